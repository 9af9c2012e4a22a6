#!/bin/sh
# The source's copy damaged (docs/train.md, "Snapshots in memory"): three
# agents on three test hosts, one worker each, --nnodes 2:3, plain DDP. The
# workers of the first two are SIGSTOPped when both hold the same newest
# step, the first one's copy of it damaged (snaptool), and the third node
# lost; the stopped workers are SIGKILLed by their agents as the group
# re-forms. The two left re-form at world size 2. Each rank checks its copies
# (checksum) before it offers them, so the damaged one is never offered: the
# other survivor's copy of the same newest step is the source, nothing falls
# back to the disk or to an older step (every rank held the whole state), and
# the run ends with the bits of its recorded schedule's replay.
# timeout: 600
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"
. "$TOP/tests/lib/ddp_lib.sh"

[ -x "$TRAIN" ] || skip_all "build/bin/train is not built"
hosts_up 3
c10d_endpoint
# --shutdown_timeout 0: the agents SIGKILL their stopped workers at the re-formation, so
# neither takes a copy of a newer step over the damaged one
C="--rdzv_backend c10d --rdzv_endpoint $EP --nproc_per_node 1 --max_restarts 3 --shutdown_timeout 0"
W="$TRAIN --data synthetic --train-samples 12800 --test-samples 500 --model cnn --batch-size 32 --log-every 1 --seed 3 --snapshot-every 1"
EL="--nnodes 2:3"
N=200

node 0 a $C $EL --log_dir "$T/la" --rdzv_id src --rdzv_conf "$MN_HB$HOST0" $W --steps $N
node 1 b $C $EL --rdzv_id src --rdzv_conf "$MN_HB$OTHER" $W --steps $N
node 2 c $C $EL --rdzv_id src --rdzv_conf "$MN_HB$OTHER" $W --steps $N
ok wait_for 90 out_has a "^step 30/"
pa=$(agent_pid a)
pb=$(agent_pid b)
wa=$(pgrep -P "$pa" -x train | head -n 1)
wb=$(pgrep -P "$pb" -x train | head -n 1)
at_cleanup "kill -CONT $wa $wb 2>/dev/null" # a stopped process ignores SIGTERM
memfd() { echo "/proc/$1/fd/$(ls -l "/proc/$1/fd" 2>/dev/null | awk '/mg-snapshot-0/ { print $9; exit }')"; }
newest() { "$HELPERS/snaptool" list "$1" | sed -n 's/^slot [01] generation [0-9]* step \([0-9]*\) valid 1$/\1/p' | sort -n | tail -n 1; }
ma=$(memfd "$pa")
mb=$(memfd "$pb")
# frozen where both hold the same newest step (one may be a copy ahead: try again)
i=0
while :; do
    kill -STOP "$wa" "$wb"
    sa=$(newest "$ma")
    sb=$(newest "$mb")
    [ -n "$sa" ] && [ "$sa" = "$sb" ] && break
    i=$((i + 1))
    [ $i -ge 50 ] && break
    kill -CONT "$wa" "$wb"
    sleep 0.1
done
DESC="both survivors hold their own copy of step ${sa:-none} (b: ${sb:-none})" ok test -n "$sa" -a "$sa" = "$sb"
"$HELPERS/snaptool" corrupt "$ma" "$sa"
DESC="the first survivor's copy of step $sa damaged" ok test $? = 0
pc=$(agent_pid c)
wc=$(pgrep -P "$pc" -x train | head -n 1)
kill -KILL "$pc" $wc
{ nodes_wait c; } 2>/dev/null # (the shell would say "Killed")
check_exits "a node lost, the source's copy damaged: the two left finish" "0 0" a b
log="$(cat "$T/a.out" "$T/a.err")"
like "$log" "train: resumed from memory: rank [0-2]'s snapshot at world size 3 \(step $sa, epoch 1\)" \
    "from the other survivor's copy of the same newest step (the only whole one left)"
is "$(grep -c "resumed from" "$T/a.out" "$T/a.err" | awk -F: '{ n += $2 } END { print n }')" 1 "once"
unlike "$log" "warning: (no snapshot|not resuming)|resuming from" "no fallback: not from the disk"
lost=$(hash_of "$T/a.out")
ok test -n "$lost"
sched=$("$MGLAUNCH" logs "$T/la" --run src --schedule)
like "$sched" "
attempt [0-9]+: world size 2 \(2 nodes; here node 0, ranks 0-0\), steps $sa-end, from memory \(rank [0-2]'s snapshot at world size 3\)$" \
    "the schedule: then 2 from the other survivor's copy"
"$TOP/scripts/replay.sh" "$T/la" src "$T/rp" $W --steps $N >"$T/replay.out" 2>&1
rc=$?
is "$rc" 0 "scripts/replay.sh replays the recorded schedule"
[ "$rc" = 0 ] || diag "$(cat "$T/replay.out")"
is "$(sed -n 's/^replay: param hash //p' "$T/replay.out")" "$lost" \
    "the run whose source copy was damaged ends with its replay's weights, bit for bit"
done_testing
