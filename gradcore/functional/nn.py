"""``F.nn``, MegEngine's functional.nn: the softmax family (softmax,
log_softmax, logsumexp, logaddexp; their ops: ops/nn.py), dropout, the
normalisations, padding and the losses, written here; and the other
families' network functions, imported (``F.nn.relu`` is ``F.relu``).

Example::

    >>> F.nn.softmax(gc.tensor([[0.0, 0.0]])).numpy()
    array([[0.5, 0.5]], dtype=float32)
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import numpy as np

from .._core import Tensor, apply as _apply
from ..op import OpError
from ..ops.loss import CrossEntropy as _CrossEntropy
from ..ops.nn import BatchNormInference, BatchNormTraining, LogSoftmax, LogSumExp, Softmax
from ._args import _axis_in, _axis_key, _fill_value, _host, _int_arg, _int_tuple, _named, _on, _t, builtins_max
from .elemwise import _float_pair, clip, isinf, where
from .elemwise_table import abs, eq, exp, log, log1p, maximum, relu, softplus, sqrt, square
from .indexing import _int_labels, getitem, indexing_one_hot, topk as _topk
from .reduce import _norm_ord, max, mean, norm, sum
from .creation import zeros
from .shape import astype, concat, copy, expand_dims, reshape, stack, stop_gradient

# F.nn also has these functions of the other families, as in MegEngine
from .conv import (adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, conv1d, conv2d, conv3d,  # noqa: F401
                   conv_transpose1d, conv_transpose2d, conv_transpose3d, max_pool2d)
from .vision import interpolate, remap, warp_affine, warp_perspective  # noqa: F401
from .elemwise import hsigmoid, hswish, leaky_relu, prelu, relu6  # noqa: F401
from .elemwise_table import gelu, logsigmoid, sigmoid, silu, tanh  # noqa: F401
from .indexing import embedding, one_hot  # noqa: F401
from .linalg import linear, matmul  # noqa: F401
from .shape import pixel_shuffle  # noqa: F401
from .rnn import gru_cell, lstm_cell, rnn_cell, rnn_layer  # noqa: F401
from .loss import _reduce_loss, cosine_similarity, ctc_loss, kl_div, nll_loss, smooth_l1_loss  # noqa: F401
from ..op import ArgumentError


__all__ = [
    # written here
    "log_softmax", "logsoftmax", "logsumexp", "softmax", "cross_entropy", "dropout", "batch_norm",
    "normalize", "l1_loss", "square_loss", "binary_cross_entropy", "hinge_loss", "layer_norm",
    "group_norm", "instance_norm", "local_response_norm", "general_norm", "pad", "topk_accuracy",
    "sliding_window", "sliding_window_transpose", "sync_batch_norm",
    # re-exported
    "relu", "sigmoid", "tanh", "gelu", "silu", "softplus", "logsigmoid", "leaky_relu", "relu6",
    "hsigmoid", "hswish", "prelu", "linear", "indexing_one_hot", "one_hot", "embedding",
    "conv2d", "conv1d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d",
    "pixel_shuffle", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "interpolate",
    "remap", "warp_affine", "warp_perspective",
    # recurrent cells (rnn.py)
    "rnn_cell", "lstm_cell", "gru_cell", "rnn_layer",
    # more losses (loss.py)
    "nll_loss", "smooth_l1_loss", "kl_div", "ctc_loss", "cosine_similarity",
    # attention (attention.py)
    "scaled_dot_product_attention",
]


# ---- the softmax family
def log_softmax(inp, axis: int = -1):
    """log(softmax(x)) along ``axis`` (an int or a sequence of axes)."""
    x = _t(inp)
    if isinstance(axis, (tuple, list)):
        try:
            return x - logsumexp(x, axis, True)
        except OpError as exc:
            raise _named("log_softmax", exc) from exc
    return _apply(LogSoftmax(axis), x)[0]


logsoftmax = log_softmax     # MegEngine 1.x's name


def logsumexp(inp, axis: int = -1, keepdims: bool = False):
    """log(sum(exp(x))) over ``axis``: an int, a sequence of axes (as in
    MegEngine) or None (every axis)."""
    x = _t(inp)
    empty = _empty_reduction(x, axis)
    if empty is not None:
        # log(0) = -inf over an empty axis, as PyTorch (the sum keeps the history)
        return sum(empty, axis if not isinstance(axis, list) else tuple(axis), keepdims) + float("-inf")
    if axis is None or isinstance(axis, (tuple, list)):
        # the LogSumExp op's decomposition, over several axes at once
        try:
            m = stop_gradient(max(x, _axis_key(axis), True))
        except (OpError, TypeError) as exc:      # an axis out of range or not an int
            raise _named("logsumexp", exc) from exc
        m = where(eq(abs(m), float("inf")), 0, m)  # as LogSumExp: no inf - inf
        s = sum(exp(x - m), _axis_key(axis), keepdims)
        return log(s) + (m if keepdims else reshape(m, s.shape))
    return _apply(LogSumExp(axis, bool(keepdims)), x)[0]


def _empty_reduction(x, axis):
    """``x`` (as a float) when reducing it over ``axis`` reduces an empty
    axis, else None (also for axes the op itself must refuse)."""
    if x.shape is None or x.size != 0:
        return None
    axes = range(x.ndim) if axis is None else axis if isinstance(axis, (tuple, list)) else (axis,)
    if not all(isinstance(a, int) and -x.ndim <= a < x.ndim for a in axes):
        return None
    if not any(x.shape[a] == 0 for a in axes):
        return None
    return x if x.dtype.kind == "f" else x.astype("float32")


def logaddexp(x: Tensor, y: Tensor) -> Tensor:
    """Elementwise ``log(exp(x) + exp(y))``, computed without overflow (a
    logsumexp over the pair; ``x`` and ``y`` broadcast).

    Example::

        >>> F.logaddexp(gc.tensor([1000.0, -1000.0]), 1000.0).numpy()     # no overflow
        array([1000.6932, 1000.    ], dtype=float32)
    """
    x, y = _float_pair("logaddexp", x, y)
    # the larger plus softplus(smaller - larger): smooth in both inputs, so every
    # order of derivative is right at ties too (max + log1p(exp(-|x - y|)) is not:
    # its kinks cancel only in the first order). An infinite input has gradient 1
    # (its partner 0); two equal infinities give x + log 2, with no inf - inf.
    first = x >= y
    hi, lo = where(first, x, y), where(first, y, x)
    both_inf = eq(x, y) & isinf(x)
    return hi + softplus(where(both_inf, 0.0, lo) - where(both_inf, 0.0, hi))


def softmax(inp, axis=None):
    """exp(x) / sum(exp(x)) along ``axis`` (an int or a sequence of axes).
    The default axis is MegEngine's: 0 for a 0-, 1- or 3-d input, else 1.

    Example::

        >>> F.softmax(x)               # (N, C) or (N, C, H, W): over C
    """
    x = _t(inp)
    if axis is None:
        axis = 0 if x.ndim in (0, 1, 3) else 1
    if isinstance(axis, (tuple, list)):
        if x.size == 0:
            # nothing to normalise (the max over an empty axis would raise), as
            # the single-axis op and PyTorch: an empty result
            for a in axis:
                _axis_in("softmax", a, x.ndim)
            return exp(x)
        try:
            e = exp(x - stop_gradient(max(x, _axis_key(axis), True)))
        except (OpError, TypeError) as exc:
            raise _named("softmax", exc) from exc
        return e / sum(e, _axis_key(axis), True)
    return _apply(Softmax(axis), x)[0]


# ---- dropout and normalisation (composites: gradients of any order and every
# device come from the recorded ops they are made of)
def dropout(inp, drop_prob: float, training: bool = True):
    """Zero each element with probability ``drop_prob`` and scale the rest by
    ``1 / (1 - drop_prob)``; the identity when not training. The mask comes
    from ``gradcore.random`` (``gradcore.random.seed`` makes it repeatable).

    Example::

        >>> F.dropout(x, 0.5)
    """
    x = _t(inp)
    _check_drop_prob("dropout", drop_prob)
    if not training or drop_prob == 0:
        return x
    if x.dtype.kind not in "fc":
        # the 1 / (1 - p) scale would be truncated to an integer
        raise TypeError(f"dropout: needs a floating-point input, got {x.dtype} of shape {x.shape}")
    from .. import random as _random
    keep = _random.generator().random(x.shape) >= drop_prob
    scale = np.asarray(1.0 / (1.0 - drop_prob), x.dtype)
    return x * Tensor(keep.astype(x.dtype) * scale, device=x.device)


def _check_drop_prob(name: str, drop_prob) -> None:
    try:
        ok = 0 <= drop_prob < 1
    except TypeError:
        raise TypeError(f"{name}: drop_prob must be a number in [0, 1), got {drop_prob!r}") from None
    if not ok:
        raise ArgumentError(f"{name}: drop_prob must be in [0, 1), got {drop_prob}")


def batch_norm(inp, running_mean=None, running_var=None, weight=None, bias=None, *,
               training: bool = False, momentum: float = 0.9, eps: float = 1e-5, inplace: bool = True,
               compute_mode: str = "default", param_dim: str = "dim_1c11"):
    """Batch normalisation over every axis but 1 (MegEngine's ``F.batch_norm``).

    In training the batch statistics normalise ``inp`` and, when given,
    ``running_mean``/``running_var`` are updated as ``momentum * running +
    (1 - momentum) * batch`` (the variance unbiased): in place, or, with
    ``inplace=False``, returned as ``(output, new_mean, new_var)`` (None for
    a statistic not given) and the buffers left alone. Otherwise (inference)
    both running statistics are required and used. ``compute_mode`` and
    ``param_dim`` ("dim_1c11" only) are MegEngine's and change nothing here.

    Example::

        >>> y = F.batch_norm(x, rm, rv, w, b, training=True)
    """
    if param_dim != "dim_1c11":
        raise ArgumentError(f"batch_norm: only param_dim='dim_1c11' (NCHW) is supported, got {param_dim!r}")
    x = _t(inp)
    if x.dtype.kind in "biu":
        # the documented rule: integer and bool inputs of a float op give float32
        x = x.astype("float32")
    if x.shape is not None:
        _check_channel_params(x, training, running_mean=running_mean, running_var=running_var,
                              weight=weight, bias=bias)
    if _one_per_channel(x, weight, bias) and (training or _one_per_channel(x, running_mean, running_var)):
        return _batch_norm_ops(x, running_mean, running_var, weight, bias, training, momentum, eps, inplace)
    axes = tuple(i for i in range(x.ndim) if i != 1)

    def per_channel(t):
        # MegEngine's parameters are (1, C, 1, 1); PyTorch's (C,) work too
        if t is None or x.ndim <= 2:
            return t
        t = _t(t)
        return t.reshape((1, -1) + (1,) * (x.ndim - 2)) if t.ndim == 1 else t
    weight, bias = per_channel(weight), per_channel(bias)
    stats = (running_mean, running_var)
    if training:
        m = mean(x, axes, True)
        d = x - m
        v = mean(d * d, axes, True)
        new_stats = _running_stats(stats, m.detach(), v.detach(), x.size // x.shape[1], momentum, inplace)
    else:
        if running_mean is None or running_var is None:
            raise ArgumentError("batch_norm: running_mean and running_var must be given in inference "
                             "(training=False)")
        d = x - per_channel(running_mean)
        v = per_channel(running_var)
    y = d / sqrt(v + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    if training and not inplace and any(t is not None for t in stats):
        return (y,) + _stats_out(new_stats)
    return y


def sync_batch_norm(inp: Tensor, running_mean: Optional[Tensor], running_var: Optional[Tensor],
                    weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, training: bool = False,
                    momentum: float = 0.9, eps: float = 1e-5, eps_mode: str = "additive", group=None) -> Tensor:
    """Batch normalisation whose training statistics cover the whole batch
    across the ranks of ``group`` (``gradcore.distributed``'s WORLD when
    None), MegEngine's ``F.nn.sync_batch_norm``: each rank's per-channel
    count, sum and sum of squares are summed over the ranks (differentiably,
    so the gradient crosses ranks too), then normalise as ``batch_norm``;
    the running statistics get the global mean and unbiased variance.
    ``eps_mode`` "max" divides by sqrt(max(var, eps)) instead of sqrt(var
    + eps). In one process, or in inference, it is ``batch_norm``.

    Example::

        >>> y = F.nn.sync_batch_norm(x, rm, rv, w, b, training=True)
    """
    mode = str(eps_mode).lower()
    if mode not in ("additive", "max"):
        raise ArgumentError(f"sync_batch_norm: eps_mode must be 'additive' or 'max', got {eps_mode!r}")
    across = False
    if training:
        # (gradcore.distributed reaches nothing of gradcore.functional: no loop)
        from ..distributed import is_distributed
        across = is_distributed()
    if mode == "additive" and not across:
        return batch_norm(inp, running_mean, running_var, weight, bias, training=training, momentum=momentum,
                          eps=eps)
    x = _t(inp)
    if x.dtype.kind in "biu":
        x = x.astype("float32")
    _check_channel_params(x, training, running_mean=running_mean, running_var=running_var, weight=weight,
                          bias=bias)
    c = x.shape[1]
    pshape = (1, c) + (1,) * (x.ndim - 2)
    axes = tuple(i for i in range(x.ndim) if i != 1)
    if training:
        count = x.size // c
        s1, s2 = sum(x, axes, True), sum(x * x, axes, True)
        if across:
            from ..distributed.functional import WORLD, all_reduce_sum
            stats = all_reduce_sum(concat([Tensor(np.array([count], x.dtype), device=x.device),
                                           reshape(s1, (c,)), reshape(s2, (c,))]), WORLD if group is None else group)
            count = int(stats[0].item())
            s1, s2 = reshape(stats[1:c + 1], pshape), reshape(stats[c + 1:], pshape)
        m = s1 / count
        v = s2 / count - m * m
        _running_stats((running_mean, running_var), m.detach(), v.detach(), count, momentum, True)
    else:
        if running_mean is None or running_var is None:
            raise ArgumentError("sync_batch_norm: running_mean and running_var must be given in inference "
                                "(training=False)")
        m, v = reshape(_t(running_mean, x), pshape), reshape(_t(running_var, x), pshape)
    scale = (maximum(v, eps) if mode == "max" else v + eps) ** -0.5
    if weight is not None:
        scale = scale * reshape(_t(weight, x), pshape)
    shift = -m * scale
    if bias is not None:
        shift = shift + reshape(_t(bias, x), pshape)
    return x * scale + shift


def _stats_out(new_stats) -> tuple:
    """The new running statistics ``batch_norm(inplace=False)`` returns:
    (1, C, 1, 1) as MegEngine's (which reshapes (C,) ones before its op)."""
    return tuple(None if t is None else t.reshape((1, -1, 1, 1)) if t.ndim == 1 else t for t in new_stats)


def instance_norm(inp: Tensor, affine: bool, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                  eps: float = 1e-5) -> Tensor:
    """Instance normalisation of ``inp`` (N, C, ...), MegEngine's
    ``F.nn.instance_norm``: each sample's channel normalised over its other
    axes (biased variance), then ``* weight + bias`` per channel when
    ``affine`` (``group_norm`` with one channel per group).

    Example::

        >>> F.nn.instance_norm(gc.tensor([[[0.0, 2.0], [4.0, 8.0]]]), affine=False).numpy()
        array([[[-1., 1.],
                [-1., 1.]]], dtype=float32)
    """
    x = _t(inp)
    if x.ndim < 3:
        raise ArgumentError(f"instance_norm: inp must be (N, C, ...) with at least one more axis, got shape {x.shape}")
    if affine and (weight is None or bias is None):
        raise ArgumentError("instance_norm: weight and bias must be given when affine is True")
    return group_norm(x, x.shape[1], affine, weight, bias, eps)


def general_norm(inp: Tensor, normalized_axis, affine: bool = True, weight: Optional[Tensor] = None,
                 bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """Normalisation over the axes ``normalized_axis`` (an int or a
    sequence, biased variance), then ``* weight + bias`` when ``affine``,
    both shaped as those axes of ``inp``, MegEngine's ``F.nn.general_norm``
    (layer_norm over the last axes, instance norm over the spatial ones...).

    Example::

        >>> F.nn.general_norm(gc.tensor([[0.0, 2.0], [1.0, 5.0]]), 1, affine=False).numpy()
        array([[-1.,  1.],
               [-1.,  1.]], dtype=float32)
    """
    x = _t(inp)
    axes = (normalized_axis,) if isinstance(normalized_axis, (int, np.integer)) else tuple(normalized_axis)
    axes = tuple(_axis_in("general_norm", a, x.ndim) for a in axes)
    if not axes or len(set(axes)) != len(axes):
        raise ArgumentError(f"general_norm: normalized_axis must name distinct axes, got {normalized_axis!r}")
    y = _standardized(x, axes, eps)
    if not affine:
        return y
    if weight is None or bias is None:
        raise ArgumentError("general_norm: weight and bias must be given when affine is True")
    # the parameters' shape is that of the normalised axes, in their order
    shape = tuple(x.shape[a] if a in axes else 1 for a in range(x.ndim))
    want = tuple(x.shape[a] for a in sorted(axes))
    w, b = _t(weight, x), _t(bias, x)
    if w.shape != want or b.shape != want:
        raise ArgumentError(f"general_norm: weight and bias must have the normalised axes' shape {want}, "
                            f"got {w.shape} and {b.shape}")
    return y * reshape(w, shape) + reshape(b, shape)


def local_response_norm(inp: Tensor, kernel_size: int = 5, k: float = 2.0, alpha: float = 1e-4,
                        beta: float = 0.75) -> Tensor:
    """Local response normalisation across channels, MegEngine's
    ``F.nn.local_response_norm``: ``x / (k + alpha * s) ** beta`` with ``s``
    the sum of ``x ** 2`` over the ``kernel_size // 2`` channels on each side
    (within the image; PyTorch's ``local_response_norm`` divides alpha by
    the window's size).

    Example::

        >>> x = gc.tensor(np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5))
        >>> F.nn.local_response_norm(x, 3, 1.0, 1e-4, 0.75).numpy()[0, 0, 0, 1].round(6)
        0.999925
    """
    x = _t(inp)
    n = _int_arg("local_response_norm", "kernel_size", kernel_size, low=1)
    if x.ndim < 3:
        raise ArgumentError(f"local_response_norm: inp must be (N, C, ...), got shape {x.shape}")
    half, c = n // 2, x.shape[1]
    sq = x * x
    zeros_side = zeros((x.shape[0], half) + tuple(x.shape[2:]), x.dtype, x.device)
    padded = concat([zeros_side, sq, zeros_side], 1) if half else sq
    s = padded[:, 0:c]
    for j in range(1, 2 * half + 1):
        s = s + padded[:, j:j + c]
    return x / (k + alpha * s) ** beta


def _window_index(name: str, hw, kernel_size, padding, stride, dilation):
    """The window geometry of ``sliding_window``: ((OH, OW), row index
    (OH, 1, KH, 1), column index (1, OW, 1, KW)) into the padded image,
    and the normalised (kernel, padding) pairs."""
    pairs = []
    for what, v in (("kernel_size", kernel_size), ("padding", padding), ("stride", stride), ("dilation", dilation)):
        t = _int_tuple(name, what, v)
        t = t * 2 if len(t) == 1 else t
        if len(t) != 2:
            raise ArgumentError(f"{name}: {what} must be an int or a pair, got {v!r}")
        pairs.append(t)
    k, p, s, d = pairs
    out = tuple((hw[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) // s[a] + 1 for a in range(2))
    if min(k) < 1 or min(s) < 1 or min(d) < 1 or min(p) < 0 or min(out) < 1:
        raise ArgumentError(f"{name}: kernel_size {k}, padding {p}, stride {s} and dilation {d} leave no "
                            f"window in an image of {tuple(hw)}")
    rows = (np.arange(out[0]) * s[0])[:, None, None, None] + (np.arange(k[0]) * d[0])[None, None, :, None]
    cols = (np.arange(out[1]) * s[1])[None, :, None, None] + (np.arange(k[1]) * d[1])[None, None, None, :]
    return out, rows, cols, k, p


def sliding_window(inp: Tensor, kernel_size, padding=0, stride=1, dilation=1) -> Tensor:
    """Every window of ``inp`` (N, C, H, W) (zero padding, stride,
    dilation) as (N, C, OH, OW, KH, KW), MegEngine's
    ``F.sliding_window`` (PyTorch's ``unfold``, not flattened).

    Example::

        >>> F.sliding_window(gc.tensor(np.arange(9.0).reshape(1, 1, 3, 3)), 2).shape
        (1, 1, 2, 2, 2, 2)
    """
    x = _t(inp)
    if x.ndim != 4:
        raise ArgumentError(f"sliding_window: inp must be (N, C, H, W), got shape {x.shape}")
    _, rows, cols, _, p = _window_index("sliding_window", x.shape[2:], kernel_size, padding, stride, dilation)
    if p[0] or p[1]:
        x = pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    return getitem(x, (slice(None), slice(None), rows, cols))


def sliding_window_transpose(inp: Tensor, output_size, kernel_size, padding=0, stride=1, dilation=1) -> Tensor:
    """The adjoint of ``sliding_window``: windows (N, C, OH, OW, KH, KW)
    summed back into an image (N, C, *output_size), where windows overlap
    too, MegEngine's ``F.sliding_window_transpose`` (PyTorch's ``fold``).

    Example::

        >>> w = F.sliding_window(gc.tensor(np.ones((1, 1, 3, 3))), 2)
        >>> F.sliding_window_transpose(w, (3, 3), 2).numpy()[0, 0]
        array([[1., 2., 1.],
               [2., 4., 2.],
               [1., 2., 1.]], dtype=float32)
    """
    from ..ops.indexing import SubtensorGrad, split_index
    g = _t(inp)
    hw = _int_tuple("sliding_window_transpose", "output_size", output_size)
    hw = hw * 2 if len(hw) == 1 else hw
    if len(hw) != 2:
        raise ArgumentError(f"sliding_window_transpose: output_size must be an int or a pair, got {output_size!r}")
    out, rows, cols, k, p = _window_index("sliding_window_transpose", hw, kernel_size, padding, stride, dilation)
    if g.ndim != 6 or tuple(g.shape[2:]) != out + k:
        raise ArgumentError(f"sliding_window_transpose: inp must be windows (N, C, {out[0]}, {out[1]}, {k[0]}, "
                            f"{k[1]}) for output_size {hw}, got shape {g.shape}")
    padded = zeros(tuple(g.shape[:2]) + (hw[0] + 2 * p[0], hw[1] + 2 * p[1]), g.dtype, g.device)
    spec, arrays = split_index((slice(None), slice(None), rows, cols))
    # the scatter-add that is the gather's backward (overlapping windows add up)
    y = _apply(SubtensorGrad(spec), g, padded, *[_on(a, g) for a in arrays])[0]
    return y[:, :, p[0]:p[0] + hw[0], p[1]:p[1] + hw[1]]


def _one_per_channel(x, *params) -> bool:
    """Whether each of ``params`` is given with one element per channel of x."""
    if x.shape is None or x.ndim < 2:
        return False
    return all(p is not None and int(np.prod(np.shape(p) if not isinstance(p, Tensor) else p.shape)) == x.shape[1]
               for p in params)


def _batch_norm_ops(x, running_mean, running_var, weight, bias, training, momentum, eps, inplace):
    """batch_norm with an affine weight and bias per channel, as the
    BatchNormTraining / BatchNormInference ops (cuDNN on a GPU)."""
    pshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    stats = (running_mean, running_var)
    given = [_t(t, x) for t in (weight, bias)] + ([] if training else [_t(t, x) for t in stats])
    dtype = np.result_type(x.dtype, *[t.dtype for t in given])
    x = x if x.dtype == dtype else astype(x, dtype)
    params = [reshape(t if t.dtype == dtype else astype(t, dtype), pshape) for t in given]
    if not training:
        w, b, m, v = params
        return _apply(BatchNormInference(eps, x.ndim), x, m, v, w, b)[0]
    y, m, invstd = _apply(BatchNormTraining(eps, x.ndim), x, *params)
    if all(t is None for t in stats):
        return y
    # the batch variance from the op's inverse std
    new_stats = _running_stats(stats, m.detach(), 1 / square(invstd.detach()) - eps, x.size // x.shape[1],
                               momentum, inplace)
    if not inplace:
        return (y,) + _stats_out(new_stats)
    return y


def _running_stats(stats, m, v, n: int, momentum: float, inplace: bool) -> list:
    """The running mean and variance updated from a batch of ``n`` values
    per channel with mean ``m`` and biased variance ``v`` (the running
    variance is unbiased); history-free tensors, computed where x is, never
    recorded, written into the buffers when ``inplace``."""
    new_stats = [None, None]
    for k, buf in enumerate(stats):
        if buf is not None:
            stat = m if k == 0 else v * (n / builtins_max(n - 1, 1))
            new_stats[k] = (buf.detach() * momentum + stat.reshape(buf.shape) * (1 - momentum)).astype(buf.dtype)
            if inplace:
                buf._reset(new_stats[k])
    return new_stats


def _check_channel_params(x, training, **params) -> None:
    """batch_norm's checks before any op runs: inp is (N, C, ...), each given
    statistic or affine parameter has C elements (weight and bias may also
    be a single one), and the running statistics updated in training are
    Tensors."""
    if x.ndim < 2:
        raise ArgumentError(f"batch_norm: inp must be (N, C, ...), got shape {x.shape}")
    c = x.shape[1]
    for what, t in params.items():
        if t is None:
            continue
        running = what.startswith("running")
        if running and training and not isinstance(t, Tensor):
            raise TypeError(f"batch_norm: {what} must be a Tensor (it is updated in place in training), "
                            f"got {type(t).__name__}")
        shape = tuple(t.shape) if hasattr(t, "shape") else np.shape(t)
        size = int(np.prod(shape))
        if size != c and (running or size != 1):
            raise ArgumentError(f"batch_norm: {what} must have one element per channel ({c} for inp of shape "
                             f"{x.shape}), got shape {shape}")


def layer_norm(inp: Tensor, normalized_shape: Union[int, Sequence[int]], affine: bool = True,
               weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               eps: float = 1e-5) -> Tensor:
    """Layer normalisation over the last ``len(normalized_shape)`` axes,
    MegEngine's ``F.nn.layer_norm``: ``(x - mean) / sqrt(var + eps)`` with
    the biased variance, then ``* weight + bias`` when ``affine`` (both of
    ``normalized_shape``, or of its size).

    Example::

        >>> x = gc.tensor([[1.0, 2.0, 3.0]])
        >>> F.nn.layer_norm(x, 3, affine=False).numpy().round(4)
        array([[-1.2247,  0.    ,  1.2247]], dtype=float32)
    """
    x = _t(inp)
    shape = tuple(_int_arg("layer_norm", "normalized_shape", d, low=1)
                  for d in _int_tuple("layer_norm", "normalized_shape", normalized_shape))
    if not shape or len(shape) > x.ndim or x.shape[x.ndim - len(shape):] != shape:
        raise ArgumentError(f"layer_norm: normalized_shape {shape} must be the trailing dimensions "
                         f"of inp, got inp shape {x.shape}")
    y = _standardized(x, tuple(range(x.ndim - len(shape), x.ndim)), eps)
    if not affine:
        return y
    return y * _affine_param("layer_norm", "weight", weight, shape, x) + \
        _affine_param("layer_norm", "bias", bias, shape, x)


def _standardized(x: Tensor, axes: tuple, eps: float) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over ``axes`` (biased variance): the
    layer, group, instance and general normalisations."""
    d = x - mean(x, axes, True)
    return d / sqrt(mean(d * d, axes, True) + eps)


def _affine_param(name: str, what: str, t, shape: tuple, x: Tensor) -> Tensor:
    """An affine ``weight``/``bias`` reshaped to ``shape`` (it may come flat),
    or a clear error: None with ``affine=True``, or the wrong size."""
    if t is None:
        raise ArgumentError(f"{name}: affine=True needs {what} (give affine=False for none)")
    t = _t(t, x)
    if t.size != int(np.prod(shape)):
        raise ArgumentError(f"{name}: {what} must have shape {shape}, got {t.shape}")
    return t if t.shape == shape else reshape(t, shape)


def group_norm(inp: Tensor, num_groups: int, affine: bool = True, weight: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """Group normalisation of ``inp`` (N, C, ...), MegEngine's
    ``F.nn.group_norm``: the C channels split into ``num_groups`` groups,
    each sample's group normalised as in ``layer_norm``, then ``* weight +
    bias`` per channel (both (C,)) when ``affine``.

    Example::

        >>> x = gc.tensor([[[0.0, 2.0], [4.0, 6.0]]])       # (N, C, L) = (1, 2, 2)
        >>> F.nn.group_norm(x, 1, affine=False).numpy().round(4)
        array([[[-1.3416, -0.4472],
                [ 0.4472,  1.3416]]], dtype=float32)
    """
    x = _t(inp)
    g = _int_arg("group_norm", "num_groups", num_groups, low=1)
    if x.ndim < 2 or x.shape[1] % g:
        raise ArgumentError(f"group_norm: inp must be (N, C, ...) with C divisible by num_groups={g}, "
                         f"got shape {x.shape}")
    n, c = x.shape[:2]
    grouped = reshape(x, (n, g, (c // g) * int(np.prod(x.shape[2:]))))
    y = reshape(_standardized(grouped, (2,), eps), x.shape)
    if not affine:
        return y
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    w = reshape(_affine_param("group_norm", "weight", weight, (c,), x), per_channel)
    b = reshape(_affine_param("group_norm", "bias", bias, (c,), x), per_channel)
    return y * w + b


def normalize(inp: Tensor, ord: Optional[float] = None, axis: Union[int, Sequence[int], None] = None,
              eps: float = 1e-12) -> Tensor:
    """``inp / max(norm(inp, ord, axis), eps)``: L``ord`` normalisation
    (default L2) of each vector along ``axis`` (None: the whole tensor as one
    vector). An all-zero vector stays zero, with a finite gradient.

    Example::

        >>> F.normalize(gc.tensor([[3.0, 4.0]]), axis=1).numpy()
        array([[0.6, 0.8]], dtype=float32)
    """
    x = _t(inp)
    if ord is None or ord == 2:
        # max(sqrt(s), eps) as sqrt(max(s, eps**2)): the same value, and no
        # 0 * inf in the gradient where s is 0
        try:
            ss = sum(x * x, axis, True)
        except (OpError, TypeError) as exc:
            raise _named("normalize", exc) from exc
        return x / sqrt(maximum(ss, eps * eps))
    try:
        n = norm(x, _norm_ord("normalize", ord), axis, True)
    except (OpError, TypeError) as exc:
        raise _named("normalize", exc) from exc
    return x / clip(n, lower=eps)


def pad(src: Tensor, pad_width: Sequence[Sequence[int]], mode: str = "constant",
        constant_value: float = 0.0) -> Tensor:
    """Pad ``src``, MegEngine's ``F.nn.pad``: ``pad_width[i] = (before,
    after)`` for axis ``i`` (later axes unpadded). ``mode`` is "constant"
    (``constant_value``), "reflect" (mirrored, edge not repeated, as
    ``np.pad``'s "reflect") or "replicate" (also "edge": the edge repeated).

    Example::

        >>> F.nn.pad(gc.tensor([[1.0, 2.0, 3.0]]), ((0, 0), (1, 2)), mode="reflect").numpy()
        array([[2., 1., 2., 3., 2., 1.]], dtype=float32)
    """
    x = _t(src)
    kind = mode.lower() if isinstance(mode, str) else mode
    kind = "replicate" if kind == "edge" else kind
    if kind not in ("constant", "reflect", "replicate"):
        raise ArgumentError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'edge', got {mode!r}")
    out = x
    if kind == "constant":
        _fill_value("pad", constant_value, x.dtype)
        _host("pad", lambda: np.asarray(constant_value, x.dtype), constant_value=constant_value, dtype=x.dtype)
    for axis, (before, after) in enumerate(_pad_widths("pad", pad_width, x.ndim)):
        if not (before or after):
            continue
        n = x.shape[axis]
        if kind == "constant":
            head, tail = (Tensor(np.full(out.shape[:axis] + (w,) + out.shape[axis + 1:], constant_value, x.dtype),
                                 device=x.device) for w in (before, after))
            out = concat([head, out, tail], axis)
            continue
        if n == 0:
            raise ArgumentError(f"pad: cannot {kind}-pad axis {axis} of size 0 (inp shape {x.shape})")
        # the source index of each output position along the axis: reflect
        # is periodic with period 2(n - 1), as np.pad's
        idx = np.arange(-before, n + after)
        if kind == "replicate" or n == 1:
            idx = np.clip(idx, 0, n - 1)
        else:
            idx = np.abs(idx) % (2 * (n - 1))
            idx = np.where(idx >= n, 2 * (n - 1) - idx, idx)
        out = getitem(out, (slice(None),) * axis + (idx,))
    return copy(x) if out is x else out


def _pad_widths(name: str, pad_width, ndim: int) -> list:
    """MegEngine's ``pad_width``: one (before, after) pair of ints >= 0 per
    leading axis (the axes after those given are not padded)."""
    try:
        pairs = [tuple(p) for p in pad_width]
    except TypeError:
        raise TypeError(f"{name}: pad_width must be a sequence of (before, after) pairs, "
                        f"got {pad_width!r}") from None
    if any(len(p) != 2 for p in pairs):
        raise ArgumentError(f"{name}: pad_width must be a sequence of (before, after) pairs, got {pad_width!r}")
    if len(pairs) > ndim:
        raise ArgumentError(f"{name}: pad_width has {len(pairs)} pairs, more than the {ndim} axes of inp")
    return [tuple(_int_arg(name, "pad_width", v) for v in p) for p in pairs]


# ---- losses: ``reduction`` is "mean" (default), "sum" or "none"
def cross_entropy(pred, label, axis: int = 1, with_logits: bool = True,
                  label_smooth: float = 0.0, reduction: str = "mean"):
    """Cross-entropy of class scores ``pred`` (logits by default) against
    integer ``label``, MegEngine's ``F.nn.cross_entropy``: per sample
    ``-log softmax(pred)[label]`` along ``axis``, with ``label_smooth`` a
    mixes in ``-mean(log softmax(pred))``: ``(1 - a) * nll - a * mean``;
    then ``reduction`` ("mean", "sum" or "none").

    Logits run as one fused op, ``CrossEntropy`` (ops/loss.py; label
    smoothing included), and its gradient as one more; probabilities
    (``with_logits=False``) and integer scores take the composed path
    (log, indexing_one_hot, negation). Labels must be in [0, n): out of
    range is an IndexError (on cuda too, from the labels' range, read once
    per content), a negative one on the cpu a ValueError.

    Example::

        >>> loss = F.cross_entropy(logits, labels)
        >>> round(F.cross_entropy(gc.tensor([[0.0, 0.0]]), gc.tensor([1])).item(), 4)     # log 2
        0.6931
    """
    pred = _t(pred)
    label = _on(label, pred)
    label = _int_labels(label, "cross_entropy", "label")
    if isinstance(label, Tensor) and label.device == "cpu" and label.size and label.numpy().min() < 0:
        # indexing would count a negative class from the end (NumPy's rule) and
        # score the wrong class silently; on cuda this check would cost a sync
        raise ArgumentError(f"cross_entropy: labels must be class indices >= 0, got {label.numpy().min()} "
                         f"(label shape {label.shape}, pred shape {pred.shape})")
    if label.ndim != pred.ndim - 1:
        raise ArgumentError(f"cross_entropy: label must have one dimension less than pred, "
                         f"got shapes {pred.shape} and {label.shape}")
    if pred.shape is not None:
        axis = _axis_in("cross_entropy", axis, pred.ndim)
    if label_smooth is None:        # MegEngine: None is no smoothing
        label_smooth = 0.0
    if isinstance(label_smooth, bool) or not isinstance(label_smooth, (int, float, np.number)):
        raise TypeError(f"cross_entropy: label_smooth must be a number, got {label_smooth!r}")
    if with_logits and pred.dtype.kind == "f":
        try:
            nll = _apply(_CrossEntropy(axis, label_smooth), pred, label)[0]
        except (OpError, IndexError) as exc:     # a label out of range, a shape
            raise _named("cross_entropy", exc) from exc
        return _reduce_loss("cross_entropy", nll, reduction)
    logp = log_softmax(pred, axis) if with_logits else log(pred)
    try:
        nll = -indexing_one_hot(logp, label, axis)
    except (OpError, IndexError) as exc:         # a label out of range
        raise _named("cross_entropy", exc) from exc
    if label_smooth:
        nll = nll * (1 - label_smooth) - mean(logp, axis) * label_smooth
    return _reduce_loss("cross_entropy", nll, reduction)


def _label(label, pred: Tensor, name: Optional[str] = None) -> Tensor:
    """``label`` as a tensor of ``pred``'s dtype: the loss keeps ``pred``'s.
    With ``name`` (a loss), ``label`` must broadcast to ``pred``'s shape (a
    (N,) label against (N, 1) scores would silently make an (N, N) loss)."""
    label = astype(_t(label, pred), pred.dtype)
    if name is not None and label.shape != pred.shape and label.shape is not None and pred.shape is not None:
        try:
            shape = tuple(np.broadcast_shapes(pred.shape, label.shape))
        except ValueError:
            shape = None
        if shape != pred.shape:
            raise ArgumentError(f"{name}: label must have pred's shape (or broadcast to it), got shapes "
                             f"{pred.shape} and {label.shape}")
    return label


def l1_loss(pred: Tensor, label: Tensor, reduction: str = "mean") -> Tensor:
    """Mean absolute error, ``|pred - label|`` reduced.

    Example::

        >>> F.l1_loss(gc.tensor([3.0, 3.0]), gc.tensor([2.0, 8.0])).item()
        3.0
    """
    pred = _t(pred)
    return _reduce_loss("l1_loss", abs(pred - _label(label, pred, "l1_loss")), reduction)


def square_loss(pred: Tensor, label: Tensor, reduction: str = "mean") -> Tensor:
    """Mean squared error, ``(pred - label) ** 2`` reduced (also ``F.mse_loss``).

    Example::

        >>> F.square_loss(gc.tensor([3.0, 3.0]), gc.tensor([2.0, 8.0])).item()
        13.0
    """
    pred = _t(pred)
    return _reduce_loss("square_loss", square(pred - _label(label, pred, "square_loss")), reduction)


mse_loss = square_loss


def binary_cross_entropy(pred: Tensor, label: Tensor, with_logits: bool = True,
                         reduction: str = "mean") -> Tensor:
    """Binary cross-entropy of ``pred`` against probabilities ``label`` (same
    shape). ``pred`` holds logits by default (computed stably as
    ``softplus(-pred) + (1 - label) * pred``); with ``with_logits=False`` it
    holds probabilities in (0, 1).

    Example::

        >>> F.binary_cross_entropy(gc.tensor([0.0, 0.0]), gc.tensor([1.0, 0.0])).item()
        0.6931471824645996
    """
    pred = _t(pred)
    label = _label(label, pred, "binary_cross_entropy")
    if with_logits:
        loss = softplus(-pred) + (1 - label) * pred
    else:
        # each log at no less than -100, as PyTorch's: a probability of
        # exactly 0 or 1 gives a large finite loss, not inf or NaN (the log
        # of a stand-in there, so that no 0 * inf reaches the gradient)
        def clamped_log(p):
            tiny = p > np.exp(-100.0)
            return where(tiny, log(where(tiny, p, 1.0)), -100.0)
        loss = -(label * clamped_log(pred) + (1 - label) * clamped_log(1 - pred))
    return _reduce_loss("binary_cross_entropy", loss, reduction)


def hinge_loss(pred: Tensor, label: Tensor, norm: str = "L1", reduction: str = "mean") -> Tensor:
    """SVM hinge loss of scores ``pred`` (N, C) against labels of -1 or 1
    (same shape): per sample, the sum over axis 1 of ``max(0, 1 - pred *
    label)`` ("L1") or of its square ("L2"); then ``reduction`` over samples.

    Example::

        >>> pred = gc.tensor([[0.5, -0.5, 0.1], [-0.6, 0.7, 0.8]])
        >>> F.hinge_loss(pred, gc.tensor([[1.0, -1, -1], [-1, 1, 1]]), reduction="none").numpy()
        array([2.1, 0.9], dtype=float32)
    """
    kind = norm.upper() if isinstance(norm, str) else norm
    if kind not in ("L1", "L2"):
        raise ArgumentError(f"hinge_loss: norm must be 'L1' or 'L2', got {norm!r}")
    pred = _t(pred)
    if pred.ndim < 2:
        raise ArgumentError(f"hinge_loss: pred must be (N, C, ...), got shape {pred.shape}")
    margin = relu(1 - pred * _label(label, pred, "hinge_loss"))
    loss = sum(margin if kind == "L1" else square(margin), 1)
    return _reduce_loss("hinge_loss", loss, reduction)


def topk_accuracy(logits: Tensor, target: Tensor,
                  topk: Union[int, Sequence[int]] = 1) -> Union[Tensor, list]:
    """Fraction of samples whose ``target`` class is among the ``k`` largest
    ``logits`` (batch, classes), for each ``k`` in ``topk``: one float32
    scalar tensor, or a list for several ``k`` (MegEngine's
    ``F.topk_accuracy``).

    Example::

        >>> logits = gc.tensor([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]])
        >>> F.topk_accuracy(logits, gc.tensor([1, 1]), topk=(1, 2))[1].item()
        1.0
    """
    x = _t(logits)
    ks = _int_tuple("topk_accuracy", "topk", topk)
    if x.ndim != 2 or not all(1 <= k <= x.shape[1] for k in ks):
        raise ArgumentError(f"topk_accuracy: logits must be (batch, classes) and each k in [1, classes], "
                         f"got shape {x.shape} and topk={topk!r}")
    label = _int_labels(_on(target, x), "topk_accuracy", "target")
    if label.shape != x.shape[:1]:
        raise ArgumentError(f"topk_accuracy: target must be ({x.shape[0]},), got shape {label.shape}")
    _, pred = _topk(stop_gradient(x), builtins_max(ks), descending=True)
    hit = astype(eq(pred, astype(expand_dims(label, 1), pred.dtype)), "float32")
    accs = [sum(hit[:, :k]) / builtins_max(x.shape[0], 1) for k in ks]
    return accs[0] if len(accs) == 1 else accs


# ---- attention (M.MultiHeadAttention runs _attention; compositions of matmul,
# softmax, where and dropout: gradients of any order, every device)
def _attention(q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], add: Optional[Tensor],
               dropout_p: float, is_causal: bool, scale: Optional[float], training: bool,
               name: str) -> Tuple[Tensor, Tensor]:
    """(output, attention weights): softmax(q k^T * scale + add, masked
    where ``keep`` is False) (dropout) @ v."""
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ArgumentError(f"{name}: query, key and value need at least 2 dimensions (..., L, E), got shapes "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ArgumentError(f"{name}: query and key must share the last dimension and key and value the "
                         f"sequence one, got shapes {q.shape}, {k.shape}, {v.shape}")
    L, S = q.shape[-2], k.shape[-2]
    s = (1.0 / math.sqrt(q.shape[-1])) if scale is None else float(scale)
    scores = matmul(q, k, transpose_b=True) * s
    if is_causal:
        causal = Tensor(np.tril(np.ones((L, S), bool)), device=q.device)
        keep = causal if keep is None else keep & causal
    if add is not None:
        scores = scores + add
    if keep is not None:
        scores = where(keep, scores, float("-inf"))
    attn = softmax(scores, axis=-1)
    if dropout_p and training:
        attn = dropout(attn, dropout_p, True)
    return matmul(attn, v), attn


def _split_mask(name: str, attn_mask, like: Tensor, true_means_keep: bool):
    """A mask as (keep: bool or None, add: float or None)."""
    if attn_mask is None:
        return None, None
    m = _t(attn_mask, like) if not isinstance(attn_mask, Tensor) else attn_mask
    if m.dtype == np.bool_:
        return (m if true_means_keep else ~m), None
    if m.dtype.kind != "f":
        raise TypeError(f"{name}: attn_mask must be bool or floating-point, got {m.dtype}")
    return None, m


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 training: bool = True) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value`` over (..., L, E)
    query and (..., S, E) key, (..., S, Ev) value, PyTorch's semantics:
    ``scale`` defaults to 1 / sqrt(E); a bool ``attn_mask`` (broadcast to
    (..., L, S)) is True where a position takes part, a float one is added
    to the scores; ``is_causal`` masks the upper triangle; ``dropout_p``
    drops attention weights while ``training``.

    Example::

        >>> out = F.nn.scaled_dot_product_attention(q, k, v, is_causal=True)
    """
    name = "scaled_dot_product_attention"
    q, k, v = _t(query), _t(key), _t(value)
    _check_drop_prob(name, dropout_p)
    if is_causal and attn_mask is not None:
        raise ArgumentError(f"{name}: give attn_mask or is_causal, not both (PyTorch's rule)")
    keep, add = _split_mask(name, attn_mask, q, True)
    return _attention(q, k, v, keep, add, dropout_p, is_causal, scale, training, name)[0]
