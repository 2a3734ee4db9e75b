"""DLPack on cpu: NumPy and PyTorch share memory with gradcore tensors, both ways."""
import subprocess
import sys
import textwrap

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


# issue 22, item 4: a tensor with negative strides is never exported as such
# (PyTorch aborts the whole process on a capsule with negative strides)

def test_numpy_gets_a_buffer_error_naming_copy_for_negative_strides():
    t = gc.tensor([1.0, 2.0, 3.0])
    with pytest.raises(BufferError, match=r"negative strides.*t\[::-1\]\.copy\(\)"):
        np.from_dlpack(t[::-1])
    with pytest.raises(BufferError, match="negative strides"):
        t[::-1].__dlpack__(copy=False)
    # the fix the message names: a copy in memory of its own
    c = t[::-1].copy()
    a = np.from_dlpack(c)
    assert a.tolist() == [3.0, 2.0, 1.0] and a.strides == (4,)
    assert not np.shares_memory(a, t._data)
    # a consumer that asks for a copy gets a contiguous one
    b = np.from_dlpack(t[::-1], copy=True)
    assert b.tolist() == [3.0, 2.0, 1.0] and b.strides == (4,) and not np.shares_memory(b, t._data)
    # a 2-d view with one reversed axis too
    m = gc.tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(BufferError, match="negative strides"):
        np.from_dlpack(m[:, ::-1])


def test_torch_gets_a_buffer_error_for_negative_strides_and_the_process_lives():
    # in a subprocess: if the export ever regressed, PyTorch would abort the
    # process, which must be a failing test, not a crashed test run
    code = textwrap.dedent("""
        import numpy as np, torch, gradcore as gc
        t = gc.tensor([1.0, 2.0, 3.0])
        try:
            torch.from_dlpack(t[::-1])
        except BufferError as exc:
            assert ".copy()" in str(exc), exc
        else:
            raise SystemExit("no BufferError")
        u = torch.from_dlpack(t[::-1].copy())
        assert u.tolist() == [3.0, 2.0, 1.0] and u.stride() == (1,)
        print("alive")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "alive", proc.stderr[-2000:]


# issue 22, item 5: what gradcore's in-place updates do to shared memory
# (documented in gradcore/interop.py and docs/interop.md)

@pytest.mark.parametrize("update", ["setitem", "iadd"])
def test_an_in_place_update_gives_the_tensor_a_new_buffer(update):
    t = gc.tensor([1.0, 2.0, 3.0])
    u, a = torch.from_dlpack(t), np.from_dlpack(t)
    if update == "setitem":
        t[0] = 9.0
    else:
        t += 1.0
    expected = [9.0, 2.0, 3.0] if update == "setitem" else [2.0, 3.0, 4.0]
    assert t.numpy().tolist() == expected
    # the views exported before keep the old buffer and its values
    assert u.tolist() == [1.0, 2.0, 3.0] and a.tolist() == [1.0, 2.0, 3.0]
    assert not np.shares_memory(a, t._data)
    # exported again, the new buffer is shared
    v = torch.from_dlpack(t)
    v[1] = -1.0
    assert t.numpy()[1] == -1.0


def test_an_in_place_update_of_an_imported_tensor_leaves_the_producer_alone():
    x = torch.zeros(3)
    t = gc.from_dlpack(x)
    t += 1.0
    assert t.numpy().tolist() == [1.0, 1.0, 1.0] and x.tolist() == [0.0, 0.0, 0.0]
    x[0] = 7.0                         # the tensor no longer views x
    assert t.numpy()[0] == 1.0
    # writes through the other library into the shared buffer are seen
    y = torch.zeros(3)
    s = gc.from_dlpack(y)
    y[2] = 5.0
    assert s.numpy()[2] == 5.0
