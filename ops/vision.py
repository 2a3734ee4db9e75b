"""Resizing of NCHW images: ``Interpolate(size, mode, align_corners)`` and
its adjoint ``InterpolateBackward``, MegEngine's ``F.vision.interpolate``.

Every mode is a separable linear map: along each spatial axis the output is
``A @ x`` with A an (out, in) matrix of interpolation weights (one 1 per row
for "nearest", two weights per row for "bilinear", four for "bicubic"), so

    Interpolate          y  = A_h @ x  @ A_w^T   -> InterpolateBackward (g, x_ref)
    InterpolateBackward  gx = A_h^T @ g @ A_w     -> Interpolate (gg)

and every order of derivative follows. Source coordinates follow the
output/input size ratio (MegEngine's resize, PyTorch's with
``recompute_scale_factor=True``): "nearest" reads ``floor(o * in / out)``
(computed in float32, as PyTorch does), the others sample at ``(o + 0.5) *
in / out - 0.5`` (clamped at 0 for "bilinear"), or at ``o * (in - 1) /
(out - 1)`` with ``align_corners``; "bicubic" is Keys' cubic convolution
(a = -0.75) over the taps floor(src) - 1 .. + 2, those outside the axis
reading its edge (PyTorch's and OpenCV's).

CPU kernels: the bilinear forward (``align_corners=False``, float32) is
oneDNN's linear resampling (2x faster than the NumPy path here, on every
thread). Otherwise each axis is either one matrix product with its (small)
matrix, where its rows are long enough against their nonzeros for BLAS to
win (the adjoint of a 64 -> 128 upsampling: 24 against 42 ms, one thread),
or one gather-and-scale per nonzero of a row (two for a bilinear row; the
adjoint of an upsampling has a few more), vectorised over everything else.
A product multiplies every element of a row, zero weights too, so an input
with an inf or NaN anywhere in a row would spread it along the row: a
result that is not finite is computed again by gathers, which confine it
to the taps that read it (as PyTorch's kernels do). CUDA: one kernel for both
ops, one thread per output element summing over the nonzero weights of its
row of each axis' matrix (tables built on the host: the matrix for the
forward, its transpose for the adjoint; no atomics).
"""
from __future__ import annotations

import functools
from typing import Tuple

import numpy as np

from gradcore import _core
from gradcore.op import Op, TensorDesc
from gradcore.cpu import onednn
from gradcore.cuda.kernels import Kernel

from .linalg import check_cuda_dtype
from .reduce import op_int

INTERPOLATE_MODES = ("nearest", "bilinear", "bicubic")
# the cubic convolution's coefficient (Keys' a; PyTorch's, OpenCV's and MegEngine's)
_CUBIC_A = -0.75


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """The four cubic-convolution weights of taps -1, 0, 1, 2 for a source
    position ``t`` in [0, 1) past tap 0: (len(t), 4)."""
    a = _CUBIC_A

    def near(d):        # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):         # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], 1)


def axis_weights(n_in: int, n_out: int, mode: str, align_corners: bool, dtype="float64") -> np.ndarray:
    """The (n_out, n_in) interpolation matrix along one axis.

    Example::

        >>> axis_weights(2, 4, "nearest", False).tolist()
        [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]
    """
    a = np.zeros((n_out, n_in), dtype)
    if n_in == 0 or n_out == 0:
        return a
    rows = np.arange(n_out)
    if mode == "nearest":
        scale = np.float32(n_in) / np.float32(n_out)
        src = np.minimum(np.floor(rows.astype(np.float32) * scale).astype(np.int64), n_in - 1)
        a[rows, src] = 1
        return a
    if align_corners:
        src = rows * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
    else:
        src = (rows + 0.5) * (n_in / n_out) - 0.5
    if mode == "bicubic":
        # taps floor(src) - 1 .. + 2, those outside the axis read its edge
        # (PyTorch's bicubic: src is not clamped at 0 as the linear one is)
        base = np.floor(src).astype(np.int64)
        weights = _cubic_weights(src - base)
        for k in range(4):
            np.add.at(a, (rows, np.clip(base - 1 + k, 0, n_in - 1)), weights[:, k])
        return a
    src = np.maximum(src, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    lam = src - i0
    np.add.at(a, (rows, i0), 1 - lam)
    np.add.at(a, (rows, i1), lam)
    return a


# a row of an axis' matrix is one matrix product's worth of work when it is
# at most this many times longer than its nonzeros (a gather per nonzero
# costs about as much as this many multiply-adds of a product, measured)
_DENSE_PER_TAP = 32


@functools.lru_cache(maxsize=64)
def _axis_plan(n_in: int, n_out: int, mode: str, align_corners: bool, dtype: str, adjoint: bool):
    """One axis of Interpolate (or of its adjoint): (matrix, tap columns,
    tap weights, by matrix product?), read-only, cached."""
    a = axis_weights(n_in, n_out, mode, align_corners, dtype)
    if adjoint:
        a = np.ascontiguousarray(a.T)
    idx, wt = _row_taps(a)
    for arr in (a, idx, wt):
        arr.flags.writeable = False
    return a, idx, wt, a.shape[1] <= _DENSE_PER_TAP * idx.shape[1]


def _apply_axis(x, plan, axis: int, dense: bool):
    """The plan's matrix applied along ``axis`` (2 or 3) of x (N, C, H, W)."""
    a, idx, wt, _ = plan
    n, c, h, w = x.shape
    if dense:
        # (a broadcast gradient reshapes to a view with zero strides, which
        # NumPy's matmul multiplies without BLAS: 26 ms against 9.5)
        x = np.ascontiguousarray(x)
        if axis == 3:
            return (x.reshape(n * c * h, w) @ a.T).reshape(n, c, h, a.shape[0])
        return np.matmul(a, x.reshape(n * c, h, w)).reshape(n, c, a.shape[0], w)
    scale = wt.reshape(wt.shape + (1,) * (3 - axis))          # broadcasts along the later axes
    out = np.take(x, idx[:, 0], axis=axis)
    out *= scale[:, 0]
    for k in range(1, idx.shape[1]):                          # loops over taps only
        term = np.take(x, idx[:, k], axis=axis)
        term *= scale[:, k]
        # a row's padding taps (weight 0 at column 0) add nothing, also where
        # column 0 holds an inf or NaN (0 * inf would be NaN)
        out += np.where(scale[:, k] != 0, term, 0) if (wt[:, k] == 0).any() else term
    return out


def _csr(a):
    """Row tables of matrix ``a``: (row starts (rows + 1,), column of each
    nonzero, its weight), the kernel's view of one axis."""
    rows, cols = np.nonzero(a)
    starts = np.searchsorted(rows, np.arange(a.shape[0] + 1)).astype(np.int32)
    return starts, cols.astype(np.int32), a[rows, cols]


def _row_taps(a):
    """Matrix ``a`` (rows, cols) as (column indices, weights), both (rows,
    K) with K the most nonzeros in a row; shorter rows are padded with
    weight 0 at column 0."""
    nz = a != 0
    k = max(1, int(nz.sum(1).max())) if a.size else 1
    order = np.argsort(~nz, axis=1, kind="stable")[:, :k]      # each row's nonzero columns first
    weights = np.take_along_axis(a, order, 1)
    return np.where(weights != 0, order, 0), weights


_RESIZE = Kernel("resize2d", "const T* __restrict__ x, T* __restrict__ y, const int* __restrict__ hstart, "
                 "const int* __restrict__ hcol, const T* __restrict__ hval, const int* __restrict__ wstart, "
                 "const int* __restrict__ wcol, const T* __restrict__ wval, long long NC, int H, int W, int OH, int OW", """
    const int q = (int)(idx % OW); long long t = idx / OW;
    const int p = (int)(t % OH); const long long nc = t / OH;
    const T* xc = x + nc * H * W;
    T acc = 0;
    for (int a = hstart[p]; a < hstart[p + 1]; ++a) {
        T row = 0;
        for (int b = wstart[q]; b < wstart[q + 1]; ++b)
            row += wval[b] * xc[(long long)hcol[a] * W + wcol[b]];
        acc += hval[a] * row;
    }
    y[idx] = acc;""", over="total", setup="const long long total = NC * OH * OW;")


class _InterpBase(Op):
    attrs = ("size", "mode", "align_corners")

    def __init__(self, size, mode="bilinear", align_corners=False):
        n = self.name
        if not isinstance(size, (tuple, list)) or len(size) != 2:
            raise ValueError(f"{n}: size must be a pair (out_height, out_width), got {size!r}")
        self.size = tuple(op_int(n, "size", s) for s in size)
        if min(self.size) < 1:
            raise ValueError(f"{n}: size must be positive, got {size!r}")
        if mode not in INTERPOLATE_MODES:
            raise ValueError(f"{n}: mode must be one of {', '.join(INTERPOLATE_MODES)}, got {mode!r}")
        if align_corners and mode == "nearest":
            raise ValueError(f"{n}: align_corners only applies to modes 'bilinear' and 'bicubic'")
        self.mode, self.align_corners = mode, bool(align_corners)

    @classmethod
    def _example_ops(cls):
        return [cls((5, 3), "bilinear", False), cls((2, 7), "bilinear", True), cls((5, 2), "nearest", False),
                cls((5, 9), "bicubic", False), cls((2, 3), "bicubic", True)]

    def _check_input(self, x, descs, what="input"):
        if x.dtype.kind != "f":
            raise self.error(f"needs a floating-point {what}, got {x.dtype}", *descs)
        if x.shape is not None and len(x.shape) != 4:
            raise self.error(f"{what} must be 4-D (N, C, H, W), got {len(x.shape)}-D", *descs)
        if x.shape is not None and 0 in x.shape[2:]:
            raise self.error(f"{what} has an empty spatial axis: nothing to interpolate from", *descs)

    def _matrices(self, in_hw, dtype, adjoint=False):
        """The (H, W) axes' matrices (transposed for the adjoint)."""
        return [self._plan(i, o, dtype, adjoint)[0] for i, o in zip(in_hw, self.size)]

    def _plan(self, n_in, n_out, dtype, adjoint):
        return _axis_plan(int(n_in), int(n_out), self.mode, self.align_corners, np.dtype(dtype).str, adjoint)

    def _separable(self, x, in_hw, adjoint=False):
        """``ah @ x @ aw^T`` over the last two axes of x (N, C, H, W) (the
        adjoint: ``ah^T @ x @ aw``), each axis by a matrix product or by
        gathers (the module docstring)."""
        plans = [(axis, self._plan(i, o, x.dtype, adjoint)) for axis, i, o in zip((2, 3), in_hw, self.size)]
        # (products only where BLAS runs them: float32, float64)
        dense = any(plan[3] for _, plan in plans) and x.dtype in (np.float32, np.float64)
        if dense:
            # (an inf times a zero weight warns; that result is not kept)
            with np.errstate(invalid="ignore", over="ignore"):
                out = x
                for axis, plan in reversed(plans):      # W first: an upsampling's H pass then reads less
                    out = _apply_axis(out, plan, axis, plan[3])
                if np.isfinite(out.sum()):
                    return out
        out = x                 # gathers (a product spreads an inf or NaN along its row; they confine it)
        for axis, plan in reversed(plans):
            out = _apply_axis(out, plan, axis, False)
        return out

    def _cuda_run(self, be, x, out, ah, aw):
        """``ah @ x @ aw^T`` on cuda, ``out`` a TensorDesc: the shared kernel."""
        check_cuda_dtype(self, out.dtype)
        y = be.empty(out.shape, out.dtype)
        if y.size == 0:
            return y
        tables = [be.to_device(t) for a in (ah, aw) for t in _csr(a)]
        n, c, h, w = x.shape
        be.launch_n(be.kernel(self, be.ctype(out.dtype)), y.size, x, y, *tables,
                    np.int64(n * c), np.int32(h), np.int32(w), np.int32(out.shape[2]), np.int32(out.shape[3]))
        return y

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_resize2d_<ctype>(x, y, hstart, hcol, hval, wstart, wcol, wval,
        long long NC, int H, int W, int OH, int OW)``: one thread per element
        of y (NC, OH, OW) (grid-stride loop), summing x (NC, H, W) over the
        nonzeros of its row p of the height matrix (``hstart[p]`` ..
        ``hstart[p+1]``, columns ``hcol``, weights ``hval``) and its row q
        of the width matrix."""
        return _RESIZE.source(ctype)


class Interpolate(_InterpBase):
    """x (N, C, H, W) resized to (N, C, *size) by ``mode`` ("nearest",
    "bilinear" or "bicubic", the last two with or without ``align_corners``).

    Example::

        >>> from gradcore.functional.vision import Interpolate
        >>> x = gc.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
        >>> y, = gc.core.apply(Interpolate((2, 4), mode="nearest"), x)
        >>> y.numpy()
        array([[[[1., 1., 2., 2.],
                 [3., 3., 4., 4.]]]], dtype=float32)
    """
    name = "Interpolate"
    reduce_broadcast = False

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: up and down, both modes."""
        rng = np.random.default_rng(0)
        return [(op, [rng.standard_normal((2, 2, 3, 4))]) for op in cls._example_ops()]

    def infer(self, x):
        self._check_input(x, (x,))
        shape = None if x.shape is None else x.shape[:2] + self.size
        return (TensorDesc(shape, x.dtype, x.device),)

    def cpu(self, x):
        self.infer(TensorDesc(x.shape, x.dtype))
        if self.mode == "bilinear" and not self.align_corners:
            y = onednn.resample(x, self.size)       # None: not float32, no oneDNN
            if y is not None:
                return y
        return self._separable(x, x.shape[2:])

    def cuda(self, be, x):
        (out,) = self.infer_arrays(x)
        ah, aw = self._matrices(x.shape[2:], x.dtype)
        return self._cuda_run(be, x, out, ah, aw)

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return [_core.apply(InterpolateBackward(self.size, self.mode, self.align_corners), g, x)[0]]


class InterpolateBackward(_InterpBase):
    """(g, x_ref) -> the adjoint of Interpolate applied to g (N, C, *size):
    an array shaped like x_ref (read only for its shape)."""
    name = "InterpolateBackward"
    reduce_broadcast = False
    shape_only_inputs = (1,)

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: the adjoints of Interpolate's examples."""
        rng = np.random.default_rng(0)
        return [(op, [rng.standard_normal((2, 2) + op.size), rng.standard_normal((2, 2, 3, 4))])
                for op in cls._example_ops()]

    def infer(self, g, ref):
        self._check_input(g, (g, ref), "gradient")
        self._check_input(ref, (g, ref), "reference input")
        if g.shape is not None and ref.shape is not None and tuple(g.shape) != ref.shape[:2] + self.size:
            raise self.error(f"gradient must have shape {ref.shape[:2] + self.size}", g, ref)
        return (TensorDesc(ref.shape, g.dtype, g.device),)

    def cpu(self, g, ref):
        self.infer(TensorDesc(g.shape, g.dtype), TensorDesc(ref.shape, ref.dtype))
        # (oneDNN's resampling backward took 104 ms against these kernels' 24
        # on the adjoint of a 64 -> 128 upsampling: not used)
        return self._separable(g, ref.shape[2:], adjoint=True)

    def cuda(self, be, g, ref):
        (out,) = self.infer_arrays(g, ref)
        ah, aw = self._matrices(ref.shape[2:], g.dtype, adjoint=True)
        return self._cuda_run(be, g, out, ah, aw)

    def vjp(self, inputs, outputs, grads):
        (g, ref), (gg,) = inputs, grads
        return [_core.apply(Interpolate(self.size, self.mode, self.align_corners), gg)[0], None]


VISION_OPS = [Interpolate, InterpolateBackward]
