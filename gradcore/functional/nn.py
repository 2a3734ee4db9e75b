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
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from .._core import Tensor, apply as _apply
from ..dtypes import autocast_dtypes, promote_types
from ..op import OpError
from ..ops.vision import DeformablePSROIPooling
from ..ops.nn import (BatchNormInference, BatchNormTraining, LogSoftmax, LogSumExp, Softmax, Standardize,
                      StandardizeAffine)
from ._args import _axis_in, _axis_key, _fill_value, _host, _int_arg, _int_tuple, _named, _on, _t, builtins_max
from .elemwise import clip, logaddexp, where  # noqa: F401  (logaddexp: F.nn's before)
from .elemwise_table import abs, eq, exp, floor, log, maximum, relu, softplus, sqrt, square
from .indexing import _int_labels, gather, getitem, indexing_one_hot, topk as _topk
from .reduce import _norm_ord, max, mean, norm, sum
from .creation import zeros
from .shape import astype, broadcast_to, concat, copy, expand_dims, reshape, stack, stop_gradient, transpose

# F.nn also has these functions of the other families, as in MegEngine
from .conv import _per_axis
from .conv import (adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, conv1d, conv2d, conv3d,  # noqa: F401
                   conv_transpose1d, conv_transpose2d, conv_transpose3d, max_pool2d)
from .vision import interpolate, remap, warp_affine, warp_perspective  # noqa: F401
from .elemwise import hsigmoid, hswish, leaky_relu, prelu, relu6  # noqa: F401
from .elemwise_table import gelu, logsigmoid, sigmoid, silu, tanh  # noqa: F401
from .indexing import embedding, one_hot  # noqa: F401
from .linalg import linear, matmul  # noqa: F401
from .shape import pixel_shuffle  # noqa: F401
from .rnn import gru_cell, lstm_cell, rnn_cell, rnn_layer  # noqa: F401
from .loss import (binary_cross_entropy, cosine_similarity, cross_entropy, ctc_loss,  # noqa: F401
                   hinge_loss, kl_div, l1_loss, mse_loss, nll_loss, smooth_l1_loss, square_loss)
from ..op import ArgumentError


__all__ = [
    # written here
    "log_softmax", "logsoftmax", "logsumexp", "softmax", "cross_entropy", "dropout", "batch_norm",
    "normalize", "l1_loss", "square_loss", "binary_cross_entropy", "hinge_loss", "layer_norm",
    "group_norm", "instance_norm", "local_response_norm", "general_norm", "pad", "topk_accuracy",
    "sliding_window", "sliding_window_transpose", "sync_batch_norm", "local_conv2d", "region_restricted_conv",
    "deformable_psroi_pooling",
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
    "scaled_dot_product_attention", "multi_head_attention",
]


# ---- the softmax family
def log_softmax(inp: Tensor, axis: int = -1) -> Tensor:
    """log(softmax(x)) along ``axis`` (an int or a sequence of axes).

    Example::

        >>> F.log_softmax(gc.tensor([0.0, 0.0])).numpy().round(4)     # log(1 / 2)
        array([-0.6931, -0.6931], dtype=float32)
    """
    x = _t(inp)
    if isinstance(axis, (tuple, list)):
        try:
            return x - logsumexp(x, axis, True)
        except OpError as exc:
            raise _named("log_softmax", exc) from exc
    return _apply(LogSoftmax(axis), x)[0]


logsoftmax = log_softmax     # MegEngine 1.x's name


def logsumexp(inp: Tensor, axis: int = -1, keepdims: bool = False) -> Tensor:
    """log(sum(exp(x))) over ``axis``: an int, a sequence of axes (as in
    MegEngine) or None (every axis).

    Example::

        >>> F.logsumexp(gc.tensor([[0.0, 0.0], [1.0, 1.0]]), axis=1).numpy().round(4)     # x + log 2
        array([0.6931, 1.6931], dtype=float32)
    """
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


def softmax(inp: Tensor, axis: Optional[Union[int, Sequence[int]]] = None) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis`` (an int or a sequence of axes).
    The default axis is MegEngine's: 0 for a 0-, 1- or 3-d input, else 1.

    Example::

        >>> F.softmax(gc.tensor([[0.0, 0.0], [0.0, np.log(3.0)]])).numpy()     # 2-d: over axis 1
        array([[0.5 , 0.5 ],
               [0.25, 0.75]], dtype=float32)
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
def dropout(inp: Tensor, drop_prob: float, training: bool = True) -> Tensor:
    """Zero each element with probability ``drop_prob`` and scale the rest by
    ``1 / (1 - drop_prob)``; the identity when not training. The mask comes
    from ``gradcore.random`` (``gradcore.random.seed`` makes it repeatable).

    Example::

        >>> gc.random.seed(0)
        >>> y = F.dropout(gc.tensor(np.ones(1000, "float32")), 0.5)
        >>> sorted(set(y.numpy().tolist()))     # dropped, or kept and scaled by 1 / (1 - 0.5)
        [0.0, 2.0]
        >>> F.dropout(gc.tensor([1.0, 2.0]), 0.5, training=False).numpy()
        array([1., 2.], dtype=float32)
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


def batch_norm(inp: Tensor, running_mean: Optional[Tensor] = None, running_var: Optional[Tensor] = None,
               weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, *, training: bool = False,
               momentum: float = 0.9, eps: float = 1e-5, inplace: bool = True, compute_mode: str = "default",
               param_dim: str = "dim_1c11") -> Union[Tensor, Tuple[Tensor, Optional[Tensor], Optional[Tensor]]]:
    """Batch normalisation over every axis but 1 (MegEngine's ``F.batch_norm``).

    In training the batch statistics normalise ``inp`` and, when given,
    ``running_mean``/``running_var`` are updated as ``momentum * running +
    (1 - momentum) * batch`` (the variance unbiased): in place, or, with
    ``inplace=False``, returned as ``(output, new_mean, new_var)`` (None for
    a statistic not given) and the buffers left alone. Otherwise (inference)
    both running statistics are required and used. ``compute_mode`` and
    ``param_dim`` ("dim_1c11" only) are MegEngine's and change nothing here.

    Example::

        >>> x = gc.tensor([[1.0], [3.0]])
        >>> rm, rv = gc.tensor([0.0]), gc.tensor([1.0])
        >>> F.batch_norm(x, rm, rv, training=True).numpy().round(4)
        array([[-1.],
               [ 1.]], dtype=float32)
        >>> rm.numpy(), rv.numpy()     # 0.9 * old + 0.1 * batch (unbiased variance 2)
        (array([0.2], dtype=float32), array([1.1], dtype=float32))
    """
    if param_dim != "dim_1c11":
        raise ArgumentError(f"batch_norm: only param_dim='dim_1c11' (NCHW) is supported, got {param_dim!r}")
    x = _t(inp)
    if x.dtype.kind in "biu":
        # the documented rule: integer and bool inputs of a float op give float32
        x = x.astype("float32")
    # MegEngine's BatchNorm gives its input's dtype whatever its parameters'
    # (float32 ones with a float16 input: computed in float32); under
    # gradcore.amp's autocast the input is first rounded to the low precision
    # and the arithmetic is in the high one
    amp = autocast_dtypes()
    if amp is not None and x.dtype.kind == "f":
        x = x.astype(amp[0])
    params = [None if p is None else _t(p, x) for p in (weight, bias)]
    compute = promote_types(x.dtype, *(p.dtype for p in params if p is not None and p.dtype.kind == "f"),
                            *(() if amp is None else (amp[1],)))
    if compute == x.dtype:
        return _batch_norm(x, running_mean, running_var, *params, training, momentum, eps, inplace)
    weight, bias = (None if p is None else p.astype(compute) for p in params)
    out = _batch_norm(x.astype(compute), running_mean, running_var, weight, bias, training, momentum, eps,
                      inplace)
    return out.astype(x.dtype) if isinstance(out, Tensor) else (out[0].astype(x.dtype),) + tuple(out[1:])


def _batch_norm(x: Tensor, running_mean, running_var, weight, bias, training: bool, momentum: float, eps: float,
                inplace: bool):
    """``batch_norm`` of a float ``x``, its arguments checked."""
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
                    momentum: float = 0.9, eps: float = 1e-5, eps_mode: str = "additive",
                    group: Optional[Any] = None) -> Tensor:
    """Batch normalisation whose training statistics cover the whole batch
    across the ranks of ``group`` (``gradcore.distributed``'s WORLD when
    None), MegEngine's ``F.nn.sync_batch_norm``: each rank's per-channel
    count, sum and sum of squares are summed over the ranks (differentiably,
    so the gradient crosses ranks too), then normalise as ``batch_norm``;
    the running statistics get the global mean and unbiased variance.
    ``eps_mode`` "max" divides by sqrt(max(var, eps)) instead of sqrt(var
    + eps). In one process, or in inference, it is ``batch_norm``.

    Example::

        >>> x = gc.tensor([[1.0], [3.0]])
        >>> rm, rv = gc.tensor([0.0]), gc.tensor([1.0])
        >>> F.nn.sync_batch_norm(x, rm, rv, training=True).numpy().round(4)     # one process: batch_norm
        array([[-1.],
               [ 1.]], dtype=float32)
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

        >>> x = gc.tensor([[[0.0, 2.0], [4.0, 8.0]]])
        >>> F.nn.instance_norm(x, affine=False).numpy().round(4)
        array([[[-1.,  1.],
                [-1.,  1.]]], dtype=float32)
    """
    x = _t(inp)
    if x.ndim < 3:
        raise ArgumentError(f"instance_norm: inp must be (N, C, ...) with at least one more axis, got shape {x.shape}")
    if affine and (weight is None or bias is None):
        raise ArgumentError("instance_norm: weight and bias must be given when affine is True")
    return group_norm(x, x.shape[1], affine, weight, bias, eps)


def general_norm(inp: Tensor, normalized_axis: Union[int, Sequence[int]], affine: bool = True,
                 weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """Normalisation over the axes ``normalized_axis`` (an int or a
    sequence, biased variance), then ``* weight + bias`` when ``affine``,
    both shaped as those axes of ``inp``, MegEngine's ``F.nn.general_norm``
    (layer_norm over the last axes, instance norm over the spatial ones...).

    Example::

        >>> x = gc.tensor([[0.0, 2.0], [1.0, 5.0]])
        >>> F.nn.general_norm(x, 1, affine=False).numpy().round(4)
        array([[-1.,  1.],
               [-1.,  1.]], dtype=float32)
    """
    x = _t(inp)
    try:
        axes = (normalized_axis,) if isinstance(normalized_axis, (int, np.integer)) else tuple(normalized_axis)
    except TypeError:
        raise TypeError(f"general_norm: normalized_axis must be an int or a sequence of ints, "
                        f"got {normalized_axis!r}") from None
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
        >>> y = F.nn.local_response_norm(x, 3, 1.0, 1e-4, 0.75)
        >>> y.shape, round(float(y.numpy()[0, 0, 0, 1]), 6)
        ((1, 1, 5, 5), 0.999925)
    """
    x = _t(inp)
    n = _int_arg("local_response_norm", "kernel_size", kernel_size, low=1)
    if x.ndim < 3:
        raise ArgumentError(f"local_response_norm: inp must be (N, C, ...), got shape {x.shape}")
    half, c = n // 2, x.shape[1]
    sq = x * x
    zeros_side = zeros((x.shape[0], half) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
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


def sliding_window(inp: Tensor, kernel_size: Union[int, Sequence[int]],
                   padding: Union[int, Sequence[int]] = 0, stride: Union[int, Sequence[int]] = 1,
                   dilation: Union[int, Sequence[int]] = 1) -> Tensor:
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


def region_restricted_conv(inp: Tensor, weight: Tensor, rin: Tensor, rout: Tensor, bias: Optional[Tensor] = None,
                           stride: Union[int, Sequence[int]] = 1, padding: Union[int, Sequence[int]] = 0,
                           dilation: Union[int, Sequence[int]] = 1, groups: int = 1,
                           conv_mode: str = "cross_correlation", compute_mode: str = "default") -> Tensor:
    """MegEngine's region-restricted convolution: a grouped 2-d convolution
    of ``inp`` (N, C, H, W) with ``weight`` (groups, O // groups, C //
    groups, KH, KW) in which an input position contributes to an output
    position only where the integer region ids agree: ``rin`` (N, H, W)
    at the input, ``rout`` (N, OH, OW) at the output (zero padding adds
    nothing). Then ``+ bias``. ``compute_mode`` is MegEngine's and changes
    nothing here. Composed of slices, masks and batched products: it
    differentiates (in ``inp``, ``weight`` and ``bias``) on every device.

    Example::

        >>> x = gc.tensor(np.arange(4.0, dtype="float32").reshape(1, 1, 2, 2))
        >>> w = gc.tensor(np.ones((1, 1, 1, 2, 2), "float32"))
        >>> rin = gc.tensor(np.array([[[1, 1], [2, 2]]], "int32"))     # top row region 1, bottom row 2
        >>> F.nn.region_restricted_conv(x, w, rin, gc.tensor(np.array([[[1]]], "int32"))).numpy()
        array([[[[1.]]]], dtype=float32)
        >>> F.nn.region_restricted_conv(x, w, rin, gc.tensor(np.array([[[2]]], "int32"))).numpy()
        array([[[[5.]]]], dtype=float32)
    """
    name = "region_restricted_conv"
    if conv_mode not in ("cross_correlation", "CROSS_CORRELATION"):
        raise ArgumentError(f"{name}: only conv_mode='cross_correlation' is supported, got {conv_mode!r}")
    x, w, ri, ro = _t(inp), _t(weight), _t(rin), _t(rout)
    g = _int_arg(name, "groups", groups, low=1)
    (sh, sw), (ph, pw), (dh, dw) = (_per_axis(name, what, v, 2, low) for what, v, low in
                                    (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)))
    if x.ndim != 4 or w.ndim != 5 or w.shape[0] != g or w.shape[0] * w.shape[2] != x.shape[1]:
        raise ArgumentError(f"{name}: inp must be (N, C, H, W) and weight (groups, O // groups, C // groups, "
                            f"KH, KW) with groups={g}, got shapes {x.shape} and {w.shape}")
    n, _, h, wd = x.shape
    _, ocg, icg, kh, kw = w.shape
    oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        raise ArgumentError(f"{name}: the kernel {(kh, kw)} (dilation {(dh, dw)}) does not fit inp {x.shape} "
                            f"padded by {(ph, pw)}")
    for what, r, shape in (("rin", ri, (n, h, wd)), ("rout", ro, (n, oh, ow))):
        if r.dtype.kind not in "iu" or r.shape != shape:
            raise ArgumentError(f"{name}: {what} must be an integer tensor of shape {shape}, got {r.dtype} "
                                f"of shape {r.shape}")
    xp = pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    rp = pad(ri, ((0, 0), (ph, ph), (pw, pw)))
    out = None
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)
            # the input under this kernel tap for every output, kept where the regions agree
            keep = expand_dims(rp[:, rows, cols] == ro, 1).astype(x.dtype)
            taps = reshape(xp[:, :, rows, cols] * keep, (n, g, icg, oh * ow))
            term = matmul(w[:, :, :, i, j], taps)           # (g, O/g, C/g) @ (N, g, C/g, OH*OW)
            out = term if out is None else out + term
    out = reshape(out, (n, g * ocg, oh, ow))
    return out if bias is None else out + bias


def local_conv2d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                 stride: Union[int, Sequence[int]] = 1, padding: Union[int, Sequence[int]] = 0,
                 dilation: Union[int, Sequence[int]] = 1, conv_mode: str = "cross_correlation") -> Tensor:
    """A locally connected layer (a convolution whose kernel differs at each
    output position), MegEngine's ``F.local_conv2d``: ``inp`` (N, C, H, W),
    ``weight`` (groups, OH, OW, C // groups, KH, KW, OC // groups) and
    ``out[n, g*OCg + o, y, x] = sum over c, i, j of window(n, g*Cg + c, y, x)[i, j]
    * weight[g, y, x, c, i, j, o]``, the windows those of ``F.sliding_window``
    (zero padding, stride, dilation; OH and OW must be the sizes they
    give); ``bias`` is added as given. One batched matmul per (group,
    position) over the windows, so gradients come from matmul's and the
    windows'.

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> w = gc.tensor(np.ones((1, 3, 3, 1, 2, 2, 1), "float32"))      # sums each 2x2 window
        >>> F.local_conv2d(x, w).numpy()[0, 0]
        array([[10., 14., 18.],
               [26., 30., 34.],
               [42., 46., 50.]], dtype=float32)
    """
    if str(conv_mode).lower() != "cross_correlation":
        raise ArgumentError(f"local_conv2d: conv_mode must be 'cross_correlation', got {conv_mode!r}")
    x, w = _t(inp), _t(weight)
    if x.ndim != 4 or w.ndim != 7:
        raise ArgumentError(f"local_conv2d: inp must be (N, C, H, W) and weight (groups, OH, OW, C // groups, "
                            f"KH, KW, OC // groups), got shapes {x.shape} and {w.shape}")
    g, oh, ow, cg, kh, kw, ocg = w.shape
    n, c = x.shape[:2]
    out, *_ = _window_index("local_conv2d", x.shape[2:], (kh, kw), padding, stride, dilation)
    if cg * g != c or out != (oh, ow):
        raise ArgumentError(f"local_conv2d: weight {w.shape} does not fit inp {x.shape}: it needs groups * "
                            f"{cg} == {c} channels and an output of {out} (OH, OW) for these kernel, padding, "
                            f"stride and dilation")
    windows = reshape(sliding_window(x, (kh, kw), padding, stride, dilation), (n, g, cg, oh, ow, kh, kw))
    # (g, OH, OW) positions as the batch: (N, Cg*KH*KW) @ (Cg*KH*KW, OCg) at each
    windows = reshape(windows.transpose(1, 3, 4, 0, 2, 5, 6), (g * oh * ow, n, cg * kh * kw))
    y = matmul(windows, reshape(w, (g * oh * ow, cg * kh * kw, ocg)))
    y = reshape(reshape(y, (g, oh, ow, n, ocg)).transpose(3, 0, 4, 1, 2), (n, g * ocg, oh, ow))
    return y if bias is None else y + bias


def deformable_conv2d(inp: Tensor, weight: Tensor, offset: Tensor, mask: Tensor, bias: Optional[Tensor] = None,
                      stride: Union[int, Sequence[int]] = 1, padding: Union[int, Sequence[int]] = 0,
                      dilation: Union[int, Sequence[int]] = 1, groups: int = 1,
                      conv_mode: str = "cross_correlation", compute_mode: str = "default") -> Tensor:
    """Modulated deformable convolution (DCNv2), MegEngine's
    ``F.deformable_conv2d``: ``inp`` (N, C, H, W), ``weight`` (O, C // groups,
    KH, KW) or MegEngine's grouped (groups, O // groups, C // groups, KH, KW),
    ``offset`` (N, 2 * DG * KH * KW, OH, OW) and ``mask`` (N, DG * KH * KW,
    OH, OW) for DG deformable groups (each a block of C // DG channels).
    Kernel tap ``k = i * KW + j`` of output position (y, x) reads the input
    at ``(y * stride - pad + i * dilation + offset[2k], x * stride - pad +
    j * dilation + offset[2k + 1])``, bilinearly interpolated (pixels
    outside the image count as 0; a point not inside (-1, H) x (-1, W) reads
    0), times ``mask[k]``. Composed of gathers and one batched matmul, so it
    runs on every device and differentiates in all of inp, weight, offset
    and mask. ``compute_mode`` is accepted for MegEngine's float16 accumulator
    switch; gradcore accumulates in the input's dtype.

    Example::

        >>> x = gc.tensor(np.arange(9, dtype="float32").reshape(1, 1, 3, 3))
        >>> w = gc.tensor(np.ones((1, 1, 1, 1), "float32"))
        >>> offset = gc.tensor(np.full((1, 2, 3, 3), 0.5, "float32"))      # every tap half a pixel down-right
        >>> F.deformable_conv2d(x, w, offset, F.ones((1, 1, 3, 3))).numpy()[0, 0]
        array([[2.  , 3.  , 1.75],
               [5.  , 6.  , 3.25],
               [3.25, 3.75, 2.  ]], dtype=float32)
    """
    name = "deformable_conv2d"
    if str(conv_mode).lower() != "cross_correlation":
        raise ArgumentError(f"{name}: conv_mode must be 'cross_correlation', got {conv_mode!r}")
    x, w, off, m = _t(inp), _t(weight), _t(offset, inp), _t(mask, inp)
    groups = _int_arg(name, "groups", groups, 1)
    if x.ndim != 4 or w.ndim not in (4, 5) or (w.ndim == 5 and w.shape[0] != groups):
        raise ArgumentError(f"{name}: inp must be (N, C, H, W) and weight (O, C // groups, KH, KW) or "
                            f"({groups}, O // groups, C // groups, KH, KW), got shapes {x.shape} and {w.shape}")
    if w.ndim == 5:
        w = reshape(w, (w.shape[0] * w.shape[1],) + w.shape[2:])
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    if cg * groups != c or oc % groups:
        raise ArgumentError(f"{name}: weight {tuple(weight.shape)} does not fit inp {x.shape} with groups={groups}: "
                            f"it needs groups * (C // groups) == C and O divisible by groups")
    (oh, ow), rows, cols, _, p = _window_index(name, (h, wd), (kh, kw), padding, stride, dilation)
    taps = kh * kw
    dg = off.shape[1] // (2 * taps) if off.ndim == 4 else 0
    if (off.ndim != 4 or dg < 1 or off.shape != (n, 2 * dg * taps, oh, ow) or c % dg
            or m.shape != (n, dg * taps, oh, ow)):
        raise ArgumentError(f"{name}: offset must be (N, 2 * DG * {taps}, {oh}, {ow}) and mask (N, DG * {taps}, "
                            f"{oh}, {ow}) with DG dividing {c} channels (inp {x.shape}, weight {tuple(weight.shape)}); "
                            f"got offset {off.shape} and mask {m.shape}")
    if off.dtype != x.dtype:
        off, m = astype(off, x.dtype), astype(m, x.dtype)
    # each tap's undeformed position in the unpadded image, (taps, OH, OW)
    base_y = np.broadcast_to(rows - p[0], (oh, ow, kh, kw)).transpose(2, 3, 0, 1).reshape(taps, oh, ow)
    base_x = np.broadcast_to(cols - p[1], (oh, ow, kh, kw)).transpose(2, 3, 0, 1).reshape(taps, oh, ow)
    off = reshape(off, (n, dg, taps, 2, oh, ow))
    ys = off[:, :, :, 0] + _t(base_y.astype(x.dtype), x)
    xs = off[:, :, :, 1] + _t(base_x.astype(x.dtype), x)
    y0, x0 = floor(stop_gradient(ys)), floor(stop_gradient(xs))
    fy, fx = ys - y0, xs - x0       # the bilinear weights carry the gradient to the offsets
    inside = stop_gradient(astype((ys > -1) * (xs > -1) * (ys < h) * (xs < wd), x.dtype))
    # one zero pixel around the image: every corner of a point inside
    # (-1, H) x (-1, W) is then a valid index, and reads 0 off the image
    pw = wd + 2
    flat = reshape(pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (n, dg, c // dg, (h + 2) * pw))
    length = taps * oh * ow
    sampled = None
    for dy in (0, 1):
        iy = clip(y0 + (1 + dy), 0, h + 1)
        wy = fy if dy else 1 - fy
        for dx in (0, 1):
            ix = clip(x0 + (1 + dx), 0, wd + 1)
            index = broadcast_to(reshape(astype(iy * pw + ix, "int32"), (n, dg, 1, length)), (n, dg, c // dg, length))
            term = gather(flat, 3, index) * reshape(wy * (fx if dx else 1 - fx), (n, dg, 1, length))
            sampled = term if sampled is None else sampled + term
    sampled = sampled * reshape(inside * reshape(m, (n, dg, taps, oh, ow)), (n, dg, 1, length))
    # (N, groups, Cg * taps, OH * OW) columns against (groups, O // groups, Cg * taps)
    columns = reshape(sampled, (n, groups, cg * taps, oh * ow))
    y = matmul(reshape(w, (1, groups, oc // groups, cg * taps)), columns)
    y = reshape(y, (n, oc, oh, ow))
    return y if bias is None else y + bias


def deformable_psroi_pooling(inp: Tensor, rois: Tensor, trans: Tensor, no_trans: bool, part_size: int,
                             pooled_h: int, pooled_w: int, sample_per_part: int, spatial_scale: float,
                             trans_std: float = 0.1) -> Tensor:
    """Deformable position-sensitive RoI pooling (Deformable R-FCN),
    MegEngine's ``F.deformable_psroi_pooling``: for each box of ``rois``
    (R, 5) as (image index, x1, y1, x2, y2) (the index truncated, the
    corners rounded, then scaled by ``spatial_scale``), each of the (pooled_h, pooled_w) bins of channel c
    is the mean of ``sample_per_part`` x ``sample_per_part`` bilinear samples
    of channel c of the box's image, spread over the bin from its top-left
    corner and shifted by ``trans_std * trans[r, (x, y), part]`` times the
    box's width and height (``part`` the bin's cell of a ``part_size`` x
    ``part_size`` grid; no shift when ``no_trans``). Samples more than half
    a pixel outside the image are left out (a bin with none is 0). ``trans``
    is (R' >= R, 2, pooled_h, pooled_w) (any 4-D array when ``no_trans``).
    Returns (R, C, pooled_h, pooled_w), as MegEngine's (its op's second
    output, the samples counted per bin, is dropped). Differentiable in
    ``inp`` and ``trans`` (first order only, as MegEngine's); ``rois`` get
    no gradient.

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> rois = gc.tensor([[0., 0, 0, 3, 3]])
        >>> trans = F.zeros((1, 2, 2, 2))
        >>> F.deformable_psroi_pooling(x, rois, trans, False, 2, 2, 2, 1, 1.0).numpy()
        array([[[[0. , 1.5],
                 [6. , 7.5]]]], dtype=float32)
    """
    x = _t(inp)
    r, t = _t(rois, x), _t(trans, x)
    # (MegEngine's op is float32 throughout: boxes and offsets take inp's dtype)
    if x.dtype.kind == "f":
        r = r if r.dtype == x.dtype else astype(r, x.dtype)
        t = t if t.dtype == x.dtype else astype(t, x.dtype)
    op = DeformablePSROIPooling(no_trans, part_size, pooled_h, pooled_w, sample_per_part, spatial_scale, trans_std)
    return _apply(op, x, r, t)[0]


def sliding_window_transpose(inp: Tensor, output_size: Union[int, Sequence[int]],
                             kernel_size: Union[int, Sequence[int]], padding: Union[int, Sequence[int]] = 0,
                             stride: Union[int, Sequence[int]] = 1, dilation: Union[int, Sequence[int]] = 1) -> Tensor:
    """The adjoint of ``sliding_window``: windows (N, C, OH, OW, KH, KW)
    summed back into an image (N, C, *output_size), where windows overlap
    too, MegEngine's ``F.sliding_window_transpose`` (PyTorch's ``fold``).

    Example::

        >>> w = F.sliding_window(gc.tensor(np.ones((1, 1, 3, 3), "float32")), 2)
        >>> w.shape
        (1, 1, 2, 2, 2, 2)
        >>> F.sliding_window_transpose(w, (3, 3), 2).numpy()[0, 0]     # how many windows cover each pixel
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
    padded = zeros(tuple(g.shape[:2]) + (hw[0] + 2 * p[0], hw[1] + 2 * p[1]), dtype=g.dtype, device=g.device)
    spec, arrays = split_index((slice(None), slice(None), rows, cols))
    # the scatter-add that is the gather's backward (overlapping windows add up)
    y = _apply(SubtensorGrad(spec), g, padded, *[_on(a, g) for a in arrays])[0]
    return y[:, :, p[0]:p[0] + hw[0], p[1]:p[1] + hw[1]]


def _one_per_channel(x, *params) -> bool:
    """Whether each of ``params`` is given with one element per channel of x."""
    if x.shape is None or x.ndim < 2:
        return False
    return all(p is not None and math.prod(np.shape(p) if not isinstance(p, Tensor) else p.shape) == x.shape[1]
               for p in params)


def _batch_norm_ops(x, running_mean, running_var, weight, bias, training, momentum, eps, inplace):
    """batch_norm with an affine weight and bias per channel, as the
    BatchNormTraining / BatchNormInference ops (cuDNN on a GPU)."""
    pshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    stats = (running_mean, running_var)
    given = [_t(t, x) for t in (weight, bias)] + ([] if training else [_t(t, x) for t in stats])
    dtype = np.result_type(x.dtype, *[t.dtype for t in given])
    x = x if x.dtype == dtype else astype(x, dtype)
    params = [t if t.shape == pshape else reshape(t, pshape) for t in
              (t if t.dtype == dtype else astype(t, dtype) for t in given)]
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
            if stat.shape != buf.shape:
                stat = stat.reshape(buf.shape)
            new = buf.detach() * momentum + stat * (1 - momentum)
            new_stats[k] = new if new.dtype == buf.dtype else new.astype(buf.dtype)
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
        size = math.prod(shape)
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
    x = _high_under_autocast(_t(inp))
    shape = tuple(_int_arg("layer_norm", "normalized_shape", d, low=1)
                  for d in _int_tuple("layer_norm", "normalized_shape", normalized_shape))
    if not shape or len(shape) > x.ndim or x.shape[x.ndim - len(shape):] != shape:
        raise ArgumentError(f"layer_norm: normalized_shape {shape} must be the trailing dimensions "
                         f"of inp, got inp shape {x.shape}")
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    if not affine:
        return _standardized(x, axes, eps)
    return _standardized_affine(x, axes, eps, _affine_param("layer_norm", "weight", weight, shape, x),
                                _affine_param("layer_norm", "bias", bias, shape, x))


def _high_under_autocast(x: Tensor) -> Tensor:
    """``x`` in gradcore.amp's high precision while autocast is on (MegEngine
    normalises layers and groups in it), else ``x``."""
    amp = autocast_dtypes()
    return x if amp is None or x.dtype == amp[1] else x.astype(amp[1])


def _standardized(x: Tensor, axes: tuple, eps: float) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over ``axes`` (biased variance): the
    layer, group, instance and general normalisations."""
    if x.dtype.kind == "f":
        # one op, its backward fused (ops/nn.py)
        return _apply(Standardize(tuple(a % x.ndim for a in axes), eps), x)[0]
    d = x - mean(x, axes, True)
    return d / sqrt(mean(d * d, axes, True) + eps)


def _standardized_affine(x: Tensor, axes: tuple, eps: float, w: Tensor, b: Tensor) -> Tensor:
    """``_standardized(x, axes, eps) * w + b``, one op (its kernel scales
    and shifts in the same pass) where x, w and b share a float dtype."""
    if x.dtype.kind == "f" and w.dtype == x.dtype and b.dtype == x.dtype and w.shape == b.shape:
        return _apply(StandardizeAffine(axes, eps), x, w, b)[0]
    return _standardized(x, axes, eps) * w + b


def _affine_param(name: str, what: str, t, shape: tuple, x: Tensor) -> Tensor:
    """An affine ``weight``/``bias`` reshaped to ``shape`` (it may come flat),
    or a clear error: None with ``affine=True``, or the wrong size."""
    if t is None:
        raise ArgumentError(f"{name}: affine=True needs {what} (give affine=False for none)")
    t = _t(t, x)
    if t.size != math.prod(shape):
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
    x = _high_under_autocast(_t(inp))
    g = _int_arg("group_norm", "num_groups", num_groups, low=1)
    if x.ndim < 2 or x.shape[1] % g:
        raise ArgumentError(f"group_norm: inp must be (N, C, ...) with C divisible by num_groups={g}, "
                         f"got shape {x.shape}")
    n, c = x.shape[:2]
    if not affine:
        grouped = reshape(x, (n, g, (c // g) * math.prod(x.shape[2:])))
        return reshape(_standardized(grouped, (2,), eps), x.shape)
    # (N, G, C/G, spatial) with the weight and bias (1, G, C/G, 1): each group's
    # channels are its rows' leading values, so the affine op scales them in its pass
    grouped = reshape(x, (n, g, c // g, math.prod(x.shape[2:])))
    per_channel = (1, g, c // g, 1)
    w = reshape(_affine_param("group_norm", "weight", weight, (c,), x), per_channel)
    b = reshape(_affine_param("group_norm", "bias", bias, (c,), x), per_channel)
    return reshape(_standardized_affine(grouped, (2, 3), eps, w, b), x.shape)


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
            head, tail = (Tensor(_host("pad", lambda w=w: np.full(out.shape[:axis] + (w,) + out.shape[axis + 1:],
                                                                  constant_value, x.dtype), pad_width=pad_width),
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

        >>> q = gc.tensor(np.ones((1, 3, 4), "float32"))
        >>> v = gc.tensor(np.arange(3, dtype="float32").reshape(1, 3, 1))
        >>> F.nn.scaled_dot_product_attention(q, q, v, is_causal=True).numpy()[0, :, 0]     # running means
        array([0. , 0.5, 1. ], dtype=float32)
    """
    name = "scaled_dot_product_attention"
    q, k, v = _t(query), _t(key), _t(value)
    _check_drop_prob(name, dropout_p)
    if is_causal and attn_mask is not None:
        raise ArgumentError(f"{name}: give attn_mask or is_causal, not both (PyTorch's rule)")
    keep, add = _split_mask(name, attn_mask, q, True)
    return _attention(q, k, v, keep, add, dropout_p, is_causal, scale, training, name)[0]


# ---- MegEngine's multi_head_attention: the flat io_weight_bias of its C++
# kernel (dnn/src/common/multi_head_attn), read here as views of one tensor
_MHA_BLOCKS = ("query weight", "key weight", "value weight", "out weight",
               "query bias", "key bias", "value bias", "out bias")


def _mha_block_shapes(embed_dim: int, kdim: int, vdim: int, num_heads: int, qproj_size: int, kproj_size: int,
                      vproj_size: int, oproj_size: int, qbias: bool, kbias: bool, vbias: bool,
                      obias: bool) -> list:
    """The shapes of io_weight_bias's eight blocks in their order (None for
    a block that is absent): weights (in, out), as ``y = x @ W + b``; the out
    weight reads the heads' concatenated values (vproj_size wide, or
    num_heads * vdim without a value projection); a bias exists only beside
    its weight. All weights come first, then the biases."""
    wo_in = vproj_size if vproj_size else num_heads * vdim
    return [(embed_dim, qproj_size) if qproj_size else None,
            (kdim, kproj_size) if kproj_size else None,
            (vdim, vproj_size) if vproj_size else None,
            (wo_in, oproj_size) if oproj_size else None,
            (qproj_size,) if qbias and qproj_size else None,
            (kproj_size,) if kbias and kproj_size else None,
            (vproj_size,) if vbias and vproj_size else None,
            (oproj_size,) if obias and oproj_size else None]


def _mha_check_sizes(name: str, E: int, kdim: int, H: int, sizes: list) -> None:
    """The projection sizes split into num_heads equal heads, and each head's
    query and key widths agree (MegEngine's checks)."""
    qp, kp, vp, _ = sizes
    for what, size in (("qproj_size", qp), ("kproj_size", kp), ("vproj_size", vp)):
        if size % H:
            raise ArgumentError(f"{name}: {what} {size} must be divisible by num_heads {H}")
    qk = (qp // H if qp else E, kp // H if kp else kdim)
    if qk[0] != qk[1]:
        raise ArgumentError(f"{name}: a head's query width {qk[0]} (qproj_size {qp}, embed_dim {E}) and "
                            f"key width {qk[1]} (kproj_size {kp}, kdim {kdim}) differ with num_heads {H}")


def _mha_split(name: str, io_weight_bias, shapes: list) -> list:
    """io_weight_bias (any shape, read flat) cut into its blocks: slices and
    reshapes of the one tensor, so each block's gradient lands in it."""
    need = int(np.sum([np.prod(s) for s in shapes if s is not None]))      # (F.nn's sum is a tensor op)
    if need == 0:
        return [None] * len(shapes)
    if io_weight_bias is None:
        raise ArgumentError(f"{name}: io_weight_bias is None but the projections need {need} values")
    w = _t(io_weight_bias)
    if w.size != need:
        have = ", ".join(f"{b} {s}" for b, s in zip(_MHA_BLOCKS, shapes) if s is not None)
        raise ArgumentError(f"{name}: io_weight_bias of shape {w.shape} has {w.size} values; {have} "
                            f"need {need}")
    flat, pos, blocks = reshape(w, (need,)), 0, []
    for s in shapes:
        if s is None:
            blocks.append(None)
            continue
        n = int(np.prod(s))
        blocks.append(reshape(flat[pos:pos + n], s))
        pos += n
    return blocks


def _float_mask(name: str, what: str, m, like: Tensor) -> Tensor:
    """A mask as MegEngine's additive form: bool True -> -inf (not attended),
    False -> 0; a float mask as it is, in the query's dtype."""
    m = _t(m, name=name) if not isinstance(m, Tensor) else m
    if m.dtype == np.bool_:
        return where(m, float("-inf"), zeros(m.shape, dtype=like.dtype, device=like.device))
    if m.dtype.kind != "f":
        raise TypeError(f"{name}: {what} must be bool or floating-point, got {m.dtype} of shape {m.shape}")
    return m if m.dtype == like.dtype else astype(m, like.dtype)


def _pad_keys(m: Tensor, s_full: int) -> Tensor:
    """Zero (attended) columns for the bias_k and zero-attention keys."""
    extra = s_full - m.shape[-1]
    if extra == 0:
        return m
    return concat([m, zeros(m.shape[:-1] + (extra,), dtype=m.dtype, device=m.device)], axis=-1)


def _mha_masks(name: str, attn_mask, key_padding_mask, is_causal: bool, q: Tensor, N: int, H: int, L: int,
               S: int, s_full: int) -> Optional[Tensor]:
    """attn_mask, key_padding_mask and is_causal merged into one additive
    mask broadcastable to (N, H, L, s_full), or None."""
    merged = None
    if attn_mask is not None:
        m = _float_mask(name, "attn_mask", attn_mask, q)
        ok_s = (S, s_full)
        if m.ndim == 2 and m.shape[0] == L and m.shape[1] in ok_s:
            m = _pad_keys(m, s_full)
        elif m.ndim == 3 and m.shape[:2] == (N * H, L) and m.shape[2] in ok_s:
            m = reshape(_pad_keys(m, s_full), (N, H, L, s_full))
        else:
            raise ArgumentError(f"{name}: attn_mask must be ({L}, {S}) or ({N * H}, {L}, {S}) (num_heads * batch "
                                f"first), got shape {m.shape}")
        merged = m
    elif is_causal:
        # MegEngine's default mask: -inf above the diagonal (key j > query i)
        keep = Tensor(np.tril(np.ones((L, S), bool)), device=q.device)
        merged = _pad_keys(_float_mask(name, "attn_mask", ~keep, q), s_full)
    if key_padding_mask is not None:
        kp = _float_mask(name, "key_padding_mask", key_padding_mask, q)
        if kp.ndim != 2 or kp.shape[0] != N or kp.shape[1] not in (S, s_full):
            raise ArgumentError(f"{name}: key_padding_mask must be ({N}, {S}), got shape {kp.shape}")
        kp = reshape(_pad_keys(kp, s_full), (N, 1, 1, s_full))
        merged = kp if merged is None else merged + kp
    return merged


def _cudnn_style_mask(name: str, attn_mask, key_padding_mask, N: int, L: int, S: int, like: Tensor):
    """MegEngine's cuDNN-style masks as (additive key mask (N, 1, L, S), query
    rows kept (N, 1, L, 1)): attn_mask (2, L) holds each query's window of
    keys [start, end), key_padding_mask (2, N) each sequence's query and key
    lengths."""
    if attn_mask is None or key_padding_mask is None:
        raise ArgumentError(f"{name}: maybe_cudnn_style_mask needs both attn_mask (2, {L}) and "
                            f"key_padding_mask (2, {N})")
    win, lens = (np.asarray(m.numpy() if isinstance(m, Tensor) else m) for m in (attn_mask, key_padding_mask))
    if win.shape != (2, L) or lens.shape != (2, N) or win.dtype.kind not in "iuf" or lens.dtype.kind not in "iuf":
        raise ArgumentError(f"{name}: cuDNN-style masks are attn_mask (2, {L}) and key_padding_mask (2, {N}) "
                            f"of integers, got {win.dtype} {win.shape} and {lens.dtype} {lens.shape}")
    lo, hi, len_q, len_k = win[0].astype(np.int64), win[1].astype(np.int64), lens[0], lens[1]
    if (lo < 0).any() or (lo >= hi).any() or (hi > S).any() or (len_q < 1).any() or (len_q > L).any() \
            or (len_k < 1).any() or (len_k > S).any():
        raise ArgumentError(f"{name}: cuDNN-style masks need 0 <= start < end <= {S} per query and lengths in "
                            f"[1, {L}] (queries) and [1, {S}] (keys), got windows {win.tolist()} and lengths "
                            f"{lens.tolist()}")
    j = np.arange(S)
    keep = (j >= lo[:, None]) & (j < hi[:, None])                       # (L, S)
    keep = keep[None] & (j[None, None] < len_k[:, None, None])          # (N, L, S)
    # a query row whose window is emptied by its key length keeps no key; it
    # is past the sequence only if len_q says so, else it is the user's error
    rows = np.arange(L)[None] < len_q[:, None]                          # (N, L)
    if (~keep.any(-1) & rows).any():
        raise ArgumentError(f"{name}: a query inside its sequence attends to no key (windows {win.tolist()}, "
                            f"key lengths {len_k.tolist()})")
    keep |= ~rows[..., None]          # rows past len_q: any finite scores (zeroed below)
    add = np.where(keep, 0.0, -np.inf).astype(like.dtype)[:, None]
    return Tensor(add, device=like.device), Tensor(rows[:, None, :, None].astype(like.dtype), device=like.device)


def _multi_head_attention(name: str, query, key, value, embed_dim: int, num_heads: int, attn_drop: float,
                          out_drop: float, blocks: list, proj: tuple, bias_k, bias_v, add_zero_attn: bool,
                          key_padding_mask, attn_mask, need_weights: bool, average_attn_weights: bool,
                          is_causal: bool, maybe_cudnn_style_mask: bool, reslink: bool, training: bool):
    """multi_head_attention on projection blocks already cut out: ``blocks``
    = (wq, wk, wv, wo, bq, bk, bv, bo), weights (in, out), None where
    absent; ``proj`` = (qproj_size, kproj_size, vproj_size, oproj_size)."""
    q, k, v = _t(query, name=name), _t(key, name=name), _t(value, name=name)
    for what, p in (("attn_drop", attn_drop), ("out_drop", out_drop)):
        _check_drop_prob(f"{name} {what}", p)
    H = _int_arg(name, "num_heads", num_heads, 1)
    unbatched = q.ndim == 2
    if unbatched and k.ndim == 2 and v.ndim == 2:
        # a batch of one; a 3-d attn_mask (num_heads, L, S) is already (1 * num_heads, L, S)
        q, k, v = expand_dims(q, 0), expand_dims(k, 0), expand_dims(v, 0)
        if key_padding_mask is not None and not maybe_cudnn_style_mask:
            key_padding_mask = expand_dims(_t(key_padding_mask, name=name), 0)
    q_in = q
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or q.shape[0] != k.shape[0] or k.shape[:2] != v.shape[:2] \
            or q.shape[2] != embed_dim:
        raise ArgumentError(f"{name}: expected query (N, L, {embed_dim}), key (N, S, kdim) and value (N, S, vdim) "
                            f"(or all three without N), got shapes {tuple(query.shape)}, {tuple(key.shape)}, "
                            f"{tuple(value.shape)}")
    if q.dtype.kind != "f":
        raise TypeError(f"{name}: needs floating-point inputs, got query {q.dtype} of shape {q.shape}")
    qp, kp, vp, op = proj
    wq, wk, wv, wo, bq, bk, bv, bo = blocks
    N, L, _ = q.shape
    S = k.shape[1]

    def project(x, w, b):
        y = x if w is None else matmul(x, w)
        return y if b is None else y + b
    q, k, v = project(q, wq, bq), project(k, wk, bk), project(v, wv, bv)
    have_bias_kv = bias_k is not None or bias_v is not None
    if have_bias_kv:
        if bias_k is None or bias_v is None:
            raise ArgumentError(f"{name}: give both bias_k and bias_v or neither")
        bias_k, bias_v = _t(bias_k, q, name), _t(bias_v, q, name)
        for what, b, x in (("bias_k", bias_k, k), ("bias_v", bias_v, v)):
            if b.shape != (1, 1, x.shape[2]):
                raise ArgumentError(f"{name}: {what} must be (1, 1, {x.shape[2]}) (the projected width), got "
                                    f"shape {b.shape}")
        # one more key and value, after the projection, at the end of the sequence
        k = concat([k, broadcast_to(bias_k, (N, 1, k.shape[2]))], axis=1)
        v = concat([v, broadcast_to(bias_v, (N, 1, v.shape[2]))], axis=1)
    if add_zero_attn:
        k = concat([k, zeros((N, 1, k.shape[2]), dtype=k.dtype, device=k.device)], axis=1)
        v = concat([v, zeros((N, 1, v.shape[2]), dtype=v.dtype, device=v.device)], axis=1)
    s_full = k.shape[1]

    def heads(x, projected):
        T, W = x.shape[1], x.shape[2]
        if projected:      # head h takes columns h*W/H .. (h+1)*W/H: (N, H, T, W/H)
            return transpose(reshape(x, (N, T, H, W // H)), (0, 2, 1, 3))
        return broadcast_to(expand_dims(x, 1), (N, H, T, W))    # no projection: every head sees all of x
    qh, kh, vh = heads(q, qp), heads(k, kp), heads(v, vp)

    rows = None
    if maybe_cudnn_style_mask and not have_bias_kv and not add_zero_attn:
        mask, rows = _cudnn_style_mask(name, attn_mask, key_padding_mask, N, L, S, q)
    else:
        mask = _mha_masks(name, attn_mask, key_padding_mask, is_causal, q, N, H, L, S, s_full)
    # MegEngine's scale: 1/sqrt(embed_dim // num_heads), 1/sqrt(embed_dim) without a query projection
    scale = (embed_dim if qp == 0 else embed_dim // H) ** -0.5
    z, attn = _attention(qh, kh, vh, None, mask, attn_drop, False, scale, training, name)
    if rows is not None:
        attn = attn * rows
    z = reshape(transpose(z, (0, 2, 1, 3)), (N, L, H * z.shape[3]))     # heads side by side
    out = project(z, wo, bo)
    if rows is not None:
        out = out * rows[:, 0]
    if out_drop and training:
        out = dropout(out, out_drop, True)
    if reslink:
        if out.shape != q_in.shape:
            raise ArgumentError(f"{name}: reslink adds the query {q_in.shape} to the output, which is {out.shape}")
        out = out + q_in
    weights = None
    if need_weights:
        weights = mean(attn, 1) if average_attn_weights else reshape(attn, (N * H, L, s_full))
    if unbatched:
        out = out[0]
        if weights is not None and average_attn_weights:
            weights = weights[0]
    return out, weights


def multi_head_attention(query: Tensor, key: Tensor, value: Tensor, embed_dim: int, num_heads: int,
                         attn_drop: float, out_drop: float, io_weight_bias: Optional[Tensor],
                         qproj_size: Optional[int] = None, kproj_size: Optional[int] = None,
                         vproj_size: Optional[int] = None, oproj_size: Optional[int] = None,
                         qbias: bool = False, kbias: bool = False, vbias: bool = False, obias: bool = False,
                         bias_k: Optional[Tensor] = None, bias_v: Optional[Tensor] = None,
                         add_zero_attn: bool = False, key_padding_mask: Optional[Tensor] = None,
                         attn_mask: Optional[Tensor] = None, need_weights: bool = False,
                         average_attn_weights: bool = False, is_causal: bool = False,
                         maybe_cudnn_style_mask: bool = False, reslink: bool = False,
                         training: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
    """MegEngine's ``F.nn.multi_head_attention``: attention of query (N, L,
    embed_dim) over key (N, S, kdim) and value (N, S, vdim) (or all three
    without N) with ``num_heads`` heads, every projection read from one flat
    ``io_weight_bias``. Returns ``(output, weights)``, weights None unless
    ``need_weights``.

    ``io_weight_bias`` (any shape, read flat) holds, back to back and each
    only where it exists: the query, key, value and out weights, then the
    query, key, value and out biases. Weights are (in, out), ``y = x @ W +
    b`` (PyTorch's are the transposes): query (embed_dim, qproj_size), key
    (kdim, kproj_size), value (vdim, vproj_size), out (vproj_size, or
    num_heads * vdim without a value projection, oproj_size). A ``*proj_size``
    of None means embed_dim, 0 means no projection (no weight, no bias): the
    input then goes whole to every head. A bias exists where ``qbias`` ...
    ``obias`` say so. Head h takes columns h*P/H .. (h+1)*P/H of a projection
    P wide; the scale is 1/sqrt(embed_dim // num_heads) (1/sqrt(embed_dim)
    with qproj_size 0); the heads' outputs go side by side into the out
    projection (the output is oproj_size wide, or the heads' width without it).

    ``bias_k``/``bias_v`` (1, 1, projected width), given together, are one
    more key and value appended to the sequence after the projections;
    ``add_zero_attn`` appends a zero key and value after them. Masks (True
    or -inf: not attended; a float mask is added to the scores):
    ``attn_mask`` (L, S) or (N * num_heads, L, S), ``key_padding_mask`` (N,
    S); their columns for the appended keys are zeros (the masks may also
    cover them, S + 1 or S + 2 wide). ``is_causal`` without ``attn_mask``
    masks key j > query i; with one it is a hint and ``attn_mask`` is used.
    ``maybe_cudnn_style_mask``: attn_mask (2, L) holds each query's key
    window [start, end) and key_padding_mask (2, N) each sequence's query
    and key lengths (rows past a query length give zeros). ``reslink`` adds
    the query to the output (after the out dropout). While ``training``,
    ``attn_drop`` drops attention weights and ``out_drop`` the output.

    Weights: per head (N * num_heads, L, S'), softmax's output (after its
    dropout), or with ``average_attn_weights`` their mean over heads (N, L,
    S'); S' counts the appended keys. A composition of differentiable ops:
    gradients of every order for every input, on every device.

    Example::

        >>> E, H = 4, 2
        >>> w = gc.tensor(np.random.default_rng(0).standard_normal(4 * E * E + 4 * E), "float32")
        >>> x = gc.tensor(np.ones((2, 3, E), "float32"))
        >>> out, weights = F.nn.multi_head_attention(x, x, x, E, H, 0.0, 0.0, w, qbias=True, kbias=True,
        ...                                          vbias=True, obias=True, need_weights=True)
        >>> out.shape, weights.shape
        ((2, 3, 4), (4, 3, 3))
    """
    name = "multi_head_attention"
    E = _int_arg(name, "embed_dim", embed_dim, 1)
    sizes = [E if s is None else _int_arg(name, what, s) for what, s in
             (("qproj_size", qproj_size), ("kproj_size", kproj_size), ("vproj_size", vproj_size),
              ("oproj_size", oproj_size))]
    for what, on, s in (("qbias", qbias, sizes[0]), ("kbias", kbias, sizes[1]), ("vbias", vbias, sizes[2]),
                        ("obias", obias, sizes[3])):
        if on and not s:
            raise ArgumentError(f"{name}: {what} needs its projection ({what[0]}proj_size > 0)")
    kdim, vdim = (x.shape[-1] if hasattr(x, "shape") and len(x.shape) else 0 for x in (key, value))
    H = _int_arg(name, "num_heads", num_heads, 1)
    _mha_check_sizes(name, E, kdim, H, sizes)
    shapes = _mha_block_shapes(E, kdim, vdim, H, *sizes,
                               bool(qbias), bool(kbias), bool(vbias), bool(obias))
    blocks = _mha_split(name, io_weight_bias, shapes)
    return _multi_head_attention(name, query, key, value, E, num_heads, attn_drop, out_drop, blocks,
                                 tuple(sizes), bias_k, bias_v, bool(add_zero_attn), key_padding_mask, attn_mask,
                                 bool(need_weights), bool(average_attn_weights), bool(is_causal),
                                 bool(maybe_cudnn_style_mask), bool(reslink), bool(training))
