"""Bad input across the public API: each case is (callable, args, expected
exception type, regex on the message). The message names the function (or
op) and the shapes or the bad value; nothing is silently broadcast,
truncated or turned into a 0 or NaN; and the library stays usable after the
error, also inside a recording GradManager."""
from functools import partial

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore.autodiff import GradManager


def T(a, dtype="float32"):
    return gc.tensor(np.asarray(a, dtype))


x23 = T(np.arange(6).reshape(2, 3))
x32 = T(np.ones((3, 2)))
x3 = T([1, 2, 3])
x4 = T([1, 2, 3, 4])
i23 = T(np.arange(6).reshape(2, 3), "int32")
x4d = T(np.random.default_rng(0).normal(size=(2, 3, 5, 5)))
w4d = T(np.random.default_rng(1).normal(size=(4, 3, 3, 3)))
lab = T([0, 2], "int32")


def P(shape=(2,), dtype="float32"):
    return gc.Parameter(np.ones(shape, dtype))


def _sgd_step_with_grad(grad, **kw):
    p = P()
    opt = optim.SGD([p], lr=0.1, **kw)
    p.grad = grad
    opt.step()


def _sgd_step_with_lr(lr):
    p = P()
    opt = optim.SGD([p], lr=0.1)
    opt.param_groups[0]["lr"] = lr
    p.grad = T([1.0, 1.0])
    opt.step()


def _clip_norm(max_norm, ord=2.0):
    p = P()
    p.grad = T([1.0, 1.0])
    return optim.clip_grad_norm([p], max_norm, ord)


def _clip_value(lower, upper):
    p = P()
    p.grad = T([1.0, 1.0])
    return optim.clip_grad_value([p], lower, upper)


CASES = [
    # None or a string where a tensor is needed: never a silent 0-d zero
    (F.relu6, (None,), TypeError, r"relu6: expected a tensor, got None"),
    (F.sum, (None,), TypeError, r"sum: expected a tensor, got None"),
    (F.mean, ("abc",), TypeError, r"mean: cannot use str 'abc' as a tensor"),
    (F.copy, (None,), TypeError, r"copy: expected a tensor, got None"),
    (F.stop_gradient, (None,), TypeError, r"stop_gradient: expected a tensor"),
    (F.isnan, (None,), TypeError, r"isnan: expected a tensor"),
    (F.isinf, ("a",), TypeError, r"isinf: cannot use str"),
    (F.dot, (x3, None), TypeError, r"dot: expected a tensor, got None"),
    (F.matmul, (x23, "a"), TypeError, r"matmul: cannot use str"),
    (F.prelu, (x23, None), TypeError, r"prelu: expected a tensor, got None"),
    (F.l1_loss, (x23, None), TypeError, r"l1_loss: expected a tensor, got None"),
    (F.atan2, (None, x23), TypeError, r"operand is None(.|\n)*Elemwise\(atan2\)"),
    (F.dropout, (None, 0.5), TypeError, r"dropout: expected a tensor"),
    (F.meshgrid, (None, x3), TypeError, r"meshgrid: expected a tensor, got None"),
    (F.zeros_like, (None,), TypeError, r"zeros_like: expected a tensor"),
    (F.full_like, (None, 1), TypeError, r"full_like: expected a tensor"),
    (F.full, ((2,), None), TypeError, r"full: expected a tensor, got None|full: value is None"),
    (F.setitem, (x23, 0, None), TypeError, r"setitem: the value is None"),
    (F.setitem, (x23, 0, "ab"), ValueError, r"setitem: cannot use str 'ab' .*float32.*\(2, 3\)"),
    (F.scatter, (x23, 1, T([[0, 1]], "int32"), "ab"), ValueError, r"scatter: cannot use str"),
    # axes, sizes and counts: not an int, or fractional, is an error (int() would truncate)
    (F.sum, (x23, 1.5), TypeError, r"Reduce\(sum\): axis must be an int, got float 1.5"),
    (F.max, (x23, "a"), TypeError, r"axis must be an int, got str 'a'"),
    (F.sum, (x23, (0, "a")), TypeError, r"sum: axis must be an int"),
    (F.argmax, (x23, "a"), TypeError, r"argmax: axis must be an int"),
    (F.cumsum, (x23, None), TypeError, r"CumSum: axis must be an int, got NoneType"),
    (F.softmax, (x23, "a"), TypeError, r"Softmax: axis must be an int"),
    (F.log_softmax, (x23, 1.5), TypeError, r"LogSoftmax: axis must be an int"),
    (F.logsumexp, (x23, "a"), TypeError, r"LogSumExp: axis must be an int"),
    (F.topk, (x23, 1.5), TypeError, r"topk: k must be an int, got float 1.5"),
    (F.topk, (x23, "a"), TypeError, r"topk: k must be an int"),
    (F.reshape, (x4, ("a",)), TypeError, r"reshape: target_shape entries must be an int"),
    (F.reshape, (x4, None), TypeError, r"reshape: target_shape must be a sequence of ints"),
    (F.broadcast_to, (x23, None), TypeError, r"broadcast_to: shape must be a sequence"),
    (F.broadcast_to, (x23, ("a", 3)), TypeError, r"broadcast_to: shape entries must be an int"),
    (F.expand_dims, (x23, "a"), TypeError, r"expand_dims: axis must be an int"),
    (F.expand_dims, (x23, None), TypeError, r"expand_dims: axis must be an int"),
    (F.squeeze, (x23, "a"), TypeError, r"squeeze: axis must be an int"),
    (F.concat, ([x23, x23], "a"), TypeError, r"concat: axis must be an int"),
    (F.split, (x23, "a"), TypeError, r"split: nsplits_or_sections"),
    (F.split, (x23, None), TypeError, r"split: nsplits_or_sections must be a sequence"),
    (F.gather, (x23, "a", T([[0, 1]], "int32")), TypeError, r"gather: axis must be an int"),
    (partial(F.conv2d, stride=1.5), (x4d, w4d), TypeError, r"conv2d: stride must be an int, got float 1.5"),
    (partial(F.conv2d, stride="a"), (x4d, w4d), TypeError, r"conv2d: stride must be an int"),
    (partial(F.conv2d, groups="a"), (x4d, w4d), TypeError, r"conv2d: groups must be an int"),
    (F.max_pool2d, (x4d, "a"), TypeError, r"MaxPool2d: kernel_size must be an int"),
    (F.eye, (1.5,), TypeError, r"eye: N must be an int, got float 1.5"),
    (F.eye, ("a",), TypeError, r"eye: shape entries must be an int"),
    (F.eye, (None,), TypeError, r"eye: N must be an int or a shape, got None"),
    (F.linspace, (0, 1, 1.5), TypeError, r"linspace: num must be an int"),
    (F.linspace, (0, 1, -1), ValueError, r"linspace: num must be >= 0, got -1"),
    (partial(F.indexing_one_hot, axis=5), (x23, lab), ValueError,
     r"indexing_one_hot: axis 5 is out of range for a 2-d tensor"),
    # creation: NumPy's errors, named, with the arguments
    (F.zeros, ((-1, 2),), ValueError, r"zeros: negative dimensions are not allowed \(got shape=\(-1, 2\)"),
    (F.ones, ("a",), TypeError, r"ones: .*\(got shape='a'"),
    (partial(F.zeros, dtype="foo"), ((2,),), TypeError, r"zeros: data type 'foo' not understood"),
    (F.full, ((-1,), 1.0), ValueError, r"full: negative dimensions"),
    (F.full, ((2,), x23), ValueError, r"full: could not broadcast"),
    (partial(F.full, dtype="int32"), ((2,), float("nan")), ValueError, r"full: cannot fill a int32 tensor with nan"),
    (F.full_like, (i23, float("inf")), ValueError, r"full_like: cannot fill a int32 tensor with inf"),
    (F.full_like, (x23, "a"), ValueError, r"full_like: could not convert"),
    (F.arange, ("a",), TypeError, r"arange: .*\(got start=0, stop='a'"),
    (F.astype, (x23, str), TypeError, r"astype: cannot make a tensor of dtype <U"),
    (F.astype, (x23, None), TypeError, r"astype: dtype must be given"),
    (F.astype, (x23, "foo"), TypeError, r"astype: data type 'foo' not understood"),
    # list arguments
    (F.concat, (x23,), TypeError, r"concat: expects a list of tensors, got Tensor"),
    (F.stack, (x23,), TypeError, r"stack: expects a list of tensors, got Tensor"),
    (F.concat, ([],), ValueError, r"concat: expects at least one tensor"),
    (F.stack, ([],), ValueError, r"stack: expects at least one tensor"),
    # masks: a bool tensor, not a truthiness test
    (F.where, (x23, x23, x23), TypeError, r"where: mask must be a bool tensor, got float32 of shape \(2, 3\)"),
    (F.where, (i23, x23, x23), TypeError, r"where: mask must be a bool tensor, got int32"),
    # composites name themselves, with the shapes
    (F.dot, (x3, x4), ValueError, r"dot: expects vectors of the same length, got shapes \(3,\) and \(4,\)"),
    (F.clip, (x23, x32), ValueError, r"clip: Elemwise\(lt\): .*\(2, 3\), \(3, 2\)"),
    (F.clip, (x23, "a"), TypeError, r"clip: .*str"),
    (F.linear, (x23, x3), ValueError, r"linear: weight must be 2-d .*got shape \(3,\)"),
    (F.linear, (x23, T(np.ones((2, 4, 3)))), ValueError, r"linear: weight must be 2-d"),
    (F.linear, (x23, T(np.ones((4, 3))), T(np.ones(3))), ValueError, r"linear: .*\(2, 4\), \(3,\)"),
    (F.conv2d, (x4d, w4d, T(np.ones(3))), ValueError,
     r"conv2d: a 1-d bias must have one element per output channel \(4\), got shape \(3,\)"),
    (F.conv2d, (x4d, w4d, T(np.ones((1, 3, 1, 1)))), ValueError, r"conv2d: .*\(1, 3, 1, 1\)"),
    (F.nn.conv1d, (T(np.ones((1, 3, 5))), T(np.ones((4, 3, 3))), T(np.ones(2))), ValueError,
     r"conv1d: a 1-d bias must have one element per output channel \(4\)"),
    (F.prelu, (x23, T(np.ones(5))), ValueError, r"prelu: .*\(2, 3\), \(5,\)"),
    (F.leaky_relu, (x23, "a"), TypeError, r"leaky_relu: .*str"),
    (F.elu, (x23, "a"), TypeError, r"elu: .*str"),
    (F.var, (x23, 5), ValueError, r"var: .*axis 5 is out of range .*\(2, 3\)"),
    (F.std, (x23, 5), ValueError, r"std: .*axis 5 is out of range"),
    (F.norm, (x23, 2, 5), ValueError, r"norm: .*axis 5 is out of range"),
    (F.norm, (x23, "fro"), TypeError, r"norm: ord must be a number"),
    (partial(F.normalize, axis=5), (x23,), ValueError, r"normalize: .*axis 5"),
    (partial(F.normalize, ord="a"), (x23,), TypeError, r"normalize: ord must be a number"),
    (F.softmax, (x23, (0, 5)), ValueError, r"softmax: .*axis 5 is out of range"),
    (F.log_softmax, (x23, (0, 5)), ValueError, r"log_softmax: .*axis 5"),
    (F.logsumexp, (x23, (0, 5)), ValueError, r"logsumexp: .*axis 5"),
    (F.cross_entropy, (x23, T([0, 3], "int32")), IndexError, r"cross_entropy: .*out of range .*\(2, 3\)"),
    (F.cross_entropy, (x23, T([0, 1, 2], "int32")), ValueError, r"cross_entropy: CrossEntropy.*label must have shape \(2,\).*\(2, 3\), \(3,\)"),
    (F.cross_entropy, (x3, T(1, "int32")), ValueError, r"cross_entropy: axis 1 is out of range for a 1-d"),
    (partial(F.cross_entropy, label_smooth="a"), (x23, lab), TypeError, r"cross_entropy: label_smooth"),
    (F.embedding, (T([3], "int32"), T(np.ones((3, 2)))), IndexError, r"embedding: .*index 3 .*\(3, 2\)"),
    (F.l1_loss, (T(np.ones((3, 1))), x3), ValueError,
     r"l1_loss: label must have pred's shape \(or broadcast to it\), got shapes \(3, 1\) and \(3,\)"),
    (F.square_loss, (x23, x32), ValueError, r"square_loss: label must have pred's shape"),
    (F.binary_cross_entropy, (x3, x23), ValueError, r"binary_cross_entropy: label must have pred's shape"),
    (F.hinge_loss, (x23, x32), ValueError, r"hinge_loss: label must have pred's shape"),
    (partial(F.batch_norm, training=True), (x3,), ValueError, r"batch_norm: inp must be \(N, C, \.\.\.\), got shape \(3,\)"),
    (partial(F.batch_norm, training=True), (x4d, [0, 0, 0], [1, 1, 1]), TypeError,
     r"batch_norm: running_mean must be a Tensor"),
    (F.batch_norm, (x4d, T(np.zeros((1, 4, 1, 1))), T(np.ones((1, 4, 1, 1)))), ValueError,
     r"batch_norm: running_mean must have one element per channel \(3 for inp of shape \(2, 3, 5, 5\)\)"),
    (partial(F.batch_norm, weight=T(np.ones(4))), (x4d, T(np.zeros(3)), T(np.ones(3))), ValueError,
     r"batch_norm: weight must have one element per channel"),
    (F.dropout, (x23, "a"), TypeError, r"dropout: drop_prob must be a number"),
    (F.dropout, (i23, 0.5), TypeError, r"dropout: needs a floating-point input, got int32"),
    (F.nn.pad, (x23, ((1, 1),)), None, None),
    (partial(F.nn.pad, constant_value="a"), (x23, ((1, 1),)), ValueError, r"pad: could not convert"),
    # modules: constructor arguments checked, named
    (M.Linear, (-1, 3), ValueError, r"Linear: in_features must be >= 0, got -1"),
    (M.Linear, ("a", 3), TypeError, r"Linear: in_features must be an int, got str"),
    (M.Linear, (1.5, 3), TypeError, r"Linear: in_features must be an int, got float 1.5"),
    (M.Linear, (3, None), TypeError, r"Linear: out_features must be an int, got NoneType"),
    (M.Linear(3, 4), ("abc",), TypeError, r"Linear: cannot use str"),
    (M.Conv2d, (-3, 8, 3), ValueError, r"Conv2d: in_channels must be >= 1"),
    (M.Conv2d, ("a", 8, 3), TypeError, r"Conv2d: groups must be an int|Conv2d: in_channels must be an int"),
    (M.Conv2d, (3, 8, "a"), TypeError, r"Conv2d: kernel_size must be an int"),
    (M.Conv2d, (3, 8, (1, 2, 3)), ValueError, r"Conv2d: kernel_size must be an int or a pair"),
    (M.Conv1d, (3, -8, 3), ValueError, r"Conv1d: out_channels must be >= 1"),
    (M.BatchNorm2d, (-1,), ValueError, r"BatchNorm2d: num_features must be >= 1"),
    (M.BatchNorm1d, ("a",), TypeError, r"BatchNorm1d: num_features must be an int"),
    (M.LayerNorm, (-1,), ValueError, r"LayerNorm: normalized_shape must be >= 1"),
    (M.LayerNorm, ("a",), TypeError, r"LayerNorm: normalized_shape must be an int"),
    (M.GroupNorm, (0, 4), ValueError, r"GroupNorm: num_groups must be >= 1"),
    (M.InstanceNorm, (-1,), ValueError, r"InstanceNorm: num_channels must be >= 1"),
    (M.Embedding, (-1, 4), ValueError, r"Embedding: num_embeddings must be >= 0"),
    (M.PReLU, ("a",), TypeError, r"PReLU: num_parameters must be an int"),
    (M.Dropout, (-0.1,), ValueError, r"Dropout: drop_prob must be in \[0, 1\), got -0.1"),
    (M.Dropout, ("a",), TypeError, r"Dropout: drop_prob must be a number"),
    (M.MaxPool2d, (0,), ValueError, r"MaxPool2d: kernel_size must be >= 1"),
    (M.AvgPool2d, (-1,), ValueError, r"AvgPool2d: kernel_size must be >= 1"),
    (partial(M.AvgPool2d, mode="foo"), (2,), ValueError, r"AvgPool2d: mode must be one of"),
    (M.Softmax, ("a",), TypeError, r"Softmax: axis must be an int"),
    (M.Embedding(10, 4), (T([10], "int32"),), IndexError, r"embedding: .*index 10"),
    (M.BatchNorm2d(4), (x4d,), ValueError, r"BatchNorm2d\(4\): expected input \(N, 4, H, W\), got shape \(2, 3, 5, 5\)"),
    # optimizers: hyper-parameters are numbers, parameters floating-point, grads Tensors
    (partial(optim.SGD, lr="a"), ([P()],), TypeError, r"SGD: lr must be a number, got str 'a'"),
    (partial(optim.SGD, lr=None), ([P()],), TypeError, r"SGD: lr must be a number, got NoneType"),
    (partial(optim.SGD, lr=float("nan")), ([P()],), ValueError, r"SGD: lr must be a number, got nan"),
    (partial(optim.SGD, lr=0.1), ([P(dtype="int32")],), TypeError, r"SGD: parameters must be floating-point, got int32"),
    (partial(optim.Adam, lr=0.1, betas="a"), ([P()],), TypeError, r"Adam: betas must be a pair"),
    (partial(optim.Adam, lr=0.1, betas=(0.9,)), ([P()],), TypeError, r"Adam: betas must be a pair"),
    (partial(optim.AdamW, lr=0.1, betas=(0.9, "a")), ([P()],), TypeError, r"AdamW: beta2 must be a number"),
    (partial(optim.Adadelta, lr="a"), ([P()],), TypeError, r"Adadelta: lr must be a number"),
    (partial(optim.Adagrad, eps=None), ([P()],), TypeError, r"Adagrad: eps must be a number"),
    (_sgd_step_with_grad, ("ab",), TypeError, r"SGD.step: the gradient of a parameter of shape \(2,\) is a str"),
    (_sgd_step_with_grad, (T(np.ones((3, 2))),), ValueError, r"SGD.step: a gradient of shape \(3, 2\)"),
    (_sgd_step_with_lr, ("a",), TypeError, r"SGD.step: .*'lr': 'a'"),
    (_clip_norm, (-1.0,), ValueError, r"clip_grad_norm: max_norm must be >= 0, got -1.0"),
    (_clip_norm, (1.0, "a"), ValueError, r"clip_grad_norm: ord must be a number or 'inf'"),
    (_clip_norm, (1.0, "inf"), None, None),
    (_clip_value, (1.0, -1.0), ValueError, r"clip_grad_value: lower must be <= upper"),
    (lambda: optim.SGD([P()], lr=0.1).load_state_dict({"foo": 1}), (), ValueError,
     r"SGD.load_state_dict: expects a dict from state_dict\(\) with 'param_groups'"),
    # op-level errors that were already clear stay so
    (F.matmul, (x23, x23), ValueError, r"MatrixMul.*\(2, 3\), \(2, 3\)"),
    (F.add, (x23, x32), ValueError, r"Elemwise\(add\).*\(2, 3\), \(3, 2\)"),
    (F.reshape, (x4, (3,)), ValueError, r"Reshape.*\(4,\)"),
]


def _case_id(case):
    fn, args = case[0], case[1]
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None) \
        or type(fn).__name__
    return f"{name}-{'-'.join(type(a).__name__ for a in args)}"


@pytest.mark.parametrize("fn, args, exc, pattern", CASES, ids=[_case_id(c) for c in CASES])
def test_bad_input_is_a_clear_error(fn, args, exc, pattern):
    if exc is None:          # a valid call next to the bad ones: must not raise
        fn(*args)
        return
    with pytest.raises(exc, match=pattern):
        fn(*args)
    # the library is still usable afterwards
    w = gc.Parameter(np.array([1.0, 2.0], np.float32))
    gm = GradManager().attach([w])
    with gm:
        gm.backward((w * w).sum())
    np.testing.assert_allclose(w.grad.numpy(), [2.0, 4.0])


def test_inputs_are_left_alone_by_failed_calls():
    before = x23.numpy().copy()
    for fn, args, exc, _ in CASES:
        if exc is not None:
            try:
                fn(*args)
            except Exception:
                pass
    np.testing.assert_array_equal(x23.numpy(), before)


RECORDED_ERRORS = [
    (lambda w: F.matmul(w, w), ValueError),
    (lambda w: F.cross_entropy(w, T([0, 3], "int32")), IndexError),
    (lambda w: F.reshape(w, (4,)), ValueError),
    (lambda w: F.softmax(w, (0, 5)), ValueError),
    (lambda w: F.linear(w, T(np.ones((4, 3))), T(np.ones(3))), ValueError),
    (lambda w: F.l1_loss(F.reshape(w, (6, 1)), T(np.ones(6))), ValueError),
    (lambda w: F.batch_norm(w, T(np.zeros(4)), T(np.ones(4)), training=True), ValueError),
    (lambda w: F.where(w, w, w), TypeError),
    (lambda w: F.concat(w), TypeError),
    (lambda w: F.sum(w, 1.5), TypeError),
    (lambda w: M.Linear(4, 2)(w), ValueError),
]


@pytest.mark.parametrize("bad, exc", RECORDED_ERRORS)
def test_error_while_recording_leaves_the_manager_usable(bad, exc):
    w = gc.Parameter(np.arange(6, dtype=np.float32).reshape(2, 3))
    gm = GradManager().attach([w])
    with gm:
        with pytest.raises(exc):
            bad(w)
        gm.backward((w * w).sum())
    np.testing.assert_allclose(w.grad.numpy(), 2 * w.numpy())
    w.grad = None
    gm2 = GradManager().attach([w])
    with gm2:
        gm2.backward((w * 3).sum())
    np.testing.assert_allclose(w.grad.numpy(), np.full((2, 3), 3.0))


def test_valid_neighbours_still_work():
    # the checks above do not reject what is meant to work
    np.testing.assert_allclose(F.l1_loss(T(np.ones((3, 4))), T(np.zeros(4)), reduction="none").numpy(), 1.0)
    assert F.conv2d(x4d, w4d, T(np.ones(1))).shape == (2, 4, 3, 3)           # a 1-element bias broadcasts
    assert F.conv2d(x4d, w4d, T(np.ones(4))).shape == (2, 4, 3, 3)           # one per channel
    assert F.sum(x23, 1.0).shape == (2,)                                      # a whole float is an axis
    assert F.reshape(x4, (np.int64(2), T(2, "int32"))).shape == (2, 2)
    assert F.where(x23 > 1, x23, 0).shape == (2, 3)
    assert F.eye(T([2, 3], "int32")).shape == (2, 3)
    assert F.linspace(1, 9, T(9, "int32")).shape == (9,)
    assert F.full((2,), 7).dtype == np.int32
    assert M.Linear(0, 3).weight.shape == (3, 0)
    assert F.dropout(i23, 0.5, training=False) is i23
    assert F.norm(x23, "inf").item() == 5.0
    opt = optim.Adam([P()], lr=np.float32(0.1), betas=[0.9, 0.99])
    assert opt.param_groups[0]["betas"] == (0.9, 0.99)
