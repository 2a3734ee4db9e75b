"""Reference computations for tests, shared by the whole suite: values and
gradients from PyTorch and from finite differences (gradcore.testing), so a
wrong op makes a test fail. tests/ops gets them as the ``h`` fixture."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import gradcore
from gradcore.autodiff import GradManager
from gradcore.testing import analytic_grads, gradcheck, gradgradcheck


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


def compare_with_torch(torch, gfn, tfn, arrays, rtol=1e-7, atol=1e-9, wrt=None, need_grads=False):
    """Values and weighted gradients of ``gfn`` (gradcore) and ``tfn`` (torch)
    on the same inputs must agree; an input torch gives no gradient must get
    none (or zeros) from gradcore (``need_grads``: both must give one).
    ``wrt``: indices of inputs to compare gradients for (default: all
    floating ones)."""
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
        if need_grads:
            assert g is not None and tg is not None, f"input {i}: gradcore {g}, torch {tg}"
        if tg is None:
            assert g is None or not np.any(g), f"input {i}: torch has no gradient, gradcore {g}"
            continue
        assert g is not None, f"input {i}: no gradient, torch has {tg}"
        assert_close(g, tg, rtol, atol, f"grad of input {i}")


def check_grads(fn, arrays, wrt=None, second=True, dtype=None, **kw):
    """First (and second) order gradients of ``fn`` against finite
    differences (inputs cast to ``dtype`` when given)."""
    xs = [gradcore.Tensor(np.asarray(a, dtype)) for a in arrays]
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


def compare_second_order(torch, gfn, tfn, arrays, rng, rtol=1e-9, atol=1e-11):
    """d/dx sum(w2 * d/dx sum(w1 * fn(x))) for each input, by nested
    managers, against torch.autograd.grad(create_graph=True)."""
    xs = [gradcore.Tensor(np.asarray(a)) for a in arrays]
    w1 = rng.standard_normal(gfn(*xs).shape)
    w2 = [rng.standard_normal(np.shape(a)) for a in arrays]
    outer = GradManager().attach(xs)
    with outer:
        inner = GradManager().attach(xs)
        with inner:
            inner.backward((gfn(*xs) * gradcore.Tensor(w1)).sum())
        firsts = [x.grad for x in xs]
        for x in xs:
            x.grad = None
        outer.backward(sum((g * gradcore.Tensor(w)).sum() for g, w in zip(firsts, w2) if g is not None))
    ours = [np.zeros(x.shape) if x.grad is None else x.grad.numpy() for x in xs]
    ts = [torch.tensor(np.asarray(a), requires_grad=True) for a in arrays]
    tfirsts = torch.autograd.grad((tfn(*ts) * torch.tensor(w1)).sum(), ts, create_graph=True)
    total = sum((g * torch.tensor(w)).sum() for g, w in zip(tfirsts, w2))
    theirs = [np.zeros(t.shape) if s is None else s.numpy()
              for t, s in zip(ts, torch.autograd.grad(total, ts, allow_unused=True))]
    for i, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"second order, input {i}")


# the functional tests' forms: float64 finite differences, 1e-10 against torch,
# every floating input must get a gradient from both
check_grads64 = functools.partial(check_grads, dtype=np.float64)
compare_torch = functools.partial(compare_with_torch, rtol=1e-10, atol=1e-12, need_grads=True)


def optimizer_steps(opt, param, grads) -> None:
    """One ``opt.step()`` per gradient in ``grads``, each set as ``param.grad``
    (the reference run of an optimizer test: a run resumed from a state_dict
    must end where the uninterrupted one does)."""
    for g in grads:
        param.grad = gradcore.tensor(g)
        opt.step()
