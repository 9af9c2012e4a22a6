#!/bin/sh
# The GPU benchmark (issue 10): NCCL allreduce bus bandwidth by size through
# mg's communicator, beside NCCL's own figure (nccl-tests' all_reduce_perf,
# when it is installed) for the same GPUs and sizes; and the training
# throughput of the MLP and the CNN on one GPU against the CPU backend and
# PyTorch. GPU only: without a usable GPU it says why and measures nothing.
#
#   tests/bench/gpu.sh [SIZES...]      (from the top of the tree, after make)
#
# Targets: the allreduce within 5% of NCCL's own bus bandwidth at each size
# from 1 MB up; training at least PyTorch's samples/s on both models (a miss
# is reported; a wrong accuracy fails).
# Bus bandwidth = size / time x 2(n-1)/n, as nccl-tests computes it. Every
# timed allreduce result is checked (nccl_rank fails on a wrong sum).
. "$(dirname "$0")/../lib/bench.sh"
need "$HELPERS/gpuprobe" "$HELPERS/nccl_rank"

probe=$("$HELPERS/gpuprobe" probe 0)
case $probe in
usable:*) ;;
*)
    echo "gpu.sh: no usable GPU ($probe): nothing to measure"
    exit 0
    ;;
esac
ngpu=$("$HELPERS/gpuprobe" count)
echo "GPU benchmark on $(host_line)"
echo "device 0: ${probe#usable: }"
echo "GPUs: $ngpu"
echo

SIZES=${*:-8 1024 65536 1048576 4194304 16777216 67108864 268435456}
fail=0

# ---- allreduce -----------------------------------------------------------------
world=$ngpu
[ "$world" -gt 8 ] && world=8
if [ "$world" -lt 2 ]; then
    echo "allreduce: not measured: it needs 2 GPUs (this machine has $ngpu)"
else
    if ! run_ranks "$world" "$T/nccl" "$HELPERS/nccl_rank" bench 20 $SIZES; then
        cat "$T"/nccl.err.* >&2
        echo "mg allreduce FAILED" >&2
        fail=1
    fi
    cat "$T/nccl.err.0" >&2
    have_ref=0
    if command -v all_reduce_perf >/dev/null 2>&1; then
        # one process, one thread per GPU: NCCL's own figure; -c 1 checks results
        if all_reduce_perf -b 8 -e 268435456 -f 2 -g "$world" -n 20 -w 5 -c 1 >"$T/ref" 2>&1; then
            have_ref=1
        else
            echo "nccl-tests reference FAILED" >&2
            fail=1
        fi
    else
        echo "(nccl-tests' all_reduce_perf is not on PATH: no NCCL column)"
    fi
    awk -v have_ref=$have_ref -v W="$T" -v n="$world" '
    function human(b) { return b >= 1048576 ? sprintf("%d MB", b / 1048576) : b >= 1024 ? sprintf("%d KB", b / 1024) : sprintf("%d B", b) }
    BEGIN {
        while ((getline l < (W "/nccl.out.0")) > 0) { split(l, f, " "); us[f[1]] = f[2]; bw[f[1]] = f[4]; order[++k] = f[1] }
        # all_reduce_perf rows: size count type redop root time algbw busbw #wrong ... (out of place first)
        if (have_ref) while ((getline l < (W "/ref")) > 0) {
            m = split(l, f, " ")
            if (m >= 8 && f[1] ~ /^[0-9]+$/ && f[3] == "float") ref[f[1]] = f[8]
        }
        printf "allreduce, %d GPUs (bus bandwidth, GB/s)\n", n
        printf "%-8s %10s %10s %10s %8s\n", "size", "mg us", "mg busbw", "nccl busbw", "mg/nccl"
        bad = 0
        for (i = 1; i <= k; i++) {
            s = order[i]
            r = (s in ref) ? ref[s] : ""
            ratio = (r != "" && r + 0 > 0) ? bw[s] / r : 0
            low = ratio > 0 && s + 0 >= 1048576 && ratio < 0.95
            printf "%-8s %10.1f %10.2f %10s %8s%s\n", human(s), us[s], bw[s], (r == "" ? "-" : r),
                   (ratio > 0 ? sprintf("%.3f", ratio) : "-"), (low ? "  < 0.95" : "")
            if (low) bad = 1
        }
        if (have_ref) print bad ? "target missed: below 95% of NCCL at 1 MB or more" : "target met: within 5% of NCCL from 1 MB up"
    }'
fi
echo

# ---- training ------------------------------------------------------------------
# train on GPU 0 against train on the CPU backend (every core) and, when
# PyTorch sees a GPU, the same loop in PyTorch on it (tests/bench/train_ref.py
# --device cuda: FP32, no TF32, as mg). One epoch, batch 64, SGD momentum 0.9.
# Checked: mg's GPU accuracy within 1 point of its CPU's (cosine schedule, so
# that rounding does not move it) and above a floor that says it learns.
EPOCHS=${EPOCHS:-1}
FMNIST=/usr/share/datasets/fashion-mnist
if [ -e "$FMNIST/train-images-idx3-ubyte.gz" ] || [ -e "$FMNIST/train-images-idx3-ubyte" ]; then
    DATA="--data fashion-mnist"
else
    DATA="--data synthetic --train-samples 60000"
    echo "(no Fashion-MNIST in $FMNIST: synthetic data, and no PyTorch column)"
fi
torch_gpu=0
if [ "$DATA" = "--data fashion-mnist" ] &&
    $PY -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    torch_gpu=1
else
    echo "(PyTorch with CUDA is not installed: no PyTorch column)"
fi
# sps_acc FILE: "samples/s accuracy" from train's last line
sps_acc() {
    sed -n 's/.*done: test accuracy \([0-9.]*\) .*samples in [0-9.]* s (\([0-9]*\) samples\/s).*/\2 \1/p' "$1"
}
echo "training, $EPOCHS epoch(s), batch 64 (samples/s; accuracy on the test set)"
printf '%-5s %12s %12s %12s %9s %9s %9s  %s\n' model "mg gpu" "mg cpu" "torch gpu" "gpu/cpu" \
    "gpu/torch" "mg acc" check
for model in mlp cnn; do
    case $model in
    mlp) lr=0.05 floor=0.78 ;;
    cnn) lr=0.02 floor=0.80 ;;
    esac
    args="$DATA --model $model --epochs $EPOCHS --lr $lr --momentum 0.9 --batch-size 64 --seed 0
          --schedule cosine --log-every 1000000"
    "$TRAIN" $args --device cuda >"$T/g.$model" 2>&1 || {
        cat "$T/g.$model" >&2
        fail=1
        continue
    }
    "$TRAIN" $args --device cpu --threads "$(nproc)" >"$T/c.$model" 2>&1 || {
        cat "$T/c.$model" >&2
        fail=1
        continue
    }
    set -- $(sps_acc "$T/g.$model")
    g_sps=$1 g_acc=$2
    set -- $(sps_acc "$T/c.$model")
    c_sps=$1 c_acc=$2
    t_sps=-
    if [ $torch_gpu = 1 ]; then
        $PY "$TOP/tests/bench/train_ref.py" --device cuda --model $model --epochs "$EPOCHS" \
            --lr $lr --momentum 0.9 --batch-size 64 --seed 0 >"$T/t.$model" 2>&1 &&
            t_sps=$($PY -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["samples_per_s"])' "$T/t.$model") ||
            { cat "$T/t.$model" >&2; echo "PyTorch $model FAILED" >&2; fail=1; }
    fi
    check=ok
    if awk -v a="$g_acc" -v f=$floor 'BEGIN { exit !(a < f) }'; then
        check="FAIL: accuracy $g_acc below $floor"
        fail=1
    elif awk -v a="$g_acc" -v c="$c_acc" 'BEGIN { exit !(a < c - 0.01) }'; then
        check="FAIL: accuracy $g_acc over 1 point below the CPU's $c_acc"
        fail=1
    elif [ "$t_sps" != - ] && awk -v a="$g_sps" -v b="$t_sps" 'BEGIN { exit !(a < b) }'; then
        check="MISS: below PyTorch's samples/s"
    fi
    printf '%-5s %12s %12s %12s %9s %9s %9s  %s\n' $model "$g_sps" "$c_sps" "$t_sps" \
        "$(awk -v a="$g_sps" -v b="$c_sps" 'BEGIN { printf "%.1fx", a / b }')" \
        "$([ "$t_sps" = - ] && echo - || awk -v a="$g_sps" -v b="$t_sps" 'BEGIN { printf "%.2fx", a / b }')" \
        "$g_acc" "$check"
done
echo "target: mg gpu at least PyTorch's samples/s on both models"
exit $fail
