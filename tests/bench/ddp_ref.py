#!/usr/bin/python3
"""PyTorch DDP reference for tests/bench/ddp.sh: the loop of train_ref.py (same
models, data, normalization, sampler and optimizer) under
DistributedDataParallel over Gloo, one process per rank (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment; WORLD_SIZE 1 runs without DDP).
--batch-size is per process. Rank 0 prints one JSON line: model, world, steps,
samples (all ranks), train_time_s, samples_per_s, test_accuracy."""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_ref import cnn, load, mlp  # noqa: E402  the single-process reference's pieces


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    lr = args.lr if args.lr is not None else (0.05 if args.model == "mlp" else 0.02)

    xtr, ytr = load(args.data_dir, "train", 0)
    xte, yte = load(args.data_dir, "t10k", 0)
    if args.model == "mlp":
        xtr, xte = xtr.reshape(len(xtr), 784), xte.reshape(len(xte), 784)
    torch.manual_seed(args.seed)
    model = mlp() if args.model == "mlp" else cnn()
    net = DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    sampler = DistributedSampler(range(len(xtr)), num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)

    def run(steps, epoch0):
        done, epoch = 0, epoch0
        while done < steps:
            sampler.set_epoch(epoch)
            idx = torch.tensor(list(sampler))
            for b in range(0, len(idx), args.batch_size):
                if done == steps:
                    break
                i = idx[b:b + args.batch_size]
                loss = F.cross_entropy(net(xtr[i]), ytr[i])
                opt.zero_grad()
                loss.backward()
                opt.step()
                done += 1
            epoch += 1

    run(10, 1000)  # warm up (allocator, Gloo connections)
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    run(args.steps, 0)
    if world > 1:
        dist.barrier()
    train_time = time.perf_counter() - t0
    samples = args.steps * args.batch_size * world

    if rank == 0:
        model.eval()
        correct = 0
        with torch.no_grad():
            for b in range(0, len(xte), 1000):
                correct += (model(xte[b:b + 1000]).argmax(1) == yte[b:b + 1000]).sum().item()
        print(json.dumps({
            "model": args.model, "world": world, "steps": args.steps, "samples": samples,
            "train_time_s": round(train_time, 3), "samples_per_s": round(samples / train_time, 1),
            "test_accuracy": correct / len(xte)}), flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
