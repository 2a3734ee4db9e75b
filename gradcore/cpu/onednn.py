"""oneDNN for the convolutions, pooling and batch norm on the CPU (issue 25).

The library is the ``onednn-cpu-gomp`` wheel (a dependency of gradcore on
x86-64 Linux: ``<prefix>/lib/libdnnl.so.3``; docs/cpu.md says why this
build), else ``$GRADCORE_ONEDNN_LIBRARY`` or the loader path. It has no
headers: gradcore declares the part of oneDNN's v3 C API it uses in
``_onednn.pxd``, opens the library with dlopen and calls it through
function pointers from Cython (``_onednn.pyx``), as cuDNN is called on a
GPU (``gradcore/cuda/cudnn.py``).

What runs on oneDNN (the ops' cpu kernels ask here first and run their
NumPy code when the answer is None), float32 only:

- ``conv_forward``, ``conv_backward_data``, ``conv_backward_weights``: 1-d,
  2-d and 3-d convolutions with stride, padding, dilation and groups (a
  transposed convolution is the backward data with the roles swapped:
  ``conv_transpose``);
- ``pool_forward``/``pool_backward``: max pooling (a window's gradient goes
  to its first maximum, as PyTorch and gradcore's NumPy path do; a window
  holding a NaN runs the NumPy path, which propagates it) and average
  pooling (padding counted or not);
- ``batch_norm_training``/``batch_norm_inference``/``batch_norm_backward``:
  the BatchNorm ops of ``gradcore/ops/nn.py``;
- ``matmul``: MatrixMul's float32 products with one (K, N) b of at least
  ``matmul_min`` multiply-adds (transposed views read in place);
- ``resample``: Interpolate's bilinear forward (``align_corners=False``;
  not its adjoint: oneDNN's resampling backward took 4x gradcore's own
  kernels here).

Primitives are made once per (direction, shapes, attributes, threads) and
kept in a bounded LRU cache (``cache_limit``; ``stats()``). Tensors stay
in NumPy's row-major layout (oneDNN picks its implementations for plain
nchw/ncdhw), the scratchpad of each run is a NumPy byte array (so it comes
from gradcore's host memory pool). A configuration oneDNN has no
implementation for is remembered and runs the NumPy path.

Threads: OpenMP's (``OMP_NUM_THREADS``), or gradcore's setting:
``set_num_threads(n)`` or ``GRADCORE_ONEDNN_THREADS=n`` (0: OpenMP's), for
primitives of at least ``grain`` multiply-adds; smaller ones are made and
run on one thread (``threads_for``; ``GRADCORE_ONEDNN_GRAIN``).
Results are deterministic for a given thread count (oneDNN's CPU kernels
split work statically; PyTorch's CPU backend gives the same guarantee).

Switches: ``GRADCORE_ONEDNN=0`` in the environment, or ``enabled = False``,
runs the NumPy kernels everywhere; ``status()`` and ``gradcore doctor`` say
which path runs and why.

Example::

    import gradcore.cpu.onednn as onednn
    onednn.status()                 # "in use: oneDNN 3.2.0 (...), 2 threads"
    y = onednn.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1)   # None: not here
"""
from __future__ import annotations

import collections
import ctypes
import os
import site
import sys
import sysconfig
import threading
from math import prod
from typing import List, Optional, Sequence, Tuple

import numpy as np

try:
    from . import _onednn
except ImportError as exc:        # the extension is not built: the NumPy path runs
    _onednn = None
    _import_error = f"gradcore.cpu._onednn does not import ({exc}); pip install -e . builds it"
else:
    _import_error = None

_OFF = ("0", "false", "no", "off")
enabled = os.environ.get("GRADCORE_ONEDNN", "1").strip().lower() not in _OFF
cache_limit = 512               # primitives kept (least recently used dropped first)
# the convolutions' layout: "plain" (NumPy's: oneDNN runs im2col + its GEMM), "blocked" (the primitive's
# channel-blocked layout, its direct JIT kernels, reorders to and from NumPy's around each run), "auto"
# (blocked where the channels fill its blocks: see _blocked)
conv_layout = "auto"
# batch norm's: "plain" or "blocked" (16-channel blocks, reorders around the run), "auto": see _bn_blocked
bn_layout = "auto"

# the thread policy (docs/cpu.md, "Threads"): a primitive whose work is
# below ``grain`` multiply-adds runs on one thread, others on num_threads().
# Measured on this 2-core machine (bench_onednn.py --grain, best rounds):
# two threads paid from 2.4-4.7e6 multiply-adds of a convolution (1.0x at
# 2.4e6, 0.73x at 4.7e6, 1.22x at 3e5); pooling and batch norm (memory
# bound) gained nothing up to 8e6 elements, so each element they touch
# counts as a quarter of a multiply-add (threads from 1.6e7 elements)
grain = 4e6
POOL_COST = 0.25
BN_COST = 0.25

_F32 = np.dtype(np.float32)
_lock = threading.Lock()
_cache: "collections.OrderedDict[tuple, object]" = collections.OrderedDict()
_refused: dict = {}             # key -> why oneDNN does not run it
_stats = {"hits": 0, "misses": 0, "evictions": 0, "refused": 0}
_path: Optional[str] = None
_load_error: Optional[str] = None
_loaded = False


# ---------------------------------------------------------------- the library
def _prefixes() -> List[str]:
    """Installation prefixes whose ``lib/`` may hold the wheel's libdnnl:
    this environment's, the user site's, and the ones above each
    site-packages folder on the path."""
    found = [sys.prefix, sysconfig.get_paths().get("data", ""), getattr(site, "USER_BASE", "") or ""]
    try:
        found += [site.getuserbase()]
    except Exception:
        pass
    roots = list(sys.path)
    try:
        roots += site.getsitepackages() + [site.getusersitepackages()]
    except Exception:
        pass
    for root in roots:           # <prefix>/lib/pythonX.Y/site-packages
        if root and os.path.basename(root) in ("site-packages", "dist-packages"):
            found.append(os.path.dirname(os.path.dirname(os.path.dirname(root))))
    return [p for p in dict.fromkeys(found) if p and os.path.isdir(p)]


def candidate_paths(loader: bool = True) -> List[str]:
    """Where libdnnl may be, most specific first: ``$GRADCORE_ONEDNN_LIBRARY``,
    the wheel's (``<prefix>/lib/libdnnl.so.3``), and with ``loader`` the
    loader path (``ctypes.util.find_library``, which runs ldconfig, gcc and
    ld: ``load`` asks for it only when nothing before it loads).

    Example::

        >>> candidate_paths(loader=False)      # ['.../lib/libdnnl.so.3'] with the wheel installed
    """
    found = []
    explicit = os.environ.get("GRADCORE_ONEDNN_LIBRARY")
    if explicit:
        found.append(explicit)
    for prefix in _prefixes():
        for name in ("libdnnl.so.3", "libdnnl.so"):
            path = os.path.join(prefix, "lib", name)
            if os.path.exists(path):
                found.append(path)
    if loader:
        import ctypes.util      # (only now: it imports subprocess and tempfile, ~5 ms)
    name = ctypes.util.find_library("dnnl") if loader else None
    if name:
        found.append(name)
    return list(dict.fromkeys(found))


def _candidates():
    # the loader path last and only when nothing else loads: finding it
    # spawns three programs (15 ms on an idle machine, far more on a busy
    # one) at every start
    yield from candidate_paths(loader=False)
    yield from candidate_paths()


def load() -> bool:
    """Load oneDNN once; True when it is usable (``why_not()`` says why not)."""
    global _loaded, _path, _load_error
    if _loaded:
        return True
    if _load_error is not None:
        return False
    with _lock:
        if _loaded or _load_error is not None:
            return _loaded
        if _onednn is None:
            _load_error = _import_error
            return False
        errors = []
        # GNU OpenMP's threads spin between parallel regions by default: on a
        # machine whose cores are busy with other work that makes a training
        # step several times slower (measured: the demo 4.6 s against 1.6 s
        # at load 9 on 2 cores); libgomp reads this when libdnnl loads it, and
        # a value the user set is kept
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        tried = []
        for path in _candidates():
            if path in tried:
                continue
            tried.append(path)
            try:
                _onednn.load(path)
            except OSError as exc:
                errors.append(f"{path}: {exc}")
                continue
            except Exception as exc:     # engine or stream creation failed
                errors.append(f"{path}: {type(exc).__name__}: {exc}")
                continue
            _path, _loaded = path, True
            if not any(v in os.environ for v in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")):
                # gradcore keeps its primitives in its own bounded cache; oneDNN's
                # (1024 by default) would keep a second reference to each, with
                # its JIT code, past cache_limit's evictions and clear_cache()
                _onednn.set_primitive_cache_capacity(0)
            _grain_from_environment()
            threads = os.environ.get("GRADCORE_ONEDNN_THREADS")
            if threads:
                try:
                    _onednn.set_num_threads(int(threads))
                except ValueError:
                    raise ValueError(f"GRADCORE_ONEDNN_THREADS must be a number of threads, got {threads!r}") \
                        from None
            return True
        _load_error = ("libdnnl was not found: pip install onednn-cpu-gomp==2023.2.0 (gradcore depends on it "
                       "on x86-64 Linux)" if not errors else "libdnnl does not load: " + "; ".join(errors))
        return False


def _grain_from_environment():
    global grain
    value = os.environ.get("GRADCORE_ONEDNN_GRAIN")
    if value:
        try:
            grain = float(value)
        except ValueError:
            raise ValueError(f"GRADCORE_ONEDNN_GRAIN must be a number of multiply-adds, got {value!r}") from None


def version() -> Optional[str]:
    """The loaded oneDNN's version ("3.2.0"), or None."""
    if not load():
        return None
    major, minor, patch, _ = _onednn.version()
    return f"{major}.{minor}.{patch}"


def library_path() -> Optional[str]:
    return _path if load() else None


def why_not() -> Optional[str]:
    """None when the CPU kernels run on oneDNN, else why they run NumPy's."""
    if not enabled:
        return "switched off (GRADCORE_ONEDNN=0 or gradcore.cpu.onednn.enabled = False)"
    if not load():
        return _load_error
    return None


def status() -> str:
    """Which path the CPU convolutions, pooling and batch norm take, and why."""
    reason = why_not()
    if reason is not None:
        return f"NumPy kernels: oneDNN {reason}"
    return (f"oneDNN {version()} ({_path}), {num_threads()} threads; NumPy kernels for float64 and "
            f"for what oneDNN refuses ({len(_refused)} configurations so far)")


def set_num_threads(n: int) -> None:
    """Run oneDNN's primitives on ``n`` threads (0: follow OMP_NUM_THREADS);
    those below ``grain`` multiply-adds run on one.
    Example: ``gradcore.cpu.onednn.set_num_threads(1)``."""
    n = int(n)
    if n < 0:
        raise ValueError(f"set_num_threads: n must be >= 0, got {n}")
    if _onednn is not None:
        _onednn.set_num_threads(n)


def num_threads() -> int:
    """The threads a large oneDNN primitive runs on now (0 when oneDNN is
    not loaded); ``threads_for(work)`` says what one of ``work`` gets."""
    return _onednn.max_threads() if load() else 0


def stats() -> dict:
    """The primitive cache: ``hits``, ``misses``, ``evictions``, ``refused``
    (configurations oneDNN has no implementation for), ``size``, ``limit``."""
    with _lock:
        return dict(_stats, size=len(_cache), limit=cache_limit)


def clear_cache() -> None:
    """Drop every cached primitive (and the memory of refused
    configurations), and give back the resident pages of libdnnl's code
    (``drop_code_pages``).

    Example::

        >>> clear_cache()          # after training: the primitives' JIT code and libdnnl's pages go
    """
    with _lock:
        _cache.clear()
        _refused.clear()
    drop_code_pages()


_MADV_DONTNEED = 4


def drop_code_pages() -> int:
    """Give back the resident pages of libdnnl's machine code (its
    read-execute mappings) and return how many bytes were mapped there.

    Creating primitives runs a large part of the library's code (the
    implementation lists, the JIT generators): ~20 MB of its pages stay
    resident after the primitives are gone, 18-20% of the demo's peak.
    The pages are clean copies of the file (the mapping is checked to hold
    no private or anonymous pages first), so madvise(MADV_DONTNEED) drops
    them from this process's memory and a later call faults them back in
    from the page cache (~5,000 minor faults, a few ms, once). Linux only;
    elsewhere, or if anything is unexpected, nothing is done (0).

    Example::

        >>> drop_code_pages()      # 44 MB of mappings given back (their resident part: ~20 MB)
    """
    if not _loaded or not sys.platform.startswith("linux"):
        return 0
    try:
        lib = os.path.realpath(_path)
        ranges, cur, clean = [], None, False
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if head and "-" in head[0] and not head[0].endswith(":"):       # a mapping's first line
                    if cur is not None and clean:
                        ranges.append(cur)
                    cur = None
                    if len(head) >= 6 and head[1] == "r-xp" and os.path.realpath(head[5]) == lib:
                        cur, clean = tuple(int(v, 16) for v in head[0].split("-")), True
                elif cur is not None and head and head[0] in ("Private_Dirty:", "Anonymous:") and head[1] != "0":
                    clean = False                 # a written page (text relocations, a debugger): keep all
        if cur is not None and clean:
            ranges.append(cur)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        done = 0
        for start, end in ranges:
            if libc.madvise(start, end - start, _MADV_DONTNEED) == 0:
                done += end - start
        return done
    except (OSError, ValueError, AttributeError):
        return 0


def refused() -> dict:
    """The configurations oneDNN refused: key -> reason."""
    with _lock:
        return dict(_refused)


# ---------------------------------------------------------------- the primitive cache
def threads_for(work: float) -> int:
    """The OpenMP threads a primitive of ``work`` units gets: one below
    ``grain``, else ``num_threads()``.

    Example::

        >>> threads_for(1e3), threads_for(1e9)     # (1, 2) on 2 threads
    """
    n = _onednn.max_threads() if _onednn is not None else 0
    return 1 if n > 1 and work < grain else n


def _conv_work(yshape, wshape) -> int:
    """A convolution's multiply-adds (each direction's): every output
    element of every image times C / groups * prod(kernel)."""
    return prod(yshape) * prod(wshape[1:])


def _pool_work(xshape, yshape, kernel) -> float:
    """Pooling's work in multiply-add units: each window's elements (and
    the input read once), at POOL_COST."""
    return (prod(yshape) * prod(kernel) + prod(xshape)) * POOL_COST


def _primitive(key: tuple, make, work: float):
    """The cached primitive of ``key`` (made by ``make()`` on a miss) for
    ``work`` units (``threads_for``), or None where oneDNN has no
    implementation for it."""
    threads = threads_for(work)
    key = key + (threads,)
    with _lock:
        prim = _cache.get(key)
        if prim is not None:
            _cache.move_to_end(key)
            _stats["hits"] += 1
            return prim
        if key in _refused:
            _stats["hits"] += 1
            return None
        _stats["misses"] += 1
    # made under the thread count it runs with (the key's): oneDNN sizes its
    # work split and scratchpad then, and a primitive made for OpenMP's
    # default of 2 threads but run on 1 took 3-6 ms instead of 20 us (the
    # weight gradient of a 1-channel convolution)
    _onednn.use_threads(threads)
    try:
        prim = make()
        prim.threads = threads
    except _onednn.OnednnError as exc:     # unimplemented, invalid arguments: the NumPy path runs it
        with _lock:
            # bounded as the cache is (a shape per key: a program of varying
            # shapes would grow it for ever); a refusal is cheap to find again
            if len(_refused) >= max(cache_limit, 1):
                _refused.clear()
            _refused[key] = str(exc)
            _stats["refused"] += 1
        return None
    with _lock:
        _cache[key] = prim
        while len(_cache) > max(cache_limit, 0):
            _cache.popitem(last=False)
            _stats["evictions"] += 1
    return prim


def _usable(*arrays) -> bool:
    """oneDNN runs on these arrays: switched on, loaded, float32, none empty."""
    if not enabled or (not _loaded and not load()):
        return False
    for a in arrays:
        if a.dtype != _F32 or a.size == 0:
            return False
    return True


def _c(a):
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _tup(v, n) -> Tuple[int, ...]:
    if isinstance(v, (int, np.integer)):
        return (int(v),) * n
    v = tuple(int(i) for i in v)
    if len(v) != n:
        raise ValueError(f"expected {n} values, got {v}")
    return v


def _right_pad(size, out, k, s, p, d):
    """oneDNN's right padding: what makes ``out`` outputs exact (PyTorch's
    floor rounding leaves part of the right padding unused)."""
    return (out - 1) * s + (k - 1) * d + 1 - size - p


def _out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _blocked(direction, cin, groups) -> bool:
    """Whether a convolution runs in the blocked layout (``conv_layout``).
    "auto": everywhere but the backward data of a layer with fewer than 16
    input channels per group (measured in benchmarks/bench_onednn.py: the
    blocked direct kernels are 2-6x faster than plain im2col + GEMM with
    the reorders counted, except that one, 2.5x slower on 3 channels)."""
    if conv_layout != "auto":
        return conv_layout == "blocked"
    return direction != 1 or cin // groups >= 16


def _conv_geometry(xshape, wshape, yshape, stride, padding, dilation, groups):
    n = len(xshape) - 2
    stride, padding, dilation = _tup(stride, n), _tup(padding, n), _tup(dilation, n)
    pr = tuple(_right_pad(xshape[2 + i], yshape[2 + i], wshape[2 + i], stride[i], padding[i], dilation[i])
               for i in range(n))
    wd = tuple(wshape) if groups == 1 else (groups, wshape[0] // groups) + tuple(wshape[1:])
    return wd, stride, tuple(d - 1 for d in dilation), padding, pr


# ---------------------------------------------------------------- convolutions
def conv_forward(x, w, stride, padding, dilation, groups=1, bias=None, relu=False):
    """y = conv(x, w) (+ bias per channel, then ReLU) over the trailing
    spatial axes of x (N, C, *S), w (O, C // groups, *K); None where
    oneDNN does not run it."""
    if not _usable(x, w) or (bias is not None and not _usable(bias)) or not 3 <= x.ndim <= 5:
        return None
    n = x.ndim - 2
    st, pd, dl = _tup(stride, n), _tup(padding, n), _tup(dilation, n)
    yshape = (x.shape[0], w.shape[0]) + tuple(_out(x.shape[2 + i], w.shape[2 + i], st[i], pd[i], dl[i])
                                               for i in range(n))
    if min(yshape) < 1:
        return None
    wd, st, dil, pl, pr = _conv_geometry(x.shape, w.shape, yshape, st, pd, dl, groups)
    blk = _blocked(0, x.shape[1], groups)
    key = ("conv", 0, x.shape, w.shape, st, pl, dil, groups, bias is not None, bool(relu), blk)
    prim = _primitive(key, lambda: _onednn.convolution(0, x.shape, wd, yshape, st, dil, pl, pr, bias is not None,
                                                       bool(relu), blk), _conv_work(yshape, w.shape))
    if prim is None:
        return None
    y = np.empty(yshape, _F32)
    if bias is None:
        prim.run(_c(x), _c(w), y)
    else:
        prim.run(_c(x), _c(w), _c(bias.reshape(-1)), y)
    return y


def conv_backward_data(g, w, xshape, stride, padding, dilation, groups=1):
    """The gradient of conv_forward with respect to x (of shape ``xshape``)
    from the output gradient g; None where oneDNN does not run it."""
    xshape = tuple(int(s) for s in xshape)
    if not _usable(g, w) or not 3 <= g.ndim <= 5 or 0 in xshape:
        return None
    wd, st, dil, pl, pr = _conv_geometry(xshape, w.shape, g.shape, stride, padding, dilation, groups)
    blk = _blocked(1, xshape[1], groups)
    key = ("conv", 1, xshape, w.shape, g.shape, st, pl, dil, groups, blk)
    prim = _primitive(key, lambda: _onednn.convolution(1, xshape, wd, g.shape, st, dil, pl, pr, False, False, blk),
                      _conv_work(g.shape, w.shape))
    if prim is None:
        return None
    dx = np.empty(xshape, _F32)
    prim.run(_c(g), _c(w), dx)
    return dx


def fuse_bias_gradient(gshape: Sequence[int], wshape: Sequence[int]) -> bool:
    """Whether a convolution's bias gradient should come from its
    weight-gradient primitive (``conv_backward_weights(..., bias=True)``)
    given the output gradient's and the weight's shapes: where that
    primitive runs on one thread (``threads_for``). On more, the primitive
    adds a cross-thread reduction and its barriers, and the op sums g with
    NumPy instead. Measured on a shared 2-core machine (the digits CNN's
    layers, batch 32): on one thread the fused gradient took 30 / 61 us
    against 39 / 80 us for the primitive plus a NumPy sum; on two threads,
    under load, the 1-channel layer's took 1.0 ms (median; 2.8 ms mean)
    against 0.7 ms (1.5 ms) unfused.

    Example::

        >>> fuse_bias_gradient((32, 16, 8, 8), (16, 1, 3, 3))    # True: a small layer runs on one thread
    """
    return threads_for(_conv_work(gshape, wshape)) == 1


def conv_backward_weights(g, x, wshape, stride, padding, dilation, groups=1, bias=False):
    """The gradient of conv_forward with respect to w (of shape ``wshape``)
    from the output gradient g (with ``bias``: the pair (dw, dbias));
    None where oneDNN does not run it."""
    wshape = tuple(int(s) for s in wshape)
    if not _usable(g, x) or not 3 <= g.ndim <= 5 or 0 in wshape:
        return None
    wd, st, dil, pl, pr = _conv_geometry(x.shape, wshape, g.shape, stride, padding, dilation, groups)
    blk = _blocked(2, x.shape[1], groups)
    key = ("conv", 2, x.shape, wshape, g.shape, st, pl, dil, groups, bool(bias), blk)
    prim = _primitive(key, lambda: _onednn.convolution(2, x.shape, wd, g.shape, st, dil, pl, pr, bool(bias), False,
                                                       blk), _conv_work(g.shape, wshape))
    if prim is None:
        return None
    dw = np.empty(wshape, _F32)
    if not bias:
        prim.run(_c(g), _c(x), dw)
        return dw
    db = np.empty((g.shape[1],), _F32)
    prim.run(_c(g), _c(x), dw, db)
    return dw, db


def conv_transpose(x, w, stride, padding, output_padding, dilation, groups=1):
    """The transposed convolution of x (N, C_in, *S) with w (C_in, C_out //
    groups, *K), PyTorch's conv_transpose: the backward data of a
    convolution with x as its output gradient. None where oneDNN does not
    run it."""
    if not 3 <= x.ndim <= 5:
        return None
    n = x.ndim - 2
    st, pd, op, dl = _tup(stride, n), _tup(padding, n), _tup(output_padding, n), _tup(dilation, n)
    out = tuple((x.shape[2 + i] - 1) * st[i] - 2 * pd[i] + dl[i] * (w.shape[2 + i] - 1) + op[i] + 1
                for i in range(n))
    if min(out, default=1) < 1:
        return None
    return conv_backward_data(x, w, (x.shape[0], w.shape[1] * groups) + out, st, pd, dl, groups)


# ---------------------------------------------------------------- pooling
_POOL_KINDS = ("max", "average", "average_count_exclude_padding")


def _pool_geometry(xshape, kernel, stride, padding):
    n = len(xshape) - 2
    k, s, p = _tup(kernel, n), _tup(stride, n), _tup(padding, n)
    out = tuple(_out(xshape[2 + i], k[i], s[i], p[i], 1) for i in range(n))
    pr = tuple(_right_pad(xshape[2 + i], out[i], k[i], s[i], p[i], 1) for i in range(n))
    return tuple(xshape[:2]) + out, k, s, p, pr


def pool_forward(x, kind, kernel, stride, padding):
    """Max or average pooling of x (N, C, *S) (``kind``: "max", "average"
    counting padding, "average_count_exclude_padding"); None where oneDNN
    does not run it (max pooling over a NaN: NumPy's path propagates it)."""
    if kind not in _POOL_KINDS or not _usable(x) or not 3 <= x.ndim <= 5:
        return None
    yshape, k, s, p, pr = _pool_geometry(x.shape, kernel, stride, padding)
    if min(yshape) < 1:
        return None
    prim = _primitive(("pool", 1, kind, x.shape, k, s, p),
                      lambda: _onednn.pooling(1, kind, x.shape, yshape, s, k, p, pr), _pool_work(x.shape, yshape, k))
    if prim is None:
        return None
    if kind == "max" and np.isnan(x.max()):
        return None      # oneDNN's max drops NaN; NumPy's path propagates it (as PyTorch's)
    y = np.empty(yshape, _F32)
    prim.run(_c(x), y)
    return y


def pool_backward(g, x, kind, kernel, stride, padding, xshape=None):
    """The input gradient of pool_forward from g: max pooling routes each
    window's gradient to its first maximum (needs x), average pooling
    spreads it (x or ``xshape`` gives the input's shape). None where
    oneDNN does not run it."""
    if kind not in _POOL_KINDS or not _usable(g):
        return None
    xshape = tuple(x.shape) if x is not None else tuple(int(v) for v in xshape)
    if not 3 <= len(xshape) <= 5 or 0 in xshape:
        return None
    yshape, k, s, p, pr = _pool_geometry(xshape, kernel, stride, padding)
    if tuple(g.shape) != yshape:
        return None
    work = _pool_work(xshape, yshape, k)
    bwd = _primitive(("pool", 2, kind, xshape, k, s, p), lambda: _onednn.pooling(2, kind, xshape, yshape, s, k, p, pr),
                     work)
    if bwd is None:
        return None
    dx = np.empty(xshape, _F32)
    if kind != "max":
        bwd.run(_c(g), dx)
        return dx
    if x is None or not _usable(x):
        return None
    fwd = _primitive(("pool", 0, kind, xshape, k, s, p), lambda: _onednn.pooling(0, kind, xshape, yshape, s, k, p, pr),
                     work)
    if fwd is None:
        return None
    if np.isnan(x.max()):
        return None      # NaN wins a window on NumPy's path: it routes the gradient there
    y = np.empty(yshape, _F32)
    ws = np.empty(fwd.workspace_bytes, np.uint8)
    fwd.run(_c(x), y, ws)        # the argmax of each window, in the workspace
    bwd.run(_c(g), ws, dx)
    return dx


# ---------------------------------------------------------------- resampling
def _resample_work(shape) -> float:
    """Linear resampling's work in multiply-add units: the larger side's
    elements, 2^d taps each (d spatial axes), at POOL_COST."""
    return prod(shape) * (1 << (len(shape) - 2)) * POOL_COST


def resample(x, size):
    """x (N, C, *S) resampled linearly to the spatial ``size``: bilinear for
    2-D, with source coordinates ``(o + 0.5) * in / out - 0.5`` clamped to
    the input (PyTorch's ``align_corners=False``, MegEngine's resize).
    None where oneDNN does not run it.

    Example::

        >>> resample(np.ones((1, 1, 2, 2), np.float32), (4, 4)).shape     # doctest: +SKIP
        (1, 1, 4, 4)
    """
    if not _usable(x) or not 3 <= x.ndim <= 5 or len(size) != x.ndim - 2 or min(size) < 1:
        return None
    yshape = tuple(x.shape[:2]) + tuple(int(s) for s in size)
    prim = _primitive(("resample", 0, x.shape, yshape), lambda: _onednn.resampling(x.shape, yshape),
                      _resample_work(max(x.shape, yshape, key=prod)))
    if prim is None:
        return None
    y = np.empty(yshape, _F32)
    prim.run(_c(x), y)
    return y


# ---------------------------------------------------------------- matmul
def _elem_strides(a):
    """a's strides in elements where they are a row-major or transposed
    2-d layout oneDNN reads in place (unit stride on one axis), else None."""
    if a.ndim != 2:
        return None
    s0, s1 = (st // a.itemsize for st in a.strides)
    if a.strides[0] % a.itemsize or a.strides[1] % a.itemsize:
        return None
    if (s1 == 1 and s0 >= max(a.shape[1], 1)) or (s0 == 1 and s1 >= max(a.shape[0], 1)):
        return (s0, s1)
    return None


# below this many multiply-adds NumPy's OpenBLAS is faster (oneDNN's call
# costs ~8 us more from Python): measured on the MLP's GEMMs, one thread,
# (128, 10) x (10, 512) 1.3x, (32, 512) x (512, 10) 2.5x, (128, 512) x
# (512, 10) 0.81x; the large ones 0.62-0.99x (bench_onednn.py --only matmul)
matmul_min = 1 << 20


def matmul(a: np.ndarray, b: np.ndarray) -> Optional[np.ndarray]:
    """a (M, K) @ b (K, N) on oneDNN's matmul primitive, or None (not
    float32, or fewer than ``matmul_min`` multiply-adds, where NumPy's BLAS
    is faster). a and b may be row-major or transposed views (``w.T``),
    read in place.

    Example::

        >>> matmul(x, w.T)            # x @ w.T, w of shape (N, K)
    """
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0] or not _usable(a, b):
        return None
    if a.shape[0] * a.shape[1] * b.shape[1] < matmul_min:
        return None
    sa, sb = _elem_strides(a), _elem_strides(b)
    if sa is None:
        a, sa = np.ascontiguousarray(a), (a.shape[1], 1)
    if sb is None:
        b, sb = np.ascontiguousarray(b), (b.shape[1], 1)
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    key = ("matmul", a.shape, sa, b.shape, sb)
    prim = _primitive(key, lambda: _onednn.matmul(a.shape, b.shape, (m, n), sa, sb), m * k * n)
    if prim is None:
        return None
    c = np.empty((m, n), _F32)
    prim.run(a, b, c)
    return c


# ---------------------------------------------------------------- batch normalisation
def _bn_blocked(x) -> bool:
    if bn_layout != "auto":
        return bn_layout == "blocked" and 3 <= x.ndim <= 5
    return 3 <= x.ndim <= 5 and x.shape[1] >= 16


def _bn_ok(x, *params) -> bool:
    return _usable(x, *params) and 2 <= x.ndim <= 5 and all(p.size == x.shape[1] for p in params)


def _per_channel(a):
    return _c(a.reshape(-1))


def _bn_primitive(kind: int, x, eps):
    """The cached batch-norm primitive of ``kind`` (0 training, 1 inference,
    2 backward) for ``x``'s shape, or None where oneDNN refuses it."""
    blk = _bn_blocked(x)
    return _primitive(("bn", kind, x.shape, float(eps), blk),
                      lambda: _onednn.batch_norm(kind, tuple(x.shape), float(eps), blk), x.size * BN_COST)


def _param_shape(x):
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def batch_norm_training(x, weight, bias, eps):
    """(y, mean, invstd) of batch normalisation with the batch's statistics
    over every axis but 1 (mean and invstd shaped (1, C, 1, ...), invstd =
    1 / sqrt(biased variance + eps)); None where oneDNN does not run it."""
    if not _bn_ok(x, weight, bias):
        return None
    prim = _bn_primitive(0, x, eps)
    if prim is None:
        return None
    c = x.shape[1]
    y = np.empty(x.shape, _F32)
    mean, var = np.empty(c, _F32), np.empty(c, _F32)
    prim.run(_c(x), _per_channel(weight), _per_channel(bias), y, mean, var)
    invstd = (1.0 / np.sqrt(var.astype(np.float64) + eps)).astype(_F32)
    shape = _param_shape(x)
    return y, mean.reshape(shape), invstd.reshape(shape)


def batch_norm_inference(x, mean, var, weight, bias, eps):
    """(x - mean) / sqrt(var + eps) * weight + bias, per channel; None
    where oneDNN does not run it."""
    if not _bn_ok(x, mean, var, weight, bias):
        return None
    prim = _bn_primitive(1, x, eps)
    if prim is None:
        return None
    y = np.empty(x.shape, _F32)
    prim.run(_c(x), _per_channel(mean), _per_channel(var), _per_channel(weight), _per_channel(bias), y)
    return y


def batch_norm_backward(g, x, weight, mean, invstd, eps):
    """(dx, dweight, dbias) of batch_norm_training from the output gradient
    g, with the mean and invstd it returned; None where oneDNN does not
    run it."""
    if not _bn_ok(x, weight, mean, invstd) or not _usable(g) or g.shape != x.shape:
        return None
    prim = _bn_primitive(2, x, eps)
    if prim is None:
        return None
    c = x.shape[1]
    # oneDNN reads the variance: the one whose 1 / sqrt(var + eps) is invstd
    inv = invstd.reshape(-1).astype(np.float64)
    var = (1.0 / (inv * inv) - eps).astype(_F32)
    dx = np.empty(x.shape, _F32)
    dw, db = np.empty(c, _F32), np.empty(c, _F32)
    prim.run(_c(x), _per_channel(mean), var, _c(g), _per_channel(weight), dx, dw, db)
    shape = _param_shape(x)
    return dx, dw.reshape(shape), db.reshape(shape)


__all__ = ["enabled", "cache_limit", "candidate_paths", "load", "version", "library_path", "why_not", "status",
           "set_num_threads", "num_threads", "grain", "threads_for", "matmul_min", "matmul", "resample", "stats",
           "clear_cache", "drop_code_pages",
           "refused", "conv_forward", "conv_backward_data", "conv_backward_weights", "fuse_bias_gradient",
           "conv_transpose", "pool_forward", "pool_backward", "batch_norm_training", "batch_norm_inference",
           "batch_norm_backward"]
