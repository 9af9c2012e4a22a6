#!/bin/sh
# A closed store by default (docs/rendezvous.md, Security; docs/environment.md,
# MG_STORE_TOKEN): a single-node job's workers get a fresh token, so nobody
# else gets into rank 0's store; the rendezvous store of a loopback endpoint
# listens on loopback only, with limits sized for the rendezvous (one client
# cannot make the supervising mglaunch grow, a 64 KiB value is refused); with
# a token an outsider's SET cannot touch the job; a store that other machines
# can reach without a token says so, once.
# timeout: 180
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
FW=$HELPERS/fakeworker
HB="heartbeat_interval=0.2,heartbeat_timeout=2"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset MG_STORE_TOKEN MG_RDZV_TOKEN

# token_of DIR RANK: the MG_STORE_TOKEN a worker printed (print-env) in its log
token_of() { sed -n 's/^MG_STORE_TOKEN=//p' "$1"/*/attempt_"${3:-0}"/"$2"/stdout.log 2>/dev/null; }

# two_nodes ID LOGA LOGB: a 2-node job on a fresh loopback endpoint ($EP), its
# workers staying until $T/go exists; the launchers' pids in $A and $B.
two_nodes() {
    P=$(free_port)
    EP="127.0.0.1:$P"
    C="--nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint $EP --monitor_interval 0.1"
    bg "$MGLAUNCH" $C --rdzv_id "$1" --rdzv_conf "$HB" --log_dir "$T/$2" "$FW" print-env wait-file "$T/go" \
        >"$T/a.out" 2>"$T/a.err"
    A=$!
    bg "$MGLAUNCH" $C --rdzv_id "$1" --rdzv_conf "$HB" --log_dir "$T/$3" "$FW" print-env wait-file "$T/go" \
        >"$T/b.out" 2>"$T/b.err"
    B=$!
}
# nodes_done: lets two_nodes' workers go; the launchers' exit codes in $nodes_rc
nodes_done() {
    touch "$T/go"
    wait "$A"
    nodes_rc="$?"
    wait "$B"
    nodes_rc="$nodes_rc $?"
}

# ---- one node: the workers' token ----------------------------------------------------
"$MGLAUNCH" --nproc_per_node 2 --max_restarts 1 --monitor_interval 0.1 --log_dir "$T/l1" \
    "$FW" print-env if restart=0,local_rank=1 sleep 0.5 if restart=0,local_rank=1 exit 3 \
    >/dev/null 2>&1
t0=$(token_of "$T/l1" 0) t1=$(token_of "$T/l1" 1) t2=$(token_of "$T/l1" 0 1)
like "$t0" '^[0-9a-f]{64}$' "a single-node job's workers get MG_STORE_TOKEN, 256 random bits"
is "$t1" "$t0" "the same for every worker of the attempt"
DESC="a restart draws a fresh one" ok test -n "$t2" -a "$t2" != "$t0"
MG_STORE_TOKEN=mine "$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/l2" "$FW" print-env >/dev/null 2>&1
is "$(token_of "$T/l2" 1)" mine "an inherited MG_STORE_TOKEN is kept"

# Rank 0's store lets in only the job's ranks.
MP=$(free_port)
bg "$MGLAUNCH" --nproc_per_node 2 --master_port "$MP" --log_dir "$T/l3" \
    "$TRAIN" --data synthetic --steps 1000000 --log-every 1000000 >"$T/t.out" 2>"$T/t.err"
JOB=$!
DESC="a 2-rank train is up" ok wait_for 60 sh -c "grep -qs 'processes, cpu' $T/l3/*/attempt_0/0/stdout.log"
out=$("$HELPERS/storectl" --connect-timeout 2000 "127.0.0.1:$MP" set /x 1 2>&1)
like "$out" "cannot connect.*authentication failed" \
    "an outsider without the token cannot get into rank 0's store"
out=$("$HELPERS/storectl" --token guess --connect-timeout 2000 "127.0.0.1:$MP" set /x 1 2>&1)
like "$out" "cannot connect.*authentication failed" "nor with a wrong token"
kill -TERM "$JOB"
wait "$JOB"
unlike "$(cat "$T/t.err" "$T/l3"/*/attempt_0/0/stderr.log)" "warning: rank 0's store" \
    "rank 0's store on loopback with a token: no warning"

# ---- several nodes on a loopback endpoint ---------------------------------------------
two_nodes lo la lb
DESC="the 2-node job forms" ok wait_for 30 sh -c "grep -qs '^RANK=' $T/la/*/attempt_0/0/stdout.log"
is "$(ss -Hltn "sport = :$P" | awk '{print $4}' | sort -u | tr '\n' ' ')" "127.0.0.1:$P " \
    "the rendezvous store of a loopback endpoint listens on 127.0.0.1 only"
is "$(ss -Htn state established "( dport = :$P or sport = :$P )" | wc -l | tr -d ' ')" 2 \
    "(one agent hosts it, the other is its client)"

# One client, no token needed on loopback: it cannot make the hosting agent
# grow. (Which agent hosts is whichever bound the port first.)
peak() { awk '/^VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
hostpid=$(ss -Hltnp "sport = :$P" | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -n 1)
DESC="the hosting mglaunch is found ($hostpid)" ok test -n "$hostpid"
before=$(peak "$hostpid")
i=0 raw=""
while [ $i -lt 16 ]; do
    "$HELPERS/storeraw" "$EP" hello frame 2 16777000 garbage 16777000 sleep 1000 >/dev/null 2>&1 &
    raw="$raw $!"
    i=$((i + 1))
done
for pid in $raw; do wait "$pid"; done
after=$(peak "$hostpid")
diag "hosting mglaunch: peak RSS ${before} kB before 16 clients sending 16 MiB frames, ${after} kB after"
DESC="16 clients sending 16 MiB SETs grow the hosting mglaunch by less than 16 MiB" \
    ok test $((after - before)) -lt 16384
out=$("$HELPERS/storeraw" "$EP" hello frame 2 16777000 reply expect-eof 5000 2>&1)
like "$out" "reply op=error status=3" "a 16 MiB SET frame is refused from its header (TOOBIG)"
big=$(head -c 65536 /dev/zero | tr '\0' x)
out=$("$HELPERS/storectl" "$EP" set /outsider "$big" 2>&1)
like "$out" "length over limit" "a 64 KiB value is over the rendezvous store's bound"
nodes_done
is "$nodes_rc" "0 0" "the job was not disturbed"
unlike "$(cat "$T/a.err" "$T/b.err")" "warning: the rendezvous store" \
    "a loopback store without a token: no warning (nobody else can reach it)"

# With a token, an outsider's SET of a rendezvous key cannot end the job.
export MG_RDZV_TOKEN=s3cret
rm -f "$T/go"
two_nodes tk ta tb
unset MG_RDZV_TOKEN
DESC="the 2-node job with a token forms" ok wait_for 30 sh -c "grep -qs '^RANK=' $T/ta/*/attempt_0/0/stdout.log"
out=$("$HELPERS/storectl" --connect-timeout 2000 "$EP" set /mg/rdzv/tk/state "0 0 f 0" 2>&1)
like "$out" "authentication failed" "an outsider's SET of the rendezvous state is refused"
out=$("$HELPERS/storeraw" "$EP" hello 2>&1)
like "$out" "status=11" "a raw hello without a token: AUTH"
nodes_done
is "$nodes_rc" "0 0" "the job with a token finishes as if nobody had tried"
ta=$(token_of "$T/ta" 0) tb=$(token_of "$T/tb" 0)
like "$ta" '^[0-9a-f]{64}$' "its workers get MG_STORE_TOKEN derived from the rendezvous token"
is "$tb" "$ta" "the same on both nodes"
DESC="and not the rendezvous token itself" ok test "$ta" != s3cret

# ---- a store other machines can reach ------------------------------------------------
hosts_up 2
if [ "$HOSTS_MODE" = netns ]; then
    EP="$(host_addr 0):29400"
    C="--nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint $EP --monitor_interval 0.1"
    bg_on 0 "$MGLAUNCH" $C --rdzv_id op --rdzv_conf "$HB" --log_dir "$T/na" "$FW" sleep 2 \
        >"$T/a.out" 2>"$T/a.err"
    A=$!
    bg_on 1 "$MGLAUNCH" $C --rdzv_id op --rdzv_conf "$HB" --log_dir "$T/nb" "$FW" sleep 2 \
        >"$T/b.out" 2>"$T/b.err"
    B=$!
    DESC="the job across two hosts forms" ok wait_for 30 sh -c "ls $T/nb/*/attempt_0/0/stdout.log >/dev/null"
    is "$(on 0 ss -Hltn "sport = :29400" | awk '{print $4}' | tr '\n' ' ')" "$EP " \
        "the store listens on the endpoint's address, not every interface"
    wait "$A"
    wait "$B"
    is "$(grep -c 'warning: the rendezvous store listens on' "$T/a.err")" 1 \
        "without a token, the agent hosting a reachable store warns once"
    like "$(cat "$T/a.err")" "listens on $(host_addr 0) port 29400 without a token: anyone who can reach that port can end the job.*MG_RDZV_TOKEN" \
        "saying what is at stake and what to do"
    MG_RDZV_TOKEN=x bg_on 0 "$MGLAUNCH" $C --rdzv_id op2 --rdzv_conf "$HB" --log_dir "$T/na" \
        "$FW" >"$T/a.out" 2>"$T/a.err"
    A=$!
    MG_RDZV_TOKEN=x bg_on 1 "$MGLAUNCH" $C --rdzv_id op2 --rdzv_conf "$HB" --log_dir "$T/nb" \
        "$FW" >"$T/b.out" 2>"$T/b.err"
    B=$!
    wait "$A"
    wait "$B"
    unlike "$(cat "$T/a.err")" "warning: the rendezvous store" "with a token: no warning"
else
    diag "no network namespaces: the reachable-store checks need an address that is not loopback"
fi

done_testing
