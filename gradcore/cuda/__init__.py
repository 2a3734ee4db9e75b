"""The parts of the CUDA backend that need no GPU: fused backward kernel
generation (``fusion``) and the nvcc/PTX kernel cache (``cache``). The
launcher, memory pool and PyCUDA context come with a GPU (issue 6)."""
from .cache import KernelCache, KernelCompileError, cache_key, default_directory
from .fusion import FusedKernel, KernelOutput, KernelParam, fuse_elementwise

__all__ = ["fuse_elementwise", "FusedKernel", "KernelParam", "KernelOutput",
           "KernelCache", "KernelCompileError", "cache_key", "default_directory"]
