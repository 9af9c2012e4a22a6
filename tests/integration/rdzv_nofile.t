#!/bin/sh
# The open-file limit of the agent that hosts the c10d store: it takes a
# descriptor per connection (2 per node of --nnodes MAX, and spares), so
# mglaunch raises its soft RLIMIT_NOFILE to what that needs when the hard
# limit allows (its workers get the limit it was given back), and when the hard limit is lower it
# says once which limit, what it needs and how to raise it, and runs the job
# the limit allows (docs/rendezvous.md, Beyond 1,000 nodes). Real limits, set
# with ulimit in the shell that starts mglaunch.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset MG_RDZV_TOKEN

# run SOFT HARD NNODES: one agent on loopback hosting the store for --nnodes
# 1:NNODES; its worker prints its own soft limit and the agent's (its parent).
# HARD above this shell's hard limit: the case is skipped (only root raises it).
HARD=$(ulimit -Hn)
can() { [ "$HARD" = unlimited ] || [ "$HARD" -ge "$1" ]; }
run() {
    port=$("$HELPERS/freeport")
    (
        ulimit -Sn "$1" && ulimit -Hn "$2" || exit 99
        exec "$MGLAUNCH" --nnodes "1:$3" --nproc_per_node 1 --rdzv_backend c10d \
            --rdzv_endpoint "127.0.0.1:$port" --rdzv_id nofile \
            --rdzv_conf last_call_timeout=1,join_timeout=20 \
            sh -c 'echo "nofile=$(ulimit -Sn) agent=$(awk "/^Max open files/ {print \$4}" /proc/$PPID/limits)"'
    ) >"$T/out" 2>"$T/err"
    echo $?
}

# 300 nodes need 2 x 300 + 32 connections and 256 more: 888.
if can 4096; then
    rc=$(run 64 4096 300)
    is "$rc" 0 "soft limit 64, hard 4096, --nnodes 1:300: the job runs"
    like "$(cat "$T/out")" "agent=888" "the agent's soft limit was raised to the 888 the store needs"
    like "$(cat "$T/out")" "nofile=64 " "  its worker has the 64 it was given back"
    unlike "$(cat "$T/err")" "RLIMIT_NOFILE" "no warning when the hard limit allows it"
else
    diag "SKIP: the hard open-file limit here is $HARD, below the 4096 this case sets"
fi

rc=$(run 64 200 300)
is "$rc" 0 "hard limit 200, --nnodes 1:300: the job the limit allows still runs"
like "$(cat "$T/out")" "agent=200" "the soft limit was raised as far as the hard one"
like "$(cat "$T/err")" "mglaunch: .*warning: the rendezvous store takes up to 632 connections .2 per node of --nnodes 300, and spares., an open file each, 888 in all with this agent's own, but this process may open only 200 .RLIMIT_NOFILE, hard limit 200.: the store can then serve about 50 nodes" \
    "one line says which limit, what the store needs and what it can serve"
like "$(cat "$T/err")" "Raise the hard limit .it takes privilege. before mglaunch starts: \`ulimit -n 888\` as root in its shell, LimitNOFILE=888 in its systemd unit" \
    "and what to do"
is "$(grep -c RLIMIT_NOFILE "$T/err")" 1 "said once"

rc=$(run 64 400 8)
unlike "$(cat "$T/err")" "RLIMIT_NOFILE" "a small job under a low limit: nothing to say"
is "$rc" 0 "and it runs"

done_testing
