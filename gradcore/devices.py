"""Devices: ``cpu`` (NumPy) always; ``cuda`` when PyCUDA and a GPU are
present (or the host emulator is selected, ``GRADCORE_CUDA=emulator``).

A tensor's data is an ``ndarray`` on cpu and a ``gradcore.cuda.DeviceArray``
on cuda; ops run on the device of their inputs, through the op's ``cpu``
kernel or its ``cuda(be, *arrays)`` launcher.
"""
from __future__ import annotations

import numpy as np


def cuda_unavailable_reason() -> str:
    """Why ``cuda`` cannot be used here ("" when it can)."""
    from .cuda import runtime as _b
    return _b.unavailable_reason() or ""


def is_cuda_available() -> bool:
    """True when tensors can be put on ``cuda``."""
    return not cuda_unavailable_reason()


def require_cuda():
    """The CUDA backend, or a RuntimeError saying why ``cuda`` is unavailable."""
    from .cuda import runtime as _b
    try:
        return _b.backend()
    except _b.CudaUnavailable as exc:
        raise RuntimeError(f"device 'cuda' is unavailable: {exc}") from None


def _no_cuda_kernel(op):
    name = op._name() if hasattr(op, "_name") else getattr(op, "name", type(op).__name__)
    return NotImplementedError(f"{name} has no cuda kernel (no cuda(be, *arrays) launcher); "
                               "run it on the cpu, or give the op a launcher next to its cuda_source")


_launchers = {}


def kernel_for(op, device):
    """The kernel running ``op`` on ``device``: a callable on that device's
    arrays. On cuda it runs the op's ``cuda(be, *arrays)`` launcher with the
    backend current at call time (compiled backward graphs keep kernels)."""
    if device == "cpu":
        return op.cpu
    require_cuda()
    fn = _launchers.get(op)
    if fn is None:
        launcher = getattr(op, "cuda", None)
        if launcher is None:
            raise _no_cuda_kernel(op)
        from .cuda import runtime

        def fn(*arrays, _launcher=launcher, _rt=runtime):
            return _launcher(_rt._backend or _rt.backend(), *arrays)
        if len(_launchers) > 4096:
            _launchers.clear()
        _launchers[op] = fn
    return fn


def to_device(arr, device):
    """``arr`` (host data) on ``device``."""
    if device == "cpu":
        return arr
    return require_cuda().to_device(arr)


def to_host(data) -> np.ndarray:
    """Host (NumPy) data for a tensor's data on any device."""
    if isinstance(data, np.ndarray):
        return data
    return data.get()


def copy_to(tensor, device):
    """A new Tensor: ``tensor``'s value on ``device``, recorded (gradients
    flow back to the source device)."""
    from .ops.shape import Copy
    from . import _core
    return _core.apply(Copy(device), tensor)[0]


def nvcc_path():
    """The path of ``nvcc`` (PATH, then ``$CUDA_HOME/bin``, then
    ``/usr/local/cuda/bin``), or None. Compiling kernel sources needs it; a
    GPU does not."""
    import os
    import shutil
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            cand = os.path.join(root, "bin", "nvcc")
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand
    return None


def is_nvcc_available() -> bool:
    return nvcc_path() is not None
