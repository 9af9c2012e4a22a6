#!/bin/sh
# Say what you wait for: a worker waiting for the store (MASTER_ADDR) or for a
# peer, and an agent waiting for the rendezvous store or etcd, say within a
# few seconds what they wait for and why, in the resolver's or the kernel's
# words, and the final error says the same: an unresolvable MASTER_ADDR is
# never "No such file or directory". (A name server that is slow or out of
# reach answers "Temporary failure in name resolution" instead of "Name or
# service not known": either is the resolver's word, and either is accepted.)
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset MG_STORE_TOKEN MG_RDZV_TOKEN

# rank R of W, alone, MASTER_ADDR $1, MASTER_PORT $2; stderr in $T/err
rank() {
    RANK=$3 WORLD_SIZE=$4 LOCAL_RANK=$3 LOCAL_WORLD_SIZE=$4 MASTER_ADDR=$1 MASTER_PORT=$2 \
        MG_COMM_INIT_TIMEOUT=6 "$TRAIN" --data synthetic --steps 1 >/dev/null 2>"$T/err"
}

P=$(free_port)
rank no-such-host.invalid "$P" 1 2
is $? 1 "an unresolvable MASTER_ADDR: rank 1 fails at the init timeout"
like "$(head -n 1 "$T/err")" "^train: rank 1: waiting for the store at no-such-host.invalid:$P \(MASTER_ADDR:MASTER_PORT, hosted by rank 0\): the name does not resolve( for now)? \((Name or service not known|Temporary failure in name resolution)\); 3 s so far, giving up in [0-9]+ s" \
    "it says what it waits for and why before the timeout"
like "$(tail -n 1 "$T/err")" "cannot connect to the store at no-such-host.invalid:$P .*: the name does not resolve" \
    "and the error says the name does not resolve"
unlike "$(cat "$T/err")" "No such file or directory" "never 'No such file or directory'"

rank 127.0.0.1 "$P" 1 2
like "$(head -n 1 "$T/err")" "waiting for the store at 127.0.0.1:$P .*: connection refused \(nothing listens there" \
    "nothing listening: connection refused, said while waiting"

rank 127.0.0.1 "$P" 0 2
like "$(head -n 1 "$T/err")" "^train: rank 0: waiting for rank 1 to join the communicator: [0-9]+ s so far, giving up in [0-9]+ s" \
    "rank 0 says which peer it waits for"
like "$(tail -n 1 "$T/err")" "waiting for rank 1 to join the communicator: timed out" "and names it at the end"

# The launcher: a c10d endpoint that does not resolve, etcd that does not answer.
out=$("$MGLAUNCH" --nnodes 2 --rdzv_backend c10d --rdzv_endpoint "no-such-host.invalid:$P" \
    --rdzv_id w --rdzv_conf join_timeout=4 "$HELPERS/fakeworker" 2>&1)
like "$out" "mglaunch: rendezvous: waiting for the backend: store no-such-host.invalid:$P: cannot connect: the name does not resolve( for now)? \((Name or service not known|Temporary failure in name resolution)\); retrying until join_timeout \([0-9]+ s left\)" \
    "an agent says why it cannot reach the rendezvous store while it retries"
# A program that is not a store holds the endpoint's port: it accepts, and never answers.
Q=$(free_port)
bg /usr/bin/python3 -c "import socket, time
s = socket.socket(); s.bind(('127.0.0.1', $Q)); s.listen(); open('$T/held', 'w').close(); time.sleep(60)"
wait_for 10 test -e "$T/held"
out=$("$MGLAUNCH" --nnodes 2 --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$Q" \
    --rdzv_id w --rdzv_conf join_timeout=4 "$HELPERS/fakeworker" 2>&1)
like "$out" "store 127.0.0.1:$Q: cannot connect: no store answers there \(the connection opened, but nothing answered the store's hello: a store too busy, or another program listening on that port\)" \
    "a port held by a program that is not a store: said so, not 'Connection timed out'"
out=$("$MGLAUNCH" --nnodes 2 --rdzv_backend etcd --rdzv_endpoint "127.0.0.1:$P" \
    --rdzv_id w --rdzv_conf join_timeout=4 "$HELPERS/fakeworker" 2>&1)
if printf '%s' "$out" | grep -q "libcurl"; then
    diag "no libcurl: $out"
    DESC="# SKIP the etcd backend needs libcurl" ok true
else
    like "$out" "mglaunch: rendezvous: waiting for the backend: etcd .*127.0.0.1:$P.*onnect.*; retrying until join_timeout" \
        "and why it cannot reach etcd"
fi

done_testing
