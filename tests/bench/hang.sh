#!/bin/sh
# Seconds lost to a hang, mg against torchrun + PyTorch, side by side in one
# run: 2 processes doing steps of 1 ms of computation and an allreduce of
# 64 KB (`comm_rank steps`, libmg; tests/bench/hang_ref.py, Gloo). Rank 1
# freezes: SIGSTOP from outside once steps run, or a spin in its own code at
# a step. Measured: from the freeze (the kill's exec, or the spinning rank's
# own stamp) to the end of the restarted group's first step on rank 0.
#
#   - default settings: mglaunch's watchdog as it comes (--hang-timeout 10);
#     torchrun with nothing (Gloo's timeout, 30 minutes: cut off at --cap
#     seconds and shown as "> cap");
#   - a 1 s bound: mglaunch --hang-timeout 1; torchrun with its file-timer
#     watchdog (TORCHELASTIC_ENABLE_FILE_TIMER=1) and every step inside
#     torch's `timer.expires(after=1)`.
#
# Then the watchdog's cost on a healthy run: the progress calls of one step,
# timed (`comm_rank progress-cost`), against train's step (MLP, synthetic
# data, 2 processes: the shortest steps, where a per-step cost shows most);
# and train's throughput with --hang-timeout 0 and with the default,
# alternated (end to end; on a shared machine mostly noise).
# Targets (issue 20): under 15 s by default and under 2 s with a 1 s bound,
# at least 20x torchrun; the watchdog under 1% of step time. Each run is
# checked: the hang must be reported and the group restarted, or the
# benchmark fails.
#
#   tests/bench/hang.sh [--repeat N] [--torch-repeat N] [--cap SECS] [--mg-only]
. "$(dirname "$0")/../lib/bench.sh"
CR=$HELPERS/comm_rank
need "$MGLAUNCH" "$TRAIN" "$CR" "$HELPERS/stampexec"
REPS=3
TREPS=1
CAP=60
MG_ONLY=0
while [ $# -gt 0 ]; do
    case $1 in
    --repeat) REPS=${2:-}; shift ;;
    --torch-repeat) TREPS=${2:-}; shift ;;
    --cap) CAP=${2:-}; shift ;;
    --mg-only) MG_ONLY=1 ;;
    *) echo "usage: hang.sh [--repeat N] [--torch-repeat N] [--cap SECS] [--mg-only]" >&2; exit 2 ;;
    esac
    shift
done
case "$REPS$TREPS$CAP" in *[!0-9]*) echo "hang.sh: --repeat, --torch-repeat and --cap take counts" >&2; exit 2 ;; esac
use_torch=0
[ $MG_ONLY = 1 ] || { have_torch && have_torchrun && use_torch=1; }
export OMP_NUM_THREADS=1
fail=0

secs_between() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f\n", b - a; else print "" }'; }
# wait_lines SECS FILE PATTERN N: until FILE has N lines matching PATTERN
wait_lines() {
    _w=$(($1 * 50))
    while [ $_w -gt 0 ]; do
        _wc=$(grep -c "$3" "$2" 2>/dev/null)
        [ "${_wc:-0}" -ge "$4" ] && return 0
        sleep 0.02
        _w=$((_w - 1))
    done
    return 1
}
rand_sleep() { sleep "$(awk -v s="$$$1" 'BEGIN { srand(s); printf "%.2f", 0.3 + rand() * 0.3 }')"; }

# mg_hang KIND BOUND REP: seconds from the freeze to the restarted first step
mg_hang() {
    o=$T/mg.$1.$2.$3
    at=1000000000
    [ "$1" = spin ] && at=$((300 + $3 * 37))
    spawn "$MGLAUNCH" --nproc_per_node 2 --max_restarts 1 --hang-timeout "$2" "$CR" steps 1000000000 1 \
        "$at" "$( [ "$1" = spin ] && echo spin || echo none)" >"$o" 2>&1
    lp=$!
    v=""
    if wait_lines 60 "$o" "first step done at" 1; then
        if [ "$1" = stop ]; then
            rand_sleep "$3"
            w=$(pgrep -P "$lp" -x comm_rank | sort -n | tail -1)
            "$HELPERS/stampexec" "$T/tk" kill -STOP "$w"
            t0=$(cat "$T/tk")
        else
            wait_lines 60 "$o" "hangs (spin) at" 1
            t0=$(sed -n 's/.*hangs (spin) at \([0-9.]*\).*/\1/p' "$o" | head -1)
        fi
        if wait_lines $((CAP + 30)) "$o" "first step done at" 2; then
            v=$(secs_between "$t0" "$(sed -n 's/.*first step done at \([0-9.]*\) (restart 1).*/\1/p' "$o")")
        fi
    fi
    kill -TERM "$lp" 2>/dev/null
    reap
    grep -q "watchdog: rank 1 .* is hung" "$o" || { diag "mg did not report the hung rank"; v=""; }
    [ -n "$v" ] || { diag "mg run ($1, bound $2) failed:"; tail -n 5 "$o" >&2; return 1; }
    echo "$v"
}

tr_done_at() { sed -n 's/.*"first_step_done": \([0-9.]*\), "restart": '"$2"'.*/\1/p' "$1" | head -1; }

# tr_hang KIND TIMER REP
tr_hang() {
    o=$T/tr.$1.$2.$3
    d=$T/trd.$1.$2.$3
    mkdir -p "$d"
    at=-1
    [ "$1" = spin ] && at=$((300 + $3 * 37))
    tmr=""
    [ "$2" != 0 ] && tmr="--timer $2"
    # shellcheck disable=SC2086
    (cd "$d" && TORCHELASTIC_ENABLE_FILE_TIMER=$( [ "$2" != 0 ] && echo 1 || echo 0) exec "$TORCHRUN" \
        --standalone --nproc_per_node 2 $TR_ARGS --max_restarts 1 "$TOP/tests/bench/hang_ref.py" \
        --kind "$( [ "$1" = spin ] && echo spin || echo none)" --hang-at "$at" $tmr >"$o" 2>&1) &
    tp=$!
    SPAWNED="$SPAWNED $tp"
    v=""
    if wait_lines 120 "$o" '"first_step_done"' 1; then
        if [ "$1" = stop ]; then
            rand_sleep "$3"
            w=$(pgrep -f "hang_ref.py" | sort -n | tail -1)
            "$HELPERS/stampexec" "$T/tk" kill -STOP "$w"
            t0=$(cat "$T/tk")
        else
            wait_lines 60 "$o" '"hang"' 1
            t0=$(sed -n 's/.*{"hang": \([0-9.]*\)}.*/\1/p' "$o" | head -1)
        fi
        if wait_lines "$CAP" "$o" '"first_step_done"' 2; then
            v=$(secs_between "$t0" "$(tr_done_at "$o" 1)")
        else
            v=">$CAP"
        fi
    fi
    kill -TERM "$tp" 2>/dev/null
    sleep 0.5
    pkill -KILL -f hang_ref.py 2>/dev/null
    pkill -KILL -P "$tp" 2>/dev/null
    reap
    [ -n "$v" ] || { diag "torchrun run ($1, timer $2) failed:"; tail -n 5 "$o" >&2; return 1; }
    echo "$v"
}

series() { # NAME COUNT FUNC ARGS...: the values in $T/NAME
    _n=$1 _c=$2
    shift 2
    : >"$T/$_n"
    _i=0
    while [ "$_i" -lt "$_c" ]; do
        "$@" "$_i" >>"$T/$_n" || fail=1
        _i=$((_i + 1))
    done
}
med() { grep -v '^>' "$T/$1" | median; }
capped() { grep -q '^>' "$T/$1" && echo ">$CAP" || med "$1"; }

{
versions_line
machine_line
echo "2 processes, steps of 1 ms + a 64 KB allreduce; rank 1 frozen; medians of $REPS mg and $TREPS PyTorch runs; torch cut off at $CAP s"
} | tee "$OUT/hang.txt"
for kind in stop spin; do
    series "mg.$kind.10" "$REPS" mg_hang "$kind" 10
    series "mg.$kind.1" "$REPS" mg_hang "$kind" 1
    if [ $use_torch = 1 ]; then
        series "tr.$kind.0" "$TREPS" tr_hang "$kind" 0
        series "tr.$kind.1" "$TREPS" tr_hang "$kind" 1
    fi
done

# the watchdog's cost on a healthy run: samples/s, alternated
TARGS="--data synthetic --train-samples 65536 --test-samples 256 --batch-size 32 --epochs 2 --log-every 1000000"
: >"$T/off"
: >"$T/on"
i=0
while [ $i -lt 5 ]; do
    for ht in 0 10; do
        "$MGLAUNCH" --nproc_per_node 2 --hang-timeout $ht "$TRAIN" $TARGS >"$T/healthy.out" 2>&1 ||
            { diag "healthy run failed"; tail -n 3 "$T/healthy.out" >&2; fail=1; }
        s=$(sed -n 's/.*(\([0-9]*\) samples\/s).*/\1/p' "$T/healthy.out")
        [ "$ht" = 0 ] && echo "$s" >>"$T/off" || echo "$s" >>"$T/on"
        grep -q "watchdog" "$T/healthy.out" && { diag "the watchdog spoke on a healthy run"; fail=1; }
    done
    i=$((i + 1))
done
first_line=$(grep -m1 '^train: model' "$T/healthy.out")
pc=$("$MGLAUNCH" --nproc_per_node 1 "$CR" progress-cost 2>&1 | sed -n 's/^\([0-9.]*\) ns per step (recording)$/\1/p')
[ -n "$pc" ] || { diag "progress-cost printed nothing"; fail=1; }

{
echo
printf '%-34s %10s %18s %8s   %s\n' "" mg "torchrun+PyTorch" ratio target
for kind in stop spin; do
    label=$( [ $kind = stop ] && echo "SIGSTOP" || echo "spin in its own code")
    for b in 10 1; do
        m=$(med "mg.$kind.$b")
        t=$( [ $use_torch = 1 ] && capped "tr.$kind.$( [ $b = 10 ] && echo 0 || echo 1)")
        awk -v m="$m" -v t="$t" -v b="$b" -v l="$label" 'BEGIN {
            tt = t; sub(/^>/, "", tt); r = (m > 0 && tt > 0) ? tt / m : 0
            tgt = (b == 10) ? 15 : 2
            cut = (t ~ /^>/ && r < 20)
            printf "%-34s %8.2f s %16s s %8s   < %d s and >= 20x: %s\n",
                l (b == 10 ? ", default" : ", 1 s bound"), m, (t != "" ? t : "-"),
                (r > 0 ? sprintf("%s%.1fx", (t ~ /^>/ ? ">" : ""), r) : "-"), tgt,
                (!(m > 0 && m < tgt) ? "MISSED" : cut ? "time met; ratio unknown (torch cut off)" : (r >= 20 || r == 0) ? "met" : "MISSED") }'
    done
done
off=$(median <"$T/off")
on=$(median <"$T/on")
# a step is 64 samples (2 processes x 32): its time from the throughput without the watchdog
awk -v a="$off" -v b="$on" -v pc="$pc" 'BEGIN { c = (a > 0) ? (a - b) / a * 100 : 0
    st = (a > 0) ? 64 / a * 1e9 : 0; p = (st > 0) ? pc / st * 100 : 0
    printf "%-34s %.0f ns of a %.0f us step: %.3f%% (< 1%%: %s)\n", "watchdog cost, per step", pc, st / 1000, p,
        (p > 0 && p < 1 ? "met" : "MISSED")
    printf "%-34s %s samples/s with it, %s without: %+.1f%% (noise on a shared machine)\n",
        "  end to end, healthy train", b, a, -c }'
echo "  (train, --hang-timeout 10 against 0, alternated 5 times; $first_line)"
echo
echo "torchrun: default = no watchdog (Gloo's 30 min timeout); 1 s bound = its file timer, expires(after=1) around every step"
for f in mg.stop.10 mg.stop.1 mg.spin.10 mg.spin.1; do echo "runs (s) $f: $(tr '\n' ' ' <"$T/$f")"; done
[ $use_torch = 1 ] && for f in tr.stop.0 tr.stop.1 tr.spin.0 tr.spin.1; do echo "runs (s) $f: $(tr '\n' ' ' <"$T/$f")"; done
[ $use_torch = 1 ] || echo "(PyTorch or torchrun not installed, or --mg-only: mg only)"
} | tee -a "$OUT/hang.txt"
[ $fail = 0 ] || diag "FAILED (a run did not succeed; see above)"
exit $fail
