"""Where the CUDA toolkit's compiler is (device layer: used by the kernel
cache, re-exported by ``gradcore.devices``)."""
from __future__ import annotations

import os
import shutil
from typing import Optional


def nvcc_path() -> Optional[str]:
    """The path of ``nvcc`` (PATH, then ``$CUDA_HOME/bin``, then
    ``/usr/local/cuda/bin``), or None. Compiling kernel sources needs it; a
    GPU does not. Example: ``nvcc_path()`` -> ``"/usr/local/cuda/bin/nvcc"``."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            cand = os.path.join(root, "bin", "nvcc")
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand
    return None


def is_nvcc_available() -> bool:
    """Whether ``nvcc`` is found (``nvcc_path()``)."""
    return nvcc_path() is not None
