"""2-d pooling over NCHW tensors: max and average, their gradients.

``MaxPool2d`` and ``AvgPool2d`` take (kernel_size, stride, padding)
(AvgPool2d also MegEngine's ``mode``); stride defaults to the kernel size,
padding is at most half the kernel. The gradients are ops with their own
``vjp``, so every order of derivative works::

    MaxPool2d            -> MaxPool2dBackward (g, x)     g added at each window's first maximum
    MaxPool2dBackward    -> MaxPool2dGather (gg, x)      gg read at each window's first maximum
    MaxPool2dGather      -> MaxPool2dBackward (gg, x)
    AvgPool2d            -> AvgPool2dBackward (g, x_ref)
    AvgPool2dBackward    -> AvgPool2d (gg)

Max pooling's tie rule is PyTorch's: the first maximum of a window in
row-major order wins, a NaN wins over numbers; padding counts as -inf.

CPU kernels work on the KH*KW strided views of the (padded) input, one per
kernel offset: the only Python loops are over kernel offsets. cuda: cuDNN
where it is loaded, else direct kernels, one thread per element written
(no atomics), shapes and attributes as ``int`` arguments (one compiled
module per element type for every configuration).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from gradcore.cpu import onednn
from gradcore.cuda import cudnn
from gradcore.cuda.kernels import Kernel
from gradcore.op import Op, TensorDesc

from .conv import _apply1, _col2im, _launch_direct, _offset_slices, _out_size, _pad
from .reduce import op_int

AVG_MODES = ("average_count_exclude_padding", "average")


def _pair(op_name, what, v, minimum) -> Tuple[int, int]:
    """An int or a pair of ints as a pair, each >= ``minimum``."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{op_name}: {what} must be an int or a pair, got {v!r}")
        out = tuple(op_int(op_name, what, a) for a in v)
    else:
        out = (op_int(op_name, what, v),) * 2
    if min(out) < minimum:
        raise ValueError(f"{op_name}: {what} must be >= {minimum}, got {v!r}")
    return out


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

    def _onednn_forward(self, x, kind):
        """The pooling on oneDNN (gradcore/cpu/onednn.py), or None (the NumPy kernels run)."""
        return onednn.pool_forward(x, kind, self.kernel_size, self.stride, self.padding)

    def _onednn_backward(self, g, x, kind, xshape=None):
        """The input gradient on oneDNN from g (and x for max pooling), or None."""
        if x is not None and x.dtype != g.dtype:
            return None
        return onednn.pool_backward(g, x, kind, self.kernel_size, self.stride, self.padding, xshape)

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


# device functions of the pooling kernels: the argmax of a window (its flat
# index in the image, its value in *value), the first maximum in row-major
# order (NaN wins) as the CPU kernel finds it; the count an average divides
# by: the window's non-padding elements when exclude_padding, else KH * KW
_WINDOW = """
#ifndef GC_POOL_WINDOW
#define GC_POOL_WINDOW
template <class V> __device__ __forceinline__ int gc_window_argmax(const V* xc, int oh, int ow, int H, int W, int KH,
                                                                   int KW, int SH, int SW, int PH, int PW, V* value)
{
    const int h0 = oh * SH - PH, w0 = ow * SW - PW;
    int best = -1; V m = 0;
    for (int i = 0; i < KH; ++i) {
        const int ih = h0 + i;
        if (ih < 0 || ih >= H) continue;
        for (int j = 0; j < KW; ++j) {
            const int iw = w0 + j;
            if (iw < 0 || iw >= W) continue;
            const V v = xc[(long long)ih * W + iw];
            if (best < 0 || (m == m && (v > m || v != v))) { m = v; best = ih * W + iw; }
        }
    }
    *value = m;
    return best;
}
__device__ __forceinline__ int gc_window_count(int oh, int ow, int H, int W, int KH, int KW, int SH, int SW,
                                               int PH, int PW, int exclude_padding)
{
    const int h0 = oh * SH - PH, w0 = ow * SW - PW;
    return exclude_padding ? (min(h0 + KH, H) - max(h0, 0)) * (min(w0 + KW, W) - max(w0, 0)) : KH * KW;
}
#endif
"""
_WINDOW_ARGS = "H, W, KH, KW, SH, SW, PH, PW"
# one thread per pooled element (grid-stride loop, launch_n(N*C*OH*OW)) ...
_PER_POOLED = ("const long long total = (long long)N * C * OH * OW;",
               "const int ow = (int)(idx % OW); long long t = idx / OW;\n"
               "const int oh = (int)(t % OH); const long long nc = t / OH;\n")
# ... or per input element (launch_n(N*C*H*W)), over the windows that hold it
_PER_INPUT = ("const long long total = (long long)N * C * H * W;",
              "const int xw = (int)(idx % W); long long t = idx / W;\n"
              "const int xh = (int)(t % H); const long long nc = t / H;\n"
              "const int oh_lo = max(0, (xh + PH - KH + SH) / SH), oh_hi = min(OH - 1, (xh + PH) / SH);\n"
              "const int ow_lo = max(0, (xw + PW - KW + SW) / SW), ow_hi = min(OW - 1, (xw + PW) / SW);\n"
              "T acc = 0;\n")


def _pool_kernel(name, arrays, args, per, body):
    return Kernel(name, arrays + args, per[1] + body, over="total", setup=per[0])


_MAX_POOL = _pool_kernel("max_pool2d", "const T* __restrict__ x, T* __restrict__ y, ", _POOL_ARGS, _PER_POOLED, f"""\
T m;
gc_window_argmax(x + nc * H * W, oh, ow, {_WINDOW_ARGS}, &m);
y[idx] = m;""")
_MAX_POOL_BACKWARD = _pool_kernel(
    "max_pool2d_backward", "const T* __restrict__ gy, const T* __restrict__ x, T* __restrict__ gx, ", _POOL_ARGS,
    _PER_INPUT, f"""\
T m;
for (int oh = oh_lo; oh <= oh_hi; ++oh)
    for (int ow = ow_lo; ow <= ow_hi; ++ow)
        if (gc_window_argmax(x + nc * H * W, oh, ow, {_WINDOW_ARGS}, &m) == xh * W + xw)
            acc += gy[(nc * OH + oh) * OW + ow];
gx[idx] = acc;""")
_MAX_POOL_GATHER = _pool_kernel(
    "max_pool2d_gather", "const T* __restrict__ gg, const T* __restrict__ x, T* __restrict__ y, ", _POOL_ARGS,
    _PER_POOLED, f"""\
T m;
y[idx] = gg[nc * H * W + gc_window_argmax(x + nc * H * W, oh, ow, {_WINDOW_ARGS}, &m)];""")


class _PoolForward(_PoolBase):
    """What the two forward poolings share: the output's description, and the
    checks then oneDNN before their own NumPy kernel."""

    def infer(self, x):
        dtype = self._float(x)
        if x.shape is None:
            return (TensorDesc(None, dtype, x.device),)
        oh, ow = self._check(x.shape, (x,))
        return (TensorDesc(x.shape[:2] + (oh, ow), dtype, x.device),)

    def _forward_checked(self, x, mode):
        """(OH, OW, oneDNN's result or None) for input array ``x``."""
        if x.dtype.kind != "f":
            self._float(TensorDesc(x.shape, x.dtype))
        oh, ow = self._check(x.shape, (TensorDesc(x.shape, x.dtype),))
        return oh, ow, self._onednn_forward(x, mode)


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


class MaxPool2d(_MaxPoolArgmax, _PoolForward):
    """Max over KH x KW windows (padding never wins: it counts as -inf)."""
    name = "MaxPool2d"
    reduce_broadcast = False
    check_params = ({"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1})

    def cpu(self, x):
        oh, ow, y = self._forward_checked(x, "max")
        if y is not None:
            return y
        taps = self._taps(_pad(x, self.padding, -np.inf), (oh, ow))
        out = taps[0].copy()
        for t in taps[1:]:              # np.maximum propagates NaN, as np.max
            np.maximum(out, t, out=out)
        return out

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return [_apply1(MaxPool2dBackward(self.kernel_size, self.stride, self.padding), g, x)]

    def cuda(self, be, x):
        (out,) = self.infer_arrays(x)
        y = self._cudnn_forward(be, x, out, "max")
        return y if y is not None else self._cuda_run(be, [x], out, x.shape, out.shape)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_max_pool2d_<ctype>(x, y, <_POOL_ARGS>)``: one thread per
        pooled element (grid-stride loop, ``launch_n(N*C*OH*OW)``): its
        window's first maximum (NaN wins)."""
        return _MAX_POOL.source(ctype, helpers=_WINDOW)



class MaxPool2dBackward(_MaxPoolArgmax):
    """(g, x) -> zeros shaped like x with each g added at its window's
    argmax (the first maximum): the backward of MaxPool2d."""
    name = "MaxPool2dBackward"
    reduce_broadcast = False
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
        gx = self._onednn_backward(g, x, "max")
        return gx if gx is not None else self._scatter(g, x)

    def cuda(self, be, g, x):
        (out,) = self.infer_arrays(g, x)
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
        return _MAX_POOL_BACKWARD.source(ctype, helpers=_WINDOW)



class MaxPool2dGather(_MaxPoolArgmax):
    """(gg, x) -> gg read at each window's argmax of x, in the pooled shape:
    the backward of MaxPool2dBackward (and the forward-mode of MaxPool2d)."""
    name = "MaxPool2dGather"
    reduce_broadcast = False
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
        (out,) = self.infer_arrays(gg, x)
        return self._cuda_argmax_run(be, gg, x, out, out.shape)

    def vjp(self, inputs, outputs, grads):
        (gg, x), (g,) = inputs, grads
        return [_apply1(MaxPool2dBackward(self.kernel_size, self.stride, self.padding), g, x), None]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_max_pool2d_gather_<ctype>(gg, x, y, <_POOL_ARGS>)``: one
        thread per pooled element (grid-stride loop, ``launch_n(N*C*OH*OW)``):
        gg at its window's argmax of x."""
        return _MAX_POOL_GATHER.source(ctype, helpers=_WINDOW)



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
_AVG_POOL = _pool_kernel("avg_pool2d", "const T* __restrict__ x, T* __restrict__ y, ", _AVG_ARGS, _PER_POOLED, f"""\
const T* xc = x + nc * H * W;
const int h0 = oh * SH - PH, w0 = ow * SW - PW;
T acc = 0;
for (int ih = max(h0, 0); ih < min(h0 + KH, H); ++ih)
    for (int iw = max(w0, 0); iw < min(w0 + KW, W); ++iw)
        acc += xc[(long long)ih * W + iw];
y[idx] = acc / (T)gc_window_count(oh, ow, {_WINDOW_ARGS}, exclude_padding);""")
_AVG_POOL_BACKWARD = _pool_kernel(
    "avg_pool2d_backward", "const T* __restrict__ gy, T* __restrict__ gx, ", _AVG_ARGS, _PER_INPUT, f"""\
for (int oh = oh_lo; oh <= oh_hi; ++oh)
    for (int ow = ow_lo; ow <= ow_hi; ++ow)
        acc += gy[(nc * OH + oh) * OW + ow] / (T)gc_window_count(oh, ow, {_WINDOW_ARGS}, exclude_padding);
gx[idx] = acc;""")


class AvgPool2d(_AvgBase, _PoolForward):
    """Mean over KH x KW windows; ``mode`` "average_count_exclude_padding"
    (MegEngine's default) divides by the number of non-padding elements,
    "average" by KH * KW."""
    name = "AvgPool2d"
    reduce_broadcast = False
    check_params = ({"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1})

    def cpu(self, x):
        oh, ow, y = self._forward_checked(x, self.mode)
        if y is not None:
            return y
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
        (out,) = self.infer_arrays(x)
        y = self._cudnn_forward(be, x, out, self.mode)
        return y if y is not None else self._cuda_run(be, [x], out, x.shape, out.shape)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_avg_pool2d_<ctype>(x, y, <_POOL_ARGS>, int exclude_padding)``:
        one thread per pooled element (grid-stride loop,
        ``launch_n(N*C*OH*OW)``): its window's sum over its count (the
        non-padding elements when ``exclude_padding``, else KH*KW)."""
        return _AVG_POOL.source(ctype, helpers=_WINDOW)



class AvgPool2dBackward(_AvgBase):
    """(g, x_ref) -> each g divided by its window's count, spread over the
    window, in x_ref's shape (read only for its shape)."""
    name = "AvgPool2dBackward"
    reduce_broadcast = False
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
        gx = self._onednn_backward(g, None, self.mode, ref.shape)
        if gx is not None:
            return gx
        n, c = ref.shape[:2]
        kh, kw = self.kernel_size
        share = (g / self._counts(ref.shape, (oh, ow), g.dtype))[..., None, None]
        cols = np.broadcast_to(share, (n, c, oh, ow, kh, kw))
        return _col2im(cols, ref.shape, self.stride, self.padding, (1, 1))

    def vjp(self, inputs, outputs, grads):
        (g, ref), (gg,) = inputs, grads
        return [_apply1(AvgPool2d(self.kernel_size, self.stride, self.padding, self.mode), gg), None]

    def cuda(self, be, g, ref):
        (out,) = self.infer_arrays(g, ref)
        gx = self._cudnn_backward(be, g, None, out, self.mode)
        return gx if gx is not None else self._cuda_run(be, [g], out, ref.shape, g.shape)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_avg_pool2d_backward_<ctype>(gy, gx, <_POOL_ARGS>, int
        exclude_padding)``: one thread per input element (grid-stride loop,
        ``launch_n(N*C*H*W)``), summing each window's gy / count it is in."""
        return _AVG_POOL_BACKWARD.source(ctype, helpers=_WINDOW)



POOL_OPS = [MaxPool2d, MaxPool2dBackward, MaxPool2dGather, AvgPool2d, AvgPool2dBackward]
