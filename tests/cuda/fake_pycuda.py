"""A stand-in for ``pycuda`` on machines without a GPU, so that gradcore's
``PyCudaDriver`` runs: its context handling, allocations, copies, PTX from
the real nvcc through gradcore's kernel cache, and raw launches.

Memory and execution are the host emulator's. What it checks that the
emulator alone cannot: every launch's parameter buffer against the
parameter list nvcc wrote into the PTX for that kernel (offsets follow the
alignment of each ``.param``, the total size must match), and the calls
follow PyCUDA's signatures (``_launch_kernel(grid, block, buffer, shared,
stream)`` with 3-tuples, bytes, an int and None), and CUDA's current
context is per thread, as on a GPU: a thread has it once PyCUDA pushed it
there (PyCUDA's own stack, per thread, which PyCUDA's allocations and
modules need) or ``cuCtxSetCurrent`` made it current (what launches and
copies need); elsewhere the calls fail as the real ones do.
"""
from __future__ import annotations

import ctypes
import re
import sys
import threading
import types

import numpy as np

from gradcore.cuda.cache import KernelCache
from gradcore.cuda.families import kernel_names
from gradcore.cuda.emulator import HostDriver

_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.([a-z])(\d+)\s+\w+(?:\[(\d+)\])?")


def ptx_params(ptx: str):
    """kernel name -> [(offset, size)] of its parameters, as nvcc laid them out."""
    kernels = {}
    for name, body in _ENTRY.findall(ptx):
        layout, offset = [], 0
        for align, _, bits, count in _PARAM.findall(body):
            size = int(bits) // 8 * (int(count) if count else 1)
            align = int(align) if align else int(bits) // 8
            offset = (offset + align - 1) // align * align
            layout.append((offset, size))
            offset += size
        kernels[name] = layout
    return kernels


class FakeCuda:
    """The parts of ``pycuda.driver`` gradcore uses."""

    def __init__(self, sources):
        self.host = HostDriver()
        self.sources = sources          # PTX text -> {kernel name -> the CUDA source that defines it}
        self.launches = []              # (kernel, grid, block, parameter bytes)
        self.modules = 0                # module_from_buffer calls
        self.functions = {}             # CUfunction handle -> _Function
        self.entry_points = _c_entry_points(self)
        # per thread (a thread's id may be the next thread's: the state is thread-local)
        self._thread = threading.local()    # .stack: PyCUDA's context stack; .set_current: cuCtxSetCurrent called
        self.stacks = {}                # thread id -> the PyCUDA stack of the last thread with that id (tests)
        self.set_current_threads = set()    # ids of the threads where cuCtxSetCurrent was called (tests)
        self.context_thread = None      # the thread that made the context
        outer = self

        class Error(Exception):
            pass

        class MemoryError_(Error):
            pass

        class Context:
            handle = 0xC0

            def push(self):
                outer.context_stack.append(self)

            @staticmethod
            def pop():
                if not outer.context_stack:
                    raise Error("context::pop failed: invalid device context - cannot pop non-current context")
                outer.context_stack.pop()

            @staticmethod
            def synchronize():
                outer._cuda_current("cuCtxSynchronize")

        class Device:
            def __init__(self, index):
                assert index == 0
                self.index = index

            @staticmethod
            def count():
                return 1

            def name(self):
                return "Fake GPU (host emulator)"

            def compute_capability(self):
                return (7, 5)

            def total_memory(self):
                return 1 << 30

            def retain_primary_context(self):
                outer.context_thread = threading.get_ident()    # PyCUDA frees its objects there only
                return Context()

        self.Error, self.MemoryError, self.Context, self.Device = Error, MemoryError_, Context, Device

    # -- pycuda.driver functions
    def init(self):
        pass

    @property
    def context_stack(self):
        """The calling thread's PyCUDA context stack."""
        stack = getattr(self._thread, "stack", None)
        if stack is None:
            stack = self._thread.stack = self.stacks[threading.get_ident()] = []
        return stack

    def _current(self, what="explicit_context_dependent"):
        """PyCUDA's objects keeping a context (allocations, modules) need it on the thread's PyCUDA stack."""
        if not self.context_stack:
            raise self.Error(f"{what} failed: invalid device context - no currently active context?")

    def cuda_is_current(self) -> bool:
        """Whether CUDA has a current context in the calling thread."""
        return bool(self.context_stack) or getattr(self._thread, "set_current", False)

    def _cuda_current(self, what):
        if not self.cuda_is_current():
            raise self.Error(f"{what} failed: invalid device context")

    def set_current(self, handle):
        """libcuda's ``cuCtxSetCurrent``: a CUresult."""
        if handle != self.Context.handle:
            return 201          # CUDA_ERROR_INVALID_CONTEXT
        self._thread.set_current = True
        self.set_current_threads.add(threading.get_ident())
        return 0

    def mem_get_info(self):
        """(free, total), PyCUDA's order: the host driver's emulated memory."""
        self._cuda_current("cuMemGetInfo")
        total, free = self.host.memory_info()
        return free, total

    @staticmethod
    def get_driver_version():
        return 13000

    def mem_alloc(self, nbytes):
        self._current()
        return _DeviceAllocation(self, self.host.alloc(nbytes))

    def memcpy_htod(self, dest, src):
        self._cuda_current("cuMemcpyHtoD")
        assert isinstance(dest, int) and isinstance(src, np.ndarray) and src.flags.c_contiguous
        self.host.htod(dest, src)

    def memcpy_dtoh(self, dest, src):
        self._cuda_current("cuMemcpyDtoH")
        assert isinstance(dest, np.ndarray) and dest.flags.c_contiguous and isinstance(src, int)
        self.host.dtoh(dest, src)

    def memcpy_dtod(self, dest, src, size):
        self._cuda_current("cuMemcpyDtoD")
        self.host.dtod(dest, src, size)

    def memset_d8(self, dest, data, size):
        self._cuda_current("cuMemsetD8")
        assert data == 0
        self.host.memset0(dest, size)

    def module_from_buffer(self, buffer):
        self._current()
        ptx = bytes(buffer).decode()
        self.modules += 1
        return _Module(self, ptx)


class _DeviceAllocation:
    """PyCUDA's DeviceAllocation: ``int()`` is the address, ``free()`` gives it back."""

    def __init__(self, fake, host_allocation):
        self.fake, self.host_allocation = fake, host_allocation

    def __int__(self):
        return int(self.host_allocation)

    def free(self):
        # PyCUDA activates the allocation's context for the free: on the thread's
        # PyCUDA stack, or in the context's own thread; elsewhere it warns and leaks
        fake = self.fake
        if not fake.context_stack and threading.get_ident() != fake.context_thread:
            raise fake.Error("device_allocation in out-of-thread context could not be cleaned up")
        fake.host.free(self.host_allocation)


class _Module:
    """A module of PTX (one kernel's, or a family part's: many kernels); each
    kernel runs on the emulator from the source that defines it."""

    def __init__(self, fake, ptx):
        self.fake, self.ptx, self.params = fake, ptx, ptx_params(ptx)

    def host_module(self, name):
        return self.fake.host.load("fake", self.fake.sources[self.ptx][name])

    def get_function(self, name):
        if name not in self.params:
            raise self.fake.Error(f"cuModuleGetFunction failed: named symbol not found ({name})")
        return _Function(self, name)


class _Function:
    def __init__(self, module, name):
        self.module, self.name = module, name
        self.host_fn = module.fake.host.function(module.host_module(name), name)
        # PyCUDA's Function.handle: the CUfunction, as an int
        fake = module.fake
        self.handle = 0x1000 + len(fake.functions)
        fake.functions[self.handle] = self

    def _launch_kernel(self, grid, block, buffer, shared, stream):
        fake = self.module.fake
        fake._cuda_current("cuLaunchKernel")
        assert isinstance(grid, tuple) and isinstance(block, tuple) and len(grid) <= 3 and len(block) <= 3
        assert isinstance(buffer, bytes) and isinstance(shared, int) and stream is None
        layout = self.module.params[self.name]
        end = layout[-1][0] + layout[-1][1] if layout else 0
        assert len(buffer) == end, (f"{self.name}: a parameter buffer of {len(buffer)} bytes; nvcc's "
                                    f"parameter list {layout} takes {end}")
        fake.launches.append((self.name, grid, block, buffer))
        fake.host.launch(self.host_fn, grid, block, buffer, shared)


_CU_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
_GEMM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_int] * 5, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong,
                         ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_int)


def _c_entry_points(fake):
    """C function pointers standing in for libcuda's ``cuLaunchKernel`` and
    cuBLAS's S/DgemmStridedBatched, with their C signatures: the compiled
    launch path calls them exactly as it calls the real ones."""
    def cu_launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        try:
            if not fake.cuda_is_current():
                return 201              # CUDA_ERROR_INVALID_CONTEXT: no context in this thread
            fn = fake.functions[f]
            # extra = {BUFFER_POINTER(1), buf, BUFFER_SIZE(2), &size, END(0)}
            assert params is None, "parameters travel in extra"
            assert (extra[0], extra[2], extra[4]) == (1, 2, None), "a malformed extra array"
            size = ctypes.c_size_t.from_address(extra[3]).value
            args = ((gx, gy, gz), (bx, by, bz), ctypes.string_at(extra[1], size), shared, None)
            if stream is not None:      # only a capture stream: recorded into the graph (FakeGraphApi)
                fake.graphs.record(stream, fn._launch_kernel, args)
                return 0
            fn._launch_kernel(*args)
            return 0
        except Exception as exc:        # a callback cannot raise: report, and fail the launch
            fake.errors.append(exc)
            return 1

    def gemm(double):
        scalar = ctypes.c_double if double else ctypes.c_float

        def call(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch):
            try:
                assert h == _BLAS_HANDLE
                # alpha and beta are read at the call (host pointer mode), as cuBLAS does
                args = (bool(ta), bool(tb), m, n, k, scalar.from_address(alpha).value, a, lda, sa, b, ldb, sb,
                        scalar.from_address(beta).value, c, ldc, sc, batch, np.float64 if double else np.float32)
                if fake.blas_stream:
                    fake.graphs.record(fake.blas_stream, fake.host.gemm, args)
                else:
                    fake.host.gemm(*args)
                fake.gemms += 1
                return 0
            except Exception as exc:
                fake.errors.append(exc)
                return 13               # CUBLAS_STATUS_EXECUTION_FAILED
        return _GEMM(call)
    fake.errors, fake.gemms, fake.blas_stream = [], 0, 0
    return {"cuLaunchKernel": _CU_LAUNCH(cu_launch), "sgemm": gemm(False), "dgemm": gemm(True)}


_BLAS_HANDLE = 0xB1A5


class FakeGraphApi:
    """libcuda's stream capture and graph calls (``gradcore.cuda.driver.CudaGraphApi``)
    on the fake: work submitted on the capture stream is recorded, a graph
    launch runs it on the host emulator. Anything on another stream while
    capturing is an error, as a real capture would be invalidated."""

    STREAM = 0x57EA

    def __init__(self, fake):
        self.fake, self.capturing, self.graphs, self.launches = fake, None, {}, 0

    def record(self, stream, fn, args):
        assert self.capturing is not None and stream == self.STREAM, f"work on stream {stream:#x} outside a capture"
        self.capturing.append((fn, args))

    def stream_create(self):
        return self.STREAM

    def stream_destroy(self, stream):
        assert stream == self.STREAM

    def begin_capture(self, stream):
        assert stream == self.STREAM and self.capturing is None
        self.capturing = []

    def end_capture(self, stream):
        assert stream == self.STREAM
        graph = 0x6000 + len(self.graphs)
        self.graphs[graph], self.capturing = self.capturing, None
        return graph

    def instantiate(self, graph):
        return graph + 0x100

    def launch(self, graph_exec, stream=0):
        assert stream == 0
        self.launches += 1
        for fn, args in self.graphs[graph_exec - 0x100]:
            fn(*args)

    def destroy(self, graph_exec, graph):
        del self.graphs[graph]

    def memcpy_dtod_async(self, dst, src, nbytes, stream):
        self.fake.host._check(src, nbytes, "device copy from")
        self.record(stream, ctypes.memmove, (dst, src, nbytes))

    def memset_d8_async(self, ptr, value, nbytes, stream):
        self.fake.host._check(ptr, nbytes, "memset")
        self.record(stream, ctypes.memset, (ptr, value, nbytes))


def _address(fn):
    return ctypes.cast(fn, ctypes.c_void_p).value


def fake_modules(fake):
    """``pycuda``, ``pycuda.driver``, ``pycuda.tools`` modules backed by ``fake``."""
    pkg = types.ModuleType("pycuda")
    drv = types.ModuleType("pycuda.driver")
    for name in ("init", "mem_get_info", "get_driver_version", "mem_alloc", "memcpy_htod", "memcpy_dtoh", "memcpy_dtod", "memset_d8",
                 "module_from_buffer"):
        setattr(drv, name, getattr(fake, name))
    drv.Device, drv.Context, drv.Error, drv.MemoryError = fake.Device, fake.Context, fake.Error, fake.MemoryError
    tools = types.ModuleType("pycuda.tools")
    tools.clear_context_caches = lambda: None
    pkg.driver, pkg.tools = drv, tools
    return {"pycuda": pkg, "pycuda.driver": drv, "pycuda.tools": tools}


class _RecordingCache(KernelCache):
    """The kernel cache, remembering per program which source defines each
    kernel (the fake module runs that source on the emulator; two sources
    may name a kernel alike, in different programs)."""

    def __init__(self, sources, **kwargs):
        super().__init__(**kwargs)
        self.sources = sources

    def program(self, name, source, *args, **kwargs):
        prog = super().program(name, source, *args, **kwargs)
        for kernel in kernel_names(source):
            self.sources.setdefault(prog.image, {})[kernel] = source
        return prog


def make_backend():
    """A gradcore Backend on ``PyCudaDriver`` driving the fake (built with
    the fake modules in ``sys.modules``, which are then put back)."""
    from gradcore.cuda.driver import PyCudaDriver
    from gradcore.cuda.runtime import Backend
    sources = {}
    fake = FakeCuda(sources)
    saved = {k: sys.modules.get(k) for k in ("pycuda", "pycuda.driver", "pycuda.tools")}
    sys.modules.update(fake_modules(fake))
    try:
        driver = PyCudaDriver()
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    driver.cache = _RecordingCache(sources, arch=driver.arch)
    entry = fake.entry_points
    driver._cu_launch = _address(entry["cuLaunchKernel"])
    driver._blas = type("Blas", (), {"entry_points": staticmethod(
        lambda: (_BLAS_HANDLE, _address(entry["sgemm"]), _address(entry["dgemm"]))),
        "set_stream": staticmethod(lambda stream: setattr(fake, "blas_stream", stream))})()
    driver.graph_api = fake.graphs = FakeGraphApi(fake)
    driver._set_current = fake.set_current      # libcuda's cuCtxSetCurrent
    driver.fake = fake
    be = Backend(driver)
    # on a machine with a GPU the real cuDNN would load, and read the fake's host addresses
    from gradcore.cuda import cudnn
    cudnn.refuse(be, "the fake GPU: its device pointers are host memory")
    return be


def close(backend):
    """Pop the fake's context (what PyCudaDriver does at exit)."""
    driver = backend.driver
    if driver.context is not None:
        driver.context.pop()
        driver.context = None
