#!/bin/sh
# Stalled peers are dropped: a connection that says nothing, a hello cut
# short, a frame header whose body never comes, half a frame. A connected
# client that is merely idle (no lease) is kept, and the server keeps serving.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/store_lib.sh"

start_store --handshake-timeout 500 --frame-timeout 500
RAW="$HELPERS/storeraw $ADDR"

bg $RAW hello expect-open 2500 >/dev/null
idle=$!

out=$($RAW expect-eof 5000 2>&1)
like "$out" "eof after" "a connection that never says hello: dropped at the handshake deadline"
out=$($RAW send 4d4753540100 expect-eof 5000 2>&1)
like "$out" "eof after" "a hello cut short: dropped"
out=$($RAW hello frame 2 5000 expect-eof 5000 2>&1)
like "$out" "eof after" "a frame header whose body never comes: dropped at the frame deadline"
out=$($RAW hello half-set expect-eof 5000 2>&1)
like "$out" "eof after" "half a SET frame: dropped"
out=$($RAW hello send 0c00 expect-eof 5000 2>&1)
like "$out" "eof after" "half a frame header: dropped"

out=$(ctl ping 2>&1)
is "$out" "ping ok" "the server still serves"
wait $idle
is "$?" 0 "an idle client without a lease is kept"
wait_stat clients 0 5
is "$(store_stat clients)" 0 "no connection left"
is "$(store_stat buffer_bytes)" 0 "no buffer left"
done_testing
