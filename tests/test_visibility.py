"""A gradient reaches a tensor only through ops that consumed that very
tensor object: an alias made with MegEngine's ``y2 = Tensor(y); y2._reset(y)``
is a different node (issue 18, item 1)."""
import numpy as np

import gradcore as gc
from gradcore.autodiff import GradManager


def _recorder(log):
    def cb(tensor, grad):
        log.append(grad.numpy().copy())
        return grad
    return cb


def test_alias_of_intermediate_gets_no_gradient_from_ops_on_the_original():
    x = gc.Tensor([1.0, 2.0])
    fired = []
    gm = GradManager().attach([x])
    with gm:
        y = x * x
        y2 = gc.Tensor(y)
        y2._reset(y)
        gm.attach([y2], callbacks=[_recorder(fired)])
        z = y * y
        gm.backward(z)
    assert fired == []
    assert y2.grad is None
    # x still gets dz/dx = 4 x^3
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 32.0])


def test_alias_gets_the_gradient_of_ops_that_consumed_it():
    x = gc.Tensor([1.0, 2.0])
    fired = []
    gm = GradManager().attach([x])
    with gm:
        y = x * x
        y2 = gc.Tensor(y)
        y2._reset(y)
        gm.attach([y2], callbacks=[_recorder(fired)])
        z = y * y + y2 * 3.0
        gm.backward(z)
    assert len(fired) == 1
    np.testing.assert_allclose(fired[0], [3.0, 3.0])
    np.testing.assert_allclose(y2.grad.numpy(), [3.0, 3.0])
    # the alias is attached, so it is a leaf: what flows into it stops there
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 32.0])


def test_alias_of_an_attached_leaf_is_a_separate_leaf():
    x = gc.Tensor([1.0, 2.0])
    x2 = gc.Tensor(x)
    x2._reset(x)
    fired_x, fired_x2 = [], []
    gm = GradManager()
    gm.attach([x], callbacks=[_recorder(fired_x)])
    gm.attach([x2], callbacks=[_recorder(fired_x2)])
    with gm:
        gm.backward((x * x).sum())
    assert fired_x2 == [] and x2.grad is None
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])
    assert len(fired_x) == 1


def test_unattached_alias_keeps_the_history_it_was_reset_from():
    # not attached itself, an alias carries the original's history back
    x = gc.Tensor([1.0, 2.0])
    gm = GradManager().attach([x])
    with gm:
        y = x * x
        y2 = gc.Tensor(y)
        y2._reset(y)
        gm.backward((y2 * 2.0).sum())
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 8.0])


def test_in_place_op_keeps_one_node():
    # `t += ...` and `t[i] = v` rebind the same object: no alias, the history
    # of the result is the tensor's own
    x = gc.Tensor([1.0, 2.0, 3.0])
    gm = GradManager().attach([x])
    with gm:
        y = x * 2.0
        y += x
        y[0] = x[1]
        gm.backward(y.sum())
    # y = 3x, then y[0] is overwritten by x[1]
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 4.0, 3.0])


def test_attaching_an_alias_twice_chains_its_callbacks():
    x = gc.Tensor([1.0])
    y2 = gc.Tensor(x)
    y2._reset(x)
    a, b = [], []
    gm = GradManager()
    gm.attach([x])
    gm.attach([y2], callbacks=[_recorder(a)])
    gm.attach([y2], callbacks=[_recorder(b)])
    with gm:
        gm.backward((y2 * 5.0).sum())
    np.testing.assert_allclose(a[0], [5.0])
    np.testing.assert_allclose(b[0], [5.0])
    np.testing.assert_allclose(y2.grad.numpy(), [5.0])
    assert x.grad is None
