#!/usr/bin/env python
"""What gradcore's host memory pool (gradcore/memory.py) is worth.

The MLP of bench_overhead.py (784-512-512-10, forward + backward), timed in
fresh processes that do not import torch (whose import changes glibc's
malloc thresholds, and with them the effect measured here): gradcore with
the pool and with NumPy's allocator (GRADCORE_HOST_POOL=0), and the
hand-written NumPy MLP with each. The four processes alternate, in a
rotating order, for --repeat rounds; each reports the median of its timed
batches and the minor page faults per step. Medians over the rounds.

Usage::

    python benchmarks/bench_host_pool.py                  # batch 128 and 512, 5 rounds
    python benchmarks/bench_host_pool.py --batch 512 --repeat 9 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import resource, statistics, sys, time
sys.modules["torch"] = None                   # bench_overhead imports it when present
sys.path.insert(0, sys.argv[1])
import bench_overhead as b
impl_name, batch, steps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
params, x, y = b.mlp_data(batch)
impl = (b.MlpGradcore if impl_name == "gradcore" else b.MlpNumpy)(params, x, y)
for _ in range(10):
    impl.run()
times = []
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    t = time.perf_counter()
    for _ in range(steps):
        impl.run()
    times.append((time.perf_counter() - t) / steps)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / (5 * steps)
print(statistics.median(times), faults)
"""

VARIANTS = [("gradcore", "1"), ("gradcore", "0"), ("numpy", "1"), ("numpy", "0")]


def run_child(impl, pool, batch, steps):
    env = dict(os.environ, GRADCORE_HOST_POOL=pool)
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", CHILD, here, impl, str(batch), str(steps)],
                         capture_output=True, text=True, env=env, check=True)
    t, faults = out.stdout.split()
    return float(t), float(faults)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, nargs="*", default=[128, 512])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    print(f"load average before: {os.getloadavg()}")
    results = {}
    for batch in args.batch:
        steps = max(5, 20000 // batch)
        rounds = {v: [] for v in VARIANTS}
        for r in range(args.repeat):
            order = VARIANTS[r % 4:] + VARIANTS[:r % 4]
            for v in order:
                rounds[v].append(run_child(v[0], v[1], batch, steps))
        print(f"\nbatch {batch}: median ms/step (minor page faults per step)")
        res = {}
        for impl, pool in VARIANTS:
            ts = [t for t, _ in rounds[(impl, pool)]]
            fs = [f for _, f in rounds[(impl, pool)]]
            label = f"{impl}, {'pool' if pool == '1' else 'NumPy allocator'}"
            res[label] = {"median_ms": statistics.median(ts) * 1e3, "faults_per_step": statistics.median(fs),
                          "rounds_ms": [t * 1e3 for t in ts]}
            print(f"  {label:32s} {res[label]['median_ms']:8.3f}  ({res[label]['faults_per_step']:.0f})")
        for impl in ("gradcore", "numpy"):
            on = res[f"{impl}, pool"]["median_ms"]
            off = res[f"{impl}, NumPy allocator"]["median_ms"]
            print(f"  {impl}: pool / NumPy allocator = {on / off:.2f}x")
        results[batch] = res
    print(f"\nload average after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
