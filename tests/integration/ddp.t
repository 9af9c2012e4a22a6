#!/bin/sh
# Data-parallel training with train: 2 processes against 1 with the same global
# batch, replicas that stay identical, --global-batch-size / --scale-lr,
# gradient buckets with and without the communication thread, with the
# gradients in registered memory (zero-copy) or not, a model that differs
# between ranks, and a run SIGKILLed at random points and resumed by mglaunch
# --max_restarts that ends bit-identical to an uninterrupted one, leaving
# nothing in /dev/shm; a checkpoint resumed by another world size is resharded.
# timeout: 300
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] && [ -x "$MGLAUNCH" ] || skip_all "train or mglaunch not built"
DATA="--data fashion-mnist --train-samples 6400 --test-samples 1000"
[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
    DATA="--data synthetic --train-samples 6400 --test-samples 1000"

# launch NPROC ARGS...: mglaunch with a log dir; console output in $T/console
launch() {
    n=$1
    shift
    "$MGLAUNCH" --nproc_per_node "$n" --log_dir "$T/logs" "$@" >"$T/console" 2>&1
}
. "$(dirname "$0")/../lib/ddp_lib.sh"
# losses of the train records of a metrics file, one per line
losses() { sed -n 's/.*"type":"train","step":\([0-9]*\),.*"loss":\([0-9.e+-]*\),.*/\1 \2/p' "$1"; }

# ---- 2 processes = 1 process with the same global batch ----
# (lr 0.02: at 0.05 with momentum 0.9 this model's trajectory amplifies any
# rounding difference, 2 processes or not, past 1e-3 within 50 steps)
"$TRAIN" $DATA --model mlp --lr 0.02 --steps 50 --log-every 1 --batch-size 64 \
    --metrics "$T/one.jsonl" >"$T/one.out" 2>&1
ok test -s "$T/one.jsonl"
launch 2 "$TRAIN" $DATA --model mlp --lr 0.02 --steps 50 --log-every 1 --batch-size 32 \
    --check-replicas 1 --metrics "$T/two.jsonl"
is "$?" 0 "2 processes, batch 32 each, --check-replicas 1: the replicas stay identical"
like "$(cat "$T/console")" "batch 32 per process x 2 processes x 1 accum = 64" \
    "train prints the per-process and the effective batch"
losses "$T/one.jsonl" >"$T/l1"
losses "$T/two.jsonl" >"$T/l2"
is "$(wc -l <"$T/l2")" 50 "50 losses logged"
worst=$(paste -d' ' "$T/l1" "$T/l2" | awk '{ d = $2 - $4; if (d < 0) d = -d; r = d / ($2 > 1e-6 ? $2 : 1e-6);
    if ($1 != $3) r = 1; if (r > m) m = r } END { printf "%.3g", m + 0 }')
diag "largest relative loss difference over 50 steps: $worst"
ok awk -v w="$worst" 'BEGIN { exit !(w < 1e-4) }'

# ---- --global-batch-size and --scale-lr ----
launch 2 "$TRAIN" $DATA --model mlp --steps 5 --global-batch-size 100 --scale-lr linear
is "$?" 0 "--global-batch-size 100 --scale-lr linear"
like "$(cat "$T/console")" "batch 50 per process x 2 processes x 1 accum = 100" \
    "--global-batch-size 100 over 2 processes: 50 each"
like "$(cat "$T/console")" "lr 0.1 = 0.05 x 2 processes \(--scale-lr linear\)" "--scale-lr linear doubles the lr"

# ---- buckets: the same bits with one bucket, many, with or without the thread,
# zero-copy or through the staging slots ----
for opt in "" "--bucket-cap-mb 0.01" "--bucket-cap-mb 0.01 --no-comm-thread" \
    "MG_COMM_ZEROCOPY=0" "MG_COMM_ZEROCOPY=0 --bucket-cap-mb 0.01"; do
    zc=""
    case $opt in MG_COMM_ZEROCOPY=0*) zc=0 opt=${opt#MG_COMM_ZEROCOPY=0} ;; esac
    MG_COMM_ZEROCOPY=${zc:-1} launch 2 "$TRAIN" $DATA --model cnn --steps 8 --batch-size 16 \
        --accum-steps 2 $opt
    echo "$(hash_of "$T/console")" >>"$T/bucket_hashes"
done
is "$(sort -u "$T/bucket_hashes" | wc -l)" 1 \
    "cnn with accumulation: one bucket, many, no thread, zero-copy or not: same weights"
ok test -n "$(head -n 1 "$T/bucket_hashes")"

# ---- ranks that disagree ----
port=$(free_port)
for r in 0 1; do
    hidden=256
    [ $r = 1 ] && hidden=128
    bg env RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
        TORCHELASTIC_ERROR_FILE="$T/err$r.json" "$TRAIN" $DATA --model mlp --hidden $hidden \
        --steps 2 >"$T/mis.$r" 2>&1
    eval "pid$r=\$!"
done
wait "$pid0"
rc0=$?
wait "$pid1"
is "$rc0" 2 "a rank with a different model: exit 2 (a configuration error: do not retry)"
like "$(cat "$T/mis.0")" "rank 1 built a different model than rank 0: mlp with 101770 parameters" \
    "the error names the rank and the difference"
like "$(cat "$T/err0.json")" '"message":"cannot synchronize the initial parameters: rank 1 built a different model' \
    "and goes to the error file"

# ---- killed at random points, resumed by mglaunch: the same weights ----
ARGS="$DATA --model cnn --steps 100 --batch-size 32 --checkpoint-every 5 --log-every 20 --seed 3"
launch 2 "$TRAIN" $ARGS --checkpoint-dir "$T/ck_ref"
is "$?" 0 "uninterrupted reference run"
ref=$(hash_of "$T/console")
ok test -n "$ref"

# Three workers SIGKILLed, each a random 0.05 to 0.4 s after a new checkpoint.
RUN_ID=ddpkill$$
"$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/logs" --max_restarts 10 --rdzv_id "$RUN_ID" "$TRAIN" \
    $ARGS --checkpoint-dir "$T/ck_kill" >"$T/console" 2>&1 &
lp=$!
at_cleanup "kill -KILL $lp 2>/dev/null"
kill_at_checkpoints "$lp" "$T/ck_kill" 0.05 0.35 &
kp=$!
at_cleanup "kill -KILL $kp 2>/dev/null"
wait "$lp"
rc=$?
wait "$kp"
is "$rc" 0 "killed at random steps: mglaunch restarts until the run finishes"
diag "workers SIGKILLed: $(cat "$T/kills" 2>/dev/null | wc -l)"
restarts=$(grep -c "resumed from" "$T/console")
diag "attempts that resumed from a checkpoint: $restarts"
DESC="at least one attempt resumed from a checkpoint" ok test "$restarts" -ge 1
is "$(hash_of "$T/console")" "$ref" "the resumed run ends with the reference run's weights, bit for bit"
is "$(ls /dev/shm | grep -c "^mg-$RUN_ID-")" 0 \
    "no shared memory (gradients in registered memory included) left in /dev/shm"

# ---- a corrupt newest checkpoint: fall back to the one before, on every rank ----
newest=$(ls "$T/ck_ref" | grep "\.mgc$" | sort | tail -n 1)
printf 'garbage' | dd of="$T/ck_ref/$newest" bs=1 seek=100 conv=notrunc 2>/dev/null
launch 2 "$TRAIN" $ARGS --checkpoint-dir "$T/ck_ref" --resume auto --steps 105
is "$?" 0 "resume past a corrupt newest checkpoint"
like "$(cat "$T/console")" "warning: skipping a corrupt checkpoint" "with a warning"

# ---- another world size on resume: resharded (tests/integration/train_reshard.t) ----
launch 1 "$TRAIN" $ARGS --checkpoint-dir "$T/ck_ref" --resume auto --steps 110
is "$?" 0 "resuming 2 processes' checkpoint with 1"
like "$(cat "$T/console")" "warning: resharding a checkpoint of 2 processes: world size 2 -> 1, effective batch 64 -> 32" \
    "is a reshard, with a warning"

done_testing
