#!/bin/sh
# Ephemeral keys belong to their connection: they vanish when it closes
# cleanly, when its process is SIGKILLed, and when it stops sending past its
# lease while keeping the socket open (a hung agent). Watchers wake on each.
# A client that pings in time keeps its keys.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/store_lib.sh"

start_store
rev_of() { ctl watch "$1" -1 0 | sed 's/.*rev=\([0-9]*\).*/\1/'; }

out=$(ctl seteph eph/a 1 get eph/a 0 2>&1)
is "$out" "seteph eph/a ok
get eph/a = 1" "an ephemeral key exists while its owner is connected"
out=$(ctl get eph/a 0 2>&1)
like "$out" "no such key" "and is gone once the owner disconnected"

bg "$HELPERS/storectl" "$ADDR" seteph eph/b 1 hold 30000 >/dev/null
holder=$!
ctl get eph/b 5000 >/dev/null
rev=$(rev_of eph/b)
kill -KILL $holder
out=$(ctl watch eph/b "$rev" 5000 2>&1)
like "$out" "watch eph/b rev=[0-9]+ absent" "owner SIGKILLed: the watcher sees the key deleted"

# A hung owner: connected, with a 300 ms lease, silent.
"$HELPERS/storeraw" "$ADDR" hello 1 300 set eph/c 1 eph expect-eof 10000 >"$T/hung.out" 2>&1 &
hung=$!
ctl get eph/c 5000 >/dev/null
# On a loaded machine the lease may already have run out by now.
out=$(ctl watch eph/c -1 0 2>&1)
case $out in
*absent) ;;
*) out=$(ctl watch eph/c "$(echo "$out" | sed 's/.*rev=\([0-9]*\).*/\1/')" 5000 2>&1) ;;
esac
like "$out" "watch eph/c rev=[0-9]+ absent" "silent past its lease: the key is deleted"
wait $hung
like "$(cat "$T/hung.out")" "eof after" "and the silent connection is closed by the server"
DESC="the server counted the expired lease" ok test "$(store_stat leases_expired)" -ge 1

# A live owner pings in time and keeps its key for several leases. (A lease
# of 1 s, so that a loaded machine does not starve the client past it.)
expired=$(store_stat leases_expired)
bg "$HELPERS/storectl" --lease 1000 "$ADDR" seteph eph/d 1 hold 4000 >/dev/null
live=$!
ctl get eph/d 5000 >/dev/null
sleep 2.5
out=$(ctl get eph/d 0 2>&1)
is "$out" "get eph/d = 1" "a client pinging in time keeps its key past two leases"
[ "$out" = "get eph/d = 1" ] ||
    diag "leases expired before: $expired, now: $(store_stat leases_expired)"
wait $live
is "$?" 0 "the pinging client never lost its connection"
out=$(ctl get eph/d 0 2>&1)
like "$out" "no such key" "and its key goes with it"

# A plain set takes an ephemeral key over.
bg "$HELPERS/storectl" "$ADDR" seteph eph/g 1 hold 30000 >/dev/null
holder=$!
ctl get eph/g 5000 >/dev/null
ctl set eph/g 2 >/dev/null
kill -KILL $holder
wait_stat clients 0 5
out=$(ctl get eph/g 0 2>&1)
is "$out" "get eph/g = 2" "a key set again without the flag survives its first owner"
done_testing
