"""gradcore.jvp / gradcore.vjp against torch.func on a sample of the op
library (float64), and composed with GradManager (Hessian-vector products)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from torch.func import jvp as torch_jvp, vjp as torch_vjp

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager

R = np.random.default_rng(0)


def _arr(*shape, positive=False):
    a = R.standard_normal(shape)
    return np.abs(a) + 0.5 if positive else a


# name: (gradcore fn, torch fn, input arrays)
CASES = {
    "exp": (F.exp, torch.exp, [_arr(3, 4)]),
    "sin_mul": (lambda x, y: F.sin(x) * y, lambda x, y: torch.sin(x) * y, [_arr(3, 4), _arr(3, 4)]),
    "div_broadcast": (lambda x, y: x / y, lambda x, y: x / y, [_arr(3, 4), _arr(4, positive=True)]),
    "pow": (lambda x, y: x ** y, lambda x, y: x ** y, [_arr(5, positive=True), _arr(5)]),
    "tanh_sigmoid": (lambda x: F.tanh(x) + F.sigmoid(x), lambda x: torch.tanh(x) + torch.sigmoid(x), [_arr(6)]),
    "relu": (F.relu, torch.relu, [_arr(4, 5)]),
    "log": (F.log, torch.log, [_arr(7, positive=True)]),
    "clip": (lambda x: F.clip(x, -0.5, 0.5), lambda x: torch.clamp(x, -0.5, 0.5), [_arr(10)]),
    "where": (lambda x, y: F.where(x > 0, x * y, y), lambda x, y: torch.where(x > 0, x * y, y),
              [_arr(8), _arr(8)]),
    "sum_axis": (lambda x: F.sum(x, axis=1), lambda x: x.sum(1), [_arr(3, 4, 2)]),
    "mean": (lambda x: F.mean(x * x), lambda x: (x * x).mean(), [_arr(3, 4)]),
    "max_axis": (lambda x: F.max(x, axis=0), lambda x: x.max(0).values, [_arr(5, 3)]),
    "var": (lambda x: F.var(x, axis=1), lambda x: x.var(1, unbiased=False), [_arr(3, 6)]),
    "logsumexp": (lambda x: F.logsumexp(x, axis=1), lambda x: torch.logsumexp(x, 1), [_arr(3, 6)]),
    "matmul": (F.matmul, torch.matmul, [_arr(3, 4), _arr(4, 5)]),
    "batched_matmul": (F.matmul, torch.matmul, [_arr(2, 3, 4), _arr(2, 4, 2)]),
    "reshape_transpose": (lambda x: F.transpose(F.reshape(x, (4, 3)), (1, 0)),
                          lambda x: x.reshape(4, 3).T, [_arr(2, 6)]),
    "concat_stack": (lambda x, y: F.stack([F.concat([x, y], axis=0), F.concat([y, x], axis=0)], axis=1),
                     lambda x, y: torch.stack([torch.cat([x, y]), torch.cat([y, x])], 1), [_arr(2, 3), _arr(2, 3)]),
    "broadcast_to": (lambda x: F.broadcast_to(x, (4, 3)), lambda x: x.expand(4, 3), [_arr(1, 3)]),
    "indexing": (lambda x: x[1:, ::2] * 2, lambda x: x[1:, ::2] * 2, [_arr(4, 5)]),
    "softmax": (lambda x: F.softmax(x, axis=-1), lambda x: torch.softmax(x, -1), [_arr(3, 5)]),
    "log_softmax": (lambda x: F.log_softmax(x, axis=1), lambda x: torch.log_softmax(x, 1), [_arr(3, 5)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b.reshape(1, 3, 1, 1), padding=1),
               lambda x, w, b: TF.conv2d(x, w, b, padding=1), [_arr(2, 2, 5, 5), _arr(3, 2, 3, 3), _arr(3)]),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), lambda x: TF.max_pool2d(x, 2), [_arr(1, 2, 4, 4)]),
    "two_outputs": (lambda x, y: (x * y, F.exp(x).sum()), lambda x, y: (x * y, torch.exp(x).sum()),
                    [_arr(3), _arr(3)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jvp_matches_torch(name):
    fn, tfn, arrays = CASES[name]
    tangents = [R.standard_normal(a.shape) for a in arrays]
    out, tan = gc.jvp(fn, tuple(gc.tensor(a, dtype="float64") for a in arrays),
                      tuple(gc.tensor(v, dtype="float64") for v in tangents))
    tout, ttan = torch_jvp(tfn, tuple(torch.tensor(a) for a in arrays), tuple(torch.tensor(v) for v in tangents))
    if isinstance(tout, torch.Tensor):
        out, tan, tout, ttan = (out,), (tan,), (tout,), (ttan,)
    assert len(out) == len(tout) and len(tan) == len(ttan)
    for o, t, to, tt in zip(out, tan, tout, ttan):
        np.testing.assert_allclose(o.numpy(), to.numpy(), rtol=1e-10, atol=1e-12)
        assert t.shape == o.shape and t.dtype == np.float64
        np.testing.assert_allclose(t.numpy(), tt.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["sin_mul", "matmul", "softmax", "conv2d", "two_outputs"])
def test_vjp_matches_torch(name):
    fn, tfn, arrays = CASES[name]
    out, vjp_fn = gc.vjp(fn, *[gc.tensor(a, dtype="float64") for a in arrays])
    tout, tvjp = torch_vjp(tfn, *[torch.tensor(a) for a in arrays])
    outs = (out,) if isinstance(out, gc.Tensor) else out
    cts = [R.standard_normal(o.shape) for o in outs]
    grads = vjp_fn(*[gc.tensor(c, dtype="float64") for c in cts])
    tgrads = tvjp(tuple(torch.tensor(c) for c in cts)) if len(cts) > 1 else tvjp(torch.tensor(cts[0]))
    assert len(grads) == len(arrays)
    for g, tg in zip(grads, tgrads):
        np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-9, atol=1e-12)
    with pytest.raises(RuntimeError, match="runs once"):
        vjp_fn(*[gc.tensor(c, dtype="float64") for c in cts])


def test_jvp_leaves_callers_tensors_alone_and_handles_unused_inputs():
    x, y = gc.tensor([1.0, 2.0], dtype="float64"), gc.tensor([3.0], dtype="float64")
    out, tan = gc.jvp(lambda x, y: x * 2, (x, y), (gc.ones_like(x), gc.ones_like(y)))
    np.testing.assert_array_equal(tan.numpy(), [2.0, 2.0])
    assert x.grad is None and y.grad is None
    _, tan = gc.jvp(lambda x: gc.tensor([5.0], dtype="float64"), (x,), (gc.ones_like(x),))   # constant
    np.testing.assert_array_equal(tan.numpy(), [0.0])
    (gx,) = gc.vjp(lambda x: gc.tensor(1.0) + 0 * 0, x)[1](gc.tensor(1.0))
    np.testing.assert_array_equal(gx.numpy(), [0.0, 0.0])


def test_jvp_argument_errors():
    x = gc.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="tangent 0 has shape \\(3,\\), its primal \\(2,\\)"):
        gc.jvp(F.exp, (x,), (gc.tensor([1.0, 2.0, 3.0]),))
    with pytest.raises(ValueError, match="1 primals but 2 tangents"):
        gc.jvp(F.exp, (x,), (x, x))
    with pytest.raises(TypeError, match="gradcore.jvp: primals must be Tensors"):
        gc.jvp(F.exp, ([1.0],), (x,))


def _loss(x):
    return (F.sin(x) * F.exp(x)).sum() + (x ** 3).sum()


def _torch_loss(x):
    return (torch.sin(x) * torch.exp(x)).sum() + (x ** 3).sum()


def test_hessian_vector_product_jvp_of_a_grad_manager_gradient():
    x0, v0 = R.standard_normal(5), R.standard_normal(5)

    def grad_fn(x):                     # the gradient, computed as any user would
        gm = GradManager().attach(x)
        with gm:
            gm.backward(_loss(x))
        return x.grad

    x = gc.tensor(x0, dtype="float64")
    g, hv = gc.jvp(grad_fn, (x,), (gc.tensor(v0, dtype="float64"),))
    tx = torch.tensor(x0)
    tg, thv = torch_jvp(torch.func.grad(_torch_loss), (tx,), (torch.tensor(v0),))
    np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-10)
    np.testing.assert_allclose(hv.numpy(), thv.numpy(), rtol=1e-9)
    assert x.grad is None


def test_grad_manager_differentiates_through_jvp_and_vjp():
    # d/dx of <J(x) v, w> for f = sin(x) * x: a GradManager around jvp
    x0, v0, w0 = R.standard_normal(4), R.standard_normal(4), R.standard_normal(4)
    x = gc.tensor(x0, dtype="float64")
    gm = GradManager().attach(x)
    with gm:
        _, tan = gc.jvp(lambda x: F.sin(x) * x, (x,), (gc.tensor(v0, dtype="float64"),))
        gm.backward((tan * gc.tensor(w0, dtype="float64")).sum())
    tx = torch.tensor(x0, requires_grad=True)
    _, ttan = torch_jvp(lambda x: torch.sin(x) * x, (tx,), (torch.tensor(v0),))
    (ttan * torch.tensor(w0)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-9)
    # and around vjp: the HVP as the gradient of a vjp
    x2 = gc.tensor(x0, dtype="float64")
    gm2 = GradManager().attach(x2)
    with gm2:
        _, vjp_fn = gc.vjp(_loss, x2)
        (g,) = vjp_fn(gc.tensor(1.0, dtype="float64"))
        gm2.backward((g * gc.tensor(v0, dtype="float64")).sum())
    _, thv = torch_jvp(torch.func.grad(_torch_loss), (torch.tensor(x0),), (torch.tensor(v0),))
    np.testing.assert_allclose(x2.grad.numpy(), thv.numpy(), rtol=1e-9)
