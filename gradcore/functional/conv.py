"""Convolution and pooling of NCHW (and NCL) tensors: conv2d, conv1d,
max_pool2d, avg_pool2d and the adaptive poolings. Their ops: ops/conv.py.

Example::

    >>> F.max_pool2d(gc.tensor(np.arange(16.0).reshape(1, 1, 4, 4)), 2).numpy()
    array([[[[ 5.,  7.],
             [13., 15.]]]], dtype=float32)
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

from .._core import Tensor, apply as _apply
from ..op import OpError, interned
from ..ops.conv import AvgPool2d, Conv2d, Conv3d, ConvTranspose2d, MaxPool2d
from ._args import _index, _int_arg, _int_tuple, _named, _t
from .shape import expand_dims, reshape, squeeze

# one op instance per distinct attributes: the per-op caches stay warm
_Conv2d, _MaxPool2d, _AvgPool2d = map(interned, (Conv2d, MaxPool2d, AvgPool2d))
_ConvTranspose2d, _Conv3d = map(interned, (ConvTranspose2d, Conv3d))


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


def conv2d(inp, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1,
           conv_mode: str = "cross_correlation", compute_mode: str = "default"):
    """2-D convolution (cross-correlation) of ``inp`` (N, C, H, W) with
    ``weight`` (O, C // groups, KH, KW), MegEngine's ``F.conv2d``. A grouped
    weight may also be given in MegEngine's 5-D form (groups, O // groups,
    C // groups, KH, KW). ``bias`` broadcasts against (N, O, OH, OW), e.g.
    shape (1, O, 1, 1).

    Example::

        >>> y = F.conv2d(x, w, b, stride=2, padding=1)
    """
    if conv_mode not in ("cross_correlation", "CROSS_CORRELATION"):
        raise ValueError(f"conv2d: only conv_mode='cross_correlation' is supported, got {conv_mode!r}")
    x, w = _t(inp), _t(weight)
    if w.ndim == 5:
        g, og, cg, kh, kw = w.shape
        if g != groups:
            raise ValueError(f"conv2d: a 5-D weight {w.shape} has {g} groups, but groups={groups}")
        w = reshape(w, (g * og, cg, kh, kw))
    out = _apply(_Conv2d(_pair(stride), _pair(padding), _pair(dilation), groups), x, w)[0]
    if bias is None:
        return out
    return _channel_bias("conv2d", out, _t(bias, out))


def _channel_bias(name: str, out: Tensor, bias: Tensor) -> Tensor:
    """``out + bias`` for a convolution's (N, O, ...) output: a 1-d bias is
    one per output channel (PyTorch's form) and must have O elements (it
    would otherwise broadcast along the last spatial axis); any other bias
    broadcasts, or the error names ``name``."""
    if bias.ndim == 1 and out.shape is not None and bias.shape[0] != 1:
        if bias.shape[0] != out.shape[1]:
            raise ValueError(f"{name}: a 1-d bias must have one element per output channel "
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
    groups, K)), MegEngine's ``F.nn.conv1d``: ``conv2d`` on a trailing axis
    of size 1. ``bias`` broadcasts against (N, O, OL), e.g. (1, O, 1); a
    (O,) bias is one per channel.

    Example::

        >>> x = gc.tensor(np.arange(5, dtype="float32").reshape(1, 1, 5))
        >>> F.nn.conv1d(x, gc.tensor([[[1.0, -1.0]]])).numpy()
        array([[[-1., -1., -1., -1.]]], dtype=float32)
    """
    x, w = _t(inp), _t(weight)
    if x.ndim != 3:
        raise ValueError(f"conv1d: inp must be (N, C, L), got shape {x.shape}")
    if w.ndim not in (3, 4) or (w.ndim == 4 and groups == 1):
        # a 4-D weight is the grouped form only; (O, C, KH, KW) is conv2d's
        raise ValueError(f"conv1d: weight must be (O, C // groups, K), or (groups, O // groups, "
                         f"C // groups, K) with groups > 1, got shape {w.shape} with groups={groups} "
                         f"(input shape {x.shape}); a (O, C, KH, KW) weight is for conv2d")
    s, p, d = (_one_int("conv1d", what, v, low) for what, v, low in
               (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)))
    out = conv2d(expand_dims(x, -1), expand_dims(w, -1), None, (s, 1), (p, 0), (d, 1), groups,
                 conv_mode, compute_mode)
    out = squeeze(out, -1)
    if bias is None:
        return out
    return _channel_bias("conv1d", out, _t(bias, out))


def _one_int(name: str, what: str, v, low: int) -> int:
    """An int, or a sequence holding one int (a 1-d ``stride=(2,)``)."""
    t = _int_tuple(name, what, v)
    if len(t) != 1:
        raise ValueError(f"{name}: {what} must be an int, got {v!r}")
    return _int_arg(name, what, t[0], low)


def max_pool2d(inp, kernel_size, stride=None, padding=0):
    """Max over ``kernel_size`` windows of ``inp`` (N, C, H, W); ``stride``
    defaults to ``kernel_size``; padding never wins.

    Example::

        >>> F.max_pool2d(x, 2)          # (N, C, H, W) -> (N, C, H // 2, W // 2)
    """
    stride = kernel_size if stride is None else stride
    return _apply(_MaxPool2d(_pair(kernel_size), _pair(stride), _pair(padding)), _t(inp))[0]


def avg_pool2d(inp, kernel_size, stride=None, padding=0, mode: str = "average_count_exclude_padding"):
    """Mean over ``kernel_size`` windows of ``inp`` (N, C, H, W). ``mode``
    "average_count_exclude_padding" (default) divides by the number of
    non-padding elements of each window, "average" by the kernel's size.

    Example::

        >>> F.avg_pool2d(x, 3, stride=1, padding=1)
    """
    stride = kernel_size if stride is None else stride
    return _apply(_AvgPool2d(_pair(kernel_size), _pair(stride), _pair(padding), mode), _t(inp))[0]


def _oshp(name: str, x: Tensor, oshp) -> tuple:
    if x.ndim != 4:
        raise ValueError(f"{name}: inp must be (N, C, H, W), got shape {x.shape}")
    if isinstance(oshp, Tensor):
        oshp = [int(v) for v in oshp.numpy().reshape(-1)]
    o = _int_tuple(name, "oshp", oshp)
    o = o * 2 if len(o) == 1 else o
    if len(o) != 2 or not all(1 <= v <= s for v, s in zip(o, x.shape[2:])):
        raise ValueError(f"{name}: oshp must be an int or (OH, OW), each in [1, input size], "
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


# ---- the rest of the convolution family: transposed, 3-d
def _grouped_weight(name: str, w: Tensor, groups: int, plain_ndim: int, layout: str) -> Tensor:
    """A convolution weight in its plain form: MegEngine's grouped form
    (groups, a // groups, b // groups, *kernel), one more axis than the
    plain (a, b // groups, *kernel), is folded; ``layout`` names the plain
    form in messages."""
    if w.ndim == plain_ndim + 1:
        if w.shape[0] != groups:
            raise ValueError(f"{name}: a grouped {w.ndim}-D weight {w.shape} has {w.shape[0]} groups, "
                             f"but groups={groups}")
        return reshape(w, (w.shape[0] * w.shape[1],) + tuple(w.shape[2:]))
    if w.ndim != plain_ndim:
        raise ValueError(f"{name}: weight must be {layout} or grouped (groups, ...), got shape {w.shape}")
    return w


def conv_transpose2d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride=1, padding=0,
                     output_padding=0, dilation=1, groups: int = 1, conv_mode: str = "cross_correlation",
                     compute_mode: str = "default") -> Tensor:
    """2-D transposed convolution ("deconvolution") of ``inp`` (N, C_in, H, W)
    with ``weight`` (C_in, C_out // groups, KH, KW), or MegEngine's grouped
    (groups, C_in // groups, C_out // groups, KH, KW); MegEngine's
    ``F.conv_transpose2d``. The output is (N, C_out, (H - 1) * stride - 2 *
    padding + dilation * (KH - 1) + output_padding + 1, ...): the gradient of
    ``conv2d`` with respect to its input. ``output_padding`` must be smaller
    than the stride. ``bias`` broadcasts against the output, e.g. (1, C_out,
    1, 1); a (C_out,) bias is one per channel.

    Example::

        >>> x = gc.tensor(np.ones((1, 1, 2, 2), "float32"))
        >>> F.conv_transpose2d(x, gc.tensor(np.ones((1, 1, 2, 2), "float32")), stride=2).shape
        (1, 1, 4, 4)
    """
    if conv_mode not in ("cross_correlation", "CROSS_CORRELATION"):
        raise ValueError(f"conv_transpose2d: only conv_mode='cross_correlation' is supported, got {conv_mode!r}")
    x = _t(inp)
    w = _grouped_weight("conv_transpose2d", _t(weight), groups, 4, "(C_in, C_out // groups, KH, KW)")
    op = _ConvTranspose2d(_pair(stride), _pair(padding), _pair(output_padding), _pair(dilation), groups)
    out = _apply(op, x, w)[0]
    return out if bias is None else _channel_bias("conv_transpose2d", out, _t(bias, out))


def conv_transpose1d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: int = 1,
                     padding: int = 0, output_padding: int = 0, dilation: int = 1, groups: int = 1,
                     conv_mode: str = "cross_correlation", compute_mode: str = "default") -> Tensor:
    """1-D transposed convolution of ``inp`` (N, C_in, L) with ``weight``
    (C_in, C_out // groups, K) (or grouped (groups, C_in // groups, C_out //
    groups, K)): ``conv_transpose2d`` on a trailing axis of size 1. Output
    length (L - 1) * stride - 2 * padding + dilation * (K - 1) +
    output_padding + 1.

    Example::

        >>> x = gc.tensor(np.ones((1, 1, 3), "float32"))
        >>> F.nn.conv_transpose1d(x, gc.tensor([[[1.0, 2.0]]]), stride=2).numpy()
        array([[[1., 2., 1., 2., 1., 2.]]], dtype=float32)
    """
    x, w = _t(inp), _t(weight)
    if x.ndim != 3:
        raise ValueError(f"conv_transpose1d: inp must be (N, C, L), got shape {x.shape}")
    if w.ndim not in (3, 4):
        raise ValueError(f"conv_transpose1d: weight must be (C_in, C_out // groups, K) or (groups, "
                         f"C_in // groups, C_out // groups, K), got shape {w.shape}")
    s, p, op, d = (_one_int("conv_transpose1d", what, v, low) for what, v, low in
                   (("stride", stride, 1), ("padding", padding, 0), ("output_padding", output_padding, 0),
                    ("dilation", dilation, 1)))
    out = squeeze(conv_transpose2d(expand_dims(x, -1), expand_dims(w, -1), None, (s, 1), (p, 0), (op, 0),
                                   (d, 1), groups, conv_mode, compute_mode), -1)
    return out if bias is None else _channel_bias("conv_transpose1d", out, _t(bias, out))


def _triple(v):
    # as _pair: anything else goes to the op as is, which says what is wrong
    try:
        if isinstance(v, (tuple, list)):
            return tuple(_index(a) for a in v)
        v = _index(v)
        return (v, v, v)
    except TypeError:
        return tuple(v) if isinstance(v, (tuple, list)) else v


def conv3d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride=1, padding=0, dilation=1,
           groups: int = 1, conv_mode: str = "cross_correlation") -> Tensor:
    """3-D convolution (cross-correlation) of ``inp`` (N, C, D, H, W) with
    ``weight`` (O, C // groups, KD, KH, KW), or MegEngine's grouped (groups,
    O // groups, C // groups, KD, KH, KW); MegEngine's ``F.conv3d``.
    ``bias`` broadcasts against (N, O, OD, OH, OW), e.g. (1, O, 1, 1, 1).

    Example::

        >>> x = gc.tensor(np.ones((1, 2, 4, 4, 4), "float32"))
        >>> F.conv3d(x, gc.tensor(np.ones((3, 2, 3, 3, 3), "float32")), padding=1).shape
        (1, 3, 4, 4, 4)
    """
    if conv_mode not in ("cross_correlation", "CROSS_CORRELATION"):
        raise ValueError(f"conv3d: only conv_mode='cross_correlation' is supported, got {conv_mode!r}")
    x = _t(inp)
    w = _grouped_weight("conv3d", _t(weight), groups, 5, "(O, C // groups, KD, KH, KW)")
    out = _apply(_Conv3d(_triple(stride), _triple(padding), _triple(dilation), groups), x, w)[0]
    return out if bias is None else _channel_bias("conv3d", out, _t(bias, out))
