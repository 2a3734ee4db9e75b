"""gradcore.to_torch and gradcore.from_torch: gradcore ops as PyTorch
functions differentiable to any order, PyTorch functions as gradcore ops;
values and gradients against PyTorch's own and finite differences."""
import gc as pygc

import numpy as np
import pytest
import torch

import gradcore
import gradcore.functional as F
from gradcore import registry
from gradcore._core import _recording_keys
from gradcore.autodiff import GradManager
from gradcore.core import NotDifferentiableError, apply
from gradcore.op import Op, OpError
from gradcore.ops import Elemwise, Identity, MatrixMul
from gradcore.testing import gradcheck as gc_gradcheck, gradgradcheck as gc_gradgradcheck


class Cube(Op):
    name = "InteropCube"

    def infer(self, x):
        if x.dtype.kind != "f":
            raise self.error(f"needs a floating-point input, got {x.dtype}", x)
        return (x,)

    def cpu(self, x):
        return x * x * x

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (g * 3 * x * x,)


class SeeBuffers(Op):
    """Records the addresses of the arrays its kernel sees and returns."""
    name = "InteropSeeBuffers"
    seen = []

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        y = x * 2
        SeeBuffers.seen.append((x.__array_interface__["data"][0], x.strides, y.ctypes.data))
        return y

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 2,)


class NoGrad(Op):
    name = "InteropNoGrad"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return np.floor(x)


class BadBackward(Op):
    name = "InteropBadBackward"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x + 1

    def _grad_rule(self, x):
        y = gradcore.Tensor(x.numpy() + 1)

        def backward(dy):
            raise OpError("InteropBadBackward: backward refuses (input shapes: (3,))")
        return y, backward


def f64(*shape, seed=0, requires_grad=True):
    t = torch.from_numpy(np.random.default_rng(seed).uniform(-1.5, 1.5, shape))
    return t.requires_grad_(requires_grad)


# ---------------------------------------------------------------- values and gradients

def test_op_instance_and_class_values_and_gradients_match_torch():
    for target in (Cube(), Cube):
        f = gradcore.to_torch(target)
        x = f64(2, 3)
        y = f(x)
        assert isinstance(y, torch.Tensor) and y.dtype == torch.float64 and y.shape == (2, 3)
        torch.testing.assert_close(y, x ** 3)
        (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
        torch.testing.assert_close(g, 3 * x.detach() ** 2)
    assert gradcore.to_torch(Cube()) is gradcore.to_torch(Cube)        # equal ops: one function
    assert gradcore.interop.to_torch is gradcore.to_torch


def test_gradcheck_gradgradcheck_and_third_order():
    f = gradcore.to_torch(Cube)
    x = f64(5)
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))
    (g1,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    (g2,) = torch.autograd.grad(g1.sum(), x, create_graph=True)
    (g3,) = torch.autograd.grad(g2.sum(), x)
    torch.testing.assert_close(g2, 6 * x.detach())
    torch.testing.assert_close(g3, torch.full_like(x, 6.0))


@pytest.mark.parametrize("mode,ref", [("tanh", torch.tanh), ("exp", torch.exp), ("sin", torch.sin),
                                      ("sigmoid", torch.sigmoid)])
def test_standard_unary_ops_against_torch(mode, ref):
    f = gradcore.to_torch(Elemwise(mode))
    x = f64(3, 4, seed=1)
    xr = x.detach().clone().requires_grad_()
    gy = f64(3, 4, seed=2, requires_grad=False)
    torch.testing.assert_close(f(x), ref(xr))
    # first and second order, against PyTorch's own derivatives
    (g,) = torch.autograd.grad(f(x), x, gy, create_graph=True)
    (gr,) = torch.autograd.grad(ref(xr), xr, gy, create_graph=True)
    torch.testing.assert_close(g, gr)
    torch.testing.assert_close(torch.autograd.grad(g.sum(), x)[0], torch.autograd.grad(gr.sum(), xr)[0])
    assert torch.autograd.gradgradcheck(f, (x,))


def test_binary_op_with_broadcasting_and_matmul():
    mul = gradcore.to_torch(Elemwise("mul"))
    a, b = f64(3, 4, seed=3), f64(4, seed=4)
    torch.testing.assert_close(mul(a, b), a * b)
    ga, gb = torch.autograd.grad(mul(a, b).sum(), (a, b))
    torch.testing.assert_close(ga, b.detach().expand(3, 4))
    torch.testing.assert_close(gb, a.detach().sum(0))
    assert torch.autograd.gradcheck(mul, (a, b)) and torch.autograd.gradgradcheck(mul, (a, b))
    mm = gradcore.to_torch(MatrixMul())
    p, q = f64(2, 3, seed=5), f64(3, 4, seed=6)
    torch.testing.assert_close(mm(p, q), p @ q)
    assert torch.autograd.gradcheck(mm, (p, q)) and torch.autograd.gradgradcheck(mm, (p, q))


def test_only_inputs_that_require_grad_get_one():
    mul = gradcore.to_torch(Elemwise("mul"))
    a, b = f64(3, seed=1), f64(3, seed=2, requires_grad=False)
    y = mul(a, b)
    y.sum().backward()
    torch.testing.assert_close(a.grad, b)
    assert b.grad is None


def test_function_of_gradcore_tensors_with_several_outputs_and_arguments():
    def fn(a, b, scale, axis=-1):
        h = F.matmul(a, b) * scale
        return F.softmax(h, axis=axis), (h * h).sum()

    f = gradcore.to_torch(fn)
    a, b = f64(2, 3, seed=7), f64(3, 4, seed=8)
    p, s = f(a, b, 0.5, axis=0)
    h = (a @ b) * 0.5
    torch.testing.assert_close(p, torch.softmax(h, 0))
    torch.testing.assert_close(s, (h * h).sum())
    assert f.__name__ == "fn" and f.op is None and f.custom_op is None
    run = lambda a, b: f(a, b, 0.5, axis=0)
    assert torch.autograd.gradcheck(run, (a, b))
    assert torch.autograd.gradgradcheck(run, (a, b))
    # one output's gradient alone (the other output unused)
    (ga,) = torch.autograd.grad(f(a, b, 0.5)[1], a)
    ar = a.detach().clone().requires_grad_()
    (gr,) = torch.autograd.grad((((ar @ b) * 0.5) ** 2).sum(), ar)
    torch.testing.assert_close(ga, gr)


def test_against_gradcore_own_gradient_and_finite_differences_float32():
    f = gradcore.to_torch(lambda x: F.log(F.exp(x) + 1) * x)
    x = torch.linspace(-2, 2, 7, requires_grad=True)
    f(x).sum().backward()
    t = gradcore.tensor(x.detach().numpy())
    gm = GradManager().attach([t])
    with gm:
        gm.backward((F.log(F.exp(t) + 1) * t).sum())
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-6)
    assert x.grad.dtype == torch.float32


def test_backward_twice_with_retain_graph():
    f = gradcore.to_torch(Cube)
    x = f64(4)
    y = f(x).sum()
    (g1,) = torch.autograd.grad(y, x, retain_graph=True)
    (g2,) = torch.autograd.grad(y, x)
    torch.testing.assert_close(g1, g2)
    torch.testing.assert_close(g1, 3 * x.detach() ** 2)


def test_non_float_outputs_are_not_differentiable():
    f = gradcore.to_torch(lambda x: (x * 2, x > 0))
    x = f64(4)
    y, pos = f(x)
    assert pos.dtype == torch.bool and not pos.requires_grad and y.requires_grad
    torch.testing.assert_close(pos, x.detach() > 0)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    ints = gradcore.to_torch(Elemwise("add"))(torch.arange(3), torch.arange(3))
    assert ints.dtype == torch.int64 and ints.tolist() == [0, 2, 4]


def test_no_grad_and_inputs_without_grad():
    f = gradcore.to_torch(Cube)
    x = f64(3)
    with torch.no_grad():
        y = f(x)
    assert not y.requires_grad and y.grad_fn is None
    y2 = f(x.detach())
    assert not y2.requires_grad
    torch.testing.assert_close(y, y2)


def test_dtypes_are_kept():
    f = gradcore.to_torch(Cube)
    for dt in (torch.float32, torch.float64, torch.float16):
        x = torch.tensor([0.5, 2.0], dtype=dt)
        assert f(x).dtype == dt
    x32 = torch.tensor([0.5, 2.0], requires_grad=True)
    f(x32).sum().backward()
    assert x32.grad.dtype == torch.float32


# ---------------------------------------------------------------- memory

def test_zero_copy_both_ways():
    f = gradcore.to_torch(SeeBuffers)
    SeeBuffers.seen.clear()
    x = torch.arange(12.0).reshape(3, 4)
    y = f(x)
    (x_addr, _, y_addr), = SeeBuffers.seen
    assert x_addr == x.data_ptr()                  # the kernel saw PyTorch's buffer
    assert y.data_ptr() == y_addr                  # and PyTorch sees the kernel's
    # a strided view: no copy either, the kernel gets the strides
    SeeBuffers.seen.clear()
    xt = x.T
    yt = f(xt)
    (x_addr, strides, _), = SeeBuffers.seen
    assert x_addr == xt.data_ptr() and strides == (4, 16)        # float32 (3, 4).T: byte strides
    torch.testing.assert_close(yt, xt * 2)
    # with grad: the same
    SeeBuffers.seen.clear()
    xg = torch.arange(4.0, requires_grad=True)
    yg = f(xg)
    (x_addr, _, y_addr), = SeeBuffers.seen
    assert x_addr == xg.data_ptr() and yg.data_ptr() == y_addr
    yg.sum().backward()
    torch.testing.assert_close(xg.grad, torch.full((4,), 2.0))


def test_outputs_never_alias_inputs():
    ident = gradcore.to_torch(Identity())
    x = torch.arange(4.0, requires_grad=True)
    y = ident(x)
    assert y.data_ptr() != x.data_ptr()
    torch.testing.assert_close(y, x)
    with torch.no_grad():
        y.add_(1)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
    # two outputs that are one gradcore tensor are two torch tensors of their own
    both = gradcore.to_torch(lambda a: (a * 2, a * 2))
    u, v = both(x)
    y2 = gradcore.to_torch(lambda a: (lambda t: (t, t))(a * 2))(x)
    assert y2[0].data_ptr() != y2[1].data_ptr()
    (u.sum() + v.sum()).backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 4.0))


def test_gradients_that_are_one_tensor_are_accumulated_correctly():
    # add's backward hands the same gradient to both inputs: torch must not
    # accumulate in place into a buffer the other gradient shares
    add = gradcore.to_torch(Elemwise("add"))
    x = torch.ones(3, requires_grad=True)
    y = add(x, x)
    (g,) = torch.autograd.grad(y, x, torch.full((3,), 0.5))
    torch.testing.assert_close(g, torch.ones(3))
    ident = gradcore.to_torch(Identity())
    z = ident(x) + ident(x) * 2
    (g,) = torch.autograd.grad(z.sum(), x)
    torch.testing.assert_close(g, torch.full((3,), 3.0))


def test_in_place_change_of_a_saved_tensor_is_caught_by_torch():
    f = gradcore.to_torch(Cube)
    x = f64(3)
    xc = x.clone()
    y = f(xc)
    with torch.no_grad():
        xc.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    y = f(x)
    y.add_(1)                      # the output, saved for backward too
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_no_recording_stays_open():
    f = gradcore.to_torch(Cube)
    before = len(_recording_keys())
    x = f64(3)
    for _ in range(3):
        f(x)                      # forward only, result dropped
    ys = [f(x) for _ in range(3)]
    assert len(_recording_keys()) >= before     # (while their results live)
    ys[0].sum().backward()
    del ys
    pygc.collect()
    assert len(_recording_keys()) == before


# ---------------------------------------------------------------- errors

def test_errors_from_gradcore_surface_unchanged():
    mm = gradcore.to_torch(MatrixMul())
    with pytest.raises(OpError, match=r"MatrixMul.*\(2, 3\).*\(2, 3\)") as info:
        mm(torch.ones(2, 3, requires_grad=True), torch.ones(2, 3))
    native = pytest.raises(OpError)
    with native as ninfo:
        apply(MatrixMul(), gradcore.tensor(np.ones((2, 3))), gradcore.tensor(np.ones((2, 3))))
    assert str(info.value) == str(ninfo.value)
    with pytest.raises(OpError, match="InteropCube: needs a floating-point input"):
        gradcore.to_torch(Cube)(torch.arange(3))


def test_error_in_backward_surfaces_unchanged():
    f = gradcore.to_torch(BadBackward)
    y = f(torch.ones(3, requires_grad=True))
    with pytest.raises(OpError, match="InteropBadBackward: backward refuses"):
        y.sum().backward()


def test_not_differentiable_op_runs_forward_and_backward_says_why():
    f = gradcore.to_torch(NoGrad)
    x = torch.tensor([0.5, 1.5], requires_grad=True)
    y = f(x)
    assert y.tolist() == [0.0, 1.0]
    with pytest.raises(NotDifferentiableError, match="InteropNoGrad"):
        y.sum().backward()


def test_bad_arguments():
    with pytest.raises(TypeError, match=r"to_torch\(InteropCube\): argument 0 is a ndarray"):
        gradcore.to_torch(Cube)(np.ones(3))
    with pytest.raises(TypeError, match=r"to_torch\(InteropCube\).*bfloat16"):
        gradcore.to_torch(Cube)(torch.ones(3, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"to_torch\(InteropCube\): an op takes tensors only.*scale"):
        gradcore.to_torch(Cube)(torch.ones(3), scale=2.0)
    with pytest.raises(TypeError, match=r"to_torch: expected a gradcore op.*int"):
        gradcore.to_torch(3)

    class NeedsArg(Cube):
        name = "InteropNeedsArg"

        def __init__(self, k):
            self.k = k
    with pytest.raises(TypeError, match=r"to_torch\(NeedsArg\): the op class cannot be built"):
        gradcore.to_torch(NeedsArg)
    with pytest.raises(TypeError, match=r"to_torch\(<lambda>\): returned a float"):
        gradcore.to_torch(lambda x: 1.0)(torch.ones(2))


# ---------------------------------------------------------------- custom op, compile, profiler

def test_registered_as_a_torch_library_custom_op():
    f = gradcore.to_torch(Cube)
    cop = f.custom_op
    assert cop is not None and "gradcore::InteropCube" in str(cop)
    x = f64(2, 3)
    (y,) = cop([x])
    torch.testing.assert_close(y, x ** 3)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    torch.testing.assert_close(g, 3 * x.detach() ** 2)
    (gg,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(gg, 6 * x.detach())
    # PyTorch's own checks of a custom op: schema, fake (shape) function, autograd registration
    torch.library.opcheck(cop, ([x],), test_utils=("test_schema", "test_faketensor",
                                                   "test_autograd_registration"))


def test_torch_compile_op_without_graph_break_and_function_with_one():
    f = gradcore.to_torch(Cube)

    def model(x, w):
        return (f(x * w) + 1).sum()

    x, w = f64(4, 3, seed=1), f64(3, seed=2)
    ref = model(x, w)
    gref = torch.autograd.grad(ref, (x, w))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)     # no graph break
    out = compiled(x, w)
    torch.testing.assert_close(out, ref)
    for g, r in zip(torch.autograd.grad(out, (x, w)), gref):
        torch.testing.assert_close(g, r)
    # a plain function cannot say its output shapes without running: a graph break, same result
    fn = gradcore.to_torch(lambda a: F.tanh(a) * a)
    model2 = lambda x: fn(x * 2).sum()
    out2 = torch.compile(model2, backend="aot_eager")(x)
    torch.testing.assert_close(out2, model2(x))
    torch.testing.assert_close(torch.autograd.grad(out2, x)[0], torch.autograd.grad(model2(x), x)[0])


@pytest.mark.slow
def test_torch_compile_inductor():
    f = gradcore.to_torch(Cube)
    model = lambda x: (f(x) * 2).sum()
    x = f64(5)
    torch._dynamo.reset()
    out = torch.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(out, model(x))
    torch.testing.assert_close(torch.autograd.grad(out, x)[0], 6 * x.detach() ** 2)


def test_appears_in_the_profiler():
    f = gradcore.to_torch(Cube)
    x = f64(3)
    with torch.profiler.profile() as prof:
        y = f(x)
        y.sum().backward()
    names = [e.key for e in prof.key_averages()]
    assert any(n.startswith("gradcore::InteropCube") for n in names), names
    torch.testing.assert_close(x.grad, 3 * x.detach() ** 2)
    fn = gradcore.to_torch(lambda a: a * 2, name="doubler")
    with torch.profiler.profile() as prof:
        fn(x)
    assert "doubler" in [e.key for e in prof.key_averages()]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for PyTorch here")
def test_cuda_zero_copy_and_gradients():     # pragma: no cover - runs where a GPU is
    f = gradcore.to_torch(Cube)
    x = torch.linspace(-1, 1, 8, device="cuda", dtype=torch.float64, requires_grad=True)
    y = f(x)
    assert y.device.type == "cuda"
    torch.testing.assert_close(y, x ** 3)
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, 3 * x.detach() ** 2)


# ---------------------------------------------------------------- torch.nn

def test_inside_a_module_trained_by_a_torch_optimizer():
    cube = gradcore.to_torch(Cube)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 1, dtype=torch.float64)

        def forward(self, x):
            return cube(self.lin(x))

    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    x = f64(16, 3, requires_grad=False)
    target = (x @ torch.tensor([[0.3], [-0.2], [0.1]], dtype=torch.float64)) ** 3
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = ((net(x) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


# ---------------------------------------------------------------- from_torch

def test_from_torch_values_gradients_and_second_order():
    softplus = gradcore.from_torch(torch.nn.functional.softplus)
    assert softplus == gradcore.from_torch(torch.nn.functional.softplus)
    assert "from_torch(softplus)" in repr(softplus)
    x = gradcore.tensor([0.3, -1.2, 2.0], dtype="float64")
    gm = GradManager().attach([x])
    with gm:
        y = softplus(x)
        gm.backward(y.sum())
    xt = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    np.testing.assert_allclose(y.numpy(), torch.nn.functional.softplus(xt).numpy())
    np.testing.assert_allclose(x.grad.numpy(), torch.sigmoid(xt).numpy())
    run = lambda t: softplus(t)
    assert gc_gradcheck(run, [x]) and gc_gradgradcheck(run, [x])


def test_from_torch_several_inputs_and_outputs():
    fn = gradcore.from_torch(lambda a, b: (a @ b, (a * a).sum()), name="mm_and_norm")
    a = gradcore.tensor(np.random.default_rng(0).uniform(-1, 1, (2, 3)))
    b = gradcore.tensor(np.random.default_rng(1).uniform(-1, 1, (3, 4)))
    p, s = fn(a, b)
    np.testing.assert_allclose(p.numpy(), a.numpy() @ b.numpy())
    assert gc_gradcheck(lambda a, b: fn(a, b), [a, b])
    assert gc_gradgradcheck(lambda a, b: fn(a, b)[0] * fn(a, b)[1], [a, b])
    # only the second output used: b gets a zero gradient
    gm = GradManager().attach([a, b])
    with gm:
        gm.backward(fn(a, b)[1])
    np.testing.assert_allclose(a.grad.numpy(), 2 * a.numpy())
    np.testing.assert_allclose(b.grad.numpy(), 0 * b.numpy())


def test_from_torch_shares_memory():
    seen = []

    def fn(x):
        seen.append(x.data_ptr())
        return x * 2

    op = gradcore.from_torch(fn)
    x = gradcore.tensor([1.0, 2.0, 3.0])
    y = op(x)
    assert seen == [x._data.ctypes.data]
    assert y.numpy().tolist() == [2.0, 4.0, 6.0]
    z = gradcore.from_torch(lambda t: t)(x)             # an output that is the input: a copy
    assert z._data.ctypes.data != x._data.ctypes.data and z.numpy().tolist() == [1.0, 2.0, 3.0]


def test_from_torch_errors_name_the_op():
    mm = gradcore.from_torch(lambda a, b: a @ b, name="my_mm")
    with pytest.raises(RuntimeError, match=r"my_mm.*\(2, 3\), \(2, 3\)"):
        mm(gradcore.tensor(np.ones((2, 3))), gradcore.tensor(np.ones((2, 3))))
    with pytest.raises(TypeError, match=r"from_torch\(bad\): the function must return torch Tensors"):
        gradcore.from_torch(lambda x: 3, name="bad")(gradcore.tensor([1.0]))
    with pytest.raises(TypeError, match="from_torch: expected a function"):
        gradcore.from_torch(3)


def test_round_trips():
    # a PyTorch function through gradcore and back, differentiated twice by torch
    there_and_back = gradcore.to_torch(gradcore.from_torch(torch.tanh))
    x = f64(4)
    torch.testing.assert_close(there_and_back(x), torch.tanh(x))
    assert torch.autograd.gradcheck(there_and_back, (x,))
    assert torch.autograd.gradgradcheck(there_and_back, (x,))
    # a gradcore op through PyTorch and back, differentiated twice by gradcore
    back = gradcore.from_torch(gradcore.to_torch(Cube))
    t = gradcore.tensor([0.5, -1.0, 2.0], dtype="float64")
    np.testing.assert_allclose(back(t).numpy(), t.numpy() ** 3)
    assert gc_gradcheck(lambda t: back(t), [t]) and gc_gradgradcheck(lambda t: back(t), [t])


def test_mixed_model_gradcore_and_torch_parts():
    # gradcore model code calling a PyTorch layer norm, trained with gradcore's optimizer
    norm = gradcore.from_torch(lambda h: torch.nn.functional.layer_norm(h, h.shape[-1:]), name="layer_norm")
    w = gradcore.Parameter(np.random.default_rng(0).uniform(-1, 1, (3, 4)).astype(np.float32))
    x = gradcore.tensor(np.random.default_rng(1).uniform(-1, 1, (8, 3)).astype(np.float32))
    target = gradcore.tensor(np.random.default_rng(2).uniform(-1, 1, (8, 4)).astype(np.float32))
    opt = gradcore.optimizer.SGD([w], lr=0.1)
    gm = GradManager().attach([w])
    losses = []
    for _ in range(20):
        with gm:
            loss = ((norm(F.matmul(x, w)) - target) ** 2).mean()
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(float(loss.item()))
    assert losses[-1] < losses[0]


# ---------------------------------------------------------------- gradcore check --torch

class DriftsUnderTorch(Op):
    """Computes something else when its input is not its own memory: the
    kind of bug ``gradcore check --torch`` exists to catch."""
    name = "InteropDrifts"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * (3 if x.flags.owndata or x.base is None else 2)

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 3,)

    @classmethod
    def examples(cls):
        return [(cls(), [np.linspace(-1, 1, 6)])]


def test_check_torch_passes_good_ops_and_catches_a_bad_one():
    from gradcore.interop import check_torch
    good = check_torch(Cube)
    assert good.ok and good.status("torch values") == "passed" and good.status("torch grad") == "passed"
    bad = check_torch(DriftsUnderTorch)
    assert not bad.ok and bad.status("torch values") == "failed"
    assert "worst element" in bad["torch values"].message
    assert check_torch(NoGrad).status("torch grad") == "not applicable"


def test_cli_check_torch(capsys):
    from gradcore import cli
    with registry.preserved():
        registry.register_op(Cube)
        registry.register_op(DriftsUnderTorch)
        dist = next(e.dist for e in registry.entries() if e.name == "InteropCube")
        code = cli.main(["check", "--torch", dist])
        out = capsys.readouterr().out
    assert code == 1, out                          # DriftsUnderTorch fails
    assert any(l.startswith("InteropCube ") and "torch grad" in l and "passed" in l for l in out.splitlines())
    assert any(l.startswith("InteropDrifts ") and "torch values" in l and "failed" in l
               for l in out.splitlines())
    assert "compared with their PyTorch form" in out
    assert cli.main(["check", "--help"]) == 0 and "--torch" in capsys.readouterr().out


def test_benchmark_runs(tmp_path):
    """benchmarks/bench_torch_interop.py --quick: it runs and reports every
    figure (a smoke test: no timing is asserted)."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_torch_interop.py"
    out = subprocess.run([sys.executable, str(script), "--quick", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    for table in ("forward+backward", "forward (no_grad)"):
        assert set(res["results"][table]) == {"hand", "custom_op", "gradcore"}
        assert all(r["median_us"] > 0 for r in res["results"][table].values())
    assert "target (forward+backward)" in out.stdout
