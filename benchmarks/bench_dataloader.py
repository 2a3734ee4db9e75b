#!/usr/bin/env python
"""Does loading in worker processes hide the cost of a transform?
(issue 28: "with 2 workers, an epoch of the digits data with a transform
that costs 1 ms per batch is not slower than the model alone").

One epoch of the demo's training (gradcore.demo: DigitsCNN, SGD with
momentum, batch 32, the 1437 training images of the digits data), timed as:

- ``model alone``: the batches cut beforehand, no loader;
- ``loader, 0 workers``: DataLoader(RandomSampler) in this process, no transform;
- ``1 ms transform, 0 workers``: a transform that burns 1 ms of CPU per batch,
  in this process (what it costs when nothing hides it);
- ``1 ms transform, 2 workers``: the same transform in 2 worker processes,
  started anew for each epoch (their start-up is in the time);
- ``... 2 persistent workers``: the same with ``persistent_workers=True``
  (started once, by the warm-up);
- with ``--torch``: ``torch DataLoader, 2 workers`` (per epoch) and ``...
  persistent``: PyTorch's loader over the same arrays, the same sampler order
  (a seeded permutation), the same transform burnt in its collate function,
  batches handed over as NumPy arrays; torch is imported for the whole run,
  so every variant forks the same, larger process;
- ``ideal overlap``: the model alone on the pre-cut batches while another
  process, already running, burns the transform's CPU (1 ms per batch)
  with no loader at all; the epoch ends when both are done. This is the
  best any loader could do on this machine: on two cores, what it adds to
  the model alone is the cost of the cores' sharing (caches, memory, the
  hypervisor), not of loading.

The variants alternate, in a rotating order, for --repeat rounds of
--epochs epochs each; the table gives each one's median epoch time and its
ratio to the model alone, and the median CPU time of the main process per
epoch (on a machine whose cores are busy with other work the wall times
mostly measure the others; the main process's CPU time says what the
loader adds to the training process itself: with the transform in the
workers it should stay the model's own).

Usage::

    python benchmarks/bench_dataloader.py                 # 5 rounds of 3 epochs
    python benchmarks/bench_dataloader.py --repeat 9 --json out.json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time

import numpy as np

import gradcore as gc
import gradcore.functional as F
import gradcore.optimizer as optim
from gradcore import demo
from gradcore.autodiff import GradManager
from gradcore.data import ArrayDataset, DataLoader, RandomSampler
from gradcore.data.transform import Transform

BATCH = 32


class BurnCPU(Transform):
    """Identity that costs ``ms`` of CPU per batch (a busy loop, as a real
    augmentation would be), or with ``wait`` that waits ``ms`` without
    using the CPU (as reading files would)."""

    def __init__(self, ms: float, wait: bool = False):
        self.seconds = ms / 1000.0
        self.wait = wait

    def apply(self, input):
        return input

    def apply_batch(self, inputs):
        if self.wait:
            time.sleep(self.seconds)
            return tuple(inputs)
        end = time.process_time() + self.seconds
        while time.process_time() < end:
            pass
        return tuple(inputs)


def _burner(conn, ms: float) -> None:
    """Burn ``n`` x ``ms`` of CPU for each ``n`` received; answer when done."""
    burn = BurnCPU(ms)
    while True:
        n = conn.recv()
        if n is None:
            return
        for _ in range(n):
            burn.apply_batch(())
        conn.send(n)


class Beside:
    """The pre-cut batches, with the transform's CPU burnt in another
    process at the same time (the ``ideal overlap`` variant)."""

    def __init__(self, batches, ms: float):
        self.batches = batches
        ctx = multiprocessing.get_context("fork")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_burner, args=(theirs, ms), daemon=True)
        self.proc.start()

    def __iter__(self):
        self.conn.send(len(self.batches))
        yield from self.batches
        self.conn.recv()            # the epoch is over when the burning is too

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join()


def make_trainer():
    gc.random.seed(0)
    model = demo.DigitsCNN()
    gm = GradManager().attach(model.parameters())
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(x, y):
        with gm:
            loss = F.cross_entropy(model(gc.tensor(x)), gc.tensor(y))
            gm.backward(loss)
        opt.step().clear_grad()
        return loss.item()
    return step


def torch_variants(x_train, y_train, burn: BurnCPU, workers: int) -> dict:
    """PyTorch's DataLoader over the same arrays: its default (per-epoch)
    workers and persistent ones, the transform in the collate function."""
    import torch.utils.data as tud

    class Arrays(tud.Dataset):
        def __len__(self):
            return len(x_train)

        def __getitem__(self, i):
            return x_train[i], y_train[i]

    def collate(samples):
        xs, ys = zip(*samples)
        return burn.apply_batch((np.stack(xs), np.stack(ys)))

    def loader(persistent: bool):
        generator = tud.RandomSampler(Arrays(), generator=__import__("torch").Generator().manual_seed(0))
        return tud.DataLoader(Arrays(), batch_size=BATCH, sampler=generator, collate_fn=collate,
                              num_workers=workers, persistent_workers=persistent)
    kept = loader(True)
    return {f"torch DataLoader, {workers} workers": lambda: loader(False),
            f"... torch, {workers} persistent": lambda: kept}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3, help="epochs per variant per round")
    ap.add_argument("--transform-ms", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--wait", action="store_true",
                    help="the transform waits (sleeps) its time instead of burning CPU")
    ap.add_argument("--torch", action="store_true",
                    help="also time PyTorch's DataLoader (torch.utils.data) over the same data and transform")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)

    x, y = demo.load_digits()
    x_train, y_train, _, _ = demo.split(x, y, 0.2, 0)
    ds = ArrayDataset(x_train, y_train)
    order = np.random.default_rng(0).permutation(len(x_train))
    pre_cut = [(x_train[order[i:i + BATCH]], y_train[order[i:i + BATCH]]) for i in range(0, len(order), BATCH)]
    step = make_trainer()
    burn = BurnCPU(args.transform_ms, wait=args.wait)

    def loader(workers, transform, persistent=False):
        return DataLoader(ds, RandomSampler(ds, batch_size=BATCH, seed=0), transform=transform,
                          num_workers=workers, timeout=600, persistent_workers=persistent)
    kept = loader(args.workers, burn, persistent=True)
    beside = Beside(pre_cut, args.transform_ms)

    variants = {
        "model alone": lambda: pre_cut,
        "loader, 0 workers": lambda: loader(0, None),
        f"{args.transform_ms:g} ms transform, 0 workers": lambda: loader(0, burn),
        f"{args.transform_ms:g} ms transform, {args.workers} workers": lambda: loader(args.workers, burn),
        f"... {args.workers} persistent workers": lambda: kept,
        "ideal overlap": lambda: beside,
    }
    if args.torch:
        variants.update(torch_variants(x_train, y_train, burn, args.workers))
    for source in variants.values():        # warm-up: kernels, caches, first fork
        for xb, yb in source():
            step(xb, yb)
    times = {name: [] for name in variants}
    cpu = {name: [] for name in variants}
    names = list(variants)
    loads = [os.getloadavg()[0]]
    for r in range(args.repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:
            source = variants[name]
            for _ in range(args.epochs):
                t, c = time.perf_counter(), time.process_time()
                for xb, yb in source():
                    step(xb, yb)
                times[name].append(time.perf_counter() - t)
                cpu[name].append(time.process_time() - c)
        loads.append(os.getloadavg()[0])

    beside.close()
    base = statistics.median(times["model alone"])
    print(f"one epoch ({len(pre_cut)} batches of {BATCH}), median of {args.repeat * args.epochs}; "
          f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"load average {min(loads):.1f}-{max(loads):.1f}; the transform "
          f"{'waits' if args.wait else 'burns CPU'}")
    rows = {}
    for name in names:
        med, med_cpu = statistics.median(times[name]), statistics.median(cpu[name])
        rows[name] = {"median_s": med, "ratio": med / base, "main_cpu_s": med_cpu, "all_s": times[name]}
        print(f"  {name:<28} {med * 1e3:8.1f} ms   {med / base:5.2f}x the model alone   "
              f"main process CPU {med_cpu * 1e3:7.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"python": sys.version, "cpus": os.cpu_count(), "loads": loads,
                       "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
