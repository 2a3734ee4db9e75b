"""The CUDA backend on a GPU: elementwise and reduction throughput against a
device copy (with PyTorch's reductions side by side), the MLP training step
and a conv2d step against PyTorch CUDA eager (side by side in one process,
alternating, repeated, medians), whole training steps as CUDA graphs
(gradcore.cuda.graphed against gradcore eager, PyTorch CUDA eager and
PyTorch's torch.cuda.graph), and cold / warm start-up of the standard kernels
(empty kernel cache vs disk cache, each in a fresh process).

    python benchmarks/bench_cuda.py [--repeat 7] [--json PATH]
    python benchmarks/bench_cuda.py --graphs             # only the CUDA-graph training steps
    python benchmarks/bench_cuda.py --emulator --quick   # smoke test without a GPU (timings meaningless)
    python benchmarks/bench_cuda.py --host-cost          # gradcore's host cost per op, cuda vs cpu (anywhere)
    python benchmarks/bench_cuda.py --cold-start [--quick]  # compiling the standard kernels, cold/warm start (anywhere)

The host-cost case runs on the host emulator with launches made no-ops,
so it measures gradcore's own per-op host path on any machine (issue 14,
item 1: at most 1.5x the same op on the cpu).

Targets (issues 6 and 14): elementwise forward and backward >= 85% of a
device-to-device copy's bandwidth; a large reduction >= 80% (the bytes it
reads against the copy's bytes read + written per second); MLP and conv2d
steps <= 1.0x PyTorch.
Issue 16: the graphed MLP 784-512-512-10 step at batch 32 <= 0.3x PyTorch
CUDA eager and <= 1.0x PyTorch's own CUDA-graph step.

Issue 17 (cuDNN): conv2d forward+backward at the three shapes of the issue
((16,32,32,32)*64, (32,128,28,28)*128, (64,64,56,56)*64, 3x3, padding 1)
and one epoch of the demo's digits CNN (batch 32, each batch uploaded as
the demo does, the loss read every step), each side by side with PyTorch
CUDA eager, target <= 1.0x; which convolution path ran (cuDNN or im2col +
cuBLAS) is printed with them. ``--conv-only`` runs just these.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import bench_models         # the conv2d case, on the device (benchmarks/ is on sys.path)
import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager
from gradcore.cuda import runtime
from gradcore.demo import DigitsCNN

try:
    import torch
    if not torch.cuda.is_available():
        torch = None
except ImportError:
    torch = None


def gradcore_cuda():
    import gradcore.cuda
    return gradcore.cuda


def sync():
    runtime.backend().synchronize()
    if torch is not None:
        torch.cuda.synchronize()


def timed(fn, seconds):
    """Seconds per call, synchronised (kernels are asynchronous)."""
    fn()
    sync()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        if n % 4 == 0:
            sync()
            if time.perf_counter() - t0 >= seconds:
                break
    sync()
    return (time.perf_counter() - t0) / n


# ---------------------------------------------------------------- elementwise throughput
def elementwise_cases(n):
    """name -> (callable, bytes moved per call); and the copy reference."""
    be = runtime.backend()
    rng = np.random.default_rng(0)
    host = rng.standard_normal(n).astype(np.float32)
    x = gc.Tensor(host, device="cuda")
    a = gc.Tensor(rng.standard_normal(n).astype(np.float32), device="cuda")
    src, dst = x._data, be.empty((n,), np.float32)
    item = 4

    def copy():
        be.driver.dtod(dst.ptr, src.ptr, src.nbytes)

    def fwd_tanh():
        F.tanh(x)

    def fwd_mul():
        x * a

    gm = GradManager().attach([x, a])

    def fwd_bwd_mul():
        with gm:
            gm.backward(x * a)
        x.grad = a.grad = None

    return {
        "copy (device to device)": (copy, 2 * n * item),
        "forward tanh(x)": (fwd_tanh, 2 * n * item),
        "forward x * a": (fwd_mul, 3 * n * item),
        # forward 3n + seed n (read) + fused backward: reads g, x, a, writes dx, da
        "forward + backward x * a": (fwd_bwd_mul, (3 + 5) * n * item),
    }


# ---------------------------------------------------------------- reduction throughput
def reduction_cases(n):
    """name -> (gradcore callable, PyTorch callable or None, bytes moved per
    call): the block reductions of ops/reduce.py and ops/nn.py on n float32
    elements (a full sum in two passes, rows, columns, softmax rows)."""
    rng = np.random.default_rng(1)
    host = rng.standard_normal(n).astype(np.float32)
    rows = 4096 if n >= 1 << 20 else 64
    x = gc.Tensor(host, device="cuda")
    m = gc.Tensor(host.reshape(rows, n // rows), device="cuda")
    tx = torch.from_numpy(host).cuda() if torch is not None else None
    tm = tx.reshape(rows, n // rows) if tx is not None else None
    item = 4
    return {
        # bytes: what the kernel must read (and write, for softmax)
        "sum (all elements)": (lambda: F.sum(x), (lambda: tx.sum()) if tx is not None else None, n * item),
        f"sum over rows ({rows} x {n // rows}, axis 1)": (lambda: F.sum(m, axis=1),
                                                           (lambda: tm.sum(1)) if tm is not None else None, n * item),
        f"max over columns ({rows} x {n // rows}, axis 0)": (
            lambda: F.max(m, axis=0), (lambda: tm.amax(0)) if tm is not None else None, n * item),
        f"softmax rows ({rows} x {n // rows})": (lambda: F.softmax(m, axis=1),
                                                 (lambda: torch.softmax(tm, 1)) if tm is not None else None,
                                                 2 * n * item),
    }


def print_reductions(results, n, copy_bw, repeat, target_time):
    cases = reduction_cases(n)
    print(f"\nreductions, {n} float32 elements (fraction of the copy's bandwidth; target >= 0.80 for a "
          "large reduction)")
    for name, (g, t, nbytes) in cases.items():
        gt, tt = [], []
        for _ in range(repeat):
            gt.append(timed(g, target_time))
            if t is not None:
                tt.append(timed(t, target_time))
        gmed = statistics.median(gt)
        tmed = statistics.median(tt) if tt else None
        torch_part = f"  torch {nbytes / tmed / copy_bw:5.2f}" if tmed else ""
        print(f"  {name:44s} {gmed * 1e6:10.1f} us  {nbytes / gmed / 1e9:8.1f} GB/s  {nbytes / gmed / copy_bw:5.2f}"
              f"{torch_part}")
        results["cases"][f"reduction: {name}"] = {
            "seconds": gmed, "bandwidth_fraction": nbytes / gmed / copy_bw,
            "torch_seconds": tmed, "torch_bandwidth_fraction": nbytes / tmed / copy_bw if tmed else None}


# ---------------------------------------------------------------- host cost (runs anywhere)
def tiny_op_cases(device):
    """A tiny op (``x * a`` on 16 floats): forward, and forward + backward."""
    x = gc.Tensor(np.ones(16, np.float32), device=device)
    a = gc.Tensor(np.full(16, 0.5, np.float32), device=device)
    gm = GradManager().attach([x, a])

    def forward():
        x * a

    def forward_backward():
        with gm:
            gm.backward(x * a)
        x.grad = a.grad = None
    return {"forward": forward, "forward + backward": forward_backward}


def torch_tiny_op_cases():
    """PyTorch CUDA eager doing what ``tiny_op_cases("cuda")`` does."""
    x = torch.ones(16, device="cuda", requires_grad=True)
    a = torch.full((16,), 0.5, device="cuda", requires_grad=True)

    def forward():
        x * a

    def forward_backward():
        y = x * a
        y.backward(torch.ones_like(y))
        x.grad = a.grad = None
    return {"forward": forward, "forward + backward": forward_backward}


def per_call(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def host_cost(repeat, calls=2000):
    """gradcore's own host cost of a tiny op on cuda against the same op on
    the cpu (issue 14, item 1; target <= 1.5x): on the host emulator with
    launches made no-ops (``Launcher.dry_run``), so only the host path is
    timed. Rounds alternate cpu and cuda; medians of the per-round ratios."""
    be = runtime.backend()
    if be.driver.kind != "emulator":
        be = runtime.use("emulator")
    cpu, cuda = tiny_op_cases("cpu"), tiny_op_cases("cuda")
    be.launcher.dry_run = True
    try:
        out = {}
        for name in cpu:
            for fn in (cpu[name], cuda[name]):
                per_call(fn, calls // 10)             # warm-up: kernels, seeds, plans
            times = [(per_call(cpu[name], calls), per_call(cuda[name], calls)) for _ in range(repeat)]
            out[name] = {"cpu_s": statistics.median(c for c, _ in times),
                         "cuda_s": statistics.median(g for _, g in times),
                         "ratio": statistics.median(g / c for c, g in times)}
    finally:
        be.launcher.dry_run = False
    return out


def print_host_cost(results, repeat):
    print("host cost of a tiny op (x * a, 16 float32), emulator with no-op launches; target <= 1.5x the cpu")
    cost = host_cost(max(repeat, 5))
    for name, r in cost.items():
        print(f"  {name:20s} cpu {r['cpu_s'] * 1e6:7.2f} us  cuda {r['cuda_s'] * 1e6:7.2f} us  {r['ratio']:5.2f}x")
        results["cases"][f"host cost: {name}"] = r


# ---------------------------------------------------------------- models
def gc_mlp(batch):
    rng = np.random.default_rng(0)
    sizes = [784, 512, 512, 10]
    ws = [gc.Parameter(rng.normal(0, 1 / np.sqrt(i), (i, o)).astype(np.float32), device="cuda")
          for i, o in zip(sizes, sizes[1:])]
    bs = [gc.Parameter(np.zeros(o, np.float32), device="cuda") for o in sizes[1:]]
    x = gc.Tensor(rng.standard_normal((batch, 784)).astype(np.float32), device="cuda")
    y = gc.Tensor(rng.integers(0, 10, batch).astype(np.int32), device="cuda")
    gm = GradManager().attach(ws + bs)

    def step():
        with gm:
            h = x
            for i, (w, b) in enumerate(zip(ws, bs)):
                h = F.matmul(h, w) + b
                if i < len(ws) - 1:
                    h = F.relu(h)
            gm.backward(F.cross_entropy(h, y))
        for p in ws + bs:
            p.grad = None
    return step


def torch_mlp(batch):
    rng = np.random.default_rng(0)
    sizes = [784, 512, 512, 10]
    dev = "cuda"
    ws = [torch.tensor(rng.normal(0, 1 / np.sqrt(i), (i, o)).astype(np.float32), device=dev, requires_grad=True)
          for i, o in zip(sizes, sizes[1:])]
    bs = [torch.zeros(o, device=dev, requires_grad=True) for o in sizes[1:]]
    x = torch.tensor(rng.standard_normal((batch, 784)).astype(np.float32), device=dev)
    y = torch.tensor(rng.integers(0, 10, batch), device=dev)

    def step():
        h = x
        for i, (w, b) in enumerate(zip(ws, bs)):
            h = h @ w + b
            if i < len(ws) - 1:
                h = torch.relu(h)
        torch.nn.functional.cross_entropy(h, y).backward()
        for p in ws + bs:
            p.grad = None
    return step


def gc_conv():
    return bench_models.gc_conv("cuda")


def torch_conv():
    return bench_models.torch_conv("cuda")


# the shapes of issue 17: (N, C, H, W), filters; 3x3, padding 1
CONV_SHAPES = [((16, 32, 32, 32), 64), ((32, 128, 28, 28), 128), ((64, 64, 56, 56), 64)]


def _spec(xshape, filters):
    n, c, h, w = xshape
    return dict(n=n, c=c, h=h, w=w, o=filters, k=3)


def gc_conv_shape(xshape, filters):
    return bench_models.gc_conv("cuda", _spec(xshape, filters))


def torch_conv_shape(xshape, filters):
    return bench_models.torch_conv("cuda", _spec(xshape, filters))


def _demo_data(batch, steps=None):
    from gradcore.demo import load_digits
    x, y = load_digits()
    order = np.random.default_rng(0).permutation(len(x))
    return x, y, [order[i:i + batch] for i in range(0, len(x), batch)][:steps]


def gc_demo_epoch(batch=32, steps=None):
    """One epoch of the demo's training loop on cuda (gradcore/demo.py)."""
    import gradcore.optimizer as optim
    from gradcore.demo import DigitsCNN
    x, y, batches = _demo_data(batch, steps)
    model = DigitsCNN().to("cuda")
    gm = GradManager().attach(model.parameters())
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def epoch():
        for idx in batches:
            with gm:
                loss = F.cross_entropy(model(gc.tensor(x[idx], device="cuda")), gc.tensor(y[idx], device="cuda"))
                gm.backward(loss)
            opt.step().clear_grad()
            loss.item()
    return epoch


def torch_demo_epoch(batch=32):
    nn = torch.nn
    x, y, batches = _demo_data(batch)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def epoch():
        for idx in batches:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.tensor(x[idx], device="cuda")),
                                                     torch.tensor(y[idx], device="cuda").long())
            loss.backward()
            opt.step()
            loss.item()
    return epoch


def conv_cases(emulator=False):
    """(name, gradcore step, PyTorch step or None): issue 17's cases (on the
    emulator, a smoke test: one small shape, 2 steps of the epoch)."""
    shapes = [((2, 4, 6, 6), 4)] if emulator else CONV_SHAPES
    cases = [(f"conv2d {'x'.join(map(str, xs))} * {o}x3x3 fwd+bwd", gc_conv_shape(xs, o),
              torch_conv_shape(xs, o) if torch else None) for xs, o in shapes]
    cases.append(("demo digits CNN, one epoch (batch 32)" if not emulator else "demo digits CNN, 2 steps",
                  gc_demo_epoch(steps=2 if emulator else None), torch_demo_epoch() if torch else None))
    return cases


def run_side_by_side(cases, results, repeat, target_time):
    """Median seconds of each case, gradcore and PyTorch alternating; printed and recorded."""
    for name, g, t in cases:
        gt, tt = [], []
        for _ in range(repeat):
            gt.append(timed(g, target_time))
            if t is not None:
                tt.append(timed(t, target_time))
        gm_, tm_ = statistics.median(gt), (statistics.median(tt) if tt else None)
        ratio = f"{gm_ / tm_:.2f}x" if tm_ else "-"
        print(f"  {name:44s} gradcore {gm_ * 1e3:8.3f} ms  torch {tm_ * 1e3 if tm_ else float('nan'):8.3f} ms  {ratio}")
        results["cases"][name] = {"gradcore_s": gm_, "torch_s": tm_}


# ---------------------------------------------------------------- whole training steps as CUDA graphs (issue 16)
MLP_SIZES = [784, 512, 512, 10]


def training_batch(model: str, batch: int):
    """(inputs, int32 labels) on the host for ``model`` ("mlp": 784 features,
    10 classes; "cnn": 1x8x8 digits images, 10 classes)."""
    rng = np.random.default_rng(0)
    shape = (batch, MLP_SIZES[0]) if model == "mlp" else (batch, 1, 8, 8)
    return rng.uniform(-1, 1, shape).astype(np.float32), rng.integers(0, 10, batch).astype(np.int32)


def gc_training_steps(model: str, batch: int):
    """gradcore's full training step (forward, backward, SGD with momentum)
    of ``model`` ("mlp" or "cnn", the demo's): (eager step, graphed step),
    each a zero-argument callable; two independent copies of the model."""
    x, y = training_batch(model, batch)
    xb, yb = gc.Tensor(x, device="cuda"), gc.Tensor(y, device="cuda")

    def make():
        gc.random.seed(0)
        if model == "mlp":
            prng = np.random.default_rng(1)
            ws = [gc.Parameter(prng.normal(0, 1 / np.sqrt(i), (i, o)).astype(np.float32), device="cuda")
                  for i, o in zip(MLP_SIZES, MLP_SIZES[1:])]
            bs = [gc.Parameter(np.zeros(o, np.float32), device="cuda") for o in MLP_SIZES[1:]]
            params = ws + bs

            def forward(x):
                h = x
                for i, (w, b) in enumerate(zip(ws, bs)):
                    h = F.matmul(h, w) + b
                    if i < len(ws) - 1:
                        h = F.relu(h)
                return h
        else:
            net = DigitsCNN().to("cuda")
            params, forward = list(net.parameters()), net
        gm = GradManager().attach(params)
        opt = gc.optimizer.SGD(params, lr=0.01, momentum=0.9)

        def step(x, y):
            with gm:
                loss = F.cross_entropy(forward(x), y)
                gm.backward(loss)
            opt.step().clear_grad()
            return loss
        return step
    eager, graphed = make(), gc.cuda.graphed(make())
    return (lambda: eager(xb, yb)), (lambda: graphed(xb, yb))


def torch_training_steps(model: str, batch: int):
    """The same training step in PyTorch on cuda: (eager step, the step
    captured whole with torch.cuda.graph and replayed, inputs copied into its
    static tensors as PyTorch's documentation shows)."""
    nn = torch.nn
    x, y = training_batch(model, batch)
    xb, yb = torch.tensor(x, device="cuda"), torch.tensor(y.astype(np.int64), device="cuda")

    def make():
        torch.manual_seed(0)
        if model == "mlp":
            layers = [nn.Linear(MLP_SIZES[0], MLP_SIZES[1]), nn.ReLU(), nn.Linear(MLP_SIZES[1], MLP_SIZES[2]),
                      nn.ReLU(), nn.Linear(MLP_SIZES[2], MLP_SIZES[3])]
        else:
            layers = [nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                      nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)]
        net = nn.Sequential(*layers).cuda()
        return net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    net, opt = make()

    def eager():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(xb), yb).backward()
        opt.step()

    gnet, gopt = make()
    static_x, static_y = xb.clone(), yb.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):           # warm-up on a side stream, as capture requires
        for _ in range(3):
            gopt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(gnet(static_x), static_y).backward()
            gopt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    gopt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = torch.nn.functional.cross_entropy(gnet(static_x), static_y)
        static_loss.backward()
        gopt.step()

    def graphed():
        static_x.copy_(xb)
        static_y.copy_(yb)
        graph.replay()
    return eager, graphed


def graph_steps(results, repeat, target_time, emulator):
    """The graphed training steps side by side with gradcore eager, PyTorch
    CUDA eager and PyTorch CUDA graphs: rounds alternate the variants;
    medians of the times and of the per-round ratios."""
    batch_mlp, batch_cnn = (8, 4) if emulator else (32, 32)
    print("\ntraining steps as CUDA graphs (SGD momentum; medians; ratios per round, then medians)")
    print("  target: graphed MLP b32 <= 0.3x torch eager and <= 1.0x torch cuda graph")
    for model, batch in (("mlp", batch_mlp), ("cnn", batch_cnn)):
        name = (f"MLP 784-512-512-10 batch {batch}" if model == "mlp" else f"demo CNN (8x8 digits) batch {batch}")
        variants = dict(zip(("gradcore eager", "gradcore graphed"), gc_training_steps(model, batch)))
        if torch is not None:
            variants.update(zip(("torch eager", "torch cuda graph"), torch_training_steps(model, batch)))
        rounds = {k: [] for k in variants}
        for _ in range(repeat):
            for label, fn in variants.items():
                rounds[label].append(timed(fn, target_time))
        med = {k: statistics.median(v) for k, v in rounds.items()}
        ratio = {}
        for ref in ("gradcore eager", "torch eager", "torch cuda graph"):
            if ref in rounds:
                ratio[f"graphed / {ref}"] = statistics.median(
                    g / r for g, r in zip(rounds["gradcore graphed"], rounds[ref]))
        print(f"  {name}")
        print("    " + "  ".join(f"{k} {v * 1e6:9.1f} us" for k, v in med.items()))
        print("    " + "  ".join(f"{k} {v:5.2f}x" for k, v in ratio.items()))
        results["cases"][f"graphed step: {name}"] = {"seconds": med, "ratios": ratio}


# ---------------------------------------------------------------- start-up
STARTUP = r"""
import time, numpy as np
t0 = time.perf_counter()
import gradcore as gc, gradcore.functional as F
from gradcore.autodiff import GradManager
x = gc.Tensor(np.ones((8, 16), np.float32), device="cuda")
w = gc.Parameter(np.ones((16, 4), np.float32), device="cuda")
y = gc.Tensor(np.zeros(8, np.int32), device="cuda")
gm = GradManager().attach([w])
with gm:
    gm.backward(F.cross_entropy(F.relu(F.matmul(x, w)) * 2.0 + 1.0, y))
w.grad.numpy()
print(time.perf_counter() - t0)
"""


def startup(cache_dir, env_kind):
    env = dict(os.environ, GRADCORE_KERNEL_CACHE=cache_dir, GRADCORE_CUDA=env_kind)
    out = subprocess.run([sys.executable, "-c", STARTUP], capture_output=True, text=True, env=env, timeout=1200)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return float(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- cold / warm start: compiling the standard kernels
def compile_standard_kernels(compiler: str, per_family: bool, ctype: str = "float", sample: int = 1):
    """(seconds, compiler runs, kernels) to compile every standard kernel
    for ``ctype`` into an empty cache: per family (one program per family,
    its parts in parallel, as the backend does) or one kernel per program
    (every ``sample``-th kernel only, when > 1: a partial measurement)."""
    from gradcore.cuda import KernelCache, families
    fams = [families.program(f, ctype) for f in families.family_names()]
    fams = [fam for fam in fams if fam.units]
    with tempfile.TemporaryDirectory() as tmp:
        cache = KernelCache(tmp, compiler=compiler)
        t0 = time.perf_counter()
        if per_family:
            cache.precompile(ctypes=(ctype,))
            runs, kernels = cache.compiler_runs, sum(len(fam.kernels) for fam in fams)
        else:
            units = [u for fam in fams for u in fam.units][::sample]
            for unit in units:
                cache.compile(families.kernel_names(unit)[0], unit)
            runs, kernels = len(units), sum(len(families.kernel_names(u)) for u in units)
        return time.perf_counter() - t0, runs, kernels


CNN_STEP = r"""
import sys, time
t0 = time.perf_counter()
import numpy as np
import gradcore as gc, gradcore.functional as F, gradcore.optimizer as optim
from gradcore.autodiff import GradManager
from gradcore.cuda import runtime
from gradcore.demo import DigitsCNN, load_digits
if sys.argv[1] == "fake-gpu":
    sys.path.insert(0, sys.argv[2])
    import fake_pycuda
    runtime.use(fake_pycuda.make_backend())
x, y = load_digits()
model = DigitsCNN().to("cuda")
gm = GradManager().attach(model.parameters())
opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
with gm:
    gm.backward(F.cross_entropy(model(gc.tensor(x[:32], device="cuda")), gc.tensor(y[:32], device="cuda")))
opt.step().clear_grad()
runtime.backend().synchronize()
print(time.perf_counter() - t0)
import os
os._exit(0)     # the fake GPU's context needs no clean-up
"""


def cnn_start(cache_dir, kind, env=None):
    """Seconds from ``import gradcore`` to the end of the demo CNN's first
    training step, in a fresh process with kernel cache ``cache_dir``
    (``env``: the child's environment, default this process's)."""
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "cuda")
    env = dict(os.environ if env is None else env, GRADCORE_KERNEL_CACHE=cache_dir,
               GRADCORE_CUDA="emulator" if kind == "emulator" else "gpu")
    out = subprocess.run([sys.executable, "-c", CNN_STEP, kind, tests], capture_output=True, text=True, env=env,
                         timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return float(out.stdout.strip().splitlines()[-1])


def cold_start(results, quick: bool):
    """Compiling the standard kernels (NVRTC per family vs nvcc per kernel)
    and the demo CNN's import-to-first-step, cold and warm. Runs without a
    GPU: NVRTC and nvcc need none; steps run on the emulator, and on the
    fake GPU (gradcore's PyCUDA driver and kernel cache, kernels executed
    by the emulator)."""
    from gradcore.cuda import nvrtc
    from gradcore.devices import nvcc_path
    sample = 8 if quick else 1
    print("\ncompiling every standard kernel for float, empty cache (seconds; compiler runs; kernels)")
    rows = []
    if nvrtc.available():
        rows += [("NVRTC, per family (the backend)", "nvrtc", True, 1), ("NVRTC, one kernel per program", "nvrtc", False, sample)]
    if nvcc_path():
        rows += [("nvcc, per family (the fallback)", "nvcc", True, 1), ("nvcc, one process per kernel (before)", "nvcc", False, sample)]
    for label, compiler, per_family, every in rows:
        seconds, runs, kernels = compile_standard_kernels(compiler, per_family, sample=every)
        note = f"  (every {every}th kernel only)" if every > 1 else ""
        print(f"  {label:40s} {seconds:8.2f} s  {runs:4d} runs  {kernels:4d} kernels{note}")
        results.setdefault("compile", {})[label] = {"seconds": seconds, "runs": runs, "kernels": kernels,
                                                      "sample": every}
    print("\ndemo CNN, import to the end of the first training step (fresh processes)")
    for kind in ("emulator", "fake-gpu"):
        with tempfile.TemporaryDirectory() as cache:
            cold = cnn_start(cache, kind)
            warm = [cnn_start(cache, kind) for _ in range(1 if quick else 5)]
        print(f"  {kind:10s} cold {cold:7.2f} s   warm {statistics.median(warm):6.2f} s (median of {len(warm)})")
        results.setdefault("cnn_start", {})[kind] = {"cold_s": cold, "warm_s": statistics.median(warm)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--target-time", type=float, default=0.3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--emulator", action="store_true", help="run on the host emulator (smoke test only)")
    ap.add_argument("--host-cost", action="store_true",
                    help="only the host cost of a tiny op, cuda (emulator, no-op launches) against cpu")
    ap.add_argument("--cold-start", action="store_true",
                    help="only compiling the standard kernels and the CNN's cold / warm start (anywhere)")
    ap.add_argument("--graphs", action="store_true", help="only the training steps as CUDA graphs")
    ap.add_argument("--conv-only", action="store_true", help="only issue 17's convolution and demo cases")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.cold_start:
        results = {"cases": {}}
        cold_start(results, args.quick)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return
    global torch
    if args.emulator:
        runtime.use("emulator")
        torch = None
    if args.quick:
        args.repeat, args.target_time = 1, 0.01
    be = runtime.backend()
    kind = be.driver.kind
    print(f"device: {be.name} ({kind}); torch: {torch.__version__ if torch else 'not available on cuda'}")
    results = {"device": be.name, "kind": kind, "cases": {}}
    from gradcore.cuda import cudnn
    results["convolutions"] = cudnn.status(be)
    if torch is not None:
        results["torch_cudnn"] = torch.backends.cudnn.version()
    print(f"convolutions: {results['convolutions']}; TF32: conv {gradcore_cuda().allow_tf32_conv}, "
          f"matmul {gradcore_cuda().allow_tf32_matmul}"
          + (f"; torch cuDNN {results['torch_cudnn']}, TF32 conv {torch.backends.cudnn.allow_tf32}, "
             f"matmul {torch.backends.cuda.matmul.allow_tf32}" if torch is not None else ""))
    if args.conv_only:
        print("\nissue 17 (medians; ratio = gradcore / PyTorch CUDA eager; target <= 1.0)")
        run_side_by_side(conv_cases(args.emulator), results, args.repeat,
                         args.target_time if args.quick else max(args.target_time, 1.0))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return
    if args.host_cost:
        print_host_cost(results, args.repeat)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return
    if args.graphs:
        graph_steps(results, args.repeat, args.target_time, args.emulator)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return

    def save():     # after every section: a run cut short still leaves its figures
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)

    # the per-op cost on the device: a tiny op, side by side with PyTorch (target <= 0.5x)
    print("\ntiny op (x * a, 16 float32; medians; ratio = gradcore / PyTorch CUDA eager; target <= 0.5)")
    tiny = tiny_op_cases("cuda")
    ttiny = torch_tiny_op_cases() if torch is not None else {}
    run_side_by_side([(f"tiny op {name}", fn, ttiny.get(name)) for name, fn in tiny.items()], results,
                     args.repeat, args.target_time)
    save()

    # elementwise throughput
    n = (1 << 12) if args.emulator else (1 << 24)
    cases = elementwise_cases(n)
    rounds = {k: [] for k in cases}
    for _ in range(args.repeat):
        for name, (fn, _) in cases.items():
            rounds[name].append(timed(fn, args.target_time))
    copy_bw = cases["copy (device to device)"][1] / statistics.median(rounds["copy (device to device)"])
    print(f"\nelementwise, {n} float32 elements (fraction of the copy's bandwidth; target >= 0.85)")
    for name, (_, nbytes) in cases.items():
        t = statistics.median(rounds[name])
        frac = nbytes / t / copy_bw
        print(f"  {name:28s} {t * 1e6:10.1f} us  {nbytes / t / 1e9:8.1f} GB/s  {frac:6.2f}")
        results["cases"][f"elementwise: {name}"] = {"seconds": t, "bandwidth_fraction": frac}
    print_reductions(results, n if not args.emulator else 1 << 13, copy_bw, args.repeat, args.target_time)
    save()

    # models, side by side
    batches = (8,) if args.emulator else (128, 32)
    model_cases = [(f"MLP 784-512-512-10 batch {b}", gc_mlp(b), torch_mlp(b) if torch else None) for b in batches]
    if not args.emulator:
        model_cases.append(("conv2d 16x32x32x32 * 64x3x3 fwd+bwd", gc_conv(), torch_conv() if torch else None))
    if not args.emulator:
        model_cases += conv_cases()
    print("\nsteps (medians; ratio = gradcore / PyTorch CUDA eager; target <= 1.0)")
    run_side_by_side(model_cases, results, args.repeat, args.target_time)
    save()
    graph_steps(results, args.repeat, args.target_time, args.emulator)
    save()

    # start-up, each in a fresh process: empty cache, then the disk cache
    with tempfile.TemporaryDirectory() as cache:
        env_kind = "emulator" if args.emulator else "gpu"
        cold = startup(cache, env_kind)
        warm = startup(cache, env_kind)
    print(f"\nstart-up (import + first MLP step, fresh process): cold {cold:.2f} s (compiles), warm {warm:.2f} s "
          "(disk cache)")
    results["startup"] = {"cold_s": cold, "warm_s": warm}
    save()
    if not args.emulator:
        with tempfile.TemporaryDirectory() as cache:
            cold, warm = cnn_start(cache, "gpu"), cnn_start(cache, "gpu")
        print(f"demo CNN, import to first step: cold {cold:.2f} s, warm {warm:.2f} s (target: warm <= 0.3 s)")
        results["cnn_start"] = {"gpu": {"cold_s": cold, "warm_s": warm}}
    print()
    print_host_cost(results, args.repeat)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
