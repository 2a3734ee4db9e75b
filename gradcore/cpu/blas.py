"""NumPy's BLAS threads for a scope: ``single_threaded()`` runs a chain of
small matrix products on one thread and gives the count back after.

Why: a recurrent layer's steps are a chain of small GEMMs, (32, 256) @
(256, 1024) for an LSTM(256, 256) at batch 32, each ~0.1-0.2 ms with
elementwise work between them. OpenBLAS splits each over its threads and
joins them at its end; where every core is busy with other work, a join
waits for a descheduled thread, and the chain of 64 joins per sequence
made LSTM(256, 256)'s forward + backward 2-4x slower with OpenBLAS's 2
threads than with one on a 2-core machine at load 3-4 (e.g. 216 ms against
111 ms, 276 against 82; the measurements in the lstmspeed branch's report).
On a quiet machine the two threads gained about 4% there. The layer ops of
ops/rnn.py (``LSTMLayer`` and its backward) run their per-step GEMMs in this
scope when they are small (``rnn.SMALL_GEMM``), the large products around
them (the input projection, the weight gradients) keep every thread.

What it changes: OpenBLAS's thread count (the library NumPy links, found
by its exported ``*openblas_set_num_threads*``), set to 1 on entering the
outermost scope and set back to what it was on leaving it (scopes nest and
may be entered by several threads: a count under a lock). OpenBLAS keeps
one count per process, so while a scope is open, NumPy products run by
other threads also run on one thread; nothing outlives the scope. With
another BLAS (MKL, Accelerate), or none found, the scope changes nothing.
``GRADCORE_BLAS_SCOPE=0`` in the environment, or ``enabled = False``,
turns it off.

Example::

    >>> import numpy as np
    >>> from gradcore.cpu import blas
    >>> with blas.single_threaded():
    ...     y = np.ones((32, 256), "float32") @ np.ones((256, 1024), "float32")
    >>> blas.status()                   # doctest: +SKIP
    'OpenBLAS (libscipy_openblas64_-...so): 2 threads; single_threaded() sets 1 in its scope'
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Iterator, Optional, Tuple

import numpy as np

__all__ = ["single_threaded", "one_thread_from_now", "num_threads", "status", "enabled"]

_OFF = ("0", "false", "no", "off")
enabled = os.environ.get("GRADCORE_BLAS_SCOPE", "1").strip().lower() not in _OFF

# (get, set) symbol pairs of OpenBLAS builds: scipy-openblas (NumPy's wheels:
# 64-bit integers, prefixed), the plain library, its 64-bit integer build
_SYMBOLS = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
            ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
            ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
            ("openblas_get_num_threads", "openblas_set_num_threads"))

_lock = threading.Lock()
_found: Optional[Tuple[str, object, object, object]] = None      # (path, get, set, lib) once looked up
_looked = False
_depth = 0                 # open scopes, all threads together
_saved = 0                 # the count the outermost scope found (0: it changed nothing)


def _mapped_openblas() -> list:
    """Paths of the loaded shared objects whose name says OpenBLAS, NumPy's
    own (under its package's parent: numpy.libs) first."""
    try:
        with open("/proc/self/maps") as f:
            paths = [line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6]
    except OSError:
        return []
    paths = list(dict.fromkeys(p for p in paths if "openblas" in os.path.basename(p).lower()))
    pkg = os.path.dirname(os.path.abspath(np.__file__))
    own = (pkg + os.sep, os.path.join(os.path.dirname(pkg), "numpy.libs") + os.sep)
    return sorted(paths, key=lambda p: not p.startswith(own))     # stable: the rest in load order


def _numpy_blas_name() -> str:
    try:
        return str(np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]).lower()
    except Exception:        # an older NumPy, another layout: decide by the libraries loaded
        return "openblas"


def _lookup():
    """(path, get, set) of NumPy's OpenBLAS, or None; looked up once."""
    global _found, _looked
    if _looked:
        return _found
    _looked = True
    if "openblas" not in _numpy_blas_name():
        return None
    for path in _mapped_openblas():
        try:
            lib = ctypes.CDLL(path)          # already loaded: the same handle
        except OSError:
            continue
        for get_name, set_name in _SYMBOLS:
            get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                _found = (path, get, set_, lib)
                return _found
    return None


def num_threads() -> Optional[int]:
    """NumPy's OpenBLAS thread count now, or None (another BLAS, not found).

    Example::

        >>> blas.num_threads()           # doctest: +SKIP
        2
    """
    found = _lookup()
    return None if found is None else int(found[1]())


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Run the block with NumPy's OpenBLAS on one thread (see the module
    docstring: the count is the process's while the outermost scope is
    open, and restored when it closes). Nests; several threads may hold it.

    Example::

        >>> with blas.single_threaded():
        ...     h = h @ w                      # a chain of small products
    """
    global _depth, _saved
    found = _lookup() if enabled else None
    if found is None:
        yield
        return
    with _lock:
        if _depth == 0:
            n = int(found[1]())
            _saved = n if n > 1 else 0
            if _saved:
                found[2](1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved:
                found[2](_saved)
                _saved = 0


def one_thread_from_now() -> bool:
    """Run NumPy's OpenBLAS on one thread for the rest of this process's
    life, without starting its thread pool. For a forked child such as a
    data-loader worker: OpenBLAS stops its threads at a fork and starts them
    again to change the count, and a new thread spins for ~0.1 s before it
    sleeps (2^28 cycles: 90 ms of CPU per worker per epoch, on the cores the
    training needs). The count is OpenBLAS's ``blas_cpu_number``, written
    directly where the library exports it (one thread in the process: a
    fresh child), else set by the API. True if the count is now 1.

    Example::

        >>> blas.one_thread_from_now()        # doctest: +SKIP
        True
    """
    found = _lookup() if enabled else None
    if found is None:
        return False
    try:
        count = ctypes.c_int.in_dll(found[3], "blas_cpu_number")
    except ValueError:          # not exported by this build: the API (starts the pool)
        found[2](1)
    else:
        count.value = 1
    return int(found[1]()) == 1


def status() -> str:
    """What ``single_threaded()`` does here, in words (``gradcore doctor``).

    Example::

        >>> blas.status()                # doctest: +SKIP
        'OpenBLAS (libscipy_openblas64_-32a4b2a6.so): 2 threads; single_threaded() sets 1 in its scope'
    """
    found = _lookup()
    if found is None:
        return f"NumPy's BLAS ({_numpy_blas_name()}) is not OpenBLAS, or its thread control was not found: " \
               "single_threaded() changes nothing"
    what = "sets 1 in its scope" if enabled else "is off (GRADCORE_BLAS_SCOPE=0)"
    return f"OpenBLAS ({os.path.basename(found[0])}): {int(found[1]())} threads; single_threaded() {what}"
