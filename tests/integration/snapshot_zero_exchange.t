#!/bin/sh
# ZeRO-1 snapshots in memory (docs/train.md, "Snapshots in memory"), a worker
# SIGKILLed in the middle of the exchange that copies each rank's optimizer
# shard to the next node: three agents on three test hosts, one worker each.
# The test hook MG_TEST_SNAPSHOT_STOP=S (set on the third host only) stops its
# worker in the copy of step S, its peer slot's copy under way and the other
# ranks inside the exchange; the test then SIGKILLs it.
# - The worker alone: every rank holds its own snapshot of step S, whole (the
#   own copy comes before the exchange), so all three resume from it; the copies
#   left under way are not used, and the run ends with the bits of its replay.
# - The worker with its node (agent and worker SIGKILLed): no survivor holds a
#   whole copy of the lost rank's shard of step S (the one under way does not
#   check out), so the two left resume from step S - 1, the newest step of
#   which every shard is whole somewhere, said once, and end with the bits of
#   the replay of the schedule the event log recorded.
# timeout: 900
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"
. "$TOP/tests/lib/ddp_lib.sh"

[ -x "$TRAIN" ] || skip_all "build/bin/train is not built"
hosts_up 3
c10d_endpoint
C="--rdzv_backend c10d --rdzv_endpoint $EP --nproc_per_node 1 --max_restarts 3"
W="$TRAIN --data synthetic --train-samples 12800 --test-samples 500 --model cnn --batch-size 32 --log-every 1 --seed 5 --snapshot-every 1 --zero 1 --optimizer adamw --lr 0.001"
STOP=25

# up ID ELASTIC ARGS...: agents a, b (hosts 0, 1) and c (host 2, with the hook)
up() {
    _id=$1
    _el=$2
    shift 2
    node 0 a $C $_el --log_dir "$T/l$_id" --rdzv_id "$_id" --rdzv_conf "$MN_HB$HOST0" $W "$@"
    node 1 b $C $_el --rdzv_id "$_id" --rdzv_conf "$MN_HB$OTHER" $W "$@"
    MG_TEST_SNAPSHOT_STOP=$STOP node 2 c $C $_el --rdzv_id "$_id" --rdzv_conf "$MN_HB$OTHER" $W "$@"
    ok wait_for 120 out_has c "test hook \(MG_TEST_SNAPSHOT_STOP\): stopped in the ZeRO-1 copy of step $STOP"
}
# peer_slots NAME: the peer slots of the agent's memory, as snaptool lists them
peer_slots() {
    _pa=$(agent_pid "$1")
    _m=/proc/$_pa/fd/$(ls -l "/proc/$_pa/fd" 2>/dev/null | awk '/mg-snapshot-0/ { print $9; exit }')
    "$HELPERS/snaptool" list "$_m" | sed -n '3,4p'
}
# replay ID ARGS...: the recorded schedule trained again; its param hash in RH
replay() {
    _id=$1
    shift
    "$TOP/scripts/replay.sh" "$T/l$_id" "$_id" "$T/rp$_id" $W "$@" >"$T/replay$_id.out" 2>&1
    _rc=$?
    is "$_rc" 0 "$_id: scripts/replay.sh replays the recorded schedule"
    [ "$_rc" = 0 ] || diag "$(tail -n 20 "$T/replay$_id.out")"
    RH=$(sed -n 's/^replay: param hash //p' "$T/replay$_id.out")
}

# ---- the worker alone ----
up wk "--nnodes 3" --steps 60
wc=$(pgrep -P "$(agent_pid c)" -x train | head -n 1)
# rank 0 receives rank 2's shard: its copy of step $STOP stays under way
like "$(peer_slots a)" "valid 0 why a copy was interrupted" \
    "the stopped worker's shard: the copy on the next node is under way"
kill -KILL "$wc"
check_exits "the worker SIGKILLed in the exchange: the three finish" "0 0 0" a b c
log="$(cat "$T/a.out" "$T/a.err")"
like "$log" "train: resumed from memory \(the snapshot of step $STOP, epoch 1\)" \
    "every rank from its own snapshot of step $STOP, whole before the exchange"
is "$(printf '%s\n' "$log" | grep -c "resumed from")" 1 "said once"
unlike "$log" "warning: (no snapshot|not resuming)" "no fallback from memory"
run=$(hash_of "$T/a.out")
ok test -n "$run"
replay wk --steps 60
is "$RH" "$run" "the worker killed in the exchange: the run ends with its replay's weights, bit for bit"

# ---- the worker with its node ----
up nd "--nnodes 2:3" --steps 60
like "$(peer_slots a)" "valid 0 why a copy was interrupted" \
    "the lost node's shard of step $STOP: its copy under way"
pc=$(agent_pid c)
kill -KILL "$pc" $(pgrep -P "$pc" -x train | head -n 1)
{ nodes_wait c; } 2>/dev/null
check_exits "the node SIGKILLed in the exchange: the two left finish" "0 0" a b
log="$(cat "$T/a.out" "$T/a.err")"
like "$log" "train: resumed from memory: the ZeRO-1 shards of world size 3 \(1 from a peer's copy\) \(step $((STOP - 1)), epoch 1\)" \
    "from step $((STOP - 1)), whose shards are all whole: the one under way is not used"
is "$(printf '%s\n' "$log" | grep -c "resumed from")" 1 "said once"
like "$log" "warning: resharding a checkpoint of 3 processes: world size 3 -> 2" "resharded as a checkpoint is"
unlike "$log" "warning: (no snapshot|not resuming)" "no fallback to the disk"
run=$(hash_of "$T/a.out")
ok test -n "$run"
replay nd --steps 60
is "$RH" "$run" "the node lost in the exchange: the run ends with its replay's weights, bit for bit"
done_testing
