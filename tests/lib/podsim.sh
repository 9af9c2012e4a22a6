# Pods simulated from a Kubernetes manifest, running the manifest's real command
# (tests/lib/podsim.py renders them: the operator's environment, host names,
# DNS records). Each pod is a network namespace of its own (tests/lib/netns.sh)
# and, inside it, its own UTS namespace (the pod's host name) and mount
# namespace (the kubelet's /etc/hosts with the records the cluster DNS
# publishes, /etc/resolv.conf, /dev/shm, /tmp, the volumes under /srv).
# Needs root and network namespaces; processes, namespaces and mounts go on
# every exit path (a mount namespace ends with its last process). Source after
# lib.sh and netns.sh.
#
#   pods_have                   true when pods can be simulated here (else: why, on stderr)
#   pods_up MANIFEST [OPTS]     renders (OPTS: podsim.py render's --secret, --env, --sub)
#                               and starts the pods; pod 0's DNS records appear after
#                               PODS_DNS_DELAY seconds (2), the others' at once
#   pods_wait SECS              waits at most SECS for the training pods to exit, then
#                               stops them and every other pod (etcd...); sets
#                               POD_RC_<i> (exit code, or "timeout") and PODS_RC ("0 0")
#   pod_log I                   what pod I printed (kubectl logs)
#   PODS_DIR, PODS_N            the rendering (run.sh, hosts, changes) and the pod count

PODSIM="/usr/bin/python3 $TOP/tests/lib/podsim.py"
PODS_DNS_DELAY=${PODS_DNS_DELAY:-2}
PODS_DIR=
PODS_N=0
_pods_k=0
_pods_pids=

pods_have() {
    [ "$(id -u)" = 0 ] || { echo "not root" >&2; return 1; }
    command -v unshare >/dev/null 2>&1 || { echo "no unshare (util-linux)" >&2; return 1; }
    /usr/bin/python3 -c 'import yaml' 2>/dev/null || { echo "no python3-yaml" >&2; return 1; }
    [ -d /srv ] || { echo "no /srv to mount the pods' volumes on" >&2; return 1; }
    unshare --uts --mount --propagation private sh -c 'hostname podsim-probe && mount -t tmpfs t /srv' 2>&1 >&2 ||
        { echo "cannot create UTS and mount namespaces" >&2; return 1; }
}

pods_up() {
    _m=$1
    shift
    _pods_k=$((_pods_k + 1))
    PODS_DIR=$T/pods$_pods_k
    mkdir -p "$PODS_DIR"
    PODS_N=$($PODSIM pods "$_m" | wc -l)
    [ "$HOSTS_N" -ge "$PODS_N" ] || { echo "pods_up: $PODS_N pods, $HOSTS_N test hosts" >&2; return 1; }
    _ips=$(for _i in $(seq 0 $((PODS_N - 1))); do host_addr "$_i"; done | paste -sd, -)
    $PODSIM render "$_m" --out "$PODS_DIR" --ips "$_ips" --image "$MG_BUILD" "$@" || return 1
    for _i in $(seq 1 $((PODS_N - 1))); do cat "$PODS_DIR/dns-now" >>"$PODS_DIR/$_i/hosts"; done
    cat "$PODS_DIR/dns-now" >>"$PODS_DIR/0/hosts"
    _pods_pids=
    for _i in $(seq 0 $((PODS_N - 1))); do
        bg_on "$_i" unshare --uts --mount --propagation private sh "$PODS_DIR/$_i/run.sh" \
            >"$PODS_DIR/$_i/log" 2>&1 </dev/null
        eval "POD_PID_$_i=$!"
        _pods_pids="$_pods_pids $!"
    done
    # The cluster DNS publishes pod 0 late: the others retry until it does.
    bg sh -c "sleep $PODS_DNS_DELAY; for h in '$PODS_DIR'/*/hosts; do cat '$PODS_DIR/dns-late' >>\"\$h\"; done"
    return 0
}

_pods_stop() {
    for _p in $_pods_pids; do kill -TERM "-$_p" 2>/dev/null; done
    sleep 0.2
    for _p in $_pods_pids; do kill -KILL "-$_p" 2>/dev/null; done
    # A pod's orphans (nothing should be left) go with their namespace's processes.
    for _i in $(seq 0 $((PODS_N - 1))); do
        for _p in $(ip netns pids "$(_host_ns "$_i")" 2>/dev/null); do kill -KILL "$_p" 2>/dev/null; done
    done
}

pods_wait() {
    _end=$(($(date +%s) + $1))
    _main=$(awk '$3 == "main" { print $1 }' "$PODS_DIR/pods")
    while :; do
        _left=0
        for _i in $_main; do
            eval "_p=\$POD_PID_$_i"
            kill -0 "$_p" 2>/dev/null && _left=1
        done
        [ $_left = 0 ] || [ "$(date +%s)" -ge "$_end" ] && break
        sleep 0.1
    done
    PODS_RC=
    for _i in $_main; do
        eval "_p=\$POD_PID_$_i"
        if kill -0 "$_p" 2>/dev/null; then
            eval "POD_RC_$_i=timeout"
        else
            wait "$_p"
            eval "POD_RC_$_i=$?"
        fi
        eval "PODS_RC=\"\$PODS_RC\${PODS_RC:+ }\$POD_RC_$_i\""
    done
    _pods_stop
    for _p in $_pods_pids; do wait "$_p" 2>/dev/null; done
    return 0
}

pod_log() { cat "$PODS_DIR/$1/log"; }

# The last lines of every pod's output, as TAP comments (after a failure).
pods_show() {
    for _i in $(seq 0 $((PODS_N - 1))); do
        tail -n "${1:-12}" "$PODS_DIR/$_i/log" | sed "s/^/#   pod $_i: /"
    done
}
