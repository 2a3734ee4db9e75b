"""NVRTC (NVIDIA's runtime compiler) through ctypes: CUDA C to PTX or a
CUBIN in-process, without ``nvcc``, without a GPU and without a driver.

The library is looked up as cuBLAS is (``toolkit.library_candidates``): the
``nvidia-cuda-nvrtc`` wheel (``pip install gradcore[cuda]``), else the
system CUDA toolkit's ``libnvrtc``. Compiling is not on the per-op path
(once per kernel family and machine, then the disk cache serves), so
ctypes is fast enough; ctypes releases the GIL during each call, so
programs compile in parallel on a thread pool.

Example::

    >>> from gradcore.cuda import nvrtc                               # doctest: +SKIP
    >>> ptx = nvrtc.compile_program('extern "C" __global__ void k(float* x) { x[0] = 1; }',
    ...                             "k", arch="compute_80").image      # doctest: +SKIP
    >>> b".entry k" in ptx                                            # doctest: +SKIP
    True
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

__all__ = ["NvrtcError", "NvrtcUnavailable", "Compiled", "available", "locate", "version", "supported_archs",
           "compile_program", "library_path"]

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_load_error: Optional[str] = None


class NvrtcUnavailable(RuntimeError):
    """No NVRTC library could be loaded here; the message says where it looked."""


class NvrtcError(RuntimeError):
    """An NVRTC call failed (other than a compile error, which the caller
    sees as a log): ``result`` is the nvrtcResult code."""

    def __init__(self, what: str, result: int, message: str):
        self.result = result
        super().__init__(f"NVRTC {what} failed: {message} (nvrtcResult {result})")


@dataclass(frozen=True)
class Compiled:
    """One program's result: ``ok``; ``image`` (PTX text as bytes for a
    ``compute_XX`` target, a CUBIN for ``sm_XX``; empty when not ok);
    ``kind`` ("ptx" or "cubin"); ``log``: NVRTC's program log."""
    ok: bool
    image: bytes
    kind: str
    log: str


def _load() -> ctypes.CDLL:
    global _lib, _lib_path, _load_error
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            if _load_error is not None:
                raise NvrtcUnavailable(_load_error)
            from .toolkit import library_candidates
            tried = []
            for path in library_candidates("nvrtc", "cuda_nvrtc"):
                try:
                    lib = ctypes.CDLL(path)
                    lib.nvrtcVersion            # a libnvrtc, not a namesake
                except (OSError, AttributeError) as exc:
                    tried.append(f"{path}: {exc}")
                    continue
                _declare(lib)
                _lib, _lib_path = lib, path
                break
            else:
                _load_error = ("NVRTC was not found: install nvidia-cuda-nvrtc (pip install gradcore[cuda]) or "
                               "the CUDA toolkit" + ("; tried " + "; ".join(tried) if tried else ""))
                raise NvrtcUnavailable(_load_error)
    return _lib


def _declare(lib: ctypes.CDLL) -> None:
    P, I, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    CP, PP = ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)
    sigs = {
        "nvrtcVersion": [ctypes.POINTER(I), ctypes.POINTER(I)],
        "nvrtcCreateProgram": [ctypes.POINTER(P), CP, CP, I, PP, PP],
        "nvrtcCompileProgram": [P, I, PP],
        "nvrtcDestroyProgram": [ctypes.POINTER(P)],
        "nvrtcGetPTXSize": [P, ctypes.POINTER(S)],
        "nvrtcGetPTX": [P, ctypes.c_char_p],
        "nvrtcGetCUBINSize": [P, ctypes.POINTER(S)],
        "nvrtcGetCUBIN": [P, ctypes.c_char_p],
        "nvrtcGetProgramLogSize": [P, ctypes.POINTER(S)],
        "nvrtcGetProgramLog": [P, ctypes.c_char_p],
        "nvrtcGetNumSupportedArchs": [ctypes.POINTER(I)],
        "nvrtcGetSupportedArchs": [ctypes.POINTER(I)],
    }
    for name, argtypes in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, I
    lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [I], ctypes.c_char_p


def _check(lib, result: int, what: str) -> None:
    if result != 0:
        raise NvrtcError(what, result, (lib.nvrtcGetErrorString(result) or b"?").decode())


def locate() -> Optional[str]:
    """The path of the libnvrtc that would load (the loaded one once
    loaded), without loading it; None when there is no candidate."""
    if _lib_path is not None:
        return _lib_path
    from .toolkit import iter_library_candidates
    return next(iter_library_candidates("nvrtc", "cuda_nvrtc"), None)


def available() -> bool:
    """Whether an NVRTC library loads here."""
    try:
        _load()
        return True
    except NvrtcUnavailable:
        return False


def library_path() -> str:
    """The path of the libnvrtc in use (raises ``NvrtcUnavailable``)."""
    _load()
    return _lib_path


def version() -> Tuple[int, int]:
    """NVRTC's (major, minor), e.g. ``(13, 0)``."""
    lib = _load()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def supported_archs() -> List[int]:
    """The compute capabilities this NVRTC targets, as ints (75, 80, ..., 120)."""
    lib = _load()
    n = ctypes.c_int()
    _check(lib, lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
    archs = (ctypes.c_int * n.value)()
    _check(lib, lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
    return list(archs)


def _read(lib, prog, size_fn, get_fn, what: str) -> bytes:
    size = ctypes.c_size_t()
    _check(lib, size_fn(prog, ctypes.byref(size)), what + "Size")
    buf = ctypes.create_string_buffer(size.value)
    _check(lib, get_fn(prog, buf), what)
    return buf.raw[:size.value]


def compile_program(source: str, name: str, arch: str, options: Sequence[str] = ()) -> Compiled:
    """Compile one CUDA C translation unit. ``arch``: ``"compute_80"`` gives
    PTX (the driver JIT-compiles it for the device), ``"sm_90"`` a CUBIN for
    that GPU (no JIT). A rejected source gives ``ok=False`` and NVRTC's log
    (the caller names the kernel in its error); a broken library raises
    ``NvrtcError``. Thread-safe: each call has its own program."""
    lib = _load()
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), (name or "kernel").encode() + b".cu",
                                       0, None, None), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", *options]
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        result = lib.nvrtcCompileProgram(prog, len(opts), argv)
        log = _read(lib, prog, lib.nvrtcGetProgramLogSize, lib.nvrtcGetProgramLog, "nvrtcGetProgramLog")
        log = log.rstrip(b"\0").decode(errors="replace")
        if result != 0:
            if result == 6:         # NVRTC_ERROR_COMPILATION: the source's fault, the log says why
                return Compiled(False, b"", "", log)
            _check(lib, result, f"nvrtcCompileProgram({name})")
        if arch.startswith("sm_"):
            image = _read(lib, prog, lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN, "nvrtcGetCUBIN")
            return Compiled(True, image, "cubin", log)
        image = _read(lib, prog, lib.nvrtcGetPTXSize, lib.nvrtcGetPTX, "nvrtcGetPTX").rstrip(b"\0")
        return Compiled(True, image, "ptx", log)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
