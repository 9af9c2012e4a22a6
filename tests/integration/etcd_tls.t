#!/bin/sh
# The etcd backend over TLS: the cacert, cert and key of --rdzv_conf reach
# libcurl. A test CA and certificates are made with openssl; etcd serves
# https, then also requires client certificates.
# timeout: 90
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/etcd.sh"
AGENT=$HELPERS/rdzv_agent

etcd_have || skip_all "etcd-server is not installed (apt-get install etcd-server)"
command -v openssl >/dev/null || skip_all "openssl is not installed (apt-get install openssl)"

cd "$T" || exit 1
DESC="openssl makes a test CA"
cat >san.cnf <<'CNF'
[req]
distinguished_name = dn
[dn]
[ext]
subjectAltName = IP:127.0.0.1
CNF
ok sh -c "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=mg-test-ca >/dev/null 2>&1"
for who in server client; do
    openssl req -newkey rsa:2048 -nodes -keyout $who.key -out $who.csr -subj "/CN=$who" >/dev/null 2>&1
    openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $who.pem -days 2 \
        -extfile san.cnf -extensions ext >/dev/null 2>&1
done
ok test -s server.pem -a -s client.pem

# https with a server certificate
ETCD_TLS="$T/server.pem $T/server.key"
etcd_start || bail "etcd starts with TLS"
EP="https://$ETCD_EP"
run() { "$AGENT" --backend etcd --endpoint "$EP" --id "$1" --script join --conf "$2" >"$T/$1.out" 2>&1; }
run a "cacert=$T/ca.pem"
is "$?" 0 "https with cacert: the agent forms its group"
run b "join_timeout=2"
is "$?" 1 "https without the CA: refused"
like "$(cat "$T/b.out")" "etcd $EP: .*(certificate|SSL)" "the error names the endpoint and the certificate problem"
# torchrun's etcd-v2 spellings, with an endpoint that names no scheme
"$AGENT" --backend etcd --endpoint "$ETCD_EP" --id e --script join \
    --conf "protocol=https,ca_cert=$T/ca.pem" >"$T/e.out" 2>&1
is "$?" 0 "protocol=https, ca_cert (torchrun's names): the agent forms its group"
"$AGENT" --backend etcd --endpoint "$ETCD_EP" --id f --script join \
    --conf "protocol=https,join_timeout=2" >"$T/f.out" 2>&1
like "$(cat "$T/f.out")" "etcd https://$ETCD_EP: .*(certificate|SSL)" \
    "protocol=https alone makes a scheme-less endpoint https"
etcd_stop

# client certificates required
ETCD_TLS="$T/server.pem $T/server.key $T/ca.pem"
etcd_start || bail "etcd starts with client auth"
EP="https://$ETCD_EP"
run c "cacert=$T/ca.pem,cert=$T/client.pem,key=$T/client.key"
is "$?" 0 "client certificate: accepted"
run d "cacert=$T/ca.pem,join_timeout=2"
is "$?" 1 "no client certificate: refused"
like "$(cat "$T/d.out")" "etcd $EP: " "and reported with the endpoint"
done_testing
