#!/bin/sh
# Store benchmark: ops/s and latency of set, get, add, wait and wake (a set
# waking a parked watch on another connection) with 1 and 128 clients, and the
# rendezvous pattern (connect, add, publish, wait for everyone, list) for 2 to
# 128 clients. The server runs as the launcher runs it (storesrv: one poll
# loop); each client is a thread with its own connection (storebench). Next to
# it, the same work against torch.distributed.TCPStore from Debian's
# python3-torch, driven from Python threads, as the reference.
#
#   tests/bench/store.sh            (after make; MG_BUILD=build by default)
#   OPS1=20000 OPS128=200 tests/bench/store.sh
#
# storebench checks its results (values read back, the add counter, every
# rendezvous key seen) and the script fails when a run fails.
. "$(dirname "$0")/../lib/bench.sh"
OPS1=${OPS1:-20000}
OPS128=${OPS128:-200}
need "$HELPERS/storesrv" "$HELPERS/storebench"

spawn "$HELPERS/storesrv" --port-file "$T/port"
wait_for 10 test -s "$T/port" || { echo "store.sh: storesrv did not start" >&2; exit 1; }
ADDR=127.0.0.1:$(cat "$T/port")

# mg: one line per run, "op clients ops/s p50_us p99_us" / "rendezvous n ms ..."
: >"$T/mg"
for c in 1 128; do
    ops=$OPS1
    [ $c -gt 1 ] && ops=$OPS128
    for op in set get add wait wake; do
        n=$c
        [ $op = wake ] && [ $c = 1 ] && n=2 # a pair: one sets, one watches
        "$HELPERS/storebench" "$ADDR" $op $n $ops >>"$T/mg" || { echo "store.sh: mg $op failed" >&2; exit 1; }
    done
done
for n in 2 8 32 128; do
    "$HELPERS/storebench" "$ADDR" rendezvous $n 1 >>"$T/mg" ||
        { echo "store.sh: mg rendezvous $n failed" >&2; exit 1; }
done

# torch.distributed.TCPStore, same work (no watch in TCPStore: no wake row).
: >"$T/torch"
if have_torch; then
    OPS1=$OPS1 OPS128=$OPS128 $PY - >"$T/torch" 2>"$T/torch.err" <<'PYEOF' || { echo "store.sh: torch reference failed:" >&2; cat "$T/torch.err" >&2; exit 1; }
import datetime, os, threading, time
import torch.distributed as dist

TO = datetime.timedelta(seconds=60)
master = dist.TCPStore("127.0.0.1", 0, None, True, TO, wait_for_workers=False)
port = master.port

def client():
    return dist.TCPStore("127.0.0.1", port, None, False, TO)

def run(op, nc, n):
    cls = [client() for _ in range(nc)]
    for i, c in enumerate(cls):
        c.set("bench/%d" % i, "value-of-client-%d" % i)
    lat = [[] for _ in cls]
    errors = []
    bar = threading.Barrier(nc)
    def work(i):
        c, key, val = cls[i], "bench/%d" % i, ("value-of-client-%d" % i).encode()
        bar.wait()
        for _ in range(n):
            t = time.perf_counter()
            if op == "set":
                c.set(key, val)
            elif op == "get":
                if c.get(key) != val:
                    errors.append("get returned a wrong value")
                    return
            elif op == "add":
                c.add("bench-counter-%d" % nc, 1)
            else:
                c.wait([key])
            lat[i].append(time.perf_counter() - t)
    ths = [threading.Thread(target=work, args=(i,)) for i in range(nc)]
    t0 = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(errors[0])
    if op == "add" and int(cls[0].add("bench-counter-%d" % nc, 0)) != nc * n:
        raise SystemExit("add counter is wrong")
    all_ = sorted(x for l in lat for x in l)
    print("%s %d %.0f %.1f %.1f" % (op, nc, len(all_) / wall, all_[len(all_) // 2] * 1e6,
                                     all_[len(all_) * 99 // 100] * 1e6), flush=True)

for nc, n in ((1, int(os.environ["OPS1"])), (128, int(os.environ["OPS128"]))):
    for op in ("set", "get", "add", "wait"):
        run(op, nc, n)

for n in (2, 8, 32, 128):
    pfx, done, bar = "rdzv%d/" % n, [], threading.Barrier(n)
    def agent(i):
        bar.wait()
        t0 = time.perf_counter()
        c = client()
        r = c.add(pfx + "joined", 1)
        c.set(pfx + "node/%d" % (r - 1), "10.0.0.%d:29500" % i)
        c.wait([pfx + "node/%d" % k for k in range(n)])
        done.append(time.perf_counter() - t0)
    ths = [threading.Thread(target=agent, args=(i,)) for i in range(n)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    if len(done) != n:
        raise SystemExit("rendezvous incomplete")
    print("rendezvous %d %.1f" % (n, max(done) * 1000), flush=True)
PYEOF
fi

field() { # file op clients column
    awk -v op="$2" -v c="$3" -v k="$4" '$1 == op && ($2 == c || (op == "wake" && c == 1 && $2 == 2)) { print $k; exit }' "$1"
}
dash() { read -r v || v=; echo "${v:--}"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2fx", a / b }'; }

echo "store benchmark: mg store (storesrv, poll loop) vs torch.distributed.TCPStore (Python threads)"
echo "loopback, $(nproc) cores; $OPS1 ops per client with 1 client, $OPS128 with 128"
echo
printf '%-6s %7s | %10s %8s %8s | %10s %8s %8s | %8s\n' op clients "mg ops/s" "p50 us" "p99 us" \
    "torch ops/s" "p50 us" "p99 us" "mg/torch"
for c in 1 128; do
    for op in set get add wait wake; do
        mo=$(field "$T/mg" $op $c 3)
        to=$(field "$T/torch" $op $c 3)
        printf '%-6s %7s | %10s %8s %8s | %10s %8s %8s | %8s\n' $op $c "$mo" \
            "$(field "$T/mg" $op $c 4)" "$(field "$T/mg" $op $c 5)" "${to:--}" \
            "$(field "$T/torch" $op $c 4 | dash)" "$(field "$T/torch" $op $c 5 | dash)" \
            "$(ratio "$mo" "$to")"
    done
done
echo
printf '%-10s %7s | %10s | %10s | %8s\n' rendezvous clients "mg ms" "torch ms" "torch/mg"
for n in 2 8 32 128; do
    m=$(field "$T/mg" rendezvous $n 3)
    t=$(field "$T/torch" rendezvous $n 3)
    printf '%-10s %7s | %10s | %10s | %8s\n' "" $n "$m" "${t:--}" "$(ratio "$t" "$m")"
done
echo
echo "notes: wake = one set waking a parked watch on another connection (1 client row: a pair)."
echo "       torch's set does not wait for an acknowledgement; mg's set is a full round trip."
echo "       torch is driven from Python threads, so its figures include Python's overhead."
[ -s "$T/torch" ] || echo "       python3-torch not found: torch columns empty (scripts/deps.sh --bench)."
