#!/bin/sh
# Bounded checkpoint reads (docs/checkpoint-format.md): a crafted checkpoint
# (a 4 MB file with valid CRCs whose stream inflates to 4 GiB) and a header
# edit (a raw size of 60 GiB with the header CRC fixed) are rejected before
# anything big is allocated, and the resume falls back to the previous intact
# checkpoint instead of inflating gigabytes or stopping with "out of memory".
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] && [ -x "$HELPERS/ckpt_craft" ] || skip_all "train or ckpt_craft not built"

ARGS="--data synthetic --train-samples 512 --test-samples 128 --model mlp --hidden 32
      --batch-size 32 --checkpoint-every 10 --log-every 100 --keep-checkpoints 0"
ck=$T/ck
"$TRAIN" $ARGS --steps 20 --checkpoint-dir "$ck" >"$T/a.out" 2>&1
is $? 0 "a run with checkpoints at steps 10 and 20"

# step 30: inflates to 4 GiB more than step 20; step 40: a header that promises 60 GiB
"$HELPERS/ckpt_craft" inflate "$ck/ckpt-000000000020.mgc" "$ck/ckpt-000000000030.mgc" 4294967296
is $? 0 "crafted a checkpoint that inflates to 4 GiB"
size=$(stat -c %s "$ck/ckpt-000000000030.mgc")
diag "its size: $size bytes"
ok test "$size" -lt 8000000
"$HELPERS/ckpt_craft" header "$ck/ckpt-000000000020.mgc" "$ck/ckpt-000000000040.mgc" 64424509440
is $? 0 "crafted a header that promises 60 GiB"
for s in 30 40; do
    sed "s/step 20 /step $s /" "$ck/ckpt-000000000020.done" >"$ck/ckpt-0000000000$s.done"
done

"$HELPERS/maxrss" "$T/rss" "$TRAIN" $ARGS --steps 50 --checkpoint-dir "$ck" --resume auto \
    >"$T/b.out" 2>"$T/b.err"
is $? 0 "resume past both"
like "$(cat "$T/b.err")" "skipping a corrupt checkpoint: '$ck/ckpt-000000000040.mgc': bad compressed payload" \
    "the header edit is skipped as corrupt"
like "$(cat "$T/b.err")" "skipping a corrupt checkpoint: '$ck/ckpt-000000000030.mgc': the header says the payload inflates to 4295[0-9]* bytes, more than a checkpoint of this model holds" \
    "the 4 GiB one too, saying why"
unlike "$(cat "$T/b.err")" "out of memory" "no 'out of memory'"
like "$(cat "$T/b.out")" "resumed from $ck/ckpt-000000000020.mgc \(step 20" \
    "resumed from the previous intact checkpoint"
rss=$(cat "$T/rss")
diag "peak resident set: $rss KiB"
ok test "$rss" -lt 262144

# a checkpoint of a bigger model is still told apart from a crafted one
"$TRAIN" $ARGS --hidden 256 --steps 10 --checkpoint-dir "$T/wide" >/dev/null 2>&1
"$TRAIN" $ARGS --steps 10 --resume "$T/wide/ckpt-000000000010.mgc" >/dev/null 2>"$T/c.err"
is $? 2 "a checkpoint of another model shape (more than this model's bound) is refused (exit 2: do not retry)"
like "$(cat "$T/c.err")" "model shape mismatch: tensor 0 is 0.weight \[256, 784\] in the checkpoint, 0.weight \[32, 784\] in the model" \
    "as a shape mismatch, with the shapes"
done_testing
