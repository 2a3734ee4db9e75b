"""Shared helpers for the op suite, handed to tests as the ``h`` fixture.

Everything here computes references *outside* gradcore (finite differences
through gradcore.testing, or PyTorch), so a wrong op makes a test fail.
"""
from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

import gradcore
from gradcore.autodiff import GradManager
from gradcore.testing import analytic_grads, gradcheck, gradgradcheck

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    # a NumPy kernel computing 0/0, log(-1), inf-inf... is an op bug here
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.filterwarnings("error::RuntimeWarning"))


def _outs(res):
    return [res] if isinstance(res, gradcore.Tensor) else [r for r in res if r is not None]


def gc_vjp(fn, arrays, weight=None, seed=0):
    """Run ``fn`` on Tensors made from ``arrays`` under a GradManager that
    attaches every floating input; return (output array, [grad or None],
    weight used)."""
    xs = [gradcore.Tensor(np.asarray(a)) for a in arrays]
    chosen = [x for x in xs if x.dtype.kind == "f"]
    gm = GradManager().attach(chosen)
    with gm:
        y = fn(*xs)
        if weight is None:
            weight = np.random.default_rng(seed).standard_normal(y.shape).astype(y.dtype)
        gm.backward(y, gradcore.Tensor(np.asarray(weight, dtype=y.dtype)))
    grads = [None if x.grad is None else x.grad.numpy() for x in xs]
    return y.numpy(), grads, weight


def to_torch(torch, a, requires_grad=True):
    a = np.asarray(a)
    if a.dtype.kind in "iu":
        a = a.astype(np.int64)
    t = torch.tensor(a)
    if requires_grad and a.dtype.kind == "f":
        t.requires_grad_(True)
    return t


def torch_vjp(torch, tfn, arrays, weight):
    """The same as ``gc_vjp`` with PyTorch: (output array, [grad or None])."""
    ts = [to_torch(torch, a) for a in arrays]
    y = tfn(*ts)
    grads = [None] * len(ts)
    if y.requires_grad:
        y.backward(torch.tensor(np.asarray(weight, dtype=np.asarray(y.detach()).dtype)))
        grads = [None if t.grad is None else t.grad.numpy() for t in ts]
    return y.detach().numpy(), grads


def assert_close(actual, expected, rtol=1e-7, atol=1e-9, what=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape}, expected {expected.shape}"
    if expected.dtype == bool:
        np.testing.assert_array_equal(actual, expected, err_msg=what)
    else:
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def compare_with_torch(torch, gfn, tfn, arrays, rtol=1e-7, atol=1e-9, wrt=None):
    """Values and weighted gradients of ``gfn`` (gradcore) and ``tfn`` (torch)
    on the same inputs must agree; an input torch gives no gradient must get
    none (or zeros) from gradcore. ``wrt``: indices of inputs to compare
    gradients for (default: all floating ones)."""
    out, grads, w = gc_vjp(gfn, arrays)
    t_out, t_grads = torch_vjp(torch, tfn, arrays, w)
    assert_close(out, t_out, rtol, atol, "value")
    assert out.dtype == t_out.dtype or (out.dtype.kind == t_out.dtype.kind == "f"), \
        f"dtype {out.dtype}, torch {t_out.dtype}"
    for i, (g, tg) in enumerate(zip(grads, t_grads)):
        if wrt is not None and i not in wrt:
            continue
        if np.asarray(arrays[i]).dtype.kind != "f":
            continue
        if tg is None:
            assert g is None or not np.any(g), f"input {i}: torch has no gradient, gradcore {g}"
            continue
        assert g is not None, f"input {i}: no gradient, torch has {tg}"
        assert_close(g, tg, rtol, atol, f"grad of input {i}")


def check_grads(fn, arrays, wrt=None, second=True, **kw):
    """First (and second) order gradients of ``fn`` against finite differences."""
    xs = [gradcore.Tensor(np.asarray(a)) for a in arrays]
    assert gradcheck(fn, xs, wrt=wrt, **kw)
    # gradcheck's tolerance test is False for NaN: check finiteness ourselves
    ws = [np.ones(o.shape, o.dtype) for o in _outs(fn(*[x.detach() for x in xs]))]
    for g in analytic_grads(fn, xs, ws, wrt):
        assert g is None or np.all(np.isfinite(g)), f"non-finite gradient {g}"
    if second:
        assert gradgradcheck(fn, xs, wrt=wrt, **kw)


def check_error(exc_info, *needles):
    """The message of a raised exception names the op and the shapes."""
    msg = str(exc_info.value)
    for n in needles:
        assert n.lower() in msg.lower(), f"{n!r} not in error message {msg!r}"


def error_of(fn, x, record, exc=ValueError):
    """The exception ``fn(x)`` raises, with ``x`` attached to a recording
    GradManager or not (the error must not depend on recording)."""
    gm = gradcore.GradManager().attach([x])
    if record:
        gm.record()
    try:
        with pytest.raises(exc) as ei:
            fn(x)
    finally:
        gm.release()
    return ei


@pytest.fixture
def h():
    return types.SimpleNamespace(gc_vjp=gc_vjp, torch_vjp=torch_vjp, to_torch=to_torch,
                                 assert_close=assert_close, compare=compare_with_torch,
                                 check_grads=check_grads, check_error=check_error,
                                 error_of=error_of)





@pytest.fixture
def nvcc_ptx(tmp_path):
    """Compile CUDA source text with ``nvcc --ptx`` (skip without nvcc);
    assert it compiles and return the PTX text."""
    import shutil
    import subprocess
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")

    def compile_(source, name="kernels"):
        path, out = tmp_path / f"{name}.cu", tmp_path / f"{name}.ptx"
        path.write_text(source)
        res = subprocess.run([nvcc, "--ptx", "-o", str(out), str(path)],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-4000:]
        return out.read_text()
    return compile_
