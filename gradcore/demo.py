"""The main job: train a small CNN on the UCI 8x8 handwritten digits.

    python -m gradcore.demo [--epochs 15] [--seed 0] [--out demo_out] [--device cpu]
    python -m gradcore.demo --device cuda --cuda-graph   # each training step one CUDA graph launch
    gradcore demo ...
    mpirun -n 2 python -m gradcore.demo     # data-parallel over MPI (gradcore[distributed])
    python -m gradcore.demo --nproc 2       # the same: relaunches itself under mpirun
    python -m gradcore.demo --workers 2     # batches loaded by 2 worker processes

The dataset ships inside the package (gradcore/data/digits.npz; 1797 images,
CC BY 4.0, see gradcore/data/README.txt): nothing is downloaded. Writes
``training_curves.png`` (loss and accuracy per epoch) and ``summary.txt`` to
the output folder. Needs the ``demo`` extra (``pip install -e ".[demo]"``):
matplotlib draws the curves, tqdm shows a progress bar on a terminal (and
one plain line per epoch when the output is a log).

Batches come from ``gradcore.data``: an ``ArrayDataset`` over the training
images, a ``RandomSampler`` (a new order every epoch, seeded by
``--seed``) and a ``DataLoader`` (``--workers`` worker processes; 0, the
default, loads in this process: for 8x8 images that is cheapest).

Under MPI every rank trains on its shard of each batch (the sampler gives
each rank ``--batch-size / ranks`` of every batch's images), the gradients are
averaged with ``gradcore.distributed.make_allreduce_cb("mean")`` while the
backward runs, the parameters start from rank 0's values, and only rank 0
prints and writes files: the same training as one process, up to float32
rounding (and, when the training set does not split evenly, the few images
that the sampler repeats so that every rank gets as many).
"""
from __future__ import annotations

import argparse
import gc as _pygc
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from importlib import resources

import numpy as np

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore.autodiff import GradManager
from gradcore import distributed as dist
from gradcore import memory
from gradcore.cpu import onednn
from gradcore.data import ArrayDataset, DataLoader, RandomSampler


def load_digits():
    """(images float32 (N, 1, 8, 8) scaled to [0, 1], labels int32 (N,))."""
    with resources.files("gradcore.data").joinpath("digits.npz").open("rb") as f:
        data = np.load(f)
        images, labels = data["images"], data["labels"]
    return (images.astype(np.float32) / 16.0)[:, None], labels.astype(np.int32)


def split(x, y, test_fraction, seed):
    """A stratified shuffle split: every digit keeps its share in both parts."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_test = int(round(len(idx) * test_fraction))
        test.extend(idx[:n_test])
        train.extend(idx[n_test:])
    train, test = rng.permutation(train), np.asarray(test)
    return x[train], y[train], x[test], y[test]


class DigitsCNN(M.Module):
    """conv(1->16) relu pool -> conv(16->32) relu pool -> linear(128->64) relu -> linear(64->10)
    (each convolution with its ReLU one op: ``M.ConvRelu2d``)."""

    def __init__(self):
        super().__init__()
        self.conv1 = M.ConvRelu2d(1, 16, 3, padding=1)
        self.conv2 = M.ConvRelu2d(16, 32, 3, padding=1)
        self.pool = M.MaxPool2d(2)
        self.fc1 = M.Linear(32 * 2 * 2, 64)
        self.fc2 = M.Linear(64, 10)

    def forward(self, x):
        x = self.pool(self.conv1(x))
        x = self.pool(self.conv2(x))
        x = F.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


def evaluate(model, x, y, batch=256, distributed=False, device="cpu"):
    """(accuracy, mean loss). Distributed: each rank evaluates its part and
    the sums are allreduced."""
    n = len(x)
    if distributed:
        part = np.array_split(np.arange(n), dist.get_world_size())[dist.get_rank()]
        x, y = x[part], y[part]
    model.eval()
    hits, losses = 0, []
    for i in range(0, len(x), batch):
        logits = model(gc.tensor(x[i:i + batch], device=device))
        losses.append(F.cross_entropy(logits, gc.tensor(y[i:i + batch], device=device), reduction="sum").item())
        hits += int((logits.numpy().argmax(1) == y[i:i + batch]).sum())
    model.train()
    hits, loss = float(hits), float(sum(losses))
    if distributed:
        hits, loss = dist.allreduce(np.array([hits, loss]), "sum")
    return hits / n, loss / n


def relaunch_under_mpirun(nproc, argv):
    """``--nproc N``: run this demo again under ``mpirun -n N``; returns its exit code."""
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        sys.stderr.write("gradcore demo --nproc: mpirun not found; install an MPI library "
                         "(e.g. apt-get install openmpi-bin libopenmpi-dev) and "
                         "pip install gradcore[distributed]\n")
        return 2
    cmd = [mpirun, "-n", str(nproc)]
    if "open mpi" in _mpirun_version(mpirun).lower():
        cmd.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    cmd += [sys.executable, "-m", "gradcore.demo", *argv]
    env = dict(os.environ)
    # one BLAS thread per rank: the ranks share the cores
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    print("launching:", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env)


def _mpirun_version(mpirun):
    try:
        return subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except Exception:
        return ""


def _without_nproc(argv):
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def _require_demo_libraries():
    # found, not imported: matplotlib costs ~16 MB that training does not
    # need; it is imported when the curves are drawn
    missing = [m for m in ("matplotlib", "tqdm") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"gradcore demo needs matplotlib and tqdm: pip install -e \".[demo]\" "
                         f"(missing: {', '.join(missing)})")


def curves_figure(history):
    """The loss (log scale) and accuracy curves per epoch as a matplotlib
    ``Figure``, drawn on the Agg canvas: no pyplot (its figure manager,
    global state and backend machinery are not needed for a file, and cost
    memory).

    Example::

        >>> fig = curves_figure({"train loss": [1.0, 0.5], "test loss": [1.1, 0.6],
        ...                      "train accuracy": [0.5, 0.8], "test accuracy": [0.5, 0.7]})
        >>> [ax.get_title() for ax in fig.axes]
        ['loss', 'accuracy']
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    epochs = np.arange(1, len(history["train loss"]) + 1)
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)            # files only, no display needed
    ax_loss, ax_acc = fig.subplots(1, 2)
    for name in ("train loss", "test loss"):
        ax_loss.plot(epochs, history[name], marker="o", label=name)
    ax_loss.set(yscale="log", xlabel="epoch", ylabel="cross-entropy loss (log scale)", title="loss")
    for name in ("train accuracy", "test accuracy"):
        ax_acc.plot(epochs, history[name], marker="o", label=name)
    ax_acc.set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    for ax in (ax_loss, ax_acc):
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def plot_curves(path, history):
    """Write the loss (log scale) and accuracy curves per epoch to ``path`` (PNG).

    Example::

        >>> plot_curves("demo_out/training_curves.png", history)
    """
    curves_figure(history).savefig(path, dpi=100)


def progress_bar(epoch, epochs, steps):
    """A tqdm bar over one epoch's steps on a terminal; nothing when stdout
    is not a terminal (a log gets the one line per epoch that main prints)."""
    from tqdm import tqdm
    return tqdm(total=steps, desc=f"epoch {epoch}/{epochs}", unit="step", leave=False,
                file=sys.stdout, disable=not sys.stdout.isatty(), dynamic_ncols=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gradcore demo", description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--workers", type=int, default=0,
                    help="data-loader worker processes (0: load batches in this process)")
    ap.add_argument("--out", default="demo_out", help="folder for training_curves.png and summary.txt")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="on cuda, run each training step as one CUDA graph (gradcore.cuda.graphed)")
    ap.add_argument("--nproc", type=int, default=1,
                    help="train data-parallel on N processes (relaunches under mpirun -n N)")
    args = ap.parse_args(argv)
    _require_demo_libraries()

    distributed = dist.is_distributed()
    if args.nproc > 1 and not dist.launched_by_mpi():
        return relaunch_under_mpirun(args.nproc, _without_nproc(sys.argv[1:] if argv is None
                                                                else list(argv)))
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    if rank != 0:
        sys.stdout = open(os.devnull, "w")        # only rank 0 prints

    if args.cuda_graph and (args.device != "cuda" or distributed):
        print("gradcore demo: --cuda-graph needs --device cuda and one process", file=sys.stderr)
        return 2
    if args.device != "cpu":
        try:
            gc.tensor([0.0], device=args.device)
        except (RuntimeError, ValueError) as exc:   # says why the device is unavailable
            print(f"gradcore demo: {exc}", file=sys.stderr)
            return 2
    if args.batch_size % world:
        print(f"gradcore demo: --batch-size {args.batch_size} must be a multiple of the number of "
              f"processes ({world})", file=sys.stderr)
        return 2
    if args.workers < 0:
        print("gradcore demo: --workers must be >= 0", file=sys.stderr)
        return 2
    history, seconds, n_test = train(args, distributed, rank, world)
    if rank != 0:
        return 0
    release_training_memory()

    os.makedirs(args.out, exist_ok=True)
    png = os.path.join(args.out, "training_curves.png")
    plot_curves(png, history)
    summary = (f"gradcore demo: small CNN on the UCI 8x8 digits\n"
               f"epochs {args.epochs}, batch {args.batch_size}, lr {args.lr}, seed {args.seed}, "
               f"{args.workers} loader workers, "
               f"device {args.device}" + (", CUDA graphs" if args.cuda_graph else "")
               + (f", {world} MPI processes" if distributed else "") + "\n"
               f"training time {seconds:.1f} s\n"
               f"final train loss {history['train loss'][-1]:.4f}\n"
               f"final test accuracy {history['test accuracy'][-1]:.4f} "
               f"({n_test} held-out images)\n"
               f"curves: {png}\n")
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(summary)
    print(summary, end="")
    return 0


def train(args, distributed=False, rank=0, world=1):
    """Train the digits CNN as ``args`` say (main's options); returns (the
    history per epoch, training seconds, the number of test images). The
    model, the data and everything the steps cached are dropped when it
    returns: ``main`` draws the curves after it, with that memory free.

    Example::

        >>> history, seconds, n_test = train(argparse.Namespace(epochs=1, seed=0, batch_size=32, lr=0.05,
        ...                                  workers=0, device="cpu", cuda_graph=False))
    """
    gc.random.seed(args.seed)
    x, y = load_digits()
    x_train, y_train, x_test, y_test = split(x, y, 0.2, args.seed)
    model = DigitsCNN().to(args.device)
    if distributed:
        dist.broadcast_parameters(model.parameters())
        # small buckets: this model has 55 KB of gradients; several buckets
        # let the first ones travel while the backward goes on
        gm = GradManager().attach(model.parameters(),
                                  callbacks=dist.make_allreduce_cb("mean", bucket_bytes=16 * 1024))
    else:
        gm = GradManager().attach(model.parameters())
    opt = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    def train_step(xb, yb):
        with gm:
            loss = F.cross_entropy(model(xb), yb)
            gm.backward(loss)
        opt.step().clear_grad()
        return loss
    if args.cuda_graph:
        import gradcore.cuda
        train_step = gradcore.cuda.graphed(train_step)
    train_set = ArrayDataset(x_train, y_train)
    # every rank draws the same order (same seed) and takes its share of each batch
    sampler = RandomSampler(train_set, batch_size=args.batch_size // world, seed=args.seed,
                            world_size=world, rank=rank)
    loader = DataLoader(train_set, sampler, num_workers=args.workers, seed=args.seed)
    history = {"train loss": [], "test loss": [], "train accuracy": [], "test accuracy": []}
    steps = len(loader)
    print(f"digits: {len(x_train)} training and {len(x_test)} test images; "
          f"{sum(p.size for p in model.parameters())} parameters"
          + (f"; data-parallel on {world} MPI processes" if distributed else ""))
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        total, seen = 0.0, 0
        bar = progress_bar(epoch, args.epochs, steps)
        for xb, yb in loader:
            loss = train_step(gc.tensor(xb, device=args.device), gc.tensor(yb, device=args.device))
            total += loss.item() * len(yb)
            seen += len(yb)
            bar.update(1)
            bar.set_postfix(loss=f"{total / seen:.4f}", refresh=False)
        bar.close()
        if distributed:
            total, seen = dist.allreduce(np.array([total, seen], np.float64), "sum")
        train_acc, _ = evaluate(model, x_train, y_train, distributed=distributed, device=args.device)
        test_acc, test_loss = evaluate(model, x_test, y_test, distributed=distributed, device=args.device)
        for k, v in (("train loss", total / seen), ("test loss", test_loss),
                     ("train accuracy", train_acc), ("test accuracy", test_acc)):
            history[k].append(v)
        print(f"epoch {epoch:>2}/{args.epochs}  train loss {total / seen:.4f}  "
              f"test accuracy {test_acc:.3f}  ({time.perf_counter() - start:.1f} s)", flush=True)
    return history, time.perf_counter() - start, len(x_test)


def release_training_memory():
    """Give back what training left cached before the curves are drawn
    (matplotlib then takes about 40 MB): the host memory pool's free blocks
    (the evaluation's batches of 256 leave sizes training does not reuse)
    and oneDNN's primitives (their JIT code), after a garbage collection
    drops the model's cycles. The freed memory is what matplotlib's import
    and drawing then reuse, so the process's peak is lower.

    Example::

        >>> release_training_memory()
    """
    _pygc.collect()
    memory.empty_cache()
    onednn.clear_cache()


if __name__ == "__main__":
    sys.exit(main())
