#!/bin/sh
# train's metrics through libmg's metrics module: on its own with --metrics,
# --tensorboard DIR and --csv DIR; under mglaunch, rank 0 alone writes
# <log_dir>/<run>/attempt_<n>/metrics.jsonl and, with the bare flags,
# tensorboard/ and csv/ beside the attempts; the straggler fields come from
# every rank; a second invocation that resumes from an older checkpoint marks
# the steps it trains again; a metrics file on a full disk is said once and
# the exit status is 3. TensorBoard files are read with crcmod and protoc,
# JSON lines and CSV with Python's json and csv modules.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
PY=/usr/bin/python3
$PY -c 'import crcmod' 2>/dev/null || skip_all "python3-crcmod is not installed (scripts/deps.sh)"
command -v protoc >/dev/null || skip_all "protoc is not installed (scripts/deps.sh)"
TFCHECK=$TOP/tests/lib/tfcheck.py
DATA="--data synthetic --train-samples 512 --test-samples 128 --model mlp --hidden 32"

# ---- on its own: the three sinks in the directories given ----
"$TRAIN" $DATA --steps 20 --log-every 5 --metrics "$T/m.jsonl" --tensorboard "$T/tb" \
    --csv "$T/csv" >"$T/out" 2>&1
is "$?" 0 "train with --metrics, --tensorboard DIR and --csv DIR"
out=$($PY - "$T/m.jsonl" <<'EOF' 2>&1
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
kinds = [r["type"] for r in recs]
assert kinds[:2] == ["hparams", "start"], kinds
assert kinds.count("train") == 4 and kinds[-1] == "summary", kinds
t = [r for r in recs if r["type"] == "train"][0]
keys = list(t)
want = ["type", "step", "epoch", "loss", "accuracy", "lr", "samples_per_s", "time_s", "step_time_s",
        "step_time_min_s", "step_time_max_s", "slowest_rank", "wall_time", "run_id", "restart", "rank"]
assert keys == want, keys
assert t["run_id"] is None and t["slowest_rank"] == 0 and t["step_time_min_s"] == t["step_time_max_s"], t
assert all("replay" not in r for r in recs)
print("ok")
EOF
)
is "$out" "ok" "JSON lines: hparams, start, then today's fields, the step time spread, wall time and identity"
tb=$(ls "$T/tb")
like "$tb" '^events\.out\.tfevents\.' "a TensorBoard file in --tensorboard DIR"
mkdir "$T/pb"
like "$($PY "$TFCHECK" "$T/tb/$tb" "$T/pb" 2>&1)" '^ok: [0-9]+ records$' "its CRCs are valid (crcmod)"
# every payload decoded, one line each
decode_all() {
    _k=0
    while [ -f "$T/pb/$_k.pb" ]; do
        protoc --decode_raw <"$T/pb/$_k.pb" 2>&1 | tr '\n' ' ' | tr -s ' '
        echo
        _k=$((_k + 1))
    done
}
decode_all >"$T/decoded"
for tag in train/loss train/accuracy train/lr train/samples_per_s train/step_time_s \
    train/step_time_max_s train/slowest_rank eval/test_accuracy; do
    is "$(grep -c "1: \"$tag\" 2: 0x" "$T/decoded")" "$(grep -c "\"$tag\"" "$T/decoded")" \
        "TensorBoard scalar $tag, a float in every event that has it (protoc --decode_raw)"
done
is "$(grep -c '1: "train/loss" 2: 0x' "$T/decoded")" 4 "train/loss at each of the 4 --log-every steps"
is "$(head -n 1 "$T/csv/version_0/metrics.csv" | tr ',' '\n' | grep -c '^train/step_time_max_s$')" 1 \
    "CSV in Lightning's layout has the straggler column"
ok test -s "$T/csv/version_0/hparams.yaml"

# ---- under mglaunch: files in the run's directory, from rank 0 only ----
L=$T/logs
CK=$T/ck
run() { # ID NPROC ARGS...
    _id=$1 _n=$2
    shift 2
    "$MGLAUNCH" --nproc_per_node "$_n" --rdzv_id "$_id" --log_dir "$L" "$TRAIN" $DATA "$@"
}
run job 2 --steps 30 --log-every 2 --checkpoint-every 10 --checkpoint-dir "$CK" --tensorboard \
    --csv >"$T/a.out" 2>&1
is "$?" 0 "2 processes under mglaunch with bare --tensorboard and --csv"
ok test -s "$L/job/attempt_0/metrics.jsonl"
is "$(cd "$L/job" && ls -d tensorboard/events.out.tfevents.* csv/version_0/metrics.csv | wc -l)" 2 \
    "tensorboard/ and csv/ beside the attempts, one file each (rank 0 only)"
is "$(find "$L" -name 'metrics*' | wc -l)" 2 "no other rank wrote metrics"
out=$($PY - "$L/job/attempt_0/metrics.jsonl" <<'EOF' 2>&1
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
tr = [r for r in recs if r["type"] == "train"]
assert len(tr) == 15 and all(r["run_id"] == "job" and r["rank"] == 0 for r in recs), recs
for r in tr:
    assert r["slowest_rank"] in (0, 1), r
    assert 0 < r["step_time_min_s"] <= r["step_time_s"] <= r["step_time_max_s"], r
assert all("replay" not in r for r in recs)
print("ok")
EOF
)
is "$out" "ok" "every train record has the spread of 2 ranks' step times and the slowest rank"

# ---- a second invocation resumes from step 20: steps 21..30 are replays ----
rm -f "$CK/ckpt-000000000030.done" "$CK/ckpt-000000000030.mgc"
run job 2 --steps 40 --log-every 2 --checkpoint-every 10 --checkpoint-dir "$CK" --tensorboard \
    >"$T/b.out" 2>&1
is "$?" 0 "the same run id again, its last checkpoint gone: resumes from step 20"
like "$(cat "$T/b.out")" "resumed from .*ckpt-000000000020.mgc" "from step 20"
ok test -s "$L/job/attempt_1/metrics.jsonl"
out=$($PY - "$L/job/attempt_1/metrics.jsonl" <<'EOF' 2>&1
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
st = [r for r in recs if r["type"] == "start"]
assert len(st) == 1 and st[0]["step"] == 20 and st[0]["prior_step"] == 30, st
tr = [r for r in recs if r["type"] == "train"]
assert [r["step"] for r in tr] == list(range(22, 41, 2)), tr
bad = [r["step"] for r in tr if bool(r.get("replay")) != (r["step"] <= 30)]
assert not bad, bad
print("ok")
EOF
)
is "$out" "ok" "attempt 1's start says step 20, prior step 30; records 22..30 carry replay, 32..40 do not"
g=$(ls -t "$L/job/tensorboard" | head -n 1)
rm -rf "$T/pb" && mkdir "$T/pb"
like "$($PY "$TFCHECK" "$L/job/tensorboard/$g" "$T/pb" 2>&1)" '^ok: ' "the second TensorBoard file reads whole"
decode_all >"$T/decoded"
is "$(grep -n ' 7 { 1: 1 }' "$T/decoded" | sed 's/0x[0-9a-f]*/0x/')" "3:1: 0x 2: 20 7 { 1: 1 } " \
    "its SessionLog START is at step 20 (after file_version and hparams): TensorBoard drops the first attempt's steps from 20"

# ---- a metrics file that cannot be written: said once, exit status 3 ----
"$TRAIN" $DATA --steps 10 --log-every 2 --metrics /dev/full >"$T/full.out" 2>"$T/full.err"
is "$?" 3 "--metrics /dev/full: trained to the end, exit status 3 (output incomplete)"
is "$(grep -c 'cannot write metrics file' "$T/full.err")" 1 "the error is said once"
like "$(cat "$T/full.err")" "train: cannot write metrics file '/dev/full': No space left on device" \
    "with the file and the reason"
like "$(cat "$T/full.out")" "train: done: " "the training itself went on to the end"
"$TRAIN" $DATA --steps 4 --tensorboard >/dev/null 2>"$T/bare.err"
is "$?" 2 "bare --tensorboard outside mglaunch is a usage error"
like "$(cat "$T/bare.err")" "outside it, give one: --tensorboard DIR" "which says how to give a directory"
done_testing
