#!/bin/sh
# Worker output: the log layout and its attempt numbering, -r/-t (single values
# and per-rank maps), the console prefix and its template, '\r' progress bars,
# partial lines, lines of several ranks never mixing, --local_ranks_filter.
# timeout: 90
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
L=$T/logs

# ---- layout: every stream saved with --log_dir; attempts never reused
"$MGLAUNCH" --log_dir "$L" --rdzv_id lay --nproc_per_node 2 "$FW" out "first run" err "first err" \
    >"$T/out" 2>"$T/err"
is $? 0 "first run"
for r in 0 1; do
    is "$(cat "$L/lay/attempt_0/$r/stdout.log")" "first run" "rank $r stdout.log"
    is "$(cat "$L/lay/attempt_0/$r/stderr.log")" "first err" "rank $r stderr.log"
done
ok test ! -e "$L/lay/attempt_0/0/error.json"
ok test -s "$L/lay/events.jsonl"
"$MGLAUNCH" --log_dir "$L" --rdzv_id lay --nproc_per_node 2 "$FW" out "second run" \
    >/dev/null 2>&1
is "$(cat "$L/lay/attempt_1/1/stdout.log")" "second run" "same run id again: attempt_1"
is "$(cat "$L/lay/attempt_0/1/stdout.log")" "first run" "attempt_0 untouched"
is "$(grep -c '"event":"run_start"' "$L/lay/events.jsonl")" 2 "event log appended, not replaced"
is "$(cat "$T/out")" "first run
first run" "default (-t 0): console gets the lines, unprefixed"

# ---- -t: tee with the default prefix; -r: redirect (file only)
"$MGLAUNCH" --log_dir "$L" --rdzv_id tee --nproc_per_node 2 -t 3 "$FW" out o err e \
    >"$T/out" 2>"$T/err"
is "$(sort "$T/out")" "[default0]:o
[default1]:o" "-t 3: stdout prefixed [default<local_rank>]:"
is "$(sort "$T/err")" "[default0]:e
[default1]:e" "-t 3: stderr prefixed"
"$MGLAUNCH" --log_dir "$L" --rdzv_id red --nproc_per_node 2 -r 1 "$FW" out o err e \
    >"$T/out" 2>"$T/err"
is "$(cat "$T/out")" "" "-r 1: stdout not on the console"
is "$(cat "$T/err")" "e
e" "-r 1: stderr still on the console"
is "$(cat "$L/red/attempt_0/0/stdout.log")" "o" "-r 1: stdout in the file"
"$MGLAUNCH" --log_dir "$L" --rdzv_id map --nproc_per_node 12 -t 0:1,11:2 -r 11:1 "$FW" out o \
    err e >"$T/out" 2>"$T/err"
is "$(grep -c '^\[default0\]:o$' "$T/out")" 1 "map: rank 0 stdout tee'd"
is "$(grep -c '^o$' "$T/out")" 10 "map: ranks 1-10 unprefixed, rank 11 stdout redirected"
is "$(grep -c '^\[default11\]:e$' "$T/err")" 1 "map: two-digit rank 11 stderr tee'd"
is "$(grep -c '^e$' "$T/err")" 11 "map: other stderr plain"
is "$(cat "$L/map/attempt_0/11/stdout.log")" o "map: redirected rank's file"

# without --log_dir, -r/-t still save what they select (in the private directory)
"$MGLAUNCH" --rdzv_id nolog -t 1 "$FW" out saved err notsaved >/dev/null 2>&1
d=$T/mglaunch-$(id -u)/nolog/attempt_0/0
is "$(cat "$d/stdout.log")" saved "-t 1 without --log_dir: stdout saved"
ok test ! -e "$d/stderr.log"

# ---- the template
"$MGLAUNCH" --nproc_per_node 2 --role trainer \
    --log_line_prefix_template '<${role_name}|${rank}|${local_rank}|${hostname}> ' \
    "$FW" out x >"$T/out" 2>/dev/null
h=$(hostname)
is "$(sort "$T/out")" "<trainer|0|0|$h> x
<trainer|1|1|$h> x" "--log_line_prefix_template with every placeholder"

# ---- '\r' progress bars and partial lines
"$MGLAUNCH" --log_dir "$L" --rdzv_id cr -t 1 "$FW" progress 3 outn "part" sleep 0.2 \
    outn "ial" sleep 0.2 out " line" outn "no newline at exit" >"$T/out" 2>/dev/null
printf '[default0]:progress 1/3\r[default0]:progress 2/3\r[default0]:progress 3/3\r\n' >"$T/want"
printf '[default0]:partial line\n[default0]:no newline at exit\n' >>"$T/want"
ok cmp "$T/out" "$T/want"
printf 'progress 1/3\rprogress 2/3\rprogress 3/3\r\npartial line\nno newline at exit' >"$T/want"
ok cmp "$L/cr/attempt_0/0/stdout.log" "$T/want"

# ---- lines of several ranks never mix inside a line
"$MGLAUNCH" --nproc_per_node 4 -t 3 "$FW" out-lines 400000 >"$T/out" 2>/dev/null
is "$(wc -l <"$T/out" | tr -d ' ')" 16000 "every line arrived"
bad=$(grep -cvE '^\[default[0-3]\]:([a-z]{99})$' "$T/out")
is "$bad" 0 "no line mixes two ranks"

# ---- --local_ranks_filter: console only; files keep everything
"$MGLAUNCH" --log_dir "$L" --rdzv_id filt --nproc_per_node 3 --local_ranks_filter 0,2 -t 3 \
    "$FW" out o err e >"$T/out" 2>"$T/err"
is "$(sort "$T/out")" "[default0]:o
[default2]:o" "only ranks 0 and 2 on the console"
# (3 workers on a 2-core machine also get mglaunch's warning: launch_cpus.t)
is "$(grep -v '^mglaunch: warning: --nproc_per_node' "$T/err" | sort)" "[default0]:e
[default2]:e" "stderr filtered too"
is "$(cat "$L/filt/attempt_0/1/stdout.log")" o "the filtered rank's file is complete"
done_testing
