"""Devices: ``cpu`` (NumPy) always; ``cuda`` when PyCUDA and a GPU are
present (or the host emulator is selected, ``GRADCORE_CUDA=emulator``).

A tensor's data is an ``ndarray`` on cpu and a ``gradcore.cuda.DeviceArray``
on cuda; ops run on the device of their inputs, through the op's ``cpu``
kernel or its ``cuda(be, *arrays)`` launcher.
"""
from __future__ import annotations

import functools
import math
import re

import numpy as np

from .cuda import _launch as _cuda_launch
from .cuda import events as _cuda_events
from .cuda import runtime as _cuda_runtime


def cuda_unavailable_reason() -> str:
    """Why ``cuda`` cannot be used here ("" when it can)."""
    from .cuda import runtime as _b
    return _b.unavailable_reason() or ""


def is_cuda_available() -> bool:
    """True when tensors can be put on ``cuda``.

    Example::

        >>> device = "cuda" if gc.is_cuda_available() else "cpu"
        >>> x = gc.tensor([1.0, 2.0], device=device)
        >>> (x * 2).numpy()
        array([2., 4.], dtype=float32)
    """
    return not cuda_unavailable_reason()


def require_cuda():
    """The CUDA backend, or a RuntimeError saying why ``cuda`` is unavailable."""
    from .cuda import runtime as _b
    try:
        return _b.backend()
    except _b.CudaUnavailable as exc:
        raise RuntimeError(f"device 'cuda' is unavailable: {exc}") from None


def _no_cuda_kernel(op):
    from .op import op_label
    name = op_label(op)
    return NotImplementedError(f"{name} has no cuda kernel: give it a `cuda_source` (its CUDA C kernel; "
                               f"a launcher `cuda(self, be, *arrays)` too when the kernel's parameters are "
                               f"not the inputs, the outputs and `long long n`), or run it on the cpu "
                               f"(move the inputs with .to('cpu'))")


def _make_cuda_launcher(op):
    """``op``'s cuda launcher bound to the current backend (see ``kernel_for``)."""
    be = require_cuda()
    if type(op) is _cuda_runtime.standard_op("Elemwise"):
        # the commonest launcher, its usual case compiled (same plan, same
        # arguments); its ``run`` takes fixed arguments: no tuple per call
        return _cuda_launch.ElementwiseLauncher(op, be).run
    from .op import describe
    kind = describe(op).kernels.get("cuda")
    if kind is None:
        raise _no_cuda_kernel(op)
    launcher = functools.partial(elementwise_launcher, op) if kind == "default launch" else op.cuda
    return functools.partial(launcher, be)


# op -> its launcher bound to the current backend; dropped when the backend changes
kernel_table = _cuda_launch.LauncherTable(_make_cuda_launcher)
_cuda_events.subscribe("backend_changed", kernel_table.clear)


def kernel_for(op, device):
    """The kernel running ``op`` on ``device``: a callable on that device's
    arrays. On cuda it is the op's ``cuda(be, *arrays)`` launcher bound to
    the current backend (rebound after ``gradcore.cuda.use``). The core
    calls ``kernel_table`` directly, its compiled form.

    Example: ``kernel_for(Elemwise("mul"), "cpu")(a, b)`` is ``a * b``."""
    return kernel_table(op, device)


def elementwise_launcher(op, be, *arrays):
    """The launcher of an op that has a ``cuda_source`` but no ``cuda``
    method, for the simplest layout: ONE kernel taking the inputs (expanded
    to the first output's shape and cast to its dtype), then the outputs,
    then ``long long n`` (the elements of that shape), one thread per element
    (a grid-stride loop, or a bound check, both work)::

        extern "C" __global__ void gc_mycube_float(const float* x, float* y, long long n)

    Any other layout: give the op a ``cuda(self, be, *arrays)`` method."""
    from .op import TensorDesc
    outs = op.infer(*[TensorDesc(a.shape, a.dtype, "cuda") for a in arrays])
    shape, dtype = tuple(outs[0].shape), np.dtype(outs[0].dtype)
    ins = [be.broadcast_to(be.cast(a, dtype) if a.dtype.kind == "f" else a, shape) for a in arrays]
    ys = [be.empty(d.shape, d.dtype) for d in outs]
    size = int(math.prod(shape))
    be.launch_n(be.kernel(op, be.ctype(dtype)), size, *ins, *ys, size)
    return ys[0] if len(ys) == 1 else tuple(ys)


# where tensors made without a device go (set_default_device)
_default_device = "cpu"


def set_default_device(device: str = "xpux") -> None:
    """Make ``device`` where tensors go when none is named, MegEngine's
    ``set_default_device`` (its default "xpux": the GPU where there is one).

    Example::

        >>> gc.set_default_device("cpu0"); gc.get_default_device()
        'cpu'
    """
    global _default_device
    _default_device = norm_device(device)


def get_default_device() -> str:
    """Where tensors made without a device go ("cpu" unless changed).

    Example::

        >>> gc.get_default_device()
        'cpu'
    """
    return _default_device


def get_device_count(device_type: str = "xpu") -> int:
    """How many devices of ``device_type`` there are: "gpu"/"cuda" (0
    without one; "xpu" counts the GPUs too), "cpu" (its cores), MegEngine's
    ``get_device_count``.

    Example::

        >>> gc.get_device_count("cpu") >= 1
        True
    """
    kind = str(device_type).lower()
    if kind.startswith("cpu"):
        import os
        return os.cpu_count() or 1
    if kind not in ("xpu", "gpu", "cuda"):
        raise ValueError(f"get_device_count: unknown device type {device_type!r} (cpu, gpu, cuda or xpu)")
    if not is_cuda_available():
        return 0
    from .cuda import runtime as _b
    return int(getattr(_b.backend(), "device_count", lambda: 1)())


class LogicalDevice(str):
    """A MegEngine logical device ("cpu1", "cpu0:1", "xpu0:2": a device
    number and a stream) on the physical device gradcore computes on.

    It equals its physical name ("cpu", so kernels dispatch as on that
    device) and its logical spellings; two of them compare by logical name
    (cpu1 != cpu2, though both == "cpu": equality is not transitive across
    the two kinds). Tensors on two different logical devices are refused by
    one op, as MegEngine refuses them (``same_device`` tells them apart).
    ``str`` gives MegEngine's form.

    Example::

        >>> d = norm_device("cpu1"); str(d), d == "cpu", d == "cpu1"
        ('cpu1:0', True, True)
    """
    name: str         # MegEngine's form: "cpu1:0"
    logical: str      # what tells it from other devices: the physical name for cpu0:0 itself

    def __new__(cls, physical: str, logical: str) -> "LogicalDevice":
        self = super().__new__(cls, physical)
        self.name = logical
        # "cpu0:0", named, is the default cpu: one device with "cpu"
        self.logical = physical if logical in ("cpu0:0", "gpu0:0") else logical
        return self

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__

    def __eq__(self, other) -> bool:
        if isinstance(other, LogicalDevice):
            return self.logical == other.logical
        if isinstance(other, str):
            return (str.__eq__(self, other) or other == self.name
                    or (self.name.endswith(":0") and other == self.name[:-2]))
        return NotImplemented

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    # hashes as its physical name: a kernel table keyed by "cpu" finds it
    __hash__ = str.__hash__

    def __reduce__(self):
        return LogicalDevice, (str.__str__(self), self.name)


_NAMED = {"cpu": LogicalDevice("cpu", "cpu0:0"), "cuda": LogicalDevice("cuda", "gpu0:0")}


def logical_name(device) -> str:
    """The name that tells logical devices apart: MegEngine's form for a
    ``LogicalDevice``, the physical name ("cpu", "cuda") for the default one
    (also when it was named "cpu0").

    Example::

        >>> logical_name(norm_device("cpu0:1")), logical_name("cpu")
        ('cpu0:1', 'cpu')
    """
    return device.logical if isinstance(device, LogicalDevice) else str(device)


def same_device(a, b) -> bool:
    """Whether ``a`` and ``b`` (normalised names) are one logical device.

    Example::

        >>> same_device(norm_device("cpu1"), norm_device("cpu0"))
        False
    """
    return logical_name(a) == logical_name(b)


def named_device(device: str):
    """``device`` ("cpu", "cuda") under MegEngine's name for it: the
    ``LogicalDevice`` "cpu0:0" or "gpu0:0", equal to ``device`` itself
    (``Tensor.device`` reports this).

    Example::

        >>> d = named_device("cpu"); str(d), d == "cpu"
        ('cpu0:0', True)
    """
    named = _NAMED.get(device)
    return device if named is None else named


# MegEngine's locator: a type, a device number ("x": any), an optional stream
_LOCATOR = re.compile(r"^(cpu|xpu|gpu|cuda)(\d+|x)?(?::(\d+))?$")


def norm_device(device) -> str:
    """The device gradcore computes on ("cpu" or "cuda") for any spelling
    MegEngine accepts ("cpu0", "gpu0", "xpux", ...); None is the default
    device (``set_default_device``). MegEngine's logical CPU devices and
    streams ("cpu1", "cpu0:1"; "xpu1", "xpu0:1" where there is no
    GPU) give a ``LogicalDevice`` on the cpu, reported in MegEngine's form;
    "cpu0" and "cpu0:0" are the default cpu itself ("cpu").

    Example::

        >>> norm_device("cpu0"), str(norm_device("cpu2")), str(norm_device("cpu0:1"))
        ('cpu', 'cpu2:0', 'cpu0:1')
    """
    if device is None:
        return _default_device
    if isinstance(device, LogicalDevice):
        # cpu0:0 and gpu0:0 (Tensor.device's names) are the physical devices themselves
        return device if device.logical != str.__str__(device) else str.__str__(device)
    d = str(device).lower()
    m = _LOCATOR.match(d)
    if m is None:
        raise ValueError(f"unknown device {device!r}; gradcore knows 'cpu' and 'cuda' "
                         f"(and MegEngine's 'cpuN', 'xpuN', 'gpu0', with ':stream')")
    kind, number, stream = m.group(1), m.group(2) or "x", int(m.group(3) or 0)
    if kind in ("gpu", "cuda"):
        if number not in ("x", "0") or stream:
            raise ValueError(f"unknown device {device!r}: gradcore has one GPU device, 'cuda' (gpu0)")
        require_cuda()
        return "cuda"
    # "xpu": MegEngine's "any device", the GPU where there is one, else the CPU
    physical = "cuda" if kind == "xpu" and is_cuda_available() else "cpu"
    if number in ("x", "0") and stream == 0:
        return physical
    if physical == "cuda":
        raise ValueError(f"unknown device {device!r}: gradcore has one GPU device and stream (xpu0)")
    return LogicalDevice(physical, f"{kind}{number}:{stream}")


def to_device(arr, device, constant: bool = False):
    """``arr`` (host data) on ``device``. ``constant``: a value kept for the
    process (uploaded even inside a CUDA-graph capture, see Backend.to_device)."""
    if device == "cpu":
        return arr
    return require_cuda().to_device(arr, constant=constant)


def filled(shape: tuple, value, dtype, device: str):
    """Data of ``shape`` and ``dtype`` with every element ``value``, made
    where it lives: NumPy on the cpu, a memset or a fill kernel on cuda (no
    host array, no copy: zeros in a training step cost no host round-trip).

    Example::

        >>> filled((2,), 0, np.float32, "cpu")
        array([0., 0.], dtype=float32)
    """
    if device == "cpu":
        return np.full(shape, value, dtype)
    be = require_cuda()
    if value == 0:
        return be.zeros(tuple(shape), np.dtype(dtype))
    out = be.empty(tuple(shape), np.dtype(dtype))
    be.fill(out, value)
    return out


def to_host(data) -> np.ndarray:
    """Host (NumPy) data for a tensor's data on any device."""
    if isinstance(data, np.ndarray):
        return data
    if isinstance(data, np.generic):     # a 0-d result some NumPy kernel gave as a scalar
        return np.asarray(data)
    return data.get()


# the toolkit lookup lives in the device layer (the kernel cache uses it)
from .cuda.toolkit import is_nvcc_available, nvcc_path  # noqa: E402,F401
