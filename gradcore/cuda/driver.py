"""The CUDA driver layer: the few device operations the backend needs, in
one small interface with two implementations.

- ``PyCudaDriver``: a real GPU through PyCUDA. It uses the device's *primary
  context* (``retain_primary_context``; never ``pycuda.autoinit``, which
  creates a private context), so gradcore shares the GPU with PyTorch or
  CuPy in one process; kernels are CUBINs for the device (PTX where NVRTC
  does not know it) from gradcore's own kernel cache (``cache.KernelCache``,
  the standard kernels compiled per family), loaded with
  ``module_from_buffer`` once per program.
- ``gradcore.cuda.emulator.HostDriver``: the same interface on the host. It
  compiles the very same CUDA C sources as C++ and runs them one simulated
  thread at a time, so the whole backend (device arrays, memory pool, launch
  layouts, argument packing) is tested on machines without a GPU.

The interface (``alloc`` returns an allocation object whose ``int()`` is the
device address; ``free`` gives it back)::

    alloc(nbytes) -> allocation            free(allocation)
    htod(ptr, ndarray)   dtoh(ndarray, ptr)   dtod(dst, src, nbytes)   memset0(ptr, nbytes)
    load(name, source) -> module           function(module, kernel_name) -> function
    launch(function, grid, block, param_buffer, shared_bytes)
    synchronize()      gemm(...)  (cuBLAS, see ``blas``)

and the C-level entry points the compiled launch path (``_launch.pyx``) calls
without going through Python per launch::

    launch_entry() -> address of cuLaunchKernel (0: kernels launch themselves)
    kernel_handle(function) -> ("cuda", CUfunction) | ("host", address of a C launcher)
    blas_entry() -> (cuBLAS handle, Sgemm address, Dgemm address)   (optional; else gemm())

Launch parameters arrive as one packed buffer laid out as the CUDA ABI lays
out kernel parameters (each at an offset aligned to its own alignment), built
by ``gradcore.cuda.runtime.pack_params``.
"""
from __future__ import annotations

import ctypes
import threading


class CudaUnavailable(RuntimeError):
    """The ``cuda`` device cannot be used here; the message says why."""


class PyCudaDriver:
    """A GPU through PyCUDA (``pip install gradcore[cuda]``)."""

    kind = "gpu"

    def __init__(self, device_index: int = 0):
        try:
            import pycuda.driver as drv
        except Exception as exc:  # ImportError, or a libcuda that fails to load
            raise CudaUnavailable(f"PyCUDA is not importable ({type(exc).__name__}: {exc}); "
                                  "install gradcore[cuda] on a machine with an NVIDIA GPU") from None
        try:
            drv.init()
            count = drv.Device.count()
        except Exception as exc:
            raise CudaUnavailable(f"the CUDA driver failed to initialise ({exc})") from None
        if count == 0:
            raise CudaUnavailable("PyCUDA found no GPU")
        if not 0 <= device_index < count:
            raise CudaUnavailable(f"there is no GPU {device_index} (this machine has {count})")
        self.drv = drv
        self.device_index = device_index
        self.device = drv.Device(device_index)
        # the primary context: the one the runtime API (PyTorch, CuPy) uses too
        self.context = self.device.retain_primary_context()
        # CUDA's current context is per thread. The main thread keeps it pushed
        # on its PyCUDA stack (popped at exit: PyCUDA aborts when a thread ends
        # with a context there, as pycuda.autoprimaryctx does); any other
        # thread, the one making the driver included (it may end before the
        # process), is bound on its first call (bind_thread)
        self._bound = threading.local()
        self._set_current = None        # libcuda's cuCtxSetCurrent, found on the first other thread
        self._owner = None              # the thread whose PyCUDA stack holds the context
        if threading.current_thread() is threading.main_thread():
            self.context.push()
            self._owner = threading.get_ident()
            import atexit
            atexit.register(self._finish_up)
        major, minor = self.device.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.name = self.device.name()
        self.total_memory = self.device.total_memory()
        from .cache import KernelCache
        # CUBINs for this very GPU: no JIT when a module loads
        self.cache = KernelCache(arch=self.arch, output="cubin")
        self._modules = {}          # program key -> module: a family part is loaded once
        # PyCUDA's Function exposes no CUfunction in some versions (2026.1): then
        # modules are loaded through libcuda directly, so that every kernel has
        # the handle the compiled launch path and CUDA graphs need
        function_class = getattr(drv, "Function", None)
        self._module_api = ModuleApi() if function_class is not None and not hasattr(function_class, "handle") \
            else None
        self._blas = None
        self._cu_launch = None
        self.graph_api = None           # CudaGraphApi, bound on the first capture
        self._capture_stream = 0        # the stream a CUDA graph is being captured on (0: none)

    def __repr__(self):
        return f"PyCudaDriver({self.name}, {self.arch})"

    def properties(self) -> tuple:
        """(name, total memory in bytes, compute capability major, minor)."""
        major, minor = self.device.compute_capability()
        return self.name, int(self.total_memory), int(major), int(minor)

    def memory_info(self) -> tuple:
        """(total, free) bytes of the GPU's memory (``cuMemGetInfo``)."""
        self.bind_thread()
        free, total = self.drv.mem_get_info()
        return int(total), int(free)

    def driver_version(self) -> int:
        """``cuDriverGetVersion``: major * 1000 + minor * 10."""
        return int(self.drv.get_driver_version())

    def bind_thread(self) -> None:
        """Make the primary context current in the calling thread (once per
        thread; nothing in the main thread, which keeps it pushed). CUDA's current
        context is per thread: elsewhere a launch fails with
        CUDA_ERROR_INVALID_CONTEXT. ``cuCtxSetCurrent``, not PyCUDA's
        ``push``: PyCUDA aborts the process when a thread ends with a context
        on its PyCUDA stack. Example: ``threading.Thread(target=lambda:
        (x * 2).numpy())`` on cuda works as in the main thread."""
        if threading.get_ident() == self._owner or getattr(self._bound, "done", False):
            return
        if self._set_current is None:
            self._set_current = _bind_libcuda(None, (("cuCtxSetCurrent", [ctypes.c_void_p]),))[2]["cuCtxSetCurrent"]
        status = self._set_current(self.context.handle)
        if status:
            raise RuntimeError(f"cuda: cuCtxSetCurrent failed in thread {threading.current_thread().name!r} "
                               f"(CUresult {status})")
        self._bound.done = True

    def _in_thread(self, fn, *args):
        """``fn(*args)``, a PyCUDA call making an object that keeps its context
        (an allocation, a module; or freeing one): outside the main thread
        PyCUDA needs the context on that thread's PyCUDA stack, so it
        is pushed for the call and popped after (never left there: see
        ``bind_thread``)."""
        if threading.get_ident() == self._owner:
            return fn(*args)
        self.bind_thread()
        self.context.push()
        try:
            return fn(*args)
        finally:
            self.drv.Context.pop()

    def _finish_up(self):
        if self.context is None:
            return
        try:
            self.context.synchronize()
        finally:
            self.context.pop()
            self.context = None
            from pycuda.tools import clear_context_caches
            clear_context_caches()

    capture_allocating = False     # set by a CUDA graph's pool: the one allocator a capture permits

    @property
    def capture_stream(self) -> int:
        """The stream a CUDA graph is being captured on; 0 when none (libraries
        with streams of their own, cuDNN, follow it)."""
        return self._capture_stream

    # ---------------------------------------------------------------- memory
    def alloc(self, nbytes: int):
        return self._in_thread(self._alloc, nbytes)

    def _alloc(self, nbytes: int):
        if self._capture_stream and not self.capture_allocating:
            raise RuntimeError(f"cuda: a device allocation of {nbytes} bytes outside the CUDA graph's memory "
                               f"pool during capture (the graph would not own it)")
        try:
            return self.drv.mem_alloc(nbytes)
        except self.drv.MemoryError as exc:
            raise MemoryError(f"cuda: out of device memory allocating {nbytes} bytes ({exc})") from None

    def free(self, allocation) -> None:
        self._in_thread(allocation.free)

    def htod(self, ptr: int, host) -> None:
        self.bind_thread()
        self.drv.memcpy_htod(ptr, host)

    def dtoh(self, host, ptr: int) -> None:
        self.bind_thread()
        self.drv.memcpy_dtoh(host, ptr)

    def dtod(self, dst: int, src: int, nbytes: int) -> None:
        self.bind_thread()
        if self._capture_stream:
            self.graph_api.memcpy_dtod_async(dst, src, nbytes, self._capture_stream)
            return
        self.drv.memcpy_dtod(dst, src, nbytes)

    def memset0(self, ptr: int, nbytes: int) -> None:
        self.bind_thread()
        if self._capture_stream:
            self.graph_api.memset_d8_async(ptr, 0, nbytes, self._capture_stream)
            return
        self.drv.memset_d8(ptr, 0, nbytes)

    # ---------------------------------------------------------------- kernels
    def load(self, name: str, source: str):
        prog = self.cache.program(name, source)
        module = self._modules.get(prog.key)
        if module is None:
            image = prog.image.encode() if isinstance(prog.image, str) else prog.image
            try:
                module = self._in_thread(self._module_api.load if self._module_api is not None
                                         else self.drv.module_from_buffer, image)
            except Exception as exc:
                raise RuntimeError(self._load_failure(name, image, exc)) from exc
            self._modules[prog.key] = module
        return module

    def _load_failure(self, name: str, image: bytes, exc: Exception) -> str:
        """What a failed module load says: the image, its compiler, the driver, and the likely cause
        (an image from a compiler newer than the driver: the driver's message does not say so)."""
        kind = "a CUBIN" if image.startswith(b"\x7fELF") else "PTX"
        compiler = self.cache.identity()
        driver = self.driver_version()
        text = (f"cuda: loading the module of {name} ({kind} for {self.arch}, compiled by {compiler}) failed "
                f"on CUDA driver {driver // 1000}.{driver % 1000 // 10}: {exc}")
        parts = compiler.split()
        if parts[0] == "nvrtc" and parts[1].split(".")[0].isdigit() and int(parts[1].split(".")[0]) > driver // 1000:
            text += (f". NVRTC {parts[1]} is newer than the driver ({driver // 1000}.x), whose loader may refuse "
                     f"its output: an NVRTC of the driver's CUDA major (nvidia-cuda-nvrtc for CUDA "
                     f"{driver // 1000}), or GRADCORE_CUDA_COMPILER=nvcc with a matching toolkit")
        return text

    def function(self, module, kernel_name: str):
        self.bind_thread()
        if self._module_api is not None:
            return DriverFunction(self._module_api.function(module, kernel_name), kernel_name)
        return module.get_function(kernel_name)

    # the C-level interface of the compiled launch path (gradcore/cuda/_launch.pyx)
    def launch_entry(self) -> int:
        """The address of libcuda's ``cuLaunchKernel`` (found once: PyCUDA
        has loaded libcuda, so dlopen returns that same library)."""
        if self._cu_launch is None:
            self._cu_launch = ctypes.cast(_libcuda().cuLaunchKernel, ctypes.c_void_p).value
        return self._cu_launch

    def kernel_handle(self, function):
        """("cuda", the CUfunction of a PyCUDA ``Function``): launched by
        ``cuLaunchKernel`` with the packed parameter buffer. A PyCUDA whose
        ``Function`` does not expose its handle gets ("python", 0): launched
        through ``launch`` below (PyCUDA's ``_launch_kernel``), slower."""
        handle = getattr(function, "handle", None)
        return ("cuda", int(handle)) if handle else ("python", 0)

    def _cublas(self):
        if self._blas is None:
            from .blas import Cublas
            self._blas = Cublas()
            if self._capture_stream:        # first used inside a capture: its GEMMs go to the capture stream
                self._blas.set_stream(self._capture_stream)
        return self._blas

    def blas_entry(self):
        """(cuBLAS handle, address of SgemmStridedBatched, of DgemmStridedBatched)."""
        return self._cublas().entry_points()

    def blas_tf32(self, allowed: bool) -> None:
        """Float32 GEMMs on TF32 tensor cores, or not (``gradcore.cuda.allow_tf32_matmul``)."""
        self._cublas().set_tf32(allowed)

    def launch(self, function, grid, block, params: bytes, shared: int = 0) -> None:
        self.bind_thread()
        if isinstance(function, DriverFunction):
            self._module_api.launch(function.handle, grid, block, params, shared, self._capture_stream)
            return
        if self._capture_stream:
            raise RuntimeError("a kernel launched through PyCUDA's Python path (this PyCUDA's Function has no "
                               "handle) cannot be captured in a CUDA graph")
        # PyCUDA's own call paths pack arguments with struct-style formats
        # that do not align a by-value struct; the raw launch takes our
        # buffer, laid out by the CUDA ABI (backend.pack_params)
        function._launch_kernel(tuple(grid), tuple(block), params, int(shared), None)

    def synchronize(self) -> None:
        if self._capture_stream:
            raise RuntimeError("a device synchronisation while a CUDA graph is being captured")
        self.bind_thread()
        self.drv.Context.synchronize()

    # ---------------------------------------------------------------- CUDA graphs (gradcore/cuda/graphs.py)
    def begin_capture(self, launcher) -> None:
        """Stream capture: the backend's kernels (``launcher``), device copies,
        memsets and cuBLAS GEMMs go to a capture stream
        (``cuStreamBeginCapture``, relaxed mode: the graph's pool may still
        call ``cuMemAlloc``), recorded, not run."""
        if self._capture_stream:
            raise RuntimeError("a CUDA graph is already being captured")
        self.bind_thread()
        if self.graph_api is None:
            self.graph_api = CudaGraphApi()
        api = self.graph_api
        stream = api.stream_create()
        api.begin_capture(stream)
        self._capture_stream = launcher.stream = stream
        if self._blas is not None:
            self._blas.set_stream(stream)

    def end_capture(self, launcher) -> "CudaGraph":
        """End the capture: the instantiated graph (``launch()`` runs it on the
        legacy default stream, ordered with everything else gradcore does)."""
        stream, api = self._capture_stream, self.graph_api
        self._capture_stream = launcher.stream = 0
        if self._blas is not None:
            self._blas.set_stream(0)
        try:
            graph = api.end_capture(stream)
            return CudaGraph(api, graph, api.instantiate(graph), self.bind_thread)
        finally:
            api.stream_destroy(stream)

    # ---------------------------------------------------------------- BLAS
    def gemm(self, *args) -> None:
        self._cublas().gemm_strided_batched(*args)


def _libcuda():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise CudaUnavailable(f"libcuda.so.1 cannot be opened ({exc})") from None


def _bind_libcuda(lib, signatures):
    """(lib, the ctypes module, name -> function) for libcuda's ``signatures``
    (name, argument types), each returning a CUresult."""
    if lib is None:
        lib = _libcuda()
    fns = {}
    for name, args in signatures:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
        fns[name] = fn
    return lib, ctypes, fns


class DriverFunction:
    """A kernel loaded through libcuda (``ModuleApi``): its ``CUfunction`` as an int."""

    __slots__ = ("handle", "name")

    def __init__(self, handle: int, name: str):
        self.handle, self.name = handle, name

    def __repr__(self):
        return f"DriverFunction({self.name}, {self.handle:#x})"


class ModuleApi:
    """Module loading and kernel lookup through libcuda with ctypes, in the
    current context (the primary one PyCUDA pushed), for a PyCUDA whose
    ``Function`` hides its ``CUfunction``. Every call's CUresult is checked
    and named."""

    def __init__(self, lib=None):
        P, U = ctypes.c_void_p, ctypes.c_uint
        self.lib, self.ctypes, self._fns = _bind_libcuda(lib, (
            ("cuModuleLoadData", [ctypes.POINTER(P), ctypes.c_char_p]),
            ("cuModuleGetFunction", [ctypes.POINTER(P), P, ctypes.c_char_p]),
            ("cuLaunchKernel", [P, U, U, U, U, U, U, U, P, ctypes.POINTER(P), ctypes.POINTER(P)]),
            ("cuGetErrorName", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])))

    def _call(self, name, what, *args) -> None:
        status = self._fns[name](*args)
        if status:
            text = self.ctypes.c_char_p()
            self._fns["cuGetErrorName"](status, self.ctypes.byref(text))
            raise RuntimeError(f"cuda: {name} ({what}) failed: {(text.value or b'?').decode()} (CUresult {status})")

    def load(self, image: bytes) -> int:
        """A ``CUmodule`` from a CUBIN or PTX image (PTX must end in a NUL)."""
        if not image.startswith(b"\x7fELF") and not image.endswith(b"\0"):
            image += b"\0"
        module = self.ctypes.c_void_p()
        self._call("cuModuleLoadData", f"an image of {len(image)} bytes", self.ctypes.byref(module), image)
        return module.value

    def function(self, module: int, name: str) -> int:
        handle = self.ctypes.c_void_p()
        self._call("cuModuleGetFunction", name, self.ctypes.byref(handle), module, name.encode())
        return handle.value

    def launch(self, handle: int, grid, block, params: bytes, shared: int, stream: int) -> None:
        """``cuLaunchKernel`` with the packed parameter buffer (``CU_LAUNCH_PARAM_BUFFER_POINTER``)."""
        c = self.ctypes
        buf = c.create_string_buffer(bytes(params), max(len(params), 1))
        size = c.c_size_t(len(params))
        extra = (c.c_void_p * 5)(1, c.cast(buf, c.c_void_p), 2, c.cast(c.pointer(size), c.c_void_p), 0)
        self._call("cuLaunchKernel", f"kernel {handle:#x}", handle, *map(int, grid), *map(int, block), int(shared),
                   stream or None, None, extra)


class CudaGraphApi:
    """The CUDA driver API's stream capture and graph calls, bound from
    libcuda with ctypes (PyCUDA does not expose stream capture in every
    version). Every call's CUresult is checked."""

    CU_STREAM_NON_BLOCKING = 1
    CU_STREAM_CAPTURE_MODE_RELAXED = 2

    def __init__(self, lib=None):
        P, U, S = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
        self.lib, self.ctypes, self._fns = _bind_libcuda(lib, (
            ("cuStreamCreate", [ctypes.POINTER(P), U]), ("cuStreamDestroy_v2", [P]),
            ("cuStreamBeginCapture_v2", [P, ctypes.c_int]), ("cuStreamEndCapture", [P, ctypes.POINTER(P)]),
            ("cuGraphInstantiateWithFlags", [ctypes.POINTER(P), P, ctypes.c_ulonglong]),
            ("cuGraphLaunch", [P, P]), ("cuGraphExecDestroy", [P]), ("cuGraphDestroy", [P]),
            ("cuMemcpyDtoDAsync_v2", [ctypes.c_ulonglong, ctypes.c_ulonglong, S, P]),
            ("cuMemsetD8Async", [ctypes.c_ulonglong, ctypes.c_ubyte, S, P])))

    def _call(self, name, *args) -> None:
        status = self._fns[name](*args)
        if status:
            raise RuntimeError(f"cuda: {name} failed (CUresult {status})")

    def _out(self, name, *args) -> int:
        handle = self.ctypes.c_void_p()
        self._call(name, self.ctypes.byref(handle), *args)
        return handle.value or 0

    def stream_create(self) -> int:
        return self._out("cuStreamCreate", self.CU_STREAM_NON_BLOCKING)

    def stream_destroy(self, stream: int) -> None:
        self._call("cuStreamDestroy_v2", stream)

    def begin_capture(self, stream: int) -> None:
        self._call("cuStreamBeginCapture_v2", stream, self.CU_STREAM_CAPTURE_MODE_RELAXED)

    def end_capture(self, stream: int) -> int:
        handle = self.ctypes.c_void_p()
        self._call("cuStreamEndCapture", stream, self.ctypes.byref(handle))
        return handle.value or 0

    def instantiate(self, graph: int) -> int:
        return self._out("cuGraphInstantiateWithFlags", graph, 0)

    def launch(self, graph_exec: int, stream: int = 0) -> None:
        self._call("cuGraphLaunch", graph_exec, stream or None)

    def destroy(self, graph_exec: int, graph: int) -> None:
        self._call("cuGraphExecDestroy", graph_exec)
        self._call("cuGraphDestroy", graph)

    def memcpy_dtod_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._call("cuMemcpyDtoDAsync_v2", dst, src, nbytes, stream)

    def memset_d8_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        self._call("cuMemsetD8Async", ptr, value, nbytes, stream)


class CudaGraph:
    """An instantiated CUDA graph (``CUgraphExec``) and its ``CUgraph``."""

    kernels = None          # the driver does not tell; the emulator's graph counts them

    def __init__(self, api: CudaGraphApi, graph: int, graph_exec: int, bind_thread=None):
        self.api, self.graph, self.graph_exec = api, graph, graph_exec
        self.bind_thread = bind_thread      # the driver's: a replay from another thread

    def launch(self) -> None:
        if self.bind_thread is not None:
            self.bind_thread()
        self.api.launch(self.graph_exec, 0)

    def destroy(self) -> None:
        if self.graph_exec:
            self.api.destroy(self.graph_exec, self.graph)
            self.graph_exec = self.graph = 0
