#!/bin/sh
# A training step without host waits, on a GPU (the GPU suite, docs/gpu.md;
# skipped, saying why, without a usable GPU). The calls that make the host wait
# for the GPU (cudaStreamSynchronize, cudaDeviceSynchronize, cudaMemcpy) are
# counted by tests/helpers/cudawaits under LD_PRELOAD: 40 more steps of the
# MLP and of the CNN add none (the loss is read back for log lines only), while
# a log line every step adds about one each (the counter sees them); the log
# cadence does not change the weights; one rank with NCCL and the
# communication thread forced (MG_TEST_COMM_THREAD=1, many buckets queued one
# behind the other; no in-memory snapshots, which copy the state) adds none
# per step either. cudaEventSynchronize (the host
# waiting for a pinned buffer's previous copy, at most two micro-batches
# behind) is reported, not judged. Waits inside cuBLAS, cuDNN and NCCL, which
# carry their own static CUDA runtime, are not seen; nsys would see them.
# timeout: 240
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] && [ -x "$MGLAUNCH" ] && [ -x "$HELPERS/gpuprobe" ] ||
    skip_all "train, mglaunch or gpuprobe not built"
[ -f "$MG_BUILD/lib/libmg_cuda.so" ] || skip_all "this build has no CUDA plugin"
LIB=$HELPERS/cudawaits/libcudawaits.so
[ -f "$LIB" ] || skip_all "the wait counter is not built ($LIB)"
probe=$("$HELPERS/gpuprobe" probe 0)
case $probe in
usable:*) ;;
*) skip_all "no CUDA device ($probe)" ;;
esac
diag "GPU 0: ${probe#usable: }"
hash_of() { sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p' "$1" | tail -n 1; }
# host waits a run made (every process's line summed), and its event waits
waits_of() { awk '{ s += $2 + $4 + $8 } END { print s + 0 }' "$1"; }
events_of() { awk '{ s += $6 } END { print s + 0 }' "$1"; }
ARGS="--device cuda --data synthetic --train-samples 6400 --test-samples 500 --batch-size 64 --seed 3"
run() { # name steps log-every [model]
    rm -f "$T/w.$1"
    MG_CUDAWAITS_OUT="$T/w.$1" LD_PRELOAD=$LIB "$TRAIN" $ARGS --model "$4" --steps "$2" \
        --log-every "$3" >"$T/out.$1" 2>&1
}
for model in mlp cnn; do
    run a 20 1000 $model && run b 60 1000 $model && run c 60 1 $model
    is $? 0 "$model: three runs on the GPU with the wait counter preloaded"
    a=$(waits_of "$T/w.a") b=$(waits_of "$T/w.b") c=$(waits_of "$T/w.c")
    diag "$model: host waits: 20 steps $a, 60 steps $b, 60 steps with a line each $c;" \
        "event waits $(events_of "$T/w.a"), $(events_of "$T/w.b"), $(events_of "$T/w.c")"
    is "$b" "$a" "$model: 40 more steps, no more host waits ($a and $b)"
    DESC="$model: a log line every step: a readback each ($c - $b >= 50)" \
        ok test $((c - b)) -ge 50
    is "$(hash_of "$T/out.c")" "$(hash_of "$T/out.b")" "$model: the same weights, whatever the log cadence"
done

# one rank, NCCL, the communication thread forced: the buckets queued one behind the other
nccl() { # name steps
    rm -f "$T/w.$1"
    MG_TEST_COMM_THREAD=1 MG_CUDAWAITS_OUT="$T/w.$1" LD_PRELOAD=$LIB "$MGLAUNCH" \
        --nproc_per_node 1 --log_dir "$T/logs.$1" "$TRAIN" $ARGS --model cnn --steps "$2" \
        --log-every 1000 --bucket-cap-mb 0.01 --snapshot-every 0 >"$T/out.$1" 2>&1
}
nccl n1 20 && nccl n2 60
is $? 0 "1 rank on NCCL, the communication thread forced, many buckets"
like "$(cat "$T/out.n2")" "nccl [0-9.]+ \\(1 rank on 1 host\\)" "... on NCCL"
a=$(waits_of "$T/w.n1") b=$(waits_of "$T/w.n2")
diag "NCCL, forced thread: host waits 20 steps $a, 60 steps $b"
is "$b" "$a" "... 40 more steps, no more host waits from mg ($a and $b)"
done_testing
