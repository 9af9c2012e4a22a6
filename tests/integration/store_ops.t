#!/bin/sh
# Every store call through the real server process, in the launcher's mode (its
# own poll loop with a signalfd) and in the runtime's mode (a server thread):
# blocking get, wait and watch are woken by another client, and time out.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/store_lib.sh"

for mode in loop thread; do
    if [ $mode = thread ]; then start_store --thread; else start_store; fi
    out=$(ctl set a 1 get a 0 add n 5 add n -2 cas c - x cas c x y cas c x z del a del a \
        check n,c check n,a list "" 10 2>&1)
    is "$out" "set a ok
get a = 1
add n = 5
add n = 3
cas c swapped, now x
cas c swapped, now y
cas c kept, now y
del a existed
del a absent
check all
check missing
list  total=2
c
n" "$mode: every call answers as documented"

    out=$(ctl get nokey 0 2>&1)
    like "$out" "no such key" "$mode: get without waiting on a missing key"
    out=$(ctl get nokey 100 2>&1)
    like "$out" "timed out" "$mode: get with a wait times out"

    # A blocked get woken by another client.
    ctl get late 10000 >"$T/late.out" 2>&1 &
    waiter=$!
    wait_stat waiters 1 5
    is "$(store_stat waiters)" 1 "$mode: the get is parked on the server"
    ctl set late here >/dev/null
    wait $waiter
    is "$?" 0 "$mode: the parked get returns"
    is "$(cat "$T/late.out")" "get late = here" "$mode: with the value set by the other client"

    # wait on several keys
    ctl wait 10000 k1,k2 >"$T/wait.out" 2>&1 &
    waiter=$!
    ctl set k1 1 >/dev/null
    sleep 0.1
    ctl set k2 2 >/dev/null
    wait $waiter
    is "$(cat "$T/wait.out")" "wait ok 2" "$mode: wait returns once both keys exist"

    # watch: wakes on a change, times out without one
    rev=$(ctl watch late -1 0 | sed 's/.*rev=\([0-9]*\).*/\1/')
    out=$(ctl watch late "$rev" 200 2>&1)
    like "$out" "timed out" "$mode: watch without a change times out"
    ctl watch late "$rev" 10000 >"$T/watch.out" 2>&1 &
    waiter=$!
    wait_stat waiters 1 5
    ctl set late again >/dev/null
    wait $waiter
    like "$(cat "$T/watch.out")" "watch late rev=[0-9]+ value=again" "$mode: watch wakes on a set"
    rev=$(sed 's/.*rev=\([0-9]*\).*/\1/' "$T/watch.out")
    ctl watch late "$rev" 10000 >"$T/watch.out" 2>&1 &
    waiter=$!
    wait_stat waiters 1 5
    ctl del late >/dev/null
    wait $waiter
    like "$(cat "$T/watch.out")" "watch late rev=[0-9]+ absent" "$mode: watch wakes on a delete"

    is "$(store_stat waiters)" 0 "$mode: nothing left parked"
    kill -TERM "$SRV_PID"
    wait "$SRV_PID"
    is "$?" 0 "$mode: server exits cleanly on SIGTERM"
done
done_testing
