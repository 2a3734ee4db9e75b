"""The CUDA backend below the ops: parameter packing, the memory pool,
device arrays, the device model (Tensor.to, device=, mixed devices,
gradients on the device), fused backward launches, compile errors, and what
``cuda`` says where it is unavailable."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.cuda import DeviceArray, pack_params, runtime
from gradcore.cuda.cache import KernelCompileError
from gradcore.cuda.memory import MemoryPool, size_class
from gradcore.op import Op


# ---------------------------------------------------------------- packing
class _Arr:
    """A stand-in pointer argument."""


def test_pack_params_follows_the_c_abi():
    # the same parameters as a C struct: ctypes lays it out by the C ABI,
    # which is how CUDA lays out kernel parameters
    class Ref(ctypes.Structure):
        _fields_ = [("p", ctypes.c_uint64), ("i", ctypes.c_int), ("d", runtime.Dims),
                    ("f", ctypes.c_float), ("n", ctypes.c_longlong), ("b", ctypes.c_bool), ("x", ctypes.c_double)]
    be = runtime.Backend.__new__(runtime.Backend)
    arr = DeviceArray(be, (2,), "float32")
    arr.ptr = 0x1234_5678_9ABC
    dims = runtime.Backend.dims((3, 4, 5))
    buf = pack_params([arr, np.int32(7), dims, np.float32(0.5), 11, np.bool_(True), np.float64(2.25)])
    ref = Ref(arr.ptr, 7, dims, 0.5, 11, True, 2.25)
    assert buf == bytes(ref)[:len(buf)]
    assert len(buf) == ctypes.sizeof(Ref) - (ctypes.sizeof(Ref) - len(buf))


def test_pack_params_rejects_ambiguous_arguments():
    with pytest.raises(TypeError, match="np.float32"):
        pack_params([1.5])
    with pytest.raises(TypeError, match="bool"):
        pack_params([True])
    be = runtime.Backend.__new__(runtime.Backend)
    with pytest.raises(ValueError, match="shape-only"):
        pack_params([DeviceArray(be, (3,), "float32")])
    with pytest.raises(ValueError, match="at most 8"):
        runtime.Backend.dims((1,) * 9)


# ---------------------------------------------------------------- memory pool
class _FakeDriver:
    def __init__(self, fail_first=False):
        self.live, self.next, self.fail = {}, 4096, fail_first
        self.allocs = self.frees = 0

    def alloc(self, n):
        if self.fail:
            self.fail = False
            raise MemoryError("out of memory")
        self.allocs += 1
        self.next += n + 4096
        self.live[self.next] = n
        return self.next

    def free(self, a):
        self.frees += 1
        del self.live[a]


def test_size_classes():
    assert size_class(1) == 512 and size_class(512) == 512 and size_class(513) == 1024
    big = 3 * (1 << 20) + 1
    assert big <= size_class(big) <= big * 1.125
    assert all(size_class(n) >= n for n in (0, 1, 1000, 1 << 20, (1 << 20) + 7, 10 ** 9))


def test_the_pool_reuses_freed_blocks():
    drv = _FakeDriver()
    pool = MemoryPool(drv)
    b = pool.malloc(1000)
    ptr = int(b)
    del b
    assert pool.stats()["cached_bytes"] == 1024 and pool.stats()["in_use_bytes"] == 0
    b2 = pool.malloc(900)               # same class: the same block, no driver call
    assert int(b2) == ptr and drv.allocs == 1 and pool.reuses == 1
    b3 = pool.malloc(5000)
    assert int(b3) != ptr and drv.allocs == 2
    del b2, b3
    assert pool.empty_cache() == 1024 + 5120
    assert drv.frees == 2 and not drv.live


def test_the_pool_frees_its_cache_when_the_driver_runs_out():
    drv = _FakeDriver()
    pool = MemoryPool(drv)
    del_me = pool.malloc(100)
    del del_me
    drv.fail = True
    b = pool.malloc(10_000)             # first try fails: cache freed, second succeeds
    assert int(b) in drv.live and drv.frees == 1


# ---------------------------------------------------------------- device arrays
def test_device_arrays(cuda):
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = cuda.to_device(host)
    assert a.shape == (3, 4) and a.dtype == np.float32 and a.size == 12 and a.nbytes == 48
    np.testing.assert_array_equal(a.get(), host)
    v = a.reshape(4, -1)
    assert v.shape == (4, 3) and v.ptr == a.ptr
    c = a.copy()
    assert c.ptr != a.ptr
    np.testing.assert_array_equal(c.get(), host)
    np.testing.assert_array_equal(a.astype(np.float64).get(), host.astype(np.float64))
    with pytest.raises(TypeError, match="implicitly"):
        np.asarray(a)
    e = cuda.empty((0, 5), np.float32)
    assert e.size == 0 and e.get().shape == (0, 5)
    z = cuda.zeros((4,), np.int32)
    np.testing.assert_array_equal(z.get(), np.zeros(4, np.int32))
    a.fill(3)
    assert (a.get() == 3).all()


def test_in_place_updates_write_into_the_array_without_a_copy(cuda):
    # what optimizers do (buf *= m; buf += g; p -= lr * g): one kernel into
    # the array itself, no temporary and no device-to-device copy
    rng = np.random.default_rng(0)
    a_host, b_host = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)
    a, b = cuda.to_device(a_host), cuda.to_device(b_host)
    cuda.scalar(0.5, np.float32)            # the constant is filled once per process, before
    ptr, launches, dtod = a.ptr, cuda.launcher.launches, cuda.copies["dtod"]
    a *= 0.5
    a += b
    a -= a                                  # the operand is the array itself: element for element, still safe
    a += b
    assert a.ptr == ptr and cuda.launcher.launches - launches == 4 and cuda.copies["dtod"] == dtod
    np.testing.assert_allclose(a.get(), b_host, rtol=1e-6)
    c = cuda.to_device(np.ones(5, np.float32))
    a += c                                  # broadcast operand
    a *= np.float64(2.0)                    # a NumPy scalar takes the array's dtype (weak)
    np.testing.assert_allclose(a.get(), (b_host + 1) * 2, rtol=1e-6)
    assert a.dtype == np.float32 and a.ptr == ptr


def test_in_place_updates_with_an_overlapping_view_read_the_old_values(cuda):
    # x[1:] += x[:-1] in NumPy reads the values before the update: a view
    # overlapping the target at another offset goes through a new array
    host = np.arange(6, dtype=np.float32)
    x = cuda.to_device(host)
    head = DeviceArray(cuda, (5,), np.float32, block=x._block, offset=0)
    tail = DeviceArray(cuda, (5,), np.float32, block=x._block, offset=4)
    tail += head
    expected = host.copy()
    expected[1:] += host[:-1].copy()
    np.testing.assert_array_equal(x.get(), expected)


def test_freed_device_memory_goes_back_to_the_pool(cuda):
    (gc.Tensor(np.ones(3, np.float32), device="cuda") * 2 + 1).sum()   # caches the scalar constants
    before = cuda.pool.stats()
    x = gc.Tensor(np.ones(1000, np.float32), device="cuda")
    for _ in range(5):
        y = (x * 2 + 1).sum()
        del y
    mid = cuda.pool.stats()
    del x
    after = cuda.pool.stats()
    assert after["in_use_bytes"] <= before["in_use_bytes"] <= mid["in_use_bytes"]
    # the loop's temporaries reuse blocks: later steps make no new driver allocation
    allocs = cuda.pool.stats()["driver_allocs"]
    x = gc.Tensor(np.ones(1000, np.float32), device="cuda")
    for _ in range(5):
        (x * 2 + 1).sum()
    assert cuda.pool.stats()["driver_allocs"] == allocs


# ---------------------------------------------------------------- device model
def test_tensors_move_between_devices_with_gradients(cuda):
    host = np.array([1.0, -2.0, 3.0], np.float32)
    x = gc.Tensor(host)
    gm = gc.GradManager().attach([x])
    with gm:
        xc = x.to("cuda")
        assert xc.device == "cuda" and x.device == "cpu"
        y = (xc * xc).to("cpu")
        assert y.device == "cpu"
        gm.backward(y.sum())
    assert x.grad.device == "cpu"
    np.testing.assert_allclose(x.grad.numpy(), 2 * host)


def test_device_on_creation_and_gradients_stay_on_the_device(cuda):
    w = gc.Parameter(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), device="cuda")
    x = gc.Tensor([0.5, -1.0], device="cuda")
    assert w.device == "cuda" and x.device == "cuda"
    gm = gc.GradManager().attach([w])
    with gm:
        gm.backward(F.sum(F.tanh(w * x)))
    assert w.grad.device == "cuda"
    expected = (1 - np.tanh(w.numpy() * x.numpy()) ** 2) * x.numpy()
    # 1 - tanh(-4)**2 cancels: CUDA's tanhf is within 2 ULP of tanh(-4) (~1.2e-7 absolute), which the
    # subtraction leaves as an absolute error
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-6, atol=2.5e-7)
    assert repr(x).startswith("Tensor([ 0.5, -1. ]") and "cuda" in repr(x)
    assert gc.Tensor(x).device == "cuda"          # a copy stays where it is
    assert x.to("cpu").numpy().tolist() == [0.5, -1.0]


def test_mixed_devices_are_refused_naming_the_op(cuda):
    a = gc.Tensor([1.0, 2.0], device="cuda")
    b = gc.Tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"Elemwise\(add\).*different devices.*cuda, cpu"):
        a + b


def test_scalar_operands_follow_the_tensor(cuda):
    a = gc.Tensor([1.0, 2.0], device="cuda")
    r = 2 * a + 1.5
    assert r.device == "cuda" and r.dtype == np.float32
    np.testing.assert_allclose(r.numpy(), [3.5, 5.5])


def test_an_elementwise_backward_is_one_fused_launch(cuda):
    if cuda.driver.kind != "emulator":
        pytest.skip("launches are counted by the emulator")
    x = gc.Tensor(np.linspace(-1, 1, 7), device="cuda")
    y = gc.Tensor(np.linspace(0.5, 2, 7), device="cuda")
    gm = gc.GradManager().attach([x, y])
    with gm:
        z = x * y              # backward: g*y and g*x, two graph nodes
        cuda.driver.launched.clear()
        gm.backward(z)
    # besides the fill of the ones seed (made on the device once per shape)
    launched = [k for k in cuda.driver.launched if not k.startswith("gc_fill_")]
    assert len(launched) == 1 and launched[0].startswith("gc_bwd_mul"), launched
    np.testing.assert_allclose(x.grad.numpy(), y.numpy())
    # a chain of N elementwise ops: N launches backward (one per op), not one per graph node
    x.grad = None
    gm = gc.GradManager().attach([x])
    with gm:
        z = F.sigmoid(F.sin(x) * 2.0 + 1.0)
        cuda.driver.launched.clear()
        gm.backward(z)
    # one fused kernel per op with a backward (add's is a pass-through), no per-node kernels;
    # at most a broadcast of the saved constant 2.0 besides
    fused = [k for k in cuda.driver.launched if k.startswith("gc_bwd_")]
    assert len(fused) == 3, list(cuda.driver.launched)
    assert all(k.startswith(("gc_bwd_", "gc_broadcast_", "gc_fill_")) for k in cuda.driver.launched), \
        list(cuda.driver.launched)
    s = 1 / (1 + np.exp(-(np.sin(x.numpy()) * 2 + 1)))
    np.testing.assert_allclose(x.grad.numpy(), s * (1 - s) * 2 * np.cos(x.numpy()), rtol=1e-10)


class _BrokenKernel(Op):
    name = "BrokenKernel"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x

    def cuda_source(self, ctype="float"):
        return (f'extern "C" __global__ void gc_broken_{ctype}({ctype}* x, long long n)\n{{\n'
                "    x[0] = undefined_name;\n}\n")

    def cuda(self, be, x):
        y = x.copy()
        be.launch_n(be.kernel(self, be.ctype(x.dtype)), y.size, y, y.size)
        return y


def test_compile_errors_name_the_kernel_and_the_source_line(cuda):
    x = gc.Tensor([1.0], device="cuda")
    with pytest.raises(RuntimeError) as info:
        gc.core.apply(_BrokenKernel(), x)
    text = str(info.value)
    assert "BrokenKernel" in text and "undefined_name" in text
    cause = info.value.__cause__
    assert isinstance(cause, KernelCompileError)
    assert any(line == 3 for line, _, _ in cause.errors), cause.errors


def test_emulator_checks_launches_and_copies(cuda):
    if cuda.driver.kind != "emulator":
        pytest.skip("emulator only")
    a = cuda.empty((4,), np.float32)
    with pytest.raises(RuntimeError, match="outside every allocation"):
        cuda.driver.htod(a.ptr, np.zeros(1000, np.float32))
    from gradcore.ops.shape import Cast
    k = cuda.kernel(Cast(np.float64), "float", source=Cast(np.float64).cuda_source("float", "double"))
    with pytest.raises(RuntimeError, match="invalid block"):
        cuda.launch(k, (1, 1, 1), (2048, 1, 1), a, a, 0)


def test_cuda_unavailable_says_why():
    code = ("import gradcore as gc\n"
            "try:\n    gc.Tensor([1.0], device='cuda')\nexcept RuntimeError as e:\n    print('ERR', e)\n")
    env = dict(os.environ, GRADCORE_CUDA="gpu")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    if "ERR" not in out.stdout:
        pytest.skip("a GPU is available here")
    assert "device 'cuda' is unavailable" in out.stdout
    assert "PyCUDA" in out.stdout or "GPU" in out.stdout or "driver" in out.stdout
    # and everything on the cpu still works in that process
    code2 = "import gradcore as gc\nprint((gc.Tensor([2.0]) * 3).item())\n"
    out2 = subprocess.run([sys.executable, "-c", code2], capture_output=True, text=True, env=env, timeout=120)
    assert out2.stdout.strip() == "6.0", out2.stderr


def test_cublas_not_found_is_a_clear_error(monkeypatch):
    from gradcore.cuda import blas
    monkeypatch.setattr(blas, "candidate_paths", lambda: [])
    with pytest.raises(blas.CublasError, match="cuBLAS was not found"):
        blas.load_library()
