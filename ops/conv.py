"""Convolution over any number of spatial axes: 1-d (N, C, L), 2-d (N, C, H,
W), 3-d (N, C, D, H, W); strided, padded, dilated, grouped and transposed.

Four ops, each for every number of spatial axes::

    Convolution(stride, padding, dilation, groups)          (x, w[, b]) -> y
    ConvolutionBackwardData(stride, padding, dilation, groups)    (g, w, x_ref) -> dx
    ConvolutionBackwardFilter(stride, padding, dilation, groups)  (g, x, w_ref[, b_ref]) -> dw[, db]
    ConvTranspose(stride, padding, output_padding, dilation, groups)   (x, w[, b]) -> y

x is (N, C, *spatial) and w (O, C // groups, *kernel) (ConvTranspose: (C_in,
C_out // groups, *kernel)); ``*_ref`` inputs are read for their shape only.
An attribute is an int (the same on every spatial axis) or a tuple with one
value per axis, which fixes the number of axes (and makes the other
attributes tuples of that length; the functional forms,
``F.conv1d/2d/3d`` and ``F.conv_transpose1d/2d/3d``, pass tuples).

The optional b is one bias per output channel, shaped (O,) (PyTorch's
form) or (1, O, 1, ...) (MegEngine's, as many axes as x). The convolution
and its bias add are one op (``F.conv2d(x, w, b)`` records one node; on
oneDNN one primitive takes the bias), and the filter gradient given a
``b_ref`` returns the bias gradient too, shaped like b (on oneDNN, where
its primitive runs on one thread, from the weight-gradient primitive
itself, ``onednn.fuse_bias_gradient``; elsewhere one reduction of g).
ConvTranspose takes a per-channel bias the same way (one op): its kernel,
oneDNN's backward-data primitive, takes none, so the op adds b in place to
the primitive's result, and the bias gradient is one sum of g (the
weight-gradient primitive, run with the roles swapped, sums x instead).

The gradients are these ops again, each with its own ``vjp``, so every
order of derivative works::

    Convolution               -> BackwardData (g, w, x_ref), BackwardFilter (g, x, w_ref[, b_ref])
    ConvolutionBackwardData   -> Convolution (gg, w), BackwardFilter (g, gg, w_ref)
    ConvolutionBackwardFilter -> Convolution (x, gg[, ggb]), BackwardData (g, gg, x_ref)
    ConvTranspose             -> Convolution (g, w), BackwardFilter (x, g, w_ref)[, sum of g]

ConvTranspose is the data gradient with x as the output gradient: it runs
ConvolutionBackwardData's kernels on both devices.

Kernels:

- CPU (NumPy): one GEMM per group on a transposed im2col matrix (C/groups *
  prod(kernel), N * prod(out)) copied out of a strided window view, over
  chunks of images whose matrix stays in cache (``_CHUNK_ELEMS``). The data
  gradient scatters its columns back with one add per kernel tap; at stride
  1 each tap is one flat offset into the padded images (long contiguous
  runs). The only Python loops are over kernel taps and image chunks.
- cuda: cuDNN where it is loaded (``gradcore/cuda/cudnn.py``; 1-d runs as
  2-d with a trailing axis of 1); else, in float32/float64 with
  ``CUDA_GEMM``, im2col + cuBLAS (one GEMM per group batched over the
  images of a chunk of at most ``CUDA_CHUNK_ELEMS`` scratch elements; col2im
  for the data gradient; a GEMM with ones sums the per-image filter
  gradients); else direct kernels, one thread per element written, no
  atomics. Every CUDA source is written for three spatial axes (1-d and 2-d
  run it with leading axes of size 1) and takes shapes and attributes as
  ``int`` arguments: one compiled module per element type serves every
  configuration and every number of axes.
"""
from __future__ import annotations

import functools
import itertools
from math import prod
import numpy as np
from numpy.lib.stride_tricks import as_strided

from gradcore import _core, dtypes
from gradcore.cpu import onednn
from gradcore.cuda import cudnn
from gradcore.cuda.kernels import Kernel, kernel_name, source
from gradcore.op import Op, TensorDesc, needs_grad, shape_carrier

from .elemwise import expression as elemwise_expression
from .linalg import check_cuda_dtype, gemm_rows
from .reduce import Reduce, op_int
from .shape import ReshapeLike


def _apply1(op, *args):
    return _core.apply(op, *args)[0]


def _axis_values(op_name, what, v, minimum):
    """An int (every spatial axis), or a tuple of ints (one per axis), each >= ``minimum``."""
    many = isinstance(v, (tuple, list))
    vals = tuple(op_int(op_name, what, a) for a in v) if many else (op_int(op_name, what, v),)
    if not vals:
        raise ValueError(f"{op_name}: {what} must be an int or one int per spatial axis, got {v!r}")
    if min(vals) < minimum:
        raise ValueError(f"{op_name}: {what} must be >= {minimum}, got {v!r}")
    return vals if many else vals[0]


def _out_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


_AXES = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}
_DIMS = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}


def _axis_names(n):
    return _AXES.get(n, tuple(f"S{i}" for i in range(n))), _DIMS.get(n, tuple(f"axis {i}" for i in range(n)))


# ---------------------------------------------------------------- NumPy helpers
def _pad(x, padding, fill=0):
    """``x`` (N, C, *spatial) padded by ``padding[a]`` on both sides of spatial axis a."""
    if not any(padding):
        return x
    out = np.full(x.shape[:2] + tuple(s + 2 * p for s, p in zip(x.shape[2:], padding)), fill, x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(p, p + s) for s, p in zip(x.shape[2:], padding))] = x
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


def _col2im(cols, xshape, stride, padding, dilation):
    """The adjoint of the window view: scatter-add ``cols`` (N, C, *out,
    *kernel) (any view, broadcast ones too) into a new (N, C, *spatial)
    array, one add per kernel tap; taps that land in the padding are skipped."""
    nd = len(xshape) - 2
    out_sp, k_sp = cols.shape[2:2 + nd], cols.shape[2 + nd:]
    out = np.zeros(xshape, cols.dtype)
    per_axis = [_offset_slices(*a) for a in zip(xshape[2:], out_sp, k_sp, stride, padding, dilation)]
    both = (slice(None), slice(None))
    for tap in itertools.product(*[range(k) for k in k_sp]):     # loops over kernel taps only
        sl = [per_axis[a][t] for a, t in enumerate(tap)]
        if None not in sl:
            out[both + tuple(s[1] for s in sl)] += cols[both + tuple(s[0] for s in sl) + tap]
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


def _grad_rows(g, grp):
    """Output gradient (N, O, *out) as (groups, O/groups, N*prod(out)), contiguous."""
    n, o = g.shape[:2]
    gm = np.ascontiguousarray(g.reshape(n, grp, o // grp, prod(g.shape[2:])).transpose(1, 2, 0, 3))
    return gm.reshape(grp, o // grp, n * prod(g.shape[2:]))


def _gemm(a, b, groups):
    """a @ b per group (axis 0); one plain GEMM when there is one group."""
    return np.matmul(a[0], b[0])[None] if groups == 1 else np.matmul(a, b)


# ---------------------------------------------------------------- CUDA helpers
# The convolutions run im2col + cuBLAS on cuda (False: the direct kernels),
# over chunks of images whose scratch matrices hold at most this many elements.
CUDA_GEMM = True
CUDA_CHUNK_ELEMS = 1 << 25
_GEMM_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _use_gemm(dtype):
    return CUDA_GEMM and np.dtype(dtype) in _GEMM_DTYPES


def _launch_direct(op, be, arrays, out, ints):
    """A new array for ``out`` (a TensorDesc) filled by ``op``'s direct
    kernel: (*arrays, out, *ints as int), one thread per output element."""
    check_cuda_dtype(op, out.dtype)
    y = be.empty(out.shape, out.dtype)
    be.launch_n(be.kernel(op, be.ctype(out.dtype)), y.size, *arrays, y, *[np.int32(i) for i in ints])
    return y


# the direct kernels' ints: x (N, C, D, H, W), weight (O, C/G, KD, KH, KW),
# output (N, O, OD, OH, OW), then stride, padding, dilation and groups
_CONV_ARGS = ("int N, int C, int D, int H, int W, int O, int KD, int KH, int KW, int OD, int OH, int OW, "
              "int SD, int SH, int SW, int PD, int PH, int PW, int DD, int DH, int DW, int G")
# the im2col/col2im kernels' ints
_GEMM_ARGS = ("int C, int D, int H, int W, int KD, int KH, int KW, int OD, int OH, int OW, "
              "int SD, int SH, int SW, int PD, int PH, int PW, int DD, int DH, int DW")


# one thread per element written (grid-stride loops)
_CONV = Kernel('conv', 'const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, ' + _CONV_ARGS, """
    const int ow = (int)(idx % OW); long long t = idx / OW;
    const int oh = (int)(t % OH); t /= OH;
    const int od = (int)(t % OD); t /= OD;
    const int o = (int)(t % O); const int n = (int)(t / O);
    const int g = o / OG;
    T acc = 0;
    for (int c = 0; c < CG; ++c) {
        const T* xc = x
            + ((long long)n * C + (long long)g * CG + c) * D * H * W;
        const T* wc = w + ((long long)o * CG + c) * KD * KH * KW;
        for (int a = 0; a < KD; ++a) {
            const int id = od * SD - PD + a * DD;
            if (id < 0 || id >= D) continue;
            for (int i = 0; i < KH; ++i) {
                const int ih = oh * SH - PH + i * DH;
                if (ih < 0 || ih >= H) continue;
                for (int j = 0; j < KW; ++j) {
                    const int iw = ow * SW - PW + j * DW;
                    if (iw < 0 || iw >= W) continue;
                    acc += xc[((long long)id * H + ih) * W + iw]
                         * wc[(a * KH + i) * KW + j];
                }
            }
        }
    }
    y[idx] = acc;""", over='total', setup="""
    const int CG = C / G, OG = O / G;
    const long long total = (long long)N * O * OD * OH * OW;""")
_CONV_BACKWARD_DATA = Kernel('conv_backward_data', 'const T* __restrict__ gy, const T* __restrict__ w, T* __restrict__ gx, ' + _CONV_ARGS, """
    const int iw = (int)(idx % W); long long t = idx / W;
    const int ih = (int)(t % H); t /= H;
    const int id = (int)(t % D); t /= D;
    const int c = (int)(t % C); const int n = (int)(t / C);
    const int g = c / CG, cc = c % CG;
    T acc = 0;
    for (int a = 0; a < KD; ++a) {
        const int td = id + PD - a * DD;
        if (td < 0 || td % SD || td / SD >= OD) continue;
        const int od = td / SD;
        for (int i = 0; i < KH; ++i) {
            const int th = ih + PH - i * DH;
            if (th < 0 || th % SH || th / SH >= OH) continue;
            const int oh = th / SH;
            for (int j = 0; j < KW; ++j) {
                const int tw = iw + PW - j * DW;
                if (tw < 0 || tw % SW || tw / SW >= OW) continue;
                const int ow = tw / SW;
                for (int k = 0; k < OG; ++k) {
                    const int o = g * OG + k;
                    const auto at = (((long long)n * O + o) * OD + od) * OH + oh;
                    const auto wt = (((long long)o * CG + cc) * KD + a) * KH + i;
                    acc += gy[at * OW + ow] * w[wt * KW + j];
                }
            }
        }
    }
    gx[idx] = acc;""", over='total', setup="""
    const int CG = C / G, OG = O / G;
    const long long total = (long long)N * C * D * H * W;""")
_CONV_BACKWARD_FILTER = Kernel('conv_backward_filter', 'const T* __restrict__ gy, const T* __restrict__ x, T* __restrict__ gw, ' + _CONV_ARGS, """
    const int j = (int)(idx % KW); long long t = idx / KW;
    const int i = (int)(t % KH); t /= KH;
    const int a = (int)(t % KD); t /= KD;
    const int cc = (int)(t % CG); const int o = (int)(t / CG);
    const int c = (o / OG) * CG + cc;
    T acc = 0;
    for (int n = 0; n < N; ++n) {
        const T* xc = x + ((long long)n * C + c) * D * H * W;
        const T* gc = gy + ((long long)n * O + o) * OD * OH * OW;
        for (int od = 0; od < OD; ++od) {
            const int id = od * SD - PD + a * DD;
            if (id < 0 || id >= D) continue;
            for (int oh = 0; oh < OH; ++oh) {
                const int ih = oh * SH - PH + i * DH;
                if (ih < 0 || ih >= H) continue;
                for (int ow = 0; ow < OW; ++ow) {
                    const int iw = ow * SW - PW + j * DW;
                    if (iw < 0 || iw >= W) continue;
                    acc += gc[((long long)od * OH + oh) * OW + ow]
                         * xc[((long long)id * H + ih) * W + iw];
                }
            }
        }
    }
    gw[idx] = acc;""", over='total', setup="""
    const int CG = C / G, OG = O / G;
    const long long total = (long long)O * CG * KD * KH * KW;""")
_IM2COL = Kernel('im2col', 'const T* __restrict__ x, T* __restrict__ cols, long long n0, long long nb, ' + _GEMM_ARGS, """
    const long long p = idx % P, t = idx / P, r = t % R, n = n0 + t / R;
    const int j = (int)(r % KW), i = (int)(r / KW % KH), a = (int)(r / ((long long)KW * KH) % KD);
    const int c = (int)(r / KK);
    const int id = (int)(p / ((long long)OH * OW)) * SD - PD + a * DD;
    const int ih = (int)(p / OW % OH) * SH - PH + i * DH, iw = (int)(p % OW) * SW - PW + j * DW;
    cols[idx] = (id >= 0 && id < D && ih >= 0 && ih < H && iw >= 0 && iw < W)
        ? x[(((n * C + c) * D + id) * H + ih) * W + iw] : (T)0;""", over='total', setup="""
    const long long P = (long long)OD * OH * OW, KK = (long long)KD * KH * KW, R = C * KK;
    const long long total = nb * R * P;""")
_COL2IM = Kernel('col2im', 'const T* __restrict__ cols, T* __restrict__ gx, long long n0, long long nb, ' + _GEMM_ARGS, """
    const int iw = (int)(idx % W), ih = (int)(idx / W % H), id = (int)(idx / ((long long)H * W) % D);
    const T* col = cols + idx / V * KD * KH * KW * P;   // image and channel
    T acc = 0;
    for (int a = 0; a < KD; ++a) {
        const int td = id + PD - a * DD;
        if (td < 0 || td % SD || td / SD >= OD) continue;
        for (int i = 0; i < KH; ++i) {
            const int th = ih + PH - i * DH;
            if (th < 0 || th % SH || th / SH >= OH) continue;
            for (int j = 0; j < KW; ++j) {
                const int tw = iw + PW - j * DW;
                if (tw < 0 || tw % SW || tw / SW >= OW) continue;
                acc += col[((a * KH + i) * KW + j) * P
                           + ((long long)(td / SD) * OH + th / SH) * OW + tw / SW];
            }
        }
    }
    gx[n0 * C * V + idx] = acc;""", over='total', setup="""
    const long long P = (long long)OD * OH * OW, V = (long long)D * H * W;
    const long long total = nb * C * V;""")


@functools.lru_cache(maxsize=None)      # built once per type: launchers ask on every call
def gemm_source(ctype: str = "float") -> str:
    """The convolutions' im2col kernels for the GEMM path, shapes and
    attributes as arguments (``_GEMM_ARGS``); one thread per element
    written (grid-stride loops):

    ``gc_im2col_<ctype>(x, cols, n0, nb, ...)``: cols (nb, C*KD*KH*KW,
    OD*OH*OW), rows (c, a, i, j), columns (od, oh, ow), of images
    n0..n0+nb of x (N, C, D, H, W); taps in the padding are 0.

    ``gc_col2im_<ctype>(cols, gx, n0, nb, ...)``: the adjoint, images
    n0..n0+nb of gx: each element gathers the columns of every tap that
    read it (no atomics).
    """
    return source(ctype, _IM2COL, _COL2IM)


# ---------------------------------------------------------------- what the four ops share
class _ConvOp(Op):
    """The attributes (ints or one value per spatial axis), the shape and
    dtype checks, the im2col view, and the cuDNN and CUDA geometry."""
    attrs = ("stride", "padding", "dilation", "groups")
    _per_axis_attrs = ("stride", "padding", "dilation")
    derived = ("_axes",)      # the number of spatial axes the attributes fix, or None (any)
    # which cuDNN call runs the op on a GPU (gradcore/cuda/cudnn.py)
    cudnn_direction = "forward"

    def __init__(self, stride=1, padding=0, dilation=1, groups=1):
        n = self.name
        self.stride = _axis_values(n, "stride", stride, 1)
        self.padding = _axis_values(n, "padding", padding, 0)
        self.dilation = _axis_values(n, "dilation", dilation, 1)
        self.groups = op_int(n, "groups", groups)
        if self.groups < 1:
            raise ValueError(f"{n}: groups must be >= 1, got {groups!r}")
        given = {a: getattr(self, a) for a in self._per_axis_attrs if isinstance(getattr(self, a), tuple)}
        if len({len(v) for v in given.values()}) > 1:
            raise ValueError(f"{n}: " + ", ".join(f"{a} {v}" for a, v in given.items())
                             + " give different numbers of spatial axes")
        self._axes = len(next(iter(given.values()))) if given else None
        for a in self._per_axis_attrs if given else ():     # Convolution((2, 2), 1) == Convolution((2, 2), (1, 1))
            setattr(self, a, self._per_axis(self._axes, (a,))[0])

    def _per_axis(self, n, names=("stride", "padding", "dilation")):
        """The attributes ``names`` as n-tuples (remembered: every launch asks)."""
        memo = self.__dict__.get("_per_axis_memo")      # ops are immutable: a cache beside the attributes
        if memo is None:
            memo = self.__dict__["_per_axis_memo"] = {}
        found = memo.get((n, names))
        if found is None:
            found = memo[(n, names)] = tuple(v if isinstance(v, tuple) else (v,) * n
                                             for v in (getattr(self, a) for a in names))
        return found

    def _attrs(self):
        return self.stride, self.padding, self.dilation, self.groups

    def _ndim_check(self, x, w, descs, weight_layout):
        """The number of spatial axes, once x and w have the right rank."""
        n = self._axes or max(len(x) - 2, 1)
        axes, _ = _axis_names(n)
        if len(x) != n + 2:
            raise self.error(f"input must be {n + 2}-D (N, C, {', '.join(axes)}), got {len(x)}-D", *descs)
        if len(w) != n + 2:
            kernel = ", ".join("k" + a.lower() for a in axes)
            raise self.error(f"weight must be {n + 2}-D ({weight_layout}, {kernel}), got {len(w)}-D", *descs)
        if min(w[2:]) < 1:
            raise self.error("kernel size must be positive", *descs)
        return n

    def _check(self, x, w, descs):
        """Validate input shape ``x`` (N, C, *spatial) against weight shape
        ``w`` (O, C/groups, *kernel); return the output's spatial sizes.
        ``descs`` name the shapes in the message."""
        n = self._ndim_check(x, w, descs, "out_channels, in_channels // groups")
        g = self.groups
        if x[1] % g:
            raise self.error(f"input channels {x[1]} are not divisible by groups={g}", *descs)
        if w[0] % g:
            raise self.error(f"output channels {w[0]} are not divisible by groups={g}", *descs)
        if w[1] * g != x[1]:
            raise self.error(f"channel mismatch: input has {x[1]} channels, weight expects "
                             f"{w[1]} * groups={g} = {w[1] * g}", *descs)
        out = []
        for dim, size, k, s, p, d in zip(_axis_names(n)[1], x[2:], w[2:], *self._per_axis(n)):
            eff = d * (k - 1) + 1
            if size + 2 * p < eff:
                raise self.error(f"kernel {dim} {eff} (kernel {k}, dilation {d}) is larger than the "
                                 f"padded input {dim} {size + 2 * p} ({size} + 2 * padding {p})", *descs)
            out.append(_out_size(size, k, s, p, d))
        return tuple(out)

    def _dtype(self, *descs):
        """The one floating dtype of the inputs ``descs`` (their descriptions)."""
        if any(d.dtype.kind != "f" for d in descs):
            raise self.error(f"needs floating-point inputs, got {' and '.join(str(d.dtype) for d in descs)}",
                             *descs)
        if any(d.dtype != descs[0].dtype for d in descs[1:]):
            raise self.error(f"input dtypes differ ({' and '.join(str(d.dtype) for d in descs)})", *descs)
        return descs[0].dtype

    def _check_bias(self, b, o, nd, descs):
        """A bias (shape ``b``) must hold one value per output channel (``o``
        of them) as (O,) or (1, O, 1, ...) with ``nd`` trailing 1s: the
        kernels add it per channel and the bias gradient is shaped like it."""
        if tuple(b) not in ((o,), (1, o) + (1,) * nd):
            want = ", ".join(["1", str(o)] + ["1"] * nd)
            raise self.error(f"bias must have one value per output channel, shaped ({o},) or ({want}), "
                             f"got shape {tuple(b)}", *descs)

    @staticmethod
    def _channel_view(b, nd):
        """The bias ``b`` (O,) or (1, O, 1, ...) viewed as (1, O, 1, ...) for ``nd`` spatial axes."""
        return b.reshape((1, -1) + (1,) * nd)

    def _cols(self, x, kshape, out_sp):
        """im2col, transposed: (groups, C/groups*prod(kernel), N*prod(out)),
        contiguous. Rows are (c, *tap), columns (n, *out): the copy out of
        the window view runs along the last output axis (contiguous at
        stride 1), and the GEMMs need no transposed copies of the big matrix."""
        n, c = x.shape[:2]
        g, cg = self.groups, x.shape[1] // self.groups
        stride, padding, dilation = self._per_axis(len(kshape))
        xp = _pad(x, padding)
        s0, s1, *ss = xp.strides
        view = as_strided(xp, (g, cg) + tuple(kshape) + (n,) + tuple(out_sp),
                          (s1 * cg, s1) + tuple(s * d for s, d in zip(ss, dilation)) + (s0,)
                          + tuple(s * st for s, st in zip(ss, stride)), writeable=False)
        return view.reshape(g, cg * prod(kshape), n * prod(out_sp))

    # ------------------------------------------------------------ cpu: oneDNN
    def _on_onednn(self, a, b, out_shape, bias=None, relu=False):
        """The op on oneDNN (``gradcore/cpu/onednn.py``): (x, w) forward,
        (g, w) backward_data, (g, x) backward_filter, ``out_shape`` the
        result's; None where oneDNN does not run it (not loaded, switched
        off, not float32, more than 3 spatial axes, a configuration it
        refuses) and the NumPy kernels do. ``bias``: the forward's bias
        array (added by the primitive), or for backward_filter True (the
        result is then the pair (dw, db), db of shape (O,)); ``relu``: the
        forward's ReLU (a post-op of the primitive)."""
        n = len(out_shape) - 2
        if n > 3 or a.dtype != b.dtype:
            return None
        s, p, d = self._per_axis(n)
        direction = self.cudnn_direction
        if direction == "forward":
            return onednn.conv_forward(a, b, s, p, d, self.groups, bias=bias, relu=relu)
        if direction == "backward_data":
            return onednn.conv_backward_data(a, b, out_shape, s, p, d, self.groups)
        return onednn.conv_backward_weights(a, b, out_shape, s, p, d, self.groups, bias=bool(bias))

    # ------------------------------------------------------------ cuda
    def _on_cudnn(self, be, a, b, out_shape):
        """The op on cuDNN: (x, w) forward, (g, w) backward_data, (g, x)
        backward_filter, ``out_shape`` the result's; None where cuDNN does
        not run it (no GPU, no cuDNN, a configuration it refuses, switched
        off) and the op's own kernels do. 1-d runs as 2-d (cuDNN takes 2 or
        3 spatial axes) with a trailing axis of 1."""
        n = len(out_shape) - 2
        if a.dtype != b.dtype or n > 3:
            return None
        s, p, d = self._per_axis(n)
        if n == 1:
            a, b, out_shape = a.reshape(a.shape + (1,)), b.reshape(b.shape + (1,)), tuple(out_shape) + (1,)
            s, p, d = s + (1,), p + (0,), d + (1,)
        attrs, direction = (s, p, d, self.groups), self.cudnn_direction
        if direction == "forward":
            y = cudnn.conv_forward(be, a, b, attrs)
        elif direction == "backward_data":
            y = cudnn.conv_backward_data(be, a, b, out_shape, attrs)
        else:
            y = cudnn.conv_backward_filter(be, a, b, out_shape, attrs)
        return y.reshape(y.shape[:-1]) if y is not None and n == 1 else y

    def _cuda_geometry(self, xshape, wshape):
        """The problem as the CUDA kernels see it: x (N, C, D, H, W), weight
        (O, C/G, KD, KH, KW), output (OD, OH, OW), stride, padding,
        dilation, with leading spatial axes of size 1 up to three."""
        n = len(xshape) - 2
        out = self._check(xshape, wshape, (TensorDesc(xshape), TensorDesc(wshape)))
        if n > 3:
            raise self.error(f"the CUDA kernels take 1 to 3 spatial axes, got {n}",
                             TensorDesc(xshape), TensorDesc(wshape))
        one = (1,) * (3 - n)
        s, p, d = self._per_axis(n)
        return (tuple(xshape[:2]) + one + tuple(xshape[2:]), tuple(wshape[:2]) + one + tuple(wshape[2:]),
                one + out, one + s, (0,) * (3 - n) + p, one + d)

    def _cuda_direct(self, be, arrays, out, xshape, wshape):
        """The op's direct kernel on ``arrays`` into a new array for ``out``
        (a TensorDesc); its ints: ``_CONV_ARGS``."""
        x5, w5, o3, s, p, d = self._cuda_geometry(xshape, wshape)
        return _launch_direct(self, be, arrays, out, x5 + (w5[0],) + w5[2:] + o3 + s + p + d + (self.groups,))

    def _gemm_geometry(self, xshape, wshape):
        """(int args of the im2col/col2im kernels, per-image sizes): rows
        R = C*prod(kernel) of the image's matrix, its columns P =
        prod(out), a group's rows K = R / groups, the output channels per
        group OG."""
        x5, w5, o3, s, p, d = self._cuda_geometry(xshape, wshape)
        ints = [np.int32(v) for v in x5[1:] + w5[2:] + o3 + s + p + d]
        kk = prod(w5[2:])
        return ints, (x5[1] * kk, prod(o3), w5[1] * kk, w5[0] // self.groups)

    def _pointwise(self, wshape):
        """A 1x..x1 kernel, stride 1, no padding: the im2col matrix is the input."""
        n = len(wshape) - 2
        s, p, _ = self._per_axis(n)
        return max(wshape[2:]) == 1 and max(s) == 1 and not any(p)

    def _cuda_cols(self, be, x, wshape, n0, nb):
        """The im2col matrices (nb, C*prod(kernel), prod(out)) of images
        n0..n0+nb of x: (the array to keep alive, its address)."""
        if self._pointwise(wshape):
            return x, x.ptr + n0 * (x.size // x.shape[0]) * x.itemsize
        ints, (r, p, _, _) = self._gemm_geometry(x.shape, wshape)
        cols = be.empty((nb, r, p), x.dtype)
        be.launch_n(be.kernel(self, be.ctype(x.dtype), name=kernel_name("im2col", be.ctype(x.dtype)),
                              source=gemm_source(be.ctype(x.dtype))), cols.size, x, cols, n0, nb, *ints)
        return cols, cols.ptr


def _examples(cls, cases):
    """Sample inputs for ``gradcore.testing.check_op``: (attributes, shapes) per case."""
    rng = np.random.default_rng(0)
    return [(cls(*attrs), [rng.standard_normal(s) for s in shapes]) for attrs, shapes in cases]


# ---------------------------------------------------------------- convolution
# what follows the convolution (and its bias) inside the op: MegEngine's
# ConvBias modes that gradcore fuses
NONLINEAR_MODES = ("identity", "relu")
# ReLU's derivative, as the op's backward applies it: a select, not a
# product with a bool mask (that would cast the mask, a kernel more on cuda)
_RELU_GRAD = elemwise_expression("out, g", "where(out > 0, g, 0)")


class Convolution(_ConvOp):
    """Cross-correlation of x (N, C, *spatial) with weight (O, C // groups,
    *kernel), plus an optional bias b per output channel, (O,) or (1, O, 1,
    ...): 1-d, 2-d, 3-d (any number of spatial axes on the CPU), then
    ``nonlinear_mode`` ("identity", or "relu": MegEngine's ConvBias mode,
    ``M.ConvRelu2d``'s op; on oneDNN a post-op of the primitive).

    Example::

        >>> Convolution((2, 2), (1, 1))(x, w)        # F.conv2d(x, w, stride=2, padding=1)
        >>> Convolution((1, 1), (1, 1))(x, w, b)     # F.conv2d(x, w, b, padding=1): one op
        >>> Convolution(1, 1, nonlinear_mode="relu")(x, w, b)    # F.relu(F.conv2d(x, w, b, padding=1))
    """
    name = "Convolution"
    attrs = _ConvOp.attrs + ("nonlinear_mode",)
    reduce_broadcast = False
    input_dtypes = dtypes.promoted_inputs      # a float16 input with a float32 weight: float32

    def __init__(self, stride=1, padding=0, dilation=1, groups=1, nonlinear_mode="identity"):
        super().__init__(stride, padding, dilation, groups)
        if nonlinear_mode not in NONLINEAR_MODES:
            raise ValueError(f"{self.name}: nonlinear_mode must be one of {', '.join(NONLINEAR_MODES)}, "
                             f"got {nonlinear_mode!r}")
        self.nonlinear_mode = nonlinear_mode

    @classmethod
    def examples(cls):
        """1-d, 2-d (strided, padded, dilated, grouped) and 3-d; with a bias
        (O,) (1-d, grouped 2-d) and (1, O, 1, 1, 1) (3-d)."""
        return _examples(cls, [((), [(2, 2, 5), (3, 2, 2)]),
                               (((2, 1), 1, (1, 2), 2), [(2, 4, 5, 4), (4, 2, 3, 2)]),
                               ((2, 1, 1, 2), [(1, 4, 3, 3, 4), (2, 2, 2, 3, 2)]),
                               ((2, 1), [(2, 2, 5), (3, 2, 2), (3,)]),
                               (((1, 2), 1, 1, 2), [(2, 4, 4, 5), (4, 2, 3, 2), (4,)]),
                               ((1, 1, 1, 2), [(1, 4, 3, 3, 4), (2, 2, 2, 3, 2), (1, 2, 1, 1, 1)]),
                               ((1, 1, 1, 1, "relu"), [(2, 3, 4, 5), (4, 3, 3, 3), (4,)])])

    def infer(self, x, w, b=None):
        dtype = self._dtype(x, w) if b is None else self._dtype(x, w, b)
        if x.shape is None or w.shape is None:
            return (TensorDesc(None, dtype, x.device),)
        descs = (x, w) if b is None else (x, w, b)
        out = self._check(x.shape, w.shape, descs)
        if b is not None and b.shape is not None:
            self._check_bias(b.shape, w.shape[0], len(out), descs)
        return (TensorDesc((x.shape[0], w.shape[0]) + out, dtype, x.device),)

    def cpu(self, x, w, b=None):
        descs = (x, w) if b is None else (x, w, b)
        out_sp = self._check(x.shape, w.shape, descs)
        if b is not None:
            self._check_bias(b.shape, w.shape[0], len(out_sp), descs)
        if x.dtype != w.dtype or x.dtype.kind != "f" or (b is not None and b.dtype != x.dtype):
            self._dtype(*[TensorDesc(a.shape, a.dtype) for a in descs])
        relu = self.nonlinear_mode == "relu"
        y = self._on_onednn(x, w, (x.shape[0], w.shape[0]) + out_sp, bias=b, relu=relu)
        if y is not None:
            return y
        n, o, g = x.shape[0], w.shape[0], self.groups
        bias = None if b is None else self._channel_view(b, len(out_sp))

        def images(s, e):
            cols = self._cols(x[s:e], w.shape[2:], out_sp)                     # g, K, nb*P
            y = _gemm(w.reshape(g, o // g, cols.shape[1]), cols, g)             # g, O/g, nb*P
            y = y.reshape(o, e - s, prod(out_sp)).swapaxes(0, 1).reshape((e - s, o) + out_sp)
            # per chunk, while it is in cache, in place: y is the GEMM's fresh result
            if bias is not None:
                np.add(y, bias, out=y)
            if relu:
                np.maximum(y, 0, out=y)
            return y

        return _by_images(images, n, x.shape[1] * prod(w.shape[2:]) * prod(out_sp))

    def vjp(self, inputs, outputs, grads):
        (g,) = grads
        if self.nonlinear_mode == "relu":
            g = _RELU_GRAD(outputs[0], g)        # ReLU's derivative: g where y > 0
        x, w = inputs[0], inputs[1]
        dx = _apply1(ConvolutionBackwardData(*self._attrs()), g, w, x)
        if len(inputs) == 2 or not needs_grad(inputs[2]):
            return [dx, _apply1(ConvolutionBackwardFilter(*self._attrs()), g, x, w), None][:len(inputs)]
        b = inputs[2]
        if needs_grad(w) or self._axes is None:
            # the weight and bias gradients from one op (on oneDNN one
            # primitive); with a frozen weight also where the number of axes
            # is open (an op built with ints), dw then computed and dropped
            dw, db = _core.apply(ConvolutionBackwardFilter(*self._attrs()), g, x, w, b)
            return [dx, dw, db]
        # a frozen weight: the bias gradient alone, one reduction (x not kept for it)
        return [dx, None, _bias_sum(g, b, self._axes)]

    def cuda(self, be, x, w, b=None):
        y = self._cuda_conv(be, x, w) if b is None else self._cuda_conv(be, x, w, b)
        if b is not None and y.size:
            # cuDNN's plans and the GEMM path stay bias-free (one plan per
            # configuration); the bias is one broadcast add, in place
            be.elementwise("add", y, self._channel_view(b, y.ndim - 2), out=y)
        if self.nonlinear_mode == "relu" and y.size:
            be.elementwise("relu", y, out=y)
        return y

    def _cuda_conv(self, be, x, w, *b):
        """The convolution without its bias, into a new array."""
        (out,) = self.infer_arrays(x, w, *b)
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

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_conv_<ctype>(x, w, y, <_CONV_ARGS>)``: one thread per output
        element (``launch_n(N*O*OD*OH*OW)``), a sum over the group's
        channels and the kernel taps."""
        return _CONV.source(ctype)



class _ConvGrad(_ConvOp):
    """A gradient of Convolution: (g, other operand, ref) -> an array shaped
    like ref (read only for its shape). ``_x_and_w`` says which of the two
    is the input and which the weight."""
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


class ConvolutionBackwardData(_ConvGrad):
    """Gradient of Convolution with respect to its input: (g, weight, x_ref)
    -> an array shaped like x_ref (read only for its shape)."""
    name = "ConvolutionBackwardData"
    reduce_broadcast = False
    cudnn_direction = "backward_data"

    @classmethod
    def examples(cls):
        """(g, w, x_ref): 1-d strided, 2-d at stride 1 (the flat-offset path), 3-d strided and grouped."""
        return _examples(cls, [((2, 1, 1, 1), [(2, 3, 3), (3, 2, 2), (2, 2, 5)]),
                               ((1, (1, 0), (1, 2), 2), [(1, 4, 5, 3), (4, 1, 2, 2), (1, 2, 4, 5)]),
                               ((2, 1, 1, 2), [(1, 2, 2, 2, 3), (2, 2, 2, 3, 2), (1, 4, 3, 3, 4)])])

    def _x_and_w(self, w, ref):
        return ref, w

    def cpu(self, g, w, ref):
        out_sp = self._check_grad(g, w, ref)
        dx = self._on_onednn(g, w, tuple(ref.shape))
        if dx is not None:
            return dx
        n, c = ref.shape[:2]
        return _by_images(lambda s, e: self._data(g[s:e], w, (e - s,) + tuple(ref.shape[1:]), out_sp),
                          n, c * prod(w.shape[2:]) * prod(out_sp))

    def _data(self, g, w, xshape, out_sp):
        """Input gradient of images ``g``, (N, C, *spatial), possibly a strided view."""
        nd = len(out_sp)
        n, c = xshape[:2]
        o, cg, k_sp = w.shape[0], w.shape[1], tuple(w.shape[2:])
        grp = self.groups
        wm = w.reshape(grp, o // grp, cg * prod(k_sp)).transpose(0, 2, 1)        # grp, K, O/grp
        stride, padding, dilation = self._per_axis(nd)
        if max(stride) == 1:
            return self._stride1(g, wm, xshape, k_sp, out_sp, padding, dilation)
        dcols = _gemm(wm, _grad_rows(g, grp), grp)                                 # grp, K, N*P
        # rows (c, *tap), columns (n, *out): view as (N, C, *out, *kernel)
        dcols = dcols.reshape((c,) + k_sp + (n,) + out_sp).transpose(
            (nd + 1, 0) + tuple(range(nd + 2, 2 * nd + 2)) + tuple(range(1, nd + 1)))
        return _col2im(dcols, xshape, stride, padding, dilation)

    @staticmethod
    def _stride1(g, wm, xshape, k_sp, out_sp, padding, dilation):
        """Stride 1: the GEMM runs on the gradient zero-padded to the padded
        input's size on every spatial axis but the first, so every kernel tap
        of the scatter-add is one flat offset into each padded (C, N) image:
        prod(kernel) adds of long contiguous runs instead of short rows."""
        n, c = xshape[:2]
        nd = len(out_sp)
        grp, _, og = wm.shape
        padded = tuple(s + 2 * p for s, p in zip(xshape[2:], padding))
        flat = [prod(padded[a + 1:]) for a in range(nd)]       # flat stride of each spatial axis
        gm = np.zeros((grp, og, n, out_sp[0]) + padded[1:], g.dtype)
        gm[(Ellipsis,) + tuple(slice(0, o) for o in out_sp[1:])] = \
            g.reshape((n, grp, og) + out_sp).transpose((1, 2, 0) + tuple(range(3, 3 + nd)))
        span = out_sp[0] * flat[0]
        dc = _gemm(wm, gm.reshape(grp, og, n * span), grp).reshape(c, prod(k_sp), n, span)
        # past the last output of the last row everything is zero columns: each run stops there
        run = span - sum((k - 1) * d * f for k, d, f in zip(k_sp[1:], dilation[1:], flat[1:]))
        out = np.zeros((c, n, prod(padded)), dc.dtype)
        for t, tap in enumerate(itertools.product(*[range(k) for k in k_sp])):    # loops over taps only
            off = sum(i * d * f for i, d, f in zip(tap, dilation, flat))
            out[:, :, off:off + run] += dc[:, t, :, :run]
        crop = (slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(padding, xshape[2:]))
        return out.reshape((c, n) + padded)[crop].swapaxes(0, 1)

    def cuda(self, be, g, w, ref):
        (out,) = self.infer_arrays(g, w, ref)
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
        T = be.ctype(out.dtype)
        for n0, n1 in _image_chunks(n, r * p, CUDA_CHUNK_ELEMS):
            nb = n1 - n0
            dcols = gx if pointwise else be.empty((nb, r, p), out.dtype)
            base = dcols.ptr + (n0 * r * p * it if pointwise else 0)
            for grp in range(self.groups):
                # dcols[i, grp] (K, P) = w[grp]^T (K, OG) @ g[i, grp] (OG, P)
                gemm_rows(be, out.dtype, k, p, og, w.ptr + grp * og * k * it, g.ptr + (n0 * o + grp * og) * p * it,
                          base + grp * k * p * it, ta=True, stride_a=0, stride_b=o * p, stride_c=r * p, batch=nb)
            if not pointwise:
                be.launch_n(be.kernel(self, T, name=kernel_name("col2im", T), source=gemm_source(T)),
                            nb * (gx.size // n), dcols, gx, n0, nb, *ints)
        return gx

    def vjp(self, inputs, outputs, grads):
        (g, w, ref), (gg,) = inputs, grads
        return [_apply1(Convolution(*self._attrs()), gg, w),
                _apply1(ConvolutionBackwardFilter(*self._attrs()), g, gg, w), None]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_conv_backward_data_<ctype>(gy, w, gx, <_CONV_ARGS>)``: one
        thread per input element (``launch_n(N*C*D*H*W)``), gathering from
        every output it fed (no atomics)."""
        return _CONV_BACKWARD_DATA.source(ctype)



class ConvolutionBackwardFilter(_ConvGrad):
    """Gradient of Convolution with respect to its weight: (g, x, w_ref) ->
    an array shaped like w_ref; with the bias's shape too, (g, x, w_ref,
    b_ref) -> (dw, db), db (the sum of g over every axis but the channels)
    shaped like b_ref. The refs are read only for their shape.

    Example::

        >>> dw, db = ConvolutionBackwardFilter(1, 1)(g, x, w, b)    # Convolution(1, 1)(x, w, b)'s
    """
    name = "ConvolutionBackwardFilter"
    reduce_broadcast = False
    cudnn_direction = "backward_filter"
    shape_only_inputs = (2, 3)

    @classmethod
    def examples(cls):
        """(g, x, w_ref[, b_ref]): 1-d, 2-d strided and grouped, 3-d strided
        and grouped; with a bias (O,) (1-d) and (1, O, 1, 1) (2-d grouped)."""
        return _examples(cls, [((1, 1, 2, 1), [(2, 3, 5), (2, 2, 5), (3, 2, 2)]),
                               (((2, 1), 1, 1, 2), [(1, 4, 3, 5), (1, 4, 5, 4), (4, 2, 3, 2)]),
                               ((2, 1, 1, 2), [(1, 2, 2, 2, 3), (1, 4, 3, 3, 4), (2, 2, 2, 3, 2)]),
                               ((1, 1, 2, 1), [(2, 3, 5), (2, 2, 5), (3, 2, 2), (3,)]),
                               (((2, 1), 1, 1, 2), [(1, 4, 3, 5), (1, 4, 5, 4), (4, 2, 3, 2), (1, 4, 1, 1)])])

    def _x_and_w(self, x, ref):
        return x, ref

    def infer(self, g, x, ref, bref=None):
        if bref is None:
            return super().infer(g, x, ref)
        (dw,) = super().infer(g, x, ref)
        if bref.shape is not None and ref.shape is not None and g.shape is not None:
            self._check_bias(bref.shape, ref.shape[0], len(g.shape) - 2, (g, x, ref, bref))
        return dw, TensorDesc(bref.shape, dw.dtype, g.device)

    def cpu(self, g, x, ref, bref=None):
        out_sp = self._check_grad(g, x, ref)
        if bref is not None:
            self._check_bias(bref.shape, ref.shape[0], len(out_sp), (g, x, ref, bref))
            fuse = onednn.fuse_bias_gradient(g.shape, ref.shape)
            both = self._on_onednn(g, x, tuple(ref.shape), bias=True) if fuse else None
            if both is not None:
                return both[0], both[1].reshape(bref.shape)
            return self.cpu(g, x, ref), self._bias_grad(g, bref.shape)
        gw = self._on_onednn(g, x, tuple(ref.shape))
        if gw is not None:
            return gw
        grp = self.groups
        gw = None
        for s, e in _image_chunks(x.shape[0], x.shape[1] * prod(ref.shape[2:]) * prod(out_sp)):
            cols = self._cols(x[s:e], ref.shape[2:], out_sp)                        # grp, K, nb*P
            # as (cols @ g^T)^T: BLAS is faster with the long N*P axis as the
            # reduction of a tall-skinny product; the transpose is small
            part = _gemm(cols, _grad_rows(g[s:e], grp).transpose(0, 2, 1), grp).transpose(0, 2, 1)
            gw = part if gw is None else np.add(gw, part, out=gw)                   # a sum over chunks
        return np.ascontiguousarray(gw).reshape(ref.shape)

    @staticmethod
    def _bias_grad(g, bshape):
        """The bias gradient, shaped ``bshape``: g summed over the images and
        the spatial axes, one reduction (per image, the contiguous spatial
        rows first: NumPy's fastest order)."""
        n, o = g.shape[:2]
        return g.reshape(n, o, prod(g.shape[2:])).sum(axis=(0, 2)).reshape(bshape)

    def cuda(self, be, g, x, ref, bref=None):
        if bref is None:
            return self._cuda_filter(be, g, x, ref)
        self.infer_arrays(g, x, ref, bref)
        db = be.reduce("sum", g, axis=(0,) + tuple(range(2, g.ndim)))
        return self._cuda_filter(be, g, x, ref), db.reshape(bref.shape)

    def _cuda_filter(self, be, g, x, ref):
        """The weight gradient on cuda, into a new array."""
        (out,) = self.infer_arrays(g, x, ref)
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
        g, x = inputs[0], inputs[1]
        # db is linear in g alone: its gradient ggb adds to g's per channel,
        # which is the bias of the same convolution
        dg = _apply1(Convolution(*self._attrs()), x, *grads)
        return [dg, _apply1(ConvolutionBackwardData(*self._attrs()), g, grads[0], x)] + [None] * (len(inputs) - 2)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_conv_backward_filter_<ctype>(gy, x, gw, <_CONV_ARGS>)``: one
        thread per weight element (``launch_n(O*C/G*KD*KH*KW)``), a
        reduction over N, OD, OH, OW."""
        return _CONV_BACKWARD_FILTER.source(ctype)



# ---------------------------------------------------------------- transposed convolution
def _bias_sum(g, b, nd):
    """The gradient of a per-channel bias b ((O,) or (1, O, 1, ...)) added
    to an (N, O, *spatial) output whose gradient is g: one reduction over
    the images and the ``nd`` spatial axes, shaped like b."""
    return _apply1(ReshapeLike(), _apply1(Reduce("sum", (0,) + tuple(range(2, nd + 2))), g), b)


class ConvTranspose(_ConvOp):
    """Transposed convolution of x (N, C_in, *spatial) with weight (C_in,
    C_out // groups, *kernel), plus an optional bias b per output channel,
    (C_out,) or (1, C_out, 1, ...): the adjoint of Convolution in its
    input, so it runs ConvolutionBackwardData's kernels (CPU and cuda)
    with x as the output gradient, then adds b in place (one op, as
    Convolution's bias). Output (N, C_out, (H-1)*S - 2*P + D*(K-1) + OP + 1
    per axis); ``output_padding`` (< stride) picks among the sizes that
    convolve back to the input's. Its gradients are the convolution ops
    themselves: x -> Convolution (g, w), w -> ConvolutionBackwardFilter (x,
    g, w_ref), b -> one sum of g.

    The bias is added after the primitive rather than inside oneDNN's
    deconvolution primitive (which takes one): measured on issue 25's
    N16 C64 16x16 -> 32 4x4 s2 case and the demo's sizes, one thread, the
    deconvolution primitive with its bias took 1.00-1.02x (1.21x on a
    (32, 16, 4, 4) input) of the backward-data primitive and an in-place
    NumPy add.

    Example::

        >>> ConvTranspose((2, 2), (1, 1))(x, w, b)     # F.conv_transpose2d(x, w, b, 2, 1): one op
    """
    name = "ConvTranspose"
    reduce_broadcast = False
    input_dtypes = dtypes.promoted_inputs      # mixed float widths: the wider
    attrs = ("stride", "padding", "output_padding", "dilation", "groups")
    _per_axis_attrs = ("stride", "padding", "output_padding", "dilation")

    def __init__(self, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
        self.output_padding = _axis_values(self.name, "output_padding", output_padding, 0)
        super().__init__(stride, padding, dilation, groups)
        if any(op >= s for op, s in zip(*self._per_axis(self._axes or 1, ("output_padding", "stride")))):
            raise ValueError(f"{self.name}: output_padding {self.output_padding} must be smaller than "
                             f"the stride {self.stride}")

    @classmethod
    def examples(cls):
        """1-d, 2-d (plain; strided and grouped with output_padding) and 3-d;
        with a bias (C_out,) (2-d grouped) and (1, C_out, 1) (1-d), their
        attributes tuples (the bias gradient's reduction needs the axes)."""
        return _examples(cls, [((2, 1, 1), [(2, 2, 3), (2, 3, 2)]),
                               ((), [(2, 3, 4, 3), (3, 2, 2, 3)]),
                               ((2, 1, 1, 1, 2), [(1, 4, 3, 3), (4, 3, 3, 2)]),
                               (((1, 2, 1), 0, (0, 1, 0)), [(1, 2, 2, 2, 3), (2, 2, 2, 2, 2)]),
                               (((2, 2), (1, 1), (1, 1), (1, 1), 2), [(1, 4, 3, 3), (4, 3, 3, 2), (6,)]),
                               (((2,), (1,), (0,), (1,)), [(2, 2, 3), (2, 3, 2), (1, 3, 1)])])

    def _data_op(self):
        return ConvolutionBackwardData(self.stride, self.padding, self.dilation, self.groups)

    def _out_shape(self, x, w, descs):
        """(N, C_out, *out) for input shape ``x`` and weight shape ``w``."""
        n = self._ndim_check(x, w, descs, "in_channels, out_channels // groups")
        g = self.groups
        if w[0] != x[1]:
            raise self.error(f"channel mismatch: input has {x[1]} channels, weight (in_channels, "
                             f"out_channels // groups, ...) expects {w[0]}", *descs)
        if x[1] % g:
            raise self.error(f"input channels {x[1]} are not divisible by groups={g}", *descs)
        s, p, op, d = self._per_axis(n, ("stride", "padding", "output_padding", "dilation"))
        out = tuple((size - 1) * s - 2 * p + d * (k - 1) + op + 1
                    for size, k, s, p, d, op in zip(x[2:], w[2:], s, p, d, op))
        if min(out) < 1:
            raise self.error(f"output size {out} is not positive: the padding {self.padding} "
                             f"removes more than the kernel and stride add", *descs)
        return (x[0], w[1] * g) + out

    def infer(self, x, w, b=None):
        descs = (x, w) if b is None else (x, w, b)
        dtype = self._dtype(*descs)
        if x.shape is None or w.shape is None:
            return (TensorDesc(None, dtype, x.device),)
        out = self._out_shape(x.shape, w.shape, descs)
        if b is not None and b.shape is not None:
            self._check_bias(b.shape, out[1], len(out) - 2, descs)
        return (TensorDesc(out, dtype, x.device),)

    def _descs(self, *arrays):
        return [TensorDesc(a.shape, a.dtype) for a in arrays]

    def cpu(self, x, w, b=None):
        (out,) = self.infer(*self._descs(x, w, *(() if b is None else (b,))))
        y = self._data_op().cpu(x, w, shape_carrier(np.broadcast_to(np.zeros((), out.dtype), out.shape)))
        if b is not None:
            # in place: y is the kernel's fresh result
            np.add(y, self._channel_view(b, y.ndim - 2), out=y)
        return y

    def cuda(self, be, x, w, b=None):
        (out,) = self.infer_arrays(x, w, *(() if b is None else (b,)))
        y = self._data_op().cuda(be, x, w, be.shape_only(out.shape, out.dtype))
        if b is not None and y.size:
            be.elementwise("add", y, self._channel_view(b, y.ndim - 2), out=y)
        return y

    def vjp(self, inputs, outputs, grads):
        (x, w), (g,) = inputs[:2], grads
        attrs = (self.stride, self.padding, self.dilation, self.groups)
        dx = _apply1(Convolution(*attrs), g, w)
        dw = _apply1(ConvolutionBackwardFilter(*attrs), x, g, w) if needs_grad(w) else None
        if len(inputs) == 2:
            return [dx, dw]
        b = inputs[2]
        if not needs_grad(b):
            return [dx, dw, None]
        nd = self._axes          # an op built with ints: the axes of whichever shape is known
        for t in (g, x, b):
            if nd is None and t.shape is not None and len(t.shape) > 2:
                nd = len(t.shape) - 2
        if nd is None:
            raise self.error("the bias gradient needs the number of spatial axes: give the attributes as tuples "
                             "or the inputs' shapes", *inputs)
        return [dx, dw, _bias_sum(g, b, nd)]

    def cuda_source(self, ctype: str = "float") -> str:
        """The direct kernel it runs: ConvolutionBackwardData's."""
        return self._data_op().cuda_source(ctype)


CONV_OPS = [Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter, ConvTranspose]
