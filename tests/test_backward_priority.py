"""Backward order by priority (gradcore.autodiff.set_backward_priority and
backward_priority): the order nodes run in, and that the gradients do not depend on it."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import Function, GradManager, backward_priority, set_backward_priority

ORDER = []


class Tag(Function):
    """The identity, noting when its backward runs."""

    def __init__(self, name):
        self.name = name

    def forward(self, x):
        return x * 1

    def backward(self, g):
        ORDER.append(self.name)
        return g


def _branches(raise_a=None, context=None):
    """Three independent branches a, b, c recorded in that order, joined at the end."""
    ORDER.clear()
    x, y, z = (gc.tensor(np.arange(1.0, 4.0) * k) for k in (1, 2, 3))
    gm = GradManager().attach([x, y, z])
    with gm:
        if context is not None:
            with backward_priority(context):
                a = F.sin(Tag("a")(x))
        else:
            tagged = Tag("a")(x)
            if raise_a is not None:
                set_backward_priority(tagged, raise_a)   # the nodes computed from it are raised too
            a = F.sin(tagged)
        b = F.exp(Tag("b")(y) * 0.1)
        c = Tag("c")(z) ** 2
        gm.backward((a * 2 + b * 3 + c).sum())
    return list(ORDER), [t.grad.numpy() for t in (x, y, z)]


def test_without_priorities_the_backward_is_the_reverse_walk():
    order, _ = _branches()
    assert order == ["c", "b", "a"]


def test_a_raised_branch_runs_its_backward_first_and_the_gradients_are_bit_identical():
    plain_order, plain = _branches()
    order, grads = _branches(raise_a=1)
    assert order == ["a", "c", "b"]
    for g, h in zip(grads, plain):
        assert g.tobytes() == h.tobytes()


def test_the_context_manager_raises_what_is_recorded_inside_it():
    order, grads = _branches(context=5)
    assert order == ["a", "c", "b"]
    assert _branches(context=0)[0] == ["c", "b", "a"]


def test_a_lower_priority_runs_later_and_negative_priorities_run_last():
    ORDER.clear()
    x = gc.tensor([1.0, 2.0])
    gm = GradManager().attach([x])
    with gm:
        parts = []
        for name, p in (("p0", 0), ("p2", 2), ("pm1", -1), ("p1", 1)):
            parts.append(set_backward_priority(Tag(name)(x), p))
        gm.backward((parts[0] + parts[1] + parts[2] + parts[3]).sum())
    assert ORDER == ["p2", "p1", "p0", "pm1"]
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0])


def test_a_shared_input_accumulates_from_every_branch_in_any_order():
    x = gc.tensor(np.linspace(-1, 1, 5))
    results = []
    for raise_first in (None, 1):
        gm = GradManager().attach([x])
        with gm:
            a = F.tanh(x * 3)
            if raise_first:
                set_backward_priority(a, raise_first)
            b = F.sigmoid(x) * x
            gm.backward((a + b).sum())
        results.append(x.grad.numpy())
        x.grad = None
    np.testing.assert_allclose(results[1], results[0], rtol=1e-15)


def test_second_order_through_nested_managers_with_priorities():
    def grads(raised):
        x = gc.tensor([0.5, 2.0])
        outer, inner = GradManager().attach(x), GradManager().attach(x)
        with outer:
            with inner:
                y = x ** 3
                if raised:
                    set_backward_priority(y, 3)
                z = F.sin(x)
                inner.backward((y + z).sum())
            d1, x.grad = x.grad, None
            with backward_priority(2):
                loss = (d1 * d1).sum()
            outer.backward(loss)
        return d1.numpy(), x.grad.numpy()

    plain, raised = grads(False), grads(True)
    for a, b in zip(plain, raised):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    x = np.array([0.5, 2.0])
    d1 = 3 * x ** 2 + np.cos(x)
    np.testing.assert_allclose(raised[1], 2 * d1 * (6 * x - np.sin(x)), rtol=1e-5)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(TypeError, match="set_backward_priority: expected a Tensor"):
        set_backward_priority(np.ones(2), 1)
    with pytest.raises(TypeError, match="backward_priority: the priority must be an int"):
        backward_priority(1.5)
    with pytest.raises(ValueError, match="must fit in 32 bits"):
        set_backward_priority(gc.tensor([1.0]), 1 << 40)


def test_the_context_is_per_thread_and_undone_on_exit():
    import threading
    seen = []

    def other():
        _, _ = _branches()
        seen.append(list(ORDER))

    with backward_priority(7):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == [["c", "b", "a"]]
    assert _branches()[0] == ["c", "b", "a"]       # nothing left raised after the exit


def test_only_the_producer_and_what_is_computed_from_it_are_raised():
    """Raising ``sin``'s output raises sin and the path to the loss, not the op before sin:
    that one waits its turn in the reverse order."""
    ORDER.clear()
    x, y = gc.tensor([1.0, 2.0]), gc.tensor([3.0, 4.0])
    gm = GradManager().attach([x, y])
    with gm:
        a = set_backward_priority(F.sin(Tag("before a")(x)), 1)
        b = Tag("b")(y)
        gm.backward((a + b).sum())
    assert ORDER == ["b", "before a"]
