#!/usr/bin/env python
"""Per-call cost of the generated elementwise functions (F.exp, F.add, ...)
three ways, in one process, rounds interleaved with a rotating order:

  compiled   gradcore/functional/elemwise_table.py as setup.py builds it (what
             ``import gradcore.functional`` loads when built)
  source     the same file run as plain Python (a def calling _core.apply1:
             one Python frame more per call)
  op call    ``Elemwise(mode)(x)``, calling the op itself (the compiled
             ``OpBase.__call__``; the former ``_core.OpFunction`` wrapper is gone)

Forward only, 16 float32 elements, no recording. Prints medians (ns per call)
and the median per-round ratio to the op call.

Usage::

    python benchmarks/bench_functional_calls.py            # 40 rounds, ~20 s
    python benchmarks/bench_functional_calls.py --rounds 150
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import timeit
from pathlib import Path

import numpy as np

import gradcore as gc
import gradcore.functional as F
from gradcore.functional import elemwise_table
from gradcore.ops.elemwise import Elemwise


def source_module():
    path = Path(F.__file__).with_name("elemwise_table.py")
    spec = importlib.util.spec_from_file_location("gradcore.functional._elemwise_table_source", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _call(fn, x, y=None):
    # written-out calls: fn(*args) would favour a callable that takes the tuple as is
    return (lambda: fn(x)) if y is None else (lambda: fn(x, y))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--number", type=int, default=2000, help="calls per timing")
    args = parser.parse_args()
    if not elemwise_table.__file__.endswith(".py"):
        print(f"compiled module: {Path(elemwise_table.__file__).name}")
    else:
        print("elemwise_table is not compiled (python setup.py build_ext --inplace): 'compiled' is the source too")
    source = source_module()
    rng = np.random.default_rng(0)
    x, y = (gc.tensor(rng.random(16).astype("float32")) for _ in range(2))
    modes = {"exp": (x,), "tanh": (x,), "add": (x, y), "mul": (x, y)}
    ways = {"compiled": lambda m: getattr(F, m), "source": lambda m: getattr(source, m),
            "op call": lambda m: Elemwise(m)}
    cases = {(m, w): _call(make(m), *a) for m, a in modes.items() for w, make in ways.items()}
    times = {k: [] for k in cases}
    keys = list(cases)
    for r in range(args.rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            times[k].append(timeit.timeit(cases[k], number=args.number) / args.number * 1e9)
    print(f"{'call':8} " + " ".join(f"{w + ' ns':>14}" for w in ways) + "   compiled/op call  source/op call")
    for m in modes:
        med = [statistics.median(times[(m, w)]) for w in ways]
        ratio = [statistics.median(a / b for a, b in zip(times[(m, w)], times[(m, "op call")]))
                 for w in ("compiled", "source")]
        print(f"F.{m:6} " + " ".join(f"{v:14.0f}" for v in med) + f"   {ratio[0]:16.3f}  {ratio[1]:14.3f}")


if __name__ == "__main__":
    main()
