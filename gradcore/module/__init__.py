"""gradcore.module (``M``): MegEngine's layers.

Module, Sequential, Identity, Linear, Conv1d, Conv2d, MaxPool2d, AvgPool2d,
AdaptiveMaxPool2d, AdaptiveAvgPool2d, Flatten, BatchNorm1d, BatchNorm2d,
LayerNorm, GroupNorm, InstanceNorm, Dropout, Embedding, and the activations
ReLU, Sigmoid, SiLU, GELU, LeakyReLU, PReLU, Softmax.

Example::

    >>> import gradcore.module as M
    >>> net = M.Sequential(M.Linear(4, 8), M.ReLU(), M.Linear(8, 2))
    >>> [name for name, _ in net.named_parameters()]
    ['0.bias', '0.weight', '2.bias', '2.weight']
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union

import numpy as np

from .. import functional as F
from .. import random as _random
from .._core import Tensor
from ..tensor import Parameter
from . import init  # noqa: F401  (M.init, as in MegEngine)


def _sorted_keys(keys) -> list:
    """Attribute names or dict keys in MegEngine's traversal order: sorted.
    Keys that are not strings (they name no Tensor or Module, see _expand)
    go last, by their text, so a dict mixing key types can still be scanned."""
    return sorted(keys, key=lambda k: (not isinstance(k, str), str(k)))


def _expand(key: str, obj) -> list:
    """``(dotted key, leaf)`` for ``obj`` if it is a Tensor or Module, and for
    every Tensor or Module inside it if it is a list, tuple or dict (nested
    ones too): ``layers.0.weight``, ``blocks.conv``. Lists and tuples go in
    index order, dicts in sorted key order (MegEngine's)."""
    if isinstance(obj, (Tensor, Module)):
        return [(key, obj)]
    if isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif isinstance(obj, dict):
        items = [(k, obj[k]) for k in _sorted_keys(obj)]
    else:
        return []
    out = []
    for k, v in items:
        sub = _expand(str(k), v)
        if sub and not isinstance(k, str) and isinstance(obj, dict):
            # MegEngine's rule: a Tensor or Module in a dict needs a str key to be named
            raise AssertionError(f"keys for Tensor and Module must be str, error key: {k}")
        out.extend((f"{key}.{kk}", leaf) for kk, leaf in sub)
    return out


def _count(name: str, what: str, v, low: int = 0) -> int:
    """A size argument of a layer (features, channels, groups...) as an int
    no smaller than ``low``; ``int()`` would truncate 1.5 and misreport a
    string, and a negative size would reach NumPy ("negative dimensions")."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            v = int(v)
        else:
            raise TypeError(f"{name}: {what} must be an int, got {type(v).__name__} {v!r}")
    if v < low:
        raise ValueError(f"{name}: {what} must be >= {low}, got {v}")
    return int(v)


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
    MegEngine's order: attribute names (and dict keys) sorted at each level,
    each sub-module's entries right after it (depth first), so ``bn.bias``,
    ``bn.weight``, ``i.bn.bias``, ..., ``param``. Names are dotted paths:
    ``fc.weight``, ``layers.0.bias``. An object reachable twice is listed
    once, under its first name in that order. ``state_dict`` has its own
    order, MegEngine's too: a module's own tensors (sorted), then each
    sub-module's state (sorted by name), and it lists a tensor shared by two
    sub-modules under both names, as MegEngine and PyTorch do.
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
    def _flatten(self, *, recursive: bool = True, with_key: bool = False, with_parent: bool = False,
                 prefix: Optional[str] = None, predicate: Callable[[Any], bool] = lambda _: True,
                 seen: Optional[set] = None):
        """Every Tensor and Module reachable from the attributes (sub-modules'
        too when ``recursive``) that ``predicate`` accepts, each once; with
        ``with_key`` as ``(dotted name, obj)``, with ``with_parent`` also the
        module that holds it: ``(obj, parent)`` or ``(name, obj, parent)``."""
        if seen is None:
            seen = {id(self)}
        dotted = "" if prefix is None else prefix + "."
        attributes = vars(self)
        for key in _sorted_keys(list(attributes)):
            for name, leaf in _expand(key, attributes[key]):
                if id(leaf) in seen:
                    continue
                seen.add(id(leaf))
                if predicate(leaf):
                    if with_key:
                        yield (dotted + name, leaf, self) if with_parent else (dotted + name, leaf)
                    else:
                        yield (leaf, self) if with_parent else leaf
                if recursive and isinstance(leaf, Module):
                    yield from leaf._flatten(recursive=True, with_key=with_key, with_parent=with_parent,
                                             prefix=dotted + name, predicate=predicate, seen=seen)

    @staticmethod
    def _drop_requires_grad(kwargs):
        # MegEngine accepts (and ignores) requires_grad: every Parameter is trainable
        kwargs.pop("requires_grad", None)
        return Module._check_kwargs(kwargs)

    @staticmethod
    def _check_kwargs(kwargs) -> bool:
        """The one extra keyword the iterators take, MegEngine's ``with_parent``."""
        with_parent = bool(kwargs.pop("with_parent", False))
        if kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
        return with_parent

    def parameters(self, recursive: bool = True, **kwargs) -> Iterator[Parameter]:
        wp = self._drop_requires_grad(kwargs)
        yield from self._flatten(recursive=recursive, with_parent=wp, predicate=_is_parameter)

    def named_parameters(self, prefix: Optional[str] = None, recursive: bool = True,
                         **kwargs) -> Iterator[Tuple[str, Parameter]]:
        wp = self._drop_requires_grad(kwargs)
        yield from self._flatten(recursive=recursive, with_key=True, with_parent=wp, prefix=prefix,
                                 predicate=_is_parameter)

    def buffers(self, recursive: bool = True, **kwargs) -> Iterator[Tensor]:
        """Tensor attributes that are not Parameters (e.g. running statistics)."""
        wp = self._check_kwargs(kwargs)
        yield from self._flatten(recursive=recursive, with_parent=wp, predicate=_is_buffer)

    def named_buffers(self, prefix: Optional[str] = None, recursive: bool = True,
                      **kwargs) -> Iterator[Tuple[str, Tensor]]:
        wp = self._check_kwargs(kwargs)
        yield from self._flatten(recursive=recursive, with_key=True, with_parent=wp, prefix=prefix,
                                 predicate=_is_buffer)

    def tensors(self, recursive: bool = True, **kwargs) -> Iterator[Tensor]:
        """Parameters and buffers."""
        wp = self._check_kwargs(kwargs)
        yield from self._flatten(recursive=recursive, with_parent=wp, predicate=lambda o: isinstance(o, Tensor))

    def named_tensors(self, prefix: Optional[str] = None, recursive: bool = True,
                      **kwargs) -> Iterator[Tuple[str, Tensor]]:
        wp = self._check_kwargs(kwargs)
        yield from self._flatten(recursive=recursive, with_key=True, with_parent=wp, prefix=prefix,
                                 predicate=lambda o: isinstance(o, Tensor))

    def children(self, **kwargs) -> Iterator["Module"]:
        """The sub-modules that are direct attributes (or inside one)."""
        wp = self._check_kwargs(kwargs)
        yield from self._flatten(recursive=False, with_parent=wp, predicate=_is_module)

    def named_children(self, **kwargs) -> Iterator[Tuple[str, "Module"]]:
        wp = self._check_kwargs(kwargs)
        yield from self._flatten(recursive=False, with_key=True, with_parent=wp, predicate=_is_module)

    def modules(self, **kwargs) -> Iterator["Module"]:
        """This module, then every sub-module (each once); with
        ``with_parent=True`` as ``(module, parent)``, the parent of this one None."""
        wp = self._check_kwargs(kwargs)
        yield (self, None) if wp else self
        yield from self._flatten(with_parent=wp, predicate=_is_module)

    def named_modules(self, prefix: Optional[str] = None, **kwargs) -> Iterator[Tuple[str, "Module"]]:
        wp = self._check_kwargs(kwargs)
        name = "" if prefix is None else prefix
        yield (name, self, None) if wp else (name, self)
        yield from self._flatten(with_key=True, with_parent=wp, prefix=prefix, predicate=_is_module)

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
        from ..devices import norm_device
        dev = norm_device(device)
        for t in list(self.tensors()):
            if t.device != dev:
                t._reset(Tensor(t, device=dev))
                t.grad = None
        return self

    def replace_param(self, params: Dict[int, Parameter], start_pos: int, seen: Optional[set] = None) -> int:
        """MegEngine's (deprecated) ``replace_param``: number the Parameters
        that are direct attributes, depth first through sub-modules that are
        direct attributes, in sorted attribute order (``parameters()``'s
        order), from ``start_pos`` on, and put ``params[i]`` (same shape) in
        place of the i-th; returns how many were numbered."""
        offset = 0
        if seen is None:
            seen = {id(self)}
        attributes = vars(self)
        for key in _sorted_keys(list(attributes)):
            value = attributes[key]
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, Parameter):
                new = params.get(start_pos + offset)
                if new is not None:
                    if tuple(new.shape) != tuple(value.shape):
                        raise ValueError(f"replace_param: {key!r} has shape {value.shape}, "
                                         f"the replacement {new.shape}")
                    setattr(self, key, new)
                offset += 1
            elif isinstance(value, Module):
                offset += value.replace_param(params, start_pos + offset, seen)
        return offset

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
        # every attribute that holds a module, under each name (a module
        # reachable twice is printed twice, as in MegEngine)
        children = [f"({k}): {m!r}".replace("\n", "\n  ")
                    for key, value in list(vars(self).items())
                    for k, m in _expand(key, value) if isinstance(m, Module)]
        if not children:
            return f"{type(self).__name__}({info})"
        lines = ([info] if info else []) + children
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"


class Linear(Module):
    """``y = x @ weight.T + bias`` with weight of shape (out_features, in_features)
    drawn from N(0, 1 / in_features) and bias of shape (out_features,) at zero."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.in_features = _count("Linear", "in_features", in_features)
        self.out_features = _count("Linear", "out_features", out_features)
        self.weight = Parameter(np.zeros((self.out_features, self.in_features), "float32"))
        self.bias = Parameter(np.zeros(self.out_features, "float32")) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = np.sqrt(1.0 / max(self.in_features, 1))     # (in_features=0: an empty weight)
        self.weight._reset(Tensor(_random.generator().normal(0.0, std, self.weight.shape).astype("float32")))
        if self.bias is not None:
            self.bias._reset(Tensor(np.zeros(self.bias.shape, "float32")))

    def forward(self, x):
        if not isinstance(x, Tensor):
            x = F._t(x, name="Linear")
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"{self!r}: expected input whose last dimension is {self.in_features}, "
                             f"got shape {x.shape}")
        return F.linear(x, self.weight, self.bias)

    def _module_info_string(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Identity(Module):
    """Returns its input unchanged (a placeholder layer).

    Example::

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

        >>> net = Sequential(Linear(2, 4), ReLU(), Linear(4, 1))
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


def _pair(v, what: str, allow_zero: bool = True, name: str = "Conv2d"):
    if isinstance(v, (tuple, list)) and len(v) != 2:
        raise ValueError(f"{name}: {what} must be an int or a pair of ints, got {v!r}")
    low = 0 if allow_zero else 1
    try:
        pair = tuple(_count(name, what, i, low) for i in v) if isinstance(v, (tuple, list)) else \
            (_count(name, what, v, low),) * 2
    except ValueError:
        raise ValueError(f"{name}: {what} must be {'non-negative' if allow_zero else 'positive'}, got {v}") from None
    return pair


class Conv2d(Module):
    """2-D convolution over NCHW input, MegEngine's ``M.Conv2d``: weight of
    shape (out_channels, in_channels, kh, kw), or with ``groups > 1``
    MegEngine's (groups, out_channels // groups, in_channels // groups, kh, kw),
    drawn from N(0, 1 / (kh * kw * in_channels)); bias of shape
    (1, out_channels, 1, 1) starting at zero. ``padding_mode`` "reflect" or
    "replicate" pads with ``F.nn.pad`` instead of zeros.

    Example::

        >>> conv = Conv2d(3, 8, 3, padding=1)
        >>> conv(x).shape                # x: (N, 3, H, W) -> (N, 8, H, W)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True,
                 conv_mode: str = "cross_correlation", compute_mode: str = "default",
                 padding_mode: str = "zeros", **kwargs):
        super().__init__(**kwargs)
        groups = _count("Conv2d", "groups", groups, 1)
        in_channels = _count("Conv2d", "in_channels", in_channels, 1)
        out_channels = _count("Conv2d", "out_channels", out_channels, 1)
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: in_channels={in_channels} and out_channels={out_channels} "
                             f"must both be divisible by groups={groups}")
        if padding_mode not in ("zeros", "reflect", "replicate"):
            raise ValueError(f"Conv2d: padding_mode must be 'zeros', 'reflect' or 'replicate', "
                             f"got {padding_mode!r}")
        self.padding_mode = padding_mode
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
        padding = self.padding
        if getattr(self, "padding_mode", "zeros") != "zeros" and padding != (0, 0):
            ph, pw = padding
            x = F.nn.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), mode=self.padding_mode)
            padding = (0, 0)
        return F.conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation,
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


def _single(v, what: str, allow_zero: bool = True) -> int:
    value = v[0] if isinstance(v, (tuple, list)) and len(v) == 1 else v
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"Conv1d: {what} must be an int, got {v!r}")
    if value < 0 or (not allow_zero and value == 0):
        raise ValueError(f"Conv1d: {what} must be {'non-negative' if allow_zero else 'positive'}, got {v}")
    return int(value)


class Conv1d(Module):
    """1-D convolution over (N, C, L) input, MegEngine's ``M.Conv1d``: weight
    of shape (out_channels, in_channels, kernel_size), or with ``groups > 1``
    (groups, out_channels // groups, in_channels // groups, kernel_size),
    drawn from N(0, 1 / (kernel_size * in_channels)); bias of shape
    (1, out_channels, 1) starting at zero. ``padding_mode`` "reflect" or
    "replicate" pads with ``F.nn.pad`` instead of zeros.

    Example::

        >>> conv = Conv1d(3, 8, 3, padding=1)
        >>> conv(x).shape                # x: (N, 3, L) -> (N, 8, L)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, dilation: int = 1, groups: int = 1, bias: bool = True,
                 conv_mode: str = "cross_correlation", compute_mode: str = "default",
                 padding_mode: str = "zeros", **kwargs):
        super().__init__(**kwargs)
        groups = _count("Conv1d", "groups", groups, 1)
        in_channels = _count("Conv1d", "in_channels", in_channels, 1)
        out_channels = _count("Conv1d", "out_channels", out_channels, 1)
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv1d: in_channels={in_channels} and out_channels={out_channels} "
                             f"must both be divisible by groups={groups}")
        if padding_mode not in ("zeros", "reflect", "replicate"):
            raise ValueError(f"Conv1d: padding_mode must be 'zeros', 'reflect' or 'replicate', "
                             f"got {padding_mode!r}")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = _single(kernel_size, "kernel_size", allow_zero=False)
        self.stride = _single(stride, "stride", allow_zero=False)
        self.padding = _single(padding, "padding")
        self.dilation = _single(dilation, "dilation", allow_zero=False)
        self.groups = groups
        self.conv_mode, self.compute_mode, self.padding_mode = conv_mode, compute_mode, padding_mode
        k = self.kernel_size
        if groups == 1:
            shape = (out_channels, in_channels, k)
        else:
            shape = (groups, out_channels // groups, in_channels // groups, k)
        self.weight = Parameter(np.zeros(shape, "float32"))
        self.bias = Parameter(np.zeros((1, out_channels, 1), "float32")) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = np.sqrt(1.0 / (self.kernel_size * self.in_channels))
        self.weight._reset(Tensor(_random.generator().normal(0.0, std, self.weight.shape).astype("float32")))
        if self.bias is not None:
            self.bias._reset(Tensor(np.zeros(self.bias.shape, "float32")))

    def forward(self, x):
        padding = self.padding
        if self.padding_mode != "zeros" and padding:
            x = F.nn.pad(x, ((0, 0), (0, 0), (padding, padding)), mode=self.padding_mode)
            padding = 0
        return F.nn.conv1d(x, self.weight, self.bias, self.stride, padding, self.dilation,
                           self.groups, self.conv_mode, self.compute_mode)

    def _module_info_string(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        if self.stride != 1:
            s += f", stride={self.stride}"
        if self.padding != 0:
            s += f", padding={self.padding}"
        if self.dilation != 1:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode!r}"
        return s


class MaxPool2d(Module):
    """``F.max_pool2d`` as a layer (stride defaults to kernel_size)."""

    def __init__(self, kernel_size, stride=None, padding=0, **kwargs):
        super().__init__(**kwargs)
        # MegEngine keeps the stride it will use: kernel_size when none is given
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
        from ..ops.conv import MaxPool2d as _op
        _op(kernel_size, self.stride, padding)      # bad sizes fail here, named, not at the first call

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def _module_info_string(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(Module):
    """``F.avg_pool2d`` as a layer (stride defaults to kernel_size)."""

    def __init__(self, kernel_size, stride=None, padding=0, mode: str = "average_count_exclude_padding",
                 **kwargs):
        super().__init__(**kwargs)
        self.kernel_size, self.stride, self.padding, self.mode = kernel_size, stride or kernel_size, padding, mode
        from ..ops.conv import AvgPool2d as _op
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

        >>> M.AdaptiveMaxPool2d((2, 2))(x).shape      # x: (N, C, H, W) -> (N, C, 2, 2)
    """

    def forward(self, x):
        return F.nn.adaptive_max_pool2d(x, self.oshp)


class AdaptiveAvgPool2d(_AdaptivePool2d):
    """Average pooling of (N, C, H, W) input to the output size ``oshp`` (an
    int or (OH, OW)): ``F.nn.adaptive_avg_pool2d`` as a layer.

    Example::

        >>> M.AdaptiveAvgPool2d(1)(x).shape           # x: (N, C, H, W) -> (N, C, 1, 1)
    """

    def forward(self, x):
        return F.nn.adaptive_avg_pool2d(x, self.oshp)


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
        self.num_features = _count(type(self).__name__, "num_features", num_features, 1)
        self.eps, self.momentum = eps, momentum
        self.affine, self.track_running_stats, self.freeze = affine, track_running_stats, freeze
        # statistics exist only when tracked from the start; turning tracking
        # off later is allowed (batch statistics are used), turning it on is not
        self._track_running_stats_saved = track_running_stats
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
            x = F._t(x, name=type(self).__name__)
        self._check_input(x)
        if self.track_running_stats and not getattr(self, "_track_running_stats_saved", True):
            raise ValueError(f"{type(self).__name__}: track_running_stats was False at construction "
                             f"(no running statistics exist) and cannot be turned on later")
        if x.size == 0:
            # an empty batch: nothing to normalise and no statistics to update
            # (their mean would be NaN); the empty input comes back, as a copy
            return F.copy(x)
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
            # without tracking, batch statistics in train and eval alike, and
            # the running statistics (if any) are left alone
            track = self.track_running_stats
            y = F.batch_norm(x, self.running_mean if track else None, self.running_var if track else None,
                             self.weight, self.bias, training=self.training or not track,
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
        self.num_parameters = _count("PReLU", "num_parameters", num_parameters)
        if self.num_parameters < 1:
            raise ValueError(f"PReLU: num_parameters must be positive, got {num_parameters}")
        shape = (1, self.num_parameters, 1, 1) if self.num_parameters > 1 else (1,)
        self.weight = Parameter(np.full(shape, init, "float32"))

    def forward(self, x):
        if self.num_parameters > 1:
            x = x if isinstance(x, Tensor) else F._t(x, name="PReLU")
            if x.ndim != 4 or x.shape[1] != self.num_parameters:
                raise ValueError(f"PReLU({self.num_parameters}): expected input (N, {self.num_parameters}, H, W), "
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
            raise ValueError("Embedding: padding_idx is not supported (give None)")
        if max_norm is not None or norm_type is not None:
            raise ValueError("Embedding: max_norm and norm_type are not supported (give None)")
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
                raise ValueError(f"Embedding: initial_weight has shape {value.shape}, expected {shape} "
                                 f"(num_embeddings, embedding_dim)")
            self.weight = Parameter(value.astype("float32", copy=False))

    def reset_parameters(self) -> None:
        self.weight._reset(Tensor(_random.generator().normal(0.0, 1.0, self.weight.shape).astype("float32")))

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
            raise ValueError(f"Embedding.from_pretrained: embeddings must be 2-d, got shape {shape}")
        return cls(shape[0], shape[1], padding_idx=padding_idx, max_norm=max_norm, norm_type=norm_type,
                   initial_weight=embeddings, freeze=freeze)

    def _module_info_string(self):
        return f"{self.num_embeddings}, {self.embedding_dim}" + (", freeze=True" if self.freeze else "")


# ---------------------------------------------------------------- normalisation
class LayerNorm(Module):
    """Normalises over the last ``len(normalized_shape)`` axes,
    ``(x - mean) / sqrt(var + eps)`` with the biased variance, then
    ``* weight + bias`` (both of shape ``normalized_shape``, starting at ones
    and zeros) when ``affine``.

    Example::

        >>> ln = M.LayerNorm(8)
        >>> ln(x).shape              # x: (N, L, 8) -> (N, L, 8)
    """

    def __init__(self, normalized_shape: Union[int, Tuple[int, ...]], eps: float = 1e-5,
                 affine: bool = True, **kwargs):
        super().__init__(**kwargs)
        if isinstance(normalized_shape, (int, np.integer, float, np.floating, str)) or normalized_shape is None:
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(_count("LayerNorm", "normalized_shape", d, 1) for d in normalized_shape)
        self.eps, self.affine = eps, affine
        self.weight = Parameter(np.ones(self.normalized_shape, "float32")) if affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, "float32")) if affine else None

    def reset_parameters(self) -> None:
        if self.affine:
            self.weight._reset(Tensor(np.ones(self.normalized_shape, "float32")))
            self.bias._reset(Tensor(np.zeros(self.normalized_shape, "float32")))

    def forward(self, x):
        return F.nn.layer_norm(x, self.normalized_shape, self.affine, self.weight, self.bias, self.eps)

    def _module_info_string(self):
        return f"normalized_shape={self.normalized_shape}, eps={self.eps}, affine={self.affine}"


class GroupNorm(Module):
    """Group normalisation of (N, C, H, W) input (any (N, C, ...) works): the
    channels are split into ``num_groups`` groups, each normalised over its
    channels and the spatial axes with the biased variance; then
    ``* weight + bias``, per channel, of shape (C,) when ``affine``.

    Example::

        >>> gn = M.GroupNorm(4, 16)
        >>> gn(x).shape              # x: (N, 16, H, W) -> (N, 16, H, W)
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.num_groups = _count("GroupNorm", "num_groups", num_groups, 1)
        self.num_channels = _count("GroupNorm", "num_channels", num_channels, 1)
        if self.num_groups < 1 or self.num_channels % self.num_groups:
            raise ValueError(f"GroupNorm: num_channels={num_channels} must be divisible by "
                             f"num_groups={num_groups}")
        self.eps, self.affine = eps, affine
        self.weight = Parameter(np.ones(self.num_channels, "float32")) if affine else None
        self.bias = Parameter(np.zeros(self.num_channels, "float32")) if affine else None

    def reset_parameters(self) -> None:
        if self.affine:
            self.weight._reset(Tensor(np.ones(self.num_channels, "float32")))
            self.bias._reset(Tensor(np.zeros(self.num_channels, "float32")))

    def forward(self, x):
        name = type(self).__name__
        if not isinstance(x, Tensor):
            x = F._t(x, name=name)
        c = self.num_channels
        if x.ndim < 2 or x.shape[1] != c:
            raise ValueError(f"{name}: expected input (N, {c}, ...), got shape {x.shape}")
        return F.nn.group_norm(x, self.num_groups, self.affine, self.weight, self.bias, self.eps)

    def _module_info_string(self):
        return f"groups={self.num_groups}, channels={self.num_channels}, eps={self.eps}, affine={self.affine}"


class InstanceNorm(GroupNorm):
    """Instance normalisation of (N, C, H, W) input (any (N, C, ...) works):
    each channel of each sample normalised over the spatial axes, the same as
    ``GroupNorm(num_channels, num_channels)``; then ``* weight + bias`` of
    shape (C,) when ``affine``. No running statistics: train and eval agree.

    Example::

        >>> norm = M.InstanceNorm(16)
        >>> norm(x).shape            # x: (N, 16, H, W) -> (N, 16, H, W)
    """

    def __init__(self, num_channels: int, eps: float = 1e-5, affine: bool = True, **kwargs):
        n = _count("InstanceNorm", "num_channels", num_channels, 1)
        super().__init__(n, n, eps, affine, **kwargs)

    def _module_info_string(self):
        return f"channels={self.num_channels}, eps={self.eps}, affine={self.affine}"


from .conv import Conv3d, ConvTranspose2d  # noqa: E402  (they build on Module above)
from .rnn import GRU, GRUCell, LSTM, LSTMCell, RNN, RNNCell  # noqa: E402,F401
from .attention import MultiHeadAttention  # noqa: E402,F401
