# Shared helpers for the integration tests (shell scripts that print TAP).
#
#   . "$(dirname "$0")/../lib/lib.sh"
#   ok CMD...            runs CMD; passes when it exits 0     (desc: $DESC or the command)
#   is GOT WANT DESC     string equality
#   like GOT REGEX DESC  extended-regex match
#   diag MSG             comment line
#   skip_all REASON      whole file skipped
#   done_testing         prints the plan, exits 1 when something failed
#   at_cleanup CMD       run CMD on every exit path (LIFO)
#   bg CMD...            start CMD in the background; its pid is in $! and is killed at cleanup
#   free_port            prints a TCP port nobody listens on
#   wait_for SECS CMD... polls CMD every 50 ms until it succeeds; fails after SECS
#
# Every test gets $T, a private temporary directory removed at exit, and
# $MGLAUNCH, $TRAIN and $HELPERS pointing at the binaries under test.

set -u
TOP=$(cd "$(dirname "$0")/../.." && pwd)
MG_BUILD=${MG_BUILD:-build}
case $MG_BUILD in /*) ;; *) MG_BUILD=$TOP/$MG_BUILD ;; esac
MGLAUNCH=$MG_BUILD/bin/mglaunch
TRAIN=$MG_BUILD/bin/train
HELPERS=$MG_BUILD/tests/helpers
T=$(mktemp -d "${TMPDIR:-/tmp}/mgtest.XXXXXX")
# mglaunch's default log directory, ${TMPDIR:-/tmp}/mglaunch-<uid>, and every
# other temporary file a test's programs make land in $T and go with it.
export TMPDIR=$T
_tap_n=0
_tap_fail=0
_cleanups=""
_bg_pids=""

_run_cleanup() {
    _rc=$?
    trap - EXIT INT TERM
    for p in $_bg_pids; do
        kill -KILL -- "-$p" 2>/dev/null
        kill -KILL "$p" 2>/dev/null
    done
    eval "$_cleanups"
    rm -rf "$T"
    exit $_rc
}
trap _run_cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

at_cleanup() { _cleanups="$*; $_cleanups"; }

bg() {
    setsid "$@" &
    _bg_pids="$_bg_pids $!"
}

_result() {
    _tap_n=$((_tap_n + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $_tap_n - $2"
    else
        _tap_fail=$((_tap_fail + 1))
        echo "not ok $_tap_n - $2"
    fi
}

ok() {
    "$@"
    _result $? "${DESC:-$*}"
}

is() {
    if [ "$1" = "$2" ]; then
        _result 0 "$3"
    else
        _result 1 "$3"
        printf '#   got:  %s\n#   want: %s\n' "$1" "$2" | head -n 40
    fi
}

like() {
    if printf '%s' "$1" | grep -Eq -- "$2"; then
        _result 0 "$3"
    else
        _result 1 "$3"
        printf '#   got:  %s\n#   want match: %s\n' "$1" "$2" | head -n 40
    fi
}

unlike() {
    if printf '%s' "$1" | grep -Eq -- "$2"; then
        _result 1 "$3"
        printf '#   got:  %s\n#   must not match: %s\n' "$1" "$2" | head -n 40
    else
        _result 0 "$3"
    fi
}

diag() { printf '# %s\n' "$*"; }

skip_all() {
    echo "1..0 # SKIP $*"
    exit 0
}

done_testing() {
    echo "1..$_tap_n"
    [ $_tap_fail -eq 0 ]
    exit $?
}

# A set-up step failed and nothing after it can run: one failed test, then stop.
bail() {
    _result 1 "$1"
    done_testing
}

free_port() {
    # Ask the kernel for an ephemeral port by binding port 0.
    "$HELPERS/freeport" 2>/dev/null || python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_for() {
    _secs=$1
    shift
    _end=$(($(date +%s%N) / 1000000 + _secs * 1000))
    while ! "$@" 2>/dev/null; do
        [ $(($(date +%s%N) / 1000000)) -ge $_end ] && return 1
        sleep 0.05
    done
    return 0
}
