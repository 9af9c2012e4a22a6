#!/bin/sh
# On a terminal, the rank whose console output is shown runs on a
# pseudo-terminal: driven through tmux as a user would, pdb stops at
# breakpoint() in rank 0 and steps; the worker sees a terminal (isatty) of
# the window's size and follows its resizes; the log files still record
# everything, stdout and stderr apart; Ctrl-C (twice) and Ctrl-Z do what they
# do to mglaunch, and the terminal is given back as it was.
# timeout: 300
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
command -v tmux >/dev/null || skip_all "tmux is not installed (apt-get install tmux)"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
[ -n "$PY" ] || skip_all "no python3"
L=$T/logs
SOCK=
tmx() { tmux -S "$SOCK" "$@"; }
pane() { tmx capture-pane -p -J -S -200 2>/dev/null; }
shows() { pane | grep -qE -- "$1"; }
# How long to wait for pdb, the job or mglaunch to answer: generous, since
# under load (the full suite on two cores) a Python start or a pdb step can
# take many seconds; every wait ends as soon as what it waits for shows.
W=90
# at_prompt: pdb waits for a command (the pane is shown when it does not come)
at_prompt() {
    wait_for $W shows '^\(Pdb\) $' && return 0
    pane | grep -v '^$' | tail -n 8 | sed 's/^/#   pane: /'
    return 1
}
# pdb_says PATTERN: pdb answered the command sent with PATTERN, and prompts again
pdb_says() {
    wait_for $W shows "$1" && at_prompt && return 0
    pane | grep -v '^$' | tail -n 8 | sed 's/^/#   pane: /'
    return 1
}
# worker_tty NAME: the pseudo-terminal of the job's rank on a terminal
# (its stdin), not the window's own
worker_tty() {
    _own=$(tmx display -p '#{pane_tty}')
    for _c in $(cat /proc/"$(cat "$T/$1.pid")"/task/*/children 2>/dev/null); do
        _t=$(readlink "/proc/$_c/fd/0" 2>/dev/null)
        case $_t in /dev/pts/*) [ "$_t" != "$_own" ] && echo "$_t" && return 0 ;; esac
    done
    return 1
}

cat >"$T/dbg.py" <<'EOF'
import os, sys
r = int(os.environ["RANK"])
size = os.get_terminal_size() if sys.stdout.isatty() else None
print(f"rank {r} isatty {sys.stdin.isatty()} {sys.stdout.isatty()} {sys.stderr.isatty()} size {size}",
      flush=True)
print(f"rank {r} to stderr", file=sys.stderr, flush=True)
if r == 0:
    x = 1
    breakpoint()
    y = x + 41
    print("y is", y)
EOF

# start NAME ARGS...: mglaunch ARGS in a 100x30 window of a tmux server of
# its own; its exit code lands in $T/NAME.exit, its pid in $T/NAME.pid, the
# terminal's settings after it in $T/NAME.stty
start() {
    _n=$1
    shift
    SOCK=$T/tmux.$_n
    at_cleanup "tmux -S $SOCK kill-server 2>/dev/null"
    printf '%s\n' "echo \$\$ >'$T/$_n.pid'; PYTHON_EXEC=$PY exec '$MGLAUNCH' $*" >"$T/$_n.sh"
    # the terminal's settings are saved before the exit code the test waits for
    tmx new-session -d -x 100 -y 30 \
        "sh '$T/$_n.sh'; rc=\$?; stty -a >'$T/$_n.stty'; echo \$rc >'$T/$_n.exit'; sleep 60"
}

# ---- pdb in rank 0, stepping; the window resized under it
start dbg --nproc_per_node 2 --log_dir "$L" --rdzv_id dbg "$T/dbg.py"
ok at_prompt
like "$(pane)" "rank 0 isatty True True True size os.terminal_size\\(columns=100, lines=30\\)" \
    "rank 0 runs on a terminal of the window's size"
like "$(pane)" "rank 1 isatty False False False size None" "rank 1 on pipes, as before"
like "$(pane)" "-> y = x \\+ 41" "breakpoint() stops rank 0 in pdb"
tmx send-keys "n" Enter
ok pdb_says '^-> print\("y is", y\)'
tmx send-keys "p y" Enter
ok pdb_says '^42$'
wtty=$(worker_tty dbg)
like "$wtty" "^/dev/pts/[0-9]+$" "rank 0's terminal is a pseudo-terminal of mglaunch's"
tmx resize-window -x 120 -y 40
sized() { [ "$(stty -F "$wtty" size)" = "40 120" ]; }
ok wait_for $W sized
tmx send-keys "p os.get_terminal_size()" Enter
ok pdb_says 'terminal_size\(columns=120, lines=40\)'
tmx send-keys "c" Enter
ok wait_for $W test -s "$T/dbg.exit"
is "$(cat "$T/dbg.exit")" 0 "the job completes after 'c'"
like "$(pane)" "^y is 42" "rank 0 went on"
out=$(cat "$L/dbg/attempt_0/0/stdout.log")
like "$out" "\\(Pdb\\) n" "stdout.log has the session, commands included"
like "$out" "y is 42" "  and what followed"
is "$(cat "$L/dbg/attempt_0/0/stderr.log")" "rank 0 to stderr" "stderr.log keeps stderr apart"
like "$(cat "$T/dbg.stty")" "[^-]icanon .*[^-]echo " "the terminal is given back with line editing and echo"

# ---- --local_ranks_filter picks the rank that gets the terminal
start filt --nproc_per_node 2 --local_ranks_filter 1 --no_python "$PY" -c \
    "'import os,sys; print(os.environ[\"RANK\"], sys.stdout.isatty())'"
ok wait_for $W test -s "$T/filt.exit"
like "$(pane)" "^1 True" "--local_ranks_filter 1: rank 1 is on the terminal"
unlike "$(pane)" "^0 " "  and rank 0 is not shown"

# ---- Ctrl-C: the first stops the workers (pdb catches it), the second kills them
start intr --nproc_per_node 2 "$T/dbg.py"
ok at_prompt
tmx send-keys C-c
ok wait_for $W shows 'SIGINT: stopping the workers'
tmx send-keys C-c
ok wait_for $W test -s "$T/intr.exit"
is "$(cat "$T/intr.exit")" 130 "Ctrl-C twice: exit 130"
like "$(cat "$T/intr.stty")" "[^-]icanon .*[^-]echo " "the terminal is given back"

# ---- Ctrl-Z stops mglaunch and its workers, and gives the terminal back
# until mglaunch is continued
start stop --nproc_per_node 2 "$T/dbg.py"
ok at_prompt
tty=$(tmx display -p '#{pane_tty}')
like "$(stty -F "$tty" -a)" "-icanon" "while a worker is on a terminal: no line editing on mglaunch's"
tmx send-keys C-z
pid=$(cat "$T/stop.pid")
stopped() { grep -q '^State:.*T' "/proc/$1/status"; }
ok wait_for $W stopped "$pid"
like "$(stty -F "$tty" -a)" "[^-]icanon" "Ctrl-Z: the terminal as it was"
w=$(cat /proc/$pid/task/*/children | tr ' ' '\n' | while read -r c; do
    [ -n "$c" ] && grep -q python "/proc/$c/cmdline" 2>/dev/null && echo "$c"; done | head -n 1)
ok stopped "$w"
kill -CONT "$pid"
running() { ! stopped "$1"; }
ok wait_for $W running "$pid"
ok wait_for $W running "$w"
like "$(stty -F "$tty" -a)" "-icanon" "continued: back to the worker's terminal"
tmx send-keys "c" Enter
ok wait_for $W test -s "$T/stop.exit"
is "$(cat "$T/stop.exit")" 0 "and the job completes"

# ---- no terminal (this test's own stdin): pipes, as before
out=$("$MGLAUNCH" --no_python "$PY" -c 'import sys; print(sys.stdout.isatty())' </dev/null)
is "$out" "False" "without a terminal, no pseudo-terminal"
done_testing
