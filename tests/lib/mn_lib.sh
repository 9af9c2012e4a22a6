# Helpers for the multi-node mglaunch tests: one agent per test host
# (tests/lib/netns.sh), and checks of what their workers saw. Source after lib.sh
# and netns.sh.
#
#   node I NAME ARGS...   starts `mglaunch ARGS...` on host I in the background;
#                         output in $T/NAME.out / $T/NAME.err, pid in PID_NAME
#   node_wait NAME        waits for it; its exit status in $RC
#   nodes_wait NAMES...   waits for each, in that order; their exit statuses in
#                         RC_NAME and, space-separated, in $RCS
#   check_exits DESC WANT NAMES...
#                         nodes_wait NAMES, then one test: $RCS is WANT ("0 0");
#                         when it is not, the agents' last lines follow
#   check_world DESC W NAMES...
#                         the workers of the agents NAMES together have ranks
#                         0..W-1 once each, WORLD_SIZE W, one MASTER_ADDR:PORT,
#                         and every one reached rank 0 there ("reach ok")
#   out_has NAME REGEX    the agent's stdout+stderr match REGEX
#   agent_pid NAME        prints the pid of the agent's mglaunch process (to
#                         freeze it with SIGSTOP)
#   c10d_endpoint         EP, HOST0 and OTHER for a c10d job hosted on host 0

MN_WORKER=$HELPERS/mn_worker
MN_HB="heartbeat_interval=0.2,heartbeat_timeout=2"

# c10d_endpoint: sets EP, the endpoint on host 0 (port 29400 in its own
# namespace, a free port on shared loopback), and HOST0 / OTHER, --rdzv_conf
# suffixes that say who hosts the store where every loopback address is local.
c10d_endpoint() {
    EP="$(host_addr 0):29400" HOST0= OTHER=
    if [ "$HOSTS_MODE" = loopback ]; then
        EP="$(host_addr 0):$(free_port)"
        HOST0=",is_host=1"
        OTHER=",is_host=0"
    fi
}

node() {
    _i=$1
    _n=$2
    shift 2
    bg_on "$_i" "$MGLAUNCH" "$@" >"$T/$_n.out" 2>"$T/$_n.err"
    eval "PID_$_n=$!"
}

node_wait() {
    eval "wait \$PID_$1"
    RC=$?
}

nodes_wait() {
    RCS=
    for _nw in "$@"; do
        node_wait "$_nw"
        eval "RC_$_nw=\$RC"
        RCS="${RCS:+$RCS }$RC"
    done
}

check_exits() {
    _ce_desc=$1
    _ce_want=$2
    shift 2
    nodes_wait "$@"
    is "$RCS" "$_ce_want" "$_ce_desc"
    [ "$RCS" = "$_ce_want" ] || node_show "$@"
}

agent_pid() {
    eval "_ap=\$PID_$1"
    while [ "$(cat "/proc/$_ap/comm" 2>/dev/null)" != mglaunch ]; do
        _ap=$(pgrep -P "$_ap" | head -n 1)
        [ -n "$_ap" ] || return 1
    done
    echo "$_ap"
}

out_has() { cat "$T/$1.out" "$T/$1.err" 2>/dev/null | grep -Eq -- "$2"; }

node_show() {
    for _f in "$@"; do
        cat "$T/$_f.out" "$T/$_f.err" 2>/dev/null | grep -v '^reach ok' | tail -n 15 | sed "s/^/#   $_f: /"
    done
}

# The env lines of each agent's last attempt (its last LOCAL_WORLD_SIZE lines).
_env_lines() {
    for _f in "$@"; do
        grep '^env ' "$T/$_f.out" | awk '{ l[NR] = $0 } END {
            n = l[NR]; sub(/.* local_world=/, "", n); sub(/ .*/, "", n)
            for (i = NR - n + 1; i <= NR; i++) if (i > 0) print l[i] }'
    done
}

check_world() {
    _desc=$1
    _w=$2
    shift 2
    _lines=$(_env_lines "$@")
    _ranks=$(printf '%s\n' "$_lines" | sed -n 's/.* rank=\([0-9]*\) .*/\1/p' | sort -n | tr '\n' ' ')
    _want=$(seq 0 $((_w - 1)) | tr '\n' ' ')
    _worlds=$(printf '%s\n' "$_lines" | sed -n 's/.* world=\([0-9]*\) .*/\1/p' | sort -u | tr '\n' ' ')
    _masters=$(printf '%s\n' "$_lines" | sed -n 's/.* master=\([^ ]*\) .*/\1/p' | sort -u | wc -l)
    # Every worker of the last attempts reached rank 0 (earlier attempts may add more).
    _reached=$(for _f in "$@"; do grep -c '^reach ok' "$T/$_f.out"; done | awk '{s+=$1} END {print s+0}')
    [ "$_reached" -ge "$_w" ] && _reached=$_w
    if [ "$_ranks" = "$_want" ] && [ "$_worlds" = "$_w " ] && [ "$_masters" = 1 ] &&
        [ "$_reached" = "$_w" ]; then
        _result 0 "$_desc"
    else
        _result 1 "$_desc"
        printf '#   ranks: %s (want %s) worlds: %s masters: %s reached: %s\n' "$_ranks" "$_want" \
            "$_worlds" "$_masters" "$_reached"
        node_show "$@"
    fi
}
