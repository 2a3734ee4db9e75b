"""Reductions over axes: sum, mean, max, min, prod."""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import numpy as np

from gradcore import _core
from gradcore.op import Op, TensorDesc, broadcast_view

from .elemwise import Elemwise
from .shape import Cast


def _apply1(op, *args):
    return _core.apply(op, *args)[0]


def norm_axis(axis) -> Optional[Tuple[int, ...]]:
    if axis is None:
        return None
    if isinstance(axis, (tuple, list)):
        return tuple(int(a) for a in axis)
    return (int(axis),)


def reduced_shape(op, shape, axis, keepdims, desc):
    if shape is None:
        return None
    nd = len(shape)
    axes = tuple(range(nd)) if axis is None else axis
    norm = set()
    for a in axes:
        if not -nd <= a < nd and not (nd == 0 and a in (0, -1)):
            raise op.error(f"axis {a} is out of range for {nd} dimensions", desc)
        norm.add(a % nd if nd else 0)
    if keepdims:
        return tuple(1 if i in norm else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in norm)


def _mean(x, axis, dtype, out, keepdims):
    return np.mean(x, axis=axis, keepdims=keepdims)


# ufunc reductions called positionally: (array, axis, dtype, out, keepdims)
_KERNELS = {"sum": np.add.reduce, "mean": _mean, "max": np.maximum.reduce,
            "min": np.minimum.reduce, "prod": np.multiply.reduce}


class Reduce(Op):
    """Reduce over ``axis`` (None: all) with mode sum, mean, max, min or prod."""
    name = "Reduce"
    attrs = ("mode", "axis", "keepdims")

    def __init__(self, mode: str, axis=None, keepdims: bool = False):
        if mode not in _KERNELS:
            raise ValueError(f"Reduce: unknown mode {mode!r}; known: {', '.join(_KERNELS)}")
        self.mode, self.axis, self.keepdims = mode, norm_axis(axis), bool(keepdims)
        self._kernel = _KERNELS[mode]
        if self.axis is None and mode != "mean":
            # a full reduction is the ufunc's reduce itself: no Python frame
            # per call (``cpu`` below, with axis None for every input)
            self.cpu = functools.partial(self._kernel, axis=None, keepdims=self.keepdims)
        self._seal()

    def infer(self, x):
        shape = reduced_shape(self, x.shape, self.axis, self.keepdims, x)
        if self.mode in ("max", "min") and x.shape is not None and 0 in x.shape:
            if self.axis is None or any(x.shape[a] == 0 for a in self.axis):
                raise self.error("cannot take max/min over an empty dimension", x)
        if self.mode == "mean":
            dtype = x.dtype if x.dtype.kind in "fc" else np.dtype("float64")
        elif self.mode in ("sum", "prod") and x.dtype.kind in "biu":
            dtype = np.sum(np.zeros(1, x.dtype)).dtype
        else:
            dtype = x.dtype
        return (TensorDesc(shape, dtype, x.device),)

    def cpu(self, x):
        # axis 0 / -1 of a 0-d array is the array itself (NumPy rejects a tuple axis there)
        axis = None if x.ndim == 0 else self.axis
        return self._kernel(x, axis, None, None, self.keepdims)

    def vjp(self, inputs, outputs, grads):
        (x,), (out,), (g,) = inputs, outputs, grads
        if self.mode in ("sum", "mean"):
            return [_apply1(BroadcastBack(self.axis, self.keepdims, self.mode == "mean"), g, x)]
        if self.mode == "prod":
            # d out / d x_i is the product of the other elements; out / x_i would be
            # 0 / 0 at a zero. Zeros count as ones in ``others``; ``rest`` is the
            # product of the other elements that are zero: 1 when there is none, the
            # one zero itself when there is one (value 0, but slope 1 for the second
            # order), 0 when there are more.
            back = BroadcastBack(self.axis, self.keepdims, False)
            red = lambda mode, t: _apply1(back, _apply1(Reduce(mode, self.axis, self.keepdims), t), x)
            is_ = lambda t, v: _apply1(Cast(x.dtype), _apply1(Elemwise("eq"), t, v))
            zero = is_(x, 0)
            nz = x + zero
            others = red("prod", nz) / nz
            elsewhere = red("sum", zero) - zero
            rest = is_(elsewhere, 0) + is_(elsewhere, 1) * (red("sum", x * zero) - x * zero)
            return [_apply1(back, g, x) * others * rest]
        # max / min: the gradient is shared evenly between tied elements
        back = BroadcastBack(self.axis, self.keepdims, False)
        hit = _apply1(Cast(x.dtype), _apply1(Elemwise("eq"), x, _apply1(back, out, x)))
        count = _apply1(back, _apply1(Reduce("sum", self.axis, self.keepdims), hit), x)
        return [_apply1(back, g, x) * hit / count]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_reduce_<mode>_<ctype>(x, y, outer, n, inner)``: x viewed as
        (outer, n, inner) with every reduced axis moved together into n (the
        backend transposes first when they are not adjacent; a full reduction
        is (1, size, 1)); y holds outer * inner elements (keepdims or not: the
        same layout). Integer inputs are cast to ``ctype`` first."""
        T = ctype
        init, step, final = {
            "sum": ("0", "acc += v;", "acc"),
            "mean": ("0", "acc += v;", f"acc / ({T})n"),
            "prod": ("1", "acc *= v;", "acc"),
            # NaN propagates as in NumPy: once acc is NaN no comparison replaces it
            "max": ("n > 0 ? p[0] : 0", "if (v > acc || v != v) acc = v;", "acc"),
            "min": ("n > 0 ? p[0] : 0", "if (v < acc || v != v) acc = v;", "acc"),
        }[self.mode]
        name = f"gc_reduce_{self.mode}_{T.replace(' ', '_')}"
        return (f'extern "C" __global__ void {name}(const {T}* __restrict__ x, {T}* __restrict__ y, '
                "long long outer, long long n, long long inner)\n{\n"
                f"    // axes {self.axis} moved together into n: x as (outer, n, inner); one thread per output\n"
                "    const long long total = outer * inner;\n"
                "    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;\n"
                "         idx += (long long)blockDim.x * gridDim.x) {\n"
                f"        const {T}* p = x + (idx / inner) * n * inner + idx % inner;\n"
                f"        {T} acc = ({T})({init});\n"
                "        for (long long k = 0; k < n; ++k) {\n"
                f"            const {T} v = p[k * inner];\n"
                f"            {step}\n"
                "        }\n"
                f"        y[idx] = {final};\n"
                "    }\n}\n")


class BroadcastBack(Op):
    """Broadcast a reduced gradient back to the shape of ``ref`` (and divide
    by the element count for a mean): the backward of a reduction."""
    name = "BroadcastBack"
    attrs = ("axis", "keepdims", "mean")
    shape_only_inputs = (1,)

    def __init__(self, axis, keepdims, mean=False):
        self.axis, self.keepdims, self.mean = norm_axis(axis), bool(keepdims), bool(mean)
        self._seal()

    def infer(self, g, ref):
        return (TensorDesc(ref.shape, g.dtype, g.device),)

    def cpu(self, g, ref):
        shape = ref.shape
        if self.axis is None and not self.mean:
            return broadcast_view(g, shape)     # a full reduction: a 0-d or all-ones g
        if not self.keepdims and len(shape):
            axes = range(len(shape)) if self.axis is None else {a % len(shape) for a in self.axis}
            kept = tuple(1 if i in axes else s for i, s in enumerate(shape))
            g = np.asarray(g).reshape(kept)
        out = broadcast_view(g, shape)
        if self.mean:
            count = out.size // max(np.size(g), 1) if out.size else 1
            out = out / np.asarray(count, dtype=out.dtype)
        return out

    def vjp(self, inputs, outputs, grads):
        mode = "mean" if self.mean else "sum"
        return [_apply1(Reduce(mode, self.axis, self.keepdims), grads[0]), None]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_broadcast_back[_mean]_<ctype>(g, y, ys)``: y contiguous of
        ref's shape ``ys``; g contiguous of the reduced shape (keepdims or
        not: the same layout). The reduced axes are compiled in; a mean
        divides by the number of elements reduced."""
        T = ctype
        axes = self.axis if self.axis is not None else ()
        all_ = "true" if self.axis is None else "false"
        name = f"gc_broadcast_back{'_mean' if self.mean else ''}_{T.replace(' ', '_')}"
        from .indexing import _DIMS
        return (_DIMS +
                f'extern "C" __global__ void {name}(const {T}* __restrict__ g, {T}* __restrict__ y, '
                "gc_dims ys)\n{\n"
                f"    const int NA = {len(axes)}; const int AXES[] = {{{', '.join(str(a) for a in axes + (0,))}}};\n"
                "    bool red[GC_MAX_DIMS];\n"
                f"    for (int d = 0; d < GC_MAX_DIMS; ++d) red[d] = {all_};\n"
                "    for (int k = 0; k < NA; ++k) {\n"
                "        const int a = AXES[k] < 0 ? AXES[k] + ys.n : AXES[k];\n"
                "        if (a >= 0 && a < ys.n) red[a] = true;\n"
                "    }\n"
                "    long long total = 1, count = 1;\n"
                "    for (int d = 0; d < ys.n; ++d) { total *= ys.d[d]; if (red[d]) count *= ys.d[d]; }\n"
                "    (void)count;\n"
                "    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;\n"
                "         idx += (long long)blockDim.x * gridDim.x) {\n"
                "        long long t = idx, off = 0, stride = 1;   // g's offset: the kept coordinates\n"
                "        for (int d = ys.n - 1; d >= 0; --d) {\n"
                "            const long long c = t % ys.d[d]; t /= ys.d[d];\n"
                "            if (!red[d]) { off += c * stride; stride *= ys.d[d]; }\n"
                "        }\n"
                f"        y[idx] = {f'g[off] / ({T})count' if self.mean else 'g[off]'};\n"
                "    }\n}\n")


class ArgReduce(Op):
    """Index of the max ("argmax") or min ("argmin") along ``axis`` (None:
    of the flattened tensor), int32. Not differentiable: no gradient flows."""
    name = "ArgReduce"
    attrs = ("mode", "axis", "keepdims")

    def __init__(self, mode: str, axis=None, keepdims: bool = False):
        if mode not in ("argmax", "argmin"):
            raise ValueError(f"ArgReduce: mode must be 'argmax' or 'argmin', got {mode!r}")
        self.mode, self.axis, self.keepdims = mode, None if axis is None else int(axis), bool(keepdims)
        self._seal()

    def infer(self, x):
        if x.shape is None:
            return (TensorDesc(None, np.dtype("int32"), x.device),)
        empty = (0 in x.shape) if self.axis is None else (x.shape and x.shape[self.axis % len(x.shape)] == 0)
        if empty:
            raise self.error("cannot take an arg-reduction over an empty axis", x)
        if self.axis is None:
            shape = (1,) * len(x.shape) if self.keepdims else ()
        else:
            shape = reduced_shape(self, x.shape, (self.axis,), self.keepdims, x)
        return (TensorDesc(shape, np.dtype("int32"), x.device),)

    def cpu(self, x):
        fn = np.argmax if self.mode == "argmax" else np.argmin
        return np.asarray(fn(x, axis=self.axis, keepdims=self.keepdims)).astype(np.int32)

    def vjp(self, inputs, outputs, grads):
        return [None]

    def cuda_source(self, ctype: str = "float") -> str:
        cmp = ">" if self.mode == "argmax" else "<"
        return (f'extern "C" __global__ void gc_{self.mode}_{ctype}(const {ctype}* __restrict__ x, '
                f"int* __restrict__ out, long long rows, long long n, long long inner)\n"
                "{\n"
                "    // one thread per (outer, inner) position; reduce over n strided by inner\n"
                "    long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
                "    if (r >= rows) return;\n"
                "    const long long base = (r / inner) * n * inner + r % inner;\n"
                f"    {ctype} best = x[base]; int at = 0;\n"
                "    for (long long k = 1; k < n; ++k) {\n"
                f"        {ctype} v = x[base + k * inner];\n"
                f"        if (v {cmp} best) {{ best = v; at = (int)k; }}\n"
                "    }\n"
                "    out[r] = at;\n"
                "}\n")


class CumSum(Op):
    """Cumulative sum along ``axis`` (``reverse``: from the end), the
    gradient of one being the other."""
    name = "CumSum"
    attrs = ("axis", "reverse")

    def __init__(self, axis: int = 0, reverse: bool = False):
        self.axis, self.reverse = int(axis), bool(reverse)
        self._seal()

    def infer(self, x):
        if x.shape is not None and not -max(len(x.shape), 1) <= self.axis < max(len(x.shape), 1):
            raise self.error(f"axis {self.axis} is out of range for {len(x.shape)} dimensions", x)
        dtype = np.cumsum(np.zeros(1, x.dtype)).dtype
        return (TensorDesc(x.shape, dtype, x.device),)

    def cpu(self, x):
        if x.ndim == 0:
            return np.asarray(x).copy()
        if self.reverse:
            return np.flip(np.cumsum(np.flip(x, self.axis), axis=self.axis), self.axis)
        return np.cumsum(x, axis=self.axis)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(CumSum(self.axis, not self.reverse), grads[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        name = "gc_cumsum_rev" if self.reverse else "gc_cumsum"
        k = "n - 1 - k" if self.reverse else "k"
        return (f'extern "C" __global__ void {name}_{ctype}(const {ctype}* __restrict__ x, '
                f"{ctype}* __restrict__ out, long long rows, long long n, long long inner)\n"
                "{\n"
                "    long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
                "    if (r >= rows) return;\n"
                "    const long long base = (r / inner) * n * inner + r % inner;\n"
                f"    {ctype} acc = 0;\n"
                "    for (long long k = 0; k < n; ++k) {\n"
                f"        const long long j = base + ({k}) * inner;\n"
                "        acc += x[j];\n"
                "        out[j] = acc;\n"
                "    }\n"
                "}\n")
