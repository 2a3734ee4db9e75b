"""cuBLAS through ctypes: the strided batched GEMMs matmul runs on.

The library is looked up where NVIDIA ships it: the ``nvidia-cublas``
wheels (``nvidia/cublas/lib`` or ``nvidia/cu*/lib``, which PyTorch's CUDA
wheels install), ``$CUDA_HOME/lib64``, ``/usr/local/cuda/lib64``, then the
system's loader path. The handle is created in the current (primary)
context and works on the default stream, like the backend's kernels, so
they are ordered without extra synchronisation.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import site
import sys
from typing import List, Optional

import numpy as np

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH = 0, 3
_STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH",
           11: "MAPPING_ERROR", 13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED",
           16: "LICENSE_ERROR"}


class CublasError(RuntimeError):
    pass


def check_status(status: int, what: str) -> None:
    """Raise a CublasError naming ``what`` unless ``status`` is success."""
    if status != 0:
        raise CublasError(f"{what} failed: CUBLAS_STATUS_{_STATUS.get(status, status)}")


def candidate_paths() -> List[str]:
    """Where libcublas may be, most specific first."""
    roots = list(sys.path) + site.getsitepackages() + [site.getusersitepackages()]
    found = []
    for root in dict.fromkeys(r for r in roots if r and os.path.isdir(r)):
        found += sorted(glob.glob(os.path.join(root, "nvidia", "cublas", "lib", "libcublas.so*")), reverse=True)
        found += sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "lib", "libcublas.so*")), reverse=True)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            found += sorted(glob.glob(os.path.join(home, "lib64", "libcublas.so*")), reverse=True)
            found += sorted(glob.glob(os.path.join(home, "targets", "*", "lib", "libcublas.so*")), reverse=True)
    name = ctypes.util.find_library("cublas")
    if name:
        found.append(name)
    return [p for p in dict.fromkeys(found) if "Lt" not in os.path.basename(p)]


def load_library() -> ctypes.CDLL:
    errors = []
    for path in candidate_paths():
        try:
            return ctypes.CDLL(path)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
    raise CublasError("cuBLAS was not found: install nvidia-cublas (pip) or the CUDA toolkit"
                      + ("; tried " + "; ".join(errors) if errors else ""))


class Cublas:
    """A cuBLAS handle and the two GEMMs gradcore uses."""

    def __init__(self, lib: Optional[ctypes.CDLL] = None):
        self.lib = lib or load_library()
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        P, I, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        for fn in (self.lib.cublasSgemmStridedBatched, self.lib.cublasDgemmStridedBatched):
            fn.argtypes = [P, I, I, I, I, I, P, P, I, L, P, I, L, P, P, I, L, I]
            fn.restype = I

    def entry_points(self):
        """(handle, address of cublasSgemmStridedBatched, of cublasDgemmStridedBatched):
        what the compiled path (``_launch.gemm``) calls, without ctypes per call."""
        addr = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
        return (self.handle.value, addr(self.lib.cublasSgemmStridedBatched),
                addr(self.lib.cublasDgemmStridedBatched))

    _check = staticmethod(check_status)

    def set_stream(self, stream: int) -> None:
        """The CUstream the handle's GEMMs run on (0: the legacy default
        stream; a capture stream while a CUDA graph is captured)."""
        fn = self.lib.cublasSetStream_v2
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
        self._check(fn(self.handle, stream or None), "cublasSetStream")

    def set_tf32(self, allowed: bool) -> None:
        """Let float32 GEMMs use TF32 tensor cores (``cublasSetMathMode``), or not (the default)."""
        fn = self.lib.cublasSetMathMode
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
        self._check(fn(self.handle, CUBLAS_TF32_TENSOR_OP_MATH if allowed else CUBLAS_DEFAULT_MATH),
                    "cublasSetMathMode")

    def gemm_strided_batched(self, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                             beta, c, ldc, stride_c, batch, dtype) -> None:
        """C = alpha op(A) op(B) + beta C for ``batch`` column-major matrices."""
        dtype = np.dtype(dtype)
        if dtype == np.float32:
            fn, scalar = self.lib.cublasSgemmStridedBatched, ctypes.c_float
        elif dtype == np.float64:
            fn, scalar = self.lib.cublasDgemmStridedBatched, ctypes.c_double
        else:
            raise TypeError(f"cuBLAS GEMM: no kernel for {dtype}")
        al, be = scalar(alpha), scalar(beta)
        status = fn(self.handle, CUBLAS_OP_T if transa else CUBLAS_OP_N, CUBLAS_OP_T if transb else CUBLAS_OP_N,
                    m, n, k, ctypes.byref(al), a, lda, stride_a, b, ldb, stride_b, ctypes.byref(be), c, ldc,
                    stride_c, batch)
        self._check(status, f"{'S' if dtype == np.float32 else 'D'}gemmStridedBatched(m={m}, n={n}, k={k}, "
                            f"batch={batch})")
