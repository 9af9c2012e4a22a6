#!/usr/bin/python3
"""Writes the golden reference files the C unit tests compare libmg against
(tests/unit/test_golden.c, test_data.c). Needs Debian's python3-torch; the
outputs are committed so the tests themselves need no torch.

    /usr/bin/python3 tests/golden/gen.py          # rewrites tests/golden/*.gold

File format (little-endian): magic b"MGGOLD1\\n", then records until EOF:
    u32 name_len, name (utf-8), u32 dtype (0 float32, 1 int32), u32 ndim,
    u32 dims[ndim] (the full shape), u32 stride, u32 count, count values
A record holds elements 0, stride, 2*stride, ... of the flattened tensor: the
whole tensor when stride is 1, an even sample of MAX_KEEP values otherwise.
"""
import os
import struct
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from torch_models import cnn, mlp  # noqa: E402  the models of mg's train

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_KEEP = 2048
BATCH = 8
STEPS = 3


class Writer:
    def __init__(self, path):
        self.f = open(path, "wb")
        self.f.write(b"MGGOLD1\n")

    def add(self, name, t, full=False):
        t = t.detach().contiguous()
        flat = t.reshape(-1)
        n = flat.numel()
        stride = 1 if full or n <= MAX_KEEP else (n + MAX_KEEP - 1) // MAX_KEEP
        kept = flat[::stride]
        if t.dtype in (torch.int64, torch.int32):
            dtype, data = 1, kept.to(torch.int32).numpy().tobytes()
        else:
            dtype, data = 0, kept.to(torch.float32).numpy().tobytes()
        name_b = name.encode()
        dims = list(t.shape)
        self.f.write(struct.pack("<I", len(name_b)) + name_b)
        self.f.write(struct.pack("<II", dtype, len(dims)) + struct.pack("<%dI" % len(dims), *dims))
        self.f.write(struct.pack("<II", stride, kept.numel()) + data)

    def close(self):
        self.f.close()


def train_steps(make, x, y, opt_fn):
    torch.manual_seed(0)
    model = make()
    opt = opt_fn(model.parameters())
    losses = []
    for _ in range(STEPS):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, torch.tensor(losses)


def model_file(name, make, in_shape):
    w = Writer(os.path.join(HERE, name + ".gold"))
    g = torch.Generator().manual_seed(1234)
    x = torch.randn((BATCH,) + in_shape, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    w.add("input", x, full=True)
    w.add("labels", y)

    torch.manual_seed(0)
    model = make()
    for k, v in model.state_dict().items():
        w.add("init." + k, v)
    out = model(x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    w.add("logits", out)
    w.add("loss", loss.reshape(1))
    for k, p in model.named_parameters():
        w.add("grad." + k, p.grad)

    configs = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        "nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4),
        "plainsgd": lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=1e-3),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01),
    }
    for cname, fn in configs.items():
        m, losses = train_steps(make, x, y, fn)
        w.add(cname + ".losses", losses)
        for k, v in m.state_dict().items():
            w.add(cname + "." + k, v)
    w.close()


def data_file():
    w = Writer(os.path.join(HERE, "data.gold"))
    for n, world in [(10, 3), (7, 2), (1000, 4), (5, 8)]:
        for drop_last in (False, True):
            if drop_last and n < world:
                continue
            for rank in range(world):
                for epoch in (0, 1):
                    s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True,
                                           seed=42, drop_last=drop_last)
                    s.set_epoch(epoch)
                    w.add("n%d.w%d.r%d.e%d.d%d" % (n, world, rank, epoch, int(drop_last)),
                          torch.tensor(list(s)))
    # the first test images of Fashion-MNIST after torchvision's ToTensor + Normalize
    import gzip
    import numpy as np
    with gzip.open("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz") as f:
        raw = np.frombuffer(f.read(), dtype=np.uint8, offset=16)[:3 * 784].reshape(3, 784)
    with gzip.open("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)[:3]
    x = torch.from_numpy(raw.copy()).float().div(255).sub_(torch.tensor(0.2860)).div_(torch.tensor(0.3530))
    w.add("fashion.t10k.x", x, full=True)
    w.add("fashion.t10k.y", torch.from_numpy(labels.astype(np.int32)))
    w.close()


if __name__ == "__main__":
    model_file("mlp", mlp, (784,))
    model_file("cnn", cnn, (1, 28, 28))
    data_file()
