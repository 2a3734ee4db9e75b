"""Fixtures shared by the whole suite."""
import zlib

import numpy as np
import pytest


@pytest.fixture
def torch():
    """PyTorch, the test oracle (skips the test where it is not installed)."""
    return pytest.importorskip("torch")


@pytest.fixture
def rng(request):
    # a stable seed per test, so failures reproduce
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def emulated_cuda():
    """The CUDA backend on the host emulator for one test (skips without g++)."""
    import shutil
    from gradcore.cuda import runtime
    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("the CUDA emulator needs g++")
    yield runtime.use("emulator")
    runtime.use(None)
