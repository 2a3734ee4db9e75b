"""Reductions over axes: sum, mean, max, min, prod."""
from __future__ import annotations

import functools
import math
import operator
from typing import Optional, Tuple

import numpy as np

from gradcore import _core, dtypes
from gradcore.cpu import _kernels, _reduce as _small
from gradcore.cuda.kernels import Kernel
from gradcore.op import Op, TensorDesc, broadcast_view

from .elemwise import Elemwise
from .shape import Cast


def _apply1(op, *args):
    return _core.apply(op, *args)[0]


def op_int(op_name: str, what: str, v) -> int:
    """``v`` as an int for an op attribute (an axis, a count): ints, NumPy
    ints, 0-d integer tensors and whole floats; a fractional float, a string
    or None is a TypeError naming the op (``int()`` would truncate 1.5 to 1
    or report "invalid literal")."""
    try:
        return operator.index(v)
    except TypeError:
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            return int(v)
        raise TypeError(f"{op_name}: {what} must be an int, got {type(v).__name__} {v!r}") from None


def norm_axis(axis, op_name: str = "Reduce") -> Optional[Tuple[int, ...]]:
    if axis is None:
        return None
    if isinstance(axis, (tuple, list)):
        return tuple(op_int(op_name, "axis", a) for a in axis)
    return (op_int(op_name, "axis", axis),)


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
    if len(norm) != len(axes) and nd:
        # (NumPy's kernels refuse it too, but a device kernel would reduce once)
        raise op.error(f"axis {tuple(axes)} names an axis twice", desc)
    if keepdims:
        return tuple(1 if i in norm else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in norm)


def _mean(x, axis, dtype, out, keepdims):
    return np.mean(x, axis=axis, keepdims=keepdims)


# ufunc reductions called positionally: (array, axis, dtype, out, keepdims)
_KERNELS = {"sum": np.add.reduce, "mean": _mean, "max": np.maximum.reduce,
            "min": np.minimum.reduce, "prod": np.multiply.reduce}


# full reductions (axis None, no keepdims) run by compiled kernels
_SMALL_FULL = {"sum": _small.full_sum, "mean": _small.full_mean}


# how many zeros besides its own an element's gradient of prod follows exactly
# (see Reduce.vjp): derivatives of the product up to order 4 are exact
_PROD_ZEROS = 3


class Reduce(Op):
    """Reduce over ``axis`` (None: all) with mode sum, mean, max, min or prod.

    Example::

        >>> from gradcore.functional import Reduce
        >>> y, = gc.core.apply(Reduce("max", axis=0), gc.tensor([[1.0, 5.0], [7.0, 0.0]]))
        >>> y.numpy()
        array([7., 5.], dtype=float32)
    """
    name = "Reduce"
    reduce_broadcast = False
    check_params = ({"mode": "sum", "axis": 1}, {"mode": "mean"}, {"mode": "max", "axis": 0},
                    {"mode": "prod", "axis": -1, "keepdims": True})  # for generated checks
    attrs = ("mode", "axis", "keepdims")
    # a full reduction may run as the bare ufunc reduce (NumPy picks the
    # dtype: right for floats only)
    fast_full_reduction = True

    def __init__(self, mode: str, axis=None, keepdims: bool = False):
        if mode not in _KERNELS:
            raise ValueError(f"Reduce: unknown mode {mode!r}; known: {', '.join(_KERNELS)}")
        self.mode, self.axis, self.keepdims = mode, norm_axis(axis, f"Reduce({mode})"), bool(keepdims)
        self._kernel = _KERNELS[mode]
        if self.axis is None and self.fast_full_reduction:
            # a full reduction calls its kernel with no Python frame per call;
            # a loss's sum or mean of a small float array is added up in C
            # (NumPy's additions, in NumPy's order, without its ~7k-instruction call)
            # (keepdims bound only when True: each bound keyword costs the call ~90 ns)
            if mode in _SMALL_FULL and not self.keepdims:
                self.cpu = _SMALL_FULL[mode]
            elif mode != "mean":
                self.cpu = (functools.partial(self._kernel, axis=None, keepdims=True) if self.keepdims
                            else functools.partial(self._kernel, axis=None))

    def infer(self, x):
        shape = reduced_shape(self, x.shape, self.axis, self.keepdims, x)
        if self.mode in ("max", "min") and x.shape is not None and 0 in x.shape:
            if self.axis is None or any(x.shape[a] == 0 for a in self.axis):
                raise self.error("cannot take max/min over an empty dimension", x)
        _, dtype = dtypes.reduce_dtypes(self.mode, x.dtype)
        return (TensorDesc(shape, dtype, x.device),)

    def input_dtypes(self, in_dtypes):
        """gradcore's dtype rules (gradcore.dtypes.reduce_dtypes): mean of
        integers in float32, sum of bool in int32, sum and prod of integers in
        their own dtype (computed so: NumPy's full reduction would widen to
        int64)."""
        want, _ = dtypes.reduce_dtypes(self.mode, in_dtypes[0])
        return (self if want.kind == "f" else ExactDtypeReduce(self.mode, self.axis, self.keepdims)), (want,)

    def cpu(self, x):
        # axis 0 / -1 of a 0-d array is the array itself (NumPy rejects a tuple axis there)
        axis = None if x.ndim == 0 else self.axis
        # the input's dtype (NumPy's ufuncs widen integer sums to int64)
        return self._kernel(x, axis, x.dtype, None, self.keepdims)

    def vjp(self, inputs, outputs, grads):
        (x,), (out,), (g,) = inputs, outputs, grads
        if self.mode in ("sum", "mean"):
            return [_apply1(BroadcastBack(self.axis, self.keepdims, self.mode == "mean"), g, x)]
        if self.mode == "prod":
            # d out / d x_i is the product of the other elements; out / x_i would be
            # 0 / 0 at a zero. Split it into the product of the other non-zero
            # elements (``others``: zeros replaced by a constant 1, so they carry no
            # slope) and ``rest``, the product of the other zeros. ``rest`` is 0 in
            # value but not in its derivatives: it is the elementary symmetric
            # polynomial e_k of the k other zeros (Newton's identities on their
            # power sums), exact for up to _PROD_ZEROS of them, so every derivative
            # below order _PROD_ZEROS + 2 of the product is right.
            back = BroadcastBack(self.axis, self.keepdims, False)
            red = lambda mode, t: _apply1(back, _apply1(Reduce(mode, self.axis, self.keepdims), t), x)
            is_ = lambda t, v: _apply1(Cast(x.dtype), _apply1(Elemwise("eq"), t, v))
            zero = is_(x, 0)
            nz = x * (1 - zero) + zero
            others = red("prod", nz) / nz
            elsewhere = red("sum", zero) - zero
            xz = x * zero                   # 0 with slope 1 at the zeros, a constant 0 elsewhere
            # powers by products: the pow op's derivatives are 0 * inf = NaN at 0
            power, xp = [None], xz
            for _ in range(_PROD_ZEROS):
                power.append(red("sum", xp) - xp)
                xp = xp * xz
            e = [1.0]
            for k in range(1, _PROD_ZEROS + 1):
                e.append(sum((-1) ** (i - 1) * e[k - i] * power[i] for i in range(1, k + 1)) / k)
            rest = sum(is_(elsewhere, k) * e[k] for k in range(_PROD_ZEROS + 1))
            return [_apply1(back, g, x) * others * rest]
        # max / min: the gradient is shared evenly between tied elements
        back = BroadcastBack(self.axis, self.keepdims, False)
        hit = _apply1(Cast(x.dtype), _apply1(Elemwise("eq"), x, _apply1(back, out, x)))
        count = _apply1(back, _apply1(Reduce("sum", self.axis, self.keepdims), hit), x)
        return [_apply1(back, g, x) * hit / count]

    def cuda_source(self, ctype: str = "float") -> str:
        """Three reduction kernels (``kernel_source`` gives each alone: a
        module of its own), x contiguous viewed as (outer, n, inner), n split
        into ``parts`` chunks of ceil(n / parts) elements (a long axis with
        few outputs: partial results, reduced again by a second launch), y
        contiguous (outer, parts, inner):

        - ``gc_reduce_<mode>_<ctype>(x, y, outer, n, inner, parts, count)``
          (a short axis): a thread per output, adjacent threads on adjacent
          outputs;
        - ``gc_reduce_rows_<mode>_<ctype>(x, y, rows, n, parts, count)``
          (inner 1): a block per (row, part), its threads striding over the
          chunk (coalesced), combined by warp shuffles and shared memory;
        - ``gc_reduce_cols_<mode>_<ctype>(x, y, outer, n, inner, parts,
          count)`` (inner > 1): a block of 32 x 8 threads per (outer, part,
          32 columns), x along the columns (coalesced), y along the chunk,
          combined in shared memory.

        A mean divides by ``count``, the number of elements of the whole
        reduction (its partial passes are sums); the other modes ignore it.
        The launcher reduces one run of adjacent axes per pass, casting
        integer inputs to the output dtype first."""
        return "".join(self.kernel_source(ctype, kind) for kind in ("thread", "rows", "cols"))

    @functools.lru_cache(maxsize=None)      # built once per op, type and kind: launchers ask on every call
    def kernel_source(self, ctype: str, kind: str) -> str:
        """The source of one of ``cuda_source``'s kernels: kind "thread",
        "rows" or "cols"."""
        init, combine, final = _MODES[self.mode]
        if kind == "thread":
            return Kernel(f"reduce_{self.mode}", _REDUCE_PARAMS, f"""
                const long long i = idx % inner, r = idx / inner;
                const long long lo = (r % parts) * chunk, hi = lo + chunk < n ? lo + chunk : n, s = inner;
                const T* q = x + (r / parts) * n * inner + i;
                T acc = (T)({init});
                for (long long k = lo; k < hi; ++k) acc = {combine}()(acc, q[k * inner]);
                y[idx] = {final};""", over="total", setup="""
                const long long chunk = (n + parts - 1) / parts, total = outer * parts * inner;
                (void)count;""").source(ctype, helpers=COMBINE)
        if kind == "rows":
            return Kernel(f"reduce_rows_{self.mode}", "const T* __restrict__ x, T* __restrict__ y, "
                          "long long rows, long long n, long long parts, long long count", f"""
                const long long lo = (r % parts) * chunk, hi = lo + chunk < n ? lo + chunk : n, s = 1;
                const T* q = x + (r / parts) * n;
                T acc = (T)({init});
                #pragma unroll 4
                for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) acc = {combine}()(acc, q[k]);
                acc = gc_block_reduce(acc, scratch, {combine}());
                if (threadIdx.x == 0) y[r] = {final};""", over="rows * parts", index="r", per="block", setup="""
                __shared__ T scratch[32];
                const long long chunk = (n + parts - 1) / parts;
                (void)count;""").source(ctype, helpers=BLOCK_REDUCE)
        return Kernel(f"reduce_cols_{self.mode}", _REDUCE_PARAMS, f"""
            const long long i = (t % strips) * 32 + threadIdx.x, r = t / strips;
            const long long lo = (r % parts) * chunk, hi = lo + chunk < n ? lo + chunk : n, s = inner;
            const T* q = x + (r / parts) * n * inner + i;
            T acc = (T)0;
            if (i < inner) {{
                acc = (T)({init});
            #pragma unroll 4
                for (long long k = lo + threadIdx.y; k < hi; k += blockDim.y) acc = {combine}()(acc, q[k * inner]);
            }}
            scratch[threadIdx.y][threadIdx.x] = acc;
            __syncthreads();
            if (threadIdx.y == 0 && i < inner) {{
                for (unsigned j = 1; j < blockDim.y; ++j) acc = {combine}()(acc, scratch[j][threadIdx.x]);
                y[r * inner + i] = {final};
            }}
            __syncthreads();     // scratch is read before the next strip writes it""",
                      over="outer * parts * strips", index="t", per="block", setup="""
            __shared__ T scratch[GC_COLS_Y][33];
            const long long chunk = (n + parts - 1) / parts, strips = (inner + 31) / 32;
            (void)count;""").source(ctype, helpers=BLOCK_REDUCE)

    def cuda(self, be, x):
        # the launches depend only on the input's shape and dtype: planned once per signature
        plans = self.__dict__.get("_cuda_plans")        # ops are immutable: a cache beside the attributes
        if plans is None:
            plans = self.__dict__["_cuda_plans"] = {}
        key = (be, x.shape, x.dtype, _SERIAL, _PARALLEL)        # the splitting knobs shape the plan too
        plan = plans.get(key)
        if plan is None:
            if len(plans) > 1024:
                plans.clear()
            plan = plans[key] = self._cuda_plan(be, x)
        out_shape, out_dtype, stages = plan
        y = be.cast(x, out_dtype)
        if stages is None:
            return (y.copy() if y is x else y).reshape(out_shape)
        return _run_stages(be, y, stages).reshape(out_shape)

    def _cuda_plan(self, be, x):
        """(output shape, output dtype, the launches: ``_reduce_stages``'s, None
        when nothing is reduced)."""
        (out,) = self.infer_arrays(x)
        axes = range(x.ndim) if self.axis is None or x.ndim == 0 else {a % x.ndim for a in self.axis}
        count = int(math.prod([x.shape[a] for a in axes]))
        # size-1 axes do not change the layout: drop them, then reduce each run
        # of adjacent reduced axes with one (outer, n, inner) reduction, the
        # last run first (the earlier axes keep their places)
        dims = [(s, a in axes) for a, s in enumerate(x.shape) if s != 1]
        runs = []
        for i, (s, red) in enumerate(dims):
            if red and runs and runs[-1][1] == i:
                runs[-1][1] = i + 1
            elif red:
                runs.append([i, i + 1])
        if not runs:
            return tuple(out.shape), out.dtype, None
        sizes, stages, ctype = [s for s, _ in dims], [], be.ctype(out.dtype)
        for k, (a, b) in enumerate(reversed(runs)):
            last = k == len(runs) - 1
            mode = self.mode if last or self.mode != "mean" else "sum"
            stages += _reduce_stages(be, mode, ctype, _prod(sizes[:a]), _prod(sizes[a:b]), _prod(sizes[b:]), count)
            del sizes[a:b]
        return tuple(out.shape), out.dtype, tuple(stages)


# (initial value of a thread's accumulator, combining functor, final value).
# max/min start from the chunk's first element: they are idempotent, so a
# thread that reads nothing more holds a value of the chunk, never an identity
# (there is none for integers) ({first} is 0 for an empty chunk: sum only)
_MODES = {
    "sum": ("0", "gc_op_sum", "acc"),
    "mean": ("0", "gc_op_sum", "acc / (T)count"),
    "prod": ("1", "gc_op_prod", "acc"),
    "max": ("lo < hi ? q[lo * s] : 0", "gc_op_max", "acc"),
    "min": ("lo < hi ? q[lo * s] : 0", "gc_op_min", "acc"),
}
_REDUCE_PARAMS = ("const T* __restrict__ x, T* __restrict__ y, long long outer, long long n, long long inner, "
                  "long long parts, long long count")

# the combining functors (plain device code: any kernel may use them)
COMBINE = r"""
#ifndef GC_COMBINE
#define GC_COMBINE
// NaN propagates as in NumPy: once a NaN is in, no comparison replaces it
struct gc_op_sum { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return (T)(a + b); } };
struct gc_op_prod { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return (T)(a * b); } };
struct gc_op_max { template <class T> __device__ __forceinline__ T operator()(T a, T b) const {
    return (b > a || b != b) ? b : a; } };
struct gc_op_min { template <class T> __device__ __forceinline__ T operator()(T a, T b) const {
    return (b < a || b != b) ? b : a; } };
#endif
"""
# CUDA C of block reductions (shared by the reductions and the row kernels
# of ops/nn.py): blocks of a multiple of 32 threads (at most 1024)
BLOCK_REDUCE = COMBINE + r"""
#ifndef GC_BLOCK_REDUCE
#define GC_BLOCK_REDUCE
#define GC_COLS_Y 8
// every lane gets the combination of its warp's 32 values (a butterfly;
// small types travel as the int they promote to)
template <class T, class Op> __device__ __forceinline__ T gc_warp_reduce(T v, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, (T)__shfl_xor_sync(0xffffffffu, +v, o));
    return v;
}
// every thread of the block gets the combination of all threads' values, the
// same value (warp results combined in one order); scratch: 32 in shared memory
template <class T, class Op> __device__ __forceinline__ T gc_block_reduce(T v, T* scratch, Op op) {
    const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned warps = (blockDim.x * blockDim.y * blockDim.z + 31) / 32;
    v = gc_warp_reduce(v, op);
    if (warps == 1) return v;   // one warp: every lane has it already (uniform: no barrier skipped by some)
    if ((tid & 31) == 0) scratch[tid / 32] = v;
    __syncthreads();
    v = scratch[0];
    for (unsigned w = 1; w < warps; ++w) v = op(v, scratch[w]);
    __syncthreads();        // scratch may be written again at once
    return v;
}
#endif
"""

# a (row, part) of a reduction covers at most _SERIAL elements when there are
# fewer than _PARALLEL blocks' worth of outputs: a long axis is then reduced
# in two launches (partials, then those), so that a full reduction fills the GPU
_SERIAL = 2048
_PARALLEL = 2048
SHORT_AXIS = 32         # an axis this short is reduced by a thread per output
_THREADS = 256          # threads per block of the reductions (a multiple of 32)
MAX_BLOCKS = 1 << 16     # grid cap: the kernels loop over the rest
_REDUCERS = {}


def _prod(sizes) -> int:
    p = 1
    for s in sizes:
        p *= int(s)
    return p


def _reducer(mode):
    op = _REDUCERS.get(mode)
    if op is None:
        op = _REDUCERS[mode] = Reduce(mode)
    return op


def row_threads(n: int) -> int:
    """Threads per block for a row of ``n`` elements: a power of two from
    32 to 256 (a short row does not leave most of a block idle)."""
    t = 32
    while t < n and t < _THREADS:
        t *= 2
    return t


def _reduce_stages(be, mode, ctype, outer, n, inner, count) -> list:
    """The launches reducing a contiguous (outer, n, inner) array over n into
    a flat array of outer * inner elements: (kernel, grid or None for
    ``launch_n``, block, output size, the kernel's int arguments after x and
    y) per pass; a long axis over few outputs is split into parts, summed by
    a further pass."""
    units = outer * -(-inner // 32) if inner > 1 else outer      # blocks' worth of outputs
    parts = 1
    if n > _SERIAL and units < _PARALLEL:
        parts = min(-(-n // _SERIAL), -(-_PARALLEL // max(units, 1)))
        parts = -(-n // -(-n // parts))                 # every part non-empty
    stage = "sum" if mode == "mean" and parts > 1 else mode    # a mean's partials are sums
    size = outer * parts * inner
    op, chunk = _reducer(stage), -(-n // parts)
    if size == 0:               # nothing to write (no kernel compiled for it)
        launch = (None, None, None, 0, ())
    elif chunk <= SHORT_AXIS:         # a thread per output (adjacent outputs on adjacent threads)
        launch = (be.kernel(op, ctype, source=op.kernel_source(ctype, "thread")), None, None, size,
                  (outer, n, inner, parts, count))
    elif inner == 1:            # a block per row
        launch = (be.kernel(op, ctype, source=op.kernel_source(ctype, "rows")), (min(outer * parts, MAX_BLOCKS),),
                  (row_threads(chunk),), size, (outer, n, parts, count))
    else:                       # 32 x 8 column tiles
        blocks = outer * parts * -(-inner // 32)
        launch = (be.kernel(op, ctype, source=op.kernel_source(ctype, "cols")), (min(blocks, MAX_BLOCKS),),
                  (32, 8), size, (outer, n, inner, parts, count))
    rest = [] if parts == 1 else _reduce_stages(be, mode, ctype, outer, parts, inner, count)
    return [launch] + rest


def _run_stages(be, x, stages):
    """Run ``_reduce_stages``' launches on ``x``: the last pass's output."""
    for kernel, grid, block, size, ints in stages:
        y = be.empty((size,), x.dtype)
        if size:
            if grid is None:
                be.launch_n(kernel, size, x, y, *ints)
            else:
                be.launch(kernel, grid, block, x, y, *ints)
        x = y
    return x


class ExactDtypeReduce(Reduce):
    """Reduce computing in its input's dtype on every input (integer and bool
    sums and products): never the full-reduction fast path, which would let
    NumPy widen to int64. A class of its own, so that it is never the same
    (interned) op as the float Reduce with the same attributes."""
    fast_full_reduction = False

class BroadcastBack(Op):
    """Broadcast a reduced gradient back to the shape of ``ref`` (and divide
    by the element count for a mean): the backward of a reduction."""
    name = "BroadcastBack"
    reduce_broadcast = False
    check_params = ({"axis": 1, "keepdims": False}, {"axis": 1, "keepdims": False, "mean": True})
    check_shapes = (((2,), (2, 3)), ((0,), (0, 3)))
    attrs = ("axis", "keepdims", "mean")
    shape_only_inputs = (1,)

    def __init__(self, axis, keepdims, mean=False):
        self.axis, self.keepdims, self.mean = norm_axis(axis), bool(keepdims), bool(mean)
        if self.axis is None and not self.mean:
            # a full sum's backward: ``cpu`` below with no Python frame per call
            self.cpu = _core.broadcast_like

    def infer(self, g, ref):
        want = reduced_shape(self, ref.shape, self.axis, self.keepdims, ref)
        if want is not None and g.shape is not None and int(np.prod(g.shape)) != int(np.prod(want)):
            raise self.error(f"the gradient must have the reduced shape {want}", g, ref)
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
        """``gc_broadcast_back[_mean]_<ctype>(g, y, gs, ys)``: y contiguous of
        ref's shape ``ys``; g contiguous of shape ``gs``, the reduced shape
        with keepdims (1 on each reduced axis, same rank as ys; without
        keepdims the layout is the same). One thread per element of y; a
        mean divides by the number of elements reduced (size(y) / size(g))."""
        from .shape import _DIMS
        return Kernel("broadcast_back_mean" if self.mean else "broadcast_back",
                      "const T* __restrict__ g, T* __restrict__ y, gc_dims gs, gc_dims ys", f"""
            long long t = idx, off = 0, stride = 1;   // g's offset: the kept coordinates
            for (int d = ys.n - 1; d >= 0; --d) {{
                const long long c = t % ys.d[d]; t /= ys.d[d];
                if (gs.d[d] != 1) off += c * stride;
                stride *= gs.d[d];
            }}
            y[idx] = {'g[off] / (T)count' if self.mean else 'g[off]'};""", over="total", setup="""
            long long total = 1, gsize = 1;
            for (int d = 0; d < ys.n; ++d) { total *= ys.d[d]; gsize *= gs.d[d]; }
            const long long count = gsize > 0 ? total / gsize : 1;
            (void)count;""").source(ctype, helpers=_DIMS)

    def cuda(self, be, g, ref):
        (out,) = self.infer_arrays(g, ref)
        shape = out.shape
        axes = range(len(shape)) if self.axis is None else {a % len(shape) for a in self.axis} if shape else ()
        kept = tuple(1 if i in axes else s for i, s in enumerate(shape))
        if self.mean and g.dtype.kind != "f":
            g = be.cast(g, np.float64)      # the cpu's true division
        y = be.empty(shape, g.dtype)
        be.launch_n(be.kernel(self, be.ctype(g.dtype)), y.size, g.reshape(kept), y, be.dims(kept), be.dims(shape))
        return y


class ArgReduce(Op):
    """Index of the max ("argmax") or min ("argmin") along ``axis`` (None:
    of the flattened tensor), int32. Not differentiable: no gradient flows.

    Example::

        >>> from gradcore.functional import ArgReduce
        >>> y, = gc.core.apply(ArgReduce("argmax", axis=1), gc.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]]))
        >>> y.numpy()
        array([1, 0], dtype=int32)
    """
    name = "ArgReduce"
    reduce_broadcast = False
    check_params = ({"mode": "argmax", "axis": 1}, {"mode": "argmin"})  # for generated checks
    attrs = ("mode", "axis", "keepdims")

    def __init__(self, mode: str, axis=None, keepdims: bool = False):
        if mode not in ("argmax", "argmin"):
            raise ValueError(f"ArgReduce: mode must be 'argmax' or 'argmin', got {mode!r}")
        self.mode, self.axis, self.keepdims = mode, None if axis is None else op_int(mode, "axis", axis), bool(keepdims)

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
        """``gc_<argmax|argmin>_<ctype>(x, out, rows, n, inner)``: x contiguous
        as (rows / inner, n, inner) (a flattened x: (1, size, 1)), out int32
        of ``rows`` elements; one thread per output. Ties and NaN as in
        NumPy: the first extreme element, the first NaN."""
        cmp = ">" if self.mode == "argmax" else "<"
        # one thread per (outer, inner) position; reduce over n strided by inner
        return Kernel(self.mode, "const T* __restrict__ x, int* __restrict__ out, long long rows, long long n, "
                      "long long inner", f"""
            const long long base = (r / inner) * n * inner + r % inner;
            T best = x[base]; int at = 0;
            for (long long k = 1; k < n && best == best; ++k) {{   // stop at a NaN
                T v = x[base + k * inner];
                if (v {cmp} best || v != v) {{ best = v; at = (int)k; }}
            }}
            out[r] = at;""", over="rows", index="r").source(ctype)

    def cuda(self, be, x):
        (out,) = self.infer_arrays(x)
        if self.axis is None:
            outer, n, inner = 1, x.size, 1
        else:
            outer, n, inner = _around(x.shape, self.axis)
        y = be.empty(out.shape, np.int32)
        be.launch_n(be.kernel(self, be.ctype(x.dtype)), y.size, x, y, outer * inner, n, inner)
        return y


class CumSum(Op):
    """Cumulative sum along ``axis`` (``reverse``: from the end), the
    gradient of one being the other.

    Example::

        >>> from gradcore.functional import CumSum
        >>> y, = gc.core.apply(CumSum(axis=0, reverse=True), gc.tensor([1.0, 2.0, 3.0]))
        >>> y.numpy()
        array([6., 5., 3.], dtype=float32)
    """
    name = "CumSum"
    reduce_broadcast = False
    attrs = ("axis", "reverse")

    def __init__(self, axis: int = 0, reverse: bool = False):
        self.axis, self.reverse = op_int("CumSum", "axis", axis), bool(reverse)

    def infer(self, x):
        if x.shape is not None and not -max(len(x.shape), 1) <= self.axis < max(len(x.shape), 1):
            raise self.error(f"axis {self.axis} is out of range for {len(x.shape)} dimensions", x)
        _, dtype = dtypes.reduce_dtypes("sum", x.dtype)     # a sum's dtype (int32 stays int32)
        return (TensorDesc(x.shape, dtype, x.device),)

    def cpu(self, x):
        _, dtype = dtypes.reduce_dtypes("sum", x.dtype)
        if x.ndim == 0:
            return np.asarray(x, dtype).copy()
        if dtype == x.dtype and x.size:
            out = _kernels.cumsum(x, *_around(x.shape, self.axis), self.reverse)
            if out is not None:
                return out
        if self.reverse:
            return np.flip(np.cumsum(np.flip(x, self.axis), axis=self.axis, dtype=dtype), self.axis)
        return np.cumsum(x, axis=self.axis, dtype=dtype)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(CumSum(self.axis, not self.reverse), grads[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_cumsum[_rev]_<ctype>(x, out, rows, n, inner)``: x and out
        contiguous as (rows / inner, n, inner); one thread per (outer, inner)
        position scans its n elements (from the end when reversed). The
        launcher casts x to the output dtype first."""
        k = "n - 1 - k" if self.reverse else "k"
        return Kernel("cumsum_rev" if self.reverse else "cumsum",
                      "const T* __restrict__ x, T* __restrict__ out, long long rows, long long n, long long inner", f"""
            const long long base = (r / inner) * n * inner + r % inner;
            T acc = 0;
            for (long long k = 0; k < n; ++k) {{
                const long long j = base + ({k}) * inner;
                acc += x[j];
                out[j] = acc;
            }}""", over="rows", index="r").source(ctype)

    def cuda(self, be, x):
        (out,) = self.infer_arrays(x)
        x = be.cast(x, out.dtype)
        y = be.empty(out.shape, out.dtype)
        if x.ndim == 0:
            outer, n, inner = 1, 1, 1
        else:
            outer, n, inner = _around(x.shape, self.axis)
        be.launch_n(be.kernel(self, be.ctype(out.dtype)), outer * inner, x, y, outer * inner, n, inner)
        return y


def _around(shape, axis):
    """(outer, n, inner) of a contiguous shape around ``axis``."""
    axis %= len(shape)
    return _prod(shape[:axis]), int(shape[axis]), _prod(shape[axis + 1:])
