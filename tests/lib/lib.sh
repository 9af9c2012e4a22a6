# Shared helpers for the integration tests (shell scripts that print TAP).
#
#   . "$(dirname "$0")/../lib/lib.sh"
#   ok CMD...            runs CMD; passes when it exits 0     (desc: $DESC or the command)
#   is GOT WANT DESC     string equality
#   like GOT REGEX DESC  extended-regex match
#   unlike GOT REGEX DESC
#   diag MSG             comment line
#   skip_all REASON      whole file skipped
#   bail DESC            a set-up step failed: one failed test, then stop
#   done_testing         prints the plan, exits 1 when something failed
#   files_ready N PREFIX PREFIX.0 .. PREFIX.N-1 exist (workers' marks, for wait_for)
#   alive PID            exists and is not a zombie
#
# and from setup.sh: at_cleanup, bg, free_port, wait_for; $T, a private
# temporary directory removed at exit (also $TMPDIR), and $MGLAUNCH, $TRAIN
# and $HELPERS pointing at the binaries under test.

. "$(dirname "$0")/../lib/setup.sh"
_tap_n=0
_tap_fail=0

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

# like TEXT PATTERN DESC: TEXT matches the extended regular expression
# PATTERN. A PATTERN of several lines matches consecutive lines of TEXT as a
# whole (grep alone would take each line for an alternative, and an empty
# last line would match anything).
_like_match() {
    case "$2" in
    *"
"*) printf '%s' "$1" | P="$2" perl -0777 -e '$t = <STDIN>; exit($t =~ /$ENV{P}/m ? 0 : 1)' ;;
    *) printf '%s' "$1" | grep -Eq -- "$2" ;;
    esac
}

like() {
    if _like_match "$1" "$2"; then
        _result 0 "$3"
    else
        _result 1 "$3"
        printf '#   got:  %s\n#   want match: %s\n' "$1" "$2" | head -n 40
    fi
}

unlike() {
    if _like_match "$1" "$2"; then
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

# files_ready N PREFIX: PREFIX.0 .. PREFIX.N-1 exist
files_ready() {
    _i=0
    while [ $_i -lt "$1" ]; do
        [ -e "$2.$_i" ] || return 1
        _i=$((_i + 1))
    done
}

# alive PID: exists and is not a zombie waiting for its reaper
alive() { [ -r "/proc/$1/stat" ] && ! grep -q ') Z ' "/proc/$1/stat"; }
