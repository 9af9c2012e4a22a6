#!/bin/sh
# Token authentication: the right token works; a wrong or missing token is
# refused with a clear error and the client dropped; a raw client sending a
# wrong proof is answered AUTH and closed; the token never crosses the wire;
# a server that cannot prove it holds the token is refused by the client
# (mutual authentication); the server keeps serving through all of it.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/store_lib.sh"

TOKEN=correct-horse-battery-staple
start_store --token "$TOKEN" --handshake-timeout 1000

out=$("$HELPERS/storectl" --token "$TOKEN" "$ADDR" set k v get k 0 2>&1)
is "$out" "set k ok
get k = v" "the right token: set and get work"

out=$("$HELPERS/storectl" --token wrong "$ADDR" ping 2>&1)
is "$?" 1 "a wrong token fails"
like "$out" "cannot connect to '$ADDR': authentication failed" "with a clear message"
out=$("$HELPERS/storectl" "$ADDR" ping 2>&1)
like "$out" "authentication failed" "no token against a server that wants one: refused"

out=$("$HELPERS/storeraw" "$ADDR" hello 1 0 1 auth not-the-token expect-eof 3000 2>&1)
like "$out" "shello version=1 status=0 auth=1" "raw: the server asks for a proof"
like "$out" "auth status=11 server=bad" "raw: a wrong proof is answered AUTH, with no server proof"
like "$out" "eof after" "raw: and the connection is closed"
out=$("$HELPERS/storeraw" "$ADDR" hello 1 0 0 expect-eof 3000 2>&1)
like "$out" "shello version=1 status=11 auth=1" "raw: a hello without a token is answered AUTH"
like "$out" "eof after" "raw: and closed"
out=$("$HELPERS/storeraw" "$ADDR" hello 1 0 1 auth "$TOKEN" set r 1 2>&1)
like "$out" "auth status=0 server=ok" "raw: the right proof is accepted, the server proves itself"
like "$out" "reply op=set status=0" "raw: then requests work"
out=$("$HELPERS/storeraw" "$ADDR" hello 1 0 1 send 0c000000 expect-eof 5000 2>&1)
like "$out" "eof after" "raw: a half-sent proof is dropped at the handshake deadline"

wait_stat clients 0 5
is "$(store_stat clients)" 0 "every rejected client is gone"
dropped=$(store_stat dropped)
ok test "$dropped" -ge 5
out=$("$HELPERS/storectl" --token "$TOKEN" "$ADDR" get k 0 2>&1)
is "$out" "get k = v" "the server still serves with the right token"

# The token never crosses the wire: a fake server records what a client sends.
rm -f "$T/fport"
bg "$HELPERS/storeraw" --listen "$T/fport" --token "$TOKEN" --dump "$T/wire"
fake=$!
wait_for 5 test -s "$T/fport"
"$HELPERS/storectl" --token "$TOKEN" --connect-timeout 2000 "127.0.0.1:$(cat "$T/fport")" \
    >/dev/null 2>&1
is "$?" 0 "a client authenticates against a server that holds the token"
wait $fake
ok test -s "$T/wire"
if grep -aq "$TOKEN" "$T/wire"; then
    is "found" "absent" "the token is not in the bytes the client sent"
else
    is "absent" "absent" "the token is not in the bytes the client sent"
fi
wire=$(od -An -tx1 -N6 "$T/wire" | tr -d ' \n')
is "$wire" "4d4753540100" "the client's bytes start with the magic and version 1"

# Mutual authentication: a server that does not hold the token is refused.
rm -f "$T/fport"
bg "$HELPERS/storeraw" --listen "$T/fport" --token impostor
wait_for 5 test -s "$T/fport"
out=$("$HELPERS/storectl" --token "$TOKEN" --connect-timeout 2000 "127.0.0.1:$(cat "$T/fport")" \
    2>&1)
like "$out" "authentication failed" "a server that cannot prove the token is refused"
rm -f "$T/fport"
bg "$HELPERS/storeraw" --listen "$T/fport"
wait_for 5 test -s "$T/fport"
out=$("$HELPERS/storectl" --token "$TOKEN" --connect-timeout 2000 "127.0.0.1:$(cat "$T/fport")" \
    2>&1)
like "$out" "authentication failed" "a server that asks for no token is refused by a client that has one"
done_testing
