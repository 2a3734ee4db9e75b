"""GradManager, Grad and Function: MegEngine's autodiff semantics."""
import copy
import gc as pygc
import weakref

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore import _core
from gradcore.autodiff import Function, GradManager
from gradcore.core import Grad


def test_basic_record_and_release():
    x = gc.tensor([1.0, 3.0, 5.0]).reshape(1, 3)
    w = gc.tensor([2.0, 4.0, 6.0]).reshape(3, 1)
    b = gc.tensor(-1.0)
    gm = GradManager().attach([w, b])
    gm.record()
    y = F.matmul(x, w) + b
    gm.backward(y)
    gm.release()
    np.testing.assert_equal(w.grad.numpy(), [[1], [3], [5]])
    np.testing.assert_equal(b.grad.numpy(), 1)
    w.grad = b.grad = None
    with gm:
        gm.backward(F.matmul(x, w) + b)
    np.testing.assert_equal(w.grad.numpy(), [[1], [3], [5]])


def test_attach_returns_self_and_lists_tensors():
    a, b = gc.tensor([1.0]), gc.tensor([2.0])
    gm = GradManager()
    assert gm.attach(a) is gm
    gm.attach([b, a])
    assert gm.attached_tensors() == [a, b] or [id(t) for t in gm.attached_tensors()] == [id(a), id(b)]


def test_dy_and_accumulation():
    x = gc.tensor([1.0, 2.0])
    gm = GradManager().attach(x)
    with gm:
        gm.backward(x * x, gc.tensor([1.0, 10.0]))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 40.0])
    with gm:
        gm.backward(x * 3)
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 43.0])


def test_callbacks_chain_in_order():
    x = gc.tensor([1.0, 2.0])
    seen = []

    def double(t, g):
        assert t is x
        seen.append("double")
        return g * 2

    def plus_one(t, g):
        seen.append("plus_one")
        return g + 1

    gm = GradManager().attach(x, callbacks=[double]).attach(x, callbacks=plus_one)
    with gm:
        gm.backward((x * x).sum())
    assert seen == ["double", "plus_one"]
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 9.0])


def test_no_path_no_gradient_no_callback():
    x = gc.tensor(3, dtype="int32")
    w = gc.Parameter(1.0)
    w_no_dep = gc.Parameter(1.0)
    called = []
    gm = GradManager().attach(w).attach(w_no_dep, callbacks=lambda t, g: called.append(g) or g)
    with gm:
        out1 = x * w
        _ = w_no_dep * out1
        gm.backward(out1.sum())
    assert w.grad is not None and float(w.grad.item()) == 3.0
    assert w_no_dep.grad is None and called == []


def test_attach_while_recording():
    a = gc.Parameter([1.0])
    gm = GradManager()
    with gm:
        b = a * 3
        gm.attach(b)
        c = b + 1
        gm.backward(c)
    assert int(b.grad.numpy()[0]) == 1
    assert a.grad is None


def test_attached_temporary_is_freed():
    w = gc.Parameter(2.0)
    gm = GradManager().attach(w)
    for i in range(3):
        called = []
        with gm:
            x = gc.Tensor(float(i))
            gm.attach(x, callbacks=lambda t, g: called.append(t) or g)
            ref = weakref.ref(x)
            gm.backward(x * w)
            assert called[0] is x
        del x, called
        assert ref() is None


def test_backward_twice_and_after_release_raise():
    x = gc.tensor([1.0])
    gm = GradManager().attach(x)
    with gm:
        y = x * 2
        gm.backward(y)
        with pytest.raises(RuntimeError, match="no computation history"):
            gm.backward(y)
    gm.record()
    y = x * 2
    gm.release()
    with pytest.raises(RuntimeError, match="no computation history"):
        gm.backward(y)
    # still usable
    with gm:
        gm.backward(x * 5)
    np.testing.assert_allclose(x.grad.numpy(), [7.0])


def test_record_twice_raises():
    gm = GradManager()
    with gm:
        with pytest.raises(RuntimeError, match="already recording"):
            gm.record()


def test_second_order_with_nested_managers():
    x_np = np.random.rand(10).astype("float32")
    x = gc.tensor(x_np)
    gm = GradManager().attach([x])
    gm2 = GradManager().attach([x])
    with gm:
        with gm2:
            y = F.cos(x)
            gm2.backward(y)
        np.testing.assert_almost_equal(x.grad.numpy(), -np.sin(x_np), decimal=5)
        gm.backward(x.grad)
    np.testing.assert_almost_equal(x.grad.numpy(), -np.sin(x_np) - np.cos(x_np), decimal=5)


def test_third_order():
    x = gc.tensor([0.5, 1.5], dtype="float64")
    g1, g2, g3 = (GradManager().attach(x) for _ in range(3))
    with g1:
        with g2:
            with g3:
                g3.backward((x ** 4).sum())
            d1 = x.grad
            x.grad = None
            np.testing.assert_allclose(d1.numpy(), 4 * x.numpy() ** 3)
            g2.backward(d1.sum())
        d2 = x.grad
        x.grad = None
        np.testing.assert_allclose(d2.numpy(), 12 * x.numpy() ** 2)
        g1.backward(d2.sum())
    np.testing.assert_allclose(x.grad.numpy(), 24 * x.numpy())


def test_visibility_by_order():
    x_np = np.random.rand(10).astype("float32")
    x = gc.tensor(x_np)
    gm = GradManager().attach([x])
    gm2 = GradManager().attach([x])
    with gm2:
        with gm:
            y = F.cos(x)
            gm2.backward(y)      # the older manager's backward is invisible to the newer one
            np.testing.assert_almost_equal(x.grad.numpy(), -np.sin(x_np), decimal=5)
            gm.backward(x.grad)
    np.testing.assert_almost_equal(x.grad.numpy(), -np.sin(x_np), decimal=5)


def test_group_does_not_record_each_other():
    x_np = np.random.rand(10).astype("float32")
    x = gc.tensor(x_np)
    gm = GradManager().attach([x])
    gm2 = GradManager().attach([x])
    with gm | gm2:
        y = F.cos(x)
        gm.backward(y)
        assert not x.grad._is_recorded()
        gm2.backward(y)
    np.testing.assert_almost_equal(x.grad.numpy(), -2 * np.sin(x_np), decimal=5)


def test_low_level_grad():
    x = gc.tensor([1.0, 2.0])
    got = []
    with Grad() as g:
        g.wrt(x, callback=got.append)
        y = x * x * x
        g([y], [gc.tensor([1.0, 1.0])])
    np.testing.assert_allclose(got[0].numpy(), [3.0, 12.0])
    with pytest.raises(RuntimeError, match="finished"):
        g.wrt(x)


def test_grad_backward_twice_raises():
    x = gc.tensor([1.0])
    with Grad() as g:
        g.wrt(x, callback=lambda d: None)
        y = x * 2
        g(y, gc.tensor([1.0]))
        with pytest.raises(RuntimeError, match="already"):
            g(y, gc.tensor([1.0]))


def test_callback_fires_when_last_producer_ran():
    # w's gradient is complete before the nodes between x and w have run
    x, w = gc.tensor([1.0, 2.0]), gc.tensor([3.0, 4.0])
    events = []
    with Grad() as g:
        g.wrt(x, callback=lambda d: events.append("x"))
        g.wrt(w, callback=lambda d: events.append("w"))
        h = F.exp(F.sin(x))
        y = (h * w).sum()
        g(y, gc.tensor(1.0))
    assert events == ["w", "x"]


# ---------------------------------------------------------------- Function
class MulFunc(Function):
    def forward(self, a):
        self.a = a
        return a * 10

    def backward(self, grad_o):
        return grad_o * 10


def test_function_single_input():
    av = np.random.random((9, 2, 6)).astype(np.float32)
    a = gc.Parameter(av)
    gm = GradManager().attach([a])
    opt = optim.SGD([a], lr=1.0)
    with gm:
        loss = MulFunc()(a)
        gm.backward(loss.sum())
    opt.step()
    np.testing.assert_almost_equal(loss.numpy(), av * 10, decimal=5)
    np.testing.assert_almost_equal(a.numpy(), av - 10, decimal=5)


def test_function_none_in_and_out():
    class Pair(Function):
        def forward(self, a, b):
            return a, b

        def backward(self, grad_a, grad_b):
            assert grad_b is None
            return grad_a, None

    a, b = gc.Parameter([1.0]), gc.Parameter([2.0])
    gm = GradManager().attach([a, b])
    with gm:
        aa, bb = Pair()(a, b)
        gm.backward(aa)
    np.testing.assert_allclose(a.grad.numpy(), [1.0])
    assert b.grad is None


def test_function_zero_grad():
    class Stop(Function):
        def forward(self, a):
            return a

        def backward(self, *_):
            return None

    a = gc.Parameter([1.0])
    gm = GradManager().attach([a])
    with gm:
        loss = Stop()(a * 3.0) + a * 4.0
        gm.backward(loss.sum())
    np.testing.assert_allclose(a.grad.numpy(), [4.0])


def test_function_non_tensor_argument():
    with pytest.raises(TypeError, match="MulFunc"):
        MulFunc()(3.0)


def test_function_wrong_gradient_count_and_kind():
    class Bad(Function):
        def __init__(self, result):
            self.result = result

        def forward(self, a, b):
            return a * b

        def backward(self, g):
            return self.result

    a, b = gc.tensor([1.0]), gc.tensor([2.0])
    for result, err, msg in [((gc.tensor([1.0]),), ValueError, "1 gradient for 2 inputs"),
                             ((1.0, None), TypeError, "expected a Tensor"),
                             ((gc.tensor([1.0, 2.0]), None), ValueError, "shape")]:
        gm = GradManager().attach([a, b])
        with gm:
            y = Bad(result)(a, b)
            with pytest.raises(err, match=msg) as info:
                gm.backward(y)
            assert "Bad" in str(info.value)
    # the library is still usable
    gm = GradManager().attach([a])
    with gm:
        gm.backward(a * 2)
    assert _core._debug_state()["recording"] == 0


def test_function_second_order():
    class Cube(Function):
        def forward(self, x):
            self.save_for_backward(x)
            return x * x * x

        def backward(self, dy):
            (x,) = self.saved_tensors
            return dy * 3 * x * x

    x = gc.tensor([0.5, 2.0], dtype="float64")
    gm, gm2 = GradManager().attach(x), GradManager().attach(x)
    with gm:
        with gm2:
            gm2.backward(Cube()(x).sum())
        d1 = x.grad
        x.grad = None
        gm.backward(d1.sum())
    np.testing.assert_allclose(d1.numpy(), 3 * x.numpy() ** 2)
    np.testing.assert_allclose(x.grad.numpy(), 6 * x.numpy())


def test_function_deepcopy():
    class Sig(Function):
        def __init__(self, param):
            super().__init__()
            self.param = param

        def forward(self, x):
            y = 1 / (1 + F.exp(-x))
            self.save_for_backward(y)
            return y

        def backward(self, gy):
            (y,) = self.saved_tensors
            return gy * y * (1 - y)

    assert copy.deepcopy(Sig(3)).param == 3


def test_function_called_twice_in_one_graph():
    class Mul10(Function):
        def forward(self, a):
            return a * 10

        def backward(self, g):
            return g * 20

    a = gc.Parameter([1.0, 2.0])
    f = Mul10()
    gm = GradManager().attach([a])
    with gm:
        gm.backward(f(f(a)).sum())
    np.testing.assert_allclose(a.grad.numpy(), [400.0, 400.0])


def test_grad_without_with_block():
    # MegEngine's older style: Grad().wrt(...) starts recording
    x_np = np.random.rand(10).astype("float32")
    x = gc.tensor(x_np)

    def save_to(t):
        def cb(g):
            t.grad = g
        return cb

    grad = Grad().wrt(x, callback=save_to(x))
    y = x * x
    y = y * y
    grad(y, gc.tensor(np.ones_like(x_np)))
    np.testing.assert_almost_equal(x.grad.numpy(), 4 * x_np ** 3, decimal=5)
    assert _core._debug_state()["recording"] == 0


def test_group_that_fails_to_enter_releases_its_managers():
    gm, busy = GradManager(), GradManager()
    busy.record()
    with pytest.raises(RuntimeError, match="already recording"):
        with gm | busy:
            pass
    busy.release()
    assert not gm.recording and _core._debug_state()["recording"] == 0


def test_or_with_something_else_is_a_type_error():
    with pytest.raises(TypeError):
        GradManager() | 3
    with pytest.raises(TypeError):
        (GradManager() | GradManager()) | "x"


def test_float32_tensor_used_with_float64_gets_float32_grad():
    x = gc.tensor([1.0, 2.0], dtype="float32")
    seen = []
    gm = GradManager().attach(x, callbacks=lambda t, g: seen.append(g.dtype) or g)
    with gm:
        gm.backward((x * gc.tensor([3.0, 4.0], dtype="float64")).sum())
    assert seen == [np.float32] and x.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 4.0])


class _Square(Function):
    def forward(self, x):
        self.save_for_backward(x)
        return x * x

    def backward(self, dy):
        (x,) = self.saved_tensors
        return 2 * x * dy


def test_function_instance_reused_keeps_each_calls_saved_tensors():
    x = gc.tensor([0.5, 1.5], dtype="float64")
    f = _Square()
    gm = GradManager().attach(x)
    with gm:
        gm.backward(f(f(x)).sum())
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.numpy() ** 3)


def test_function_saved_tensor_written_in_place_raises():
    w = gc.Parameter(np.array([1.0, 2.0]))
    gm = GradManager().attach(w)
    gm.record()
    y = _Square()(w).sum()
    w._data -= 0.5              # what an optimizer step does
    _core._bump_version(w)
    with pytest.raises(RuntimeError, match="_Square.*modified in place"):
        gm.backward(y)
    assert not gm.recording
    with gm:
        gm.backward((w * 2).sum())
    np.testing.assert_allclose(w.grad.numpy(), [2.0, 2.0])


def test_function_saved_tensor_rebound_keeps_saved_value():
    x = gc.tensor([1.0, 2.0], dtype="float64")
    gm = GradManager().attach(x)
    with gm:
        h = x * 1
        y = _Square()(h).sum()
        h += 10                 # rebinds h: the saved value stays the one used
        gm.backward(y)
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


def test_function_second_order_through_saved_output():
    # the forward is not made of gradcore ops: the saved output's history
    # (the Function itself) carries the second order, as in torch
    class NpTanh(Function):
        def forward(self, x):
            y = gc.Tensor(np.tanh(x.numpy()))
            self.save_for_backward(y)
            return y

        def backward(self, dy):
            (y,) = self.saved_tensors
            return dy * (1 - y * y)

    xv = np.array([0.3, -0.8, 1.1])
    x = gc.tensor(xv)
    gm, gm2 = GradManager().attach(x), GradManager().attach(x)
    with gm:
        with gm2:
            gm2.backward(NpTanh()(x).sum())
        d1 = x.grad
        x.grad = None
        gm.backward((d1 * d1).sum())
    t = np.tanh(xv)
    np.testing.assert_allclose(d1.numpy(), 1 - t * t)
    np.testing.assert_allclose(x.grad.numpy(), -4 * t * (1 - t * t) ** 2)


def test_function_second_order_through_forward_attribute():
    # MegEngine's Sigmoid example keeps the forward's result in an attribute:
    # the older manager records the forward's ops, so that value has a history
    class Sigmoid(Function):
        def forward(self, x):
            y = 1 / (1 + F.exp(-x))
            self.y = y
            return y

        def backward(self, dy):
            y = self.y
            return dy * y * (1 - y)

    xv = np.array([0.5, -1.0])
    x = gc.tensor(xv)
    gm, gm2 = GradManager().attach(x), GradManager().attach(x)
    with gm:
        with gm2:
            gm2.backward(Sigmoid()(x).sum())
        d1 = x.grad
        x.grad = None
        gm.backward(d1.sum())
    s = 1 / (1 + np.exp(-xv))
    np.testing.assert_allclose(d1.numpy(), s * (1 - s))
    np.testing.assert_allclose(x.grad.numpy(), s * (1 - s) * (1 - 2 * s))
    assert _core._debug_state()["no_record"] == 0


def test_gradcheck_checks_float32_inputs_in_float64():
    from gradcore.testing import GradcheckError, gradcheck, gradgradcheck
    x = gc.tensor([0.2, 0.7, 1.3])          # float32, gradcore.tensor's default
    assert gradcheck(F.tanh, [x]) and gradgradcheck(lambda v: v * v * v, [x])
    assert x.dtype == np.float32

    class Wrong(Function):
        def forward(self, a):
            return a * a

        def backward(self, dy):
            return dy * 3

    with pytest.raises(GradcheckError, match="analytic"):
        gradcheck(lambda a: Wrong()(a), [x])


def test_gradcheck_and_gradgradcheck_return_false_with_raise_exception_false():
    # PyTorch's keyword: a wrong gradient gives False instead of raising
    from gradcore.testing import GradcheckError, gradcheck, gradgradcheck
    x = gc.tensor([0.5, 2.0], dtype="float64")
    assert gradcheck(lambda v: v.detach() * v, [x], raise_exception=False) is False
    assert gradgradcheck(lambda v: v.detach() * v * v, [x], raise_exception=False) is False
    assert gradgradcheck(lambda v: v * v * v, [x], raise_exception=False) is True
    with pytest.raises(GradcheckError):
        gradgradcheck(lambda v: v.detach() * v * v, [x])


def test_gradient_penalty_through_an_op_that_saves_its_output():
    # tanh's backward reads its output; the op is recorded by both managers
    # (x by the inner, w by the outer), so the saved output must carry its
    # history under the outer one
    xv, wv = np.array([0.3, -0.7]), np.array([1.5, 0.5])
    x, w = gc.tensor(xv), gc.tensor(wv)
    outer, inner = GradManager().attach(w), GradManager().attach(x)
    with outer:
        with inner:
            inner.backward(F.tanh(x * w).sum())
        gx = x.grad
        outer.backward((gx * gx).sum())
    t = np.tanh(xv * wv)
    np.testing.assert_allclose(gx.numpy(), wv * (1 - t * t))
    # d/dw sum((w (1 - t^2))^2), t = tanh(x w)
    d = 2 * wv * (1 - t * t) * ((1 - t * t) - 2 * wv * t * (1 - t * t) * xv)
    np.testing.assert_allclose(w.grad.numpy(), d)


def test_attach_and_backward_arguments_are_checked():
    x = gc.tensor([1.0, 2.0])
    for bad, msg in ((5, "expected a Tensor or an iterable of Tensors, got int"),
                     (None, "expected a Tensor or an iterable of Tensors, got NoneType")):
        with pytest.raises(TypeError, match=msg):
            GradManager().attach(bad)
    with pytest.raises(TypeError, match="callbacks must be a callable or a list of them, got int"):
        GradManager().attach(x, callbacks=5)
    with pytest.raises(TypeError, match="a callback is not callable"):
        GradManager().attach(x, callbacks=[3])
    gm = GradManager().attach(x)
    with gm:
        y = x * 2
        with pytest.raises(ValueError, match=r"dy of shape \(3,\) for y of shape \(2,\)"):
            gm.backward(y, gc.tensor([1.0, 1.0, 1.0]))
    with gm:
        with pytest.raises(TypeError, match="dy must be a Tensor or array like y"):
            gm.backward(x * 2, "abc")
    with gm:
        gm.backward(x * 2, np.array([1.0, 3.0]))    # an array is a fine dy
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 6.0])


def test_a_callback_returning_a_wrongly_shaped_gradient_is_an_error():
    x = gc.tensor([[1.0, 2.0, 3.0]])
    gm = GradManager().attach(x, callbacks=lambda t, g: g.sum())
    with gm:
        with pytest.raises(ValueError, match=r"callback .*returned a gradient of shape \(\) for an "
                                             r"attached tensor of shape \(1, 3\)"):
            gm.backward((x * 2).sum())
    assert not gm._recording


# ---------------------------------------------------------------- issue 23: silent inputs refused
def test_backward_of_an_integer_output_raises():
    import gradcore.functional as F
    w = gc.Parameter([1.0, 2.0])
    gm = GradManager().attach(w)
    with pytest.raises(RuntimeError, match=r"y \(shape \(\), dtype int32\) has no history.*dtype int32.*argmax"):
        with gm:
            gm.backward(F.argmax(w * 2))
    assert w.grad is None and not gm.recording
    with gm:                                           # a float output without history: MegEngine's no-op
        gm.backward((gc.tensor([2.0]) * 3).sum())
    assert w.grad is None
    with gm:                                           # the manager still works
        gm.backward((w * w).sum())
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0])


def test_after_backward_callback_must_be_callable():
    gm = GradManager()
    with pytest.raises(TypeError, match=r"register_after_backward_callback: the callback must be callable, got int"):
        gm.register_after_backward_callback(5)
    assert gm.register_after_backward_callback(lambda: None) is gm


# ---------------------------------------------------------------- issue 25 item 5: what record() attaches
def test_record_attaches_what_is_attached_now():
    """record() attaches from a plan made once per change of the attached
    set: a tensor attached later, callbacks added later, and a tensor that
    died since are all taken into account."""
    import gc as pygc
    a, b = gc.Parameter([1.0, 2.0]), gc.Parameter([3.0])
    gm = GradManager().attach(a)
    for _ in range(2):
        a.grad = None
        with gm:
            gm.backward((a * a).sum())
    np.testing.assert_array_equal(a.grad.numpy(), [2.0, 4.0])
    seen = []
    gm.attach(b).attach(a, callbacks=lambda t, g: seen.append(t) or g * 10)
    a.grad = None
    with gm:
        gm.backward((a * a).sum() + (b * b).sum())
    np.testing.assert_array_equal(a.grad.numpy(), [20.0, 40.0])
    np.testing.assert_array_equal(b.grad.numpy(), [6.0])
    assert len(seen) == 1 and seen[0] is a
    del b, seen[:]
    pygc.collect()
    assert gm.attached_tensors() == [a]
    a.grad = None
    with gm:
        gm.backward((a * 3).sum())
    np.testing.assert_array_equal(a.grad.numpy(), [30.0, 30.0])
