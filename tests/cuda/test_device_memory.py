"""gradcore.device's figures for cuda: the device pool's allocated and
reserved bytes, their peaks, and the driver's properties."""
from __future__ import annotations

import numpy as np

import gradcore as gc
import gradcore.device as device

MiB = 1 << 20


def test_allocated_reserved_and_peaks_on_cuda(cuda):
    cuda.pool.empty_cache()
    device.reset_max_memory_stats("gpu0")
    base = device.get_allocated_memory("cuda")
    x = gc.tensor(np.ones((256, 1024), np.float32), device="cuda")         # 1 MiB
    assert device.get_allocated_memory("xpux") - base >= MiB
    assert device.get_reserved_memory("cuda") >= device.get_allocated_memory("cuda")
    y = x * 2
    del x, y
    assert device.get_allocated_memory("cuda") - base < 4096     # the constant 2, cached by the backend
    assert device.get_max_allocated_memory("cuda") - base >= 2 * MiB
    assert device.get_reserved_memory("cuda") - base >= 2 * MiB      # kept for reuse
    assert device.get_max_reserved_memory("cuda") >= device.get_reserved_memory("cuda")
    device.coalesce_free_memory()
    assert device.get_reserved_memory("cuda") == device.get_allocated_memory("cuda")
    device.reset_max_memory_stats("cuda")
    assert device.get_max_allocated_memory("cuda") == device.get_allocated_memory("cuda")


def test_device_properties(cuda):
    prop = device.get_cuda_device_property(0)
    assert prop.name == cuda.driver.name and prop.total_memory > 0
    assert device.get_cuda_compute_capability(0) == prop.major * 10 + prop.minor
    total, free = device.get_mem_status_bytes("cuda")
    assert 0 <= free <= total
    if cuda.driver.kind == "emulator":
        assert (prop.major, prop.minor) == (0, 0)
    else:
        assert device.get_cuda_driver_version() >= 11000
