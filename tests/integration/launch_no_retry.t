#!/bin/sh
# The do-not-retry exit code class (docs/cli.md#exit-code): a worker that
# exits 2 (a usage or configuration error) is not restarted whatever
# --max_restarts allows, and the run exits 2; exit 1 is restarted as before.
# train exits 2 for a checkpoint that does not fit the run (another run's
# directory, other settings), so the whole chain is: no restart, exit 2. With
# several nodes, the job ends on every node with exit 2.
# timeout: 90
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
L=$T/logs

"$MGLAUNCH" --max_restarts 3 --nproc_per_node 2 --log_dir "$L" --rdzv_id two "$FW" 'if' rank=1 exit 2 \
    sleep 30 >"$T/out" 2>"$T/err"
is $? 2 "a worker exiting 2: the run exits 2"
like "$(cat "$T/err")" "not restarting: exit code 2 is the do-not-retry class" "  and says why"
is "$(grep -c '"event":"attempt_start"' "$L/two/events.jsonl")" 1 "  one attempt, no restart"

"$MGLAUNCH" --max_restarts 2 --nproc_per_node 1 --log_dir "$L" --rdzv_id one "$FW" exit 1 \
    >"$T/out" 2>"$T/err"
is $? 1 "a worker exiting 1: exit 1"
is "$(grep -c '"event":"attempt_start"' "$L/one/events.jsonl")" 3 "  after its 2 restarts"

# Across nodes (c10d on loopback): the job ends on every node with that root
# cause, rather than re-forming into the same error.
port=$(free_port)
bg "$MGLAUNCH" --nnodes 2 --nproc_per_node 1 --max_restarts 3 --rdzv_backend c10d \
    --rdzv_endpoint "127.0.0.1:$port" --rdzv_id mn --rdzv_conf is_host=1 --log_dir "$L" \
    "$FW" sleep 30 >"$T/a.out" 2>&1
pa=$!
sleep 0.3
"$MGLAUNCH" --nnodes 2 --nproc_per_node 1 --max_restarts 3 --rdzv_backend c10d \
    --rdzv_endpoint "127.0.0.1:$port" --rdzv_id mn --rdzv_conf is_host=0 --log_dir "$T/logs1" \
    "$FW" exit 2 >"$T/b.out" 2>&1
rcb=$?
wait "$pa"
rca=$?
is "$rca $rcb" "2 2" "two nodes, a worker exiting 2 on one: both exit 2, no restart"
like "$(cat "$T/a.out")" "the job failed: rank 1 \(local rank 0\) on .* exited with code 2" \
    "  the other node names the root cause"

[ -x "$TRAIN" ] || { done_testing; }
common="--data synthetic --train-samples 512 --test-samples 128 --model mlp --checkpoint-dir $T/ck"
"$TRAIN" $common --steps 10 >"$T/out" 2>&1
is $? 0 "train writes a checkpoint"
"$MGLAUNCH" --max_restarts 3 --nproc_per_node 1 --log_dir "$L" --rdzv_id other "$TRAIN" $common \
    --steps 20 --lr 0.3 >"$T/out" 2>"$T/err"
is $? 2 "another job's checkpoint directory: exit 2 through mglaunch"
like "$(cat "$T/err")" "holds the checkpoints of another job" "  train says why"
is "$(grep -c '"event":"attempt_start"' "$L/other/events.jsonl")" 1 "  not restarted"
"$TRAIN" $common --steps 20 --lr 0.3 --resume auto >"$T/out" 2>"$T/err"
is $? 2 "a checkpoint written with other settings: train exits 2"
like "$(cat "$T/err")" "does not fit this run: written with lr 0.05" "  naming the difference"

done_testing
