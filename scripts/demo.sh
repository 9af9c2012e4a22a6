#!/bin/sh
# The README's main job (`make demo`): mglaunch starts 2 workers that train the
# CNN on Fashion-MNIST for one epoch with DDP (libmg), saving every rank's
# stdout/stderr under the log directory and a checkpoint after the epoch. It
# ends with the test accuracy and `mglaunch logs`' summary of the run.
#
#   MG_DEMO_LOG_DIR   where the logs go (default build/demo-logs)
#   MG_DEMO_ARGS      extra train flags (for example "--epochs 3" or "--model mlp")
set -eu
TOP=$(cd "$(dirname "$0")/.." && pwd)
MG_BUILD=${MG_BUILD:-build}
case $MG_BUILD in /*) ;; *) MG_BUILD=$TOP/$MG_BUILD ;; esac
MGLAUNCH=$MG_BUILD/bin/mglaunch
TRAIN=$MG_BUILD/bin/train
LOGS=${MG_DEMO_LOG_DIR:-$MG_BUILD/demo-logs}
for b in "$MGLAUNCH" "$TRAIN"; do
    [ -x "$b" ] || { echo "demo: $b is missing; run make" >&2; exit 1; }
done

run=demo-$(date +%Y%m%d-%H%M%S)
set -- --nproc_per_node 2 --max_restarts 1 --log_dir "$LOGS" --rdzv_id "$run" -t 3 \
    "$TRAIN" --model cnn --data fashion-mnist --epochs 1 --log-every 100 \
    --checkpoint-dir "$LOGS/$run/checkpoints" ${MG_DEMO_ARGS:-}
echo "== mglaunch $*"
rc=0
"$MGLAUNCH" "$@" || rc=$?
echo
echo "== mglaunch logs $LOGS --run $run"
"$MGLAUNCH" logs "$LOGS" --run "$run"
echo
echo "Per-rank logs: $LOGS/$run/attempt_<n>/<local_rank>/{stdout.log,stderr.log}"
echo "Checkpoints:   $LOGS/$run/checkpoints"
exit $rc
