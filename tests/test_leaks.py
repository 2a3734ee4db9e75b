"""Leaks and robustness: what autodiff records dies when it is no longer
needed, without the cyclic GC (gc.disable()), long loops do not grow, and
every error leaves the library usable (nothing stays recording, the next
step's gradients are right)."""
import gc
import sys
import weakref

import numpy as np
import pytest

import gradcore as gc_
import gradcore.functional as F
import gradcore.memory as mem
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore import _core
from gradcore import autodiff
from gradcore import graph as _graph
from gradcore.autodiff import Function, GradManager
from gradcore.core import Grad, Op, apply

_DEFAULT_VISIBLE = _core._debug_state()["visible_below"]


@pytest.fixture
def no_gc():
    """Cyclic GC off: what must die has to die by reference counting."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@pytest.fixture(autouse=True)
def _clean_core():
    yield
    # a failing test must not leave keys recording for the next ones
    for k in _core._recording_keys():
        k.exit()


def _assert_clean():
    st = _core._debug_state()
    assert _core._recording_keys() == []
    assert st["recording"] == 0 and st["no_record"] == 0
    assert st["visible_below"] == _DEFAULT_VISIBLE
    assert autodiff._backwarding() == []


# ---------------------------------------------------------------- op families
class _Square(Function):
    def forward(self, x):
        self.save_for_backward(x)
        return x * x

    def backward(self, dy):
        (x,) = self.saved_tensors
        return dy * 2 * x


class _ExpFn(Function):
    def forward(self, x):
        y = F.exp(x)
        self.save_for_backward(y)     # a saved output
        return y

    def backward(self, dy):
        (y,) = self.saved_tensors
        return dy * y


class _OwnCube(Op):
    name = "leaks_own_cube"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * x * x

    def _grad_rule(self, x):
        (y,) = apply(self, x)

        def backward(dy):
            return dy * 3 * x * x
        return (y,), backward


_OWN = _OwnCube()
_LABELS = np.array([1, 0, 3, 7], "int32")
_IDX = np.array([list(range(8))[::-1]] * 4, "int32")


def _fam_elemwise(W, x):
    w = W[2] * 1
    return (F.tanh(x * w + 1) * F.exp(-x) / (1 + F.sigmoid(w)) - F.relu(x - w) ** 2).sum()


def _fam_reduce(W, x):
    y = x * W[2]
    return (y.sum(0).mean() + y.max(1).sum() + y.min() + F.var(y) + F.std(y, 1).sum()
            + F.logsumexp(y, 1).sum() + F.norm(y) + F.prod(y[:, :2], 1).sum())


def _fam_matmul(W, x):
    y = F.matmul(x, W.T) + F.matmul(x.reshape(1, 4, 8), W.T.reshape(1, 8, 8)).sum(0)
    return F.matmul(y, y, transpose_b=True).sum()


def _fam_conv_pool(W, x):
    k = W.reshape(-1)[:36].reshape(4, 1, 3, 3)
    y = F.conv2d(x.reshape(2, 1, 4, 4), k, padding=1)
    return (F.max_pool2d(y, 2) + F.avg_pool2d(y, 2)).sum()


def _fam_batch_norm(W, x):
    y = (x * W[2]).reshape(4, 8, 1, 1)
    rm = gc_.Tensor(np.zeros((1, 8, 1, 1), "float32"))
    rv = gc_.Tensor(np.ones((1, 8, 1, 1), "float32"))
    z = F.batch_norm(y, rm, rv, W[0].reshape(1, 8, 1, 1), W[1].reshape(1, 8, 1, 1), training=True)
    return (z * z).sum()


def _fam_softmax_ce(W, x):
    y = x * W[2]
    return F.softmax(y, 1).max() + F.cross_entropy(y, gc_.Tensor(_LABELS)) + F.log_softmax(y, 1).mean()


def _fam_getitem_setitem(W, x):
    y = x * W[2]
    z = y[1:3, ::2] * 2 + y[[0, 2]].sum() + y[y.detach() > 0].sum()
    y2 = y * 1
    y2[0] = z[0].sum()
    y2[:, 1] = 3.0
    return y2.sum() + z.sum()


def _fam_gather_scatter(W, x):
    y = x * W[2]
    idx = gc_.Tensor(_IDX)
    g = F.gather(y, 1, idx)
    s = F.scatter(y, 1, idx, g * 2)
    return (g * s).sum() + F.indexing_one_hot(y, gc_.Tensor(_LABELS), 1).sum()


def _fam_concat_split(W, x):
    y = x * W[2]
    a, b = F.split(y, 2, axis=1)
    return F.concat([a * 2, b, y], axis=1).sum() + (F.stack([a, b], axis=0) ** 2).sum()


def _fam_norm_composites(W, x):
    y = x * W[2]
    a = F.layer_norm(y, 8, affine=True, weight=W[0], bias=W[1])
    b = F.group_norm(y.reshape(4, 8, 1, 1), 2, affine=False)
    c = F.pad(y, ((1, 1), (0, 2)))
    return (a * a).sum() + (b * b).sum() + (c * c).sum()


def _fam_function(W, x):
    y = x * W[2]
    return _Square()(y).sum() + _ExpFn()(y * 0.1).sum()


def _fam_own_rule(W, x):
    return apply(_OWN, x * W[2])[0].sum()


FAMILIES = {f.__name__[5:]: f for f in (
    _fam_elemwise, _fam_reduce, _fam_matmul, _fam_conv_pool, _fam_batch_norm, _fam_softmax_ce,
    _fam_getitem_setitem, _fam_gather_scatter, _fam_concat_split, _fam_norm_composites,
    _fam_function, _fam_own_rule)}

_R = np.random.RandomState(1234)
_W0 = _R.randn(8, 8).astype("float32")
_X0 = _R.randn(4, 8).astype("float32")


def _inputs():
    return gc_.Parameter(_W0.copy()), gc_.Tensor(_X0.copy())


_REF = {}


def _reference(name):
    """The first-order gradient of a family in a fresh setting."""
    if name not in _REF:
        w, x = _inputs()
        gm = GradManager().attach([w])
        with gm:
            gm.backward(FAMILIES[name](w, x))
        _REF[name] = w.grad.numpy().copy()
    return _REF[name]


# ---------------------------------------------------------------- (1) weakrefs
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_outputs_die_after_backward_and_after_release(name, no_gc):
    fam = FAMILIES[name]
    w, x = _inputs()
    gm = GradManager().attach([w])
    gm.record()
    key = gm._key
    loss = fam(w, x)
    refs = [weakref.ref(loss), weakref.ref(loss._data)]
    assert key.tape_length > 0
    gm.backward(loss)
    assert not gm.recording and key.tape_length == 0
    del loss
    assert all(r() is None for r in refs)
    np.testing.assert_allclose(w.grad.numpy(), _reference(name), rtol=1e-4, atol=1e-5)

    gm.record()
    key = gm._key
    loss = fam(w, x)
    refs = [weakref.ref(loss), weakref.ref(loss._data)]
    gm.release()
    assert key.tape_length == 0
    del loss
    assert all(r() is None for r in refs)
    _assert_clean()


_UNARY = {
    "sum": lambda h: h.sum(), "mean": lambda h: h.mean(1), "exp": F.exp, "relu": F.relu,
    "tanh": F.tanh, "sigmoid": F.sigmoid, "mul_const": lambda h: h * 2, "add_const": lambda h: h + 1,
    "neg": lambda h: -h, "softmax": lambda h: F.softmax(h, 1),
    "log_softmax": lambda h: F.log_softmax(h, 1),
    "cross_entropy_of_probabilities": lambda h: F.cross_entropy(F.softmax(h, 1), gc_.Tensor(_LABELS),
                                                                with_logits=False),
    "indexing_one_hot": lambda h: F.indexing_one_hot(h, gc_.Tensor(_LABELS), 1),
    "concat": lambda h: F.concat([h, h]), "pad": lambda h: F.pad(h, ((1, 1), (0, 0))),
}


@pytest.mark.parametrize("name", sorted(_UNARY))
def test_an_intermediate_no_backward_needs_is_freed_when_dropped(name, no_gc):
    w, x = _inputs()
    gm = GradManager().attach([w])
    with gm:
        h = x * w[2]
        rh, rd = weakref.ref(h), weakref.ref(h._data)
        y = _UNARY[name](h)
        del h
        assert rh() is None, "the intermediate Tensor is kept while recording"
        assert rd() is None, "the intermediate's data is kept, but no backward reads it"
        gm.backward(y.sum())
    assert w.grad is not None


def test_cross_entropy_keeps_its_logits_and_nothing_else(no_gc):
    """The fused CrossEntropy's backward recomputes the softmax from the
    logits: they are what it keeps (the composition kept log_softmax's
    output, of the same size), until the backward has run."""
    w, x = _inputs()
    gm = GradManager().attach([w])
    with gm:
        h = x * w[2]
        rh, rd = weakref.ref(h), weakref.ref(h._data)
        loss = F.cross_entropy(h, gc_.Tensor(_LABELS))
        del h
        assert rh() is None, "the logits' Tensor is kept while recording"
        assert rd() is not None, "the backward reads the logits"
        gm.backward(loss)
    assert rd() is None, "the logits are kept after the backward"
    assert w.grad is not None
    _assert_clean()


def test_second_and_third_order_keep_nothing(no_gc):
    w = gc_.Parameter(_R.randn(5).astype("float64"))
    g1, g2, g3 = (GradManager().attach([w]) for _ in range(3))
    refs = []
    with g1:
        with g2:
            with g3:
                y = (w ** 4).sum()
                refs.append(weakref.ref(y))
                g3.backward(y)
            a = w.grad
            w.grad = None
            g2.backward(a.sum())
        b = w.grad
        w.grad = None
        g1.backward(b.sum())
    refs += [weakref.ref(a), weakref.ref(b), weakref.ref(a._data), weakref.ref(b._data)]
    np.testing.assert_allclose(w.grad.numpy(), 24 * w.numpy())
    del y, a, b
    assert all(r() is None for r in refs)
    _assert_clean()


@pytest.mark.parametrize("name", ["elemwise", "matmul", "softmax_ce", "function", "own_rule",
                                  "norm_composites"])
def test_nested_and_grouped_managers_keep_nothing(name, no_gc):
    fam = FAMILIES[name]
    w, x = _inputs()
    g1, g2 = GradManager().attach([w]), GradManager().attach([w])
    with g1:
        with g2:
            loss = fam(w, x)
            refs = [weakref.ref(loss)]
            g2.backward(loss)
        g = w.grad
        w.grad = None
        refs.append(weakref.ref(g))
        g1.backward((g * g).sum())
    del loss, g
    assert all(r() is None for r in refs)
    w.grad = None
    with g1 | g2:
        loss = fam(w, x)
        r = weakref.ref(loss)
        g1.backward(loss)
        g2.backward(loss)
    del loss
    assert r() is None
    np.testing.assert_allclose(w.grad.numpy(), 2 * _reference(name), rtol=1e-4, atol=1e-5)
    _assert_clean()


def test_managers_and_grads_are_freed_without_the_cyclic_gc(no_gc):
    w = gc_.Parameter([1.0, 2.0])
    gm = GradManager().attach([w], callbacks=lambda t, g: g)
    with gm:
        gm.backward((w * w).sum())
    r = weakref.ref(gm)
    del gm
    assert r() is None
    with Grad() as g:
        g.wrt(w, callback=lambda d: None)
        g([(w * 2).sum()], [None])
    r = weakref.ref(g)
    del g
    assert r() is None


def test_attached_tensor_deleted_is_freed_and_forgotten(no_gc):
    gm = GradManager()
    t = gc_.Tensor([1.0, 2.0])
    r = weakref.ref(t)
    gm.attach([t])
    del t
    assert r() is None and gm.attached_tensors() == [] and not gm._attach_specs
    with gm:
        t = gc_.Tensor([1.0, 2.0])
        r = weakref.ref(t)
        gm.attach([t])
        (t * t).sum()
        del t
        assert r() is None
    assert not gm._attach_specs


# ---------------------------------------------------------------- regressions
def test_a_manager_dropped_while_recording_stops_recording(no_gc):
    w = gc_.Parameter([1.0, 2.0])
    gm = GradManager().attach([w])
    gm.record()
    key = weakref.ref(gm._key)
    (w * 2).sum()
    del gm
    assert _core._recording_keys() == []
    # ops on the attached tensor are no longer recorded on a dead key
    assert not (w * 2)._is_recorded()
    assert key() is None or key().tape_length == 0
    # and a new manager works
    gm = GradManager().attach([w])
    with gm:
        gm.backward((w * w).sum())
    np.testing.assert_allclose(w.grad.numpy(), [2.0, 4.0])


def test_a_grad_dropped_while_recording_stops_recording(no_gc):
    w = gc_.Tensor([1.0, 2.0])
    g = Grad().wrt(w, callback=lambda d: None)      # auto-entered, never called
    (w * 2).sum()
    del g
    assert _core._recording_keys() == []
    g = Grad()
    g.__enter__()
    g.wrt(w)
    del g
    assert _core._recording_keys() == []
    assert not (w * 2)._is_recorded()


def test_managers_dropped_while_recording_do_not_grow_the_tapes():
    w = gc_.Parameter(np.ones(16, "float32"))
    for _ in range(30):
        g = GradManager().attach([w])
        g.record()
        (w * 2 + 1).sum()
    del g
    assert _core._recording_keys() == []


def test_a_kept_function_instance_does_not_keep_what_it_saved(no_gc):
    w = gc_.Parameter(np.ones(3, "float32"))
    sq = _Square()
    gm = GradManager().attach([w])
    with gm:
        h = w * 3
        r = weakref.ref(h._data)
        y = sq(h)
        del h
        gm.backward(y.sum())
    del y
    assert r() is None, "the Function instance keeps its saved tensors after backward"
    np.testing.assert_allclose(w.grad.numpy(), [18.0] * 3)
    # released without backward
    gm.record()
    h = w * 3
    r = weakref.ref(h._data)
    y = sq(h)
    del h, y
    gm.release()
    assert r() is None


def test_a_backward_with_bad_arguments_ends_the_recording():
    w = gc_.Parameter([1.0, 2.0])
    gm = GradManager().attach([w])
    gm.record()
    with pytest.raises(TypeError):
        gm.backward([w * 2, 3])
    assert not gm.recording
    _assert_clean()
    gm.record()
    with pytest.raises(ValueError):
        gm.backward([w * 2], [None, None])
    assert not gm.recording
    gm.record()             # not stuck: records again
    gm.backward((w * w).sum())
    np.testing.assert_allclose(w.grad.numpy(), [2.0, 4.0])


def test_the_backward_graph_cache_is_bounded(monkeypatch):
    class Scale(Op):
        name = "leaks_scale"
        attrs = ("k",)

        def __init__(self, k):
            self.k = float(k)

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return x * self.k

        def vjp(self, inputs, outputs, grads):
            return (grads[0] * self.k,)

    monkeypatch.setattr(_graph, "_CACHE_LIMIT", 16, raising=False)
    w = gc_.Parameter(np.ones(2, "float32"))
    gm = GradManager().attach([w])
    for i in range(60):          # a new attribute value per step
        w.grad = None
        with gm:
            gm.backward(apply(Scale(1 + i), w)[0].sum())
        np.testing.assert_allclose(w.grad.numpy(), [1.0 + i] * 2)
    assert _graph.cache_info()["size"] <= 16


# ---------------------------------------------------------------- (4) errors
class _BadBackward(Function):
    def forward(self, x):
        self.save_for_backward(x)
        return x * 2

    def backward(self, dy):
        raise ValueError("backward failed")


class _InterruptedForward(Function):
    def forward(self, x):
        self.save_for_backward(x)
        raise KeyboardInterrupt

    def backward(self, dy):
        return dy


class _WrongCount(Op):
    name = "leaks_wrong_count"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * 1

    def _grad_rule(self, x):
        (y,) = apply(self, x)
        return (y,), lambda dy: (dy, dy)


def _interrupt(t, g):
    raise KeyboardInterrupt


def _err_forward(w, x, outer):
    with GradManager().attach([w]):
        y = w * 2
        F.matmul(y, gc_.Tensor(np.ones((3, 3), "float32")))


def _err_function_backward(w, x, outer):
    gm = GradManager().attach([w])
    with gm:
        gm.backward(_BadBackward()(w * 3).sum() + (w * x[0]).sum())


def _err_function_forward_interrupted(w, x, outer):
    with GradManager().attach([w]):
        _InterruptedForward()(w * 1)


def _err_callback_interrupt(w, x, outer):
    gm = GradManager().attach([w], callbacks=_interrupt)
    gm.record()                  # no `with`: backward itself must end the recording
    gm.backward((w * w).sum())


def _err_group_callback_interrupt(w, x, outer):
    a, b = GradManager().attach([w], callbacks=_interrupt), GradManager().attach([w])
    with a | b:
        y = (w * w).sum()
        a.backward(y)


def _err_rule_wrong_count(w, x, outer):
    gm = GradManager().attach([w])
    with gm:
        gm.backward(apply(_WrongCount(), w * 2)[0].sum())


def _err_after_backward_callback(w, x, outer):
    gm = GradManager().attach([w]).register_after_backward_callback(lambda: 1 / 0)
    with gm:
        gm.backward((w * 2).sum())


def _err_wrong_dy(w, x, outer):
    gm = GradManager().attach([w])
    gm.record()
    gm.backward(w * 2, dy=F.ones((3,)))


def _err_grad_callback(w, x, outer):
    g = Grad()
    g.wrt(w, callback=lambda d: 1 / 0)
    g([(w * 2).sum()], [None])


_ERRORS = [_err_forward, _err_function_backward, _err_function_forward_interrupted,
           _err_callback_interrupt, _err_group_callback_interrupt, _err_rule_wrong_count,
           _err_after_backward_callback, _err_wrong_dy, _err_grad_callback]


@pytest.mark.parametrize("nested", [False, True], ids=["alone", "under_an_outer_manager"])
@pytest.mark.parametrize("err", _ERRORS, ids=[e.__name__[5:] for e in _ERRORS])
def test_an_error_leaves_the_library_usable(err, nested):
    w, x = _inputs()
    if nested:
        outer = GradManager().attach([w])
        with pytest.raises((Exception, KeyboardInterrupt)):
            with outer:
                err(w, x, outer)
        assert not outer.recording
    else:
        with pytest.raises((Exception, KeyboardInterrupt)):
            err(w, x, None)
    assert w.grad is None
    _assert_clean()
    for name in ("elemwise", "function", "own_rule", "softmax_ce"):
        w.grad = None
        gm = GradManager().attach([w])
        with gm:
            gm.backward(FAMILIES[name](w, x))
        np.testing.assert_allclose(w.grad.numpy(), _reference(name), rtol=1e-4, atol=1e-5)
    # second order still right
    w.grad = None
    g1, g2 = GradManager().attach([w]), GradManager().attach([w])
    with g1:
        with g2:
            g2.backward((w ** 3).sum())
        a = w.grad
        w.grad = None
        g1.backward(a.sum())
    np.testing.assert_allclose(w.grad.numpy(), 6 * _W0, rtol=1e-4)
    _assert_clean()


def test_an_inner_error_leaves_the_outer_manager_recording_correctly():
    w, x = _inputs()
    outer = GradManager().attach([w])
    with outer:
        with pytest.raises(ValueError):
            inner = GradManager().attach([w])
            with inner:
                inner.backward(_BadBackward()(w * 3).sum())
        assert outer.recording
        outer.backward((w * w).sum())
    np.testing.assert_allclose(w.grad.numpy(), 2 * _W0, rtol=1e-6)
    _assert_clean()


# ---------------------------------------------------------------- (2)(3)(5) loops
def _counts(params):
    gc.collect()
    return (len(gc.get_objects()), sys.getallocatedblocks(),
            [sys.getrefcount(p) for p in params])


def _assert_no_growth(step, params, n=150, warm=40, blocks=400):
    for _ in range(warm):
        step()
    o0, b0, r0 = _counts(params)
    for _ in range(n):
        step()
    o1, b1, r1 = _counts(params)
    assert o1 - o0 <= 20, f"{o1 - o0} more GC-tracked objects after {n} steps"
    assert b1 - b0 <= blocks, f"{b1 - b0} more allocated blocks after {n} steps"
    assert r1 == r0, "parameter reference counts changed"
    _assert_clean()


@pytest.mark.parametrize("name", ["elemwise", "conv_pool", "batch_norm", "getitem_setitem",
                                  "function", "own_rule"])
def test_first_and_second_order_loops_do_not_grow(name):
    fam = FAMILIES[name]
    w, x = _inputs()
    gm, g1, g2 = GradManager().attach([w]), GradManager().attach([w]), GradManager().attach([w])

    def step():
        with gm:
            gm.backward(fam(w, x))
        w.grad = None
        gm.record()
        fam(w, x)
        gm.release()
        with g1:
            with g2:
                g2.backward(fam(w, x))
            g = w.grad
            w.grad = None
            g1.backward((g * g).sum())
        w.grad = None
    _assert_no_growth(step, [w, x], n=100, warm=20)


def test_error_loops_do_not_grow():
    w, x = _inputs()

    def step():
        for err in _ERRORS:
            try:
                err(w, x, None)
            except (Exception, KeyboardInterrupt):
                pass
        g = GradManager().attach([w])       # dropped while recording
        g.record()
        (w * 2).sum()
    _assert_no_growth(step, [w], n=60, warm=10, blocks=600)


def test_training_loop_with_batchnorm_and_dropout_does_not_grow():
    gc_.random.seed(0)

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.conv = M.Conv2d(1, 4, 3, padding=1)
            self.bn = M.BatchNorm2d(4)
            self.drop = M.Dropout(0.3)
            self.fc = M.Linear(4 * 16, 3)

        def forward(self, x):
            x = self.drop(F.relu(self.bn(self.conv(x))))
            return self.fc(F.flatten(x, 1))

    net = Net()
    net.train()
    params = list(net.parameters())
    opt = optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=1e-4)
    gm = GradManager().attach(params)
    x = gc_.Tensor(_R.randn(8, 1, 4, 4).astype("float32"))
    y = gc_.Tensor(_R.randint(0, 3, 8).astype("int32"))

    def step():
        with gm:
            gm.backward(F.cross_entropy(net(x), y))
        opt.step().clear_grad()
    _assert_no_growth(step, params, n=200)


def test_optimizer_loop_keeps_the_host_pool_bounded():
    model = M.Sequential(M.Linear(128, 256), M.ReLU(), M.Linear(256, 10))
    params = list(model.parameters())
    opt = optim.Adam(params, lr=1e-3)
    gm = GradManager().attach(params)
    x = gc_.Tensor(_R.randn(64, 128).astype("float32"))      # activations of 64 KiB
    y = gc_.Tensor(_R.randint(0, 10, 64).astype("int32"))

    def step():
        with gm:
            gm.backward(F.cross_entropy(model(x), y))
        opt.step().clear_grad()
    for _ in range(20):
        step()
    s0 = mem.stats()
    _assert_no_growth(step, params, n=200, warm=0)
    s1 = mem.stats()
    assert s1["cached_bytes"] <= s1["limit"]
    if mem.is_enabled():
        # the same buffers every step: reused, not asked of malloc again
        assert s1["cached_bytes"] <= s0["cached_bytes"] + (1 << 20)
        assert s1["misses"] - s0["misses"] <= 10
        assert s1["hits"] > s0["hits"]


def test_an_op_is_freed_by_reference_counting_after_its_kernel_ran():
    # the core caches the op's CPU kernel: as the class's function, not a
    # bound method (op -> method -> op would leave ops to the cyclic GC)
    from gradcore.op import clear_interned
    from gradcore.ops import Reshape
    w = gc_.Tensor([1.0, 2.0])
    gm = GradManager().attach(w)
    gc.disable()
    try:
        # shapes no other test reshapes to: F's own op caches (functional's
        # interned constructors) would otherwise keep an equal op alive
        for shape in ((1, 1, 2, 1, 1, 1), (1, 2, 1, 1, 1, 1)):
            op = Reshape(shape)
            apply(op, w)                           # not recorded
            ref = weakref.ref(op)
            del op
            clear_interned()                       # equal ops are interned (bounded): let this one go
            assert ref() is None
        op = Reshape((2, 1, 1))
        with gm:
            gm.backward(apply(op, w)[0].sum())      # recorded: graph cached on the op
        np.testing.assert_array_equal(w.grad.numpy(), [1.0, 1.0])
    finally:
        gc.enable()
