"""gradcore.module (``M``): Module, Linear, Conv2d, BatchNorm2d, ReLU, Sequential, ...

Example::

    >>> import gradcore.module as M
    >>> net = M.Sequential(M.Linear(4, 8), M.ReLU(), M.Linear(8, 2))
    >>> [name for name, _ in net.named_parameters()]
    ['0.weight', '0.bias', '2.weight', '2.bias']
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union

import numpy as np

from . import functional as F
from . import random as _random
from ._core import Tensor
from .tensor import Parameter


def _expand(key: str, obj) -> list:
    """``(dotted key, leaf)`` for ``obj`` if it is a Tensor or Module, and for
    every Tensor or Module inside it if it is a list, tuple or dict (nested
    ones too): ``layers.0.weight``, ``blocks.conv``."""
    if isinstance(obj, (Tensor, Module)):
        return [(key, obj)]
    if isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif isinstance(obj, dict):
        items = obj.items()
    else:
        return []
    out = []
    for k, v in items:
        out.extend((f"{key}.{kk}", leaf) for kk, leaf in _expand(str(k), v))
    return out


def _is_parameter(obj) -> bool:
    return isinstance(obj, Parameter)


def _is_buffer(obj) -> bool:
    return isinstance(obj, Tensor) and not isinstance(obj, Parameter)


def _is_module(obj) -> bool:
    return isinstance(obj, Module)


class HookHandler:
    """Returned by ``register_forward_*hook``; ``remove()`` unregisters the hook."""

    _next_id = 0

    def __init__(self, hooks: "OrderedDict", hook: Callable):
        self._hooks, self._id = hooks, HookHandler._next_id
        HookHandler._next_id += 1
        hooks[self._id] = hook

    def remove(self) -> None:
        self._hooks.pop(self._id, None)


class Module:
    """Base class of layers, MegEngine's ``M.Module``.

    Parameters (``Parameter`` attributes), buffers (other ``Tensor``
    attributes, such as BatchNorm's running statistics) and sub-modules are
    found by scanning the attributes, also inside lists, tuples and dicts, in
    the order the attributes were first set (PyTorch's order; MegEngine sorts
    the attribute names instead). Names are dotted paths: ``fc.weight``,
    ``layers.0.bias``. An object reachable twice is listed once, under its
    first name (``state_dict`` alone lists a tensor shared by two sub-modules
    under both names, as MegEngine and PyTorch do).
    """

    # class-level defaults, so a subclass that forgets super().__init__() still works
    training = True
    name = None

    def __init__(self, name: str = None):
        if name is not None and not (isinstance(name, str) and name.strip()):
            raise ValueError(f"Module name must be a non-empty string, got {name!r}")
        self.name = name
        self.training = True
        self._forward_pre_hooks: "OrderedDict[int, Callable]" = OrderedDict()
        self._forward_hooks: "OrderedDict[int, Callable]" = OrderedDict()

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}.forward is not defined")

    def __call__(self, *inputs, **kwargs):
        for hook in list(self.__dict__.get("_forward_pre_hooks", {}).values()):
            modified = hook(self, inputs)
            if modified is not None:
                inputs = modified if isinstance(modified, tuple) else (modified,)
        outputs = self.forward(*inputs, **kwargs)
        for hook in list(self.__dict__.get("_forward_hooks", {}).values()):
            modified = hook(self, inputs, outputs)
            if modified is not None:
                outputs = modified
        return outputs

    def register_forward_pre_hook(self, hook: Callable) -> HookHandler:
        """``hook(module, inputs)`` runs before forward; it may return new inputs."""
        return HookHandler(self.__dict__.setdefault("_forward_pre_hooks", OrderedDict()), hook)

    def register_forward_hook(self, hook: Callable) -> HookHandler:
        """``hook(module, inputs, outputs)`` runs after forward; it may return new outputs."""
        return HookHandler(self.__dict__.setdefault("_forward_hooks", OrderedDict()), hook)

    # ---- traversal
    def _flatten(self, *, recursive: bool = True, with_key: bool = False, prefix: Optional[str] = None,
                 predicate: Callable[[Any], bool] = lambda _: True, seen: Optional[set] = None):
        """Every Tensor and Module reachable from the attributes (sub-modules'
        too when ``recursive``) that ``predicate`` accepts, each once."""
        if seen is None:
            seen = {id(self)}
        dotted = "" if prefix is None else prefix + "."
        for key, value in list(vars(self).items()):
            for name, leaf in _expand(key, value):
                if id(leaf) in seen:
                    continue
                seen.add(id(leaf))
                if predicate(leaf):
                    yield (dotted + name, leaf) if with_key else leaf
                if recursive and isinstance(leaf, Module):
                    yield from leaf._flatten(recursive=True, with_key=with_key, prefix=dotted + name,
                                             predicate=predicate, seen=seen)

    @staticmethod
    def _drop_requires_grad(kwargs):
        # MegEngine accepts (and ignores) requires_grad: every Parameter is trainable
        kwargs.pop("requires_grad", None)
        if kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")

    def parameters(self, recursive: bool = True, **kwargs) -> Iterator[Parameter]:
        self._drop_requires_grad(kwargs)
        yield from self._flatten(recursive=recursive, predicate=_is_parameter)

    def named_parameters(self, prefix: Optional[str] = None, recursive: bool = True,
                         **kwargs) -> Iterator[Tuple[str, Parameter]]:
        self._drop_requires_grad(kwargs)
        yield from self._flatten(recursive=recursive, with_key=True, prefix=prefix, predicate=_is_parameter)

    def buffers(self, recursive: bool = True) -> Iterator[Tensor]:
        """Tensor attributes that are not Parameters (e.g. running statistics)."""
        yield from self._flatten(recursive=recursive, predicate=_is_buffer)

    def named_buffers(self, prefix: Optional[str] = None, recursive: bool = True) -> Iterator[Tuple[str, Tensor]]:
        yield from self._flatten(recursive=recursive, with_key=True, prefix=prefix, predicate=_is_buffer)

    def tensors(self, recursive: bool = True) -> Iterator[Tensor]:
        """Parameters and buffers."""
        yield from self._flatten(recursive=recursive, predicate=lambda o: isinstance(o, Tensor))

    def named_tensors(self, prefix: Optional[str] = None, recursive: bool = True) -> Iterator[Tuple[str, Tensor]]:
        yield from self._flatten(recursive=recursive, with_key=True, prefix=prefix,
                                 predicate=lambda o: isinstance(o, Tensor))

    def children(self) -> Iterator["Module"]:
        """The sub-modules that are direct attributes (or inside one)."""
        yield from self._flatten(recursive=False, predicate=_is_module)

    def named_children(self) -> Iterator[Tuple[str, "Module"]]:
        yield from self._flatten(recursive=False, with_key=True, predicate=_is_module)

    def modules(self) -> Iterator["Module"]:
        """This module, then every sub-module (each once)."""
        yield self
        yield from self._flatten(predicate=_is_module)

    def named_modules(self, prefix: Optional[str] = None) -> Iterator[Tuple[str, "Module"]]:
        yield ("" if prefix is None else prefix), self
        yield from self._flatten(with_key=True, prefix=prefix, predicate=_is_module)

    def apply(self, fn: Callable[["Module"], Any]) -> None:
        """``fn(m)`` for this module and every sub-module."""
        for m in list(self.modules()):
            fn(m)

    # ---- modes
    def train(self, mode: bool = True, recursive: bool = True) -> "Module":
        """Set ``training`` on this module (and, when ``recursive``, every
        sub-module); returns the module."""
        for m in (self.modules() if recursive else (self,)):
            m.training = bool(mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    # ---- state
    def _state_items(self, prefix: str = "") -> Iterator[Tuple[str, Tensor, "Module"]]:
        """``(key, tensor, owner)`` for every parameter and buffer: a module's
        own tensors first, then its sub-modules' (MegEngine's state_dict order).
        A tensor shared by two sub-modules is listed under both names, as in
        MegEngine and PyTorch."""
        active = set()

        def walk(module, dotted):
            active.add(id(module))      # only guards against a module containing itself
            for k, t in module._flatten(recursive=False, with_key=True, predicate=lambda o: isinstance(o, Tensor)):
                yield dotted + k, t, module
            for k, sub in module._flatten(recursive=False, with_key=True, predicate=_is_module):
                if id(sub) not in active:
                    yield from walk(sub, dotted + k + ".")
            active.discard(id(module))
        yield from walk(self, prefix)

    def state_dict(self, rst=None, prefix: str = "", keep_var: bool = False) -> "OrderedDict[str, Any]":
        """Parameters and buffers by dotted name, as NumPy copies (the Tensors
        themselves with ``keep_var=True``). As in MegEngine, BatchNorm's
        (1, C, 1, 1) tensors are stored flat, shape (C,)."""
        rst = OrderedDict() if rst is None else rst
        for k, t, owner in self._state_items(prefix):
            if keep_var:
                rst[k] = t
            else:
                value = t.numpy().copy()
                rst[k] = value.reshape(-1) if isinstance(owner, _BatchNorm) else value
        return rst

    def load_state_dict(self, state_dict: Union[Dict[str, Any], Callable[[str, Tensor], Any]],
                        strict: bool = True) -> None:
        """Load values saved by ``state_dict``: a dict by name (a value of None
        skips that entry), or a callable ``fn(key, tensor) -> array or None``.
        With ``strict``, a missing or an unexpected key raises KeyError; a shape
        that differs raises ValueError (BatchNorm also accepts its flat (C,)
        form). Nothing is changed unless every check passes."""
        if isinstance(state_dict, dict):
            unexpected = set(state_dict)

            def closure(k, _):
                return state_dict.get(k)
        elif callable(state_dict):
            unexpected, closure = set(), state_dict
        else:
            raise TypeError(f"load_state_dict expects a dict or a callable, got {type(state_dict).__name__}")
        loads, missing = [], []
        for k, t, owner in self._state_items():
            unexpected.discard(k)
            value = closure(k, t)
            if value is None:
                missing.append(k)
                continue
            value = np.asarray(value.numpy() if isinstance(value, Tensor) else value)
            if value.shape != t.shape:
                flat_ok = isinstance(owner, _BatchNorm) and value.size == int(np.prod(t.shape))
                if not flat_ok:
                    raise ValueError(f"load_state_dict: {k}: shape {value.shape} does not match {t.shape}")
                value = value.reshape(t.shape)
            loads.append((t, value))
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict (strict): missing keys {missing}, "
                           f"unexpected keys {sorted(unexpected)}")
        for t, value in loads:
            # a copy in the tensor's own dtype: later changes to the dict do not leak in
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
        for t in list(self.tensors()):
            if t.device != dev:
                t._reset(Tensor(t, device=dev))
                t.grad = None
        return self

    def zero_grad(self) -> None:
        """Set every existing parameter gradient to zeros (MegEngine's
        deprecated ``zero_grad``; ``optimizer.clear_grad()`` sets them to None)."""
        for p in self.parameters():
            if p.grad is not None:
                p.grad = F.zeros_like(p.grad)

    # ---- printing
    def _module_info_string(self) -> str:
        return ""

    def __repr__(self):
        info = self._module_info_string()
        children = [f"({k}): {m!r}".replace("\n", "\n  ") for k, m in self.named_children()]
        if not children:
            return f"{type(self).__name__}({info})"
        lines = ([info] if info else []) + children
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"


class Linear(Module):
    """``y = x @ weight.T + bias`` with weight of shape (out_features, in_features)
    drawn from N(0, 1 / in_features) and bias of shape (out_features,) at zero."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight = Parameter(np.zeros((self.out_features, self.in_features), "float32"))
        self.bias = Parameter(np.zeros(self.out_features, "float32")) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = np.sqrt(1.0 / self.in_features)
        self.weight._reset(Tensor(_random.generator().normal(0.0, std, self.weight.shape).astype("float32")))
        if self.bias is not None:
            self.bias._reset(Tensor(np.zeros(self.bias.shape, "float32")))

    def forward(self, x):
        if not isinstance(x, Tensor):
            x = Tensor(x)
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"{self!r}: expected input whose last dimension is {self.in_features}, "
                             f"got shape {x.shape}")
        return F.linear(x, self.weight, self.bias)

    def _module_info_string(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class Identity(Module):
    def forward(self, x):
        return x


class Sequential(Module):
    """Layers applied in order; given positionally they are named "0", "1",
    ..., given as an (Ordered)dict they keep its keys. Indexing, slicing (a
    new Sequential), ``len`` and iteration work as on a list.

    Example::

        >>> net = Sequential(Linear(2, 4), ReLU(), Linear(4, 1))
        >>> [n for n, _ in net.named_parameters()]
        ['0.weight', '0.bias', '2.weight', '2.bias']
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
                raise ValueError(f"Sequential: layer name {key!r} clashes with an attribute of Sequential")
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


def _pair(v, what: str, allow_zero: bool = True):
    pair = (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))
    if min(pair) < 0 or (not allow_zero and min(pair) == 0):
        raise ValueError(f"Conv2d: {what} must be {'non-negative' if allow_zero else 'positive'}, got {v}")
    return pair


class Conv2d(Module):
    """2-D convolution over NCHW input, MegEngine's ``M.Conv2d``: weight of
    shape (out_channels, in_channels, kh, kw), or with ``groups > 1``
    MegEngine's (groups, out_channels // groups, in_channels // groups, kh, kw),
    drawn from N(0, 1 / (kh * kw * in_channels)); bias of shape
    (1, out_channels, 1, 1) starting at zero.

    Example::

        >>> conv = Conv2d(3, 8, 3, padding=1)
        >>> conv(x).shape                # x: (N, 3, H, W) -> (N, 8, H, W)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True,
                 conv_mode: str = "cross_correlation", compute_mode: str = "default", **kwargs):
        super().__init__(**kwargs)
        groups = int(groups)
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: in_channels={in_channels} and out_channels={out_channels} "
                             f"must both be divisible by groups={groups}")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = _pair(kernel_size, "kernel_size", allow_zero=False)
        self.stride = _pair(stride, "stride", allow_zero=False)
        self.padding = _pair(padding, "padding")
        self.dilation = _pair(dilation, "dilation", allow_zero=False)
        self.groups = groups
        self.conv_mode, self.compute_mode = conv_mode, compute_mode
        kh, kw = self.kernel_size
        if groups == 1:
            shape = (out_channels, in_channels, kh, kw)
        else:
            shape = (groups, out_channels // groups, in_channels // groups, kh, kw)
        self.weight = Parameter(np.zeros(shape, "float32"))
        self.bias = Parameter(np.zeros((1, out_channels, 1, 1), "float32")) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        kh, kw = self.kernel_size
        std = np.sqrt(1.0 / (kh * kw * self.in_channels))
        self.weight._reset(Tensor(_random.generator().normal(0.0, std, self.weight.shape).astype("float32")))
        if self.bias is not None:
            self.bias._reset(Tensor(np.zeros(self.bias.shape, "float32")))

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups, self.conv_mode, self.compute_mode)

    def _module_info_string(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        if self.stride != (1, 1):
            s += f", stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


class MaxPool2d(Module):
    """``F.max_pool2d`` as a layer (stride defaults to kernel_size)."""

    def __init__(self, kernel_size, stride=None, padding=0, **kwargs):
        super().__init__(**kwargs)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def _module_info_string(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(Module):
    """``F.avg_pool2d`` as a layer (stride defaults to kernel_size)."""

    def __init__(self, kernel_size, stride=None, padding=0, mode: str = "average_count_exclude_padding",
                 **kwargs):
        super().__init__(**kwargs)
        self.kernel_size, self.stride, self.padding, self.mode = kernel_size, stride, padding, mode

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.mode)

    def _module_info_string(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, mode={self.mode!r}")


class Flatten(Module):
    """``F.flatten(x, start_axis, end_axis)``; by default keeps the batch axis."""

    def __init__(self, start_axis: int = 1, end_axis: int = -1, **kwargs):
        super().__init__(**kwargs)
        self.start_axis, self.end_axis = start_axis, end_axis

    def forward(self, x):
        return F.flatten(x, self.start_axis, self.end_axis)


class _BatchNorm(Module):
    """Batch normalisation with running statistics, MegEngine's convention:
    ``running = momentum * running + (1 - momentum) * batch`` (so the default
    ``momentum=0.9`` is PyTorch's 0.1), the running variance unbiased.
    Parameters and statistics have shape (1, C, 1, 1); ``state_dict`` stores
    them flat. In eval() the running statistics normalise; without
    ``track_running_stats`` the batch statistics always do. ``freeze`` uses
    the running statistics and fixed weight and bias even in training."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.9,
                 affine: bool = True, track_running_stats: bool = True, freeze: bool = False, **kwargs):
        super().__init__(**kwargs)
        if freeze and not track_running_stats:
            raise ValueError(f"{type(self).__name__}: freeze needs track_running_stats=True")
        self.num_features, self.eps, self.momentum = int(num_features), eps, momentum
        self.affine, self.track_running_stats, self.freeze = affine, track_running_stats, freeze
        shape = (1, self.num_features, 1, 1)
        self.weight = Parameter(np.ones(shape, "float32")) if affine else None
        self.bias = Parameter(np.zeros(shape, "float32")) if affine else None
        if track_running_stats:
            self.running_mean = Tensor(np.zeros(shape, "float32"))
            self.running_var = Tensor(np.ones(shape, "float32"))
        else:
            self.running_mean = self.running_var = None

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean._reset(Tensor(np.zeros(self.running_mean.shape, "float32")))
            self.running_var._reset(Tensor(np.ones(self.running_var.shape, "float32")))

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            self.weight._reset(Tensor(np.ones(self.weight.shape, "float32")))
            self.bias._reset(Tensor(np.zeros(self.bias.shape, "float32")))

    def _check_input(self, x):
        raise NotImplementedError

    def forward(self, x):
        if not isinstance(x, Tensor):
            x = Tensor(x)
        self._check_input(x)
        shape = x.shape
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
            y = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                             training=self.training or not self.track_running_stats,
                             momentum=self.momentum, eps=self.eps)
        return y if y.shape == shape else y.reshape(shape)

    def _module_info_string(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of (N, C, H, W) inputs (see ``_BatchNorm``).

    Example::

        >>> bn = BatchNorm2d(16); y = bn(x)
    """

    def _check_input(self, x):
        if x.ndim != 4 or x.shape[1] != self.num_features:
            raise ValueError(f"BatchNorm2d({self.num_features}): expected input (N, {self.num_features}, H, W), "
                             f"got shape {x.shape}")


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of (N, C) or (N, C, L) inputs (see ``_BatchNorm``)."""

    def _check_input(self, x):
        if x.ndim not in (2, 3) or x.shape[1] != self.num_features:
            raise ValueError(f"BatchNorm1d({self.num_features}): expected input (N, {self.num_features}) or "
                             f"(N, {self.num_features}, L), got shape {x.shape}")


class Dropout(Module):
    """Dropout with probability ``drop_prob`` while training; identity in eval()."""

    def __init__(self, drop_prob: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.drop_prob = drop_prob

    def forward(self, x):
        return F.dropout(x, self.drop_prob, training=self.training)

    def _module_info_string(self):
        return f"drop_prob={self.drop_prob}"
