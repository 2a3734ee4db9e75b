"""Convolution (2-d, transposed 2-d, 3-d) and 2-d pooling over NCHW (NCDHW) tensors.

``Conv2d(stride, padding, dilation, groups)`` takes (x, weight) with x of
shape (N, C, H, W) and weight (O, C // groups, KH, KW) (the bias is added by
``F.conv2d`` with broadcasting). ``MaxPool2d`` and ``AvgPool2d`` take
(kernel_size, stride, padding) (AvgPool2d also MegEngine's ``mode``).

CPU kernels: convolutions are one GEMM per group on a transposed im2col
matrix (C/groups*KH*KW, N*OH*OW) copied out of a strided window view (the
gradients use the same layout: no transposed copies of the big matrix), run
over chunks of images whose matrix stays in cache (a few MB; small problems
are a single GEMM). The stride-1 data gradient scatters its columns back with
one flat offset per kernel tap over width-padded images. Pooling works on the
KH*KW strided views of the input, one per kernel offset. The only Python
loops are over kernel offsets (pooling, col2im) and image chunks, never over
pixels or channels. Every op also has a
``cuda_source(ctype)``: a direct kernel, one thread per output element
(grid-stride loop), shapes and then the op's attributes passed as ``int``
arguments after the pointers. The source depends on the element type only
(never on the attributes), so every configuration of an op class shares
one compiled module per type: a network with many layer shapes compiles
each kernel once.

CUDA launchers (``cuda(be, ...)``): pooling runs the direct kernels. The
convolutions in float32/float64 run as the CPU does, im2col + GEMM: an
im2col kernel (``gemm_source``; shapes and attributes are arguments, one
compile per element type) writes each image's (C*KH*KW, OH*OW) matrix, and
cuBLAS multiplies it per group, batched over the images (the data gradient
scatters its columns back with a col2im kernel; the filter gradient sums
the per-image products with one more GEMM). Images run in chunks whose
scratch matrices stay under ``CUDA_CHUNK_ELEMS``. With ``CUDA_GEMM = False``
(or other dtypes) the convolutions run the direct kernels.

Gradients are built from the helper ops below, each with its own ``vjp``, so
every order of derivative works:

    Conv2d               -> Conv2dBackwardData (g, w, x_ref), Conv2dBackwardFilter (g, x, w_ref)
    Conv2dBackwardData   -> Conv2d (gg, w), Conv2dBackwardFilter (g, gg, w_ref)
    Conv2dBackwardFilter -> Conv2d (x, gg), Conv2dBackwardData (g, gg, x_ref)
    MaxPool2d            -> MaxPool2dBackward (g, x)     scatter g to each window's argmax
    MaxPool2dBackward    -> MaxPool2dGather (gg, x)      gather gg at each window's argmax
    MaxPool2dGather      -> MaxPool2dBackward (gg, x)
    AvgPool2d            -> AvgPool2dBackward (g, x_ref)
    AvgPool2dBackward    -> AvgPool2d (gg)
    ConvTranspose2d      -> Conv2d (g, w), Conv2dBackwardFilter (x, g, w_ref)
    Conv3d, Conv3dBackwardData, Conv3dBackwardFilter: as the 2-d three

``ConvTranspose2d(stride, padding, output_padding, dilation, groups)`` takes
(x, weight (C_in, C_out // groups, KH, KW)): it is Conv2dBackwardData with x
as the gradient, and runs that op's kernels on both devices. ``Conv3d``
and its gradients work as the 2-d ones on the CPU (im2col over a strided
5-d window view, one GEMM per group, a scatter-add per kernel tap) and run
direct kernels on cuda (one thread per element written, no atomics).
"""
from __future__ import annotations

import itertools
from typing import Tuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from gradcore import _core, dtypes
from gradcore.cuda import cudnn
from gradcore.op import Op, TensorDesc, shape_carrier

from .linalg import check_cuda_dtype, gemm_rows
from .reduce import op_int

AVG_MODES = ("average_count_exclude_padding", "average")


def _apply1(op, *args):
    return _core.apply(op, *args)[0]


def _spatial(op_name, what, v, minimum, n) -> Tuple[int, ...]:
    """An int or ``n`` ints (one per spatial axis) as an n-tuple, each >= ``minimum``."""
    if isinstance(v, (tuple, list)):
        if len(v) != n:
            raise ValueError(f"{op_name}: {what} must be an int or {_N_INTS[n]}, got {v!r}")
        out = tuple(op_int(op_name, what, a) for a in v)
    else:
        out = (op_int(op_name, what, v),) * n
    if min(out) < minimum:
        raise ValueError(f"{op_name}: {what} must be >= {minimum}, got {v!r}")
    return out


_N_INTS = {2: "a pair", 3: "a triple"}


def _pair(op_name, what, v, minimum) -> Tuple[int, int]:
    return _spatial(op_name, what, v, minimum, 2)


def _out_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


# ---------------------------------------------------------------- NumPy helpers
def _pad(x, padding, fill=0):
    ph, pw = padding
    if not ph and not pw:
        return x
    n, c, h, w = x.shape
    out = np.full((n, c, h + 2 * ph, w + 2 * pw), fill, x.dtype)
    out[:, :, ph:ph + h, pw:pw + w] = x
    return out


def _offset_slices(size, out, k, s, p, d):
    """For each kernel offset along one axis: (output slice, input slice) of
    the outputs whose tap lands inside the unpadded input, or None."""
    res = []
    for i in range(k):
        off = i * d - p                       # input index of output 0's tap
        lo = max(0, -(off // s)) if off < 0 else 0
        hi = min(out - 1, (size - 1 - off) // s)
        if hi < lo:
            res.append(None)
        else:
            start = lo * s + off
            res.append((slice(lo, hi + 1), slice(start, start + (hi - lo) * s + 1, s)))
    return res


def _col2im(cols, xshape, stride, padding, dilation, dtype):
    """Scatter-add windows ``cols`` (..., OH, OW, KH, KW) (leading axes N, C
    or any view of them) back to an (N, C, H, W) array: the adjoint of
    im2col over the padded input. Loops over kernel offsets only; taps
    that land in the padding are skipped instead of written and cropped."""
    n, c, h, w = xshape
    oh, ow, kh, kw = cols.shape[-4:]
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    out = np.zeros((n, c, h, w), dtype)
    rows = _offset_slices(h, oh, kh, sh, ph, dh)
    colz = _offset_slices(w, ow, kw, sw, pw, dw)
    for i in range(kh):                 # loops over kernel positions only
        if rows[i] is None:
            continue
        ro, ri = rows[i]
        for j in range(kw):
            if colz[j] is None:
                continue
            co, ci = colz[j]
            out[:, :, ri, ci] += cols[:, :, ro, co, i, j]
    return out


# Convolutions run over chunks of images whose im2col matrix holds about this
# many elements (a few MB: it stays in cache between being written and read by
# the GEMM); small problems are one chunk, one GEMM.
_CHUNK_ELEMS = 1 << 20


def _image_chunks(n, per_image, budget=None):
    cs = max(1, (budget or _CHUNK_ELEMS) // max(per_image, 1))
    return [(s, min(n, s + cs)) for s in range(0, n, cs)] or [(0, 0)]


def _by_images(fn, n, per_image):
    """Stack ``fn(start, stop)`` (arrays with the images on axis 0) over the
    chunks of ``n`` images, into one contiguous array."""
    chunks = _image_chunks(n, per_image)
    first = fn(*chunks[0])
    if len(chunks) == 1:
        return np.ascontiguousarray(first)
    out = np.empty((n,) + first.shape[1:], first.dtype)
    out[:chunks[0][1]] = first
    for s, e in chunks[1:]:
        out[s:e] = fn(s, e)
    return out


# ---------------------------------------------------------------- CUDA helpers
# The convolutions run im2col + cuBLAS on cuda (False: the direct kernels),
# over chunks of images whose scratch matrices hold at most this many elements.
CUDA_GEMM = True
CUDA_CHUNK_ELEMS = 1 << 25
_GEMM_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _desc(a):
    return TensorDesc(a.shape, a.dtype, "cuda")


def _use_gemm(dtype):
    return CUDA_GEMM and np.dtype(dtype) in _GEMM_DTYPES


def _launch_direct(op, be, arrays, out, ints):
    """A new array for ``out`` (a TensorDesc) filled by ``op``'s direct
    kernel: (*arrays, out, *ints as int), one thread per output element."""
    check_cuda_dtype(op, out.dtype)
    y = be.empty(out.shape, out.dtype)
    be.launch_n(be.kernel(op, be.ctype(out.dtype)), y.size, *arrays, y, *[np.int32(i) for i in ints])
    return y


def _gemm_kernel(op, be, which, dtype):
    """The im2col or col2im kernel (``gemm_source``: one module per dtype)."""
    T = be.ctype(dtype)
    return be.kernel(op, T, name=_kname(which, T), source=gemm_source(T))


def gemm_source(ctype: str = "float") -> str:
    """The convolutions' im2col kernels for the GEMM path, shapes and
    attributes as arguments (ints: C, H, W, KH, KW, OH, OW, SH, SW, PH, PW,
    DH, DW); one thread per element written (grid-stride loops):

    ``gc_im2col_<ctype>(x, cols, n0, nb, ...)``: cols (nb, C*KH*KW, OH*OW),
    rows (c, i, j), columns (oh, ow), of images n0..n0+nb of x (N, C, H, W);
    taps in the padding are 0.

    ``gc_col2im_<ctype>(cols, gx, n0, nb, ...)``: the adjoint, images
    n0..n0+nb of gx: each element gathers the columns of every tap that
    read it (no atomics).
    """
    T = ctype
    ints = ("int C, int H, int W, int KH, int KW, int OH, int OW, int SH, int SW, int PH, int PW, "
            "int DH, int DW")
    return (
        f"extern \"C\" __global__ void {_kname('im2col', T)}(const {T}* __restrict__ x, {T}* __restrict__ cols, "
        f"long long n0, long long nb, {ints})\n{{\n"
        "    const long long P = (long long)OH * OW, R = (long long)C * KH * KW;\n"
        "    const long long total = nb * R * P;\n" + _LOOP +
        "        const long long p = idx % P, t = idx / P, r = t % R, n = n0 + t / R;\n"
        "        const int j = (int)(r % KW), i = (int)(r / KW % KH), c = (int)(r / ((long long)KH * KW));\n"
        "        const int ih = (int)(p / OW) * SH - PH + i * DH, iw = (int)(p % OW) * SW - PW + j * DW;\n"
        "        cols[idx] = (ih >= 0 && ih < H && iw >= 0 && iw < W)\n"
        f"            ? x[((n * C + c) * H + ih) * W + iw] : ({T})0;\n"
        "    }\n}\n"
        f"extern \"C\" __global__ void {_kname('col2im', T)}(const {T}* __restrict__ cols, {T}* __restrict__ gx, "
        f"long long n0, long long nb, {ints})\n{{\n"
        "    const long long P = (long long)OH * OW;\n"
        "    const long long total = nb * C * H * W;\n" + _LOOP +
        "        const int iw = (int)(idx % W), ih = (int)(idx / W % H);\n"
        f"        const {T}* col = cols + idx / ((long long)H * W) * KH * KW * P;   // image and channel\n"
        f"        {T} acc = 0;\n"
        "        for (int i = 0; i < KH; ++i) {\n"
        "            const int th = ih + PH - i * DH;\n"
        "            if (th < 0 || th % SH || th / SH >= OH) continue;\n"
        "            for (int j = 0; j < KW; ++j) {\n"
        "                const int tw = iw + PW - j * DW;\n"
        "                if (tw < 0 || tw % SW || tw / SW >= OW) continue;\n"
        "                acc += col[(i * KW + j) * P + (long long)(th / SH) * OW + tw / SW];\n"
        "            }\n"
        "        }\n"
        "        gx[n0 * C * H * W + idx] = acc;\n"
        "    }\n}\n")


# ---------------------------------------------------------------- convolution
class _ConvAttrs(Op):
    """What the 2-d and 3-d convolutions share: the attributes (one value per
    spatial axis, ``spatial`` axes) and the shape and dtype checks."""
    attrs = ("stride", "padding", "dilation", "groups")
    spatial = 2

    def __init__(self, stride=1, padding=0, dilation=1, groups=1):
        n = self.name
        self.stride = _spatial(n, "stride", stride, 1, self.spatial)
        self.padding = _spatial(n, "padding", padding, 0, self.spatial)
        self.dilation = _spatial(n, "dilation", dilation, 1, self.spatial)
        self.groups = op_int(n, "groups", groups)
        if self.groups < 1:
            raise ValueError(f"{n}: groups must be >= 1, got {groups!r}")

    def _check(self, x, w, descs):
        """Validate input shape ``x`` (N, C, [D,] H, W) against weight shape
        ``w`` (O, C/groups, [KD,] KH, KW); return the output's spatial
        sizes. ``descs`` name the shapes in the message."""
        nd = self.spatial + 2
        axes = ("D", "H", "W")[-self.spatial:]
        if len(x) != nd:
            raise self.error(f"input must be {nd}-D (N, C, {', '.join(axes)}), got {len(x)}-D", *descs)
        if len(w) != nd:
            kernel = ", ".join("k" + a.lower() for a in axes)
            raise self.error(f"weight must be {nd}-D (out_channels, in_channels // groups, {kernel}), "
                             f"got {len(w)}-D", *descs)
        g = self.groups
        if x[1] % g:
            raise self.error(f"input channels {x[1]} are not divisible by groups={g}", *descs)
        if w[0] % g:
            raise self.error(f"output channels {w[0]} are not divisible by groups={g}", *descs)
        if w[1] * g != x[1]:
            raise self.error(f"channel mismatch: input has {x[1]} channels, weight expects "
                             f"{w[1]} * groups={g} = {w[1] * g}", *descs)
        if min(w[2:]) < 1:
            raise self.error("kernel size must be positive", *descs)
        out = []
        dims = ("depth", "height", "width")[-self.spatial:]
        for dim, size, k, s, p, d in zip(dims, x[2:], w[2:], self.stride, self.padding, self.dilation):
            eff = d * (k - 1) + 1
            if size + 2 * p < eff:
                raise self.error(f"kernel {dim} {eff} (kernel {k}, dilation {d}) is larger than the "
                                 f"padded input {dim} {size + 2 * p} ({size} + 2 * padding {p})", *descs)
            out.append(_out_size(size, k, s, p, d))
        return tuple(out)

    def _dtype(self, a, b):
        for d in (a, b):
            if d.dtype.kind != "f":
                raise self.error(f"needs floating-point inputs, got {a.dtype} and {b.dtype}", a, b)
        if a.dtype != b.dtype:
            raise self.error(f"input dtypes differ ({a.dtype} and {b.dtype})", a, b)
        return a.dtype

    def _attrs(self):
        return self.stride, self.padding, self.dilation, self.groups

    # which cuDNN call runs the op on a GPU (gradcore/cuda/cudnn.py)
    cudnn_direction = "forward"

    def _on_cudnn(self, be, a, b, ref_shape):
        """The op on cuDNN: (x, w) forward, (g, w) backward_data, (g, x)
        backward_filter, ``ref_shape`` the gradient's; None where cuDNN does
        not run it (no GPU, no cuDNN, a configuration it refuses, switched
        off) and the op's own kernels do."""
        if a.dtype != b.dtype:
            return None
        attrs, d = self._attrs(), self.cudnn_direction
        if d == "forward":
            return cudnn.conv_forward(be, a, b, attrs)
        if d == "backward_data":
            return cudnn.conv_backward_data(be, a, b, ref_shape, attrs)
        return cudnn.conv_backward_filter(be, a, b, ref_shape, attrs)


class _ConvBase(_ConvAttrs):
    def _cols(self, x, kshape, out_hw):
        """im2col, transposed: (groups, C/groups*KH*KW, N*OH*OW), contiguous.
        Rows are (c, i, j), columns (n, oh, ow): the copy out of the window
        view then runs along OW (contiguous for stride 1), and the GEMMs
        below need no transposed copies of the big matrix."""
        n, c = x.shape[:2]
        g = self.groups
        kh, kw = kshape
        oh, ow = out_hw
        (sh, sw), (dh, dw) = self.stride, self.dilation
        xp = _pad(x, self.padding)
        s0, s1, s2, s3 = xp.strides
        cg = c // g
        view = as_strided(xp, (g, cg, kh, kw, n, oh, ow),
                          (s1 * cg, s1, s2 * dh, s3 * dw, s0, s2 * sh, s3 * sw), writeable=False)
        return view.reshape(g, cg * kh * kw, n * oh * ow)

    @staticmethod
    def _grad_rows(g, grp):
        """Output gradient (N, O, OH, OW) as (groups, O/groups, N*OH*OW), contiguous."""
        n, o, oh, ow = g.shape
        gm = np.ascontiguousarray(g.reshape(n, grp, o // grp, oh * ow).transpose(1, 2, 0, 3))
        return gm.reshape(grp, o // grp, n * oh * ow)

    # ------------------------------------------------------------ cuda
    def _cuda_direct(self, be, arrays, out, xshape, wshape):
        """Run the op's direct kernel (one thread per element of ``out``, a
        TensorDesc) on ``arrays``; the kernel's ints (``_CONV_ARGS``): the
        shapes, then the attributes."""
        ints = (tuple(xshape) + (wshape[0],) + tuple(wshape[2:]) + tuple(self._out_hw(xshape, wshape))
                + self.stride + self.padding + self.dilation + (self.groups,))
        return _launch_direct(self, be, arrays, out, ints)

    def _out_hw(self, xshape, wshape):
        return [_out_size(*a) for a in zip(xshape[2:], wshape[2:], self.stride, self.padding, self.dilation)]

    def _pointwise(self, wshape):
        """A 1x1 kernel, stride 1, no padding: the im2col matrix is the input."""
        return tuple(wshape[2:]) == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0)

    def _gemm_geometry(self, xshape, wshape):
        """(int args of the im2col/col2im kernels, per-image sizes): rows
        R = C*KH*KW of the image's matrix, its columns P = OH*OW, a group's
        rows K = R / groups, the output channels per group OG."""
        n, c, h, w = xshape
        o, cg, kh, kw = wshape
        oh, ow = self._out_hw(xshape, wshape)
        ints = [np.int32(v) for v in (c, h, w, kh, kw, oh, ow) + self.stride + self.padding + self.dilation]
        return ints, (c * kh * kw, oh * ow, cg * kh * kw, o // self.groups)

    def _cuda_cols(self, be, x, wshape, n0, nb):
        """The im2col matrices (nb, C*KH*KW, OH*OW) of images n0..n0+nb of
        x: (the array to keep alive, its address)."""
        if self._pointwise(wshape):
            return x, x.ptr + n0 * (x.size // x.shape[0]) * x.itemsize
        ints, (r, p, _, _) = self._gemm_geometry(x.shape, wshape)
        cols = be.empty((nb, r, p), x.dtype)
        be.launch_n(_gemm_kernel(self, be, "im2col", x.dtype), cols.size, x, cols, n0, nb, *ints)
        return cols, cols.ptr


# the direct convolution kernels' ints: x (N, C, H, W), weight (O, C/G, KH, KW),
# output (N, O, OH, OW), then stride, padding, dilation and groups
_CONV_ARGS = ("int N, int C, int H, int W, int O, int KH, int KW, int OH, int OW, "
              "int SH, int SW, int PH, int PW, int DH, int DW, int G")
_LOOP = ("    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;\n"
         "         idx += (long long)blockDim.x * gridDim.x) {\n")


def _kname(op_name, ctype):
    return f"gc_{op_name}_{ctype.replace(' ', '_')}"


class Conv2d(_ConvBase):
    """Cross-correlation of x (N, C, H, W) with weight (O, C // groups, KH, KW)."""
    name = "Conv2d"
    input_dtypes = dtypes.promoted_inputs      # a float16 input with a float32 weight: float32

    def infer(self, x, w):
        dtype = self._dtype(x, w)
        if x.shape is None or w.shape is None:
            return (TensorDesc(None, dtype, x.device),)
        oh, ow = self._check(x.shape, w.shape, (x, w))
        return (TensorDesc((x.shape[0], w.shape[0], oh, ow), dtype, x.device),)

    def cpu(self, x, w):
        oh, ow = self._check(x.shape, w.shape, (x, w))
        if x.dtype != w.dtype or x.dtype.kind != "f":
            self._dtype(TensorDesc(x.shape, x.dtype), TensorDesc(w.shape, w.dtype))
        return _by_images(lambda s, e: self._forward(x[s:e], w, (oh, ow)), x.shape[0],
                          x.shape[1] * w.shape[2] * w.shape[3] * oh * ow)

    def _forward(self, x, w, out_hw):
        """Output of images ``x`` as a (possibly strided) (N, O, OH, OW) view."""
        oh, ow = out_hw
        n, o, g = x.shape[0], w.shape[0], self.groups
        cols = self._cols(x, w.shape[2:], (oh, ow))                 # g, K, N*OH*OW
        wm = w.reshape(g, o // g, cols.shape[1])
        out = np.matmul(wm, cols) if g > 1 else np.matmul(wm[0], cols[0])[None]   # g, O/g, N*OH*OW
        return out.reshape(g, o // g, n, oh, ow).transpose(2, 0, 1, 3, 4).reshape(n, o, oh, ow)

    def cuda(self, be, x, w):
        (out,) = self.infer(_desc(x), _desc(w))
        if 0 in out.shape or x.shape[1] == 0:      # no outputs, or sums over no channels
            return be.zeros(out.shape, out.dtype)
        y = self._on_cudnn(be, x, w, out.shape)
        if y is not None:
            return y
        if not _use_gemm(out.dtype):
            return self._cuda_direct(be, [x, w], out, x.shape, w.shape)
        y = be.empty(out.shape, out.dtype)
        _, (r, p, k, og) = self._gemm_geometry(x.shape, w.shape)
        n, o, it = x.shape[0], w.shape[0], x.itemsize
        for n0, n1 in _image_chunks(n, r * p, CUDA_CHUNK_ELEMS):
            scratch, cols = self._cuda_cols(be, x, w.shape, n0, n1 - n0)   # alive while the GEMMs read it
            for g in range(self.groups):
                # y[i, g] (OG, P) = w[g] (OG, K) @ cols[i, g] (K, P), for each image i of the chunk
                gemm_rows(be, out.dtype, og, p, k, w.ptr + g * og * k * it, cols + g * k * p * it,
                          y.ptr + (n0 * o + g * og) * p * it, stride_a=0, stride_b=r * p, stride_c=o * p,
                          batch=n1 - n0)
        return y

    def vjp(self, inputs, outputs, grads):
        (x, w), (g,) = inputs, grads
        attrs = (self.stride, self.padding, self.dilation, self.groups)
        return [_apply1(Conv2dBackwardData(*attrs), g, w, x),
                _apply1(Conv2dBackwardFilter(*attrs), g, x, w)]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_conv2d_<ctype>(x, w, y, <_CONV_ARGS>)``: one thread per
        output element (grid-stride loop, ``launch_n(N*O*OH*OW)``), a sum
        over the group's channels and the kernel taps."""
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('conv2d', T)}(const {T}* __restrict__ x, "
            f"const {T}* __restrict__ w, {T}* __restrict__ y, {_CONV_ARGS})\n{{\n"
            "    const int CG = C / G, OG = O / G;\n"
            "    const long long total = (long long)N * O * OH * OW;\n" + _LOOP +
            "        const int ow = (int)(idx % OW); long long t = idx / OW;\n"
            "        const int oh = (int)(t % OH); t /= OH;\n"
            "        const int o = (int)(t % O); const int n = (int)(t / O);\n"
            "        const int g = o / OG;\n"
            f"        {T} acc = 0;\n"
            "        for (int c = 0; c < CG; ++c) {\n"
            f"            const {T}* xc = x + ((long long)n * C + (long long)g * CG + c) * H * W;\n"
            f"            const {T}* wc = w + ((long long)o * CG + c) * KH * KW;\n"
            "            for (int i = 0; i < KH; ++i) {\n"
            "                const int ih = oh * SH - PH + i * DH;\n"
            "                if (ih < 0 || ih >= H) continue;\n"
            "                for (int j = 0; j < KW; ++j) {\n"
            "                    const int iw = ow * SW - PW + j * DW;\n"
            "                    if (iw < 0 || iw >= W) continue;\n"
            "                    acc += xc[(long long)ih * W + iw] * wc[i * KW + j];\n"
            "                }\n"
            "            }\n"
            "        }\n"
            "        y[idx] = acc;\n"
            "    }\n}\n")


class _ConvGrad(_ConvBase):
    """A gradient of Conv2d: (g, other operand, ref) -> an array shaped like
    ref (read only for its shape). ``_x_and_w`` says which of the two is the
    input and which the weight."""
    shape_only_inputs = (2,)

    def _x_and_w(self, other, ref):
        raise NotImplementedError

    def infer(self, g, other, ref):
        dtype = self._dtype(g, other)
        if g.shape is not None and other.shape is not None and ref.shape is not None:
            self._check_grad(g, other, ref)
        return (TensorDesc(ref.shape, dtype, g.device),)

    def _check_grad(self, g, other, ref):
        """The output's spatial sizes, once g, other and ref are checked."""
        x, w = self._x_and_w(other, ref)
        out = self._check(x.shape, w.shape, (g, other, ref))
        want = (x.shape[0], w.shape[0]) + out
        if tuple(g.shape) != want:
            raise self.error(f"output gradient must have shape {want}", g, other, ref)
        return out


class Conv2dBackwardData(_ConvGrad):
    """Gradient of Conv2d with respect to its input: (g, weight, x_ref) ->
    an array shaped like x_ref (read only for its shape)."""
    name = "Conv2dBackwardData"
    cudnn_direction = "backward_data"
    check_shapes = (((1, 3, 3, 3), (3, 2, 3, 3), (1, 2, 5, 5)),)

    def _x_and_w(self, w, ref):
        return ref, w

    def cpu(self, g, w, ref):
        oh, ow = self._check_grad(g, w, ref)
        n, c = ref.shape[:2]
        kh, kw = w.shape[2:]
        return _by_images(lambda s, e: self._data(g[s:e], w, (e - s,) + tuple(ref.shape[1:]), (oh, ow)),
                          n, c * kh * kw * oh * ow)

    def _data(self, g, w, xshape, out_hw):
        """Input gradient of images ``g`` as a (possibly strided) (N, C, H, W) view."""
        oh, ow = out_hw
        n, c, h, wd = xshape
        o, cg, kh, kw = w.shape
        grp = self.groups
        wm = w.reshape(grp, o // grp, cg * kh * kw).transpose(0, 2, 1)
        if self.stride == (1, 1):
            return self._stride1(g, wm, xshape, (kh, kw), (oh, ow))
        gm = self._grad_rows(g, grp)                                            # grp, O/grp, N*OH*OW
        dcols = np.matmul(wm, gm) if grp > 1 else np.matmul(wm[0], gm[0])        # (grp,) K, N*OH*OW
        # rows (c, i, j), columns (n, oh, ow): view as (N, C, OH, OW, KH, KW)
        dcols = dcols.reshape(c, kh, kw, n, oh, ow).transpose(3, 0, 4, 5, 1, 2)
        return _col2im(dcols, xshape, self.stride, self.padding, self.dilation, dcols.dtype)

    def _stride1(self, g, wm, xshape, kshape, out_hw):
        """Stride 1: the GEMM runs on the gradient zero-padded to the padded
        input's width, so every kernel tap of the scatter-add is one flat
        offset into each padded (C, N) image: KH*KW adds of long contiguous
        runs instead of short rows."""
        n, c, h, w = xshape
        kh, kw = kshape
        oh, ow = out_hw
        (ph, pw), (dh, dw) = self.padding, self.dilation
        grp, _, og = wm.shape
        hp, wp = h + 2 * ph, w + 2 * pw            # oh = hp - (kh-1)*dh, ow = wp - (kw-1)*dw
        gm = np.zeros((grp, og, n, oh, wp), g.dtype)
        gm[..., :ow] = g.reshape(n, grp, og, oh, ow).transpose(1, 2, 0, 3, 4)
        gm = gm.reshape(grp, og, n * oh * wp)
        dc = np.matmul(wm, gm) if grp > 1 else np.matmul(wm[0], gm[0])           # (grp,) K, N*OH*WP
        dc = dc.reshape(c, kh, kw, n, oh * wp)       # the columns past ow are zero
        out = np.zeros((c, n, hp * wp), dc.dtype)
        run = oh * wp - (kw - 1) * dw                # the rest of the last row is zero columns
        for i in range(kh):                          # loops over kernel positions only
            for j in range(kw):
                off = i * dh * wp + j * dw
                out[:, :, off:off + run] += dc[:, i, j, :, :run]
        return out.reshape(c, n, hp, wp)[:, :, ph:ph + h, pw:pw + w].transpose(1, 0, 2, 3)

    def cuda(self, be, g, w, ref):
        (out,) = self.infer(_desc(g), _desc(w), _desc(ref))
        if 0 in out.shape or w.shape[0] == 0:      # nothing to fill, or no outputs fed by it
            return be.zeros(out.shape, out.dtype)
        gx = self._on_cudnn(be, g, w, ref.shape)
        if gx is not None:
            return gx
        if not _use_gemm(out.dtype):
            return self._cuda_direct(be, [g, w], out, ref.shape, w.shape)
        gx = be.empty(out.shape, out.dtype)
        ints, (r, p, k, og) = self._gemm_geometry(ref.shape, w.shape)
        n, o, it = ref.shape[0], w.shape[0], g.itemsize
        pointwise = self._pointwise(w.shape)     # the columns are the gradient itself
        for n0, n1 in _image_chunks(n, r * p, CUDA_CHUNK_ELEMS):
            nb = n1 - n0
            dcols = gx if pointwise else be.empty((nb, r, p), out.dtype)
            base = dcols.ptr + (n0 * r * p * it if pointwise else 0)
            for grp in range(self.groups):
                # dcols[i, grp] (K, P) = w[grp]^T (K, OG) @ g[i, grp] (OG, P)
                gemm_rows(be, out.dtype, k, p, og, w.ptr + grp * og * k * it, g.ptr + (n0 * o + grp * og) * p * it,
                          base + grp * k * p * it, ta=True, stride_a=0, stride_b=o * p, stride_c=r * p, batch=nb)
            if not pointwise:
                be.launch_n(_gemm_kernel(self, be, "col2im", out.dtype), nb * (gx.size // n), dcols, gx,
                            n0, nb, *ints)
        return gx

    def vjp(self, inputs, outputs, grads):
        (g, w, ref), (gg,) = inputs, grads
        attrs = (self.stride, self.padding, self.dilation, self.groups)
        return [_apply1(Conv2d(*attrs), gg, w),
                _apply1(Conv2dBackwardFilter(*attrs), g, gg, w), None]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_conv2d_backward_data_<ctype>(gy, w, gx, <_CONV_ARGS>)``: one
        thread per input element (grid-stride loop, ``launch_n(N*C*H*W)``),
        gathering from every output it fed (no atomics)."""
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('conv2d_backward_data', T)}(const {T}* __restrict__ gy, "
            f"const {T}* __restrict__ w, {T}* __restrict__ gx, {_CONV_ARGS})\n{{\n"
            "    const int CG = C / G, OG = O / G;\n"
            "    const long long total = (long long)N * C * H * W;\n" + _LOOP +
            "        const int iw = (int)(idx % W); long long t = idx / W;\n"
            "        const int ih = (int)(t % H); t /= H;\n"
            "        const int c = (int)(t % C); const int n = (int)(t / C);\n"
            "        const int g = c / CG, cc = c % CG;\n"
            f"        {T} acc = 0;\n"
            "        for (int i = 0; i < KH; ++i) {\n"
            "            const int th = ih + PH - i * DH;\n"
            "            if (th < 0 || th % SH) continue;\n"
            "            const int oh = th / SH;\n"
            "            if (oh >= OH) continue;\n"
            "            for (int j = 0; j < KW; ++j) {\n"
            "                const int tw = iw + PW - j * DW;\n"
            "                if (tw < 0 || tw % SW) continue;\n"
            "                const int ow = tw / SW;\n"
            "                if (ow >= OW) continue;\n"
            "                for (int k = 0; k < OG; ++k) {\n"
            "                    const int o = g * OG + k;\n"
            "                    acc += gy[(((long long)n * O + o) * OH + oh) * OW + ow]\n"
            "                         * w[(((long long)o * CG + cc) * KH + i) * KW + j];\n"
            "                }\n"
            "            }\n"
            "        }\n"
            "        gx[idx] = acc;\n"
            "    }\n}\n")


class Conv2dBackwardFilter(_ConvGrad):
    """Gradient of Conv2d with respect to its weight: (g, x, w_ref) -> an
    array shaped like w_ref (read only for its shape)."""
    name = "Conv2dBackwardFilter"
    cudnn_direction = "backward_filter"
    check_shapes = (((1, 3, 3, 3), (1, 2, 5, 5), (3, 2, 3, 3)),)

    def _x_and_w(self, x, ref):
        return x, ref

    def cpu(self, g, x, ref):
        oh, ow = self._check_grad(g, x, ref)
        n, c = x.shape[:2]
        per_image = c * ref.shape[2] * ref.shape[3] * oh * ow
        gw = None
        for s, e in _image_chunks(n, per_image):       # a sum over chunks of images
            part = self._filter(g[s:e], x[s:e], ref.shape, (oh, ow))
            gw = part if gw is None else np.add(gw, part, out=gw)
        return np.ascontiguousarray(gw).reshape(ref.shape)

    def _filter(self, g, x, wshape, out_hw):
        oh, ow = out_hw
        grp = self.groups
        cols = self._cols(x, wshape[2:], (oh, ow))                           # grp, K, N*OH*OW
        gm = self._grad_rows(g, grp)                                           # grp, O/grp, N*OH*OW
        # computed as (cols @ gm^T)^T: BLAS is faster with the long N*OH*OW
        # axis as the reduction of a tall-skinny product; the transpose is small
        if grp == 1:
            return np.matmul(cols[0], gm[0].T).T
        return np.matmul(cols, gm.transpose(0, 2, 1)).transpose(0, 2, 1)

    def cuda(self, be, g, x, ref):
        (out,) = self.infer(_desc(g), _desc(x), _desc(ref))
        if 0 in out.shape or x.shape[0] == 0:      # no weights, or a sum over no images
            return be.zeros(out.shape, out.dtype)
        gw = self._on_cudnn(be, g, x, ref.shape)
        if gw is not None:
            return gw
        if not _use_gemm(out.dtype):
            return self._cuda_direct(be, [g, x], out, x.shape, ref.shape)
        gw = be.empty(out.shape, out.dtype)
        _, (r, p, k, og) = self._gemm_geometry(x.shape, ref.shape)
        n, o, it = x.shape[0], ref.shape[0], x.itemsize
        chunks = _image_chunks(n, r * p + o * k, CUDA_CHUNK_ELEMS)
        most = max(e - s for s, e in chunks)
        part = be.empty((most, o, k), out.dtype)          # each image's product
        ones = be.full((most,), 1, out.dtype)
        for n0, n1 in chunks:
            nb = n1 - n0
            scratch, cols = self._cuda_cols(be, x, ref.shape, n0, nb)      # alive while the GEMMs read it
            for grp in range(self.groups):
                # part[i, grp] (OG, K) = g[i, grp] (OG, P) @ cols[i, grp]^T (P, K)
                gemm_rows(be, out.dtype, og, k, p, g.ptr + (n0 * o + grp * og) * p * it, cols + grp * k * p * it,
                          part.ptr + grp * og * k * it, tb=True, stride_a=o * p, stride_b=r * p,
                          stride_c=o * k, batch=nb)
            # gw (1, O*K) (+)= ones (1, nb) @ part (nb, O*K): the sum over the images
            gemm_rows(be, out.dtype, 1, o * k, nb, ones.ptr, part.ptr, gw.ptr, beta=0.0 if n0 == 0 else 1.0)
        return gw

    def vjp(self, inputs, outputs, grads):
        (g, x, ref), (gg,) = inputs, grads
        attrs = (self.stride, self.padding, self.dilation, self.groups)
        return [_apply1(Conv2d(*attrs), x, gg),
                _apply1(Conv2dBackwardData(*attrs), g, gg, x), None]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_conv2d_backward_filter_<ctype>(gy, x, gw, <_CONV_ARGS>)``: one
        thread per weight element (grid-stride loop, ``launch_n(O*C/G*KH*KW)``),
        a reduction over N, OH, OW."""
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('conv2d_backward_filter', T)}(const {T}* __restrict__ gy, "
            f"const {T}* __restrict__ x, {T}* __restrict__ gw, {_CONV_ARGS})\n{{\n"
            "    const int CG = C / G, OG = O / G;\n"
            "    const long long total = (long long)O * CG * KH * KW;\n" + _LOOP +
            "        const int j = (int)(idx % KW); long long t = idx / KW;\n"
            "        const int i = (int)(t % KH); t /= KH;\n"
            "        const int cc = (int)(t % CG); const int o = (int)(t / CG);\n"
            "        const int c = (o / OG) * CG + cc;\n"
            f"        {T} acc = 0;\n"
            "        for (int n = 0; n < N; ++n) {\n"
            f"            const {T}* xc = x + ((long long)n * C + c) * H * W;\n"
            f"            const {T}* gc = gy + ((long long)n * O + o) * OH * OW;\n"
            "            for (int oh = 0; oh < OH; ++oh) {\n"
            "                const int ih = oh * SH - PH + i * DH;\n"
            "                if (ih < 0 || ih >= H) continue;\n"
            "                for (int ow = 0; ow < OW; ++ow) {\n"
            "                    const int iw = ow * SW - PW + j * DW;\n"
            "                    if (iw < 0 || iw >= W) continue;\n"
            "                    acc += gc[(long long)oh * OW + ow] * xc[(long long)ih * W + iw];\n"
            "                }\n"
            "            }\n"
            "        }\n"
            "        gw[idx] = acc;\n"
            "    }\n}\n")


# ---------------------------------------------------------------- pooling
class _PoolBase(Op):
    attrs = ("kernel_size", "stride", "padding")

    def __init__(self, kernel_size, stride=None, padding=0):
        n = self.name
        self.kernel_size = _pair(n, "kernel_size", kernel_size, 1)
        self.stride = self.kernel_size if stride is None else _pair(n, "stride", stride, 1)
        self.padding = _pair(n, "padding", padding, 0)

    def _check(self, x, descs):
        """Validate the input shape ``x``; return the pooled (OH, OW)."""
        if len(x) != 4:
            raise self.error(f"input must be 4-D (N, C, H, W), got {len(x)}-D", *descs)
        out = []
        for ax, (size, k, s, p) in enumerate(zip(x[2:], self.kernel_size, self.stride, self.padding)):
            dim = "height" if ax == 0 else "width"
            if p > k // 2:
                raise self.error(f"padding {p} must be at most half the kernel {dim} {k}", *descs)
            if size + 2 * p < k:
                raise self.error(f"kernel {dim} {k} is larger than the padded input {dim} "
                                 f"{size + 2 * p} ({size} + 2 * padding {p})", *descs)
            out.append(_out_size(size, k, s, p, 1))
        return tuple(out)

    def _float(self, *descs):
        if descs[0].dtype.kind != "f":
            raise self.error(f"needs a floating-point input, got {descs[0].dtype}", *descs)
        return descs[0].dtype

    def _taps(self, xp, out_hw):
        """The KH*KW strided views (N, C, OH, OW) of padded ``xp``, one per
        kernel offset, in row-major order."""
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        oh, ow = out_hw
        return [xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
                for i in range(kh) for j in range(kw)]

    def _cudnn_forward(self, be, x, out, kind):
        """The pooling on cuDNN (gradcore/cuda/cudnn.py), or None."""
        return cudnn.pool_forward(be, x, kind, self.kernel_size, self.stride, self.padding, out.shape)

    def _cudnn_backward(self, be, g, x, out, kind):
        """The input gradient on cuDNN from g (and x for max pooling), or None."""
        if x is not None and x.dtype != g.dtype:
            return None
        return cudnn.pool_backward(be, g, x, kind, self.kernel_size, self.stride, self.padding, out.shape)

    def _cuda_attrs(self):
        """The attributes as the kernels' trailing ints (after the shapes)."""
        return self.kernel_size + self.stride + self.padding

    def _cuda_run(self, be, arrays, out, xshape, pooled_shape):
        """The op's direct kernel on ``arrays`` into a new array for ``out``
        (a TensorDesc); its ints: x's shape, the pooled (OH, OW), then the
        attributes (``_POOL_ARGS``)."""
        return _launch_direct(self, be, arrays, out,
                              tuple(xshape) + tuple(pooled_shape[2:]) + self._cuda_attrs())


# the pooling kernels' ints: x (N, C, H, W), pooled (OH, OW), kernel size, stride, padding
_POOL_ARGS = "int N, int C, int H, int W, int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW"


# the argmax of a window, first maximum in row-major order (NaN wins), as the CPU kernel does
def _cuda_argmax(T, ind="        "):
    lines = [
        "const int h0 = oh * SH - PH, w0 = ow * SW - PW;",
        f"int best = -1; {T} m = 0;",
        "for (int i = 0; i < KH; ++i) {",
        "    const int ih = h0 + i;",
        "    if (ih < 0 || ih >= H) continue;",
        "    for (int j = 0; j < KW; ++j) {",
        "        const int iw = w0 + j;",
        "        if (iw < 0 || iw >= W) continue;",
        f"        const {T} v = xc[(long long)ih * W + iw];",
        "        if (best < 0 || (m == m && (v > m || v != v))) { m = v; best = ih * W + iw; }",
        "    }",
        "}"]
    return "".join(ind + line + "\n" for line in lines)


class _MaxPoolArgmax(_PoolBase):
    """Shared by the max-pooling ops: index of each window's maximum."""

    def _cuda_argmax_run(self, be, g, x, out, pooled_shape):
        """Run the kernel on (g, x) in one type, the wider of the two (exact:
        the argmax of x does not change), then give ``out``'s dtype."""
        common = np.result_type(g.dtype, x.dtype)
        y = self._cuda_run(be, [be.cast(g, common), be.cast(x, common)], TensorDesc(out.shape, common),
                           x.shape, pooled_shape)
        return be.cast(y, out.dtype)

    def _argmax(self, x):
        """Offset (row-major in the window) of each window's first maximum,
        NaN winning (as np.argmax): a loop over kernel offsets only."""
        oh, ow = self._check(x.shape, (TensorDesc(x.shape, x.dtype),))
        taps = self._taps(_pad(x, self.padding, -np.inf), (oh, ow))
        m = taps[0].copy()
        for t in taps[1:]:              # propagates NaN
            np.maximum(m, t, out=m)
        nan = bool(np.isnan(m).any())
        kk = len(taps)
        idx = np.full(m.shape, kk - 1, np.uint8 if kk <= 256 else np.intp)
        for k in range(kk - 2, -1, -1):   # descending: the first maximum is written last
            hit = taps[k] == m
            if nan:                       # where the max is NaN, the first NaN wins
                hit |= taps[k] != taps[k]
            np.copyto(idx, k, where=hit, casting="unsafe")
        return idx, (oh, ow)

    def _scatter(self, g, x):
        """g (pooled shape) added at each window's argmax, in x's shape."""
        idx, (oh, ow) = self._argmax(x)
        g = np.asarray(g)
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        h, w = x.shape[2:]
        out = np.zeros(x.shape, g.dtype)
        rows = _offset_slices(h, oh, kh, sh, ph, 1)
        colz = _offset_slices(w, ow, kw, sw, pw, 1)
        disjoint = sh >= kh and sw >= kw     # each input element in one window at most
        zero = g.dtype.type(0)
        for i in range(kh):              # loops over kernel positions only
            if rows[i] is None:
                continue
            ro, ri = rows[i]
            for j in range(kw):
                if colz[j] is None:
                    continue
                co, ci = colz[j]
                hit = idx[:, :, ro, co] == i * kw + j
                if disjoint:
                    np.copyto(out[:, :, ri, ci], g[:, :, ro, co], where=hit)
                else:
                    out[:, :, ri, ci] += np.where(hit, g[:, :, ro, co], zero)
        return out

    def _gather(self, gg, x):
        """gg (x's shape) read at each window's argmax, in the pooled shape."""
        idx, (oh, ow) = self._argmax(x)
        gg = np.asarray(gg)
        taps = self._taps(_pad(gg, self.padding, 0), (oh, ow))
        out = taps[-1].copy()
        for k in range(len(taps) - 2, -1, -1):
            np.copyto(out, taps[k], where=idx == k)
        return out


class MaxPool2d(_MaxPoolArgmax):
    """Max over KH x KW windows (padding never wins: it counts as -inf)."""
    name = "MaxPool2d"
    check_params = ({"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1})

    def infer(self, x):
        dtype = self._float(x)
        if x.shape is None:
            return (TensorDesc(None, dtype, x.device),)
        oh, ow = self._check(x.shape, (x,))
        return (TensorDesc(x.shape[:2] + (oh, ow), dtype, x.device),)

    def cpu(self, x):
        if x.dtype.kind != "f":
            self._float(TensorDesc(x.shape, x.dtype))
        oh, ow = self._check(x.shape, (TensorDesc(x.shape, x.dtype),))
        taps = self._taps(_pad(x, self.padding, -np.inf), (oh, ow))
        out = taps[0].copy()
        for t in taps[1:]:              # np.maximum propagates NaN, as np.max
            np.maximum(out, t, out=out)
        return out

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return [_apply1(MaxPool2dBackward(self.kernel_size, self.stride, self.padding), g, x)]

    def cuda(self, be, x):
        (out,) = self.infer(_desc(x))
        y = self._cudnn_forward(be, x, out, "max")
        return y if y is not None else self._cuda_run(be, [x], out, x.shape, out.shape)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_max_pool2d_<ctype>(x, y, <_POOL_ARGS>)``: one thread per
        pooled element (grid-stride loop, ``launch_n(N*C*OH*OW)``): its
        window's first maximum (NaN wins)."""
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('max_pool2d', T)}(const {T}* __restrict__ x, "
            f"{T}* __restrict__ y, {_POOL_ARGS})\n{{\n" +
            "    const long long total = (long long)N * C * OH * OW;\n" + _LOOP +
            "        const int ow = (int)(idx % OW); long long t = idx / OW;\n"
            "        const int oh = (int)(t % OH); const long long nc = t / OH;\n"
            f"        const {T}* xc = x + nc * H * W;\n"
            + _cuda_argmax(T) +
            "        y[idx] = m;\n"
            "    }\n}\n")


class MaxPool2dBackward(_MaxPoolArgmax):
    """(g, x) -> zeros shaped like x with each g added at its window's
    argmax (the first maximum): the backward of MaxPool2d."""
    name = "MaxPool2dBackward"
    check_params = ({"kernel_size": 2},)
    check_shapes = (((1, 2, 2, 2), (1, 2, 4, 4)),)

    def infer(self, g, x):
        self._float(x, g)
        if x.shape is not None and g.shape is not None:
            oh, ow = self._check(x.shape, (g, x))
            if tuple(g.shape) != x.shape[:2] + (oh, ow):
                raise self.error(f"gradient must have the pooled shape {x.shape[:2] + (oh, ow)}", g, x)
        return (TensorDesc(x.shape, g.dtype, g.device),)

    def cpu(self, g, x):
        return self._scatter(g, x)

    def cuda(self, be, g, x):
        (out,) = self.infer(_desc(g), _desc(x))
        gx = self._cudnn_backward(be, g, x, out, "max")
        return gx if gx is not None else self._cuda_argmax_run(be, g, x, out, g.shape)

    def vjp(self, inputs, outputs, grads):
        (g, x), (gg,) = inputs, grads
        # piecewise constant in x: no gradient for it
        return [_apply1(MaxPool2dGather(self.kernel_size, self.stride, self.padding), gg, x), None]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_max_pool2d_backward_<ctype>(gy, x, gx, <_POOL_ARGS>)``: one
        thread per input element (grid-stride loop, ``launch_n(N*C*H*W)``),
        summing gy over the windows whose argmax it is (no atomics)."""
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('max_pool2d_backward', T)}(const {T}* __restrict__ gy, "
            f"const {T}* __restrict__ x, {T}* __restrict__ gx, {_POOL_ARGS})\n{{\n" +
            "    const long long total = (long long)N * C * H * W;\n" + _LOOP +
            "        const int xw = (int)(idx % W); long long t = idx / W;\n"
            "        const int xh = (int)(t % H); const long long nc = t / H;\n"
            f"        const {T}* xc = x + nc * H * W;\n"
            f"        {T} acc = 0;\n"
            "        const int oh_lo = max(0, (xh + PH - KH + SH) / SH), oh_hi = min(OH - 1, (xh + PH) / SH);\n"
            "        const int ow_lo = max(0, (xw + PW - KW + SW) / SW), ow_hi = min(OW - 1, (xw + PW) / SW);\n"
            "        for (int oh = oh_lo; oh <= oh_hi; ++oh) {\n"
            "            for (int ow = ow_lo; ow <= ow_hi; ++ow) {\n"
            + _cuda_argmax(T, " " * 16) +
            "                if (best == xh * W + xw) acc += gy[(nc * OH + oh) * OW + ow];\n"
            "            }\n"
            "        }\n"
            "        gx[idx] = acc;\n"
            "    }\n}\n")


class MaxPool2dGather(_MaxPoolArgmax):
    """(gg, x) -> gg read at each window's argmax of x, in the pooled shape:
    the backward of MaxPool2dBackward (and the forward-mode of MaxPool2d)."""
    name = "MaxPool2dGather"
    check_params = ({"kernel_size": 2},)
    check_shapes = (((1, 2, 4, 4), (1, 2, 4, 4)),)

    def infer(self, gg, x):
        dtype = self._float(x, gg)
        if x.shape is None:
            return (TensorDesc(None, dtype, gg.device),)
        oh, ow = self._check(x.shape, (gg, x))
        if gg.shape is not None and tuple(gg.shape) != tuple(x.shape):
            raise self.error("gradient must have the input's shape", gg, x)
        return (TensorDesc(x.shape[:2] + (oh, ow), gg.dtype, gg.device),)

    def cpu(self, gg, x):
        return self._gather(gg, x)

    def cuda(self, be, gg, x):
        (out,) = self.infer(_desc(gg), _desc(x))
        return self._cuda_argmax_run(be, gg, x, out, out.shape)

    def vjp(self, inputs, outputs, grads):
        (gg, x), (g,) = inputs, grads
        return [_apply1(MaxPool2dBackward(self.kernel_size, self.stride, self.padding), g, x), None]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_max_pool2d_gather_<ctype>(gg, x, y, <_POOL_ARGS>)``: one
        thread per pooled element (grid-stride loop, ``launch_n(N*C*OH*OW)``):
        gg at its window's argmax of x."""
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('max_pool2d_gather', T)}(const {T}* __restrict__ gg, "
            f"const {T}* __restrict__ x, {T}* __restrict__ y, {_POOL_ARGS})\n{{\n" +
            "    const long long total = (long long)N * C * OH * OW;\n" + _LOOP +
            "        const int ow = (int)(idx % OW); long long t = idx / OW;\n"
            "        const int oh = (int)(t % OH); const long long nc = t / OH;\n"
            f"        const {T}* xc = x + nc * H * W;\n"
            + _cuda_argmax(T) +
            "        y[idx] = gg[nc * H * W + best];\n"
            "    }\n}\n")


class _AvgBase(_PoolBase):
    attrs = ("kernel_size", "stride", "padding", "mode")

    def __init__(self, kernel_size, stride=None, padding=0, mode="average_count_exclude_padding"):
        # MegEngine takes the mode in either case ("AVERAGE" in older releases)
        mode = mode.lower() if isinstance(mode, str) else mode
        if mode not in AVG_MODES:
            raise ValueError(f"{self.name}: mode must be one of {', '.join(AVG_MODES)}, got {mode!r}")
        self.mode = mode
        super().__init__(kernel_size, stride, padding)

    def _counts(self, shape, out_hw, dtype):
        """Divisor of each window, (OH, OW)."""
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        oh, ow = out_hw
        if self.mode == "average":
            return np.full((oh, ow), kh * kw, dtype)
        h, w = shape[2:]

        def valid(n_out, size, k, s, p):
            start = np.arange(n_out) * s - p
            return np.minimum(start + k, size) - np.maximum(start, 0)

        return np.multiply.outer(valid(oh, h, kh, sh, ph), valid(ow, w, kw, sw, pw)).astype(dtype)

    def _cuda_attrs(self):
        # then the mode: 1 divides by the count of non-padding elements
        return super()._cuda_attrs() + (int(self.mode != "average"),)


# the average pooling kernels take one more int after _POOL_ARGS
_AVG_ARGS = _POOL_ARGS + ", int exclude_padding"
_CUDA_COUNT = (
    "{ind}const int h0 = oh * SH - PH, w0 = ow * SW - PW;\n"
    "{ind}const int cnt = exclude_padding\n"
    "{ind}    ? (min(h0 + KH, H) - max(h0, 0)) * (min(w0 + KW, W) - max(w0, 0)) : KH * KW;\n")


class AvgPool2d(_AvgBase):
    """Mean over KH x KW windows; ``mode`` "average_count_exclude_padding"
    (MegEngine's default) divides by the number of non-padding elements,
    "average" by KH * KW."""
    name = "AvgPool2d"
    check_params = ({"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1})

    def infer(self, x):
        dtype = self._float(x)
        if x.shape is None:
            return (TensorDesc(None, dtype, x.device),)
        oh, ow = self._check(x.shape, (x,))
        return (TensorDesc(x.shape[:2] + (oh, ow), dtype, x.device),)

    def cpu(self, x):
        if x.dtype.kind != "f":
            self._float(TensorDesc(x.shape, x.dtype))
        oh, ow = self._check(x.shape, (TensorDesc(x.shape, x.dtype),))
        taps = self._taps(_pad(x, self.padding, 0), (oh, ow))
        out = taps[0].copy()
        for t in taps[1:]:
            out += t
        out /= self._counts(x.shape, (oh, ow), x.dtype)
        return out

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return [_apply1(AvgPool2dBackward(self.kernel_size, self.stride, self.padding, self.mode), g, x)]

    def cuda(self, be, x):
        (out,) = self.infer(_desc(x))
        y = self._cudnn_forward(be, x, out, self.mode)
        return y if y is not None else self._cuda_run(be, [x], out, x.shape, out.shape)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_avg_pool2d_<ctype>(x, y, <_POOL_ARGS>, int exclude_padding)``:
        one thread per pooled element (grid-stride loop,
        ``launch_n(N*C*OH*OW)``): its window's sum over its count (the
        non-padding elements when ``exclude_padding``, else KH*KW)."""
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('avg_pool2d', T)}(const {T}* __restrict__ x, "
            f"{T}* __restrict__ y, {_AVG_ARGS})\n{{\n" +
            "    const long long total = (long long)N * C * OH * OW;\n" + _LOOP +
            "        const int ow = (int)(idx % OW); long long t = idx / OW;\n"
            "        const int oh = (int)(t % OH); const long long nc = t / OH;\n"
            f"        const {T}* xc = x + nc * H * W;\n"
            + _CUDA_COUNT.format(ind="        ") +
            f"        {T} acc = 0;\n"
            "        for (int ih = max(h0, 0); ih < min(h0 + KH, H); ++ih)\n"
            "            for (int iw = max(w0, 0); iw < min(w0 + KW, W); ++iw)\n"
            "                acc += xc[(long long)ih * W + iw];\n"
            f"        y[idx] = acc / ({T})cnt;\n"
            "    }\n}\n")


class AvgPool2dBackward(_AvgBase):
    """(g, x_ref) -> each g divided by its window's count, spread over the
    window, in x_ref's shape (read only for its shape)."""
    name = "AvgPool2dBackward"
    check_params = ({"kernel_size": 2},)
    check_shapes = (((1, 2, 2, 2), (1, 2, 4, 4)),)
    shape_only_inputs = (1,)

    def infer(self, g, ref):
        dtype = self._float(g, ref)
        if ref.shape is not None and g.shape is not None:
            oh, ow = self._check(ref.shape, (g, ref))
            if tuple(g.shape) != ref.shape[:2] + (oh, ow):
                raise self.error(f"gradient must have the pooled shape {ref.shape[:2] + (oh, ow)}", g, ref)
        return (TensorDesc(ref.shape, dtype, g.device),)

    def cpu(self, g, ref):
        oh, ow = self._check(ref.shape, (TensorDesc(g.shape, g.dtype), TensorDesc(ref.shape, ref.dtype)))
        n, c = ref.shape[:2]
        kh, kw = self.kernel_size
        share = (g / self._counts(ref.shape, (oh, ow), g.dtype))[..., None, None]
        cols = np.broadcast_to(share, (n, c, oh, ow, kh, kw))
        return _col2im(cols, ref.shape, self.stride, self.padding, (1, 1), g.dtype)

    def vjp(self, inputs, outputs, grads):
        (g, ref), (gg,) = inputs, grads
        return [_apply1(AvgPool2d(self.kernel_size, self.stride, self.padding, self.mode), gg), None]

    def cuda(self, be, g, ref):
        (out,) = self.infer(_desc(g), _desc(ref))
        gx = self._cudnn_backward(be, g, None, out, self.mode)
        return gx if gx is not None else self._cuda_run(be, [g], out, ref.shape, g.shape)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_avg_pool2d_backward_<ctype>(gy, gx, <_POOL_ARGS>, int
        exclude_padding)``: one thread per input element (grid-stride loop,
        ``launch_n(N*C*H*W)``), summing each window's gy / count it is in."""
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('avg_pool2d_backward', T)}(const {T}* __restrict__ gy, "
            f"{T}* __restrict__ gx, {_AVG_ARGS})\n{{\n" +
            "    const long long total = (long long)N * C * H * W;\n" + _LOOP +
            "        const int xw = (int)(idx % W); long long t = idx / W;\n"
            "        const int xh = (int)(t % H); const long long nc = t / H;\n"
            f"        {T} acc = 0;\n"
            "        const int oh_lo = max(0, (xh + PH - KH + SH) / SH), oh_hi = min(OH - 1, (xh + PH) / SH);\n"
            "        const int ow_lo = max(0, (xw + PW - KW + SW) / SW), ow_hi = min(OW - 1, (xw + PW) / SW);\n"
            "        for (int oh = oh_lo; oh <= oh_hi; ++oh) {\n"
            "            for (int ow = ow_lo; ow <= ow_hi; ++ow) {\n"
            + _CUDA_COUNT.format(ind="                ") +
            f"                acc += gy[(nc * OH + oh) * OW + ow] / ({T})cnt;\n"
            "            }\n"
            "        }\n"
            "        gx[idx] = acc;\n"
            "    }\n}\n")


# ---------------------------------------------------------------- transposed convolution
class ConvTranspose2d(_ConvBase):
    """Transposed convolution of x (N, C_in, H, W) with weight (C_in,
    C_out // groups, KH, KW): the adjoint of Conv2d in its input, so it runs
    Conv2dBackwardData's kernels (CPU and cuda) with x as the output
    gradient. Output (N, C_out, (H-1)*SH - 2*PH + DH*(KH-1) + OPH + 1, ...);
    ``output_padding`` (< stride) picks among the sizes that convolve back
    to (H, W). Its gradients are the convolution ops themselves:
    x -> Conv2d (g, w), w -> Conv2dBackwardFilter (x, g, w_ref)."""
    input_dtypes = dtypes.promoted_inputs      # mixed float widths: the wider
    name = "ConvTranspose2d"
    attrs = ("stride", "padding", "output_padding", "dilation", "groups")

    def __init__(self, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
        self.output_padding = _pair(self.name, "output_padding", output_padding, 0)
        super().__init__(stride, padding, dilation, groups)
        for op, s in zip(self.output_padding, self.stride):
            if op >= s:
                raise ValueError(f"{self.name}: output_padding {self.output_padding} must be smaller than "
                                 f"the stride {self.stride}")

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: plain, and strided grouped with output_padding."""
        rng = np.random.default_rng(0)
        return [(cls(), [rng.standard_normal((2, 3, 4, 3)), rng.standard_normal((3, 2, 2, 3))]),
                (cls(2, 1, 1, 1, 2), [rng.standard_normal((1, 4, 3, 3)), rng.standard_normal((4, 3, 3, 2))])]

    def _out_shape(self, x, w, descs):
        """(N, C_out, OH, OW) for input shape ``x`` and weight shape ``w``."""
        if len(x) != 4:
            raise self.error(f"input must be 4-D (N, C, H, W), got {len(x)}-D", *descs)
        if len(w) != 4:
            raise self.error(f"weight must be 4-D (in_channels, out_channels // groups, kh, kw), "
                             f"got {len(w)}-D", *descs)
        g = self.groups
        if w[0] != x[1]:
            raise self.error(f"channel mismatch: input has {x[1]} channels, weight (in_channels, "
                             f"out_channels // groups, kh, kw) expects {w[0]}", *descs)
        if x[1] % g:
            raise self.error(f"input channels {x[1]} are not divisible by groups={g}", *descs)
        if min(w[2:]) < 1:
            raise self.error("kernel size must be positive", *descs)
        out = [(size - 1) * s - 2 * p + d * (k - 1) + op + 1 for size, k, s, p, d, op in
               zip(x[2:], w[2:], self.stride, self.padding, self.dilation, self.output_padding)]
        if min(out) < 1:
            raise self.error(f"output size {tuple(out)} is not positive: the padding {self.padding} "
                             f"removes more than the kernel and stride add", *descs)
        return (x[0], w[1] * g) + tuple(out)

    def infer(self, x, w):
        dtype = self._dtype(x, w)
        if x.shape is None or w.shape is None:
            return (TensorDesc(None, dtype, x.device),)
        return (TensorDesc(self._out_shape(x.shape, w.shape, (x, w)), dtype, x.device),)

    def cpu(self, x, w):
        (out,) = self.infer(TensorDesc(x.shape, x.dtype), TensorDesc(w.shape, w.dtype))
        ref = shape_carrier(np.broadcast_to(np.zeros((), out.dtype), out.shape))
        return Conv2dBackwardData(*self._attrs()).cpu(x, w, ref)

    def cuda(self, be, x, w):
        (out,) = self.infer(_desc(x), _desc(w))
        return Conv2dBackwardData(*self._attrs()).cuda(be, x, w, be.shape_only(out.shape, out.dtype))

    def vjp(self, inputs, outputs, grads):
        (x, w), (g,) = inputs, grads
        attrs = self._attrs()
        return [_apply1(Conv2d(*attrs), g, w), _apply1(Conv2dBackwardFilter(*attrs), x, g, w)]

    def cuda_source(self, ctype: str = "float") -> str:
        """The direct kernel it runs: Conv2dBackwardData's (``launch_n(N*C_out*OH*OW)``)."""
        return Conv2dBackwardData(*self._attrs()).cuda_source(ctype)


# ---------------------------------------------------------------- 3-d convolution
def _col2im_nd(cols, xshape, stride, padding, dilation):
    """The adjoint of the N-d window view: scatter-add ``cols`` (N, C,
    *out, *kernel) into an (N, C, *xshape[2:]) array, one add per kernel
    tap (taps that land in the padding are skipped)."""
    nd = len(xshape) - 2
    out_sp, k_sp = cols.shape[2:2 + nd], cols.shape[2 + nd:]
    out = np.zeros(xshape, cols.dtype)
    per_axis = [_offset_slices(*a) for a in zip(xshape[2:], out_sp, k_sp, stride, padding, dilation)]
    for tap in itertools.product(*[range(k) for k in k_sp]):     # loops over kernel taps only
        sl = [per_axis[a][t] for a, t in enumerate(tap)]
        if any(s is None for s in sl):
            continue
        out[(slice(None), slice(None)) + tuple(s[1] for s in sl)] += \
            cols[(slice(None), slice(None)) + tuple(s[0] for s in sl) + tap]
    return out


# the 3-d kernels' ints: x (N, C, D, H, W), weight (O, C/G, KD, KH, KW),
# output (N, O, OD, OH, OW), then stride, padding, dilation and groups
_CONV3D_ARGS = ("int N, int C, int D, int H, int W, int O, int KD, int KH, int KW, int OD, int OH, int OW, "
                "int SD, int SH, int SW, int PD, int PH, int PW, int DD, int DH, int DW, int G")


class _Conv3dBase(_ConvAttrs):
    spatial = 3

    def _cols(self, x, kshape, out_sp):
        """im2col, transposed: (groups, C/groups*KD*KH*KW, N*OD*OH*OW)."""
        n, c = x.shape[:2]
        g = self.groups
        pads = ((0, 0), (0, 0)) + tuple((p, p) for p in self.padding)
        xp = np.pad(x, pads) if any(self.padding) else x
        s0, s1, *ss = xp.strides
        cg = c // g
        view = as_strided(xp, (g, cg) + tuple(kshape) + (n,) + tuple(out_sp),
                          (s1 * cg, s1) + tuple(s * d for s, d in zip(ss, self.dilation)) + (s0,)
                          + tuple(s * st for s, st in zip(ss, self.stride)), writeable=False)
        return view.reshape(g, cg * int(np.prod(kshape)), n * int(np.prod(out_sp)))

    def _cuda_direct(self, be, arrays, out, xshape, wshape):
        ints = (tuple(xshape) + (wshape[0],) + tuple(wshape[2:]) + self._check(xshape, wshape, ())
                + self.stride + self.padding + self.dilation + (self.groups,))
        if 0 in out.shape:
            return be.zeros(out.shape, out.dtype)
        done = self._on_cudnn(be, arrays[0], arrays[1], out.shape)
        if done is not None:
            return done
        return _launch_direct(self, be, arrays, out, ints)


class Conv3d(_Conv3dBase):
    """Cross-correlation of x (N, C, D, H, W) with weight (O, C // groups, KD, KH, KW)."""
    name = "Conv3d"
    input_dtypes = dtypes.promoted_inputs      # mixed float widths: the wider

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: plain, and strided, padded, grouped."""
        rng = np.random.default_rng(0)
        return [(cls(), [rng.standard_normal((2, 2, 3, 4, 3)), rng.standard_normal((3, 2, 2, 2, 2))]),
                (cls(2, 1, 1, 2), [rng.standard_normal((1, 4, 3, 3, 4)), rng.standard_normal((2, 2, 2, 3, 2))])]

    def infer(self, x, w):
        dtype = self._dtype(x, w)
        if x.shape is None or w.shape is None:
            return (TensorDesc(None, dtype, x.device),)
        return (TensorDesc((x.shape[0], w.shape[0]) + self._check(x.shape, w.shape, (x, w)), dtype, x.device),)

    def cpu(self, x, w):
        (out,) = self.infer(TensorDesc(x.shape, x.dtype), TensorDesc(w.shape, w.dtype))
        out_sp = out.shape[2:]
        n, o, g = x.shape[0], w.shape[0], self.groups

        def forward(s, e):
            cols = self._cols(x[s:e], w.shape[2:], out_sp)                 # g, K, nb*P
            y = np.matmul(w.reshape(g, o // g, cols.shape[1]), cols)        # g, O/g, nb*P
            return y.reshape((g, o // g, e - s) + out_sp).swapaxes(0, 2).swapaxes(1, 2).reshape((e - s, o) + out_sp)

        return _by_images(forward, n, x.shape[1] * int(np.prod(w.shape[2:])) * int(np.prod(out_sp)))

    def vjp(self, inputs, outputs, grads):
        (x, w), (g,) = inputs, grads
        return [_apply1(Conv3dBackwardData(*self._attrs()), g, w, x),
                _apply1(Conv3dBackwardFilter(*self._attrs()), g, x, w)]

    def cuda(self, be, x, w):
        (out,) = self.infer(_desc(x), _desc(w))
        return self._cuda_direct(be, [x, w], out, x.shape, w.shape)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_conv3d_<ctype>(x, w, y, <_CONV3D_ARGS>)``: one thread per
        output element (grid-stride loop, ``launch_n(N*O*OD*OH*OW)``), a
        sum over the group's channels and the kernel taps."""
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('conv3d', T)}(const {T}* __restrict__ x, "
            f"const {T}* __restrict__ w, {T}* __restrict__ y, {_CONV3D_ARGS})\n{{\n"
            "    const int CG = C / G, OG = O / G;\n"
            "    const long long total = (long long)N * O * OD * OH * OW;\n" + _LOOP +
            "        const int ow = (int)(idx % OW); long long t = idx / OW;\n"
            "        const int oh = (int)(t % OH); t /= OH;\n"
            "        const int od = (int)(t % OD); t /= OD;\n"
            "        const int o = (int)(t % O); const int n = (int)(t / O);\n"
            "        const int g = o / OG;\n"
            f"        {T} acc = 0;\n"
            "        for (int c = 0; c < CG; ++c) {\n"
            f"            const {T}* xc = x + ((long long)n * C + (long long)g * CG + c) * D * H * W;\n"
            f"            const {T}* wc = w + ((long long)o * CG + c) * KD * KH * KW;\n"
            "            for (int a = 0; a < KD; ++a) {\n"
            "                const int id = od * SD - PD + a * DD;\n"
            "                if (id < 0 || id >= D) continue;\n"
            "                for (int i = 0; i < KH; ++i) {\n"
            "                    const int ih = oh * SH - PH + i * DH;\n"
            "                    if (ih < 0 || ih >= H) continue;\n"
            "                    for (int j = 0; j < KW; ++j) {\n"
            "                        const int iw = ow * SW - PW + j * DW;\n"
            "                        if (iw < 0 || iw >= W) continue;\n"
            "                        acc += xc[((long long)id * H + ih) * W + iw] * wc[(a * KH + i) * KW + j];\n"
            "                    }\n"
            "                }\n"
            "            }\n"
            "        }\n"
            "        y[idx] = acc;\n"
            "    }\n}\n")


class _Conv3dGrad(_Conv3dBase):
    """A gradient of Conv3d: (g, other operand, ref) -> an array shaped like
    ref (read only for its shape); checked as the 2-d ones are."""
    shape_only_inputs = (2,)
    _x_and_w = _ConvGrad._x_and_w
    infer = _ConvGrad.infer
    _check_grad = _ConvGrad._check_grad

    def _grad_rows(self, g):
        """Output gradient (N, O, *out) as (groups, O/groups, N*prod(out)), contiguous."""
        n, o = g.shape[:2]
        grp, p = self.groups, int(np.prod(g.shape[2:]))
        gm = np.ascontiguousarray(g.reshape(n, grp, o // grp, p).transpose(1, 2, 0, 3))
        return gm.reshape(grp, o // grp, n * p)


class Conv3dBackwardData(_Conv3dGrad):
    """Gradient of Conv3d with respect to its input: (g, weight, x_ref) ->
    an array shaped like x_ref (read only for its shape)."""
    name = "Conv3dBackwardData"
    cudnn_direction = "backward_data"

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: (g, w, x_ref), strided and grouped."""
        rng = np.random.default_rng(0)
        return [(cls(2, 1, 1, 2), [rng.standard_normal((1, 2, 2, 2, 3)), rng.standard_normal((2, 2, 2, 3, 2)),
                                   rng.standard_normal((1, 4, 3, 3, 4))])]

    def _x_and_w(self, w, ref):
        return ref, w

    def cpu(self, g, w, ref):
        desc = [TensorDesc(a.shape, a.dtype) for a in (g, w, ref)]
        out_sp = self._check_grad(*desc)
        n, c = ref.shape[:2]
        o, cg = w.shape[:2]
        k_sp = w.shape[2:]
        grp = self.groups
        wm = w.reshape(grp, o // grp, -1).transpose(0, 2, 1)                    # grp, K, O/grp

        def data(s, e):
            dcols = np.matmul(wm, self._grad_rows(g[s:e]))                        # grp, K, nb*P
            dcols = dcols.reshape((c,) + k_sp + (e - s,) + out_sp)                # c, kd, kh, kw, n, od, oh, ow
            dcols = dcols.transpose(4, 0, 5, 6, 7, 1, 2, 3)
            return _col2im_nd(dcols, (e - s,) + tuple(ref.shape[1:]), self.stride, self.padding, self.dilation)

        return _by_images(data, n, c * int(np.prod(k_sp)) * int(np.prod(out_sp)))

    def vjp(self, inputs, outputs, grads):
        (g, w, ref), (gg,) = inputs, grads
        return [_apply1(Conv3d(*self._attrs()), gg, w),
                _apply1(Conv3dBackwardFilter(*self._attrs()), g, gg, w), None]

    def cuda(self, be, g, w, ref):
        (out,) = self.infer(_desc(g), _desc(w), _desc(ref))
        return self._cuda_direct(be, [g, w], out, ref.shape, w.shape)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_conv3d_backward_data_<ctype>(gy, w, gx, <_CONV3D_ARGS>)``: one
        thread per input element (grid-stride loop, ``launch_n(N*C*D*H*W)``),
        gathering from every output it fed (no atomics)."""
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('conv3d_backward_data', T)}(const {T}* __restrict__ gy, "
            f"const {T}* __restrict__ w, {T}* __restrict__ gx, {_CONV3D_ARGS})\n{{\n"
            "    const int CG = C / G, OG = O / G;\n"
            "    const long long total = (long long)N * C * D * H * W;\n" + _LOOP +
            "        const int iw = (int)(idx % W); long long t = idx / W;\n"
            "        const int ih = (int)(t % H); t /= H;\n"
            "        const int id = (int)(t % D); t /= D;\n"
            "        const int c = (int)(t % C); const int n = (int)(t / C);\n"
            "        const int g = c / CG, cc = c % CG;\n"
            f"        {T} acc = 0;\n"
            "        for (int a = 0; a < KD; ++a) {\n"
            "            const int td = id + PD - a * DD;\n"
            "            if (td < 0 || td % SD || td / SD >= OD) continue;\n"
            "            const int od = td / SD;\n"
            "            for (int i = 0; i < KH; ++i) {\n"
            "                const int th = ih + PH - i * DH;\n"
            "                if (th < 0 || th % SH || th / SH >= OH) continue;\n"
            "                const int oh = th / SH;\n"
            "                for (int j = 0; j < KW; ++j) {\n"
            "                    const int tw = iw + PW - j * DW;\n"
            "                    if (tw < 0 || tw % SW || tw / SW >= OW) continue;\n"
            "                    const int ow = tw / SW;\n"
            "                    for (int k = 0; k < OG; ++k) {\n"
            "                        const int o = g * OG + k;\n"
            "                        acc += gy[((((long long)n * O + o) * OD + od) * OH + oh) * OW + ow]\n"
            "                             * w[((((long long)o * CG + cc) * KD + a) * KH + i) * KW + j];\n"
            "                    }\n"
            "                }\n"
            "            }\n"
            "        }\n"
            "        gx[idx] = acc;\n"
            "    }\n}\n")


class Conv3dBackwardFilter(_Conv3dGrad):
    """Gradient of Conv3d with respect to its weight: (g, x, w_ref) -> an
    array shaped like w_ref (read only for its shape)."""
    name = "Conv3dBackwardFilter"
    cudnn_direction = "backward_filter"

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: (g, x, w_ref), strided and grouped."""
        rng = np.random.default_rng(0)
        return [(cls(2, 1, 1, 2), [rng.standard_normal((1, 2, 2, 2, 3)), rng.standard_normal((1, 4, 3, 3, 4)),
                                   rng.standard_normal((2, 2, 2, 3, 2))])]

    def _x_and_w(self, x, ref):
        return x, ref

    def cpu(self, g, x, ref):
        desc = [TensorDesc(a.shape, a.dtype) for a in (g, x, ref)]
        out_sp = self._check_grad(*desc)
        n = x.shape[0]
        gw = np.zeros((self.groups, ref.shape[0] // self.groups, int(np.prod(ref.shape[1:]))), g.dtype)
        per_image = int(np.prod(ref.shape[1:])) * int(np.prod(out_sp))
        for s, e in _image_chunks(n, per_image):           # a sum over chunks of images
            cols = self._cols(x[s:e], ref.shape[2:], out_sp)                     # grp, K, nb*P
            gw += np.matmul(self._grad_rows(g[s:e]), cols.transpose(0, 2, 1))     # grp, O/grp, K
        return gw.reshape(ref.shape)

    def vjp(self, inputs, outputs, grads):
        (g, x, ref), (gg,) = inputs, grads
        return [_apply1(Conv3d(*self._attrs()), x, gg),
                _apply1(Conv3dBackwardData(*self._attrs()), g, gg, x), None]

    def cuda(self, be, g, x, ref):
        (out,) = self.infer(_desc(g), _desc(x), _desc(ref))
        return self._cuda_direct(be, [g, x], out, x.shape, ref.shape)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_conv3d_backward_filter_<ctype>(gy, x, gw, <_CONV3D_ARGS>)``:
        one thread per weight element (grid-stride loop,
        ``launch_n(O*C/G*KD*KH*KW)``), a reduction over N, OD, OH, OW."""
        T = ctype
        return (
            f"extern \"C\" __global__ void {_kname('conv3d_backward_filter', T)}(const {T}* __restrict__ gy, "
            f"const {T}* __restrict__ x, {T}* __restrict__ gw, {_CONV3D_ARGS})\n{{\n"
            "    const int CG = C / G, OG = O / G;\n"
            "    const long long total = (long long)O * CG * KD * KH * KW;\n" + _LOOP +
            "        const int j = (int)(idx % KW); long long t = idx / KW;\n"
            "        const int i = (int)(t % KH); t /= KH;\n"
            "        const int a = (int)(t % KD); t /= KD;\n"
            "        const int cc = (int)(t % CG); const int o = (int)(t / CG);\n"
            "        const int c = (o / OG) * CG + cc;\n"
            f"        {T} acc = 0;\n"
            "        for (int n = 0; n < N; ++n) {\n"
            f"            const {T}* xc = x + ((long long)n * C + c) * D * H * W;\n"
            f"            const {T}* gc = gy + ((long long)n * O + o) * OD * OH * OW;\n"
            "            for (int od = 0; od < OD; ++od) {\n"
            "                const int id = od * SD - PD + a * DD;\n"
            "                if (id < 0 || id >= D) continue;\n"
            "                for (int oh = 0; oh < OH; ++oh) {\n"
            "                    const int ih = oh * SH - PH + i * DH;\n"
            "                    if (ih < 0 || ih >= H) continue;\n"
            "                    for (int ow = 0; ow < OW; ++ow) {\n"
            "                        const int iw = ow * SW - PW + j * DW;\n"
            "                        if (iw < 0 || iw >= W) continue;\n"
            "                        acc += gc[((long long)od * OH + oh) * OW + ow]\n"
            "                             * xc[((long long)id * H + ih) * W + iw];\n"
            "                    }\n"
            "                }\n"
            "            }\n"
            "        }\n"
            "        gw[idx] = acc;\n"
            "    }\n}\n")


CONV_OPS = [Conv2d, Conv2dBackwardData, Conv2dBackwardFilter, MaxPool2d, MaxPool2dBackward,
            MaxPool2dGather, AvgPool2d, AvgPool2dBackward, ConvTranspose2d, Conv3d, Conv3dBackwardData,
            Conv3dBackwardFilter]
