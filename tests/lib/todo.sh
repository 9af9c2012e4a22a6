# TAP's TODO directive for the integration tests: a check of behaviour that is
# not there yet, run and reported, which does not fail the test while it fails
# ("not ok 3 - desc # TODO phase 2: ..."); prove reports it when it starts
# passing. Source after lib.sh.
#
#   todo_result RC DESC REASON   one result: passes when RC is 0
#   todo_like GOT REGEX DESC REASON

todo_result() {
    _tap_n=$((_tap_n + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $_tap_n - $2 # TODO $3"
    else
        echo "not ok $_tap_n - $2 # TODO $3"
    fi
}

todo_like() {
    printf '%s' "$1" | grep -Eq -- "$2"
    _rc=$?
    todo_result $_rc "$3" "$4"
    [ $_rc -eq 0 ] || printf '#   got:  %s\n#   want match: %s\n' "$1" "$2" | head -n 20
    return 0
}
