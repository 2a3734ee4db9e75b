"""Deferred results in the core (docs/core.md, "Deferred results"), without MPI: a kernel
that returns its buffer before it is filled (as gradcore.distributed's adjoint collectives
do with an MPI request in flight) gets it completed before anything reads it. A fake
registry here plays MPI's part: its buffers hold NaN until it completes them, so a gradient
read too early shows up in the values."""
import sys

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore import _core
from gradcore.autodiff import Function, GradManager, set_backward_priority
from gradcore.op import Op


class FakeRegistry:
    """The hooks the core calls, over buffers that "arrive" (get their value) only when
    completed; every call is logged."""

    def __init__(self):
        self.entries = {}            # id(buffer) -> (buffer, value)
        self.log = []

    def defer(self, value):
        buf = np.full_like(value, np.nan)
        self.entries[id(buf)] = (buf, value.copy())
        _core._set_pending_count(len(self.entries))
        self.log.append("deferred")
        return buf

    def _complete(self, g):
        entry = self.entries.pop(id(g), None)
        if entry is not None:
            entry[0][...] = entry[1]
            self.log.append("completed")
            _core._set_pending_count(len(self.entries))

    def before_node(self, grads, reads):
        self.log.append(("node", reads))
        if reads:
            self.settle(grads)

    def settle(self, g):
        for x in (g if type(g) is tuple else (g,)):
            self._complete(x)

    def settle_all(self, exc):
        self.log.append(("all", None if exc is None else type(exc).__name__))
        for buf, _ in list(self.entries.values()):
            self._complete(buf)


@pytest.fixture
def registry():
    reg = FakeRegistry()
    _core._set_pending_hooks(reg)
    yield reg
    # give the core back what it had: gradcore.distributed's registry where it was imported
    mine = sys.modules.get("gradcore.distributed._pending")
    _core._set_pending_hooks(mine._Hooks() if mine is not None else None)
    _core._set_pending_count(mine.in_flight() if mine is not None else 0)


class Delayed(Op):
    """The identity whose backward kernel returns its gradient in flight (a fake adjoint
    collective) in a raw-mode backward."""
    name = "delayed"
    registry = None

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x.copy()

    def vjp(self, inputs, outputs, grads):
        return (DelayedAdjoint()(grads[0]),)


class DelayedAdjoint(Op):
    name = "delayed_adjoint"
    side_buffer = False              # also defer a buffer that is no gradient

    def infer(self, x):
        return (x,)

    def cpu(self, g):
        if Delayed.registry is not None and _core._in_raw_backward():
            if DelayedAdjoint.side_buffer:
                Delayed.registry.defer(np.zeros(1))
            return Delayed.registry.defer(g)
        return g.copy()


@pytest.fixture
def delayed(registry):
    Delayed.registry = registry
    yield registry
    Delayed.registry = None


def test_a_gradient_in_flight_is_completed_before_the_node_that_reads_it(delayed):
    x = gc.tensor([1.0, 2.0, 3.0])
    gm = GradManager().attach(x)
    with gm:
        y = Delayed()(F.sin(x))              # sin's backward reads the delayed gradient
        gm.backward((y * gc.tensor([1.0, 10.0, 100.0])).sum())
    np.testing.assert_allclose(x.grad.numpy(), np.cos([1.0, 2.0, 3.0]) * [1, 10, 100])
    assert delayed.log.index("deferred") < delayed.log.index("completed")
    assert not delayed.entries


def test_a_gradient_in_flight_added_to_another_is_completed_first(delayed):
    x = gc.tensor([1.0, 2.0])
    gm = GradManager().attach(x)
    with gm:
        h = x * 1.0
        y = Delayed()(h)                     # h's slot: the delayed gradient and 3 from h * 3
        gm.backward((y * 2.0 + h * 3.0).sum())
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 5.0])


def test_a_gradient_in_flight_is_completed_before_a_leaf_gets_it(delayed):
    x = gc.tensor([1.0, 2.0])
    seen = []
    gm = GradManager().attach(x, callbacks=lambda t, g: seen.append(g.numpy().copy()) or g)
    with gm:
        gm.backward((Delayed()(x) * 4.0).sum())
    np.testing.assert_allclose(seen[0], [4.0, 4.0])
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 4.0])


def test_a_node_that_only_routes_the_gradient_leaves_it_in_flight(delayed):
    x, z = gc.tensor([1.0, 2.0]), gc.tensor([5.0, 7.0])
    gm = GradManager().attach([x, z])
    with gm:
        y = Delayed()(x * 2.0 + z * 3.0)     # add's backward passes the delayed gradient on, unread
        gm.backward(y.sum())
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])
    np.testing.assert_allclose(z.grad.numpy(), [3.0, 3.0])
    # add routes it to both products; the first of them to run reads it
    assert delayed.log == ["deferred", ("node", False), ("node", True), "completed"]


def test_what_no_node_reads_is_completed_at_the_end_of_the_backward(delayed, monkeypatch):
    # a request whose buffer is no gradient (an MPI request's side buffer): nothing reads it
    monkeypatch.setattr(DelayedAdjoint, "side_buffer", True)
    x = gc.tensor([1.0, 2.0])
    gm = GradManager().attach(x)
    with gm:
        gm.backward((Delayed()(x * 1.0) * 3.0).sum())
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])
    assert delayed.log.count("deferred") == 2 and delayed.log[-2:] == [("all", None), "completed"]
    assert not delayed.entries


class Boom(Function):
    def forward(self, x):
        return x * 2

    def backward(self, g):
        raise RuntimeError("boom in a later backward node")


def test_a_failing_backward_completes_what_is_in_flight_and_raises_its_error(delayed):
    table, dense = gc.tensor([1.0, 2.0]), gc.tensor([3.0])
    gm = GradManager().attach([table, dense])
    with gm:
        looked_up = set_backward_priority(Delayed()(table * 1.0), 1)   # its backward runs first
        with pytest.raises(RuntimeError, match="boom in a later backward node"):
            gm.backward((looked_up.sum() * Boom()(dense)).sum())
    assert "deferred" in delayed.log and ("all", "RuntimeError") in delayed.log
    assert not delayed.entries


def test_with_nothing_in_flight_the_core_calls_no_hook(registry):
    x = gc.tensor([1.0, 2.0])
    gm = GradManager().attach(x)
    with gm:
        h = x * 1.0
        gm.backward((F.sin(h) + h * 2.0).sum())
    assert registry.log == []


def test_only_a_raw_mode_backward_says_so():
    seen = []

    class Spy(Function):
        def forward(self, x):
            return x * 1

        def backward(self, g):
            seen.append(_core._in_raw_backward())
            return g

    assert _core._in_raw_backward() is False
    x = gc.tensor([0.5, 2.0])
    gm = GradManager().attach(x)
    with gm:
        gm.backward(Spy()(x).sum())
    outer, inner = GradManager().attach(x), GradManager().attach(x)
    with outer:
        with inner:                            # recorded by outer: a tensor-mode backward
            inner.backward((Spy()(x) ** 2).sum())
        outer.backward(x.grad.sum())
    assert seen[:2] == [True, False] and _core._in_raw_backward() is False
