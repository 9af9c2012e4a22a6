#!/bin/sh
# Multi-node rendezvous, mglaunch against torchrun (Debian's python3-torch), on
# this machine (every agent on loopback), side by side in one run:
#   - rendezvous time: N agents (--nnodes N, one trivial worker each, c10d),
#     from the moment the last agent was started to the moment the last worker
#     is running (each worker stamps CLOCK_MONOTONIC first thing), N = 2 8 32 128.
#     torchrun runs where it can: each of its agents is a Python process of
#     ~200 MB, so by default only N <= 8 (MG_BENCH_TR_MAX raises it).
#   - dead-node detection: 3 agents with --nnodes 2:3, one SIGKILLed; the time
#     from the SIGKILL to the survivors' workers running again, over trials
#     (c10d, and etcd when etcd-server is installed), with the default
#     heartbeat settings (interval 1 s, timeout 5 s).
# Every run must succeed with every rank once, or the benchmark fails.
# Knobs: MG_BENCH_REPS (mglaunch runs per N, 3), MG_BENCH_TREPS (torchrun, 1),
# MG_BENCH_NS ("2 8 32 128"), MG_BENCH_TR_MAX (8), MG_BENCH_TRIALS (10).
set -u
TOP=$(cd "$(dirname "$0")/../.." && pwd)
MG_BUILD=${MG_BUILD:-build}
case $MG_BUILD in /*) ;; *) MG_BUILD=$TOP/$MG_BUILD ;; esac
MGLAUNCH=$MG_BUILD/bin/mglaunch
H=$MG_BUILD/tests/helpers
W=$H/mn_worker
TORCHRUN=${TORCHRUN:-/usr/bin/torchrun}
REPS=${MG_BENCH_REPS:-3}
TREPS=${MG_BENCH_TREPS:-1}
NS=${MG_BENCH_NS:-"2 8 32 128"}
TR_MAX=${MG_BENCH_TR_MAX:-8}
TRIALS=${MG_BENCH_TRIALS:-10}
OUT=$TOP/tests/bench/out
T=$(mktemp -d "${TMPDIR:-/tmp}/mgbench.XXXXXX")
PIDS=""
ETCD_PID=""
cleanup() {
    for p in $PIDS $ETCD_PID; do kill -KILL "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
export TMPDIR=$T
mkdir -p "$OUT"
for b in "$MGLAUNCH" "$W" "$H/fakeworker" "$H/freeport"; do
    [ -x "$b" ] || { echo "rdzv.sh: $b missing (run make)" >&2; exit 1; }
done
have_torchrun=0
[ -x "$TORCHRUN" ] && have_torchrun=1
TR_ARGS="--monitor_interval 0.1 -r 1 -t 1"
fail=0
ulimit -n 65536 2>/dev/null

now_ns() {
    rm -f "$T/now"
    "$H/fakeworker" stamp "$T/now"
    cat "$T/now"
}
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "" }'; }
ms() { awk -v ns="$1" 'BEGIN { if (ns == "") print "-"; else printf "%.1f ms", ns / 1e6 }'; }

# one_run TOOL N: starts N agents; prints the rendezvous time in ns, or fails.
one_run() {
    tool=$1
    n=$2
    port=$("$H/freeport")
    st=$T/stamps.$tool.$n
    rm -f "$st"
    PIDS=""
    i=0
    while [ $i -lt "$n" ]; do
        if [ "$tool" = mg ]; then
            host=0
            [ $i = 0 ] && host=1
            "$MGLAUNCH" --nnodes "$n" --nproc_per_node 1 --rdzv_backend c10d \
                --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "b$n" \
                --rdzv_conf "is_host=$host,join_timeout=120" "$W" --stamp "$st" \
                >"$T/agent.$i.log" 2>&1 &
        else
            # shellcheck disable=SC2086
            "$TORCHRUN" --nnodes "$n" --nproc_per_node 1 --rdzv_backend c10d \
                --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "b$n" $TR_ARGS --no_python \
                "$W" --stamp "$st" >"$T/agent.$i.log" 2>&1 &
        fi
        PIDS="$PIDS $!"
        i=$((i + 1))
    done
    t0=$(now_ns)
    bad=0
    for p in $PIDS; do wait "$p" || bad=$((bad + 1)); done
    PIDS=""
    got=$(wc -l <"$st" 2>/dev/null | tr -d ' ')
    ranks=$(sed 's/.* rank=\([0-9]*\) .*/\1/' "$st" 2>/dev/null | sort -n | uniq | wc -l | tr -d ' ')
    if [ "$bad" != 0 ] || [ "$got" != "$n" ] || [ "$ranks" != "$n" ]; then
        echo "rdzv.sh: $tool with $n agents: $bad agent(s) failed, $got worker(s) ran, $ranks distinct rank(s)" >&2
        tail -n 5 "$T/agent.0.log" | sed 's/^/  /' >&2
        return 1
    fi
    last=$(cut -d' ' -f1 "$st" | sort -n | tail -n 1)
    echo $((last - t0))
}

{
echo "mglaunch $("$MGLAUNCH" --version | cut -d' ' -f2) vs torchrun ($( [ $have_torchrun = 1 ] &&
    /usr/bin/python3 -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo "not installed"))"
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo
echo "rendezvous: N agents on loopback, c10d, 1 worker each; last agent started -> last worker running"
echo "(median; mglaunch $REPS runs, torchrun $TREPS; targets: <= 100 ms for 2, <= 1 s for 128)"
printf '  %-5s %14s %14s %9s\n' N mglaunch torchrun ratio
} | tee "$OUT/rdzv.txt"

for n in $NS; do
    r=0
    : >"$T/mg.times"
    while [ $r -lt "$REPS" ]; do
        t=$(one_run mg "$n") || { fail=1; break; }
        echo "$t" >>"$T/mg.times"
        r=$((r + 1))
    done
    mg=$(median <"$T/mg.times")
    tr=""
    if [ $have_torchrun = 1 ] && [ "$n" -le "$TR_MAX" ]; then
        : >"$T/tr.times"
        r=0
        while [ $r -lt "$TREPS" ]; do
            t=$(one_run tr "$n") || { fail=1; break; }
            echo "$t" >>"$T/tr.times"
            r=$((r + 1))
        done
        tr=$(median <"$T/tr.times")
    fi
    tr_txt=$(ms "$tr")
    [ -z "$tr" ] && tr_txt="not run"
    [ $have_torchrun = 0 ] && tr_txt="n/a"
    ratio=$(awk -v a="$mg" -v b="$tr" 'BEGIN { if (a > 0 && b > 0) printf "%.0fx", b / a; else print "-" }')
    printf '  %-5s %14s %14s %9s\n' "$n" "$(ms "$mg")" "$tr_txt" "$ratio" | tee -a "$OUT/rdzv.txt"
done

# detect BACKEND ENDPOINT: dead-node detection trials; prints a summary line.
detect() {
    be=$1
    ep=$2
    : >"$T/detect.$be"
    k=0
    while [ $k -lt "$TRIALS" ]; do
        st=$T/dstamps
        rm -f "$st"
        PIDS=""
        for i in 0 1 2; do
            extra=""
            if [ "$be" = c10d ]; then
                host=0
                [ $i = 0 ] && host=1
                extra=",is_host=$host"
            fi
            "$MGLAUNCH" --nnodes 2:3 --nproc_per_node 1 --rdzv_backend "$be" --rdzv_endpoint "$ep" \
                --rdzv_id "d$k.$$" --rdzv_conf "last_call_timeout=5$extra" \
                "$W" --stamp "$st" --sleep-at 3:120 >"$T/dagent.$i.log" 2>&1 &
            PIDS="$PIDS $!"
        done
        victim=$(echo $PIDS | cut -d' ' -f3)
        end=$(($(date +%s) + 60))
        while [ "$(grep -c 'group_world=3' "$st" 2>/dev/null)" != 3 ] && [ "$(date +%s)" -lt $end ]; do
            sleep 0.02
        done
        sleep 0.3
        tk=$(now_ns)
        kill -KILL "$victim"
        while [ "$(grep -c 'group_world=2' "$st" 2>/dev/null)" -lt 2 ] && [ "$(date +%s)" -lt $end ]; do
            sleep 0.02
        done
        bad=0
        for p in $PIDS; do
            [ "$p" = "$victim" ] && { wait "$p" 2>/dev/null; continue; }
            wait "$p" || bad=1
        done
        PIDS=""
        if [ $bad = 1 ] || [ "$(grep -c 'group_world=2' "$st")" != 2 ]; then
            echo "rdzv.sh: detection trial $k ($be) did not re-form" >&2
            tail -n 5 "$T/dagent.0.log" | sed 's/^/  /' >&2
            return 1
        fi
        last=$(grep 'group_world=2' "$st" | cut -d' ' -f1 | sort -n | tail -n 1)
        echo $((last - tk)) >>"$T/detect.$be"
        k=$((k + 1))
    done
    sort -n "$T/detect.$be" | awk -v be="$be" -v n="$TRIALS" '
        { v[NR] = $1 / 1e6 }
        END { printf "  %-5s %3d trials: min %6.0f  median %6.0f  p90 %6.0f  max %6.0f ms  (target <= 6000 ms)\n",
              be, NR, v[1], v[int((NR + 1) / 2)], v[int(NR * 0.9 + 0.999)], v[NR] }'
}

{
echo
echo "dead-node detection: 3 agents, --nnodes 2:3, one SIGKILLed; SIGKILL -> survivors' workers"
echo "running again (default heartbeat_interval 1 s, heartbeat_timeout 5 s)"
} | tee -a "$OUT/rdzv.txt"
detect c10d "127.0.0.1:$("$H/freeport")" >"$T/d.txt" || fail=1
tee -a "$OUT/rdzv.txt" <"$T/d.txt"
if [ -x /usr/bin/etcd ]; then
    cport=$("$H/freeport")
    pport=$("$H/freeport")
    /usr/bin/etcd --name default --data-dir "$T/etcd" --listen-client-urls "http://127.0.0.1:$cport" \
        --advertise-client-urls "http://127.0.0.1:$cport" --listen-peer-urls "http://127.0.0.1:$pport" \
        --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
        --initial-cluster "default=http://127.0.0.1:$pport" >"$T/etcd.log" 2>&1 &
    ETCD_PID=$!
    sleep 1.5
    detect etcd "127.0.0.1:$cport" >"$T/d.txt" || fail=1
    tee -a "$OUT/rdzv.txt" <"$T/d.txt"
else
    echo "  etcd  not installed" | tee -a "$OUT/rdzv.txt"
fi
echo "  torchrun: no detection; a dead peer is noticed when a collective times out" | tee -a "$OUT/rdzv.txt"
exit $fail
