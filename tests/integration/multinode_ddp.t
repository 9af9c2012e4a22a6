#!/bin/sh
# DDP training (build/bin/train) across test hosts under mglaunch: a run on 2
# hosts x 2 workers completes (hierarchical allreduce: shared memory on each
# host, TCP between them); and with --nnodes 2:3, a node's agent SIGKILLed
# mid-run: the group re-forms (a spare takes its place) and training resumes
# from the last checkpoint, without counting a restart.
# timeout: 180
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"

[ -x "$TRAIN" ] || skip_all "build/bin/train is not built"
[ -e /usr/share/datasets/fashion-mnist ] || skip_all "dataset-fashion-mnist is not installed"
hosts_up 4
c10d_endpoint
C="--rdzv_backend c10d --rdzv_endpoint $EP"
DATA="--model mlp --data fashion-mnist --train-samples 8192 --test-samples 1000 --eval-every 100000"

node 0 a $C --nnodes 2 --nproc_per_node 2 --rdzv_id ddp2 --rdzv_conf "$MN_HB$HOST0" \
    "$TRAIN" $DATA --steps 60 --log-every 30
node 1 b $C --nnodes 2 --nproc_per_node 2 --rdzv_id ddp2 --rdzv_conf "$MN_HB$OTHER" \
    "$TRAIN" $DATA --steps 60 --log-every 30
check_exits "DDP on 2 hosts x 2 workers: both agents succeed" "0 0" a b
ok out_has a "train: 4 processes, cpu: .*4 ranks on 2 hosts"
ok out_has a "train: done: test accuracy"

# 2:3 with a spare; the third node dies at step ~300 of 1500.
CK="$T/ckpt"
W="$TRAIN $DATA --steps 1500 --log-every 100 --checkpoint-dir $CK --checkpoint-every 50 --resume auto"
node 0 a $C --nnodes 2:3 --nproc_per_node 1 --rdzv_id el --rdzv_conf "$MN_HB$HOST0" $W
node 1 b $C --nnodes 2:3 --nproc_per_node 1 --rdzv_id el --rdzv_conf "$MN_HB$OTHER" $W
node 2 c $C --nnodes 2:3 --nproc_per_node 1 --rdzv_id el --rdzv_conf "$MN_HB$OTHER" $W
ok wait_for 30 out_has a "3 processes"
node 3 d $C --nnodes 2:3 --nproc_per_node 1 --rdzv_id el --rdzv_conf "$MN_HB$OTHER" $W
ok wait_for 60 out_has a "^step [3-9]00/1500"
kill -KILL "$PID_c"
check_exits "a node SIGKILLed mid-run: the job re-forms and completes" "0 0 0" a b d
ok out_has a "re-forming the group"
ok out_has a "train: resumed from .*step [1-9][0-9]*"
unlike "$(cat "$T/a.out" "$T/a.err")" "resharding" "the spare keeps the world size: no resharding"
ok out_has a "train: done: test accuracy"
unlike "$(cat "$T/a.out" "$T/a.err")" "restart [1-9]" "no restart was counted for the lost node"
done_testing
