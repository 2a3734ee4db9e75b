"""Recording is per thread (docs/core.md, "Threading model"): real threads,
repeated rounds, a very short thread switch interval so that the GIL changes
hands inside nearly every op."""
import contextlib
import queue
import sys
import threading

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore import _core, graph
from gradcore.autodiff import GradManager, get_backwarding_grad_manager

ROUNDS = 3


@contextlib.contextmanager
def switch_interval(seconds):
    old = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def run_threads(targets):
    """Run each callable in its own thread, all released at once; re-raise
    the first exception a thread raised."""
    barrier = threading.Barrier(len(targets))
    errors = []

    def wrap(fn):
        def body():
            try:
                barrier.wait()
                fn()
            except BaseException as exc:       # reported to the test below
                errors.append(exc)
        return body

    threads = [threading.Thread(target=wrap(fn), name=f"worker-{i}") for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a worker thread hangs"
    if errors:
        raise errors[0]


# ---------------------------------------------------------------- independent trainings
class Training:
    """A 16-32-4 MLP trained with SGD (momentum) under its own GradManager,
    on data of its own; counts the steps where an attached parameter got no
    gradient."""

    def __init__(self, seed, steps):
        rng = np.random.RandomState(seed)
        self.model = M.Sequential(M.Linear(16, 32), M.ReLU(), M.Linear(32, 4))
        self.model.load_state_dict({k: (rng.randn(*v.shape) * 0.3).astype(np.float32)
                                    for k, v in self.model.state_dict().items()})
        self.params = list(self.model.parameters())
        self.gm = GradManager().attach(self.params)
        self.opt = optim.SGD(self.params, lr=0.05, momentum=0.9)
        self.x = [gc.tensor(rng.randn(8, 16).astype(np.float32)) for _ in range(4)]
        self.y = [gc.tensor(rng.randint(0, 4, size=8).astype(np.int32)) for _ in range(4)]
        self.steps = steps
        self.missing = 0

    def __call__(self):
        for step in range(self.steps):
            with self.gm:
                loss = F.cross_entropy(self.model(self.x[step % 4]), self.y[step % 4])
                self.gm.backward(loss)
            self.missing += sum(p.grad is None for p in self.params)
            self.opt.step().clear_grad()

    def weights(self):
        return [p.numpy().copy() for p in self.params]


@pytest.mark.parametrize("interval", [5e-3, 1e-6])
def test_concurrent_trainings_equal_sequential_bit_for_bit(interval):
    steps = 150
    a, b = Training(1, steps), Training(2, steps)
    a(), b()
    want_a, want_b = a.weights(), b.weights()
    assert a.missing == b.missing == 0
    with switch_interval(interval):
        for _ in range(ROUNDS):
            a, b = Training(1, steps), Training(2, steps)
            run_threads([a, b])
            assert a.missing == 0 and b.missing == 0, "x.grad came back None"
            for got, want in zip(a.weights() + b.weights(), want_a + want_b):
                np.testing.assert_array_equal(got, want)
    assert _core._recording_keys() == []


def test_higher_order_managers_in_two_threads():
    # nested managers (second order) in each thread: the threads' keys are
    # interleaved in age, yet each backward sees only its own thread's keys
    def second_derivative(value, out):
        def run():
            for _ in range(40):
                x = gc.tensor([value])
                outer, inner = GradManager().attach([x]), GradManager().attach([x])
                with outer:
                    with inner:
                        y = x * x * x
                        inner.backward(y)       # x.grad = 3 x^2, recorded by outer
                    g = x.grad
                    x.grad = None
                    outer.backward(g)
                out.append(float(x.grad.numpy()[0]))
        return run

    with switch_interval(1e-6):
        for _ in range(ROUNDS):
            r1, r2 = [], []
            run_threads([second_derivative(2.0, r1), second_derivative(5.0, r2)])
            assert r1 == [12.0] * 40 and r2 == [30.0] * 40


def test_no_record_section_of_one_thread_does_not_stop_another():
    w = gc.Parameter([3.0])
    gm = GradManager().attach([w])
    done = []

    def other():
        with gm:
            gm.backward((w * w).sum())
        done.append(float(w.grad.numpy()[0]))

    _core._no_record_enter()       # what an op's own forward does while it runs
    try:
        t = threading.Thread(target=other)
        t.start()
        t.join(30)
    finally:
        _core._no_record_exit()
    assert done == [6.0]
    assert _core._debug_state()["no_record"] == 0


# ---------------------------------------------------------------- backward in another thread
def test_backward_in_another_thread_than_the_forward():
    w = gc.Parameter(np.arange(6, dtype=np.float32).reshape(2, 3))
    x = gc.tensor(np.ones((4, 2), np.float32))
    seen = []

    def callback(tensor, grad):
        # a data-parallel callback runs in the thread that called backward
        seen.append((threading.current_thread().name, get_backwarding_grad_manager() is gm))
        return grad

    gm = GradManager().attach([w], callbacks=callback)
    want = np.full((2, 3), 4.0, np.float32)
    with switch_interval(1e-6):
        for _ in range(ROUNDS * 4):
            handoff = queue.Queue()
            w.grad = None
            seen.clear()
            gm.record()
            handoff.put(F.matmul(x, w).sum())          # recorded here, in the main thread

            def backward():
                gm.backward(handoff.get())

            t = threading.Thread(target=backward, name="backward-thread")
            t.start()
            t.join(30)
            np.testing.assert_array_equal(w.grad.numpy(), want)
            assert seen == [("backward-thread", True)]
            assert not gm.recording
            assert get_backwarding_grad_manager() is None
    assert _core._recording_keys() == []


def test_with_block_exit_in_forward_thread_while_backward_runs_elsewhere():
    # the forward thread leaves `with gm:` while another thread runs the
    # backward: the backward still gets every gradient, then ends the recording
    w = gc.Parameter([1.0, 2.0])
    started, may_finish = threading.Event(), threading.Event()

    def slow_callback(tensor, grad):
        started.set()
        may_finish.wait(10)
        return grad

    gm = GradManager().attach([w], callbacks=slow_callback)
    with gm:
        loss = (w * w).sum()
        t = threading.Thread(target=gm.backward, args=(loss,))
        t.start()
        assert started.wait(10)
    may_finish.set()
    t.join(30)
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0])
    assert not gm.recording and _core._recording_keys() == []


def test_backward_from_a_thread_whose_ops_were_not_recorded_raises():
    w = gc.Parameter([1.0, 2.0])
    gm = GradManager().attach([w])
    gm.record()
    errors = []

    def forward_and_backward_here():
        try:
            gm.backward((w * w).sum())      # this thread's ops: not gm's recording
        except RuntimeError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=forward_and_backward_here, name="other-thread")
    t.start()
    t.join(30)
    assert len(errors) == 1
    assert "GradManager" in errors[0] and "other-thread" in errors[0] and "MainThread" in errors[0]
    # refused before it ran: the owner's recording goes on (issue 23)
    assert gm.recording and w.grad is None
    gm.release()
    assert not gm.recording and _core._recording_keys() == []


def test_op_recorded_while_another_thread_starts_the_backward_raises():
    # an own-rule op keeps the forward thread inside its recording while the
    # backward of the same manager starts in another thread: the op is
    # refused with an error, never linked after the backward read the tape
    w = gc.Parameter([2.0])
    inside, backward_done = threading.Event(), threading.Event()

    class Slow(gc.Function):
        def forward(self, x):
            inside.set()
            backward_done.wait(10)
            return x * 1.0

        def backward(self, dy):
            return dy

    gm = GradManager().attach([w])
    gm.record()
    first = w * 3.0
    errors = []

    def forward():
        try:
            Slow()(w)
        except RuntimeError as exc:
            errors.append(str(exc))

    # the recording belongs to the main thread: the slow forward runs here,
    # the backward in the helper thread
    helper = threading.Thread(target=lambda: (inside.wait(10), gm.backward(first), backward_done.set()))
    helper.start()
    forward()
    helper.join(30)
    assert errors and "GradManager" in errors[0] and "recording ended" in errors[0]
    np.testing.assert_array_equal(w.grad.numpy(), [3.0])


# ---------------------------------------------------------------- one manager, two threads
def test_one_manager_recorded_from_two_threads_raises_naming_both():
    gm = GradManager().attach([gc.Parameter([1.0])])
    gm.record()
    errors = []

    def second():
        try:
            gm.record()
        except RuntimeError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=second, name="second-thread")
    t.start()
    t.join(30)
    gm.release()
    assert len(errors) == 1
    assert "GradManager" in errors[0] and "MainThread" in errors[0] and "second-thread" in errors[0]


def test_one_manager_hammered_from_two_threads_never_mixes_graphs():
    # both threads train through one manager on shared parameters: each
    # attempt either records alone and gets exactly its own gradient, or is
    # refused with a RuntimeError naming GradManager
    w = gc.Parameter(np.ones(3, np.float32))
    got = {}

    def grab(tensor, grad):
        got.setdefault(threading.get_ident(), []).append(grad.numpy().copy())
        return None          # nothing lands on w.grad: each thread checks its own

    gm = GradManager().attach([w], callbacks=grab)

    def worker(scale, outcome):
        def run():
            for _ in range(60):
                try:
                    with gm:
                        loss = (w * w * scale).sum()
                        gm.backward(loss)
                    outcome["ok"] += 1
                except RuntimeError as exc:
                    assert "GradManager" in str(exc), str(exc)
                    outcome["refused"] += 1
        return run

    with switch_interval(1e-6):
        for _ in range(ROUNDS):
            got.clear()
            o1, o2 = {"ok": 0, "refused": 0}, {"ok": 0, "refused": 0}
            run_threads([worker(1.0, o1), worker(10.0, o2)])
            grads = list(got.values())
            assert o1["ok"] + o2["ok"] == sum(len(g) for g in grads) > 0
            for per_thread in grads:
                first = per_thread[0]
                assert any(np.array_equal(first, 2.0 * s * np.ones(3)) for s in (1.0, 10.0))
                for g in per_thread:
                    np.testing.assert_array_equal(g, first)
            assert not gm.recording
    assert _core._recording_keys() == []


def test_state_of_an_ended_thread_is_not_inherited():
    # a thread that ends while its manager still records: threads started
    # later (which may get the same thread ident) do not record into it
    w = gc.Parameter([1.0])
    gm = GradManager().attach([w])
    recorder = threading.Thread(target=gm.record)
    recorder.start()
    recorder.join(30)
    assert gm.recording
    for _ in range(5):
        res = []
        t = threading.Thread(target=lambda: res.append((gm._key.records_in_this_thread,
                                                        gm._key.tracks(w * 2.0))))
        t.start()
        t.join(30)
        assert res == [(False, False)]
    assert not gm._key.records_in_this_thread
    gm.release()


# ---------------------------------------------------------------- shared caches
def test_shared_caches_filled_from_many_threads_give_the_single_thread_gradients():
    # the backward graph caches, the op intern tables and the rule caches
    # start empty and are filled by four threads at once
    shapes = [(3,), (2, 3), (4, 1), (2, 2, 2)]
    dtypes = [np.float32, np.float64]

    def grads_of(seed):
        rng = np.random.RandomState(seed)
        res = []
        for shape in shapes:
            for dt in dtypes:
                x = gc.Parameter(rng.rand(*shape).astype(dt) + 0.5)
                gm = GradManager().attach([x])
                with gm:
                    y = F.sum(F.exp(x) * F.log(x) / (x + 1.5)) + F.mean(x.reshape(-1) ** 3)
                    y = y + F.max(x, axis=len(shape) - 1).sum()
                    gm.backward(y)
                res.append(x.grad.numpy().copy())
        return res

    want = {s: grads_of(s) for s in range(4)}
    with switch_interval(1e-6):
        for _ in range(ROUNDS):
            graph.clear_cache()
            out = {}
            run_threads([lambda s=s: out.__setitem__(s, grads_of(s)) for s in range(4)])
            for s in range(4):
                for g, w in zip(out[s], want[s]):
                    np.testing.assert_array_equal(g, w)


def test_a_refused_backward_from_another_thread_leaves_the_owners_recording_intact():
    # issue 23: the refused call used to end the recording, so the owner's
    # own backward then failed
    w = gc.Parameter([2.0, 3.0])
    gm = GradManager().attach(w)
    gm.record()
    loss = (w * w).sum()
    errors = []

    def intruder():
        try:
            gm.backward(gc.tensor([1.0]) * 2)        # ops of this thread: not recorded by gm
        except RuntimeError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=intruder, name="intruder")
    t.start()
    t.join(30)
    assert len(errors) == 1 and "'intruder'" in errors[0] and "MainThread" in errors[0]
    assert gm.recording
    gm.backward(loss)                                 # the owner's backward still works
    np.testing.assert_array_equal(w.grad.numpy(), [4.0, 6.0])
    assert not gm.recording and _core._recording_keys() == []
