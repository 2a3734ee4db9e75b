"""gradcore.core: the low-level API under GradManager.

Example::

    >>> from gradcore.core import Grad, apply
    >>> with Grad() as g:
    ...     g.wrt(x, callback=lambda dx: print(dx))
    ...     (y,) = apply(Elemwise("mul"), x, x)
    ...     g([y], [gradcore.ones_like(y)])
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional

from ._core import (GradKey, GradRuleFallback, NotDifferentiableError, Tensor,
                    apply, register_grad_rule, registered_grad_rule, unregister_grad_rule)
from .graph import BackwardGraph, cache_info, make_backward_graph
from .op import Composite, Op, OpError, TensorDesc

__all__ = ["apply", "Grad", "GradKey", "TensorDesc", "make_backward_graph", "BackwardGraph",
           "register_grad_rule", "unregister_grad_rule", "registered_grad_rule", "GradRuleFallback", "NotDifferentiableError", "Op", "Composite",
           "OpError", "cache_info"]

_counter = itertools.count()


def _broadcasts_to(src, dst) -> bool:
    if src is None or dst is None or len(src) > len(dst):
        return False
    return all(s == d or s == 1 for s, d in zip(src[::-1], dst[::-1]))


class Grad:
    """A recording: ``wrt`` tensors, run ops, then ``g(ys, dys)``.

    Example::

        >>> with Grad() as g:
        ...     g.wrt(x, callback=grads.append)
        ...     y = x * x
        ...     g([y], [ones_like(y)])
    """

    def __init__(self, name: Optional[str] = None):
        self._key = GradKey(name or f"grad_{next(_counter)}")
        self._auto = False      # entered by wrt() rather than by `with`

    @property
    def name(self) -> str:
        return self._key.name

    def wrt(self, *tensors: Tensor, callback: Optional[Callable] = None) -> "Grad":
        if not self._key.recording and not self._auto and self._key.phase == 0:     # never entered
            # the older style `g = Grad().wrt(x)` without `with`: start
            # recording now and stop after the backward
            self._key.enter()
            self._auto = True
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"{self.name}: wrt() takes Tensors, got {type(t).__name__}")
            self._key.attach(t, callback)
        return self

    def __call__(self, ys, dys) -> None:
        if isinstance(ys, Tensor):
            ys = [ys]
        if isinstance(dys, Tensor) or not isinstance(dys, (list, tuple)):
            dys = [dys]
        ys, dys = list(ys), list(dys)
        try:
            for i, (y, dy) in enumerate(zip(ys, dys)):
                # MegEngine's Grad takes an output gradient that broadcasts to the
                # output (its own tests pass a (1,) gradient for a (2,) relu):
                # broadcast it here, so that every backward sees y's shape; one
                # that does not broadcast is left to the core's error
                if (isinstance(y, Tensor) and isinstance(dy, Tensor) and dy.shape != y.shape
                        and _broadcasts_to(dy.shape, y.shape)):
                    from .functional import broadcast_to
                    dys[i] = broadcast_to(dy, y.shape)
            self._key.backward(ys, dys)
        finally:
            if self._auto:
                self._key.exit()

    def __enter__(self) -> "Grad":
        self._key.enter()
        return self

    def __del__(self):
        # dropped while recording (``Grad().wrt(x)`` never called, or a
        # ``g.__enter__()`` without exit): no backward can run any more, but
        # the key would stay on the core's list of recording keys and record
        # every op on ``x`` for ever. End the recording, as MegEngine's
        # GradKey does when it is destroyed.
        try:
            if self._key.phase == 1:
                self._key.exit()
        except Exception:       # interpreter shutdown, or __init__ did not finish
            pass

    def __exit__(self, *exc) -> None:
        self._key.exit()

    def suppress(self):
        self._key.suppress()

    def resume(self):
        self._key.resume()
