# Test hosts for the multi-node tests: network namespaces, each with its own
# address on a private bridge, created by the test and removed on every exit
# path. Source after lib.sh.
#
#   hosts_up N     creates hosts 0..N-1 (and a "switch" namespace holding the
#                  bridge, which also gets an address: the host "sw", e.g. for
#                  etcd). Sets HOSTS_MODE=netns, or, when namespaces cannot be
#                  created (no root, no ip, a sandbox), falls back to loopback
#                  addresses 127.0.0.2... with HOSTS_MODE=loopback and says so.
#   host_addr I    the address of host I (I = sw: the switch)
#   on I CMD...    runs CMD on host I (in the foreground); in netns mode the
#                  host also has its own host name, mgt-h<I> (a UTS namespace),
#                  so host names sort in host order as on a real cluster and
#                  the rendezvous ranks new nodes in that order
#   bg_on I CMD... runs CMD on host I in the background, in its own process
#                  group (killed at cleanup); its pid is in $!
#
# Names start with "mgt<pid>": a test's namespaces are its own, and a sweep at
# start removes those of earlier tests whose process is gone (a test killed
# with SIGKILL cannot clean up after itself). Nothing is created in the root
# namespace: the bridge and every veth end live in the test's namespaces.

NS_PREFIX="mgt$$"
HOSTS_MODE=
HOSTS_N=0
_subnet=

_netns_sweep() {
    for _ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^mgt[0-9]'); do
        _pid=$(printf '%s' "$_ns" | sed 's/^mgt\([0-9]*\).*/\1/')
        [ -n "$_pid" ] && [ ! -d "/proc/$_pid" ] && ip netns del "$_ns" 2>/dev/null
    done
}

_netns_down() {
    for _i in $(seq 0 $((HOSTS_N - 1))); do
        # Whatever still runs in the namespace goes with it.
        for _p in $(ip netns pids "${NS_PREFIX}h$_i" 2>/dev/null); do kill -KILL "$_p" 2>/dev/null; done
        ip netns del "${NS_PREFIX}h$_i" 2>/dev/null
    done
    for _p in $(ip netns pids "${NS_PREFIX}sw" 2>/dev/null); do kill -KILL "$_p" 2>/dev/null; done
    ip netns del "${NS_PREFIX}sw" 2>/dev/null
    return 0
}

_netns_try() {
    _n=$1
    command -v ip >/dev/null 2>&1 || { echo "no ip command (apt-get install iproute2)" >&2; return 1; }
    [ "$(id -u)" = 0 ] || { echo "not root" >&2; return 1; }
    _netns_sweep
    # A /24 of 10.x.y.0 chosen from the pid, so that concurrent tests differ.
    _subnet="10.$((200 + $$ % 50)).$(($$ / 50 % 250))"
    at_cleanup _netns_down
    ip netns add "${NS_PREFIX}sw" || return 1
    ip -n "${NS_PREFIX}sw" link add br0 type bridge || return 1
    ip -n "${NS_PREFIX}sw" addr add "$_subnet.254/24" dev br0 || return 1
    ip -n "${NS_PREFIX}sw" link set br0 up || return 1
    ip -n "${NS_PREFIX}sw" link set lo up || return 1
    HOSTS_N=$_n
    for _i in $(seq 0 $((_n - 1))); do
        _h="${NS_PREFIX}h$_i"
        ip netns add "$_h" || return 1
        ip -n "$_h" link add eth0 type veth peer name "p$_i" netns "${NS_PREFIX}sw" || return 1
        ip -n "${NS_PREFIX}sw" link set "p$_i" master br0 up || return 1
        ip -n "$_h" addr add "$_subnet.$((_i + 1))/24" dev eth0 || return 1
        ip -n "$_h" link set eth0 up || return 1
        ip -n "$_h" link set lo up || return 1
    done
    return 0
}

hosts_up() {
    [ "${MG_TEST_NO_NETNS:-}" = 1 ] && echo "MG_TEST_NO_NETNS=1" >"$T/netns.err"
    if [ "${MG_TEST_NO_NETNS:-}" != 1 ] && _netns_try "$1" 2>"$T/netns.err"; then
        HOSTS_MODE=netns
        diag "test hosts: $1 network namespaces on a bridge, $_subnet.1-$_subnet.$1"
    else
        _netns_down
        HOSTS_MODE=loopback
        HOSTS_N=$1
        diag "test hosts: network namespaces unavailable ($(head -c 200 "$T/netns.err" 2>/dev/null | tr '\n' ' ')); falling back to loopback addresses 127.0.0.2-127.0.0.$(($1 + 1)) on this one host"
    fi
}

host_addr() {
    if [ "$HOSTS_MODE" = netns ]; then
        if [ "$1" = sw ]; then echo "$_subnet.254"; else echo "$_subnet.$(($1 + 1))"; fi
    else
        if [ "$1" = sw ]; then echo 127.0.0.1; else echo "127.0.0.$(($1 + 2))"; fi
    fi
}

_host_ns() {
    if [ "$1" = sw ]; then echo "${NS_PREFIX}sw"; else echo "${NS_PREFIX}h$1"; fi
}

# Host I's name (UTS namespace) for the command, where unshare can give one.
_UTS='hostname "$0" && exec "$@"'
_host_uts() { [ "$1" != sw ] && command -v unshare >/dev/null 2>&1; }

on() {
    _h=$1
    shift
    if [ "$HOSTS_MODE" != netns ]; then
        "$@"
    elif _host_uts "$_h"; then
        ip netns exec "$(_host_ns "$_h")" unshare --uts sh -c "$_UTS" "mgt-h$_h" "$@"
    else
        ip netns exec "$(_host_ns "$_h")" "$@"
    fi
}

bg_on() {
    _h=$1
    shift
    if [ "$HOSTS_MODE" != netns ]; then
        bg "$@"
    elif _host_uts "$_h"; then
        bg ip netns exec "$(_host_ns "$_h")" unshare --uts sh -c "$_UTS" "mgt-h$_h" "$@"
    else
        bg ip netns exec "$(_host_ns "$_h")" "$@"
    fi
}
