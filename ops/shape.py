"""Shape ops: reshape, transpose, broadcast, expand_dims, squeeze, cast, and
the "like" helpers backward graphs use (their reference input is read only
for its shape, so backward graphs keep a shape carrier instead of it)."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from gradcore import _core
from gradcore.op import Op, TensorDesc


def _apply1(op, *args):
    return _core.apply(op, *args)[0]


def _norm_axes(axes, ndim, op, desc):
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise op.error(f"axis {a} is out of range for {ndim} dimensions", desc)
        out.append(a % ndim)
    return tuple(out)


def _resolve_shape(op, shape, in_shape, desc):
    shape = tuple(int(s) for s in shape)
    if in_shape is None:      # traced: checked when the shape is known
        return None if -1 in shape else shape
    if shape.count(-1) > 1:
        raise op.error(f"at most one dimension of {shape} can be -1", desc)
    size = int(np.prod(in_shape, dtype=np.int64))
    if -1 in shape:
        rest = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        if rest == 0 or size % rest:
            raise op.error(f"cannot reshape {size} elements into {shape}", desc)
        shape = tuple(size // rest if s == -1 else s for s in shape)
    if int(np.prod(shape, dtype=np.int64)) != size:
        raise op.error(f"cannot reshape {size} elements into {shape}", desc)
    return shape


class Reshape(Op):
    name = "Reshape"
    attrs = ("shape",)

    def __init__(self, shape: Sequence[int]):
        self.shape = tuple(int(s) for s in shape)
        self._seal()

    def infer(self, x):
        return (TensorDesc(_resolve_shape(self, self.shape, x.shape, x), x.dtype, x.device),)

    def cpu(self, x):
        return x.reshape(self.shape)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(ReshapeLike(), grads[0], inputs[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        return _copy_source("reshape", ctype, f"reshape to {self.shape}")


class ReshapeLike(Op):
    """reshape(x, shape of ref)."""
    name = "ReshapeLike"
    shape_only_inputs = (1,)

    def infer(self, x, ref):
        return (TensorDesc(ref.shape, x.dtype, x.device),)

    def cpu(self, x, ref):
        return x.reshape(ref.shape)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(ReshapeLike(), grads[0], inputs[0]), None]

    def cuda_source(self, ctype: str = "float") -> str:
        return _copy_source("reshape_like", ctype, "reshape to ref's shape (ref is not passed)")


class Transpose(Op):
    name = "Transpose"
    attrs = ("perm",)

    def __init__(self, perm: Sequence[int]):
        self.perm = tuple(int(p) for p in perm)
        self._seal()

    def infer(self, x):
        if x.shape is None:
            return (TensorDesc(None, x.dtype, x.device),)
        if sorted(self.perm) != list(range(x.ndim)):
            raise self.error(f"perm {self.perm} is not a permutation of {x.ndim} axes", x)
        return (TensorDesc(tuple(x.shape[p] for p in self.perm), x.dtype, x.device),)

    def cpu(self, x):
        return x.transpose(self.perm)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(Transpose(tuple(np.argsort(self.perm))), grads[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        T, nd = ctype, len(self.perm)
        return (_dims_src() +
                f"extern \"C\" __global__ void {_kname('transpose', T)}(const {T}* __restrict__ x, "
                f"{T}* __restrict__ y, gc_dims xs)\n{{\n"
                "    // y = x.transpose(PERM); x contiguous of shape xs, y contiguous\n"
                f"    const int ND = {nd}; const int PERM[] = {{{_c_list(self.perm)}}};\n"
                "    long long xstr[ND + 1], total = 1;          // x's element strides\n"
                "    for (int d = ND - 1; d >= 0; --d) { xstr[d] = total; total *= xs.d[d]; }\n" + _LOOP +
                "        long long t = idx, off = 0;\n"
                "        for (int d = ND - 1; d >= 0; --d) {     // y's axis d is x's axis PERM[d]\n"
                "            const long long n = xs.d[PERM[d]];\n"
                "            off += (t % n) * xstr[PERM[d]]; t /= n;\n"
                "        }\n"
                "        y[idx] = x[off];\n"
                "    }\n}\n")


class Broadcast(Op):
    name = "Broadcast"
    attrs = ("shape",)
    reduce_broadcast = True   # the gradient is the output grad, summed down centrally

    def __init__(self, shape: Sequence[int]):
        self.shape = tuple(int(s) for s in shape)
        self._seal()

    def infer(self, x):
        if x.shape is not None:
            try:
                if tuple(np.broadcast_shapes(x.shape, self.shape)) != self.shape:
                    raise ValueError
            except ValueError:
                raise self.error(f"cannot broadcast to {self.shape}", x) from None
        return (TensorDesc(self.shape, x.dtype, x.device),)

    def cpu(self, x):
        return np.broadcast_to(x, self.shape)

    def vjp(self, inputs, outputs, grads):
        return [grads[0]]

    def cuda_source(self, ctype: str = "float") -> str:
        return _broadcast_source("broadcast", ctype, ", gc_dims ys", _RUNTIME_OUT)

    def cuda(self, be, x):
        y = be.empty(self.shape, x.dtype)
        be.launch_n(be.kernel(self, be.ctype(x.dtype)), y.size, x, y, be.dims(x.shape), be.dims(self.shape))
        return y


class BroadcastToLike(Op):
    """broadcast x to the shape of ref."""
    name = "BroadcastToLike"
    shape_only_inputs = (1,)
    reduce_broadcast = True

    def infer(self, x, ref):
        return (TensorDesc(ref.shape, x.dtype, x.device),)

    def cpu(self, x, ref):
        return np.broadcast_to(x, ref.shape)

    def vjp(self, inputs, outputs, grads):
        return [grads[0], None]

    def cuda_source(self, ctype: str = "float") -> str:
        return _broadcast_source(
            "broadcast_to_like", ctype, ", gc_dims ys",
            "    const int ND = ys.n; const long long* OUT = ys.d;   // ref's shape\n"
            "    long long total = 1;\n"
            "    for (int d = 0; d < ND; ++d) total *= OUT[d];\n")


class SumToLike(Op):
    """Sum x down to the (broadcast-compatible) shape of ref."""
    name = "SumToLike"
    shape_only_inputs = (1,)

    def infer(self, x, ref):
        return (TensorDesc(ref.shape, x.dtype, x.device),)

    def cpu(self, x, ref):
        return sum_to(x, ref.shape)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(BroadcastToLike(), grads[0], inputs[0]), None]

    def cuda_source(self, ctype: str = "float") -> str:
        return _sum_to_source("sum_to_like", ctype, ", gc_dims ys",
                              "    const int NY = ys.n; const long long* YS = ys.d;   // ref's shape\n")


class SumTo(Op):
    """Sum x down to a fixed shape (the core's central broadcast reduction
    when a backward is itself recorded)."""
    name = "SumTo"
    attrs = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(int(s) for s in shape)
        self._seal()

    def infer(self, x):
        return (TensorDesc(self.shape, x.dtype, x.device),)

    def cpu(self, x):
        return sum_to(x, self.shape)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(BroadcastToLike(), grads[0], inputs[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        return _sum_to_source("sum_to", ctype, "",
                              f"    const int NY = {len(self.shape)}; "
                              f"const long long YS[] = {{{_c_list(self.shape)}}};\n")


def sum_to(x, shape):
    shape = tuple(shape)
    if x.shape == shape:
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape) if s == 1 and x.shape[i + lead] != 1)
    return np.asarray(x.sum(axis=axes)).reshape(shape)


class ZerosLike(Op):
    name = "ZerosLike"
    shape_only_inputs = (0,)

    def infer(self, ref):
        return (TensorDesc(ref.shape, ref.dtype, ref.device),)

    def cpu(self, ref):
        return np.zeros(ref.shape, ref.dtype)

    def vjp(self, inputs, outputs, grads):
        return [None]

    def cuda_source(self, ctype: str = "float") -> str:
        T = ctype
        return (f"extern \"C\" __global__ void {_kname('zeros_like', T)}({T}* __restrict__ y, long long total)\n{{\n"
                "    // y: total contiguous elements (ref is not passed)\n" + _LOOP +
                f"        y[idx] = ({T})0;\n"
                "    }\n}\n")


class ExpandDims(Op):
    name = "ExpandDims"
    attrs = ("axis",)

    def __init__(self, axis):
        self.axis = tuple(int(a) for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
        self._seal()

    def infer(self, x):
        if x.shape is None:
            return (TensorDesc(None, x.dtype, x.device),)
        nd = x.ndim + len(self.axis)
        axes = _norm_axes(self.axis, nd, self, x)
        shape, it = [], iter(x.shape)
        for i in range(nd):
            shape.append(1 if i in axes else next(it))
        return (TensorDesc(tuple(shape), x.dtype, x.device),)

    def cpu(self, x):
        return np.expand_dims(x, self.axis)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(ReshapeLike(), grads[0], inputs[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        return _copy_source("expand_dims", ctype, f"expand_dims at {self.axis}")


class Squeeze(Op):
    name = "Squeeze"
    attrs = ("axis",)

    def __init__(self, axis=None):
        if axis is not None:
            axis = tuple(int(a) for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
        self.axis = axis
        self._seal()

    def infer(self, x):
        if x.shape is None:
            return (TensorDesc(None, x.dtype, x.device),)
        if self.axis is None:
            return (TensorDesc(tuple(s for s in x.shape if s != 1), x.dtype, x.device),)
        axes = _norm_axes(self.axis, x.ndim, self, x)
        for a in axes:
            if x.shape[a] != 1:
                raise self.error(f"cannot squeeze axis {a} of size {x.shape[a]}", x)
        return (TensorDesc(tuple(s for i, s in enumerate(x.shape) if i not in axes), x.dtype, x.device),)

    def cpu(self, x):
        return np.squeeze(x, self.axis)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(ReshapeLike(), grads[0], inputs[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        return _copy_source("squeeze", ctype, f"squeeze of {self.axis if self.axis is not None else 'every size-1 axis'}")


class Cast(Op):
    name = "Cast"
    attrs = ("dtype",)

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self._seal()

    def infer(self, x):
        return (TensorDesc(x.shape, self.dtype, x.device),)

    def cpu(self, x):
        return x.astype(self.dtype)

    def vjp(self, inputs, outputs, grads):
        x = inputs[0]
        if x.dtype.kind not in "fc" or self.dtype.kind not in "fc":
            return [None]
        return [_apply1(Cast(x.dtype), grads[0])]

    def cuda(self, be, x):
        y = be.empty(x.shape, self.dtype)
        src = self.cuda_source(be.ctype(x.dtype), be.ctype(self.dtype))
        be.launch_n(be.kernel(self, be.ctype(x.dtype), source=src), y.size, x, y, y.size)
        return y

    def cuda_source(self, ctype: str = "float", to_ctype: Optional[str] = None) -> str:
        """Convert ``ctype`` elements to ``to_ctype`` (default: the C type of
        the op's dtype); the kernel is ``gc_cast_<ctype>_to_<to_ctype>``."""
        if to_ctype is None:
            if self.dtype.name not in CUDA_CTYPES:
                raise ValueError(f"Cast: no CUDA C type for {self.dtype}")
            to_ctype = CUDA_CTYPES[self.dtype.name]
        T, U = ctype, to_ctype
        name = f"gc_cast_{T}_to_{U}".replace(" ", "_")
        return (f"extern \"C\" __global__ void {name}(const {T}* __restrict__ x, {U}* __restrict__ y, "
                "long long total)\n{\n"
                "    // x, y: total contiguous elements\n" + _LOOP +
                f"        y[idx] = ({U})x[idx];\n"
                "    }\n}\n")


class Copy(Op):
    """``x`` copied to ``device`` ("cpu" or "cuda"): ``Tensor.to(device)``.
    Differentiable: the gradient is copied back to the input's device."""
    name = "Copy"
    attrs = ("device",)

    def __init__(self, device: str = "cpu"):
        from gradcore.tensor_methods import norm_device
        self.device = norm_device(device)
        self._seal()

    def infer(self, x):
        return (TensorDesc(x.shape, x.dtype, self.device),)

    def cpu(self, x):
        # runs wherever the input is (backward graphs call it on either device)
        from gradcore import devices
        if self.device == "cpu":
            return np.array(devices.to_host(x))
        if isinstance(x, np.ndarray):
            return devices.to_device(x, self.device)
        return x.copy()

    def cuda(self, be, x):
        return self.cpu(x)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(Copy(inputs[0].device), grads[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_copy_<ctype>(x, y, total)``: a device-to-device copy of
        contiguous arrays (host <-> device copies are driver memcpys)."""
        return (f"extern \"C\" __global__ void {_kname('copy', ctype)}(const {ctype}* __restrict__ x, "
                f"{ctype}* __restrict__ y, long long total)\n{{\n" + _LOOP + "        y[idx] = x[idx];\n    }\n}\n")


class Identity(Op):
    name = "Identity"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x

    def vjp(self, inputs, outputs, grads):
        return [grads[0]]

    def cuda_source(self, ctype: str = "float") -> str:
        return _copy_source("identity", ctype, "identity")


class StopGradient(Op):
    """Identity in the forward, no gradient in the backward."""
    name = "StopGradient"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x

    def vjp(self, inputs, outputs, grads):
        return [None]

    def cuda_source(self, ctype: str = "float") -> str:
        return _copy_source("stop_gradient", ctype, "stop_gradient (identity forward)")


class Concat(Op):
    name = "Concat"
    attrs = ("axis",)

    def __init__(self, axis=0):
        self.axis = int(axis)
        self._seal()

    def infer(self, *xs):
        if not xs:
            raise self.error("needs at least one input")
        dtype = np.result_type(*[x.dtype for x in xs])
        if any(x.shape is None for x in xs):
            return (TensorDesc(None, dtype, xs[0].device),)
        nd = xs[0].ndim
        if any(x.ndim != nd for x in xs) or not -nd <= self.axis < nd:
            raise self.error("inputs must have the same number of dimensions and a valid axis", *xs)
        ax = self.axis % nd
        for x in xs:
            if any(x.shape[i] != xs[0].shape[i] for i in range(nd) if i != ax):
                raise self.error(f"shapes differ outside axis {ax}", *xs)
        shape = list(xs[0].shape)
        shape[ax] = sum(x.shape[ax] for x in xs)
        return (TensorDesc(tuple(shape), dtype, xs[0].device),)

    def cpu(self, *xs):
        return np.concatenate(xs, axis=self.axis)

    def vjp(self, inputs, outputs, grads):
        return list(_core.apply(SplitLike(self.axis), grads[0], *inputs))

    def cuda_source(self, ctype: str = "float") -> str:
        T = ctype
        return (f"extern \"C\" __global__ void {_kname('concat', T)}(const {T}* __restrict__ x, "
                f"{T}* __restrict__ y, long long outer, long long n, long long offset, long long len, "
                "long long inner)\n{\n"
                f"    // one launch per input (axis {self.axis}): y[:, offset:offset + len, :] = x, y viewed\n"
                "    // as (outer, n, inner) around the axis and x as (outer, len, inner); inputs of\n"
                "    // another dtype are cast to y's first\n"
                "    const long long total = outer * len * inner;\n" + _LOOP +
                "        const long long i = idx % inner; const long long t = idx / inner;\n"
                "        const long long j = t % len; const long long o = t / len;\n"
                "        y[(o * n + offset + j) * inner + i] = x[idx];\n"
                "    }\n}\n")


class SplitLike(Op):
    """Split x along axis into pieces sized like refs (concat's backward)."""
    name = "SplitLike"
    attrs = ("axis",)

    def __init__(self, axis):
        self.axis = int(axis)
        self.shape_only_inputs = tuple(range(1, 4096))
        self._seal()

    def infer(self, x, *refs):
        return tuple(TensorDesc(r.shape, x.dtype, x.device) for r in refs)

    def cpu(self, x, *refs):
        if len(refs) == 1:    # one output: the array itself, as backward graphs call it
            return x
        bounds = np.cumsum([r.shape[self.axis] for r in refs])[:-1]
        return tuple(np.split(x, bounds, axis=self.axis))

    def vjp(self, inputs, outputs, grads):
        return [_apply1(Concat(self.axis), *grads)] + [None] * (len(inputs) - 1)

    def cuda_source(self, ctype: str = "float") -> str:
        T = ctype
        return (f"extern \"C\" __global__ void {_kname('split_like', T)}(const {T}* __restrict__ x, "
                f"{T}* __restrict__ y, long long outer, long long n, long long offset, long long len, "
                "long long inner)\n{\n"
                f"    // one launch per output (axis {self.axis}): y = x[:, offset:offset + len, :], x viewed\n"
                "    // as (outer, n, inner) around the axis and y as (outer, len, inner)\n"
                "    const long long total = outer * len * inner;\n" + _LOOP +
                "        const long long i = idx % inner; const long long t = idx / inner;\n"
                "        const long long j = t % len; const long long o = t / len;\n"
                "        y[idx] = x[(o * n + offset + j) * inner + i];\n"
                "    }\n}\n")

# ---------------------------------------------------------------- split / stack
# CUDA kernels of the copy ops below: one thread per output element
# (grid-stride loop); the caller collapses the shape to (outer, axis, inner)
# and passes it as integer arguments after the pointers.
_LOOP = ("    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;\n"
         "         idx += (long long)blockDim.x * gridDim.x) {\n")


def _kname(op_name, ctype):
    return f"gc_{op_name}_{ctype.replace(' ', '_')}"


def _split_sizes(sections, n):
    """Piece sizes along an axis of length ``n``: ``sections`` is a number of
    parts (np.array_split / MegEngine: the first ``n % parts`` pieces are one
    longer) or a tuple of split indices (MegEngine: non-decreasing, <= n)."""
    if isinstance(sections, int):
        return [(n + sections - i - 1) // sections for i in range(sections)]
    bounds = (0,) + tuple(sections) + (n,)
    return [bounds[i + 1] - bounds[i] for i in range(len(sections) + 1)]


class Split(Op):
    """Split x along ``axis`` (MegEngine's ``F.split``): ``sections`` is an int
    (that many pieces, as np.array_split) or a tuple of split indices."""
    name = "Split"
    attrs = ("axis", "sections")

    def __init__(self, axis=0, sections=1):
        self.axis = int(axis)
        if isinstance(sections, (int, np.integer)):
            self.sections = int(sections)
        else:
            self.sections = tuple(int(s) for s in sections)
        self._seal()

    @property
    def n_out(self):
        return self.sections if isinstance(self.sections, int) else len(self.sections) + 1

    def infer(self, x):
        if x.shape is None:       # traced: checked when the shape is known
            return tuple(TensorDesc(None, x.dtype, x.device) for _ in range(max(self.n_out, 0)))
        if isinstance(self.sections, int) and self.sections <= 0:
            raise self.error(f"the number of sections must be positive, got {self.sections}", x)
        nd = x.ndim
        if not -nd <= self.axis < nd:
            raise self.error(f"axis {self.axis} is out of range for {nd} dimensions", x)
        ax = self.axis % nd
        n = x.shape[ax]
        if isinstance(self.sections, int) and self.sections > n:
            raise self.error(f"axis {ax} of size {n} cannot be split into {self.sections} sections", x)
        sizes = _split_sizes(self.sections, n)
        if any(s < 0 for s in sizes):
            raise self.error(f"split indices {self.sections} must be non-decreasing and within "
                             f"[0, {n}] (axis {ax} has size {n})", x)
        out = []
        for s in sizes:
            shape = list(x.shape)
            shape[ax] = s
            out.append(TensorDesc(tuple(shape), x.dtype, x.device))
        return tuple(out)

    def cpu(self, x):
        self.infer(TensorDesc(x.shape, x.dtype))     # bad input: Split's own error
        ax = self.axis % x.ndim
        sizes = _split_sizes(self.sections, x.shape[ax])
        if len(sizes) == 1:
            return x
        return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=ax))

    def vjp(self, inputs, outputs, grads):
        # a piece without a gradient gets zeros (filled in by the core)
        return [_apply1(Concat(self.axis), *grads) if grads else None]

    def cuda_source(self, ctype: str = "float") -> str:
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('split', T)}(const {T}* __restrict__ x, "
            f"{T}* __restrict__ y, long long outer, int n, int offset, int len, long long inner)\n{{\n"
            "    // y = x[:, offset:offset + len, :] of x viewed as (outer, n, inner)\n"
            "    const long long total = outer * len * inner;\n" + _LOOP +
            "        const long long i = idx % inner; const long long t = idx / inner;\n"
            "        const long long j = t % len; const long long o = t / len;\n"
            "        y[idx] = x[(o * n + offset + j) * inner + i];\n"
            "    }\n}\n")


def _stack_axis(op, axis, nd, descs):
    if not -(nd + 1) <= axis <= nd:
        raise op.error(f"axis {axis} is out of range for stacking {nd}-dimensional inputs", *descs)
    return axis % (nd + 1)


class Stack(Op):
    """Stack equally shaped inputs along a new ``axis``."""
    name = "Stack"
    attrs = ("axis",)

    def __init__(self, axis=0):
        self.axis = int(axis)
        self._seal()

    def infer(self, *xs):
        if not xs:
            raise self.error("needs at least one input")
        dtype = np.result_type(*[x.dtype for x in xs])
        if any(x.shape is None for x in xs):
            return (TensorDesc(None, dtype, xs[0].device),)
        shape = xs[0].shape
        if any(x.shape != shape for x in xs):
            raise self.error("all inputs must have the same shape", *xs)
        ax = _stack_axis(self, self.axis, len(shape), xs)
        return (TensorDesc(shape[:ax] + (len(xs),) + shape[ax:], dtype, xs[0].device),)

    def cpu(self, *xs):
        self.infer(*[TensorDesc(x.shape, x.dtype) for x in xs])
        return np.stack(xs, axis=self.axis)

    def vjp(self, inputs, outputs, grads):
        gs = _core.apply(Unstack(self.axis, len(inputs)), grads[0])
        out = []
        for x, g in zip(inputs, gs):
            if x.dtype != g.dtype and x.dtype.kind in "fc":
                g = _apply1(Cast(x.dtype), g)
            out.append(g)
        return out

    def cuda_source(self, ctype: str = "float") -> str:
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('stack', T)}(const {T}* __restrict__ x, "
            f"{T}* __restrict__ y, long long outer, int n, int k, long long inner)\n{{\n"
            "    // y[:, k, :] = x, y viewed as (outer, n, inner) and x as (outer, inner)\n"
            "    const long long total = outer * inner;\n" + _LOOP +
            "        const long long i = idx % inner; const long long o = idx / inner;\n"
            "        y[(o * n + k) * inner + i] = x[idx];\n"
            "    }\n}\n")


class Unstack(Op):
    """The ``n`` slices of x along ``axis``, that axis removed (Stack's backward)."""
    name = "Unstack"
    attrs = ("axis", "n")

    def __init__(self, axis=0, n=1):
        self.axis, self.n = int(axis), int(n)
        self._seal()

    def infer(self, x):
        if x.shape is None:
            return tuple(TensorDesc(None, x.dtype, x.device) for _ in range(self.n))
        nd = x.ndim
        if nd == 0 or not -nd <= self.axis < nd:
            raise self.error(f"axis {self.axis} is out of range for {nd} dimensions", x)
        ax = self.axis % nd
        if x.shape[ax] != self.n:
            raise self.error(f"axis {ax} has size {x.shape[ax]}, expected {self.n}", x)
        shape = x.shape[:ax] + x.shape[ax + 1:]
        return tuple(TensorDesc(shape, x.dtype, x.device) for _ in range(self.n))

    def cpu(self, x):
        ax = self.axis % x.ndim
        parts = tuple(np.take(x, i, axis=ax) for i in range(self.n))
        return parts[0] if self.n == 1 else parts

    def vjp(self, inputs, outputs, grads):
        return [_apply1(Stack(self.axis), *grads)]

    def cuda_source(self, ctype: str = "float") -> str:
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('unstack', T)}(const {T}* __restrict__ x, "
            f"{T}* __restrict__ y, long long outer, int n, int k, long long inner)\n{{\n"
            "    // y = x[:, k, :], x viewed as (outer, n, inner)\n"
            "    const long long total = outer * inner;\n" + _LOOP +
            "        const long long i = idx % inner; const long long o = idx / inner;\n"
            "        y[idx] = x[(o * n + k) * inner + i];\n"
            "    }\n}\n")


# ---------------------------------------------------------------- CUDA helpers
# of the shape ops above (same conventions as the split / stack kernels; a
# rank not known from the op's attributes comes as a ``gc_dims`` struct by
# value, at most GC_MAX_DIMS = 8 dimensions).
CUDA_CTYPES = {"float32": "float", "float64": "double", "int8": "signed char", "int16": "short",
               "int32": "int", "int64": "long long", "uint8": "unsigned char", "uint16": "unsigned short",
               "uint32": "unsigned int", "uint64": "unsigned long long", "bool": "bool"}


def _dims_src():
    from .indexing import _DIMS      # one guarded gc_dims definition for every op
    return _DIMS


def _c_list(values):
    """A C initializer list; padded so that a 0-d one is not empty."""
    return ", ".join([str(int(v)) for v in values] + ["1"])


def _copy_source(op_name, T, what):
    return (f"extern \"C\" __global__ void {_kname(op_name, T)}(const {T}* __restrict__ x, "
            f"{T}* __restrict__ y, long long total)\n{{\n"
            f"    // {what}: a contiguous copy of total elements\n" + _LOOP +
            "        y[idx] = x[idx];\n"
            "    }\n}\n")


# the output shape as a kernel argument (one kernel for every shape)
_RUNTIME_OUT = ("    const int ND = ys.n; const long long* OUT = ys.d;\n"
                "    long long total = 1;\n    for (int d = 0; d < ND; ++d) total *= OUT[d];\n")


def _broadcast_source(op_name, T, extra_params, shape_decl):
    """y (shape OUT of rank ND, contiguous) = x broadcast: x contiguous of
    shape xs, right-aligned to OUT (size-1 and missing axes repeat)."""
    return (_dims_src() +
            f"extern \"C\" __global__ void {_kname(op_name, T)}(const {T}* __restrict__ x, "
            f"{T}* __restrict__ y, gc_dims xs{extra_params})\n{{\n"
            "    // x: contiguous, shape xs right-aligned to OUT; y: contiguous, shape OUT\n" + shape_decl + _LOOP +
            "        long long t = idx, off = 0, stride = 1;\n"
            "        for (int d = ND - 1; d >= 0; --d) {\n"
            "            const long long c = t % OUT[d]; t /= OUT[d];\n"
            "            const int j = d - (ND - xs.n);           // x's axis under y's axis d\n"
            "            if (j >= 0) { if (xs.d[j] != 1) off += c * stride; stride *= xs.d[j]; }\n"
            "        }\n"
            "        y[idx] = x[off];\n"
            "    }\n}\n")


def _sum_to_source(op_name, T, extra_params, shape_decl):
    """y (shape YS of rank NY) = x summed over its broadcast axes: x's leading
    axes, and those where YS (right-aligned) has 1 and x more. One thread per
    output element loops over every x element that maps to it."""
    return (_dims_src() +
            f"extern \"C\" __global__ void {_kname(op_name, T)}(const {T}* __restrict__ x, "
            f"{T}* __restrict__ y, gc_dims xs{extra_params})\n{{\n"
            "    // x: contiguous of shape xs; y: contiguous, shape YS right-aligned to xs\n" + shape_decl +
            "    const int lead = xs.n - NY;\n"
            "    bool summed[GC_MAX_DIMS];\n"
            "    long long total = 1, count = 1;\n"
            "    for (int d = 0; d < NY; ++d) total *= YS[d];\n"
            "    for (int d = 0; d < xs.n; ++d) {\n"
            "        summed[d] = d < lead || (YS[d - lead] == 1 && xs.d[d] != 1);\n"
            "        if (summed[d]) count *= xs.d[d];\n"
            "    }\n" + _LOOP +
            "        long long t = idx, base = 0, stride = 1;   // x offset of the kept coordinates\n"
            "        for (int d = xs.n - 1; d >= lead; --d) {\n"
            "            const long long c = t % YS[d - lead]; t /= YS[d - lead];\n"
            "            if (!summed[d]) base += c * stride;\n"
            "            stride *= xs.d[d];\n"
            "        }\n"
            f"        {T} acc = 0;\n"
            "        for (long long r = 0; r < count; ++r) {  // r: coordinates over the summed axes\n"
            "            long long u = r, off = base, s = 1;\n"
            "            for (int d = xs.n - 1; d >= 0; --d) {\n"
            "                if (summed[d]) { off += (u % xs.d[d]) * s; u /= xs.d[d]; }\n"
            "                s *= xs.d[d];\n"
            "            }\n"
            "            acc += x[off];\n"
            "        }\n"
            "        y[idx] = acc;\n"
            "    }\n}\n")
