#!/bin/sh
# What a worker failure costs with in-memory snapshots (docs/train.md,
# "Snapshots in memory"), and what the snapshots cost a healthy run; side by
# side in one run.
#
# 1. Recovery: the CNN on Fashion-MNIST, 2 processes, batch 64 each, SGD
#    momentum, a checkpoint per epoch (469 steps: the default cadence). A
#    worker is SIGKILLed at a random step between 60 and 140 (--max_restarts
#    1). Per failure: the steps trained again (the last step rank 0 finished
#    before the kill, less the step the restart resumed from) and the time
#    from the kill to the end of the restarted group's first step. Three sides:
#      - mg, snapshots in memory (the default, --snapshot-every auto);
#      - mg, disk only (--snapshot-every 0): today's recovery, from the last
#        checkpoint (none yet: step 0);
#      - torchrun + PyTorch (tests/bench/startup_ref.py), a checkpoint per
#        epoch likewise.
#    Work lost is the steps redone times the side's own step time: the time a
#    failure costs beyond the restart itself.
# 2. Cost on a healthy run: the CNN (200 steps) and the MLP (2000 steps), 2
#    processes under mglaunch, train's samples/s with --snapshot-every 0
#    against 1 (every step) and auto, runs alternating, medians; the noise
#    floor is the odd off runs against the even ones (as sinks.sh states it).
#    train's own figure (the time its copies took, as a share of the time in
#    steps) is listed too: it is what the noise of a shared machine touches
#    least. Target: every-step snapshots under 3% for the CNN; auto under 3%
#    for both.
# 3. The same for ZeRO-1 over two nodes, where each snapshot's optimizer
#    shard is also copied to the other node: the CNN (200 steps) with AdamW,
#    two agents on loopback (c10d, --nnodes 2, 1 process each), --zero 1,
#    --snapshot-every 0, 1 and auto, alternating, medians. --nodes N: N
#    agents instead (each rank's shard copied to the next node); with
#    MG_COMM=tcp in the environment the ranks talk over one TCP ring, as
#    between machines (else over shared memory: one machine).
#
# Checks its own results: every recovery must resume (from memory for the
# first side), every healthy run on a model must end with the same parameter
# hash (snapshots never change the training).
#
#   tests/bench/snapshot.sh [--repeat N] [--kills N] [--mg-only] [--parts "1 2 3"] [--nodes N]
#   (defaults: 5 healthy runs a side, 3 kills a side, every part, 2 nodes)
. "$(dirname "$0")/../lib/bench.sh"
need "$MGLAUNCH" "$TRAIN"
DATA=/usr/share/datasets/fashion-mnist
[ -e "$DATA/train-images-idx3-ubyte.gz" ] ||
    { diag "Fashion-MNIST missing (apt-get install dataset-fashion-mnist)"; exit 2; }
REPS=5
KILLS=3
PARTS="1 2 3"
MG_ONLY=0
NODES=2
while [ $# -gt 0 ]; do
    case $1 in
    --repeat) REPS=${2:-}; shift ;;
    --kills) KILLS=${2:-}; shift ;;
    --parts) PARTS=${2:-}; shift ;;
    --nodes) NODES=${2:-}; shift ;;
    --mg-only) MG_ONLY=1 ;;
    *) echo "usage: snapshot.sh [--repeat N] [--kills N] [--mg-only] [--parts LIST] [--nodes N]" >&2; exit 2 ;;
    esac
    shift
done
case "$REPS$KILLS$NODES" in *[!0-9]*) echo "snapshot.sh: --repeat, --kills and --nodes need counts" >&2; exit 2 ;; esac
[ "$NODES" -ge 2 ] || { echo "snapshot.sh: --nodes needs at least 2" >&2; exit 2; }
use_torch=0
[ $MG_ONLY = 1 ] || { have_torch && have_torchrun && use_torch=1; }
export OMP_NUM_THREADS=1
fail=0
ARGS="--model cnn --batch-size 64 --log-every 1 --test-samples 100 --profile-startup"

# mg_kill SIDE REP [ARGS]: prints "redone ms step_s"
mg_kill() {
    _side=$1
    _rep=$2
    shift 2
    _d=$T/$_side.$_rep
    "$MGLAUNCH" --nproc_per_node 2 --max_restarts 1 --log_dir "$_d/logs" "$TRAIN" --steps 1000000 \
        $ARGS --checkpoint-dir "$_d/ck" "$@" >"$_d.out" 2>&1 &
    lp=$!
    SPAWNED="$SPAWNED $lp"
    _at=$(rand_step "$_rep")
    _v=""
    if wait_steps 120 "grep -c '^step ' $_d/logs/*/attempt_0/0/stdout.log" "$_at"; then
        w=$(pgrep -P "$lp" -x train | shuf -n 1)
        _v=$(kill_and_time mg_done_at "$_d.out" 2 60 kill -KILL "$w")
    fi
    kill -TERM "$lp" 2>/dev/null
    reap
    [ -n "$_v" ] || { diag "$_side run $_rep failed:"; tail -n 5 "$_d.out" >&2; return 1; }
    _last=$(sed -n 's/^step \([0-9]*\)\/.*/\1/p' "$_d"/logs/*/attempt_0/0/stdout.log | tail -n 1)
    _from=$(sed -n 's/.*resumed from .*step \([0-9]*\)[,)].*/\1/p' "$_d.out" | head -n 1)
    if [ "$_side" = memory ] && ! grep -q "resumed from memory" "$_d.out"; then
        diag "memory run $_rep did not resume from memory"
        return 1
    fi
    _rate=$(sed -n 's/^step [0-9]*\/.* \([0-9.]*\) samples\/s$/\1/p' "$_d"/logs/*/attempt_0/0/stdout.log |
        tail -n 40 | median)
    awk -v l="$_last" -v f="${_from:-0}" -v v="$_v" -v r="$_rate" 'BEGIN {
        d = l - f; if (d < 0) d = 0; printf "%d %s %.4f\n", d, v, (r > 0 ? 128 / r : 0) }'
}

tr_kill() { # REP: prints "redone ms step_s"
    _d=$T/torch.$1
    mkdir -p "$_d"
    # shellcheck disable=SC2086
    "$TORCHRUN" --standalone --nproc_per_node 2 $TR_ARGS --max_restarts 1 \
        "$TOP/tests/bench/startup_ref.py" --steps 1000000 --checkpoint-dir "$_d" \
        --checkpoint-every 469 --print-steps >"$_d.out" 2>&1 &
    tp=$!
    SPAWNED="$SPAWNED $tp"
    _at=$(rand_step "$1")
    _v=""
    _t0=""
    if wait_steps 180 "grep -c '\"step\"' $_d.out" "$_at"; then
        _t0=$(date +%s.%N)
        w=$(pgrep -P "$tp" -f startup_ref.py | shuf -n 1)
        "$HELPERS/stampexec" "$T/tk" kill -KILL "$w"
        sleep 0.3 # the killed group's last lines; a restart takes seconds
        _last=$(sed -n 's/.*"step": \([0-9]*\).*/\1/p' "$_d.out" | tail -n 1)
        if wait_steps 180 "grep -c first_step_done $_d.out" 2; then
            _v=$(ms_between "$(cat "$T/tk")" "$(tr_done_at "$_d.out" 2)")
        fi
    fi
    _t1=$(sed -n 's/.*"first_step_done": \([0-9.]*\),.*/\1/p' "$_d.out" | head -n 1)
    kill -TERM "$tp" 2>/dev/null
    sleep 0.5
    pkill -KILL -P "$tp" 2>/dev/null
    reap
    [ -n "$_v" ] || { diag "torchrun run $1 failed:"; tail -n 5 "$_d.out" >&2; return 1; }
    _from=$(grep '"first_step_done"' "$_d.out" | sed -n 2p | sed -n 's/.*"resumed_step": \([0-9]*\).*/\1/p')
    # its step time: the first attempt's steps after the first, over their time
    awk -v l="$_last" -v f="${_from:-0}" -v v="$_v" -v a="$_t1" -v b="$_t0" 'BEGIN {
        d = l - f; if (d < 0) d = 0; printf "%d %s %.4f\n", d, v, (l > 1 ? (b - a) / (l - 1) : 0) }'
}

mg_mem() { mg_kill memory "$1"; }
mg_disk() { mg_kill disk "$1" --snapshot-every 0; }

part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
{
versions_line
machine_line
} | tee "$OUT/snapshot.txt"
if part 1; then
{
echo "1. a worker SIGKILLed at a random step in 60..140: CNN, Fashion-MNIST, 2 processes x batch 64,"
echo "   1 thread each, a checkpoint per epoch (469 steps); $KILLS kills a side, medians"
} | tee -a "$OUT/snapshot.txt"
"$MGLAUNCH" --nproc_per_node 2 "$TRAIN" --steps 1 $ARGS >"$T/warm.out" 2>&1 ||
    { diag "warm-up run failed"; tail -n 5 "$T/warm.out" >&2; exit 1; }
series mem mg_mem "$KILLS"
series disk mg_disk "$KILLS"
[ $use_torch = 1 ] && series torch tr_kill "$KILLS"
row() { # LABEL FILE
    [ -s "$2" ] || { printf '   %-30s %s\n' "$1" "-"; return; }
    r=$(cut -d' ' -f1 "$2" | median)
    m=$(cut -d' ' -f2 "$2" | median)
    s=$(cut -d' ' -f3 "$2" | median)
    awk -v l="$1" -v r="$r" -v m="$m" -v s="$s" -v all="$(cut -d' ' -f1 "$2" | tr '\n' ' ')" 'BEGIN {
        printf "   %-30s %8d %12.0f ms %10.1f ms %12.0f ms   (redone: %s)\n", l, r, m, s * 1000, r * s * 1000, all }'
}
{
printf '   %-30s %8s %15s %13s %15s\n' "" "redone" "kill->1st step" "step time" "work lost"
row "mg, snapshots in memory" "$T/mem"
row "mg, disk only (today)" "$T/disk"
[ $use_torch = 1 ] && row "torchrun + PyTorch" "$T/torch"
[ $use_torch = 1 ] || echo "   (PyTorch or torchrun not installed, or --mg-only: mg only)"
awk -v r="$(cut -d' ' -f1 "$T/mem" | sort -n | tail -n 1)" -v m="$(cut -d' ' -f2 "$T/mem" | median)" 'BEGIN {
    printf "   targets: at most 1 step redone (worst: %s, %s), kill to next step under 500 ms (%s)\n",
        r, (r <= 1 ? "met" : "MISSED"), (m < 500 ? "met" : "MISSED") }'
echo
} | tee -a "$OUT/snapshot.txt"
fi

# ---- 2. the cost on a healthy run ----
# hrun MODEL STEPS EVERY K: "samples/s hash share%"
hrun() {
    _o=$T/h.$1.$3.$4
    "$MGLAUNCH" --nproc_per_node 2 "$TRAIN" --model "$1" --steps "$2" --batch-size 64 --log-every 100000 \
        --test-samples 100 --snapshot-every "$3" >"$_o" 2>&1 ||
        { diag "healthy run $1 $3 $4 failed: $(tail -n 3 "$_o")"; return 1; }
    _r=$(sed -n 's/.*done: .*(\([0-9]*\) samples\/s), wall time [0-9.]* s; param hash \([0-9a-f]*\).*/\1 \2/p' "$_o")
    [ -n "$_r" ] || { diag "no summary line in $_o"; return 1; }
    _p=$(sed -n 's/.*snapshots in memory, .* and \([0-9.]*\) ms each (\([0-9.]*\)% of the time in steps).*/\2 \1/p' "$_o")
    echo "$_r ${_p:-0 0}"
}
# hzrun MODEL STEPS EVERY K: the same over NODES agents on loopback with --zero 1
hzrun() {
    _o=$T/hz.$1.$3.$4
    _ep="127.0.0.1:$(free_port)"
    _rz="--rdzv_backend c10d --rdzv_endpoint $_ep --rdzv_id hz$$$4$3 --nnodes $NODES --nproc_per_node 1"
    _i=0
    while [ $_i -lt "$NODES" ]; do
        _host=0
        [ $_i = 0 ] && _host=1
        "$MGLAUNCH" $_rz --rdzv_conf is_host=$_host "$TRAIN" --model "$1" --steps "$2" \
            --batch-size 64 --log-every 100000 --test-samples 100 --zero 1 --optimizer adamw \
            --lr 0.001 --snapshot-every "$3" >"$_o.$_i" 2>&1 &
        SPAWNED="$SPAWNED $!"
        _i=$((_i + 1))
    done
    reap || { diag "healthy ZeRO-1 run $1 $3 $4 failed: $(tail -n 3 "$_o".*)"; return 1; }
    _r=$(sed -n 's/.*done: .*(\([0-9]*\) samples\/s), wall time [0-9.]* s; param hash \([0-9a-f]*\).*/\1 \2/p' "$_o".*)
    [ -n "$_r" ] || { diag "no summary line in $_o.0"; return 1; }
    _p=$(sed -n 's/.*snapshots in memory, .* and \([0-9.]*\) ms each (\([0-9.]*\)% of the time in steps).*/\2 \1/p' "$_o".*)
    echo "$_r ${_p:-0 0}"
}
# cost_table NAME STEPS FUNC: part 2's runs and table for one model
cost_table() {
    _cn=$1
    _cs=$2
    _cf=$3
    for e in 0 1 auto; do : >"$T/c.$_cn.$e"; done
    k=0
    while [ $k -lt "$REPS" ]; do
        for e in 0 1 auto; do $_cf "${_cn%%.*}" "$_cs" "$e" "$k" >>"$T/c.$_cn.$e" || fail=1; done
        k=$((k + 1))
    done
    if [ "$(cut -d' ' -f2 "$T/c.$_cn.0" "$T/c.$_cn.1" "$T/c.$_cn.auto" | sort -u | wc -l)" -ne 1 ]; then
        diag "$_cn: the runs ended with different weights"
        fail=1
    fi
    off=$(cut -d' ' -f1 "$T/c.$_cn.0" | median)
    {
    echo "   $_cn, $_cs steps:"
    printf '     %-26s %10s %10s %36s\n' "--snapshot-every" "samples/s" "vs off" "copies (train's own)"
    for e in 0 1 auto; do
        v=$(cut -d' ' -f1 "$T/c.$_cn.$e" | median)
        p=$(cut -d' ' -f3 "$T/c.$_cn.$e" | median)
        ms=$(cut -d' ' -f4 "$T/c.$_cn.$e" | median)
        awk -v e="$e" -v v="$v" -v o="$off" -v p="$p" -v ms="$ms" 'BEGIN {
            printf "     %-26s %10d %9.2f%% %35s\n", e, v, (o - v) / o * 100,
                (e == "0" ? "-" : sprintf("%.1f%% of step time, %.3f ms each", p, ms)) }'
    done
    odd=$(awk 'NR % 2 == 1 { print $1 }' "$T/c.$_cn.0" | median)
    even=$(awk 'NR % 2 == 0 { print $1 }' "$T/c.$_cn.0" | median)
    [ -n "$even" ] && awk -v a="$odd" -v b="$even" 'BEGIN {
        d = (a - b) / (a > b ? a : b) * 100; if (d < 0) d = -d
        printf "     noise floor: the odd off runs against the even ones, %.2f%% apart\n", d }'
    cat "$T/${_cf%run}.${_cn%%.*}.auto.0"* 2>/dev/null | grep -h "snapshots in memory every" | head -n 1 |
        sed 's/^train: /     auto chose: /'
    echo "     runs (samples/s): off $(cut -d' ' -f1 "$T/c.$_cn.0" | tr '\n' ' ')| 1 $(cut -d' ' -f1 "$T/c.$_cn.1" | tr '\n' ' ')| auto $(cut -d' ' -f1 "$T/c.$_cn.auto" | tr '\n' ' ')"
    } | tee -a "$OUT/snapshot.txt"
}
if part 2; then
echo "2. a healthy run: 2 processes under mglaunch, $REPS runs a side, alternating; medians" |
    tee -a "$OUT/snapshot.txt"
cost_table cnn 200 hrun
cost_table mlp 2000 hrun
fi
if part 3; then
echo "3. ZeRO-1 over $NODES nodes ($NODES agents on loopback x 1 process, AdamW, MG_COMM=${MG_COMM:-auto}), each" |
    tee -a "$OUT/snapshot.txt"
echo "   snapshot's shard copied to the next node; $REPS runs a side, alternating; medians" |
    tee -a "$OUT/snapshot.txt"
cost_table cnn.zero1 200 hzrun
fi
[ $fail = 0 ] || diag "FAILED (a run did not succeed or did not check out; see above)"
exit $fail
