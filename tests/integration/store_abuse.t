#!/bin/sh
# Garbage, oversized lengths, malformed bodies, wrong versions and a flood of
# half-open connections, all while a well-behaved client runs set/get/add with
# checks: the bad connections are dropped (or answered an error), the good
# client never sees an error, and the server keeps serving.
# timeout: 90
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/store_lib.sh"

start_store
RAW="$HELPERS/storeraw $ADDR"

bg "$HELPERS/storectl" "$ADDR" stress 4 >/dev/null
good=$!
wait_stat clients 1 5

out=$($RAW garbage 100000 expect-eof 5000 2>&1)
like "$out" "eof after" "garbage instead of a hello: dropped"
out=$($RAW hello garbage 200000 expect-eof 5000 2>&1)
like "$out" "eof after" "garbage after the handshake: dropped"
out=$($RAW hello frame 2 0xffffffff reply expect-eof 5000 2>&1)
like "$out" "reply op=error status=3" "a 4 GiB frame length is answered TOOBIG"
like "$out" "eof after" "and the connection closed, nothing allocated"
out=$($RAW hello frame 5 0x7fffffff expect-eof 5000 2>&1)
like "$out" "eof after" "a 2 GiB compare_set: dropped"
out=$($RAW hello frame 1 1 expect-eof 5000 2>&1)
like "$out" "eof after" "a ping with a body: over its bound, dropped"
out=$($RAW hello frame 0x42 10 send 00112233445566778899 reply expect-open 300 set after-unknown 1 2>&1)
like "$out" "reply op=unknown status=7" "an unknown opcode is answered UNSUPPORTED"
like "$out" "reply op=set status=0" "and the connection keeps working"
# SET with a key length (0x0400) pointing past the end of its 8-byte body.
out=$($RAW hello send 08000000020000000900000000046b6b6b6b6b6b reply set after-bad 1 2>&1)
like "$out" "reply op=set status=6" "a malformed body is answered PROTO"
like "$out" "reply op=set status=0" "and the connection keeps working"
# SET with a NUL inside the key
out=$($RAW hello send 090000000200000003000000030061006200000000 reply 2>&1)
like "$out" "reply op=set status=8" "a NUL inside a key is answered INVAL"
out=$($RAW hello 2 expect-eof 5000 2>&1)
like "$out" "shello version=1 status=10" "protocol version 2 is answered VERSION with the server's version"
like "$out" "eof after" "then closed"
out=$($RAW hello 1 999999999 expect-eof 5000 2>&1)
like "$out" "shello version=1 status=8" "a lease over the bound is answered INVAL"
out=$($RAW flood 300 500 2>&1)
like "$out" "flood 300" "300 half-open connections held at once"
out=$($RAW flood 200 0 2>&1)
like "$out" "flood 200" "200 connect-and-close in a row"

wait $good
is "$?" 0 "the well-behaved client saw no error during all of it"
out=$(ctl get stress-count 0 2>&1)
like "$out" "get stress-count = [0-9]+" "its work is in the store"
out=$(ctl set k v get k 0 2>&1)
is "$out" "set k ok
get k = v" "the server still serves new clients"
wait_stat clients 0 10
is "$(store_stat clients)" 0 "every bad connection is gone"
is "$(store_stat buffer_bytes)" 0 "no input buffer left behind"
dropped=$(store_stat dropped)
DESC="the server counted the drops ($dropped)" ok test "$dropped" -ge 8
kill -0 "$SRV_PID"
is "$?" 0 "server process alive"
done_testing
