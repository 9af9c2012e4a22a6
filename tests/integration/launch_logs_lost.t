#!/bin/sh
# `mglaunch logs` says what it knows of output that is not on disk: without
# --log_dir, the failed rank's stderr tail the launcher kept (event log's
# worker_logs), "not saved" and never "(empty)"; on a full disk (a 1 MiB
# tmpfs this test mounts), "cut short (disk full)" with the kept tail. And the
# run list's command column and its filters (PROGRAM, --cmd).
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
export TMPDIR=$T/tmp
mkdir -p "$TMPDIR"

# ---- no --log_dir: the kept tail, "not saved"
"$MGLAUNCH" --nproc_per_node 2 "$FW" 'if' rank=1 err "Traceback: ValueError: boom" \
    'if' rank=1 exit 3 sleep 5 >/dev/null 2>&1
is $? 3 "a failed run without --log_dir"
out=$("$MGLAUNCH" logs)
unlike "$out" "\\(empty\\)" "no '(empty)' for a stderr that was not saved"
is "$(printf '%s\n' "$out" | sed -n '/^  stderr (last lines):/,$p')" "  stderr (last lines):
    Traceback: ValueError: boom
  logs      : $(printf '%s\n' "$out" | sed -n 's/^  logs      : //p')" \
    "the root cause shows the stderr tail the launcher kept"
like "$out" "  logs      : .* \\(stdout/stderr not saved: use --log_dir\\)" \
    "and says the logs were not saved"
grep -q '"event":"worker_logs".*"stdout":"not saved","stderr":"not saved","stderr_tail":"Traceback: ValueError: boom"' \
    "$TMPDIR"/mglaunch-*/*/events.jsonl
is $? 0 "the event log's worker_logs records it"

out=$("$MGLAUNCH" logs --rank 1)
is "$out" "[attempt_0 1:err, kept] Traceback: ValueError: boom" \
    "--rank 1 without saved logs: the stderr lines the launcher kept, marked so"
"$MGLAUNCH" logs --rank 0 >/dev/null 2>"$T/err"
is $? 1 "--rank 0 (nothing kept, nothing saved): exit 1"
like "$(cat "$T/err")" "no log files saved for this selection" "and says so"

# the kept tail goes to disk: its secrets are hidden as the event log's command line's are
mkdir -p "$T/tmp2"
TMPDIR=$T/tmp2 "$MGLAUNCH" --nproc_per_node 1 "$FW" err "HTTPError: https://alice:hunter2pw@db.example/x" \
    exit 3 >/dev/null 2>&1
out=$(TMPDIR=$T/tmp2 "$MGLAUNCH" logs)
like "$out" "HTTPError: https://alice:\\*\\*\\*@db.example/x" "the kept stderr tail is shown with its password hidden"
grep -l hunter2pw "$T"/tmp2/mglaunch-*/*/events.jsonl >/dev/null
is $? 1 "  and no event log holds it"

# a failed rank that printed nothing: "(empty)" is then true, since the launcher watched it
"$MGLAUNCH" --nproc_per_node 1 "$FW" exit 4 >/dev/null 2>&1
like "$("$MGLAUNCH" logs)" "  stderr    : \\(empty\\)" "a silent failed rank: (empty), which is true"

# ---- the run list: a command column, PROGRAM and --cmd filters
"$MGLAUNCH" --nproc_per_node 1 "$FW" out "second program" >/dev/null 2>&1
ln -s "$FW" "$T/other_prog"
"$MGLAUNCH" --nproc_per_node 1 -t 3 "$T/other_prog" out "hello" >/dev/null 2>&1
out=$("$MGLAUNCH" logs)
like "$out" "  RUN +STARTED +STATUS +ATTEMPTS COMMAND" "the list has a COMMAND column"
like "$out" "failed \\(exit 3\\) +1 +fakeworker if rank=1 err Traceback: ValueError: boom if r\\.\\.\\.$" \
    "a run's program (its name) and first arguments, cut at 60 characters"
like "$out" "\\* [0-9a-f-]+ +[0-9-]+ [0-9:]+ +succeeded +1 +other_prog out hello$" "the latest run selected, with its command"
out=$("$MGLAUNCH" logs fakeworker)
is "$(echo "$out" | grep -c '^[ *] [0-9]')" 3 "PROGRAM keeps the runs of that program only"
like "$out" "\\* [0-9a-f-]+ .*succeeded +1 +fakeworker out second program$" "and selects the latest of them"
cp "$FW" "$T/fakeworker" # run where the program lies, as users do: the file is no log directory
out=$(cd "$T" && "$MGLAUNCH" logs fakeworker)
is "$(echo "$out" | grep -c '^[ *] [0-9]')" 3 "  also from the directory that holds a file of that name"
out=$("$MGLAUNCH" logs "$TMPDIR/mglaunch-$(id -u)" other_prog --rank 0 --stream out)
is "$out" "hello" "LOG_DIR PROGRAM with a content selector: that program's latest run"
out=$("$MGLAUNCH" logs --cmd 'rank=1 err')
is "$(echo "$out" | grep -c '^[ *] [0-9]')" 1 "--cmd TEXT keeps the runs whose command has TEXT"
like "$out" "\\* .*failed \\(exit 3\\)" "and selects it"
"$MGLAUNCH" logs nosuchprog >/dev/null 2>"$T/err"
is $? 1 "no run of a program: exit 1"
is "$(cat "$T/err")" "mglaunch logs: no directory 'nosuchprog', and no run of program 'nosuchprog' in '$TMPDIR/mglaunch-$(id -u)'" \
    "and it says so, naming both readings"
"$MGLAUNCH" logs --cmd zzz >/dev/null 2>"$T/err"
like "$(cat "$T/err")" "no run with 'zzz' in its command in '.*' \\(4 other runs there\\)" \
    "--cmd without a match says so"

# ---- a full disk: cut short, and the tail the launcher kept
D=$T/small
mkdir -p "$D"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=1m tmpfs "$D" 2>/dev/null; then
    at_cleanup "umount '$D'"
    "$MGLAUNCH" --log_dir "$D" --rdzv_id full --nproc_per_node 2 "$FW" \
        'if' rank=1 err-bytes 2000000 'if' rank=1 err '' 'if' rank=1 err "Traceback: RuntimeError: the end" \
        'if' rank=1 exit 5 sleep 5 >/dev/null 2>"$T/full.err"
    is $? 5 "a run whose stderr fills the disk fails with its own exit code"
    like "$(cat "$T/full.err")" "warning: cannot write the log of local rank 1 \\(stderr\\): No space left on device" \
        "the launcher said so as it happened"
    out=$("$MGLAUNCH" logs "$D")
    is "$(printf '%s\n' "$out" | grep -A1 'local rank 1 ' | tail -n 1)" \
        "      stderr.log cut short: disk full" \
        "the rank's listing says its stderr.log was cut short (disk full)"
    is "$(printf '%s\n' "$out" | sed -n '/^  stderr (last lines):/,$p' | tail -n 2)" \
        "    Traceback: RuntimeError: the end
  logs      : $D/full/attempt_0/1 (stderr.log cut short: disk full)" \
        "the root cause shows the end of stderr the launcher kept, and says the log was cut short"
    DESC="stderr.log is indeed shorter than what the rank wrote" \
        ok [ "$(stat -c %s "$D/full/attempt_0/1/stderr.log")" -lt 1000000 ]
    unlike "$out" "\\(empty\\)" "never '(empty)'"
else
    ok 1 "# SKIP a full disk needs root to mount a small tmpfs"
fi
done_testing
