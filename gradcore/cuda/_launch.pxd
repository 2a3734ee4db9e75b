# The compiled launch path of the CUDA backend (gradcore/cuda/_launch.pyx).
#
# What this file is for: the C-level declarations of _launch.pyx's cdef
# classes (their attributes and C methods), which Cython reads when it
# compiles _launch.pyx. No other module cimports them; the rest of gradcore
# uses the module from Python. The classes _launch.pyx declares in full itself
# (ElementwiseLauncher, FusedRunner, LauncherTable) are not repeated here.
# Cython directives: setup.py, for every compiled module at once.
#
# Contract (the Python-level surface gradcore/cuda/ uses):
# - ``Kernel``: a loaded kernel's C handle, cached by the backend per
#   (op, C type, name, source). ``mode`` says how it is launched: through
#   libcuda's ``cuLaunchKernel`` (``handle`` is the CUfunction) or, on the host
#   emulator, by calling ``handle`` itself as
#   ``void launch(const unsigned grid[3], const unsigned block[3], const char* params)``.
# - ``Launcher``: packs kernel arguments into a C buffer in the CUDA ABI's
#   layout and calls the entry point; it never goes through PyCUDA's Python
#   objects. It counts launches; ``dry_run`` skips the call (host-cost benchmarks).
# - ``MemoryPool``/``Block``: the caching device allocator (size classes, free
#   lists, statistics, ``empty_cache``); the driver is called only on a miss.
# - ``gemm``: cuBLAS's S/DgemmStridedBatched through C function pointers.
# - CUDA-graph capture (gradcore/cuda/graphs.py sets and clears these; outside
#   a capture they cost one pointer test per launch / allocation): the
#   Launcher's ``capture`` takes launches instead of running them (emulator),
#   ``stream`` is the CUstream of cuLaunchKernel (a GPU's capture stream),
#   ``keep`` collects the Blocks the captured kernels read (all but those of
#   ``own_pool``); the MemoryPool's ``redirect`` sends allocations to the
#   graph's private pool and ``held`` keeps the blocks given back meanwhile.
# - ``DeviceArrayBase`` (with ``set_array_type``): the fields of
#   gradcore/cuda/array.py's ``DeviceArray``; ``new_array`` makes one in a
#   pool without Python-level construction; ``set_dims_type`` gives the
#   layout of the dims struct kernels take; ``pack_params`` and
#   ``size_class`` are the packer and the allocator's rounding, for tests.
# - ``ElementwiseLauncher``: an elementwise op's common case (same shapes
#   and dtypes, contiguous) from plan to launch in C, the op's own launcher
#   for the rest; ``FusedRunner``: a fused backward kernel's whole call;
#   ``LauncherTable``: the core's lookup of an op's launcher by identity.

cdef enum LaunchMode:
    MODE_CUDA = 0
    MODE_HOST = 1
    MODE_PYTHON = 2                     # fallback: the driver's Python launch(fn, grid, block, bytes, shared)

cdef class DeviceArrayBase:
    # the data of a DeviceArray (gradcore/cuda/array.py subclasses it with the methods)
    cdef public object backend, shape, dtype, _block
    cdef public Py_ssize_t size, ndim, nbytes
    cdef public unsigned long long ptr
    cdef object __weakref__


cdef class Kernel:
    cdef readonly object name
    cdef readonly object fn             # the driver's own function object (kept alive)
    cdef void* handle
    cdef LaunchMode mode
    cdef readonly bytes kinds           # per parameter, how it is passed (kernels.parameters), or None
    cdef readonly object params         # the C parameter list, for messages


cdef class MemoryPool


cdef class Launcher:
    cdef void* cu_launch                # CUresult cuLaunchKernel(...)
    cdef public bint dry_run
    cdef public unsigned long long launches
    cdef public object trace            # a deque of kernel names, or None
    cdef object python_launch           # the driver's launch, for MODE_PYTHON kernels
    cdef object bind_thread             # the driver's: its context made current in a new thread (or None)
    cdef unsigned long long launcher_id     # what a thread that bound the context for it records (_launch.pyx)
    # CUDA-graph capture (gradcore/cuda/graphs.py); all None/0 outside a capture
    cdef public object capture          # emulator: takes each launch (kernel, grid, block, params, shared) instead of running it
    cdef public list keep               # the Blocks of the arrays the captured launches read (the graph keeps them alive)
    cdef public MemoryPool own_pool     # the capturing graph's pool: its blocks are not kept (reused inside the capture)
    cdef public unsigned long long stream   # the CUstream cuLaunchKernel launches on (0: the legacy default stream)
    cdef char[4096] buf
    cdef int submit(self, Kernel k, unsigned* grid, unsigned* block, Py_ssize_t size, unsigned shared) except -1
    # one thread per element of n > 0, the parameters already packed into ``buf``
    cdef int submit_n(self, Kernel k, long long n, Py_ssize_t size) except -1


cdef class Block:
    cdef readonly unsigned long long ptr
    cdef readonly Py_ssize_t size
    cdef MemoryPool pool
    cdef public unsigned long long version      # bumped by every in-place write through the backend
    cdef object __weakref__


cdef struct AddressStack:             # cached device addresses of one size class
    unsigned long long* items
    Py_ssize_t n, cap


cdef class MemoryPool:
    cdef readonly object driver
    cdef AddressStack* small            # the classes up to 1 MiB, indexed by size // 512
    cdef dict free_lists                # larger size class -> [device address]
    cdef dict allocations               # device address -> the driver's allocation object
    cdef public long long in_use_bytes, cached_bytes, peak_bytes
    cdef public long long reserved_bytes, peak_reserved_bytes     # taken from the driver and not freed
    cdef public long long driver_allocs, driver_frees, reuses
    # CUDA-graph capture: allocations go to the graph's private pool, and blocks
    # given back are held (a captured kernel may read them at every replay)
    cdef public MemoryPool redirect
    cdef public list held
    cpdef Block malloc(self, Py_ssize_t nbytes)
    cdef void give_back(self, unsigned long long ptr, Py_ssize_t size)
