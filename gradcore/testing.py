"""Gradient checks for op authors: analytic gradients against float64
central finite differences, first order (``gradcheck``) and second order
(``gradgradcheck``).

Example::

    >>> from gradcore.testing import gradcheck
    >>> x = gradcore.tensor(np.random.rand(3), dtype="float64")
    >>> gradcheck(lambda x: F.tanh(x) * x, [x])
    True
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import numpy as np

from ._core import Tensor
from .autodiff import GradManager

__all__ = ["gradcheck", "gradgradcheck", "GradcheckError", "numerical_grads", "analytic_grads"]


class GradcheckError(AssertionError):
    """Analytic and numerical gradients differ; the message shows the worst element."""


def _outputs(res) -> List[Tensor]:
    if isinstance(res, Tensor):
        return [res]
    return [r for r in res if r is not None]


def _as_tensors(inputs):
    out = []
    for x in inputs:
        t = x if isinstance(x, Tensor) else Tensor(np.asarray(x, dtype=np.float64))
        out.append(t)
    return out


def _weights(fn, xs, seed):
    rng = np.random.default_rng(seed)
    outs = _outputs(fn(*[x.detach() for x in xs]))
    return [rng.standard_normal(o.shape).astype(o.dtype) if o.dtype.kind in "fc" else None for o in outs]


def _objective(fn, xs, ws) -> float:
    outs = _outputs(fn(*xs))
    total = 0.0
    for o, w in zip(outs, ws):
        if w is not None:
            total += float(np.sum(o.numpy().astype(np.float64) * w))
    return total


def numerical_grads(fn: Callable, inputs: Sequence[Tensor], weights, eps: float = 1e-6,
                    wrt: Optional[Sequence[int]] = None) -> List[Optional[np.ndarray]]:
    """Central differences of ``sum(w * fn(*inputs))`` with respect to each input."""
    xs = list(inputs)
    grads = []
    for i, x in enumerate(xs):
        if (wrt is not None and i not in wrt) or x.dtype.kind not in "fc":
            grads.append(None)
            continue
        base = x.numpy().astype(np.float64)
        g = np.zeros(base.shape, np.float64)
        for idx in np.ndindex(*base.shape):
            for sign in (1, -1):
                pert = base.copy()
                pert[idx] += sign * eps
                xs[i] = Tensor(pert.astype(x.dtype))
                g[idx] += sign * _objective(fn, xs, weights)
            g[idx] /= 2 * eps
        xs[i] = x
        grads.append(g)
    return grads


def analytic_grads(fn: Callable, inputs: Sequence[Tensor], weights,
                   wrt: Optional[Sequence[int]] = None) -> List[Optional[np.ndarray]]:
    xs = [x.detach() for x in inputs]
    chosen = [x for i, x in enumerate(xs) if (wrt is None or i in wrt) and x.dtype.kind in "fc"]
    gm = GradManager().attach(chosen)
    with gm:
        outs = _outputs(fn(*xs))
        ys = [o for o, w in zip(outs, weights) if w is not None]
        dys = [Tensor(w) for w in weights if w is not None]
        gm.backward(ys, dys)
    res = []
    for i, x in enumerate(xs):
        if not any(x is c for c in chosen):
            res.append(None)
        else:
            res.append(np.zeros(x.shape) if x.grad is None else x.grad.numpy().astype(np.float64))
    return res


def _compare(name, analytic, numeric, inputs, atol, rtol):
    for i, (a, n) in enumerate(zip(analytic, numeric)):
        if n is None:
            continue
        if a.shape != n.shape:
            raise GradcheckError(f"{name}: input {i}: gradient shape {a.shape}, expected {n.shape}")
        err = np.abs(a - n) - (atol + rtol * np.abs(n))
        # NaN or inf on one side only is the worst disagreement there is
        same_nonfinite = (np.isnan(a) & np.isnan(n)) | (np.isinf(a) & (a == n))
        err = np.where(np.isnan(err) & ~same_nonfinite, np.inf, np.where(same_nonfinite, 0.0, err))
        if err.size and np.max(err) > 0:
            k = np.unravel_index(np.argmax(err), err.shape)
            raise GradcheckError(
                f"{name}: input {i} (shape {inputs[i].shape}): worst element {tuple(int(j) for j in k)}: "
                f"analytic {a[k]:.8g}, numerical {n[k]:.8g}, |diff| {abs(a[k] - n[k]):.3g} "
                f"> atol {atol} + rtol {rtol} * |numerical|")


def gradcheck(fn: Callable, inputs: Sequence, eps: float = 1e-6, atol: float = 1e-5,
              rtol: float = 1e-3, wrt: Optional[Sequence[int]] = None, seed: int = 0) -> bool:
    """Check ``fn``'s gradients against central finite differences.

    ``inputs`` should be float64 for a meaningful check. Raises
    GradcheckError naming the worst element; returns True otherwise.

    Example::

        >>> gradcheck(F.sin, [gradcore.tensor(np.random.rand(4), dtype="float64")])
        True
    """
    xs = _as_tensors(inputs)
    ws = _weights(fn, xs, seed)
    a = analytic_grads(fn, xs, ws, wrt)
    n = numerical_grads(fn, xs, ws, eps, wrt)
    _compare("gradcheck", a, n, xs, atol, rtol)
    return True


def _first_order_fn(fn: Callable, ws, wrt):
    """A function returning fn's weighted first-order gradients, built from
    gradcore ops so that an outer GradManager can differentiate it."""
    def grads(*xs):
        chosen = [x for i, x in enumerate(xs) if (wrt is None or i in wrt) and x.dtype.kind in "fc"]
        saved = [x.grad for x in chosen]
        for x in chosen:
            x.grad = None
        gm = GradManager().attach(chosen)
        with gm:
            outs = _outputs(fn(*xs))
            ys = [o for o, w in zip(outs, ws) if w is not None]
            gm.backward(ys, [Tensor(w) for w in ws if w is not None])
        res = []
        for x, old in zip(chosen, saved):
            g = x.grad
            x.grad = old
            res.append(g if g is not None else Tensor(np.zeros(x.shape, x.dtype)))
        return tuple(res)
    return grads


def gradgradcheck(fn: Callable, inputs: Sequence, eps: float = 1e-6, atol: float = 1e-5,
                  rtol: float = 1e-3, wrt: Optional[Sequence[int]] = None, seed: int = 0) -> bool:
    """Check second-order gradients: the gradient of fn's (weighted)
    gradient, computed with nested GradManagers, against finite differences.

    Example::

        >>> gradgradcheck(lambda x: x * x * x, [gradcore.tensor([0.5, 2.0], dtype="float64")])
        True
    """
    xs = _as_tensors(inputs)
    ws = _weights(fn, xs, seed)
    g = _first_order_fn(fn, ws, wrt)
    ws2 = _weights(g, xs, seed + 1)
    a = analytic_grads(g, xs, ws2, wrt)
    n = numerical_grads(g, xs, ws2, eps, wrt)
    _compare("gradgradcheck", a, n, xs, atol, rtol)
    return True
