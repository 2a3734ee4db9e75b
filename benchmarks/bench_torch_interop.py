#!/usr/bin/env python
"""What a gradcore op costs per call when PyTorch calls it (``gradcore.to_torch``),
against the two ways of writing the same custom op in PyTorch itself.

The op is the tutorial's ``MyCube`` (y = x**3, NumPy kernel, ``vjp``
g * 3 * x * x) on 16 float32 elements; every implementation does the same
NumPy work:

  hand        a hand-written ``torch.autograd.Function`` (forward and
              backward on ``x.numpy()``)
  custom_op   ``torch.library.custom_op`` + ``register_autograd`` (the
              backward a second custom op), as PyTorch documents it
  gradcore    ``gradcore.to_torch(MyCube)`` (eager: one
              ``torch.autograd.Function`` around gradcore's recorded op)

Each timed call is forward + backward: ``torch.autograd.grad(f(x), x, gy)``
with ``x.requires_grad``; a second table times the forward alone under
``torch.no_grad()``. The implementations alternate inside every round (the
order rotating from round to round); each round times a batch of calls per
implementation; the figures are medians over rounds of the per-call time,
and the ratios are medians of the per-round ratios, which stay put on a
shared machine where the times drift.

Target (issue 27): gradcore at most 2x ``hand`` and below ``custom_op``,
forward + backward.

Usage::

    python benchmarks/bench_torch_interop.py                 # 9 rounds
    python benchmarks/bench_torch_interop.py --quick         # a smoke test, not a measurement
    python benchmarks/bench_torch_interop.py --json out.json
    python benchmarks/bench_torch_interop.py --clock cpu     # CPU time: steadier on a shared machine
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np
import torch

import gradcore
from gradcore.op import Op

perf_counter = time.perf_counter
clock = time.perf_counter          # --clock cpu: time.thread_time
TARGET_VS_HAND = 2.0


class MyCube(Op):
    """The tutorial's op: y = x**3."""
    name = "BenchTorchCube"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * x * x

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (g * 3 * x * x,)


class HandCube(torch.autograd.Function):
    """The same op written by hand for PyTorch, on NumPy."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        a = x.detach().numpy()
        return torch.from_numpy(a * a * a)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        a = x.detach().numpy()
        return torch.from_numpy(g.numpy() * 3 * a * a)


@torch.library.custom_op("gradcore_bench::cube", mutates_args=())
def custom_cube(x: torch.Tensor) -> torch.Tensor:
    a = x.numpy()
    return torch.from_numpy(a * a * a)


@torch.library.custom_op("gradcore_bench::cube_backward", mutates_args=())
def custom_cube_backward(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    a = x.numpy()
    return torch.from_numpy(g.numpy() * 3 * a * a)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, g):
    return custom_cube_backward(ctx.saved_tensors[0], g)


custom_cube.register_autograd(_backward, setup_context=_setup)


def implementations():
    return {"hand": HandCube.apply, "custom_op": custom_cube, "gradcore": gradcore.to_torch(MyCube)}


def check_same(impls, x, gy):
    ref_y, ref_g = None, None
    for name, f in impls.items():
        y = f(x)
        (g,) = torch.autograd.grad(y, x, gy)
        if ref_y is None:
            ref_y, ref_g = y.detach(), g
        elif not (torch.allclose(y, ref_y) and torch.allclose(g, ref_g)):
            raise SystemExit(f"{name} computes something else than hand")


def time_batch(call, n):
    t0 = clock()
    for _ in range(n):
        call()
    return (clock() - t0) / n


def measure(impls, make_call, rounds, target_time):
    calls = {name: make_call(f) for name, f in impls.items()}
    # calibrate the batch size on the slowest, ~target_time per batch
    n = 50
    for call in calls.values():
        for _ in range(200):
            call()
    slowest = max(time_batch(c, 200) for c in calls.values())
    n = max(50, int(target_time / max(slowest, 1e-9)))
    names = list(calls)
    times = {k: [] for k in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            times[k].append(time_batch(calls[k], n))
    return times


def summarize(times, base):
    rows = {}
    for k, ts in times.items():
        ratios = [t / b for t, b in zip(ts, times[base])]
        rows[k] = {"median_us": statistics.median(ts) * 1e6, "min_us": min(ts) * 1e6,
                   f"ratio_vs_{base}": statistics.median(ratios)}
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--target-time", type=float, default=0.2, help="seconds per batch")
    ap.add_argument("--quick", action="store_true", help="3 short rounds: a smoke test")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: time.perf_counter; cpu: the thread's CPU time (time.thread_time), which a "
                         "busy machine's other processes do not inflate (everything here runs in one thread)")
    args = ap.parse_args(argv)
    global clock
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.quick:
        args.rounds, args.target_time = 3, 0.02

    torch.set_num_threads(1)
    impls = implementations()
    x = torch.from_numpy(np.linspace(-1.5, 1.5, 16).astype(np.float32)).requires_grad_()
    gy = torch.ones(16)
    check_same(impls, x, gy)

    def fwd_bwd(f):
        return lambda: torch.autograd.grad(f(x), x, gy)

    xd = x.detach()

    def fwd_only(f):
        def call():
            with torch.no_grad():
                return f(xd)
        return call

    print(f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
          f"gradcore {gradcore.__file__}")
    print(f"{args.rounds} rounds, ~{args.target_time} s per batch, {args.clock} clock; MyCube on 16 float32\n")
    results = {}
    for label, make in (("forward+backward", fwd_bwd), ("forward (no_grad)", fwd_only)):
        times = measure(impls, make, args.rounds, args.target_time)
        rows = summarize(times, "hand")
        co = summarize(times, "custom_op")
        for k in rows:
            rows[k]["ratio_vs_custom_op"] = co[k]["ratio_vs_custom_op"]
        results[label] = rows
        print(f"{label:<18} {'median us':>10} {'min us':>8} {'x hand':>8} {'x custom_op':>12}")
        for k, r in rows.items():
            print(f"  {k:<16} {r['median_us']:>10.2f} {r['min_us']:>8.2f} {r['ratio_vs_hand']:>8.2f} "
                  f"{r['ratio_vs_custom_op']:>12.2f}")
        print()
    fb = results["forward+backward"]["gradcore"]
    ok = fb["ratio_vs_hand"] <= TARGET_VS_HAND and fb["ratio_vs_custom_op"] < 1.0
    print(f"target (forward+backward): gradcore <= {TARGET_VS_HAND}x hand and < custom_op: "
          f"{fb['ratio_vs_hand']:.2f}x hand, {fb['ratio_vs_custom_op']:.2f}x custom_op -> "
          f"{'met' if ok else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": results, "target_met": ok, "rounds": args.rounds, "clock": args.clock,
                       "torch": torch.__version__, "python": platform.python_version()}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
