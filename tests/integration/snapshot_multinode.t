#!/bin/sh
# In-memory snapshots across test hosts (docs/train.md, "Snapshots in
# memory"): two agents, one worker each, so the ranks agree on the snapshot
# over TCP. A worker SIGKILLed on the second host restarts both hosts' workers;
# each resumes from its own host's memory, and the run ends with the weights of
# a 2-host run that never stopped. (A whole node lost: snapshot_nodeloss.t.)
# timeout: 180
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"
. "$TOP/tests/lib/ddp_lib.sh"

[ -x "$TRAIN" ] || skip_all "build/bin/train is not built"
hosts_up 2
c10d_endpoint
C="--rdzv_backend c10d --rdzv_endpoint $EP --nnodes 2 --nproc_per_node 1 --max_restarts 3"
W="$TRAIN --data synthetic --train-samples 12800 --test-samples 500 --model cnn --steps 100 --batch-size 32 --log-every 1 --seed 2 --snapshot-every 1"

node 0 a $C --rdzv_id ref --rdzv_conf "$MN_HB$HOST0" $W
node 1 b $C --rdzv_id ref --rdzv_conf "$MN_HB$OTHER" $W
check_exits "2 hosts x 1 worker: the reference run" "0 0" a b
ref=$(hash_of "$T/a.out")
ok test -n "$ref"

node 0 a $C --rdzv_id kill --rdzv_conf "$MN_HB$HOST0" $W
node 1 b $C --rdzv_id kill --rdzv_conf "$MN_HB$OTHER" $W
ok wait_for 60 out_has a "^step 30/100"
pb=$(agent_pid b)
kill -KILL "$(pgrep -P "$pb" -x train | head -n 1)"
check_exits "the second host's worker SIGKILLed: both agents finish" "0 0" a b
ok out_has a "2 processes, cpu: .*2 ranks on 2 hosts"
# (or, the worker killed in its copy, from the other rank's newer one)
ok out_has a "train: resumed from memory.*[ (]step [3-9][0-9], epoch"
unlike "$(cat "$T/a.out" "$T/a.err")" "warning: (no snapshot|not resuming)" "no fallback from memory"
is "$(hash_of "$T/a.out")" "$ref" "the weights of the run that never stopped, bit for bit"
done_testing
