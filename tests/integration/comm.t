#!/bin/sh
# The runtime's distributed init and CPU collectives, with ranks started the
# way a launcher starts them (RANK, WORLD_SIZE, MASTER_ADDR, ... in the
# environment): world sizes 1 to 4, shared memory, the TCP ring, hierarchical
# (hosts simulated with MG_COMM_HOST), allreduces in registered memory
# (zero-copy on one host), a rank killed mid-collective (in ordinary and in
# registered memory), a hung rank, the error file, and every launcher variable
# validated.
# timeout: 180
. "$(dirname "$0")/../lib/lib.sh"
RANKBIN=$HELPERS/comm_rank
[ -x "$RANKBIN" ] || skip_all "comm_rank helper not built"

# run_ranks N CMD...: N ranks of CMD on 127.0.0.1; HOSTS="h0 h1 ..." gives
# each rank an MG_COMM_HOST. Rank r's stdout, stderr and exit status land in
# $T/out.r, $T/err.r, $T/rc.r; its error file is $T/error.r.json.
run_ranks() {
    n=$1
    shift
    port=$(free_port)
    pids=""
    r=0
    for h in ${HOSTS:-$(seq 1 "$n")}; do
        [ $r -lt "$n" ] || break
        hostvar=""
        [ -n "${HOSTS:-}" ] && hostvar="MG_COMM_HOST=$h"
        rm -f "$T/error.$r.json"
        bg env RANK=$r WORLD_SIZE="$n" LOCAL_RANK=$r LOCAL_WORLD_SIZE="$n" GROUP_RANK=0 \
            MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" TORCHELASTIC_RUN_ID=commtest \
            TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_USE_AGENT_STORE=False \
            TORCHELASTIC_ERROR_FILE="$T/error.$r.json" $hostvar "$@" >"$T/out.$r" 2>"$T/err.$r"
        pids="$pids $!"
        r=$((r + 1))
    done
    r=0
    for p in $pids; do
        wait "$p"
        echo $? >"$T/rc.$r"
        r=$((r + 1))
    done
}

all_ok() { # N: every rank exited 0
    for r in $(seq 0 $(($1 - 1))); do
        [ "$(cat "$T/rc.$r")" = 0 ] || { sed "s/^/# rank $r: /" "$T/err.$r" "$T/out.$r"; return 1; }
    done
}

shm_left() { ls /dev/shm 2>/dev/null | grep -c '^mg-commtest-' ; }

# ---- world size 1 without a launcher ----
out=$(env -u RANK -u WORLD_SIZE "$RANKBIN" info 2>&1)
like "$out" "^rank 0 world 1 .*single process" "no launcher environment: world size 1"
out=$(env -u RANK -u WORLD_SIZE "$RANKBIN" check 4194304 2>&1)
like "$out" "all collective checks passed" "world size 1: the collectives work"

# ---- correct and identical on every rank, every layout ----
for n in 2 3 4; do
    max=4194304
    [ $n = 2 ] && max=67108864
    run_ranks $n "$RANKBIN" check $max
    DESC="shared memory, world size $n: every collective correct, bit-identical (up to $max bytes)" ok all_ok $n
done
like "$(cat "$T/out.0")" "shared memory, 4 ranks on 1 host" "4 ranks share memory"

run_ranks 3 env MG_COMM=tcp "$RANKBIN" check 4194304
DESC="MG_COMM=tcp: the TCP ring, world size 3, correct" ok all_ok 3
like "$(cat "$T/out.1")" "tcp ring of 3 ranks" "MG_COMM=tcp forces the ring"

HOSTS="a a b b" run_ranks 4 "$RANKBIN" check 4194304
DESC="hierarchical (2 simulated hosts x 2 ranks): correct" ok all_ok 4
like "$(cat "$T/out.3")" "hierarchical, 4 ranks on 2 hosts" "ranks grouped by host"

HOSTS="a b a" run_ranks 3 "$RANKBIN" check 1048576
DESC="hierarchical with interleaved hosts (a b a): correct" ok all_ok 3

HOSTS="a b" run_ranks 2 "$RANKBIN" info
like "$(cat "$T/out.0")" "tcp ring of 2 ranks on 2 hosts" "one rank per host: the ring"

HOSTS="a b" run_ranks 2 env MG_COMM=shm "$RANKBIN" info
like "$(cat "$T/err.0" "$T/err.1")" "MG_COMM=shm needs every rank on one host" \
    "MG_COMM=shm across hosts is refused"

# ---- registered memory: zero-copy on one host, ordinary memory elsewhere ----
for n in 2 3; do
    max=16777216
    [ $n = 3 ] && max=4194304
    run_ranks $n "$RANKBIN" check-registered $max
    DESC="registered memory, world size $n: allreduces correct, same bits as ordinary memory, zero-copy above 64 KiB" \
        ok all_ok $n
done
run_ranks 2 env MG_COMM_ZEROCOPY=0 "$RANKBIN" check-registered 1048576
DESC="MG_COMM_ZEROCOPY=0: registered memory is ordinary memory, no zero-copy, correct" ok all_ok 2
like "$(cat "$T/out.0")" " 0 zero-copy" "MG_COMM_ZEROCOPY=0: nothing was zero-copy"
HOSTS="a a b b" run_ranks 4 "$RANKBIN" check-registered 1048576
DESC="hierarchical: registered memory is ordinary memory, correct" ok all_ok 4

is "$(shm_left)" 0 "no shared memory segment left in /dev/shm"

# ---- a rank killed mid-collective ----
start=$(date +%s)
run_ranks 3 env MG_COMM_TIMEOUT=60 "$RANKBIN" loop 1 300
took=$(($(date +%s) - start))
is "$(cat "$T/rc.1")" 137 "the victim was SIGKILLed"
for r in 0 2; do
    is "$(cat "$T/rc.$r")" 1 "rank $r fails when rank 1 dies"
    like "$(cat "$T/err.$r")" "comm_rank: rank $r: allreduce of 4194304 floats: .*rank 1 .*exited" \
        "rank $r's error names rank 1 and the operation"
done
diag "peers of the killed rank failed within ${took}s (collective timeout 60 s)"
DESC="the peers fail before the 60 s collective timeout" ok test "$took" -lt 50
msg=$(/usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
m = d["message"]
x = m["extraInfo"]
print(m["message"]); print(x["rank"], x["hostname"], int(x["timestamp"]) > 0, "py_callstack" in x)
' "$T/error.0.json" 2>&1)
like "$msg" "allreduce of 4194304 floats: .*rank 1 \(pid [0-9]+\) exited" \
    "error file: torchrun's message field"
like "$msg" "^0 $(hostname) True True" "error file: rank, hostname, timestamp, py_callstack"
ok test ! -e "$T/error.1.json"
is "$(shm_left)" 0 "no shared memory segment left after the kill"

run_ranks 3 env MG_COMM_TIMEOUT=60 "$RANKBIN" loop 1 300 --registered
is "$(cat "$T/rc.1")" 137 "zero-copy: the victim was SIGKILLed"
for r in 0 2; do
    like "$(cat "$T/err.$r")" "comm_rank: rank $r: allreduce of 4194304 floats: .*rank 1 .*exited" \
        "zero-copy: rank $r's error names rank 1 and the operation"
done
is "$(shm_left)" 0 "zero-copy: no shared memory left after the kill"

run_ranks 2 env MG_COMM=tcp MG_COMM_TIMEOUT=60 "$RANKBIN" loop 1 300
like "$(cat "$T/err.0")" "rank 1 closed its connection" "tcp: the peer of a killed rank names it"

# ---- a hung rank ----
run_ranks 3 env MG_COMM_TIMEOUT=1 "$RANKBIN" hang 2 3
for r in 0 1; do
    like "$(cat "$T/err.$r")" "allreduce of 1024 floats: .*timed out( after 1 s)? waiting for rank 2" \
        "rank $r times out naming the hung rank 2"
done

# ---- under mglaunch ----
if [ -x "$MGLAUNCH" ]; then
    for n in 1 4; do
        out=$("$MGLAUNCH" --nproc_per_node $n -t 3 "$RANKBIN" check 1048576 2>&1)
        is "$?" 0 "mglaunch --nproc_per_node $n: every collective correct"
        is "$(printf '%s\n' "$out" | grep -c 'all collective checks passed')" $n "all $n ranks say so"
    done
    out=$("$MGLAUNCH" --nproc_per_node 3 --log_dir "$T/ml" "$RANKBIN" loop 1 300 2>&1)
    is "$?" 137 "mglaunch: a rank SIGKILLed mid-collective fails the run with its exit code"
    like "$out" "rank 1 .*SIGKILL" "and the summary names rank 1 as the root cause"
else
    diag "mglaunch not built: skipping the runs under it"
fi

# ---- the environment is validated ----
check_env() { # DESC REGEX VAR=VALUE...
    d=$1
    re=$2
    shift 2
    out=$(env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$@" \
        MG_COMM_INIT_TIMEOUT=0.5 "$RANKBIN" info 2>&1)
    rc=$?
    is "$rc" 1 "$d: exits 1"
    like "$out" "$re" "$d: the message names it"
}
check_env "RANK not a number" "RANK='abc'" RANK=abc
check_env "RANK >= WORLD_SIZE" "RANK=5: must be below WORLD_SIZE=2" RANK=5
check_env "WORLD_SIZE 0" "WORLD_SIZE='0'" WORLD_SIZE=0
check_env "MASTER_PORT out of range" "MASTER_PORT='70000'" MASTER_PORT=70000
check_env "MASTER_ADDR empty" "MASTER_ADDR is not set" MASTER_ADDR=
check_env "LOCAL_RANK >= LOCAL_WORLD_SIZE" "LOCAL_RANK=2: must be below LOCAL_WORLD_SIZE=2" \
    WORLD_SIZE=4 LOCAL_RANK=2 LOCAL_WORLD_SIZE=2
check_env "TORCHELASTIC_RESTART_COUNT negative" "TORCHELASTIC_RESTART_COUNT='-1'" \
    TORCHELASTIC_RESTART_COUNT=-1
check_env "TORCHELASTIC_USE_AGENT_STORE=True" \
    "TORCHELASTIC_USE_AGENT_STORE=True.*mglaunch.*--rdzv_backend=c10d" TORCHELASTIC_USE_AGENT_STORE=True
check_env "TORCHELASTIC_USE_AGENT_STORE garbage" "TORCHELASTIC_USE_AGENT_STORE='maybe'" \
    TORCHELASTIC_USE_AGENT_STORE=maybe
check_env "MG_COMM unknown" "MG_COMM='fast'" MG_COMM=fast
check_env "MG_COMM_TIMEOUT bad" "MG_COMM_TIMEOUT='-3'" MG_COMM_TIMEOUT=-3
check_env "MG_COMM_SPIN_US bad" "MG_COMM_SPIN_US='fast'" MG_COMM_SPIN_US=fast
check_env "MG_COMM_TCP_SEGMENT bad" "MG_COMM_TCP_SEGMENT='12'" MG_COMM_TCP_SEGMENT=12
check_env "MG_COMM_ZEROCOPY bad" "MG_COMM_ZEROCOPY='2': expected 0 or 1" MG_COMM_ZEROCOPY=2
out=$(env -u WORLD_SIZE RANK=1 "$RANKBIN" info 2>&1)
like "$out" "RANK is set but WORLD_SIZE is not" "RANK without WORLD_SIZE"

# Rank 1 alone: rank 0 never hosts the store.
port=$(free_port)
out=$(env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MG_COMM_INIT_TIMEOUT=0.5 \
    TORCHELASTIC_ERROR_FILE="$T/lonely.json" "$RANKBIN" info 2>&1)
like "$out" "cannot connect to the store at 127.0.0.1:$port \(MASTER_ADDR:MASTER_PORT, hosted by rank 0\)" \
    "no rank 0: a clear error, after the init timeout"
ok test -s "$T/lonely.json"

done_testing
