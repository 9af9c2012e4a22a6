#!/bin/sh
# torchrun's file-timer watchdog served by mglaunch, with Debian's torch 1.13
# FileTimerClient in the workers: TORCHELASTIC_ENABLE_FILE_TIMER=1 makes the
# FIFO and hands its path to the workers; a scope that overstays its timer
# gets the signal it asked for (SIGKILL), is named with its rank in a line
# and as the root cause, and the group restarts; a timer released in time
# does nothing; garbage written to the FIFO is reported and ignored; a
# TORCHELASTIC_TIMER_FILE of our own is used; one that is not a FIFO is
# refused; the FIFO mglaunch made is gone afterwards.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
/usr/bin/python3 -c 'import torch.distributed.elastic.timer' 2>/dev/null ||
    skip_all "python3-torch not installed"
export PYTHON_EXEC=/usr/bin/python3
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset TORCHELASTIC_TIMER_FILE
export TORCHELASTIC_ENABLE_FILE_TIMER=1
L=$T/logs
W=$T/ftw.py
cat >"$W" <<'PY'
import os, sys, time
import torch.distributed.elastic.timer as timer
mode = sys.argv[1]
rank = int(os.environ["RANK"])
first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
path = os.environ["TORCHELASTIC_TIMER_FILE"]
print("timer file", path, flush=True)
timer.configure(timer.FileTimerClient(path))
if mode == "expire" and first:
    if rank == 1:
        with timer.expires(after=1, scope="slow_step"):
            time.sleep(60)
    time.sleep(60)
if mode == "garbage" and rank == 0:
    with open(path, "w") as f:
        f.write("not json\n")
        f.write('{"version": 1, "pid": "x", "scope_id": "s", "expiration_time": 1, "signal": 9}\n')
        f.write("x" * 5000 + "\n")
    with open(path, "w") as f: # torch's client closes after each line: and a broken one
        f.write('{"version": 1, "pid": %d, "scope_id": "s", "expiration_time": 1}\n' % os.getpid())
with timer.expires(after=30, scope="quick"):
    time.sleep(0.3)
print(f"rank {rank} done", flush=True)
PY

# ---- a scope overstays: killed, named, restarted
TMPDIR=$T "$MGLAUNCH" --log_dir "$L" --rdzv_id exp --nproc_per_node 2 --max_restarts 1 "$W" expire \
    >"$T/out" 2>"$T/err"
is $? 0 "expired: the restarted group finishes"
e=$(cat "$T/err")
like "$e" "mglaunch: file timer: scope 'slow_step' of rank 1 \\(local rank 1, host $(hostname), pid [0-9]+\\) expired: it was given 1.0 s \\(torch's FileTimerClient\\); sending SIGKILL" \
    "one line names the rank and the scope"
like "$e" "restarting the workers \\(restart 1 of 1\\)" "restarted"
grep -q "^timer file $T/mglaunch-timer-....../watchdog_timer\$" "$L/exp/attempt_0/0/stdout.log"
is $? 0 "the workers got TORCHELASTIC_TIMER_FILE: a FIFO in a directory of its own under TMPDIR"
is "$(ls "$T" | grep -c mglaunch-timer)" 0 "the FIFO and its directory are gone at the end"
grep '"event":"worker_exit"' "$L/exp/events.jsonl" | grep '"rank":1' |
    grep -q "\"outcome\":\"failed\".*file timer expired: scope 'slow_step'"
is $? 0 "the event log has rank 1's failure with the scope"

# ---- no restart left: the root cause is the rank whose timer expired
"$MGLAUNCH" --log_dir "$L" --rdzv_id exp0 --nproc_per_node 2 "$W" expire >"$T/out" 2>"$T/err"
is $? 137 "no restart left: exit code 137 (SIGKILL)"
e=$(cat "$T/err")
like "$e" "attempt 0 \\(restart 0, [^)]*\\): rank 1 \\(local rank 1, pid [0-9]+\\) overstayed its file timer: killed by mglaunch's watchdog \\(SIGKILL, exit code 137\\); 1 stopped" \
    "the attempt's line"
like "$e" "  message   : file timer expired: scope 'slow_step', given 1.0 s; sent SIGKILL" \
    "the root cause's message names the scope"

# ---- released in time: nothing happens
"$MGLAUNCH" --log_dir "$L" --rdzv_id rel --nproc_per_node 2 "$W" release >"$T/out" 2>"$T/err"
is $? 0 "released in time: success"
unlike "$(cat "$T/err")" "file timer" "and no file timer line"
is "$(grep -c ' done$' "$T/out")" 2 "both ranks done"

# ---- garbage in the FIFO: told, ignored
"$MGLAUNCH" --log_dir "$L" --rdzv_id bad --nproc_per_node 2 "$W" garbage >"$T/out" 2>"$T/err"
is $? 0 "garbage: the run succeeds"
e=$(cat "$T/err")
like "$e" "file timer: ignored a request \\(not a JSON object\\): not json" "not JSON"
like "$e" "ignored a request \\(no \"pid\" \\(a positive integer\\)\\)" "a bad pid"
like "$e" "ignored a request \\(longer than 4096 bytes\\)" "an over-long line"
like "$e" "ignored a request \\(no \"signal\"" "a request without a signal"
is "$(grep -c ' done$' "$T/out")" 2 "both ranks done"

# ---- a path of our own: used, and left alone when it was there
mkfifo "$T/fifo"
TORCHELASTIC_TIMER_FILE=$T/fifo "$MGLAUNCH" --log_dir "$L" --rdzv_id own --nproc_per_node 2 \
    "$W" release >"$T/out" 2>"$T/err"
is $? 0 "TORCHELASTIC_TIMER_FILE: success"
grep -q "^timer file $T/fifo\$" "$L/own/attempt_0/1/stdout.log"
is $? 0 "the workers got that path"
ok test -p "$T/fifo"
echo data >"$T/notfifo"
TORCHELASTIC_TIMER_FILE=$T/notfifo "$MGLAUNCH" --nproc_per_node 2 "$W" release >"$T/out" 2>"$T/err"
is $? 1 "a TORCHELASTIC_TIMER_FILE that is not a FIFO: refused"
like "$(cat "$T/err")" "mglaunch: TORCHELASTIC_TIMER_FILE='$T/notfifo' exists and is not a FIFO" \
    "says so"
is "$(cat "$T/notfifo")" data "and leaves the file alone"
done_testing
