#!/bin/sh
# ZeRO-1 (--zero 1, MG_ZERO): the same weights, bit for bit, as plain DDP for
# both models, both optimizers (with momentum, Nesterov, weight decay,
# schedules, accumulation) and 1 to 4 processes, over shared memory, a TCP
# ring and the hierarchical layout; checkpoints identical to plain DDP's, a
# ZeRO checkpoint resumed without ZeRO and the other way round, resharded to
# another world size; SIGKILLed at random points and resumed by mglaunch, the
# same bits as an uninterrupted run; the optimizer state per process divided
# by the world size.
# timeout: 600
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] && [ -x "$MGLAUNCH" ] || skip_all "train or mglaunch not built"
DATA="--data fashion-mnist --train-samples 1600 --test-samples 300"
[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
    DATA="--data synthetic --train-samples 1600 --test-samples 300"

. "$(dirname "$0")/../lib/ddp_lib.sh"
# run NPROC OUT ARGS...: train under mglaunch (world 1: train alone), output in OUT
run() {
    n=$1 out=$2
    shift 2
    if [ "$n" = 1 ]; then
        "$TRAIN" --log-every 1000 "$@" >"$out" 2>&1
    else
        "$MGLAUNCH" --nproc_per_node "$n" --log_dir "$T/logs" "$TRAIN" --log-every 1000 "$@" \
            >"$out" 2>&1
    fi
}
# same NPROC WHAT ARGS...: --zero 0 and --zero 1 end with the same weights
same() {
    n=$1 what=$2
    shift 2
    run "$n" "$T/z0" --zero 0 "$@"
    rc0=$?
    run "$n" "$T/z1" --zero 1 "$@"
    rc1=$?
    h0=$(hash_of "$T/z0")
    h1=$(hash_of "$T/z1")
    if [ $rc0 = 0 ] && [ $rc1 = 0 ] && [ -n "$h0" ] && [ "$h0" = "$h1" ]; then
        _result 0 "$what: $n processes: the same weights with and without --zero 1 ($h0)"
    else
        _result 1 "$what: $n processes: the same weights with and without --zero 1"
        printf '#   --zero 0 (exit %s): %s\n#   --zero 1 (exit %s): %s\n' "$rc0" "$h0" "$rc1" "$h1"
        tail -n 3 "$T/z1" | sed 's/^/#   /'
    fi
}

for n in 1 2 3 4; do
    same $n "mlp sgd momentum" --model mlp --steps 8 $DATA
    same $n "mlp adamw, cosine with warmup" --model mlp --optimizer adamw --schedule cosine \
        --warmup 3 --steps 8 $DATA
    same $n "cnn sgd nesterov, weight decay, step schedule, accumulation 2" --model cnn \
        --nesterov --weight-decay 0.001 --schedule step --step-size 2 --accum-steps 2 \
        --batch-size 16 --steps 5 $DATA
    same $n "cnn adamw" --model cnn --optimizer adamw --steps 5 --batch-size 32 $DATA
done
same 3 "mlp, plain sgd (no state), small buckets, no communication thread" --model mlp \
    --momentum 0 --bucket-cap-mb 0.05 --no-comm-thread --steps 8 $DATA
same 2 "mlp with dropout, many buckets" --model mlp --hidden 128,64 --dropout 0.2 \
    --bucket-cap-mb 0.02 --steps 8 $DATA
MG_COMM=tcp same 3 "MG_COMM=tcp (a ring), cnn adamw" --model cnn --optimizer adamw --steps 4 \
    --batch-size 32 $DATA
MG_COMM_ZEROCOPY=0 same 2 "MG_COMM_ZEROCOPY=0, mlp" --model mlp --steps 8 $DATA

# hierarchical: 2 simulated hosts (MG_COMM_HOST), ranks started by hand
hier() { # ZERO OUT HOSTS...
    z=$1 out=$2
    shift 2
    port=$(free_port)
    r=0
    pids=""
    for h in "$@"; do
        RANK=$r WORLD_SIZE=$# MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MG_COMM_HOST=$h \
            "$TRAIN" --zero "$z" --model mlp --optimizer adamw --bucket-cap-mb 0.05 --steps 6 \
            --log-every 1000 $DATA >"$out.$r" 2>&1 &
        pids="$pids $!"
        r=$((r + 1))
    done
    for p in $pids; do wait "$p"; done
}
hier 0 "$T/h0" a a b
hier 1 "$T/h1" a a b
like "$(cat "$T/h1.0")" "hierarchical, 3 ranks on 2 hosts" "hierarchical layout"
h0=$(hash_of "$T/h0.0")
is "$(hash_of "$T/h1.0")" "$h0" "hierarchical (2 hosts, 2 + 1 ranks): the same weights with --zero 1"
ok test -n "$h0"

# ---- the optimizer state per process ----
run 4 "$T/mem" --zero 1 --model cnn --optimizer adamw --steps 1 $DATA
like "$(cat "$T/mem")" "ZeRO-1: each process keeps the optimizer state of 46160 of 184586 parameters: 360.6 KiB instead of 1442.1 KiB" \
    "4 processes: a quarter of the AdamW state each (184586 padded to 184640, a multiple of 16 x 4)"
MG_ZERO=1 run 2 "$T/env" --model mlp --steps 2 $DATA
like "$(cat "$T/env")" "ZeRO-1: each process keeps" "MG_ZERO=1 turns it on"
MG_ZERO=2 "$TRAIN" --steps 1 >"$T/o" 2>"$T/e"
is $? 2 "MG_ZERO=2: a usage error"
like "$(cat "$T/e")" "MG_ZERO='2': expected 0 or 1" "naming the variable"
MG_ZERO=1 run 2 "$T/env0" --zero 0 --model mlp --steps 2 $DATA
unlike "$(cat "$T/env0")" "ZeRO-1" "--zero 0 wins over MG_ZERO=1"

# ---- checkpoints: the same files, and resumed across --zero ----
ARGS="$DATA --model cnn --optimizer adamw --steps 20 --batch-size 32 --checkpoint-every 5 --seed 3"
for z in 0 1; do
    "$MGLAUNCH" --nproc_per_node 2 --rdzv_id zerock "$TRAIN" $ARGS --zero $z \
        --checkpoint-dir "$T/ck$z" --keep-checkpoints 0 >"$T/ck$z.out" 2>&1
done
ref=$(hash_of "$T/ck0.out")
is "$(hash_of "$T/ck1.out")" "$ref" "checkpointing runs: the same weights"
same_files=1
for f in "$T"/ck0/*.mgc; do
    cmp -s "$f" "$T/ck1/$(basename "$f")" || same_files=0
done
is "$same_files" 1 "every checkpoint of the --zero 1 run is byte for byte the plain run's"
for z in 0 1; do
    other=$((1 - z))
    cp -r "$T/ck$z" "$T/re$z"
    rm -f "$T/re$z"/ckpt-000000000020.* "$T/re$z"/ckpt-000000000015.*
    "$MGLAUNCH" --nproc_per_node 2 "$TRAIN" $ARGS --zero $other --checkpoint-dir "$T/re$z" \
        --resume auto >"$T/re$z.out" 2>&1
    like "$(cat "$T/re$z.out")" "resumed from .*ckpt-000000000010.mgc" "--zero $z's checkpoint resumed with --zero $other"
    is "$(hash_of "$T/re$z.out")" "$ref" "and ends with the uninterrupted run's weights"
done
# another world size: both resharded alike
for z in 0 1; do
    cp -r "$T/ck1" "$T/rs$z"
    rm -f "$T/rs$z"/ckpt-000000000020.* "$T/rs$z"/ckpt-000000000015.*
    "$MGLAUNCH" --nproc_per_node 3 "$TRAIN" $ARGS --zero $z --checkpoint-dir "$T/rs$z" \
        --resume auto >"$T/rs$z.out" 2>&1
    is $? 0 "a --zero 1 checkpoint of 2 processes resumed by 3 with --zero $z"
done
like "$(cat "$T/rs1.out")" "resharding a checkpoint of 2 processes" "resharded"
is "$(hash_of "$T/rs1.out")" "$(hash_of "$T/rs0.out")" "the same weights with and without --zero 1"

# ---- killed at random points, resumed by mglaunch: the uninterrupted run's bits ----
KARGS="$DATA --model cnn --steps 60 --batch-size 32 --checkpoint-every 5 --seed 5 --zero 1"
run 2 "$T/kref" $KARGS --checkpoint-dir "$T/k_ref"
kref=$(hash_of "$T/kref")
ok test -n "$kref"
"$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/logs" --max_restarts 10 --rdzv_id zerokill$$ \
    "$TRAIN" --log-every 1000 $KARGS --checkpoint-dir "$T/k_kill" >"$T/kconsole" 2>&1 &
lp=$!
at_cleanup "kill -KILL $lp 2>/dev/null"
kill_at_checkpoints "$lp" "$T/k_kill" 0.02 0.3 &
kp=$!
at_cleanup "kill -KILL $kp 2>/dev/null"
wait "$lp"
rc=$?
wait "$kp"
is "$rc" 0 "--zero 1 killed at random steps: mglaunch restarts until the run finishes"
diag "workers SIGKILLed: $(cat "$T/kills" 2>/dev/null | wc -l); attempts that resumed: $(grep -c 'resumed from' "$T/kconsole")"
ok test "$(grep -c 'resumed from' "$T/kconsole")" -ge 1
is "$(hash_of "$T/kconsole")" "$kref" "the resumed --zero 1 run ends with the uninterrupted run's weights"
is "$(ls /dev/shm | grep -c "^mg-zerokill$$-")" 0 "nothing left in /dev/shm"
done_testing
