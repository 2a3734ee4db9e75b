#!/usr/bin/env python
"""About 45 common ops one at a time, gradcore against PyTorch eager (CPU),
side by side in one process: forward alone and forward + backward (through a
``GradManager``, the gradient of a random cotangent), float32, at a small and
a medium size, on one thread and on the default threads.

    python benchmarks/bench_ops.py [--repeat 5] [--threads 1,0] [--sizes small,medium]
                                   [--only TEXT] [--seconds 0.05] [--json PATH]
    python benchmarks/bench_ops.py --compare BEFORE.json AFTER.json

Every round times gradcore and PyTorch back to back (the one that goes first
alternates); the figure is the median over the rounds of the per-round ratio
gradcore / PyTorch, so a slow minute on this shared machine hits both.
``--clock cpu`` (with ``--threads 1``) times the calling thread's CPU time
instead of the wall clock: on a shared, loaded machine what other
processes take does not count (both libraries run their kernels in the
calling thread then).

Before timing, each case's forward values and gradients are compared with
PyTorch's; a case that differs is printed and not timed (a ratio between two
different computations means nothing).

One thread is oneDNN's (``onednn.set_num_threads(1)``), NumPy's OpenBLAS
(``blas.single_threaded()``) and PyTorch's (``torch.set_num_threads(1)``);
default threads is 0 for oneDNN (its own policy) and every core for the
others. ``--only`` takes a comma-separated list of substrings of case names.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time

import numpy as np

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager
from gradcore.cpu import blas, onednn

try:
    import torch
    import torch.nn.functional as TF
except ImportError:  # the script compares against PyTorch: nothing to do without it
    torch = None

# (rows, cols) for the row-wise ops, an NCHW activation for the nn ops,
# (batch, mid, last) for the middle-axis softmax
SIZES = {
    "small": {"2d": (32, 64), "4d": (4, 16, 8, 8), "3d": (4, 16, 32), "vocab": 100, "mm": 64},
    "medium": {"2d": (256, 1024), "4d": (32, 64, 56, 56), "3d": (16, 128, 128), "vocab": 10000, "mm": 256},
}


class Case:
    """One op at one size: its inputs (NumPy arrays; ``grad`` marks the ones
    differentiated), the gradcore and the PyTorch call, and whether it has a
    backward at all (argmax, argsort: no)."""

    def __init__(self, name, inputs, grad, gc_fn, torch_fn, backward=True, check=True, ints=()):
        self.name, self.inputs, self.grad = name, inputs, grad
        self.gc_fn, self.torch_fn = gc_fn, torch_fn
        self.backward, self.check, self.ints = backward, check, ints


def _f32(rng, shape, lo=None, hi=None):
    if lo is None:
        return rng.standard_normal(shape).astype(np.float32)
    return rng.uniform(lo, hi, shape).astype(np.float32)


def _first(out):
    """The float outputs a case differentiates: sort/topk give (values, indices)."""
    if isinstance(out, tuple):
        return [out[0]]
    if isinstance(out, list):
        return out
    return [out]


def _gc_setitem_idx(x, idx, v):
    y = F.copy(x)
    y[idx] = v
    return y


def _torch_setitem_idx(x, idx, v):
    y = x.clone()
    y[idx] = v
    return y


def _gc_setitem_mask(x, mask):
    y = F.copy(x)
    y[mask] = 0.0
    return y


def _torch_setitem_mask(x, mask):
    y = x.clone()
    y[mask] = 0.0
    return y


def _gc_batch_norm(x, w, b, rm, rv):
    return F.batch_norm(x, rm, rv, w, b, training=True)


def _torch_batch_norm(x, w, b, rm, rv):
    return TF.batch_norm(x, rm, rv, w, b, training=True)


def build_cases(size: str) -> list:
    """Every case at ``size`` ("small" or "medium"), inputs seeded."""
    s = SIZES[size]
    r, c = s["2d"]
    n4 = s["4d"]
    rng = np.random.default_rng(0)
    x, y = _f32(rng, (r, c)), _f32(rng, (r, c))
    pos = _f32(rng, (r, c), 0.5, 2.0)
    b = _f32(rng, (c,))
    a4 = _f32(rng, n4)
    cases = []

    def add(name, inputs, grad, gc_fn, torch_fn, **kw):
        cases.append(Case(name, inputs, grad, gc_fn, torch_fn, **kw))

    # elementwise
    add("add (bcast row)", [x, b], [0, 1], F.add, torch.add)
    add("mul", [x, y], [0, 1], F.mul, torch.mul)
    add("exp", [x], [0], F.exp, torch.exp)
    add("log", [pos], [0], F.log, torch.log)
    add("tanh", [x], [0], F.tanh, torch.tanh)
    add("sigmoid", [x], [0], F.sigmoid, torch.sigmoid)
    add("gelu", [x], [0], F.gelu, TF.gelu)
    add("silu", [x], [0], F.silu, TF.silu)
    add("relu", [x], [0], F.relu, torch.relu)
    add("pow (tensor exp)", [pos, y], [0, 1], F.pow, torch.pow)
    add("where", [x > 0, x, y], [1, 2], F.where, torch.where)
    add("clip", [x], [0], lambda t: F.clip(t, -0.5, 0.5), lambda t: torch.clamp(t, -0.5, 0.5))
    add("maximum", [x, y], [0, 1], F.maximum, torch.maximum)
    # reductions
    add("sum axis=1", [x], [0], lambda t: F.sum(t, axis=1), lambda t: t.sum(1))
    add("sum all", [x], [0], F.sum, torch.sum)
    add("mean axis=0", [x], [0], lambda t: F.mean(t, axis=0), lambda t: t.mean(0))
    add("mean all", [x], [0], F.mean, torch.mean)
    add("max axis=1", [x], [0], lambda t: F.max(t, axis=1), lambda t: t.amax(1))
    add("max all", [x], [0], F.max, torch.amax)
    add("var axis=1", [x], [0], lambda t: F.var(t, axis=1), lambda t: t.var(1, correction=0))
    add("std axis=1", [x], [0], lambda t: F.std(t, axis=1), lambda t: t.std(1, correction=0))
    add("logsumexp axis=-1", [x], [0], lambda t: F.logsumexp(t, axis=-1), lambda t: torch.logsumexp(t, -1))
    add("argmax axis=1", [x], [], lambda t: F.argmax(t, axis=1), lambda t: t.argmax(1), backward=False)
    add("norm L2 axis=1", [x], [0], lambda t: F.norm(t, axis=1), lambda t: torch.linalg.vector_norm(t, dim=1))
    # softmax family
    a3 = _f32(rng, s["3d"])
    add("softmax last", [x], [0], lambda t: F.softmax(t, axis=-1), lambda t: torch.softmax(t, -1))
    add("softmax middle (3d, axis=1)", [a3], [0], lambda t: F.softmax(t, axis=1), lambda t: torch.softmax(t, 1))
    add("log_softmax last", [x], [0], lambda t: F.logsoftmax(t, axis=-1), lambda t: torch.log_softmax(t, -1))
    add("log_softmax middle (3d, axis=1)", [a3], [0], lambda t: F.logsoftmax(t, axis=1),
        lambda t: torch.log_softmax(t, 1))
    # normalisation
    w, bb = _f32(rng, (c,), 0.5, 1.5), _f32(rng, (c,))
    add("layer_norm (last axis, affine)", [x, w, bb], [0, 1, 2],
        lambda t, w_, b_: F.layer_norm(t, c, weight=w_, bias=b_),
        lambda t, w_, b_: TF.layer_norm(t, (c,), w_, b_))
    ch = n4[1]
    w4, b4 = _f32(rng, (ch,), 0.5, 1.5), _f32(rng, (ch,))
    rm, rv = np.zeros(ch, np.float32), np.ones(ch, np.float32)
    add("batch_norm train (4d)", [a4, w4.reshape(1, ch, 1, 1), b4.reshape(1, ch, 1, 1),
                                  rm.reshape(1, ch, 1, 1), rv.reshape(1, ch, 1, 1)], [0, 1, 2],
        _gc_batch_norm,
        lambda t, w_, b_, m_, v_: _torch_batch_norm(t, w_.reshape(-1), b_.reshape(-1), m_.reshape(-1),
                                                    v_.reshape(-1)))
    groups = ch // 4
    add(f"group_norm {groups} groups (4d)", [a4, w4, b4], [0, 1, 2],
        lambda t, w_, b_: F.group_norm(t, groups, weight=w_, bias=b_),
        lambda t, w_, b_: TF.group_norm(t, groups, w_, b_))
    add(f"group_norm {groups} groups no affine (4d)", [a4], [0],
        lambda t: F.group_norm(t, groups, affine=False), lambda t: TF.group_norm(t, groups))
    add("instance_norm no affine (4d)", [a4], [0],
        lambda t: F.instance_norm(t, affine=False), lambda t: TF.instance_norm(t))
    # losses
    lab = rng.integers(0, c, r).astype(np.int32)
    add("cross_entropy (mean)", [x, lab], [0], F.cross_entropy,
        lambda t, l_: TF.cross_entropy(t, l_.long()), ints=(1,))
    logp = np.log(np.exp(x) / np.exp(x).sum(1, keepdims=True)).astype(np.float32)
    add("nll_loss (mean)", [logp, lab], [0], F.nll_loss, lambda t, l_: TF.nll_loss(t, l_.long()), ints=(1,))
    # indexing
    vocab = s["vocab"]
    emb = _f32(rng, (vocab, c))
    tok = rng.integers(0, vocab, (r, 8)).astype(np.int32)
    add("embedding (bwd scatter-add)", [tok, emb], [1], F.embedding,
        lambda i_, e_: TF.embedding(i_.long(), e_), ints=(0,))
    rows = rng.integers(0, r, r // 2).astype(np.int32)
    add("getitem int index (rows)", [x, rows], [0], lambda t, i_: t[i_], lambda t, i_: t[i_.long()], ints=(1,))
    mask = x > 0.3
    add("getitem bool mask", [x, mask], [0], lambda t, m_: t[m_], lambda t, m_: t[m_])
    urows = rng.permutation(r)[: r // 2].astype(np.int32)
    vals = _f32(rng, (r // 2, c))
    add("setitem int index (rows)", [x, urows, vals], [0, 2], _gc_setitem_idx,
        lambda t, i_, v_: _torch_setitem_idx(t, i_.long(), v_), ints=(1,))
    add("setitem bool mask (scalar)", [x, mask], [0], _gc_setitem_mask, _torch_setitem_mask)
    perm = np.argsort(rng.random((r, c)), axis=1).astype(np.int32)
    half = perm[:, : c // 2].copy()
    add("gather axis=1", [x, half], [0], lambda t, i_: F.gather(t, 1, i_),
        lambda t, i_: torch.gather(t, 1, i_.long()), ints=(1,))
    src = _f32(rng, (r, c // 2))
    add("scatter axis=1", [x, half, src], [0, 2], lambda t, i_, s_: F.scatter(t, 1, i_, s_),
        lambda t, i_, s_: torch.scatter(t, 1, i_.long(), s_), ints=(1,))
    # shape
    q = [_f32(rng, (r, c // 4)) for _ in range(4)]
    add("concat 4 axis=1", q, [0, 1, 2, 3], lambda *t: F.concat(t, axis=1), lambda *t: torch.cat(t, 1))
    add("stack 4 axis=0", q, [0, 1, 2, 3], lambda *t: F.stack(t, axis=0), lambda *t: torch.stack(t, 0))
    add("split 4 axis=1", [x], [0], lambda t: F.split(t, 4, axis=1), lambda t: list(torch.split(t, c // 4, 1)))
    add("transpose+reshape (copy)", [x], [0], lambda t: F.reshape(F.transpose(t, (1, 0)), (-1,)),
        lambda t: t.t().reshape(-1))
    add("pad 4d H,W by 1", [a4], [0], lambda t: F.pad(t, ((0, 0), (0, 0), (1, 1), (1, 1))),
        lambda t: TF.pad(t, (1, 1, 1, 1)))
    add("cumsum axis=1", [x], [0], lambda t: F.cumsum(t, axis=1), lambda t: torch.cumsum(t, 1))
    # sorting: distinct values in each row (ties would make the order, and
    # so the gradient, depend on the sort's stability)
    xs = (np.argsort(rng.random((r, c)), axis=1) / c - 0.5).astype(np.float32)
    add("sort last", [xs], [0], lambda t: F.sort(t), lambda t: torch.sort(t, -1))
    add("argsort last", [xs], [], lambda t: F.argsort(t), lambda t: torch.argsort(t, -1), backward=False)
    add("topk k=8 last", [xs], [0], lambda t: F.topk(t, 8), lambda t: torch.topk(t, 8, -1))
    # products
    m = s["mm"]
    add(f"matmul ({r},{c})@({c},{m})", [x, _f32(rng, (c, m))], [0, 1], F.matmul, torch.matmul)
    bm = (8, 32, 64) if size == "small" else (32, 64, 128)
    add(f"batched matmul {bm}@(..,{bm[2]},{bm[1]})", [_f32(rng, bm), _f32(rng, (bm[0], bm[2], bm[1]))], [0, 1],
        F.matmul, torch.matmul)
    add(f"linear {c}->{m} (bias)", [x, _f32(rng, (m, c)), _f32(rng, (m,))], [0, 1, 2], F.linear, TF.linear)
    # nn
    add("dropout p=0.5 train", [x], [0], lambda t: F.dropout(t, 0.5), lambda t: TF.dropout(t, 0.5, True),
        check=False)
    h = n4[:2] + (n4[2] // 2, n4[3] // 2)
    a4h = _f32(rng, h)
    add(f"interpolate nearest x2 {h}", [a4h], [0], lambda t: F.interpolate(t, scale_factor=2, mode="nearest"),
        lambda t: TF.interpolate(t, scale_factor=2, mode="nearest"))
    o = n4[2] // 8 if size == "medium" else 4
    add(f"adaptive_avg_pool2d -> {o}x{o}", [a4], [0], lambda t: F.adaptive_avg_pool2d(t, (o, o)),
        lambda t: TF.adaptive_avg_pool2d(t, (o, o)))
    return cases


class Runner:
    """The four timed callables of one case (gradcore / PyTorch, forward /
    forward + backward) over the same inputs and cotangents."""

    def __init__(self, case: Case):
        self.case = case
        grad = set(case.grad)
        self.gc_in = [gc.tensor(a) for a in case.inputs]
        self.gc_diff = [self.gc_in[i] for i in sorted(grad)]
        self.gm = GradManager().attach(self.gc_diff) if case.backward else None
        # PyTorch indexes with int64: int inputs convert in the call (the
        # conversion is part of what a PyTorch user writes), so store int32
        self.th_in = [torch.tensor(a) for a in case.inputs]
        self.th_diff = []
        for i in sorted(grad):
            self.th_in[i].requires_grad_(True)
            self.th_diff.append(self.th_in[i])
        with torch.no_grad():
            outs = _first(case.torch_fn(*self.th_in))
        rng = np.random.default_rng(1)
        self.dys = [_f32(rng, tuple(o.shape)) for o in outs]
        self.gc_dys = [gc.tensor(d) for d in self.dys]
        self.th_dys = [torch.tensor(d) for d in self.dys]

    def gc_fwd(self):
        return self.case.gc_fn(*self.gc_in)

    def torch_fwd(self):
        with torch.no_grad():
            return self.case.torch_fn(*self.th_in)

    def gc_fwdbwd(self):
        gm = self.gm
        with gm:
            outs = _first(self.case.gc_fn(*self.gc_in))
            gm.backward(outs, self.gc_dys)
        grads = [t.grad for t in self.gc_diff]
        for t in self.gc_diff:
            t.grad = None
        return grads

    def torch_fwdbwd(self):
        outs = _first(self.case.torch_fn(*self.th_in))
        torch.autograd.backward(outs, self.th_dys)
        grads = [t.grad for t in self.th_diff]
        for t in self.th_diff:
            t.grad = None
        return grads

    def check(self):
        """Forward values and gradients against PyTorch's; a message or None."""
        if not self.case.check:
            return None
        a = [np.asarray(o.numpy()) for o in _first(self.gc_fwd())]
        b = [o.detach().numpy() for o in _first(self.torch_fwd())]
        pairs = list(zip(a, b))
        if self.case.backward:
            pairs += list(zip([g.numpy() for g in self.gc_fwdbwd()], [g.numpy() for g in self.torch_fwdbwd()]))
        for k, (u, v) in enumerate(pairs):
            # relative to the array's largest value: a sum over 1e5 terms
            # (a bias gradient) carries float32 rounding of its magnitude
            if u.shape != v.shape:
                err = "shape"
            else:
                d = float(np.max(np.abs(u - v), initial=0))
                err = None if d <= 2e-4 * float(np.max(np.abs(v), initial=0)) + 2e-5 else f"max |diff| {d:.3g}"
            if err:
                return f"{self.case.name}: output/grad {k} differs from PyTorch ({u.shape} vs {v.shape}, {err})"
        return None


CLOCK = time.perf_counter


def timed(fn, seconds):
    """Seconds per call by ``CLOCK``: one warm-up call, then calls for
    ``seconds`` (at least 3)."""
    fn()
    n, t0 = 0, CLOCK()
    while n < 3 or CLOCK() - t0 < seconds:
        fn()
        n += 1
    return (CLOCK() - t0) / n


def set_threads(n):
    """oneDNN's and PyTorch's thread counts (0: the default); NumPy's
    OpenBLAS is scoped in main."""
    onednn.set_num_threads(n)
    torch.set_num_threads(n if n else os.cpu_count())


def measure(runner: Runner, repeat: int, seconds: float) -> dict:
    out = {}
    modes = [("fwd", runner.gc_fwd, runner.torch_fwd)]
    if runner.case.backward:
        modes.append(("fwd+bwd", runner.gc_fwdbwd, runner.torch_fwdbwd))
    for mode, g, t in modes:
        tg, tt, ratios = [], [], []
        for rnd in range(repeat):
            if rnd % 2:
                b_ = timed(t, seconds)
                a_ = timed(g, seconds)
            else:
                a_ = timed(g, seconds)
                b_ = timed(t, seconds)
            tg.append(a_)
            tt.append(b_)
            ratios.append(a_ / b_)
        out[mode] = {"gradcore_s": statistics.median(tg), "torch_s": statistics.median(tt),
                     "ratio": statistics.median(ratios), "ratios": ratios}
    return out


def _fmt(res, mode):
    m = res.get(mode)
    if m is None:
        return f"{'-':>26}"
    flag = " !" if m["ratio"] > 1.5 else "  "
    return f"{m['gradcore_s'] * 1e6:10.1f} {m['torch_s'] * 1e6:9.1f} {m['ratio']:5.2f}{flag}"


def compare(before_path: str, after_path: str) -> None:
    """Print, per case, the ratio gradcore/PyTorch of two runs' JSON files
    (a library before and after a change) side by side."""
    with open(before_path) as f:
        before = json.load(f)["cases"]
    with open(after_path) as f:
        after = json.load(f)["cases"]
    print(f"{'case':66s} {'fwd before':>10} {'after':>6}   {'fwd+bwd before':>14} {'after':>6}")
    for name, res in after.items():
        old = before.get(name, {})
        cells = []
        for mode in ("fwd", "fwd+bwd"):
            a, b = old.get(mode, {}).get("ratio"), res.get(mode, {}).get("ratio")
            cells.append(f"{a:10.2f} {b:6.2f}" if a is not None and b is not None else f"{'-':>10} {'-':>6}")
        print(f"{name:66s} {cells[0]}   {cells[1]:>21}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="rounds per case (medians over them)")
    ap.add_argument("--threads", default="1,0", help="thread counts to run, 0 = the default")
    ap.add_argument("--sizes", default="small,medium")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    ap.add_argument("--seconds", type=float, default=0.05, help="time per measurement")
    ap.add_argument("--json")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                    help="print two runs' JSON files side by side instead of measuring")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: the calling thread's CPU time (one thread only): what a loaded machine's "
                         "other processes do not change")
    args = ap.parse_args(argv)
    if args.clock == "cpu":
        if args.threads != "1":
            ap.error("--clock cpu measures the calling thread: use it with --threads 1")
        global CLOCK
        CLOCK = time.thread_time
    if args.compare:
        compare(*args.compare)
        return 0
    if torch is None:
        print("bench_ops.py compares against PyTorch, which is not installed")
        return 1
    only = [o for o in args.only.split(",") if o]
    start_load = os.getloadavg()
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load {start_load}; "
          f"clock {args.clock}; torch {torch.__version__}; {onednn.status()}; {blas.status()}")
    results = {"meta": {"date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
                        "load_before": start_load, "torch": torch.__version__, "numpy": np.__version__,
                        "repeat": args.repeat, "seconds": args.seconds, "clock": args.clock}, "cases": {}}
    for n in (int(t) for t in args.threads.split(",")):
        set_threads(n)
        label = "1 thread" if n == 1 else f"default threads ({os.cpu_count()} cores)"
        with blas.single_threaded() if n == 1 else contextlib.nullcontext():
            for size in args.sizes.split(","):
                print(f"\n--- {label}, {size}: times in us, ratio gradcore/torch (! > 1.5)")
                print(f"{'op':44s} {'fwd: gradcore':>14} {'torch':>9} {'ratio':>5}   "
                      f"{'fwd+bwd: gradcore':>18} {'torch':>9} {'ratio':>5}")
                for case in build_cases(size):
                    if only and not any(o in case.name for o in only):
                        continue
                    runner = Runner(case)
                    bad = runner.check()
                    if bad:
                        print(f"MISMATCH {bad}: not timed")
                        results["cases"][f"{case.name} [{size}, {label}]"] = {"mismatch": bad}
                        continue
                    res = measure(runner, args.repeat, args.seconds)
                    results["cases"][f"{case.name} [{size}, {label}]"] = res
                    print(f"{case.name:44s} {_fmt(res, 'fwd')}   {_fmt(res, 'fwd+bwd')}", flush=True)
    set_threads(0)
    results["meta"]["load_after"] = os.getloadavg()
    print(f"\nload after: {results['meta']['load_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
