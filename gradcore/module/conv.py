"""The rest of MegEngine's convolution layers: ``ConvTranspose2d`` and
``Conv3d`` (``M.ConvTranspose2d``, ``M.Conv3d``), with MegEngine's weight
layouts, initialisation (N(0, 1 / fan_in), zero bias) and parameter names
(``weight``, ``bias``).

Example::

    >>> up = M.ConvTranspose2d(8, 4, 2, stride=2)
    >>> up(x).shape                  # x: (N, 8, H, W) -> (N, 4, 2H, 2W)
"""
from __future__ import annotations

from typing import Tuple, Union

import numpy as np

from .. import functional as F
from .. import random as _random
from .._core import Tensor
from ..tensor import Parameter
from .module import Module, _count, _pair

IntOrTuple = Union[int, Tuple[int, ...]]


def _triple(v, what: str, allow_zero: bool = True, name: str = "Conv3d") -> Tuple[int, int, int]:
    if isinstance(v, (tuple, list)) and len(v) != 3:
        raise ValueError(f"{name}: {what} must be an int or a triple of ints, got {v!r}")
    low = 0 if allow_zero else 1
    try:
        return tuple(_count(name, what, i, low) for i in v) if isinstance(v, (tuple, list)) else \
            (_count(name, what, v, low),) * 3
    except ValueError:
        raise ValueError(f"{name}: {what} must be {'non-negative' if allow_zero else 'positive'}, got {v}") from None


class _ConvLayer(Module):
    """What the layers share: the checked channel counts, the weight
    (``weight_shape``) drawn from N(0, 1 / ``fan_in``), a (1, out_channels,
    1, ...) bias starting at zero, and the description."""

    def _setup(self, name: str, in_channels, out_channels, groups, weight_shape, fan_in: int, bias: bool):
        self.groups = _count(name, "groups", groups, 1)
        self.in_channels = _count(name, "in_channels", in_channels, 1)
        self.out_channels = _count(name, "out_channels", out_channels, 1)
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(f"{name}: in_channels={self.in_channels} and out_channels={self.out_channels} "
                             f"must both be divisible by groups={self.groups}")
        self._fan_in = fan_in
        self.weight = Parameter(np.zeros(weight_shape(self.in_channels, self.out_channels, self.groups), "float32"))
        ones = (1,) * len(self.kernel_size)
        self.bias = Parameter(np.zeros((1, self.out_channels) + ones, "float32")) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = np.sqrt(1.0 / self._fan_in)
        self.weight._reset(Tensor(_random.generator().normal(0.0, std, self.weight.shape).astype("float32")))
        if self.bias is not None:
            self.bias._reset(Tensor(np.zeros(self.bias.shape, "float32")))

    def _module_info_string(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        zeros, ones = (0,) * len(self.kernel_size), (1,) * len(self.kernel_size)
        for what, default in (("stride", ones), ("padding", zeros), ("output_padding", zeros),
                              ("dilation", ones)):
            value = getattr(self, what, default)
            if value != default:
                s += f", {what}={value}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


def _grouped_shape(a: int, b: int, groups: int, kernel) -> tuple:
    """(a, b, *kernel), or MegEngine's grouped (groups, a // groups, b // groups, *kernel)."""
    if groups == 1:
        return (a, b) + tuple(kernel)
    return (groups, a // groups, b // groups) + tuple(kernel)


class ConvTranspose2d(_ConvLayer):
    """2-D transposed convolution over NCHW input, MegEngine's
    ``M.ConvTranspose2d``: weight (in_channels, out_channels, kh, kw), or
    with ``groups > 1`` (groups, in_channels // groups, out_channels //
    groups, kh, kw), drawn from N(0, 1 / (kh * kw * out_channels)); bias
    (1, out_channels, 1, 1) starting at zero. Output size per axis: (size -
    1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1.

    Example::

        >>> up = M.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
        >>> up(x).shape              # x: (N, 8, H, W) -> (N, 4, 2H, 2W)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
                 padding: IntOrTuple = 0, output_padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 groups: int = 1, bias: bool = True, conv_mode: str = "cross_correlation",
                 compute_mode: str = "default", **kwargs):
        super().__init__(**kwargs)
        name = "ConvTranspose2d"
        self.kernel_size = _pair(kernel_size, "kernel_size", allow_zero=False, name=name)
        self.stride = _pair(stride, "stride", allow_zero=False, name=name)
        self.padding = _pair(padding, "padding", name=name)
        self.output_padding = _pair(output_padding, "output_padding", name=name)
        self.dilation = _pair(dilation, "dilation", allow_zero=False, name=name)
        if any(op >= s for op, s in zip(self.output_padding, self.stride)):
            raise ValueError(f"{name}: output_padding {self.output_padding} must be smaller than the "
                             f"stride {self.stride}")
        self.conv_mode, self.compute_mode = conv_mode, compute_mode
        kh, kw = self.kernel_size
        self._setup(name, in_channels, out_channels, groups,
                    lambda i, o, g: _grouped_shape(i, o, g, self.kernel_size), kh * kw * out_channels, bias)

    def forward(self, x):
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.dilation, self.groups, self.conv_mode, self.compute_mode)


class Conv3d(_ConvLayer):
    """3-D convolution over (N, C, D, H, W) input, MegEngine's ``M.Conv3d``:
    weight (out_channels, in_channels, kd, kh, kw), or with ``groups > 1``
    (groups, out_channels // groups, in_channels // groups, kd, kh, kw),
    drawn from N(0, 1 / (kd * kh * kw * in_channels)); bias (1,
    out_channels, 1, 1, 1) starting at zero.

    Example::

        >>> conv = M.Conv3d(2, 8, 3, padding=1)
        >>> conv(x).shape            # x: (N, 2, D, H, W) -> (N, 8, D, H, W)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
                 padding: IntOrTuple = 0, dilation: IntOrTuple = 1, groups: int = 1, bias: bool = True,
                 conv_mode: str = "cross_correlation", **kwargs):
        super().__init__(**kwargs)
        self.kernel_size = _triple(kernel_size, "kernel_size", allow_zero=False)
        self.stride = _triple(stride, "stride", allow_zero=False)
        self.padding = _triple(padding, "padding")
        self.dilation = _triple(dilation, "dilation", allow_zero=False)
        self.conv_mode = conv_mode
        kd, kh, kw = self.kernel_size
        self._setup("Conv3d", in_channels, out_channels, groups,
                    lambda i, o, g: _grouped_shape(o, i, g, self.kernel_size), kd * kh * kw * in_channels, bias)

    def forward(self, x):
        return F.conv3d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
                        self.conv_mode)
