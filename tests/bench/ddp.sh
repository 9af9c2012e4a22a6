#!/bin/sh
# Data-parallel training on this host: mg's train under mglaunch against
# PyTorch DistributedDataParallel over Gloo (tests/bench/ddp_ref.py), same
# models, same data (Fashion-MNIST), batch 64 per process, one thread per
# process, side by side in one run. Then the accuracy of 2 processes against 1
# with the same effective batch (CNN, one epoch).
#
#   tests/bench/ddp.sh [--quick] [--mg-only] [--repeat N]
#                                     (run from the top of the tree, after make)
#
# --mg-only skips PyTorch and the accuracy runs; --repeat N runs each mg figure
# N times, alternating 1 and 2 processes, and reports the medians (the runs are
# listed under the table): on a machine shared with other work one run says
# little. Each figure also gets the rate of two independent 1-process runs at
# once (no communication), the ceiling this machine puts on 2 processes, and
# mg's 2-process rate with --zero 1 (ZeRO-1, a sharded optimizer; the same
# weights) against it too.
#
# Targets (issue 4): 2 processes, mg >= 3x PyTorch for the MLP and >= 1.5x for
# the CNN; mg's 2-process scaling efficiency over its 1-process run >= 85%; the
# 2-process CNN test accuracy within 0.5 points of the 1-process run. Issue 15:
# mg's 2 processes, with and without --zero 1, >= 90% of the two-independent-
# processes ceiling for both models (on a quiet machine).
# Issue 22: the CNN's 2 processes >= 1.8x its 1 process; each figure's FLOP/s
# against the hardware's peak for that many cores (tests/lib/bench.sh's
# peak_gflops: measured clock x FP32 FLOP per cycle of the CPU's best ISA).
# The OpenBLAS kernels both sides run are named; `OPENBLAS_CORETYPE=Prescott
# sh tests/bench/ddp.sh` runs both on the SSE3 fallback that OpenBLAS takes on
# a CPU it does not know (mg's default chooses from the CPU's features).
# Each figure is checked for sense (finite, positive; accuracy above chance).
. "$(dirname "$0")/../lib/bench.sh"
need "$TRAIN" "$MGLAUNCH"
[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
    { echo "ddp.sh: Fashion-MNIST missing (apt-get install dataset-fashion-mnist)" >&2; exit 2; }

MLP_STEPS=2000
CNN_STEPS=300
ACC_EPOCHS=1
MG_ONLY=0
REPEAT=1
while [ $# -gt 0 ]; do
    case $1 in
    --quick) MLP_STEPS=300 CNN_STEPS=40 ACC_EPOCHS=0 ;;
    --mg-only) MG_ONLY=1 ACC_EPOCHS=0 ;;
    --repeat)
        REPEAT=${2:-}
        case $REPEAT in '' | *[!0-9]* | 0) echo "ddp.sh: --repeat needs a count >= 1" >&2; exit 2 ;; esac
        shift ;;
    *) echo "usage: ddp.sh [--quick] [--mg-only] [--repeat N]" >&2; exit 2 ;;
    esac
    shift
done
export OMP_NUM_THREADS=1
fail=0

# mg_rate NPROC ARGS...: samples/s of train's summary line ("... (N samples/s) ...")
mg_rate() {
    n=$1
    shift
    "$MGLAUNCH" --nproc_per_node "$n" "$TRAIN" --log-every 1000000 "$@" >"$T/mg.out" 2>&1 ||
        { sed 's/^/  mg: /' "$T/mg.out" >&2; fail=1; echo 0; return; }
    sed -n 's/.*train: done: .*(\([0-9.]*\) samples\/s).*/\1/p' "$T/mg.out" | tail -n 1
}
# pair_rate ARGS...: the summed samples/s of two independent 1-process runs at
# the same time, without communication: what this machine gives two processes
# at all (shared caches, memory bandwidth, a busy neighbour on a VM). mg's
# 2-process rate over it is what communication costs.
pair_rate() {
    spawn "$TRAIN" --log-every 1000000 "$@" >"$T/pair.a" 2>&1
    "$TRAIN" --log-every 1000000 "$@" >"$T/pair.b" 2>&1 || fail=1
    reap || fail=1
    cat "$T/pair.a" "$T/pair.b" | sed -n 's/.*train: done: .*(\([0-9.]*\) samples\/s).*/\1/p' |
        awk '{ s += $1; n++ } END { print (n == 2) ? s : 0 }'
}
mg_acc() { sed -n 's/.*train: done: test accuracy \([0-9.]*\).*/\1/p' "$T/mg.out" | tail -n 1; }

# median_mean: the median of the numbers on stdin, the mean of the two middle
# ones for an even count (--repeat's runs)
median_mean() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; else print 0 }'; }

use_torch=0
[ $MG_ONLY = 1 ] || ! have_torch || use_torch=1
# torch_rate NPROC ARGS...: samples/s of ddp_ref.py
torch_rate() {
    n=$1
    shift
    [ $use_torch = 1 ] || { echo 0; return; }
    run_ranks "$n" "$T/torch" $PY "$TOP/tests/bench/ddp_ref.py" "$@" ||
        { cat "$T"/torch.err.* >&2; fail=1; echo 0; return; }
    sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' "$T/torch.out.0"
}

need "$HELPERS/blas_info"
_CPU_GHZ=$(cpu_ghz) # measured once, before the runs
echo "DDP training, $(host_line); batch 64 per process, 1 thread each"
echo "kernels: mg $("$HELPERS/blas_info" | sed -n 2p) (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset})"
echo "peak: $(peak_gflops 1 | awk '{ printf "%s GFLOP/s per core (%s, %s FLOP/cycle)", $1, $2, $3 }') at $_CPU_GHZ GHz (measured)"
if [ $MG_ONLY = 1 ]; then
    echo "(--mg-only: no PyTorch columns)"
elif [ $use_torch = 0 ]; then
    echo "(python3-torch not installed: no PyTorch columns; scripts/deps.sh --bench installs it)"
fi
[ "$REPEAT" = 1 ] || echo "(mg figures: medians of $REPEAT runs each)"
printf '%-5s | %12s %12s %9s | %12s %12s | %8s %8s\n' model "mg 1 proc" "mg 2 proc" "scaling" \
    "torch 1 proc" "torch 2 proc" "mg/torch" "target"
printf '%s\n' "------+----------------------------------------+---------------------------+------------------"
for model in mlp cnn; do
    steps=$MLP_STEPS
    [ $model = cnn ] && steps=$CNN_STEPS
    : >"$T/runs1"
    : >"$T/runs2"
    : >"$T/runsp"
    : >"$T/runsz"
    for i in $(seq "$REPEAT"); do
        mg_rate 1 --model $model --steps "$steps" --batch-size 64 >>"$T/runs1"
        mg_rate 2 --model $model --steps "$steps" --batch-size 64 >>"$T/runs2"
        pair_rate --model $model --steps "$steps" --batch-size 64 >>"$T/runsp"
        mg_rate 2 --model $model --steps "$steps" --batch-size 64 --zero 1 >>"$T/runsz"
    done
    m1=$(median_mean <"$T/runs1")
    m2=$(median_mean <"$T/runs2")
    mp=$(median_mean <"$T/runsp")
    mz=$(median_mean <"$T/runsz")
    [ "$REPEAT" = 1 ] ||
        echo "$model: 1 process $(tr '\n' ' ' <"$T/runs1")| 2 processes $(tr '\n' ' ' <"$T/runs2")| 2 alone $(tr '\n' ' ' <"$T/runsp")| 2 with --zero 1 $(tr '\n' ' ' <"$T/runsz")" >>"$T/runs"
    awk -v model=$model -v m2="$m2" -v mp="$mp" -v mz="$mz" 'BEGIN { if (mp > 0)
        printf "%s: 2 independent processes at once (no communication): %.0f; mg 2 proc = %.0f%% of that, with --zero 1 (%.0f) %.0f%% (target >= 90%%: %s)\n",
               model, mp, 100 * m2 / mp, mz, 100 * mz / mp,
               (m2 >= 0.9 * mp && mz >= 0.9 * mp) ? "met" : "MISSED" }' >>"$T/pairs"
    t1=$(torch_rate 1 --model $model --steps "$steps" --batch-size 64)
    t2=$(torch_rate 2 --model $model --steps "$steps" --batch-size 64)
    target=3
    [ $model = cnn ] && target=1.5
    awk -v model=$model -v f="$(model_flops $model)" -v m1="$m1" -v m2="$m2" -v p1="$(peak_gflops 1 | cut -d' ' -f1)" \
        -v p2="$(peak_gflops 2 | cut -d' ' -f1)" 'BEGIN {
        g1 = f * m1 / 1e9; g2 = f * m2 / 1e9
        printf "%s: %.2f MFLOP/sample; 1 process %.1f GFLOP/s = %.0f%% of 1 core'"'"'s peak, 2 processes %.1f GFLOP/s = %.0f%% of 2 cores'"'"'; 2 proc / 1 proc = %.2fx%s\n",
               model, f / 1e6, g1, (p1 > 0) ? 100 * g1 / p1 : 0, g2, (p2 > 0) ? 100 * g2 / p2 : 0,
               (m1 > 0) ? m2 / m1 : 0, (model == "cnn") ? ((m2 >= 1.8 * m1) ? " (target >= 1.8x: met)" : " (target >= 1.8x: MISSED)") : "" }' >>"$T/flops"
    awk -v model=$model -v m1="$m1" -v m2="$m2" -v t1="$t1" -v t2="$t2" -v target=$target '
    BEGIN {
        eff = (m1 > 0) ? m2 / (2 * m1) : 0; ratio = (t2 > 0) ? m2 / t2 : 0
        t1s = (t1 > 0) ? sprintf("%.0f", t1) : "-"; t2s = (t2 > 0) ? sprintf("%.0f", t2) : "-"
        rs = (ratio > 0) ? sprintf("%.2fx", ratio) : "-"
        verdict = ((ratio >= target || ratio == 0) && eff >= 0.85) ? "met" : "MISSED"
        printf "%-5s | %12.0f %12.0f %8.0f%% | %12s %12s | %7s %5sx %s\n", model, m1, m2,
               100 * eff, t1s, t2s, rs, target, verdict
    }' | tee -a "$T/table"
    for v in "$m1" "$m2" "$mz"; do
        awk -v v="$v" 'BEGIN { exit !(v > 0) }' || { echo "mg gave no rate for $model" >&2; fail=1; }
    done
done

[ -s "$T/flops" ] && { echo; echo "compute (dense FLOP of forward + backward per sample):"; sed 's/^/  /' "$T/flops"; }
[ -s "$T/pairs" ] && { echo; echo "the machine's own 2-process ceiling:"; sed 's/^/  /' "$T/pairs"; }
[ -s "$T/runs" ] && { echo; echo "runs (samples/s):"; sed 's/^/  /' "$T/runs"; }

if [ "$ACC_EPOCHS" -gt 0 ]; then
    echo
    echo "accuracy, CNN, $ACC_EPOCHS epoch, effective batch 64, lr 0.02:"
    mg_rate 1 --model cnn --epochs "$ACC_EPOCHS" --batch-size 64 >/dev/null
    a1=$(mg_acc)
    mg_rate 2 --model cnn --epochs "$ACC_EPOCHS" --batch-size 32 >/dev/null
    a2=$(mg_acc)
    awk -v a1="$a1" -v a2="$a2" 'BEGIN {
        d = 100 * (a2 - a1); if (d < 0) d = -d
        v = (d <= 0.5) ? "met" : "MISSED"
        printf "  1 process x 64: %.4f   2 processes x 32: %.4f   difference %.2f points (target <= 0.5): %s\n",
               a1, a2, d, v
        exit !(a1 > 0.5 && a2 > 0.5)
    }' || { echo "accuracy run failed or below chance" >&2; fail=1; }
fi
exit $fail
