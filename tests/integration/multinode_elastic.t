#!/bin/sh
# Elastic membership with mglaunch across test hosts (c10d): a node's agent
# SIGKILLed with --nnodes 2:3 while 6 workers train (the survivors re-form
# with 4 and train resumes the checkpoint or a survivor's snapshot, resharded), the same
# with 3:3 (they exit with a clear error), a node joining mid-run (scale-up),
# and a worker failure on one node restarting every node.
# timeout: 150
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] || skip_all "build/bin/train is not built"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"

hosts_up 3
c10d_endpoint
C="--nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint $EP"

# --nnodes 2:3, training: 3 nodes x 2 workers; once a checkpoint is complete
# the third node's agent is SIGKILLed; the survivors re-form with 2 x 2 workers
# and train resumes the 6 workers' checkpoint, resharded to 4, and finishes.
# No --resume: a group of the same job (TORCHELASTIC_RUN_ID) resumes by itself.
CK="$T/ck"
W="$TRAIN --data synthetic --train-samples 6000 --test-samples 600 --model mlp --hidden 128
   --steps 1200 --log-every 400 --eval-every 100000 --checkpoint-dir $CK --checkpoint-every 40"
node 0 a $C --nnodes 2:3 --rdzv_id kill --rdzv_conf "$MN_HB$HOST0" $W
node 1 b $C --nnodes 2:3 --rdzv_id kill --rdzv_conf "$MN_HB$OTHER" $W
node 2 c $C --nnodes 2:3 --rdzv_id kill --rdzv_conf "$MN_HB$OTHER" $W
ok wait_for 30 out_has a "train: 6 processes"
ok wait_for 60 sh -c "ls '$CK' 2>/dev/null | grep -q '[.]done$'"
kill -KILL "$PID_c"
check_exits "2:3, a node SIGKILLed: the survivors re-form and finish the training" "0 0" a b
# (the survivors' workers usually notice first: their allreduce with the dead ones breaks)
ok out_has a "re-forming the group"
ok out_has a "train: 4 processes, cpu: .*4 ranks on 2 hosts|train: 4 processes, cpu: shared memory"
like "$(cat "$T/a.out" "$T/a.err")" "warning: resharding a checkpoint of 6 processes: world size 6 -> 4, effective batch 384 -> 256" \
    "the re-formed group of 4 workers reshards the 6 workers' checkpoint"
like "$(cat "$T/a.out" "$T/a.err")" "train: resumed from ($CK/ckpt-[0-9]*[.]mgc|memory: rank [0-9]+'s snapshot at world size 6) \(step [1-9][0-9]*, epoch [0-9]*\)" \
    "and resumes from it, or from a survivor's newer snapshot in memory (docs/train.md)"
ok out_has a "train: done: test accuracy .*; 1200 steps"
# (--max_restarts is 0: had the re-formation counted as a restart, the job would have failed)
unlike "$(cat "$T/a.out" "$T/a.err")" "restart [1-9]|no restarts are left" "a membership change does not count as a restart"

# --nnodes 3:3: the survivors cannot go on.
W="$MN_WORKER --sleep 60"
node 0 a $C --nnodes 3 --rdzv_id min3 --rdzv_conf "$MN_HB$HOST0" $W
node 1 b $C --nnodes 3 --rdzv_id min3 --rdzv_conf "$MN_HB$OTHER" $W
node 2 c $C --nnodes 3 --rdzv_id min3 --rdzv_conf "$MN_HB$OTHER" $W
ok wait_for 20 sh -c "[ \$(grep -c '^env' $T/a.out $T/b.out $T/c.out | awk -F: '{s+=\$2} END {print s}') -ge 6 ]"
kill -KILL "$PID_c"
nodes_wait b a
is "$RC_a" "$RC_b" "3:3, a node SIGKILLed: both survivors exit"
ok test "$RC_a" -ne 0 -a "$RC_b" -ne 0
ok out_has b "stopped sending heartbeats; 2 node\(s\) left, fewer than the minimum 3"

# Scale-up: 2 nodes of 2:3 run, a third arrives and the group grows.
W="$MN_WORKER --reach --sleep-at 2:60"
node 0 a $C --nnodes 2:3 --rdzv_id grow --rdzv_conf "$MN_HB$HOST0,last_call_timeout=0.5" $W
node 1 b $C --nnodes 2:3 --rdzv_id grow --rdzv_conf "$MN_HB$OTHER,last_call_timeout=0.5" $W
ok wait_for 20 sh -c "[ \$(grep -c '^reach ok' $T/a.out $T/b.out | awk -F: '{s+=\$2} END {print s}') -ge 4 ]"
node 2 c $C --nnodes 2:3 --rdzv_id grow --rdzv_conf "$MN_HB$OTHER,last_call_timeout=0.5" $W
check_exits "a node joining mid-run: all three finish" "0 0 0" a b c
ok out_has a "re-forming the group.*waiting to join"
is "$(grep '^env' "$T/c.out" | tail -n 1 | sed 's/.* group_rank=\([0-9]*\) .*/\1/')" 2 \
    "the newcomer is node rank 2"
check_world "the grown group: ranks 0..5" 6 a b c

# A worker failure on one node restarts every node, with a new attempt.
W="$MN_WORKER --reach --fail 3:7"
node 0 a $C --nnodes 2 --max_restarts 1 --rdzv_id fail1 --rdzv_conf "$MN_HB$HOST0" $W
node 1 b $C --nnodes 2 --max_restarts 1 --rdzv_id fail1 --rdzv_conf "$MN_HB$OTHER" $W
check_exits "rank 3 fails once, --max_restarts 1: both nodes restart and succeed" "0 0" a b
is "$(grep -c '^env.* restart=1 ' "$T/a.out")" 2 "node 0's workers ran again with TORCHELASTIC_RESTART_COUNT=1"

W="$MN_WORKER --fail 3:7 --sleep 30"
node 0 a $C --nnodes 2 --max_restarts 0 --rdzv_id fail0 --rdzv_conf "$MN_HB$HOST0" $W
node 1 b $C --nnodes 2 --max_restarts 0 --rdzv_id fail0 --rdzv_conf "$MN_HB$OTHER" $W
check_exits "no restarts left: both nodes exit with the failed worker's code" "7 7" b a
ok out_has a "rank 3 .* exited with code 7"
done_testing
