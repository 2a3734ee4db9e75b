"""Devices. ``cpu`` (NumPy) is always there; ``cuda`` needs PyCUDA and a GPU
(the CUDA backend issue builds it). Until then every cuda request says why
it is unavailable."""
from __future__ import annotations


def cuda_unavailable_reason() -> str:
    try:
        import pycuda.driver as drv  # noqa: F401
    except Exception as exc:  # ImportError, or a driver that fails to load
        return f"PyCUDA is not importable ({type(exc).__name__}: {exc}); install gradcore[cuda] on a machine with an NVIDIA GPU"
    try:
        drv.init()
        if drv.Device.count() == 0:
            return "PyCUDA found no GPU"
    except Exception as exc:
        return f"the CUDA driver failed to initialise ({exc})"
    return "the CUDA backend is not built into this version of gradcore yet"


def is_cuda_available() -> bool:
    return False


def require_cuda():
    raise RuntimeError(f"device 'cuda' is unavailable: {cuda_unavailable_reason()}")


def kernel_for(op, device):
    require_cuda()


def to_device(arr, device):
    require_cuda()


def copy_to(tensor, device):
    require_cuda()


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
