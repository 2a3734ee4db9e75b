"""gradcore.module (``M``): Module, Linear, ReLU, Sequential.

Example::

    >>> import gradcore.module as M
    >>> net = M.Sequential(M.Linear(4, 8), M.ReLU(), M.Linear(8, 2))
    >>> [name for name, _ in net.named_parameters()]
    ['layer_values.0.weight', 'layer_values.0.bias', 'layer_values.2.weight', 'layer_values.2.bias']
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Iterator, Tuple

import numpy as np

from . import functional as F
from . import random as _random
from ._core import Tensor
from .tensor import Parameter


class Module:
    """Base class of layers: parameters are the Parameter attributes (and
    those of sub-modules), in attribute order."""

    def __init__(self, name: str = None):
        self.training = True
        self.name = name

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}.forward is not defined")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- traversal
    def _children(self) -> Iterator[Tuple[str, object]]:
        for key, value in vars(self).items():
            if isinstance(value, (Module, Parameter)):
                yield key, value
            elif isinstance(value, (list, tuple)):
                for i, v in enumerate(value):
                    if isinstance(v, (Module, Parameter)):
                        yield f"{key}.{i}", v
            elif isinstance(value, dict):
                for k, v in value.items():
                    if isinstance(v, (Module, Parameter)):
                        yield f"{key}.{k}", v

    def named_parameters(self, prefix: str = "") -> Iterator[Tuple[str, Parameter]]:
        seen = set()
        for name, value in self._children():
            full = f"{prefix}{name}"
            if isinstance(value, Parameter):
                if id(value) not in seen:
                    seen.add(id(value))
                    yield full, value
            else:
                for n, p in value.named_parameters(prefix=full + "."):
                    if id(p) not in seen:
                        seen.add(id(p))
                        yield n, p

    def parameters(self) -> Iterator[Parameter]:
        for _, p in self.named_parameters():
            yield p

    def named_modules(self, prefix: str = "") -> Iterator[Tuple[str, "Module"]]:
        yield prefix.rstrip("."), self
        for name, value in self._children():
            if isinstance(value, Module):
                yield from value.named_modules(prefix=f"{prefix}{name}.")

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_buffers(self, prefix: str = "") -> Iterator[Tuple[str, Tensor]]:
        for key, value in vars(self).items():
            if isinstance(value, Tensor) and not isinstance(value, Parameter):
                yield f"{prefix}{key}", value
        for name, value in self._children():
            if isinstance(value, Module):
                yield from value.named_buffers(prefix=f"{prefix}{name}.")

    # ---- modes
    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> "Module":
        return self.train(False)

    # ---- state
    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        state = OrderedDict()
        for name, p in self.named_parameters():
            state[name] = p.numpy().copy()
        for name, b in self.named_buffers():
            state[name] = b.numpy().copy()
        return state

    def load_state_dict(self, state: Dict[str, np.ndarray], strict: bool = True) -> None:
        own = dict(self.named_parameters())
        own.update(dict(self.named_buffers()))
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for k, t in own.items():
            if k not in state:
                continue
            value = np.asarray(state[k].numpy() if isinstance(state[k], Tensor) else state[k])
            if value.shape != t.shape:
                raise ValueError(f"load_state_dict: {k}: shape {value.shape} does not match {t.shape}")
            t._reset(Tensor(value.astype(t.dtype), device=t.device))

    def to(self, device: str) -> "Module":
        """Move every parameter and buffer to ``device`` ("cpu" or "cuda"),
        in place: the Parameter objects stay the same, so an optimizer made
        before keeps working. Gradients are dropped.

        Example::

            >>> model = M.Linear(3, 2).to("cuda")     # doctest: +SKIP
        """
        from .tensor_methods import norm_device
        dev = norm_device(device)
        for _, t in list(self.named_parameters()) + list(self.named_buffers()):
            if t.device != dev:
                t._reset(Tensor(t, device=dev))
                t.grad = None
        return self

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def __repr__(self):
        lines = [f"{type(self).__name__}("]
        for name, value in self._children():
            if isinstance(value, Module):
                lines.append(f"  ({name}): {value!r}".replace("\n", "\n  "))
        return "\n".join(lines) + ")" if len(lines) > 1 else f"{type(self).__name__}()"


class Linear(Module):
    """``y = x @ weight.T + bias`` with weight of shape (out_features, in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.in_features, self.out_features = in_features, out_features
        std = np.sqrt(1.0 / in_features)
        self.weight = Parameter(_random.generator().normal(0.0, std, (out_features, in_features)).astype("float32"))
        self.bias = Parameter(np.zeros(out_features, "float32")) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def __repr__(self):
        return f"Linear(in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None})"


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class Sequential(Module):
    """Layers applied in order.

    Example::

        >>> net = Sequential(Linear(2, 4), ReLU(), Linear(4, 1))
    """

    def __init__(self, *layers, **kwargs):
        super().__init__(**kwargs)
        if len(layers) == 1 and isinstance(layers[0], dict):
            layers = tuple(layers[0].values())
        self.layer_values = list(layers)

    def __getitem__(self, i):
        return self.layer_values[i]

    def __len__(self):
        return len(self.layer_values)

    def forward(self, x):
        for layer in self.layer_values:
            x = layer(x)
        return x


def _pair(v):
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


class Conv2d(Module):
    """2-D convolution over NCHW input, MegEngine's ``M.Conv2d``: weight of
    shape (out_channels, in_channels // groups, kh, kw) drawn from
    N(0, 1 / (kh * kw * in_channels)), bias of shape (1, out_channels, 1, 1)
    starting at zero.

    Example::

        >>> conv = Conv2d(3, 8, 3, padding=1)
        >>> conv(x).shape                # x: (N, 3, H, W) -> (N, 8, H, W)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True,
                 conv_mode: str = "cross_correlation", compute_mode: str = "default", **kwargs):
        super().__init__(**kwargs)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: in_channels={in_channels} and out_channels={out_channels} "
                             f"must both be divisible by groups={groups}")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding, self.dilation, self.groups = _pair(padding), _pair(dilation), int(groups)
        self.conv_mode, self.compute_mode = conv_mode, compute_mode
        kh, kw = self.kernel_size
        std = np.sqrt(1.0 / (kh * kw * in_channels))
        shape = (out_channels, in_channels // groups, kh, kw)
        self.weight = Parameter(_random.generator().normal(0.0, std, shape).astype("float32"))
        self.bias = Parameter(np.zeros((1, out_channels, 1, 1), "float32")) if bias else None

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups, self.conv_mode, self.compute_mode)

    def __repr__(self):
        return (f"Conv2d({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"groups={self.groups}, bias={self.bias is not None})")


class MaxPool2d(Module):
    """``F.max_pool2d`` as a layer (stride defaults to kernel_size)."""

    def __init__(self, kernel_size, stride=None, padding=0, **kwargs):
        super().__init__(**kwargs)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def __repr__(self):
        return f"MaxPool2d(kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding})"


class AvgPool2d(Module):
    """``F.avg_pool2d`` as a layer (stride defaults to kernel_size)."""

    def __init__(self, kernel_size, stride=None, padding=0, mode: str = "average_count_exclude_padding",
                 **kwargs):
        super().__init__(**kwargs)
        self.kernel_size, self.stride, self.padding, self.mode = kernel_size, stride, padding, mode

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.mode)

    def __repr__(self):
        return (f"AvgPool2d(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, mode={self.mode!r})")


class Flatten(Module):
    """``F.flatten(x, start_axis, end_axis)``; by default keeps the batch axis."""

    def __init__(self, start_axis: int = 1, end_axis: int = -1, **kwargs):
        super().__init__(**kwargs)
        self.start_axis, self.end_axis = start_axis, end_axis

    def forward(self, x):
        return F.flatten(x, self.start_axis, self.end_axis)


class BatchNorm2d(Module):
    """Batch normalisation of (N, C, H, W) inputs with running statistics
    (MegEngine's BatchNorm2d: ``momentum=0.9`` keeps 90% of the old value).

    Example::

        >>> bn = BatchNorm2d(16); y = bn(x)
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.9,
                 affine: bool = True, track_running_stats: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        shape = (1, num_features, 1, 1)
        self.weight = Parameter(np.ones(shape, "float32")) if affine else None
        self.bias = Parameter(np.zeros(shape, "float32")) if affine else None
        self.track_running_stats = track_running_stats
        if track_running_stats:
            self.running_mean = Tensor(np.zeros(shape, "float32"))
            self.running_var = Tensor(np.ones(shape, "float32"))
        else:
            self.running_mean = self.running_var = None

    def forward(self, x):
        if x.ndim != 4 or x.shape[1] != self.num_features:
            raise ValueError(f"BatchNorm2d({self.num_features}): expected input (N, {self.num_features}, H, W), "
                             f"got shape {x.shape}")
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=self.training or not self.track_running_stats,
                            momentum=self.momentum, eps=self.eps)


class Dropout(Module):
    """Dropout with probability ``drop_prob`` while training; identity in eval()."""

    def __init__(self, drop_prob: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.drop_prob = drop_prob

    def forward(self, x):
        return F.dropout(x, self.drop_prob, training=self.training)
