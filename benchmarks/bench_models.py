"""The demo's training step, the MLP 784-512-512-10 (forward + backward,
batch 128 and 32, as bench_overhead.py's) and forward + backward of conv2d,
conv_transpose2d, conv3d, max_pool2d and bilinear interpolate, gradcore
against PyTorch eager, side by side in one process (alternating, repeated,
medians), on one thread and on all cores.

    python benchmarks/bench_models.py [--repeat 7] [--threads 1,0] [--only TEXT] [--json PATH]

One thread means oneDNN's (``onednn.set_num_threads(1)``), NumPy's OpenBLAS
(``blas.single_threaded()``) and PyTorch's (``torch.set_num_threads(1)``);
0 means every core for all three.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import contextlib

import gradcore as gc
import gradcore.functional as F
from gradcore.cpu import blas, onednn
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


MLP_SIZES = (784, 512, 512, 10)


def _mlp_arrays(batch):
    rng = np.random.default_rng(0)
    ws = [rng.uniform(-fin ** -0.5, fin ** -0.5, (fout, fin)).astype("float32")
          for fin, fout in zip(MLP_SIZES, MLP_SIZES[1:])]
    bs = [np.zeros(fout, "float32") for fout in MLP_SIZES[1:]]
    return ws, bs, rng.standard_normal((batch, MLP_SIZES[0])).astype("float32"), rng.integers(0, 10, batch)


def gc_mlp(batch):
    ws, bs, x, y = _mlp_arrays(batch)
    params = [gc.Parameter(a) for pair in zip(ws, bs) for a in pair]
    xt, yt = gc.tensor(x), gc.tensor(y.astype("int32"))
    gm = GradManager().attach(params)

    def step():
        for p in params:
            p.grad = None
        with gm:
            h = xt
            for i in range(0, 6, 2):
                h = F.linear(h, params[i], params[i + 1])
                h = F.relu(h) if i < 4 else h
            gm.backward(F.cross_entropy(h, yt))
    return step


def torch_mlp(batch):
    ws, bs, x, y = _mlp_arrays(batch)
    params = [torch.tensor(a, requires_grad=True) for pair in zip(ws, bs) for a in pair]
    xt, yt = torch.tensor(x), torch.tensor(y).long()
    TF = torch.nn.functional

    def step():
        for p in params:
            p.grad = None
        h = xt
        for i in range(0, 6, 2):
            h = TF.linear(h, params[i], params[i + 1])
            h = torch.relu(h) if i < 4 else h
        TF.cross_entropy(h, yt).backward()
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
    "conv2d s2": (lambda x, w: F.conv2d(x, w, stride=2), lambda x, w: torch.nn.functional.conv2d(x, w, stride=2),
                  [(32, 3, 64, 64), (16, 3, 5, 5)]),
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


def set_threads(n):
    """oneDNN's and PyTorch's thread counts (0: every core); NumPy's
    OpenBLAS is scoped in main."""
    onednn.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n if n else os.cpu_count())


def cases():
    found = {"demo training step (digits CNN, batch 32)": (gc_demo_step, torch_demo_step),
             "MLP 784-512-512-10 fwd+bwd batch 128": (lambda: gc_mlp(128), lambda: torch_mlp(128)),
             "MLP 784-512-512-10 fwd+bwd batch 32": (lambda: gc_mlp(32), lambda: torch_mlp(32)),
             f"conv2d fwd+bwd {CONV}": (gc_conv, torch_conv),
             "conv2d fwd+bwd x(32,3,64,64) w(16,3,5,5) stride 2":
                 (lambda: gc_family("conv2d s2"), lambda: torch_family("conv2d s2"))}
    for name in FAMILY:
        if name != "conv2d s2":
            found[name] = (lambda name=name: gc_family(name), lambda name=name: torch_family(name))
    return found


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", default="1,0", help="thread counts to run, 0 = all cores")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    print(f"load average before: {os.getloadavg()}; torch {'absent' if torch is None else torch.__version__}; "
          f"{onednn.status()}; {blas.status()}")
    results = {}
    for n in (int(t) for t in args.threads.split(",")):
        set_threads(n)
        label = f"{n} thread{'s' if n != 1 else ''}" if n else f"all cores ({os.cpu_count()})"
        print(f"--- {label}")
        with blas.single_threaded() if n == 1 else contextlib.nullcontext():
            for name, (make_gc, make_torch) in cases().items():
                if args.only not in name:
                    continue
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
                res = results[f"{name} [{label}]"] = {"median_s": med, "rounds": times}
                line = f"{name}: gradcore {med['gradcore'] * 1e3:.3f} ms"
                if "torch" in med:
                    ratios = [a / b for a, b in zip(times["gradcore"], times["torch"])]
                    res["ratio_median"] = statistics.median(ratios)
                    line += (f", torch {med['torch'] * 1e3:.3f} ms, gradcore/torch {res['ratio_median']:.2f}x "
                             f"(per-round ratios {min(ratios):.2f}-{max(ratios):.2f})")
                print(line, flush=True)
    set_threads(0)
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
