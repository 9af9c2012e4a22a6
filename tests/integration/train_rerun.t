#!/bin/sh
# A job, not an invocation, owns its checkpoints (docs/train.md, "Checkpoints
# belong to a job"), end to end with the real data: the README's mglaunch
# command with a --checkpoint-dir, interrupted (SIGTERM) after a checkpoint and
# run again identically (a new run id), goes on where it stopped and ends with
# the bits of a run that never stopped, its done line telling its own figures
# from the job's, and the plot and the dashboard draw the first run's records
# before the rerun's; another job into that directory is refused once, by rank
# 0, and the root cause quotes that line once; the command make demo prints,
# run again after an interruption, resumes; under
# torchrun --standalone (a new run id each time too) the same command run
# again continues.
# timeout: 240
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] && [ -x "$MGLAUNCH" ] || skip_all "train or mglaunch not built"
[ -r /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] ||
    skip_all "dataset-fashion-mnist not installed"

ARGS="--model cnn --data fashion-mnist --train-samples 1024 --test-samples 200 --batch-size 32
      --epochs 12 --log-every 4 --checkpoint-every 8"
hash_of() { sed -n 's/.*done:.*param hash \([0-9a-f]*\).*/\1/p' "$1" | tail -n 1; }

"$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/logs" "$TRAIN" $ARGS \
    --checkpoint-dir "$T/straight" >"$T/straight.out" 2>&1
is $? 0 "the job, never stopped"
want=$(hash_of "$T/straight.out")

ck=$T/ck
cmd() {
    "$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/logs" "$TRAIN" $ARGS --checkpoint-dir "$ck" "$@"
}
# mglaunch itself in the background (not cmd's subshell), for the signal
"$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/logs" "$TRAIN" $ARGS --checkpoint-dir "$ck" \
    >"$T/a.out" 2>&1 &
lp=$!
at_cleanup "kill -KILL $lp 2>/dev/null"
wait_for 60 test -f "$ck/ckpt-000000000016.done"
kill -TERM "$lp"
wait "$lp"
rc=$?
is "$rc" 143 "interrupted (SIGTERM, as a preemption) after the checkpoint of step 16"
DESC="before the end" ok test ! -f "$ck/ckpt-000000000192.done"
newest=$(ls "$ck" | sed -n 's/^ckpt-0*\([0-9]*\)\.done$/\1/p' | sort -n | tail -n 1)
diag "newest complete checkpoint: step $newest"

cmd >"$T/b.out" 2>&1
is $? 0 "the identical command again"
like "$(cat "$T/b.out")" "continuing this job's checkpoints in '$ck', from run '[0-9]{8}-[0-9]{6}-[0-9a-f]{6}' \(newest: step $newest\)" \
    "continues the first invocation's checkpoints, saying whose"
like "$(cat "$T/b.out")" "resumed from $ck/ckpt-0*$newest.mgc \(step $newest," "from the newest"
unlike "$(cat "$T/b.out")" "Pass --resume auto|took '$ck' over" "without being told to"
is "$(hash_of "$T/b.out")" "$want" "and ends with the bits of the job that never stopped"
left=$((192 - newest))
like "$(cat "$T/b.out")" "done: .*; $left steps since the resume at step $newest, $((left * 64)) samples in [0-9.]+ s \([0-9]+ samples/s\), wall time [0-9.]+ s; 192 steps in all; param hash" \
    "the done line tells this start's steps and samples from the job's total"
like "$(cat "$T/straight.out")" "done: .*; 192 steps, 12288 samples in " "and without a resume, the plain totals"
like "$(sed -n 2p "$ck/ckpt-owner")" "^run [0-9a-f]{16} " "the owner record names the latest run"
is "$(grep -c '^adopted ' "$ck/ckpt-owner")" 1 "with the first one's checkpoints adopted"

# the plot and the dashboard show the whole job: the first run's records first
aid=$(sed -n "s/.*continuing this job's checkpoints in '[^']*', from run '\([^']*\)'.*/\1/p" "$T/b.out")
bid=$(sed -n 2p "$ck/ckpt-owner" | cut -d' ' -f3)
like "$(grep '"type":"start"' "$T/logs/$bid/attempt_0/metrics.jsonl")" "\"step\":$newest,\"resumed_run\":\"$aid\"" \
    "the rerun's start record names the run it resumed"
out=$("$MGLAUNCH" logs "$T/logs" --run "$bid" --plot "$T/job.svg" 2>&1)
is $? 0 "mglaunch logs --plot of the rerun"
like "$out" "run $bid, [0-9]+ records from 1 attempt and 1 file of the job's earlier run \($aid\)" \
    "draws the earlier run's metrics too, and says so"
svg_check() { # what the SVG in $1 must show
    like "$(sed -n 's/.*<title>\([^<]*\) - loss.*/\1/p' "$1")" "^runs $aid, $bid \(one job" "$2: the title names both runs"
    like "$(tr "\n" " " <"$1")" ">run 1 attempt 0<.*>run 2 attempt 0<" "$2: the legend, the first run first"
    like "$(cat "$1")" "class=\"restart-label\"[^>]*>run 2 attempt 0 \(from step $newest\)<" \
        "$2: the rerun is drawn as resuming at step $newest"
    like "$(cat "$1")" "data-metric=\"loss\" data-series=\"train\" data-attempt=\"0\" data-records=\"[1-9]" \
        "$2: the first run's train loss is there"
    like "$(cat "$1")" "data-metric=\"loss\" data-series=\"train\" data-attempt=\"1000000\" data-records=\"[1-9]" \
        "$2: and the rerun's after it"
}
svg_check "$T/job.svg" "plot"
if [ -x "$MG_BUILD/bin/mglaunch-dashboard" ] && command -v curl >/dev/null; then
    bg "$MGLAUNCH" dashboard "$T/logs" --port 0 >"$T/dash.out" 2>&1
    wait_for 10 grep -q ' at http' "$T/dash.out" || bail "the dashboard starts ($(cat "$T/dash.out"))"
    url=$(sed -n 's/^mglaunch dashboard: serving .* at \(http:[^ ]*\)$/\1/p' "$T/dash.out")
    curl -s -o "$T/dash.svg" "${url}api/plot.svg?run=$bid"
    svg_check "$T/dash.svg" "dashboard"
else
    diag "mglaunch-dashboard or curl missing: the dashboard part is skipped"
fi

# another job (another lr): refused once, by rank 0
before=$(cd "$ck" && ls | sort | md5sum)
cmd --lr 0.05 >"$T/c.out" 2>&1
is $? 2 "another job into the same directory: exit 2 (do not retry)"
like "$(cat "$T/c.out")" "^train: '$ck' holds the checkpoints of another job, run '[^']*' \(newest: step 192\): written with lr 0.02 \(this run: 0.05\). To continue that job, run it with its settings; to start this one, use another --checkpoint-dir" \
    "saying whose they are, what differs and what to do"
is "$(grep -c 'holds the checkpoints of another job' "$T/c.out")" 2 \
    "twice in all: rank 0's line and the root cause's message"
like "$(grep -A3 '^Root cause' "$T/c.out")" "rank      : 0 \(local rank 0\)" "the root cause is rank 0"
unlike "$(cat "$T/c.out")" "rank 1: |traceback :" "no other rank's copy, no traceback repeating it"
is "$(cd "$ck" && ls | sort | md5sum)" "$before" "the directory is left as it was"

# the README's demo (make demo): interrupted after a checkpoint, the command it
# printed, run again, goes on from there
TOP=$(cd "$(dirname "$0")/../.." && pwd)
MG_DEMO_LOG_DIR=$T/demo MG_DEMO_ARGS="--train-samples 1024 --test-samples 200 --epochs 12
    --checkpoint-every 8" "$TOP/scripts/demo.sh" >"$T/demo1.out" 2>&1 &
dp=$!
at_cleanup "kill -KILL $dp 2>/dev/null"
wait_for 60 sh -c "ls '$T'/demo/*/checkpoints/ckpt-000000000016.done" >/dev/null 2>&1
mp=$(pgrep -P "$dp" -x mglaunch)
[ -n "$mp" ] && kill -TERM "$mp"
wait "$dp"
is $? 143 "make demo's job, interrupted (SIGTERM) after a checkpoint"
demo_cmd=$(sed -n 's/^== mglaunch //p' "$T/demo1.out" | head -n 1)
eval "\"\$MGLAUNCH\" $demo_cmd" >"$T/demo2.out" 2>&1
is $? 0 "the mglaunch command the demo printed, run again"
like "$(cat "$T/demo2.out")" "resumed from $T/demo/demo-[0-9-]+/checkpoints/ckpt-0*[1-9][0-9]*\.mgc" \
    "goes on from the demo's checkpoint"
like "$(cat "$T/demo2.out")" "done: .* since the resume at step [1-9][0-9]*, .*; 96 steps in all" "to the end"

# torchrun --standalone gives each invocation a new run id as well
if /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null; then
    torchrun() { /usr/bin/python3 -m torch.distributed.run --monitor_interval 0.1 -r 1 -t 1 "$@"; }
    tck=$T/tck
    targs="--data synthetic --train-samples 512 --test-samples 128 --model mlp --hidden 32
           --batch-size 32 --checkpoint-every 10 --checkpoint-dir $tck"
    torchrun --standalone --nnodes 1 --nproc_per_node 2 --no_python "$TRAIN" $targs --steps 20 \
        >"$T/t1.out" 2>&1
    is $? 0 "torchrun: the job to step 20"
    torchrun --standalone --nnodes 1 --nproc_per_node 2 --no_python "$TRAIN" $targs --steps 30 \
        >"$T/t2.out" 2>&1
    is $? 0 "torchrun: the same command again (a new run id), longer"
    like "$(cat "$T/t2.out")" "resumed from $tck/ckpt-000000000020.mgc \(step 20" \
        "continues where it stopped"
else
    diag "python3-torch not installed: the torchrun part is skipped"
fi
done_testing
