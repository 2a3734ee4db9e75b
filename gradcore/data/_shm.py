"""Batches through POSIX shared memory, in a ring of reused slots.

Each worker owns a few *slots*, shared-memory segments that it keeps mapped
and writes batches into again and again. A batch travels as a small message
(slot number, and the layout of its arrays only when it differs from the
worker's previous batch); the parent hands out the arrays as views of its
own mapping of the slot, with no copy and no system call. The parent maps
a slot once, when the worker announces it under a new name, and unlinks
that name at once: from then on the memory belongs to the two mappings and
goes when both are gone, whatever happens to the processes.

A slot is written again only when the parent has said it is free, and the
parent says so only when every array of the batch in it is gone: the
arrays are views of one *lease* array per batch, and a weak reference to
the lease tells the parent when the last view died. A worker that has no
free slot large enough makes a new one (or replaces a free one that is too
small), so a consumer that keeps its batches (``list(loader)``) only costs
the memory it keeps, and never waits for a slot.

Segments are created with ``_posixshmem`` directly rather than
``multiprocessing.shared_memory.SharedMemory``: the latter registers each
segment with the resource tracker of the process that creates it, which
then warns about "leaked" segments that the parent has already unlinked.
"""
from __future__ import annotations

import mmap
import os
import weakref
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

try:
    import _posixshmem
except ImportError:             # not a POSIX system: DataLoader says workers are unavailable
    _posixshmem = None

_ALIGN = 64     # each array starts on a cache line (and on any dtype's alignment)
# a new slot is rounded up to this, so that batches that grow a little
# (a longer string, a larger last image) fit the slot made for the first
_SLOT_GRAIN = 1 << 16


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


def _create(name: str, size: int) -> mmap.mmap:
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
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


class SlotWriter:
    """A worker's slots: ``write`` puts a batch in a free one and returns
    the message for ``SlotReader.read``; ``release`` takes back the slots
    that the parent reports free."""

    def __init__(self):
        self.maps: List[Optional[mmap.mmap]] = []     # slot -> this process's mapping
        self.free: Set[int] = set()
        self._last: Any = None                        # the (spec, layout) last sent

    def release(self, slots) -> None:
        self.free.update(slots)

    def write(self, batch: Any, fresh_name: str) -> Tuple:
        """Write ``batch``'s arrays into a free slot (or a new one, created
        as ``fresh_name``). The message is (slot, name, capacity, desc):
        name and capacity only when the slot is new to the parent, desc
        (the structure and the arrays' offsets, shapes and dtypes) only when
        it differs from the previous batch's."""
        arrays: List[np.ndarray] = []
        spec = _flatten(batch, arrays)
        layout, size = [], 0
        for a in arrays:
            layout.append((size, a.shape, a.dtype.str))
            size += -(-a.nbytes // _ALIGN) * _ALIGN
        desc = (spec, layout)
        if desc == self._last:
            desc = None
        else:
            self._last = desc
        if size == 0:
            return (None, None, 0, desc)
        fits = [s for s in self.free if len(self.maps[s]) >= size]
        name = None
        if fits:
            slot = min(fits, key=lambda s: len(self.maps[s]))
        else:
            # a free slot too small is replaced; with none free, a new one
            slot = max(self.free, default=None)
            if slot is None:
                slot = len(self.maps)
                self.maps.append(None)
            else:
                self.maps[slot].close()
                self.maps[slot] = None
            self.maps[slot] = _create(fresh_name, -(-size // _SLOT_GRAIN) * _SLOT_GRAIN)
            name = fresh_name
        self.free.discard(slot)
        mm = self.maps[slot]
        for a, (offset, shape, dtype) in zip(arrays, layout):
            np.ndarray(shape, dtype, buffer=mm, offset=offset)[...] = a
        return (slot, name, len(mm) if name else 0, desc)


class SlotReader:
    """The parent's side of one worker's slots: ``read`` turns a message of
    ``SlotWriter.write`` into the batch (views of the slot); ``take_freed``
    returns the slots whose batches are gone since it was last called."""

    def __init__(self):
        self.maps: Dict[int, mmap.mmap] = {}
        self._desc: Any = None
        # the lease of each slot's batch; its callback reports the slot free
        self._leases: Dict[int, weakref.ref] = {}
        self._freed: List[int] = []

    def read(self, message: Tuple) -> Any:
        """The batch of ``message``, as views of the slot (a new slot's
        name is mapped and unlinked here)."""
        slot, name, capacity, desc = message
        if desc is not None:
            self._desc = desc
        spec, layout = self._desc
        if slot is None:
            return _rebuild(spec, [np.empty(shape, dtype) for _, shape, dtype in layout])
        if name is not None:
            fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
            try:
                self.maps[slot] = mmap.mmap(fd, capacity)
            finally:
                os.close(fd)
                _posixshmem.shm_unlink(name)
        # the views' base is the lease (NumPy stops collapsing a view's base
        # at an array whose base is not an array, here the mmap)
        lease = np.frombuffer(self.maps[slot], np.uint8)
        self._leases[slot] = weakref.ref(lease, lambda _, s=slot, freed=self._freed: freed.append(s))
        arrays = [np.ndarray(shape, dtype, buffer=lease, offset=offset) for offset, shape, dtype in layout]
        return _rebuild(spec, arrays)

    def take_freed(self) -> List[int]:
        """The slots freed since the last call (for the worker's next task)."""
        if not self._freed:
            return []
        freed = self._freed[:]
        del self._freed[:len(freed)]      # a callback may append meanwhile (garbage collection)
        return freed

    def in_use(self) -> List[int]:
        """The slots whose batch is still referenced (for tests)."""
        return sorted(s for s, ref in self._leases.items() if ref() is not None)


def discard(name: str) -> None:
    """Unlink segment ``name`` if it exists (a slot never announced)."""
    try:
        _posixshmem.shm_unlink(name)
    except (FileNotFoundError, OSError):
        pass
