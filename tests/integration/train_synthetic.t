#!/bin/sh
# train end to end on the synthetic dataset: it learns, prints plain progress
# lines without a terminal and a bar with one, ends with a summary, writes
# metrics as JSON lines, and repeats bit for bit with the same seed.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] || skip_all "train not built"
PY=/usr/bin/python3

common="--data synthetic --train-samples 2048 --test-samples 512 --batch-size 32"
"$TRAIN" $common --model mlp --epochs 2 --log-every 16 --metrics "$T/m.jsonl" >"$T/out" 2>"$T/err"
is $? 0 "mlp trains on synthetic data"
out=$(cat "$T/out")
like "$out" "model mlp \(203530 parameters\)" "start line names the model and its size"
like "$out" "batch 32 per process x 1 process x 1 accum = 32, 128 steps \(2 epochs\)" \
    "start line gives batch, steps, epochs"
like "$out" "step 16/128 epoch 1 loss [0-9.]+ accuracy [0-9.]+ lr 0.05 [0-9]+ samples/s" \
    "plain progress lines"
like "$out" "eval step 64 epoch 1: test loss" "evaluation after epoch 1"
like "$out" "train: done: test accuracy" "summary line"
unlike "$out" "$(printf '\r')" "no carriage returns without a terminal"
is "$(cat "$T/err")" "" "nothing on stderr"
acc=$(sed -n 's/.*done: test accuracy \([0-9.]*\).*/\1/p' "$T/out")
ok $PY -c "import sys; sys.exit(0 if float('$acc') > 0.9 else 1)"
diag "synthetic test accuracy $acc"
hash1=$(sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p' "$T/out")

# metrics: JSON lines with the documented fields
ok $PY - "$T/m.jsonl" <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
kinds = [r["type"] for r in recs]
assert kinds.count("train") == 8, kinds
assert kinds.count("eval") == 2 and kinds[-1] == "summary", kinds
t = [r for r in recs if r["type"] == "train"][0]
for k in ("step", "epoch", "loss", "accuracy", "lr", "samples_per_s", "time_s"):
    assert k in t, k
e = [r for r in recs if r["type"] == "eval"][-1]
assert 0.9 < e["test_accuracy"] <= 1 and e["test_samples"] == 512, e
s = recs[-1]
assert s["step"] == 128 and s["test_accuracy"] == e["test_accuracy"] and len(s["param_hash"]) == 16
PYEOF

"$TRAIN" $common --model mlp --epochs 2 --log-every 16 >"$T/out2" 2>&1
hash2=$(sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p' "$T/out2")
is "$hash2" "$hash1" "same seed, same final weights (bit for bit)"
"$TRAIN" $common --model mlp --epochs 2 --seed 1 >"$T/out3" 2>&1
hash3=$(sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p' "$T/out3")
ok test -n "$hash3" -a "$hash3" != "$hash1"
diag "seed 1 gives a different hash ($hash3)"

"$TRAIN" $common --model cnn --steps 20 --optimizer adamw --schedule cosine --warmup 5 \
    --accum-steps 2 >"$T/cnn" 2>&1
is $? 0 "cnn with adamw, cosine schedule, warmup and accumulation runs"
like "$(cat "$T/cnn")" "adamw lr 0.001, schedule cosine, batch 32 per process x 1 process x 2 accum = 64" \
    "start line shows the optimizer and effective batch"

"$TRAIN" $common --model mlp --hidden 64,32 --dropout 0.2 --steps 10 --eval-every 5 >"$T/hid" 2>&1
is $? 0 "mlp with two hidden layers and dropout"
like "$(cat "$T/hid")" "model mlp \(52650 parameters\)" "784-64-32-10 has 52,650 parameters"
is "$(grep -c '^eval step' "$T/hid")" 2 "--eval-every 5 evaluates at steps 5 and 10"

# on a terminal: a progress bar redrawn in place
if command -v script >/dev/null; then
    script -qec "$TRAIN $common --model mlp --steps 30" /dev/null >"$T/tty" 2>&1
    like "$(cat "$T/tty")" "$(printf '\r').*epoch 1/1 \[#+-*\] +[0-9]+% step [0-9]+/30" \
        "a progress bar on a terminal"
    like "$(cat "$T/tty")" "train: done" "summary on a terminal"
fi
done_testing
