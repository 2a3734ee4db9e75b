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
from gradcore.op import IndexOpError, Op, TensorDesc
from gradcore.cpu import onednn
from gradcore.cuda.kernels import Kernel

from .elemwise import round_half_away
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


# ---- deformable position-sensitive RoI pooling (Deformable R-FCN, MegEngine's
# DeformablePSROIPooling)
#
# Per box n (rois[n] = image index, x1, y1, x2, y2) and output bin (ph, pw),
# out[n, c] is the mean of the S x S bilinear samples (S = sample_per_part)
# of channel c of the box's image at
#     h = hl + ph * bin_h + ty * roi_h + i * bin_h / S     (i, j < S)
#     w = wl + pw * bin_w + tx * roi_w + j * bin_w / S
# with hl, wl, roi_h, roi_w from the box's corners rounded half away from
# zero and scaled by spatial_scale (less half a pixel; the image index is
# truncated toward zero, as C's cast: MegEngine's test passes 0.65), the offsets
# (tx, ty) = trans_std * trans[n, (0, 1), part_h, part_w] (none when
# no_trans), part_h = floor(ph / pooled_h * part_size). A sample outside
# [-0.5, size - 0.5] on either axis is dropped, the others are clamped into
# the image; ``count`` is the number kept (a bin with none is 0). MegEngine
# does not group channels by bin: out is (R, C, pooled_h, pooled_w), as its
# op's.
#
# MegEngine's kernel indexes trans with part_size as the stride of its last
# two axes while its shape check makes them (pooled_h, pooled_w); both agree
# when part_size equals them (its test, Deformable R-FCN's use). Here trans
# is read at [n, k, part_h, part_w] always, so part_size may be at most
# pooled_h and pooled_w (otherwise MegEngine reads out of place).
#
# Gradients: the outputs are sparse linear maps of inp given the sample
# positions (scatter-add of the same weights), and bilinear in the offsets
# (the sample's slope along each axis, times trans_std and the box's size);
# rois are positions (rounded: their gradient is zero almost everywhere)
# and get None, as MegEngine's backward gives them none. The count, and the
# set of samples kept, is piecewise constant in trans: no gradient. The
# backward op has no gradient of its own (MegEngine's is first order only).

class _PSROIBase(Op):
    attrs = ("no_trans", "part_size", "pooled_h", "pooled_w", "sample_per_part", "spatial_scale", "trans_std")
    reduce_broadcast = False
    devices = ("cpu", "cuda")
    max_grad_order = 1

    def __init__(self, no_trans: bool = False, part_size: int = 2, pooled_h: int = 2, pooled_w: int = 2,
                 sample_per_part: int = 2, spatial_scale: float = 1.0, trans_std: float = 0.1):
        n = self.name
        self.no_trans = bool(no_trans)
        self.part_size = op_int(n, "part_size", part_size)
        self.pooled_h = op_int(n, "pooled_h", pooled_h)
        self.pooled_w = op_int(n, "pooled_w", pooled_w)
        self.sample_per_part = op_int(n, "sample_per_part", sample_per_part)
        self.spatial_scale, self.trans_std = float(spatial_scale), float(trans_std)
        if min(self.pooled_h, self.pooled_w, self.sample_per_part, self.part_size) < 1:
            raise ValueError(f"{n}: pooled_h, pooled_w, sample_per_part and part_size must be positive, got "
                             f"{self.pooled_h}, {self.pooled_w}, {self.sample_per_part}, {self.part_size}")
        if not self.no_trans and self.part_size > min(self.pooled_h, self.pooled_w):
            raise ValueError(f"{n}: part_size ({self.part_size}) must be at most pooled_h ({self.pooled_h}) and "
                             f"pooled_w ({self.pooled_w}): trans is (R, 2, pooled_h, pooled_w), read at the part")

    @classmethod
    def _example_cases(cls):
        """(op, inp, rois, trans) cases: offsets and none, a box partly outside
        the image (dropped samples), parts coarser than the bins, two images."""
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 3, 6, 7))
        # corners away from halves (their rounding is a jump), image indices
        # away from the integers above them (truncated: a jump at 1.0 - eps)
        rois = np.array([[0, 1.2, 0.9, 4.1, 5.2], [1.5, -2.1, 2.0, 3.3, 7.8], [1.5, 0.0, 0.0, 6.0, 5.0]])
        trans = rng.uniform(-1, 1, (4, 2, 3, 3))
        return [(cls(False, 3, 3, 3, 2, 1.0, 0.3), x, rois, trans),
                (cls(True, 3, 3, 3, 2, 1.0, 0.3), x, rois, trans),
                (cls(False, 2, 2, 3, 3, 0.8, 0.2), x, rois, trans[..., :2, :])]

    def _check(self, x, rois, trans, descs):
        for what, d in (("inp", x), ("rois", rois), ("trans", trans)):
            if d.dtype.kind != "f":
                raise self.error(f"needs floating-point {what}, got {d.dtype}", *descs)
        if trans.dtype != x.dtype:
            raise self.error(f"inp and trans must have one dtype, got {x.dtype} and {trans.dtype}", *descs)
        for what, d, nd in (("inp", x, 4), ("rois", rois, 2), ("trans", trans, 4)):
            if d.ndim is not None and d.ndim != nd:
                raise self.error(f"{what} must be {nd}-D, got shape {tuple(d.shape)}", *descs)
        if rois.shape is not None and rois.shape[1] != 5:
            raise self.error(f"rois must be (R, 5) as (image index, x1, y1, x2, y2), got {tuple(rois.shape)}",
                             *descs)
        if x.shape is not None and 0 in x.shape[2:]:
            raise self.error(f"inp has an empty spatial axis: {tuple(x.shape)}", *descs)
        if not self.no_trans and trans.shape is not None:
            want = (2, self.pooled_h, self.pooled_w)
            if tuple(trans.shape[1:]) != want:
                raise self.error(f"trans must be (R, 2, pooled_h, pooled_w) = (R, {', '.join(map(str, want))}), "
                                 f"got {tuple(trans.shape)}", *descs)
            if rois.shape is not None and trans.shape[0] < rois.shape[0]:
                raise self.error(f"trans has offsets for {trans.shape[0]} boxes, rois has {rois.shape[0]}",
                                 *descs)

    def _cuda_args(self, be, x, rois, trans, total):
        """The kernels' arguments after x, up to the outputs (their order in _PSROI_PARAMS)."""
        t = x.dtype.type
        return (be.cast(rois, x.dtype), trans, np.int64(total), *(np.int32(v) for v in x.shape[1:]),
                np.int32(self.pooled_h), np.int32(self.pooled_w), np.int32(self.part_size),
                np.int32(self.sample_per_part), t(self.spatial_scale), t(self.trans_std), np.int32(self.no_trans))

    # -- the sampling geometry (depends on the boxes and offsets, not the channels)

    def _boxes(self, rois, n_images, dt):
        """(image index (R,), left, top, width, height (R,) in dtype dt),
        MegEngine's arithmetic: rounded corners, scaled, less half a pixel,
        the size at least 0.1."""
        f = dt.type
        index = rois[:, 0].astype(np.int64)          # C's float -> int, toward zero (MegEngine's test has 0.65)
        if index.size and (index.min() < 0 or index.max() >= n_images):
            raise IndexOpError(str(self.error(f"a box's image index is outside [0, {n_images}): "
                                              f"{rois[:, 0].tolist()}")))
        c = round_half_away(rois[:, 1:].astype(dt))     # C's round, as MegEngine's kernel
        scale = f(self.spatial_scale)
        left, top = c[:, 0] * scale - f(0.5), c[:, 1] * scale - f(0.5)
        width = np.maximum((c[:, 2] + f(1)) * scale - f(0.5) - left, f(0.1))
        height = np.maximum((c[:, 3] + f(1)) * scale - f(0.5) - top, f(0.1))
        return index, left, top, width, height

    def _parts(self):
        """The part of each bin row and column (pooled_h,), (pooled_w,):
        floor(p / pooled * part_size) in float32, as MegEngine computes it."""
        f = np.float32
        ph = np.floor(np.arange(self.pooled_h, dtype=f) / f(self.pooled_h) * f(self.part_size)).astype(np.int64)
        pw = np.floor(np.arange(self.pooled_w, dtype=f) / f(self.pooled_w) * f(self.part_size)).astype(np.int64)
        return ph, pw

    def _samples(self, x_shape, rois, trans):
        """Every sample of every bin: a dict of flat pixel indices into
        (N * H * W) and weights (M, K) for M = R * PH * PW bins and K = 4 * S * S
        taps (bilinear value, ``w``; its slope along x and y, ``dx``, ``dy``;
        each already divided by the bin's count), the count (M,) and each
        box's width and height."""
        n, _, h, w = x_shape
        dt = trans.dtype
        f = dt.type
        r = rois.shape[0]
        ph_n, pw_n, s = self.pooled_h, self.pooled_w, self.sample_per_part
        index, left, top, width, height = self._boxes(rois, n, dt)
        bin_h, bin_w = height / f(ph_n), width / f(pw_n)
        hs = top[:, None, None] + np.arange(ph_n, dtype=dt)[None, :, None] * bin_h[:, None, None]  # (R, PH, 1)
        ws = left[:, None, None] + np.arange(pw_n, dtype=dt)[None, None, :] * bin_w[:, None, None]  # (R, 1, PW)
        if not self.no_trans:
            part_h, part_w = self._parts()
            t = trans[:r][:, :, part_h[:, None], part_w[None, :]] * f(self.trans_std)           # (R, 2, PH, PW)
            ws = ws + t[:, 0] * width[:, None, None]
            hs = hs + t[:, 1] * height[:, None, None]
        steps = np.arange(s, dtype=dt)
        hh = hs[..., None, None] + steps[:, None] * (bin_h / f(s))[:, None, None, None, None]   # (R, PH, PW, S, 1)
        ww = ws[..., None, None] + steps[None, :] * (bin_w / f(s))[:, None, None, None, None]   # (R, PH, PW, 1, S)
        hh, ww = np.broadcast_arrays(hh, ww)
        keep = (ww >= -0.5) & (ww <= w - 0.5) & (hh >= -0.5) & (hh <= h - 0.5)
        count = keep.sum((3, 4)).reshape(-1)
        hh, ww = np.clip(hh, 0, h - 1), np.clip(ww, 0, w - 1)
        # corners floor and ceil (a sample on a pixel reads it alone: slope 0 there, as MegEngine's)
        y0, x0 = np.floor(hh), np.floor(ww)
        y1, x1 = np.ceil(hh), np.ceil(ww)
        ly, lx = hh - y0, ww - x0
        base = index[:, None, None, None, None] * (h * w)
        corners = [(y0, x0), (y1, x0), (y0, x1), (y1, x1)]
        flat = np.stack([base + (yy * w + xx).astype(np.int64) for yy, xx in corners], -1)
        scale = np.where(keep, 1, 0).astype(dt) / np.maximum(count, 1).astype(dt).reshape(keep.shape[:3] + (1, 1))
        ky, kx = 1 - ly, 1 - lx
        weights = {"w": np.stack([ky * kx, ly * kx, ky * lx, ly * lx], -1),
                   "dx": np.stack([-ky, -ly, ky, ly], -1),
                   "dy": np.stack([-kx, kx, -lx, lx], -1)}
        m = r * ph_n * pw_n
        weights = {k: (v * scale[..., None]).reshape(m, -1) for k, v in weights.items()}
        return flat.reshape(m, -1), weights, count, width, height


# the bins per chunk of the CPU kernels: a chunk gathers (bins, K, C) values
_PSROI_CHUNK_ELEMS = 1 << 22


def _psroi_chunks(m: int, per_bin: int):
    step = max(1, _PSROI_CHUNK_ELEMS // max(per_bin, 1))
    return [slice(i, min(i + step, m)) for i in range(0, m, step)]


def _gather_contract(rows, flat, *weights):
    """sum_k w[m, k] * rows[flat[m, k]] for each w of ``weights``: (M, C)
    arrays from rows (P, C), gathering the rows once for them all."""
    outs = [np.empty((flat.shape[0], rows.shape[1]), rows.dtype) for _ in weights]
    for sl in _psroi_chunks(flat.shape[0], flat.shape[1] * rows.shape[1]):
        picked = rows[flat[sl]]
        for out, w in zip(outs, weights):
            out[sl] = np.einsum("mk,mkc->mc", w[sl], picked)
    return outs


def _scatter_rows(flat, weights, grows, n_rows):
    """The adjoint of ``_gather_contract``: rows (n_rows, C) with
    sum_{m, k: flat[m, k] = p} weights[m, k] * grows[m] in row p. The taps of
    one bin on one pixel (its samples are close: most of its taps share a
    few pixels) are merged first, then sorted by pixel and each pixel's run
    summed by ``np.add.reduceat`` (``np.add.at`` on the (taps, C) rows took
    10 times as long); taps of weight 0 (samples left out) are dropped."""
    m_n, taps = flat.shape
    out = np.zeros((n_rows, grows.shape[1]), grows.dtype)
    w = weights.reshape(-1)
    live = np.flatnonzero(w)
    # one key per (pixel, bin), sorted by pixel
    keys, inverse = np.unique(flat.reshape(-1)[live] * m_n + live // taps, return_inverse=True)
    merged = np.bincount(inverse, w[live], len(keys)).astype(grows.dtype)
    pixel, bin_ = keys // m_n, keys % m_n
    for sl in _psroi_chunks(len(keys), grows.shape[1]):
        p = pixel[sl]
        if not len(p):
            continue
        starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
        contrib = grows[bin_[sl]] * merged[sl, None]
        out[p[starts]] += np.add.reduceat(contrib, starts, axis=0)    # distinct pixels within a chunk
    return out


def _pixel_rows(x):
    """x (N, C, H, W) as rows (N * H * W, C), one per pixel."""
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)).reshape(n * h * w, c)


def _bin_rows(y, m):
    """y (R, C, PH, PW) as rows (R * PH * PW, C), one per bin."""
    return np.ascontiguousarray(y.transpose(0, 2, 3, 1)).reshape(m, y.shape[1])


_PSROI_HELPERS = r"""
#ifndef GC_PSROI_HELPERS
#define GC_PSROI_HELPERS
// the sampling geometry of output element idx of (R, C, PH, PW): its image's
// plane offset, the first sample (h0, w0), the sample steps, the box size
// and the trans index of its x offset (-1 without offsets)
template <class V> struct GcPsroiBin { long long plane; V h0, w0, sh, sw, rw, rh; long long tx; };
template <class V> static __device__ GcPsroiBin<V> gc_psroi_bin(
        long long idx, const V* rois, const V* trans, int C, int H, int W, int PH, int PW, int P, int S,
        V scale, V tstd, int no_trans) {
    const int pw = (int)(idx % PW), ph = (int)((idx / PW) % PH);
    const int c = (int)((idx / ((long long)PW * PH)) % C);
    const long long n = idx / ((long long)PW * PH * C);
    const V* r = rois + n * 5;
    const V half = (V)0.5;
    // (cast: the host emulator's round of a float is a double)
    const V left = (V)round(r[1]) * scale - half, top = (V)round(r[2]) * scale - half;
    const V rw = max(((V)round(r[3]) + (V)1) * scale - half - left, (V)0.1);
    const V rh = max(((V)round(r[4]) + (V)1) * scale - half - top, (V)0.1);
    const V bh = rh / (V)PH, bw = rw / (V)PW;
    GcPsroiBin<V> b;
    b.plane = ((long long)r[0] * C + c) * H * W;
    b.h0 = top + (V)ph * bh;
    b.w0 = left + (V)pw * bw;
    b.sh = bh / (V)S; b.sw = bw / (V)S; b.rw = rw; b.rh = rh; b.tx = -1;
    if (!no_trans) {
        const int parth = (int)floorf((float)ph / (float)PH * (float)P);
        const int partw = (int)floorf((float)pw / (float)PW * (float)P);
        b.tx = ((n * 2) * PH + parth) * PW + partw;
        b.w0 += trans[b.tx] * tstd * rw;
        b.h0 += trans[b.tx + (long long)PH * PW] * tstd * rh;
    }
    return b;
}
// sample (i, j) of bin b: false when it is left out (more than half a
// pixel outside the image), else its bilinear corners and fractions, the
// sample clamped into the image first
template <class V> struct GcPsroiTap { int y0, y1, x0, x1; V ly, lx; };
template <class V> static __device__ bool gc_psroi_sample(const GcPsroiBin<V>& b, int i, int j, int H, int W,
                                                          GcPsroiTap<V>& t) {
    V h = b.h0 + (V)i * b.sh, w = b.w0 + (V)j * b.sw;
    if (w < (V)-0.5 || w > (V)W - (V)0.5 || h < (V)-0.5 || h > (V)H - (V)0.5) return false;
    w = min(max(w, (V)0), (V)(W - 1));
    h = min(max(h, (V)0), (V)(H - 1));
    t.y0 = (int)floor(h); t.y1 = (int)ceil(h); t.x0 = (int)floor(w); t.x1 = (int)ceil(w);
    t.ly = h - (V)t.y0; t.lx = w - (V)t.x0;
    return true;
}
#endif
"""

_PSROI_PARAMS = ("const T* __restrict__ rois, const T* __restrict__ trans, long long total, int C, int H, int W, "
                 "int PH, int PW, int P, int S, T scale, T tstd, int no_trans")

_PSROI_FWD = Kernel("deformablepsroipooling", "const T* __restrict__ x, " + _PSROI_PARAMS
                    + ", T* __restrict__ y, T* __restrict__ cnt", """
    const GcPsroiBin<T> b = gc_psroi_bin<T>(idx, rois, trans, C, H, W, PH, PW, P, S, scale, tstd, no_trans);
    const T* xp = x + b.plane;
    T sum = 0; int count = 0;
    GcPsroiTap<T> t;
    for (int i = 0; i < S; ++i)
        for (int j = 0; j < S; ++j) {
            if (!gc_psroi_sample<T>(b, i, j, H, W, t)) continue;
            sum += ((T)1 - t.ly) * ((T)1 - t.lx) * xp[t.y0 * W + t.x0] + t.ly * ((T)1 - t.lx) * xp[t.y1 * W + t.x0]
                 + ((T)1 - t.ly) * t.lx * xp[t.y0 * W + t.x1] + t.ly * t.lx * xp[t.y1 * W + t.x1];
            ++count;
        }
    y[idx] = count ? sum / (T)count : (T)0;
    cnt[idx] = (T)count;""", over="total")

# one thread per output element, adding its share into gx and gtrans (atomics:
# bins overlap in the input, and several bins share a part of trans)
_PSROI_BWD = Kernel("deformablepsroipoolingbackward", "const T* __restrict__ x, " + _PSROI_PARAMS
                    + ", const T* __restrict__ g, T* gx, T* gt", """
    const GcPsroiBin<T> b = gc_psroi_bin<T>(idx, rois, trans, C, H, W, PH, PW, P, S, scale, tstd, no_trans);
    const T* xp = x + b.plane;
    T* gp = gx + b.plane;
    int count = 0;
    GcPsroiTap<T> t;
    for (int i = 0; i < S; ++i)
        for (int j = 0; j < S; ++j) count += gc_psroi_sample<T>(b, i, j, H, W, t);
    if (count == 0) continue;
    const T d = g[idx] / (T)count;
    T dtx = 0, dty = 0;
    for (int i = 0; i < S; ++i)
        for (int j = 0; j < S; ++j) {
            if (!gc_psroi_sample<T>(b, i, j, H, W, t)) continue;
            const T ly = t.ly, lx = t.lx;
            const long long p00 = t.y0 * W + t.x0, p10 = t.y1 * W + t.x0, p01 = t.y0 * W + t.x1,
                            p11 = t.y1 * W + t.x1;
            atomicAdd(gp + p00, ((T)1 - ly) * ((T)1 - lx) * d);
            atomicAdd(gp + p10, ly * ((T)1 - lx) * d);
            atomicAdd(gp + p01, ((T)1 - ly) * lx * d);
            atomicAdd(gp + p11, ly * lx * d);
            if (b.tx < 0) continue;
            const T u00 = xp[p00], u10 = xp[p10], u01 = xp[p01], u11 = xp[p11];
            dtx += ((T)1 - ly) * (u01 - u00) + ly * (u11 - u10);
            dty += ((T)1 - lx) * (u10 - u00) + lx * (u11 - u01);
        }
    if (b.tx >= 0) {
        atomicAdd(gt + b.tx, dtx * d * tstd * b.rw);
        atomicAdd(gt + b.tx + (long long)PH * PW, dty * d * tstd * b.rh);
    }""", over="total")


class DeformablePSROIPooling(_PSROIBase):
    """(inp (N, C, H, W), rois (R, 5), trans (R', 2, pooled_h, pooled_w))
    -> (out (R, C, pooled_h, pooled_w), count): deformable position-sensitive
    RoI pooling, MegEngine's op (the comment above the class says how).
    ``count`` is each bin's number of samples inside the image, in inp's
    dtype. Differentiable in inp and trans, first order only.

    Example::

        >>> from gradcore.ops.vision import DeformablePSROIPooling
        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> op = DeformablePSROIPooling(True, 1, 1, 1, 1, 1.0)
        >>> out, count = gc.core.apply(op, x, gc.tensor([[0., 1, 1, 2, 2]]), F.zeros((1, 2, 1, 1)))
        >>> out.numpy(), count.numpy()      # one sample, at the box's corner (0.5, 0.5)
        (array([[[[2.5]]]], dtype=float32), array([[[[1.]]]], dtype=float32))
    """
    name = "DeformablePSROIPooling"

    @classmethod
    def examples(cls):
        """Sample inputs for ``check_op``: with offsets and without, parts coarser than the bins."""
        return [(op, [x, rois, trans]) for op, x, rois, trans in cls._example_cases()]

    def infer(self, x, rois, trans):
        self._check(x, rois, trans, (x, rois, trans))
        shape = None
        if x.shape is not None and rois.shape is not None:
            shape = (rois.shape[0], x.shape[1], self.pooled_h, self.pooled_w)
        out = TensorDesc(shape, x.dtype, x.device)
        return (out, out)

    def cpu(self, x, rois, trans):
        self.infer(*(TensorDesc(a.shape, a.dtype) for a in (x, rois, trans)))
        r, c = rois.shape[0], x.shape[1]
        flat, weights, count, _, _ = self._samples(x.shape, rois, trans)
        (rows,) = _gather_contract(_pixel_rows(x), flat, weights["w"])               # (M, C)
        shape = (r, self.pooled_h, self.pooled_w)
        out = np.ascontiguousarray(rows.reshape(shape + (c,)).transpose(0, 3, 1, 2))
        cnt = np.broadcast_to(count.reshape(r, 1, *shape[1:]), out.shape).astype(x.dtype)
        return out, cnt

    def cuda(self, be, x, rois, trans):
        out, _ = self.infer_arrays(x, rois, trans)
        check_cuda_dtype(self, out.dtype)
        self._boxes(rois.get(), x.shape[0], np.dtype(x.dtype))      # the image indices, on the host
        y, cnt = be.empty(out.shape, out.dtype), be.empty(out.shape, out.dtype)
        if y.size:
            be.launch_n(be.kernel(self, be.ctype(out.dtype)), y.size, x, *self._cuda_args(be, x, rois, trans, y.size),
                        y, cnt)
        return y, cnt

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_deformablepsroipooling_<ctype>(x, rois, trans, long long total,
        int C, int H, int W, int PH, int PW, int P, int S, T scale, T tstd,
        int no_trans, y, cnt)``: one thread per output element (grid-stride
        loop), the mean of its bin's kept samples and their count."""
        return _PSROI_FWD.source(ctype, helpers=_PSROI_HELPERS)

    def vjp(self, inputs, outputs, grads):
        (x, rois, trans), (g, _) = inputs, grads
        gx, gt = _core.apply(DeformablePSROIPoolingBackward(*(getattr(self, a) for a in self.attrs)),
                             x, rois, trans, g)
        return [gx, None, gt]


class DeformablePSROIPoolingBackward(_PSROIBase):
    """(inp, rois, trans, g (R, C, pooled_h, pooled_w)) -> the gradients of
    sum(g * out) of DeformablePSROIPooling with respect to inp and trans
    (zeros for trans when no_trans). Declares no gradient (first order only,
    as MegEngine's)."""
    name = "DeformablePSROIPoolingBackward"

    @classmethod
    def examples(cls):
        """Sample inputs for ``check_op``: the forward's examples with a gradient."""
        rng = np.random.default_rng(1)
        return [(op, [x, rois, trans, rng.standard_normal((len(rois), x.shape[1], op.pooled_h, op.pooled_w))])
                for op, x, rois, trans in cls._example_cases()]

    def infer(self, x, rois, trans, g):
        descs = (x, rois, trans, g)
        self._check(x, rois, trans, descs)
        if g.dtype != x.dtype:
            raise self.error(f"g must have inp's dtype {x.dtype}, got {g.dtype}", *descs)
        if x.shape is not None and rois.shape is not None and g.shape is not None:
            want = (rois.shape[0], x.shape[1], self.pooled_h, self.pooled_w)
            if tuple(g.shape) != want:
                raise self.error(f"g must be (R, C, pooled_h, pooled_w) = {want}, got {tuple(g.shape)}", *descs)
        return (x, trans)

    def cpu(self, x, rois, trans, g):
        self.infer(*(TensorDesc(a.shape, a.dtype) for a in (x, rois, trans, g)))
        n, c, h, w = x.shape
        flat, weights, _, width, height = self._samples(x.shape, rois, trans)
        m = flat.shape[0]
        grows = _bin_rows(g, m)                                                         # (M, C)
        gx = _scatter_rows(flat, weights["w"], grows, n * h * w)
        gx = np.ascontiguousarray(gx.reshape(n, h, w, c).transpose(0, 3, 1, 2))
        gt = np.zeros_like(trans)
        if not self.no_trans:
            r, ph_n, pw_n = rois.shape[0], self.pooled_h, self.pooled_w
            part_h, part_w = self._parts()
            pos = (np.arange(r)[:, None, None], part_h[None, :, None], part_w[None, None, :])
            slopes = _gather_contract(_pixel_rows(x), flat, weights["dx"], weights["dy"])
            for axis, size, slope in ((0, width, slopes[0]), (1, height, slopes[1])):
                total = (slope * grows).sum(1).reshape(r, ph_n, pw_n)
                np.add.at(gt[:, axis], pos, total * (x.dtype.type(self.trans_std) * size)[:, None, None])
        return gx, gt

    def cuda(self, be, x, rois, trans, g):
        check_cuda_dtype(self, x.dtype)
        self.infer_arrays(x, rois, trans, g)
        self._boxes(rois.get(), x.shape[0], np.dtype(x.dtype))
        gx, gt = be.zeros(x.shape, x.dtype), be.zeros(trans.shape, trans.dtype)
        if g.size:
            be.launch_n(be.kernel(self, be.ctype(x.dtype)), g.size, x,
                        *self._cuda_args(be, x, rois, trans, g.size), g, gx, gt)
        return gx, gt

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_deformablepsroipoolingbackward_<ctype>(x, rois, trans, long
        long total, int C, int H, int W, int PH, int PW, int P, int S, T scale,
        T tstd, int no_trans, g, gx, gt)``: one thread per element of g,
        adding its samples' shares into gx and gt (zeroed first) with
        atomicAdd."""
        return _PSROI_BWD.source(ctype, helpers=_PSROI_HELPERS)


VISION_OPS += [DeformablePSROIPooling, DeformablePSROIPoolingBackward]
