"""The demo's training step and forward + backward of conv2d, conv_transpose2d,
conv3d and bilinear interpolate, gradcore against PyTorch eager, side by side
in one process (alternating, repeated, medians).

    python benchmarks/bench_models.py [--repeat 7] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import gradcore as gc
import gradcore.functional as F
import gradcore.optimizer as optim
from gradcore.autodiff import GradManager
from gradcore.demo import DigitsCNN, load_digits

try:
    import torch
except ImportError:  # the torch column is left out
    torch = None


def timed(fn, seconds=0.25):
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def gc_demo_step(batch=32):
    x, y = load_digits()
    xb, yb = gc.tensor(x[:batch]), gc.tensor(y[:batch])
    model = DigitsCNN()
    gm = GradManager().attach(model.parameters())
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        with gm:
            gm.backward(F.cross_entropy(model(xb), yb))
        opt.step().clear_grad()
    return step


def torch_demo_step(batch=32):
    nn = torch.nn
    x, y = load_digits()
    xb, yb = torch.tensor(x[:batch]), torch.tensor(y[:batch]).long()
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return step


CONV = dict(n=16, c=32, h=32, w=32, o=64, k=3)


def gc_conv(device="cpu", spec=None):
    """A conv2d forward + backward step (x and w both get gradients) on
    ``spec`` (n, c, h, w, o, k; default ``CONV``), padding 1."""
    s = spec or CONV
    rng = np.random.default_rng(0)
    x = gc.tensor(rng.normal(size=(s["n"], s["c"], s["h"], s["w"])).astype("float32"), device=device)
    w = gc.Parameter(rng.normal(size=(s["o"], s["c"], s["k"], s["k"])).astype("float32") * 0.05, device=device)
    gm = GradManager().attach([x, w])

    def step():
        with gm:
            gm.backward(F.conv2d(x, w, padding=1).sum())
        x.grad = w.grad = None
    return step


def torch_conv(device="cpu", spec=None):
    s = spec or CONV
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(s["n"], s["c"], s["h"], s["w"])).astype("float32"), device=device,
                     requires_grad=True)
    w = torch.tensor(rng.normal(size=(s["o"], s["c"], s["k"], s["k"])).astype("float32") * 0.05, device=device,
                     requires_grad=True)

    def step():
        torch.nn.functional.conv2d(x, w, padding=1).sum().backward()
        x.grad = w.grad = None
    return step


# the rest of the convolution family: (gradcore fn, torch fn, input shapes)
FAMILY = {
    "conv_transpose2d fwd+bwd x(16,64,16,16) w(64,32,4,4) stride 2 pad 1":
        (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1),
         lambda x, w: torch.nn.functional.conv_transpose2d(x, w, stride=2, padding=1),
         [(16, 64, 16, 16), (64, 32, 4, 4)]),
    "conv3d fwd+bwd x(4,16,16,16,16) w(32,16,3,3,3) pad 1":
        (lambda x, w: F.conv3d(x, w, padding=1), lambda x, w: torch.nn.functional.conv3d(x, w, padding=1),
         [(4, 16, 16, 16, 16), (32, 16, 3, 3, 3)]),
    "max_pool2d fwd+bwd x(32,64,32,32) 2x2":
        (lambda x: F.max_pool2d(x, 2), lambda x: torch.nn.functional.max_pool2d(x, 2), [(32, 64, 32, 32)]),
    "interpolate bilinear fwd+bwd x(16,32,64,64) -> 128x128":
        (lambda x: F.vision.interpolate(x, size=(128, 128)),
         lambda x: torch.nn.functional.interpolate(x, size=(128, 128), mode="bilinear", align_corners=False),
         [(16, 32, 64, 64)]),
}


def _inputs(shapes):
    rng = np.random.default_rng(0)
    return [(rng.normal(size=s) * 0.1).astype("float32") for s in shapes]


def gc_family(name):
    fn, _, shapes = FAMILY[name]
    xs = [gc.tensor(a) for a in _inputs(shapes)]
    gm = GradManager().attach(xs)

    def step():
        with gm:
            gm.backward(fn(*xs).sum())
        for x in xs:
            x.grad = None
    return step


def torch_family(name):
    _, fn, shapes = FAMILY[name]
    xs = [torch.tensor(a, requires_grad=True) for a in _inputs(shapes)]

    def step():
        fn(*xs).sum().backward()
        for x in xs:
            x.grad = None
    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    print(f"load average before: {os.getloadavg()}; torch {'absent' if torch is None else torch.__version__}")
    cases = {"demo training step (digits CNN, batch 32)": (gc_demo_step, torch_demo_step),
             f"conv2d fwd+bwd {CONV}": (gc_conv, torch_conv)}
    for name in FAMILY:
        cases[name] = (lambda name=name: gc_family(name), lambda name=name: torch_family(name))
    results = {}
    for name, (make_gc, make_torch) in cases.items():
        impls = {"gradcore": make_gc()}
        if torch is not None:
            impls["torch"] = make_torch()
        times = {k: [] for k in impls}
        for r in range(args.repeat):
            order = list(impls)[r % len(impls):] + list(impls)[:r % len(impls)]
            for k in order:
                time.sleep(0.2)      # let the other library's worker threads go idle
                times[k].append(timed(impls[k]))
        med = {k: statistics.median(v) for k, v in times.items()}
        results[name] = {"median_s": med, "rounds": times}
        line = f"{name}: gradcore {med['gradcore'] * 1e3:.3f} ms"
        if "torch" in med:
            line += f", torch {med['torch'] * 1e3:.3f} ms, gradcore/torch {med['gradcore'] / med['torch']:.2f}x"
        print(line)
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
