"""The SVD op and F.svd: factors against NumPy's (LAPACK) up to the sign
convention (each column of U has its largest entry positive), tall, wide,
square, batched, full and reduced; gradients against float64 finite
differences to second order and against PyTorch's linalg.svd for
sign-invariant functions and for the factors themselves; the CUDA kernel
(one-sided Jacobi) on the host emulator against the cpu's, full matrices
and rank-deficient inputs included (their orthonormal completion)."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.core import NotDifferentiableError, apply
from gradcore.ops import SVD
from gradcore.testing import gradcheck, gradgradcheck

SHAPES = [(4, 3), (3, 5), (3, 3), (2, 4, 2), (1, 1), (6, 1), (1, 4)]


def _check_factors(x, u, s, vh, full):
    m, n = x.shape[-2:]
    k = min(m, n)
    assert u.shape == x.shape[:-2] + ((m, m) if full else (m, k)) and s.shape == x.shape[:-2] + (k,)
    assert vh.shape == x.shape[:-2] + ((n, n) if full else (k, n))
    np.testing.assert_allclose((u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :], x, atol=1e-10)
    np.testing.assert_allclose(np.swapaxes(u, -1, -2) @ u, np.broadcast_to(np.eye(u.shape[-1]), u.shape[:-2] +
                                                                          (u.shape[-1],) * 2), atol=1e-10)
    np.testing.assert_allclose(vh @ np.swapaxes(vh, -1, -2), np.broadcast_to(np.eye(vh.shape[-2]), vh.shape[:-2] +
                                                                             (vh.shape[-2],) * 2), atol=1e-10)
    assert np.all(np.diff(s, axis=-1) <= 0) and np.all(s >= 0)
    big = np.take_along_axis(u, np.abs(u).argmax(-2)[..., None, :], -2)
    assert np.all(big >= 0)


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_factors(shape, full, rng):
    x = rng.standard_normal(shape)
    u, s, vh = (t.numpy() for t in F.svd(gc.tensor(x), full_matrices=full))
    _check_factors(x, u, s, vh, full)
    np.testing.assert_allclose(s, np.linalg.svd(x, compute_uv=False), rtol=1e-12)


def test_rank_deficient_and_zero(rng):
    a = rng.standard_normal((5, 2))
    x = a @ rng.standard_normal((2, 4))           # rank 2
    _check_factors(x, *(t.numpy() for t in F.svd(gc.tensor(x), full_matrices=True)), True)
    _check_factors(np.zeros((3, 2)), *(t.numpy() for t in F.svd(gc.tensor(np.zeros((3, 2))))), False)


def test_megengine_shapes_and_errors():
    u, s, vh = F.svd(gc.tensor(np.random.default_rng(0).standard_normal((2, 7, 8, 3))))
    assert (u.shape, s.shape, vh.shape) == ((2, 7, 8, 3), (2, 7, 3), (2, 7, 3, 3))
    with pytest.raises(ValueError, match=r"svd: inp must have at least 2 dimensions"):
        F.svd(gc.tensor([1.0, 2.0]))


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 3, 3)])
def test_gradients_first_and_second_order(shape, rng):
    x = rng.standard_normal(shape)
    wu, ws, wv = (rng.standard_normal(t.shape) for t in F.svd(gc.tensor(x)))

    def f(a):
        u, s, vh = F.svd(a)
        return (u * gc.tensor(wu)).sum() + (s * gc.tensor(ws)).sum() + (vh * gc.tensor(wv)).sum() + (s ** 3).sum()
    gradcheck(f, [x], atol=1e-6)
    gradgradcheck(f, [x], atol=1e-5)


def test_gradients_match_torch(rng, torch):
    x = rng.standard_normal((2, 5, 3))
    wu, ws, wv = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 3)), rng.standard_normal((2, 3, 3))
    t = torch.tensor(x, requires_grad=True)
    tu, ts, tvh = torch.linalg.svd(t, full_matrices=False)
    # torch's own signs, then the same convention as gradcore's (a sign flip of a pair is a symmetry)
    flip = torch.sign(torch.gather(tu, -2, tu.abs().argmax(-2, keepdim=True)))
    tu, tvh = tu * flip, tvh * flip.transpose(-1, -2)
    ((tu * torch.tensor(wu)).sum() + (ts * torch.tensor(ws)).sum() + (tvh * torch.tensor(wv)).sum()).backward()
    gx = gc.tensor(x)
    gm = gc.GradManager().attach([gx])
    with gm:
        u, s, vh = F.svd(gx)
        gm.backward((u * gc.tensor(wu)).sum() + (s * gc.tensor(ws)).sum() + (vh * gc.tensor(wv)).sum())
    np.testing.assert_allclose(u.numpy(), tu.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(gx.grad.numpy(), t.grad.numpy(), rtol=1e-8, atol=1e-10)


def test_full_matrices_have_no_gradient_and_say_so(rng):
    x = gc.tensor(rng.standard_normal((3, 2)))
    gm = gc.GradManager().attach([x])
    with pytest.raises(NotDifferentiableError, match="full_matrices=True.*differentiate the reduced form"):
        with gm:
            gm.backward(F.svd(x, full_matrices=True)[1].sum())


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 3, 3), (5, 1)])
def test_cuda_kernel_matches_cpu(emulated_cuda, shape, full, rng):
    x = rng.standard_normal(shape)
    k = min(shape[-2:])
    ref = [t.numpy() for t in apply(SVD(full), gc.tensor(x))]
    got = [t.numpy() for t in apply(SVD(full), gc.tensor(x, device="cuda"))]
    # the vectors beyond K (full matrices) are any orthonormal completion: checked as such
    for r, g in zip((ref[0][..., :k], ref[1], ref[2][..., :k, :]), (got[0][..., :k], got[1], got[2][..., :k, :])):
        np.testing.assert_allclose(g, r, atol=1e-10)
    _check_factors(x, *got, full)
    deficient = rng.standard_normal((5, 2)) @ rng.standard_normal((2, 3))
    u, s, vh = (t.numpy() for t in apply(SVD(full), gc.tensor(deficient, device="cuda")))
    _check_factors(deficient, u, s, vh, full)
