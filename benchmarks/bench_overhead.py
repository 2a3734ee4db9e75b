#!/usr/bin/env python
"""Per-op overhead of gradcore against hand-written NumPy and PyTorch eager.

Three cases, all forward + backward, all in one process, the implementations
alternating inside every round (the starting implementation rotates from
round to round), medians over the rounds:

  (a) chain  : 1000 cheap elementwise ops on 16-element float32 arrays
               ([x*a, x+b, tanh(x), sin(x)] repeated 250 times, then sum);
               only the starting x requires a gradient.
  (b) scalar : y = sum(x*x) on a one-element tensor: the fixed cost of one
               whole record + forward + backward.
  (c) mlp    : 784-512-512-10 ReLU MLP, softmax cross-entropy (mean), batch
               128 and 32, gradients for all six parameters, no optimizer step.

Before timing, gradcore's gradients are checked against the NumPy reference
(np.allclose) for (a), (b) and (c); the script stops if they differ.

Usage::

    python benchmarks/bench_overhead.py                 # 7 rounds
    python benchmarks/bench_overhead.py --repeat 11 --json results.json
    python benchmarks/bench_overhead.py --quick         # 3 short rounds, a smoke test
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc as pygc
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

import gradcore as gc
import gradcore.functional as F
import gradcore.memory as gc_memory
from gradcore.autodiff import GradManager

try:
    import torch
    import torch.nn.functional as TF
except ImportError:  # torch is a benchmark-only dependency
    torch = None

perf_counter = time.perf_counter

CHAIN_BLOCKS = 250          # 4 ops per block -> 1000 ops
CHAIN_OPS = 4 * CHAIN_BLOCKS
CHAIN_N = 16
MLP_SIZES = (784, 512, 512, 10)

# ratio targets: gradcore time / other time must be <= this
TARGETS = {
    "chain": {"torch": 0.35, "numpy": 1.7},
    "scalar": {"torch": 0.25},
    "mlp128": {"torch": 0.75},
    "mlp32": {"torch": 0.85},
}


# ============================================================== machine info
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def numpy_blas_info() -> dict:
    info = {}
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        info = {k: blas.get(k) for k in ("name", "version", "openblas configuration") if blas.get(k)}
    except Exception as exc:  # older numpy: no mode="dicts"
        info = {"error": repr(exc)}
    threads = _openblas_threads()
    if threads is not None:
        info["threads"] = threads
    return info


def _openblas_threads():
    """Threads OpenBLAS will use, asked from the library numpy loaded."""
    try:
        from threadpoolctl import threadpool_info
        for p in threadpool_info():
            if p.get("internal_api") in ("openblas", "mkl", "blis"):
                return p.get("num_threads")
    except ImportError:
        pass
    import ctypes
    try:
        with open(f"/proc/{os.getpid()}/maps") as f:
            libs = {line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return None
    for lib in sorted(libs):
        try:
            dll = ctypes.CDLL(lib)
        except OSError:
            continue
        for sym in ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                    "openblas_get_num_threads64_", "openblas_get_num_threads"):
            fn = getattr(dll, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                return int(fn())
    return None


def gradcore_git() -> str:
    """Commit (and whether gradcore's sources differ from it) of the gradcore
    being measured, when it is imported from a git checkout."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(gc.__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return "not a git checkout"
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "gradcore", "ops",
                                "setup.py"], capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + (" + uncommitted changes in gradcore/ or ops/" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_info() -> dict:
    env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
           if k in os.environ}
    info = {
        "cpu": cpu_model(),
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "numpy_blas": numpy_blas_info(),
        "gradcore": getattr(gc, "__version__", "?"),
        "gradcore_path": os.path.dirname(os.path.abspath(gc.__file__)),
        "gradcore_git": gradcore_git(),
        "thread_env": env,
    }
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["torch_interop_threads"] = torch.get_num_interop_threads()
        info["torch_mkl"] = bool(torch.backends.mkl.is_available())
    return info


# ============================================================== (a) chain
def chain_data(seed=0):
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(-1.0, 1.0, CHAIN_N).astype(np.float32)
    # a close to 1 and b close to 0 keep the 1000-op gradient in the normal
    # float32 range (1e-8 .. 1): no denormals, and a meaningful check
    a = rng.uniform(0.98, 1.02, CHAIN_N).astype(np.float32)
    b = rng.uniform(-0.002, 0.002, CHAIN_N).astype(np.float32)
    return x0, a, b


class ChainGradcore:
    name = "gradcore"

    def __init__(self, x0, a, b):
        self.x = gc.Parameter(x0.copy())
        self.a = gc.tensor(a)          # constants: not attached
        self.b = gc.tensor(b)
        self.gm = GradManager().attach([self.x])

    def run(self):
        x, a, b, gm = self.x, self.a, self.b, self.gm
        tanh, sin, fsum = F.tanh, F.sin, F.sum
        x.grad = None
        t0 = perf_counter()
        with gm:
            h = x
            for _ in range(CHAIN_BLOCKS):
                h = h * a
                h = h + b
                h = tanh(h)
                h = sin(h)
            loss = fsum(h)
            t1 = perf_counter()
            gm.backward(loss)
        self.loss = loss
        return t1 - t0

    def result(self):
        return float(self.loss.item()), [self.x.grad.numpy()]


class ChainNumpy:
    """Hand-written forward (keeping only what the backward reads: the tanh
    outputs, which are also the sin inputs) and hand-written backward doing
    the same ufunc calls as the derivative rules (sin: g*cos(x); tanh:
    g*(1-out*out); x+b: g; x*a: g*a), in place where NumPy allows it and with
    the constant 1 hoisted out of the loop as a float32 0-d array."""
    name = "numpy"
    host_pool = False        # NumPy's own allocator, as hand-written code has

    def __init__(self, x0, a, b):
        self.x0, self.a, self.b = x0, a, b
        # the constant as a 0-d float32 array: a Python int costs NumPy a
        # scalar conversion on every call (~0.3 us)
        self.one = np.ones((), np.float32)

    def run(self):
        x0, a, b = self.x0, self.a, self.b
        tanh, sin, cos, mul, sub = np.tanh, np.sin, np.cos, np.multiply, np.subtract
        one = self.one
        t0 = perf_counter()
        saved = []
        keep = saved.append
        h = x0
        for _ in range(CHAIN_BLOCKS):
            h = h * a
            h += b
            t = tanh(h)
            keep(t)
            h = sin(t)
        loss = h.sum()
        t1 = perf_counter()
        g = np.ones_like(h)
        tmp = np.empty_like(h)
        for t in reversed(saved):
            g *= cos(t)              # sin
            mul(t, t, out=tmp)       # tanh
            sub(one, tmp, out=tmp)
            g *= tmp
            g *= a                   # x*a   (x+b passes g through)
        self.out = (loss, g)
        return t1 - t0

    def result(self):
        return float(self.out[0]), [self.out[1]]


class ChainTorch:
    name = "torch"

    def __init__(self, x0, a, b):
        self.x = torch.tensor(x0, requires_grad=True)
        self.a = torch.from_numpy(a.copy())
        self.b = torch.from_numpy(b.copy())

    def run(self):
        x, a, b = self.x, self.a, self.b
        tanh, sin = torch.tanh, torch.sin
        x.grad = None
        t0 = perf_counter()
        h = x
        for _ in range(CHAIN_BLOCKS):
            h = h * a
            h = h + b
            h = tanh(h)
            h = sin(h)
        loss = h.sum()
        t1 = perf_counter()
        loss.backward()
        self.loss = loss
        return t1 - t0

    def result(self):
        return float(self.loss.item()), [self.x.grad.numpy()]


# ============================================================== (b) scalar
class ScalarGradcore:
    name = "gradcore"

    def __init__(self, x0):
        self.x = gc.Parameter(x0.copy())
        self.gm = GradManager().attach([self.x])

    def run(self):
        x, gm = self.x, self.gm
        x.grad = None
        with gm:
            y = F.sum(x * x)
            gm.backward(y)
        self.y = y

    def result(self):
        return float(self.y.item()), [self.x.grad.numpy()]


class ScalarNumpy:
    name = "numpy"
    host_pool = False

    def __init__(self, x0):
        self.x = x0.copy()

    def run(self):
        x = self.x
        xx = x * x                   # forward
        y = xx.sum()
        gy = np.ones_like(y)         # backward: seed, then d(x*x)/dx = 2x
        gx = x * (gy * 2)
        self.out = (y, gx)

    def result(self):
        return float(self.out[0]), [self.out[1]]


class ScalarTorch:
    name = "torch"

    def __init__(self, x0):
        self.x = torch.tensor(x0, requires_grad=True)

    def run(self):
        x = self.x
        x.grad = None
        y = (x * x).sum()
        y.backward()
        self.y = y

    def result(self):
        return float(self.y.item()), [self.x.grad.numpy()]


# ============================================================== (c) MLP
def mlp_data(batch, seed=0):
    """Weights (out, in) as in nn.Linear / MegEngine's Linear, uniform
    +-1/sqrt(fan_in); standard-normal inputs; int64 labels."""
    rng = np.random.default_rng(seed)
    params = []
    for fin, fout in zip(MLP_SIZES[:-1], MLP_SIZES[1:]):
        bound = 1.0 / np.sqrt(fin)
        params.append(rng.uniform(-bound, bound, (fout, fin)).astype(np.float32))
        params.append(rng.uniform(-bound, bound, fout).astype(np.float32))
    x = rng.standard_normal((batch, MLP_SIZES[0])).astype(np.float32)
    y = rng.integers(0, MLP_SIZES[-1], batch).astype(np.int64)
    return params, x, y


class MlpGradcore:
    name = "gradcore"

    def __init__(self, params, x, y):
        self.params = [gc.Parameter(p.copy()) for p in params]
        self.x = gc.tensor(x)
        self.y = gc.tensor(y)
        self.gm = GradManager().attach(self.params)

    def run(self):
        W1, b1, W2, b2, W3, b3 = ps = self.params
        for p in ps:
            p.grad = None
        relu, linear = F.relu, F.linear
        t0 = perf_counter()
        with self.gm:
            h = relu(linear(self.x, W1, b1))
            h = relu(linear(h, W2, b2))
            logits = linear(h, W3, b3)
            loss = F.cross_entropy(logits, self.y)
            t1 = perf_counter()
            self.gm.backward(loss)
        self.loss = loss
        return t1 - t0

    def result(self):
        return float(self.loss.item()), [p.grad.numpy() for p in self.params]


class MlpNumpy:
    """Hand-written forward and backward (fused softmax-cross-entropy
    gradient, in-place ReLU masks and bias adds), no dx for the input."""
    name = "numpy"
    host_pool = False

    def __init__(self, params, x, y):
        self.params = [p.copy() for p in params]
        self.x, self.y = x, y
        self.rows = np.arange(x.shape[0])

    def run(self):
        W1, b1, W2, b2, W3, b3 = self.params
        x, y, rows = self.x, self.y, self.rows
        n = x.shape[0]
        t0 = perf_counter()
        z1 = x @ W1.T
        z1 += b1
        h1 = np.maximum(z1, 0)
        z2 = h1 @ W2.T
        z2 += b2
        h2 = np.maximum(z2, 0)
        logits = h2 @ W3.T
        logits += b3
        z = logits - logits.max(axis=1, keepdims=True)
        e = np.exp(z)
        s = e.sum(axis=1, keepdims=True)
        logp = z - np.log(s)
        loss = -logp[rows, y].mean()
        t1 = perf_counter()
        d = e / s                    # softmax
        d[rows, y] -= 1
        d *= np.float32(1.0 / n)     # d loss / d logits
        gW3 = d.T @ h2
        gb3 = d.sum(axis=0)
        dh = d @ W3
        dh *= h2 > 0
        gW2 = dh.T @ h1
        gb2 = dh.sum(axis=0)
        dh = dh @ W2
        dh *= h1 > 0
        gW1 = dh.T @ x
        gb1 = dh.sum(axis=0)
        self.out = (loss, [gW1, gb1, gW2, gb2, gW3, gb3])
        return t1 - t0

    def result(self):
        return float(self.out[0]), self.out[1]


class MlpNumpyPooled(MlpNumpy):
    """The same hand-written NumPy, its arrays from gradcore's host memory
    pool (gradcore.memory): what the allocator alone is worth."""
    name = "numpy+pool"
    host_pool = True


class MlpTorch:
    name = "torch"

    def __init__(self, params, x, y):
        self.params = [torch.tensor(p, requires_grad=True) for p in params]
        self.x = torch.from_numpy(x.copy())
        self.y = torch.from_numpy(y.copy())

    def run(self):
        W1, b1, W2, b2, W3, b3 = ps = self.params
        for p in ps:
            p.grad = None
        t0 = perf_counter()
        h = torch.relu(TF.linear(self.x, W1, b1))
        h = torch.relu(TF.linear(h, W2, b2))
        logits = TF.linear(h, W3, b3)
        loss = TF.cross_entropy(logits, self.y)
        t1 = perf_counter()
        loss.backward()
        self.loss = loss
        return t1 - t0

    def result(self):
        return float(self.loss.item()), [p.grad.numpy() for p in self.params]


# ------------------------------------------------- (c') the MLP's GEMMs alone
def mlp_gemm_operands(batch, seed=1):
    """The eight products of one MLP step (forward: x W1^T, h1 W2^T, h2 W3^T;
    backward: dW3 = d^T h2, dh2 = d W3, dW2 = g2^T h1, dh1 = g2 W2,
    dW1 = g1^T x; no dx for the input), as (a, b, transpose a, transpose b)."""
    rng = np.random.default_rng(seed)
    r = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    (i, h, o), n = (MLP_SIZES[0], MLP_SIZES[1], MLP_SIZES[3]), batch
    return [(r(n, i), r(h, i), False, True), (r(n, h), r(h, h), False, True), (r(n, h), r(o, h), False, True),
            (r(n, o), r(n, h), True, False), (r(n, o), r(o, h), False, False),
            (r(n, h), r(n, h), True, False), (r(n, h), r(h, h), False, False),
            (r(n, h), r(n, i), True, False)]


class GemmGradcore:
    """The products through gradcore's MatrixMul op (not recorded)."""
    name = "gradcore"

    def __init__(self, operands):
        self.ops = [(gc.tensor(a), gc.tensor(b), ta, tb) for a, b, ta, tb in operands]

    def run(self):
        self.out = [F.matmul(a, b, ta, tb) for a, b, ta, tb in self.ops]

    def result(self):
        return 0.0, [o.numpy() for o in self.out]


class GemmNumpy:
    name = "numpy"
    host_pool = False

    def __init__(self, operands):
        self.ops = [(a.T if ta else a, b.T if tb else b) for a, b, ta, tb in operands]

    def run(self):
        self.out = [np.matmul(a, b) for a, b in self.ops]

    def result(self):
        return 0.0, self.out


class GemmTorch:
    name = "torch"

    def __init__(self, operands):
        t = lambda x: torch.from_numpy(x.copy())  # noqa: E731
        self.ops = [(t(a).T if ta else t(a), t(b).T if tb else t(b)) for a, b, ta, tb in operands]

    def run(self):
        self.out = [torch.mm(a, b) for a, b in self.ops]

    def result(self):
        return 0.0, [o.numpy() for o in self.out]


# ============================================================== cases
class Case:
    def __init__(self, key, title, impls, unit, scale, ops=None, rtol=1e-5, atol_rel=0.0,
                 split=True):
        self.key, self.title, self.impls = key, title, impls
        self.unit, self.scale = unit, scale    # reported value = seconds * scale
        self.ops = ops                          # divide by this for per-op figures
        self.rtol, self.atol_rel = rtol, atol_rel
        self.split = split                      # run() returns its forward time


def build_cases(args):
    cases = []
    x0, a, b = chain_data()
    impls = [ChainGradcore(x0, a, b), ChainNumpy(x0, a, b)]
    if torch is not None:
        impls.append(ChainTorch(x0, a, b))
    cases.append(Case("chain", f"(a) chain of {CHAIN_OPS} elementwise ops, 16 x f32",
                      impls, "us/op", 1e6 / CHAIN_OPS, ops=CHAIN_OPS, rtol=1e-5, atol_rel=1e-6))
    xs = np.array([1.5], np.float32)
    impls = [ScalarGradcore(xs), ScalarNumpy(xs)]
    if torch is not None:
        impls.append(ScalarTorch(xs))
    cases.append(Case("scalar", "(b) y = sum(x*x), one element", impls, "us/call", 1e6,
                      rtol=1e-6, split=False))
    # the same fixed cost on 16 floats (issue 25, item 5)
    xs16 = np.linspace(0.5, 2.0, 16).astype(np.float32)
    impls = [ScalarGradcore(xs16), ScalarNumpy(xs16)]
    if torch is not None:
        impls.append(ScalarTorch(xs16))
    cases.append(Case("fixed16", "(b') y = sum(x*x), 16 elements", impls, "us/call", 1e6,
                      rtol=1e-6, split=False))
    for batch in (128, 32):
        params, x, y = mlp_data(batch)
        impls = [MlpGradcore(params, x, y), MlpNumpy(params, x, y), MlpNumpyPooled(params, x, y)]
        if torch is not None:
            impls.append(MlpTorch(params, x, y))
        cases.append(Case(f"mlp{batch}", f"(c) MLP 784-512-512-10, batch {batch}", impls,
                          "ms/iter", 1e3, rtol=1e-4, atol_rel=1e-5))
    for batch in (128, 32):
        # the floor under (c): its eight GEMMs alone, on each library's BLAS
        operands = mlp_gemm_operands(batch)
        impls = [GemmGradcore(operands), GemmNumpy(operands)]
        if torch is not None:
            impls.append(GemmTorch(operands))
        cases.append(Case(f"gemm{batch}", f"(c') its 8 GEMMs alone, batch {batch}", impls,
                          "ms/iter", 1e3, rtol=1e-4, atol_rel=1e-5, split=False))
    if args.only:
        cases = [c for c in cases if c.key in args.only]
    return cases


# ============================================================== checks
def check_case(case) -> dict:
    """Run each implementation once and compare with the NumPy reference.
    gradcore must match (np.allclose); torch is reported, not enforced (its
    tanh/sin/exp and GEMM differ in the last bits)."""
    results = {}
    for impl in case.impls:
        with allocator(impl):
            impl.run()
        results[impl.name] = impl.result()
    ref_loss, ref_grads = results["numpy"]
    report = {}
    ok = True
    for name, (loss, grads) in results.items():
        if name == "numpy":
            continue
        worst = 0.0
        close = np.isclose(loss, ref_loss, rtol=case.rtol, atol=0)
        for g, r in zip(grads, ref_grads):
            scale = float(np.abs(r).max()) or 1.0
            close = close and g.shape == r.shape and np.allclose(
                g, r, rtol=case.rtol, atol=case.atol_rel * scale)
            worst = max(worst, float(np.abs(g.astype(np.float64) - r).max()) / scale)
        report[name] = {"allclose": bool(close), "max_abs_err_over_max_abs_ref": worst,
                        "loss": loss, "ref_loss": ref_loss}
        if name == "gradcore" and not close:
            ok = False
    return ok, report


# ============================================================== timing
def allocator(impl):
    """The NumPy allocator an implementation runs with: gradcore's pool
    (what gradcore and torch see) or NumPy's own (hand-written NumPy)."""
    if getattr(impl, "host_pool", True):
        return contextlib.nullcontext()
    return gc_memory.pool_disabled()


def _time_loop(run, n):
    fwd = 0.0
    t0 = perf_counter()
    for _ in range(n):
        f = run()
        if f is not None:
            fwd += f
    return perf_counter() - t0, fwd


def calibrate(run, target_s):
    """Inner iterations so that one measurement lasts about target_s."""
    for _ in range(3):                 # warm-up: caches, backward graphs, allocator
        run()
    n = 1
    while True:
        dt, _ = _time_loop(run, n)
        if dt >= target_s / 4 or n >= 1 << 20:
            return max(1, int(round(n * target_s / max(dt, 1e-9))))
        n *= 2


def bench_case(case, repeat, target_s, no_gc, settle_s):
    names = [i.name for i in case.impls]
    inner = {}
    for impl in case.impls:
        time.sleep(settle_s)
        with allocator(impl):
            inner[impl.name] = calibrate(impl.run, target_s)
    total = {n: [] for n in names}
    fwd = {n: [] for n in names}
    k = len(case.impls)
    for r in range(repeat):
        order = case.impls[r % k:] + case.impls[:r % k]   # rotate who goes first
        for impl in order:
            n = inner[impl.name]
            # Let the previous implementation's BLAS/OpenMP worker threads stop
            # spinning (OpenBLAS and torch's OpenMP pool busy-wait after a call;
            # on 2 cores that starves whoever runs next), then two untimed calls.
            time.sleep(settle_s)
            with allocator(impl):
                impl.run()
                impl.run()
                pygc.collect()
                if no_gc:
                    pygc.disable()
                try:
                    dt, f = _time_loop(impl.run, n)
                finally:
                    if no_gc:
                        pygc.enable()
            total[impl.name].append(dt / n)
            fwd[impl.name].append(f / n)
    out = {"title": case.title, "unit": case.unit, "scale": case.scale, "inner": inner,
           "impls": {}, "ratios": {}}
    for n in names:
        ts = total[n]
        d = {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "rounds_s": ts}
        if case.split:
            fs = fwd[n]
            bs = [t - f for t, f in zip(ts, fs)]
            d["fwd_median_s"] = statistics.median(fs)
            d["bwd_median_s"] = statistics.median(bs)
        out["impls"][n] = d
    for other in names:
        if other == "gradcore":
            continue
        paired = [g / o for g, o in zip(total["gradcore"], total[other])]
        out["ratios"][other] = {
            "ratio_of_medians": out["impls"]["gradcore"]["median_s"] / out["impls"][other]["median_s"],
            "paired_median": statistics.median(paired),
            "paired_min": min(paired), "paired_max": max(paired),
            "target": TARGETS.get(case.key, {}).get(other),
        }
        if case.split:
            for ph in ("fwd", "bwd"):
                o = out["impls"][other][f"{ph}_median_s"]
                out["ratios"][other][f"{ph}_ratio"] = (out["impls"]["gradcore"][f"{ph}_median_s"] / o
                                                       if o else None)
    return out


# ============================================================== report
def fmt(v):
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}"


def print_table(results, names):
    cols = ["case", "unit"] + names + [f"gc/{n}" for n in names if n != "gradcore"] + ["target", "met"]
    rows = []
    for key, res in results.items():
        scale = res["scale"]
        for phase in ("", "fwd", "bwd"):
            if phase and f"{phase}_median_s" not in res["impls"]["gradcore"]:
                continue
            field = f"{phase}_median_s" if phase else "median_s"
            label = res["title"] if not phase else f"    {'forward' if phase == 'fwd' else 'backward'} only"
            row = [label, res["unit"]]
            for n in names:
                v = res["impls"].get(n, {}).get(field)
                row.append(fmt(v * scale) if v is not None else "-")
            tgt, met = [], []
            for n in names:
                if n == "gradcore":
                    continue
                rr = res["ratios"].get(n)
                if rr is None:
                    row.append("-")
                    continue
                ratio = rr["ratio_of_medians"] if not phase else rr.get(f"{phase}_ratio")
                row.append(f"{ratio:.2f}x" if ratio is not None else "-")
                if not phase and rr["target"] is not None:
                    tgt.append(f"{n}<={rr['target']}")
                    met.append("yes" if ratio <= rr["target"] else
                               f"NO ({ratio / rr['target']:.2f}x over)")
            row += [", ".join(tgt) or "", "; ".join(met) or ""]
            rows.append(row)
    widths = [max(len(str(r[i])) for r in rows + [cols]) for i in range(len(cols))]
    line = "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths)))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(str(c).ljust(w) if i < 2 or i >= len(cols) - 2 else str(c).rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=None,
                   help="rounds (default 7, quick 3); medians over the rounds are reported")
    p.add_argument("--quick", action="store_true", help="3 rounds of ~0.05 s measurements")
    p.add_argument("--target-time", type=float, default=None,
                   help="seconds per measurement of one implementation (default 0.25, quick 0.05)")
    p.add_argument("--only", nargs="*", choices=["chain", "scalar", "fixed16", "mlp128", "mlp32", "gemm128", "gemm32"],
                   help="run only these cases")
    p.add_argument("--no-gc", action="store_true",
                   help="disable Python's cyclic GC while timing (default: enabled, as in real use)")
    p.add_argument("--settle", type=float, default=0.3, metavar="S",
                   help="pause before each measurement so that the other library's spinning "
                        "worker threads go idle (default 0.3 s)")
    p.add_argument("--anomaly", action="store_true",
                   help="run everything inside gradcore.autodiff.detect_anomaly() (its cost when on)")
    p.add_argument("--label", default="", help="free text stored with the results (e.g. a commit)")
    p.add_argument("--json", metavar="PATH", help="write all results to PATH")
    args = p.parse_args(argv)
    repeat = args.repeat if args.repeat is not None else (3 if args.quick else 7)
    if repeat < 1:
        p.error("--repeat must be >= 1")
    target_s = args.target_time if args.target_time is not None else (0.05 if args.quick else 0.25)
    anomaly = contextlib.nullcontext()
    if args.anomaly:
        from gradcore.autodiff import detect_anomaly
        anomaly = detect_anomaly()
    with anomaly:
        return _run(args, p, repeat, target_s)


def _run(args, p, repeat, target_s):

    load_before = loadavg()
    info = machine_info()
    print(f"date      : {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"cpu       : {info['cpu']}  (nproc {info['nproc']}, affinity {info['affinity']})")
    print(f"load avg  : {load_before}  (before)")
    print(f"python    : {info['python']}  numpy {info['numpy']}")
    print(f"gradcore  : {info['gradcore']} from {info['gradcore_path']} ({info['gradcore_git']})"
          + (f"  [{args.label}]" if args.label else ""))
    print(f"numpy BLAS: {info['numpy_blas']}")
    if torch is not None:
        print(f"torch     : {info['torch']}  threads {info['torch_threads']} "
              f"(interop {info['torch_interop_threads']}), MKL {info['torch_mkl']}")
    else:
        print("torch     : not installed, torch columns skipped")
    print(f"thread env: {info['thread_env'] or 'none set'}")
    print(f"settings  : {repeat} rounds, ~{target_s} s per measurement, {args.settle} s settle, "
          f"GC {'disabled' if args.no_gc else 'enabled'} while timing"
          + (", anomaly mode ON" if args.anomaly else ""))
    print()

    cases = build_cases(args)
    checks = {}
    print("correctness (gradcore vs NumPy reference, torch for information):")
    for case in cases:
        ok, rep = check_case(case)
        checks[case.key] = rep
        for name, r in rep.items():
            print(f"  {case.key:7s} {name:9s} allclose={r['allclose']!s:5s} "
                  f"max|err|/max|ref|={r['max_abs_err_over_max_abs_ref']:.1e}  "
                  f"loss {r['loss']:.6g} vs {r['ref_loss']:.6g}")
        if not ok:
            print(f"\nFAILED: gradcore's gradients differ from the NumPy reference in case "
                  f"{case.key}; not timing incorrect code.", file=sys.stderr)
            return 1
    print()

    results = {}
    t_start = perf_counter()
    for case in cases:
        print(f"timing {case.title} ...", flush=True)
        results[case.key] = bench_case(case, repeat, target_s, args.no_gc, args.settle)
    elapsed = perf_counter() - t_start
    load_after = loadavg()

    names = list(dict.fromkeys(i.name for c in cases for i in c.impls))
    print()
    print(f"medians over {repeat} rounds (ratios: gradcore median / other median; "
          f"target met when ratio <= target)")
    print()
    print_table(results, names)
    print()
    for key, res in results.items():
        for other, rr in res["ratios"].items():
            print(f"  {key:7s} gc/{other:6s} per-round paired ratios: median {rr['paired_median']:.2f}x, "
                  f"range {rr['paired_min']:.2f}x .. {rr['paired_max']:.2f}x")
    print()
    print(f"load avg  : {load_after}  (after; timing took {elapsed:.0f} s)")

    if args.json:
        out = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "label": args.label,
               "machine": info,
               "load_before": load_before, "load_after": load_after,
               "settings": {"repeat": repeat, "target_time_s": target_s, "settle_s": args.settle,
                            "gc_disabled": args.no_gc, "anomaly": args.anomaly},
               "checks": checks, "results": results, "targets": TARGETS}
        d = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(d, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
