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

import contextlib
import copy
import functools
import inspect
import os
import re
import shutil
import subprocess
import tempfile
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from . import _core
from . import devices as devmod
from ._core import GradRuleFallback, Tensor, apply
from .autodiff import GradManager
from .op import IndexOpError, Op, TensorDesc, _decomposed_cpu, describe, op_label, positional_arity

__all__ = ["gradcheck", "gradgradcheck", "GradcheckError", "numerical_grads", "analytic_grads",
           "check_op", "CheckReport", "CheckResult", "OpCheckError", "op_examples", "nvcc_path",
           "generated_cases", "op_devices", "NoInputsError", "cuda_for_checks", "check_grad_rule"]


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
        if t.dtype.kind == "f" and t.dtype.itemsize < 8:
            # central differences with eps 1e-6 are noise in float32 (gradcore.tensor's
            # default): check in float64, as the docstring asks, instead of failing falsely
            t = Tensor(np.asarray(t.numpy(), dtype=np.float64), device=t.device)
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


def numerical_grads(fn: Callable, inputs: Sequence[Tensor], weights: Sequence[np.ndarray], eps: float = 1e-6,
                    wrt: Optional[Sequence[int]] = None) -> List[Optional[np.ndarray]]:
    """Central differences of ``sum(w * fn(*inputs))`` with respect to each input.

    Example::

        >>> from gradcore.testing import numerical_grads
        >>> x = gc.tensor([3.0], dtype="float64")
        >>> [g.round(6) for g in numerical_grads(lambda x: x * x, [x], [np.ones(1)])]     # d(x^2)/dx = 6
        [array([6.])]
    """
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


def _chosen(xs, wrt) -> list:
    """The inputs to differentiate: those in ``wrt`` (default all), floating point."""
    return [x for i, x in enumerate(xs) if (wrt is None or i in wrt) and x.dtype.kind in "fc"]


def _backward_weighted(fn: Callable, xs, chosen, weights) -> None:
    """Differentiate ``sum(w * out)`` over ``fn(*xs)``'s outputs into ``chosen``'s ``.grad``."""
    gm = GradManager().attach(chosen)
    with gm:
        pairs = [(o, w) for o, w in zip(_outputs(fn(*xs)), weights) if w is not None]
        gm.backward([o for o, _ in pairs], [Tensor(w) for _, w in pairs])


def _host_grads(xs, chosen) -> List[Optional[np.ndarray]]:
    """Each chosen input's gradient as a float64 array (zeros where none came), else None."""
    return [None if not any(x is c for c in chosen)
            else np.zeros(x.shape) if x.grad is None else x.grad.numpy().astype(np.float64) for x in xs]


def analytic_grads(fn: Callable, inputs: Sequence[Tensor], weights: Sequence[np.ndarray],
                   wrt: Optional[Sequence[int]] = None) -> List[Optional[np.ndarray]]:
    """The gradients of ``sum(w * fn(*inputs))`` with respect to each input,
    computed by a GradManager (None for an input not differentiated).

    Example::

        >>> from gradcore.testing import analytic_grads
        >>> analytic_grads(lambda x: x * x, [gc.tensor([3.0], dtype="float64")], [np.ones(1)])
        [array([6.])]
    """
    xs = [x.detach() for x in inputs]
    chosen = _chosen(xs, wrt)
    _backward_weighted(fn, xs, chosen, weights)
    return _host_grads(xs, chosen)


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
                f"> atol {atol} + rtol {rtol} * |numerical|" + _swapped_hint(i, analytic, numeric, atol, rtol))


def _swapped_hint(i, analytic, numeric, atol, rtol) -> str:
    """A hint when input i's analytic gradient is another input's numerical
    one: gradients returned in the wrong order (two inputs of one shape make
    no shape error to catch it)."""
    for j, n in enumerate(numeric):
        if (j != i and n is not None and n.shape == analytic[i].shape and n.size and np.abs(n).max() > atol
                and np.allclose(analytic[i], n, atol=atol, rtol=rtol)):
            return (f"; input {i}'s analytic gradient is input {j}'s numerical one: the backward returns "
                    f"the gradients in the wrong order?")
    return ""


def gradcheck(fn: Callable, inputs: Sequence, eps: float = 1e-6, atol: float = 1e-5,
              rtol: float = 1e-3, wrt: Optional[Sequence[int]] = None, seed: int = 0,
              raise_exception: bool = True) -> bool:
    """Check ``fn``'s gradients against central finite differences.

    ``inputs`` should be float64 for a meaningful check. Raises
    GradcheckError naming the worst element (with ``raise_exception=False``,
    as PyTorch's, returns False instead); returns True otherwise.

    Example::

        >>> from gradcore.testing import gradcheck
        >>> gradcheck(F.sin, [gc.tensor(np.random.rand(4), dtype="float64")])
        True
        >>> gradcheck(lambda x: x.detach() * x, [gc.tensor([1.0, 2.0], dtype="float64")], raise_exception=False)
        False
    """
    try:
        xs = _as_tensors(inputs)
        ws = _weights(fn, xs, seed)
        a = analytic_grads(fn, xs, ws, wrt)
        n = numerical_grads(fn, xs, ws, eps, wrt)
        _compare("gradcheck", a, n, xs, atol, rtol)
    except GradcheckError:
        if raise_exception:
            raise
        return False
    return True


def _first_order_fn(fn: Callable, ws, wrt):
    """A function returning fn's weighted first-order gradients, built from
    gradcore ops so that an outer GradManager can differentiate it."""
    def grads(*xs):
        chosen = _chosen(xs, wrt)
        saved = [x.grad for x in chosen]
        for x in chosen:
            x.grad = None
        _backward_weighted(fn, xs, chosen, ws)
        res = []
        for x, old in zip(chosen, saved):
            g = x.grad
            x.grad = old
            res.append(g if g is not None else Tensor(np.zeros(x.shape, x.dtype)))
        return tuple(res)
    return grads


def gradgradcheck(fn: Callable, inputs: Sequence, eps: float = 1e-6, atol: float = 1e-5,
                  rtol: float = 1e-3, wrt: Optional[Sequence[int]] = None, seed: int = 0,
                  raise_exception: bool = True) -> bool:
    """Check second-order gradients: the gradient of fn's (weighted)
    gradient, computed with nested GradManagers, against finite differences.
    Raises GradcheckError on a mismatch, or with ``raise_exception=False``
    returns False.

    Example::

        >>> from gradcore.testing import gradgradcheck
        >>> gradgradcheck(lambda x: x * x * x, [gc.tensor([0.5, 2.0], dtype="float64")])
        True
    """
    try:
        return _gradgradcheck(fn, inputs, eps, atol, rtol, wrt, seed)
    except GradcheckError:
        if raise_exception:
            raise
        return False


def _gradgradcheck(fn, inputs, eps, atol, rtol, wrt, seed) -> bool:
    xs = _as_tensors(inputs)
    ws = _weights(fn, xs, seed)
    g = _first_order_fn(fn, ws, wrt)
    ws2 = _weights(g, xs, seed + 1)
    a = analytic_grads(g, xs, ws2, wrt)
    n = numerical_grads(g, xs, ws2, eps, wrt)
    try:
        _compare("gradgradcheck", a, n, xs, atol, rtol)
    except GradcheckError as exc:
        if any(ai is not None and ni is not None and not ai.any() and np.abs(ni).max(initial=0) > atol
               for ai, ni in zip(a, n)):
            # the commonest cause of a second order that is zero everywhere
            raise GradcheckError(
                f"{exc}. The second-order gradient is zero everywhere: a backward that computes with "
                f"NumPy (on .numpy()) instead of gradcore ops is not recorded, so it cannot be "
                f"differentiated again; write the backward with gradcore ops. A _grad_rule's (or "
                f"registered rule's) backward that reads a value its forward computed (the output y "
                f"of `y = F.tanh(x)` inside the rule) has the same effect: the rule's forward is not "
                f"recorded, so compute what the backward needs from the inputs inside it") from None
        raise
    return True


# ---------------------------------------------------------------- check_op
# Everything an op should pass, in one call: see ``check_op``.

PASSED, FAILED, SKIPPED, NOT_APPLICABLE = "passed", "failed", "skipped", "not applicable"
# "skipped": the check could not run for a reason outside the op author's
# control (no GPU and no emulator, no nvcc, not requested); "not applicable":
# the check has nothing to test for this op (not differentiable, no cuda
# kernel declared, no bad-shape variant rejected...). Neither is "passed".
CHECKS = ("forward[cpu]", "forward[cuda]", "infer", "dtype", "grad", "gradgrad", "grad[cuda]", "bad_shapes",
          "cuda_compile")


class OpCheckError(AssertionError):
    """``CheckReport.raise_on_failure``: some check of an op failed; the message is the report."""


@dataclass
class CheckResult:
    """One line of a ``CheckReport``: which op, which check, its status
    ("passed", "failed", "skipped" or "not applicable") and why.

    Example::

        >>> from gradcore.testing import CheckResult
        >>> r = CheckResult("Elemwise(mul)", "grad", "failed", "input 0: off by 0.5")
        >>> r.ok, r.status
        (False, 'failed')
    """

    op: str
    check: str
    status: str           # "passed" | "failed" | "skipped" | "not applicable"
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status != FAILED


@dataclass
class CheckReport:
    """The outcome of ``check_op``: one ``CheckResult`` per (op, check).

    ``ok`` is False when any check failed (skipped and not-applicable
    checks do not fail; ``passed`` tells whether anything was tested);
    ``raise_on_failure()`` raises ``OpCheckError`` with the table.

    Example::

        >>> from gradcore.testing import check_op
        >>> from gradcore.functional import Elemwise
        >>> report = check_op(Elemwise("mul"), np.ones((2, 3)), np.full(3, 2.0), devices=["cpu"])
        >>> report.ok, report.results[0].check, report.results[0].status
        (True, 'forward[cpu]', 'passed')
    """
    results: List[CheckResult] = field(default_factory=list)
    instances: List[str] = field(default_factory=list)    # the ops checked, parameters included

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def _with(self, status: str) -> List[CheckResult]:
        return [r for r in self.results if r.status == status]

    failed = property(lambda self: self._with(FAILED))
    skipped = property(lambda self: self._with(SKIPPED))
    passed = property(lambda self: self._with(PASSED))
    not_applicable = property(lambda self: self._with(NOT_APPLICABLE))

    def __getitem__(self, check: str) -> CheckResult:
        """The (first) result of the check named ``check``."""
        for r in self.results:
            if r.check == check:
                return r
        raise KeyError(check)

    def status(self, check: str) -> str:
        return self[check].status

    def extend(self, other: "CheckReport") -> "CheckReport":
        self.results.extend(other.results)
        self.instances.extend(other.instances)
        return self

    def table(self) -> str:
        rows = [(r.op, r.check, r.status + (f": {r.message}" if r.message else "")) for r in self.results]
        w0 = max([len(r[0]) for r in rows] + [2])
        w1 = max([len(r[1]) for r in rows] + [5])
        lines = [f"{'op':<{w0}} | {'check':<{w1}} | status"]
        lines += [f"{a:<{w0}} | {b:<{w1}} | {c}" for a, b, c in rows]
        if len(self.instances) > 1:
            lines.append("checked at: " + ", ".join(self.instances))
        return "\n".join(lines)

    def __str__(self):
        head = "all checks passed" if self.ok else f"{len(self.failed)} check(s) failed"
        return f"{head}\n{self.table()}"

    def raise_on_failure(self) -> "CheckReport":
        if not self.ok:
            raise OpCheckError(str(self))
        return self


def _op_short_name(op) -> str:
    cls = op if isinstance(op, type) else type(op)
    return getattr(cls, "name", "") or cls.__name__


def op_examples(op_or_cls: Any) -> List[tuple]:
    """The op's own sample inputs: ``examples()`` (a classmethod, method or
    attribute) as a list of ``(op_instance, [arrays])`` or
    ``(op_instance, [arrays], wrt)``; [] when the op has none.

    Example::

        >>> from gradcore.testing import op_examples
        >>> from gradcore.functional import Elemwise
        >>> [(op, [a.shape for a in arrays]) for op, arrays, wrt in op_examples(Elemwise("mul"))]
        [(Elemwise(mul), [(2, 3), (3,)]), (Elemwise(add), [(3, 1), (1, 2)]), (Elemwise(tanh), [(4,)])]
    """
    ex = getattr(op_or_cls, "examples", None)
    if ex is None:
        return []
    if callable(ex):
        ex = ex()
    out = []
    for item in ex or ():
        item = tuple(item)
        if len(item) not in (2, 3):
            raise TypeError(f"{_op_short_name(op_or_cls)}.examples(): each item must be "
                            f"(op, [inputs]) or (op, [inputs], wrt), got {item!r}")
        _check_example_arity(op_or_cls, len(out), item[0], len(item[1]))
        out.append(item if len(item) == 3 else item + (None,))
    return out


def _check_example_arity(op_or_cls, k: int, inst, n: int) -> None:
    """Example ``k`` gives ``n`` inputs to ``inst``: refused with the count
    the op takes (else every check fails with a TypeError from deep inside)."""
    nin = getattr(inst, "nin", None)
    if isinstance(nin, int) and nin >= 0:
        lo, hi, where = nin, nin, "its nin"
    else:
        arity = describe(type(inst)).arity
        if arity is None:
            return
        where, (lo, hi) = f"its {arity[0]}()", arity[1]
    if n < lo or (hi is not None and n > hi):
        takes = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi is not None else f"at least {lo}"
        raise NoInputsError(f"{_op_short_name(op_or_cls)}.examples(): example {k} gives {n} input(s) to "
                            f"{op_label(inst)}, which takes {takes} (from {where})")


def _to_array(x) -> np.ndarray:
    return np.array(x.numpy() if isinstance(x, Tensor) else x)


def _cast(arrays, dtype):
    return [a.astype(dtype) if a.dtype.kind == "f" else a for a in arrays]


def _run(op, arrays, device="cpu", modified=None, out_devices=None, overruns=None):
    """The op's outputs on ``arrays`` (host arrays). ``modified``: a list
    that receives the index of each input the kernel changed;
    ``out_devices``: one that receives each output's device; ``overruns``
    (cuda): one that receives a description of each array a kernel wrote
    past the end of (seen on the host emulator, whose arrays end in guard
    bands)."""
    with _guarded(device, overruns) as named:
        xs = [Tensor(a) if device == "cpu" else Tensor(a, device=device) for a in arrays]
        results = apply(op, *xs)
        named += [(f"input {i}", x) for i, x in enumerate(xs)] + [(f"output {j}", o) for j, o in enumerate(results)]
        if out_devices is not None:
            out_devices += [str(o._device) for o in results]      # gradcore's name ("cuda"), not MegEngine's
        outs = [np.asarray(o.numpy()) for o in results]
    if modified is not None:
        modified += [i for i, (x, a) in enumerate(zip(xs, arrays))
                     if not np.array_equal(np.asarray(x.numpy()), a, equal_nan=a.dtype.kind in "fc")]
    return outs


@contextlib.contextmanager
def _guarded(device, overruns):
    """Within, on the cuda host emulator with ``overruns`` given, new device
    arrays end in guard bands; after, ``overruns`` receives one line per
    array whose band a kernel wrote, naming it by the (name, tensor) pairs
    the caller added to the yielded list."""
    named: List[tuple] = []
    if device != "cuda" or overruns is None:
        yield named
        return
    from .cuda import runtime
    from .cuda.memory import guarded_writes
    with guarded_writes(runtime.backend()) as guard:
        yield named
        damaged = guard.damaged() if guard is not None else []
    where = {}
    for name, t in named:
        try:
            where[t.__cuda_array_interface__["data"][0]] = f"{name} ({t.shape}, {t.dtype})"
        except AttributeError:          # an output the kernel left on the host
            pass
    for ptr, nbytes, past in damaged:
        overruns.append(f"a kernel wrote past the end of {where.get(ptr, 'a temporary array')}: {nbytes} bytes, "
                        f"written at byte {nbytes + past}; an index check such as `i < n` is missing or off by one")


def _compare_with_cpu(check, what, got, ref, exact=False):
    """Fail ``check`` for each array computed on cuda (``got``) that is not
    the cpu's (``ref``; None: nothing to compare) within float32 tolerance
    (``exact``: float64's, for results computed in double)."""
    rtol, atol = (1e-6, 1e-8) if exact else (1e-4, 1e-5)
    for j, (g, r) in enumerate(zip(got, ref)):
        if r is None:
            continue
        if g.shape != r.shape or g.dtype != r.dtype:
            check.failed(f"{what} {j}: cuda gives {g.shape} {g.dtype}, cpu {r.shape} {r.dtype}")
        elif not np.allclose(g, r, rtol=rtol, atol=atol, equal_nan=True):
            check.failed(f"{what} {j}: cuda and cpu values differ by up to "
                         f"{np.max(np.abs(g.astype(np.float64) - r)):.3g}")


def _nondeterminism(op, variant, outs) -> str:
    """"" when a second run on the same inputs reproduces ``outs``, else
    what differs: a random kernel, or one keeping state between calls,
    otherwise surfaces as a float32/float64 disagreement and gradients off
    by orders of magnitude, which point away from the cause."""
    if outs is None:
        return ""
    dt, arrays = variant
    return _rerun_problem(op, arrays, outs, arrays, f"{dt} inputs: two runs on the same inputs",
                          "the kernel is not deterministic (random numbers, or state kept between calls); values "
                          "and gradients cannot be checked, and gradcore caches what an op computes by its "
                          "parameters and inputs: take the randomness as an input (a mask, or a seed parameter)")


def _rerun_problem(op, arrays, outs, inputs, what: str, cause: str) -> str:
    """"" when the op gives its outputs ``outs`` (of ``arrays``) again for
    ``inputs`` (the same values), else a message: ``what`` says how it was
    run again, ``cause`` what a difference means."""
    try:
        again = _run(op, inputs)
    except Exception as exc:
        return f"{what}: the kernel fails ({_fmt_exc(exc)}), the first run did not"
    differs = _first_difference(arrays, outs, again)
    return f"{what} give different {differs}: {cause}" if differs else ""


def _first_difference(arrays, outs, again) -> str:
    """"" when ``again`` gives the outputs ``outs`` (computed from
    ``arrays``) up to float rounding, else which output differs and by how
    much. Rounding of a sum taken in another order (atomicAdd, a threaded
    reduction) is ulps of the summands, which may be far above a sum that
    cancels: tolerated up to 1e-9 of the largest input or output (random
    numbers, kept state and a misread memory layout differ by far more)."""
    scale = max([float(np.max(np.abs(x))) for x in list(arrays) + list(outs)
                 if x.dtype.kind in "fc" and x.size and np.all(np.isfinite(x))] + [1e-300])
    for j, (a, b) in enumerate(zip(outs, again)):
        same = (a.shape == b.shape and (np.allclose(a, b, rtol=1e-9, atol=1e-9 * scale, equal_nan=True)
                                        if a.dtype.kind in "fc" else np.array_equal(a, b)))
        if not same:
            by = (f" by up to {np.max(np.abs(a.astype(np.float64) - b)):.3g}"
                  if a.shape == b.shape and a.dtype.kind in "fc" and a.size else "")
            return f"output {j}{by}"
    return ""


def _strided(a: np.ndarray) -> np.ndarray:
    """``a``'s values in another memory layout: Fortran order (a transposed
    tensor's), or a strided view for one axis; ``a`` itself when no other
    layout exists (fewer than two elements)."""
    if a.size < 2:
        return a
    if a.ndim >= 2:
        return np.asfortranarray(a)
    return np.repeat(a, 2, axis=0)[::2] if a.ndim == 1 else a


def _layout_problem(op, variant, outs) -> str:
    """"" when the cpu kernel gives ``outs`` for its inputs in another
    memory layout too (it receives a tensor's array as it is, a transposed
    one included), else what differs."""
    if outs is None:
        return ""
    dt, arrays = variant
    other = [_strided(a) for a in arrays]
    if all(o is a for o, a in zip(other, arrays)):
        return ""
    return _rerun_problem(op, arrays, outs, other,
                          f"{dt} inputs in Fortran order or strided (a transposed or sliced tensor's layout)",
                          "the kernel reads the inputs' memory as if C-contiguous; a cpu kernel gets a tensor's "
                          "array with its strides: call np.ascontiguousarray(x) before handing the buffer to C, "
                          "ctypes or np.frombuffer")


def _compare_with_decomposition(check, op, tag, variant, outs) -> None:
    """An op with kernels and a ``decompose`` (its reference definition,
    while its gradient comes from its ``vjp``): fail ``check`` where the
    cpu kernel's results are not the decomposition's."""
    desc = describe(op)
    if outs is None or desc.kernels.get("cpu") != "cpu" or getattr(type(op), "decompose", None) is None:
        return
    dt, arrs = variant
    try:
        ref = _decomposed_cpu(op, *arrs)
    except Exception as exc:
        check.failed(f"{tag}{dt} inputs: its decompose (the op's reference definition) raised {_fmt_exc(exc)}")
        return
    ref = ref if isinstance(ref, tuple) else (ref,)
    for j, (o, r) in enumerate(zip(outs, ref)):
        r = np.asarray(r)
        if o.shape != r.shape:
            check.failed(f"{tag}{dt} inputs: output {j}: the cpu kernel gives shape {o.shape}, its decompose "
                         f"(the op's reference definition) {r.shape}")
        elif o.dtype.kind == "f" and not np.allclose(o, r, rtol=1e-6, atol=1e-9, equal_nan=True):
            err = np.max(np.abs(o.astype(np.float64) - r)) if o.size else 0.0
            check.failed(f"{tag}{dt} inputs: output {j}: the cpu kernel and its decompose (the op's reference "
                         f"definition) differ by up to {err:.3g}; fix the one that is wrong")


def _device_grads(op, arrays, weights, wrt, device, overruns=None):
    """First-order gradients of ``sum(op(*arrays) * weights)`` computed on
    ``device``, as float64 host arrays (None for inputs not in ``wrt``);
    ``overruns`` as ``_run``'s."""
    with _guarded(device, overruns) as named:
        xs = [Tensor(a, device=device) for a in arrays]
        chosen = [xs[i] for i in wrt]
        _backward_weighted(_apply_fn(op), xs, chosen, weights)
        named += [(f"the gradient of input {i}", xs[i].grad) for i in wrt if xs[i].grad is not None]
        grads = _host_grads(xs, chosen)
    return grads


@functools.lru_cache(maxsize=None)
def nvcc_path() -> Optional[str]:
    """nvcc on PATH, or under $CUDA_HOME / /usr/local/cuda; None when absent."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    return None


@functools.lru_cache(maxsize=256)
def _nvcc_compile(source: str) -> Optional[str]:
    """None when ``source`` compiles to PTX, else nvcc's error output."""
    with tempfile.TemporaryDirectory(prefix="gradcore-nvcc-") as d:
        src = os.path.join(d, "op.cu")
        with open(src, "w") as fh:
            fh.write(source)
        try:
            # the bare file name, run in the folder: the log names no temporary path
            out = subprocess.run([nvcc_path(), "--ptx", "-o", "op.ptx", "op.cu"],
                                 capture_output=True, text=True, timeout=300, cwd=d)
        except subprocess.TimeoutExpired:
            return "nvcc timed out after 300 s"
        if out.returncode != 0:
            return (out.stderr or out.stdout)[-2000:]
    return None


def _cuda_sources(op, dtypes) -> List[tuple]:
    src = getattr(op, "cuda_source", None)
    if isinstance(src, str):
        return [("", src)]
    if not callable(src):
        return []
    try:
        params = [p for p in inspect.signature(src).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = [None]
    if not params:
        return [("", src())]
    ctypes = {np.dtype("float32"): "float", np.dtype("float64"): "double"}
    names = [ctypes[d] for d in dtypes if d in ctypes] or ["float"]
    return [(c, src(c)) for c in dict.fromkeys(names)]


class _Check:
    """Accumulates one check's outcome over several samples."""

    def __init__(self, report, label, check):
        self.report, self.label, self.check = report, label, check
        self.fail: List[str] = []
        self.skip: List[str] = []
        self.na: List[str] = []
        self.notes: List[str] = []
        self.ran = False
        self.rejected = self.accepted = 0     # bad_shapes: variants rejected / accepted

    def passed(self, note=""):
        self.ran = True
        if note and note not in self.notes:
            self.notes.append(note)

    def failed(self, msg):
        self.fail.append(msg)

    def skipped(self, reason):
        """Could not run, for a reason outside the op author's control."""
        if reason not in self.skip:
            self.skip.append(reason)

    def not_applicable(self, reason):
        """Nothing to test here for this op (reported as such, never as passed)."""
        if reason not in self.na:
            self.na.append(reason)

    def close(self):
        if self.rejected or self.accepted:
            self.notes.append(f"{self.rejected} bad-shape variant(s) rejected naming the op, "
                              f"{self.accepted} accepted by infer and kernel alike")
            if not self.rejected:
                # accepting every variant tests nothing: not a pass
                self.ran = False
                self.na.append("; ".join(self.notes))
        if self.fail:
            res = CheckResult(self.label, self.check, FAILED, _compact_failures(self.fail))
        elif self.ran:
            # what some instances could not check stays visible beside the pass
            res = CheckResult(self.label, self.check, PASSED, "; ".join(
                self.notes + [f"not checked: {r}" for r in self.na]))
        elif self.skip:
            res = CheckResult(self.label, self.check, SKIPPED, "; ".join(self.skip))
        else:
            res = CheckResult(self.label, self.check, NOT_APPLICABLE, "; ".join(self.na) or "nothing to test")
        self.report.results.append(res)


_SHOWN_FAILURES = 4      # distinct failures a check's message quotes in full


def _compact_failures(fails: List[str]) -> str:
    """A check's failures for its message: each distinct one once (those
    that differ only in the ``[instance; inputs]`` they came from are one,
    with a count), the first few in full, then how many more: one mistake
    repeated over every instance and input shape is one line, not dozens.

    Example::

        >>> _compact_failures(["[A(p=1.0); shapes (2,)] x wrong", "[A(p=2.0); shapes (2,)] x wrong"])
        '[A(p=1.0); shapes (2,)] x wrong (and 1 more like it)'
    """
    groups: Dict[str, list] = {}
    for msg in fails:
        m = re.match(r"\[[^\]]*\] (.*)", msg, re.S)
        entry = groups.setdefault(m.group(1) if m else msg, [msg, 0])
        entry[1] += 1
    shown = [msg + (f" (and {n - 1} more like it)" if n > 1 else "")
             for msg, n in list(groups.values())[:_SHOWN_FAILURES]]
    rest = sum(n for _, n in list(groups.values())[_SHOWN_FAILURES:])
    if rest:
        shown.append(f"... and {rest} more failure(s) of this check on other instances or inputs")
    return "; ".join(shown)


def op_devices(op: Any) -> List[str]:
    """The devices of an op (its description's: declared, else those it has
    kernels for).

    Example::

        >>> from gradcore.testing import op_devices
        >>> from gradcore.functional import Elemwise
        >>> op_devices(Elemwise("mul"))
        ['cpu', 'cuda']
    """
    return list(describe(op).devices)


def _fmt_exc(exc) -> str:
    return f"{type(exc).__name__}: {exc}"


def _bad_shape_variants(arrays):
    """(description, arrays) with one input given an extra or a mismatched dimension."""
    for i, a in enumerate(arrays):
        if a.dtype.kind not in "fc":
            continue
        yield f"input {i} with an extra dimension {(2,) + a.shape}", \
            arrays[:i] + [np.ones((2,) + a.shape, a.dtype) * 0.5] + arrays[i + 1:]
        if a.ndim:
            shp = a.shape[:-1] + (a.shape[-1] + 3,)
            yield f"input {i} with a mismatched last dimension {shp}", \
                arrays[:i] + [np.full(shp, 0.5, a.dtype)] + arrays[i + 1:]


def check_op(op: Any, *sample_inputs, devices: Optional[Sequence[str]] = None, atol: float = 1e-5,
             rtol: float = 1e-3, eps: float = 1e-6, wrt: Optional[Sequence[int]] = None,
             second_order: bool = True, compile_cuda: bool = True, seed: int = 0) -> CheckReport:
    """Run every check an op should pass and return a ``CheckReport``:

    - ``forward[cpu]`` / ``forward[cuda]``: the op runs through ``apply`` on
      each device (cuda only when ``gradcore.devices.is_cuda_available()``,
      else skipped with the reason); float32 results agree with the float64
      ones, cuda results with cpu;
    - ``infer``: ``op.infer`` gives the number, shapes and dtypes of the
      outputs the kernel actually returns;
    - ``dtype``: float32 in gives float32 out, float64 stays float64 (unless
      ``infer`` declares otherwise, as ``Cast`` does);
    - ``grad`` / ``gradgrad``: first and second order gradients against
      float64 central finite differences (the samples are cast to float64);
    - ``grad[cuda]``: first order gradients computed on cuda agree with the
      cpu's (float32), when the forward ran on cuda. Without a GPU,
      ``GRADCORE_CUDA=emulator`` runs the op's CUDA kernels on the host;
    - ``bad_shapes``: inputs with an extra or a mismatched dimension are
      either accepted consistently by ``infer`` and the kernel, or rejected
      with an error that names the op;
    - ``cuda_compile``: ``cuda_source`` compiles with nvcc (when both exist).

    ``op`` is an op instance or class. Without ``sample_inputs`` the op's
    ``examples()`` are used (every example for a class, the equal ones for
    an instance), and without those, inputs generated from the op's
    declaration (``generated_cases``, from ``seed``; the seed and shapes are
    in every failure message). When none can be built, the report has a
    failed ``inputs`` check saying what to add. Checks run on the devices
    the op declares (``op_devices``); a check with nothing to test is
    "not applicable", one that could not run is "skipped" with the reason. ``wrt``: input indices to differentiate (default: every
    floating input not listed in ``op.shape_only_inputs``).

    Example::

        >>> from gradcore.testing import check_op
        >>> from gradcore.functional import Elemwise
        >>> rng = np.random.default_rng(0)
        >>> report = check_op(Elemwise("mul"), rng.random((2, 3)), rng.random(3), devices=["cpu"])
        >>> report.ok
        True
    """
    # what register_op would refuse fails the report, beside the checks that still run
    declared = _declaration_problem(op)
    first = [CheckResult(_op_short_name(op), "declaration", FAILED, declared)] if declared else []
    try:
        cases = _cases_for(op, sample_inputs, wrt, seed)
    except NoInputsError as exc:
        return CheckReport(first + [CheckResult(_op_short_name(op), "inputs", FAILED, str(exc))])
    label = op_label(cases[0][0]) if len(cases) == 1 else _op_short_name(op)
    report = CheckReport(first, instances=list(dict.fromkeys(op_label(c[0]) for c in cases)))
    checks = {c: _Check(report, label, c) for c in CHECKS}
    wanted = list(devices) if devices is not None else ["cpu", "cuda"]
    many = len(cases) > 1
    for k, (inst, arrays, case_wrt, origin) in enumerate(cases):
        where = "; ".join(x for x in ((op_label(inst) if many else ""), origin) if x)
        tag = f"[{where}] " if where else ""
        _check_case(inst, arrays, case_wrt, tag, checks, wanted, atol, rtol, eps, second_order, compile_cuda)
    for c in CHECKS:
        checks[c].close()
    return report


def _declaration_problem(op) -> str:
    """What ``register_op`` would refuse in the op's class (a misspelt
    ``vpj``, a parameter stored as ``self._k``, one named like a protocol
    member...), or "": ``check_op`` holds an op it is given unregistered to
    the same declaration rules, so that it never passes one that cannot be
    registered or silently misses its gradient."""
    from .registry import OpDeclarationError, validate_op_class
    cls = op if isinstance(op, type) else type(op)
    if not (isinstance(cls, type) and issubclass(cls, Op)):
        return ""
    try:
        validate_op_class(cls)
    except OpDeclarationError as exc:
        return str(exc)
    return ""


def _cases_for(op, sample_inputs, wrt, seed=0):
    """(op instance, [arrays], wrt, where the inputs came from) per case:
    the given samples, else the op's examples(), else generated ones."""
    if sample_inputs:
        inst = op() if isinstance(op, type) else op
        return [(inst, [_to_array(x) for x in sample_inputs], wrt, "")]
    examples = op_examples(op)
    if not isinstance(op, type):
        same = [e for e in examples if e[0] == op]
        examples = same or [(op,) + tuple(e[1:]) for e in examples[:1]]
    if examples:
        cases = [(e[0], [_to_array(x) for x in e[1]], wrt if wrt is not None else e[2], "") for e in examples]
        return cases + _other_parameters(op, cases, seed)
    return [(inst, arrays, wrt, f"generated inputs, seed {seed}, shapes "
                                f"{', '.join(str(a.shape) for a in arrays)}")
            for inst, arrays in generated_cases(op, seed)]


def _other_parameters(op, cases, seed) -> list:
    """For a class whose examples() build it with its defaults only (and no
    ``check_params``): the first example's inputs again for the instances
    ``check_op`` derives from the defaults, those the op's infer accepts
    them for (a gradient right only at the default must not pass)."""
    if not isinstance(op, type) or describe(op).check["check_params"] or not describe(op).params:
        return []
    try:
        default = op()
        derived = _instances_for(op, seed)
    except Exception:          # no argument-free constructor, a string without Literal: examples only
        return []
    if any(c[0] != default for c in cases):
        return []              # the examples choose their parameters themselves
    inst0, arrays, case_wrt, _ = cases[0]
    extra = []
    for inst in derived:
        if inst == default:
            continue
        try:
            inst.infer(*[TensorDesc(a.shape, a.dtype, "cpu") for a in arrays])
        except Exception:
            continue
        extra.append((inst, arrays, case_wrt, f"example 0's inputs, parameters derived from the defaults "
                                              f"(seed {seed})"))
    return extra


class NoInputsError(ValueError):
    """check_op could not build sample inputs for an op; the message says what to add."""


class UncheckedParameters(NoInputsError):
    """check_op would check a parameter at its default value only; the message says what to declare."""


# shapes tried for generated inputs, per input count: plain, broadcasting,
# matrix-like, rank 4 (images), and 0-size; the op's infer picks those it accepts
_SHAPES = {
    0: [()],             # an op without inputs (a constant, a table): its one call
    1: [((2, 3),), ((4,),), ((2, 3, 4),), ((1, 2, 5, 5),), ((0, 3),)],
    2: [((2, 3), (2, 3)), ((2, 3), (3,)), ((3, 1), (1, 4)), ((3, 4), (4, 2)),
        ((1, 2, 5, 5), (3, 2, 3, 3)), ((0, 3), (0, 3)), ((0, 3), (3, 2))],
    3: [((2, 3), (2, 3), (2, 3)), ((2, 3), (3,), (2, 1)), ((0, 3), (0, 3), (0, 3))],
}
_DEFAULT_DOMAIN = (-1.5, 1.5)


def _forward_arity(cls) -> tuple:
    arity = describe(cls).arity
    if arity is None:
        fn = getattr(cls, "infer", None) or getattr(cls, "cpu", None)
        variadic = fn is not None and (positional_arity(fn) or (0, 0))[1] is None
        # a variadic op (concat-like, *xs) is checked with several inputs too:
        # with one its gradient's split is never exercised
        return (1, 3) if variadic else (1, 2)
    lo, hi = arity[1]
    if hi == 0:            # an op that takes no inputs at all
        return (0, 0)
    return (max(lo, 1), hi)


def _check_params_instance(cls, i: int, p) -> Any:
    """The op ``check_params[i]`` builds; an entry that is not constructor
    arguments, or that the constructor refuses, is a ``NoInputsError``
    naming the op and the entry (the other entries would otherwise go
    unchecked behind a bare TypeError from deep inside check_op)."""
    where = f"check_op({_op_short_name(cls)}): check_params[{i}] = {p!r}"
    if not isinstance(p, (dict, tuple)):
        raise NoInputsError(f"{where} is a {type(p).__name__}; each entry is a dict of constructor arguments "
                            f"(or a tuple of positional ones): check_params = [{{'k': 2.0}}, ...]")
    p = copy.deepcopy(p)      # a constructor that changes its arguments must not change the class's list
    try:
        return cls(*p) if isinstance(p, tuple) else cls(**p)
    except Exception as exc:
        raise NoInputsError(f"{where}: the constructor refuses it ({type(exc).__name__}: {exc}); "
                            f"list only parameter values the op accepts (a value the op must refuse "
                            f"belongs in a test of its own)") from None


def _instances_for(op, seed: int = 0) -> List:
    """The instances ``check_op`` checks: ``op`` itself; for a class, one
    per ``check_params`` entry, else the class built with its defaults and,
    for each numeric parameter, with two more values drawn from ``seed``,
    for each bool parameter with its other value, for each parameter
    annotated ``typing.Literal[...]`` with each of its other values (a
    gradient right only at the default must not pass). A parameter of
    another kind with a default (a string without ``Literal``) is an
    ``UncheckedParameters`` error: nothing would check its other values."""
    if not isinstance(op, type):
        return [op]
    desc = describe(op)
    params = desc.check["check_params"]
    if params:
        if not isinstance(params, (list, tuple)):
            raise NoInputsError(f"check_op({_op_short_name(op)}): check_params is a {type(params).__name__}; "
                                f"it is a list of constructor arguments: check_params = [{{'k': 2.0}}, ...]")
        return [_check_params_instance(op, i, p) for i, p in enumerate(params)]
    choices = desc.choices()
    hints = _init_hints(op)
    unchecked = []
    try:
        insts = [op()]
    except TypeError as exc:
        raise NoInputsError(
            f"check_op({_op_short_name(op)}): cannot construct the op with its defaults ({exc}); "
            f"add a class attribute check_params = [{{...constructor arguments...}}, ...] or a "
            f"classmethod examples() returning [(op_instance, [input arrays]), ...]") from None
    rng = np.random.default_rng(seed)
    for name, default in desc.params:
        if name in choices:
            values = [c for c in choices[name] if c != default]
        else:
            values = _other_values(default, hints.get(name), rng)
        if values is None:
            if _needs_values(default):
                unchecked.append(f"{name}={default!r}")
            continue               # objects: no value to try from the declaration
        for value in values:
            try:
                inst = op(**{name: value})
            except Exception:
                continue               # a value the constructor refuses: not a parameter to vary
            if inst not in insts:
                insts.append(inst)
    if unchecked:
        raise UncheckedParameters(
            f"check_op({_op_short_name(op)}): the parameter(s) {', '.join(unchecked)} would be checked at "
            f"the default only (a gradient wrong for another value would pass): check_op derives other values "
            f"for numbers, bools, tuples of numbers and parameters annotated `typing.Literal[...]` or "
            f"`Optional[float]`/`Optional[int]`; annotate each (`{unchecked[0].split('=')[0]}: "
            f"typing.Literal[...] = ...` in __init__), or list the instances to check in "
            f"check_params = [{{...}}, ...] or examples()")
    return insts


def _init_hints(cls) -> dict:
    """The constructor's resolved annotations ({} when they do not resolve)."""
    try:
        return typing.get_type_hints(cls.__init__)
    except Exception:
        return {}


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _other_values(default, hint, rng) -> Optional[list]:
    """Two values (one for a bool) to check a parameter at besides its
    default, drawn from ``rng``; None when its kind gives none to derive. A
    tuple (or list) of numbers, kernel sizes or coefficients, is varied
    element by element, and one of floats also one element longer; None is
    varied when annotated
    ``Optional[float]``, ``Optional[int]`` or ``Optional[bool]``."""
    if isinstance(default, (bool, np.bool_)):
        return [not default]                  # a flag: its other value
    if isinstance(default, (int, np.integer)):
        return [int(default) + int(rng.integers(1, 4)) for _ in range(2)]
    if isinstance(default, (float, np.floating)):
        return [round(float(default) * rng.uniform(0.3, 1.7) + rng.uniform(0.2, 1.0), 3) for _ in range(2)]
    if isinstance(default, (tuple, list)) and default and all(_is_number(v) for v in default):
        values = [type(default)(_other_values(v, None, rng)[0] for v in default) for _ in range(2)]
        if any(isinstance(v, (float, np.floating)) for v in default):
            # coefficients, weights: their count may matter too (a polynomial's degree)
            values.append(type(default)(list(values[0]) + [_other_values(1.0, None, rng)[0]]))
        return values
    if default is None and hint is not None:
        base = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) is typing.Union and len(base) == 1:
            if typing.get_origin(base[0]) is typing.Literal:
                return list(typing.get_args(base[0]))
            sample = {float: 1.0, int: 1, bool: False}.get(base[0])
            if sample is not None:
                return ([True] if base[0] is bool else []) + _other_values(sample, None, rng)
    return None


def _needs_values(default) -> bool:
    """A default whose other values check_op cannot derive, so that it would
    be checked at the default only: a string, None, a dtype, a tuple that is
    not of numbers (other objects, a callable say, are left to examples())."""
    return isinstance(default, (str, np.dtype, tuple, list)) or default is None


def _sample(rng, shape, domain):
    """Uniform values in ``domain``, kept 0.05 away from integers and the
    domain's ends: away from the kinks of relu, abs, floor, max/min ties..."""
    lo, hi = domain
    margin = 0.05 * (hi - lo)
    x = rng.uniform(lo + margin, hi - margin, shape)
    near = np.abs(x - np.round(x)) < 0.05
    # moved towards the middle: still inside the domain, and no two equal (a sort's ties)
    return np.where(near, x + np.where(x > (lo + hi) / 2, -0.1, 0.1), x)


def generated_cases(op: Any, seed: int = 0) -> List[tuple]:
    """Sample inputs built from an op's declaration when it gives no
    ``examples()``: ``(op_instance, [float64 arrays])`` per case.

    For each instance (``op`` itself, the class's ``check_params``, or the
    class constructed with its defaults) and input count (from ``infer`` /
    ``cpu``), shapes are tried from a fixed list (plain, broadcasting,
    matrix-like, rank 4, 0-size; or the op's ``check_shapes`` hint) and kept
    when ``infer`` and the kernel accept them: up to three non-empty shape
    sets and one 0-size set. Values are uniform in the op's ``domain`` hint
    (default (-1.5, 1.5)), away from integers, from ``seed``.

    Example::

        >>> from gradcore.testing import generated_cases
        >>> from gradcore.functional import Softmax
        >>> cases = generated_cases(Softmax)
        >>> [(op, [a.shape for a in arrays]) for op, arrays in cases[:2]]
        [(Softmax(axis=-1), [(2, 3)]), (Softmax(axis=-1), [(4,)])]
    """
    cls = op if isinstance(op, type) else type(op)
    rng = np.random.default_rng(seed)
    domain = tuple(describe(cls).check["domain"] or _DEFAULT_DOMAIN)
    cases, tried, first_error = [], [], None
    insts = _instances_for(op, seed)
    # the instances asked for (op itself, check_params, else the defaults)
    # must get inputs; one derived from the defaults whose values infer
    # refuses every shape for is left out (and not listed as checked)
    asked = len(insts) if not isinstance(op, type) or describe(cls).check["check_params"] else 1
    unreached = []
    for k, inst in enumerate(insts):
        nin = getattr(inst, "nin", None)
        lo, hi = (nin, nin) if isinstance(nin, int) and nin >= 0 else _forward_arity(cls)
        hint = getattr(inst, "check_shapes", None)
        candidates = [tuple(tuple(s) for s in c) for c in hint] if hint else \
            [c for n in range(lo, hi + 1) for c in _SHAPES.get(n, [])]
        full, empty = [], []
        for shapes in candidates:
            is_empty = any(0 in s for s in shapes)
            # up to three sets of the first input count, two of each further
            # one (an optional input, a variadic op's longer lists)
            same = sum(len(a) == len(shapes) for _, a in full)
            if (is_empty and empty) or (not is_empty and (len(full) >= 3 and same >= 2 or same >= 3)):
                continue
            try:
                inst.infer(*[TensorDesc(s, "float64", "cpu") for s in shapes])
                arrays = [_sample(rng, s, domain) for s in shapes]
                _run(inst, arrays)
            except Exception as exc:
                tried.append(f"{shapes}: {type(exc).__name__}")
                first_error = first_error or exc
                continue
            (empty if is_empty else full).append((inst, arrays))
        if not full:           # a 0-size input alone checks no value and no gradient
            if k < asked:
                unreached.append(op_label(inst))
            continue
        cases += full + empty
    if unreached or not cases:
        raise NoInputsError(
            f"check_op({_op_short_name(op)}): no examples() and no generated input with elements was accepted"
            + (f" for {', '.join(unreached)}" if unreached and cases else "") +
            f" (tried shapes {'; '.join(tried[:6])}"
            + (f"; the first: {_fmt_exc(first_error)[:400]}" if first_error is not None else "") + "); "
            f"if that error is the op's own, fix it; else add a classmethod examples() returning "
            f"[(op_instance, [input arrays]), ...], or narrow the generated inputs with the class "
            f"attributes check_shapes = [(shape, ...), ...] and domain = (low, high)")
    return cases


def _check_case(op, arrays, wrt, tag, checks, devices, atol, rtol, eps, second_order, compile_cuda):
    name = _op_short_name(op)
    a32, a64 = _cast(arrays, np.float32), _cast(arrays, np.float64)
    has_float = any(a.dtype.kind == "f" for a in arrays)
    # the dtypes the forward runs in: both float precisions, or the inputs as given
    variants = (("float64", a64), ("float32", a32)) if has_float else (("input", arrays),)

    # ---- forward, cpu
    outs = {}
    c = checks["forward[cpu]"]
    declared = op_devices(op)
    if "cpu" not in declared:
        c.not_applicable("the op declares no cpu kernel")
    elif "cpu" not in devices:
        c.skipped("not requested")
    else:
        for dt, arrs in variants:
            modified = []
            try:
                outs[dt] = _run(op, arrs, modified=modified)
            except Exception as exc:
                c.failed(f"{tag}{dt} inputs: {_fmt_exc(exc)}")
            for i in modified:
                c.failed(f"{tag}{dt} inputs: the cpu kernel changed input {i} (shape {arrs[i].shape}) in "
                         f"place; a kernel must not write its inputs (the caller's tensor changes): "
                         f"compute into a new array")
        varying = _nondeterminism(op, variants[0], outs.get(variants[0][0]))
        if varying:
            c.failed(f"{tag}{varying}")
        elif layout := _layout_problem(op, variants[0], outs.get(variants[0][0])):
            c.failed(f"{tag}{layout}")
        elif "float64" in outs and "float32" in outs:
            for j, (o32, o64) in enumerate(zip(outs["float32"], outs["float64"])):
                if o32.shape != o64.shape:
                    c.failed(f"{tag}output {j}: shape {o32.shape} for float32 inputs, {o64.shape} for float64")
                elif o64.dtype.kind == "f" and not np.allclose(o32.astype(np.float64), o64, rtol=1e-3, atol=1e-4,
                                                                equal_nan=True):
                    err = np.max(np.abs(o32.astype(np.float64) - o64)) if o64.size else 0.0
                    c.failed(f"{tag}output {j}: float32 and float64 results differ by up to {err:.3g}")
        _compare_with_decomposition(c, op, tag, variants[0], outs.get(variants[0][0]))
        if not c.fail:
            c.passed()

    # ---- forward, cuda
    c = checks["forward[cuda]"]
    cuda_skip = None              # why the cuda gradients cannot be checked in this case
    cuda_float = False            # the cuda forward gave a floating-point output
    cuda_na = False               # ... and whether that is "not applicable" rather than "skipped"
    cuda_outs = {}                # the cuda outputs per input dtype (infer and dtype read them without cpu)
    if "cuda" not in declared:
        c.not_applicable(cuda_skip := "the op declares no cuda kernel")
        cuda_na = True
    elif "cuda" not in devices:
        c.skipped(cuda_skip := "not requested")
    elif not devmod.is_cuda_available():
        c.skipped(cuda_skip := f"CUDA unavailable: {devmod.cuda_unavailable_reason()}")
    else:
        # both float types: a launcher can be right for one element type only
        # (a float32 scalar argument handed to the double kernel reads garbage)
        for dt, arrs in (("float32", a32), ("float64", a64)) if has_float else (("input", arrays),):
            modified, where, overruns = [], [], []
            try:
                got = _run(op, arrs, "cuda", modified=modified, out_devices=where, overruns=overruns)
                want = [str(d.device) for d in op.infer(*[TensorDesc(a.shape, a.dtype, "cuda") for a in arrs])]
            except Exception as exc:
                c.failed(f"{tag}{dt} inputs: {_fmt_exc(exc)}")
                continue
            for j, (w, g) in enumerate(zip(want, where)):
                if w.split(":")[0] != g.split(":")[0]:
                    c.failed(f"{tag}{dt} inputs: output {j}: infer says device {w}, the cuda kernel returned it on "
                             f"{g}" + (" (a NumPy array: host memory); return device arrays (be.empty, "
                                       "be.to_device, be.elementwise, ...)" if g.startswith("cpu") else ""))
            cuda_float = cuda_float or any(getattr(o, "dtype", np.dtype("O")).kind == "f" for o in got)
            ref = outs.get(dt)
            if ref is None and "cpu" in declared:
                # cpu not requested (--devices cuda): its kernel is still the reference
                # the cuda values are checked against, else any values pass
                try:
                    ref = _run(op, arrs)
                except Exception as exc:
                    c.failed(f"{tag}{dt} inputs: the cpu kernel, the reference for the cuda values, "
                             f"fails: {_fmt_exc(exc)}")
            if ref is not None:
                _compare_with_cpu(c, f"{tag}{dt} inputs: output", got, ref, exact=dt == "float64")
            cuda_outs[dt] = got
            for i in modified:
                c.failed(f"{tag}{dt} inputs: the cuda kernel changed input {i} (shape {arrs[i].shape}) in "
                         f"place; a kernel must not write its inputs (declare them `const T*`)")
            for overrun in overruns:
                c.failed(f"{tag}{dt} inputs: {overrun}")
        if not c.fail:
            c.passed()
        else:
            cuda_skip, cuda_na = "the forward fails on cuda", True

    # ---- infer
    c = checks["infer"]
    infers = {}
    # shapes and dtypes do not depend on the device: without a cpu run, the cuda outputs
    outs = outs or cuda_outs
    if not hasattr(op, "infer"):
        c.not_applicable("the op has no infer()")
    else:
        for dt, arrs in variants:
            if dt not in outs:
                continue
            try:
                descs = tuple(op.infer(*[TensorDesc(a.shape, a.dtype, "cpu") for a in arrs]))
            except Exception as exc:
                c.failed(f"{tag}{dt} inputs: infer raised {_fmt_exc(exc)} but the kernel ran")
                continue
            infers[dt] = descs
            actual = outs[dt]
            if len(descs) != len(actual):
                c.failed(f"{tag}infer declares {len(descs)} output(s), the kernel returns {len(actual)}")
                continue
            for j, (d, o) in enumerate(zip(descs, actual)):
                if d.shape is not None and tuple(d.shape) != o.shape:
                    c.failed(f"{tag}{dt} inputs: output {j}: infer says shape {tuple(d.shape)}, kernel gives {o.shape}")
                if np.dtype(d.dtype) != o.dtype:
                    c.failed(f"{tag}{dt} inputs: output {j}: infer says dtype {np.dtype(d.dtype)}, "
                             f"kernel gives {o.dtype}")
            if not c.fail:
                c.passed()
        if not infers and not c.fail:
            c.not_applicable("the forward did not run")

    # ---- dtype propagation
    c = checks["dtype"]
    if not has_float:
        c.not_applicable("no floating-point input")
    else:
        for dt in ("float32", "float64"):
            if dt not in outs:
                continue
            declared = infers.get(dt)
            for j, o in enumerate(outs[dt]):
                if o.dtype.kind != "f":
                    continue
                if o.dtype != np.dtype(dt):
                    if declared is not None and j < len(declared) and np.dtype(declared[j].dtype) == o.dtype:
                        c.passed(f"output {j}: {o.dtype} for {dt} inputs, as infer declares")
                    else:
                        c.failed(f"{tag}{dt} inputs give a {o.dtype} output {j}")
                else:
                    c.passed()
        if not c.ran and not c.fail:
            c.not_applicable("no floating-point output")

    # ---- gradients
    path = describe(op).grad_path
    float_idx = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"
                 and i not in tuple(getattr(op, "shape_only_inputs", ()) or ())]
    chosen = list(wrt) if wrt is not None else float_idx
    out_float = "float64" in outs and any(o.dtype.kind == "f" for o in outs["float64"])
    # an output rounded to float32 (a dtype parameter) hides the 1e-6 steps of
    # float64 finite differences: the gradient would fail for being right
    narrow = sorted({f"output {j} is {o.dtype}" for j, o in enumerate(outs.get("float64", ()))
                     if o.dtype.kind == "f" and o.dtype.itemsize < 8})
    for check, fn, order in (("grad", gradcheck, 1), ("gradgrad", gradgradcheck, 2)):
        c = checks[check]
        if path is None:
            c.not_applicable("not differentiable: no _grad_rule, registered rule, vjp or decompose")
        elif order == 2 and not second_order:
            c.skipped("second order not requested")
        elif not chosen:
            c.not_applicable("no floating-point input to differentiate")
        elif "cpu" not in devices:
            c.skipped("cpu not requested")
        elif "float64" not in outs:
            c.not_applicable("the forward did not run")
        elif not out_float:
            c.not_applicable("no floating-point output")
        elif narrow:
            c.not_applicable(f"{op_label(op)}: {', '.join(narrow)} for float64 inputs, as infer declares: "
                             f"float64 finite differences cannot check a gradient through it; check the op "
                             f"at a float64 output too (check_params or examples())")
        elif not checks[check].fail and check == "gradgrad" and checks["grad"].fail:
            c.not_applicable("first order gradients already fail")
        elif order == 2 and describe(op).check["max_grad_order"] == 1:
            # declared: its backward op has no gradient (as PyTorch's ctc_loss)
            c.not_applicable("first-order gradients only, as declared (max_grad_order = 1)")
        elif describe(op).check["check_gradient"] == "zero":
            # declared zero by design (a stop-gradient): finite differences
            # would disagree, so check that the gradient is exactly that
            if order == 2:
                c.not_applicable("the gradient is zero by design (check_gradient = 'zero')")
                continue
            try:
                xs = [Tensor(a) for a in a64]
                got = analytic_grads(_apply_fn(op), xs, _weights(_apply_fn(op), xs, 0), chosen)
                nonzero = [i for i, g in enumerate(got) if g is not None and np.any(g != 0)]
                if nonzero:
                    c.failed(f"{tag}declared check_gradient = 'zero' but input(s) {nonzero} get a nonzero gradient")
                else:
                    c.passed("zero by design, as declared (check_gradient = 'zero')")
            except Exception as exc:
                c.failed(f"{tag}{_fmt_exc(exc)}")
        else:
            try:
                fn(_apply_fn(op), [Tensor(a) for a in a64], eps=eps, atol=atol, rtol=rtol, wrt=chosen)
                c.passed(f"via {path}")
            except Exception as exc:
                c.failed(f"{tag}{_fmt_exc(exc)}")

    # a vjp's gradient for an integer input is dropped: a sign of gradients in the wrong order
    ints = [i for i, a in enumerate(a64) if a.dtype.kind not in "fc"]
    if ints and path == "vjp" and chosen and "cpu" in devices and not checks["grad"].fail:
        from .graph import make_backward_graph
        try:
            graph = make_backward_graph(op, [TensorDesc(None, a.dtype, "cpu") for a in a64], [True] * len(a64))[0]
            for i in graph.integer_input_grads:
                checks["grad"].failed(
                    f"{tag}vjp returns a gradient for input {i}, of dtype {a64[i].dtype}: integer and bool "
                    f"inputs have no gradient, and it is dropped; return None in its place (are the "
                    f"gradients in the order of the inputs?)")
        except Exception as exc:
            checks["grad"].failed(f"{tag}{_fmt_exc(exc)}")

    # ---- gradients on cuda against the cpu's (float32)
    c = checks["grad[cuda]"]
    if cuda_skip:
        (c.not_applicable if cuda_na else c.skipped)(cuda_skip)
    elif path is None or not chosen or not (out_float or cuda_float):
        c.not_applicable("nothing to differentiate")
    else:
        try:
            ws = _weights(_apply_fn(op), [Tensor(a) for a in a32], 0)
            ref = _device_grads(op, a32, ws, chosen, "cpu")
            overruns = []
            got = _device_grads(op, a32, ws, chosen, "cuda", overruns=overruns)
            _compare_with_cpu(c, f"{tag}gradient of input", got, ref)
            for overrun in overruns:
                c.failed(f"{tag}{overrun}")
            if not c.fail:
                c.passed()
        except Exception as exc:
            c.failed(f"{tag}{_fmt_exc(exc)}")

    # ---- bad shapes
    c = checks["bad_shapes"]
    for what, bad in _bad_shape_variants(a64):
        descs = [TensorDesc(a.shape, a.dtype, "cpu") for a in bad]
        infer_exc = kernel_exc = None
        try:
            op.infer(*descs)
        except Exception as exc:
            infer_exc = exc
        try:
            got = _run(op, bad)
        except Exception as exc:
            kernel_exc = exc
        for who, exc in (("infer", infer_exc), ("apply", kernel_exc)):
            if exc is not None and name.lower() not in str(exc).lower():
                c.failed(f"{tag}{what}: the {who} error does not name the op {name!r}: {_fmt_exc(exc)}")
        if (infer_exc is None and isinstance(kernel_exc, IndexOpError)
                and name.lower() in str(kernel_exc).lower()):
            # an index out of range for the new shape: a check of the index
            # values, which infer (shapes and dtypes only) cannot make
            c.passed()
            c.rejected += 1
        elif infer_exc is None and kernel_exc is not None:
            c.failed(f"{tag}{what}: infer accepts it but the kernel fails ({_fmt_exc(kernel_exc)}); "
                     f"reject it in infer")
        elif infer_exc is not None and kernel_exc is None:
            c.failed(f"{tag}{what}: infer rejects it ({infer_exc}) but apply silently runs the kernel; "
                     f"make the kernel reject it too")
        elif infer_exc is not None:
            c.passed()
            c.rejected += 1
        else:
            c.passed()
            c.accepted += 1
    if not c.ran and not c.fail:
        c.not_applicable("no floating-point input to reshape")

    # ---- CUDA source compiles
    c = checks["cuda_compile"]
    if not compile_cuda:
        c.skipped("not requested")
    elif getattr(op, "cuda_source", None) is None:
        c.not_applicable("the op has no cuda_source")
    elif nvcc_path() is None:
        c.skipped("nvcc is not installed")
    else:
        dts = sorted({a.dtype for a in a32 + a64 if a.dtype.kind == "f"}, key=str)
        try:
            sources = _cuda_sources(op, dts)
        except Exception as exc:
            c.failed(f"{tag}cuda_source raised {_fmt_exc(exc)}")
            sources = []
        for ctype, src in sources:
            err = _nvcc_compile(src)
            if err:
                c.failed(f"{tag}cuda_source({ctype!r}) does not compile: {err.strip()[-800:]}")
            else:
                c.passed()


@contextlib.contextmanager
def cuda_for_checks(wanted: bool = True) -> Iterator[str]:
    """A context manager yielding where cuda checks run: the GPU, else the
    host emulator (selected for the duration, and forgotten after), else
    nowhere (why). ``gradcore check`` and the pytest plugin check in it.

    Example::

        >>> from gradcore.testing import check_op, cuda_for_checks
        >>> from gradcore.functional import Elemwise
        >>> with cuda_for_checks() as where:     # "GPU", "host emulator (no GPU)", ...
        ...     report = check_op(Elemwise("mul"), np.ones((2, 3)), np.ones(3))
        >>> [r.status for r in report.results if r.check == "forward[cuda]"]
        ['passed']
    """
    if not wanted:
        yield "not requested"
    elif os.environ.get("GRADCORE_CUDA"):
        yield f"GRADCORE_CUDA={os.environ['GRADCORE_CUDA']}"
    elif devmod.is_cuda_available():
        yield "GPU"
    elif not (shutil.which("g++") or shutil.which("c++")):
        yield f"unavailable: {devmod.cuda_unavailable_reason()}"
    else:
        from .cuda import runtime
        os.environ["GRADCORE_CUDA"] = "emulator"
        try:
            runtime.use("emulator")
            where = "host emulator (no GPU)"
        except Exception as exc:
            where = f"unavailable ({type(exc).__name__}: {exc})"
        try:
            yield where
        finally:
            os.environ.pop("GRADCORE_CUDA", None)
            runtime.use(None)


def _apply_fn(op):

    def run(*xs):
        outs = apply(op, *xs)
        return outs if len(outs) > 1 else outs[0]
    return run


def check_grad_rule(op_cls: type, rule: Callable, seed: int = 0, atol: float = 1e-4,
                    rtol: float = 1e-3) -> CheckReport:
    """Check a registered grad rule (gradient path 2) for ``op_cls``, on the
    op's examples() or generated inputs, each in float32 and float64:

    - ``rule[accepted]``: where the rule runs, its outputs and gradients
      agree with the op's own (the rule unregistered for the reference);
    - ``rule[fallback]``: where it raises ``GradRuleFallback``, gradients
      through ``apply`` (the rule registered, so it declines and the core
      falls back) agree with the op's own;
    - in both, for float64 inputs, second-order gradients with the rule
      registered against finite differences (``gradgradcheck``).

    Example::

        >>> from gradcore.testing import check_grad_rule
        >>> from gradcore.functional import CumSum
        >>> def cumsum_rule(op, x):     # a cumsum's gradient: the cumsum of dy the other way
        ...     y = gc.core.apply(op, x)[0]
        ...     return (y,), lambda dy: gc.core.apply(CumSum(op.axis, not op.reverse), dy)[0]
        >>> check_grad_rule(CumSum, cumsum_rule).ok
        True
    """
    label = f"{_op_short_name(op_cls)} rule {getattr(rule, '__name__', 'rule')}"
    try:
        cases = _cases_for(op_cls, (), None, seed)
    except NoInputsError as exc:
        return CheckReport([CheckResult(label, "inputs", FAILED, str(exc))])
    report = CheckReport()
    accepted, fallback = _Check(report, label, "rule[accepted]"), _Check(report, label, "rule[fallback]")
    installed = _core.registered_grad_rule(op_cls)
    for inst, arrays, wrt, origin in cases:
        for dt in (np.float32, np.float64):
            arrs = _cast(arrays, dt)
            where = f"[{op_label(inst)}, {np.dtype(dt).name}{'; ' + origin if origin else ''}] "
            chosen = list(wrt) if wrt is not None else [i for i, a in enumerate(arrs) if a.dtype.kind == "f"]
            try:
                rule(inst, *[Tensor(a) for a in arrs])
                took = True
            except GradRuleFallback:
                took = False
            except Exception as exc:
                accepted.failed(f"{where}the rule raised {_fmt_exc(exc)}")
                continue
            c = accepted if took else fallback
            try:
                ws = _weights(_apply_fn(inst), [Tensor(a) for a in arrs], seed)
                _core.unregister_grad_rule(op_cls)
                try:
                    ref_out = _run(inst, arrs)
                    ref = _device_grads(inst, arrs, ws, chosen, "cpu")
                finally:
                    _core.register_grad_rule(op_cls)(rule)
                got_out = _run(inst, arrs)
                got = _device_grads(inst, arrs, ws, chosen, "cpu")
            except Exception as exc:
                c.failed(f"{where}{_fmt_exc(exc)}")
                continue
            finally:
                if installed is None:
                    _core.unregister_grad_rule(op_cls)
                elif _core.registered_grad_rule(op_cls) is not installed:
                    _core.register_grad_rule(op_cls)(installed)
            n_before = len(c.fail)
            if dt is np.float64 and chosen and describe(op_cls).check["max_grad_order"] != 1:
                # second order, the rule registered (finite differences of its own first
                # order, itself compared with the op's below): a backward that reads what
                # the rule's unrecorded forward computed is right once, zero the second time
                try:
                    gradgradcheck(_apply_fn(inst), [Tensor(a) for a in arrs], wrt=chosen, seed=seed)
                except Exception as exc:
                    c.failed(f"{where}second order: {_fmt_exc(exc)}")
            for what, gs, rs in (("output", got_out, ref_out), ("gradient of input", got, ref)):
                for j, (g, r) in enumerate(zip(gs, rs)):
                    if r is None:
                        continue
                    if g is None or np.shape(g) != np.shape(r) or not np.allclose(
                            np.asarray(g, np.float64), np.asarray(r, np.float64), rtol=rtol, atol=atol):
                        c.failed(f"{where}{what} {j}: with the rule {np.asarray(g).ravel()[:4]}..., "
                                 f"the op's own {np.asarray(r).ravel()[:4]}...")
            if len(c.fail) == n_before:
                c.passed()
    for c, why in ((accepted, "the rule accepted none of the inputs tried; give the op examples() it accepts"),
                   (fallback, "the rule declined none of the inputs tried")):
        if not c.ran and not c.fail:
            (c.failed if c is accepted else c.not_applicable)(why)
        c.close()
    return report
