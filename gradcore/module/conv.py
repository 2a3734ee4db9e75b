"""MegEngine's convolution layers: ``Conv1d``, ``Conv2d``, ``Conv3d`` and
``ConvTranspose2d`` (``M.Conv2d``, ...), with MegEngine's weight layouts,
initialisation (N(0, 1 / fan_in), zero bias) and parameter names
(``weight``, ``bias``).

Example::

    >>> up = M.ConvTranspose2d(8, 4, 2, stride=2)
    >>> up(x).shape                  # x: (N, 8, H, W) -> (N, 4, 2H, 2W)
"""
from __future__ import annotations

import math
from typing import Tuple, Union

import numpy as np

from .. import functional as F
from ..tensor import Parameter
from . import init
from .module import Module, _count, _sizes
from ..op import ArgumentError

IntOrTuple = Union[int, Tuple[int, ...]]
_PADDING_MODES = ("zeros", "reflect", "replicate")


class _ConvLayer(Module):
    """What the layers share: the checked channel counts, the weight drawn
    from N(0, 1 / fan_in), a (1, out_channels, 1, ...) bias starting at
    zero, and the description. ``kernel_size`` and the other per-axis sizes
    are set before ``_setup``."""

    def _setup(self, name: str, in_channels, out_channels, groups, bias: bool, transposed: bool = False,
               grouped: bool = False):
        self.groups = _count(name, "groups", groups, 1)
        self.in_channels = _count(name, "in_channels", in_channels, 1)
        self.out_channels = _count(name, "out_channels", out_channels, 1)
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ArgumentError(f"{name}: in_channels={self.in_channels} and out_channels={self.out_channels} "
                             f"must both be divisible by groups={self.groups}")
        kernel = self.kernel_size if isinstance(self.kernel_size, tuple) else (self.kernel_size,)
        # a transposed convolution's weight is (in, out, ...) and its fan-in the output channels
        a, b = (self.in_channels, self.out_channels) if transposed else (self.out_channels, self.in_channels)
        self._fan_in = math.prod(kernel) * b
        g = self.groups
        # MegEngine's grouped layout: (groups, a // groups, b // groups, *kernel);
        # ``grouped``: that layout even for one group (RegionRestrictedConv's)
        shape = (a, b) + kernel if g == 1 and not grouped else (g, a // g, b // g) + kernel
        self.weight = Parameter(np.zeros(shape, "float32"))
        self.bias = Parameter(np.zeros((1, self.out_channels) + (1,) * len(kernel), "float32")) if bias else None
        self.reset_parameters()

    def _set_sizes(self, name: str, n: int, kernel_size, stride, padding, dilation) -> None:
        """The checked per-axis sizes (``n`` of each; a 1-d layer keeps plain ints)."""
        sizes = [_sizes(kernel_size, n, "kernel_size", allow_zero=False, name=name),
                 _sizes(stride, n, "stride", allow_zero=False, name=name),
                 _sizes(padding, n, "padding", name=name),
                 _sizes(dilation, n, "dilation", allow_zero=False, name=name)]
        self.kernel_size, self.stride, self.padding, self.dilation = (s[0] for s in sizes) if n == 1 else sizes

    def _setup_transposed(self, name: str, n: int, in_channels, out_channels, kernel_size, stride, padding,
                          output_padding, dilation, groups, bias: bool):
        """A transposed layer's checked per-axis sizes (``n`` axes; output
        padding smaller than the stride), then ``_setup``."""
        self._set_sizes(name, n, kernel_size, stride, padding, dilation)
        self.output_padding = _sizes(output_padding, n, "output_padding", name=name)
        if any(op >= s for op, s in zip(self.output_padding, self.stride)):
            raise ArgumentError(f"{name}: output_padding {self.output_padding} must be smaller than the "
                             f"stride {self.stride}")
        self._setup(name, in_channels, out_channels, groups, bias, transposed=True)

    def _padded(self, x, padding_mode: str):
        """``x`` padded by ``self.padding`` in ``padding_mode`` ("reflect" or
        "replicate", with ``F.nn.pad``), and the padding left for the
        convolution itself (all of it for "zeros")."""
        pads = self.padding if isinstance(self.padding, tuple) else (self.padding,)
        if padding_mode == "zeros" or not any(pads):
            return x, self.padding
        x = F.nn.pad(x, ((0, 0), (0, 0)) + tuple((p, p) for p in pads), mode=padding_mode)
        return x, (0,) * len(pads) if isinstance(self.padding, tuple) else 0

    def reset_parameters(self) -> None:
        init.normal_(self.weight, 0.0, math.sqrt(1.0 / self._fan_in))
        if self.bias is not None:
            init.zeros_(self.bias)

    def _module_info_string(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        n = len(self.kernel_size) if isinstance(self.kernel_size, tuple) else None
        zeros, ones = ((0,) * n, (1,) * n) if n else (0, 1)
        for what, default in (("stride", ones), ("padding", zeros), ("output_padding", zeros),
                              ("dilation", ones)):
            value = getattr(self, what, default)
            if value != default:
                s += f", {what}={value}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if getattr(self, "padding_mode", "zeros") != "zeros":
            s += f", padding_mode={self.padding_mode!r}"
        return s


def _check_padding_mode(name: str, padding_mode: str) -> str:
    if padding_mode not in _PADDING_MODES:
        raise ArgumentError(f"{name}: padding_mode must be 'zeros', 'reflect' or 'replicate', got {padding_mode!r}")
    return padding_mode


class Conv2d(_ConvLayer):
    """2-D convolution over NCHW input, MegEngine's ``M.Conv2d``: weight of
    shape (out_channels, in_channels, kh, kw), or with ``groups > 1``
    MegEngine's (groups, out_channels // groups, in_channels // groups, kh, kw),
    drawn from N(0, 1 / (kh * kw * in_channels)); bias of shape
    (1, out_channels, 1, 1) starting at zero. ``padding_mode`` "reflect" or
    "replicate" pads with ``F.nn.pad`` instead of zeros.

    Example::

        >>> conv = M.Conv2d(3, 8, 3, padding=1)
        >>> conv.weight.shape, conv.bias.shape
        ((8, 3, 3, 3), (1, 8, 1, 1))
        >>> conv(gc.tensor(np.ones((2, 3, 5, 5), "float32"))).shape     # (N, 3, H, W) -> (N, 8, H, W)
        (2, 8, 5, 5)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True,
                 conv_mode: str = "cross_correlation", compute_mode: str = "default",
                 padding_mode: str = "zeros", **kwargs):
        super().__init__(**kwargs)
        self.padding_mode = _check_padding_mode("Conv2d", padding_mode)
        self._set_sizes("Conv2d", 2, kernel_size, stride, padding, dilation)
        self.conv_mode, self.compute_mode = conv_mode, compute_mode
        self._setup("Conv2d", in_channels, out_channels, groups, bias)

    _nonlinear_mode = "identity"

    def forward(self, x):
        x, padding = self._padded(x, getattr(self, "padding_mode", "zeros"))
        return F.conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation,
                        self.groups, self.conv_mode, self.compute_mode, nonlinear_mode=self._nonlinear_mode)


class DeformableConv2d(Conv2d):
    """Modulated deformable convolution (``F.deformable_conv2d``),
    MegEngine's ``M.DeformableConv2d``: Conv2d's weight and bias (shapes and
    initialisation), applied as ``module(inp, offset, mask)`` with the
    sampling offsets and masks given per call. Zero padding only.

    Example::

        >>> dcn = M.DeformableConv2d(2, 4, 3, padding=1)
        >>> x = gc.tensor(np.ones((1, 2, 5, 5), "float32"))
        >>> offset, mask = F.zeros((1, 18, 5, 5)), F.ones((1, 9, 5, 5))     # no offsets: Conv2d
        >>> np.allclose(dcn(x, offset, mask).numpy(), F.conv2d(x, dcn.weight, dcn.bias, padding=1).numpy(), atol=1e-5)
        True
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True,
                 conv_mode: str = "cross_correlation", compute_mode: str = "default", **kwargs):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         conv_mode, compute_mode, **kwargs)

    def forward(self, inp, offset, mask):
        return F.deformable_conv2d(inp, self.weight, offset, mask, self.bias, self.stride, self.padding,
                                   self.dilation, self.groups, self.conv_mode, self.compute_mode)


class RegionRestrictedConv(_ConvLayer):
    """A 2-D convolution over NCHW input in which an input position feeds an
    output position only where their integer region ids agree
    (``F.nn.region_restricted_conv``), MegEngine's ``M.RegionRestrictedConv``:
    called as ``layer(inp, rin, rout)``, ``rin`` (N, H, W) and ``rout``
    (N, OH, OW). The weight always has the grouped layout (groups,
    out_channels // groups, in_channels // groups, kh, kw), drawn from
    N(0, 1 / (kh * kw * in_channels)); the bias (1, out_channels, 1, 1)
    starts at zero. Arguments in MegEngine's order (``groups`` and ``bias``
    before ``stride``). ``padding_mode`` is checked and kept as MegEngine's
    layer keeps it; the convolution pads with zeros, as MegEngine's does
    (``rin`` covers the unpadded input).

    Example::

        >>> rr = M.RegionRestrictedConv(2, 4, 3, groups=2, padding=1)
        >>> rr.weight.shape, rr.bias.shape
        ((2, 2, 1, 3, 3), (1, 4, 1, 1))
        >>> x = gc.tensor(np.ones((1, 2, 5, 5), "float32"))
        >>> rin = gc.tensor(np.zeros((1, 5, 5), "int32")); rout = gc.tensor(np.zeros((1, 5, 5), "int32"))
        >>> rr(x, rin, rout).shape
        (1, 4, 5, 5)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple, groups: int = 1,
                 bias: bool = True, stride: IntOrTuple = 1, padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 conv_mode: str = "cross_correlation", compute_mode: str = "default",
                 padding_mode: str = "zeros", **kwargs):
        super().__init__(**kwargs)
        name = "RegionRestrictedConv"
        self.padding_mode = _check_padding_mode(name, padding_mode)
        self._set_sizes(name, 2, kernel_size, stride, padding, dilation)
        self.conv_mode, self.compute_mode = conv_mode, compute_mode
        self._setup(name, in_channels, out_channels, groups, bias, grouped=True)

    def forward(self, inp, rin, rout):
        return F.nn.region_restricted_conv(inp, self.weight, rin, rout, self.bias, self.stride, self.padding,
                                           self.dilation, self.groups, self.conv_mode, self.compute_mode)


class LocalConv2d(Conv2d):
    """A locally connected layer over NCHW input of a fixed size (a kernel
    per output position, ``F.local_conv2d``), MegEngine's ``M.LocalConv2d``:
    weight of shape (groups, OH, OW, in_channels // groups, kh, kw,
    out_channels // groups), OH and OW the output size for ``input_height``
    and ``input_width``, drawn from N(0, 1 / (kh * kw * in_channels)); no
    bias (MegEngine's). Zero padding only.

    Example::

        >>> lc = M.LocalConv2d(3, 8, 7, 7, 3)
        >>> lc.weight.shape
        (1, 5, 5, 3, 3, 3, 8)
        >>> lc(gc.tensor(np.ones((2, 3, 7, 7), "float32"))).shape
        (2, 8, 5, 5)
    """

    def __init__(self, in_channels: int, out_channels: int, input_height: int, input_width: int, kernel_size,
                 stride=1, padding=0, dilation=1, groups: int = 1, conv_mode: str = "cross_correlation",
                 **kwargs):
        self.input_height = _count("LocalConv2d", "input_height", input_height, 1)
        self.input_width = _count("LocalConv2d", "input_width", input_width, 1)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias=False,
                         conv_mode=conv_mode, **kwargs)
        if self.padding_mode != "zeros":
            raise ArgumentError(f"LocalConv2d: zero padding only, got padding_mode={self.padding_mode!r}")

    def _setup(self, name, in_channels, out_channels, groups, bias, transposed=False):
        # Conv2d's checks and initialisation, then the weight in the local layout
        super()._setup("LocalConv2d", in_channels, out_channels, groups, bias)
        (kh, kw), (ph, pw), (sh, sw), (dh, dw) = self.kernel_size, self.padding, self.stride, self.dilation
        oh = (self.input_height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (self.input_width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        if oh < 1 or ow < 1:
            raise ArgumentError(f"LocalConv2d: kernel_size {self.kernel_size}, padding {self.padding}, stride "
                                f"{self.stride} and dilation {self.dilation} leave no output for an input of "
                                f"({self.input_height}, {self.input_width})")
        g = self.groups
        self.weight = Parameter(np.zeros((g, oh, ow, self.in_channels // g, kh, kw, self.out_channels // g),
                                         "float32"))
        self.reset_parameters()

    def forward(self, x):
        return F.local_conv2d(x, self.weight, None, self.stride, self.padding, self.dilation, self.conv_mode)

    def _module_info_string(self):
        return (f"{super()._module_info_string()}, input_height={self.input_height}, "
                f"input_width={self.input_width}")


class ConvRelu2d(Conv2d):
    """Conv2d followed by ReLU, as one op (MegEngine's ``M.ConvRelu2d``):
    the convolution, its bias and the ReLU in one Convolution op
    (``nonlinear_mode="relu"``), on oneDNN one primitive with a ReLU
    post-op. Same parameters, names and values as ``Conv2d`` followed by
    ``F.relu``.

    Example::

        >>> block = M.ConvRelu2d(3, 8, 3, padding=1)
        >>> y = block(gc.tensor(np.ones((2, 3, 5, 5), "float32")))
        >>> y.shape, bool((y.numpy() >= 0).all())
        ((2, 8, 5, 5), True)
    """

    _nonlinear_mode = "relu"


class Conv1d(_ConvLayer):
    """1-D convolution over (N, C, L) input, MegEngine's ``M.Conv1d``: weight
    of shape (out_channels, in_channels, kernel_size), or with ``groups > 1``
    (groups, out_channels // groups, in_channels // groups, kernel_size),
    drawn from N(0, 1 / (kernel_size * in_channels)); bias of shape
    (1, out_channels, 1) starting at zero. ``padding_mode`` "reflect" or
    "replicate" pads with ``F.nn.pad`` instead of zeros.

    Example::

        >>> conv = M.Conv1d(3, 8, 3, padding=1)
        >>> conv(gc.tensor(np.ones((2, 3, 10), "float32"))).shape     # (N, 3, L) -> (N, 8, L)
        (2, 8, 10)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, dilation: int = 1, groups: int = 1, bias: bool = True,
                 conv_mode: str = "cross_correlation", compute_mode: str = "default",
                 padding_mode: str = "zeros", **kwargs):
        super().__init__(**kwargs)
        self.padding_mode = _check_padding_mode("Conv1d", padding_mode)
        self._set_sizes("Conv1d", 1, kernel_size, stride, padding, dilation)
        self.conv_mode, self.compute_mode = conv_mode, compute_mode
        self._setup("Conv1d", in_channels, out_channels, groups, bias)

    def forward(self, x):
        x, padding = self._padded(x, self.padding_mode)
        return F.nn.conv1d(x, self.weight, self.bias, self.stride, padding, self.dilation,
                           self.groups, self.conv_mode, self.compute_mode)


class ConvTranspose2d(_ConvLayer):
    """2-D transposed convolution over NCHW input, MegEngine's
    ``M.ConvTranspose2d``: weight (in_channels, out_channels, kh, kw), or
    with ``groups > 1`` (groups, in_channels // groups, out_channels //
    groups, kh, kw), drawn from N(0, 1 / (kh * kw * out_channels)); bias
    (1, out_channels, 1, 1) starting at zero. Output size per axis: (size -
    1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1.

    Example::

        >>> up = M.ConvTranspose2d(8, 4, 2, stride=2)
        >>> up(gc.tensor(np.ones((1, 8, 3, 3), "float32"))).shape     # (N, 8, H, W) -> (N, 4, 2H, 2W)
        (1, 4, 6, 6)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
                 padding: IntOrTuple = 0, output_padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 groups: int = 1, bias: bool = True, conv_mode: str = "cross_correlation",
                 compute_mode: str = "default", **kwargs):
        super().__init__(**kwargs)
        self.conv_mode, self.compute_mode = conv_mode, compute_mode
        self._setup_transposed("ConvTranspose2d", 2, in_channels, out_channels, kernel_size, stride, padding,
                               output_padding, dilation, groups, bias)

    def forward(self, x):
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.dilation, self.groups, self.conv_mode, self.compute_mode)


class ConvTransposeRelu2d(ConvTranspose2d):
    """ConvTranspose2d followed by ReLU, MegEngine's ``M.ConvTransposeRelu2d``:
    the same parameters and names as ``ConvTranspose2d``.

    Example::

        >>> y = M.ConvTransposeRelu2d(8, 4, 3)(gc.tensor(np.ones((1, 8, 3, 3), "float32")))
        >>> y.shape, bool((y.numpy() >= 0).all())
        ((1, 4, 5, 5), True)
    """

    def forward(self, x):
        return F.relu(super().forward(x))


class ConvTranspose3d(_ConvLayer):
    """3-D transposed convolution over (N, C, D, H, W) input, MegEngine's
    ``M.ConvTranspose3d``: weight (in_channels, out_channels, kd, kh, kw)
    (grouped: (groups, in_channels // groups, out_channels // groups, kd,
    kh, kw)), drawn from N(0, 1 / (kd * kh * kw * out_channels)); bias (1,
    out_channels, 1, 1, 1) starting at zero; output sizes as
    ``ConvTranspose2d``'s per axis.

    Example::

        >>> up = M.ConvTranspose3d(8, 4, 2, stride=2)
        >>> up(gc.tensor(np.ones((1, 8, 2, 3, 3), "float32"))).shape
        (1, 4, 4, 6, 6)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
                 padding: IntOrTuple = 0, output_padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 groups: int = 1, bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self._setup_transposed("ConvTranspose3d", 3, in_channels, out_channels, kernel_size, stride, padding,
                               output_padding, dilation, groups, bias)

    def forward(self, x):
        return F.conv_transpose3d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.dilation, self.groups)


class Conv3d(_ConvLayer):
    """3-D convolution over (N, C, D, H, W) input, MegEngine's ``M.Conv3d``:
    weight (out_channels, in_channels, kd, kh, kw), or with ``groups > 1``
    (groups, out_channels // groups, in_channels // groups, kd, kh, kw),
    drawn from N(0, 1 / (kd * kh * kw * in_channels)); bias (1,
    out_channels, 1, 1, 1) starting at zero.

    Example::

        >>> conv = M.Conv3d(2, 8, 3, padding=1)
        >>> conv(gc.tensor(np.ones((1, 2, 4, 4, 4), "float32"))).shape
        (1, 8, 4, 4, 4)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
                 padding: IntOrTuple = 0, dilation: IntOrTuple = 1, groups: int = 1, bias: bool = True,
                 conv_mode: str = "cross_correlation", **kwargs):
        super().__init__(**kwargs)
        self._set_sizes("Conv3d", 3, kernel_size, stride, padding, dilation)
        self.conv_mode = conv_mode
        self._setup("Conv3d", in_channels, out_channels, groups, bias)

    def forward(self, x):
        return F.conv3d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
                        self.conv_mode)
