"""The PyTorch models that mg's `train --model mlp|cnn` builds, layer for layer
(docs/train.md): one definition for the golden files (tests/golden/gen.py) and
the PyTorch references of the benchmarks (tests/bench/train_ref.py)."""
import torch.nn as nn


def mlp():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1024, 128), nn.ReLU(), nn.Linear(128, 10))
