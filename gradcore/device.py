"""MegEngine's ``megengine.device``: which devices there are, the default
one, and what their memory and CUDA stack are.

The machinery itself (device names, moving data, kernels per device) is
``gradcore.devices``; this module is the MegEngine-named face of it, with
the memory statistics of gradcore's two caching allocators:

- on the cpu, the host pool that allocates the data of NumPy arrays made
  in gradcore's threads (``gradcore.memory``): "allocated" is the bytes of
  the arrays alive now (tensors' data and any other array made there),
  "reserved" that plus the freed blocks the pool keeps for reuse;
- on cuda, the device pool (``gradcore.cuda``): "allocated" is the bytes of
  live device arrays, "reserved" all that was taken from the driver and not
  given back (a CUDA graph's private pool counts while the graph is being
  captured; afterwards its memory is the graph's, freed with it).

MegEngine's logical devices ("cpu1", "xpux") name the physical device they
run on, so they report its figures. Every function that takes ``device``
uses the default device (``get_default_device()``) when it is None.

Example::

    >>> import gradcore.device as device
    >>> device.reset_max_memory_stats("cpu0")
    >>> x = gc.functional.zeros((1024, 1024))                 # 4 MiB of float32
    >>> device.get_max_allocated_memory("cpu0") - device.get_allocated_memory("cpu0") < 1 << 20
    True
    >>> del x
    >>> device.get_max_allocated_memory("cpu0") >= 4 << 20
    True
"""
from __future__ import annotations

import os
from typing import NamedTuple, Optional, Tuple

from . import _host_pool
from .devices import get_default_device, get_device_count, is_cuda_available, norm_device, \
    require_cuda, set_default_device

__all__ = [
    "is_cuda_available", "is_cambricon_available", "is_atlas_available", "is_rocm_available",
    "get_device_count", "get_default_device", "set_default_device", "what_is_xpu",
    "get_mem_status_bytes", "get_cuda_compute_capability", "get_cuda_device_property",
    "get_cuda_version", "get_cudnn_version", "get_cuda_driver_version",
    "get_allocated_memory", "get_reserved_memory", "get_max_allocated_memory",
    "get_max_reserved_memory", "reset_max_memory_stats", "coalesce_free_memory",
]


class DeviceProperties(NamedTuple):
    """A GPU's properties, as MegEngine's ``get_cuda_device_property`` gives them."""
    name: str
    total_memory: int
    major: int
    minor: int


def is_cambricon_available() -> bool:
    """False: gradcore has no Cambricon backend (MegEngine's query).

    Example::

        >>> gc.device.is_cambricon_available()
        False
    """
    return False


def is_atlas_available() -> bool:
    """False: gradcore has no Atlas backend (MegEngine's query).

    Example::

        >>> gc.device.is_atlas_available()
        False
    """
    return False


def is_rocm_available() -> bool:
    """False: gradcore has no ROCm backend (MegEngine's query).

    Example::

        >>> gc.device.is_rocm_available()
        False
    """
    return False


def what_is_xpu() -> str:
    """The device MegEngine's "xpu" means here: "cuda" where there is a GPU
    (or the emulator is selected), else "cpu".

    Example::

        >>> gc.device.what_is_xpu() in ("cpu", "cuda")
        True
    """
    return "cuda" if is_cuda_available() else "cpu"


def _physical(device: Optional[str]) -> str:
    """"cpu" or "cuda" for any device name MegEngine accepts (None: the default)."""
    d = norm_device(get_default_device() if device is None else device)
    return "cpu" if str.__str__(d).startswith("cpu") or d == "cpu" else "cuda"


def _cuda_pools() -> list:
    """The device pool and the one it sends allocations to meanwhile (a
    CUDA graph's being captured, the emulator's guarded pool)."""
    pool = require_cuda().pool
    return [pool] if pool.redirect is None else [pool, pool.redirect]


def _cuda_figure(name: str) -> int:
    return int(sum(getattr(p, name) for p in _cuda_pools()))


def get_mem_status_bytes(device: Optional[str] = None) -> Tuple[int, int]:
    """``(total, free)`` bytes of the device's memory: the machine's memory
    and what is available to new processes (``MemAvailable``) on the cpu,
    the GPU's on cuda.

    Example::

        >>> total, free = gc.device.get_mem_status_bytes("cpu0")
        >>> 0 < free <= total
        True
    """
    if _physical(device) == "cuda":
        return require_cuda().driver.memory_info()
    return _host_memory_info()


def _host_memory_info() -> Tuple[int, int]:
    try:
        fields = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                fields[key] = int(rest.split()[0]) * 1024
        return fields["MemTotal"], fields.get("MemAvailable", fields.get("MemFree", 0))
    except (OSError, KeyError, ValueError, IndexError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page


def get_allocated_memory(device: Optional[str] = None) -> int:
    """Bytes of the device's memory held by live arrays now (see the module
    docstring for what counts on each device).

    Example::

        >>> before = gc.device.get_allocated_memory("cpu0")
        >>> x = gc.functional.zeros((256, 1024))                  # 1 MiB
        >>> gc.device.get_allocated_memory("cpu0") - before >= 1 << 20
        True
    """
    if _physical(device) == "cuda":
        return _cuda_figure("in_use_bytes")
    return int(_host_pool.stats()["in_use_bytes"])


def get_reserved_memory(device: Optional[str] = None) -> int:
    """Bytes the device's caching allocator holds now: the live arrays' and
    the freed blocks it keeps for reuse.

    Example::

        >>> gc.device.get_reserved_memory() >= gc.device.get_allocated_memory()
        True
    """
    if _physical(device) == "cuda":
        return _cuda_figure("reserved_bytes")
    s = _host_pool.stats()
    return int(s["in_use_bytes"] + s["cached_bytes"] + s["small_cached_bytes"])


def get_max_allocated_memory(device: Optional[str] = None) -> int:
    """The peak of ``get_allocated_memory`` since the start or the last
    ``reset_max_memory_stats``.

    Example::

        >>> gc.device.get_max_allocated_memory() >= gc.device.get_allocated_memory()
        True
    """
    if _physical(device) == "cuda":
        return _cuda_figure("peak_bytes")
    return int(_host_pool.stats()["peak_in_use_bytes"])


def get_max_reserved_memory(device: Optional[str] = None) -> int:
    """The peak of ``get_reserved_memory`` since the start or the last
    ``reset_max_memory_stats``.

    Example::

        >>> gc.device.get_max_reserved_memory() >= gc.device.get_max_allocated_memory()
        True
    """
    if _physical(device) == "cuda":
        return _cuda_figure("peak_reserved_bytes")
    return int(_host_pool.stats()["peak_reserved_bytes"])


def reset_max_memory_stats(device: Optional[str] = None) -> None:
    """Start the peaks (``get_max_allocated_memory``,
    ``get_max_reserved_memory``) again from what the device holds now.

    Example::

        >>> gc.device.reset_max_memory_stats()
        >>> gc.device.get_max_allocated_memory() - gc.device.get_allocated_memory() < 1 << 16
        True
    """
    if _physical(device) == "cuda":
        for pool in _cuda_pools():
            pool.reset_peaks()
    else:
        _host_pool.reset_peaks()


def coalesce_free_memory() -> None:
    """Give the freed blocks that the caching allocators keep back to the
    system (the host pool's, and the GPU's where cuda is in use); what live
    arrays hold stays.

    Example::

        >>> gc.device.coalesce_free_memory()
        >>> gc.memory.stats()["cached_bytes"]
        0
    """
    _host_pool.empty_cache()
    from .cuda import runtime
    if runtime.started():
        for pool in _cuda_pools():
            pool.empty_cache()


def get_cuda_compute_capability(device: int = 0, device_type: str = "cuda") -> int:
    """The GPU's compute capability as a number, major * 10 + minor (an
    H100: 90); raises RuntimeError without a GPU (0 on the host emulator,
    which is no GPU).

    Example::

        >>> if gc.is_cuda_available():
        ...     assert gc.device.get_cuda_compute_capability(0) >= 0
    """
    prop = get_cuda_device_property(device, device_type)
    return prop.major * 10 + prop.minor


def get_cuda_device_property(device: int = 0, device_type: str = "cuda") -> DeviceProperties:
    """The GPU's ``name``, ``total_memory`` (bytes), ``major`` and ``minor``
    compute capability; raises RuntimeError without a GPU.

    Example::

        >>> if gc.is_cuda_available():         # an H100: 'NVIDIA H100 80GB HBM3', 80 GB, 9, 0
        ...     prop = gc.device.get_cuda_device_property(0)
        ...     assert prop.total_memory > 0 and prop.name
    """
    if str(device_type).lower() not in ("cuda", "gpu"):
        raise ValueError(f"get_cuda_device_property: device_type must be 'cuda', got {device_type!r}")
    be = require_cuda()
    if device != 0:
        raise ValueError(f"get_cuda_device_property: gradcore uses one GPU (device 0), got device {device!r}")
    return DeviceProperties(*be.driver.properties())


def get_cuda_version() -> int:
    """The version of the CUDA compiler (NVRTC) gradcore compiles kernels
    with, as CUDA numbers it: major * 1000 + minor * 10 (CUDA 13.0: 13000);
    raises RuntimeError where NVRTC is not found.

    Example::

        >>> try:
        ...     version = gc.device.get_cuda_version()        # 13000 for CUDA 13.0
        ... except RuntimeError:                               # no NVRTC here
        ...     version = None
        >>> version is None or version >= 11000
        True
    """
    from .cuda import nvrtc
    try:
        major, minor = nvrtc.version()
    except Exception as exc:
        raise RuntimeError(f"get_cuda_version: NVRTC is unavailable ({exc})") from None
    return major * 1000 + minor * 10


def get_cudnn_version() -> int:
    """The version of the cuDNN gradcore loads, as cuDNN numbers it
    (``cudnnGetVersion``; cuDNN 9.1.0: 90100); raises RuntimeError where
    cuDNN is not found.

    Example::

        >>> try:
        ...     version = gc.device.get_cudnn_version()       # 91000 for cuDNN 9.10.0
        ... except RuntimeError:                               # no cuDNN here
        ...     version = None
        >>> version is None or version >= 8000
        True
    """
    from .cuda import cudnn
    try:
        return cudnn.load_library().version()
    except cudnn.CudnnUnavailable as exc:
        raise RuntimeError(f"get_cudnn_version: {exc}") from None


def get_cuda_driver_version() -> int:
    """The newest CUDA version the GPU's driver supports, major * 1000 +
    minor * 10 (``cuDriverGetVersion``); raises RuntimeError without a GPU
    driver.

    Example::

        >>> try:
        ...     version = gc.device.get_cuda_driver_version()   # 13000: CUDA 13.0
        ... except RuntimeError:                                 # no GPU driver here
        ...     version = None
        >>> version is None or version >= 11000
        True
    """
    return int(require_cuda().driver.driver_version())
