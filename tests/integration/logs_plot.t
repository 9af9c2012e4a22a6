#!/bin/sh
# mglaunch logs --plot: the SVG of a run's metrics, from the files train's
# rank 0 left in each attempt directory. A run of two invocations (the second
# resumed from an older checkpoint) gives one chart of both attempts: the SVG
# parses (xmllint, Python's xml.etree), each curve has one point per record of
# its attempt's file, the restart is drawn; --attempt narrows it, - writes to
# stdout, and a run without metrics (not train, or another node's) says so.
# timeout: 90
. "$(dirname "$0")/../lib/lib.sh"
PY=/usr/bin/python3
command -v xmllint >/dev/null || skip_all "xmllint is not installed (scripts/deps.sh)"
L=$T/logs
CK=$T/ck
DATA="--data synthetic --train-samples 512 --test-samples 128 --model mlp --hidden 32"
run() { # ID NPROC ARGS...
    _id=$1 _n=$2
    shift 2
    "$MGLAUNCH" --nproc_per_node "$_n" --rdzv_id "$_id" --log_dir "$L" "$@"
}
run job 2 "$TRAIN" $DATA --steps 30 --log-every 2 --eval-every 10 --checkpoint-every 10 \
    --checkpoint-dir "$CK" >"$T/a.out" 2>&1 || bail "first invocation ($(tail -n 3 "$T/a.out"))"
rm -f "$CK/ckpt-000000000030.done" "$CK/ckpt-000000000030.mgc"
run job 2 "$TRAIN" $DATA --steps 40 --log-every 2 --eval-every 10 --checkpoint-every 10 \
    --checkpoint-dir "$CK" >"$T/b.out" 2>&1 || bail "second invocation ($(tail -n 3 "$T/b.out"))"

out=$("$MGLAUNCH" logs "$L" --plot "$T/job.svg" 2>&1)
is "$?" 0 "mglaunch logs --plot"
n0=$(grep -c '"type":"train"' "$L/job/attempt_0/metrics.jsonl")
n1=$(grep -c '"type":"train"' "$L/job/attempt_1/metrics.jsonl")
e0=$(grep -c '"type":"eval"' "$L/job/attempt_0/metrics.jsonl")
e1=$(grep -c '"type":"eval"' "$L/job/attempt_1/metrics.jsonl")
is "$out" "$T/job.svg: run job, $((n0 + n1 + e0 + e1)) records from 2 attempts" \
    "it says what it drew ($n0 + $n1 train and $e0 + $e1 eval records)"
ok xmllint --noout "$T/job.svg"
cat >"$T/count.py" <<'EOF'
import sys
import xml.etree.ElementTree as ET
NS = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
for g in root.iter(NS + "g"):
    if g.get("class") == "curve":
        pts = sum(len(p.get("points").split()) for p in g.iter(NS + "polyline"))
        print(g.get("data-metric"), g.get("data-series"), g.get("data-attempt"), pts)
print("restarts", sum(1 for e in root.iter() if e.get("class") == "restart-label"))
print("title", root.find(NS + "title").text)
EOF
counts=$($PY "$T/count.py" "$T/job.svg" 2>&1)
like "$counts" "loss train 0 $n0" "attempt 0's loss curve: a point per train record ($n0)"
like "$counts" "accuracy train 0 $n0" "attempt 0's accuracy curve too"
like "$counts" "loss train 1 $n1" "attempt 1's loss curve: a point per train record ($n1)"
like "$counts" "loss eval 0 $e0" "attempt 0's eval curve: a point per eval record ($e0)"
like "$counts" "loss eval 1 $e1" "attempt 1's eval curve ($e1)"
like "$counts" "restarts 1" "the restart is drawn and labelled"
like "$counts" "title run job - " "titled with the run"

out=$("$MGLAUNCH" logs "$L" --run job --attempt 1 --plot - 2>&1)
like "$out" '^<\?xml' "--plot - writes the SVG to stdout"
counts=$(printf '%s\n' "$out" >"$T/one.svg" && $PY "$T/count.py" "$T/one.svg" 2>&1)
unlike "$counts" "train 0 " "--attempt 1: attempt 0 is left out"
like "$counts" "loss train 1 $n1" "and attempt 1 is drawn"

run other 1 true >/dev/null 2>&1
out=$("$MGLAUNCH" logs "$L" --run other --plot "$T/none.svg" 2>&1)
is "$?" 1 "a run without metrics: exit 1"
like "$out" "run 'other' has no metrics in .*: train's rank 0 writes attempt_<n>/metrics.jsonl there on the node it runs on" \
    "and it says where they would be"
ok test ! -e "$T/none.svg"
out=$("$MGLAUNCH" logs "$L" --run job --attempt 7 --plot "$T/x.svg" 2>&1)
like "$out" "no attempt 7 in run 'job'" "an attempt that does not exist"
out=$("$MGLAUNCH" logs "$L" --plot "$T/x.svg" --rank 0 2>&1)
is "$?" 2 "--plot with a content selector is a usage error"
done_testing
