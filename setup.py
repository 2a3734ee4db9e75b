"""Builds gradcore's Cython core; the top-level ``ops/`` folder is installed
as ``gradcore.ops``. Metadata and entry points are in pyproject.toml."""
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

# The Cython compiler directives, for every compiled module: here only (no
# ``# cython:`` line in a source file). The hand-written modules index only
# within bounds they check themselves, so bounds and negative-index checks and
# memoryview initialisation checks are off.
CORE_DIRECTIVES = {"language_level": 3, "boundscheck": False, "wraparound": False, "initializedcheck": False}
# The generated elementwise functions are plain Python that is also imported
# uncompiled: compiled, they must behave exactly the same, so Python semantics.
PLAIN_DIRECTIVES = {"language_level": 3}

extensions = [
    Extension("gradcore._core", ["gradcore/_core.pyx"], include_dirs=[np.get_include()],
              extra_compile_args=["-O3"]),
    # op construction's fast path: an op built per call (``Scale(3.0)(x)``) is a C table lookup
    Extension("gradcore._op_intern", ["gradcore/_op_intern.pyx"], extra_compile_args=["-O3"]),
    # NumPy's allocator for CPU tensors: a cache of large blocks (gradcore/memory.py)
    Extension("gradcore._host_pool", ["gradcore/_host_pool.pyx"], include_dirs=[np.get_include()],
              extra_compile_args=["-O3"]),
    # full sums and means of small float arrays, NumPy's additions without its call (gradcore/cpu/)
    Extension("gradcore.cpu._reduce", ["gradcore/cpu/_reduce.pyx"], include_dirs=[np.get_include()],
              extra_compile_args=["-O3"]),
    # small loops NumPy does slowly (a branch-free where, erf, scatter-add), NumPy's values (gradcore/cpu/)
    Extension("gradcore.cpu._kernels", ["gradcore/cpu/_kernels.pyx"], include_dirs=[np.get_include()],
              extra_compile_args=["-O3"]),
    # the CUDA backend's per-call path: launches, the device allocator, cuBLAS calls (gradcore/cuda/)
    Extension("gradcore.cuda._launch", ["gradcore/cuda/_launch.pyx"], extra_compile_args=["-O3"]),
    # cuDNN's per-call functions through C function pointers (gradcore/cuda/cudnn.py)
    Extension("gradcore.cuda._cudnn", ["gradcore/cuda/_cudnn.pyx"], extra_compile_args=["-O3"]),
    # oneDNN's C API through function pointers, beside the NumPy kernels (gradcore/cpu/onednn.py)
    Extension("gradcore.cpu._onednn", ["gradcore/cpu/_onednn.pyx"], include_dirs=[np.get_include()],
              extra_compile_args=["-O3"]),
]
# the generated elementwise functions (plain Python, also importable uncompiled):
# compiled, F.exp costs no Python frame per call
plain_extensions = [
    Extension("gradcore.functional.elemwise_table", ["gradcore/functional/elemwise_table.py"],
              extra_compile_args=["-O3"]),
]

setup(
    packages=["gradcore", "gradcore.functional", "gradcore.ops", "gradcore.data", "gradcore.data.transform",
              "gradcore.cuda", "gradcore.cpu", "gradcore.module", "gradcore.distributed"],
    package_dir={"gradcore": "gradcore", "gradcore.ops": "ops"},
    package_data={"gradcore.data": ["*.npz", "*.txt"]},
    # the extensions compile side by side, one per core (pip install -e . included)
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
    ext_modules=(cythonize(extensions, compiler_directives=CORE_DIRECTIVES, nthreads=os.cpu_count() or 1)
                 + cythonize(plain_extensions, compiler_directives=PLAIN_DIRECTIVES)),
    zip_safe=False,
)
