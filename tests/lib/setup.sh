# What every test and every benchmark script needs before its first step: the
# paths of the binaries under test, a private temporary directory, and cleanup
# on every exit path. lib.sh (tests, TAP) and bench.sh (benchmarks, tables)
# source it; a script sources one of those, not this file.
#
#   at_cleanup CMD       run CMD on every exit path (LIFO); CMD is evaluated then
#   bg CMD...            start CMD in the background, in its own session; its
#                        pid is in $! and its process group is killed at cleanup
#   free_port            prints a TCP port nobody listens on
#   wait_for SECS CMD... polls CMD every 50 ms until it succeeds; fails after SECS
#
# Sets $TOP (the tree), $MG_BUILD (absolute; build/ unless set), $MGLAUNCH,
# $TRAIN, $HELPERS (the binaries under test), and $T, a private temporary
# directory removed at exit, which is also $TMPDIR and holds $MG_DATA_CACHE.
# The script itself must sit two levels below the top (tests/integration/x.t,
# tests/bench/x.sh).

set -u
TOP=$(cd "$(dirname "$0")/../.." && pwd)
MG_BUILD=${MG_BUILD:-build}
case $MG_BUILD in /*) ;; *) MG_BUILD=$TOP/$MG_BUILD ;; esac
MGLAUNCH=$MG_BUILD/bin/mglaunch
TRAIN=$MG_BUILD/bin/train
HELPERS=$MG_BUILD/tests/helpers
# _t_prefix names the directory (mgtest.*, mgbench.*): leftovers say whose they are.
T=$(mktemp -d "${TMPDIR:-/tmp}/${_t_prefix:-mgtest}.XXXXXX")
# mglaunch's default log directory, ${TMPDIR:-/tmp}/mglaunch-<uid>, and every
# other temporary file the programs make land in $T and go with it.
export TMPDIR=$T
# train's dataset cache too (docs/train.md): a run never reads or leaves one
# outside $T.
export MG_DATA_CACHE=$T/data-cache
_cleanups=""
_bg_pids=""

_run_cleanup() {
    _rc=$?
    trap - EXIT INT TERM
    for p in $_bg_pids; do
        kill -KILL "-$p" 2>/dev/null
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
