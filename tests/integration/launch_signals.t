#!/bin/sh
# Signals: SIGTERM forwarded to every worker group, SIGKILL for one that ignores
# it once --shutdown_timeout is over; a second SIGINT kills at once; SIGUSR1
# forwarded only, to the worker process and not its children; SIGHUP and
# SIGQUIT; exit codes 128+signal; SIGINT and SIGQUIT handled though ignored at
# start (a script's background job), SIGHUP ignored by nohup left alone. A stop
# that reaches a worker before mglaunch (Slurm, systemd and a deleted pod
# signal every process) is a stop, not a failure, in either order. And the
# launcher SIGKILLed: no worker or grandchild survives 2 s later.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
L=$T/logs

none_alive() {
    for p in "$@"; do alive "$p" && return 1; done
    return 0
}
pids_of() { cat "$@" 2>/dev/null | tr '\n' ' '; }

# ---- SIGTERM forwarded; the worker that ignores it is SIGKILLed after the grace period
bg "$MGLAUNCH" --log_dir "$L" --rdzv_id term --nproc_per_node 3 --shutdown_timeout 0.5 "$FW" \
    'if' rank=2 ignore-term 'if' rank=0 on-term 7 'if' rank=1 on-term 8 \
    pidfile "$T/term.pid.\${local_rank}" touch "$T/term.\${local_rank}" pause \
    >"$T/out" 2>"$T/err"
pid=$!
ok wait_for 10 files_ready 3 "$T/term"
kill -TERM "$pid"
wait "$pid"
is $? 143 "SIGTERM: exit code 143"
is "$(grep -c 'got SIGTERM' "$T/err")" 2 "the two handling workers got SIGTERM"
ev=$L/term/events.jsonl
like "$(grep '"event":"kill"' "$ev")" '"reason":"grace period over"' \
    "the one ignoring it was SIGKILLed after the grace period"
like "$(grep '"local_rank":2' "$ev" | grep worker_exit)" '"signal":"SIGKILL"' "rank 2 died by SIGKILL"
like "$(grep '"local_rank":0' "$ev" | grep worker_exit)" '"outcome":"stopped","exit_code":7' \
    "rank 0 stopped (exit 7 from its handler)"
ok none_alive $(pids_of "$T"/term.pid.*)
like "$(cat "$T/err")" "stopped by SIGTERM after 1 attempt; exit code 143" "summary line"
like "$(tail -n 1 "$ev")" '"event":"run_end","time_ms":[0-9]+,"result":"signaled","exit_code":143' \
    "run_end in the event log"

# A script's background job (like every bg job here) starts with SIGINT and
# SIGQUIT ignored; mglaunch handles them anyway. DFL restores them for the
# cases that are about something else.
DFL="env --default-signal=INT,QUIT"

# ---- SIGINT twice: the second kills at once (the workers ignore SIGINT here)
bg $DFL "$MGLAUNCH" --log_dir "$L" --rdzv_id int --nproc_per_node 2 --shutdown_timeout 60 "$FW" \
    trap INT "$T/int.got.\${local_rank}" touch "$T/int.\${local_rank}" sleep 60 \
    >"$T/out" 2>"$T/err"
pid=$!
ok wait_for 10 files_ready 2 "$T/int"
kill -INT "$pid"
ok wait_for 10 files_ready 2 "$T/int.got" # forwarded to both
kill -INT "$pid"
wait "$pid"
is $? 130 "SIGINT twice: exit code 130, without waiting out the 60 s grace period"
like "$(grep '"event":"kill"' "$L/int/events.jsonl")" '"reason":"second signal"' "killed on the second"
like "$(cat "$T/err")" "SIGINT again: killing the workers now" "said so"

# ---- SIGUSR1 is forwarded and nothing else happens
bg "$MGLAUNCH" --log_dir "$L" --rdzv_id usr --nproc_per_node 2 "$FW" \
    trap USR1 "$T/usr.got.\${local_rank}" touch "$T/usr.\${local_rank}" sleep 1 \
    >"$T/out" 2>"$T/err"
pid=$!
ok wait_for 10 files_ready 2 "$T/usr"
kill -USR1 "$pid"
wait "$pid"
is $? 0 "SIGUSR1: the run goes on and succeeds"
is "$(cat "$T/usr.got.0" "$T/usr.got.1")" "USR1
USR1" "every worker got SIGUSR1"

# ---- SIGUSR1 goes to the worker process only: the worker's child without a
# handler (a DataLoader's worker processes) is the worker's business, and lives
bg "$MGLAUNCH" --log_dir "$L" --rdzv_id usr1 --nproc_per_node 1 "$FW" \
    trap USR1 "$T/usr1.got" grandchild "$T/usr1.child" touch "$T/usr1.0" wait-file "$T/usr1.end" \
    >"$T/out" 2>"$T/err"
pid=$!
ok wait_for 10 files_ready 1 "$T/usr1"
ok wait_for 10 test -s "$T/usr1.child"
child=$(cat "$T/usr1.child")
kill -USR1 "$pid"
DESC="SIGUSR1 reaches the worker, which handles it" ok wait_for 10 test -s "$T/usr1.got"
sleep 0.3
DESC="the worker's child, which has no handler for it, is still alive" ok alive "$child"
touch "$T/usr1.end"
wait "$pid"
is $? 0 "and the run succeeds"

# ---- A stop that reaches a worker first: the worker exits 143 from its
# SIGTERM handler, or dies of SIGHUP (129); mglaunch's own SIGTERM comes at
# once, or 0.3 s later. mglaunch's signal decides the exit code.
for case in TERM:0 HUP:0.3; do
    s=${case%:*}
    gap=${case#*:}
    id=race$s
    bg "$MGLAUNCH" --log_dir "$L" --rdzv_id "$id" --nproc_per_node 2 "$FW" on-term 143 \
        pidfile "$T/$id.\${local_rank}" pause >"$T/out" 2>"$T/err"
    pid=$!
    ok wait_for 10 files_ready 2 "$T/$id"
    kill -"$s" "$(cat "$T/$id.0")"
    sleep "$gap"
    kill -TERM "$pid"
    wait "$pid"
    is $? 143 "SIG$s to a worker, then SIGTERM to mglaunch $gap s later: exit code 143"
    err=$(cat "$T/err")
    like "$err" "stopped by SIGTERM after 1 attempt; exit code 143" "  stopped by SIGTERM"
    unlike "$err" "FAILED|Root cause" "  no failure, no root cause"
    like "$(grep '"local_rank":0' "$L/$id/events.jsonl" | grep worker_exit | tail -n 1)" \
        '"outcome":"stopped"' "  the worker's exit is a stop in the event log"
    st=$("$MGLAUNCH" logs "$L" --run "$id" 2>&1)
    like "$(printf '%s\n' "$st" | grep '^\*')" "stopped by SIGTERM \(exit 143\)" "  mglaunch logs: stopped"
    unlike "$st" "Root cause" "  mglaunch logs: no root cause"
done

# ---- The same exit with no stop behind it is the failure it looks like,
# once mglaunch has waited a moment for a stop signal that does not come.
"$MGLAUNCH" --nproc_per_node 2 "$FW" 'if' rank=0 signal TERM 'if' rank=1 pause >"$T/out" 2>"$T/err"
is $? 143 "a worker killed by SIGTERM with no stop of mglaunch: exit code 143"
like "$(cat "$T/err")" "FAILED: .*exit code 143" "  a failure"
like "$(cat "$T/err")" "exit      : was killed by SIGTERM" "  with its root cause"

# ---- A failure well before the stop stays the failure it was.
bg "$MGLAUNCH" --log_dir "$L" --rdzv_id early --nproc_per_node 1 --max_restarts 1 "$FW" \
    'if' restart=0 exit 3 touch "$T/early.0" pause >"$T/out" 2>"$T/err"
pid=$!
ok wait_for 10 files_ready 1 "$T/early"
sleep 1.2
kill -TERM "$pid"
wait "$pid"
is $? 143 "a failure, a restart, then SIGTERM: exit code 143"
like "$(cat "$T/err")" "stopped by SIGTERM after 2 attempts" "  stopped by SIGTERM"
like "$(cat "$T/err")" "exit      : exited with code 3" "  and the earlier failure is still the root cause"

# ---- SIGHUP and SIGQUIT stop the run like SIGTERM
for sn in HUP:1 QUIT:3; do
    s=${sn%:*}
    bg $DFL "$MGLAUNCH" --nproc_per_node 2 "$FW" touch "$T/$s.\${local_rank}" pause >/dev/null 2>&1
    pid=$!
    ok wait_for 10 files_ready 2 "$T/$s"
    kill -"$s" "$pid"
    wait "$pid"
    is $? $((128 + ${sn#*:})) "SIG$s: exit code 128+signal"
done

# ---- SIGINT ignored at start (this background job's) is handled all the same,
# and the workers get it with its default action (they would ignore it too)
bg sh -c 'grep ^SigIgn: /proc/$$/status >"$1"' sh "$T/sigign"
ok wait_for 5 test -s "$T/sigign"
like "$(cat "$T/sigign")" '[2367abef]$' "a background job here starts with SIGINT ignored"
bg "$MGLAUNCH" --nproc_per_node 2 --log_dir "$L" --rdzv_id ign "$FW" touch "$T/ign.\${local_rank}" \
    sleep 30 >/dev/null 2>"$T/err"
pid=$!
ok wait_for 10 files_ready 2 "$T/ign"
kill -INT "$pid"
wait "$pid"
is $? 130 "SIGINT ignored at start: handled, exit 130"
like "$(grep '"local_rank":0' "$L/ign/events.jsonl" | grep worker_exit)" '"signal":"SIGINT"' \
    "the worker died of the SIGINT passed on, not of SIGKILL later"

# ---- SIGHUP ignored by nohup stays ignored; named in --signals-to-handle it is handled
bg env --ignore-signal=HUP "$MGLAUNCH" --nproc_per_node 1 "$FW" touch "$T/hup.0" sleep 1 \
    >/dev/null 2>&1
pid=$!
ok wait_for 10 files_ready 1 "$T/hup"
kill -HUP "$pid"
wait "$pid"
is $? 0 "SIGHUP ignored at start (nohup): the run completes"
bg env --ignore-signal=HUP "$MGLAUNCH" --signals-to-handle SIGHUP,SIGTERM --nproc_per_node 1 "$FW" \
    touch "$T/hup2.0" sleep 30 >/dev/null 2>&1
pid=$!
ok wait_for 10 files_ready 1 "$T/hup2"
kill -HUP "$pid"
wait "$pid"
is $? 129 "SIGHUP named in --signals-to-handle: handled under nohup too"

# ---- the launcher SIGKILLed: workers and their children die with it
bg "$MGLAUNCH" --nproc_per_node 3 "$FW" grandchild "$T/gc.\${local_rank}" \
    pidfile "$T/w.\${local_rank}" touch "$T/k.\${local_rank}" sleep 60 >/dev/null 2>&1
pid=$!
ok wait_for 10 files_ready 3 "$T/k"
ok wait_for 10 files_ready 3 "$T/gc"
victims=$(pids_of "$T"/w.* "$T"/gc.*)
is "$(echo $victims | wc -w | tr -d ' ')" 6 "three workers and three grandchildren running"
kill -KILL "$pid"
ok wait_for 2 none_alive $victims

# ---- the same after the sentinel was killed: mglaunch starts another and tells it the groups
bg "$MGLAUNCH" --nproc_per_node 2 "$FW" grandchild "$T/gc2.\${local_rank}" \
    pidfile "$T/w2.\${local_rank}" touch "$T/k2.\${local_rank}" sleep 60 >/dev/null 2>&1
pid=$!
ok wait_for 10 files_ready 2 "$T/k2"
ok wait_for 10 files_ready 2 "$T/gc2"
sentinel=$(pgrep -P "$pid" -x mglaunch-sentin)
like "$sentinel" '^[0-9]+$' "the sentinel runs as a child of mglaunch"
kill -KILL "$sentinel"
new_sentinel() {
    s=$(pgrep -P "$pid" -x mglaunch-sentin) && [ "$s" != "$sentinel" ]
}
ok wait_for 5 new_sentinel
victims=$(pids_of "$T"/w2.* "$T"/gc2.*)
kill -KILL "$pid"
ok wait_for 2 none_alive $victims
done_testing
