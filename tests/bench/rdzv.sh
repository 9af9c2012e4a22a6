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
. "$(dirname "$0")/../lib/bench.sh"
. "$TOP/tests/lib/etcd.sh"
W=$HELPERS/mn_worker
REPS=${MG_BENCH_REPS:-3}
TREPS=${MG_BENCH_TREPS:-1}
NS=${MG_BENCH_NS:-"2 8 32 128"}
TR_MAX=${MG_BENCH_TR_MAX:-8}
TRIALS=${MG_BENCH_TRIALS:-10}
need "$MGLAUNCH" "$W" "$HELPERS/fakeworker" "$HELPERS/freeport"
fail=0
ulimit -n 65536 2>/dev/null

now_ns() {
    rm -f "$T/now"
    "$HELPERS/fakeworker" stamp "$T/now"
    cat "$T/now"
}
ms() { awk -v ns="$1" 'BEGIN { if (ns == "") print "-"; else printf "%.1f ms", ns / 1e6 }'; }

# one_run TOOL N: starts N agents; prints the rendezvous time in ns, or fails.
one_run() {
    tool=$1
    n=$2
    port=$(free_port)
    st=$T/stamps.$tool.$n
    rm -f "$st"
    i=0
    while [ $i -lt "$n" ]; do
        if [ "$tool" = mg ]; then
            host=0
            [ $i = 0 ] && host=1
            spawn "$MGLAUNCH" --nnodes "$n" --nproc_per_node 1 --rdzv_backend c10d \
                --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "b$n" \
                --rdzv_conf "is_host=$host,join_timeout=120" "$W" --stamp "$st" \
                >"$T/agent.$i.log" 2>&1
        else
            # shellcheck disable=SC2086
            spawn "$TORCHRUN" --nnodes "$n" --nproc_per_node 1 --rdzv_backend c10d \
                --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "b$n" $TR_ARGS --no_python \
                "$W" --stamp "$st" >"$T/agent.$i.log" 2>&1
        fi
        i=$((i + 1))
    done
    t0=$(now_ns)
    bad=0
    for p in $SPAWNED; do wait "$p" || bad=$((bad + 1)); done
    SPAWNED=""
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
versions_line
machine_line
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
    if have_torchrun && [ "$n" -le "$TR_MAX" ]; then
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
    have_torchrun || tr_txt="n/a"
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
        for i in 0 1 2; do
            extra=""
            if [ "$be" = c10d ]; then
                host=0
                [ $i = 0 ] && host=1
                extra=",is_host=$host"
            fi
            spawn "$MGLAUNCH" --nnodes 2:3 --nproc_per_node 1 --rdzv_backend "$be" \
                --rdzv_endpoint "$ep" --rdzv_id "d$k.$$" --rdzv_conf "last_call_timeout=5$extra" \
                "$W" --stamp "$st" --sleep-at 3:120 >"$T/dagent.$i.log" 2>&1
        done
        victim=$!
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
        for p in $SPAWNED; do
            [ "$p" = "$victim" ] && { wait "$p" 2>/dev/null; continue; }
            wait "$p" || bad=1
        done
        SPAWNED=""
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
detect c10d "127.0.0.1:$(free_port)" >"$T/d.txt" || fail=1
tee -a "$OUT/rdzv.txt" <"$T/d.txt"
if etcd_have; then
    if etcd_start; then
        detect etcd "$ETCD_EP" >"$T/d.txt" || fail=1
        tee -a "$OUT/rdzv.txt" <"$T/d.txt"
    else
        fail=1
    fi
else
    echo "  etcd  not installed" | tee -a "$OUT/rdzv.txt"
fi
echo "  torchrun: no detection; a dead peer is noticed when a collective times out" | tee -a "$OUT/rdzv.txt"
exit $fail
