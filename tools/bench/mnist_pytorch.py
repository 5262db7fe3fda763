#!/usr/bin/env python3
"""The main job's recipe in PyTorch eager, for time-to-accuracy next to `bazel run
//tools:train_mnist` on the same machine: the CNN of nn/models/image.cc on Fashion-MNIST (Debian's
dataset-fashion-mnist), pixels normalised with mean 0.2860 / std 0.3530, batch 128 reshuffled each
epoch, AdamW (lr 1e-3, betas (0.9, 0.999), weight decay 1e-4 on matrices and conv kernels only)
with cosine decay to lr/10 over the run, f32, 4 epochs, test accuracy after each epoch.

  py=$(tools/bench/setup_pytorch_venv.sh | tail -1)
  OMP_NUM_THREADS=2 $py tools/bench/mnist_pytorch.py

Prints "epoch N: test loss L, test accuracy A% at T s" (T: wall time since training started,
evaluations included, as train_mnist prints it) and the time to 90% test accuracy.
"""
import argparse
import gzip
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def load(split):
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(f"{DATA}/{prefix}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{DATA}/{prefix}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (torch.from_numpy(images.astype(np.float32)) / 255 - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=90.0, help="test accuracy, percent")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    train_x, train_y = load("train")
    test_x, test_y = load("test")
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 1e-4},
                             {"params": other, "weight_decay": 0.0}], lr=1e-3, fused=True)
    batch = 128
    per_epoch = math.ceil(len(train_x) / batch)  # the last one partial, as tapegrad's batcher
    total = args.epochs * per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {total} steps", flush=True)
    reached = None
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(train_x))
        for i in range(per_epoch):
            idx = order[i * batch:(i + 1) * batch]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(train_x[idx]), train_y[idx]).backward()
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            logits = model(test_x)
            loss = F.cross_entropy(logits, test_y).item()
            acc = 100 * (logits.argmax(1) == test_y).float().mean().item()
        elapsed = time.perf_counter() - start
        print(f"epoch {epoch}: test loss {loss:.4f}, test accuracy {acc:.2f}% at {elapsed:.1f} s",
              flush=True)
        if reached is None and acc >= args.target:
            reached = elapsed
    print(f"time to {args.target:.0f}%: " + (f"{reached:.1f} s" if reached else "not reached"))


if __name__ == "__main__":
    main()
