#!/bin/sh
# The rendezvous protocol (launcher/rdzv/rdzv_proto.c) on mg's own store (the c10d
# backend), hosted by one of the agents: the same scenarios as etcd_rdzv.t,
# plus what is specific to a store that lives inside an agent: the token,
# the host agent going away, and a client that cannot connect.
# timeout: 240
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/rdzv_cases.sh"

BACKEND=c10d
HOST_ARGS="--is_host 1"
OTHER_ARGS="--is_host 0"

case_form3
case_last_call
case_dead_node
case_below_min
case_scale_up
case_failure_restart
case_peer_death_failure
case_barrier
case_spare
case_static
case_run_ids

# A wrong token is refused, and says so; the right one works.
new_case
SHOW="a b c"
agent a join,run:3000,finish --nnodes 2 --conf "$HB,token=right"
agent c join --nnodes 2 --conf "$HB,token=wrong,join_timeout=2"
agent b join,run:1000,finish --nnodes 2 --conf "$HB,token=right"
finish c
is "$RC" 1 "a wrong token: the agent fails"
check_ok "the error says the token differs" grep -q 'authentication failed.*token' "$T/c.out"
finish a
is "$RC" 0 "the right token forms the group (the wrong one did not disturb it)"
finish b

# MG_RDZV_TOKEN works as the token.
new_case
SHOW="a b"
MG_RDZV_TOKEN=envtok agent a join,run:300,finish --nnodes 2 --conf "$HB"
MG_RDZV_TOKEN=envtok agent b join,run:300,finish --nnodes 2 --conf "$HB"
finish a
finish b
is "$RC" 0 "MG_RDZV_TOKEN authenticates"

# The agent hosting the store dies: the others fail fast with a clear error.
new_case
SHOW="a b"
agent a join,run:60000 --nnodes 2 --conf "$HB"
agent b join,run:60000 --nnodes 2 --conf "$HB"
check_ok "formed" wait_line b '^formed' 15
kill -KILL "$PID_a"
finish b
is "$RC" 3 "the store's host died: the other agent fails"
check_ok "saying the connection to the store closed" \
    grep -q 'event failed.*lost the rendezvous backend: .*store 127.0.0.1:[0-9]*: .*closed' "$T/b.out"

# Nothing at the endpoint: a clear error naming it, at join_timeout.
new_case
"$AGENT" --backend c10d --endpoint "$EP" --is_host 0 --id x --conf "join_timeout=1" >"$T/u.out" 2>&1
is "$?" 1 "no store at the endpoint: the agent fails"
like "$(cat "$T/u.out")" "store $EP: cannot connect: connection refused.*join_timeout" \
    "the error names the endpoint and what failed"
"$AGENT" --backend c10d --endpoint "nosuchhost.invalid:29400" --id x --conf "join_timeout=1" >"$T/n.out" 2>&1
like "$(cat "$T/n.out")" "nosuchhost.invalid.*does not resolve" "an unresolvable name is reported by name"
done_testing
