"""``gradcore.jvp`` and ``gradcore.vjp``: Jacobian-vector and
vector-Jacobian products of a function of Tensors.

``jvp`` uses the double-reverse trick over the recorded backward graphs, so
every differentiable op has a forward-mode derivative without a rule of its
own: with ``g(u) = J^T u`` the reverse-mode product (linear in the output
cotangent ``u``), recording that backward and differentiating it with
respect to ``u`` along ``v`` gives ``d<J^T u, v>/du = J v``. Cost: one
forward and two backwards (about three times a forward, as reverse mode).

The trick needs each op's backward to be differentiable itself (as second
order gradients do): every standard op's is; a ``Function`` whose
``backward`` computes outside gradcore ops (on NumPy arrays) has a backward
the dual recording cannot see, and its part of ``J v`` comes out as zero.

Both record with their own low-level ``Grad`` keys and never touch
``.grad`` of the caller's tensors. They compose with ``GradManager``: an
enclosing manager that records the primals or tangents differentiates
through the results, and ``f`` may use a ``GradManager`` inside (a
Hessian-vector product is ``jvp`` of a gradient function).

Example::

    >>> import gradcore as gc
    >>> x = gc.tensor([1.0, 2.0])
    >>> y, dy = gc.jvp(lambda x: x ** 3, (x,), (gc.tensor([1.0, 0.0]),))
    >>> dy.numpy()
    array([3., 0.], dtype=float32)
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, Union

from ._core import Tensor, apply
from .core import Grad

Tensors = Union[Tensor, Sequence[Tensor]]


def _as_tuple(what: str, fn_name: str, values) -> Tuple[Tensor, ...]:
    if isinstance(values, (Tensor, tuple, list)):
        values = (values,) if isinstance(values, Tensor) else tuple(values)
    else:
        raise TypeError(f"gradcore.{fn_name}: {what} must be a Tensor or a tuple/list of Tensors, "
                        f"got {type(values).__name__}")
    for v in values:
        if not isinstance(v, Tensor):
            raise TypeError(f"gradcore.{fn_name}: {what} must be Tensors, got {type(v).__name__}")
    return values


def _fresh_inputs(primals: Tuple[Tensor, ...]) -> List[Tensor]:
    # tensor objects of our own (recorded identities: an enclosing manager
    # still sees the history), so attaching them never touches the caller's
    from .ops import Identity
    return [apply(Identity(), p)[0] for p in primals]


def _collector(store: List[Optional[Tensor]], i: int) -> Callable:
    def keep(grad):
        store[i] = grad
        return grad
    return keep


def _zeros_like(t: Tensor) -> Tensor:
    from .functional import zeros_like
    return zeros_like(t)


def jvp(fn: Callable[..., Tensors], primals: Tensors, tangents: Tensors) -> Tuple[Tensors, Tensors]:
    """``(fn(*primals), J v)``: the outputs and their directional derivatives
    along ``tangents`` (one per primal, same shapes), in the shape ``fn``
    returns (a Tensor or a tuple of Tensors). As ``torch.func.jvp``.

    Example::

        >>> x, v = gc.tensor([1.0, 2.0]), gc.tensor([1.0, 1.0])
        >>> out, tangent_out = gc.jvp(lambda x: x * x * x, (x,), (v,))
        >>> out.numpy(), tangent_out.numpy()     # x^3 and 3 x^2 * v
        (array([1., 8.], dtype=float32), array([ 3., 12.], dtype=float32))
    """
    primals = _as_tuple("primals", "jvp", primals)
    tangents = _as_tuple("tangents", "jvp", tangents)
    if len(primals) != len(tangents):
        raise ValueError(f"gradcore.jvp: {len(primals)} primals but {len(tangents)} tangents")
    tangents = list(tangents)
    for i, (p, v) in enumerate(zip(primals, tangents)):
        if p.shape != v.shape:
            raise ValueError(f"gradcore.jvp: tangent {i} has shape {v.shape}, its primal {p.shape}")
        if v.device != p.device:
            tangents[i] = v.to(p.device)        # a tangent follows its primal
    dual, primal = Grad("jvp_dual"), Grad("jvp_primal")
    input_cotangents: List[Optional[Tensor]] = [None] * len(primals)   # J^T u, functions of u
    with dual:                    # older than `primal`: it records primal's backward
        with primal:
            xs = _fresh_inputs(primals)
            for i, x in enumerate(xs):
                primal.wrt(x, callback=_collector(input_cotangents, i))
            result = fn(*xs)
            outs = _as_tuple("fn's outputs", "jvp", result)
            us = [_zeros_like(o) for o in outs]
            output_tangents: List[Optional[Tensor]] = [None] * len(outs)
            for j, u in enumerate(us):
                dual.wrt(u, callback=_collector(output_tangents, j))
            differentiable = [j for j, o in enumerate(outs) if o.dtype.kind in "fc"]
            primal([outs[j] for j in differentiable], [us[j] for j in differentiable])
        reached = [i for i, g in enumerate(input_cotangents) if g is not None]
        dual([input_cotangents[i] for i in reached], [tangents[i] for i in reached])
    out_tangents = tuple(_zeros_like(o) if t is None else t for o, t in zip(outs, output_tangents))
    if isinstance(result, Tensor):
        return outs[0], out_tangents[0]
    return outs, out_tangents


class _VjpFunction:
    """``vjp``'s second result: call it once with the output cotangents."""

    def __init__(self, key: Grad, xs: List[Tensor], grads: List[Optional[Tensor]], outs):
        self._key, self._xs, self._grads, self._outs = key, xs, grads, outs
        self._used = False

    def __call__(self, *cotangents: Tensor) -> Tuple[Tensor, ...]:
        if self._used:
            raise RuntimeError("gradcore.vjp: the vjp function runs once (its recording is consumed); "
                               "call gradcore.vjp again for another product")
        self._used = True
        cotangents = _as_tuple("cotangents", "vjp", cotangents[0] if len(cotangents) == 1 and
                               not isinstance(cotangents[0], Tensor) else cotangents)
        if len(cotangents) != len(self._outs):
            raise ValueError(f"gradcore.vjp: {len(cotangents)} cotangents for {len(self._outs)} outputs")
        cotangents = list(cotangents)
        for j, (o, c) in enumerate(zip(self._outs, cotangents)):
            if not isinstance(c, Tensor):
                raise TypeError(f"gradcore.vjp: cotangent {j} must be a Tensor, got {type(c).__name__}")
            if o.shape != c.shape:
                raise ValueError(f"gradcore.vjp: cotangent {j} has shape {c.shape}, output {j} {o.shape}")
            if c.device != o.device:
                # a cotangent follows its output, as GradManager.backward's dy does
                cotangents[j] = c.to(o.device)
        self._key.resume()
        try:
            self._key(list(self._outs), list(cotangents))
        finally:
            self._key.__exit__(None, None, None)
        return tuple(_zeros_like(x) if g is None else g for x, g in zip(self._xs, self._grads))


def vjp(fn: Callable[..., Tensors], *primals: Tensor) -> Tuple[Tensors, Callable[..., Tuple[Tensor, ...]]]:
    """``(fn(*primals), vjp_fn)`` where ``vjp_fn(*cotangents)`` returns one
    gradient per primal: ``J^T c``. As ``torch.func.vjp``; ``vjp_fn`` runs
    once. A ``GradManager`` recording around the call of ``vjp_fn``
    differentiates through it (second order).

    Example::

        >>> y, vjp_fn = gc.vjp(lambda x: (x * x).sum(), gc.tensor([1.0, 3.0]))
        >>> (gx,) = vjp_fn(gc.tensor(1.0))
        >>> y.item(), gx.numpy()
        (10.0, array([2., 6.], dtype=float32))
    """
    primals = _as_tuple("primals", "vjp", primals)
    key = Grad("vjp")
    grads: List[Optional[Tensor]] = [None] * len(primals)
    key.__enter__()
    try:
        xs = _fresh_inputs(primals)
        for i, x in enumerate(xs):
            key.wrt(x, callback=_collector(grads, i))
        result = fn(*xs)
        outs = _as_tuple("fn's outputs", "vjp", result)
    except BaseException:
        key.__exit__(None, None, None)      # on success the recording stays open until vjp_fn runs
        raise
    key.suppress()                  # recording stays open (for the backward) but records nothing more
    return result, _VjpFunction(key, xs, grads, outs)
