"""The compiled launch path (gradcore/cuda/_launch.pyx): packing limits,
launch checks, dry runs, and the compiled elementwise launcher's fallback."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore import devices
from gradcore.cuda import _launch, pack_params
from gradcore.ops.elemwise import Elemwise


def test_too_many_kernel_arguments_are_refused():
    with pytest.raises(ValueError, match="more than 4096 bytes"):
        pack_params([np.int64(1)] * 513)
    assert len(pack_params([np.int64(1)] * 512)) == 4096


def test_invalid_launch_shapes_name_the_kernel(cuda):
    k = cuda.kernel(Elemwise("neg"), "float")
    x = cuda.to_device(np.ones(4, np.float32))
    y = cuda.empty((4,), np.float32)
    with pytest.raises(RuntimeError, match=r"gc_neg_float: invalid block \(2048, 1, 1\)"):
        cuda.launch(k, (1,), (2048,), x, 4, y, 4)
    with pytest.raises(RuntimeError, match="invalid grid"):
        cuda.launch(k, (1, 70000), (32,), x, 4, y, 4)


def test_a_dry_run_counts_launches_and_runs_nothing(cuda):
    x = cuda.to_device(np.ones(4, np.float32))
    k = cuda.kernel(Elemwise("neg"), "float")
    y = cuda.zeros((4,), np.float32)
    before = cuda.launcher.launches
    cuda.launcher.dry_run = True
    try:
        cuda.launch_n(k, 4, x, 4, y, 4)
    finally:
        cuda.launcher.dry_run = False
    assert cuda.launcher.launches == before + 1 and not y.get().any()
    cuda.launch_n(k, 4, x, 4, y, 4)
    np.testing.assert_array_equal(y.get(), -np.ones(4))


def test_the_compiled_elementwise_launcher_falls_back_for_casts_and_broadcasts(cuda):
    launcher = devices.kernel_for(Elemwise("add"), "cuda")
    assert isinstance(launcher.__self__, _launch.ElementwiseLauncher)     # its run method
    a = gc.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device="cuda")
    b = gc.Tensor(np.arange(3, dtype=np.float64), device="cuda")       # cast and broadcast: the op's launcher
    c = gc.Tensor(np.ones((2, 3), np.float32), device="cuda")          # the compiled case
    np.testing.assert_array_equal((a + b).numpy(), a.numpy() + b.numpy())
    np.testing.assert_array_equal((a + c).numpy(), a.numpy() + 1)
    assert (a + b).dtype == np.float64 and (a + c).dtype == np.float32


def test_launchers_are_rebound_when_the_backend_changes(cuda):
    from gradcore.cuda import runtime
    op = Elemwise("mul")
    first = devices.kernel_for(op, "cuda")
    runtime.use(cuda)                                      # publishes backend_changed
    again = devices.kernel_for(op, "cuda")
    assert again is not first
    x = gc.Tensor(np.full(3, 2.0, np.float32), device="cuda")
    np.testing.assert_array_equal(F.mul(x, x).numpy(), np.full(3, 4.0))


def test_a_tiny_op_forward_and_backward_is_two_launches_and_no_copies(cuda):
    # after warm-up: the forward kernel and ONE fused backward kernel; the
    # ones seed is cached on the device, nothing crosses to or from the host
    from gradcore.autodiff import GradManager
    x = gc.Tensor(np.ones(16, np.float32), device="cuda")
    a = gc.Tensor(np.full(16, 0.5, np.float32), device="cuda")
    gm = GradManager().attach([x, a])

    def step():
        with gm:
            gm.backward(x * a)
        x.grad = a.grad = None
    step()
    before, copies = cuda.launcher.launches, dict(cuda.copies)
    step()
    assert cuda.launcher.launches - before == 2
    assert cuda.copies == copies


def test_repeated_signatures_reuse_the_plan_and_new_ones_do_not_mix(cuda):
    # the last signature is kept by identity: a different shape or dtype
    # through the same launcher must get its own plan (and right values)
    op = Elemwise("mul")
    run = devices.kernel_for(op, "cuda")
    a = cuda.to_device(np.arange(4, dtype=np.float32))
    b = cuda.to_device(np.arange(6, dtype=np.float64).reshape(2, 3))
    np.testing.assert_array_equal(run(a, a).get(), np.arange(4) ** 2)
    np.testing.assert_array_equal(run(a, a).get(), np.arange(4) ** 2)
    out = run(b, b)
    assert out.shape == (2, 3) and out.dtype == np.float64
    np.testing.assert_array_equal(out.get(), np.arange(6).reshape(2, 3) ** 2)
    np.testing.assert_array_equal(run(a, a).get(), np.arange(4) ** 2)
