"""gradcore's PyCUDA driver (gradcore/cuda/driver.py) without a GPU: a fake
``pycuda`` (tests/cuda/fake_pycuda.py) takes PyCUDA's place, kernels are
compiled to PTX by the real nvcc through gradcore's kernel cache, and every
launch's parameter buffer is checked against the parameter list nvcc wrote
for that kernel before the host emulator runs it. So the code that drives a
real GPU runs here end to end: the primary context, allocations through the
pool, copies, PTX loading, raw launches with the packed parameters."""
import shutil
import sys
import threading

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.cuda import runtime
from gradcore.devices import nvcc_path

import fake_pycuda

pytestmark = pytest.mark.skipif(nvcc_path() is None or not (shutil.which("g++") or shutil.which("c++")),
                                reason="needs nvcc (PTX) and g++ (the emulator runs the kernels)")


@pytest.fixture
def fake_gpu():
    be = fake_pycuda.make_backend()
    assert type(be.driver).__name__ == "PyCudaDriver" and be.driver.arch == "sm_75"
    runtime.use(be)
    yield be.driver.fake
    fake_pycuda.close(be)
    runtime.use(None)


def test_the_primary_context_is_pushed_and_popped_at_exit(fake_gpu, monkeypatch):
    assert len(fake_gpu.context_stack) == 1
    for name, mod in fake_pycuda.fake_modules(fake_gpu).items():
        monkeypatch.setitem(sys.modules, name, mod)
    runtime.backend().driver._finish_up()
    assert fake_gpu.context_stack == []


def _in_a_thread(fn):
    """``fn()`` in a new thread: (its result, the exception it raised, the thread's id)."""
    box = {}

    def run():
        try:
            box["result"] = fn()
        except Exception as exc:        # re-raised in the test, with the thread's message
            box["error"] = exc
    t = threading.Thread(target=run)
    t.start()
    t.join()
    return box.get("result"), box.get("error"), t.ident


def test_cuda_work_in_another_thread(fake_gpu):
    # CUDA's current context is per thread: PyCUDA pushed it in the thread that
    # made the driver only. In another thread a launch failed with
    # CUDA_ERROR_INVALID_CONTEXT and an allocation with PyCUDA's "no currently
    # active context?" (the fake, like a GPU, keeps contexts per thread)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((6, 3)).astype(np.float32)
    x = gc.Tensor(a, device="cuda")
    be = runtime.backend()

    def work():
        w = gc.Tensor(b, device="cuda")                     # an allocation and a copy
        with gc.GradManager().attach([w]) as gm:            # kernels, a GEMM, a backward
            y = F.matmul(F.tanh(x * 2.0), w)
            gm.backward(F.sum(y * y))
        be.pool.empty_cache()                               # allocations given back from this thread
        return y.numpy(), w.grad.numpy()
    result, error, ident = _in_a_thread(work)
    assert error is None, f"cuda in a second thread: {error!r}"
    y, gw = result
    t = np.tanh(a.astype(np.float64) * 2)
    np.testing.assert_allclose(y, t @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, t.T @ (2 * (t @ b)), rtol=1e-4, atol=1e-4)
    # nothing left on that thread's PyCUDA stack (PyCUDA aborts the process when a thread ends with a
    # context there), and the main thread still has its context
    assert fake_gpu.stacks[ident] == [] and ident in fake_gpu.set_current_threads
    assert len(fake_gpu.context_stack) == 1
    np.testing.assert_allclose((x + 1).numpy(), a + 1)


def test_a_launch_as_the_first_cuda_call_of_a_thread(fake_gpu):
    # the compiled launch path binds the context itself: here the output's block
    # comes from the pool, the kernel and the constant are loaded, so the
    # thread's first call into CUDA is cuLaunchKernel
    x = gc.Tensor(np.arange(6, dtype=np.float32), device="cuda")
    (x * 3.0).numpy()
    launches = len(fake_gpu.launches)
    y, error, ident = _in_a_thread(lambda: x * 3.0)
    assert error is None, f"a launch in a second thread: {error!r}"
    assert len(fake_gpu.launches) == launches + 1 and ident in fake_gpu.set_current_threads
    np.testing.assert_array_equal(y.numpy(), np.arange(6) * 3.0)
    # a thread after it, whose id may well be the ended thread's, binds the context too
    for _ in range(3):
        y, error, _ = _in_a_thread(lambda: x * 3.0)
        assert error is None, f"a launch in a later thread: {error!r}"


def test_a_driver_made_in_a_thread_leaves_nothing_on_its_stack():
    # the first cuda use may be in a thread (a loader's, a pool's): the driver pushed the context on that
    # thread's PyCUDA stack, where PyCUDA aborts the process when the thread ends, and no other thread had it
    be, error, ident = _in_a_thread(fake_pycuda.make_backend)
    assert error is None, repr(error)
    fake = be.driver.fake
    runtime.use(be)
    try:
        assert fake.stacks.get(ident, []) == []
        x = gc.Tensor(np.arange(4, dtype=np.float32), device="cuda")        # the main thread, bound now
        np.testing.assert_array_equal((x * 2.0).numpy(), np.arange(4) * 2.0)
        assert fake.context_stack == []             # bound with cuCtxSetCurrent, nothing pushed to pop at exit
    finally:
        runtime.use(None)


def test_a_module_the_driver_refuses_names_its_compiler_and_the_driver(fake_gpu, monkeypatch):
    # a CUBIN or PTX from an NVRTC newer than the driver (CUDA 13 wheels, a CUDA 12 driver) is refused
    # by the driver's loader with a message that does not say why; the error says what was loaded
    drv = runtime.backend().driver
    monkeypatch.setattr(drv.cache, "identity", lambda: "nvrtc 13.0 ptx")
    monkeypatch.setattr(drv.drv, "get_driver_version", lambda: 12040)

    def refuse(image):
        raise fake_gpu.Error("cuModuleLoadDataEx failed: the provided PTX was compiled with an unsupported "
                             "toolchain.")
    monkeypatch.setattr(drv.drv, "module_from_buffer", refuse)
    with pytest.raises(RuntimeError, match=r"gc_mul_float \(PTX for sm_75, compiled by nvrtc 13.0 ptx\) failed "
                                           r"on CUDA driver 12.4: .*unsupported toolchain.*NVRTC 13.0 is newer than "
                                           r"the driver \(12.x\)"):
        (gc.Tensor(np.ones(3, np.float32), device="cuda") * 2.0).numpy()
    monkeypatch.setattr(drv.drv, "get_driver_version", lambda: 13000)     # a driver as new: no such hint
    with pytest.raises(RuntimeError, match="unsupported toolchain") as info:
        (gc.Tensor(np.ones(3, np.float32), device="cuda") * 2.0).numpy()
    assert "newer than the driver" not in str(info.value)


def test_elementwise_reductions_and_second_order(fake_gpu, matches_cpu):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    matches_cpu(lambda x, y: F.tanh(x * y + x) * 2.0, [a, b])
    matches_cpu(lambda x: F.sum(F.exp(x), axis=1, keepdims=True) - F.max(x, axis=0), [a])
    names = {n for n, *_ in fake_gpu.launches}
    assert {"gc_mul_float", "gc_tanh_float"} <= names and any(n.startswith("gc_bwd_") for n in names)


def test_a_training_step_matches_the_cpu(fake_gpu):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    y = rng.integers(0, 3, 6).astype(np.int32)
    w0 = (rng.standard_normal((8, 3)) * 0.3).astype(np.float32)

    def train(device):
        w = gc.Parameter(w0, device=device)
        b = gc.Parameter(np.zeros(3, np.float32), device=device)
        gm = gc.GradManager().attach([w, b])
        opt = gc.optimizer.SGD([w, b], lr=0.5, momentum=0.9)
        losses = []
        for _ in range(3):
            with gm:
                loss = F.cross_entropy(F.relu(F.matmul(gc.tensor(x, device=device), w) + b),
                                       gc.tensor(y, device=device))
                gm.backward(loss)
            opt.step().clear_grad()
            losses.append(loss.item())
        return losses, w.numpy()
    cpu, gpu = train("cpu"), train("cuda")
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5)
    np.testing.assert_allclose(gpu[1], cpu[1], rtol=1e-5, atol=1e-6)


def test_kernels_with_many_scalar_parameters(fake_gpu, matches_cpu):
    # conv and pooling take a dozen int parameters, indexing gc_dims structs
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    matches_cpu(lambda t, k: F.max_pool2d(F.conv2d(t, k, stride=1, padding=1), 2), [x, w], second_order=False)
    matches_cpu(lambda t: F.sum(t[[0, 1, 1], :, 1:] * 2.0, axis=0) + F.transpose(t, (0, 2, 1))[1, :, 1:], [x[0]])
    assert len(fake_gpu.launches) > 10


def test_a_parameter_of_the_wrong_c_type_is_caught(fake_gpu):
    """An int32 passed where the kernel takes a long long would leave the
    buffer shorter than nvcc's parameter list: the packer refuses it,
    naming the parameter, before anything reaches the driver."""
    from gradcore.ops.shape import Cast
    be = runtime.backend()
    op = Cast(np.float64)
    k = be.kernel(op, "float", source=op.cuda_source("float", "double"))
    x, y = be.to_device(np.ones(3, np.float32)), be.empty((3,), np.float64)
    be.launch_n(k, 3, x, y, 3)                       # long long: right
    np.testing.assert_array_equal(y.get(), np.ones(3))
    launches = len(fake_gpu.errors)
    with pytest.raises(TypeError, match=r"gc_cast_float_to_double\(.*\): argument 2 \(long long total\) got a int32"):
        be.launch_n(k, 3, x, y, np.int32(3))
    assert len(fake_gpu.errors) == launches            # refused before the driver saw it


def test_launches_and_gemms_go_through_the_c_entry_points(fake_gpu):
    """Per call, nothing of PyCUDA's Python objects is used: every launch
    arrives at the fake cuLaunchKernel, every GEMM at the fake cuBLAS entry."""
    be = runtime.backend()
    assert be.driver.launch_entry() == fake_pycuda._address(fake_gpu.entry_points["cuLaunchKernel"])
    launches, gemms = len(fake_gpu.launches), fake_gpu.gemms
    a = gc.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device="cuda")
    b = gc.Tensor(np.ones((3, 2), np.float64), device="cuda")
    np.testing.assert_allclose((F.matmul(a, a.T) * 2.0).numpy(), (a.numpy() @ a.numpy().T) * 2)
    np.testing.assert_allclose(F.matmul(b.T, b).numpy(), np.full((2, 2), 3.0))
    assert fake_gpu.gemms == gemms + 2 and len(fake_gpu.launches) > launches and not fake_gpu.errors


def test_a_pycuda_without_function_handles_launches_through_python(fake_gpu, monkeypatch):
    """PyCUDA versions whose Function has no ``handle``: kernels are launched
    with PyCUDA's ``_launch_kernel`` (the same packed buffer), not lost."""
    be = runtime.backend()
    assert be.kernel(_Neg(), "float").launch_mode == "cuda"          # with handles: cuLaunchKernel
    monkeypatch.delattr(fake_pycuda._Function, "handle", raising=False)
    real = fake_pycuda._Function.__init__

    def without_handle(self, module, name):
        real(self, module, name)
        del self.handle
    monkeypatch.setattr(fake_pycuda._Function, "__init__", without_handle)
    fresh = runtime.Backend(be.driver)
    x = fresh.to_device(np.arange(4, dtype=np.float32))
    k = fresh.kernel(_Neg(), "float")
    assert k.name == "gc_neg_test_float" and k.launch_mode == "python"
    before = len(fake_gpu.launches)
    y = fresh.empty((4,), np.float32)
    fresh.launch_n(k, 4, x, y, 4)
    np.testing.assert_array_equal(y.get(), -np.arange(4, dtype=np.float32))
    assert len(fake_gpu.launches) == before + 1


class _Neg:
    def _name(self):
        return "neg_test"

    def cuda_source(self, ctype):
        return (f'extern "C" __global__ void gc_neg_test_{ctype}(const {ctype}* x, {ctype}* y, long long n) {{\n'
                "    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
                "         i += (long long)blockDim.x * gridDim.x) y[i] = -x[i];\n}\n")


def test_module_api_loads_kernels_through_libcuda_and_names_failures():
    """A PyCUDA whose Function hides its CUfunction (2026.1, seen on an H100) gets its modules
    loaded through libcuda by ModuleApi: checked here against a stand-in libcuda."""
    import ctypes
    from gradcore.cuda.driver import DriverFunction, ModuleApi

    calls = []

    class Fn:
        def __init__(self, name, result):
            self.name, self.result = name, result

        def __call__(self, *args):
            calls.append((self.name, args))
            if self.name == "cuModuleLoadData":
                args[0]._obj.value = 0x1111
            elif self.name == "cuModuleGetFunction":
                args[0]._obj.value = 0x2222
            elif self.name == "cuGetErrorName":
                args[1]._obj.value = b"CUDA_ERROR_NOT_FOUND"
            return self.result(args) if callable(self.result) else self.result

    class Lib:
        cuModuleLoadData = Fn("cuModuleLoadData", 0)
        cuModuleGetFunction = Fn("cuModuleGetFunction", lambda args: 500 if args[2] == b"missing" else 0)
        cuLaunchKernel = Fn("cuLaunchKernel", 0)
        cuGetErrorName = Fn("cuGetErrorName", 0)

    api = ModuleApi(Lib())
    module = api.load(b".version 8.0\n.target sm_90\n")
    assert module == 0x1111 and calls[0][1][1].endswith(b"\0")        # PTX handed over NUL-terminated
    assert DriverFunction(api.function(module, "gc_add_float"), "gc_add_float").handle == 0x2222
    with pytest.raises(RuntimeError, match=r"cuModuleGetFunction \(missing\) failed: CUDA_ERROR_NOT_FOUND"):
        api.function(module, "missing")
    api.launch(0x2222, (2, 1, 1), (128, 1, 1), b"\x01" * 12, 0, 0)
    name, args = calls[-1]
    assert name == "cuLaunchKernel" and args[:8] == (0x2222, 2, 1, 1, 128, 1, 1, 0)
    extra = ctypes.cast(args[10], ctypes.POINTER(ctypes.c_void_p))
    assert [extra[0], extra[2], extra[4]] == [1, 2, None]            # BUFFER_POINTER, BUFFER_SIZE, END
