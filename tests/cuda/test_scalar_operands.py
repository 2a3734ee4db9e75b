"""Python-scalar operands on cuda (issue 25, item 4): the backend's registered
constants, read expanded by the fused backward; values and gradients as on
the cpu, to second order."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager


@pytest.mark.parametrize("form", [
    lambda x: x * 0.5, lambda x: 0.5 * x, lambda x: 1 - x, lambda x: x / 2, lambda x: x ** 2,
    lambda x: F.maximum(x, 0.0), lambda x: F.sum((x * 1.5 - 2) ** 2 / 3),
])
def test_scalar_forms_match_cpu(cuda, matches_cpu, form):
    x = np.array([[1.5, -2.0, 0.25], [3.0, -0.5, 2.0]], np.float32)
    matches_cpu(form, [x])


def test_the_fused_backward_reads_the_expanded_constant(cuda):
    x = gc.Parameter(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), device="cuda")
    gm = GradManager().attach([x])
    for _ in range(3):
        x.grad = None
        with gm:
            gm.backward(F.sum(x * 0.75 * 2.0))
        np.testing.assert_allclose(x.grad.numpy(), np.full((3, 4), 1.5, np.float32))
    expanded = getattr(cuda, "_expanded", None)
    if expanded is not None:
        assert any(key[1] == (3, 4) for key in expanded)
