#!/bin/sh
# Failures and restarts: fail once then succeed; restarts exhausted (the exit
# code is the worker's); a signal death reported by name; the root cause with
# its error.json message or its stderr, and the crash behind a peer's error
# when the peer's exit is seen first; exec failures (127, 126) that are not
# retried; the documented backoff as recorded in the event log.
# timeout: 90
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
L=$T/logs

# ---- fail once, then succeed
"$MGLAUNCH" --log_dir "$L" --rdzv_id once --nproc_per_node 2 --max_restarts 1 "$FW" \
    'if' rank=1,restart=0 exit 3 print-env >"$T/out" 2>"$T/err"
is $? 0 "fail once then succeed: exit 0"
ok test -d "$L/once/attempt_1"
grep -qx TORCHELASTIC_RESTART_COUNT=1 "$L/once/attempt_1/0/stdout.log"
is $? 0 "the restarted group sees TORCHELASTIC_RESTART_COUNT=1"
grep -qx "TORCHELASTIC_ERROR_FILE=$L/once/attempt_1/0/error.json" "$L/once/attempt_1/0/stdout.log"
is $? 0 "and a new attempt directory"
like "$(cat "$T/err")" "local rank 1 \\(rank 1, pid [0-9]+\\) exited with code 3" "the failure noted"
like "$(cat "$T/err")" "restarting the workers \\(restart 1 of 1\\)" "the restart noted"
unlike "$(cat "$T/err")" "FAILED" "no failure summary after a success"

# ---- restarts exhausted: the worker's exit code, a summary covering every attempt
"$MGLAUNCH" --log_dir "$L" --rdzv_id exh --nproc_per_node 2 --max_restarts 2 "$FW" \
    'if' rank=1 err "bad things happened" 'if' rank=1 exit 5 sleep 5 >"$T/out" 2>"$T/err"
is $? 5 "restarts exhausted: exit code 5 (the worker's)"
e=$(cat "$T/err")
like "$e" "FAILED: run exh, 3 attempts \\(2 restarts\\); exit code 5" "summary headline"
like "$e" "attempt 0 \\(restart 0, [^)]*\\): rank 1 \\(local rank 1, pid [0-9]+\\) exited with code 5; 1 stopped" \
    "attempt 0 listed"
like "$e" "attempt 2 \\(restart 2, " "attempt 2 listed"
like "$e" "Root cause \\(first failure\\):" "root cause block"
like "$e" "  rank      : 1 \\(local rank 1\\)" "root cause rank"
like "$e" "  host      : $(hostname)" "root cause host"
like "$e" "  exit      : exited with code 5" "root cause exit"
like "$e" "stderr \\(last lines\\):
    bad things happened" "its stderr when there is no error file"
like "$e" "logs      : $L/exh/attempt_0/1" "where its logs are"
unlike "$e" "Traceback" "no launcher traceback"
is "$(grep -c '"event":"restart"' "$L/exh/events.jsonl")" 2 "two restarts in the event log"
# the documented backoff: none for the first restart, then 100 ms for a quick second failure
is "$(grep '"event":"restart"' "$L/exh/events.jsonl" | sed 's/.*"backoff_ms":\([0-9]*\).*/\1/' |
    tr '\n' ' ')" "0 100 " "backoff 0 ms, then 100 ms"

# ---- the root cause is the first failure, even when a later attempt fails differently
"$MGLAUNCH" --log_dir "$L" --rdzv_id first --max_restarts 1 "$FW" 'if' restart=0 exit 3 \
    'if' restart=1 signal SEGV >"$T/out" 2>"$T/err"
is $? 3 "exit code of the first failure"
like "$(cat "$T/err")" "attempt 1 \\(restart 1, [^)]*\\): rank 0 \\(local rank 0, pid [0-9]+\\) was killed by SIGSEGV \\(exit code 139\\)" \
    "the later signal death is listed by name"

# ---- a signal death as the root cause
"$MGLAUNCH" --log_dir "$L" --rdzv_id sig --nproc_per_node 2 "$FW" 'if' rank=0 signal ABRT \
    sleep 5 >"$T/out" 2>"$T/err"
is $? 134 "killed by SIGABRT: exit code 128+6"
like "$(cat "$T/err")" "exit      : was killed by SIGABRT \\(exit code 134\\)" "signal named"

# ---- error.json in torch's format, and its other accepted shape
"$MGLAUNCH" --log_dir "$L" --rdzv_id ej --nproc_per_node 2 "$FW" \
    'if' rank=1 error-json "ValueError: bad input" 'if' rank=1 exit 1 sleep 5 \
    >"$T/out" 2>"$T/err"
is $? 1 "worker with an error file: its exit code"
e=$(cat "$T/err")
like "$e" "error file: $L/ej/attempt_0/1/error.json" "error file named"
like "$e" "message   : ValueError: bad input" "message from error.json"
like "$e" "traceback :
    Traceback \\(most recent call last\\):
      File \"fake.py\", line 1, in <module>" "worker traceback from error.json"
like "$(grep '"event":"worker_exit"' "$L/ej/events.jsonl")" '"message":"ValueError: bad input"' \
    "the message is in the event log too"
"$MGLAUNCH" --log_dir "$L" --rdzv_id ejs "$FW" error-json-str "plain message" exit 9 \
    >"$T/out" 2>"$T/err"
is $? 9 "string-message error file"
like "$(cat "$T/err")" "message   : plain message" "its message"
# without --log_dir too: the stderr tail is kept in memory
"$MGLAUNCH" "$FW" err "tail line 1" err "tail line 2" exit 4 >/dev/null 2>"$T/err"
is $? 4 "failure without --log_dir"
like "$(cat "$T/err")" "stderr \\(last lines\\):
    tail line 1
    tail line 2" "stderr tail without --log_dir"

# ---- a program that does not exist: a usage error, nobody started
"$MGLAUNCH" --log_dir "$L" --rdzv_id nf0 --nproc_per_node 2 "$T/no-such-program" >"$T/out" 2>"$T/err"
is $? 2 "missing program: exit 2"
is "$(cat "$T/err")" "mglaunch: program '$T/no-such-program' does not exist" "one line naming it"
ok test ! -e "$L/nf0/attempt_0"
"$MGLAUNCH" no-such-program-in-path >/dev/null 2>"$T/err"
is $? 2 "not found in PATH: exit 2"
like "$(cat "$T/err")" "^mglaunch: program 'no-such-program-in-path' not found in PATH or in /" "says where it looked"

# ---- exec failures: 127 / 126, reported, not retried
printf '#!/no/such/interpreter\n' >"$T/badinterp"
chmod 755 "$T/badinterp"
"$MGLAUNCH" --log_dir "$L" --rdzv_id nf --max_restarts 3 --nproc_per_node 2 \
    "$T/badinterp" >"$T/out" 2>"$T/err"
is $? 127 "exec fails with ENOENT (missing interpreter): exit 127"
like "$(cat "$T/err")" "message   : cannot execute '$T/badinterp': No such file or directory" \
    "says what could not be executed"
ok test ! -e "$L/nf/attempt_1" # not retried
printf 'not a program\n' >"$T/noexec"
chmod 644 "$T/noexec"
"$MGLAUNCH" "$T/noexec" >/dev/null 2>"$T/err"
is $? 126 "not executable: exit 126"
like "$(cat "$T/err")" "Permission denied" "says why"
# ---- a crash whose peer exits first: rank 0 is SIGKILLed while it holds
# 100 MB (its exit takes a while), rank 1 sees it exiting and exits 1 with an
# error of its own, and mglaunch sees rank 1's exit first. The root cause is
# rank 0's SIGKILL, not rank 1's error, and rank 0 did not count as stopped.
"$MGLAUNCH" --nproc_per_node 2 --log_dir "$L" --rdzv_id crashpeer --monitor_interval 0.05 "$FW" \
    if local_rank=0 pidfile "$T/p0" if local_rank=0 alloc 100 if local_rank=0 signal KILL \
    if local_rank=1 wait-exiting "$T/p0" if local_rank=1 error-json "lost rank 0" \
    if local_rank=1 exit 1 >"$T/cp.out" 2>&1
is "$?" 137 "a crash behind a peer's error: the exit code is the crash's"
e=$(cat "$T/cp.out")
like "$e" "Root cause \\(first failure\\):
  rank      : 0 \\(local rank 0\\)" "the root cause is rank 0"
like "$e" "  exit      : was killed by SIGKILL" "killed by SIGKILL"
# (mglaunch may also see rank 0 die first, and then stop rank 1: the same root cause)
like "$e" "rank 0 \\(local rank 0, pid [0-9]+\\) was killed by SIGKILL \\(exit code 137\\); 1 (more failed|stopped)" \
    "rank 0 failed, it was not stopped"
# The same with --shutdown_timeout 0 (the others are SIGKILLed at once, and
# the escalation must not count the dying rank 0 as stopped either).
"$MGLAUNCH" --nproc_per_node 2 --log_dir "$L" --rdzv_id crashpeer0 --monitor_interval 0.05 \
    --shutdown_timeout 0 "$FW" \
    if local_rank=0 pidfile "$T/p1" if local_rank=0 alloc 100 if local_rank=0 signal KILL \
    if local_rank=1 wait-exiting "$T/p1" if local_rank=1 error-json "lost rank 0" \
    if local_rank=1 exit 1 >"$T/cp0.out" 2>&1
is "$?" 137 "--shutdown_timeout 0: the exit code is still the crash's"
like "$(cat "$T/cp0.out")" "Root cause \\(first failure\\):
  rank      : 0 \\(local rank 0\\)" "--shutdown_timeout 0: the root cause is still rank 0"
done_testing
