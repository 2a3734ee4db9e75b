"""The CUDA backend.

- ``backend``: the process's ``Backend`` (device arrays, kernel loading and
  launching, the helpers op launchers use); ``use("gpu" | "emulator")``.
- ``driver``: PyCUDA on the device's primary context; ``emulator``: the same
  interface on the host, running the CUDA C sources as C++ (tests without a GPU).
- ``memory``: the caching device-memory pool; ``blas``: cuBLAS via ctypes.
- ``cache``: the nvcc/PTX kernel cache (memory and disk); ``fusion``: one
  fused kernel for an all-elementwise backward graph.

An op runs on ``cuda`` through its ``cuda(be, *arrays)`` launcher, next to
its ``cpu`` kernel and ``cuda_source`` in ``gradcore/ops``.
"""
from .array import DeviceArray
from .runtime import Backend, CudaUnavailable, Dims, backend, pack_params, unavailable_reason, use
from .cache import KernelCache, KernelCompileError, cache_key, default_directory
from .fusion import FusedKernel, KernelOutput, KernelParam, fuse_elementwise

__all__ = ["backend", "use", "unavailable_reason", "Backend", "DeviceArray", "Dims", "pack_params",
           "CudaUnavailable", "fuse_elementwise", "FusedKernel", "KernelParam", "KernelOutput",
           "KernelCache", "KernelCompileError", "cache_key", "default_directory"]
