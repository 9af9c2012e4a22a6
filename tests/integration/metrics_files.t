#!/bin/sh
# The JSON lines and CSV files of libmg's metrics, read by Python's own json,
# csv and yaml modules over a run with a restart that resumed from step 50
# after the first attempt had reached step 100: every record carries its wall
# time and identity, the replayed steps are marked in both formats, the CSV
# follows Lightning's layout (version_N, sorted header with step,
# hparams.yaml). A metrics file on a full disk: one message, exit status 3.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
W=$HELPERS/metrics_write
[ -x "$W" ] || bail "metrics_write helper is built ($W)"
PY=/usr/bin/python3
$PY -c 'import yaml' 2>/dev/null || skip_all "python3-yaml is not installed (scripts/deps.sh)"

before=$(date +%s)
"$W" --jsonl "$T/m.jsonl" --csv "$T/csv" --run-id job --to 100 --every 10 --eval-every 50 &&
    "$W" --jsonl "$T/m.jsonl" --csv "$T/csv" --run-id job --restart 1 --from 50 --to 150 \
        --every 10 --eval-every 50
is "$?" 0 "two attempts wrote their metrics"
after=$(($(date +%s) + 1))

# JSON lines: what each record holds, and which are replays.
out=$($PY - "$T/m.jsonl" "$before" "$after" <<'EOF' 2>&1
import json, sys
path, lo, hi = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
recs = [json.loads(l) for l in open(path)]
for r in recs:
    assert lo <= r["wall_time"] <= hi, r
    assert r["run_id"] == "job" and r["rank"] == 0 and r["restart"] in (0, 1), r
a0 = [r for r in recs if r["restart"] == 0]
a1 = [r for r in recs if r["restart"] == 1]
print("types0", " ".join(r["type"] for r in a0[:4]), len(a0))
print("types1", " ".join(r["type"] for r in a1[:4]), len(a1))
start1 = a1[0]
print("start1", start1["step"], start1["prior_step"])
train1 = [r for r in a1 if r["type"] == "train"]
print("replayed", " ".join(str(r["step"]) for r in train1 if r.get("replay")))
print("new", " ".join(str(r["step"]) for r in train1 if not r.get("replay")))
print("none0", sum(1 for r in a0 if "replay" in r))
print("fields", ",".join(k for k in train1[0]))
t = [r for r in a0 if r["type"] == "train"][0]
print("values", t["loss"], t["accuracy"], t["lr"], t["samples_per_s"], t["time_s"])
EOF
)
like "$out" "types0 start hparams train train 15" \
    "attempt 0: start, hparams, 10 train, 2 eval and the summary"
like "$out" "types1 start hparams train train 15" "attempt 1: start, hparams, 10 train, 2 eval, summary"
like "$out" "start1 50 100" "attempt 1's start record: resumed from 50, the run had reached 100"
like "$out" "replayed 60 70 80 90 100
" "attempt 1's train records at steps 60..100 are marked replays"
like "$out" "new 110 120 130 140 150
" "steps past 100 are not"
like "$out" "none0 0" "attempt 0 has no replay marks"
like "$out" "fields type,step,epoch,loss,accuracy,lr,samples_per_s,time_s,wall_time,run_id,restart,rank,replay
" "train's fields: today's, then wall_time, run_id, restart, rank (and replay)"
like "$out" "values 2.090909 0.163636 0.05 5000 0.1" "values rounded to their digits"

# CSV: Lightning's layout, read by Python's csv module.
out=$($PY - "$T/csv" <<'EOF' 2>&1
import csv, os, sys, yaml
root = sys.argv[1]
print("dirs", " ".join(sorted(os.listdir(root))))
for v in ("version_0", "version_1"):
    d = os.path.join(root, v)
    print(v, " ".join(sorted(os.listdir(d))))
    rows = list(csv.DictReader(open(os.path.join(d, "metrics.csv"), newline="")))
    header = list(rows[0].keys())
    print(v, "sorted", header == sorted(header), "step" in header, len(rows))
    print(v, "replay", " ".join(r["step"] for r in rows if r.get("replay") == "1"))
    print(v, "summary", [r["summary/param_hash"] for r in rows if r["summary/param_hash"]])
    print(v, "hparams", yaml.safe_load(open(os.path.join(d, "hparams.yaml"))))
first = next(csv.DictReader(open(os.path.join(root, "version_0", "metrics.csv"), newline="")))
print("first", first["step"], first["epoch"], first["train/loss"], first["eval/test_loss"] == "")
EOF
)
like "$out" "dirs version_0 version_1" "one version directory per attempt"
like "$out" "version_0 hparams.yaml metrics.csv" "version_0 holds metrics.csv and hparams.yaml"
like "$out" "version_0 sorted True True 13" "version_0: sorted header with step, 13 rows"
like "$out" "version_1 sorted True True 13" "version_1: 13 rows"
like "$out" "^version_0 replay $" "version_0: no replays"
like "$out" "^version_1 replay 60 70 80 90 100 100$" "version_1: the rows of steps 60..100 (train, and eval at 100) have replay=1"
like "$out" "version_1 summary \['5c0d1a0e8e6b2f11'\]" "the summary's text column"
like "$out" "version_0 hparams \{'batch_size': 32, 'lr': 0.05, 'model': 'mlp'\}" \
    "hparams.yaml reads back as the settings, with their types"
like "$out" "first 10 1 2.090909 True" "the first row: step, epoch, loss; eval columns empty"

# A full disk: the program reports the first failure once and exits 3.
"$W" --jsonl /dev/full --to 50 >"$T/out" 2>"$T/err"
is "$?" 3 "metrics on /dev/full: exit status 3 (output incomplete)"
is "$(cat "$T/err")" \
    "metrics_write: metrics incomplete: cannot write metrics file '/dev/full': No space left on device" \
    "one line on stderr naming the file and the reason"
done_testing
