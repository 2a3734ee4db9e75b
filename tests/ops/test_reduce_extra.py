"""argmax, argmin and cumsum: values against NumPy/torch, cumsum's gradients
first and second order, errors, CUDA sources compile."""

import numpy as np
import pytest

import gradcore
import gradcore.functional as F
from gradcore.ops.reduce import ArgReduce, CumSum
from gradcore.testing import gradcheck, gradgradcheck


@pytest.mark.parametrize("shape, axis, keepdims", [((5,), None, False), ((2, 3), 1, False), ((2, 3), 0, True),
                                                  ((2, 3, 4), -1, False), ((1,), 0, False), ((3, 4), None, True)])
def test_argmax_argmin_match_numpy_and_torch(shape, axis, keepdims, torch):
    x = np.random.default_rng(0).permutation(int(np.prod(shape))).reshape(shape).astype("float32")
    for name in ("argmax", "argmin"):
        got = getattr(F, name)(gradcore.Tensor(x), axis, keepdims)
        ref = getattr(np, name)(x, axis=axis, keepdims=keepdims)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got.numpy(), ref)
        if axis is not None:
            t = getattr(torch, name)(torch.tensor(x), dim=axis, keepdim=keepdims)
            np.testing.assert_array_equal(got.numpy(), t.numpy())


def test_argmax_has_no_gradient_and_rejects_empty():
    x = gradcore.Tensor(np.array([1.0, 3.0, 2.0]))
    gm = gradcore.GradManager().attach(x)
    with gm:
        i = F.argmax(x)
        assert not i._is_recorded()
        gm.backward((x * 2).sum())
    with pytest.raises(ValueError, match=r"ArgReduce.*\(0, 3\)"):
        F.argmax(gradcore.Tensor(np.zeros((0, 3))), 0)


@pytest.mark.parametrize("shape, axis", [((5,), 0), ((2, 3), 1), ((2, 3), -2), ((1, 4), 0), ((0, 3), 1)])
def test_cumsum_values_and_gradients(shape, axis, torch):
    x = np.random.default_rng(1).normal(size=shape)
    np.testing.assert_allclose(F.cumsum(gradcore.Tensor(x), axis).numpy(), np.cumsum(x, axis))
    tx = torch.tensor(x, requires_grad=True)
    w = np.random.default_rng(2).normal(size=shape)
    (torch.cumsum(tx, axis) * torch.tensor(w)).sum().backward()
    gx = gradcore.Tensor(x)
    gm = gradcore.GradManager().attach(gx)
    with gm:
        gm.backward((F.cumsum(gx, axis) * gradcore.Tensor(w)).sum())
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy())
    assert gradcheck(lambda t: F.cumsum(t, axis), [x])
    assert gradgradcheck(lambda t: F.cumsum(t * t, axis), [x])


def test_cumsum_bad_axis_names_op_and_shape():
    with pytest.raises(ValueError, match=r"CumSum.*axis 2.*\(2, 3\)"):
        F.cumsum(gradcore.Tensor(np.ones((2, 3))), 2)


def test_cuda_sources_compile(nvcc_ptx):
    ops = [ArgReduce("argmax", 0), ArgReduce("argmin", 0), CumSum(0), CumSum(0, True)]
    ptx = nvcc_ptx("\n".join(op.cuda_source(t) for op in ops for t in ("float", "double")))
    for name in ("argmax", "argmin", "cumsum", "cumsum_rev"):
        assert f"gc_{name}_float" in ptx and f"gc_{name}_double" in ptx
