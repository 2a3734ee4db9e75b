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

from ._launch import Block, MemoryPool, size_class

__all__ = ["Block", "MemoryPool", "size_class"]
