#!/bin/sh
# A node lost, and the in-memory snapshots of the survivors (docs/train.md,
# "Snapshots in memory"): three agents on three test hosts, one worker each,
# --nnodes 2:3; the third agent SIGKILLed with its worker mid-run. The two
# left re-form at world size 2 and resume from memory: one survivor's copy of
# the newest step, sent to the other and resharded as a checkpoint of another
# world size is (plain DDP: every rank holds the whole model and optimizer
# state). The run ends with the bits of a run that replays its schedule: 3
# hosts up to that step, then 2 from its checkpoint. A spare that takes the
# lost node's place is healed the same way (world size 3 throughout): the run
# ends with the bits of one that never stopped. With ZeRO-1 the lost node's
# shard is nowhere else: the run resumes from --checkpoint-dir, said once.
# timeout: 600
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"
. "$TOP/tests/lib/ddp_lib.sh"

[ -x "$TRAIN" ] || skip_all "build/bin/train is not built"
hosts_up 4
c10d_endpoint
C="--rdzv_backend c10d --rdzv_endpoint $EP --nproc_per_node 1 --max_restarts 3"
W="$TRAIN --data synthetic --train-samples 12800 --test-samples 500 --model cnn --batch-size 32 --log-every 1 --seed 3 --snapshot-every 1"
EL="--nnodes 2:3"

# three_up ID ARGS...: the agents a, b, c of an elastic job; waits for step 30
three_up() {
    _id=$1
    shift
    node 0 a $C $EL --rdzv_id "$_id" --rdzv_conf "$MN_HB$HOST0" $W "$@"
    node 1 b $C $EL --rdzv_id "$_id" --rdzv_conf "$MN_HB$OTHER" $W "$@"
    node 2 c $C $EL --rdzv_id "$_id" --rdzv_conf "$MN_HB$OTHER" $W "$@"
    ok wait_for 90 out_has a "^step 30/"
}
# lose_c: the third host's agent and worker SIGKILLed, as a machine that dies
lose_c() {
    pc=$(agent_pid c)
    wc=$(pgrep -P "$pc" -x train | head -n 1)
    kill -KILL "$pc" $wc
    { nodes_wait c; } 2>/dev/null # (the shell would say "Killed")
}

# ---- plain DDP: resumed from a survivor's memory ----
three_up loss --steps 100
lose_c
check_exits "a node lost: the two hosts left finish" "0 0" a b
log="$(cat "$T/a.out" "$T/a.err")"
like "$log" "re-forming the group" "the group re-formed without the lost node"
like "$log" "train: 2 processes" "at world size 2"
like "$log" "train: resumed from memory: rank [0-2]'s snapshot at world size 3 \(step [3-9][0-9], epoch 1\)" \
    "from memory: a survivor's copy, said once with its source and step"
is "$(grep -c "resumed from" "$T/a.out" "$T/a.err" | awk -F: '{ n += $2 } END { print n }')" 1 "once"
like "$log" "warning: resharding a checkpoint of 3 processes: world size 3 -> 2" "resharded as a checkpoint is"
unlike "$log" "warning: (no snapshot|not resuming)" "no fallback from memory"
S=$(sed -n "s/.*resumed from memory: .* (step \([0-9]*\), epoch.*/\1/p" "$T/a.out" | tail -n 1)
lost=$(hash_of "$T/a.out")
ok test -n "$lost"

# the replay of its schedule: 3 hosts for S steps (its last checkpoint), then 2 from there
R="--nnodes 3 --rdzv_id replay1"
node 0 a $C $R --rdzv_conf "$MN_HB$HOST0" $W --steps "$S" --checkpoint-dir "$T/rp"
node 1 b $C $R --rdzv_conf "$MN_HB$OTHER" $W --steps "$S" --checkpoint-dir "$T/rp"
node 2 c $C $R --rdzv_conf "$MN_HB$OTHER" $W --steps "$S" --checkpoint-dir "$T/rp"
check_exits "the replay: 3 hosts up to step $S" "0 0 0" a b c
ck=$(ls "$T"/rp/ckpt-*.mgc | tail -n 1)
like "$ck" "ckpt-0*$S.mgc" "its checkpoint of step $S"
R="--nnodes 2 --rdzv_id replay2"
node 0 a $C $R --rdzv_conf "$MN_HB$HOST0" $W --steps 100 --resume "$ck"
node 1 b $C $R --rdzv_conf "$MN_HB$OTHER" $W --steps 100 --resume "$ck"
check_exits "then 2 hosts from it" "0 0" a b
is "$(hash_of "$T/a.out")" "$lost" "the run that lost a node ends with the replay's weights, bit for bit"

# ---- a spare takes the lost node's place: healed from a survivor's memory ----
R="--nnodes 3 --rdzv_id ref3"
node 0 a $C $R --rdzv_conf "$MN_HB$HOST0" $W --steps 400
node 1 b $C $R --rdzv_conf "$MN_HB$OTHER" $W --steps 400
node 2 c $C $R --rdzv_conf "$MN_HB$OTHER" $W --steps 400
check_exits "the reference: 3 hosts that never stopped" "0 0 0" a b c
ref=$(hash_of "$T/a.out")
three_up spare --steps 400
node 3 d $C $EL --rdzv_id spare --rdzv_conf "$MN_HB$OTHER" $W --steps 400
ok wait_for 60 out_has d "waiting for a place in the job" # the spare waits in the rendezvous
lose_c
check_exits "a node lost, a spare in its place: all three finish" "0 0 0" a b d
log="$(cat "$T/a.out" "$T/a.err")"
like "$log" "train: resumed from memory: rank [0-2]'s snapshot at world size 3 \(step [0-9]+, epoch [0-9]+\)" \
    "every rank, the spare too, from a survivor's copy"
unlike "$log" "resharding|warning: (no snapshot|not resuming)" "at the same world size, no fallback"
is "$(hash_of "$T/a.out")" "$ref" "the run ends with the weights of one that never stopped, bit for bit"

# ---- ZeRO-1: the lost node's shard is gone; the disk, said once ----
three_up zloss --steps 80 --zero 1 --optimizer adamw --lr 0.001 --checkpoint-dir "$T/zk" \
    --checkpoint-every 10
lose_c
check_exits "ZeRO-1, a node lost: the two hosts left finish" "0 0" a b
log="$(cat "$T/a.out" "$T/a.err")"
like "$log" "warning: no snapshot in memory that every rank holds \(rank [01]: its memory held snapshots of another size \(a ZeRO-1 shard at another world size\), dropped\): resuming from --checkpoint-dir" \
    "the fallback is said, with why"
is "$(printf '%s\n' "$log" | grep -c "no snapshot in memory")" 1 "once"
like "$log" "train: resumed from $T/zk/ckpt-0*[1-9]0.mgc" "from the newest checkpoint"
unlike "$log" "resumed from memory" "not from memory"
done_testing
