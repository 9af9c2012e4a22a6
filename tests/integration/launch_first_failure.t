#!/bin/sh
# The first failure named is the cause: a rank SIGKILLed and the rank whose
# collective then failed with an exit code are usually both waiting to be
# reaped when mglaunch wakes, and waitpid hands them back in the order they
# were started. mglaunch is stopped here (SIGSTOP) while rank 1 is SIGKILLed
# and rank 0, which sees it die (the end of a pipe rank 1 held), exits 1; once
# both are zombies mglaunch goes on and must name rank 1, the SIGKILL, in its
# "stopping the other workers" line and in the run's first failure.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
L=$T/logs
mkfifo "$T/fifo"
cat >"$T/w.py" <<'PY'
import os, sys, time
d = sys.argv[1]
if os.environ["RANK"] == "1":
    f = open(d + "/fifo", "w")          # rank 0's read ends when this process does
    with open(d + "/r1.tmp", "w") as p:
        p.write(str(os.getpid()))
    os.rename(d + "/r1.tmp", d + "/r1")
    while True:
        time.sleep(1)
else:
    f = open(d + "/fifo")
    with open(d + "/r0.tmp", "w") as p:
        p.write(str(os.getpid()))
    os.rename(d + "/r0.tmp", d + "/r0")
    f.read()                             # EOF: rank 1 is gone
    sys.stderr.write("rank 0: my peer is gone\n")
    sys.exit(1)
PY

bg "$MGLAUNCH" --log_dir "$L" --rdzv_id ff --nproc_per_node 2 /usr/bin/python3 "$T/w.py" "$T" \
    >"$T/out" 2>&1
M=$!
DESC="both workers started"
ok wait_for 30 test -e "$T/r0" -a -e "$T/r1"
r0=$(cat "$T/r0")
r1=$(cat "$T/r1")
kill -STOP "$M"
kill -KILL "$r1"
DESC="rank 1 SIGKILLed and rank 0 exited (both zombies, mglaunch stopped)"
ok wait_for 20 sh -c "grep -q ') Z ' /proc/$r0/stat && grep -q ') Z ' /proc/$r1/stat"
kill -CONT "$M"
wait "$M"
is $? 137 "mglaunch: exit code 137, the root cause's"
like "$(cat "$T/out")" "local rank 1 .rank 1, pid $r1. was killed by SIGKILL; stopping the other workers" \
    "the console names the SIGKILLed rank"
unlike "$(cat "$T/out")" "local rank 0 .*; stopping the other workers" "  not the rank that failed after it"
like "$(grep worker_exit "$L/ff/events.jsonl" | head -n 1)" '"rank":1,' \
    "  the event log's first worker_exit is rank 1's"
done_testing
