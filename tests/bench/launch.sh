#!/bin/sh
# mglaunch against torchrun (Debian's python3-torch), side by side in one run:
#   - startup: `--standalone --nproc_per_node N /bin/true` wall time, N = 1 2 8 32
#   - peak RSS (GNU time's %M: the launcher and the largest worker it waited for)
#   - restart latency: rank 0's failing exit to its replacement's first instruction,
#     measured by the worker itself (CLOCK_MONOTONIC stamps), minus the documented
#     backoff (0 ms for a first restart)
# Every run must succeed and every worker must have run, or the benchmark fails.
# Knobs: MG_BENCH_REPS (mglaunch runs per point, 20), MG_BENCH_TREPS (torchrun, 3).
. "$(dirname "$0")/../lib/bench.sh"
FW=$HELPERS/fakeworker
REPS=${MG_BENCH_REPS:-20}
TREPS=${MG_BENCH_TREPS:-3}
need "$MGLAUNCH" "$FW" "$HELPERS/timeit"
have_time=0
[ -x /usr/bin/time ] && have_time=1
fail=0

ms() { awk -v us="$1" 'BEGIN { printf "%.2f", us / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0) printf "%.0fx", b / a; else print "-" }'; }

# check_ranks TOOL N: every worker ran (each touches a file named after its local rank)
check_ranks() {
    d=$T/ranks.$1.$2
    mkdir -p "$d"
    if [ "$1" = mg ]; then
        "$MGLAUNCH" --standalone --nproc_per_node "$2" "$FW" touch "$d/\${local_rank}" >/dev/null 2>&1
    else
        # shellcheck disable=SC2086
        "$TORCHRUN" --standalone --nproc_per_node "$2" $TR_ARGS --no_python "$FW" \
            touch "$d/\${local_rank}" >/dev/null 2>&1
    fi
    n=$(ls "$d" | wc -l | tr -d ' ')
    if [ "$n" != "$2" ]; then
        echo "launch.sh: $1 with N=$2 ran $n workers" >&2
        fail=1
    fi
}

{
versions_line
machine_line
echo
echo "startup: --standalone --nproc_per_node N /bin/true (median wall; mglaunch $REPS runs, torchrun $TREPS)"
printf '  %-4s %14s %14s %9s\n' N mglaunch torchrun ratio
} | tee "$OUT/launch.txt"

for n in 1 2 8 32; do
    check_ranks mg "$n"
    mg=$("$HELPERS/timeit" "$REPS" "$MGLAUNCH" --standalone --nproc_per_node "$n" /bin/true) || fail=1
    mg_us=${mg%% *}
    tr_txt=n/a
    rt=-
    if have_torchrun; then
        check_ranks tr "$n"
        # shellcheck disable=SC2086
        tr=$("$HELPERS/timeit" "$TREPS" "$TORCHRUN" --standalone --nproc_per_node "$n" $TR_ARGS \
            --no_python /bin/true) || fail=1
        tr_us=${tr%% *}
        tr_txt="$(ms "$tr_us") ms"
        rt=$(ratio "$mg_us" "$tr_us")
    fi
    [ "$n" = 8 ] && mg8=$mg_us
    printf '  %-4s %11s ms %14s %9s\n' "$n" "$(ms "$mg_us")" "$tr_txt" "$rt" | tee -a "$OUT/launch.txt"
done

mgrss=0
trss=n/a
if [ $have_time = 1 ]; then
    mgrss=$(/usr/bin/time -f %M "$MGLAUNCH" --standalone --nproc_per_node 8 /bin/true 2>&1 >/dev/null |
        tail -n 1)
    if have_torchrun; then
        # shellcheck disable=SC2086
        trss=$(/usr/bin/time -f %M "$TORCHRUN" --standalone --nproc_per_node 8 $TR_ARGS --no_python \
            /bin/true 2>&1 >/dev/null | tail -n 1)
    fi
fi
{
echo
echo "peak RSS, N=8 (/usr/bin/time -f %M; includes the largest worker, /bin/true)"
if [ $have_time = 1 ]; then
    printf '  mglaunch %s KiB   torchrun %s KiB   ratio %s\n' "$mgrss" "$trss" \
        "$( [ "$trss" != n/a ] && ratio "$mgrss" "$trss" || echo -)"
else
    echo "  /usr/bin/time not installed (scripts/deps.sh --bench installs it)"
fi
} | tee -a "$OUT/launch.txt"

# latency TOOL N REP: one restart; prints microseconds from rank 0's failing exit
# to its replacement's start (the worker stamps both).
latency() {
    d=$T/lat.$1.$2.$3
    mkdir -p "$d"
    set -- "$1" "$2" "$d"
    args="'if' restart=0 sleep 0.3 'if' rank=0,restart=0 stamp $d/fail"
    args="$args 'if' rank=0,restart=0 exit 1 'if' restart=0 sleep 30 'if' rank=0 stamp $d/start"
    if [ "$1" = mg ]; then
        eval "\"\$MGLAUNCH\" --standalone --nproc_per_node $2 --max_restarts 1 \"\$FW\" $args" \
            >/dev/null 2>&1
    else
        eval "\"\$TORCHRUN\" --standalone --nproc_per_node $2 $TR_ARGS --max_restarts 1 --no_python \
            \"\$FW\" $args" >/dev/null 2>&1
    fi
    rc=$?
    if [ $rc != 0 ] || [ ! -s "$d/fail" ] || [ ! -s "$d/start" ]; then
        echo "launch.sh: $1 restart run (N=$2) failed (exit $rc)" >&2
        return 1
    fi
    echo $((($(cat "$d/start") - $(cat "$d/fail")) / 1000))
}

{
echo
echo "restart latency: rank 0 exits 1 -> its replacement starts (--max_restarts 1; backoff 0 ms"
echo "  for a first restart, subtracted; N=8: the other 7 are stopped first; medians)"
printf '  %-4s %14s %14s %9s\n' N mglaunch torchrun ratio
} | tee -a "$OUT/launch.txt"
lreps=$(( REPS / 2 ))
[ $lreps -lt 3 ] && lreps=3
for n in 1 8; do
    i=0
    : >"$T/lat.mg"
    while [ $i -lt $lreps ]; do
        latency mg "$n" $i >>"$T/lat.mg" || fail=1
        i=$((i + 1))
    done
    mg_us=$(median <"$T/lat.mg")
    [ "$n" = 1 ] && lat1=$mg_us
    tr_txt=n/a
    rt=-
    if have_torchrun; then
        i=0
        : >"$T/lat.tr"
        while [ $i -lt "$TREPS" ]; do
            latency tr "$n" $i >>"$T/lat.tr" || fail=1
            i=$((i + 1))
        done
        tr_us=$(median <"$T/lat.tr")
        tr_txt="$(ms "$tr_us") ms"
        rt=$(ratio "$mg_us" "$tr_us")
    fi
    printf '  %-4s %11s ms %14s %9s\n' "$n" "$(ms "$mg_us")" "$tr_txt" "$rt" | tee -a "$OUT/launch.txt"
done

{
echo
echo "targets (informational; timings are noisy on shared machines):"
awk -v v="${mg8:-0}" 'BEGIN { printf "  startup N=8 <= 10 ms:          %.2f ms  %s\n", v/1000, (v <= 10000 ? "met" : "MISSED") }'
awk -v v="${mgrss:-0}" 'BEGIN { printf "  peak RSS <= 4 MiB:             %d KiB  %s\n", v, (v > 0 && v <= 4096 ? "met" : "MISSED") }'
awk -v v="${lat1:-0}" 'BEGIN { printf "  restart latency <= 5 ms:       %.2f ms  %s\n", v/1000, (v <= 5000 ? "met" : "MISSED") }'
} | tee -a "$OUT/launch.txt"
[ $fail = 0 ] || echo "launch.sh: FAILED (a run did not succeed; see above)" >&2
exit $fail
