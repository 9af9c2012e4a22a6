#!/bin/sh
# 128 client processes at once, each joining like a rendezvous agent: take a
# number, publish a key, wait for everyone's key. All succeed and see all.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/store_lib.sh"

N=128
start_store
all=$(seq -s, -f 'agent/%g' 0 $((N - 1)))
i=0
pids=""
while [ $i -lt $N ]; do
    "$HELPERS/storectl" "$ADDR" add joined 1 set "agent/$i" up wait 60000 "$all" \
        >"$T/agent.$i" 2>&1 &
    pids="$pids $!"
    i=$((i + 1))
done
fails=0
for p in $pids; do
    wait "$p" || fails=$((fails + 1))
done
is "$fails" 0 "all $N agents finished without error"
is "$(cat "$T"/agent.* | grep -c "wait ok $N")" "$N" "every agent saw all $N keys"
out=$(ctl get joined 0 list agent/ 0 2>&1)
is "$out" "get joined = $N
list agent/ total=$N" "the counter and the keys add up"
nums=$(cat "$T"/agent.* | sed -n 's/^add joined = //p' | sort -n | uniq | wc -l)
is "$nums" "$N" "every agent got a distinct number from add"
wait_stat clients 0 10
is "$(store_stat clients)" 0 "all connections closed"
done_testing
