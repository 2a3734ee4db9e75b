"""The caching device-memory pool (compiled: ``gradcore/cuda/_launch.pyx``).

``cuMemAlloc``/``cuMemFree`` synchronise the device and cost microseconds
to milliseconds; a training step allocates the same sizes every step. So a
block whose last array dies goes back to a free list of its size class and
the next request of that class reuses it. Size classes: multiples of 512
bytes below 1 MiB, then 8 steps per power of two (at most 12.5% slack).
Every kernel and copy runs on the default stream, so reuse is stream
ordered. When the driver runs out of memory the pool frees its cached
blocks and tries once more.

Example::

    pool = MemoryPool(driver)
    block = pool.malloc(4096)       # int(block) is the device address
    del block                       # back to the pool, not to the driver
    pool.stats()["cached_bytes"]    # 4096
"""
from __future__ import annotations

import contextlib
import ctypes
from typing import Dict, Iterator, List, Optional, Tuple

from ._launch import Block, MemoryPool, size_class

__all__ = ["Block", "MemoryPool", "size_class", "GuardedPool", "guarded_writes"]

GUARD_BYTES = 256           # at least this much band after every array's bytes
_BAND_MAX = 4096            # checked at most this far past the end
_GUARD_BYTE = 0xA5


class GuardedPool(MemoryPool):
    """On the host emulator only: a pool whose every block ends in a guard
    band of known bytes after the array's own ``nbytes``. A kernel writing
    past an array's end (``i <= n`` for ``i < n``) lands in the size class's
    slack, unseen on a GPU and by every value check; here it changes the
    band, which ``damaged()`` reports.

    Example::

        >>> import ctypes
        >>> from gradcore.cuda.emulator import HostDriver
        >>> from gradcore.cuda.memory import GuardedPool
        >>> pool = GuardedPool(HostDriver())
        >>> block = pool.malloc(100)
        >>> _ = ctypes.memset(block.ptr + 100, 0, 4)      # a write past the end
        >>> [(nbytes, past) for _, nbytes, past in pool.damaged()]
        [(100, 0)]
    """

    def __init__(self, driver):
        if getattr(driver, "kind", None) != "emulator":
            raise RuntimeError("GuardedPool: guard bands need device memory the host can read (the emulator)")
        super().__init__(driver)
        self.bands: Dict[int, Tuple[int, int]] = {}       # block address -> (array bytes, band length)

    def malloc(self, nbytes: int) -> Block:
        block = MemoryPool.malloc(self, nbytes + GUARD_BYTES)
        length = min(block.size - nbytes, _BAND_MAX)
        ctypes.memset(block.ptr + nbytes, _GUARD_BYTE, length)
        self.bands[block.ptr] = (nbytes, length)
        return block

    def damaged(self) -> List[Tuple[int, int, int]]:
        """(address, array bytes, first byte past the end that was written)
        for every block whose band changed; the bands are restored."""
        found = []
        for ptr, (nbytes, length) in self.bands.items():
            band = ctypes.string_at(ptr + nbytes, length)
            if band.count(_GUARD_BYTE) != length:
                found.append((ptr, nbytes, next(i for i, b in enumerate(band) if b != _GUARD_BYTE)))
                ctypes.memset(ptr + nbytes, _GUARD_BYTE, length)
        return found


@contextlib.contextmanager
def guarded_writes(backend) -> Iterator[Optional[GuardedPool]]:
    """Within: the backend's new arrays come from a ``GuardedPool`` (on the
    host emulator; elsewhere, or during a CUDA-graph capture, nothing
    changes and None is yielded). Check ``pool.damaged()`` before leaving.

    Example::

        with guarded_writes(backend) as pool:
            run_the_kernels()
            assert pool is None or not pool.damaged()
    """
    pool = backend.pool
    if getattr(backend.driver, "kind", None) != "emulator" or pool.redirect is not None:
        yield None
        return
    guard = pool.redirect = GuardedPool(backend.driver)
    try:
        yield guard
    finally:
        if pool.redirect is guard:
            pool.redirect = None
