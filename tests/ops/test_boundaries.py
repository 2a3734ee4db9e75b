"""Gradients at boundaries and kinks where PyTorch picks a subgradient or a
convention: gradcore picks the same (clip's bounds, a norm at zero) and
accepts PyTorch's per-channel parameter shapes in batch_norm."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.testing import gradcheck, gradgradcheck


def test_clip_passes_the_gradient_at_its_bounds_like_torch(h, torch):
    x = np.array([-1.0, 0.0, 0.5, 1.0, 2.0, np.nan])
    _, grads, w = h.gc_vjp(lambda a: F.clip(a, 0.0, 1.0), [x], weight=np.ones(6))
    np.testing.assert_array_equal(grads[0], [0, 1, 1, 1, 0, 1])
    h.compare(torch, lambda a: F.clip(a, 0.0, 1.0), lambda a: torch.clamp(a, 0.0, 1.0), [x[:5]])


def test_clip_with_tensor_bounds_like_torch(h, torch, rng):
    x, lo, hi = rng.standard_normal(6), np.full(6, -0.3), np.full(6, 0.4)
    h.compare(torch, lambda a, b, c: F.clip(a, b, c), lambda a, b, c: torch.clamp(a, b, c), [x, lo, hi])


def test_clip_keeps_the_dtype_and_one_sided_bounds():
    x = gc.tensor(np.array([-2, 0, 3], np.int32))
    assert F.clip(x, lower=0).dtype == np.int32
    np.testing.assert_array_equal(F.clip(x, lower=0).numpy(), [0, 0, 3])
    np.testing.assert_array_equal(F.clip(x, upper=1).numpy(), [-2, 0, 1])


@pytest.mark.parametrize("axis", [None, 1])
def test_norm_of_a_zero_vector_has_zero_gradient_like_torch(axis, h, torch):
    x = np.zeros((2, 3))
    x[1] = [3.0, 0.0, -4.0]
    _, grads, _ = h.gc_vjp(lambda a: F.norm(a, axis=axis), [x])
    assert np.isfinite(grads[0]).all()
    tfn = (lambda a: torch.linalg.vector_norm(a)) if axis is None else (lambda a: torch.linalg.vector_norm(a, dim=1))
    h.compare(torch, lambda a: F.norm(a, axis=axis), tfn, [x])


def test_norm_first_and_second_order_away_from_zero(rng):
    x = rng.standard_normal((3, 4))
    assert gradcheck(lambda a: F.norm(a, axis=1), [x])
    assert gradgradcheck(lambda a: F.norm(a, axis=1), [x])


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_takes_per_channel_vectors_like_torch(training, rng, torch):
    x = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    w, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    rm, rv = rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 2, 3).astype(np.float32)
    ours = F.batch_norm(gc.tensor(x), None if training else gc.tensor(rm), None if training else gc.tensor(rv),
                        gc.tensor(w), gc.tensor(b), training=training)
    ref = torch.nn.functional.batch_norm(torch.tensor(x), None if training else torch.tensor(rm),
                                         None if training else torch.tensor(rv), torch.tensor(w), torch.tensor(b),
                                         training=training)
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
    # and MegEngine's (1, C, 1, 1) shapes give the same
    same = F.batch_norm(gc.tensor(x), None if training else gc.tensor(rm.reshape(1, 3, 1, 1)),
                        None if training else gc.tensor(rv.reshape(1, 3, 1, 1)), gc.tensor(w.reshape(1, 3, 1, 1)),
                        gc.tensor(b.reshape(1, 3, 1, 1)), training=training)
    np.testing.assert_allclose(same.numpy(), ours.numpy(), rtol=1e-6)
