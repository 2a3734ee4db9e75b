"""Python scalars on the per-op path (issue 25, item 4).

    python benchmarks/bench_scalars.py                 # cpu and the cuda host path, 7 rounds
    python benchmarks/bench_scalars.py --device cpu --repeat 11 --json benchmarks/results/scalars.json

For each form of the issue (``y * 0.5``, ``0.5 * y``, ``1 - y``, ``y / 2``,
``y ** 2``, ``F.maximum(y, 0.0)``) a recorded chain of ``--ops`` such ops on
16 float32 is timed forward + backward (``with gm: ...; gm.backward(F.sum(h))``)
twice: with the Python scalar, and with the same value as a 16-element
float32 tensor that needs no gradient (``y * a``). Reported: the median over
rounds of scalar / tensor, each round timing the two one after the other
(order alternating); target <= 1.2x.

``cuda`` is the host path on the host emulator with no-op launches (as
``bench_cuda.py --host-cost``): only gradcore's own host cost is timed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager

N = 16

# (name, scalar step, tensor step, scalar value, start values): chains of
# --ops steps that stay in the normal float32 range (no denormals, no inf)
FORMS = [
    ("y * 0.5", lambda h, c: h * 0.5, lambda h, c: h * c, 0.5),
    ("0.5 * y", lambda h, c: 0.5 * h, lambda h, c: c * h, 0.5),
    ("1 - y", lambda h, c: 1 - h, lambda h, c: c - h, 1),
    ("y / 2", lambda h, c: h / 2, lambda h, c: h / c, 2),
    ("y ** 2", lambda h, c: h ** 2, lambda h, c: h ** c, 2),
    ("maximum(y, 0.0)", lambda h, c: F.maximum(h, 0.0), lambda h, c: F.maximum(h, c), 0.0),
]


def make_case(device, step, value, const_tensor, ops):
    x0 = np.ones(N, np.float32)
    x0[::2] = -1.0                     # y ** 2: +-1 -> 1; maximum: half clipped
    x = gc.Parameter(x0, device=device)
    gm = GradManager().attach([x])
    c = gc.Tensor(np.full(N, value, np.float32), device=device) if const_tensor else value
    fsum = F.sum

    def run():
        x.grad = None
        with gm:
            h = x
            for _ in range(ops):
                h = step(h, c)
            gm.backward(fsum(h))
    return run, x


def per_call(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def check(device, ops):
    """The scalar and tensor chains give the same gradient."""
    for name, s_step, t_step, value in FORMS:
        rs, xs = make_case(device, s_step, value, False, ops)
        rt, xt = make_case(device, t_step, value, True, ops)
        rs(), rt()
        gs, gt = np.asarray(xs.grad.numpy()), np.asarray(xt.grad.numpy())
        if not np.allclose(gs, gt, rtol=1e-5, atol=0):
            raise SystemExit(f"{device} {name}: scalar and tensor chains differ: {gs} {gt}")
        if xs.grad.dtype != np.float32:
            raise SystemExit(f"{device} {name}: gradient dtype {xs.grad.dtype}")


def bench(device, ops, repeat, target_s):
    out = {}
    for name, s_step, t_step, value in FORMS:
        rs, _ = make_case(device, s_step, value, False, ops)
        rt, _ = make_case(device, t_step, value, True, ops)
        for f in (rs, rt, rs, rt):
            f()
        t = per_call(rs, 3)
        calls = max(3, int(target_s / max(t, 1e-7)))
        rounds = []
        for r in range(repeat):
            if r % 2:
                tt = per_call(rt, calls); ts = per_call(rs, calls)
            else:
                ts = per_call(rs, calls); tt = per_call(rt, calls)
            rounds.append((ts, tt))
        ratios = [s / t for s, t in rounds]
        out[name] = {"scalar_us_per_op": statistics.median(s for s, _ in rounds) * 1e6 / ops,
                     "tensor_us_per_op": statistics.median(t for _, t in rounds) * 1e6 / ops,
                     "ratio": statistics.median(ratios),
                     "ratio_range": [min(ratios), max(ratios)]}
        r = out[name]
        print(f"  {device:4s} {name:18s} scalar {r['scalar_us_per_op']:6.2f} us/op  tensor "
              f"{r['tensor_us_per_op']:6.2f} us/op  {r['ratio']:5.2f}x  "
              f"({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f})", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda", "both"], default="both")
    ap.add_argument("--ops", type=int, default=100, help="ops per chain (default 100)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--target-time", type=float, default=0.2, help="seconds per measurement")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    devices = ["cpu", "cuda"] if args.device == "both" else [args.device]
    results = {"ops": args.ops, "repeat": args.repeat, "cases": {}}
    print(f"recorded chains of {args.ops} ops on {N} float32, forward + backward: "
          f"Python scalar / tensor operand (target <= 1.2x)")
    for dev in devices:
        if dev == "cuda":
            from gradcore.cuda import runtime
            be = runtime.use("emulator")
            check(dev, args.ops)
            be.launcher.dry_run = True
            try:
                results["cases"]["cuda"] = bench(dev, args.ops, args.repeat, args.target_time)
            finally:
                be.launcher.dry_run = False
        else:
            check(dev, args.ops)
            results["cases"][dev] = bench(dev, args.ops, args.repeat, args.target_time)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
