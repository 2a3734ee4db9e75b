"""The main job: train a 784-512-512-10 ReLU MLP with softmax cross-entropy.

Until the op library ships the digits dataset, the data are generated: ten
Gaussian classes in 784 dimensions, with a held-out test split.

    python -m gradcore.demo --epochs 3 --seed 0
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore.autodiff import GradManager


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 1, (10, 784)).astype("float32")
    labels = rng.integers(0, 10, n).astype("int32")
    # noisy enough that a linear read-out is not enough after one look
    x = 0.25 * centers[labels] + rng.normal(0, 2.0, (n, 784)).astype("float32")
    return x / 2.0, labels


def build_model():
    return M.Sequential(M.Linear(784, 512), M.ReLU(), M.Linear(512, 512), M.ReLU(), M.Linear(512, 10))


def accuracy(model, x, y, batch=512):
    hits = 0
    for i in range(0, len(x), batch):
        logits = model(gc.tensor(x[i:i + batch]))
        hits += int((logits.numpy().argmax(1) == y[i:i + batch]).sum())
    return hits / len(x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args(argv)

    gc.random.seed(args.seed)
    x, y = make_data(6000, args.seed)
    x_train, y_train, x_test, y_test = x[:5000], y[:5000], x[5000:], y[5000:]
    model = build_model()
    gm = GradManager().attach(model.parameters())
    opt = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_train))
        losses = []
        for i in range(0, len(order), args.batch_size):
            idx = order[i:i + args.batch_size]
            with gm:
                loss = F.cross_entropy(model(gc.tensor(x_train[idx])), gc.tensor(y_train[idx]))
                gm.backward(loss)
            opt.step().clear_grad()
            losses.append(loss.item())
        acc = accuracy(model, x_test, y_test)
        print(f"epoch {epoch}/{args.epochs}  loss {np.mean(losses):.4f}  test accuracy {acc:.3f}  "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
    final = accuracy(model, x_test, y_test)
    print(f"final test accuracy: {final:.3f}")
    return 0 if final > 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
