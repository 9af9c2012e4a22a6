#!/bin/sh
# Resharding through mglaunch and train: a checkpoint written by 3 processes
# resumed by 2 (and then by 3 again) starts from the checkpoint's parameters
# and step, goes on from the same place in the epoch, warns about what changed
# (world size, effective batch, lr) and finishes with a sane loss; --epochs is
# counted from the checkpoint's place; a group of the same job (same
# TORCHELASTIC_RUN_ID) resumes without --resume, another job's is refused;
# --global-batch-size keeps the effective batch; a changed batch per process
# is refused. Which samples a resharded pass takes is tested exactly in
# test_data (sampler) and test_checkpoint (trainer).
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] && [ -x "$MGLAUNCH" ] || skip_all "train or mglaunch not built"

CK=$T/ck
# 1200 samples: 400 per process with 3 (13 batches of 32), 600 with 2 (19)
ARGS="--data synthetic --train-samples 1200 --test-samples 300 --model mlp --hidden 64
      --dropout 0.1 --log-every 1 --seed 4 --checkpoint-dir $CK"
# launch NAME NPROC RUN_ID ARGS...: output in $T/NAME.out, metrics in $T/NAME.jsonl
launch() {
    _name=$1 _n=$2 _id=$3
    shift 3
    "$MGLAUNCH" --nproc_per_node "$_n" --rdzv_id "$_id" --log_dir "$T/logs" "$TRAIN" $ARGS \
        --metrics "$T/$_name.jsonl" "$@" >"$T/$_name.out" 2>&1
}
done_hash() { sed -n 's/.*done:.*param hash \([0-9a-f]*\).*/\1/p' "$T/$1.out"; }
resume_hash() { sed -n 's/.*resumed from .*param hash \([0-9a-f]*\).*/\1/p' "$T/$1.out"; }
# loss of the first / last train record of a metrics file
loss() { sed -n 's/.*"type":"train",.*"loss":\([0-9.e+-]*\),.*/\1/p' "$T/$1.jsonl" | sed -n "$2"; }

# 3 processes stop at step 20: 7 batches into the second epoch (positions 0..671)
launch a 3 job1 --batch-size 32 --steps 20
is $? 0 "3 processes, 20 steps, checkpointed"
ok test -f "$CK/ckpt-000000000020.done"
hash_a=$(done_hash a)

# 2 processes of the same job: resumed without --resume (a re-formed group
# gets TORCHELASTIC_RESTART_COUNT=0), resharded 3 -> 2
launch b 2 job1 --batch-size 32 --epochs 2
is $? 0 "2 processes of the same job resume and finish"
like "$(cat "$T/b.out")" "train: resumed from $CK/ckpt-000000000020.mgc \(step 20, epoch 2\)" \
    "resumed from step 20 without --resume (same TORCHELASTIC_RUN_ID)"
is "$(resume_hash b)" "$hash_a" "with the parameters the 3 processes ended with"
like "$(cat "$T/b.out")" "warning: resharding a checkpoint of 3 processes: world size 3 -> 2, effective batch 96 -> 64 \(32 per process x 2 x 1 accum\), lr 0.05 -> 0.05; epoch 2 goes on from sample 672 of 1200 in its order: the 528 not yet taken are shared by 2 processes, 264 each" \
    "warns: world size, effective batch, lr, and where the epoch goes on"
like "$(cat "$T/b.out")" "warning: --batch-size is per process, so the effective batch follows the world size; --global-batch-size 96 keeps it" \
    "and how to keep the effective batch"
like "$(cat "$T/b.out")" "train: 2 epochs now end at step 29" "--epochs 2 counted from the checkpoint: 20 + 9 steps"
like "$(cat "$T/b.out")" "done: .*; 9 steps since the resume at step 20, .*; 29 steps in all;" "the run ends there"
first=$(loss b 1p)
last_a=$(loss a '$p')
start_a=$(loss a 1p)
diag "losses: 3 processes start at $start_a, end at $last_a; 2 processes resume at $first"
DESC="the first loss after resuming continues the trajectory (<= 2 x $last_a, far below $start_a)" \
    ok awk -v f="$first" -v l="$last_a" -v s="$start_a" 'BEGIN { exit !(f <= 2 * l && f < s / 4) }'
like "$(cat "$T/b.out")" "done: test accuracy 0\.9[0-9]*|done: test accuracy 1\.0000" "ends with a sane test accuracy"
unlike "$(cat "$T/b.out")" "no checkpoint|starting from step 0" "it did not start over"

# back to 3 processes after a complete epoch: the next one begins
launch c 3 job1 --batch-size 32 --epochs 3 --resume auto
is $? 0 "3 processes resume the 2 processes' checkpoint"
is "$(resume_hash c)" "$(done_hash b)" "from the parameters the 2 processes ended with"
like "$(cat "$T/c.out")" "world size 2 -> 3, effective batch 64 -> 96 .*; epoch 3 begins" "2 -> 3 after the epoch ended"
like "$(cat "$T/c.out")" "train: 3 epochs now end at step 42" "29 + 13 steps"

# the same job under another run id at another world size continues these
# checkpoints, resharded; another job (another lr) neither picks them up nor
# writes among them: it is refused, saying whose they are and what differs
cp -r "$CK" "$T/ck2"
"$MGLAUNCH" --nproc_per_node 2 --rdzv_id job2 --log_dir "$T/logs" "$TRAIN" $ARGS \
    --checkpoint-dir "$T/ck2" --batch-size 32 --epochs 4 >"$T/d2.out" 2>&1
is $? 0 "the same job under another run id and world size continues"
like "$(cat "$T/d2.out")" "continuing this job's checkpoints in '$T/ck2', from run 'job1' \(newest: step 42\)" \
    "saying whose checkpoints"
like "$(cat "$T/d2.out")" "world size 3 -> 2" "resharded"
rm -rf "$T/ck2"
cp -r "$CK" "$T/ck2"
before=$(cd "$T/ck2" && ls | sort | tr '\n' ' ')
"$MGLAUNCH" --nproc_per_node 2 --rdzv_id job2 --log_dir "$T/logs" "$TRAIN" $ARGS \
    --checkpoint-dir "$T/ck2" --batch-size 32 --steps 3 --lr 0.01 >"$T/d.out" 2>&1
is $? 2 "another job in the same directory is refused"
like "$(cat "$T/d.out")" "'$T/ck2' holds the checkpoints of another job, run 'job1' \(newest: step 42\): written with lr 0.05 \(this run: 0.01\)" \
    "naming the run that owns it and what differs"
is "$(grep -c "holds the checkpoints" "$T/d.out")" 2 "said once by rank 0, quoted once by the root cause"
is "$(cd "$T/ck2" && ls | sort | tr '\n' ' ')" "$before" "and leaves the directory as it was"

# a changed batch per process is refused; --global-batch-size keeps the effective batch
launch e 2 job1 --batch-size 16 --epochs 4 --resume auto
ok test $? -ne 0
like "$(cat "$T/e.out")" "cannot resume: .*written with batch size 32 per process x 3 processes, this run has batch size 16 per process: pass --batch-size 32 .* or --global-batch-size 96" \
    "another batch per process with another world size: a clear error"
launch f 2 job1 --global-batch-size 96 --epochs 4 --resume auto
is $? 0 "--global-batch-size 96: 48 per process"
like "$(cat "$T/f.out")" "world size 3 -> 2, effective batch 96 -> 96 \(48 per process x 2 x 1 accum\)" \
    "the effective batch stays"
unlike "$(cat "$T/f.out")" "effective batch follows" "and there is nothing to warn about it"
done_testing
