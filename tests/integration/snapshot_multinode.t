#!/bin/sh
# In-memory snapshots across test hosts (docs/train.md, "Snapshots in
# memory"): two agents, one worker each, so the ranks agree on the snapshot
# over TCP. A worker SIGKILLed on the second host restarts both hosts' workers;
# each resumes from its own host's memory, and the run ends with the weights of
# a 2-host run that never stopped. (A whole node lost: snapshot_nodeloss.t.)
# With --zero 1 over two hosts each rank also keeps two copies of the other
# host's optimizer shard, and room to send its own: they count in
# MG_SNAPSHOT_MAX_BYTES, and a limit one byte short stops the run at its
# start, saying so. With two ranks per host (shared memory within, TCP
# between) each rank's shard goes two ranks on, to the same local rank on the
# other host (the hierarchical shift): when that host is lost, the one left
# resumes from memory with both its shards from the copies.
# timeout: 360
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"
. "$TOP/tests/lib/ddp_lib.sh"

[ -x "$TRAIN" ] || skip_all "build/bin/train is not built"
hosts_up 2
c10d_endpoint
C="--rdzv_backend c10d --rdzv_endpoint $EP --nnodes 2 --nproc_per_node 1 --max_restarts 3"
W="$TRAIN --data synthetic --train-samples 12800 --test-samples 500 --model cnn --steps 100 --batch-size 32 --log-every 1 --seed 2 --snapshot-every 1"

node 0 a $C --rdzv_id ref --rdzv_conf "$MN_HB$HOST0" $W
node 1 b $C --rdzv_id ref --rdzv_conf "$MN_HB$OTHER" $W
check_exits "2 hosts x 1 worker: the reference run" "0 0" a b
ref=$(hash_of "$T/a.out")
ok test -n "$ref"

node 0 a $C --rdzv_id kill --rdzv_conf "$MN_HB$HOST0" $W
node 1 b $C --rdzv_id kill --rdzv_conf "$MN_HB$OTHER" $W
ok wait_for 60 out_has a "^step 30/100"
pb=$(agent_pid b)
kill -KILL "$(pgrep -P "$pb" -x train | head -n 1)"
check_exits "the second host's worker SIGKILLed: both agents finish" "0 0" a b
ok out_has a "2 processes, cpu: .*2 ranks on 2 hosts"
# (or, the worker killed in its copy, from the other rank's newer one)
ok out_has a "train: resumed from memory.*[ (]step [3-9][0-9], epoch"
unlike "$(cat "$T/a.out" "$T/a.err")" "warning: (no snapshot|not resuming)" "no fallback from memory"
is "$(hash_of "$T/a.out")" "$ref" "the weights of the run that never stopped, bit for bit"

# ---- ZeRO-1: the peer copies count in the memory limit ----
Z="--rdzv_backend c10d --rdzv_endpoint $EP --nnodes 2 --nproc_per_node 1 --max_restarts 0"
# zlim ID LIMIT: both hosts with MG_SNAPSHOT_MAX_BYTES=LIMIT, 5 steps of ZeRO-1
zlim() {
    export MG_SNAPSHOT_MAX_BYTES="$2"
    node 0 a $Z --rdzv_id "$1" --rdzv_conf "$MN_HB$HOST0" $W --zero 1 --optimizer adamw --steps 5
    node 1 b $Z --rdzv_id "$1" --rdzv_conf "$MN_HB$OTHER" $W --zero 1 --optimizer adamw --steps 5
    unset MG_SNAPSHOT_MAX_BYTES
}
zlim z1 1
nodes_wait a b
need=$(sed -n "s/.*two copies of this rank's state, two of its peer's shard and room to send its own take \([0-9]*\) bytes.*/\1/p" \
    "$T/a.out" "$T/a.err" | head -n 1)
DESC="a limit too small: refused at the start, naming the peer's copies ($need bytes)" ok test -n "$need"
zlim z2 $((need - 1))
nodes_wait a b
like "$(cat "$T/a.out" "$T/a.err")" "cannot keep snapshots in memory: two copies of this rank's state, two of its peer's shard and room to send its own take $need bytes of memory, more than the $((need - 1)) allowed \(MG_SNAPSHOT_MAX_BYTES\)" \
    "one byte short of own and peer slots and the exchange: refused, saying what takes the room"
is "$RCS" "1 1" "both hosts stop at the start"
zlim z3 "$need"
check_exits "exactly the room for own and peer slots and the exchange: the run goes" "0 0" a b
unlike "$(cat "$T/a.out" "$T/a.err")" "cannot keep|not keeping|no memory" "with snapshots, nothing to say about them"

# ---- ZeRO-1, two ranks per host: the copies by the hierarchical shift ----
Z2="--rdzv_backend c10d --rdzv_endpoint $EP --nnodes 1:2 --nproc_per_node 2 --max_restarts 3"
node 0 a $Z2 --rdzv_id z22 --rdzv_conf "$MN_HB$HOST0" $W --zero 1 --optimizer adamw --lr 0.001 --batch-size 16
node 1 b $Z2 --rdzv_id z22 --rdzv_conf "$MN_HB$OTHER" $W --zero 1 --optimizer adamw --lr 0.001 --batch-size 16
ok wait_for 120 out_has a "^step 30/100"
pb=$(agent_pid b)
kill -KILL "$pb" $(pgrep -P "$pb" -x train)
{ nodes_wait b; } 2>/dev/null
check_exits "ZeRO-1, 2 ranks per host, the second host lost: the first finishes" "0" a
log="$(cat "$T/a.out" "$T/a.err")"
like "$log" "train: 4 processes, cpu: hierarchical, 4 ranks on 2 hosts" "4 ranks on 2 hosts"
like "$log" "train: resumed from memory: the ZeRO-1 shards of world size 4 \(2 from a peer's copy\) \(step [3-9][0-9], epoch 1\)" \
    "the lost host's two shards from the copies its local ranks' peers kept"
unlike "$log" "warning: (no snapshot|not resuming)" "no fallback from memory"
done_testing
