#!/bin/sh
# The agent hosting the c10d store serves it from its one poll loop (DESIGN.md:
# one thread, one loop): while it waits in the rendezvous, and while it
# supervises workers, /proc/PID/task has one entry and the store answers.
# SIGTERM while it waits for missing nodes: exit 143 at once, and nothing
# left behind (no process, no listening port). Its workers' output and exits
# are handled while clients keep its store busy. And an agent whose store
# stops answering still handles SIGTERM at once.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
CTL=$HELPERS/storectl
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

threads() { ls "/proc/$1/task" 2>/dev/null | wc -l | tr -d ' '; }
gone() { ! alive "$1"; }
# the store at 127.0.0.1:PORT answers a ping
answers() { "$CTL" --connect-timeout 300 --timeout 2000 "127.0.0.1:$1" ping >/dev/null 2>&1; }
C="--nproc_per_node 1 --rdzv_backend c10d --rdzv_conf heartbeat_interval=0.2,heartbeat_timeout=2"

# ---- waiting in the rendezvous for a node that never comes
P=$(free_port)
# (--nnodes 2:200: a store sized for up to 200 nodes takes values of 200 KiB.)
bg "$MGLAUNCH" $C --nnodes 2:200 --rdzv_endpoint "127.0.0.1:$P" --rdzv_id wait \
    --rdzv_conf is_host=1 "$FW" sleep 30 >"$T/w.out" 2>"$T/w.err"
pid=$!
ok wait_for 10 answers "$P"
is "$(threads "$pid")" 1 "waiting for the missing node, the hosting agent is one thread"
ok answers "$P"
# The host reads a slice of each connection per turn: a larger value still
# goes through, over several turns.
V=$(head -c 120000 /dev/zero | tr '\0' 'v')
got=$("$CTL" "127.0.0.1:$P" set big "$V" get big 0 2>&1 | tail -n 1)
got=${got#get big = }
is "${#got}" 120000 "a 120 kB value (an argument can hold no more) round-trips through the store"
DESC="after 5 s the waiting agent says what it waits for" \
    ok wait_for 10 grep -q "^mglaunch: rendezvous: waiting for nodes: 1 joined round 0, --nnodes 2:200; join_timeout in [0-9]* s$" "$T/w.err"
kids=$(pgrep -P "$pid" | tr '\n' ' ')
ok test -n "$kids"
kill -TERM "$pid"
DESC="SIGTERM while waiting for missing nodes: the agent exits at once" ok wait_for 5 gone "$pid"
wait "$pid"
is "$?" 143 "exit code 143"
like "$(cat "$T/w.err")" "stopped by SIGTERM" "and says so"
DESC="nothing left behind: its children are gone" ok wait_for 5 sh -c "for k in $kids; do ! kill -0 \$k 2>/dev/null || exit 1; done"
closed() { ! answers "$1"; }
DESC="nothing left behind: the store's port is closed" ok closed "$P"

# ---- a formed job: a worker prints a lot and exits while clients keep the
# host's store busy; its other worker keeps the job (and the store) up until
# the clients are done.
P=$(free_port)
bg "$MGLAUNCH" $C --nnodes 2 --nproc_per_node 2 --rdzv_endpoint "127.0.0.1:$P" --rdzv_id busy \
    --log_dir "$T/la" --rdzv_conf is_host=1 "$FW" touch "$T/a.up.\${local_rank}" \
    wait-file "$T/go" if local_rank=0 out-lines 3000000 if local_rank=0 exit 0 \
    wait-file "$T/fin" >/dev/null 2>"$T/a.err"
pa=$!
bg "$MGLAUNCH" $C --nnodes 2 --rdzv_endpoint "127.0.0.1:$P" --rdzv_id busy --log_dir "$T/lb" \
    --rdzv_conf is_host=0 "$FW" touch "$T/b.up" wait-file "$T/fin" >/dev/null 2>"$T/b.err"
pb=$!
ok wait_for 15 test -e "$T/a.up.0" -a -e "$T/a.up.1" -a -e "$T/b.up"
is "$(threads "$pa") $(threads "$pb")" "1 1" \
    "supervising workers, the hosting agent (and the other) is one thread"
spids=""
for i in 1 2 3; do
    "$CTL" --timeout 10000 "127.0.0.1:$P" stress 3 >"$T/stress.$i" 2>&1 &
    spids="$spids $!"
done
at_cleanup "kill -KILL $spids 2>/dev/null"
sleep 0.3
touch "$T/go"
EV=$T/la/busy/events.jsonl
exited() { grep '"event":"worker_exit"' "$EV" 2>/dev/null | grep -q '"local_rank":0'; }
ok wait_for 20 exited
lines() { cat "$1"/busy/attempt_*/"$2"/stdout.log 2>/dev/null | wc -l | tr -d ' '; }
is "$(lines "$T/la" 0)" 30000 "with the store busy, the worker's output is all read and logged"
busy=0
for p in $spids; do alive "$p" && busy=$((busy + 1)); done
diag "store clients still busy when the worker's exit was handled: $busy of 3"
bad=0
for p in $spids; do wait "$p" || bad=$((bad + 1)); done
is "$bad" 0 "the store answered its busy clients all along"
like "$(cat "$T/stress.1")" '^stress ok [1-9][0-9]*$' "they got answers ($(cat "$T/stress.1") checked operations for one)"
touch "$T/fin"
wait "$pa"
rc_a=$?
wait "$pb"
is "$rc_a $?" "0 0" "the job ends normally: both agents exit 0"
# ---- an agent whose store stops answering (the hosting agent stopped, not
# gone) with long request timeouts: SIGTERM still ends it at once, with the
# last courtesy requests bounded.
P=$(free_port)
SLOW="heartbeat_interval=1,heartbeat_timeout=60,read_timeout=60"
bg "$MGLAUNCH" $C --nnodes 3 --rdzv_endpoint "127.0.0.1:$P" --rdzv_id stall \
    --rdzv_conf "is_host=1,$SLOW" "$FW" sleep 30 >/dev/null 2>&1
ph=$!
ok wait_for 10 answers "$P"
bg "$MGLAUNCH" $C --nnodes 3 --rdzv_endpoint "127.0.0.1:$P" --rdzv_id stall \
    --rdzv_conf "is_host=0,$SLOW" "$FW" sleep 30 >"$T/s.out" 2>"$T/s.err"
ps_=$!
ok wait_for 10 sh -c "'$CTL' 127.0.0.1:$P list /mg/rdzv/stall/r/0/j/ 10 | grep -q j/"
kill -STOP "$ph"
at_cleanup "kill -CONT $ph 2>/dev/null"
sleep 0.5
kill -TERM "$ps_"
DESC="its store stopped answering: SIGTERM still ends the other agent at once" \
    ok wait_for 5 gone "$ps_"
wait "$ps_"
is "$?" 143 "exit code 143"
kill -CONT "$ph"
kill -TERM "$ph"
wait "$ph"
done_testing
