"""Host memory: the caching allocator behind the data of CPU tensors.

A CPU tensor's data is a NumPy array, so gradcore gives NumPy an allocator
(NEP 49) that keeps freed blocks of 32 KiB and more and hands them out again:
a training step that allocates the same activations and gradients every step
then reuses them instead of getting fresh pages from the kernel each time
(page faults and zeroing cost about half of a NumPy MLP step on a small
machine). Smaller blocks go to malloc as before. The cached bytes are bounded
(256 MiB by default, ``GRADCORE_HOST_CACHE_MB``), and ``empty_cache()`` gives
them back.

``import gradcore`` installs it for the importing thread's context (NumPy's
allocator is a context variable); ``GRADCORE_HOST_POOL=0`` leaves NumPy's own
allocator in place. Other threads use NumPy's allocator unless they call
``enable()``.

Example::

    >>> import gradcore.memory as mem
    >>> mem.stats()["hits"] >= 0
    True
    >>> with mem.pool_disabled():      # arrays made here come from plain malloc
    ...     pass
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import numpy as np

from . import _host_pool

_DEFAULT_LIMIT_MB = 256


def enable() -> None:
    """Allocate NumPy arrays made in the current thread (context) from the pool.

    Example::

        >>> threading.Thread(target=lambda: (mem.enable(), train())).start()
    """
    if not _host_pool.is_active():
        _host_pool.install()
        # Once a context variable is set, looking up one that is not costs a
        # walk of the context's map, and NumPy looks its error state up on
        # every ufunc call (~230 instructions, a few percent of a small op).
        # Setting it to its current value lets CPython's per-variable cache
        # answer instead.
        np.seterr(**np.geterr())


def is_enabled() -> bool:
    """Whether arrays made now, in this context, come from the pool."""
    return _host_pool.is_active()


@contextlib.contextmanager
def pool_disabled() -> Iterator[None]:
    """Arrays made inside come from NumPy's own allocator (they are still
    freed correctly after the block, by the allocator that made them).

    Example::

        >>> with mem.pool_disabled():
        ...     a = np.empty(1 << 20)
    """
    previous = _host_pool.set_handler(None)
    try:
        yield
    finally:
        _host_pool.set_handler(previous)


def stats() -> dict:
    """The pool's counters: ``hits`` and ``misses`` of requests of at least
    ``min_block`` bytes, ``cached_bytes`` kept now, ``limit``, and ``flushes``
    (times the cache was emptied because a new size did not fit).

    Example::

        >>> mem.stats()["cached_bytes"] <= mem.stats()["limit"]
        True
    """
    return _host_pool.stats()


def empty_cache() -> None:
    """Free every cached block (what tensors hold stays)."""
    _host_pool.empty_cache()


def set_limit(nbytes: int) -> None:
    """Keep at most ``nbytes`` of freed blocks cached (0: cache nothing)."""
    if nbytes < 0:
        raise ValueError(f"set_limit: the limit must be >= 0 bytes, got {nbytes}")
    _host_pool.set_limit(int(nbytes))


def _install_at_import() -> None:
    if os.environ.get("GRADCORE_HOST_POOL", "1").strip() in ("0", "false", "no", "off"):
        return
    mb = os.environ.get("GRADCORE_HOST_CACHE_MB")
    try:
        set_limit(int(float(mb) * (1 << 20)) if mb else _DEFAULT_LIMIT_MB << 20)
    except ValueError:
        raise ValueError(f"GRADCORE_HOST_CACHE_MB must be a number of MiB, got {mb!r}") from None
    enable()
