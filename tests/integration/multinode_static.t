#!/bin/sh
# mglaunch across test hosts with the static backend: --nnodes, --node_rank,
# --master_addr, --master_port as torchrun takes them, and the same derived
# from a Slurm environment fixture (SLURM_STEP_ID, SLURM_NNODES, SLURM_NODEID,
# SLURM_JOB_NODELIST with a bracketed hostlist) when the flags are absent. A
# node 0 whose port another program holds stops at once, saying so, and node 1
# says what it waits for.
# timeout: 90
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"

hosts_up 3
M=$(host_addr 0)
PORT=29500
[ "$HOSTS_MODE" = loopback ] && PORT=$(free_port)
C="--nproc_per_node 2 --master_addr $M --master_port $PORT --rdzv_conf $MN_HB"

node 0 a $C --nnodes 2 --node_rank 0 "$MN_WORKER" --reach
node 1 b $C --nnodes 2 --node_rank 1 "$MN_WORKER" --reach
check_exits "static, 2 nodes x 2 workers: both succeed" "0 0" a b
check_world "static 2 nodes: ranks 0..3, world 4, one master, reachable" 4 a b
is "$(grep '^env' "$T/b.out" | head -n 1 | sed 's/.* group_rank=\([0-9]*\) .*/\1/')" 1 \
    "--node_rank 1 is GROUP_RANK 1"

# Reversed start order and 3 nodes: ranks follow --node_rank, not arrival.
node 2 c $C --nnodes 3 --node_rank 2 "$MN_WORKER" --reach
node 1 b $C --nnodes 3 --node_rank 1 "$MN_WORKER" --reach
sleep 0.2
node 0 a $C --nnodes 3 --node_rank 0 "$MN_WORKER" --reach
check_exits "static, 3 nodes started in reverse: all succeed" "0 0 0" a b c
check_world "static 3 nodes: ranks 0..5" 6 a b c
is "$(grep '^env' "$T/c.out" | sed 's/.* rank=\([0-9]*\) .*/\1/' | sort -n | tr '\n' ' ')" "4 5 " \
    "node_rank 2 holds global ranks 4 and 5"

# Two nodes claiming one rank: a clear error.
node 0 a $C --nnodes 2 --node_rank 0 "$MN_WORKER"
node 1 b $C --nnodes 2 --node_rank 0 "$MN_WORKER"
nodes_wait a b
ok test "$RC_a" -ne 0 -a "$RC_b" -ne 0
ok out_has b "node_rank 0 given to two nodes"

# Node 0 cannot host the store (another program holds the port): it stops at
# once and says why; node 1 says what it waits for until join_timeout.
bg_on 0 /usr/bin/python3 -c "
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('$M', $PORT))
s.listen(8)
open('$T/held', 'w').close()
while True:
    s.accept()[0].close()
"
holder=$!
ok wait_for 10 test -e "$T/held"
node 0 a $C --nnodes 2 --node_rank 0 "$MN_WORKER"
node 1 b $C,join_timeout=4 --nnodes 2 --node_rank 1 "$MN_WORKER"
nodes_wait a b
ok test "$RC_a" -ne 0 -a "$RC_b" -ne 0
like "$(cat "$T/a.err")" "cannot host the rendezvous store .*$PORT: Address already in use .*--master_port" \
    "node 0 whose port is taken says so"
like "$(cat "$T/b.err")" "waiting for node 0 \(--node_rank 0\) to host the store at $M:$PORT" \
    "node 1 says what it waits for"
kill -KILL "$holder" 2>/dev/null
wait "$holder" 2>/dev/null

# A Slurm job step of 3 nodes, no flags but the program's.
case $HOSTS_MODE in
netns) LIST="$(echo "$M" | sed 's/\.[0-9]*$//').[1-3]" ;;
*) LIST="127.0.0.[2-4]" ;;
esac
for i in 0 1 2; do
    SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_NNODES=3 SLURM_NODEID=$i SLURM_JOB_NODELIST="$LIST" \
        node $i "s$i" --nproc_per_node 2 --master_port "$PORT" --rdzv_conf "$MN_HB" "$MN_WORKER" --reach
done
check_exits "Slurm fixture ($LIST): 3 nodes formed from SLURM_* alone" "0 0 0" s0 s1 s2
check_world "Slurm: ranks 0..5, world 6" 6 s0 s1 s2
is "$(grep '^env' "$T/s2.out" | head -n 1 | sed 's/.* group_rank=\([0-9]*\) .*/\1/')" 2 \
    "SLURM_NODEID 2 is GROUP_RANK 2"
like "$(grep '^env' "$T/s1.out" | head -n 1)" "master=$M:.* run_id=slurm-4242" \
    "MASTER_ADDR is the first host of the list; the run id is the Slurm job's"
ok out_has s0 "Slurm: --nnodes 3, --node_rank 0, --master_addr $M"
done_testing
