#!/bin/sh
# The fault-injection soak (make soak; docs/development.md), in two parts.
#
# Workers: train runs under mglaunch with checkpoints and restarts while this
# script SIGKILLs, SIGSEGVs and SIGTERMs random workers at random moments,
# until FAULTS faults were delivered. Every run must end as an uninterrupted
# run does:
#   hang      mglaunch exits within its time limit
#   orphan    no process of the run outlives mglaunch
#   log       every attempt's rank-0 log has its step lines without a gap, the
#             event log has an end for every attempt and the run's end
#   mismatch  exit 0 and the final weights' hash of the uninterrupted run
#   leak      nothing of the run left in /dev/shm, no temporary file in its
#             TMPDIR or checkpoint directory
#
# Nodes: an elastic job of three agents on loopback (c10d, --nnodes 2:3, one
# worker each, snapshots in memory every step, no checkpoint directory) while
# this script SIGKILLs a worker, or a whole node (an agent other than the
# store's host, with its worker, as a machine that dies), and starts a new
# agent in a lost one's place (a rejoin, healed from a live peer's snapshot),
# until NODE_FAULTS worker kills and node losses were delivered. Every run
# must, besides no hang, no orphan and a complete event log:
#   lost      resume from memory after every failure and re-formation, with at
#             most one step trained again (the step the first agent's event
#             log says its rank had done, less the step the next attempt went
#             on from)
#   mismatch  exit 0 on every agent left, with the bits of the replay of the
#             schedule its event log recorded (scripts/replay.sh; the workers
#             use MG_COMM=tcp, a ring as over hosts, and so does the replay)
#
# Prints one line per run and a summary; exits 1 on any problem (the failed
# runs' directories are kept under build/soak/).
#
#   scripts/soak.sh [FAULTS [NODE_FAULTS]]   (default 100 and 20; SOAK_SEED=N for a
#                                            repeatable run)
# Knobs: SOAK_STEPS (300), SOAK_NPROC (2), SOAK_MAX_FAULTS_PER_RUN (6),
# SOAK_NODE_STEPS (240), MG_BUILD.
set -u
cd "$(dirname "$0")/.."
TOP=$(pwd)
B=${MG_BUILD:-build}
case $B in /*) ;; *) B=$TOP/$B ;; esac
MGLAUNCH=$B/bin/mglaunch
TRAIN=$B/bin/train
FAULTS=${1:-${SOAK_FAULTS:-100}}
NODE_FAULTS=${2:-${SOAK_NODE_FAULTS:-20}}
NODE_STEPS=${SOAK_NODE_STEPS:-240}
STEPS=${SOAK_STEPS:-300}
NPROC=${SOAK_NPROC:-2}
PER_RUN=${SOAK_MAX_FAULTS_PER_RUN:-6}
SEED=${SOAK_SEED:-$$}
OUT=$TOP/build/soak
for f in "$MGLAUNCH" "$TRAIN"; do
    [ -x "$f" ] || { echo "soak: $f is not built (make)" >&2; exit 2; }
done
mkdir -p "$OUT"
W=$(mktemp -d "${TMPDIR:-/tmp}/mgsoak.XXXXXX")
cleanup() {
    [ -n "${LPID:-}" ] && kill -KILL "$LPID" 2>/dev/null
    for p in ${NODE_PIDS:-}; do kill -KILL -- "-$p" "$p" 2>/dev/null; done
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
ulimit -c 0 # a SIGSEGV must not leave a core file behind

# A small random generator of our own (an LCG, seeded), so that a seed
# repeats the same faults. rnd N sets R to an integer in [0, N) (no subshell:
# the state must advance).
RND_STATE=$((SEED % 2147483648))
rnd() {
    RND_STATE=$(((RND_STATE * 1103515245 + 12345) % 2147483648))
    R=$((RND_STATE / 65536 % $1))
}

train_args() {
    echo "--data synthetic --steps $STEPS --log-every 1 --checkpoint-every 10 --keep-checkpoints 2 --checkpoint-dir $1"
}

# run NAME MAX_RESTARTS: starts one run in the background (LPID), in its own
# directory with its own TMPDIR, tagged in its environment with SOAK_TAG.
start_run() {
    R=$W/$1
    mkdir -p "$R/tmp"
    TAG="soak-$$-$1"
    # shellcheck disable=SC2046
    TMPDIR=$R/tmp SOAK_TAG=$TAG setsid "$MGLAUNCH" --nproc_per_node "$NPROC" --max_restarts "$2" \
        --monitor_interval 0.1 --log_dir "$R/logs" --rdzv_id "$1" \
        "$TRAIN" $(train_args "$R/ck") >"$R/out" 2>"$R/err" &
    LPID=$!
}

# The processes of a run: those whose environment carries its tag.
tagged() {
    grep -l "SOAK_TAG=$1" /proc/[0-9]*/environ 2>/dev/null | sed 's|/proc/\([0-9]*\)/environ|\1|'
}

hash_of() {
    cat "$1"/logs/"$2"/attempt_*/0/stdout.log 2>/dev/null | sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p' | tail -n 1
}

# Every attempt's rank-0 log: step lines consecutive, each line whole.
check_logs() {
    bad=""
    for f in "$1"/logs/"$2"/attempt_*/0/stdout.log; do
        [ -f "$f" ] || continue
        gap=$(awk '/^step [0-9]+\// { split($2, a, "/"); s = a[1] + 0
                   if (prev && s != prev + 1) { print "step " prev " then " s; exit }
                   prev = s; next }
                 /^(train:|eval step)/ { next }
                 { print "a torn line: " substr($0, 1, 60); exit }' "$f")
        [ -n "$gap" ] && bad="$bad ${f#"$1"/}: $gap;"
    done
    ev=$1/logs/$2/events.jsonl
    starts=$(grep -c '"event":"attempt_start"' "$ev" 2>/dev/null)
    ends=$(grep -c '"event":"attempt_end"' "$ev" 2>/dev/null)
    [ "$starts" = "$ends" ] || bad="$bad events: $starts attempt_start, $ends attempt_end;"
    tail -n 1 "$ev" 2>/dev/null | grep -q '"event":"run_end"' || bad="$bad events: no run_end last;"
    echo "$bad"
}

# Reference: the same run without faults.
echo "soak: seed $SEED, $FAULTS faults, train --steps $STEPS x $NPROC workers, checkpoints every 10 steps"
start_run ref 0
t0=$(date +%s)
wait "$LPID"
rc=$?
LPID=
REF_SECS=$(($(date +%s) - t0 + 1))
REF=$(hash_of "$W/ref" ref)
if [ "$rc" != 0 ] || [ -z "$REF" ]; then
    echo "soak: the uninterrupted run failed (exit $rc):" >&2
    tail -n 5 "$W/ref/err" >&2
    exit 2
fi
echo "soak: uninterrupted run: ${REF_SECS} s, param hash $REF"
LIMIT=$((REF_SECS * 4 + 60 + PER_RUN * 15)) # seconds a faulted run may take

faults=0 runs=0 hangs=0 orphans=0 lost=0 mismatches=0 leaks=0 n_kill=0 n_segv=0 n_term=0
while [ "$faults" -lt "$FAULTS" ]; do
    runs=$((runs + 1))
    name=r$runs
    rnd "$PER_RUN"
    want=$((1 + R))
    start_run "$name" $((want + 2))
    end=$(($(date +%s) + LIMIT))
    sent=0 what=""
    while [ "$sent" -lt "$want" ] && [ "$faults" -lt "$FAULTS" ] && kill -0 "$LPID" 2>/dev/null; do
        # a random moment: 0.05 to 0.8 uninterrupted runs from now, in 10 ms steps
        rnd $((REF_SECS * 75))
        sleep "$(awk -v n="$R" 'BEGIN { printf "%.2f", 0.05 + n / 100 }')"
        pids=$(pgrep -P "$LPID" -x train | tr '\n' ' ')
        set -- $pids
        [ $# -gt 0 ] || continue
        rnd $#
        shift "$R"
        victim=$1
        rnd 3
        case $R in
        0) sig=KILL ;;
        1) sig=SEGV ;;
        *) sig=TERM ;;
        esac
        if kill -s "$sig" "$victim" 2>/dev/null; then
            sent=$((sent + 1))
            faults=$((faults + 1))
            what="$what $sig"
            case $sig in
            KILL) n_kill=$((n_kill + 1)) ;;
            SEGV) n_segv=$((n_segv + 1)) ;;
            TERM) n_term=$((n_term + 1)) ;;
            esac
        fi
    done
    # Wait for the run to end, or call it a hang.
    while kill -0 "$LPID" 2>/dev/null && [ "$(date +%s)" -lt "$end" ]; do
        # (a zombie counts as ended: wait reaps it below)
        grep -q '^State:.*Z' "/proc/$LPID/status" 2>/dev/null && break
        sleep 0.2
    done
    problems=""
    if kill -0 "$LPID" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$LPID/status" 2>/dev/null; then
        hangs=$((hangs + 1))
        problems="$problems hang;"
        kill -KILL -- "-$LPID" 2>/dev/null
    fi
    wait "$LPID"
    rc=$?
    LPID=
    sleep 0.2 # a killed group's last processes are reaped by init
    left=$(tagged "$TAG" | tr '\n' ' ')
    if [ -n "$left" ]; then
        orphans=$((orphans + 1))
        problems="$problems orphans: $left;"
        for p in $left; do kill -KILL "$p" 2>/dev/null; done
    fi
    got=$(hash_of "$W/$name" "$name")
    if [ "$rc" != 0 ] || [ "$got" != "$REF" ]; then
        mismatches=$((mismatches + 1))
        problems="$problems exit $rc, hash ${got:-none};"
    fi
    badlog=$(check_logs "$W/$name" "$name")
    if [ -n "$badlog" ]; then
        lost=$((lost + 1))
        problems="$problems log:$badlog"
    fi
    shm=$(ls /dev/shm 2>/dev/null | grep -e "^mg-$name-" | tr '\n' ' ')
    tmp=$(find "$W/$name/tmp" "$W/$name/ck" -mindepth 1 \( -name '*tmp*' -o -path "$W/$name/tmp/*" \) 2>/dev/null | tr '\n' ' ')
    if [ -n "$shm$tmp" ]; then
        leaks=$((leaks + 1))
        problems="$problems leak: ${shm}${tmp};"
        for s in $shm; do rm -f "/dev/shm/$s"; done
    fi
    attempts=$(ls -d "$W/$name"/logs/"$name"/attempt_* 2>/dev/null | wc -l | tr -d ' ')
    printf 'run %3d: %d fault(s)%s, %s attempt(s), exit %s: %s\n' "$runs" "$sent" "${what:+ (${what# })}" \
        "$attempts" "$rc" "${problems:-ok}"
    if [ -n "$problems" ]; then
        rm -rf "$OUT/$name"
        cp -r "$W/$name" "$OUT/$name"
    fi
    rm -rf "${W:?}/$name"
done

echo "soak: $faults faults (SIGKILL $n_kill, SIGSEGV $n_segv, SIGTERM $n_term) over $runs runs:" \
    "$hangs hangs, $orphans orphans, $lost lost log lines, $mismatches mismatches, $leaks leaks"
problems_workers=$((hangs + orphans + lost + mismatches + leaks))

. "$TOP/scripts/soak_nodes.sh"
soak_nodes

[ $((problems_workers + problems_nodes)) = 0 ] || {
    echo "soak: the failed runs are in $OUT/"
    exit 1
}
