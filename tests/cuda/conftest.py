"""The ``cuda`` fixture and the cpu-vs-cuda comparison every CUDA op test uses.

Each test taking ``cuda`` runs once per CUDA driver: ``emulator`` (the host
emulation in gradcore/cuda/emulator.py, wherever a C++ compiler is) and
``gpu`` (PyCUDA on a real GPU, skipped cleanly where there is none). The
same launch code runs on both; on the emulator the kernels are the same
CUDA C sources compiled as C++.
"""
from __future__ import annotations

import shutil
from typing import Callable, Optional, Sequence

import numpy as np
import pytest

import gradcore as gc
from gradcore.autodiff import GradManager
from gradcore.cuda import runtime
from gradcore.cuda.memory import guarded_writes

from gpu_probe import gpu_unavailable_reason  # noqa: E402 (tests/cuda is on the path, as for fake_cudnn)


@pytest.fixture(scope="session")
def _fake_gpu_backend():
    import fake_pycuda
    be = fake_pycuda.make_backend()
    yield be
    fake_pycuda.close(be)


@pytest.fixture(params=["emulator", "gpu", "fake-gpu"])
def cuda(request):
    """The CUDA backend under test (selected for the whole process while the
    test runs: ``device="cuda"`` means it).

    - ``emulator``: the host emulator (gradcore/cuda/emulator.py);
    - ``gpu``: PyCUDA on a real GPU, where there is one;
    - ``fake-gpu``: where there is none but nvcc is, gradcore's PyCUDA driver
      on a fake pycuda (fake_pycuda.py): every kernel compiled to PTX by
      nvcc, every launch's parameters checked against the PTX, run by the
      emulator."""
    kind = request.param
    has_cxx = bool(shutil.which("g++") or shutil.which("c++"))
    if kind in ("emulator", "fake-gpu") and not has_cxx:
        pytest.skip("the CUDA emulator needs g++")
    if kind == "gpu":
        reason = gpu_unavailable_reason()
        if reason:
            pytest.skip(f"no GPU: {reason}")
    if kind == "fake-gpu":
        from gradcore.devices import nvcc_path
        if not gpu_unavailable_reason():
            pytest.skip("a real GPU runs these")
        if nvcc_path() is None:
            pytest.skip("the fake GPU needs nvcc")
        be = runtime.use(request.getfixturevalue("_fake_gpu_backend"))
    else:
        be = runtime.use(kind)
    import gradcore.cuda as gcuda
    # the comparisons with the cpu are in float32's precision: TF32 convolutions (cuDNN's default on a
    # GPU, gradcore's too) keep 10 mantissa bits; test_cudnn.py tests the TF32 policy itself
    tf32, gcuda.allow_tf32_conv = gcuda.allow_tf32_conv, False
    try:
        if request.node.get_closest_marker("pool_statistics"):
            yield be
        else:
            # on the emulator every array ends in a guard band: a kernel that
            # writes past an array's end fails the test that launched it
            with guarded_writes(be) as guard:
                yield be
                damaged = [(nbytes, past) for _, nbytes, past in guard.damaged()] if guard is not None else []
                assert not damaged, ("a kernel wrote past the end of an array "
                                     "((array bytes, first byte written past its end): " f"{damaged})")
    finally:
        gcuda.allow_tf32_conv = tf32
        runtime.use(None)


def _outputs(res):
    return [res] if isinstance(res, gc.Tensor) else [r for r in res if r is not None]


def _host(t):
    return None if t is None else np.asarray(t.numpy(), dtype=np.float64)


def run_on(device: str, fn: Callable, arrays: Sequence[np.ndarray], weights=None, vweights=None,
           wrt: Optional[Sequence[int]] = None, second_order: bool = True):
    """(outputs, first-order grads, second-order grads) of ``fn`` on ``device``,
    all as float64 host arrays. First order: d sum(out * w) / dx; second order:
    d sum(grad1 * v) / dx, through nested GradManagers."""
    xs = [gc.Tensor(np.asarray(a), device=device) for a in arrays]
    chosen = [x for i, x in enumerate(xs) if x.dtype.kind == "f" and (wrt is None or i in wrt)]
    outer, inner = GradManager().attach(chosen), GradManager().attach(chosen)
    with outer:
        with inner:
            outs = _outputs(fn(*xs))
            for o in outs:
                assert o.device == device, f"an output is on {o.device}, its inputs on {device}"
            # (an output with no history, of an op with no gradient, has no
            # gradients to compare: its backward would raise)
            ys = [o for o, w in zip(outs, weights) if o.dtype.kind == "f" and o._is_recorded()]
            dys = [gc.Tensor(w, device=device) for o, w in zip(outs, weights)
                   if o.dtype.kind == "f" and o._is_recorded()]
            if ys:
                inner.backward(ys, dys)
        first = [x.grad for x in chosen]
        for g in first:
            assert g is None or g.device == device, f"a gradient is on {g.device}, its tensor on {device}"
        for x in chosen:
            x.grad = None
        second = None
        if second_order:
            terms = [(g * gc.Tensor(v, device=device)).sum() for g, v in zip(first, vweights) if g is not None]
            if terms:
                total = terms[0]
                for t in terms[1:]:
                    total = total + t
                outer.backward(total)
            second = [_host(x.grad) for x in chosen]
    return [_host(o) for o in outs], [_host(g) for g in first], second


def assert_cuda_matches_cpu(fn: Callable, arrays: Sequence, *, rtol: float = 1e-4, atol: float = 1e-5,
                            wrt: Optional[Sequence[int]] = None, second_order: bool = True, seed: int = 0):
    """``fn`` on cuda gives the cpu's outputs, first-order gradients and
    (``second_order``) second-order gradients, within float32 tolerance."""
    arrays = [np.asarray(a) for a in arrays]
    rng = np.random.default_rng(seed)
    cpu_outs = _outputs(fn(*[gc.Tensor(a) for a in arrays]))
    weights = [rng.standard_normal(o.shape).astype(o.dtype) if o.dtype.kind == "f" else None for o in cpu_outs]
    floats = [a for i, a in enumerate(arrays) if a.dtype.kind == "f" and (wrt is None or i in wrt)]
    vweights = [rng.standard_normal(a.shape).astype(a.dtype) for a in floats]
    ref = run_on("cpu", fn, arrays, weights, vweights, wrt, second_order)
    got = run_on("cuda", fn, arrays, weights, vweights, wrt, second_order)
    for what, r_list, g_list in zip(("output", "gradient", "second-order gradient"), ref, got):
        if r_list is None:
            continue
        assert len(r_list) == len(g_list), f"{what}s: {len(g_list)} on cuda, {len(r_list)} on cpu"
        for i, (r, g) in enumerate(zip(r_list, g_list)):
            if r is None or g is None:
                # no path on one device: the other must be zero (or also no path)
                other = g if r is None else r
                assert other is None or not np.any(other), f"{what} {i}: None on one device only"
                continue
            assert r.shape == g.shape, f"{what} {i}: shape {g.shape} on cuda, {r.shape} on cpu"
            np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=f"{what} {i}: cuda vs cpu")
    return ref, got


@pytest.fixture(params=["gemm", "direct"])
def conv_path(request, monkeypatch):
    """Both cuda paths of the 2-d convolutions (and what runs on them:
    ConvTranspose2d): im2col + GEMM, direct kernels."""
    from gradcore.ops import conv
    monkeypatch.setattr(conv, "CUDA_GEMM", request.param == "gemm")
    return request.param


@pytest.fixture
def matches_cpu():
    return assert_cuda_matches_cpu


@pytest.fixture
def fresh_backend(cuda, tmp_path, monkeypatch):
    """A new backend (nothing loaded) on the driver under test, and the
    sources its driver is asked to load. On the emulator a new driver with
    an empty disk cache: every load is a compile."""
    from gradcore.cuda.emulator import HostDriver
    driver = HostDriver(tmp_path) if cuda.driver.kind == "emulator" else cuda.driver
    loads = []
    real = driver.load
    monkeypatch.setattr(driver, "load", lambda name, src: (loads.append(src), real(name, src))[1])
    return runtime.Backend(driver), loads
