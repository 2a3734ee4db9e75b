"""The base of every layer: ``Module`` (parameters and buffers with
MegEngine's dotted names, ``state_dict``/``load_state_dict``, train/eval,
hooks) and the argument checks the layers share. It is a module of its own,
as MegEngine's ``megengine.module.module``, so that the layer modules
(``gradcore.module`` itself, ``gradcore.module.conv``) import it instead of
importing the package they are part of.

Example::

    >>> import gradcore as gc
    >>> from gradcore.module.module import Module
    >>> class Scale(Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.w = gc.Parameter([2.0])
    ...     def forward(self, x):
    ...         return x * self.w
    >>> [name for name, _ in Scale().named_parameters()]
    ['w']
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Optional, Tuple, Union

import numpy as np

from .. import functional as F
from .._core import Tensor
from ..tensor import Parameter
from ..op import ArgumentError

if TYPE_CHECKING:       # annotations only: logging loads on first use (see _logger)
    import logging


def _logger() -> "logging.Logger":
    """This module's logger (``logging`` loads on first use, as in ``gradcore.get_logger``)."""
    import logging
    return logging.getLogger(__name__)


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
        raise ArgumentError(f"{name}: {what} must be >= {low}, got {v}")
    return int(v)


def _is_parameter(obj) -> bool:
    return isinstance(obj, Parameter)


def _is_tensor(obj) -> bool:
    return isinstance(obj, Tensor)


def _is_buffer(obj) -> bool:
    return isinstance(obj, Tensor) and not isinstance(obj, Parameter)


def _is_module(obj) -> bool:
    return isinstance(obj, Module)


class HookHandler:
    """Returned by ``register_forward_*hook``; ``remove()`` unregisters the hook.

    Example::

        >>> fc, seen = M.Linear(2, 2), []
        >>> handle = fc.register_forward_hook(lambda m, inputs, out: seen.append(out.shape))
        >>> _ = fc(gc.tensor(np.ones((3, 2), "float32"))); handle.remove()
        >>> _ = fc(gc.tensor(np.ones((1, 2), "float32")))
        >>> seen     # the hook saw only the first call
        [(3, 2)]
    """

    _next_id = 0

    def __init__(self, hooks: "OrderedDict", hook: Callable):
        self._hooks, self._id = hooks, HookHandler._next_id
        HookHandler._next_id += 1
        hooks[self._id] = hook

    def remove(self) -> None:
        self._hooks.pop(self._id, None)


def _walk_state(module, dotted: str, active: set):
    """``Module._state_items``' walk; ``active`` only guards against a module
    containing itself."""
    active.add(id(module))
    for k, t in module._flatten(recursive=False, with_key=True, predicate=_is_tensor):
        yield dotted + k, t, module
    for k, sub in module._flatten(recursive=False, with_key=True, predicate=_is_module):
        if id(sub) not in active:
            yield from _walk_state(sub, dotted + k + ".", active)
    active.discard(id(module))


def _naming_memory_errors(init):
    """``init`` (a layer's ``__init__``) with a MemoryError from allocating
    its parameters (``M.Linear(10**6, 10**6)``: 4 TB) naming the layer:
    NumPy's message gives the shape but not whose it is."""
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except MemoryError as exc:
            name = type(self).__name__
            if str(exc).startswith(f"{name}:"):
                raise                  # named by a subclass's __init__ already
            raise MemoryError(f"{name}: cannot allocate its parameters or buffers: {exc}") from None
    return __init__


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

    Example::

        >>> class Net(M.Module):
        ...     def __init__(self):
        ...         super().__init__(); self.fc = M.Linear(2, 1)
        ...     def forward(self, x): return F.relu(self.fc(x))
        >>> [name for name, _ in Net().named_parameters()]
        ['fc.bias', 'fc.weight']
    """

    # class-level defaults, so a subclass that forgets super().__init__() still works
    training = True
    name = None
    # BatchNorm keeps (1, C, 1, 1) tensors and stores them flat, shape (C,), as
    # MegEngine does; a class attribute, so that this base knows no subclass
    _state_dict_flat = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _naming_memory_errors(cls.__dict__["__init__"])

    def __init__(self, name: str = None):
        if name is not None and not (isinstance(name, str) and name.strip()):
            raise ArgumentError(f"Module name must be a non-empty string, got {name!r}")
        self.name = name
        self.training = True

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
    def _check_kwargs(kwargs) -> bool:
        """The one extra keyword the iterators take, MegEngine's ``with_parent``."""
        with_parent = bool(kwargs.pop("with_parent", False))
        if kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
        return with_parent

    def _select(self, kwargs, predicate, recursive: bool = True, prefix: Optional[str] = None, named: bool = False):
        """The iterators' shared part (a generator: ``kwargs`` are checked when it is iterated)."""
        wp = self._check_kwargs(kwargs)
        yield from self._flatten(recursive=recursive, with_key=named, with_parent=wp, prefix=prefix,
                                 predicate=predicate)

    def parameters(self, recursive: bool = True, **kwargs) -> Iterator[Parameter]:
        kwargs.pop("requires_grad", None)   # MegEngine accepts (and ignores) it: every Parameter is trainable
        return self._select(kwargs, _is_parameter, recursive)

    def named_parameters(self, prefix: Optional[str] = None, recursive: bool = True,
                         **kwargs) -> Iterator[Tuple[str, Parameter]]:
        kwargs.pop("requires_grad", None)
        return self._select(kwargs, _is_parameter, recursive, prefix, named=True)

    def buffers(self, recursive: bool = True, **kwargs) -> Iterator[Tensor]:
        """Tensor attributes that are not Parameters (e.g. running statistics)."""
        return self._select(kwargs, _is_buffer, recursive)

    def named_buffers(self, prefix: Optional[str] = None, recursive: bool = True,
                      **kwargs) -> Iterator[Tuple[str, Tensor]]:
        return self._select(kwargs, _is_buffer, recursive, prefix, named=True)

    def tensors(self, recursive: bool = True, **kwargs) -> Iterator[Tensor]:
        """Parameters and buffers."""
        return self._select(kwargs, _is_tensor, recursive)

    def named_tensors(self, prefix: Optional[str] = None, recursive: bool = True,
                      **kwargs) -> Iterator[Tuple[str, Tensor]]:
        return self._select(kwargs, _is_tensor, recursive, prefix, named=True)

    def children(self, **kwargs) -> Iterator["Module"]:
        """The sub-modules that are direct attributes (or inside one)."""
        return self._select(kwargs, _is_module, recursive=False)

    def named_children(self, **kwargs) -> Iterator[Tuple[str, "Module"]]:
        return self._select(kwargs, _is_module, recursive=False, named=True)

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
        # a module-level walk, not a closure calling itself: such a closure is
        # a reference cycle (function -> cell -> function) left per call
        yield from _walk_state(self, prefix, set())

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
                rst[k] = value.reshape(-1) if owner._state_dict_flat else value
        return rst

    def __setattr__(self, name: str, value: Any) -> None:
        # an array put where a Parameter was would silently leave
        # parameters() (and the optimizer): refused, as PyTorch does
        old = self.__dict__.get(name)
        if isinstance(old, Parameter) and not isinstance(value, Tensor) and value is not None and \
                isinstance(value, (np.ndarray, np.generic, list, tuple, int, float)):
            raise TypeError(f"{type(self).__name__}.{name} is a Parameter of shape {old.shape}; assigning a "
                            f"{type(value).__name__} would drop it from parameters(). Assign "
                            f"gradcore.Parameter(value), or load values with load_state_dict")
        object.__setattr__(self, name, value)

    def load_state_dict(self, state_dict: Union[Dict[str, Any], Callable[[str, Tensor], Any]],
                        strict: bool = True) -> None:
        """Load values saved by ``state_dict``: a dict by name (a value of None
        skips that entry), or a callable ``fn(key, tensor) -> array or None``.
        With ``strict``, a missing or an unexpected key raises KeyError (without,
        each is named in a warning on the ``gradcore.module.module`` logger); a shape
        that differs raises ValueError (BatchNorm also accepts its flat (C,)
        form). Nothing is changed unless every check passes."""
        if isinstance(state_dict, dict):
            state_dict = self._saved_forms(state_dict)
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
            try:
                value = np.asarray(value.numpy() if isinstance(value, Tensor) else value)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"load_state_dict: {k}: cannot read a {type(value).__name__} as an "
                                f"array ({exc})") from None
            if value.dtype.kind not in "biuf":
                # complex would lose its imaginary part, str/object have no number
                raise TypeError(f"load_state_dict: {k}: a value of dtype {value.dtype} (shape "
                                f"{value.shape}) cannot be loaded into a {t.dtype} tensor of shape "
                                f"{t.shape}; give real numbers")
            if value.shape != t.shape:
                flat_ok = owner._state_dict_flat and value.size == int(np.prod(t.shape))
                if not flat_ok:
                    raise ArgumentError(f"load_state_dict: {k}: shape {value.shape} does not match {t.shape}")
                value = value.reshape(t.shape)
            loads.append((t, value))
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict (strict): missing keys {missing}, "
                           f"unexpected keys {sorted(unexpected)}")
        # strict=False loads what matches and, as MegEngine does, reports the
        # rest as a logged warning (a misspelt key would otherwise go unseen)
        if unexpected:
            _logger().warning("load_state_dict: unused keys in strict=False mode, unused=%s", sorted(unexpected))
        if missing:
            _logger().warning("load_state_dict: missing keys in strict=False mode, missing=%s", missing)
        for t, value in loads:
            # a copy in the tensor's own dtype: later changes to the dict do not leak in
            t._reset(Tensor(value.astype(t.dtype), device=t.device))

    def _saved_forms(self, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        """``state_dict`` with the entries that this module or a sub-module
        saves in another form (an RNN's MegEngine ``_flatten_weights``)
        rewritten by that module's ``_load_form``, under its dotted prefix:
        so a whole model's checkpoint loads, not only the layer's own."""
        for name, m in self.named_modules():
            if type(m)._load_form is not Module._load_form:
                state_dict = m._load_form(state_dict, name + "." if name else "")
        return state_dict

    def _load_form(self, state_dict: Dict[str, Any], prefix: str) -> Dict[str, Any]:
        """A layer whose checkpoints may hold its tensors in another form
        returns ``state_dict`` with the entries under ``prefix`` rewritten
        to its own names (none here)."""
        return state_dict

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
                t._reset(Tensor(t.to(dev)))      # a buffer of its own on dev
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
                        raise ArgumentError(f"replace_param: {key!r} has shape {value.shape}, "
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


def _sizes(v, n: int, what: str, allow_zero: bool = True, name: str = "Conv2d") -> Tuple[int, ...]:
    """A layer's per-axis size argument (an int, or ``n`` ints) as ``n`` checked ints."""
    if isinstance(v, (tuple, list)) and len(v) != n:
        raise ArgumentError(f"{name}: {what} must be an int or {('', 'a 1-tuple', 'a pair', 'a triple')[n]} "
                         f"of ints, got {v!r}")
    low = 0 if allow_zero else 1
    try:
        return tuple(_count(name, what, i, low) for i in v) if isinstance(v, (tuple, list)) else \
            (_count(name, what, v, low),) * n
    except ValueError:
        raise ArgumentError(f"{name}: {what} must be {'non-negative' if allow_zero else 'positive'}, got {v}") from None
