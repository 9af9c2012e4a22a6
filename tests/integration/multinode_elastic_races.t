#!/bin/sh
# The elastic rendezvous where timing decides (c10d, test hosts): what load
# makes happen by chance, forced here with workers that fail or hold the
# attempt open on a file the test creates, and a store host frozen with
# SIGSTOP.
# - A worker fails just before the heartbeat sees the node that broke it gone:
#   the survivor re-forms rather than exiting with the failure.
# - A worker fails while the store does not answer for a moment (shorter than
#   heartbeat_timeout): the group re-forms once it answers.
# - The store stays silent past heartbeat_timeout: the node exits and says why.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"

hosts_up 3
c10d_endpoint
C="--nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint $EP"

# The worker: NAME ROLE TAG. On a node's first round, role "fail": local rank 1
# exits 3 once $T/TAG.fail exists, local rank 0 holds a SIGTERM off until
# $T/TAG.go exists (the attempt stays open); role "run": up until SIGTERM. In
# a later round every worker exits 0 at once.
cat >"$T/w.sh" <<'EOF'
#!/bin/sh
d=$(dirname "$0")
echo "env rank=$RANK local_rank=$LOCAL_RANK group_world=$GROUP_WORLD_SIZE restart=$TORCHELASTIC_RESTART_COUNT"
m=$d/ran.$1.$LOCAL_RANK
[ -e "$m" ] && exit 0
: >"$m"
case $2.$LOCAL_RANK in
fail.1)
    until [ -e "$d/$3.fail" ]; do sleep 0.05; done
    echo "w.sh: failing on purpose" >&2
    exit 3
    ;;
fail.0) trap 'until [ -e "$d/$3.go" ]; do sleep 0.05; done; exit 143' TERM ;;
*) trap 'exit 143' TERM ;;
esac
sleep 100 &
wait $!
EOF
chmod +x "$T/w.sh"
W="$T/w.sh"
envs() { [ "$(cat "$@" | grep -c '^env')" -ge "$N" ]; }

# 1. A node dies; on a survivor a worker's collective breaks (it fails) and
# the agent stops the other worker, which takes its time; meanwhile the
# heartbeat sees the dead node and leaves the round. The failure is the
# membership change's doing: both survivors re-form (--max_restarts 0).
node 0 a $C --nnodes 2:3 --rdzv_id race --rdzv_conf "$MN_HB$HOST0" $W a fail r1
node 1 b $C --nnodes 2:3 --rdzv_id race --rdzv_conf "$MN_HB$OTHER" $W b run r1
node 2 c $C --nnodes 2:3 --rdzv_id race --rdzv_conf "$MN_HB$OTHER" $W c run r1
N=6
ok wait_for 30 envs "$T/a.out" "$T/b.out" "$T/c.out"
: >"$T/r1.fail"
ok wait_for 20 out_has a "exited with code 3; stopping the other workers"
kill -KILL "$PID_c"
ok wait_for 20 out_has b "re-forming the group"
# The round moved on; a's heartbeat (every 0.2 s) notices while its attempt is
# still open. (Had it not yet, a would take the other path, which re-forms too.)
sleep 1
: >"$T/r1.go"
check_exits "a worker fails as the heartbeat sees a node die: both survivors re-form and finish" \
    "0 0" a b
ok out_has a "re-forming the group \(.*(stopped sending heartbeats|node died)"
unlike "$(cat "$T/a.err")" "FAILED" "the survivor does not report the excused failure as the run's"

# 2. b's worker fails while the agent hosting the store (a) is frozen for 2.5 s:
# each request times out after read_timeout (1 s), but heartbeat_timeout (5 s)
# has not passed, so b keeps asking, and the job restarts on both nodes once a
# answers again.
HB="heartbeat_interval=0.5,heartbeat_timeout=5,read_timeout=1"
node 0 a $C --nnodes 2 --max_restarts 1 --rdzv_id stall --rdzv_conf "$HB$HOST0" $W a2 run r2
node 1 b $C --nnodes 2 --max_restarts 1 --rdzv_id stall --rdzv_conf "$HB$OTHER" $W b2 fail r2
N=4
ok wait_for 30 envs "$T/a.out" "$T/b.out"
: >"$T/r2.fail"
ok wait_for 20 out_has b "exited with code 3; stopping the other workers"
A=$(agent_pid a)
kill -STOP "$A"
: >"$T/r2.go"
sleep 2.5
kill -CONT "$A"
check_exits "a worker fails while the store is frozen for less than heartbeat_timeout: both restart and finish" \
    "0 0" a b
ok out_has b "re-forming the group \(a worker failed here"
is "$(grep -c '^env.* restart=1$' "$T/a.out")" 2 "the restart counts on node 0 too"

# 3. The same, but the store stays frozen: b gives up after heartbeat_timeout
# (3 s) and says so, naming the store; its exit code is its worker's.
HB="heartbeat_interval=0.5,heartbeat_timeout=3,read_timeout=1"
node 0 a $C --nnodes 2 --rdzv_id gone --rdzv_conf "$HB$HOST0" $W a3 run r3
node 1 b $C --nnodes 2 --rdzv_id gone --rdzv_conf "$HB$OTHER" $W b3 fail r3
N=4
ok wait_for 30 envs "$T/a.out" "$T/b.out"
: >"$T/r3.fail"
ok wait_for 20 out_has b "exited with code 3; stopping the other workers"
A=$(agent_pid a)
kill -STOP "$A"
: >"$T/r3.go"
check_exits "the store frozen past heartbeat_timeout: the node with the failed worker exits" "3" b
like "$(cat "$T/b.err")" \
    "mglaunch: rendezvous \(c10d\): (a worker failed here, and the rendezvous backend did not answer within heartbeat_timeout \(3s\)|lost the rendezvous backend).*store $EP" \
    "it says why, naming the store and the timeout it gave it"
kill -CONT "$A"
node_wait a
ok test "$RC" -ne 0 # the frozen node, thawed, finds its peer gone and exits too
done_testing
