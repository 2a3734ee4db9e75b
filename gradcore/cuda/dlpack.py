"""DLPack capsules and ``__cuda_array_interface__`` for device arrays.

NumPy builds DLPack capsules for host memory; nothing here does for device
memory, so this module lays out DLPack's C structs with ctypes (the
layout of ``dlpack.h``, v1.0, both the legacy ``DLManagedTensor`` and the
versioned ``DLManagedTensorVersioned``), puts one in a ``PyCapsule`` and
reads them back from other libraries' capsules.

Ownership, as the protocol says: the producer's capsule holds a reference
to the array (through ``manager_ctx``) until its ``deleter`` runs. A
consumer renames the capsule ``used_dltensor[_versioned]`` and calls the
deleter when done; a capsule nobody consumed calls it from its destructor.

Streams: gradcore launches every kernel on the legacy default stream. A
consumer stream of None, 1 (legacy default) or 2 (per-thread default, which
synchronises with the legacy one) needs nothing; -1 asks for no
synchronisation; any other stream handle gets a device synchronisation
first (conservative: that stream may be non-blocking).

Example::

    >>> cap = device_array.__dlpack__(stream=1)          # doctest: +SKIP
    >>> torch.from_dlpack(device_array)                   # doctest: +SKIP
"""
from __future__ import annotations

import ctypes
import threading
from typing import Optional, Tuple

import numpy as np

# DLDeviceType
kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
# DLDataTypeCode
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex, kDLBool = 0, 1, 2, 4, 5, 6
DLPACK_MAJOR, DLPACK_MINOR = 1, 0
FLAG_READ_ONLY, FLAG_IS_COPIED = 1, 2


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


LEGACY_NAME, VERSIONED_NAME = b"dltensor", b"dltensor_versioned"
USED_LEGACY_NAME, USED_VERSIONED_NAME = b"used_dltensor", b"used_dltensor_versioned"

# a handle of our own on the Python C API: its argtypes below do not change ctypes.pythonapi's
_api = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.c_void_p]

_INT64_P = ctypes.POINTER(ctypes.c_int64)
_INT64_ARRAYS = {}       # length -> ctypes array type, made once (a type made per call can end in a cycle)


def _int64_array(n: int):
    t = _INT64_ARRAYS.get(n)
    if t is None:
        t = _INT64_ARRAYS[n] = ctypes.c_int64 * n
    return t


# what each exported capsule keeps alive until its deleter runs:
# address of the managed struct -> (struct, shape array, the device array)
_exported = {}
_exported_lock = threading.Lock()


@DELETER
def _deleter(managed_ptr):
    with _exported_lock:
        _exported.pop(managed_ptr, None)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule_ptr):
    # an unconsumed capsule still has its original name: free what it holds
    for name in (LEGACY_NAME, VERSIONED_NAME):
        if _api.PyCapsule_IsValid(capsule_ptr, name):
            _deleter(_api.PyCapsule_GetPointer(capsule_ptr, name))
            return


def live_exports() -> int:
    """How many exported capsules still hold their array (for tests)."""
    return len(_exported)


def dl_dtype(dtype: np.dtype) -> DLDataType:
    dtype = np.dtype(dtype)
    code = {"i": kDLInt, "u": kDLUInt, "f": kDLFloat, "c": kDLComplex, "b": kDLBool}.get(dtype.kind)
    if code is None:
        raise BufferError(f"DLPack: dtype {dtype} has no DLPack type code")
    return DLDataType(code, dtype.itemsize * 8, 1)


def np_dtype(dt: DLDataType) -> np.dtype:
    kinds = {kDLInt: "i", kDLUInt: "u", kDLFloat: "f", kDLComplex: "c", kDLBool: "b"}
    if dt.lanes != 1 or dt.code not in kinds:
        raise BufferError(f"DLPack: unsupported data type (code {dt.code}, {dt.bits} bits, {dt.lanes} lanes)")
    return np.dtype(f"{kinds[dt.code]}{dt.bits // 8}")


def device_index_of(backend) -> int:
    """The GPU ordinal a backend's arrays live on (0 for the emulator)."""
    return int(getattr(backend.driver, "device_index", 0))


def sync_for_consumer(array, stream) -> None:
    """Make ``array``'s data ready for use on the consumer's ``stream`` (see
    the module docstring)."""
    if stream is None or stream in (-1, 1, 2):
        return
    if stream == 0:
        raise ValueError("__dlpack__: stream 0 is ambiguous for CUDA; pass 1 for the legacy default "
                         "stream or 2 for the per-thread default stream")
    array.backend.driver.synchronize()


def export(array, stream=None, max_version: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None):
    """A DLPack capsule (kDLCUDA) viewing ``array``'s device memory (a copy
    when ``copy`` is True). Versioned when the consumer's ``max_version`` is
    1.x or later, the legacy struct otherwise."""
    sync_for_consumer(array, stream)
    copied = bool(copy)
    if copied:
        array = array.copy()
    versioned = max_version is not None and max_version[0] >= 1
    managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    shape = _int64_array(max(array.ndim, 1))(*array.shape)
    t = managed.dl_tensor
    t.data = array.ptr or None
    t.device = DLDevice(kDLCUDA, device_index_of(array.backend))
    t.ndim = array.ndim
    t.dtype = dl_dtype(array.dtype)
    # from the address: ctypes.cast(shape, ...) puts ``shape`` in its own _objects
    # dict, a reference cycle left per export (``_exported`` keeps ``shape`` alive)
    t.shape = ctypes.cast(ctypes.addressof(shape), _INT64_P)
    t.strides = None                   # NULL: C-contiguous
    t.byte_offset = 0
    managed.deleter = _deleter
    if versioned:
        managed.version = DLPackVersion(DLPACK_MAJOR, DLPACK_MINOR)
        managed.flags = FLAG_IS_COPIED if copied else 0
    address = ctypes.addressof(managed)
    with _exported_lock:
        _exported[address] = (managed, shape, array)
    return _api.PyCapsule_New(address, VERSIONED_NAME if versioned else LEGACY_NAME, _capsule_destructor)


class ForeignMemory:
    """Device memory another library owns, held by a DeviceArray in place of
    a pool block: keeps the producer's object (or DLPack deleter) alive
    until the last array viewing it goes."""

    __slots__ = ("ptr", "_owner", "_release")

    def __init__(self, ptr: int, owner=None, release=None):
        self.ptr, self._owner, self._release = int(ptr or 0), owner, release

    def __int__(self):
        return self.ptr

    def __del__(self):
        release, self._release = self._release, None
        if release is not None:
            release()


def _contiguous(shape, strides_in_items) -> bool:
    expected = 1
    for n, s in zip(reversed(shape), reversed(strides_in_items)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def _managed(capsule):
    """(address, struct, used name) of an unconsumed DLPack capsule."""
    cap = ctypes.c_void_p(id(capsule))
    if _api.PyCapsule_IsValid(cap, VERSIONED_NAME):
        ptr = _api.PyCapsule_GetPointer(cap, VERSIONED_NAME)
        managed = DLManagedTensorVersioned.from_address(ptr)
        if managed.version.major > DLPACK_MAJOR:
            raise BufferError(f"from_dlpack: DLPack {managed.version.major}.{managed.version.minor} "
                              f"is newer than this reader ({DLPACK_MAJOR}.{DLPACK_MINOR})")
        return ptr, managed, USED_VERSIONED_NAME
    if _api.PyCapsule_IsValid(cap, LEGACY_NAME):
        ptr = _api.PyCapsule_GetPointer(cap, LEGACY_NAME)
        return ptr, DLManagedTensor.from_address(ptr), USED_LEGACY_NAME
    raise BufferError(f"from_dlpack: not an unconsumed DLPack capsule (its name is {_api.PyCapsule_GetName(cap)!r})")


def capsule_device(capsule) -> Tuple[int, int]:
    """(device type, device id) of an unconsumed DLPack capsule."""
    device = _managed(capsule)[1].dl_tensor.device
    return (device.device_type, device.device_id)


def import_capsule(capsule, backend, array_type):
    """A DeviceArray viewing the device memory a kDLCUDA capsule describes;
    the capsule is marked used and its deleter runs when that array (and
    every view of it) is gone. ``array_type`` is gradcore.cuda.array.DeviceArray
    (passed in: array.py imports this module)."""
    ptr, managed, used = _managed(capsule)
    t = managed.dl_tensor
    if t.device.device_type not in (kDLCUDA, kDLCUDAManaged):
        raise BufferError(f"from_dlpack: expected CUDA memory, the capsule is on device type {t.device.device_type}")
    if t.device.device_id != device_index_of(backend):
        raise BufferError(f"from_dlpack: the capsule is on cuda:{t.device.device_id}, gradcore uses "
                          f"cuda:{device_index_of(backend)}")
    dtype = np_dtype(t.dtype)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides and not _contiguous(shape, [t.strides[i] for i in range(t.ndim)]):
        raise BufferError(f"from_dlpack: gradcore's cuda arrays are C-contiguous; the capsule's array of "
                          f"shape {shape} has strides {[t.strides[i] for i in range(t.ndim)]} "
                          f"(make it contiguous first)")
    deleter = managed.deleter
    _api.PyCapsule_SetName(ctypes.c_void_p(id(capsule)), used)
    release = (lambda: deleter(ptr)) if ctypes.cast(deleter, ctypes.c_void_p).value else None
    memory = ForeignMemory((t.data or 0) + t.byte_offset, owner=capsule, release=release)
    return array_type(backend, shape, dtype, block=memory)


def interface(array) -> dict:
    """``__cuda_array_interface__`` (version 3) of a DeviceArray."""
    return {"shape": array.shape, "typestr": array.dtype.str, "data": (array.ptr, False),
            "strides": None, "descr": [("", array.dtype.str)], "version": 3,
            "stream": 1}   # gradcore works on the legacy default stream


def from_interface(obj, backend, array_type):
    """A DeviceArray viewing the memory of an object with
    ``__cuda_array_interface__`` (CuPy, Numba, PyTorch), which it keeps alive;
    ``array_type`` as for import_capsule."""
    cai = obj.__cuda_array_interface__
    shape = tuple(int(n) for n in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    if cai.get("mask") is not None:
        raise BufferError("from_dlpack: masked __cuda_array_interface__ arrays are not supported")
    strides = cai.get("strides")
    if strides is not None and not _contiguous(shape, [s // dtype.itemsize if s % dtype.itemsize == 0 else -1
                                                       for s in strides]):
        raise BufferError(f"from_dlpack: gradcore's cuda arrays are C-contiguous; this array of shape {shape} "
                          f"has strides {tuple(strides)} bytes (make it contiguous first)")
    stream = cai.get("stream")
    if stream is not None and stream not in (1, 2):
        backend.driver.synchronize()   # the producer's work on its stream must be done
    ptr, _readonly = cai["data"]
    return array_type(backend, shape, dtype, block=ForeignMemory(ptr or 0, owner=obj))
