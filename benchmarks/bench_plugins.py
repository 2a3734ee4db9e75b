#!/usr/bin/env python
"""What an op declared outside the standard library costs per call, against
the standard equivalent, and how long listing the registry takes cold.

  (a) per call: ``apply(op, a, b)`` for a tiny ``Op`` subclass defined in
      this script and registered with ``gradcore.registry.register_op``
      (``PluginMul``: NumPy ``a * b`` kernel, hand VJP) against the standard
      ``Elemwise("mul")``, on 16-element float32 arrays; not recorded, and
      recorded (both inputs attached to a recording GradManager, the tape
      released after each batch). The two ops alternate inside every round;
      medians over rounds of the per-call time of a batch.
  (c) per call, the op constructed per call and called, as a plugin's
      users write it (``PluginUfuncMul()(a, b)``, ``PluginMul()(a, b)``;
      equal ops are interned, so construction is a lookup) against the
      standard ``F.mul(a, b)``, each wrapped in the same lambda; forward
      alone and forward+backward (``gm.backward`` of the product's sum,
      both inputs attached). Target: within 1.1x of F.mul.
  (d) the same for an op with a parameter, constructed per call
      (``PluginScale(3.0)(x)``: ``x * 3.0``, its kernel bound per instance
      to ``np.multiply`` with the factor as a 0-d float32 array) against the standard op doing the same arithmetic,
      ``F.mul(x, c)`` with ``c`` the 0-d float32 tensor 3.0, and against
      the same ``PluginScale`` instance reused (what construction adds).
      Target: within 1.1x of F.mul(x, c).
  For (c) and (d) the ratios printed are medians of the per-round ratios
  (each round times the calls side by side, in alternating order), which
  stay put on a shared machine where the medians of the times drift.
  (b) registry listing: ``gradcore.registry.entries()`` in a fresh
      subprocess (cold: every entry point read, every plugin imported), the
      call alone and ``import gradcore`` + the call; medians over fresh
      processes. Target: entries() under 50 ms.

Usage::

    python benchmarks/bench_plugins.py                # 9 rounds, 9 cold processes
    python benchmarks/bench_plugins.py --quick        # a smoke test
    python benchmarks/bench_plugins.py --json out.json
"""
from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

import gradcore
from gradcore.autodiff import GradManager
from gradcore.core import apply
from gradcore.op import Op
from gradcore.ops import Elemwise
from gradcore.registry import register_op

perf_counter = time.perf_counter
REGISTRY_TARGET_MS = 50.0


@register_op
class PluginMul(Op):
    """a * b, declared the way a third-party plugin declares an op."""
    name = "BenchPluginMul"

    def infer(self, a, b):
        return (a,)

    def cpu(self, a, b):
        return a * b

    def vjp(self, inputs, outputs, grads):
        (a, b), (g,) = inputs, grads
        return (g * b, g * a)


@register_op
class PluginUfuncMul(PluginMul):
    """The same op with its kernel given as the ufunc itself (no Python frame
    per call), the way the standard elementwise ops bind theirs."""
    name = "BenchPluginUfuncMul"
    cpu = staticmethod(np.multiply)


@register_op
class PluginScale(Op):
    """x * factor: an op with a parameter, constructed per call as
    ``PluginScale(3.0)(x)``. Its kernel is bound per instance to a C
    callable (``np.multiply`` with the factor as a 0-d float32 array), as
    the standard elementwise ops bind theirs: no Python frame per call, and
    NumPy's path for a Python-float operand costs more than the dispatch."""
    name = "BenchPluginScale"

    def __init__(self, factor=1.0):
        self.factor = float(factor)
        # a per-instance kernel is a derived value, not a parameter
        self.cpu = functools.partial(np.multiply, np.asarray(self.factor, dtype=np.float32))

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * np.float32(self.factor)

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * self.factor,)


def _per_call(op, a, b, n, record):
    if not record:
        t = perf_counter()
        for _ in range(n):
            apply(op, a, b)
        return (perf_counter() - t) / n
    gm = GradManager().attach([a, b])
    gm.record()
    t = perf_counter()
    for _ in range(n):
        apply(op, a, b)
    dt = (perf_counter() - t) / n
    gm.release()
    return dt


def bench_calls(rounds, n):
    a = gradcore.Tensor(np.random.default_rng(0).random(16, dtype=np.float32))
    b = gradcore.Tensor(np.random.default_rng(1).random(16, dtype=np.float32))
    ops = {"plugin": PluginMul(), "plugin, ufunc kernel": PluginUfuncMul(), "standard": Elemwise("mul")}
    # same values, and both differentiate the same
    np.testing.assert_allclose(apply(ops["plugin"], a, b)[0].numpy(), apply(ops["standard"], a, b)[0].numpy())
    times = {(k, r): [] for k in ops for r in (False, True)}
    for k in ops:                                   # warm caches (kernel, backward graph)
        for r in (False, True):
            _per_call(ops[k], a, b, 200, r)
    for i in range(rounds):
        order = list(ops) if i % 2 == 0 else list(ops)[::-1]
        for r in (False, True):
            for k in order:
                times[(k, r)].append(_per_call(ops[k], a, b, n, r))
    return {f"{k}{'_recorded' if r else ''}_us": statistics.median(v) * 1e6 for (k, r), v in times.items()}


def _loop(fn, a, b, n, backward):
    if not backward:
        t = perf_counter()
        for _ in range(n):
            fn(a, b)
        return (perf_counter() - t) / n
    gm = GradManager().attach([a, b])
    t = perf_counter()
    for _ in range(n):
        with gm:
            gm.backward(fn(a, b).sum())
    return (perf_counter() - t) / n


def bench_constructed_per_call(rounds, n):
    """Cases (c) and (d): medians of the time per call and of the per-round
    ratio to the standard function doing the same work."""
    import gradcore.functional as F
    a = gradcore.Tensor(np.random.default_rng(0).random(16, dtype=np.float32))
    b = gradcore.Tensor(np.random.default_rng(1).random(16, dtype=np.float32))
    c = gradcore.tensor(3.0, dtype="float32")
    reused = PluginScale(3.0)
    fns = {"plugin per call, ufunc kernel": lambda x, y: PluginUfuncMul()(x, y),
           "plugin per call": lambda x, y: PluginMul()(x, y),
           "F.mul": lambda x, y: F.mul(x, y),
           "PluginScale(3.0) per call": lambda x, y: PluginScale(3.0)(x),
           "PluginScale reused": lambda x, y: reused(x),
           "F.mul(x, c)": lambda x, y: F.mul(x, c)}
    baseline = {k: "F.mul(x, c)" if "Scale" in k else "F.mul" for k in fns}
    np.testing.assert_allclose(fns["plugin per call"](a, b).numpy(), fns["F.mul"](a, b).numpy())
    np.testing.assert_allclose(fns["PluginScale(3.0) per call"](a, b).numpy(), fns["F.mul(x, c)"](a, b).numpy())
    times = {(k, bw): [] for k in fns for bw in (False, True)}
    for k in fns:
        for bw in (False, True):
            _loop(fns[k], a, b, 200, bw)
    for i in range(rounds):
        order = list(fns) if i % 2 == 0 else list(fns)[::-1]
        for bw in (False, True):
            for k in order:
                times[(k, bw)].append(_loop(fns[k], a, b, n if not bw else max(n // 10, 1), bw))
    out = {}
    for (k, bw), v in times.items():
        part = "_fwd_bwd" if bw else "_fwd"
        out[f"{k}{part}_us"] = statistics.median(v) * 1e6
        base = times[(baseline[k], bw)]
        out[f"{k}{part}_ratio"] = statistics.median(t / t0 for t, t0 in zip(v, base))
    return out


COLD = r"""
import time
t0 = time.perf_counter()
import gradcore.registry as registry
t1 = time.perf_counter()
entries = registry.entries()
t2 = time.perf_counter()
print((t2 - t1) * 1e3, (t2 - t0) * 1e3, len(entries), len(registry.failures()))
"""


def bench_registry(procs):
    calls, totals, counts = [], [], None
    for _ in range(procs):
        out = subprocess.run([sys.executable, "-c", COLD], capture_output=True, text=True, check=True)
        call_ms, total_ms, n, nfail = out.stdout.split()
        calls.append(float(call_ms))
        totals.append(float(total_ms))
        counts = (int(n), int(nfail))
    return {"entries_ms": statistics.median(calls), "import_and_entries_ms": statistics.median(totals),
            "ops": counts[0], "failed_plugins": counts[1]}


def _print_per_call(per_call, rounds):
    print(f"constructed per call and called, median of {rounds} rounds (ratio: median of per-round ratios)")
    for cols, base in ((("plugin per call, ufunc kernel", "plugin per call"), "F.mul"),
                       (("PluginScale(3.0) per call", "PluginScale reused"), "F.mul(x, c)")):
        print(f"{'':<14}" + "".join(f"{k:>30}{'ratio':>7}" for k in cols) + f"{base:>14}")
        for part, label in (("_fwd", "forward"), ("_fwd_bwd", "fwd+backward")):
            row = "".join(f"{per_call[f'{k}{part}_us']:>28.2f}us{per_call[f'{k}{part}_ratio']:>7.2f}" for k in cols)
            print(f"{label:<14}{row}{per_call[f'{base}{part}_us']:>12.2f}us")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--procs", type=int, default=9)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--only-calls", action="store_true",
                    help="cases (c) and (d) only: ops constructed per call (for before/after runs)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.calls, args.procs = 3, 2000, 3
    if args.only_calls:
        per_call = bench_constructed_per_call(args.rounds, args.calls)
        _print_per_call(per_call, args.rounds)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"calls": per_call, "date": time.strftime("%Y-%m-%d %H:%M")}, fh, indent=2)
        return 0
    calls = bench_calls(args.rounds, args.calls)
    per_call = bench_constructed_per_call(args.rounds, args.calls)
    reg = bench_registry(args.procs)
    print(f"per call, 16-element float32 a*b, median of {args.rounds} rounds x {args.calls} calls")
    print(f"{'':<14}{'plugin op':>12}{'ratio':>7}{'plugin, ufunc kernel':>22}{'ratio':>7}{'Elemwise mul':>14}")
    for rec in ("", "_recorded"):
        p, u, s = (calls[f"{k}{rec}_us"] for k in ("plugin", "plugin, ufunc kernel", "standard"))
        label = "recorded" if rec else "not recorded"
        print(f"{label:<14}{p:>10.2f}us{p / s:>7.2f}{u:>20.2f}us{u / s:>7.2f}{s:>12.2f}us")
    _print_per_call(per_call, args.rounds)
    calls.update(per_call)
    ok = reg["entries_ms"] < REGISTRY_TARGET_MS
    print(f"registry.entries() cold, median of {args.procs} processes: {reg['entries_ms']:.1f} ms "
          f"(target < {REGISTRY_TARGET_MS:.0f} ms: {'met' if ok else 'MISSED'}); import gradcore + entries(): "
          f"{reg['import_and_entries_ms']:.1f} ms; {reg['ops']} ops, {reg['failed_plugins']} failed plugins")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"calls": calls, "registry": reg, "python": platform.python_version(),
                       "numpy": np.__version__, "machine": platform.machine(),
                       "date": time.strftime("%Y-%m-%d %H:%M")}, fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
