#!/bin/sh
# `mglaunch logs`: on a finished run, a failed run, a running run and a run
# whose launcher was SIGKILLed; the selectors --run, --attempt, --rank,
# --stream, --tail, --grep and --follow (also across a restart).
# timeout: 90
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
L=$T/logs
ready() { [ -e "$1" ]; }

# ---- a finished run
"$MGLAUNCH" --log_dir "$L" --rdzv_id ok1 --nproc_per_node 2 "$FW" out "hello from \${local_rank}" \
    'if' rank=1 out-lines 1000 'if' rank=1 err "a warning" >/dev/null 2>&1
out=$("$MGLAUNCH" logs "$L")
is $? 0 "logs on a finished run"
like "$out" "\\* ok1 +[0-9-]+ [0-9:]+ +succeeded +1" "the run listed as succeeded"
like "$out" "attempt 0 \\(restart 0\\), started [0-9-]+ [0-9:.]+: succeeded after" "its attempt"
like "$out" "local rank 1   rank 1    pid [0-9]+ +succeeded: exit 0 after" "its ranks"
out=$("$MGLAUNCH" logs "$L" --rank 1 --stream stdout --tail 2)
is "$(echo "$out" | wc -l | tr -d ' ')" 2 "--tail 2: two lines"
like "$out" "^[a-z]{99}
[a-z]{99}$" "one file: raw lines"
out=$("$MGLAUNCH" logs "$L" --rank 0)
is "$out" "[0:out] hello from 0" "--rank 0: both streams, prefixed, empty stderr"
out=$("$MGLAUNCH" logs "$L" --grep 'hello|warning')
is "$(echo "$out" | sort)" "[0:out] hello from 0
[1:err] a warning
[1:out] hello from 1" "--grep over every rank and stream"
out=$("$MGLAUNCH" logs "$L" --stream=err --grep warn --tail 5)
is "$out" "[1:err] a warning" "--grep with --tail"

# ---- a failed run with a restart; another run listed alongside
"$MGLAUNCH" --log_dir "$L" --rdzv_id bad1 --nproc_per_node 2 --max_restarts 1 "$FW" \
    out "attempt line" 'if' rank=0,restart=0 touch "$T/printed0" \
    'if' rank=0,restart=1 touch "$T/printed1" 'if' rank=1,restart=0 wait-file "$T/printed0" \
    'if' rank=1,restart=1 wait-file "$T/printed1" \
    'if' rank=1 error-json "KeyError: 'lr'" 'if' rank=1 exit 3 sleep 5 \
    >/dev/null 2>&1
out=$("$MGLAUNCH" logs "$L")
like "$out" "  ok1 " "both runs listed"
like "$out" "\\* bad1 .*failed \\(exit 3\\) +2" "the latest selected: failed, 2 attempts"
like "$out" "local rank 1   rank 1    pid [0-9]+ +failed: exit 3 after [^\"]*\"KeyError: 'lr'\"" \
    "the failed rank with its message"
like "$out" "local rank 0   rank 0    pid [0-9]+ +stopped: killed by SIGTERM \\(exit 143\\)" \
    "the stopped rank"
like "$out" "Root cause \\(first failure\\):
  rank      : 1 \\(local rank 1\\)
  host      : $(hostname)
  pid       : [0-9]+
  attempt   : 0 \\(restart 0\\)
  time      : " "root cause"
like "$out" "  message   : KeyError: 'lr'" "root cause message from error.json"
like "$out" "  logs      : $L/bad1/attempt_0/1" "root cause logs"
out=$("$MGLAUNCH" logs "$L" --run ok1)
like "$out" "run ok1 \\($L/ok1\\)" "--run selects a run"
out=$("$MGLAUNCH" logs "$L" --attempt 0)
unlike "$out" "attempt 1 \\(" "--attempt 0 lists that attempt only"
out=$("$MGLAUNCH" logs "$L" --run bad1 --rank 0 --stream out)
is "$out" "attempt line" "content of the last attempt by default"
out=$("$MGLAUNCH" logs "$L" --run bad1 --rank 0 --stream out --attempt all)
is "$out" "[attempt_0 0:out] attempt line
[attempt_1 0:out] attempt line" "--attempt all"
"$MGLAUNCH" logs "$L" --run nope >/dev/null 2>"$T/err"
is $? 1 "unknown run: exit 1"
like "$(cat "$T/err")" "mglaunch logs: no run 'nope'" "and says so"
"$MGLAUNCH" logs "$L" --run bad1 --attempt 7 --rank 0 >/dev/null 2>"$T/err"
is $? 1 "unknown attempt: exit 1"
for args in "--bogus" "--bogus x" "--stream x" "--attempt"; do
    # shellcheck disable=SC2086
    "$MGLAUNCH" logs "$L" $args >/dev/null 2>"$T/err"
    is $? 2 "bad usage ($args): exit 2"
done
like "$("$MGLAUNCH" logs "$L" --bogus 2>&1)" "unknown option '--bogus'" \
    "an unknown option last on the line is called unknown"
like "$("$MGLAUNCH" logs "$L" --attempt 2>&1)" "option --attempt needs a value" \
    "a known option without its value says so"

# ---- a running run, then the same run after its launcher was SIGKILLed
bg "$MGLAUNCH" --log_dir "$L" --rdzv_id live --nproc_per_node 2 "$FW" out "live line" \
    touch "$T/live.\${local_rank}" sleep 60 >/dev/null 2>&1
pid=$!
ok wait_for 10 ready "$T/live.1"
out=$("$MGLAUNCH" logs "$L" --run live)
like "$out" "launcher pid $pid on $(hostname), started .*, running" "a running run"
like "$out" "local rank 0   rank 0    pid [0-9]+ +running" "its ranks running"
ok wait_for 5 sh -c "\"$MGLAUNCH\" logs \"$L\" --run live --rank 1 | grep -q 'live line'"
kill -KILL "$pid"
wait "$pid" 2>/dev/null
out=$("$MGLAUNCH" logs "$L" --run live)
like "$out" "\\* live .*launcher died" "the killed run is marked"
like "$out" "attempt 0 \\(restart 0\\), started .*: not finished" "its attempt never finished"
like "$out" "local rank 1   rank 1    pid [0-9]+ +no exit recorded \\(launcher died\\)" \
    "its workers have no recorded exit"
out=$("$MGLAUNCH" logs "$L" --run live --rank 0 --stream stdout)
is "$out" "live line" "its logs are readable"

# ---- --follow: lines as they come, across a restart, until the run ends
bg "$MGLAUNCH" --log_dir "$L" --rdzv_id fol --max_restarts 1 "$FW" touch "$T/fol.go" \
    out "tick 1" sleep 0.3 out "tick 2" sleep 0.3 'if' restart=0 exit 1 out "tick 3" \
    >/dev/null 2>&1
pid=$!
ok wait_for 10 ready "$T/fol.go"
out=$("$MGLAUNCH" logs "$L" --run fol --follow --stream stdout)
is $? 0 "--follow returns when the run ends"
is "$out" "tick 1
tick 2
==> attempt_1 <==
tick 1
tick 2
tick 3" "--follow printed every line, and followed the restart"
wait "$pid"
is $? 0 "the followed run succeeded"

# ---- numbers past an int in the event log: never shown cut to another number
"$MGLAUNCH" --log_dir "$T/big" "$FW" >/dev/null 2>&1
ev=$(ls "$T"/big/*/events.jsonl)
sed -i 's/"attempt":0/"attempt":99999999999/g; s/"pid":\([0-9]*\)/"pid":4294967297/g' "$ev"
out=$("$MGLAUNCH" logs "$T/big" 2>&1)
is "$?" 0 "an event log with attempt 99999999999: still read"
unlike "$out" "1215752191|pid 1 " "  no number is shown cut to an int (1215752191, a pid of 4294967297 as 1)"
like "$out" "attempt 0 \\(restart 0\\), started \\?" \
    "  the attempt is its directory's, the event's number ignored as out of range"

# ---- the default directory
"$MGLAUNCH" --rdzv_id indef "$FW" >/dev/null 2>&1
out=$("$MGLAUNCH" logs)
like "$out" "\\* indef " "without LOG_DIR: the private default directory"
done_testing
