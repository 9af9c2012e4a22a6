#!/bin/sh
# mglaunch across test hosts with the etcd backend (etcd 3.4 on its own test
# host): 2 and 3 nodes x 2 workers, a SIGKILLed node with 2:3, etcd stopped
# mid-run (a clear error naming the endpoint, not a hang), and a missing
# --rdzv_id refused with the reason.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/etcd.sh"
. "$TOP/tests/lib/mn_lib.sh"

etcd_have || skip_all "etcd-server is not installed (apt-get install etcd-server)"
hosts_up 3
if [ "$HOSTS_MODE" = netns ]; then
    etcd_start "$(host_addr sw)" "${NS_PREFIX}sw" || bail "etcd starts"
else
    etcd_start || bail "etcd starts"
fi
diag "etcd at $ETCD_EP"
C="--nproc_per_node 2 --rdzv_backend etcd --rdzv_endpoint $ETCD_EP"

node 0 a $C --nnodes 2 --rdzv_id two --rdzv_conf "$MN_HB" "$MN_WORKER" --reach
node 1 b $C --nnodes 2 --rdzv_id two --rdzv_conf "$MN_HB" "$MN_WORKER" --reach
check_exits "2 nodes x 2 workers on etcd: both agents succeed" "0 0" a b
check_world "2 nodes: ranks 0..3, world 4, one master, reachable from every host" 4 a b

node 0 a $C --nnodes 3 --rdzv_id three --rdzv_conf "$MN_HB" "$MN_WORKER" --reach
node 1 b $C --nnodes 3 --rdzv_id three --rdzv_conf "$MN_HB" "$MN_WORKER" --reach
node 2 c $C --nnodes 3 --rdzv_id three --rdzv_conf "$MN_HB" "$MN_WORKER" --reach
check_exits "3 nodes x 2 workers on etcd: all succeed" "0 0 0" a b c
check_world "3 nodes: ranks 0..5, world 6, one master, reachable from every host" 6 a b c

# Any node may die with etcd (no agent holds the state): here node 0.
W="$MN_WORKER --reach --sleep-at 3:60"
node 0 a $C --nnodes 2:3 --rdzv_id kill --rdzv_conf "$MN_HB" $W
node 1 b $C --nnodes 2:3 --rdzv_id kill --rdzv_conf "$MN_HB" $W
node 2 c $C --nnodes 2:3 --rdzv_id kill --rdzv_conf "$MN_HB" $W
ok wait_for 20 sh -c "[ \$(grep -c '^reach ok' $T/a.out $T/b.out $T/c.out | awk -F: '{s+=\$2} END {print s}') -ge 6 ]"
kill -KILL "$PID_a"
check_exits "2:3 on etcd, node 0 SIGKILLed: the survivors re-form and finish" "0 0" b c
check_world "the survivors: ranks 0..3" 4 b c

# etcd goes away mid-run.
W="$MN_WORKER --sleep 60"
node 0 a $C --nnodes 2 --rdzv_id gone --rdzv_conf "$MN_HB" $W
node 1 b $C --nnodes 2 --rdzv_id gone --rdzv_conf "$MN_HB" $W
ok wait_for 20 sh -c "[ \$(grep -c '^env' $T/a.out $T/b.out | awk -F: '{s+=\$2} END {print s}') -ge 4 ]"
etcd_stop
check_exits "etcd stopped mid-run: the agents stop the job and exit 1" "1 1" a b
ok out_has a "lost the rendezvous backend: .*etcd http://$ETCD_EP"

node 0 a $C --nnodes 2 "$MN_WORKER"
check_exits "etcd without --rdzv_id: refused" 2 a
ok out_has a "rdzv_id is required with --rdzv_backend etcd.*share their rendezvous"
done_testing
