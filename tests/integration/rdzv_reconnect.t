#!/bin/sh
# The connection to the rendezvous store closed under a live agent (c10d,
# three agents on three test hosts, --nnodes 2:3; docs/rendezvous.md,
# Liveness). The store closes a connection whose lease ran out, so an agent
# whose heartbeats stopped past heartbeat_timeout finds it closed, with
# whichever request comes first:
# 1. c is SIGSTOPped inside its heartbeat's ping (the store's host frozen a
#    moment, so that the ping waits there), past heartbeat_timeout: the two
#    others re-form without it. Thawed, c reads the ping's answer, and the
#    tick's next request finds the connection closed: c connects again, says
#    it was declared dead, rejoins, and the job of three finishes.
# 2. The store's side of c's connection is cut (ss -K) while c runs: c
#    connects again and rejoins, the job finishes.
# 3. The store is really gone (its agent SIGKILLed): the others try to
#    connect again until heartbeat_timeout, say so once, and then exit with
#    an error that names the store and what failed.
# 4. A job of fixed size (--nnodes 2) cannot take a node back: b, stopped
#    past heartbeat_timeout, ends the job on a (b is its root cause), and
#    thawed, exits 1 saying it was declared dead, for how long its
#    heartbeats stopped, and which heartbeat_timeout to give it instead.
# timeout: 240
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"

command -v ss >/dev/null 2>&1 || skip_all "no ss (apt-get install iproute2)"
hosts_up 3
c10d_endpoint
PORT=${EP##*:}

# The worker: its group's size, then up until $T/finish.ID exists (or SIGTERM).
cat >"$T/w.sh" <<'W'
#!/bin/sh
echo "env group_world=$GROUP_WORLD_SIZE"
trap 'exit 143' TERM
until [ -e "$(dirname "$0")/finish.$1" ]; do sleep 0.1; done
exit 0
W
chmod +x "$T/w.sh"

# start ID: agents a (hosting the store), b and c of job ID, one worker each.
start() {
    C="--rdzv_backend c10d --rdzv_endpoint $EP --nproc_per_node 1 --nnodes 2:3 --rdzv_id $1"
    node 0 a $C --rdzv_conf "$MN_HB$HOST0" "$T/w.sh" "$1"
    node 1 b $C --rdzv_conf "$MN_HB$OTHER" "$T/w.sh" "$1"
    node 2 c $C --rdzv_conf "$MN_HB$OTHER" "$T/w.sh" "$1"
    ok wait_for 30 out_has c "^env group_world=3"
}
worlds() { grep -c "^env group_world=$2" "$T/$1.out"; }

# The port agent c's connection to the store comes from (seen on c's host).
c_port() {
    on 2 ss -tnpH state established "( dport = :$PORT )" |
        awk -v p="pid=$(agent_pid c)," 'index($0, p) { n = split($3, a, ":"); print a[n]; exit }'
}
# Bytes the store has not read yet from that connection (on its host).
c_unread() { on 0 ss -tnH state established "( sport = :$PORT and dport = :$1 )" | awk '{ print $1; exit }'; }

# 1.
start thaw
pa=$(agent_pid a)
pc=$(agent_pid c)
at_cleanup "kill -CONT $pa $pc 2>/dev/null"
cp=$(c_port)
ok test -n "$cp"
# Freeze the store's host until c's next heartbeat ping (a header of 12
# bytes) waits there unread, then c; thaw the host, which answers the ping
# and, heartbeat_timeout later, drops c.
pinged=
for try in 1 2 3 4 5; do
    kill -STOP "$pa"
    end=$(($(date +%s%N) / 1000000 + 1000))
    while [ $(($(date +%s%N) / 1000000)) -lt $end ]; do
        u=$(c_unread "$cp")
        [ -n "$u" ] && [ "$u" != 0 ] && break
        sleep 0.02
    done
    if [ "$u" = 12 ]; then
        kill -STOP "$pc"
        pinged=1
        kill -CONT "$pa"
        break
    fi
    kill -CONT "$pa"
    sleep 0.5
done
DESC="c stopped while its ping waits at the frozen store" ok test -n "$pinged"
ok wait_for 30 out_has a "^env group_world=2"
kill -CONT "$pc"
ok wait_for 30 sh -c "[ \$(grep -c '^env group_world=3' '$T/a.out') -ge 2 ]"
: >"$T/finish.thaw"
check_exits "c, dropped while stopped, rejoins, and the job of three finishes" "0 0 0" a b c
like "$(cat "$T/c.err")" \
    "mglaunch: re-forming the group \(this node was declared dead: its heartbeats stopped for [0-9.]+ s, past heartbeat_timeout \(2s\) \(was it stopped, or starved of CPU\?\); rejoining as a new node\)" \
    "c says it was declared dead and rejoins"
unlike "$(cat "$T/c.err")" "lost the rendezvous backend" "not that it lost the store"

# 2. (ss -K takes CAP_NET_ADMIN: root, as the test hosts do)
if [ "$(id -u)" = 0 ]; then
    start cut
    cp=$(c_port)
    ok test -n "$cp"
    on 0 ss -tnH -K state established "( sport = :$PORT and dport = :$cp )" >/dev/null
    ok wait_for 30 sh -c "[ \$(grep -c '^env group_world=3' '$T/a.out') -ge 2 ]"
    : >"$T/finish.cut"
    check_exits "c's store connection cut: c rejoins, and the job of three finishes" "0 0 0" a b c
    like "$(cat "$T/c.err")" \
        "mglaunch: re-forming the group \(this node lost its place in the job \(store $EP: the store dropped this agent's connection.*\); rejoining as a new node\)" \
        "c says it lost its place, and rejoins"
else
    diag "not root: no ss -K, the cut connection is not tried"
fi

# 3.
start gone
kill -KILL "$(agent_pid a)"
nodes_wait b c
is "$RCS" "1 1" "the store's agent gone: the others exit 1"
for n in b c; do
    like "$(cat "$T/$n.err")" \
        "mglaunch: rendezvous: the connection to the backend closed \(store $EP: the connection closed, and connecting again failed: connection refused \(nothing listens there\)\); connecting again until heartbeat_timeout \(2s\)" \
        "$n says once that it connects again, and for how long"
    like "$(cat "$T/$n.err")" \
        "mglaunch: rendezvous \(c10d\): lost the rendezvous backend: store $EP: the connection closed, and connecting again failed: connection refused \(nothing listens there\) \(did the agent hosting the store exit\?\); connecting again failed for [0-9.]+ s \(heartbeat_timeout 2s\)" \
        "$n then exits, naming the store and the budget"
done

# 4.
C="--rdzv_backend c10d --rdzv_endpoint $EP --nproc_per_node 1 --nnodes 2 --rdzv_id fixed"
node 0 a $C --rdzv_conf "$MN_HB$HOST0" "$T/w.sh" fixed
node 1 b $C --rdzv_conf "$MN_HB$OTHER" "$T/w.sh" fixed
ok wait_for 30 out_has b "^env group_world=2"
pb=$(agent_pid b)
at_cleanup "kill -CONT $pb 2>/dev/null"
kill -STOP "$pb"
node_wait a
is "$RC" 1 "b stopped past heartbeat_timeout: the job of two ends on a"
like "$(cat "$T/a.err")" "Root cause \(first failure\): node .* was lost" "b is the root cause"
kill -CONT "$pb"
node_wait b
is "$RC" 1 "b, thawed, exits 1"
like "$(cat "$T/b.err")" \
    "mglaunch: rendezvous \(c10d\): this node was declared dead: its heartbeats stopped for [0-9.]+ s, past heartbeat_timeout \(2s\) \(was it stopped, or starved of CPU\? If it was only slow, give it more room: --rdzv_conf heartbeat_timeout=[0-9]+\), and the job could not take it back: its rendezvous store is gone \(store $EP: .*connection refused.*\): the job most likely ended without it" \
    "it says it was declared dead, for how long, and what to do"
unlike "$(cat "$T/b.err")" "did the agent hosting the store exit" "not that the store's host exited"
done_testing
