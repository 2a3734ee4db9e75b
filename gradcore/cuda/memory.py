"""A caching device-memory pool.

``cuMemAlloc``/``cuMemFree`` synchronise the device and cost microseconds
to milliseconds; a training step allocates the same sizes every step. So a
block whose last array dies goes back to a free list of its size class and
the next request of that class reuses it. Size classes: multiples of 512
bytes below 1 MiB, then 8 steps per power of two (at most 12.5% slack).
When the driver runs out of memory the pool frees its cached blocks and
tries once more.

Example::

    pool = MemoryPool(driver)
    block = pool.malloc(4096)       # int(block) is the device address
    del block                       # back to the pool, not to the driver
    pool.stats()["cached_bytes"]    # 4096
"""
from __future__ import annotations

import threading
from typing import Dict, List

_SMALL = 1 << 20


def size_class(nbytes: int) -> int:
    """The allocation size serving a request of ``nbytes``."""
    if nbytes <= 0:
        return 512
    if nbytes < _SMALL:
        return (nbytes + 511) & ~511
    step = 1 << (nbytes.bit_length() - 4)           # 8 steps per power of two
    return (nbytes + step - 1) // step * step


class Block:
    """A device allocation lent by the pool; returned to it when the last
    reference (an array, its views) goes."""

    __slots__ = ("ptr", "size", "_alloc", "_pool", "__weakref__")

    def __init__(self, pool: "MemoryPool", alloc, size: int):
        self._pool, self._alloc, self.size = pool, alloc, size
        self.ptr = int(alloc)

    def __int__(self):
        return self.ptr

    def __del__(self):
        pool = self._pool
        if pool is not None:
            self._pool = None
            try:
                pool._give_back(self._alloc, self.size)
            except Exception:   # interpreter shutdown: the driver may be gone
                pass


class MemoryPool:
    """Caches device blocks per size class (see the module docstring)."""

    def __init__(self, driver):
        self.driver = driver
        self._free: Dict[int, List[object]] = {}
        self._lock = threading.Lock()
        self.in_use_bytes = 0
        self.cached_bytes = 0
        self.driver_allocs = 0
        self.reuses = 0

    def malloc(self, nbytes: int) -> Block:
        size = size_class(nbytes)
        with self._lock:
            bucket = self._free.get(size)
            if bucket:
                alloc = bucket.pop()
                self.cached_bytes -= size
                self.reuses += 1
                self.in_use_bytes += size
                return Block(self, alloc, size)
        try:
            alloc = self.driver.alloc(size)
        except MemoryError:
            self.empty_cache()
            alloc = self.driver.alloc(size)      # a second failure propagates
        with self._lock:
            self.driver_allocs += 1
            self.in_use_bytes += size
        return Block(self, alloc, size)

    def _give_back(self, alloc, size: int) -> None:
        with self._lock:
            self._free.setdefault(size, []).append(alloc)
            self.in_use_bytes -= size
            self.cached_bytes += size

    def empty_cache(self) -> int:
        """Return every cached block to the driver; the bytes freed."""
        with self._lock:
            free, self._free = self._free, {}
            freed, self.cached_bytes = self.cached_bytes, 0
        for allocs in free.values():
            for alloc in allocs:
                self.driver.free(alloc)
        return freed

    def stats(self) -> dict:
        return {"in_use_bytes": self.in_use_bytes, "cached_bytes": self.cached_bytes,
                "driver_allocs": self.driver_allocs, "reuses": self.reuses}
