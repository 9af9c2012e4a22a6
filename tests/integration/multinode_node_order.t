#!/bin/sh
# Node ranks follow placement: 12 agents on 12 test hosts (network namespaces
# with host names mgt-h0 .. mgt-h11; loopback addresses where namespaces cannot
# be made), c10d, one worker each, started in a shuffled order. Without a
# scheduler index, GROUP_RANK follows the host names in natural order (mgt-h2
# before mgt-h10, where strcmp put h10 second); with one (JOB_COMPLETION_INDEX,
# SKYPILOT_NODE_RANK, VC_TASK_INDEX, here reversed against the host names),
# GROUP_RANK is the index. A malformed index is a clear error.
# timeout: 240
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"

hosts_up 12
c10d_endpoint
SHUFFLED="7 10 0 3 11 1 9 2 5 8 4 6"

# run ID VAR: one agent per host, in the shuffled order; VAR (a variable
# name, or "") set to 11 - host on each.
run() {
    _id=$1
    _var=$2
    for i in $SHUFFLED; do
        conf="$MN_HB,last_call_timeout=1"
        if [ "$HOSTS_MODE" = loopback ]; then
            [ "$i" = 0 ] && conf="$conf$HOST0" || conf="$conf$OTHER"
        fi
        _set=
        [ -n "$_var" ] && _set="$_var=$((11 - i))"
        eval "$_set node \"\$i\" \"n\$i\" --nnodes 12 --nproc_per_node 1 --rdzv_backend c10d \
            --rdzv_endpoint \"\$EP\" --rdzv_id \"\$_id\" --rdzv_conf \"\$conf\" \"\$MN_WORKER\" --reach"
        [ "$i" = 0 ] && sleep 0.3 # host 0 binds the store first
    done
}

# GROUP_RANK each host's worker saw, in host order.
group_ranks() {
    for i in $(seq 0 11); do
        sed -n 's/^env .* group_rank=\([0-9]*\) .*/\1/p' "$T/n$i.out" | tail -n 1
    done | tr '\n' ' '
}

NAMES="n0 n1 n2 n3 n4 n5 n6 n7 n8 n9 n10 n11"
run natural ""
check_exits "12 agents, no scheduler index: all succeed" "0 0 0 0 0 0 0 0 0 0 0 0" $NAMES
check_world "  one world of 12" 12 $NAMES
if [ "$HOSTS_MODE" = netns ]; then
    is "$(group_ranks)" "0 1 2 3 4 5 6 7 8 9 10 11 " \
        "  GROUP_RANK follows the host names in natural order (mgt-h2 before mgt-h10)"
else
    diag "loopback hosts share one host name: the natural order is checked by test_rdzv only"
fi

for var in JOB_COMPLETION_INDEX SKYPILOT_NODE_RANK VC_TASK_INDEX; do
    run "idx-$var" "$var"
    check_exits "12 agents with $var: all succeed" "0 0 0 0 0 0 0 0 0 0 0 0" $NAMES
    is "$(group_ranks)" "11 10 9 8 7 6 5 4 3 2 1 0 " "  GROUP_RANK is $var, whatever the host names"
done

JOB_COMPLETION_INDEX=two "$MGLAUNCH" --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d \
    --rdzv_endpoint "127.0.0.1:$(free_port)" --rdzv_id bad "$MN_WORKER" >"$T/bad.out" 2>&1
is $? 2 "JOB_COMPLETION_INDEX=two: a usage error"
like "$(cat "$T/bad.out")" "JOB_COMPLETION_INDEX='two': expected the node's index" "  naming the variable"

done_testing
