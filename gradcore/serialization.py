"""``gradcore.save`` / ``gradcore.load``: tensors, state dicts, optimizer
states and nested containers to a file and back.

Format: the 16-byte header ``MAGIC`` (``b"GRADCORE-SAVE\\x00v1"``), then
one pickle stream (the highest protocol). Tensors pickle as their
value (a host NumPy array), their device and name; NumPy arrays and scalars
as NumPy pickles them; containers as themselves.

Loading is restricted by default (``weights_only=True``): the unpickler
resolves only the globals listed in ``SAFE_GLOBALS`` (gradcore's Tensor and
Parameter, NumPy's array/dtype/scalar reconstructors, a few builtins and
``collections.OrderedDict``), so a file cannot make ``load`` import or call
anything else: no arbitrary code runs. ``weights_only=False`` lifts the
restriction, for files you trust that hold other objects (Modules, your own
classes).

Example::

    >>> import gradcore as gc, io
    >>> buf = io.BytesIO()
    >>> gc.save({"w": gc.tensor([1.0, 2.0]), "step": 3}, buf)
    >>> _ = buf.seek(0)
    >>> gc.load(buf)["w"].numpy()
    array([1., 2.], dtype=float32)
"""
from __future__ import annotations

import io
import os
import pickle
from typing import Any, BinaryIO, Callable, Dict, Optional, Union

from ._core import Tensor, _rebuild_tensor

MAGIC = b"GRADCORE-SAVE\x00v1"

PathOrFile = Union[str, "os.PathLike[str]", BinaryIO]
MapLocation = Union[None, str, Dict[str, str], Callable[[str], str]]

# (module, name) pairs a restricted load may resolve; nothing else
SAFE_GLOBALS = frozenset([
    ("gradcore._core", "Tensor"), ("gradcore._core", "_rebuild_tensor"), ("gradcore.tensor", "Parameter"),
    ("numpy", "dtype"), ("numpy", "ndarray"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"),
    ("collections", "OrderedDict"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"), ("builtins", "slice"),
    ("builtins", "range"), ("builtins", "bytearray"),
])


class LoadError(pickle.UnpicklingError):
    """A file that ``gradcore.load`` cannot read: not written by
    ``gradcore.save``, truncated, or asking for a global it refuses."""


def save(obj: Any, f: PathOrFile) -> None:
    """Write ``obj`` (Tensors, NumPy arrays, numbers, strings and nested
    dicts/lists/tuples of them, e.g. a Module's or an optimizer's
    ``state_dict()``) to a path or a binary file object.

    Example::

        >>> gradcore.save(net.state_dict(), "net.gc")          # doctest: +SKIP
        >>> net.load_state_dict(gradcore.load("net.gc"))       # doctest: +SKIP
    """
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            _write(obj, fh)
    else:
        _write(obj, f)


def _write(obj, fh) -> None:
    fh.write(MAGIC)
    pickle.dump(obj, fh, protocol=pickle.HIGHEST_PROTOCOL)


def load(f: PathOrFile, map_location: MapLocation = None, weights_only: bool = True) -> Any:
    """Read what ``gradcore.save`` wrote.

    ``map_location`` puts the tensors on another device: a device name
    (``"cpu"``), a dict from saved to wanted device (``{"cuda": "cpu"}``) or
    a callable ``saved_device -> device``; None keeps each tensor's saved
    device. ``weights_only=True`` (the default) refuses any global outside
    ``SAFE_GLOBALS``; pass False only for a file you trust.

    Example::

        >>> state = gradcore.load("net.gc", map_location="cpu")   # doctest: +SKIP
    """
    name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "<file object>")
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            return _read(fh, name, map_location, weights_only)
    return _read(f, name, map_location, weights_only)


def _read(fh, name, map_location, weights_only):
    head = fh.read(len(MAGIC))
    if head != MAGIC:
        if len(head) < len(MAGIC) and MAGIC.startswith(head):
            raise LoadError(f"gradcore.load: {name} is truncated (it ends inside the header)")
        raise LoadError(f"gradcore.load: {name} was not written by gradcore.save "
                        f"(it starts with {head[:8]!r}, expected {MAGIC[:8]!r})")
    unpickler = _Unpickler(fh, _device_mapper(map_location), weights_only)
    try:
        return unpickler.load()
    except LoadError:
        raise
    except (EOFError, pickle.UnpicklingError, ValueError, IndexError) as exc:
        raise LoadError(f"gradcore.load: {name} is truncated or corrupt ({type(exc).__name__}: {exc})") from exc


def _device_mapper(map_location: MapLocation) -> Callable[[str], str]:
    if map_location is None:
        return lambda device: device
    if isinstance(map_location, str):
        return lambda device: map_location
    if isinstance(map_location, dict):
        return lambda device: map_location.get(device, device)
    if callable(map_location):
        return map_location
    raise TypeError(f"gradcore.load: map_location must be None, a device name, a dict or a callable, "
                    f"got {type(map_location).__name__}")


class _Unpickler(pickle.Unpickler):
    def __init__(self, fh, map_device, weights_only):
        super().__init__(fh)
        self._map_device = map_device
        self._weights_only = weights_only

    def find_class(self, module, name):
        if (module, name) == ("gradcore._core", "_rebuild_tensor"):
            return self._rebuild_tensor
        if self._weights_only and (module, name) not in SAFE_GLOBALS:
            raise LoadError(f"gradcore.load refused to load the global {module}.{name}: with "
                            f"weights_only=True only tensors, NumPy arrays and plain containers load. "
                            f"If you trust this file, pass weights_only=False")
        return super().find_class(module, name)

    def _rebuild_tensor(self, cls, data, device, name):
        if not (isinstance(cls, type) and issubclass(cls, Tensor)):
            raise LoadError(f"gradcore.load: a tensor record names {cls!r}, which is not a Tensor class")
        return _rebuild_tensor(cls, data, self._map_device(device), name)
