#!/bin/sh
# mglaunch dashboard in a real browser: Debian's chromium, headless, driven by
# playwright-core (tests/node/dashboard.js). The log directory holds a run
# that finished (train, 2 ranks), one that failed (rank 1 exits 3 with an error
# file) and one that is running (a worker that has written megabytes and
# keeps writing, and a metrics file the browser script appends to). The page
# must list all three with their state, show the failed run's root cause, draw
# the finished run's metrics (a point per record, visible when rendered), and
# follow the running run's log and chart as they grow, and show the stacks
# `mglaunch dump` took of a Python run (its threads' tracebacks, then the
# native frames). Screenshots go to
# $MG_BUILD/tests/output/dashboard/. Without a browser: the Host check on
# loopback, the token on another address, bad requests, and that mglaunch
# itself links no HTTP library (mglaunch dashboard execs mglaunch-dashboard).
# timeout: 240
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/node.sh"
DASH=$MG_BUILD/bin/mglaunch-dashboard
[ -x "$DASH" ] || skip_all "mglaunch-dashboard is not built (libmicrohttpd-dev: scripts/deps.sh)"
CHROMIUM=/usr/bin/chromium
[ -x "$CHROMIUM" ] || skip_all "chromium is not installed (scripts/deps.sh)"
command -v curl >/dev/null || skip_all "curl is not installed"
need_node_modules
L=$T/logs
OUT=$MG_BUILD/tests/output/dashboard
DATA="--data synthetic --train-samples 512 --test-samples 128 --model mlp --hidden 32"

needed=$(readelf -d "$MGLAUNCH" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')
unlike "$needed" 'microhttpd|curl' "mglaunch links no HTTP library ($needed)"
is "$(nm "$MGLAUNCH" | grep -c 'MHD_')" 0 "mglaunch holds no libmicrohttpd code: mglaunch-dashboard does"

# ---- three runs ----
"$MGLAUNCH" --nproc_per_node 2 --rdzv_id done --log_dir "$L" "$TRAIN" $DATA --steps 30 \
    --log-every 2 --eval-every 10 >"$T/done.out" 2>&1 || bail "the finished run ($(tail -n 3 "$T/done.out"))"
MSG="ValueError: learning rate must be positive"
"$MGLAUNCH" --nproc_per_node 2 --rdzv_id broken --log_dir "$L" "$HELPERS/fakeworker" \
    if rank=1 error-json "$MSG" if rank=1 exit 3 sleep 10 >"$T/broken.out" 2>&1
is "$?" 3 "the failed run ends with its root cause's exit code"
cat >"$T/live.sh" <<'EOF'
#!/bin/sh
# rank 0 starts a metrics file as train would; every rank writes 3 MB, then a line 5 times a second
if [ "$RANK" = 0 ]; then
    for s in 1 2 3 4 5 6 7 8 9 10; do
        printf '{"type":"train","step":%d,"epoch":1,"loss":%s,"accuracy":0.5,"lr":0.05,"samples_per_s":1000,"time_s":1,"run_id":"live","restart":0,"rank":0}\n' \
            "$s" "$(awk -v s="$s" 'BEGIN { print 2.3 / (1 + s / 20) }')"
    done >>"$MG_RUN_LOG_DIR/attempt_$MG_ATTEMPT/metrics.jsonl"
fi
echo BIGSTART
head -c 3000000 /dev/zero | tr '\0' x | fold -w 99
echo "to stderr" >&2
i=0
while :; do
    echo "tick $i"
    i=$((i + 1))
    sleep 0.2
done
EOF
chmod +x "$T/live.sh"
bg "$MGLAUNCH" --nproc_per_node 2 --rdzv_id live --log_dir "$L" "$T/live.sh" >"$T/live.out" 2>&1
live=$!
at_cleanup "kill -TERM $live 2>/dev/null"
wait_for 20 grep -q 'tick 1' "$L/live/attempt_0/0/stdout.log" || bail "the running run writes its log"

# A Python run's stacks: mglaunch dump while it spins in spin() with a
# thread asleep in sleeper(); then it is stopped (its files stay).
printf '%s\n' 'import threading, time' '' '' 'def sleeper():' '    time.sleep(1000)' '' '' \
    'def spin():' '    while True:' '        pass' '' '' \
    'threading.Thread(target=sleeper, daemon=True).start()' 'print("spinning", flush=True)' 'spin()' >"$T/spin.py"
PYTHON_EXEC=/usr/bin/python3 bg "$MGLAUNCH" --nproc_per_node 1 --rdzv_id py --log_dir "$L" "$T/spin.py" >"$T/py.out" 2>&1
py=$!
at_cleanup "kill -KILL $py 2>/dev/null"
wait_for 20 grep -q 'spinning' "$T/py.out" || bail "the Python run starts ($(cat "$T/py.out"))"
"$MGLAUNCH" dump "$L" --run py >"$T/dump" 2>&1 || bail "mglaunch dump of the Python run ($(cat "$T/dump"))"
DUMP=$(basename "$(sed -n 's/^  saved in \(.*\)\.txt$/\1/p' "$T/dump")")
kill -TERM $py
wait $py

# ---- the dashboard on loopback ----
bg "$MGLAUNCH" dashboard "$L" --port 0 >"$T/dash.out" 2>&1
wait_for 10 grep -q ' at http' "$T/dash.out" || bail "the dashboard starts ($(cat "$T/dash.out"))"
URL=$(sed -n 's/^mglaunch dashboard: serving .* at \(http:[^ ]*\)$/\1/p' "$T/dash.out")
like "$URL" '^http://127\.0\.0\.1:[0-9]+/$' "it serves on loopback, no token needed ($URL)"
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
is "$(code "${URL}api/runs")" 200 "the run list answers"
is "$(code -H 'Host: attacker.example:80' "${URL}api/runs")" 403 \
    "a request for another host name is refused (a rebound DNS name cannot read it)"
is "$(code -X POST "${URL}api/runs")" 405 "only GET and HEAD"
is "$(code "${URL}api/run?run=..")" 404 "a run id cannot leave the log directory"
is "$(code "${URL}api/log?run=live&attempt=0&rank=0&stream=../../x&offset=0")" 400 "nor can a stream name"
is "$(code "${URL}api/log?run=live&attempt=9&rank=0&stream=stdout")" 404 "a log that does not exist"
curl -s -D "$T/h" -o "$T/tail" "${URL}api/log?run=live&attempt=0&rank=0&stream=stdout&offset=-1"
size=$(sed -n 's/^X-Log-Size: \([0-9]*\).*/\1/p' "$T/h")
DESC="the tail of a 3 MB log is at most 64 KiB and ends at the file's end" \
    ok test "$(wc -c <"$T/tail")" -le 65536 -a "$size" -gt 3000000
curl -s -D "$T/h" -o "$T/head" "${URL}api/log?run=live&attempt=0&rank=0&stream=stdout&offset=0"
like "$(head -n 1 "$T/head")" '^BIGSTART$' "offset 0 starts at the beginning"
is "$(sed -n 's/^X-Log-End: \([0-9]*\).*/\1/p' "$T/h" | tr -d '\r')" "$(wc -c <"$T/head" | tr -d ' ')" \
    "and X-Log-End says where the next request goes on"
like "$(curl -s "${URL}api/run?run=py")" "\"stacks\":\\[\"$DUMP\"\\]" "a rank's stacks are listed ($DUMP)"
# (the loop's jump is on its first line or its last: Python says either)
like "$(curl -s "${URL}api/log?run=py&attempt=0&rank=0&stream=$DUMP&offset=0")" "File \"$T/spin.py\", line (9|10) in spin" \
    "and served: its Python traceback"
is "$(code "${URL}api/log?run=py&attempt=0&rank=0&stream=dump-1/../../x&offset=0")" 400 "a stacks name cannot leave its directory"
is "$(code "${URL}api/log?run=py&attempt=0&rank=0&stream=stacks&offset=0")" 404 "stacks the watchdog never took: 404"
etag=$(curl -s -D - -o /dev/null "${URL}api/plot.svg?run=done" | sed -n 's/^ETag: \(.*\)\r$/\1/p')
is "$(code -H "If-None-Match: $etag" "${URL}api/plot.svg?run=done")" 304 "an unchanged plot is not sent again"

# ---- in the browser ----
n_train=$(grep -c '"type":"train"' "$L/done/attempt_0/metrics.jsonl")
n_eval=$(grep -c '"type":"eval"' "$L/done/attempt_0/metrics.jsonl")
cfg=$(printf '{"url":"%s","chromium":"%s","profile":"%s","out":"%s","done":"done","done_train":%d,"done_eval":%d,"broken":"broken","broken_message":"%s","live":"live","live_metrics":"%s","live_steps":10,"big_marker":"BIGSTART","py":"py","py_dump":"%s","py_frame":"in sleeper"}' \
    "$URL" "$CHROMIUM" "$T/profile" "$OUT" "$n_train" "$n_eval" "$MSG" "$L/live/attempt_0/metrics.jsonl" "$DUMP")
node "$NODE_DIR/dashboard.js" "$cfg" >"$T/browser.out" 2>&1
brc=$?
while IFS= read -r line; do
    case $line in
    "ok - "*) DESC=${line#ok - } ok true ;;
    "not ok - "*) DESC=${line#not ok - } ok false ;;
    "#"*) echo "$line" ;;
    esac
done <"$T/browser.out"
[ $brc -eq 0 ] || diag "the browser script: $(grep -v '^ok' "$T/browser.out" | head -n 20)"
DESC="screenshots saved under $OUT" ok test -s "$OUT/dashboard.png" -a -s "$OUT/plot.png"

# ---- on another address: a token is made and required ----
bg "$MGLAUNCH" dashboard "$L" --host 0.0.0.0 --port 0 >"$T/dash2.out" 2>&1
wait_for 10 grep -q ' at http' "$T/dash2.out" || bail "the second dashboard starts ($(cat "$T/dash2.out"))"
URL2=$(sed -n 's/^mglaunch dashboard: serving .* at \(http:[^ ]*\)$/\1/p' "$T/dash2.out")
TOKEN=${URL2#*?token=}
like "$TOKEN" '^[0-9a-f]{32}$' "bound to all addresses, it prints an address with a generated token"
PORT2=$(printf '%s' "$URL2" | sed 's/.*:\([0-9]*\)\/.*/\1/')
B2=http://127.0.0.1:$PORT2
is "$(code "$B2/api/runs")" 401 "without the token: 401"
is "$(code "$B2/api/runs?token=wrong$TOKEN")" 401 "with a wrong token: 401"
is "$(code "$B2/?token=$TOKEN")" 200 "the page with the token in its address"
is "$(code -H "X-MG-Token: $TOKEN" "$B2/api/runs")" 200 "the API with the token in a header"
done_testing
