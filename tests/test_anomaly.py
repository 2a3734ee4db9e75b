"""Anomaly mode: a backward producing NaN/Inf raises, naming the op and
showing where its forward was called; off, nothing is captured."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import AnomalyError, Function, GradManager, detect_anomaly, is_anomaly_enabled


def _sqrt_at_zero(x):
    return F.sqrt(x).sum()       # the forward call the error must point at


def test_nan_in_backward_names_the_op_and_its_forward_call():
    x = gc.tensor([0.0, 4.0])
    gm = GradManager().attach(x)
    with detect_anomaly():
        assert is_anomaly_enabled()
        with gm:
            with pytest.raises(AnomalyError) as info:
                gm.backward(_sqrt_at_zero(x) * 0.0 + F.log(x).sum())
    msg = str(info.value)
    first_line = msg.splitlines()[0]
    assert "backward returned" in first_line and "gradient of input 0" in first_line
    assert "shape (2,)" in first_line and "float32" in first_line
    assert "The forward of" in msg and "test_anomaly.py" in msg
    assert not is_anomaly_enabled()


def test_the_failing_op_is_the_first_one_in_backward_order():
    # log(0) has an infinite derivative; the sum and mul before it are finite
    x = gc.tensor([0.0, 1.0])
    gm = GradManager().attach(x)
    with detect_anomaly(), gm:
        y = F.log(x)                                   # line recorded for the error
        with pytest.raises(AnomalyError, match=r"returned inf values") as info:
            gm.backward((y * 2.0).sum())
    assert "y = F.log(x)" in str(info.value)
    assert "log" in str(info.value).splitlines()[0]


def test_custom_function_backward_and_no_stack_when_recorded_outside():
    class Bad(Function):
        def forward(self, x):
            return x * 1.0

        def backward(self, dy):
            return dy / 0.0

    x = gc.tensor([1.0])
    gm = GradManager().attach(x)
    with detect_anomaly(), gm:
        y = Bad()(x)
        with pytest.raises(AnomalyError, match="Bad") as info:
            gm.backward(y.sum())
    assert "y = Bad()(x)" in str(info.value)
    # recorded with the mode off, backward with it on: the op is still named
    gm = GradManager().attach(x)
    with gm:
        y = Bad()(x)
        with detect_anomaly():
            with pytest.raises(AnomalyError, match="recorded while anomaly mode was off"):
                gm.backward(y.sum())


def test_off_no_check_and_nesting():
    x = gc.tensor([0.0])
    gm = GradManager().attach(x)
    with gm:
        gm.backward(F.sqrt(x).sum())                   # off: inf reaches .grad, no error
    assert np.isinf(x.grad.numpy()).all()
    with detect_anomaly():
        with detect_anomaly(check_nan=False):
            gm = GradManager().attach(x)
            with gm:
                gm.backward(F.sqrt(x).sum())            # stacks kept, no check
        assert is_anomaly_enabled()
    assert not is_anomaly_enabled()


def test_higher_order_backward_is_checked_too():
    x = gc.tensor([0.0])
    outer, inner = GradManager().attach(x), GradManager().attach(x)
    with detect_anomaly(), outer:
        with inner:
            inner.backward((x * x * x).sum())          # finite: 3x^2 = 0
        g = x.grad
        x.grad = None
        with pytest.raises(AnomalyError):
            outer.backward(F.sqrt(g).sum())            # d sqrt(3x^2) at 0: nan


def test_an_inf_gradient_of_a_plugin_op_names_the_ops_input_shapes_beside_the_gradients():
    from gradcore.core import apply
    from gradcore.op import Op, TensorDesc

    class Scale(Op):
        """x * w, w broadcast along x's rows; its vjp's w gradient is in x's shape (summed down later)."""
        name = "AnomalyPluginScale"

        def infer(self, x, w):
            return (TensorDesc(x.shape, x.dtype, x.device),)

        def cpu(self, x, w):
            return x * w

        def vjp(self, inputs, outputs, grads):
            (x, w), (g,) = inputs, grads
            return (g * w, g * x / F.zeros_like(x))
    x, w = gc.tensor(np.ones((3, 4))), gc.tensor(np.ones(4))
    gm = GradManager().attach([x, w])
    with np.errstate(divide="ignore"), detect_anomaly(), gm:
        with pytest.raises(AnomalyError) as info:
            gm.backward(apply(Scale(), x, w)[0].sum())
    # the gradient's shape (3, 4) is not input 1's: the input shapes say so (was: only "shape (3, 4)")
    assert str(info.value).splitlines()[0] == (
        "AnomalyPluginScale: its backward returned inf values in the gradient of input 1 (shape (3, 4), "
        "dtype float64; the op's inputs: (3, 4) float64, (4,) float64).")
