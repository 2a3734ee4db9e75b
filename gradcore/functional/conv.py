"""Convolution and pooling: conv1d, conv2d, conv3d, conv_transpose1d/2d/3d
(one N-d op each: ops/conv.py), max_pool2d, avg_pool2d and the adaptive
poolings (ops/pool.py).

Example::

    >>> F.max_pool2d(gc.tensor(np.arange(16.0).reshape(1, 1, 4, 4)), 2).numpy()
    array([[[[ 5.,  7.],
             [13., 15.]]]], dtype=float32)
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

from .._core import Tensor, apply as _apply
from ..dtypes import promote_types
from ..op import OpError
from ..ops.conv import NONLINEAR_MODES, ConvTranspose, Convolution
from ..ops.pool import AvgPool2d, MaxPool2d
from ..ops.reduce import op_int
from ._args import _check_compute_mode, _index, _int_tuple, _named, _t
from .elemwise_table import relu as relu_op
from .shape import reshape
from ..op import ArgumentError

# one op instance per distinct attributes: the per-op caches stay warm
_Convolution, _ConvTranspose, _MaxPool2d, _AvgPool2d = Convolution, ConvTranspose, MaxPool2d, AvgPool2d


def _per_axis(name: str, what: str, v, n: int, low: int) -> tuple:
    """An int or ``n`` ints (one per spatial axis) as an n-tuple, each >= ``low``."""
    if isinstance(v, (tuple, list)):
        if len(v) != n:
            raise ArgumentError(f"{name}: {what} must be an int or {n} ints (one per spatial axis), got {v!r}")
        out = tuple(op_int(name, what, a) for a in v)
    else:
        out = (op_int(name, what, v),) * n
    if min(out) < low:
        raise ArgumentError(f"{name}: {what} must be >= {low}, got {v!r}")
    return out


def _conv(name, n, inp, weight, bias, stride, padding, dilation, groups, conv_mode,
          output_padding=None, nonlinear_mode="identity", compute_mode="default") -> Tensor:
    """The body of every convolution function: ``n`` spatial axes,
    transposed when ``output_padding`` is given, then ``nonlinear_mode``.
    The op checks the shapes; its errors are prefixed with ``name``."""
    if conv_mode not in ("cross_correlation", "CROSS_CORRELATION"):
        raise ArgumentError(f"{name}: only conv_mode='cross_correlation' is supported, got {conv_mode!r}")
    _check_compute_mode(name, compute_mode)
    if nonlinear_mode not in NONLINEAR_MODES:
        raise ArgumentError(f"{name}: nonlinear_mode must be one of {', '.join(NONLINEAR_MODES)}, "
                         f"got {nonlinear_mode!r}")
    groups = op_int(name, "groups", groups)
    if groups < 1:
        raise ArgumentError(f"{name}: groups must be >= 1, got {groups}")
    x, w = _t(inp), _t(weight)
    if w.ndim == n + 3 and groups == 1:
        # one more axis than the plain weight is the grouped form only: with one group it is
        # most likely the next dimension's weight
        bigger = {1: "; a (O, C, KH, KW) weight is for conv2d", 2: "; a (O, C, KD, KH, KW) weight is for conv3d"}
        raise ArgumentError(f"{name}: weight must be (O, C // groups, {', '.join(['K'] * n)}), or the grouped "
                         f"(groups, O // groups, C // groups, ...) with groups > 1, got shape {w.shape} with "
                         f"groups=1 (input shape {x.shape}){bigger.get(n, '')}")
    if w.ndim == n + 3:         # MegEngine's grouped weight (groups, a // groups, b // groups, *kernel)
        if w.shape[0] != groups:
            raise ArgumentError(f"{name}: a grouped {w.ndim}-D weight {w.shape} has {w.shape[0]} groups, "
                             f"but groups={groups}")
        w = reshape(w, (w.shape[0] * w.shape[1],) + tuple(w.shape[2:]))
    attrs = (_per_axis(name, "stride", stride, n, 1), _per_axis(name, "padding", padding, n, 0))
    dilation = _per_axis(name, "dilation", dilation, n, 1)
    relu = nonlinear_mode == "relu"
    if output_padding is None:
        b = None if bias is None else _op_bias(x, w, bias, n, lambda: w.shape[0])
        # the ReLU inside the op, unless a bias is added after it
        fused = relu and (bias is None or b is not None)
        op = _Convolution(*attrs, dilation, groups, nonlinear_mode if fused else "identity")
    else:
        fused = False
        op = _ConvTranspose(*attrs, _per_axis(name, "output_padding", output_padding, n, 0), dilation, groups)
        b = None if bias is None else _op_bias(x, w, bias, n, lambda: w.shape[1] * groups)
    try:
        out = _apply(op, x, w)[0] if b is None else _apply(op, x, w, b)[0]
    except OpError as exc:
        raise _named(name, exc) from exc
    if bias is not None and b is None:
        out = _channel_bias(name, out, _t(bias, out))
    return relu_op(out) if relu and not fused else out


def _op_bias(x: Tensor, w: Tensor, bias, n: int, channels) -> Optional[Tensor]:
    """``bias`` as the Convolution or ConvTranspose op's third input (the
    convolution and its bias add as one op: one node recorded; Convolution
    on oneDNN adds it inside its primitive), ``channels()`` giving the
    output channels once the shapes are known, or None
    where it is added as a broadcast op after it, which gives exactly what
    the op would not: a bias that is not one value per output channel, (O,)
    or (1, O, 1, ...), one of another dtype than the convolution's output
    (the add promotes; the op would convolve in the promoted dtype) or on
    another device, or shapes not known yet (inside a trace)."""
    if x.shape is None or w.shape is None or hasattr(x, "trace") or hasattr(w, "trace"):
        return None
    dtype = promote_types(x.dtype, w.dtype)
    if dtype.kind != "f" or x.device != w.device:
        return None
    if not isinstance(bias, Tensor):
        if hasattr(bias, "trace"):
            return None
        bias = _t(bias, _Like(dtype, x.device))     # as _t(bias, out) would make it
    o = channels()
    if (bias.dtype != dtype or bias.device != x.device
            or tuple(bias.shape) not in ((o,), (1, o) + (1,) * n)):
        return None
    return bias


class _Like:
    """What ``_t`` reads of a tensor to convert a value like it: dtype and device."""
    __slots__ = ("dtype", "device")

    def __init__(self, dtype, device):
        self.dtype, self.device = dtype, device


def _channel_bias(name: str, out: Tensor, bias: Tensor) -> Tensor:
    """``out + bias`` for a convolution's (N, O, ...) output: a 1-d bias is
    one per output channel (PyTorch's form) and must have O elements (it
    would otherwise broadcast along the last spatial axis); any other bias
    broadcasts, or the error names ``name``."""
    if bias.ndim == 1 and out.shape is not None and bias.shape[0] != 1:
        if bias.shape[0] != out.shape[1]:
            raise ArgumentError(f"{name}: a 1-d bias must have one element per output channel "
                             f"({out.shape[1]}), got shape {bias.shape} (output shape {out.shape})")
        bias = reshape(bias, (1, -1) + (1,) * (out.ndim - 2))
    try:
        return out + bias
    except OpError as exc:
        raise _named(name, exc) from exc


def conv1d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: int = 1, padding: int = 0,
           dilation: int = 1, groups: int = 1, conv_mode: str = "cross_correlation",
           compute_mode: str = "default") -> Tensor:
    """1-D convolution (cross-correlation) of ``inp`` (N, C, L) with
    ``weight`` (O, C // groups, K) (or grouped, (groups, O // groups, C //
    groups, K)), MegEngine's ``F.nn.conv1d``. ``bias`` broadcasts against
    (N, O, OL), e.g. (1, O, 1); a (O,) bias is one per channel.

    Example::

        >>> x = gc.tensor(np.arange(5, dtype="float32").reshape(1, 1, 5))
        >>> F.nn.conv1d(x, gc.tensor([[[1.0, -1.0]]])).numpy()
        array([[[-1., -1., -1., -1.]]], dtype=float32)
    """
    return _conv("conv1d", 1, inp, weight, bias, stride, padding, dilation, groups, conv_mode,
                 compute_mode=compute_mode)


def conv2d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Union[int, Sequence[int]] = 1,
           padding: Union[int, Sequence[int]] = 0, dilation: Union[int, Sequence[int]] = 1, groups: int = 1,
           conv_mode: str = "cross_correlation", compute_mode: str = "default", *,
           nonlinear_mode: str = "identity") -> Tensor:
    """2-D convolution (cross-correlation) of ``inp`` (N, C, H, W) with
    ``weight`` (O, C // groups, KH, KW), MegEngine's ``F.conv2d``. A grouped
    weight may also be given in MegEngine's 5-D form (groups, O // groups,
    C // groups, KH, KW). ``bias`` broadcasts against (N, O, OH, OW), e.g.
    shape (1, O, 1, 1); a (O,) bias is one per channel. A per-channel bias
    of either form is added inside the convolution op (one op recorded; on
    oneDNN, inside its primitive). ``nonlinear_mode="relu"`` (MegEngine's
    ConvBias mode; ``M.ConvRelu2d``) applies ReLU inside the same op: on
    oneDNN a post-op of the primitive, no tensor more.

    Example::

        >>> x = gc.tensor(np.ones((1, 2, 5, 5), "float32"))
        >>> F.conv2d(x, gc.tensor(np.ones((3, 2, 3, 3), "float32")), stride=2, padding=1).shape
        (1, 3, 3, 3)
    """
    return _conv("conv2d", 2, inp, weight, bias, stride, padding, dilation, groups, conv_mode,
                 nonlinear_mode=nonlinear_mode, compute_mode=compute_mode)


def conv3d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Union[int, Sequence[int]] = 1,
           padding: Union[int, Sequence[int]] = 0, dilation: Union[int, Sequence[int]] = 1, groups: int = 1,
           conv_mode: str = "cross_correlation") -> Tensor:
    """3-D convolution (cross-correlation) of ``inp`` (N, C, D, H, W) with
    ``weight`` (O, C // groups, KD, KH, KW), or MegEngine's grouped (groups,
    O // groups, C // groups, KD, KH, KW); MegEngine's ``F.conv3d``.
    ``bias`` broadcasts against (N, O, OD, OH, OW), e.g. (1, O, 1, 1, 1).

    Example::

        >>> x = gc.tensor(np.ones((1, 2, 4, 4, 4), "float32"))
        >>> F.conv3d(x, gc.tensor(np.ones((3, 2, 3, 3, 3), "float32")), padding=1).shape
        (1, 3, 4, 4, 4)
    """
    return _conv("conv3d", 3, inp, weight, bias, stride, padding, dilation, groups, conv_mode)


def conv_transpose1d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: int = 1,
                     padding: int = 0, output_padding: int = 0, dilation: int = 1, groups: int = 1,
                     conv_mode: str = "cross_correlation", compute_mode: str = "default") -> Tensor:
    """1-D transposed convolution of ``inp`` (N, C_in, L) with ``weight``
    (C_in, C_out // groups, K) (or grouped (groups, C_in // groups, C_out //
    groups, K)). Output length (L - 1) * stride - 2 * padding + dilation *
    (K - 1) + output_padding + 1.

    Example::

        >>> x = gc.tensor(np.ones((1, 1, 3), "float32"))
        >>> F.nn.conv_transpose1d(x, gc.tensor([[[1.0, 2.0]]]), stride=2).numpy()
        array([[[1., 2., 1., 2., 1., 2.]]], dtype=float32)
    """
    return _conv("conv_transpose1d", 1, inp, weight, bias, stride, padding, dilation, groups, conv_mode,
                 output_padding, compute_mode=compute_mode)


def conv_transpose2d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                     stride: Union[int, Sequence[int]] = 1, padding: Union[int, Sequence[int]] = 0,
                     output_padding: Union[int, Sequence[int]] = 0, dilation: Union[int, Sequence[int]] = 1,
                     groups: int = 1, conv_mode: str = "cross_correlation", compute_mode: str = "default") -> Tensor:
    """2-D transposed convolution ("deconvolution") of ``inp`` (N, C_in, H, W)
    with ``weight`` (C_in, C_out // groups, KH, KW), or MegEngine's grouped
    (groups, C_in // groups, C_out // groups, KH, KW); MegEngine's
    ``F.conv_transpose2d``. The output is (N, C_out, (H - 1) * stride - 2 *
    padding + dilation * (KH - 1) + output_padding + 1, ...): the gradient of
    ``conv2d`` with respect to its input. ``output_padding`` must be smaller
    than the stride. ``bias`` broadcasts against the output, e.g. (1, C_out,
    1, 1); a (C_out,) bias is one per channel, added inside the op (one op
    recorded).

    Example::

        >>> x = gc.tensor(np.ones((1, 1, 2, 2), "float32"))
        >>> F.conv_transpose2d(x, gc.tensor(np.ones((1, 1, 2, 2), "float32")), stride=2).shape
        (1, 1, 4, 4)
    """
    return _conv("conv_transpose2d", 2, inp, weight, bias, stride, padding, dilation, groups, conv_mode,
                 output_padding, compute_mode=compute_mode)


def conv_transpose3d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                     stride: Union[int, Sequence[int]] = 1, padding: Union[int, Sequence[int]] = 0,
                     output_padding: Union[int, Sequence[int]] = 0, dilation: Union[int, Sequence[int]] = 1,
                     groups: int = 1) -> Tensor:
    """3-D transposed convolution of ``inp`` (N, C_in, D, H, W) with
    ``weight`` (C_in, C_out // groups, KD, KH, KW) (or grouped (groups,
    C_in // groups, C_out // groups, KD, KH, KW)); MegEngine's
    ``F.conv_transpose3d``: the gradient of ``conv3d`` with respect to its
    input, output sizes as ``conv_transpose2d``'s per axis.

    Example::

        >>> x = gc.tensor(np.ones((1, 2, 2, 2, 2), "float32"))
        >>> F.conv_transpose3d(x, gc.tensor(np.ones((2, 3, 2, 2, 2), "float32")), stride=2).shape
        (1, 3, 4, 4, 4)
    """
    return _conv("conv_transpose3d", 3, inp, weight, bias, stride, padding, dilation, groups,
                 "cross_correlation", output_padding)


def _pair(v):
    # anything but an int or a pair of ints goes to the op as is, which says
    # what is wrong (int() would truncate 1.5 or misreport a string)
    try:
        if isinstance(v, (tuple, list)):
            return (_index(v[0]), _index(v[1])) if len(v) == 2 else tuple(v)
        v = _index(v)
        return (v, v)
    except TypeError:
        return tuple(v) if isinstance(v, (tuple, list)) else v


def max_pool2d(inp: Tensor, kernel_size: Union[int, Sequence[int]],
               stride: Optional[Union[int, Sequence[int]]] = None, padding: Union[int, Sequence[int]] = 0) -> Tensor:
    """Max over ``kernel_size`` windows of ``inp`` (N, C, H, W); ``stride``
    defaults to ``kernel_size``; padding never wins.

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> F.max_pool2d(x, 2).numpy()
        array([[[[ 5.,  7.],
                 [13., 15.]]]], dtype=float32)
    """
    stride = kernel_size if stride is None else stride
    return _apply(_MaxPool2d(_pair(kernel_size), _pair(stride), _pair(padding)), _t(inp))[0]


def avg_pool2d(inp: Tensor, kernel_size: Union[int, Sequence[int]],
               stride: Optional[Union[int, Sequence[int]]] = None, padding: Union[int, Sequence[int]] = 0,
               mode: str = "average_count_exclude_padding") -> Tensor:
    """Mean over ``kernel_size`` windows of ``inp`` (N, C, H, W). ``mode``
    "average_count_exclude_padding" (default) divides by the number of
    non-padding elements of each window, "average" by the kernel's size.

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> F.avg_pool2d(x, 2).numpy()
        array([[[[ 2.5,  4.5],
                 [10.5, 12.5]]]], dtype=float32)
        >>> F.avg_pool2d(x, 3, stride=1, padding=1).shape
        (1, 1, 4, 4)
    """
    stride = kernel_size if stride is None else stride
    return _apply(_AvgPool2d(_pair(kernel_size), _pair(stride), _pair(padding), mode), _t(inp))[0]


def _oshp(name: str, x: Tensor, oshp) -> tuple:
    if x.ndim != 4:
        raise ArgumentError(f"{name}: inp must be (N, C, H, W), got shape {x.shape}")
    if isinstance(oshp, Tensor):
        oshp = [int(v) for v in oshp.numpy().reshape(-1)]
    o = _int_tuple(name, "oshp", oshp)
    o = o * 2 if len(o) == 1 else o
    if len(o) != 2 or not all(1 <= v <= s for v, s in zip(o, x.shape[2:])):
        raise ArgumentError(f"{name}: oshp must be an int or (OH, OW), each in [1, input size], "
                         f"got {oshp!r} for inp shape {x.shape}")
    return o


def _adaptive_window(name: str, x: Tensor, oshp) -> tuple:
    """MegEngine's adaptive pooling window: stride ``in // out`` and window
    ``in - (out - 1) * stride`` per axis (the same bins as PyTorch's when
    ``out`` divides ``in``; otherwise equal windows, overlapping)."""
    o = _oshp(name, x, oshp)
    stride = tuple(i // v for i, v in zip(x.shape[2:], o))
    return tuple(i - (v - 1) * s for i, v, s in zip(x.shape[2:], o, stride)), stride


def adaptive_avg_pool2d(inp: Tensor, oshp: Union[int, Sequence[int], Tensor]) -> Tensor:
    """Average pooling of ``inp`` (N, C, H, W) to ``oshp`` = (OH, OW) (or an
    int for both), MegEngine's ``F.nn.adaptive_avg_pool2d``: a pooling of
    stride ``H // OH`` and window ``H - (OH - 1) * stride`` (likewise W).

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> F.nn.adaptive_avg_pool2d(x, 2).numpy()
        array([[[[ 2.5,  4.5],
                 [10.5, 12.5]]]], dtype=float32)
    """
    x = _t(inp)
    window, stride = _adaptive_window("adaptive_avg_pool2d", x, oshp)
    return avg_pool2d(x, window, stride, 0)


def adaptive_max_pool2d(inp: Tensor, oshp: Union[int, Sequence[int], Tensor]) -> Tensor:
    """Max pooling of ``inp`` (N, C, H, W) to ``oshp`` = (OH, OW) (or an int
    for both), MegEngine's ``F.nn.adaptive_max_pool2d``: windows as in
    ``adaptive_avg_pool2d``.

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> F.nn.adaptive_max_pool2d(x, (1, 2)).numpy()
        array([[[[13., 15.]]]], dtype=float32)
    """
    x = _t(inp)
    window, stride = _adaptive_window("adaptive_max_pool2d", x, oshp)
    return max_pool2d(x, window, stride, 0)
