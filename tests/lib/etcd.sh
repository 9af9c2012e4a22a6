# etcd for the integration tests: a private etcd-server on free loopback ports
# with a temporary data dir under $T, stopped (by its pid) and removed on every
# exit path through lib.sh's at_cleanup. Source after lib.sh.
#
#   etcd_start [ADDR] [NETNS]  starts etcd (on ADDR, default 127.0.0.1; inside
#                              network namespace NETNS when given); sets
#                              ETCD_EP=ADDR:PORT and ETCD_PID
#   etcd_stop                  stops it now (to test an etcd that goes away)
#   etcd_have                  true when /usr/bin/etcd is installed
#   ETCD_TLS="CERT KEY [CA]"   set before etcd_start: serve https with this
#                              certificate, and with CA require client certificates

ETCD=${ETCD:-/usr/bin/etcd}
ETCD_PID=
ETCD_EP=
ETCD_TLS=${ETCD_TLS:-}

etcd_have() { [ -x "$ETCD" ]; }

etcd_stop() {
    if [ -n "$ETCD_PID" ]; then
        kill -KILL "$ETCD_PID" 2>/dev/null
        wait "$ETCD_PID" 2>/dev/null
        ETCD_PID=
    fi
}

etcd_start() {
    _ea=${1:-127.0.0.1}
    _ens=${2:-}
    _edir=$(mktemp -d "$T/etcd.XXXXXX")
    _ex=
    [ -n "$_ens" ] && _ex="ip netns exec $_ens"
    for _try in 1 2 3 4 5; do
        if [ -n "$_ens" ]; then
            # Ports are free inside a fresh namespace.
            _ecp=$((20000 + ($$ + _try * 7919) % 20000))
            _epp=$((_ecp + 1))
        else
            _ecp=$(free_port)
            _epp=$(free_port)
        fi
        _es=http
        _etls=
        if [ -n "$ETCD_TLS" ]; then
            set -- $ETCD_TLS
            _es=https
            _etls="--cert-file $1 --key-file $2"
            [ -n "${3:-}" ] && _etls="$_etls --client-cert-auth --trusted-ca-file $3"
        fi
        $_ex "$ETCD" --name default --data-dir "$_edir/data" $_etls \
            --listen-client-urls "$_es://$_ea:$_ecp" --advertise-client-urls "$_es://$_ea:$_ecp" \
            --listen-peer-urls "http://$_ea:$_epp" --initial-advertise-peer-urls "http://$_ea:$_epp" \
            --initial-cluster "default=http://$_ea:$_epp" >"$_edir/etcd.log" 2>&1 &
        ETCD_PID=$!
        at_cleanup "kill -KILL $ETCD_PID 2>/dev/null; wait $ETCD_PID 2>/dev/null"
        ETCD_EP="$_ea:$_ecp"
        if [ -n "$ETCD_TLS" ]; then
            # etcdctl would need the client files too: wait for etcd to say it serves.
            wait_for 15 sh -c "grep -q 'serving .*client requests on' '$_edir/etcd.log'" && return 0
        elif wait_for 15 sh -c "$_ex env ETCDCTL_API=3 etcdctl --endpoints=http://$ETCD_EP --command-timeout=1s endpoint health >/dev/null 2>&1"; then
            return 0
        fi
        etcd_stop
        rm -rf "$_edir/data"
    done
    diag "etcd did not start: $(tail -n 5 "$_edir/etcd.log" 2>/dev/null)"
    return 1
}
