#!/bin/sh
# Replays the membership schedule a run recorded (docs/train.md, "Replaying a
# schedule"): reads it with `mglaunch logs LOG_DIR --run RUN_ID --schedule`,
# then trains each segment on this machine under mglaunch at its world size,
# from the checkpoint the segment before it ended with (train --stop-at-step),
# and prints the final weights' hash. A run that survived failures from memory
# ends with the same bits as its replay: the script compares the two when the
# run's rank 0 logged in LOG_DIR, and exits 1 when they differ.
#
#   scripts/replay.sh LOG_DIR RUN_ID OUT_DIR TRAIN [TRAIN_ARGS...]
#
# TRAIN_ARGS: the run's own train arguments; --checkpoint-dir, --resume,
# --snapshot-every and --stop-at-step are replaced by the replay's. Each
# segment's console output is OUT_DIR/segment_<N>.out, its checkpoints
# OUT_DIR/segment_<N>/. The placement of ranks decides the order of the sums
# (docs/distributed.md): a segment on one node is replayed with shared memory,
# one rank per node with one TCP ring over every rank (MG_COMM=tcp); several
# nodes with several ranks each cannot be replayed on one machine. A run that
# set MG_COMM for its workers is replayed with the same MG_COMM in the
# environment: every segment then uses it.
# Knobs: MG_BUILD (build), MGLAUNCH (the mglaunch to run).
set -u
me=replay
die() {
    echo "$me: $*" >&2
    exit 2
}
[ $# -ge 4 ] || die "usage: scripts/replay.sh LOG_DIR RUN_ID OUT_DIR TRAIN [TRAIN_ARGS...]"
top=$(cd "$(dirname "$0")/.." && pwd)
B=${MG_BUILD:-build}
case $B in /*) ;; *) B=$top/$B ;; esac
MGLAUNCH=${MGLAUNCH:-$B/bin/mglaunch}
[ -x "$MGLAUNCH" ] || die "$MGLAUNCH is not built (make)"
logdir=$1 run=$2 out=$3 train=$4
run_comm=${MG_COMM:-}
shift 4
mkdir -p "$out" || die "cannot create '$out'"
out=$(cd "$out" && pwd)

# The run's arguments without those the replay sets (as --flag VALUE or --flag=VALUE).
args_file=$out/args
: >"$args_file"
skip=0
for a in "$@"; do
    if [ $skip = 1 ]; then
        skip=0
        continue
    fi
    case $a in
    --checkpoint-dir | --resume | --snapshot-every | --stop-at-step) skip=1 ;;
    --checkpoint-dir=* | --resume=* | --snapshot-every=* | --stop-at-step=*) ;;
    *) printf '%s\n' "$a" >>"$args_file" ;;
    esac
done

sched=$out/schedule
"$MGLAUNCH" logs "$logdir" --run "$run" --schedule >"$sched" || die "no schedule for run '$run' in '$logdir'"
grep -q '^# .*did not succeed' "$sched" && die "run '$run' did not succeed: its schedule has no end to replay ($sched)"
n=$(grep -c '^attempt ' "$sched")
echo "$me: run $run: $n segment(s) ($sched)"

i=0
prev=
grep '^attempt ' "$sched" >"$out/segments"
while read -r line; do
    i=$((i + 1))
    # attempt A: world size W (N node[s]...), steps FIRST-LAST, from ...
    set -- $(printf '%s\n' "$line" |
        sed -n 's/^attempt \([0-9]*\): world size \([0-9]*\) (\([0-9]*\) nodes*[;)].*, steps \([0-9]*\)-\([0-9a-z?]*\), from \(.*\)$/\2 \3 \4 \5/p')
    [ $# = 4 ] || die "cannot read segment $i of $sched: $line"
    world=$1 nodes=$2 first=$3 last=$4
    comm=
    if [ -n "$run_comm" ]; then
        comm=$run_comm # the run's own, for every segment
    elif [ "$nodes" -gt 1 ] && [ "$nodes" = "$world" ]; then
        comm=tcp
    elif [ "$nodes" -gt 1 ]; then
        die "segment $i: world size $world on $nodes nodes with several ranks each: its sums' order (each node's, then a ring of the nodes) cannot be replayed on one machine"
    fi
    resume=
    if [ -n "$prev" ]; then
        resume=$(printf '%s/ckpt-%012d.mgc' "$prev" "$first")
        [ -f "$resume" ] || die "segment $i: segment $((i - 1)) left no checkpoint of step $first ($resume)"
    elif [ "$first" != 0 ]; then
        # the run itself began from a checkpoint: the one it names
        resume=$(printf '%s\n' "$line" | sed -n 's/.*from disk (\(.*\))$/\1/p')
        [ -n "$resume" ] && [ -f "$resume" ] ||
            die "segment 1 begins at step $first, from no checkpoint this machine has: $line"
    fi
    seg=$out/segment_$i
    rm -rf "$seg"
    echo "$me: segment $i: world size $world${comm:+ (MG_COMM=$comm)}, steps $first-$last${resume:+, from $resume}"
    # shellcheck disable=SC2046
    (
        IFS='
'
        set -- $(cat "$args_file")
        [ "$last" = end ] || set -- "$@" --stop-at-step "$last"
        [ -z "$resume" ] || set -- "$@" --resume "$resume"
        [ -z "$comm" ] || export MG_COMM="$comm"
        # (a restart, after a launch failure such as a port taken meanwhile, starts the
        # segment again from the same checkpoint: the same bits)
        "$MGLAUNCH" --nproc_per_node "$world" --max_restarts 2 \
            --log_dir "$out/logs" --rdzv_id "replay-$run" \
            "$train" "$@" --snapshot-every 0 --checkpoint-dir "$seg"
    ) </dev/null >"$out/segment_$i.out" 2>&1 || {
        tail -n 5 "$out/segment_$i.out" >&2
        die "segment $i failed (its output: $out/segment_$i.out)"
    }
    prev=$seg
done <"$out/segments"
hash=$(sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p' "$out/segment_$i.out" | tail -n 1)
[ -n "$hash" ] || die "the last segment printed no param hash ($out/segment_$i.out)"
echo "$me: param hash $hash"
# The run's own final hash, when its rank 0 logged here: a replay with other
# TRAIN_ARGS than the run's trains something else, and says so.
theirs=$("$MGLAUNCH" logs "$logdir" --run "$run" --attempt last --rank 0 --grep '; param hash ' 2>/dev/null |
    sed -n 's/.*; param hash \([0-9a-f]*\).*/\1/p' | tail -n 1)
if [ -z "$theirs" ]; then
    echo "$me: the run's own final hash is not in $logdir (its rank 0 logged elsewhere): compare it by hand"
elif [ "$theirs" = "$hash" ]; then
    echo "$me: the same as the run's"
else
    echo "$me: the run ended with param hash $theirs, not $hash: were TRAIN_ARGS the run's own? (its command line: the run_start event's argv in $logdir)" >&2
    exit 1
fi
