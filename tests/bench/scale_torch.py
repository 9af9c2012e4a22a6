"""torch's rendezvous at scale, the reference column of tests/bench/scale.sh.

  scale_torch.py rdzv N TIMEOUT_S   torch's real rendezvous, what
      `torchrun --rdzv_backend c10d` runs: one TCPStore server (the agent on
      the endpoint host), N simulated nodes as threads across a few processes,
      each node with its own TCPStore client, C10dRendezvousBackend and
      DynamicRendezvousHandler (min = max = N nodes), all calling
      next_rendezvous() at once.
  scale_torch.py kv N TIMEOUT_S     the minimal TCPStore pattern, a floor rather
      than what torchrun does: N clients add themselves to a count, the last
      one writes the roster, every client waits for it and reads it.

Prints one line: "torch MODE N MS" (the last node's call began -> the last
node knew its rank), or "torch MODE N fail WHY" ("timeout" when it did not
finish in TIMEOUT_S seconds). Every result is checked: ranks 0..N-1, each
once, the same world size everywhere. Run with Debian's /usr/bin/python3.
"""
import datetime
import json
import os
import subprocess
import sys
import threading
import time

THREADS_PER_PROC = 256


def child(mode, port, run_id, first, count, n, timeout_s):
    """count nodes (first, first + 1, ...) as threads of this process: connect,
    say "ready", wait for "go" on stdin, rendezvous, print the results."""
    import torch.distributed as dist

    to = datetime.timedelta(seconds=timeout_s)
    stores = [dist.TCPStore("127.0.0.1", port, None, False, to) for _ in range(count)]
    res = [None] * count
    bar = threading.Barrier(count + 1)

    def node(i):
        st = stores[i]
        try:
            if mode == "rdzv":
                from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
                    C10dRendezvousBackend,
                )
                from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
                    DynamicRendezvousHandler,
                    RendezvousTimeout,
                )

                backend = C10dRendezvousBackend(st, run_id)
                h = DynamicRendezvousHandler.from_backend(
                    run_id, st, backend, n, n, RendezvousTimeout(join=to)
                )
                bar.wait()
                t0 = time.monotonic()
                _, rank, world = h.next_rendezvous()
            else:
                bar.wait()
                t0 = time.monotonic()
                me = "n%05d" % (first + i)
                st.set("j/" + me, "addr=127.0.0.1 port=%d nproc=1" % (30000 + first + i))
                if st.add("n", 1) == n:
                    st.set("close", "\n".join("n%05d" % k for k in range(n)))
                st.wait(["close"])
                roster = st.get("close").decode().split("\n")
                rank, world = roster.index(me), len(roster)
            res[i] = [rank, world, t0, time.monotonic()]
        except Exception as e:  # reported, not raised: the parent checks the ranks
            res[i] = ["error", str(e)[:200]]

    ths = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(count)]
    for t in ths:
        t.start()
    print("ready", flush=True)
    sys.stdin.readline()
    bar.wait()
    for t in ths:
        t.join()
    print(json.dumps(res), flush=True)
    # torch 1.13's clients can hang tearing down (the heartbeat timers, the
    # store's sockets): leave once the results are out.
    os._exit(0)


def parent(mode, n, timeout_s):
    import torch.distributed as dist

    t_end = time.monotonic() + timeout_s
    master = dist.TCPStore(
        "127.0.0.1", 0, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False
    )
    procs, first = [], 0
    nprocs = max(1, (n + THREADS_PER_PROC - 1) // THREADS_PER_PROC)
    for p in range(nprocs):
        count = n // nprocs + (1 if p < n % nprocs else 0)
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "child", mode, str(master.port), "scale",
                 str(first), str(count), str(n), str(timeout_s)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )
        )
        first += count

    def finish(why):
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        print("torch %s %d %s" % (mode, n, why), flush=True)
        os._exit(0)

    # Lines from the children, read in threads so the timeout holds.
    lines = [[] for _ in procs]

    def reader(k):
        for line in procs[k].stdout:
            lines[k].append(line)

    rts = [threading.Thread(target=reader, args=(k,), daemon=True) for k in range(len(procs))]
    for t in rts:
        t.start()
    while not all(lines[k] and lines[k][0].startswith("ready") for k in range(len(procs))):
        if time.monotonic() > t_end:
            finish("fail timeout_connecting_in_%ds" % timeout_s)
        if any(p.poll() is not None for p in procs):
            finish("fail a_node_process_exited_%s" % [p.returncode for p in procs])
        time.sleep(0.01)
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for t in rts:
        t.join(max(0.0, t_end - time.monotonic()))
    if any(t.is_alive() for t in rts):
        finish("fail timeout:_did_not_finish_in_%ds" % timeout_s)
    res = []
    for k in range(len(procs)):
        if len(lines[k]) < 2:
            finish("fail process_%d_printed_no_result" % k)
        res += json.loads(lines[k][1])
    errs = [r[1] for r in res if r and r[0] == "error"]
    if errs:
        finish("fail " + errs[0].replace(" ", "_")[:100])
    if sorted(r[0] for r in res) != list(range(n)) or any(r[1] != n for r in res):
        finish("fail ranks_or_world_size_wrong")
    finish("%.1f" % ((max(r[3] for r in res) - max(r[2] for r in res)) * 1000))


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]),
              int(sys.argv[7]), int(sys.argv[8]))
    else:
        parent(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
