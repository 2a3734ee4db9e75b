"""Anomaly mode checks cuda gradients too (on the host: a debugging mode)."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import AnomalyError, GradManager, detect_anomaly


def test_inf_in_a_cuda_backward_is_caught(cuda):
    x = gc.tensor([0.0, 1.0], device="cuda")
    gm = GradManager().attach(x)
    with detect_anomaly(), gm:
        y = F.sqrt(x)
        with pytest.raises(AnomalyError, match=r"Elemwise\(sqrt\): its backward returned inf") as info:
            gm.backward(y.sum())
    assert "y = F.sqrt(x)" in str(info.value)
    finite = gc.tensor([1.0, 4.0], device="cuda")
    gm = GradManager().attach(finite)
    with detect_anomaly(), gm:
        gm.backward(F.sqrt(finite).sum())
    np.testing.assert_allclose(finite.grad.numpy(), [0.5, 0.25])
