"""gradcore.device: MegEngine's ``megengine.device`` queries, and the memory
statistics of the host pool behind them (the cuda side: tests/cuda/test_device_memory.py)."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore as gc
import gradcore.device as device
import gradcore.functional as F

MiB = 1 << 20


def test_megengine_names_at_both_paths():
    for name in device.__all__:
        assert getattr(gc, name) is getattr(device, name), name
    assert gc.device is device
    assert not gc.is_rocm_available() and not gc.is_atlas_available() and not gc.is_cambricon_available()
    assert gc.what_is_xpu() == ("cuda" if gc.is_cuda_available() else "cpu")


def test_allocated_memory_follows_a_tensor_on_the_cpu():
    before = device.get_allocated_memory("cpu0")
    x = gc.tensor(np.ones((1024, 1024), np.float32))        # 4 MiB, copied into the tensor
    grown = device.get_allocated_memory("cpu0") - before
    assert 4 * MiB <= grown < 4 * MiB + 64 * 1024
    del x
    assert device.get_allocated_memory("cpu0") - before < 64 * 1024


def test_peaks_and_their_reset():
    device.reset_max_memory_stats()
    base = device.get_allocated_memory()
    assert device.get_max_allocated_memory() - base < 64 * 1024
    y = F.exp(F.ones((512, 1024))) * 2          # 2 MiB each: ones, exp, the product
    del y
    peak = device.get_max_allocated_memory() - base
    assert 4 * MiB <= peak < 6 * MiB + 64 * 1024
    assert device.get_max_reserved_memory() >= device.get_max_allocated_memory()
    device.reset_max_memory_stats("cpu1")           # a logical cpu device: the same host pool
    assert device.get_max_allocated_memory() - device.get_allocated_memory() < 64 * 1024


def test_creation_functions_make_their_data_once():
    # F.zeros & co. used to build the array and then copy it into the tensor
    for make in (lambda: F.zeros((1024, 1024)), lambda: F.full((1024, 1024), 3.0),
                 lambda: F.arange(1 << 20), lambda: F.eye(1024)):
        device.reset_max_memory_stats()
        base = device.get_allocated_memory()
        t = make()
        assert device.get_max_allocated_memory() - base < 4 * MiB + 64 * 1024
        assert t.dtype == np.float32
    with pytest.raises(TypeError, match="complex"):
        F.zeros(2, dtype=complex)
    assert F.zeros(2, device="cpu1").device == "cpu1:0"


def test_reserved_memory_and_coalescing():
    x = F.ones((2048, 1024))        # 8 MiB
    del x                           # kept by the pool for reuse
    assert device.get_reserved_memory() - device.get_allocated_memory() >= 8 * MiB
    device.coalesce_free_memory()
    assert gc.memory.stats()["cached_bytes"] == 0
    # what stays is the small blocks' cache (as MegEngine: "small pieces may not be
    # returned"): at most 8 blocks of each 16-byte size up to 1 KiB
    assert device.get_reserved_memory() - device.get_allocated_memory() <= 8 * 16 * sum(range(65))


def test_memory_status_and_cuda_queries_without_a_gpu():
    total, free = device.get_mem_status_bytes("cpu0")
    assert 0 < free <= total
    assert device.get_mem_status_bytes() == pytest.approx((total, free), rel=0.2)
    if not gc.is_cuda_available():
        with pytest.raises(RuntimeError, match="cuda"):
            device.get_cuda_compute_capability(0)
        with pytest.raises(RuntimeError, match="cuda"):
            device.get_allocated_memory("gpu0")
    with pytest.raises(ValueError, match="unknown device"):
        device.get_allocated_memory("tpu0")
