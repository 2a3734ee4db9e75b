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
