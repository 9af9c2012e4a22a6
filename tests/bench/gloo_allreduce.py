#!/usr/bin/python3
# The reference for tests/bench/allreduce.sh: torch.distributed allreduce over
# Gloo, run as one process per rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
# in the environment). Rank 0 prints "bytes us_per_op" for each size.
#   gloo_allreduce.py SIZE_BYTES...
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [int(s) for s in sys.argv[1:]]
    for size in sizes:
        n = size // 4
        gen = torch.Generator().manual_seed(rank)
        x = torch.rand(n, generator=gen)
        ref = x.clone()
        for _ in range(3):
            dist.all_reduce(x)
        # Calibrate to about 0.3 s per size; rank 0 decides for everyone.
        t0 = time.perf_counter()
        for _ in range(5):
            dist.all_reduce(x)
        per = (time.perf_counter() - t0) / 5
        iters = torch.tensor([max(5, min(20000, int(0.3 / max(per, 1e-6))))])
        dist.broadcast(iters, 0)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(int(iters.item())):
            dist.all_reduce(x)
        us = (time.perf_counter() - t0) / int(iters.item()) * 1e6
        # Check one result, as the mg side does.
        x.copy_(ref)
        dist.all_reduce(x)
        want = sum(torch.rand(n, generator=torch.Generator().manual_seed(r)) for r in range(world))
        if not torch.allclose(x, want, rtol=1e-5, atol=1e-5):
            sys.exit(f"gloo allreduce of {size} bytes gave a wrong sum")
        if rank == 0:
            print(f"{size} {us:.2f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
