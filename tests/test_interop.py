"""DLPack on cpu: NumPy and PyTorch share memory with gradcore tensors, both ways."""
import numpy as np
import pytest
import torch

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager


def test_numpy_views_a_tensor_and_sees_its_writes():
    t = gc.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert t.__dlpack_device__() == (1, 0)
    a = np.from_dlpack(t)
    assert a.dtype == np.float32 and a.shape == (2, 2)
    assert np.shares_memory(a, t._data)
    t._data[0, 1] = 7.0                # a write on gradcore's side
    assert a[0, 1] == 7.0
    a[1, 0] = -1.0                     # and on NumPy's
    assert t.numpy()[1, 0] == -1.0


def test_from_dlpack_views_numpy_memory():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    t = gc.from_dlpack(a)
    assert t.dtype == np.float64 and t.shape == (2, 3) and t.device == "cpu"
    a[1, 2] = 100.0
    assert t.numpy()[1, 2] == 100.0
    # usable as any tensor, differentiable as a leaf
    gm = GradManager().attach([t])
    with gm:
        gm.backward((t * t).sum())
    np.testing.assert_allclose(t.grad.numpy(), 2 * a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.bool])
def test_torch_and_gradcore_share_memory_both_ways(dtype):
    # torch -> gradcore
    x = torch.zeros(2, 3, dtype=dtype)
    t = gc.from_dlpack(x)
    assert t.shape == (2, 3) and t.dtype == np.dtype(str(dtype).replace("torch.", ""))
    x[1, 1] = 1
    assert t.numpy()[1, 1] == 1
    # gradcore -> torch
    g = gc.tensor(np.zeros((4,), dtype=str(dtype).replace("torch.", "")))
    y = torch.from_dlpack(g)
    assert y.dtype == dtype and y.data_ptr() == g._data.ctypes.data
    y[2] = 1
    assert g.numpy()[2] == 1
    g._data[3] = 1
    assert bool(y[3])


def test_torch_non_contiguous_and_offset_views():
    base = torch.arange(12.0).reshape(3, 4)
    t = gc.from_dlpack(base.T[1:])               # strided, with an offset
    np.testing.assert_array_equal(t.numpy(), base.T[1:].numpy())
    base[2, 3] = -5.0
    assert t.numpy()[2, 2] == -5.0
    np.testing.assert_allclose(F.exp(t).numpy(), np.exp(base.T[1:].numpy()), rtol=1e-6)


def test_tensor_outlives_the_producer_object():
    t = gc.from_dlpack(torch.full((1000,), 3.0))      # the torch tensor is dropped right away
    import gc as pygc
    pygc.collect()
    assert float(t.sum().item()) == 3000.0


def test_raw_capsule_and_errors():
    a = np.arange(3.0)
    t = gc.from_dlpack(a.__dlpack__())
    a[0] = 9
    assert t.numpy()[0] == 9
    with pytest.raises(TypeError, match="from_dlpack: list has neither __dlpack__"):
        gc.from_dlpack([1, 2])
    with pytest.raises(AttributeError, match="only cuda tensors"):
        gc.tensor([1.0]).__cuda_array_interface__
    assert not hasattr(gc.tensor([1.0]), "__cuda_array_interface__")
    with pytest.raises(RuntimeError, match="stream=None"):
        gc.tensor([1.0]).__dlpack__(stream=1)       # cpu: no streams (NumPy's own check)
