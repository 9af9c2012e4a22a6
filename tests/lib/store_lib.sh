# Shared by the store_*.t tests (after ../lib.sh): start a store server
# (tests/helpers/storesrv) and read its statistics.
#
#   start_store [storesrv options]   sets SRV_PID, PORT, ADDR (127.0.0.1:PORT)
#   store_stat NAME                  prints one statistic (clients, dropped, ...)
#   ctl ARGS...                      storectl ADDR ARGS... (options before ADDR: ctlx)

start_store() {
    rm -f "$T/port" "$T/stats"
    bg "$HELPERS/storesrv" --port-file "$T/port" --stats-file "$T/stats" "$@"
    SRV_PID=$!
    wait_for 10 test -s "$T/port" || bail "storesrv starts"
    PORT=$(cat "$T/port")
    ADDR=127.0.0.1:$PORT
}

store_stat() {
    rm -f "$T/stats"
    kill -USR1 "$SRV_PID" 2>/dev/null || return 1
    wait_for 5 test -s "$T/stats" || return 1
    tr ' ' '\n' <"$T/stats" | sed -n "s/^$1=//p"
}

# Waits until a statistic has a value (e.g. clients back to 1).
wait_stat() {
    _ws_end=$(($(date +%s) + $3))
    while [ "$(store_stat "$1")" != "$2" ]; do
        [ "$(date +%s)" -ge $_ws_end ] && return 1
        sleep 0.05
    done
    return 0
}

ctl() { "$HELPERS/storectl" "$ADDR" "$@"; }
