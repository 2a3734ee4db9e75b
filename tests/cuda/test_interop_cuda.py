"""DLPack and __cuda_array_interface__ for cuda tensors.

On the host emulator (and on a GPU when there is one, through the ``cuda``
fixture): the capsule's struct layout, the deleter protocol, stream
arguments, zero-copy round trips, ``gradcore.load(map_location="cuda")``.
PyTorch CUDA and CuPy interop need a real GPU with those libraries and
skip, saying so, everywhere else."""
import ctypes
import gc as pygc
import io

import numpy as np
import pytest

import gradcore as gc
from gradcore.cuda import dlpack



from gpu_probe import gpu_unavailable_reason  # noqa: E402



def _write(t, values):
    """Write host values into a cuda tensor's device memory directly (as
    another library would)."""
    t._data.backend.driver.htod(t._data.ptr, np.asarray(values, t.dtype))


def test_cuda_array_interface(cuda):
    t = gc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device="cuda")
    cai = t.__cuda_array_interface__
    assert cai["shape"] == (2, 3) and cai["typestr"] == "<f4" and cai["version"] == 3
    assert cai["data"] == (t._data.ptr, False) and cai["strides"] is None and cai["stream"] == 1


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_capsule_layout(cuda, max_version):
    t = gc.tensor(np.arange(6, dtype=np.float64).reshape(3, 2), device="cuda")
    assert t.__dlpack_device__() == (dlpack.kDLCUDA, 0)
    before = dlpack.live_exports()
    cap = t.__dlpack__(stream=1, max_version=max_version)
    name = dlpack.VERSIONED_NAME if max_version else dlpack.LEGACY_NAME
    assert dlpack._api.PyCapsule_IsValid(ctypes.c_void_p(id(cap)), name)
    ptr, managed, _ = dlpack._managed(cap)
    if max_version:
        assert (managed.version.major, managed.version.minor) == (1, 0) and managed.flags == 0
        # the struct as dlpack.h lays it out: version, manager_ctx, deleter, flags, then the DLTensor
        assert ctypes.addressof(managed.dl_tensor) - ptr == 32
    else:
        assert ctypes.addressof(managed.dl_tensor) == ptr
    d = managed.dl_tensor
    assert d.data == t._data.ptr and d.byte_offset == 0 and not d.strides
    assert (d.device.device_type, d.device.device_id) == (2, 0)
    assert d.ndim == 2 and [d.shape[i] for i in range(2)] == [3, 2]
    assert (d.dtype.code, d.dtype.bits, d.dtype.lanes) == (dlpack.kDLFloat, 64, 1)
    assert dlpack.live_exports() == before + 1
    del cap                                  # never consumed: its destructor runs the deleter
    pygc.collect()
    assert dlpack.live_exports() == before


def test_round_trip_shares_memory_and_runs_the_deleter_once(cuda):
    t = gc.tensor(np.zeros(4, np.float32), device="cuda")
    before = dlpack.live_exports()
    u = gc.from_dlpack(t)                     # through a versioned capsule
    assert u.device == "cuda" and u._data.ptr == t._data.ptr and u.shape == (4,)
    _write(t, [1, 2, 3, 4])
    np.testing.assert_array_equal(u.numpy(), [1, 2, 3, 4])
    _write(u, [5, 6, 7, 8])
    np.testing.assert_array_equal(t.numpy(), [5, 6, 7, 8])
    assert dlpack.live_exports() == before + 1
    v = u.reshape(2, 2)                       # a view keeps the import alive
    del u
    pygc.collect()
    assert dlpack.live_exports() == before + 1
    np.testing.assert_array_equal(v.numpy(), [[5, 6], [7, 8]])
    del v
    pygc.collect()
    assert dlpack.live_exports() == before
    # a bare capsule (legacy) works too, and a used capsule cannot be read twice
    cap = t.__dlpack__()
    w = gc.from_dlpack(cap)
    assert w._data.ptr == t._data.ptr
    with pytest.raises(BufferError, match="not an unconsumed DLPack capsule"):
        gc.from_dlpack(cap)


def test_exported_memory_outlives_the_tensor(cuda):
    t = gc.tensor(np.full(3, 2.0, np.float32), device="cuda")
    cap = t.__dlpack__()
    del t
    pygc.collect()
    u = gc.from_dlpack(cap)
    np.testing.assert_array_equal(u.numpy(), [2, 2, 2])


def test_streams_copy_and_host_export(cuda):
    t = gc.tensor(np.arange(3, dtype=np.float32), device="cuda")
    with pytest.raises(ValueError, match="stream 0 is ambiguous"):
        t.__dlpack__(stream=0)
    for stream in (None, -1, 1, 2, 12345):    # 12345: a foreign stream handle, synchronised for
        gc.from_dlpack(t.__dlpack__(stream=stream))
    copied = gc.from_dlpack(t.__dlpack__(copy=True, max_version=(1, 0)))
    assert copied._data.ptr != t._data.ptr
    np.testing.assert_array_equal(copied.numpy(), [0, 1, 2])
    host = np.from_dlpack(t, device="cpu")    # NumPy asks for dl_device=(kDLCPU, 0): a host copy
    np.testing.assert_array_equal(host, [0, 1, 2])
    with pytest.raises(BufferError, match="copy=False"):
        t.__dlpack__(dl_device=(1, 0), copy=False)


class _CaiProducer:
    """What CuPy or Numba look like to gradcore: only __cuda_array_interface__."""

    def __init__(self, keep, shape, typestr, ptr, strides=None, stream=None):
        self.keep = keep
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3, "stream": stream}


def test_from_cuda_array_interface(cuda):
    src = gc.tensor(np.zeros((2, 3), np.float32), device="cuda")
    prod = _CaiProducer(src, (2, 3), "<f4", src._data.ptr, stream=2)
    t = gc.from_dlpack(prod)
    _write(src, np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))
    assert t._data._block._owner is prod       # the producer stays alive with the tensor
    contiguous_strides = _CaiProducer(src, (2, 3), "<f4", src._data.ptr, strides=(12, 4))
    gc.from_dlpack(contiguous_strides)
    with pytest.raises(BufferError, match="C-contiguous"):
        gc.from_dlpack(_CaiProducer(src, (3, 2), "<f4", src._data.ptr, strides=(4, 12)))


def test_load_onto_cuda(cuda):
    buf = io.BytesIO()
    gc.save({"w": gc.tensor([1.0, 2.0]), "c": gc.tensor([3.0], device="cuda")}, buf)
    buf.seek(0)
    out = gc.load(buf, map_location="cuda")
    assert out["w"].device == out["c"].device == "cuda"
    np.testing.assert_array_equal(out["w"].numpy(), [1.0, 2.0])
    buf.seek(0)
    out = gc.load(buf, map_location={"cuda": "cpu"})
    assert out["w"].device == out["c"].device == "cpu" and isinstance(out["c"]._data, np.ndarray)
    buf.seek(0)
    assert gc.load(buf)["c"].device == "cuda"


# ---------------------------------------------------------------- GPU only
@pytest.fixture
def real_gpu():
    reason = gpu_unavailable_reason()
    if reason:
        pytest.skip(f"PyTorch/CuPy CUDA interop needs a GPU: {reason}")
    from gradcore.cuda import runtime
    yield runtime.use("gpu")
    runtime.use(None)


def test_torch_cuda_shares_memory_both_ways(real_gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch here is built without CUDA")
    x = torch.zeros(3, device="cuda")
    t = gc.from_dlpack(x)
    x[1] = 5
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.numpy(), [0, 5, 0])
    y = torch.from_dlpack(t)
    assert y.data_ptr() == t._data.ptr
    y[2] = 7
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.numpy(), [0, 5, 7])
    z = torch.as_tensor(t, device="cuda")          # through __cuda_array_interface__
    assert z.data_ptr() == t._data.ptr


def _cupy():
    """CuPy, or a skip saying why: its import is tried in a child process first, because a CuPy
    built against other library versions can crash the interpreter while importing (seen on a GPU
    machine: ml_dtypes segfaulting under a newer NumPy)."""
    import subprocess
    import sys
    import importlib.util
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("CuPy is not installed")
    probe = subprocess.run([sys.executable, "-c", "import cupy; cupy.zeros(1)"], capture_output=True, text=True,
                           timeout=300)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no message)"])[-1]
        pytest.skip(f"CuPy is installed but does not import here (exit {probe.returncode}: {last})")
    import cupy
    return cupy


def test_cupy_shares_memory_both_ways(real_gpu):
    cupy = _cupy()
    a = cupy.zeros(3, dtype=cupy.float32)
    t = gc.from_dlpack(a)
    a[0] = 4
    np.testing.assert_array_equal(t.numpy(), [4, 0, 0])
    b = cupy.from_dlpack(t)
    c = cupy.asarray(t)                            # __cuda_array_interface__
    assert b.data.ptr == c.data.ptr == t._data.ptr
