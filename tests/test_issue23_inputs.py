"""Issue 23, item 6: the last silent and unclear inputs, each refused with
a clear message or given the result PyTorch gives."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
from gradcore.autodiff import GradManager


@pytest.mark.parametrize("op", ["floordiv", "mod"])
def test_integer_division_by_zero_is_zero_as_documented(op):
    # documented in docs/core.md ("Integer division by zero"): NumPy's 0 with its warning
    from pathlib import Path
    doc = (Path(__file__).resolve().parent.parent / "docs" / "core.md").read_text()
    assert "### Integer division by zero" in doc
    i = gc.tensor([3, 4], dtype="int32")
    run = (lambda a, b: a // b) if op == "floordiv" else (lambda a, b: a % b)
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        out = run(i, gc.tensor([0, 3], dtype="int32"))
    np.testing.assert_array_equal(out.numpy(), [0, run(4, 3)])
    assert out.dtype == np.int32


def test_matmul_compute_mode_is_checked():
    a = gc.tensor(np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="compute_mode must be 'default' or 'float32', got 'bogus'"):
        F.matmul(a, a, compute_mode="bogus")
    np.testing.assert_array_equal(F.matmul(a, a, compute_mode="float32").numpy(), 2 * np.ones((2, 2)))


def test_batch_norm_in_training_needs_more_than_one_value_per_channel():
    m = M.BatchNorm1d(3)
    with pytest.raises(ValueError, match=r"BatchNorm1d: expected more than 1 value per channel when training, got input of shape \(1, 3\)"):
        m(gc.tensor(np.ones((1, 3), np.float32)))
    # BatchNorm2d keeps MegEngine's behaviour (its tests run it on (1, C, 1, 1))
    assert M.BatchNorm2d(3)(gc.tensor(np.ones((1, 3, 1, 1), np.float32))).shape == (1, 3, 1, 1)
    assert m(gc.tensor(np.ones((1, 3, 2), np.float32))).shape == (1, 3, 2)   # two values per channel
    m.eval()
    assert m(gc.tensor(np.ones((1, 3), np.float32))).shape == (1, 3)         # running statistics


def test_batch_norm_of_an_integer_input_is_float32():
    m = M.BatchNorm2d(3)
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 2, 2)
    y = m(gc.tensor(x))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), m(gc.tensor(x.astype(np.float32))).numpy(), rtol=1e-6)


def test_assigning_an_array_to_a_parameter_attribute_raises():
    m = M.Linear(2, 2)
    with pytest.raises(TypeError, match=r"Linear.weight is a Parameter of shape \(2, 2\); assigning a ndarray"):
        m.weight = np.ones((2, 2), np.float32)
    assert [n for n, _ in m.named_parameters()] == ["bias", "weight"]
    m.weight = gc.Parameter(np.ones((2, 2), np.float32))              # a Parameter is fine
    m.extra = np.ones(2)                                              # not a parameter attribute: fine
    assert [n for n, _ in m.named_parameters()] == ["bias", "weight"]


def test_from_dlpack_refuses_complex_and_bfloat16(torch):
    with pytest.raises(TypeError, match="from_dlpack: Tensor of dtype complex64"):
        gc.from_dlpack(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(TypeError, match="from_dlpack: Tensor of dtype torch.bfloat16.*to\\(torch.float32\\)"):
        gc.from_dlpack(torch.ones(2, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="complex128"):
        gc.from_dlpack(np.ones(2, np.complex128))


def test_from_dlpack_shares_writes_as_documented(torch):
    # documented next to from_dlpack: the exporter's in-place writes between
    # forward and backward are seen by the backward (no version counter)
    assert "version counter" in gc.from_dlpack.__doc__
    src = torch.ones(3)
    x = gc.from_dlpack(src)
    w = gc.Parameter([1.0, 1.0, 1.0])
    gm = GradManager().attach(w)
    with gm:
        y = (w * x).sum()
        src.mul_(5)
        gm.backward(y)
    np.testing.assert_array_equal(w.grad.numpy(), [5.0, 5.0, 5.0])
    w.grad = None
    xc = gc.tensor(torch.ones(3).numpy())                              # the copy the doc recommends
    with gm:
        y = (w * xc).sum()
        gm.backward(y)
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 1.0, 1.0])


@pytest.mark.parametrize("value, match", [
    (np.ones((2, 2), np.complex64) * 1j, "weight: a value of dtype complex64"),
    ("abc", "weight: a value of dtype <U3"),
    (np.array([[None, 1], [2, 3]], dtype=object), "weight: a value of dtype object"),
])
def test_load_state_dict_refuses_values_that_are_not_real_numbers(value, match):
    m = M.Linear(2, 2)
    before = m.weight.numpy().copy()
    with pytest.raises(TypeError, match=match):
        m.load_state_dict({"weight": value, "bias": np.zeros(2, np.float32)})
    np.testing.assert_array_equal(m.weight.numpy(), before)             # nothing changed


def test_none_operands_name_the_op_and_compare_as_python():
    t = gc.tensor([1.0, 2.0])
    for use, op in ((lambda: F.where(None, t, t), "where"), (lambda: t ** None, "pow"), (lambda: t + None, "add")):
        with pytest.raises(TypeError, match="the operand is None and is not supported.") as info:
            use()
        # MegEngine's exact text, and the op with the operands' shapes in a note (shown by tracebacks)
        assert any(op in n and "(2,)" in n and "None" in n for n in getattr(info.value, "__notes__", [])), \
            info.value.__notes__
    assert (t == None) is False and (t != None) is True                # noqa: E711


def test_conv1d_with_a_conv2d_weight_speaks_of_conv1d():
    x = gc.tensor(np.ones((1, 1, 5), np.float32))
    with pytest.raises(ValueError, match=r"conv1d: weight must be .*got shape \(1, 1, 3, 3\) with groups=1 "
                                         r"\(input shape \(1, 1, 5\)\); a \(O, C, KH, KW\) weight is for conv2d"):
        F.conv1d(x, gc.tensor(np.ones((1, 1, 3, 3), np.float32)))


def test_vjp_of_a_function_returning_a_float_says_so():
    with pytest.raises(TypeError, match="gradcore.vjp: fn's outputs must be a Tensor or a tuple/list of Tensors, got float"):
        gc.vjp(lambda a: 3.0, gc.tensor([1.0]))


def test_logsumexp_over_an_empty_axis_is_minus_inf(torch):
    x = np.ones((0, 3), np.float32)
    for axis in (0, (0,), None, -2):
        got = F.logsumexp(gc.tensor(x), axis=axis).numpy()
        want = torch.logsumexp(torch.tensor(x), dim=axis if axis is not None else (0, 1)).numpy()
        np.testing.assert_array_equal(got, want)
    assert F.logsumexp(gc.tensor(x), axis=1).shape == (0,)              # nothing empty reduced
    w = gc.Parameter(x)
    gm = GradManager().attach(w)
    with gm:
        gm.backward(F.logsumexp(w, axis=0).sum())
    assert w.grad.shape == (0, 3)
