#!/bin/sh
# The rendezvous at scale: thousands of simulated nodes (tests/helpers/rdzv_swarm:
# one thread per node, in a few processes, each running mg's real rendezvous
# client over its own socket) against a real store, side by side in one run:
#   - own:    mg's store server as its own process (storesrv, its poll loop);
#   - hosted: the c10d store that the agent on the endpoint host serves from its
#             loop (node 0 of the swarm, in a process of its own);
#   - etcd:   a real etcd (Debian's etcd-server, started on loopback for each
#             run by tests/lib/etcd.sh, data in the run's temporary directory)
#             through mg's etcd backend, as `--rdzv_backend etcd` uses it:
#             its JSON gateway, a lease per node; a dead node's key goes when
#             its lease runs out (heartbeat_timeout). Its requests are the
#             gRPC calls etcd's /metrics counts; skipped, said, without etcd;
#   - torch:  Debian's torch 1.13 (tests/bench/scale_torch.py), two columns:
#             "torch rdzv", its real rendezvous, what `torchrun --rdzv_backend
#             c10d` runs (DynamicRendezvousHandler over C10dRendezvousBackend
#             and a TCPStore, N nodes as threads across processes of 256, each
#             with its own TCPStore client), timed from the last node's
#             next_rendezvous() call to the last one returning; and "torch kv",
#             a floor rather than what torchrun does: N TCPStore clients add
#             themselves to a count, the last writes the roster, all wait for
#             it and read it. Each is bounded by MG_SCALE_TORCH_TIMEOUT and
#             says "timeout" when it did not finish.
# Per N: time from the last join to every node knowing its rank; the store's
# requests, CPU and peak RSS; the heartbeat load at steady state (requests/s and
# the store's CPU share); the time for the survivors to re-form after 1% of the
# nodes die (their connections close, as a SIGKILLed agent's do); the worst
# latency a probe client saw (a GET every 10 ms throughout).
# Every run checks its result (distinct ranks, one round, one master), and the
# benchmark fails when one does not. An etcd run that does not finish within
# MG_SCALE_TIMEOUT (a loaded etcd sharing the cores with the node threads) is
# reported as such, as torch's timeouts are; mg's own stores must finish. Run it under `flock /work/locks/heavy`.
# Knobs: MG_SCALE_NS ("128 1024 4096 10000"), MG_SCALE_STORES ("own hosted etcd"),
# MG_SCALE_TORCH_MAX (10000), MG_SCALE_TORCH_TIMEOUT (120 s per N and column),
# MG_SCALE_STEADY_MS (3000), MG_SCALE_TIMEOUT (240 s per run), MG_SCALE_CONF
# (--rdzv_conf for every node, ""), MG_SCALE_ARRIVE_MS (0: every node begins
# its join at once; W: node i at i/N of a window of W ms, as the nodes of a
# large job arrive over time; "form ms" is counted from the last node's join
# either way), MG_SCALE_NICE (0; N: the simulated nodes' threads run at nice
# N, the store and the probe client not, as a store on a host of its own
# would be: on 2 cores, thousands of node threads otherwise starve the store;
# the table's header says so), MG_SCALE_RT (0; 1: the store (storesrv, or the
# swarm's thread hosting it) and the probe client run at a real-time
# priority (SCHED_FIFO 1, which takes root or CAP_SYS_NICE), as on hosts of
# their own: nice 19 is not enough once thousands of node threads are
# runnable together, and the probe then measures the wait for a core rather
# than the store; the header says so).
. "$(dirname "$0")/../lib/bench.sh"
. "$(dirname "$0")/../lib/etcd.sh"
SW=$HELPERS/rdzv_swarm
NS=${MG_SCALE_NS:-"128 1024 4096 10000"}
STORES=${MG_SCALE_STORES:-"own hosted etcd"}
case " $STORES " in
*" etcd "*)
    if ! etcd_have; then
        diag "etcd is not installed ($ETCD; scripts/deps.sh installs etcd-server): no etcd column"
        STORES=$(echo " $STORES " | sed 's/ etcd / /; s/^ *//; s/ *$//')
    fi
    ;;
esac
TORCH_MAX=${MG_SCALE_TORCH_MAX:-10000}
TORCH_TMO=${MG_SCALE_TORCH_TIMEOUT:-120}
STEADY=${MG_SCALE_STEADY_MS:-3000}
TMO=${MG_SCALE_TIMEOUT:-240}
CONF=${MG_SCALE_CONF:-}
ARRIVE=${MG_SCALE_ARRIVE_MS:-0}
NICE=${MG_SCALE_NICE:-0}
RT=${MG_SCALE_RT:-0}
RTCMD="" RTFLAG=""
if [ "$RT" = 1 ]; then
    chrt -f 1 true 2>/dev/null || {
        echo "scale.sh: MG_SCALE_RT=1 needs a real-time priority (root or CAP_SYS_NICE): chrt -f 1 failed" >&2
        exit 1
    }
    RTCMD="chrt -f 1" RTFLAG=--rt
fi
need "$SW" "$HELPERS/storesrv" "$HELPERS/freeport"
fail=0

# The swarm needs about 2 descriptors per node in each of its processes, and
# the store one per node: raise the soft limit to the hard one.
hard=$(ulimit -Hn)
ulimit -n "$hard" 2>/dev/null || diag "cannot raise the open-file limit to $hard (ulimit -n)"
procs_for() { # N: processes so that each stays well under the descriptor limit
    p=$(($1 * 2 / (hard / 2) + 1))
    [ "$p" -lt 4 ] && p=4
    echo "$p"
}

val() { sed -n "s/.*\\b$2=\\([^ ]*\\).*/\\1/p" "$1" | head -n 1; }

# swarm STORE N: one run; its key=value lines in $T/sw.STORE.N
swarm() {
    st=$1
    n=$2
    out=$T/sw.$st.$n
    kill=$((n / 100))
    [ "$kill" -lt 1 ] && kill=1
    conf="join_timeout=$TMO${CONF:+,$CONF}"
    if [ "$st" = own ]; then
        rm -f "$T/port"
        $RTCMD "$HELPERS/storesrv" --port-file "$T/port" --stats-file "$T/stats" \
            --max-clients $((n * 2 + 64)) >"$T/storesrv.log" 2>&1 &
        spid=$!
        SPAWNED="$SPAWNED $spid"
        wait_for 10 test -s "$T/port" || { diag "storesrv did not start"; return 1; }
        timeout $((TMO + 30)) "$SW" --nodes "$n" --procs "$(procs_for "$n")" \
            --endpoint "127.0.0.1:$(cat "$T/port")" --server-pid "$spid" \
            --stats-file "$T/stats" --kill "$kill" --steady-ms "$STEADY" --conf "$conf" \
            --arrive-ms "$ARRIVE" --nice "$NICE" $RTFLAG --timeout-s "$TMO" >"$out" 2>"$out.err"
        rc=$?
        kill "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
    elif [ "$st" = etcd ]; then
        # a fresh etcd per run: its memory and requests are this run's alone
        etcd_start || { diag "etcd did not start"; return 1; }
        timeout $((TMO + 30)) "$SW" --nodes "$n" --procs "$(procs_for "$n")" \
            --etcd "$ETCD_EP" --server-pid "$ETCD_PID" --kill "$kill" --steady-ms "$STEADY" \
            --conf "$conf" --arrive-ms "$ARRIVE" --nice "$NICE" --timeout-s "$TMO" \
            >"$out" 2>"$out.err"
        rc=$?
        etcd_stop
        rm -rf "$T"/etcd.*
    else
        timeout $((TMO + 30)) "$SW" --nodes "$n" --procs "$(procs_for "$n")" \
            --hosted "$(free_port)" --kill "$kill" --steady-ms "$STEADY" --conf "$conf" \
            --arrive-ms "$ARRIVE" --nice "$NICE" $RTFLAG --timeout-s "$TMO" >"$out" 2>"$out.err"
        rc=$?
    fi
    cat "$out" "$out.err" >"$OUT/scale.$st.$n.txt" 2>/dev/null # the requests by kind, for a reader
    if [ $rc != 0 ] || ! grep -q '^check=ok' "$out"; then
        diag "$st store, $n nodes: $(grep -h 'check=\|first_error\|^round0' "$out" "$out.err" | tr '\n' ' ')"
        return 1
    fi
}

# torch MODE N: the form time in ms, "timeout" or "fail" (why on stderr).
torch_run() {
    r=$(timeout $((TORCH_TMO + 30)) $PY "$(dirname "$0")/scale_torch.py" "$1" "$2" "$TORCH_TMO" \
        2>>"$T/torch.err")
    case $r in
    *"fail a_node_process_exited"*) # torch 1.13 crashes now and then (SIGSEGV): once more
        diag "torch $1, $2 nodes: $r; running it again"
        r=$(timeout $((TORCH_TMO + 30)) $PY "$(dirname "$0")/scale_torch.py" "$1" "$2" \
            "$TORCH_TMO" 2>>"$T/torch.err")
        ;;
    esac
    case $r in
    "torch $1 $2 fail timeout"*) echo "timeout" ;;
    "torch $1 $2 fail"*) diag "torch $1, $2 nodes: $r" && echo fail ;;
    "torch $1 $2 "*) echo "${r##* }" ;;
    *) diag "torch $1, $2 nodes: no result" && echo fail ;;
    esac
}

{
versions_line
machine_line
echo
echo "rendezvous at scale: simulated nodes (one thread each, real rendezvous client, own socket),"
echo "1% killed after ${STEADY} ms of heartbeats (default heartbeat_interval 1 s, timeout 5 s)"
[ -n "$CONF" ] && echo "--rdzv_conf $CONF"
[ "$ARRIVE" != 0 ] && echo "nodes begin their joins over $ARRIVE ms"
[ "$NICE" != 0 ] && echo "node threads at nice $NICE, the store and the probe at 0: a store on its own host, not starved by the nodes"
[ "$RT" = 1 ] && echo "the store and the probe at real-time priority (SCHED_FIFO 1), as on hosts of their own"
printf '  %-6s %-6s %9s %9s %9s %9s %9s %9s %10s %9s %11s %9s\n' N store "form ms" "req/node" \
    "hb req/s" "hb cpu" "reform ms" "rss MB" "cpu s" "probe ms" "torch rdzv" "torch kv"
} | tee "$OUT/scale.txt"

for n in $NS; do
    tr="" tk=""
    if have_torch && [ "$n" -le "$TORCH_MAX" ]; then
        tr=$(torch_run rdzv "$n")
        tk=$(torch_run kv "$n")
    fi
    for st in $STORES; do
        if swarm "$st" "$n"; then
            f=$T/sw.$st.$n
            hwm=$(val "$f" store_hwm_kb)
            printf '  %-6s %-6s %9s %9s %9s %9s %9s %9s %10s %9s %11s %9s\n' "$n" "$st" \
                "$(val "$f" form_ms)" \
                "$(awk -v r="$(val "$f" form_requests)" -v n="$n" 'BEGIN { printf "%.1f", r / n }')" \
                "$(val "$f" hb_requests_per_s)" \
                "$(val "$f" hb_store_cpu)" "$(val "$f" reform_ms)" \
                "$(awk -v k="$hwm" 'BEGIN { printf "%.1f", k / 1024 }')" "$(val "$f" store_cpu_s)" \
                "$(val "$f" probe_max_ms)" "${tr:--}" "${tk:--}" | tee -a "$OUT/scale.txt"
        elif [ "$st" = etcd ] && grep -q '^check=FAIL' "$T/sw.$st.$n" &&
            ! grep -q '^check=FAIL \(node \|[0-9]* nodes formed\)' "$T/sw.$st.$n"; then
            # etcd on these cores with the node threads did not keep up within the bound (as
            # torch's "timeout"); a wrong answer (ranks, membership) still fails the benchmark
            printf '  %-6s %-6s  did not finish within %s s: %s\n' "$n" "$st" "$TMO" \
                "$(sed -n 's/^check=FAIL \([^(]*\).*/\1/p' "$T/sw.$st.$n")" | tee -a "$OUT/scale.txt"
        else
            printf '  %-6s %-6s  FAILED (see above)\n' "$n" "$st" | tee -a "$OUT/scale.txt"
            fail=1
        fi
    done
done
{
echo
echo "form ms: last node's join began -> last node knew its rank.  req/node: the store's requests"
echo "(etcd: the gRPC calls its /metrics counts, one per request of its JSON gateway)"
echo "while forming, per node (the closer's reads of every join included).  hb: steady-state heartbeat"
echo "requests/s and the store's CPU share (1.0 = one core).  reform ms: deaths -> last survivor"
echo "in the new round.  rss: the store process's peak (hosted: the agent hosting it; etcd: etcd's).  probe:"
echo "worst GET latency of an extra client.  torch rdzv: torch 1.13's c10d rendezvous"
echo "(DynamicRendezvousHandler, what torchrun runs), last next_rendezvous() call -> last return."
echo "torch kv: bare TCPStore, add to a count, last writes the roster, all wait and read it."
echo "timeout: torch did not finish within ${TORCH_TMO} s (MG_SCALE_TORCH_TIMEOUT)."
} | tee -a "$OUT/scale.txt"
exit $fail
