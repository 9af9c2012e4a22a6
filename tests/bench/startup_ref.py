#!/usr/bin/python3
"""PyTorch reference for tests/bench/startup.sh: what `train --model cnn
--checkpoint-dir D --checkpoint-every K` does at a start, in PyTorch, under
torchrun: Gloo process group, Fashion-MNIST decoded from its files (the loader
of train_ref.py), the same CNN under DistributedDataParallel, SGD with
momentum, the newest checkpoint in D resumed (torch.load), then steps, rank 0
saving a checkpoint every K steps (torch.save to a temporary name, renamed,
after a barrier). Once its first step is done, rank 0 prints one JSON line:
{"first_step_done": UNIX TIME, "restart": TORCHELASTIC_RESTART_COUNT,
"resumed_step": STEP OR 0, "loss": ...}; with --print-steps, also {"step": N} after
every step (tests/bench/snapshot.sh counts the steps a failure costs). Runs
--steps steps, then exits."""
import argparse
import glob
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
from train_ref import cnn, load, mlp  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cnn", choices=["mlp", "cnn"])
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--checkpoint-dir", default="")
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--print-steps", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dist.init_process_group("gloo")
    xtr, ytr = load(args.data_dir, "train", 0)
    if args.model == "mlp":
        xtr = xtr.reshape(len(xtr), 784)
    torch.manual_seed(0)
    model = mlp() if args.model == "mlp" else cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    step = 0
    ckpts = sorted(glob.glob(os.path.join(args.checkpoint_dir, "ckpt-*.pt"))) \
        if args.checkpoint_dir else []
    if ckpts:
        state = torch.load(ckpts[-1])
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    resumed = step
    net = DistributedDataParallel(model)
    sampler = DistributedSampler(range(len(xtr)), num_replicas=world, rank=rank, shuffle=True, seed=0)
    epoch = 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(sampler))
        for b in range(0, len(idx), args.batch_size):
            if step == args.steps:
                break
            i = idx[b:b + args.batch_size]
            loss = F.cross_entropy(net(xtr[i]), ytr[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == resumed + 1 and rank == 0:
                print(json.dumps({"first_step_done": time.time(),
                                  "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                                  "resumed_step": resumed, "loss": loss.item()}), flush=True)
            if args.print_steps and rank == 0:
                print(json.dumps({"step": step}), flush=True)
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                if rank == 0:
                    tmp = os.path.join(args.checkpoint_dir, "tmp.pt")
                    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                                "step": step}, tmp)
                    os.rename(tmp, os.path.join(args.checkpoint_dir, "ckpt-%012d.pt" % step))
                dist.barrier()
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
