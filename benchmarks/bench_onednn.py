"""oneDNN's CPU primitives (gradcore/cpu/onednn.py) at the kernel level,
side by side with PyTorch (CPU) in one process: forward + backward of the
issue-25 table's convolution, pooling and batch-norm cases, on one thread
and on all cores (alternating, repeated, medians of per-round ratios), and
oneDNN's matmul against NumPy's BLAS on the MLP's shapes.

gradcore's column is the kernels the ops' cpu methods call (forward,
backward data, backward weights / pooling backward / batch-norm backward),
without the tape; PyTorch's is its forward and ``torch.autograd.grad``
with a given output gradient.

    python benchmarks/bench_onednn.py [--repeat 7] [--threads 1,0] [--only TEXT] [--json PATH]
    python benchmarks/bench_onednn.py --grain [--repeat 7]     # the thread policy's threshold

``--grain`` runs a ladder of primitives (the digits CNN's layers up to the
table's sizes) on one thread and on all, alternating, and prints each
one's work units beside the two times: where all/one drops below 1 is the
threshold ``onednn.grain`` (docs/cpu.md, "Threads").

The matmul comparison runs NumPy's OpenBLAS on one thread where the others
are (``blas.single_threaded()``). Figures: benchmarks/CHANGELOG.md, "oneDNN on the CPU".
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import numpy as np

from gradcore.cpu import blas, onednn

try:
    import torch
    TF = torch.nn.functional
except ImportError:
    torch = None


def timed(fn, seconds=0.3):
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def timed_calls(fn, seconds=0.05):
    """The median of single calls over ``seconds``: the typical call, not
    the mean a few descheduled ones dominate."""
    fn()
    times, end = [], time.perf_counter() + seconds
    while True:
        t = time.perf_counter()
        fn()
        now = time.perf_counter()
        times.append(now - t)
        if now > end and len(times) >= 5:
            return statistics.median(times)


def rnd(*shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.1).astype(np.float32)


def conv_case(xs, ws, stride, padding, transposed=False):
    x, w = rnd(*xs), rnd(*ws, seed=1)
    if transposed:
        y = onednn.conv_transpose(x, w, stride, padding, 0, 1)
    else:
        y = onednn.conv_forward(x, w, stride, padding, 1)
    g = rnd(*y.shape, seed=2)

    def gc_step():
        if transposed:           # y = backward_data(x, w); dx = forward(g, w); dw = backward_weights(x, g)
            onednn.conv_transpose(x, w, stride, padding, 0, 1)
            onednn.conv_forward(g, w, stride, padding, 1)
            onednn.conv_backward_weights(x, g, w.shape, stride, padding, 1)
        else:
            onednn.conv_forward(x, w, stride, padding, 1)
            onednn.conv_backward_data(g, w, x.shape, stride, padding, 1)
            onednn.conv_backward_weights(g, x, w.shape, stride, padding, 1)

    xt, wt, gt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True), torch.tensor(g)
    fn = {(3, False): TF.conv1d, (4, False): TF.conv2d, (5, False): TF.conv3d, (4, True): TF.conv_transpose2d,
          (5, True): TF.conv_transpose3d}[(x.ndim, transposed)]

    def torch_step():
        torch.autograd.grad(fn(xt, wt, None, stride, padding), (xt, wt), gt)
    return gc_step, torch_step


def pool_case(xs, kind, k, s):
    x = rnd(*xs)
    y = onednn.pool_forward(x, kind, k, s, 0)
    g = rnd(*y.shape, seed=2)

    def gc_step():
        onednn.pool_forward(x, kind, k, s, 0)
        onednn.pool_backward(g, x, kind, k, s, 0)
    xt, gt = torch.tensor(x, requires_grad=True), torch.tensor(g)
    fn = TF.max_pool2d if kind == "max" else TF.avg_pool2d

    def torch_step():
        torch.autograd.grad(fn(xt, k, s), xt, gt)
    return gc_step, torch_step


def bn_case(xs):
    x = rnd(*xs) * 10 + 1
    c = xs[1]
    p = (1, c) + (1,) * (len(xs) - 2)
    w, b, g = rnd(c, seed=1).reshape(p) + 1, rnd(c, seed=2).reshape(p), rnd(*xs, seed=3)

    def gc_step():
        _, m, inv = onednn.batch_norm_training(x, w, b, 1e-5)
        onednn.batch_norm_backward(g, x, w, m, inv, 1e-5)
    xt, wt, bt, gt = (torch.tensor(a.reshape(-1) if a.ndim == len(xs) and a is not x and a is not g else a,
                                   requires_grad=a is not g) for a in (x, w.reshape(-1), b.reshape(-1), g))

    def torch_step():
        torch.autograd.grad(TF.batch_norm(xt, None, None, wt, bt, True, 0.1, 1e-5), (xt, wt, bt), gt)
    return gc_step, torch_step


CASES = {
    "conv2d N16 C32 32x32 -> 64, 3x3, pad 1": lambda: conv_case((16, 32, 32, 32), (64, 32, 3, 3), 1, 1),
    "conv2d N32 C3 64x64 -> 16, 5x5, stride 2": lambda: conv_case((32, 3, 64, 64), (16, 3, 5, 5), 2, 0),
    "conv_transpose2d N16 C64 16x16 -> 32, 4x4, stride 2, pad 1":
        lambda: conv_case((16, 64, 16, 16), (64, 32, 4, 4), 2, 1, transposed=True),
    "conv3d N4 C16 16^3 -> 32, 3x3x3, pad 1": lambda: conv_case((4, 16, 16, 16, 16), (32, 16, 3, 3, 3), 1, 1),
    "max_pool2d N32 C64 32x32, 2x2": lambda: pool_case((32, 64, 32, 32), "max", 2, 2),
    "avg_pool2d N32 C64 32x32, 2x2": lambda: pool_case((32, 64, 32, 32), "average", 2, 2),
    "batch_norm training N32 C64 32x32": lambda: bn_case((32, 64, 32, 32)),
}

MATMUL_LAYERS = [(784, 512), (512, 512), (512, 10)]      # the MLP's (in, out)


def matmul_cases(repeat, label):
    """oneDNN's matmul against NumPy's matmul on the three products of each
    MLP layer as MatrixMul runs them (x @ w.T, g @ w, g.T @ x: transposed
    views), batch 128 and 32; matmul_min lifted so oneDNN runs them all."""
    saved, onednn.matmul_min = onednn.matmul_min, 0
    out = {}
    try:
        for batch in (128, 32):
            for fin, fout in MATMUL_LAYERS:
                x, w, g = rnd(batch, fin), rnd(fout, fin, seed=1), rnd(batch, fout, seed=2)
                for what, a, b in ((f"x @ w.T {batch}x{fin}x{fout}", x, w.T), (f"g @ w {batch}x{fout}x{fin}", g, w),
                                   (f"g.T @ x {fout}x{batch}x{fin}", g.T, x)):
                    res = compare({"onednn": lambda a=a, b=b: onednn.matmul(a, b),
                                   "numpy": lambda a=a, b=b: np.matmul(a, b)}, repeat, pause=0.0, seconds=0.05,
                                  timer=timed_calls)
                    out[f"matmul {what} [{label}]"] = res
                    med = res["median_s"]
                    print(f"matmul {what}: oneDNN {med['onednn'] * 1e6:.1f} us, NumPy {med['numpy'] * 1e6:.1f} us, "
                          f"oneDNN/NumPy {res['ratio_median']:.2f}x")
    finally:
        onednn.matmul_min = saved
    return out


# the thread policy's ladder (onednn.grain): one primitive each, from the
# digits CNN's layers up; (N, C, H, O) for 3x3 pad-1 conv2d, (N, C, H) else
GRAIN_CONV = [(4, 8, 8, 8), (32, 1, 8, 16), (32, 16, 4, 32), (8, 16, 16, 16), (32, 16, 8, 32), (16, 16, 16, 32),
              (16, 32, 16, 64), (16, 32, 32, 64)]
GRAIN_POOL = [(8, 16, 8), (32, 16, 8), (32, 32, 16), (32, 64, 16), (32, 64, 32), (64, 64, 32)]


def grain_cases():
    """(family, shape, work units, fn) for the thread policy's ladder."""
    for n, c, h, o in GRAIN_CONV:
        x, w = rnd(n, c, h, h), rnd(o, c, 3, 3, seed=1)
        g = rnd(n, o, h, h, seed=2)
        work = onednn._conv_work(g.shape, w.shape)
        yield "conv fwd", (n, c, h, o), work, lambda x=x, w=w: onednn.conv_forward(x, w, 1, 1, 1)
        yield "conv bwd data", (n, c, h, o), work, lambda g=g, w=w, x=x: onednn.conv_backward_data(g, w, x.shape, 1,
                                                                                                    1, 1)
        yield "conv bwd weights", (n, c, h, o), work, \
            lambda g=g, x=x, w=w: onednn.conv_backward_weights(g, x, w.shape, 1, 1, 1)
    for n, c, h in GRAIN_POOL:
        x = rnd(n, c, h, h)
        g = rnd(n, c, h // 2, h // 2, seed=2)
        work = onednn._pool_work(x.shape, g.shape, (2, 2))
        yield "max pool fwd+bwd", (n, c, h), work, lambda x=x, g=g: onednn.pool_backward(g, x, "max", 2, 2, 0)
        yield "avg pool fwd", (n, c, h), work, lambda x=x: onednn.pool_forward(x, "average", 2, 2, 0)
    for n, c, h in GRAIN_POOL:
        x = rnd(n, c, h, h) + 1
        p = (1, c, 1, 1)
        w, b, g = np.ones(p, np.float32), np.zeros(p, np.float32), rnd(n, c, h, h, seed=3)
        _, m, inv = onednn.batch_norm_training(x, w, b, 1e-5)

        def bn(x=x, w=w, b=b, g=g, m=m, inv=inv):
            onednn.batch_norm_training(x, w, b, 1e-5)
            onednn.batch_norm_backward(g, x, w, m, inv, 1e-5)
        yield "batch norm fwd+bwd", (n, c, h), x.size * onednn.BN_COST, bn


def grain_ladder(repeat):
    """Each primitive of the ladder on one thread (grain above its work) and
    on all (grain 0), alternating: the ratio all/one says where the
    threads start to pay."""
    saved = onednn.grain
    out = {}
    try:
        for fam, shape, work, fn in grain_cases():
            def one():
                onednn.grain = float("inf")
                fn()

            def every():
                onednn.grain = 0
                fn()
            res = compare({"all": every, "one": one}, repeat, pause=0.0, seconds=0.05, timer=timed_calls)
            # the best round of each: what a quiet machine gives (the median measures the load)
            best = {k: min(v) for k, v in res["rounds"].items()}
            out[f"{fam} {shape}"] = dict(res, work=work, best_s=best)
            med = res["median_s"]
            print(f"{fam:18s} {str(shape):18s} work {work:9.3g}: median one {med['one'] * 1e6:8.1f} us, "
                  f"all {med['all'] * 1e6:8.1f} us ({res['ratio_median']:6.2f}x); best one "
                  f"{best['one'] * 1e6:8.1f}, all {best['all'] * 1e6:8.1f} ({best['all'] / best['one']:.2f}x)")
    finally:
        onednn.grain = saved
    return out


def set_threads(n):
    onednn.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n if n else os.cpu_count())


def compare(impls, repeat, pause=0.1, seconds=0.3, timer=timed):
    times = {k: [] for k in impls}
    for r in range(repeat):
        order = list(impls)[r % len(impls):] + list(impls)[:r % len(impls)]
        for k in order:
            time.sleep(pause)      # let the other library's worker threads go idle
            times[k].append(timer(impls[k], seconds))
    a, b = list(impls)
    ratios = [x / y for x, y in zip(times[a], times[b])]
    return {"median_s": {k: statistics.median(v) for k, v in times.items()},
            "ratio_median": statistics.median(ratios), "rounds": times}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", default="1,0", help="thread counts to run, 0 = all cores")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--grain", action="store_true", help="the thread policy's ladder: each primitive on one "
                    "thread and on all (onednn.grain), no PyTorch")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.grain:
        print(f"{onednn.status()}; load average {os.getloadavg()}")
        results = grain_ladder(args.repeat)
        print(f"load average {os.getloadavg()}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return 0
    if torch is None or onednn.why_not():
        print(f"needs PyTorch and oneDNN: torch {'absent' if torch is None else 'ok'}, oneDNN {onednn.status()}")
        return 1
    print(f"{onednn.status()}; torch {torch.__version__}; load average {os.getloadavg()}")
    results = {}
    for n in (int(t) for t in args.threads.split(",")):
        set_threads(n)
        scope = blas.single_threaded() if n == 1 else contextlib.nullcontext()
        scope.__enter__()
        label = f"{n} thread{'s' if n != 1 else ''}" if n else f"all cores ({os.cpu_count()})"
        print(f"--- {label}")
        for name, make in CASES.items():
            if args.only not in name:
                continue
            gc_step, torch_step = make()
            res = compare({"gradcore": gc_step, "torch": torch_step}, args.repeat)
            results[f"{name} [{label}]"] = res
            med = res["median_s"]
            print(f"{name}: oneDNN {med['gradcore'] * 1e3:.3f} ms, torch {med['torch'] * 1e3:.3f} ms, "
                  f"gradcore/torch {res['ratio_median']:.2f}x")
        if "matmul" in args.only or not args.only:
            results.update(matmul_cases(args.repeat, label))
        scope.__exit__(None, None, None)
    set_threads(0)
    print(f"cache: {onednn.stats()}; load average {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
