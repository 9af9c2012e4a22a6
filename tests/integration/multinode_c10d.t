#!/bin/sh
# mglaunch across test hosts (network namespaces, or loopback addresses where
# they cannot be made) with the c10d backend: mg's store hosted by the agent
# on the endpoint host. 2 and 3 nodes x 2 workers: unique ranks 0..W-1, one
# world size, MASTER_ADDR:MASTER_PORT leads to rank 0 from every host. A wrong
# token is refused; garbage and oversized frames from a raw client do not
# disturb a running rendezvous; an endpoint name that resolves only later is
# retried; a missing --rdzv_id is explained.
# timeout: 150
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"

hosts_up 3
c10d_endpoint
C="--nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint $EP"

# 2 nodes
node 0 a $C --nnodes 2 --rdzv_id two --rdzv_conf "$MN_HB$HOST0" "$MN_WORKER" --reach
node 1 b $C --nnodes 2 --rdzv_id two --rdzv_conf "$MN_HB$OTHER" "$MN_WORKER" --reach
check_exits "2 nodes x 2 workers on c10d: both agents succeed" "0 0" a b
check_world "2 nodes: ranks 0..3, world 4, one master, reachable from every host" 4 a b
if [ "$HOSTS_MODE" = netns ]; then
    like "$(grep -h '^env' "$T/a.out" | head -n 1)" "master=$(host_addr 0):" \
        "MASTER_ADDR is rank 0's address on the test network"
fi

# 3 nodes; the third advertises itself with --local_addr
node 0 a $C --nnodes 3 --rdzv_id three --rdzv_conf "$MN_HB$HOST0" "$MN_WORKER" --reach
node 1 b $C --nnodes 3 --rdzv_id three --rdzv_conf "$MN_HB$OTHER" "$MN_WORKER" --reach
node 2 c $C --nnodes 3 --rdzv_id three --local_addr "$(host_addr 2)" --rdzv_conf "$MN_HB$OTHER" \
    "$MN_WORKER" --reach
check_exits "3 nodes x 2 workers on c10d: all succeed" "0 0 0" a b c
check_world "3 nodes: ranks 0..5, world 6, one master, reachable from every host" 6 a b c

# A wrong token is refused with a clear message; the right ones form the job.
node 0 a $C --nnodes 2 --rdzv_id tok --rdzv_conf "$MN_HB$HOST0,token=s3cret" "$MN_WORKER" --reach --sleep 1
node 2 c $C --nnodes 2 --rdzv_id tok --rdzv_conf "$MN_HB$OTHER,token=wrong,join_timeout=3" "$MN_WORKER"
MG_RDZV_TOKEN=s3cret node 1 b $C --nnodes 2 --rdzv_id tok --rdzv_conf "$MN_HB$OTHER" "$MN_WORKER" --reach
check_exits "a wrong token: the agent exits 1" 1 c
ok out_has c "authentication failed"
check_exits "the job with the right token (one via MG_RDZV_TOKEN) runs" "0 0" a b
check_world "token job: ranks 0..3" 4 a b

# Garbage, an oversized length and a bad handshake against the store while
# the agents rendezvous: dropped, the job is not affected.
node 0 a $C --nnodes 2 --rdzv_id raw --rdzv_conf "$MN_HB$HOST0,last_call_timeout=1" "$MN_WORKER" --reach
sleep 0.3
RAW="$HELPERS/storeraw $EP"
out=$(on 2 $RAW garbage 100000 expect-eof 5000 2>&1)
like "$out" "eof after" "garbage instead of a hello: dropped by the agent's store"
out=$(on 2 $RAW hello frame 2 0xffffffff reply expect-eof 5000 2>&1)
like "$out" "reply op=error status=3" "a 4 GiB frame length: answered TOOBIG, connection dropped"
out=$(on 2 $RAW send 5858585858585858585858585858585858585858585858585858585858585858585858585858585858585858 expect-eof 5000 2>&1)
like "$out" "eof after" "a bad magic: dropped"
node 1 b $C --nnodes 2 --rdzv_id raw --rdzv_conf "$MN_HB$OTHER" "$MN_WORKER" --reach
check_exits "garbage from a raw client does not break the rendezvous" "0 0" a b
check_world "after the garbage: ranks 0..3" 4 a b

# An endpoint name that does not resolve yet (a Kubernetes service not yet
# published): retried until it does. The agent sees a private /etc/hosts that
# gets the name a second later.
if command -v unshare >/dev/null 2>&1 && unshare -m true 2>/dev/null; then
    cp /etc/hosts "$T/hosts"
    node 0 a $C --nnodes 2 --rdzv_id dns --rdzv_conf "$MN_HB$HOST0" "$MN_WORKER" --reach
    bg_on 1 unshare -m sh -c "mount --bind '$T/hosts' /etc/hosts && exec '$MGLAUNCH' \
        --nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint mg-late-name:${EP##*:} --nnodes 2 \
        --rdzv_id dns --rdzv_conf '$MN_HB$OTHER' '$MN_WORKER' --reach" >"$T/b.out" 2>"$T/b.err"
    PID_b=$!
    sleep 1
    echo "$(host_addr 0) mg-late-name" >>"$T/hosts"
    check_exits "an endpoint name published late is retried until it resolves" "0 0" a b
    check_world "late name: ranks 0..3" 4 a b
else
    diag "unshare -m unavailable: the late-name case is not run"
fi

# Configured through PET_* variables only, the way k8s/indexed-job.yaml (and
# the Kubeflow operators) do it, with PET_LOCAL_ADDR as MASTER_ADDR.
for i in 0 1; do
    ih=0
    [ $i = 0 ] && ih=1
    PET_NNODES=2 PET_NPROC_PER_NODE=2 PET_RDZV_BACKEND=c10d PET_RDZV_ENDPOINT="$EP" \
        PET_RDZV_ID=pet PET_LOCAL_ADDR="$(host_addr $i)" PET_RDZV_CONF="$MN_HB,is_host=$ih" \
        node $i "p$i" "$MN_WORKER" --reach
done
check_exits "PET_* variables alone configure a 2-node job" "0 0" p0 p1
check_world "PET job: ranks 0..3" 4 p0 p1
like "$(grep -h '^env' "$T/p0.out" | head -n 1)" "master=$(host_addr 0):" \
    "PET_LOCAL_ADDR of rank 0 is MASTER_ADDR"

# No --rdzv_id: a warning that explains the risk.
node 0 a $C --nnodes 2 --rdzv_conf "$MN_HB$HOST0" "$MN_WORKER"
node 1 b $C --nnodes 2 --rdzv_conf "$MN_HB$OTHER" "$MN_WORKER"
nodes_wait a b
ok out_has a "warning: no --rdzv_id.*same --rdzv_endpoint would join"
done_testing
