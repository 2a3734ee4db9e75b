"""Where the CUDA toolkit's pieces are: ``nvcc``, and NVIDIA's shared
libraries (cuBLAS, NVRTC) shipped in pip wheels or a system toolkit
(device layer: used by the kernel cache and ``blas``; ``nvcc_path`` is
re-exported by ``gradcore.devices``)."""
from __future__ import annotations

import glob
import os
import shutil
import site
import sys
from typing import Iterator, List, Optional


def nvcc_path() -> Optional[str]:
    """The path of ``nvcc`` (PATH, then ``$CUDA_HOME/bin``, then
    ``/usr/local/cuda/bin``), or None. Compiling kernel sources needs it; a
    GPU does not. Example: ``nvcc_path()`` -> ``"/usr/local/cuda/bin/nvcc"``."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in _cuda_homes():
        cand = os.path.join(root, "bin", "nvcc")
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def is_nvcc_available() -> bool:
    """Whether ``nvcc`` is found (``nvcc_path()``)."""
    return nvcc_path() is not None


def _cuda_homes() -> List[str]:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        # /usr/local/cuda-13.0/bin/nvcc, or a wrapper script that execs it
        homes.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    return [h for h in dict.fromkeys(homes) if h and os.path.isdir(h)]


def library_candidates(stem: str, wheel: str) -> List[str]:
    """Where ``lib<stem>.so`` may be, most specific first: NVIDIA's pip
    wheels (``nvidia/<wheel>/lib``, and ``nvidia/cu*/lib`` as the CUDA 13
    wheels lay it out) on ``sys.path``, ``$CUDA_HOME``/``$CUDA_PATH``/
    ``/usr/local/cuda`` (``lib64``, ``targets/*/lib``); the system loader's
    name when none of those has it. Example: ``library_candidates("nvrtc",
    "cuda_nvrtc")`` -> ``[".../site-packages/nvidia/cu13/lib/libnvrtc.so.13"]``."""
    return list(dict.fromkeys(iter_library_candidates(stem, wheel)))


def iter_library_candidates(stem: str, wheel: str) -> Iterator[str]:
    """``library_candidates`` one by one, searched as they are asked for
    (``next()`` of it finds the first without globbing every directory)."""
    roots = list(sys.path) + site.getsitepackages() + [site.getusersitepackages()]
    pattern = f"lib{stem}.so*"
    any_found = False
    for root in dict.fromkeys(r for r in roots if r and os.path.isdir(r)):
        for sub in (wheel, "cu*"):
            for path in sorted(glob.glob(os.path.join(root, "nvidia", sub, "lib", pattern)), reverse=True):
                any_found = True
                yield path
    for home in _cuda_homes():
        for where in (("lib64",), ("targets", "*", "lib")):
            for path in sorted(glob.glob(os.path.join(home, *where, pattern)), reverse=True):
                any_found = True
                yield path
    if not any_found:
        # the system loader's name: last, and only then (it runs ldconfig;
        # ctypes.util, imported here, brings subprocess and tempfile: ~7 ms)
        import ctypes.util
        name = ctypes.util.find_library(stem)
        if name:
            yield name
