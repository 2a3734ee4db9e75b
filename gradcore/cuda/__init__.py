"""The CUDA backend.

- ``backend``: the process's ``Backend`` (device arrays, kernel loading and
  launching, the helpers op launchers use); ``use("gpu" | "emulator")``.
- ``driver``: PyCUDA on the device's primary context; ``emulator``: the same
  interface on the host, running the CUDA C sources as C++ (tests without a GPU).
- ``_launch`` (compiled): kernel handles, argument packing and launches
  through C entry points, the caching allocator, cuBLAS calls by pointer;
  ``memory``: the allocator's Python face; ``blas``: finding cuBLAS.
- ``memory_stats()``: allocator statistics and host/device copy counts;
  ``empty_cache()``: give cached blocks back.
- ``graphed(step)``: a whole training step as one CUDA graph (``graphs``).
- ``cudnn``: cuDNN for the convolutions and pooling on a GPU (the switches
  ``cudnn.benchmark``, ``cudnn.deterministic``, ``cudnn.enabled``).
- ``allow_tf32_conv`` (default True): float32 convolutions on cuDNN may use
  TF32 tensor cores; ``allow_tf32_matmul`` (default False): cuBLAS GEMMs
  stay full float32 (PyTorch's defaults; docs/cuda.md, "Precision").
- ``cache``: the nvcc/PTX kernel cache (memory and disk); ``fusion``: one
  fused kernel for an all-elementwise backward graph.
- ``kernels``: the kernel builder (``Kernel(name, params, body, over=...)``):
  the ``extern "C" __global__`` header, the element type ``T`` and the
  grid-stride or block loop of every kernel, written in one place.

An op runs on ``cuda`` through its ``cuda(be, *arrays)`` launcher, next to
its ``cpu`` kernel and ``cuda_source`` in ``gradcore/ops``.
"""
from .array import DeviceArray
from .runtime import (Backend, CudaUnavailable, Dims, backend, empty_cache, memory_stats, pack_params,
                      unavailable_reason, use)
from .cache import KernelCache, KernelCompileError, cache_key, default_directory
from .fusion import FusedKernel, KernelOutput, KernelParam, fuse_elementwise
from .graphs import GraphCaptureError, graphed
from . import cudnn

# the precision policy, read at each call (docs/cuda.md, "Precision")
allow_tf32_conv = True
allow_tf32_matmul = False

__all__ = ["backend", "use", "memory_stats", "empty_cache", "unavailable_reason", "Backend", "DeviceArray", "Dims", "pack_params",
           "CudaUnavailable", "fuse_elementwise", "FusedKernel", "KernelParam", "KernelOutput",
           "KernelCache", "KernelCompileError", "cache_key", "default_directory", "graphed", "GraphCaptureError",
           "cudnn", "allow_tf32_conv", "allow_tf32_matmul"]
