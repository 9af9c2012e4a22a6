#!/bin/sh
# The README's main job (`make demo`). Until the train program exists, a demo of
# the launcher: two workers with torchrun's environment, per-rank logs, a
# progress bar, a simulated crash of rank 1 that mglaunch restarts from, and
# then `mglaunch logs` showing the run, its attempts and the root cause.
set -eu
TOP=$(cd "$(dirname "$0")/.." && pwd)
MG_BUILD=${MG_BUILD:-build}
case $MG_BUILD in /*) ;; *) MG_BUILD=$TOP/$MG_BUILD ;; esac
MGLAUNCH=$MG_BUILD/bin/mglaunch
LOGS=${MG_DEMO_LOG_DIR:-$MG_BUILD/demo-logs}
[ -x "$MGLAUNCH" ] || { echo "demo: $MGLAUNCH is missing; run make" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/mgdemo.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
cat >"$work/worker" <<'EOF'
#!/bin/sh
# A stand-in for a training worker: it reads torchrun's variables like a DDP script would.
echo "rank $RANK of $WORLD_SIZE (local rank $LOCAL_RANK), store at $MASTER_ADDR:$MASTER_PORT," \
     "restart $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS"
i=1
while [ $i -le 5 ]; do
    printf 'epoch 1 [%-5s] %d/5\r' "$(printf '%*s' $i '' | tr ' ' '#')" $i
    sleep 0.1
    i=$((i + 1))
done
echo
if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
    echo "rank 1: simulated crash (out of memory)" >&2
    exit 3
fi
echo "rank $RANK: done"
EOF
chmod +x "$work/worker"

run=demo-$(date +%Y%m%d-%H%M%S)
echo "== mglaunch --nproc_per_node 2 --max_restarts 1 --log_dir $LOGS --rdzv_id $run -t 3 worker"
"$MGLAUNCH" --nproc_per_node 2 --max_restarts 1 --log_dir "$LOGS" --rdzv_id "$run" -t 3 \
    "$work/worker"
echo "== mglaunch exited with $? (rank 1 crashed once; the group restarted and finished)"
echo
echo "== mglaunch logs $LOGS --run $run"
"$MGLAUNCH" logs "$LOGS" --run "$run"
echo
echo "== mglaunch logs $LOGS --run $run --rank 1 --attempt all --grep rank"
"$MGLAUNCH" logs "$LOGS" --run "$run" --rank 1 --attempt all --grep rank
echo
echo "The per-rank files are under $LOGS/$run/attempt_<n>/<local_rank>/."
