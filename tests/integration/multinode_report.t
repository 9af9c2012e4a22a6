#!/bin/sh
# What each node says, on test hosts (network namespaces; loopback when
# they cannot be made): a healthy job's node rank 1 prints progress lines of
# its own ranks and their end (node rank 0 prints train's); a node lost with
# its workers (its agent SIGKILLed while train runs) is the root cause in the
# survivor's summary, with its ranks, and the survivor's rank that waited
# for it follows as what came after; a rank hung on one node (the watchdog's
# verdict there) is the root cause in the other node's summary, not that
# node's own rank. A bad MG_NODE_PROGRESS_EVERY is refused.
# timeout: 150
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] || skip_all "build/bin/train is not built"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset MG_HANG_TIMEOUT

hosts_up 2
c10d_endpoint
# heartbeats: a node SIGKILLed is seen at once (its store connection closes);
# a long timeout keeps a loaded machine's slow beat from looking like a loss
MN_HB="heartbeat_interval=0.5,heartbeat_timeout=10"
HB=$(on 1 hostname)

# ---- a healthy job: node rank 1 says where its ranks are, and that they ended
C="--nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint $EP --nnodes 2 --rdzv_id ok"
W="$TRAIN --data synthetic --train-samples 6000 --test-samples 600 --model mlp --hidden 64
   --steps 6000 --log-every 3000 --eval-every 100000"
export MG_NODE_PROGRESS_EVERY=1
node 0 a $C --rdzv_conf "$MN_HB$HOST0" $W
node 1 b $C --rdzv_conf "$MN_HB$OTHER" $W
unset MG_NODE_PROGRESS_EVERY
check_exits "a healthy job: both nodes exit 0" "0 0" a b
e=$(cat "$T/b.out" "$T/b.err")
like "$e" "^mglaunch: ranks 2-3 here \\(node rank 1 of 2\\) took their first step; a line here every 1 s \\(the job's progress lines are on node rank 0's console\\)$" \
    "node rank 1: a line when its ranks start"
like "$e" "^mglaunch: ranks 2-3 here \\(node rank 1 of 2\\): step [0-9]+, [0-9.]+ steps/s$" "then where they are"
like "$e" "^mglaunch: every node finished; ranks 2-3 here exited 0 \\(node rank 1\\)$" "and their end"
unlike "$(cat "$T/a.out" "$T/a.err")" "here \\(node rank" "node rank 0 prints train's lines only"

MG_NODE_PROGRESS_EVERY=soon "$MGLAUNCH" --nproc_per_node 1 true >"$T/out" 2>"$T/err"
is $? 1 "a bad MG_NODE_PROGRESS_EVERY: refused"
like "$(cat "$T/err")" "MG_NODE_PROGRESS_EVERY='soon' is not a number of seconds from 0 \\(off\\) to 86400" "says why"

# ---- a node lost: its agent and workers SIGKILLed; --nnodes 2 cannot go on
C="--nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint $EP --nnodes 2 --rdzv_id lost"
W="$TRAIN --data synthetic --train-samples 6000 --test-samples 600 --model mlp --hidden 64
   --steps 100000 --log-every 100 --eval-every 100000"
node 0 a $C --rdzv_conf "$MN_HB$HOST0" --log_dir "$T/la" $W
node 1 b $C --rdzv_conf "$MN_HB$OTHER" --log_dir "$T/lb" $W
ok wait_for 60 out_has a "step 100/"
kill -KILL "$(agent_pid b)"
nodes_wait a b
ok test "$RC_a" -ne 0
e=$(cat "$T/a.err")
# (like and unlike match line by line)
like "$e" "^Root cause \\(first failure\\): node $HB was lost$" "node lost: the survivor's root cause is the lost node"
like "$e" "^  ranks     : 2-3$" "with its ranks"
like "$e" "^  message   : node $HB \\(node rank 1: ranks 2-3; [^)]*\\) stopped sending heartbeats; 1 node\\(s\\) left, fewer than the minimum 2 of --nnodes$" \
    "and what happened to it"
like "$e" "^  logs      : on $HB, in its own log directory" "and where its logs are"
unlike "$e" "^Root cause \\(first failure\\):$" "not its own rank that waited"
like "$("$MGLAUNCH" logs "$T/la" --run lost)" "^Root cause \\(first failure\\): node $HB was lost$" \
    "mglaunch logs says the same later"
if grep -q "exited with code" "$T/a.err"; then
    like "$e" "^This node's first failure \\(it followed the root cause\\):$" "its own failure comes after, as what followed"
else
    DESC="its workers were stopped before they failed: no failure of its own" ok true
fi

# ---- a rank hung on node 1: node 1's watchdog judges; node 0 names that rank
# (node 0's bound is the longer, so its rank surely waits when the verdict comes)
C="--nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint $EP --nnodes 2 --rdzv_id hang"
node 0 a $C --rdzv_conf "$MN_HB$HOST0" --log_dir "$T/la" --hang-timeout 4 "$HELPERS/comm_rank" steps 400 1 100 sleep
node 1 b $C --rdzv_conf "$MN_HB$OTHER" --log_dir "$T/lb" --hang-timeout 2 "$HELPERS/comm_rank" steps 400 1 100 sleep
check_exits "a hang on node 1: both nodes end with the hung rank's exit code" "137 137" a b
[ "$RCS" = "137 137" ] || diag "$(cat "$T/a.err" "$T/b.err")"
like "$(cat "$T/b.err")" "watchdog: rank 1 \\(local rank 0, host $HB, pid [0-9]+\\) is hung" \
    "node 1 names its hung rank"
like "$(cat "$T/lb/hang/attempt_0/0/stacks.txt")" "^# rank 1 \\(local rank 0, host $HB, pid [0-9]+\\), hung, at " \
    "and keeps its stacks in its own log directory"
e=$(cat "$T/a.err")
like "$e" "the job failed: rank 1 \\(local rank 0\\) on $HB exited with code 137: hung: no progress" \
    "node 0 learns the verdict"
like "$e" "^Root cause \\(first failure, on node $HB\\):$" "node 0's root cause is on node 1"
like "$e" "^  rank      : 1 \\(local rank 0\\)$" "the hung rank"
like "$e" "^  exit      : was killed by SIGKILL \\(exit code 137\\)$" "its exit"
like "$e" "^  message   : hung: no progress for [0-9.]+ s" "why"
unlike "$e" "^Root cause \\(first failure\\):$" "not node 0's own rank"
e=$("$MGLAUNCH" logs "$T/la" --run hang)
like "$e" "^Root cause \\(first failure, on node $HB\\):$" "mglaunch logs says the same later"
if grep -q "exited with code" "$T/a.err"; then
    like "$e" "^This node's first failure \\(it followed the root cause\\):$" "with node 0's own after it"
else
    DESC="node 0's rank was stopped before it failed: no failure of its own" ok true
fi
done_testing
