"""Batches through POSIX shared memory: a worker writes the arrays of a
collated batch into one new segment and sends only a small description
(segment name, offsets, shapes, dtypes) through its pipe; the parent maps
the segment, unlinks its name at once and hands out arrays that are views
of the mapping (no copy). The mapping lives as long as those arrays do.

Segments are created with ``_posixshmem`` directly rather than
``multiprocessing.shared_memory.SharedMemory``: the latter registers each
segment with the resource tracker of the process that creates it, which
then warns about "leaked" segments that the parent has already unlinked.
"""
from __future__ import annotations

import mmap
import os
from typing import Any, List, Tuple

import numpy as np

try:
    import _posixshmem
except ImportError:             # not a POSIX system: DataLoader says workers are unavailable
    _posixshmem = None

_ALIGN = 64     # each array starts on a cache line (and on any dtype's alignment)


def available() -> bool:
    return _posixshmem is not None


class ShmError(RuntimeError):
    """A batch could not be placed in shared memory."""


def _flatten(obj: Any, arrays: List[np.ndarray]) -> Any:
    """``obj``'s structure with each NumPy array replaced by ("a", k), its
    index in ``arrays``; other leaves stay as ("v", value) (pickled with
    the message: numbers, strings)."""
    if isinstance(obj, np.ndarray) and obj.dtype.kind not in "OV":
        arrays.append(obj)
        return ("a", len(arrays) - 1)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return ("n", type(obj), [_flatten(v, arrays) for v in obj])
    if isinstance(obj, (list, tuple)):
        return ("l" if isinstance(obj, list) else "t", [_flatten(v, arrays) for v in obj])
    if isinstance(obj, dict):
        return ("d", [(k, _flatten(v, arrays)) for k, v in obj.items()])
    return ("v", obj)


def _rebuild(spec: Any, arrays: List[np.ndarray]) -> Any:
    kind = spec[0]
    if kind == "a":
        return arrays[spec[1]]
    if kind == "v":
        return spec[1]
    if kind == "n":
        return spec[1](*(_rebuild(s, arrays) for s in spec[2]))
    if kind == "l":
        return [_rebuild(s, arrays) for s in spec[1]]
    if kind == "t":
        return tuple(_rebuild(s, arrays) for s in spec[1])
    return {k: _rebuild(s, arrays) for k, s in spec[1]}


def pack(batch: Any, name: str) -> Tuple:
    """Write ``batch``'s arrays into a new segment ``name``; return the
    message that ``unpack`` turns back into the batch."""
    arrays: List[np.ndarray] = []
    spec = _flatten(batch, arrays)
    layout, size = [], 0
    for a in arrays:
        layout.append((size, a.shape, a.dtype.str))
        size += -(-a.nbytes // _ALIGN) * _ALIGN
    if size == 0:
        return (None, 0, spec, layout)
    fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        try:
            # reserve the pages now: writing to an unbacked page of a full
            # /dev/shm would kill the worker with SIGBUS instead
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            _posixshmem.shm_unlink(name)
            raise ShmError(f"could not get {size} bytes of shared memory for a batch ({exc}); "
                           "/dev/shm may be too small (in Docker: --shm-size), or use num_workers=0") from None
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    for a, (offset, shape, dtype) in zip(arrays, layout):
        np.ndarray(shape, dtype, buffer=mm, offset=offset)[...] = a
    mm.close()
    return (name, size, spec, layout)


def unpack(message: Tuple) -> Any:
    """The batch that ``pack`` wrote, as views of the segment; the segment's
    name is unlinked (the memory stays until the arrays are gone)."""
    name, size, spec, layout = message
    if name is None:
        arrays = [np.empty(shape, dtype) for _, shape, dtype in layout]
        return _rebuild(spec, arrays)
    fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
    try:
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
        _posixshmem.shm_unlink(name)
    arrays = [np.ndarray(shape, dtype, buffer=mm, offset=offset) for offset, shape, dtype in layout]
    return _rebuild(spec, arrays)


def discard(name: str) -> None:
    """Unlink segment ``name`` if it exists (a batch never unpacked)."""
    try:
        _posixshmem.shm_unlink(name)
    except (FileNotFoundError, OSError):
        pass
