#!/usr/bin/python3
"""PyTorch reference for tests/bench/hang.sh: the loop of `comm_rank steps`
under torchrun: a Gloo process group, steps of 1 ms of computation and an
allreduce of 64 KB. In the first attempt, with --kind spin, rank 1 spins at
step --hang-at (and prints {"hang": UNIX TIME}); with --timer S each step runs
inside torch's file timer, `timer.expires(after=S)` (torchrun's watchdog,
TORCHELASTIC_ENABLE_FILE_TIMER=1). Once its first step is done, rank 0 prints
{"first_step_done": UNIX TIME, "restart": TORCHELASTIC_RESTART_COUNT}."""
import argparse
import contextlib
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10**9)
    ap.add_argument("--hang-at", type=int, default=-1)
    ap.add_argument("--kind", default="none", choices=["none", "spin"])
    ap.add_argument("--timer", type=float, default=0)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if a.timer > 0:
        import torch.distributed.elastic.timer as timer

        timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    x = torch.zeros(16384)
    for s in range(a.steps):
        ctx = timer.expires(after=a.timer, scope="step") if a.timer > 0 else contextlib.nullcontext()
        with ctx:
            if restart == "0" and rank == 1 and s == a.hang_at and a.kind == "spin":
                print(json.dumps({"hang": time.time()}), flush=True)
                while True:
                    pass
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.001:
                pass
            dist.all_reduce(x)
        if s == 0 and rank == 0:
            print(json.dumps({"first_step_done": time.time(), "restart": int(restart)}), flush=True)


if __name__ == "__main__":
    main()
