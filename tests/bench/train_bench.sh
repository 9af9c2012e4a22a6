#!/bin/sh
# Benchmark: mg's `train` against the same loop in PyTorch (tests/bench/train_ref.py),
# side by side, single process, 1 thread, SGD momentum 0.9, batch 64, lr 0.05 (mlp) /
# 0.02 (cnn), seed 0, Fashion-MNIST. Prints a table with throughput ratios, accuracy,
# and the GFLOP/s mg achieves against the single-core sgemm peak measured through the
# same BLAS (the best of square sizes 256 to 2048). GFLOP/s count the dense work of
# forward + backward (no input gradient for the first layer): 0.818 MFLOP per sample
# for the mlp, 22.3 for the cnn. mg's backward skips the zeros that ReLU (linear) and
# max-pool (conv) leave in the gradients, so either figure can pass the sgemm peak.
# It checks its own results: an accuracy more than 1 point below PyTorch's, or one
# that shows the model is not learning, fails the benchmark; missed targets (accuracy
# MLP 0.86 / CNN 0.90 after 5 epochs, throughput MLP 1.5x / CNN 1.2x) are reported.
#
#   tests/bench/train_bench.sh                  both models, 5 epochs
#   MODELS=mlp EPOCHS=1 tests/bench/train_bench.sh
#   REPEAT=3      run each side 3 times, keep the best throughput (noisy machines)
#   STRICT=1      also fail when a target is missed
#   NO_TORCH=1    mg only
#   env -u OPENBLAS_CORETYPE tests/bench/train_bench.sh
#   OPENBLAS_CORETYPE=Haswell tests/bench/train_bench.sh
#                 choose OpenBLAS's kernels for both sides (unset: OpenBLAS picks from
#                 the CPU). PyTorch's Linear uses the same OpenBLAS; its convolutions
#                 use oneDNN, which always picks its own (AVX-512 where the CPU has it).
. "$(dirname "$0")/../lib/bench.sh"
PEAK=$HELPERS/blas_peak
MODELS=${MODELS:-mlp cnn}
EPOCHS=${EPOCHS:-5}
REPEAT=${REPEAT:-1}
need "$TRAIN" "$PEAK"
use_torch=1
[ "${NO_TORCH:-0}" = 1 ] && use_torch=0
[ $use_torch = 0 ] || have_torch || use_torch=0
[ $use_torch = 1 ] || echo "train_bench: PyTorch not available: mg only (apt-get install python3-torch)" >&2

# one thread everywhere, for both sides (PyTorch's BLAS ignores torch.set_num_threads)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

measure_peak() {
    "$PEAK" 1 2>/dev/null | awk '{ m = 0; for (i = 2; i <= NF; i++) if ($i > m) m = $i; print m }'
}
peak1=$(measure_peak)
core=$("$PEAK" 1 2>/dev/null | cut -d' ' -f1)
echo "machine: $(getconf _NPROCESSORS_ONLN) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"
echo "BLAS: OpenBLAS kernels $core (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset})"
echo "setting: $EPOCHS epochs, batch 64, SGD momentum 0.9, seed 0, 1 thread, best of $REPEAT"
echo

best() { sort -g | tail -1; }
fail=0
rows=""
for model in $MODELS; do
    case $model in
    mlp) lr=0.05 acc_target=0.86 acc_floor=0.80 ratio_target=1.5 flops=818176 ;;
    cnn) lr=0.02 acc_target=0.90 acc_floor=0.85 ratio_target=1.2 flops=22298112 ;;
    *) echo "train_bench: unknown model $model" >&2; exit 2 ;;
    esac
    : >"$T/mg.$model"
    : >"$T/pt.$model"
    i=0
    while [ $i -lt "$REPEAT" ]; do
        i=$((i + 1))
        "$TRAIN" --model $model --epochs "$EPOCHS" --lr $lr --momentum 0.9 --batch-size 64 \
            --seed 0 --threads 1 --log-every 100000 >"$T/mg.out" 2>&1 ||
            { cat "$T/mg.out" >&2; echo "train_bench: mg $model failed" >&2; exit 1; }
        sed -n 's/.*done: test accuracy \([0-9.]*\).* samples in [0-9.]* s (\([0-9]*\) samples\/s).*/\1 \2/p' \
            "$T/mg.out" >>"$T/mg.$model"
        if [ $use_torch = 1 ]; then
            $PY "$TOP/tests/bench/train_ref.py" --model $model --epochs "$EPOCHS" --lr $lr \
                --momentum 0.9 --batch-size 64 --seed 0 >"$T/pt.out" 2>&1 ||
                { cat "$T/pt.out" >&2; echo "train_bench: PyTorch $model failed" >&2; exit 1; }
            $PY -c 'import json,sys; r=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print(r["test_accuracy"], r["samples_per_s"])' \
                "$T/pt.out" >>"$T/pt.$model"
        fi
    done
    mg_acc=$(cut -d' ' -f1 "$T/mg.$model" | head -1)
    mg_sps=$(cut -d' ' -f2 "$T/mg.$model" | best)
    gflops=$(awk -v f=$flops -v s="$mg_sps" 'BEGIN { printf "%.1f", f * s / 1e9 }')
    if [ $use_torch = 1 ]; then
        pt_acc=$(cut -d' ' -f1 "$T/pt.$model" | head -1)
        pt_sps=$(cut -d' ' -f2 "$T/pt.$model" | best)
        ratio=$(awk -v a="$mg_sps" -v b="$pt_sps" 'BEGIN { printf "%.2f", a / b }')
    else
        pt_acc=- pt_sps=- ratio=-
    fi
    # correctness: a wrong implementation fails; targets that are missed are reported
    verdict=ok
    if awk -v a="$mg_acc" -v f=$acc_floor 'BEGIN { exit !(a < f) }'; then
        verdict="FAIL: accuracy below $acc_floor, the model is not learning"
        fail=1
    elif [ "$pt_acc" != - ] && awk -v a="$mg_acc" -v b="$pt_acc" 'BEGIN { exit !(a < b - 0.01) }'; then
        verdict="FAIL: accuracy over 1 point below PyTorch"
        fail=1
    else
        if [ "$EPOCHS" -ge 5 ] && awk -v a="$mg_acc" -v t=$acc_target 'BEGIN { exit !(a < t) }'; then
            verdict="MISS: accuracy target $acc_target"
            [ "${STRICT:-0}" = 1 ] && fail=1
        fi
        if [ "$ratio" != - ] && awk -v r="$ratio" -v t=$ratio_target 'BEGIN { exit !(r < t) }'; then
            verdict="MISS: throughput target ${ratio_target}x"
            [ "${STRICT:-0}" = 1 ] && fail=1
        fi
    fi
    rows="$rows$model|$mg_sps|$pt_sps|${ratio}x|$mg_acc|$pt_acc|$gflops|$verdict
"
done
# the peak again at the end: the best of both, as a busy machine lowers either
peak2=$(measure_peak)
peak=$(awk -v a="$peak1" -v b="$peak2" 'BEGIN { print (a > b ? a : b) }')
echo "sgemm peak, 1 thread, best of square 256 to 2048: $peak GFLOP/s"
echo
printf '%-5s %12s %12s %7s %8s %8s %9s %8s  %s\n' model "mg samp/s" "torch samp/s" ratio "mg acc" "torch acc" "mg GFLOP/s" "of peak" check
printf '%s' "$rows" | while IFS='|' read -r m a b r c d g v; do
    pct=$(awk -v g="$g" -v p="$peak" 'BEGIN { if (p > 0) printf "%.0f%%", 100 * g / p; else print "?" }')
    printf '%-5s %12s %12s %7s %8s %8s %9s %8s  %s\n' "$m" "$a" "$b" "$r" "$c" "$d" "$g" "$pct" "$v"
done
exit $fail
