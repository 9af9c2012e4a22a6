#!/bin/sh
# Benchmark: mg's `train` against the same loop in PyTorch (tests/bench/train_ref.py),
# side by side, single process, 1 thread, SGD momentum 0.9, batch 64, lr 0.05 (mlp) /
# 0.02 (cnn), seed 0, Fashion-MNIST. Prints a table with throughput ratios, accuracy,
# and the GFLOP/s mg achieves against the single-core sgemm peak measured through the
# same BLAS. It checks its own results: an accuracy below target (MLP 0.86, CNN 0.90)
# or more than 1 point below PyTorch's fails the benchmark.
#
#   tests/bench/train_bench.sh                  both models, 5 epochs
#   MODELS=mlp EPOCHS=1 tests/bench/train_bench.sh
#   REPEAT=3      run each side 3 times, keep the best throughput (noisy machines)
#   STRICT=1      also fail when a throughput target (MLP 1.5x, CNN 1.2x) is missed
#   NO_TORCH=1    mg only
#   OPENBLAS_CORETYPE=SkylakeX tests/bench/train_bench.sh
#                 both sides with OpenBLAS's AVX-512 kernels (PyTorch's Linear uses the
#                 same OpenBLAS; its convolutions use oneDNN, which picks its own)
set -u
TOP=$(cd "$(dirname "$0")/../.." && pwd)
B=${MG_BUILD:-build}
case $B in /*) ;; *) B=$TOP/$B ;; esac
TRAIN=$B/bin/train
PEAK=$B/tests/helpers/blas_peak
PY=/usr/bin/python3
MODELS=${MODELS:-mlp cnn}
EPOCHS=${EPOCHS:-5}
REPEAT=${REPEAT:-1}
[ -x "$TRAIN" ] || { echo "train_bench: build first (make)" >&2; exit 1; }
have_torch=1
[ "${NO_TORCH:-0}" = 1 ] && have_torch=0
$PY -c 'import torch' 2>/dev/null || have_torch=0
[ $have_torch = 1 ] || echo "train_bench: PyTorch not available: mg only (apt-get install python3-torch)" >&2

# one thread everywhere, for both sides (PyTorch's BLAS ignores torch.set_num_threads)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

peak=$("$PEAK" 1 2>/dev/null || echo "? 0 0")
core=$(echo "$peak" | cut -d' ' -f1)
peak1=$(echo "$peak" | cut -d' ' -f2)
peak2=$(echo "$peak" | cut -d' ' -f3)
echo "machine: $(getconf _NPROCESSORS_ONLN) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"
echo "BLAS: OpenBLAS kernels $core (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}); sgemm peak, 1 thread: $peak1 GFLOP/s (1024^3), $peak2 GFLOP/s (2048^3)"
echo "setting: $EPOCHS epochs, batch 64, SGD momentum 0.9, seed 0, 1 thread, best of $REPEAT"
echo

best() { sort -g | tail -1; }
fail=0
rows=""
for model in $MODELS; do
    case $model in
    mlp) lr=0.05 acc_target=0.86 ratio_target=1.5 flops=818176 ;;
    cnn) lr=0.02 acc_target=0.90 ratio_target=1.2 flops=22298112 ;;
    *) echo "train_bench: unknown model $model" >&2; exit 2 ;;
    esac
    : >"$tmp/mg.$model"
    : >"$tmp/pt.$model"
    i=0
    while [ $i -lt "$REPEAT" ]; do
        i=$((i + 1))
        "$TRAIN" --model $model --epochs "$EPOCHS" --lr $lr --momentum 0.9 --batch-size 64 \
            --seed 0 --threads 1 --log-every 100000 >"$tmp/mg.out" 2>&1 ||
            { cat "$tmp/mg.out" >&2; echo "train_bench: mg $model failed" >&2; exit 1; }
        sed -n 's/.*done: test accuracy \([0-9.]*\).* samples in [0-9.]* s (\([0-9]*\) samples\/s).*/\1 \2/p' \
            "$tmp/mg.out" >>"$tmp/mg.$model"
        if [ $have_torch = 1 ]; then
            $PY "$TOP/tests/bench/train_ref.py" --model $model --epochs "$EPOCHS" --lr $lr \
                --momentum 0.9 --batch-size 64 --seed 0 >"$tmp/pt.out" 2>&1 ||
                { cat "$tmp/pt.out" >&2; echo "train_bench: PyTorch $model failed" >&2; exit 1; }
            $PY -c 'import json,sys; r=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print(r["test_accuracy"], r["samples_per_s"])' \
                "$tmp/pt.out" >>"$tmp/pt.$model"
        fi
    done
    mg_acc=$(cut -d' ' -f1 "$tmp/mg.$model" | head -1)
    mg_sps=$(cut -d' ' -f2 "$tmp/mg.$model" | best)
    gflops=$(awk -v f=$flops -v s="$mg_sps" 'BEGIN { printf "%.1f", f * s / 1e9 }')
    pct=$(awk -v g="$gflops" -v p="$peak1" 'BEGIN { if (p > 0) printf "%.0f%%", 100 * g / p; else print "?" }')
    if [ $have_torch = 1 ]; then
        pt_acc=$(cut -d' ' -f1 "$tmp/pt.$model" | head -1)
        pt_sps=$(cut -d' ' -f2 "$tmp/pt.$model" | best)
        ratio=$(awk -v a="$mg_sps" -v b="$pt_sps" 'BEGIN { printf "%.2f", a / b }')
    else
        pt_acc=- pt_sps=- ratio=-
    fi
    verdict=ok
    # the absolute targets are for 5 epochs; shorter runs are only compared with PyTorch
    if [ "$EPOCHS" -ge 5 ] && awk -v a="$mg_acc" -v t=$acc_target 'BEGIN { exit !(a < t) }'; then
        verdict="FAIL: accuracy below $acc_target"
        fail=1
    elif [ "$pt_acc" != - ] && awk -v a="$mg_acc" -v b="$pt_acc" 'BEGIN { exit !(a < b - 0.01) }'; then
        verdict="FAIL: accuracy over 1 point below PyTorch"
        fail=1
    elif [ "$ratio" != - ] && awk -v r="$ratio" -v t=$ratio_target 'BEGIN { exit !(r < t) }'; then
        verdict="throughput below ${ratio_target}x"
        [ "${STRICT:-0}" = 1 ] && fail=1
    fi
    rows="$rows$(printf '%-5s %12s %12s %7s %8s %8s %9s %8s  %s' $model "$mg_sps" "$pt_sps" "${ratio}x" "$mg_acc" "$pt_acc" "$gflops" "$pct" "$verdict")
"
done
printf '%-5s %12s %12s %7s %8s %8s %9s %8s  %s\n' model "mg samp/s" "torch samp/s" ratio "mg acc" "torch acc" "mg GFLOP/s" "of peak" check
printf '%s' "$rows"
exit $fail
