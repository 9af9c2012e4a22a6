# Rendezvous protocol scenarios, shared by the backends' integration tests
# (etcd_rdzv.t, multinode_store_rdzv.t). They drive build/tests/helpers/rdzv_agent,
# which joins rounds through launcher/rdzv/rdzv_proto.c exactly as mglaunch does.
#
# The caller sets BACKEND (etcd | c10d), EP (the endpoint) and, for c10d,
# HOST_ARGS: the arguments that make an agent host the store (only the first
# agent of each case gets them, and that agent is never the one killed), and
# OTHER_ARGS those of the other agents.
# Source after lib.sh.

AGENT=$HELPERS/rdzv_agent
HB="heartbeat_interval=0.2,heartbeat_timeout=2"
_case=0
HOST_ARGS=${HOST_ARGS:-}
OTHER_ARGS=${OTHER_ARGS:-}

# new_case: a fresh run id (and, for c10d, a fresh store port) per scenario.
new_case() {
    _case=$((_case + 1))
    RUN="case$_case-$$"
    [ "$BACKEND" = c10d ] && EP="127.0.0.1:$(free_port)"
    _first=1
}

# agent NAME SCRIPT [ARGS...]: starts an agent in the background; output in $T/NAME.out.
agent() {
    _n=$1
    _s=$2
    shift 2
    _extra=$OTHER_ARGS
    if [ "$_first" = 1 ]; then
        _extra=$HOST_ARGS
        _first=0
    fi
    # The previous case's files go first, here: the background child would
    # empty them only when it runs, and a check of this case could read the
    # last case's lines before that (a stale "formed": the test then killed an
    # agent that had not joined yet, and the others waited for it).
    rm -f "$T/$_n.out" "$T/$_n.err"
    "$AGENT" --backend "$BACKEND" --endpoint "$EP" --id "$RUN" --host "$_n" --script "$_s" \
        $_extra "$@" >"$T/$_n.out" 2>"$T/$_n.err" &
    eval "PID_$_n=$!"
    # The store host must listen before the others connect (they retry anyway).
    [ -n "$_extra" ] && [ "$_extra" = "$HOST_ARGS" ] && sleep 0.1
    return 0
}

pid_of() { eval "echo \$PID_$1"; }

# has NAME REGEX: the agent printed a line matching REGEX.
has() { grep -Eq -- "$2" "$T/$1.out"; }

# wait_line NAME REGEX SECS
wait_line() { wait_for "$3" has "$1" "$2"; }

# finish NAME: waits for the agent to exit; its status in $RC.
finish() {
    wait "$(pid_of "$1")"
    RC=$?
}

# field NAME KEY [N]: value of KEY= in the N-th (default last) formed line.
field() {
    if [ -n "${3:-}" ]; then
        grep '^formed' "$T/$1.out" | sed -n "${3}p" | tr ' ' '\n' | sed -n "s/^$2=//p"
    else
        grep '^formed' "$T/$1.out" | tail -n 1 | tr ' ' '\n' | sed -n "s/^$2=//p"
    fi
}

show() {
    for _f in "$@"; do
        sed "s/^/#   $_f: /" "$T/$_f.out" "$T/$_f.err" 2>/dev/null | head -n 20
    done
}

check_ok() {
    # check_ok DESC CMD...: like ok, but shows the agents' output on failure
    _d=$1
    shift
    if "$@"; then
        _result 0 "$_d"
    else
        _result 1 "$_d"
        show $SHOW
    fi
}

case_form3() {
    new_case
    SHOW="a b c"
    for n in a b c; do agent $n join,run:600,finish --nnodes 3 --nproc 2 --conf "$HB"; done
    for n in a b c; do finish $n; eval "rc_$n=$RC"; done
    is "$rc_a$rc_b$rc_c" 000 "$BACKEND: 3 agents form one group and finish"
    ranks=$(for n in a b c; do field $n node_rank; done | sort | tr '\n' ' ')
    is "$ranks" "0 1 2 " "$BACKEND: node ranks 0..2, each once"
    bases=$(for n in a b c; do field $n rank_base; done | sort -n | tr '\n' ' ')
    is "$bases" "0 2 4 " "$BACKEND: global ranks start at 0, 2, 4 (nproc 2)"
    ws=$(for n in a b c; do echo "$(field $n world) $(field $n master)"; done | sort -u | wc -l)
    is "$ws" 1 "$BACKEND: one world size and one master address for all"
    is "$(field a world)" 6 "$BACKEND: world size 6"
    # Ranks follow host names for a new group: a, b, c.
    is "$(field a node_rank)$(field b node_rank)$(field c node_rank)" 012 \
        "$BACKEND: a new group is ranked by host name"
    check_ok "$BACKEND: every agent passed the exit barrier" \
        sh -c "grep -q 'event done' $T/a.out && grep -q 'event done' $T/b.out && grep -q 'event done' $T/c.out"
}

case_last_call() {
    new_case
    SHOW="a b"
    for n in a b; do agent $n join,run:300,finish --nnodes 2:3 --conf "$HB,last_call_timeout=0.5"; done
    finish a
    finish b
    is "$(field a nnodes) $(field b nnodes)" "2 2" "$BACKEND: 2:3 forms with 2 nodes after the last call"
}

case_dead_node() {
    new_case
    SHOW="a b c"
    agent a join,run:8000,finish --nnodes 2:3 --conf "$HB"
    agent b join,run:8000,finish --nnodes 2:3 --conf "$HB"
    agent c join,run:60000 --nnodes 2:3 --conf "$HB"
    check_ok "$BACKEND: 3 nodes formed" wait_line c '^formed round=0' 15
    kill -KILL "$PID_c"
    check_ok "$BACKEND: survivors notice the SIGKILLed node" wait_line a 'event restart reason=node_died' 10
    check_ok "$BACKEND: and re-form without it" wait_line b '^formed round=1 .*nnodes=2' 10
    finish a
    finish b
    is "$RC" 0 "$BACKEND: the re-formed group finishes"
    is "$(field a nnodes)" 2 "$BACKEND: the new round has 2 nodes"
    is "$(field a node_rank)$(field b node_rank)" 01 "$BACKEND: survivors keep their order"
    is "$(field a restarts)" 0 "$BACKEND: a membership change does not count as a restart"
}

case_below_min() {
    new_case
    SHOW="a b c"
    agent a join,run:20000 --nnodes 3:3 --conf "$HB"
    agent b join,run:20000 --nnodes 3:3 --conf "$HB"
    agent c join,run:60000 --nnodes 3:3 --conf "$HB"
    check_ok "$BACKEND: 3:3 formed" wait_line c '^formed' 15
    kill -KILL "$PID_c"
    finish a
    rc_a=$RC
    finish b
    is "$rc_a $RC" "3 3" "$BACKEND: with 3:3 the survivors exit with an error"
    check_ok "$BACKEND: the error explains the minimum" \
        grep -q 'stopped sending heartbeats.*fewer than the minimum 3' "$T/a.out"
}

case_scale_up() {
    new_case
    SHOW="a b c"
    agent a join,run:6000,finish --nnodes 2:3 --conf "$HB,last_call_timeout=0.3"
    agent b join,run:6000,finish --nnodes 2:3 --conf "$HB,last_call_timeout=0.3"
    check_ok "$BACKEND: 2 of 2:3 formed" wait_line b '^formed round=0 .*nnodes=2' 15
    agent c join,run:3000,finish --nnodes 2:3 --conf "$HB,last_call_timeout=0.3"
    check_ok "$BACKEND: a node arriving mid-run triggers a re-formation" \
        wait_line a 'event restart' 10
    check_ok "$BACKEND: the group grows to 3" wait_line a '^formed round=1 .*nnodes=3' 10
    finish a
    finish b
    finish c
    is "$(field c node_rank)" 2 "$BACKEND: the newcomer comes after the existing nodes"
    is "$(field a restarts)" 0 "$BACKEND: scaling up does not count as a restart"
}

case_failure_restart() {
    new_case
    SHOW="a b"
    agent a join,run:500,fail:7,run:500,finish --nnodes 2 --max_restarts 1 --conf "$HB"
    agent b join,run:3000,finish --nnodes 2 --max_restarts 1 --conf "$HB"
    finish a
    finish b
    is "$RC" 0 "$BACKEND: the job completes after one restart"
    check_ok "$BACKEND: the other node restarts too, for a failure" \
        grep -q 'event restart reason=failure' "$T/b.out"
    is "$(field b round) $(field b restarts)" "1 1" "$BACKEND: new round (attempt), restart count 1"

    new_case
    agent a join,run:300,fail:7 --nnodes 2 --max_restarts 0 --conf "$HB"
    agent b join,run:10000 --nnodes 2 --max_restarts 0 --conf "$HB"
    finish a
    is "$RC" 7 "$BACKEND: no restarts left: the failing node exits with the worker's code"
    finish b
    is "$RC" 3 "$BACKEND: and every other node stops"
    check_ok "$BACKEND: the others report the root cause" \
        grep -q 'the job failed: rank 0 .* on a exited with code 7: scripted failure' "$T/b.out"
}

# Workers that fail because a peer node died (their collective broke) are a
# membership change, not a failure: even with --max_restarts 0 the job re-forms.
case_peer_death_failure() {
    new_case
    SHOW="a b c"
    HB2="heartbeat_interval=1,heartbeat_timeout=4"
    # a's worker fails only once c is dead (as a collective would), however
    # slowly the test machine schedules the kill.
    rm -f "$T/c_dead"
    agent a join,await:$T/c_dead,fail:9,run:1500,finish --nnodes 2:3 --max_restarts 0 --conf "$HB2"
    agent b join,run:5000,finish --nnodes 2:3 --max_restarts 0 --conf "$HB2"
    agent c join,run:60000 --nnodes 2:3 --max_restarts 0 --conf "$HB2"
    check_ok "$BACKEND: formed" wait_line c '^formed' 15
    kill -KILL "$PID_c"
    touch "$T/c_dead"
    finish a
    rc_a=$RC
    finish b
    is "$rc_a $RC" "0 0" "$BACKEND: a worker failure right after a node died does not end the job"
    is "$(field a nnodes) $(field a restarts)" "2 0" \
        "$BACKEND: the group re-formed without the dead node, no restart counted"
}

case_barrier() {
    new_case
    SHOW="a b"
    agent a join,finish --nnodes 2 --conf "$HB"
    agent b join,run:60000 --nnodes 2 --conf "$HB"
    check_ok "$BACKEND: formed" wait_line b '^formed' 15
    sleep 0.3
    kill -KILL "$PID_b"
    finish a
    is "$RC" 0 "$BACKEND: the exit barrier does not wait for a dead node"
    check_ok "$BACKEND: it passes" grep -q 'event done' "$T/a.out"

    new_case
    agent a join,finish --nnodes 2 --conf "$HB,exit_barrier_timeout=0.5"
    agent b join,run:4000 --nnodes 2 --conf "$HB"
    finish a
    check_ok "$BACKEND: the exit barrier is bounded" grep -q 'event barrier_timeout' "$T/a.out"
    finish b
}

case_closed() {
    new_case
    SHOW="a b c"
    agent a join,finish --nnodes 2 --conf "$HB"
    agent b join,run:2000,finish --nnodes 2 --conf "$HB"
    # Keep the store host alive (c10d) while c arrives: a waits in the barrier for b.
    check_ok "$BACKEND: formed" wait_line b '^formed' 15
    if [ "$BACKEND" = etcd ]; then
        finish a
        finish b
        agent c join --nnodes 2 --conf "$HB,join_timeout=5"
        finish c
        is "$RC" 4 "$BACKEND: joining a finished run is refused"
        check_ok "$BACKEND: saying to use a new run id" grep -q 'already finished.*new --rdzv_id' "$T/c.out"
    else
        finish a
        finish b
    fi
}

case_spare() {
    new_case
    SHOW="a b c"
    agent a join,run:9000,finish --nnodes 2 --conf "$HB"
    agent b join,run:60000 --nnodes 2 --conf "$HB"
    check_ok "$BACKEND: 2:2 formed" wait_line b '^formed' 15
    agent c join,run:3000,finish --nnodes 2 --conf "$HB"
    sleep 0.5
    check_ok "$BACKEND: a third node waits as a spare" sh -c "! grep -q formed $T/c.out"
    kill -KILL "$PID_b"
    check_ok "$BACKEND: the spare takes the dead node's place" wait_line c '^formed round=1' 10
    finish a
    finish c
    is "$RC" 0 "$BACKEND: and the job finishes"
}

case_static() {
    new_case
    SHOW="a b"
    agent a join,run:300,finish --nnodes 2 --node_rank 1 --conf "$HB"
    agent b join,run:300,finish --nnodes 2 --node_rank 0 --conf "$HB"
    finish a
    finish b
    is "$(field a node_rank)$(field b node_rank)" 10 "$BACKEND: a fixed --node_rank is kept"

    new_case
    agent a join --nnodes 2 --node_rank 0 --conf "$HB"
    agent b join --nnodes 2 --node_rank 0 --conf "$HB"
    finish a
    rc_a=$RC
    finish b
    is "$rc_a$RC" 33 "$BACKEND: two nodes with the same --node_rank fail"
    check_ok "$BACKEND: saying so" grep -q 'node_rank 0 given to two nodes' "$T/a.out"
}

case_run_ids() {
    new_case
    SHOW="a b x y"
    agent a join,run:1500,finish --nnodes 2 --conf "$HB"
    agent b join,run:1500,finish --nnodes 2 --conf "$HB"
    RUN="other$RUN"
    _first=0
    agent x join,run:300,finish --nnodes 2 --conf "$HB"
    agent y join,run:300,finish --nnodes 2 --conf "$HB"
    for n in a b x y; do finish $n; done
    is "$(field a nnodes)$(field x nnodes)" 22 "$BACKEND: two run ids on one backend form two groups"
}
