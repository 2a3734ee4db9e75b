#!/usr/bin/env python
"""Where gradcore's per-op time goes, for cases (a) and (b) of bench_overhead.py.

Sections:

  1. per op type: chains of 1000 of one op (x*a, x+b, tanh, sin) on
     16 x float32; microseconds per op for
       - the bare NumPy ufunc call (the floor),
       - gradcore forward with nothing recording (dispatch only),
       - gradcore forward while recording, and its backward,
       - the hand-written NumPy forward / backward of the same op,
       - torch eager forward / backward;
     Python's cyclic GC is off here so that it does not blur the comparison
     (section 2 measures it).
  2. the cyclic GC in case (a): collections per run and time spent in them.
  3. case (b) y = sum(x*x) cut into phases (record, x*x, sum, backward, ...).
  4. cProfile of case (a) and (b): the Python-level functions the core calls
     back into per run (Cython functions are invisible to cProfile: their
     time lands in the calling Python function).

Usage::

    python benchmarks/profile_overhead.py [--quick]

For a C-level view (CPython, NumPy and gradcore._core symbols), run perf on
the loop mode (cases chain, chain-fwd = recorded forward only, scalar);
``-D 2500`` skips the imports (torch's take ~1.5 s)::

    perf record -D 2500 -F 1999 -o /tmp/perf.data python benchmarks/profile_overhead.py --loop chain 10
    perf report -i /tmp/perf.data --no-children --sort dso,symbol
    # inclusive times per function need call graphs:
    perf record -D 2500 -F 999 --call-graph dwarf,16384 -o /tmp/perf.data python ... --loop chain 6
    perf report -i /tmp/perf.data --children -g none --sort symbol
"""
from __future__ import annotations

import argparse
import cProfile
import gc as pygc
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_overhead as B  # noqa: E402

import gradcore as gc  # noqa: E402
import gradcore.functional as F  # noqa: E402
from gradcore.autodiff import GradManager  # noqa: E402

torch = B.torch
perf_counter = time.perf_counter
NOPS = 1000


def best_of(fn, number, rounds):
    """Lowest mean over `rounds` blocks of `number` calls (seconds per call)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (perf_counter() - t0) / number)
    return best


def best_split(fn, number, rounds):
    """fn() returns its forward seconds; (best total, forward, backward) per call,
    taken from the block with the lowest total."""
    best = None
    for _ in range(rounds):
        fwd = 0.0
        t0 = perf_counter()
        for _ in range(number):
            fwd += fn()
        tot = perf_counter() - t0
        if best is None or tot < best[0]:
            best = (tot, fwd)
    tot, fwd = best
    return tot / number, fwd / number, (tot - fwd) / number


# ---------------------------------------------------------------- 1. per op type
def op_type_table(number, rounds):
    x0, a, b = B.chain_data()
    kinds = ["x*a", "x+b", "tanh", "sin"]

    rows = []
    for kind in kinds:
        row = {"op": kind}
        # bare ufunc call, straight-line (no Python function in between)
        x = x0
        if kind == "x*a":
            f = lambda: [x * a for _ in range(NOPS)]
        elif kind == "x+b":
            f = lambda: [x + b for _ in range(NOPS)]
        elif kind == "tanh":
            f = lambda: [np.tanh(x) for _ in range(NOPS)]
        else:
            f = lambda: [np.sin(x) for _ in range(NOPS)]
        row["ufunc"] = best_of(f, number, rounds) / NOPS

        # gradcore, nothing recording
        gx = gc.tensor(x0)
        ga, gb = gc.tensor(a), gc.tensor(b)
        tanh, sin = F.tanh, F.sin
        if kind == "x*a":
            def g_nr():
                h = gx
                for _ in range(NOPS):
                    h = h * ga
        elif kind == "x+b":
            def g_nr():
                h = gx
                for _ in range(NOPS):
                    h = h + gb
        elif kind == "tanh":
            def g_nr():
                h = gx
                for _ in range(NOPS):
                    h = tanh(h)
        else:
            def g_nr():
                h = gx
                for _ in range(NOPS):
                    h = sin(h)
        row["gc_norecord"] = best_of(g_nr, number, rounds) / NOPS

        # gradcore recording + backward
        p = gc.Parameter(x0.copy())
        gm = GradManager().attach([p])
        step = {"x*a": lambda h: h * ga, "x+b": lambda h: h + gb, "tanh": tanh, "sin": sin}[kind]

        def g_rec():
            p.grad = None
            t0 = perf_counter()
            with gm:
                h = p
                for _ in range(NOPS):
                    h = step(h)
                loss = F.sum(h)
                t1 = perf_counter()
                gm.backward(loss)
            return t1 - t0
        tot, fw, bw = best_split(g_rec, number, rounds)
        row["gc_fwd"], row["gc_bwd"] = fw / NOPS, bw / NOPS

        # hand-written NumPy, same kernels as gradcore's derivative rules
        mul, sub, cos = np.multiply, np.subtract, np.cos
        one = np.ones((), np.float32)

        def n_run():
            t0 = perf_counter()
            saved = []
            keep = saved.append
            h = x0
            if kind == "x*a":
                for _ in range(NOPS):
                    h = h * a
            elif kind == "x+b":
                for _ in range(NOPS):
                    h = h + b
            elif kind == "tanh":
                for _ in range(NOPS):
                    h = np.tanh(h)
                    keep(h)
            else:
                for _ in range(NOPS):
                    keep(h)
                    h = np.sin(h)
            h.sum()
            t1 = perf_counter()
            g = np.ones_like(h)
            if kind == "x*a":
                for _ in range(NOPS):
                    g = g * a
            elif kind == "x+b":
                for _ in range(NOPS):
                    pass                      # identity
            elif kind == "tanh":
                tmp = np.empty_like(h)
                for t in reversed(saved):
                    mul(t, t, out=tmp)
                    sub(one, tmp, out=tmp)
                    g *= tmp
            else:
                for t in reversed(saved):
                    g *= cos(t)
            return t1 - t0
        tot, fw, bw = best_split(n_run, number, rounds)
        row["np_fwd"], row["np_bwd"] = fw / NOPS, bw / NOPS

        if torch is not None:
            tx = torch.tensor(x0, requires_grad=True)
            ta, tb = torch.from_numpy(a.copy()), torch.from_numpy(b.copy())
            tstep = {"x*a": lambda h: h * ta, "x+b": lambda h: h + tb,
                     "tanh": torch.tanh, "sin": torch.sin}[kind]

            def t_run():
                tx.grad = None
                t0 = perf_counter()
                h = tx
                for _ in range(NOPS):
                    h = tstep(h)
                loss = h.sum()
                t1 = perf_counter()
                loss.backward()
                return t1 - t0
            tot, fw, bw = best_split(t_run, number, rounds)
            row["t_fwd"], row["t_bwd"] = fw / NOPS, bw / NOPS
        rows.append(row)
    return rows


def print_op_table(rows):
    cols = [("op", "op"), ("ufunc", "ufunc"), ("gc_norecord", "gc fwd, no rec"),
            ("gc_fwd", "gc fwd rec"), ("np_fwd", "np fwd"), ("t_fwd", "torch fwd"),
            ("gc_bwd", "gc bwd"), ("np_bwd", "np bwd"), ("t_bwd", "torch bwd")]
    print("  ".join(f"{h:>14s}" for _, h in cols))
    for r in rows:
        cells = [f"{r['op']:>14s}"]
        for k, _ in cols[1:]:
            v = r.get(k)
            cells.append(f"{v * 1e6:14.3f}" if v is not None else f"{'-':>14s}")
        print("  ".join(cells))
    print("  (microseconds per op; the loss sum and the whole record/backward setup are")
    print("   spread over the 1000 ops; x+b's NumPy backward is the identity: no call)")


# ---------------------------------------------------------------- 2. GC
def gc_section(number, rounds):
    x0, a, b = B.chain_data()
    g = B.ChainGradcore(x0, a, b)
    for _ in range(3):
        g.run()
    counts = [0, 0, 0]
    spent = [0.0]
    start = [0.0]

    def cb(phase, info):
        if phase == "start":
            counts[info["generation"]] += 1
            start[0] = perf_counter()
        else:
            spent[0] += perf_counter() - start[0]
    pygc.collect()
    pygc.callbacks.append(cb)
    n = max(number * rounds, 500)
    t0 = perf_counter()
    for _ in range(n):
        g.run()
    total = perf_counter() - t0
    pygc.callbacks.remove(cb)
    pygc.collect()
    pygc.disable()
    try:
        off = best_of(g.run, number, rounds)
    finally:
        pygc.enable()
    on = best_of(g.run, number, rounds)
    print(f"  tracked objects in this process: {len(pygc.get_objects())} "
          f"(torch {'imported' if torch is not None else 'absent'})")
    print(f"  collections per run (gen0, gen1, gen2): "
          f"{', '.join(f'{c / n:.2f}' for c in counts)}")
    print(f"  time inside collections: {spent[0] / n * 1e6:.0f} us per run = "
          f"{spent[0] / n / NOPS * 1e6:.3f} us/op ({100 * spent[0] / total:.0f}% of the run)")
    print(f"  best-of timing: GC on {on / NOPS * 1e6:.3f} us/op, GC off {off / NOPS * 1e6:.3f} us/op")
    return {"collections_per_run": [c / n for c in counts], "gc_us_per_op": spent[0] / n / NOPS * 1e6,
            "on_us_per_op": on / NOPS * 1e6, "off_us_per_op": off / NOPS * 1e6}


# ---------------------------------------------------------------- 3. case (b) phases
def scalar_phases(n):
    x = gc.Parameter(np.array([1.5], np.float32))
    gm = GradManager().attach([x])
    ph = dict.fromkeys(["record (with gm: enter)", "x*x (recorded)", "F.sum (recorded)",
                        "gm.backward (incl. release)", "x.grad = None"], 0.0)
    keys = list(ph)
    for _ in range(200):
        x.grad = None
        with gm:
            gm.backward(F.sum(x * x))
    for _ in range(n):
        t0 = perf_counter()
        x.grad = None
        t1 = perf_counter()
        gm.__enter__()
        t2 = perf_counter()
        y1 = x * x
        t3 = perf_counter()
        y = F.sum(y1)
        t4 = perf_counter()
        gm.backward(y)
        t5 = perf_counter()
        gm.__exit__(None, None, None)
        ph[keys[4]] += t1 - t0
        ph[keys[0]] += t2 - t1
        ph[keys[1]] += t3 - t2
        ph[keys[2]] += t4 - t3
        ph[keys[3]] += t5 - t4
    # pieces of the backward, measured alone
    y = gc.tensor(np.float32(2.25))
    extra = {}
    extra["F.ones_like(y) (the default dy)"] = best_of(lambda: F.ones_like(y), n, 3)
    extra["gc.tensor(np.float32(1))"] = best_of(lambda: gc.tensor(np.float32(1.0)), n, 3)
    extra["F.sum(t), not recording"] = best_of(lambda: F.sum(x), n, 3)
    from gradcore.ops.reduce import Reduce
    extra["Reduce('sum', None, False) construction"] = best_of(lambda: Reduce("sum", None, False), n, 3)
    extra["x*x, not recording"] = best_of(lambda: x * x, n, 3)
    xa = np.array([1.5], np.float32)
    extra["numpy x*x"] = best_of(lambda: xa * xa, n, 3)
    extra["numpy (x*x).sum()"] = best_of(lambda: (xa * xa).sum(), n, 3)
    if torch is not None:
        tx = torch.tensor([1.5], requires_grad=True)

        def t_all():
            tx.grad = None
            (tx * tx).sum().backward()
        extra["torch whole case (b)"] = best_of(t_all, n, 3)
    total = sum(ph.values())
    for k, v in ph.items():
        print(f"  {k:40s} {v / n * 1e6:7.2f} us  ({100 * v / total:3.0f}%)")
    print(f"  {'total':40s} {total / n * 1e6:7.2f} us")
    print("  pieces measured alone (best of 3):")
    for k, v in extra.items():
        print(f"    {k:44s} {v * 1e6:7.2f} us")
    return {k: v / n * 1e6 for k, v in ph.items()}, {k: v * 1e6 for k, v in extra.items()}


# ---------------------------------------------------------------- 4. cProfile
def cprofile_section(name, run, n, top):
    for _ in range(5):
        run()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        run()
    pr.disable()
    st = pstats.Stats(pr)
    rows = []
    for (fn, line, func), (cc, nc, tt, ct, callers) in st.stats.items():
        if "bench_overhead" in fn or "profile_overhead" in fn:
            continue
        short = fn.split("/gradcore/")[-1] if "/gradcore/" in fn else os.path.basename(fn)
        rows.append((tt, nc, ct, f"{short}:{line}({func})"))
    rows.sort(reverse=True)
    print(f"  {name}: calls per run and time per run under cProfile (inflated by the profiler)")
    print(f"  {'calls/run':>10s} {'tottime us':>11s} {'cumtime us':>11s}  function")
    for tt, nc, ct, label in rows[:top]:
        print(f"  {nc / n:10.1f} {tt / n * 1e6:11.1f} {ct / n * 1e6:11.1f}  {label}")


class _ChainForwardOnly(B.ChainGradcore):
    """Case (a)'s forward while recording, then release without backward."""

    def run(self):
        x, a, b, gm = self.x, self.a, self.b, self.gm
        tanh, sin = F.tanh, F.sin
        with gm:
            h = x
            for _ in range(B.CHAIN_BLOCKS):
                h = h * a
                h = h + b
                h = tanh(h)
                h = sin(h)
        return 0.0


def loop(case, seconds):
    x0, a, b = B.chain_data()
    if case == "chain":
        impl = B.ChainGradcore(x0, a, b)
    elif case == "chain-fwd":
        impl = _ChainForwardOnly(x0, a, b)
    elif case == "scalar":
        impl = B.ScalarGradcore(np.array([1.5], np.float32))
    else:
        raise SystemExit(f"--loop: unknown case {case!r} (chain, chain-fwd, scalar)")
    for _ in range(5):
        impl.run()
    t0 = perf_counter()
    n = 0
    while perf_counter() - t0 < seconds:
        impl.run()
        n += 1
    dt = (perf_counter() - t0) / n
    print(f"{case}: {n} runs, {dt * 1e6:.1f} us per run"
          + (f", {dt / NOPS * 1e6:.3f} us/op" if case.startswith("chain") else ""))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--loop", nargs=2, metavar=("CASE", "SECONDS"),
                   help="just run gradcore's case 'chain', 'chain-fwd' (forward only) or "
                        "'scalar' for SECONDS (for perf)")
    args = p.parse_args(argv)
    if args.loop:
        loop(args.loop[0], float(args.loop[1]))
        return 0
    number, rounds = (3, 3) if args.quick else (10, 5)
    print(f"cpu {B.cpu_model()}, nproc {os.cpu_count()}, load {B.loadavg()}")
    print(f"gradcore from {os.path.dirname(gc.__file__)}")
    print()
    print("1. per op type, chains of 1000 ops on 16 x float32, GC off, best of "
          f"{rounds} x {number} runs")
    pygc.collect()
    pygc.disable()
    try:
        rows = op_type_table(number, rounds)
    finally:
        pygc.enable()
    print_op_table(rows)
    print()
    print("2. cyclic GC during case (a)")
    gc_section(number, rounds)
    print()
    print("3. case (b) y = sum(x*x), one element, phases (mean over runs, GC on)")
    scalar_phases(2000 if args.quick else 20000)
    print()
    print("4. cProfile")
    x0, a, b = B.chain_data()
    cprofile_section("case (a)", B.ChainGradcore(x0, a, b).run, 20, 12)
    print()
    cprofile_section("case (b)", B.ScalarGradcore(np.array([1.5], np.float32)).run, 2000, 25)
    print(f"\nload {B.loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
