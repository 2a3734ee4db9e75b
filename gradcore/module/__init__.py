"""gradcore.module (``M``): MegEngine's layers.

Module, Sequential, Identity, Linear, Conv1d, Conv2d, ConvRelu2d, ConvBn2d,
ConvBnRelu2d, Conv3d, ConvTranspose2d, ConvTranspose3d, RegionRestrictedConv, MaxPool2d, AvgPool2d, Pad, PixelShuffle,
AdaptiveMaxPool2d, AdaptiveAvgPool2d, Flatten, BatchNorm1d, BatchNorm2d, SyncBatchNorm,
SlidingWindow, SlidingWindowTranspose, BatchMatMulActivation, QuantStub, DequantStub,
LayerNorm, GroupNorm, InstanceNorm, Dropout, Embedding, DeformableConv2d, DeformablePSROIPooling, Resize, Remap,
and the activations
ReLU, Sigmoid, SiLU, GELU, LeakyReLU, PReLU, Softmax.

Example::

    >>> import gradcore.module as M
    >>> net = M.Sequential(M.Linear(4, 8), M.ReLU(), M.Linear(8, 2))
    >>> [name for name, _ in net.named_parameters()]
    ['0.bias', '0.weight', '2.bias', '2.weight']
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Tuple, Union

import numpy as np

from .. import functional as F
from .._core import Tensor
from ..tensor import Parameter
from . import init  # noqa: F401  (M.init, as in MegEngine)
from .attention import MultiHeadAttention  # noqa: F401
from .augment import (ActiveBlur, AdditiveElemwise, AdditiveGaussianNoise, AdditiveLaplaceNoise,  # noqa: F401
                      AdditivePoissonNoise, CropAndPad, Cutmix, Dilation, Emboss, FillPoly, Flip, GaussianBlur,
                      LinearContrast, Mixup, RandomHorizontalFlip, RandomVerticalFlip, Rot90, Rotate, Sharpen)
from .conv import (Conv1d, Conv2d, Conv3d, ConvRelu2d, ConvTranspose2d, ConvTranspose3d,  # noqa: F401
                   ConvTransposeRelu2d, DeformableConv2d, LocalConv2d, RegionRestrictedConv)
from .linear import Linear, LinearRelu  # noqa: F401
from .vision import DeformablePSROIPooling, Remap, Resize  # noqa: F401
from .module import HookHandler, Module, _count  # noqa: F401
from .rnn import GRU, GRUCell, LSTM, LSTMCell, RNN, RNNCell  # noqa: F401
from ..op import ArgumentError


class Identity(Module):
    """Returns its input unchanged (a placeholder layer).

    Example::

        >>> x = gc.tensor([1.0, 2.0])
        >>> M.Identity()(x) is x
        True
    """

    def forward(self, x):
        return x


class Sequential(Module):
    """Layers applied in order; given positionally they are named "0", "1",
    ..., given as an (Ordered)dict they keep its keys. Indexing, slicing (a
    new Sequential), ``len`` and iteration work as on a list.

    Example::

        >>> net = M.Sequential(M.Linear(2, 4), M.ReLU(), M.Linear(4, 1))
        >>> [n for n, _ in net.named_parameters()]
        ['0.bias', '0.weight', '2.bias', '2.weight']
    """

    def __init__(self, *layers, **kwargs):
        super().__init__(**kwargs)
        if len(layers) == 1 and isinstance(layers[0], dict):
            items = [(str(k), m) for k, m in layers[0].items()]
        else:
            items = [(str(i), m) for i, m in enumerate(layers)]
        self.layer_keys = []
        for key, module in items:
            if not callable(module):
                raise TypeError(f"Sequential: layer {key!r} is not callable: {module!r}")
            if key in vars(self) or hasattr(type(self), key):
                raise ArgumentError(f"Sequential: layer name {key!r} clashes with an attribute of Sequential")
            setattr(self, key, module)
            self.layer_keys.append(key)

    @property
    def layer_values(self):
        return [getattr(self, k) for k in self.layer_keys]

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)(OrderedDict(zip(self.layer_keys[idx], self.layer_values[idx])))
        return getattr(self, self.layer_keys[idx])

    def __setitem__(self, idx, module):
        setattr(self, self.layer_keys[idx], module)

    def __delitem__(self, idx):
        keys = self.layer_keys[idx] if isinstance(idx, slice) else [self.layer_keys[idx]]
        for key in keys:
            delattr(self, key)
            self.layer_keys.remove(key)

    def __len__(self):
        return len(self.layer_keys)

    def __iter__(self):
        return iter(self.layer_values)

    def forward(self, x):
        for layer in self.layer_values:
            x = layer(x)
        return x


class MaxPool2d(Module):
    """``F.max_pool2d`` as a layer (stride defaults to kernel_size).

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> M.MaxPool2d(2)(x).numpy()
        array([[[[ 5.,  7.],
                 [13., 15.]]]], dtype=float32)
    """

    def __init__(self, kernel_size, stride=None, padding=0, **kwargs):
        super().__init__(**kwargs)
        # MegEngine keeps the stride it will use: kernel_size when none is given
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
        from ..ops.pool import MaxPool2d as _op
        _op(kernel_size, self.stride, padding)      # bad sizes fail here, named, not at the first call

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def _module_info_string(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(Module):
    """``F.avg_pool2d`` as a layer (stride defaults to kernel_size).

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> M.AvgPool2d(2)(x).numpy()
        array([[[[ 2.5,  4.5],
                 [10.5, 12.5]]]], dtype=float32)
    """

    def __init__(self, kernel_size, stride=None, padding=0, mode: str = "average_count_exclude_padding",
                 **kwargs):
        super().__init__(**kwargs)
        self.kernel_size, self.stride, self.padding, self.mode = kernel_size, stride or kernel_size, padding, mode
        from ..ops.pool import AvgPool2d as _op
        _op(kernel_size, self.stride, padding, mode)     # bad sizes or mode fail here, named

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.mode)

    def _module_info_string(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, mode={self.mode}")


class _AdaptivePool2d(Module):
    def __init__(self, oshp: Union[int, Tuple[int, int]], **kwargs):
        super().__init__(**kwargs)
        self.oshp = oshp

    def _module_info_string(self):
        return f"oshp={self.oshp}"


class AdaptiveMaxPool2d(_AdaptivePool2d):
    """Max pooling of (N, C, H, W) input to the output size ``oshp`` (an int
    or (OH, OW)): ``F.nn.adaptive_max_pool2d`` as a layer.

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> M.AdaptiveMaxPool2d((2, 2))(x).numpy()
        array([[[[ 5.,  7.],
                 [13., 15.]]]], dtype=float32)
    """

    def forward(self, x):
        return F.nn.adaptive_max_pool2d(x, self.oshp)


class AdaptiveAvgPool2d(_AdaptivePool2d):
    """Average pooling of (N, C, H, W) input to the output size ``oshp`` (an
    int or (OH, OW)): ``F.nn.adaptive_avg_pool2d`` as a layer.

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> M.AdaptiveAvgPool2d(1)(x).numpy()     # (N, C, H, W) -> (N, C, 1, 1)
        array([[[[7.5]]]], dtype=float32)
    """

    def forward(self, x):
        return F.nn.adaptive_avg_pool2d(x, self.oshp)


class Flatten(Module):
    """``F.flatten(x, start_axis, end_axis)``; by default keeps the batch axis.

    Example::

        >>> M.Flatten()(gc.tensor(np.zeros((2, 3, 4, 5), "float32"))).shape     # from axis 1 on
        (2, 60)
    """

    def __init__(self, start_axis: int = 1, end_axis: int = -1, **kwargs):
        super().__init__(**kwargs)
        self.start_axis, self.end_axis = start_axis, end_axis

    def forward(self, x):
        return F.flatten(x, self.start_axis, self.end_axis)


class _AffineNorm(Module):
    """A normalisation followed, when ``affine``, by a learnt ``* weight +
    bias`` (starting at ones and zeros)."""

    def _affine(self, shape, affine: bool) -> None:
        self.affine = affine
        self.weight = Parameter(np.ones(shape, "float32")) if affine else None
        self.bias = Parameter(np.zeros(shape, "float32")) if affine else None

    def reset_parameters(self) -> None:
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)


class _BatchNorm(_AffineNorm):
    """Batch normalisation with running statistics, MegEngine's convention:
    ``running = momentum * running + (1 - momentum) * batch`` (so the default
    ``momentum=0.9`` is PyTorch's 0.1), the running variance unbiased.
    Parameters and statistics have shape (1, C, 1, 1); ``state_dict`` stores
    them flat. In eval() the running statistics normalise; without
    ``track_running_stats`` the batch statistics always do. ``freeze`` uses
    the running statistics and fixed weight and bias even in training."""

    _state_dict_flat = True

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.9,
                 affine: bool = True, track_running_stats: bool = True, freeze: bool = False, **kwargs):
        super().__init__(**kwargs)
        if freeze and not track_running_stats:
            raise ArgumentError(f"{type(self).__name__}: freeze needs track_running_stats=True")
        self.num_features = _count(type(self).__name__, "num_features", num_features, 1)
        self.eps, self.momentum = eps, momentum
        self.track_running_stats, self.freeze = track_running_stats, freeze
        # statistics exist only when tracked from the start; turning tracking
        # off later is allowed (batch statistics are used), turning it on is not
        self._track_running_stats_saved = track_running_stats
        shape = (1, self.num_features, 1, 1)
        self._affine(shape, affine)
        if track_running_stats:
            self.running_mean = Tensor(np.zeros(shape, "float32"))
            self.running_var = Tensor(np.ones(shape, "float32"))
        else:
            self.running_mean = self.running_var = None

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            init.zeros_(self.running_mean)
            init.ones_(self.running_var)

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        super().reset_parameters()

    def _check_input(self, x):
        raise NotImplementedError

    def forward(self, x):
        if not isinstance(x, Tensor):
            x = F._t(x, name=type(self).__name__)
        self._check_input(x)
        if self.track_running_stats and not getattr(self, "_track_running_stats_saved", True):
            raise ArgumentError(f"{type(self).__name__}: track_running_stats was False at construction "
                             f"(no running statistics exist) and cannot be turned on later")
        if x.size == 0:
            # an empty batch: nothing to normalise and no statistics to update
            # (their mean would be NaN); the empty input comes back, as a copy
            return F.copy(x)
        shape = x.shape
        if isinstance(self, BatchNorm1d) and not self.freeze and (self.training or not self.track_running_stats) \
                and x.size // shape[1] == 1:
            # batch statistics of one value per channel: zeros; PyTorch refuses it
            # (BatchNorm1d only: MegEngine's own tests run BatchNorm2d on (1, C, 1, 1))
            raise ArgumentError(f"{type(self).__name__}: expected more than 1 value per channel when "
                             f"training, got input of shape {shape}")
        if x.ndim != 4:     # (N, C) or (N, C, L): normalised as (N, C, L, 1)
            x = x.reshape((shape[0], shape[1], -1, 1))
        if self.freeze:
            # running statistics and fixed affine parameters, nothing updated
            scale = (self.running_var + self.eps) ** -0.5
            if self.weight is not None:
                scale = scale * self.weight.detach()
            shift = -self.running_mean * scale
            if self.bias is not None:
                shift = shift + self.bias.detach()
            y = x * scale + shift
        else:
            # without tracking, batch statistics in train and eval alike, and
            # the running statistics (if any) are left alone
            track = self.track_running_stats
            y = self._normalize(x, self.running_mean if track else None, self.running_var if track else None,
                                self.weight, self.bias, training=self.training or not track,
                                momentum=self.momentum, eps=self.eps)
        return y if y.shape == shape else y.reshape(shape)

    _normalize = staticmethod(F.batch_norm)

    def _module_info_string(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of (N, C, H, W) inputs (see ``_BatchNorm``).

    Example::

        >>> bn = M.BatchNorm2d(16)
        >>> x = gc.tensor(np.random.default_rng(0).normal(2.0, 1.0, (4, 16, 5, 5)).astype("float32"))
        >>> y = bn(x)     # training: normalised with the batch's statistics
        >>> y.shape, bool(abs(y.numpy().mean()) < 1e-5), bn.running_mean.shape
        ((4, 16, 5, 5), True, (1, 16, 1, 1))
    """

    def _check_input(self, x):
        if x.ndim != 4 or x.shape[1] != self.num_features:
            raise ArgumentError(f"BatchNorm2d({self.num_features}): expected input (N, {self.num_features}, H, W), "
                             f"got shape {x.shape}")


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of (N, C) or (N, C, L) inputs (see ``_BatchNorm``).

    Example::

        >>> bn = M.BatchNorm1d(2)
        >>> y = bn(gc.tensor([[1.0, 0.0], [3.0, 8.0]]))     # training: the batch's statistics
        >>> y.numpy().round(4)
        array([[-1., -1.],
               [ 1.,  1.]], dtype=float32)
        >>> bn.running_mean.numpy().flatten()     # 0.9 * 0 + 0.1 * the batch mean
        array([0.2, 0.4], dtype=float32)
    """

    def _check_input(self, x):
        if x.ndim not in (2, 3) or x.shape[1] != self.num_features:
            raise ArgumentError(f"BatchNorm1d({self.num_features}): expected input (N, {self.num_features}) or "
                             f"(N, {self.num_features}, L), got shape {x.shape}")


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation whose training statistics are those of the whole
    batch across the ranks of ``group`` (``gradcore.distributed``'s WORLD
    when None), MegEngine's ``M.SyncBatchNorm``: (N, C), (N, C, L) or (N,
    C, H, W) inputs; one process normalises as ``BatchNorm2d`` does.
    ``eps_mode`` "max" uses max(var, eps) instead of var + eps.

    Example::

        >>> bn = M.SyncBatchNorm(2)     # in one process: BatchNorm2d
        >>> bn(gc.tensor([[[[1.0]], [[0.0]]], [[[3.0]], [[4.0]]]])).numpy().round(4)[:, :, 0, 0]
        array([[-1., -1.],
               [ 1.,  1.]], dtype=float32)
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.9, affine: bool = True,
                 track_running_stats: bool = True, freeze: bool = False, group=None, eps_mode: str = "additive",
                 **kwargs):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, freeze, **kwargs)
        self.group, self.eps_mode = group, eps_mode

    def _check_input(self, x):
        if x.ndim not in (2, 3, 4) or x.shape[1] != self.num_features:
            raise ArgumentError(f"SyncBatchNorm({self.num_features}): expected input (N, {self.num_features}), "
                                f"(N, {self.num_features}, L) or (N, {self.num_features}, H, W), got shape {x.shape}")

    def _normalize(self, x, running_mean, running_var, weight, bias, training, momentum, eps):
        return F.nn.sync_batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps,
                                    self.eps_mode, self.group)


class _BnBlock(Module):
    """A layer (the attribute ``_layer`` names) then its BatchNorm (``bn``),
    and a ReLU when ``_relu``: MegEngine's fused blocks, one forward."""
    _layer = ""
    _relu = False

    def forward(self, x):
        y = self.bn(getattr(self, self._layer)(x))
        return F.relu(y) if self._relu else y


class _ConvBn2d(_BnBlock):
    """A Conv2d (``conv``) and a BatchNorm2d (``bn``) as one layer, MegEngine's
    fused modules: their arguments and parameter names (``conv.weight``,
    ``conv.bias``, ``bn.weight``, ``bn.bias``, ``bn.running_mean``, ...)."""
    _layer = "conv"

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, conv_mode: str = "cross_correlation",
                 compute_mode: str = "default", eps: float = 1e-5, momentum: float = 0.9, affine: bool = True,
                 track_running_stats: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.conv = Conv2d(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                           conv_mode, compute_mode)
        self.bn = BatchNorm2d(out_channels, eps, momentum, affine, track_running_stats)


class ConvBn2d(_ConvBn2d):
    """Conv2d then BatchNorm2d, MegEngine's ``M.ConvBn2d``.

    Example::

        >>> block = M.ConvBn2d(3, 8, 3, padding=1)
        >>> sorted(block.state_dict())[:3]
        ['bn.bias', 'bn.running_mean', 'bn.running_var']
    """


class ConvBnRelu2d(_ConvBn2d):
    """Conv2d, BatchNorm2d, then ReLU, MegEngine's ``M.ConvBnRelu2d``.

    Example::

        >>> x = gc.tensor(np.ones((2, 3, 8, 8), "float32"))
        >>> y = M.ConvBnRelu2d(3, 8, 3)(x)
        >>> y.shape, bool((y.numpy() >= 0).all())
        ((2, 8, 6, 6), True)
    """
    _relu = True


class _ConvTransposeBn2d(_BnBlock):
    """A ConvTranspose2d (``conv_transpose2d``) and a BatchNorm2d (``bn``) as
    one layer, MegEngine's fused modules: their arguments and parameter names."""
    _layer = "conv_transpose2d"

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, conv_mode: str = "cross_correlation",
                 compute_mode: str = "default", eps: float = 1e-5, momentum: float = 0.9, affine: bool = True,
                 track_running_stats: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.conv_transpose2d = ConvTranspose2d(in_channels, out_channels, kernel_size, stride, padding,
                                                output_padding, dilation, groups, bias, conv_mode, compute_mode)
        self.bn = BatchNorm2d(out_channels, eps, momentum, affine, track_running_stats)


class ConvTransposeBn2d(_ConvTransposeBn2d):
    """ConvTranspose2d then BatchNorm2d, MegEngine's ``M.ConvTransposeBn2d``.

    Example::

        >>> sorted(M.ConvTransposeBn2d(8, 4, 3).state_dict())[-2:]
        ['conv_transpose2d.bias', 'conv_transpose2d.weight']
    """


class ConvTransposeBnRelu2d(_ConvTransposeBn2d):
    """ConvTranspose2d, BatchNorm2d, then ReLU, MegEngine's ``M.ConvTransposeBnRelu2d``.

    Example::

        >>> x = gc.tensor(np.ones((2, 8, 4, 4), "float32"))
        >>> y = M.ConvTransposeBnRelu2d(8, 4, 3)(x)
        >>> y.shape, bool((y.numpy() >= 0).all())
        ((2, 4, 6, 6), True)
    """
    _relu = True


class _LinearBn1d(_BnBlock):
    """A Linear (``linear``) and a BatchNorm1d (``bn``) as one layer,
    MegEngine's fused modules: their arguments and parameter names (and,
    as there, a ``bias`` of the block itself that the forward does not use,
    so that MegEngine's state_dicts load)."""
    _layer = "linear"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, compute_mode: str = "default",
                 eps: float = 1e-5, momentum: float = 0.9, affine: bool = True, track_running_stats: bool = True,
                 **kwargs):
        super().__init__(**kwargs)
        self.in_features, self.out_features = in_features, out_features
        self.bias = Parameter(np.zeros((out_features,), "float32")) if bias else None
        self.linear = Linear(in_features, out_features, bias, compute_mode)
        self.bn = BatchNorm1d(out_features, eps, momentum, affine, track_running_stats)


class LinearBn1d(_LinearBn1d):
    """Linear then BatchNorm1d, MegEngine's ``M.LinearBn1d``.

    Example::

        >>> x = gc.tensor(np.random.default_rng(0).normal(size=(5, 4)).astype("float32"))
        >>> M.LinearBn1d(4, 3)(x).shape
        (5, 3)
    """


class LinearBnRelu1d(_LinearBn1d):
    """Linear, BatchNorm1d, then ReLU, MegEngine's ``M.LinearBnRelu1d``.

    Example::

        >>> x = gc.tensor(np.random.default_rng(0).normal(size=(5, 4)).astype("float32"))
        >>> y = M.LinearBnRelu1d(4, 3)(x)
        >>> y.shape, bool((y.numpy() >= 0).all())
        ((5, 3), True)
    """
    _relu = True


# MegEngine's Elemwise mode names (lower case) that are not F's function names
_ELEMWISE_MODES = {
    "h_swish": F.hswish, "h_sigmoid": F.hsigmoid, "true_div": F.div, "max": F.maximum, "min": F.minimum,
    "negate": F.neg, "leq": F.le, "neq": F.ne, "fast_tanh": F.tanh,
    "switch_gt0": lambda x, y: F.where(x > 0, y, 0.0),
    "fuse_add_relu": lambda x, y: F.relu(x + y), "fuse_add_sigmoid": lambda x, y: F.sigmoid(x + y),
    "fuse_add_tanh": lambda x, y: F.tanh(x + y), "fuse_add_h_swish": lambda x, y: F.hswish(x + y),
    "fuse_mul_add3": lambda x, y, z: x * y + z, "fuse_mul_add4": lambda x, y, z, w: x * y + z * w,
}


class Elemwise(Module):
    """An elementwise function by its MegEngine mode name (``method``, any
    case: "add", "relu", "h_swish", "true_div", "fuse_add_relu", ...) or
    F's name for it, MegEngine's ``M.Elemwise``.

    Example::

        >>> M.Elemwise("add")(gc.tensor([1.0]), gc.tensor([2.0])).numpy()
        array([3.], dtype=float32)
    """

    def __init__(self, method: str, **kwargs):
        super().__init__(**kwargs)
        name = method.lower() if isinstance(method, str) else method
        fn = _ELEMWISE_MODES.get(name) or (getattr(F, name, None) if isinstance(name, str) else None)
        if fn is None or not callable(fn):
            raise ArgumentError(f"Elemwise: no elementwise function named {method!r}")
        self.method, self._fn = method, fn

    def forward(self, *inps):
        return self._fn(*inps)


class Concat(Module):
    """``F.concat`` as a module, MegEngine's ``M.Concat``.

    Example::

        >>> M.Concat()([gc.tensor([1.0]), gc.tensor([2.0])]).numpy()
        array([1., 2.], dtype=float32)
    """

    def forward(self, inps, axis: int = 0):
        return F.concat(inps, axis)


class Pad(Module):
    """Pads its input, MegEngine's ``M.Pad``: ``F.nn.pad`` with
    ``pad_width`` ((before, after) per leading axis), ``mode`` ("constant",
    "reflect", "replicate") and ``constant_val``.

    Example::

        >>> M.Pad(((1, 1),))(gc.tensor([[1.0, 2.0]])).numpy()
        array([[0., 0.],
               [1., 2.],
               [0., 0.]], dtype=float32)
    """

    def __init__(self, pad_width, mode: str = "constant", constant_val: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.pad_width, self.mode, self.pad_val = pad_width, mode, constant_val

    def forward(self, x):
        return F.nn.pad(x, self.pad_width, self.mode, self.pad_val)


class PixelShuffle(Module):
    """(*, C * r * r, H, W) -> (*, C, H * r, W * r) for r = ``upscale_factor``,
    MegEngine's ``M.PixelShuffle`` (``F.nn.pixel_shuffle``).

    Example::

        >>> M.PixelShuffle(2)(gc.tensor(np.zeros((1, 8, 3, 3), "float32"))).shape
        (1, 2, 6, 6)
    """

    def __init__(self, upscale_factor: int, **kwargs):
        super().__init__(**kwargs)
        self.upscale_factor = upscale_factor

    def forward(self, x):
        return F.nn.pixel_shuffle(x, self.upscale_factor)


class SlidingWindow(Module):
    """The sliding blocks of (N, C, H, W) images, MegEngine's
    ``M.SlidingWindow`` (``F.sliding_window``).

    Example::

        >>> M.SlidingWindow(2)(gc.tensor(np.zeros((1, 1, 3, 3), "float32"))).shape
        (1, 1, 2, 2, 2, 2)
    """

    def __init__(self, kernel_size, padding=0, stride=1, dilation=1, **kwargs):
        super().__init__(**kwargs)
        self.kernel_size, self.padding, self.stride, self.dilation = kernel_size, padding, stride, dilation

    def forward(self, inp):
        return F.sliding_window(inp, self.kernel_size, self.padding, self.stride, self.dilation)


class SlidingWindowTranspose(Module):
    """Blocks summed back into (N, C, *output_size) images, MegEngine's
    ``M.SlidingWindowTranspose`` (``F.sliding_window_transpose``).

    Example::

        >>> M.SlidingWindowTranspose((3, 3), 2)(gc.tensor(np.ones((1, 1, 2, 2, 2, 2), "float32"))).shape
        (1, 1, 3, 3)
    """

    def __init__(self, output_size, kernel_size, padding=0, stride=1, dilation=1, **kwargs):
        super().__init__(**kwargs)
        self.output_size, self.kernel_size = output_size, kernel_size
        self.padding, self.stride, self.dilation = padding, stride, dilation

    def forward(self, inp):
        return F.sliding_window_transpose(inp, self.output_size, self.kernel_size, self.padding, self.stride,
                                          self.dilation)


class BatchMatMulActivation(Module):
    """``weight @ x (+ bias)`` with a weight per batch element (batch,
    out_features, in_features), then ReLU when ``nonlinear_mode`` is
    "relu", MegEngine's ``M.BatchMatMulActivation`` (its initialisation:
    weight N(0, 1 / in_features), bias 0).

    Example::

        >>> M.BatchMatMulActivation(2, 3, 4)(gc.tensor(np.ones((2, 3, 4), "float32"))).shape
        (2, 4, 4)
    """

    def __init__(self, batch: int, in_features: int, out_features: int, bias: bool = True,
                 nonlinear_mode: str = "identity", **kwargs):
        super().__init__(**kwargs)
        self.batch, self.in_features, self.out_features = batch, in_features, out_features
        self.nonlinear_mode = nonlinear_mode.lower()
        if self.nonlinear_mode not in ("identity", "relu"):
            raise ArgumentError(f"BatchMatMulActivation: nonlinear_mode must be 'identity' or 'relu', "
                                f"got {nonlinear_mode!r}")
        self.weight = Parameter(np.zeros((batch, out_features, in_features), "float32"))
        self.bias = Parameter(np.zeros((out_features,), "float32")) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.normal_(self.weight, 0.0, float(np.sqrt(1 / self.in_features)))
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x):
        y = F.matmul(self.weight, x)
        if self.bias is not None:
            y = y + self.bias       # (along the last axis, as MegEngine's: x (batch, in, out))
        return F.relu(y) if self.nonlinear_mode == "relu" else y

    def _module_info_string(self) -> str:
        return (f"batch={self.batch}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class QuantStub(Identity):
    """Returns its input: where a quantisation-aware model quantises (MegEngine's ``M.QuantStub``;
    gradcore trains in floating point only).

    Example::

        >>> M.QuantStub()(gc.tensor([1.0])).numpy()
        array([1.], dtype=float32)
    """


class DequantStub(Identity):
    """Returns its input: where a quantisation-aware model dequantises (MegEngine's ``M.DequantStub``).

    Example::

        >>> M.DequantStub()(gc.tensor([1.0])).numpy()
        array([1.], dtype=float32)
    """


class Dropout(Module):
    """Dropout with probability ``drop_prob`` while training; identity in eval().

    Example::

        >>> gc.random.seed(0)
        >>> drop = M.Dropout(0.5)
        >>> sorted(set(drop(gc.tensor(np.ones(100, "float32"))).numpy().tolist()))     # training
        [0.0, 2.0]
        >>> drop.eval()(gc.tensor([1.0, 2.0])).numpy()     # the identity in eval mode
        array([1., 2.], dtype=float32)
    """

    def __init__(self, drop_prob: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        F._check_drop_prob("Dropout", drop_prob)
        self.drop_prob = drop_prob

    def forward(self, x):
        return F.dropout(x, self.drop_prob, training=self.training)

    def _module_info_string(self):
        return f"drop_prob={self.drop_prob}"


# ---------------------------------------------------------------- activations
class ReLU(Module):
    """``max(x, 0)`` elementwise.

    Example::

        >>> M.ReLU()(gc.tensor([-1.0, 2.0])).numpy()
        array([0., 2.], dtype=float32)
    """

    def forward(self, x):
        return F.relu(x)


class Sigmoid(Module):
    """``1 / (1 + exp(-x))`` elementwise.

    Example::

        >>> M.Sigmoid()(gc.tensor([0.0])).numpy()
        array([0.5], dtype=float32)
    """

    def forward(self, x):
        return F.sigmoid(x)


class SiLU(Module):
    """``x * sigmoid(x)`` elementwise (also called swish).

    Example::

        >>> M.SiLU()(gc.tensor([0.0, 1.0])).numpy().round(4)
        array([0.    , 0.7311], dtype=float32)
    """

    def forward(self, x):
        return F.silu(x)


class GELU(Module):
    """``x * Phi(x)`` elementwise, Phi the standard normal CDF.

    Example::

        >>> M.GELU()(gc.tensor([1.0])).numpy().round(4)
        array([0.8413], dtype=float32)
    """

    def forward(self, x):
        return F.gelu(x)


class LeakyReLU(Module):
    """``x`` where positive, ``negative_slope * x`` elsewhere.

    Example::

        >>> M.LeakyReLU(0.1)(gc.tensor([-2.0, 3.0])).numpy()
        array([-0.2,  3. ], dtype=float32)
    """

    def __init__(self, negative_slope: float = 0.01, **kwargs):
        super().__init__(**kwargs)
        self.negative_slope = negative_slope

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)

    def _module_info_string(self):
        return f"negative_slope={self.negative_slope}"


class PReLU(Module):
    """``max(x, 0) + a * min(x, 0)`` with a learnable slope ``a``, MegEngine's
    ``M.PReLU``: one slope shared by every element (``num_parameters=1``,
    weight of shape (1,)), or one per channel of an (N, C, H, W) input
    (``num_parameters=C``, weight of shape (1, C, 1, 1)), all starting at
    ``init``.

    Example::

        >>> M.PReLU()(gc.tensor([-1.2, 2.7])).numpy()
        array([-0.3,  2.7], dtype=float32)
    """

    def __init__(self, num_parameters: int = 1, init: float = 0.25, **kwargs):
        super().__init__(**kwargs)
        self.num_parameters = _count("PReLU", "num_parameters", num_parameters, 1)
        shape = (1, self.num_parameters, 1, 1) if self.num_parameters > 1 else (1,)
        self.weight = Parameter(np.full(shape, init, "float32"))

    def forward(self, x):
        if self.num_parameters > 1:
            x = x if isinstance(x, Tensor) else F._t(x, name="PReLU")
            if x.ndim != 4 or x.shape[1] != self.num_parameters:
                raise ArgumentError(f"PReLU({self.num_parameters}): expected input (N, {self.num_parameters}, H, W), "
                                 f"got shape {x.shape}")
        return F.prelu(x, self.weight)

    def _module_info_string(self):
        return f"num_parameters={self.num_parameters}"


class Softmax(Module):
    """``exp(x) / sum(exp(x))`` along ``axis``; the default axis is
    ``F.softmax``'s (0 for a 0-, 1- or 3-d input, else 1).

    Example::

        >>> M.Softmax()(gc.tensor([0.0, 0.0])).numpy()
        array([0.5, 0.5], dtype=float32)
    """

    def __init__(self, axis: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        if axis is not None:
            for a in (axis if isinstance(axis, (tuple, list)) else (axis,)):
                _count("Softmax", "axis", a, low=-(2 ** 62))
        self.axis = axis

    def forward(self, x):
        return F.softmax(x, self.axis)

    def _module_info_string(self):
        return f"axis={self.axis}"


# ---------------------------------------------------------------- embedding
class Embedding(Module):
    """A lookup table: row ``i`` of ``weight`` (num_embeddings, embedding_dim)
    for each integer ``i`` of the input, so the output has shape
    ``inp.shape + (embedding_dim,)``. The weight starts as ``initial_weight``
    (copied) or is drawn from N(0, 1). As in MegEngine, ``padding_idx``,
    ``max_norm`` and ``norm_type`` must be None; with ``freeze`` no gradient
    reaches the weight.

    Example::

        >>> emb = M.Embedding(10, 4)
        >>> emb(gc.tensor([[1, 2, 3]], dtype="int32")).shape
        (1, 3, 4)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: Optional[int] = None,
                 max_norm: Optional[float] = None, norm_type: Optional[float] = None,
                 initial_weight: Union[Tensor, np.ndarray, None] = None, freeze: bool = False, **kwargs):
        super().__init__(**kwargs)
        if padding_idx is not None:
            raise ArgumentError("Embedding: padding_idx is not supported (give None)")
        if max_norm is not None or norm_type is not None:
            raise ArgumentError("Embedding: max_norm and norm_type are not supported (give None)")
        self.num_embeddings = _count("Embedding", "num_embeddings", num_embeddings)
        self.embedding_dim = _count("Embedding", "embedding_dim", embedding_dim)
        self.padding_idx, self.max_norm, self.norm_type = padding_idx, max_norm, norm_type
        self.freeze = freeze
        shape = (self.num_embeddings, self.embedding_dim)
        if initial_weight is None:
            self.weight = Parameter(np.zeros(shape, "float32"))
            self.reset_parameters()
        else:
            value = np.array(initial_weight.numpy() if isinstance(initial_weight, Tensor) else initial_weight)
            if value.shape != shape:
                raise ArgumentError(f"Embedding: initial_weight has shape {value.shape}, expected {shape} "
                                 f"(num_embeddings, embedding_dim)")
            self.weight = Parameter(value.astype("float32", copy=False))

    def reset_parameters(self) -> None:
        init.normal_(self.weight)

    def forward(self, x):
        weight = self.weight.detach() if self.freeze else self.weight
        return F.embedding(x, weight)

    @classmethod
    def from_pretrained(cls, embeddings: Union[Tensor, np.ndarray], freeze: bool = True,
                        padding_idx: Optional[int] = None, max_norm: Optional[float] = None,
                        norm_type: Optional[float] = None) -> "Embedding":
        """An Embedding whose weight is a copy of the 2-d ``embeddings``,
        frozen by default.

        Example::

            >>> emb = M.Embedding.from_pretrained(gc.tensor([[1.0, 2.0], [3.0, 4.0]]))
            >>> emb(gc.tensor([1], dtype="int32")).numpy()
            array([[3., 4.]], dtype=float32)
        """
        shape = tuple(embeddings.shape)
        if len(shape) != 2:
            raise ArgumentError(f"Embedding.from_pretrained: embeddings must be 2-d, got shape {shape}")
        return cls(shape[0], shape[1], padding_idx=padding_idx, max_norm=max_norm, norm_type=norm_type,
                   initial_weight=embeddings, freeze=freeze)

    def _module_info_string(self):
        return f"{self.num_embeddings}, {self.embedding_dim}" + (", freeze=True" if self.freeze else "")


# ---------------------------------------------------------------- normalisation
class LayerNorm(_AffineNorm):
    """Normalises over the last ``len(normalized_shape)`` axes,
    ``(x - mean) / sqrt(var + eps)`` with the biased variance, then
    ``* weight + bias`` (both of shape ``normalized_shape``, starting at ones
    and zeros) when ``affine``.

    Example::

        >>> ln = M.LayerNorm(2)
        >>> ln(gc.tensor([[[0.0, 2.0], [4.0, 8.0]]])).numpy().round(4)     # over the last axis
        array([[[-1.,  1.],
                [-1.,  1.]]], dtype=float32)
    """

    def __init__(self, normalized_shape: Union[int, Tuple[int, ...]], eps: float = 1e-5,
                 affine: bool = True, **kwargs):
        super().__init__(**kwargs)
        if isinstance(normalized_shape, (int, np.integer, float, np.floating, str)) or normalized_shape is None:
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(_count("LayerNorm", "normalized_shape", d, 1) for d in normalized_shape)
        self.eps = eps
        self._affine(self.normalized_shape, affine)

    def forward(self, x):
        return F.nn.layer_norm(x, self.normalized_shape, self.affine, self.weight, self.bias, self.eps)

    def _module_info_string(self):
        return f"normalized_shape={self.normalized_shape}, eps={self.eps}, affine={self.affine}"


class GroupNorm(_AffineNorm):
    """Group normalisation of (N, C, H, W) input (any (N, C, ...) works): the
    channels are split into ``num_groups`` groups, each normalised over its
    channels and the spatial axes with the biased variance; then
    ``* weight + bias``, per channel, of shape (C,) when ``affine``.

    Example::

        >>> gn = M.GroupNorm(4, 16)
        >>> x = gc.tensor(np.random.default_rng(0).normal(size=(2, 16, 3, 3)).astype("float32"))
        >>> y = gn(x)
        >>> y.shape, round(float(y.numpy()[0, :4].std()), 3)     # each group of 4 channels: unit variance
        ((2, 16, 3, 3), 1.0)
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.num_groups = _count("GroupNorm", "num_groups", num_groups, 1)
        self.num_channels = _count("GroupNorm", "num_channels", num_channels, 1)
        if self.num_channels % self.num_groups:
            raise ArgumentError(f"GroupNorm: num_channels={num_channels} must be divisible by "
                             f"num_groups={num_groups}")
        self.eps = eps
        self._affine(self.num_channels, affine)

    def forward(self, x):
        name = type(self).__name__
        if not isinstance(x, Tensor):
            x = F._t(x, name=name)
        c = self.num_channels
        if x.ndim < 2 or x.shape[1] != c:
            raise ArgumentError(f"{name}: expected input (N, {c}, ...), got shape {x.shape}")
        return F.nn.group_norm(x, self.num_groups, self.affine, self.weight, self.bias, self.eps)

    def _module_info_string(self):
        return f"groups={self.num_groups}, channels={self.num_channels}, eps={self.eps}, affine={self.affine}"


class InstanceNorm(GroupNorm):
    """Instance normalisation of (N, C, H, W) input (any (N, C, ...) works):
    each channel of each sample normalised over the spatial axes, the same as
    ``GroupNorm(num_channels, num_channels)``; then ``* weight + bias`` of
    shape (C,) when ``affine``. No running statistics: train and eval agree.

    Example::

        >>> norm = M.InstanceNorm(2)
        >>> norm(gc.tensor([[[0.0, 2.0], [4.0, 8.0]]])).numpy().round(4)
        array([[[-1.,  1.],
                [-1.,  1.]]], dtype=float32)
    """

    def __init__(self, num_channels: int, eps: float = 1e-5, affine: bool = True, **kwargs):
        n = _count("InstanceNorm", "num_channels", num_channels, 1)
        super().__init__(n, n, eps, affine, **kwargs)

    def _module_info_string(self):
        return f"channels={self.num_channels}, eps={self.eps}, affine={self.affine}"


class GeneralNorm(_AffineNorm):
    """Normalisation over the axes ``normalized_axis`` of the input, then a
    learnt ``* weight + bias`` of shape ``normalized_shape`` (those axes'
    sizes) when ``affine``, MegEngine's ``M.GeneralNorm`` (``F.nn.general_norm``).

    Example::

        >>> x = gc.tensor(np.random.default_rng(0).normal(size=(2, 3, 4, 5)).astype("float32"))
        >>> M.GeneralNorm((3, 4), (1, 2))(x).shape     # normalised over axes 1 and 2
        (2, 3, 4, 5)
    """

    def __init__(self, normalized_shape=None, normalized_axis=0, eps: float = 1e-5, affine: bool = True,
                 **kwargs):
        super().__init__(**kwargs)
        self.eps = float(eps)
        axes = [normalized_axis] if isinstance(normalized_axis, (int, np.integer)) else list(normalized_axis)
        shape = None
        if affine:
            if normalized_shape is None:
                raise ArgumentError("GeneralNorm: normalized_shape must be given when affine is True")
            shape = [normalized_shape] if isinstance(normalized_shape, (int, np.integer)) else list(normalized_shape)
            if len(shape) != len(axes) or len(set(axes)) != len(axes):
                raise ArgumentError(f"GeneralNorm: normalized_shape {normalized_shape!r} and normalized_axis "
                                    f"{normalized_axis!r} must name as many distinct axes")
        self._affine(shape, bool(affine))
        self.normalized_shape, self.normalized_axis = normalized_shape, axes

    def forward(self, x):
        x = x if isinstance(x, Tensor) else F._t(x, name="GeneralNorm")
        axes = [a + x.ndim if a < 0 else a for a in self.normalized_axis]
        if axes != sorted(axes):
            raise ArgumentError(f"GeneralNorm: normalized_axis must be in increasing order, got {self.normalized_axis}")
        return F.nn.general_norm(x, axes, self.affine, self.weight, self.bias, self.eps)

    def _module_info_string(self):
        return (f"normalized_shape={self.normalized_shape}, normalized_axis={self.normalized_axis}, "
                f"eps={self.eps}, affine={self.affine}")


class LocalResponseNorm(Module):
    """Local response normalisation across channels, MegEngine's
    ``M.LocalResponseNorm`` (``F.nn.local_response_norm``): no parameters.

    Example::

        >>> lrn = M.LocalResponseNorm(kernel_size=3, k=1.0, alpha=1e-4, beta=0.75)
        >>> lrn(gc.tensor(np.ones((1, 4, 2, 2), "float32"))).shape
        (1, 4, 2, 2)
    """

    def __init__(self, kernel_size: int = 5, k: float = 2.0, alpha: float = 1e-4, beta: float = 0.75, **kwargs):
        super().__init__(**kwargs)
        self.kernel_size = _count("LocalResponseNorm", "kernel_size", kernel_size, 1)
        self.k, self.alpha, self.beta = float(k), float(alpha), float(beta)

    def forward(self, inp):
        return F.nn.local_response_norm(inp, self.kernel_size, self.k, self.alpha, self.beta)

    def _module_info_string(self):
        return f"kernel_size={self.kernel_size}, k={self.k}, alpha={self.alpha}, beta={self.beta}"
