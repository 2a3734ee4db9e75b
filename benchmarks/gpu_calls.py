"""Per library call on a GPU: the host's time to queue one call and the GPU's
time to run it, gradcore and PyTorch side by side (issue 26's diagnosis of
the convolution and MLP steps).

    python3 benchmarks/gpu_calls.py          # on the GPU machine, after gpu_check.py's setup step

Each case is called 30 times queued behind a spin kernel (``torch.cuda._sleep``)
on the default stream both libraries use, so the GPU time between two events
is the calls' own, and the host time is the queuing alone. Cases: cuDNN's
convolution forward, backward data and backward filter (gradcore's op and
its raw call; PyTorch's), every legacy cuDNN algorithm and math mode for the
32x128x28x28 * 128x3x3 convolution, the MLP's GEMMs (gradcore's op, its raw
cuBLAS call, ``torch.mm``) and a tiny elementwise op. Results:
``$OUT/diag.json`` (name -> [host us, GPU us]). The record of 2026-11-26 is
``benchmarks/gpu_runs/2026-11-26-h100-run5-calls.json``.
"""
import json, os, sys, time, traceback
out = os.environ.get("OUT", "/tmp/diag"); os.makedirs(out, exist_ok=True)
res = {}
def save():
    with open(f"{out}/diag.json", "w") as f:
        json.dump(res, f, indent=1, default=str)
import numpy as np
import gradcore as gc, gradcore.functional as F
from gradcore.cuda import runtime, cudnn, _cudnn
be = runtime.use("gpu")
import torch
torch.backends.cuda.matmul.allow_tf32 = False
import ctypes

def measure(fn, n=30, sleep=True):
    """(host s per call, GPU s per call): n calls queued behind a spin kernel (GPU time = pure)."""
    for _ in range(3): fn()
    be.synchronize(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if sleep: torch.cuda._sleep(200_000_000)
    s.record()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    t1 = time.perf_counter()
    e.record(); torch.cuda.synchronize(); be.synchronize()
    return round((t1 - t0) / n * 1e6, 2), round(s.elapsed_time(e) * 1e3 / n, 2)

def case(name, fn, **kw):
    try:
        res[name] = measure(fn, **kw)
    except Exception:
        res[name] = traceback.format_exc()[-800:]
    print(name, res[name], flush=True); save()

rng = np.random.default_rng(0)
# is torch on our stream? (both on the legacy default stream)
res["torch_stream"] = str(torch.cuda.current_stream())
xs, ws = (32, 128, 28, 28), (128, 128, 3, 3)
xn = rng.standard_normal(xs).astype(np.float32); wn = (rng.standard_normal(ws) * 0.05).astype(np.float32)
x, w = gc.tensor(xn, device="cuda"), gc.tensor(wn, device="cuda")
tx, tw = torch.tensor(xn, device="cuda"), torch.tensor(wn, device="cuda")
attrs = ((1, 1), (1, 1), (1, 1), 1)
xa, wa = x._data if hasattr(x, "_data") else None, None
def dev(t):
    for name in ("_data", "data", "value", "_value"):
        v = getattr(t, name, None)
        if v is not None and hasattr(v, "ptr"):
            return v
    return t.numpy_device() if hasattr(t, "numpy_device") else None
xa, wa = dev(x), dev(w)
print("device arrays", type(xa), type(wa), flush=True)
case("gc conv2d forward (op)", lambda: F.conv2d(x, w, padding=1))
case("gc cudnn.conv_forward (raw)", lambda: cudnn.conv_forward(be, xa, wa, attrs))
ya = cudnn.conv_forward(be, xa, wa, attrs)
case("gc cudnn.conv_backward_data (raw)", lambda: cudnn.conv_backward_data(be, ya, wa, xs, attrs))
case("gc cudnn.conv_backward_filter (raw)", lambda: cudnn.conv_backward_filter(be, ya, xa, ws, attrs))
torch.backends.cudnn.allow_tf32 = True
case("torch conv2d forward", lambda: torch.nn.functional.conv2d(tx, tw, padding=1))
ty = torch.nn.functional.conv2d(tx, tw, padding=1)
case("torch conv backward data", lambda: torch.ops.aten.convolution_backward(ty, tx, tw, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, False, False]))
case("torch conv backward filter", lambda: torch.ops.aten.convolution_backward(ty, tx, tw, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False]))
# host cost alone: no spin, small n
case("gc cudnn.conv_forward host (no spin)", lambda: cudnn.conv_forward(be, xa, wa, attrs), n=10, sleep=False)
case("torch conv2d forward host (no spin)", lambda: torch.nn.functional.conv2d(tx, tw, padding=1), n=10, sleep=False)

# cuDNN legacy algorithm sweep, forward / backward data / backward filter, math 0 and 1
ctx = cudnn.context(be); lib = ctx.lib
sweep = {}
for direction, (a, b, oshape) in {"forward": (xa, wa, (32, 128, 28, 28)),
                                  "backward_data": (wa, ya, xs), "backward_filter": (xa, ya, ws)}.items():
    descs = cudnn._conv_descriptors(ctx, direction, a, b, oshape, attrs, np.dtype(np.float32), 0)
    outa = be.empty(oshape, np.float32)
    fn_name = cudnn._CONV_FUNCTIONS[direction][3]; size_fn = cudnn._CONV_FUNCTIONS[direction][2]
    for math in (0, 1, 3):
        conv = ctx.convolution(attrs, np.dtype(np.float32), math)
        for algo in range(cudnn.ALGO_COUNT[direction]):
            size = ctypes.c_size_t(0)
            st = getattr(lib, size_fn)(ctx.handle, descs[0], descs[1], conv, descs[3], algo, ctypes.byref(size))
            if st != 0:
                sweep[f"{direction} algo {algo} math {math}"] = f"size status {st}"; continue
            wsb = be.pool.malloc(size.value) if size.value else None
            def call():
                s2 = _cudnn.convolution(lib.address[fn_name], ctx.handle, False, descs[0], a.ptr, descs[1], b.ptr,
                                        conv, algo, int(wsb) if wsb is not None else 0, size.value, descs[3], outa.ptr)
                if s2: raise RuntimeError(f"status {s2}")
            try:
                sweep[f"{direction} algo {algo} math {math}"] = (measure(call, n=10), size.value)
            except Exception as exc:
                sweep[f"{direction} algo {algo} math {math}"] = str(exc)[-200:]
            print(direction, algo, math, sweep[f"{direction} algo {algo} math {math}"], flush=True)
res["sweep"] = sweep; save()

# cuBLAS: the MLP's GEMMs, gradcore (StridedBatched, batch 1) against torch.mm
for (m, k, n) in ((32, 784, 512), (128, 784, 512), (32, 512, 10)):
    an = rng.standard_normal((m, k)).astype(np.float32); bn = rng.standard_normal((k, n)).astype(np.float32)
    ga, gb = gc.tensor(an, device="cuda"), gc.tensor(bn, device="cuda")
    ta, tb = torch.tensor(an, device="cuda"), torch.tensor(bn, device="cuda")
    case(f"gc matmul {m}x{k}x{n}", lambda: F.matmul(ga, gb))
    case(f"torch mm {m}x{k}x{n}", lambda: ta @ tb)
    A, B = dev(ga), dev(gb); C = be.empty((m, n), np.float32)
    case(f"gc be.gemm raw {m}x{k}x{n}", lambda: be.gemm(False, False, n, m, k, 1.0, B.ptr, n, 0, A.ptr, k, 0, 0.0, C.ptr, n, 0, 1, np.float32))
ta16 = torch.ones(16, device="cuda"); t16 = gc.tensor(np.ones(16, np.float32), device="cuda")
case("gc tiny x * x", lambda: t16 * t16)
case("torch tiny x * x", lambda: ta16 * ta16)
print(json.dumps(res, indent=1, default=str)[:3000])
