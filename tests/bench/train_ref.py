#!/usr/bin/python3
"""PyTorch reference for tests/bench/train_bench.sh and gpu.sh: the same training
loop as mg's `train`, in PyTorch. In-memory tensors, a DistributedSampler (rank 0 of
1, so the same shuffle as mg for the same seed), no DataLoader, one thread.
--device cuda: the data and the model on GPU 0, FP32 without TF32 (as mg's CUDA
backend by default), the clock read after torch.cuda.synchronize().

Prints one JSON line: model, steps, samples, train_time_s, samples_per_s,
test_accuracy, test_loss."""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from torch_models import cnn, mlp  # noqa: E402,F401  also for ddp_ref, startup_ref


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, split, limit):
    def path(name):
        p = os.path.join(data_dir, name)
        return p if os.path.exists(p) else p + ".gz"
    x = read_idx(path(f"{split}-images-idx3-ubyte"))
    y = read_idx(path(f"{split}-labels-idx1-ubyte"))
    if limit:
        x, y = x[:limit], y[:limit]
    # torchvision ToTensor + Normalize((0.2860,), (0.3530,)), in float32
    t = torch.from_numpy(x.copy()).float().div(255).sub_(torch.tensor(0.2860)).div_(torch.tensor(0.3530))
    return t.unsqueeze(1), torch.from_numpy(y.astype(np.int64))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--train-samples", type=int, default=0)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    dev = torch.device(args.device)
    cuda = args.device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def sync():
        if cuda:
            torch.cuda.synchronize()
    lr = args.lr if args.lr is not None else (0.05 if args.model == "mlp" else 0.02)

    xtr, ytr = load(args.data_dir, "train", args.train_samples)
    xte, yte = load(args.data_dir, "t10k", 0)
    if args.model == "mlp":
        xtr, xte = xtr.reshape(len(xtr), 784), xte.reshape(len(xte), 784)
    xtr, ytr, xte, yte = xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev)
    torch.manual_seed(args.seed)
    model = (mlp() if args.model == "mlp" else cnn()).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    sampler = DistributedSampler(range(len(xtr)), num_replicas=1, rank=0, shuffle=True, seed=args.seed)
    per_epoch = (len(sampler) + args.batch_size - 1) // args.batch_size
    total = args.steps or args.epochs * per_epoch

    step, samples, train_time, epoch = 0, 0, 0.0, 0
    while step < total:
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(sampler), device=dev)
        sync()
        t0 = time.perf_counter()
        for b in range(0, len(idx), args.batch_size):
            if step == total:
                break
            i = idx[b:b + args.batch_size]
            x, y = xtr[i], ytr[i]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            samples += len(i)
        sync()
        train_time += time.perf_counter() - t0
        epoch += 1

    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for b in range(0, len(xte), 1000):
            out = model(xte[b:b + 1000])
            loss_sum += F.cross_entropy(out, yte[b:b + 1000], reduction="sum").item()
            correct += (out.argmax(1) == yte[b:b + 1000]).sum().item()
    print(json.dumps({
        "model": args.model, "steps": step, "samples": samples,
        "train_time_s": round(train_time, 3), "samples_per_s": round(samples / train_time, 1),
        "test_accuracy": correct / len(xte), "test_loss": loss_sum / len(xte)}))


if __name__ == "__main__":
    main()
