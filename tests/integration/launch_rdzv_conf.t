#!/bin/sh
# Every --rdzv_conf key torchrun reads is accepted by mglaunch: torchrun 1.13's
# keys are taken from Debian's torch source at test time (the lines that read
# them), torchrun 2.x's from the list below (docs/torchrun-compat.md names the
# file each comes from). A key that means something to mg takes effect (timeout
# is the join timeout); one that does not gets a one-line notice; a key neither
# knows is still an error that lists the known ones.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset MG_RDZV_TOKEN

# A value each key accepts.
value() {
    case $1 in
    *_timeout | timeout) echo 30 ;;
    keep_alive_interval) echo 5 ;;
    keep_alive_max_attempt) echo 3 ;;
    is_host | use_libuv) echo false ;;
    protocol) echo http ;;
    store_type) echo tcp ;;
    rank) echo 0 ;;
    etcd_prefix) echo /torchelastic/p2p ;;
    cacert | cert | key | ca_cert | ssl_cert | ssl_cert_key) echo /etc/hostname ;;
    *) echo 1 ;;
    esac
}

# accepted VERSION KEY: mglaunch runs a job with KEY=VALUE, on the default
# (static) backend and on c10d, without calling the key unknown.
accepted() {
    v=$(value "$2")
    for b in static c10d; do
        "$MGLAUNCH" --rdzv_backend $b --rdzv_conf "$2=$v" true >"$T/out" 2>"$T/err"
        rc=$?
        if [ "$rc" != 0 ] || grep -q "unknown key" "$T/err"; then
            is "$rc: $(cat "$T/err")" "0: " "torchrun $1 key $2=$v with $b"
            return
        fi
    done
    ok true "torchrun $1 key $2=$v accepted (static, c10d)"
}

TORCH=/usr/lib/python3/dist-packages/torch/distributed
if [ -d "$TORCH/elastic/rendezvous" ]; then
    # What torch 1.13's rendezvous code reads from the config: params.get*("k"),
    # params.config.get("k") / ["k"] / "k" in, _get_timeout(params, "x") (x_timeout),
    # and what run.py and launcher/api.py put there (rank, timeout).
    src="$TORCH/elastic/rendezvous/*.py $TORCH/launcher/api.py $TORCH/run.py"
    keys113=$(
        {
            cat $src | grep -oE 'params\.(get|get_as_int|get_as_bool)\("[a-z_]+"|params\.config\.get\("[a-z_]+"|params\.config\["[a-z_]+"\]|"[a-z_]+" (not )?in params\.config|rdzv_configs\["[a-z_]+"\]' |
                sed -E 's/.*"([a-z_]+)".*/\1/'
            cat $src | grep -oE '_get_timeout\(params, "[a-z_]+"\)' | sed -E 's/.*"([a-z_]+)".*/\1_timeout/'
        } | sort -u
    )
    n=$(echo "$keys113" | grep -c .)
    ok test "$n" -ge 15
    diag "torch 1.13 reads $n rendezvous keys: $(echo $keys113)"
    for k in $keys113; do accepted 1.13 "$k"; done
else
    diag "Debian's python3-torch is not installed: torchrun 1.13's keys come from the list below only"
fi

# torchrun 2.x (pytorch/pytorch main): dynamic_rendezvous.py create_handler
# (join/last_call/close/heartbeat timeouts, keep_alive_*), c10d_rendezvous_backend.py
# (is_host, read_timeout, store_type, use_libuv), etcd_rendezvous_backend.py
# (read_timeout, protocol, ssl_cert, ssl_cert_key, ca_cert), etcd_rendezvous.py
# (protocol, cert, key, cacert, etcd_prefix, timeout, last_call_timeout),
# static_tcp_rendezvous.py (rank, timeout).
for k in join_timeout last_call_timeout close_timeout heartbeat_timeout keep_alive_interval \
    keep_alive_max_attempt is_host read_timeout store_type use_libuv protocol ssl_cert \
    ssl_cert_key ca_cert cert key cacert etcd_prefix timeout rank; do
    accepted 2.x "$k"
done

# Keys mg has no use for: accepted with one line saying so.
"$MGLAUNCH" --rdzv_conf use_libuv=True,rank=1 true >"$T/out" 2>"$T/err"
is "$?" 0 "use_libuv and rank: the run goes on"
like "$(cat "$T/err")" "^mglaunch: --rdzv_conf use_libuv=True: no effect" "use_libuv: a notice"
like "$(cat "$T/err")" "mglaunch: --rdzv_conf rank=1: ignored; --node_rank gives" "rank: a notice"
is "$(wc -l <"$T/err" | tr -d ' ')" 2 "one line each"
"$MGLAUNCH" --rdzv_backend c10d --rdzv_conf ssl_cert=/etc/hostname true >"$T/out" 2>"$T/err"
like "$(cat "$T/err")" "cert: applies to the etcd backend only; ignored with c10d" \
    "an etcd key with c10d: a notice (torchrun ignores it)"

# Unknown keys and bad values are still errors.
"$MGLAUNCH" --rdzv_conf bogus=1 true >"$T/out" 2>"$T/err"
is "$?" 2 "an unknown key: exit 2"
like "$(cat "$T/err")" "unknown key 'bogus' \\(known: join_timeout, timeout, .*use_libuv, rank, exclude_after, exclude_window, exclude_cooldown\\)" \
    "the error lists the known keys"
"$MGLAUNCH" --rdzv_conf store_type=file true >"$T/out" 2>"$T/err"
is "$?" 2 "store_type=file: exit 2"
like "$(cat "$T/err")" "store_type=file: mglaunch's c10d backend has no file store" "and why"
"$MGLAUNCH" --rdzv_conf cacert=/a,ca_cert=/b true >"$T/out" 2>"$T/err"
like "$(cat "$T/err")" "cacert and ca_cert are one setting" "one setting under two names: an error"
# (join_timeout and timeout are not: torchrun's backends read one each; launch_torchx.t)

# timeout= is the join timeout: a static node whose peer never comes gives up then.
port=$(free_port)
start=$(date +%s)
"$MGLAUNCH" --nnodes 2 --node_rank 0 --master_addr 127.0.0.1 --master_port "$port" \
    --rdzv_conf timeout=2 true >"$T/out" 2>"$T/err"
rc=$?
end=$(date +%s)
ok test "$rc" -ne 0
like "$(cat "$T/err")" "join_timeout|did not form" "timeout=2: the round did not form"
ok test $((end - start)) -lt 30
done_testing
