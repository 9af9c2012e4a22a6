#!/bin/sh
# The rendezvous protocol (launcher/rdzv/rdzv_proto.c) on the etcd backend, against a real
# etcd 3.4 started on loopback: forming, last call, a SIGKILLed node (re-form
# or, below MIN, a clear error), scale-up, restarts across nodes, the exit
# barrier, spares, static ranks, run ids, and etcd going away.
# timeout: 240
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/etcd.sh"
. "$TOP/tests/lib/rdzv_cases.sh"

etcd_have || skip_all "etcd-server is not installed (apt-get install etcd-server)"
etcd_start || bail "etcd starts"
BACKEND=etcd
EP=$ETCD_EP

case_form3
case_last_call
case_dead_node
case_below_min
case_scale_up
case_failure_restart
case_peer_death_failure
case_barrier
case_closed
case_spare
case_static
case_run_ids

# Unreachable: the error names the endpoint, and the agent gives up at join_timeout.
new_case
DEAD="127.0.0.1:$(free_port)"
"$AGENT" --backend etcd --endpoint "$DEAD" --id x --conf "join_timeout=1" >"$T/u.out" 2>&1
is "$?" 1 "unreachable etcd: the agent fails"
like "$(cat "$T/u.out")" "etcd http://$DEAD: .*(connect|Connect).*join_timeout" \
    "the error names the endpoint and what failed"

# A name that does not resolve is retried until join_timeout, then reported.
"$AGENT" --backend etcd --endpoint "nosuchhost.invalid:2379" --id x --conf "join_timeout=1" >"$T/n.out" 2>&1
like "$(cat "$T/n.out")" "nosuchhost.invalid.*resolve" "an unresolvable name is reported by name"

# etcd stopped mid-run: a clear error within the heartbeat timeout, not a hang.
new_case
SHOW="a b"
agent a join,run:30000 --nnodes 2 --conf "$HB"
agent b join,run:30000 --nnodes 2 --conf "$HB"
wait_line a '^formed' 15
check_ok "formed before etcd stops" wait_line b '^formed' 15
etcd_stop
finish a
is "$RC" 3 "etcd stopped: the agent fails"
check_ok "saying it lost etcd, naming the endpoint" \
    grep -q "event failed.*lost the rendezvous backend.*etcd http://$EP" "$T/a.out"
finish b
done_testing
