#!/bin/sh
# A node left out of a re-formation and back with stale snapshots in memory
# (docs/train.md, "Snapshots in memory"): three agents on three test hosts,
# one worker each, --nnodes 2:3, plain DDP. The third agent and its worker are
# SIGSTOPped past heartbeat_timeout: the two others declare it dead, re-form at
# world size 2 and train on from a survivor's copy. Then it is SIGCONTed: its
# agent finds itself dropped, joins the next round as a new node, and the
# group of 3 re-forms around it while its memory still holds its snapshots of
# world size 3, steps behind. Those are not used: the group resumes from the
# newest step the two that trained on hold (at world size 2), and the run ends
# with the bits of the replay of the schedule node a's event log records.
# timeout: 600
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"
. "$TOP/tests/lib/ddp_lib.sh"

[ -x "$TRAIN" ] || skip_all "build/bin/train is not built"
hosts_up 3
c10d_endpoint
C="--rdzv_backend c10d --rdzv_endpoint $EP --nproc_per_node 1 --max_restarts 3"
W="$TRAIN --data synthetic --train-samples 12800 --test-samples 500 --model cnn --batch-size 32 --log-every 1 --seed 3 --snapshot-every 1"
EL="--nnodes 2:3"
N=300

# scenario ID: the three agents of job ID (event log in $T/l_ID), c frozen
# from step 30 until the two left are 40 steps past the step they resumed
# from; waits for all three. Sets stale (that step) and held (the newest
# step c's memory holds meanwhile).
scenario() {
    node 0 a $C $EL --log_dir "$T/l_$1" --rdzv_id "$1" --rdzv_conf "$MN_HB$HOST0" $W --steps $N
    node 1 b $C $EL --rdzv_id "$1" --rdzv_conf "$MN_HB$OTHER" $W --steps $N
    node 2 c $C $EL --rdzv_id "$1" --rdzv_conf "$MN_HB$OTHER" $W --steps $N
    ok wait_for 90 out_has a "^step 30/"
    pc=$(agent_pid c)
    wc=$(pgrep -P "$pc" -x train | head -n 1)
    # a test that stops early must not leave them stopped (a stopped process ignores SIGTERM)
    at_cleanup "kill -CONT $pc $wc 2>/dev/null"
    kill -STOP "$pc" $wc
    ok wait_for 60 out_has a "resumed from memory: rank" # the two left, from a survivor's copy
    ok wait_for 90 out_has a "train: 2 processes"
    # train on well past the step c's memory holds
    stale=$(sed -n 's/.*resumed from memory: .* (step \([0-9]*\), epoch.*/\1/p' "$T/a.out" | tail -n 1)
    ok test -n "$stale"
    ok wait_for 120 out_has a "^step $((stale + 40))/"
    # what c's memory holds meanwhile: its own snapshots of world size 3, as they were when it stopped
    mc=/proc/$pc/fd/$(ls -l "/proc/$pc/fd" 2>/dev/null | awk '/mg-snapshot-0/ { print $9; exit }')
    held=$("$HELPERS/snaptool" list "$mc" | sed -n 's/^slot [01] generation [0-9]* step \([0-9]*\) valid 1$/\1/p' | sort -n | tail -n 1)
    DESC="c's memory still holds a whole snapshot of its own (step ${held:-none}), from before it stopped" \
        ok test -n "$held"
    kill -CONT "$pc" $wc
    nodes_wait a b c
}
id=rejoin
scenario $id
is "$RCS" "0 0 0" "a node frozen past the heartbeat, left out, then back: all three finish"
like "$(cat "$T/c.err")" "re-forming the group \(this node was declared dead: its heartbeats stopped for [0-9.]+ s" \
    "c, thawed, says it was declared dead, and rejoins"
log="$(cat "$T/a.out" "$T/a.err")"
like "$log" "re-forming the group" "the group re-formed"
like "$log" "train: 2 processes" "the two left ran at world size 2"
is "$(printf '%s\n' "$log" | grep -c "^train: 3 processes")" 2 "then at world size 3 again, with c"
back=$(sed -n 's/.*resumed from memory: .* (step \([0-9]*\), epoch.*/\1/p' "$T/a.out" | tail -n 1)
DESC="the group of 3 resumed at a step the two trained on to (step $back), not c's stale one (step $held)" \
    ok test "${back:-0}" -ge $((stale + 40)) -a "${back:-0}" -gt "${held:-0}"
like "$log" "train: resumed from memory: rank [01]'s snapshot at world size 2 \(step $back, epoch [0-9]+\)" \
    "from a copy the two that trained on hold, written at world size 2"
like "$log" "warning: resharding a checkpoint of 2 processes: world size 2 -> 3" "resharded to 3"
unlike "$log" "warning: (no snapshot|not resuming)" "no fallback from memory"
is "$(grep -c "resumed from" "$T/a.out" "$T/a.err" | awk -F: '{ n += $2 } END { print n }')" 2 "once a re-formation"
lost=$(hash_of "$T/a.out")
ok test -n "$lost"
sched=$("$MGLAUNCH" logs "$T/l_$id" --run $id --schedule)
like "$sched" "^attempt 0: world size 3 \(3 nodes; here node 0, ranks 0-0\), steps 0-$stale, from the start
attempt [0-9]+: world size 2 \(2 nodes; .*\), steps $stale-$back, from memory \(rank [0-2]'s snapshot at world size 3\)
attempt [0-9]+: world size 3 \(3 nodes; .*\), steps $back-end, from memory \(rank [01]'s snapshot at world size 2\)$" \
    "the schedule: 3 from the start, 2 from a survivor's copy, 3 again from the copy of world size 2"
"$TOP/scripts/replay.sh" "$T/l_$id" $id "$T/rp" $W --steps $N >"$T/replay.out" 2>&1
rc=$?
is "$rc" 0 "scripts/replay.sh replays the recorded schedule"
[ "$rc" = 0 ] || diag "$(cat "$T/replay.out")"
is "$(sed -n 's/^replay: param hash //p' "$T/replay.out")" "$lost" \
    "the run that left a node out and took it back ends with its replay's weights, bit for bit"
[ "$_tap_fail" = 0 ] || diag "$(sed -n '1,400p' "$T/c.err" | tail -n 30)"
done_testing
