"""LSTM(256, 256) over 32 steps at batch 32, forward + backward on CPU:
gradcore's M.LSTM (the input projection of every step as one matrix
product, the recurrence as one LSTMLayer op, its backward as one op) side
by side with PyTorch's nn.LSTM, same weights, float32, in one process,
alternating runs, medians. Target (issue 28): at most 1.5x PyTorch. The
machine's load average (1 minute) before and after is printed and saved:
on a shared machine, threads contend with other work.

    python benchmarks/bench_rnn.py [--reps 30] [--threads N] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    import gradcore as gc
    import gradcore.functional as F
    import gradcore.module as M

    if args.threads:
        torch.set_num_threads(args.threads)
    H, T, B = args.hidden, args.seq, args.batch
    torch.manual_seed(0)
    tm = torch.nn.LSTM(H, H)
    m = M.LSTM(H, H)
    m.load_state_dict(tm.state_dict())
    x = np.random.default_rng(0).standard_normal((T, B, H)).astype("float32")
    xg, xt = gc.tensor(x), torch.tensor(x)
    params = list(m.parameters())
    gm = gc.GradManager().attach(params)

    def run_gc():
        with gm:
            out, _ = m(xg)
            gm.backward(F.sum(out))
        for p in params:
            p.grad = None

    def run_torch():
        out, _ = tm(xt)
        out.sum().backward()
        tm.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        run_gc()
        run_torch()
    tg, tt = [], []
    load_before = os.getloadavg()[0]
    for _ in range(args.reps):
        t0 = time.perf_counter()
        run_gc()
        t1 = time.perf_counter()
        run_torch()
        t2 = time.perf_counter()
        tg.append(t1 - t0)
        tt.append(t2 - t1)
    res = {"case": f"LSTM({H},{H}) T={T} B={B} fwd+bwd float32 cpu",
           "gradcore_ms": 1e3 * statistics.median(tg), "torch_ms": 1e3 * statistics.median(tt),
           "torch_threads": torch.get_num_threads(), "reps": args.reps,
           "loadavg": [load_before, os.getloadavg()[0]]}
    res["ratio"] = res["gradcore_ms"] / res["torch_ms"]
    print(f"{res['case']}: gradcore {res['gradcore_ms']:.2f} ms, torch {res['torch_ms']:.2f} ms "
          f"(median of {args.reps}, alternating; torch threads {res['torch_threads']}): "
          f"{res['ratio']:.2f}x PyTorch (target <= 1.5x); load average {load_before:.2f} -> "
          f"{res['loadavg'][1]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
