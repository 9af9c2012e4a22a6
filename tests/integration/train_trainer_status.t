#!/bin/sh
# train reports its progress to Kubeflow Trainer's status server (Trainer
# v2.2, TrainJobStatus): a small HTTPS server on loopback, with a certificate
# of its own CA, stands in for the controller's. It checks the bearer token
# and the JSON of each POST (trainerStatus: progressPercentage,
# estimatedRemainingSeconds, metrics [{name, value}], lastUpdatedTime) and
# keeps what it accepted. Under mglaunch with 2 ranks, rank 0 reports: a first
# report, then 100 % with the test figures. A refused token, and a server
# that is not there: a warning, and training ends as it would have (exit 0).
# The first version's KUBEFLOW_TRAINER_STATUS_* names work too.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] || skip_all "train not built"
command -v openssl >/dev/null 2>&1 || skip_all "openssl not installed"
PY=/usr/bin/python3
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset KUBEFLOW_TRAINER_SERVER_URL KUBEFLOW_TRAINER_SERVER_TOKEN KUBEFLOW_TRAINER_SERVER_CA_CERT
unset KUBEFLOW_TRAINER_STATUS_URL KUBEFLOW_TRAINER_STATUS_TOKEN KUBEFLOW_TRAINER_STATUS_CA_CERT

# A CA, and the server's certificate for 127.0.0.1 signed by it.
cd "$T" || bail "cd"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=test-ca \
    >/dev/null 2>&1 || bail "openssl: CA"
openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj /CN=127.0.0.1 \
    >/dev/null 2>&1 || bail "openssl: request"
printf 'subjectAltName=IP:127.0.0.1\n' >ext
openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out srv.crt -days 2 \
    -extfile ext >/dev/null 2>&1 || bail "openssl: sign"
printf 'eyJhbGciOiJSUzI1NiJ9.test-token.sig\n' >token

cat >server.py <<'PYEOF'
import json, re, ssl, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port_file, log = sys.argv[1], sys.argv[2]
TOKEN = "eyJhbGciOiJSUzI1NiJ9.test-token.sig"
PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/job/status"

def problem(body):
    ts = body.get("trainerStatus")
    if set(body) != {"trainerStatus"} or not isinstance(ts, dict):
        return "no trainerStatus object"
    p = ts.get("progressPercentage")
    if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p <= 100:
        return "progressPercentage %r" % (p,)
    e = ts.get("estimatedRemainingSeconds")
    if e is not None and (not isinstance(e, int) or e < 0):
        return "estimatedRemainingSeconds %r" % (e,)
    for m in ts.get("metrics", []):
        if set(m) != {"name", "value"} or not all(isinstance(m[k], str) for k in m):
            return "metric %r" % (m,)
        float(m["value"])
    if not re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", ts.get("lastUpdatedTime", "")):
        return "lastUpdatedTime %r" % (ts.get("lastUpdatedTime"),)
    extra = set(ts) - {"progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"}
    return "unknown fields %r" % (extra,) if extra else None

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def answer(self, code, what):
        with open(log, "a") as f:
            f.write(what + "\n")
        data = json.dumps({"kind": "Status", "code": code}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(n)
        if self.path != PATH:
            return self.answer(404, "bad path " + self.path)
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            return self.answer(401, "bad token %r" % self.headers.get("Authorization"))
        if self.headers.get("Content-Type") != "application/json":
            return self.answer(415, "bad content type")
        try:
            body = json.loads(raw)
            why = problem(body)
        except Exception as e:
            why = "not JSON: %s" % e
        if why:
            return self.answer(422, "bad body: " + why)
        self.answer(200, "ok " + json.dumps(body["trainerStatus"], sort_keys=True))

srv = HTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("srv.crt", "srv.key")
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
with open(port_file + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
import os
os.rename(port_file + ".tmp", port_file)
srv.serve_forever()
PYEOF
bg $PY server.py "$T/port" "$T/log"
wait_for 20 test -s "$T/port" || bail "the status server did not start"
URL="https://127.0.0.1:$(cat "$T/port")/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/job/status"

common="--data synthetic --train-samples 2048 --test-samples 512 --batch-size 32 --model mlp --log-every 16"
KUBEFLOW_TRAINER_SERVER_URL=$URL KUBEFLOW_TRAINER_SERVER_TOKEN=$T/token \
    KUBEFLOW_TRAINER_SERVER_CA_CERT=$T/ca.crt \
    "$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/logs" --rdzv_id kf "$TRAIN" $common --epochs 2 \
    >"$T/out" 2>"$T/err"
is $? 0 "training with the status server: exit 0"
unlike "$(cat "$T/err")" "warning" "  no warning"
unlike "$(cat "$T/log")" "^bad" "  every POST had the token, the path and a valid body"
[ -s "$T/log" ] && grep '^bad' "$T/log" | head -5 | sed 's/^/# /'
n=$(grep -c '^ok' "$T/log")
ok test "$n" -ge 2
ok $PY - "$T/log" <<'PYEOF'
import json, sys
recs = [json.loads(l[3:]) for l in open(sys.argv[1]) if l.startswith("ok ")]
first, last = recs[0], recs[-1]
assert first["progressPercentage"] < 100 and "estimatedRemainingSeconds" in first, first
names = [m["name"] for m in first["metrics"]]
assert names == ["loss", "accuracy", "learning_rate"], names
assert last["progressPercentage"] == 100 and last["estimatedRemainingSeconds"] == 0, last
test = {m["name"]: float(m["value"]) for m in last["metrics"]}
assert set(test) == {"test_loss", "test_accuracy"} and 0.5 < test["test_accuracy"] <= 1, test
assert all(r["progressPercentage"] <= s["progressPercentage"] for r, s in zip(recs, recs[1:]))
PYEOF
diag "$n reports accepted; the last: $(grep '^ok' "$T/log" | tail -n 1)"
ok grep -q 'done: test accuracy' "$T/out"

# The first version's names (kubeflow/trainer #3227).
: >"$T/log"
KUBEFLOW_TRAINER_STATUS_URL=$URL KUBEFLOW_TRAINER_STATUS_TOKEN=$T/token \
    KUBEFLOW_TRAINER_STATUS_CA_CERT=$T/ca.crt "$TRAIN" $common --steps 20 >"$T/out" 2>"$T/err"
is $? 0 "KUBEFLOW_TRAINER_STATUS_*: exit 0"
like "$(tail -n 1 "$T/log")" '^ok .*"progressPercentage": 100' "  reports reach the server"

# A token the server refuses: a warning that names the answer, never the token.
printf 'wrong-token\n' >"$T/wrong"
: >"$T/log"
KUBEFLOW_TRAINER_SERVER_URL=$URL KUBEFLOW_TRAINER_SERVER_TOKEN=$T/wrong \
    KUBEFLOW_TRAINER_SERVER_CA_CERT=$T/ca.crt "$TRAIN" $common --steps 20 >"$T/out" 2>"$T/err"
is $? 0 "a refused token: training still ends with exit 0"
like "$(cat "$T/err")" "warning: cannot report progress to https://127.0.0.1:[0-9]+/.*: HTTP 401" \
    "  one warning naming the answer"
is "$(grep -c 'cannot report progress' "$T/err")" 1 "  said once"
unlike "$(cat "$T/err" "$T/out")" "wrong-token" "  the token itself is not shown"
ok grep -q 'done: test accuracy' "$T/out"

# No CA: the server's certificate is not trusted.
KUBEFLOW_TRAINER_SERVER_URL=$URL KUBEFLOW_TRAINER_SERVER_TOKEN=$T/token "$TRAIN" $common \
    --steps 20 >"$T/out" 2>"$T/err"
is $? 0 "an untrusted certificate: exit 0"
like "$(cat "$T/err")" "warning: cannot report progress to .*(certificate|SSL)" "  with a warning"

# Nothing listens there: the same.
port=$(free_port)
KUBEFLOW_TRAINER_SERVER_URL="https://127.0.0.1:$port/status" KUBEFLOW_TRAINER_SERVER_TOKEN=$T/token \
    KUBEFLOW_TRAINER_SERVER_CA_CERT=$T/ca.crt "$TRAIN" $common --steps 20 >"$T/out" 2>"$T/err"
is $? 0 "no status server: exit 0"
like "$(cat "$T/err")" "warning: cannot report progress to https://127.0.0.1:$port/status" "  a warning"

KUBEFLOW_TRAINER_SERVER_URL="ftp://x/y" "$TRAIN" $common --steps 20 >"$T/out" 2>"$T/err"
is $? 0 "a URL that is not http(s): exit 0"
like "$(cat "$T/err")" "warning: cannot report progress to Kubeflow Trainer: the status URL 'ftp://x/y' is not http" \
    "  a warning"

done_testing
