#!/bin/sh
# The rendezvous with 256 simulated nodes (tests/helpers/rdzv_swarm: one
# thread per node running mg's real rendezvous client over its own socket),
# against mg's store server and against the store the c10d agent hosts from
# its loop. Every node that stays gets a distinct rank in one round with the
# same size and master (a round of more than 128 nodes writes its membership
# in blocks with an index, docs/rendezvous.md); then 2 nodes die and the
# survivors re-form the same way. Meanwhile, as the docs say they are handled:
# a node begins its join again while the round is open and counts once; 3
# nodes join and leave before the round closes, which forms without them;
# 2 clients flood the store with requests whose replies they never read, and
# the store serves the others. Then the same against a real etcd through mg's
# etcd backend (no flooders: they speak the store's protocol), where etcd is
# installed: the nodes count their joins in etcd (an add of 1 each, all at
# once) and wait on watches parked between their steps; a dead node's lease
# runs out. Timings are tests/bench/scale.sh's business.
# timeout: 240
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/store_lib.sh"
. "$(dirname "$0")/../lib/etcd.sh"

N=256
ulimit -n "$(ulimit -Hn)" 2>/dev/null
[ "$(ulimit -n)" -ge 1200 ] || skip_all "needs 1200 open files (ulimit -Hn is $(ulimit -Hn))"
# heartbeat_timeout 2 s: the dead are noticed quickly; join_timeout bounds a hang
CONF=heartbeat_interval=0.5,heartbeat_timeout=2,join_timeout=60
MISBEHAVE="--kill 2 --join-twice 1 --leave 3 --flood 2"

check_run() { # NAME OUTFILE RC [noflood]
    is "$3" 0 "$1: the swarm exits 0"
    is "$(tail -n 1 "$2")" "check=ok" "$1: every node that stayed has a distinct rank, one round, one master"
    like "$(cat "$2")" "killed=2 reform_ms=" "$1: the survivors re-formed without the 2 dead"
    [ -n "${4:-}" ] || like "$(cat "$2")" "flooders=2 " "$1: both flooding clients were connected"
    is "$(sed -n 's/.*probe_errors=\([0-9]*\).*/\1/p' "$2")" 0 "$1: the probe client was answered throughout"
}

start_store --max-clients 1024
timeout 150 "$HELPERS/rdzv_swarm" --nodes $N --procs 4 --endpoint "$ADDR" --server-pid "$SRV_PID" \
    --conf "$CONF" $MISBEHAVE --steady-ms 500 --timeout-s 120 >"$T/own" 2>&1
rc=$?
diag "$(tr '\n' ' ' <"$T/own")"
check_run "mg's store server" "$T/own" $rc
# the round's count counts agents: 253 that stayed, 3 that left, node 1 once
is "$(ctl get /mg/rdzv/swarm/r/0/n 0 2>&1)" "get /mg/rdzv/swarm/r/0/n = $N" \
    "mg's store server: the join count is one per agent, the one that joined twice too"
# 253 members: the close record holds the first 64, 3 more blocks and 4 index records
is "$(ctl list /mg/rdzv/swarm/r/0/m/ 0 list /mg/rdzv/swarm/r/0/i/ 0 2>&1)" \
    "list /mg/rdzv/swarm/r/0/m/ total=3
list /mg/rdzv/swarm/r/0/i/ total=4" "mg's store server: the membership in blocks, and its index"
wait_stat clients 0 10
is "$(store_stat clients)" 0 "mg's store server: every connection closed"

port=$(free_port)
timeout 150 "$HELPERS/rdzv_swarm" --nodes $N --procs 4 --hosted "$port" \
    --conf "$CONF" $MISBEHAVE --steady-ms 500 --timeout-s 120 >"$T/hosted" 2>&1
rc=$?
diag "$(tr '\n' ' ' <"$T/hosted")"
check_run "the store hosted by node 0" "$T/hosted" $rc

if ! etcd_have; then
    _tap_n=$((_tap_n + 1))
    echo "ok $_tap_n # skip etcd: etcd-server is not installed ($ETCD; scripts/deps.sh installs it)"
    done_testing
    exit 0
fi
etcd_start || bail "etcd started"
# a dead node's lease runs out after heartbeat_timeout - heartbeat_interval; a request waits at
# most heartbeat_timeout: 2 s made a loaded machine's etcd drop live nodes
ECONF=heartbeat_interval=1,heartbeat_timeout=6,join_timeout=60
timeout 150 "$HELPERS/rdzv_swarm" --nodes $N --procs 4 --etcd "$ETCD_EP" --server-pid "$ETCD_PID" \
    --conf "$ECONF" --kill 2 --join-twice 1 --leave 3 --steady-ms 500 --timeout-s 120 >"$T/etcd" 2>&1
rc=$?
diag "$(tr '\n' ' ' <"$T/etcd")"
check_run "etcd" "$T/etcd" $rc noflood
is "$(ETCDCTL_API=3 etcdctl --endpoints="http://$ETCD_EP" --command-timeout=5s get --print-value-only \
    /mg/rdzv/swarm/r/0/n 2>&1)" "$N" "etcd: the join count is one per agent, the one that joined twice too"
is "$(ETCDCTL_API=3 etcdctl --endpoints="http://$ETCD_EP" --command-timeout=5s get --prefix --keys-only \
    /mg/rdzv/swarm/a/ 2>&1 | grep -c .)" 0 "etcd: every node's lease is gone at the end (revoked or run out)"
done_testing
