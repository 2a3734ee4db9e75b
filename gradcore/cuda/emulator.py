"""A host emulation of the CUDA driver, for machines without a GPU.

``HostDriver`` has ``PyCudaDriver``'s interface. Device memory is host
memory; a kernel module is the op's CUDA C source compiled as C++ (g++)
behind a prelude that maps CUDA's keywords, with one launcher per
``extern "C" __global__`` kernel that unpacks the parameter buffer (laid out
as the CUDA ABI lays it out) and runs the kernel once per simulated thread,
block after block, thread after thread. So everything above the driver (the
device arrays, the memory pool, each op's launch layout and argument list)
is exercised exactly as on a GPU, only slower.

Kernels whose threads wait for each other (``__syncthreads``, ``__shared__``,
warp shuffles and votes) run their blocks as cooperatively scheduled fibers
instead (gradcore/cuda/emulator_blocks.py); a missed barrier or a deadlock
is an error, not a hang. What it cannot emulate: timing, and concurrency
between blocks (they run one after the other). Launch configurations
are checked against a GPU's limits (1024 threads per block, grid y/z at most
65535), so a launch that would fail on a GPU fails here too.

Select it with ``GRADCORE_CUDA=emulator`` or ``gradcore.cuda.use("emulator")``.
"""
from __future__ import annotations

import collections
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from . import emulator_blocks as blocks
from .cache import KernelCompileError, default_directory, parse_errors
from .driver import CudaUnavailable
from .kernels import kernel_names

# ctypes array types made once: a type made per launch (c_uint * 3) is kept
# only by ctypes' cache and, when that lets it go, a reference cycle left per call
_DIM3 = ctypes.c_uint * 3
_ERRBUF = ctypes.c_char * 1024


PRELUDE = r"""
// ---- gradcore host emulation of CUDA C (gradcore/cuda/emulator.py)
#include <cmath>
#include <cfloat>
#include <climits>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <tuple>
#include <utility>
#include <algorithm>
using std::min; using std::max;
using std::sqrt; using std::exp; using std::log; using std::fabs; using std::floor; using std::ceil;
using std::isnan; using std::isinf;
struct gc_emu_dim3 { unsigned int x, y, z; };
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
template <class T> static inline T atomicAdd(T* p, T v) { T old = *p; *p += v; return old; }
template <class T> static inline T __ldg(const T* p) { return *p; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// fast-math and rounding-mode intrinsics: the plain operation (the GPU's
// approximations are within a few ulps of it). Macros: glibc's math.h
// declares some of these names for itself (without exporting them)
#define __expf(x) expf(x)
#define __exp10f(x) powf(10.0f, (x))
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __log10f(x) log10f(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __powf(x, y) powf((x), (y))
#define __fdividef(x, y) ((float)(x) / (float)(y))
#define __frcp_rn(x) (1.0f / (float)(x))
#define __fsqrt_rn(x) sqrtf(x)
#define __fadd_rn(x, y) ((float)(x) + (float)(y))
#define __fmul_rn(x, y) ((float)(x) * (float)(y))
#define __fmaf_rn(x, y, z) fmaf((x), (y), (z))
#define __dadd_rn(x, y) ((double)(x) + (double)(y))
#define __dmul_rn(x, y) ((double)(x) * (double)(y))
#define __fma_rn(x, y, z) fma((x), (y), (z))
static inline float gc_emu_saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
#define __saturatef(x) gc_emu_saturatef(x)
#define __popc(x) __builtin_popcount((unsigned int)(x))
#define __popcll(x) __builtin_popcountll((unsigned long long)(x))
#define __clz(x) ((int)(x) == 0 ? 32 : __builtin_clz((unsigned int)(x)))
#define __ffs(x) __builtin_ffs((int)(x))
"""

# the prelude's end for kernels run one thread after the other (no barriers)
SERIAL_PRELUDE = r"""
static gc_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
"""

LAUNCHER = r"""
// ---- launchers: unpack the CUDA-ABI parameter buffer, loop over the grid
template <class T> static T gc_emu_take(const char* buf, size_t& off) {
    off = (off + alignof(T) - 1) / alignof(T) * alignof(T);
    T v; std::memcpy((void*)&v, buf + off, sizeof(T)); off += sizeof(T);
    return v;
}
template <class... A> static void gc_emu_run(void (*k)(A...), const unsigned* g, const unsigned* b, const char* buf) {
    size_t off = 0;
    std::tuple<A...> args{gc_emu_take<A>(buf, off)...};   // braced: left to right
    gridDim = {g[0], g[1], g[2]}; blockDim = {b[0], b[1], b[2]};
    for (unsigned bz = 0; bz < g[2]; ++bz) for (unsigned by = 0; by < g[1]; ++by) for (unsigned bx = 0; bx < g[0]; ++bx) {
        blockIdx = {bx, by, bz};
        for (unsigned tz = 0; tz < b[2]; ++tz) for (unsigned ty = 0; ty < b[1]; ++ty) for (unsigned tx = 0; tx < b[0]; ++tx) {
            threadIdx = {tx, ty, tz};
            std::apply(k, args);
        }
    }
}
"""


def _compiler():
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


class _Module:
    def __init__(self, lib, path, cooperative=False):
        self.lib, self.path, self.cooperative = lib, path, cooperative


_block_runtime = None           # the fiber scheduler's library, loaded once per process (RTLD_GLOBAL)
_block_runtime_lock = threading.Lock()


class HostDriver:
    """The CUDA driver interface on the host (see the module docstring)."""

    kind = "emulator"
    name = "host emulator"
    arch = "host"

    def __init__(self, directory=None):
        self.cxx = _compiler()
        if self.cxx is None:
            raise CudaUnavailable("the CUDA emulator needs a C++ compiler (g++), and none was found")
        self.directory = Path(directory) if directory else default_directory() / "host"
        self.total_memory = 1 << 34
        self._buffers = {}          # address -> host buffer backing it
        self._modules = {}
        self._lock = threading.Lock()
        self.stats = {"compiles": 0, "launches": 0, "graph_launches": 0}
        self._recording = None      # the HostGraph a capture is recording (gradcore/cuda/graphs.py)
        self.launched = collections.deque(maxlen=10000)     # kernel names, for tests

    def __repr__(self):
        return "HostDriver(CUDA emulated on the host)"

    def properties(self) -> tuple:
        """(name, total memory, major, minor): the emulator is no GPU, so
        its compute capability is 0.0."""
        return self.name, self.total_memory, 0, 0

    def memory_info(self) -> tuple:
        """(total, free) of the emulated memory: ``total_memory`` less the
        bytes of the buffers backing device arrays now."""
        used = sum(size for _, size in list(self._buffers.values()))
        return self.total_memory, max(0, self.total_memory - used)

    def driver_version(self) -> int:
        raise CudaUnavailable("the host emulator has no CUDA driver (it runs kernels compiled for the host)")

    capture_allocating = False     # set by a CUDA graph's pool: the one allocator a capture permits

    # ---------------------------------------------------------------- memory
    def alloc(self, nbytes: int):
        if self._recording is not None and not self.capture_allocating:
            raise RuntimeError(f"cuda emulator: a device allocation of {nbytes} bytes outside the CUDA graph's "
                               f"memory pool during capture (the graph would not own it)")
        buf = np.empty(max(int(nbytes), 1) + 256, np.uint8)
        addr = (buf.ctypes.data + 255) & ~255          # cudaMalloc aligns to 256
        self._buffers[addr] = (buf, int(nbytes))
        return _Allocation(addr)

    def free(self, allocation) -> None:
        if self._buffers.pop(int(allocation), None) is None:
            raise RuntimeError(f"cuda emulator: free of an unknown address {int(allocation):#x}")

    def _check(self, ptr: int, nbytes: int, what: str):
        """The range [ptr, ptr+nbytes) must lie inside one live allocation
        (on a GPU, a stray pointer is an illegal address, or silent garbage);
        returns that allocation's host buffer (None for an empty range)."""
        if nbytes == 0:
            return None
        for base, (buf, size) in self._buffers.items():
            if base <= ptr and ptr + nbytes <= base + size:
                return buf
        raise RuntimeError(f"cuda emulator: {what} of {nbytes} bytes at {ptr:#x} is outside every allocation")

    def _refuse_while_recording(self, what: str) -> None:
        if self._recording is not None:
            raise RuntimeError(f"cuda emulator: {what} while a CUDA graph is being captured")

    def _run_or_record(self, fn, *args) -> None:
        """``fn(*args)`` now, or as a node of the CUDA graph being captured."""
        if self._recording is not None:
            self._recording.nodes.append((fn, args))
        else:
            fn(*args)

    def htod(self, ptr: int, host) -> None:
        host = np.ascontiguousarray(host)
        self._check(ptr, host.nbytes, "copy to device")
        ctypes.memmove(ptr, host.ctypes.data, host.nbytes)

    def dtoh(self, host, ptr: int) -> None:
        self._refuse_while_recording("a device-to-host copy")
        self._check(ptr, host.nbytes, "copy to host")
        ctypes.memmove(host.ctypes.data, ptr, host.nbytes)

    def dtod(self, dst: int, src: int, nbytes: int) -> None:
        self._check(src, nbytes, "device copy from")
        self._check(dst, nbytes, "device copy to")
        self._run_or_record(ctypes.memmove, dst, src, nbytes)

    def memset0(self, ptr: int, nbytes: int) -> None:
        self._check(ptr, nbytes, "memset")
        self._run_or_record(ctypes.memset, ptr, 0, nbytes)

    # ---------------------------------------------------------------- kernels
    def load(self, name: str, source: str):
        kernels = kernel_names(source)
        cooperative = blocks.is_cooperative(source)
        if cooperative:       # threads that wait for each other: blocks of fibers
            full = (PRELUDE + blocks.PRELUDE + "#line 1\n" + blocks.rewrite_dynamic_shared(source) + "\n" +
                    LAUNCHER + blocks.LAUNCHER + "".join(blocks.launcher(k) for k in kernels))
        else:
            full = PRELUDE + SERIAL_PRELUDE + "#line 1\n" + source + "\n" + LAUNCHER + "".join(
                f'extern "C" void gc_emu_launch_{k}(const unsigned* g, const unsigned* b, const char* p) '
                f'{{ gc_emu_run({k}, g, b, p); }}\n' for k in kernels)
        key = hashlib.sha256(f"{self.cxx}\0{full}".encode()).hexdigest()[:32]
        if cooperative:
            self._load_block_runtime()
        with self._lock:
            mod = self._modules.get(key)
            if mod is None:
                path = self.directory / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:80]}-{key}.so"
                if not path.exists():
                    self._compile(name, source, full, path)
                mod = self._modules[key] = _Module(ctypes.CDLL(str(path)), path, cooperative)
        return mod

    def _load_block_runtime(self) -> None:
        """The fiber scheduler of cooperative kernels, compiled once per
        machine and loaded once per process, its symbols global (the kernel
        modules link to them when loaded)."""
        global _block_runtime
        with _block_runtime_lock:
            if _block_runtime is not None:
                return
            key = hashlib.sha256(f"{self.cxx}\0{blocks.RUNTIME}".encode()).hexdigest()[:32]
            path = self.directory / f"gc_emu_blocks-{key}.so"
            if not path.exists():
                self._compile("gc_emu_blocks", blocks.RUNTIME, blocks.RUNTIME, path)
            _block_runtime = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)

    def _compile(self, name, source, full, path: Path):
        self.stats["compiles"] += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="gradcore-emu-") as tmp:
            src = Path(tmp) / "kernel.cpp"
            src.write_text(full)
            out = Path(tmp) / "kernel.so"
            # run in the temporary folder on the bare file name: the log names no temporary path (one
            # mistake reads alike in every report); no caret excerpts: the compiler would quote the line
            # of the whole file (the prelude's), not the line of the kernel's source that #line names
            cmd = [self.cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-fno-diagnostics-show-caret",
                   "-o", out.name, src.name]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)
            if res.returncode != 0:
                log = res.stdout + res.stderr
                raise KernelCompileError(name, parse_errors(log, source, src.name), log, "host")
            tmp_target = path.with_suffix(f".{os.getpid()}.tmp")
            shutil.copyfile(out, tmp_target)
            os.replace(tmp_target, path)      # atomic: concurrent processes never see half a file

    def function(self, module, kernel_name: str):
        entry = "gc_emu_coop_" if module.cooperative else "gc_emu_launch_"
        try:
            fn = getattr(module.lib, entry + kernel_name)
        except AttributeError:
            raise RuntimeError(f"cuda emulator: no kernel {kernel_name!r} in {module.path.name}") from None
        fn.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint), ctypes.c_char_p]
        fn.restype = None
        if module.cooperative:      # + the dynamic shared memory size and an error buffer
            fn.argtypes += [ctypes.c_uint, ctypes.c_char_p, ctypes.c_size_t]
            fn.restype = ctypes.c_int
        fn.kernel_name = kernel_name
        fn.cooperative = module.cooperative
        return fn

    # the C-level interface of the compiled launch path (gradcore/cuda/_launch.pyx)
    def launch_entry(self) -> int:
        """No ``cuLaunchKernel`` here: each kernel's handle is its own launcher."""
        return 0

    def kernel_handle(self, function):
        """("host", address of the kernel's compiled launcher
        ``void(const unsigned* grid, const unsigned* block, const char* params)``);
        a cooperative kernel is launched through ``launch`` ("python"), which
        passes the dynamic shared memory size and raises its errors."""
        if function.cooperative:
            return "python", 0
        return "host", ctypes.cast(function, ctypes.c_void_p).value

    def launch(self, function, grid, block, params: bytes, shared: int = 0) -> None:
        g = tuple(grid) + (1,) * (3 - len(grid))
        b = tuple(block) + (1,) * (3 - len(block))
        if b[0] * b[1] * b[2] > 1024 or b[2] > 64 or min(b) < 1:
            raise RuntimeError(f"cuda emulator: invalid block {b} (at most 1024 threads, z at most 64)")
        if not (1 <= g[0] < 2 ** 31 and 1 <= g[1] <= 65535 and 1 <= g[2] <= 65535):
            raise RuntimeError(f"cuda emulator: invalid grid {g}")
        self.stats["launches"] += 1
        # (``launched`` is the backend's Launcher's trace: it records every
        # launch, this one included, before calling here)
        if not function.cooperative:
            function(_DIM3(*g), _DIM3(*b), params)
            return
        run_cooperative(function, g, b, params, shared)

    def synchronize(self) -> None:
        self._refuse_while_recording("a device synchronisation")

    # ---------------------------------------------------------------- CUDA graphs (gradcore/cuda/graphs.py)
    def begin_capture(self, launcher) -> None:
        """Stream capture: from now on the backend's device work (kernels
        from ``launcher``, device copies, memsets, GEMMs) is recorded into a
        ``HostGraph``, not run; host copies are refused."""
        if self._recording is not None:
            raise RuntimeError("cuda emulator: a CUDA graph is already being captured")
        self._recording = HostGraph(self)
        launcher.capture = self._recording.add_launch

    def end_capture(self, launcher) -> "HostGraph":
        """End the capture; the recorded graph (``launch()`` replays it)."""
        launcher.capture = None
        graph, self._recording = self._recording, None
        if graph is None:
            raise RuntimeError("cuda emulator: end_capture without begin_capture")
        return graph

    # ---------------------------------------------------------------- BLAS
    def gemm(self, *args) -> None:
        """cuBLAS's column-major strided batched GEMM, C = alpha op(A) op(B) + beta C,
        on host memory (NumPy); the arguments as ``_gemm_now``'s."""
        self._run_or_record(self._gemm_now, *args)

    def _gemm_now(self, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                  beta, c, ldc, stride_c, batch, dtype) -> None:
        dt = np.dtype(dtype)
        ra, ca = (k, m) if transa else (m, k)      # op(A) is m x k; A is stored ra x ca column-major
        rb, cb = (n, k) if transb else (k, n)

        def view(ptr, rows, cols, ld, stride):
            if batch == 0 or rows == 0 or cols == 0:
                return np.zeros((batch, rows, cols), dt)
            span = ((batch - 1) * stride + (cols - 1) * ld + rows) * dt.itemsize
            buf = self._check(ptr, span, "gemm operand")
            # a slice of the allocation's own buffer: a ctypes array type made
            # per call (c_char * span) is a reference cycle left per GEMM
            start = ptr - buf.ctypes.data
            flat = buf[start:start + span].view(dt)
            # column-major: element (r, c) of batch i at i*stride + c*ld + r
            return np.lib.stride_tricks.as_strided(
                flat, (batch, rows, cols), (stride * dt.itemsize, dt.itemsize, ld * dt.itemsize))
        A, B, C = view(a, ra, ca, lda, stride_a), view(b, rb, cb, ldb, stride_b), view(c, m, n, ldc, stride_c)
        opA = A.transpose(0, 2, 1) if transa else A
        opB = B.transpose(0, 2, 1) if transb else B
        res = alpha * np.matmul(opA, opB)
        if beta != 0:
            res = res + beta * C
        if m and n and batch:
            C[...] = res.astype(dt)


def run_cooperative(function, grid, block, params: bytes, shared: int) -> None:
    """Run a cooperative kernel's launcher (blocks of fibers,
    gradcore/cuda/emulator_blocks.py); its errors (a missed barrier, a
    deadlock, too much shared memory) as a RuntimeError."""
    err = _ERRBUF()
    if function(_DIM3(*grid), _DIM3(*block), params, int(shared), err, len(err)):
        raise RuntimeError(f"cuda emulator: kernel {function.kernel_name} (grid {tuple(grid)}, block "
                           f"{tuple(block)}): {err.value.decode(errors='replace')}")


class HostGraph:
    """A captured launch sequence (the emulator's CUDA graph): each node a
    kernel's compiled launcher with its packed parameter buffer, a device
    copy, a memset or a GEMM, in capture order; ``launch()`` replays them."""

    def __init__(self, driver: HostDriver):
        self.driver = driver
        self.nodes = []
        self.kernels = 0

    def add_launch(self, kernel, grid, block, params: bytes, shared: int) -> None:
        """The Launcher's capture hook: one kernel launch, recorded."""
        fn = kernel.fn
        if getattr(fn, "cooperative", False):     # its own entry: the shared size, errors raised
            self.nodes.append((run_cooperative, (fn, tuple(grid), tuple(block), params, shared)))
        else:
            self.nodes.append((fn, (_DIM3(*grid), _DIM3(*block), params)))
        self.kernels += 1

    def launch(self) -> None:
        """Replay every recorded node, in order (one graph launch)."""
        self.driver.stats["graph_launches"] += 1
        for run, args in self.nodes:
            run(*args)

    def destroy(self) -> None:
        self.nodes = []


class _Allocation:
    __slots__ = ("addr",)

    def __init__(self, addr):
        self.addr = addr

    def __int__(self):
        return self.addr
