#!/bin/sh
# In-memory snapshots (docs/train.md, "Snapshots in memory"): a 2-process run
# whose workers are SIGKILLed at random steps resumes each time from the
# snapshot in the memory mglaunch keeps, redoing at most one step, and ends
# bit-identical to a run that never stopped, with no checkpoint on disk to
# help; a damaged snapshot on one rank (the agent stopped, the worker killed,
# a byte flipped in its memfd) is replaced by the other rank's copy (a
# replicated optimizer: every rank holds the whole state), damaged on both,
# the run goes to the checkpoint directory, said once, never to wrong weights;
# ZeRO-1 shards come back the same way; a snapshot larger than the memory
# allowed is refused at start; --snapshot-every 0, a run without mglaunch, and
# ranks of which one has no memory keep none. (A writer killed in the middle of
# a copy: tests/unit/test_snapshot.c.)
# timeout: 300
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] && [ -x "$MGLAUNCH" ] && [ -x "$HELPERS/snaptool" ] ||
    skip_all "train, mglaunch or snaptool not built"
. "$(dirname "$0")/../lib/ddp_lib.sh"
DATA="--data synthetic --train-samples 12800 --test-samples 500"
# 200 steps an epoch: with the default cadence no checkpoint is written before the end
ARGS="$DATA --model cnn --steps 150 --batch-size 32 --log-every 1 --seed 5 --snapshot-every 1"

launch() {
    n=$1
    shift
    "$MGLAUNCH" --nproc_per_node "$n" --log_dir "$T/logs" "$@" >"$T/console" 2>&1
}
# the memfd of local rank R in mglaunch PID's descriptors
memfd_of() { ls -l "/proc/$1/fd" 2>/dev/null | awk -v m="mg-snapshot-$2" '$0 ~ m { print $9; exit }'; }
# the step of the last "step N/..." line in FILE
last_step() { sed -n 's/^step \([0-9]*\)\/.*/\1/p' "$1" | tail -n 1; }

launch 2 "$TRAIN" $ARGS --checkpoint-dir "$T/ck_ref"
is "$?" 0 "uninterrupted reference run"
ref=$(hash_of "$T/console")
ok test -n "$ref"

# ---- workers SIGKILLed at random steps: resumed from memory ----
"$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/klogs" --max_restarts 10 "$TRAIN" $ARGS \
    --checkpoint-dir "$T/ck_kill" >"$T/console" 2>&1 &
lp=$!
at_cleanup "kill -KILL $lp 2>/dev/null"
kills=0
: >"$T/redone"
while [ $kills -lt 3 ] && alive "$lp"; do
    seen=$(grep -c "^step " "$T/console")
    sleep "$(awk -v s="$$$kills" 'BEGIN { srand(s); printf "%.2f", 0.3 + rand() * 0.6 }')"
    [ "$(grep -c "^step " "$T/console")" -gt "$seen" ] || continue
    [ "$(last_step "$T/console")" -lt 120 ] || break # not while the run ends
    w=$(pgrep -P "$lp" -x train | shuf -n 1)
    [ -n "$w" ] || continue
    kill -KILL "$w" 2>/dev/null || continue
    kills=$((kills + 1))
    wait_for 60 sh -c "[ \$(grep -c 'resumed from memory' '$T/console') -ge $kills ]" || break
    # the last step rank 0 logged in the attempt killed, and where the next went on from
    # (later, when it was killed between its snapshot and its step line: none redone)
    before=$(last_step "$(find "$T/klogs" -path "*/attempt_$((kills - 1))/0/stdout.log")")
    # (a rank killed in its copy: every rank takes the other's newer one, "step N, epoch")
    sed -n "s/.*resumed from memory.*[ (]step \([0-9]*\), epoch.*/\1/p" "$T/console" |
        tail -n 1 | awk -v b="$before" '{ print (b > $1 ? b - $1 : 0) }' >>"$T/redone"
done
wait "$lp"
rc=$?
is "$rc" 0 "killed $kills times: mglaunch restarts until the run finishes"
is "$(grep -c "resumed from memory" "$T/console")" "$kills" "every restart resumed from memory"
diag "steps redone per failure: $(tr '\n' ' ' <"$T/redone")"
DESC="at most one step redone per failure" ok awk 'NF && $1 > 1 { bad = 1 } END { exit bad }' "$T/redone"
DESC="each failure measured" ok test -s "$T/redone"
is "$(ls "$T/ck_kill" | grep -c '\.mgc$')" 1 "no checkpoint but the final one was written"
# the event log records each attempt's start: step 0 first, then each resume's step from memory
ev=$(find "$T/klogs" -name events.jsonl)
froms=$(sed -n 's/.*"event":"resume".*"from":"\([a-z]*\)","step":\([0-9]*\).*/\1 \2/p' "$ev" | tr '\n' ' ')
said=$(sed -n "s/.*resumed from memory.*[ (]step \([0-9]*\), epoch.*/memory \1/p" "$T/console" | tr '\n' ' ')
is "$froms" "start 0 $said" "events.jsonl: a resume event per attempt, with its source and step"
is "$(hash_of "$T/console")" "$ref" "the resumed run ends with the reference run's weights, bit for bit"
unlike "$(cat "$T/console")" "warning" "and nothing to warn about"

# ---- a damaged snapshot on rank 1 ----
none_alive() {
    for p in "$@"; do alive "$p" && return 1; done
    return 0
}
# damage WHAT RUN_ARGS...: the agent stopped, rank 1 killed, its newest snapshot
# damaged ("newest"), or every snapshot of both ranks ("all"), the agent continued
damage() {
    what=$1
    shift
    "$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/logs" --max_restarts 3 "$TRAIN" "$@" \
        >"$T/console" 2>&1 &
    lp=$!
    wait_for 60 grep -q "^step 40/" "$T/console"
    kill -STOP "$lp"
    # the workers are children of the launcher; rank 1's is local rank 1's
    w1=$(grep -l "^LOCAL_RANK=1$" $(for p in $(pgrep -P "$lp" -x train); do
        tr '\0' '\n' <"/proc/$p/environ" >"$T/env.$p" && echo "$T/env.$p"; done) |
        sed 's/.*env\.//')
    ws=$(pgrep -P "$lp" -x train)
    kill -KILL "$w1"
    # rank 0 fails on its next collective: its last snapshot is taken once it has exited
    wait_for 60 none_alive $ws
    m0=/proc/$lp/fd/$(memfd_of "$lp" 0)
    m1=/proc/$lp/fd/$(memfd_of "$lp" 1)
    "$HELPERS/snaptool" list "$m0" >"$T/slots0"
    "$HELPERS/snaptool" list "$m1" >"$T/slots1"
    newest1=$(awk '$8 == 1 { print $6 }' "$T/slots1" | sort -n | tail -n 1)
    if [ "$what" = all ]; then
        for s in $(awk '$8 == 1 { print $6 }' "$T/slots1"); do "$HELPERS/snaptool" corrupt "$m1" "$s"; done
        for s in $(awk '$8 == 1 { print $6 }' "$T/slots0"); do "$HELPERS/snaptool" corrupt "$m0" "$s"; done
    else
        "$HELPERS/snaptool" corrupt "$m1" "$newest1"
    fi
    kill -CONT "$lp"
    wait "$lp"
}

damage newest $ARGS
is "$?" 0 "rank 1's newest snapshot damaged: the run finishes"
# the newest step rank 0 holds, sent to rank 1: nothing lost to the damage
newest0=$(awk '$8 == 1 { print $6 }' "$T/slots0" | sort -n | tail -n 1)
like "$(cat "$T/console")" "resumed from memory: rank 0's snapshot at world size 2 \(step $newest0, epoch 1\)" \
    "rank 1 resumes from rank 0's copy of the newest step ($newest0)"
unlike "$(cat "$T/console")" "warning" "no fallback to warn about"
is "$(hash_of "$T/console")" "$ref" "with the reference run's weights"

damage all $ARGS --checkpoint-every 10 --checkpoint-dir "$T/ck_all"
is "$?" 0 "every snapshot of both ranks damaged: the run finishes"
like "$(cat "$T/console")" "warning: no snapshot in memory that every rank holds \(rank 0: slot [01]: payload checksum mismatch \(step [0-9]+\)\): resuming from --checkpoint-dir" \
    "the fallback to the disk is said, with a rank's reason"
is "$(grep -c "no snapshot in memory" "$T/console")" 1 "once"
like "$(cat "$T/console")" "resumed from $T/ck_all/ckpt-0000000000[1-9]0.mgc" "from the newest checkpoint"
is "$(hash_of "$T/console")" "$ref" "with the reference run's weights"

# ---- ZeRO-1: each rank's shard comes back from its own snapshot ----
"$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/logs" --max_restarts 3 "$TRAIN" $ARGS --zero 1 \
    --optimizer adamw --lr 0.001 >"$T/console" 2>&1 &
lp=$!
wait_for 60 grep -q "^step 15/" "$T/console"
kill -KILL "$(pgrep -P "$lp" -x train | shuf -n 1)"
wait "$lp"
is "$?" 0 "ZeRO-1 with AdamW, a worker killed: the run finishes"
like "$(cat "$T/console")" "resumed from memory" "from memory"
zkill=$(hash_of "$T/console")
launch 2 "$TRAIN" $ARGS --zero 1 --optimizer adamw --lr 0.001
is "$zkill" "$(hash_of "$T/console")" "with the weights of a run that never stopped"
ok test -n "$zkill"

# ---- limits, and no snapshots ----
MG_SNAPSHOT_MAX_BYTES=100000 launch 1 "$TRAIN" $ARGS
is "$?" 1 "a snapshot over the memory allowed: exit 1"
like "$(cat "$T/console")" "cannot keep snapshots in memory: two copies of this rank's state take [0-9]+ bytes of memory, more than the 100000 allowed \(MG_SNAPSHOT_MAX_BYTES\); set MG_SNAPSHOT_MAX_BYTES higher, --snapshot-every 0 to train without them" \
    "refused at start, saying what and what to do"
MG_SNAPSHOT_MAX_BYTES=lots launch 1 "$TRAIN" $ARGS
like "$(cat "$T/console")" "MG_SNAPSHOT_MAX_BYTES='lots': expected a number of bytes" "a bad limit is named"
MG_SNAPSHOT_MAX_BYTES=0 launch 1 "$TRAIN" $ARGS
like "$(cat "$T/console")" "MG_SNAPSHOT_MAX_BYTES=0: expected a number of bytes above 0; to keep no snapshots, use --snapshot-every 0" \
    "a limit of 0 is neither no limit nor no snapshots: refused"
"$TRAIN" $DATA --model mlp --steps 3 --snapshot-every 2 >"$T/alone" 2>&1
is "$?" 0 "without mglaunch"
like "$(cat "$T/alone")" "--snapshot-every: no memory to keep snapshots in" "an explicit --snapshot-every says it has none"
launch 1 "$TRAIN" $DATA --model mlp --steps 40
like "$(cat "$T/console")" "snapshots in memory every [0-9]+ steps? \(one takes" "auto says what it chose"
# ranks started by hand, only rank 0 given memory: snapshots are for all ranks or none
port=$(free_port)
: >"$T/mem0"
for r in 0 1; do
    fd=""
    [ $r = 0 ] && fd=MG_SNAPSHOT_FD=9
    bg env RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" $fd \
        sh -c 'exec 9<>"$0"; exec "$@"' "$T/mem0" "$TRAIN" $DATA --model mlp --steps 30 \
        >"$T/half.$r" 2>&1
    eval "hp$r=\$!"
done
wait "$hp0"
rc0=$?
wait "$hp1"
is "$rc0 $?" "0 0" "one rank of two with memory: the run goes on"
like "$(cat "$T/half.0")" "warning: rank 1 keeps no snapshots in memory \(MG_SNAPSHOT_FD unset: not started by mglaunch\?\): this run keeps none" \
    "said once, by rank 0"
unlike "$(cat "$T/half.0")" "(snapshots in memory every|[0-9]+ snapshots in memory)" "and none is kept"
launch 1 "$TRAIN" $DATA --model mlp --steps 5 --snapshot-every 0
unlike "$(cat "$T/console")" "snapshots in memory" "--snapshot-every 0 keeps none"
done_testing
