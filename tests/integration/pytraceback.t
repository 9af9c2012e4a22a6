#!/bin/sh
# Python tracebacks (launcher/watchdog/pytb.h): mglaunch registers
# faulthandler in Python workers through a sitecustomize of its own and
# triggers it in `mglaunch dump` and, before the signal, on a file-timer
# expiry; the traceback of every thread (a function spinning, one asleep in
# time.sleep in a second thread) lands next to the native stacks. The
# user's program sees no difference: its PYTHONPATH, sys.path, its own
# sitecustomize, -m and sys.argv, its stdout. A worker that blocks the
# signal, and one whose Python never registered it (python -S), get a line
# and keep running; MG_PYTHON_TRACEBACKS=0 turns it off.
# timeout: 150
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset PYTHONPATH MG_PYTHON_TRACEBACKS TORCHELASTIC_ENABLE_FILE_TIMER TORCHELASTIC_TIMER_FILE
PY=/usr/bin/python3
[ -x $PY ] || skip_all "no /usr/bin/python3"
export PYTHON_EXEC=$PY
L=$T/logs
export TMPDIR=$T/tmp # where the hook's directories go
mkdir -p "$T/pkg" "$T/userpath" "$TMPDIR"

# Both programs here (spin.py, and ft.py for the file timer) start the same
# way: spin() spins (line 11, or 10: the loop's jump) while sleeper() (line 5)
# sleeps in a second thread, which each starts after its own set-up.
spin_sleep_py() {
    cat <<'EOF'
import os, sys, threading, signal, time


def sleeper():
    time.sleep(1000)


def spin():
    n = 0
    while True:
        n += 1


EOF
}
# spin.py says what it sees of its environment first.
{
    spin_sleep_py
    cat <<'EOF'
if os.environ.get("BLOCK") == "1":  # before any thread, so that all inherit the mask
    sig = int(open("/proc/self/environ").read().split("MG_PY_TRACEBACK=")[1].split(":")[0])
    signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
threading.Thread(target=sleeper, daemon=True).start()
print("seen: PYTHONPATH=%s hook_vars=%s hook_on_path=%s user_site=%s argv=%s main=%s" % (
    os.environ.get("PYTHONPATH"), any(k.startswith("MG_PY_TRACEBACK") for k in os.environ),
    any("mglaunch-py-" in p for p in sys.path), os.environ.get("USER_SITE_RAN"),
    sys.argv[1:], __name__), flush=True)
spin()
EOF
} >"$T/pkg/spin.py"
: >"$T/pkg/__init__.py"
# the user's own sitecustomize, on their PYTHONPATH: it must still run
cat >"$T/userpath/sitecustomize.py" <<'EOF'
import os
os.environ["USER_SITE_RAN"] = "yes"
EOF

start() { # name, then mglaunch's arguments; waits for the program's first line
    _n=$1
    shift
    "$MGLAUNCH" --log_dir "$L" --rdzv_id "$_n" --nproc_per_node 1 "$@" >"$T/$_n.out" 2>"$T/$_n.err" &
    M=$!
    at_cleanup "kill -KILL $M 2>/dev/null"
    wait_for 30 grep -q 'seen:' "$T/$_n.out" || bail "$_n: the program did not start: $(cat "$T/$_n.err")"
}
stop() {
    kill -TERM $M
    wait $M
}

# ---- mglaunch dump on a live Python job
start live "$T/pkg/spin.py" a1 --flag
"$MGLAUNCH" dump "$L" --run live >"$T/dump" 2>&1
is $? 0 "dump: exit 0"
d=$(cat "$T/dump")
like "$d" "  # Python threads, by faulthandler:" "dump: a Python section"
like "$d" "File \"$T/pkg/spin.py\", line 1[01] in spin" "dump: the spinning function and its line"
like "$d" "File \"$T/pkg/spin.py\", line 5 in sleeper" "dump: the thread in time.sleep"
like "$d" "  #[0-9]+ +0x[0-9a-f]+ " "dump: and the native stacks after it"
f=$(sed -n 's/^  saved in \(.*dump-[0-9]*\.txt\)$/\1/p' "$T/dump")
like "$(cat "$f")" "line 1[01] in spin" "dump: saved in the attempt's directory"
DESC="dump: the job runs on" ok alive $M
like "$(cat "$T/live.out")" "seen: PYTHONPATH=None hook_vars=False hook_on_path=False user_site=None argv=\\['a1', '--flag'\\] main=__main__" \
    "the program sees no PYTHONPATH, no hook, its own argv"
unlike "$(cat "$T/live.out" "$L/live/attempt_0/0/stdout.log" "$L/live/attempt_0/0/stderr.log")" "most recent call first" \
    "the traceback is not in the worker's output"
"$MGLAUNCH" dump "$L" --run live >"$T/dump2" 2>&1
like "$(cat "$T/dump2")" "line 1[01] in spin" "a second dump: the traceback again"
is "$(grep -c 'Current thread' "$T/dump2")" 1 "and only the new one"
stop
like "$("$MGLAUNCH" logs "$L" --run live)" "mglaunch dump: $L/live/attempt_0/0/dump-[0-9-]+.txt" \
    "mglaunch logs names the dump"

# ---- -m, a user's PYTHONPATH and their own sitecustomize
PYTHONPATH="$T/userpath:$T" start modpp -m pkg.spin x
like "$(cat "$T/modpp.out")" "seen: PYTHONPATH=$T/userpath:$T hook_vars=False hook_on_path=False user_site=yes argv=\\['x'\\] main=__main__" \
    "-m: the user's PYTHONPATH as given, their sitecustomize ran"
"$MGLAUNCH" dump "$L" --run modpp >"$T/dump" 2>&1
like "$(cat "$T/dump")" "pkg/spin.py\", line 1[01] in spin" "-m: the dump shows the function"
stop

# ---- a worker that blocks the signal: a line, and it keeps running
BLOCK=1 start block "$T/pkg/spin.py"
"$MGLAUNCH" dump "$L" --run block >"$T/dump" 2>&1
is $? 0 "blocked: exit 0"
like "$(cat "$T/dump")" "  # no Python traceback: every thread of the worker blocks signal [0-9]+ \\(SIGRTMAX-3\\) \\(pthread_sigmask\\)" \
    "blocked: says so"
DESC="blocked: the worker runs on" ok alive $M
stop

# ---- a Python that never registered it (-S: no site, no sitecustomize)
printf '#!/bin/sh\nexec %s -S "$@"\n' $PY >"$T/py-nosite"
chmod +x "$T/py-nosite"
PYTHON_EXEC=$T/py-nosite start nosite "$T/pkg/spin.py"
"$MGLAUNCH" dump "$L" --run nosite >"$T/dump" 2>&1
like "$(cat "$T/dump")" "  # no Python traceback: its Python does not catch signal [0-9]+ \\(SIGRTMAX-3\\), so faulthandler was not registered" \
    "no hook: says so"
DESC="no hook: the signal was not sent (its default action would kill)" ok alive $M
stop

# ---- turned off
MG_PYTHON_TRACEBACKS=0 PYTHONPATH=$T/userpath start off "$T/pkg/spin.py"
like "$(cat "$T/off.out")" "seen: PYTHONPATH=$T/userpath hook_vars=False" "off: the environment untouched"
"$MGLAUNCH" dump "$L" --run off >"$T/dump" 2>&1
unlike "$(cat "$T/dump")" "Python" "off: no Python section"
stop

# ---- the hang: torch's file timer expires; the tracebacks come before the signal
if $PY -c 'import torch.distributed.elastic.timer' 2>/dev/null; then
    {
        spin_sleep_py
        cat <<'EOF'
import torch.distributed.elastic.timer as timer

threading.Thread(target=sleeper, daemon=True).start()
timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    with timer.expires(after=1, scope="spin"):
        spin()
EOF
    } >"$T/ft.py"
    TORCHELASTIC_ENABLE_FILE_TIMER=1 "$MGLAUNCH" --log_dir "$L" --rdzv_id ft --nproc_per_node 2 \
        --max_restarts 1 "$T/ft.py" >"$T/ft.out" 2>"$T/ft.err"
    is $? 0 "file timer: the restarted group finishes"
    e=$(cat "$T/ft.err")
    like "$e" "file timer: scope 'spin' of rank 1 .* expired.*
mglaunch: watchdog: stacks of local (rank 1|ranks 1,0|ranks 0,1) in $L/ft/attempt_0/<local rank>/stacks.txt
mglaunch: sent SIGKILL to local rank 1" "file timer: the stacks before the signal"
    s=$(cat "$L/ft/attempt_0/1/stacks.txt")
    like "$s" "^# rank 1 \\(local rank 1, host $(hostname), pid [0-9]+\\), hung, at " "file timer: the hung rank's file"
    like "$s" "File \"$T/ft.py\", line 1[01] in spin" "file timer: the spinning function and its line"
    like "$s" "File \"$T/ft.py\", line 5 in sleeper" "file timer: the sleeping thread"
    like "$s" "# native threads:
PID [0-9]+" "file timer: then the native stacks"
    like "$("$MGLAUNCH" logs "$L" --run ft)" "stacks \\(the watchdog's\\): $L/ft/attempt_0/1/stacks.txt" \
        "mglaunch logs names them"
else
    DESC="# SKIP python3-torch not installed: the file timer's hang" ok true
fi
is "$(ls "$TMPDIR")" "" "every hook directory removed"
done_testing
