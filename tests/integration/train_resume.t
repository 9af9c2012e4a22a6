#!/bin/sh
# Checkpoints and resume through the train program: a run stopped after any
# checkpoint and resumed ends with the same bits as one that never stopped
# (cosine schedule with warmup, dropout, momentum); --resume auto, --resume
# FILE, restarts by the launcher (TORCHELASTIC_RESTART_COUNT), fallback past a
# corrupt newest checkpoint, pruning, and refusals of mismatched checkpoints.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] || skip_all "train not built"

args="--data synthetic --train-samples 1000 --test-samples 200 --batch-size 32 --model mlp
      --hidden 64 --dropout 0.1 --steps 60 --schedule cosine --warmup 5 --nesterov
      --weight-decay 1e-4 --log-every 1000"
hash_of() { sed -n 's/.*done:.*param hash \([0-9a-f]*\).*/\1/p' "$1"; }

"$TRAIN" $args >"$T/straight" 2>&1
is $? 0 "uninterrupted run"
want=$(hash_of "$T/straight")

ck=$T/ck
"$TRAIN" $args --checkpoint-dir "$ck" --checkpoint-every 10 --keep-checkpoints 0 >"$T/full" 2>&1
is $? 0 "run with a checkpoint every 10 steps"
is "$(hash_of "$T/full")" "$want" "checkpointing does not change the result"
is "$(ls "$ck" | grep -c '\.mgc$')" 6 "six checkpoints (steps 10..60) with --keep-checkpoints 0"
ok test -f "$ck/ckpt-000000000030.done"

# as if the run had been killed after step 30: later checkpoints never happened
for s in 40 50 60; do rm -f "$ck/ckpt-0000000000$s.mgc" "$ck/ckpt-0000000000$s.done"; done
"$TRAIN" $args --checkpoint-dir "$ck" --checkpoint-every 10 --resume auto >"$T/resumed" 2>&1
is $? 0 "resume auto"
like "$(cat "$T/resumed")" "resumed from $ck/ckpt-000000000030.mgc \(step 30, epoch 1\)" \
    "says where it resumed"
is "$(hash_of "$T/resumed")" "$want" "stopped at 30 + resumed == uninterrupted, bit for bit"
is "$(ls "$ck" | grep -c '\.mgc$')" 3 "--keep-checkpoints 3 (default) pruned the older ones"

# the launcher's restart: TORCHELASTIC_RESTART_COUNT > 0 resumes without --resume
rm -f "$ck"/ckpt-000000000060.* "$ck"/ckpt-000000000050.*
TORCHELASTIC_RESTART_COUNT=1 "$TRAIN" $args --checkpoint-dir "$ck" --checkpoint-every 10 \
    >"$T/restart" 2>&1
like "$(cat "$T/restart")" "resumed from .*ckpt-000000000040.mgc" "a restarted worker resumes"
is "$(hash_of "$T/restart")" "$want" "and finishes with the same bits"

# a corrupt newest checkpoint: warning, fall back to the previous one
rm -f "$ck"/ckpt-000000000060.*
f=$ck/ckpt-000000000050.mgc
size=$(stat -c %s "$f")
printf 'XXXX' | dd of="$f" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
"$TRAIN" $args --checkpoint-dir "$ck" --resume auto >"$T/fallback" 2>"$T/fallback.err"
is $? 0 "resume past a corrupt checkpoint"
like "$(cat "$T/fallback.err")" "warning: skipping a corrupt checkpoint: '$f': payload checksum mismatch" \
    "warns about the corrupt one"
like "$(cat "$T/fallback")" "resumed from .*ckpt-000000000040.mgc" "falls back to step 40"
is "$(hash_of "$T/fallback")" "$want" "still bit-identical"

# --resume FILE
"$TRAIN" $args --resume "$ck/ckpt-000000000040.mgc" >"$T/file" 2>&1
is "$(hash_of "$T/file")" "$want" "--resume FILE"
# --resume auto on an empty directory starts fresh
"$TRAIN" $args --checkpoint-dir "$T/empty" --resume auto >"$T/fresh" 2>&1
like "$(cat "$T/fresh")" "no checkpoint in '$T/empty' yet: starting from step 0" "nothing to resume"
is "$(hash_of "$T/fresh")" "$want" "fresh start gives the same result"
ok test -f "$T/empty/ckpt-000000000060.done"
"$TRAIN" $args --checkpoint-dir "$T/empty" --resume auto >"$T/done" 2>&1
like "$(cat "$T/done")" "resumed from .*ckpt-000000000060.mgc \(step 60" "resuming a finished run"
is "$(hash_of "$T/done")" "$want" "evaluates the finished weights without training further"
# --resume DIR with nothing in it is an error
mkdir "$T/none"
"$TRAIN" $args --resume "$T/none" >/dev/null 2>"$T/err"
is $? 1 "--resume DIR without checkpoints fails"
like "$(cat "$T/err")" "no complete checkpoint in" "and says why"

# mismatches
"$TRAIN" $(echo $args | sed 's/--hidden 64/--hidden 32/') --resume "$ck/ckpt-000000000040.mgc" \
    >/dev/null 2>"$T/err"
is $? 2 "another hidden size is refused (exit 2: do not retry)"
like "$(cat "$T/err")" "^train: cannot resume: .*model shape mismatch: tensor 0 is 0.weight \[64, 784\] in the checkpoint, 0.weight \[32, 784\] in the model" \
    "with a clear message"
"$TRAIN" $args --batch-size 16 --resume "$ck/ckpt-000000000040.mgc" >/dev/null 2>"$T/err"
like "$(cat "$T/err")" "written with batch size 32, this run has batch size 16" "another batch size"
printf 'not a checkpoint' >"$T/junk.mgc"
"$TRAIN" $args --resume "$T/junk.mgc" >/dev/null 2>"$T/err"
like "$(cat "$T/err")" "not an mg checkpoint \(bad magic\)" "a file that is not a checkpoint"
done_testing
