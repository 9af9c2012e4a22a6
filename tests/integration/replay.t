#!/bin/sh
# The membership schedule and its replay (docs/logs.md, "The membership
# schedule"; docs/train.md, "Replaying a schedule"): `mglaunch logs
# --schedule` reads an event log into segments (a resume from an older state
# ends the segments past it; an attempt that never said where it went on from
# has none); train --stop-at-step stops a run after a step with a checkpoint,
# its schedule unchanged; a 2-process run whose workers are SIGKILLed twice
# (resumed from memory) ends with the bits scripts/replay.sh gets from its
# recorded schedule. (A node loss: snapshot_nodeloss.t.)
# timeout: 240
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] && [ -x "$MGLAUNCH" ] || skip_all "train or mglaunch not built"
. "$(dirname "$0")/../lib/ddp_lib.sh"

# ---- the schedule of a written event log ----
mkdir -p "$T/logs/job"
ev() { printf '%s\n' "$1" >>"$T/logs/job/events.jsonl"; }
st() { ev "{\"event\":\"attempt_start\",\"time_ms\":1,\"attempt\":$1,\"restart_count\":$1,\"round\":$1,\"nproc\":1,\"world_size\":$2,\"group_rank\":0,\"group_world_size\":$2,\"first_rank\":0,\"master_addr\":\"h\",\"master_port\":1,\"dir\":\"d\"}"; }
en() { ev "{\"event\":\"attempt_end\",\"time_ms\":2,\"attempt\":$1,\"result\":\"$2\",\"failed\":1,\"stopped\":0,\"duration_ms\":5,\"step\":$3}"; }
ev '{"event":"run_start","time_ms":1,"run_id":"job","host":"h","pid":1,"nproc":1,"argv":["train"]}'
st 0 3
ev '{"event":"resume","time_ms":1,"attempt":0,"rank":0,"world_size":3,"from":"start","step":0,"epoch":1}'
en 0 failed 40
st 1 3
ev '{"event":"resume","time_ms":1,"attempt":1,"rank":0,"world_size":3,"from":"memory","step":31,"epoch":1,"source_world_size":3}'
en 1 failed 50
st 2 3 # failed before its workers said anything
en 2 failed 31
st 3 2
ev '{"event":"resume","time_ms":1,"attempt":3,"rank":0,"world_size":2,"from":"disk","step":20,"epoch":1,"source_world_size":3,"checkpoint":"/ck/ckpt-000000000020.mgc"}'
en 3 failed 47
st 4 2
ev '{"event":"resume","time_ms":1,"attempt":4,"rank":0,"world_size":2,"from":"memory","step":45,"epoch":1,"source_rank":1,"source_world_size":2}'
cp "$T/logs/job/events.jsonl" "$T/unfinished"
en 4 succeeded 100
ev '{"event":"run_end","time_ms":3,"result":"succeeded","exit_code":0,"rounds":5,"restarts":4}'
out=$("$MGLAUNCH" logs "$T/logs" --run job --schedule 2>&1)
is "$?" 0 "--schedule: exit 0"
is "$out" "# run job: 3 segments
attempt 0: world size 3 (3 nodes; here node 0, ranks 0-0), steps 0-20, from the start
attempt 3: world size 2 (2 nodes; here node 0, ranks 0-0), steps 20-45, from disk (/ck/ckpt-000000000020.mgc)
attempt 4: world size 2 (2 nodes; here node 0, ranks 0-0), steps 45-end, from memory (rank 1's snapshot at world size 2)" \
    "segments: attempt 1's steps dropped by the resume from an older checkpoint, attempt 2 said nothing"
cp "$T/unfinished" "$T/logs/job/events.jsonl"
like "$("$MGLAUNCH" logs "$T/logs" --run job --schedule 2>&1)" "did not succeed.*
.*
.*
attempt 4: .*, steps 45-\?, from memory" "a run that has not ended: its last segment's end is not known"
grep -v '"resume"' "$T/unfinished" >"$T/logs/job/events.jsonl"
out=$("$MGLAUNCH" logs "$T/logs" --run job --schedule 2>&1)
is "$?" 1 "no resume event: exit 1"
like "$out" "run 'job' records no resume in .*events.jsonl: its workers did not say where they went on from \(.*--hang-timeout 0" \
    "said in a line"
out=$("$MGLAUNCH" logs "$T/logs" --run job --schedule --plot x.svg 2>&1)
is "$?" 2 "--schedule with --plot: bad usage"
like "$out" "does not go with --plot" "said"

# ---- --stop-at-step ----
A="--data synthetic --train-samples 3200 --test-samples 100 --model cnn --batch-size 32 --log-every 10 --seed 4 --steps 60 --schedule cosine"
"$TRAIN" $A >"$T/whole" 2>&1
is "$?" 0 "a whole run"
"$TRAIN" $A --checkpoint-dir "$T/c1" --stop-at-step 25 >"$T/part" 2>&1
is "$?" 0 "--stop-at-step 25"
like "$(cat "$T/part")" "train: stopped after step 25 of 60 \(--stop-at-step\), param hash [0-9a-f]+" "said"
ok test -f "$T/c1/ckpt-000000000025.mgc"
"$TRAIN" $A --checkpoint-dir "$T/c2" --resume "$T/c1/ckpt-000000000025.mgc" >"$T/rest" 2>&1
is "$(hash_of "$T/rest")" "$(hash_of "$T/whole")" \
    "resumed from there: the whole run's bits (the cosine schedule kept its length)"
out=$("$TRAIN" $A --checkpoint-dir "$T/c1" --stop-at-step 20 2>&1)
is "$?" 1 "--stop-at-step before the step resumed from: an error"
like "$out" "train: --stop-at-step 20: this run is already at step 25" "said"
out=$("$TRAIN" $A --checkpoint-dir "$T/c3" --stop-at-step 61 2>&1)
is "$?" 1 "--stop-at-step past the run's last step: an error"
like "$out" "train: --stop-at-step 61 is past this run's last step, 60; leave it out to train to the end" "said"
ok test ! -e "$T/c3/ckpt-000000000060.mgc"
out=$("$TRAIN" $A --stop-at-step 5 2>&1)
is "$?" 2 "--stop-at-step without --checkpoint-dir: a usage error"
like "$out" "--stop-at-step needs --checkpoint-dir" "said"
out=$("$TRAIN" $A --snapshot-every abc 2>&1)
is "$?" 2 "--snapshot-every abc: a usage error"
like "$out" "--snapshot-every: 'abc' is neither auto nor a number of steps \\(0: none\\)" "naming both forms"

# ---- a run with two workers killed, and its replay ----
ARGS="--data synthetic --train-samples 12800 --test-samples 500 --model cnn --steps 150 --batch-size 32 --log-every 1 --seed 6 --snapshot-every 1"
"$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/klogs" --rdzv_id kills --max_restarts 5 "$TRAIN" $ARGS \
    >"$T/console" 2>&1 &
lp=$!
at_cleanup "kill -KILL $lp 2>/dev/null"
for k in 1 2; do
    wait_for 60 sh -c "[ \$(grep -c '^step ' '$T/console') -ge $((k * 40)) ]" || break
    kill -KILL "$(pgrep -P "$lp" -x train | shuf -n 1)"
    wait_for 60 sh -c "[ \$(grep -c 'resumed from memory' '$T/console') -ge $k ]" || break
done
wait "$lp"
is "$?" 0 "two workers killed: the run finishes"
is "$(grep -c "resumed from memory" "$T/console")" 2 "each time from memory"
"$MGLAUNCH" logs "$T/klogs" --run kills --schedule >"$T/sched"
is "$(grep -c '^attempt' "$T/sched")" 3 "its schedule: three segments"
"$TOP/scripts/replay.sh" "$T/klogs" kills "$T/rp" "$TRAIN" $ARGS >"$T/replay.out" 2>&1
rc=$?
is "$rc" 0 "scripts/replay.sh"
[ "$rc" = 0 ] || diag "$(cat "$T/replay.out")"
is "$(sed -n 's/^replay: param hash //p' "$T/replay.out")" "$(hash_of "$T/console")" \
    "the run ends with its replay's weights, bit for bit"
like "$(cat "$T/replay.out")" "^replay: the same as the run's$" "  and the script says so itself"
# Other train arguments than the run's: another result, said, exit 1.
"$TOP/scripts/replay.sh" "$T/klogs" kills "$T/rp2" "$TRAIN" $ARGS --seed 7 >"$T/replay2.out" 2>&1
is "$?" 1 "a replay with other TRAIN_ARGS: exit 1"
like "$(cat "$T/replay2.out")" "the run ended with param hash $(hash_of "$T/console"), not [0-9a-f]+: were TRAIN_ARGS the run's own" \
    "  saying the run's hash and what to check"
done_testing
