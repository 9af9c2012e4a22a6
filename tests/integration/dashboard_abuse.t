#!/bin/sh
# mglaunch dashboard against a hostile client, with real connections
# (python sockets from chosen loopback addresses): an idle connection is
# closed within seconds, and so is one that trickles its request a byte at a
# time; one address holding 40 connections does not lock another address out;
# on loopback (every local user is 127.0.0.1) 100 held connections do not lock
# out the next user; a request without the token is answered 401 and its
# connection closed; and a symbolic link in the log directory (a run, an
# attempt, a log) is never followed out of it, each component opened without
# following links (no check-then-open), and a log that is a FIFO is not waited on.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
DASH=$MG_BUILD/bin/mglaunch-dashboard
[ -x "$DASH" ] || skip_all "mglaunch-dashboard is not built (libmicrohttpd-dev: scripts/deps.sh)"
command -v curl >/dev/null || skip_all "curl is not installed"

L=$T/logs
"$MGLAUNCH" --rdzv_id real --log_dir "$L" "$HELPERS/fakeworker" exit 0 >/dev/null 2>&1
"$MGLAUNCH" --rdzv_id clean --log_dir "$L" "$HELPERS/fakeworker" exit 0 >/dev/null 2>&1
mkdir -p "$T/outside/attempt_0/0"
echo "OUTSIDE-SECRET" >"$T/outside/attempt_0/0/stdout.log"
cp "$L/real/events.jsonl" "$T/outside/events.jsonl"
ln -s "$T/outside" "$L/evil"                         # a run that is a link
ln -s "$T/outside/attempt_0" "$L/real/attempt_7"     # an attempt that is a link
mkdir -p "$T/real2" && cp -r "$L/real" "$T/real2/" && mv "$T/real2/real" "$L/real2"
rm -f "$L/real2/attempt_7" "$L/real2/attempt_0/0/stdout.log"
ln -s "$T/outside/attempt_0/0/stdout.log" "$L/real2/attempt_0/0/stdout.log" # a log that is a link
cp -r "$L/real" "$T/fifo" && mv "$T/fifo" "$L/fifo" && rm -rf "$L/fifo/attempt_7"
rm -f "$L/fifo/attempt_0/0/stdout.log" && mkfifo "$L/fifo/attempt_0/0/stdout.log" # a log that is a FIFO
# a rerun whose earlier run's metrics file is a FIFO (the plot reads the earlier run first)
cp -r "$L/real" "$T/fifoB" && mv "$T/fifoB" "$L/fifoB" && rm -rf "$L/fifoB/attempt_7"
cp -r "$L/fifoB" "$T/fifoA" && mv "$T/fifoA" "$L/fifoA" && mkfifo "$L/fifoA/attempt_0/metrics.jsonl"
printf '{"type":"start","step":20,"resumed_run":"fifoA"}\n{"type":"train","step":21,"loss":0.5}\n' \
    >"$L/fifoB/attempt_0/metrics.jsonl"

cat >"$T/c.py" <<'PY'
import socket, sys, time
port, what = int(sys.argv[1]), sys.argv[2]
def conn(src):
    s = socket.socket()
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s
def closed_within(s, secs):  # seconds until the server closed it, or None
    t0 = time.time()
    s.settimeout(secs)
    try:
        while s.recv(4096):
            pass
        return round(time.time() - t0, 1)
    except (socket.timeout, TimeoutError):
        return None
    except OSError:
        return round(time.time() - t0, 1)
def get(src, path, token):
    try:
        s = conn(src)
        s.settimeout(3)
        s.sendall(f"GET {path}{'&' if '?' in path else '?'}token={token} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        return s.recv(200).decode(errors="replace").split("\r\n")[0] or "closed"
    except OSError as e:
        return f"refused ({e.__class__.__name__})"
if what == "idle":
    print("idle closed after", closed_within(conn("127.0.0.2"), 15))
elif what == "trickle":
    s = conn("127.0.0.2")
    t0 = time.time()
    try:
        for b in b"GET /api/runs?token=" + b"x" * 30:
            s.send(bytes([b]))
            time.sleep(1)
        print("trickle never closed")
    except OSError:
        print("trickle closed after", round(time.time() - t0))
elif what == "per-address":
    token = sys.argv[3]
    held = [conn("127.0.0.2") for _ in range(40)]
    time.sleep(0.5)
    print("other address:", get("127.0.0.3", "/api/runs", token))
    print("same address:", get("127.0.0.2", "/api/runs", token))
    time.sleep(7)  # the idle ones are closed by now
    print("same address later:", get("127.0.0.2", "/api/runs", token))
elif what == "loopback":
    held = [conn("127.0.0.1") for _ in range(100)]
    time.sleep(0.5)
    print("next local user:", get("127.0.0.1", "/api/runs", ""))
elif what == "notoken":
    s = conn("127.0.0.3")
    s.sendall(b"GET /api/runs HTTP/1.1\r\nHost: x\r\n\r\n")
    head = s.recv(4096).decode(errors="replace")
    print(head.split("\r\n")[0], "| Connection: close" if "Connection: close" in head else "| kept open",
          "| closed after", closed_within(s, 5))
PY
c() { python3 "$T/c.py" "$PORT" "$@" 2>&1; }

# ---- on every interface, with a token: per-address limits
PORT=$(free_port)
bg "$DASH" "$L" --host 0.0.0.0 --port "$PORT" --token tok123 >"$T/dash.out" 2>&1
up() { curl -sf -o /dev/null "http://127.0.0.1:$PORT/?token=tok123"; }
DESC="the dashboard serves on 0.0.0.0:$PORT"
ok wait_for 10 up
unset DESC

out=$(c idle)
like "$out" "^idle closed after [0-9.]+$" "an idle connection is closed ($out)"
s=$(printf '%s' "$out" | sed 's/.* //; s/\..*//')
DESC="  within seconds (idle timeout 5 s)"
ok test "$s" -le 7
out=$(c trickle)
like "$out" "^trickle closed after (9|10|11|12|13)$" "a request trickled a byte a second: closed at the 10 s deadline ($out)"
out=$(c per-address tok123)
like "$out" "other address: HTTP/1.1 200" "40 connections held from 127.0.0.2: 127.0.0.3 is served"
like "$out" "same address: (refused|closed)" "  127.0.0.2 itself is over its limit of 16"
like "$out" "same address later: HTTP/1.1 200" "  and is served again once its idle ones are closed"
out=$(c notoken)
like "$out" "^HTTP/1.1 401 .*\| Connection: close \| closed after [0-9.]+$" \
    "no token: 401, and the connection closed at once ($out)"

# ---- symbolic links in the log directory are not followed
get() { curl -s "http://127.0.0.1:$PORT$1&token=tok123"; }
unlike "$(get '/api/runs?x=1')" '"evil"' "a run directory that is a link is not listed"
like "$(get '/api/runs?x=1')" '"clean"' "  a run without links is"
is "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/log?run=evil&attempt=0&rank=0&stream=stdout&token=tok123")" 404 \
    "  nor served (its log: 404)"
is "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/log?run=real&attempt=7&rank=0&stream=stdout&token=tok123")" 404 \
    "an attempt directory that is a link: its log is not served"
is "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/run?run=real&token=tok123")" 404 \
    "  nor its run's page"
is "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/log?run=real2&attempt=0&rank=0&stream=stdout&token=tok123")" 404 \
    "a log file that is a link: 404"
is "$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/log?run=fifo&attempt=0&rank=0&stream=stdout&token=tok123")" 404 \
    "a log file that is a FIFO: 404 at once (opening it does not wait for a writer)"
is "$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/plot.svg?run=fifoB&token=tok123")" 200 \
    "a rerun whose earlier run's metrics file is a FIFO: its plot is drawn at once"
is "$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/runs?token=tok123")" 200 \
    "  and the dashboard goes on serving"
timeout 10 "$MGLAUNCH" logs "$L" --run fifoB --plot "$T/p.svg" >"$T/plot.out" 2>&1
rc=$?
DESC="mglaunch logs --plot does not wait on that FIFO (exit $rc: $(head -c 200 "$T/plot.out"))"
ok test "$rc" != 124
timeout 10 "$MGLAUNCH" logs "$L" --run fifoA >"$T/fifoA.out" 2>&1
rc=$?
DESC="  nor mglaunch logs on the run that holds it (exit $rc)"
ok test "$rc" != 124
unset DESC
unlike "$(get '/api/log?run=evil&attempt=0&rank=0&stream=stdout')$(get '/api/log?run=real&attempt=7&rank=0&stream=stdout')" \
    OUTSIDE-SECRET "the file outside is never sent"

# ---- on loopback, no token: every local user shares 127.0.0.1
PORT=$(free_port)
bg "$DASH" "$L" --host 127.0.0.1 --port "$PORT" >"$T/dash2.out" 2>&1
up2() { curl -sf -o /dev/null "http://127.0.0.1:$PORT/"; }
DESC="a second dashboard on 127.0.0.1:$PORT"
ok wait_for 10 up2
unset DESC
sed -i 's/Host: x/Host: 127.0.0.1/' "$T/c.py"
out=$(c loopback)
like "$out" "next local user: HTTP/1.1 200" "100 connections held on loopback: the next local user is served ($out)"
done_testing
