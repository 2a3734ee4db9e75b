"""Data-parallel step time over MPI: 2 ranks against 1 on this machine, and
how much of the gradient allreduce is hidden behind the backward.

    python benchmarks/bench_distributed.py                  # ~1 min on 2 cores
    python benchmarks/bench_distributed.py --model mlp --batch 256
    python benchmarks/bench_distributed.py --json benchmarks/results/dist.json
    python benchmarks/bench_distributed.py --model-parallel   # issue 29: priority and deferred adjoint on/off

The script launches itself under ``mpirun -n 1`` and ``mpirun -n 2`` (needs
OpenMPI or another MPI, and mpi4py). The global batch is fixed (strong
scaling): with 2 ranks each rank computes half of it. Each rank uses one BLAS
thread (``OMP_NUM_THREADS=1``); the 1-rank case is also measured with the
default BLAS threads, which is what a plain single-process run uses.

Per configuration (medians over the timed steps):

- step: forward + backward (with the allreduce callback) + SGD step;
- step, no communication (2 ranks): the same without the callback, each
  rank on its half: the compute a perfect allreduce would leave;
- end-of-backward wait: time spent in the after-backward flush waiting for
  the reductions (what the backward did not hide);
- allreduce alone: the same buckets reduced back to back with nothing else
  running (the cost of the communication when nothing hides it);
- hidden fraction, two ways: (a) the share of gradient bytes whose
  allreduce had already completed when the backward ended (tested right
  then, before the wait): communication fully hidden; (b) 1 - wait /
  allreduce alone (clipped to [0, 1]); the wait also contains any skew
  between the ranks (one finishing its backward later), so (b) is a lower
  bound and meaningless when the allreduce itself is tiny.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def build(model_name):
    import gradcore as gc
    import gradcore.module as M
    gc.random.seed(0)
    if model_name == "cnn":
        from gradcore.demo import DigitsCNN, load_digits
        x, y = load_digits()
        return DigitsCNN(), x, y
    net = M.Sequential(M.Linear(256, 1024), M.ReLU(), M.Linear(1024, 1024), M.ReLU(),
                       M.Linear(1024, 1024), M.ReLU(), M.Linear(1024, 10))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 256)).astype(np.float32)
    y = rng.integers(0, 10, 4096).astype(np.int32)
    return net, x, y


def worker(args):
    import gradcore as gc
    import gradcore.functional as F
    import gradcore.optimizer as optim
    import gradcore.distributed as dist
    from gradcore.autodiff import GradManager

    dist.init(timeout=120)
    rank, size = dist.get_rank(), dist.get_world_size()
    model, x, y = build(args.model)
    params = list(model.parameters())
    dist.broadcast_parameters(params)
    cb = dist.make_allreduce_cb("mean", bucket_bytes=args.bucket_kb * 1024)
    gm_comm = GradManager().attach(params, callbacks=cb)
    gm_plain = GradManager().attach(params)
    opt = optim.SGD(params, lr=0.01, momentum=0.9)
    mine = dist.shard(args.batch)

    def step(gm, i):
        lo = (i * args.batch) % (len(x) - args.batch)
        idx = np.arange(lo, lo + args.batch)[mine]
        with gm:
            loss = F.cross_entropy(model(gc.tensor(x[idx])), gc.tensor(y[idx]))
            gm.backward(loss)
        opt.step().clear_grad()

    def timed(gm, n):
        times, waits = [], []
        for i in range(n):
            dist.barrier()
            w0 = cb.stats["wait_s"]
            t0 = time.perf_counter()
            step(gm, i)
            times.append(time.perf_counter() - t0)
            waits.append(cb.stats["wait_s"] - w0)
        return times, waits

    for i in range(args.warmup):
        step(gm_comm, i)
        step(gm_plain, i)
    res = {"rank": rank, "world": size}
    t_comm, waits = timed(gm_comm, args.steps)
    t_plain, _ = timed(gm_plain, args.steps)
    res["step_s"] = statistics.median(t_comm)
    res["step_nocomm_s"] = statistics.median(t_plain)
    res["wait_s"] = statistics.median(waits)
    # the same buckets reduced back to back, nothing else running
    st = next(iter(cb._states.values()))
    bufs = [np.zeros(b.nelem + len(b.params), b.dtype) for b in st.buckets]
    MPI = dist._state.MPI
    comm = dist._state.comm
    alone = []
    for _ in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        reqs = [comm.Iallreduce(MPI.IN_PLACE, b, op=MPI.SUM) for b in bufs]
        MPI.Request.Waitall(reqs)
        alone.append(time.perf_counter() - t0)
    res["allreduce_alone_s"] = statistics.median(alone)
    res["buckets"] = len(st.buckets)
    res["grad_bytes"] = int(sum(b.nelem * b.dtype.itemsize for b in st.buckets))
    res["early_buckets_per_step"] = cb.stats["early_buckets"] / max(cb.stats["backwards"], 1)
    res["done_at_end_fraction"] = cb.stats["bytes_done_at_end"] / max(cb.stats["bytes_total"], 1)
    res["sent_early_fraction"] = cb.stats["bytes_sent_early"] / max(cb.stats["bytes_total"], 1)
    gathered = comm.gather(res, root=0)
    if rank == 0:
        print("RESULT " + json.dumps(gathered), flush=True)


def model_parallel_worker(args):
    """One rank of the model-parallel step (issue 29): an embedding table sharded across the
    ranks, looked up through all_to_all, beside a dense branch; forward + backward + SGD.
    Rounds alternate three settings: the default (the collectives' priority, the adjoint
    deferred: posted, then waited for when read), the priority with the adjoint waiting in
    its kernel (``DEFER_ADJOINTS = False``), and neither (the reverse walk). The time inside
    the all_to_all kernels (forward and adjoint) plus the time waiting for a deferred adjoint
    is the communication this rank did not hide."""
    import numpy as np
    import gradcore as gc
    import gradcore.distributed as dist
    import gradcore.distributed.functional as DF
    import gradcore.functional as F
    import gradcore.optimizer as optim
    from gradcore.autodiff import GradManager
    try:
        from gradcore.distributed import _pending
    except ImportError:               # a gradcore whose adjoints always wait in their kernel
        _pending = None

    dist.init()
    r, P = dist.get_rank(), dist.get_world_size()
    rows, dim, batch, hidden = 8192, 64, args.batch, 512
    rng = np.random.default_rng(r)
    shard = gc.Parameter(rng.standard_normal((rows, dim)).astype(np.float32) * 0.01)
    w1 = gc.Parameter(rng.standard_normal((hidden, hidden)).astype(np.float32) * 0.02)
    w2 = gc.Parameter(rng.standard_normal((hidden, dim)).astype(np.float32) * 0.02)
    gm = GradManager().attach([shard, w1, w2])
    opt = optim.SGD([shard, w1, w2], lr=0.01)
    ids = np.random.default_rng(0).integers(0, P * rows, (P, batch))
    x = gc.tensor(np.random.default_rng(1 + r).standard_normal((batch, hidden)).astype(np.float32))
    comm = [0.0]
    kernel = DF.AllToAll.cpu

    def timed_kernel(self, a):
        t0 = time.perf_counter()
        try:
            return kernel(self, a)
        finally:
            comm[0] += time.perf_counter() - t0
    DF.AllToAll.cpu = timed_kernel
    if _pending is not None:
        pending_wait = _pending._wait

        def timed_wait(requests, what):
            t0 = time.perf_counter()
            try:
                return pending_wait(requests, what)
            finally:
                comm[0] += time.perf_counter() - t0
        _pending._wait = timed_wait
    local = ids.reshape(-1) - r * rows
    mine = (local >= 0) & (local < rows)
    index, mask = np.where(mine, local, 0), gc.tensor(mine[:, None].astype(np.float32))

    def step():
        with gm:
            got = DF.all_to_all(shard[index] * mask, split_axis=0, concat_axis=1)
            emb = got.reshape(batch, P, dim).sum(axis=1)
            d = F.matmul(F.relu(F.matmul(x, w1)), w2)             # the dense branch, recorded later
            gm.backward(((emb + d) ** 2).mean())
        opt.step().clear_grad()

    default = DF.COLLECTIVE_PRIORITY
    settings = [("priority", default, True), ("priority, waiting in the kernel", default, False), ("none", 0, False)]
    if not hasattr(DF, "DEFER_ADJOINTS"):
        settings = [s for s in settings if not s[2]]
        settings[0] = ("priority", default, False)
    times = {name: [] for name, _, _ in settings}
    shares = {name: [] for name, _, _ in settings}
    for i in range(args.warmup + args.steps):
        for name, prio, defer in settings:
            DF.COLLECTIVE_PRIORITY = prio
            DF.DEFER_ADJOINTS = defer
            dist.barrier()
            comm[0] = 0.0
            t0 = time.perf_counter()
            step()
            t = time.perf_counter() - t0
            if i >= args.warmup:
                times[name].append(t)
                shares[name].append(comm[0] / t)
    out = {k: {"step_s": statistics.median(v), "comm_share": statistics.median(shares[k])} for k, v in times.items()}
    every = dist._state.comm.gather(out, root=0)
    if r == 0:
        print("RESULT " + json.dumps(every), flush=True)


def launch(n, args, threads):
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        sys.exit("bench_distributed: mpirun not found (apt-get install openmpi-bin libopenmpi-dev; "
                 "pip install mpi4py)")
    cmd = [mpirun, "-n", str(n), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, os.path.abspath(__file__), "--model-parallel-worker" if args.model_parallel else "--worker",
            "--model", args.model,
            "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--bucket-kb", str(args.bucket_kb)]
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        if threads is None:
            env.pop(var, None)
        else:
            env[var] = str(threads)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    sys.exit(f"bench_distributed: run failed:\n{out.stdout}\n{out.stderr}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    ap.add_argument("--batch", type=int, default=None, help="global batch (cnn 256, mlp 256)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--bucket-kb", type=int, default=None,
                    help="bucket size in KiB (cnn 16, mlp 1024)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--model-parallel", action="store_true",
                    help="the sharded-embedding step: the collectives' priority with the adjoint deferred, "
                         "with it waiting in its kernel, and neither (2 ranks)")
    ap.add_argument("--model-parallel-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.batch is None:
        args.batch = 256
    if args.bucket_kb is None:
        args.bucket_kb = 16 if args.model == "cnn" else 1024
    if args.worker:
        return worker(args)
    if args.model_parallel_worker:
        return model_parallel_worker(args)
    if args.model_parallel:
        res = launch(2, args, 1)
        print(f"model-parallel step, 2 ranks (1 BLAS thread each), batch {args.batch} per rank, "
              f"{args.steps} timed steps, rounds alternating; load {os.getloadavg()[0]:.2f}")
        for name in res[0]:
            worst = max(r[name]["step_s"] for r in res)
            share = max(r[name]["comm_share"] for r in res)
            print(f"  {name:32s}: step {worst * 1e3:8.2f} ms, all_to_all (forward + adjoint, "
                  f"waits included) {share:.0%} of the step")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0

    print(f"model {args.model}, global batch {args.batch}, bucket {args.bucket_kb} KiB, "
          f"{args.steps} timed steps; load: {os.getloadavg()[0]:.2f}")
    rows = {}
    for name, n, threads in (("1 rank, default BLAS threads", 1, None),
                             ("1 rank, 1 BLAS thread", 1, 1),
                             ("2 ranks, 1 BLAS thread each", 2, 1)):
        res = launch(n, args, threads)
        r0 = res[0]
        rows[name] = res
        ms = lambda s: f"{s * 1e3:8.2f} ms"          # noqa: E731
        line = f"{name:32s} step {ms(r0['step_s'])}"
        if n > 1:
            alone = max(r["allreduce_alone_s"] for r in res)
            wait = max(r["wait_s"] for r in res)
            hidden = min(max(1 - wait / alone, 0.0), 1.0) if alone > 0 else float("nan")
            done = min(r["done_at_end_fraction"] for r in res)
            early = min(r["sent_early_fraction"] for r in res)
            line += (f"\n    no-comm step {ms(r0['step_nocomm_s'])}; end-of-backward wait {ms(wait)};"
                     f" allreduce alone {ms(alone)}; 1 - wait/alone {hidden:.0%}"
                     f"\n    {r0['buckets']} buckets, {r0['grad_bytes'] / 1024:.0f} KiB of gradients;"
                     f" bytes sent during the backward {early:.0%}, already reduced when it"
                     f" ended {done:.0%}")
            r0["hidden_fraction"] = hidden
        print(line, flush=True)
    base = rows["1 rank, 1 BLAS thread"][0]["step_s"]
    base_default = rows["1 rank, default BLAS threads"][0]["step_s"]
    two = rows["2 ranks, 1 BLAS thread each"][0]["step_s"]
    print(f"speed-up of 2 ranks: {base / two:.2f}x against 1 rank with 1 thread, "
          f"{base_default / two:.2f}x against 1 rank with default threads")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
