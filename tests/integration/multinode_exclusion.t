#!/bin/sh
# Node exclusion (docs/rendezvous.md#node-exclusion): three agents, c10d,
# --nnodes 2:3, --rdzv_conf exclude_after=3,exclude_window=60,exclude_cooldown=2.
# Node c's worker fails on its first three attempts. After the third, c sits
# out: a and b go on as a group of 2, and after the cooldown c joins again,
# the group is 3 once more, and everyone ends with 0. With --nnodes 3:3 the
# job cannot do without c: it stays, and says so.
# timeout: 180
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"

hosts_up 3
c10d_endpoint
export T
cat >"$T/w.sh" <<'EOF2'
#!/bin/sh
# w.sh NAME: one line per attempt; c fails its first three; the others run
# until $T/stop (20 s at most).
n=$1
cnt=$(($(cat "$T/$n.count" 2>/dev/null || echo 0) + 1))
echo "$cnt" >"$T/$n.count"
echo "env node=$n attempt=$cnt group_rank=$GROUP_RANK group_world=$GROUP_WORLD_SIZE restart=$TORCHELASTIC_RESTART_COUNT"
if [ "$n" = c ] && [ "$cnt" -le 3 ]; then
    sleep 0.3
    exit 1
fi
i=0
while [ ! -e "$T/stop" ] && [ $i -lt 400 ]; do
    sleep 0.05
    i=$((i + 1))
done
exit 0
EOF2
chmod +x "$T/w.sh"

# run NNODES ID [COOLDOWN]: the three agents
run() {
    for n in a b c; do
        case $n in a) i=0 ;; b) i=1 ;; c) i=2 ;; esac
        conf="$MN_HB,last_call_timeout=1,exclude_after=3,exclude_window=60,exclude_cooldown=${3:-2}"
        if [ "$HOSTS_MODE" = loopback ]; then
            [ $i = 0 ] && conf="$conf$HOST0" || conf="$conf$OTHER"
        fi
        node $i $n --nnodes "$1" --nproc_per_node 1 --max_restarts 5 --rdzv_backend c10d \
            --rdzv_endpoint "$EP" --rdzv_id "$2" --rdzv_conf "$conf" --no_python "$T/w.sh" $n
        [ $i = 0 ] && sleep 0.3
    done
}
seen() { grep -q "$2" "$T/$1.out" 2>/dev/null; }

run 2:3 excl
wait_for 60 seen a "group_world=2" || diag "a never ran in a group of 2"
wait_for 60 seen c "attempt=4 .*group_world=3" || diag "c never came back"
touch "$T/stop"
check_exits "node exclusion: every agent ends with 0" "0 0 0" a b c
like "$(cat "$T/c.err")" "node exclusion: 3 failures of this node's workers within [0-9]+ s \\(--rdzv_conf exclude_after=3\\); the other 2 nodes go on without it, and it joins again in 2 s" \
    "c says it sits out, and for how long"
like "$(cat "$T/c.err")" "node exclusion: the cooldown is over; joining the job again" "  then comes back"
like "$(grep -h '^env' "$T/a.out")" "group_world=2" "a and b ran as a group of 2 meanwhile"
like "$(grep -h '^env' "$T/c.out" | tail -n 1)" "attempt=4 .*group_world=3" \
    "c's next attempt is in a group of 3 again"
is "$(grep -c '^env' "$T/c.out")" 4 "c ran 4 attempts: 3 failed, then the one after its cooldown"

# --nnodes 3:3: without c the job is below its minimum: c stays.
rm -f "$T"/*.count "$T/stop"
run 3:3 stay
wait_for 60 seen c "attempt=4" || diag "c's fourth attempt never came"
touch "$T/stop"
check_exits "--nnodes 3:3: every agent ends with 0" "0 0 0" a b c
like "$(cat "$T/c.err")" "node exclusion: 3 failures .* but the job would fall below --nnodes 3 without it \\(3 nodes now\\): staying" \
    "c stays, and says why"
unlike "$(grep -h '^env' "$T/a.out")" "group_world=2" "  the group was never smaller"

# The job ends while c sits out: c's part is over too, and it ends with 0.
rm -f "$T"/*.count "$T/stop"
run 2:3 early 3
wait_for 60 seen a "group_world=2" || diag "a never ran in a group of 2"
touch "$T/stop"
check_exits "the job ends while c sits out: every agent ends with 0" "0 0 0" a b c
like "$(cat "$T/c.err")" "node exclusion: the job finished while this node sat out; nothing left to do" \
    "  c says so"

done_testing
