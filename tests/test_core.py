"""The compiled core: dispatch, the three gradient paths, backward graphs,
memory (what is kept, what is freed, no cycles) and error handling."""
import gc as pygc
import os
import weakref

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore import _core
from gradcore.autodiff import GradManager
from gradcore.core import (GradRuleFallback, NotDifferentiableError, Op, TensorDesc, apply,
                           cache_info, make_backward_graph, register_grad_rule)
from gradcore.graph import clear_cache
from gradcore.ops import Elemwise, LogSoftmax, MatrixMul, Reduce, Reshape
from gradcore.ops.elemwise import ROWS


def grad_of(fn, *xs):
    gm = GradManager().attach(list(xs))
    with gm:
        gm.backward(fn(*xs))
    return [x.grad for x in xs]


def test_import_without_built_core_says_how_to_build(tmp_path):
    import shutil
    import subprocess
    import sys
    src = os.path.dirname(gc.__file__)
    shutil.copytree(src, tmp_path / "gradcore", ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    # the copy has no compiled extension; hide an editable install's finder
    code = ("import sys; sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
            f"sys.path.insert(0, {str(tmp_path)!r}); import gradcore")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode != 0
    assert "not built" in out.stderr and "pip install -e ." in out.stderr


def test_apply_returns_tuple_and_records():
    x = gc.tensor([1.0, 2.0])
    out = apply(Elemwise("mul"), x, x)
    assert isinstance(out, tuple) and len(out) == 1
    np.testing.assert_allclose(out[0].numpy(), [1.0, 4.0])
    (g,) = grad_of(lambda x: apply(Elemwise("mul"), x, x)[0].sum(), x)
    np.testing.assert_allclose(g.numpy(), [2.0, 4.0])


def test_relu_mask():
    d = TensorDesc((3,), "float32", "cpu")
    graph, mask, has = make_backward_graph(Elemwise("relu"), [d], [True], [True])
    assert mask == [False, True, True]
    assert has == [True]


def test_masks_of_common_ops():
    d = TensorDesc((2, 3), "float32", "cpu")
    _, mask, _ = make_backward_graph(Elemwise("add"), [d, d], [True, True], [True])
    assert mask == [False, False, False, True]
    _, mask, _ = make_backward_graph(Elemwise("mul"), [d, d], [True, False], [True])
    assert mask == [False, True, False, True]          # d(x*y)/dx reads only y
    _, mask, _ = make_backward_graph(Elemwise("exp"), [d], [True], [True])
    assert mask == [False, True, True]                  # reads the output, not the input
    _, mask, _ = make_backward_graph(LogSoftmax(1), [d], [True], [True])
    assert mask == [False, True, True]


def test_shape_reads_go_to_precomp():
    d = TensorDesc((2, 3), "float32", "cpu")
    graph, mask, _ = make_backward_graph(Reduce("sum", 1), [d], [True], [True])
    assert mask == [False, False, True]                 # x is read only for its shape
    assert len(graph.precomp) == 1
    graph, mask, _ = make_backward_graph(Reshape((3, 2)), [d], [True], [True])
    assert mask == [False, False, True] and graph.precomp


def test_backward_graph_cache_hit():
    clear_cache()
    d = TensorDesc((4,), "float32", "cpu")
    before = cache_info()
    g1, _, _ = make_backward_graph(Elemwise("tanh"), [d], [True], [True])
    mid = cache_info()
    g2, _, _ = make_backward_graph(Elemwise("tanh"), [TensorDesc((7, 2), "float32", "cpu")], [True], [True])
    after = cache_info()
    assert mid["misses"] == before["misses"] + 1
    assert after["hits"] == mid["hits"] + 1 and g1 is g2
    g3, _, _ = make_backward_graph(Elemwise("tanh"), [TensorDesc((4,), "float64", "cpu")], [True], [True])
    assert g3 is not g1                                   # dtype is part of the key


def test_requires_grad_mask_prunes_dead_code():
    d = TensorDesc(None, "float32", "cpu")
    graph, mask, has = make_backward_graph(MatrixMul(), [d, d], [True, False], [True])
    assert has == [True, False]
    assert len(graph.nodes) == 1 and mask == [False, True, False, True]


def test_intermediate_freed_while_recording():
    x = gc.tensor(np.random.rand(100).astype("float32"))
    gm = GradManager().attach(x)
    with gm:
        h = x * 2            # mul by a constant keeps the constant, not h's inputs
        r = weakref.ref(h)
        y = F.exp(h)         # exp keeps its output, not h
        del h
        assert r() is None
        gm.backward(y.sum())
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp(2 * x.numpy()), rtol=1e-5)


def test_saved_values_released_after_backward():
    x = gc.tensor(np.random.rand(50).astype("float32"))
    gm = GradManager().attach(x)
    with gm:
        y = F.exp(x)
        data_ref = weakref.ref(y._data)
        z = y.sum()
        del y
        assert data_ref() is not None        # saved for exp's backward
        gm.backward(z)
        assert data_ref() is None            # freed as soon as the node ran


def test_no_reference_cycles():
    pygc.collect()
    pygc.disable()
    try:
        x = gc.tensor(np.random.rand(3, 4).astype("float32"))
        w = gc.Parameter(np.random.rand(4, 2).astype("float32"))
        gm = GradManager().attach([w])
        for _ in range(3):
            with gm:
                y = F.log_softmax(F.relu(F.matmul(x, w)), 1)
                gm.backward(y.sum())
        del x, w, gm, y
        assert pygc.collect() == 0
    finally:
        pygc.enable()


def test_nothing_recorded_stays_alive_after_release():
    x = gc.tensor(np.random.rand(10).astype("float32"))
    gm = GradManager().attach(x)
    with gm:
        y = F.exp(F.sin(x))
        ref = weakref.ref(y._data)
    del y
    assert ref() is None


def test_unrecorded_op_does_not_record():
    x = gc.tensor([1.0])
    y = x * 2
    assert not y._is_recorded()


# ---------------------------------------------------------------- gradient paths
class Cube(Op):
    name = "test_cube"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * x * x


class CubeWithRule(Cube):
    name = "test_cube_rule"
    calls = 0

    def _grad_rule(self, x):
        y = apply(Cube(), x)[0]
        CubeWithRule.calls += 1
        return y, lambda dy: dy * 3 * x * x


def test_path1_own_grad_rule():
    x = gc.tensor([1.0, 2.0])
    CubeWithRule.calls = 0
    (g,) = grad_of(lambda x: apply(CubeWithRule(), x)[0].sum(), x)
    np.testing.assert_allclose(g.numpy(), [3.0, 12.0])
    assert CubeWithRule.calls == 1
    # without recording the kernel runs directly
    np.testing.assert_allclose(apply(CubeWithRule(), x)[0].numpy(), [1.0, 8.0])
    assert CubeWithRule.calls == 1


def test_op_without_path_raises_naming_it():
    x = gc.tensor([1.0, 2.0])
    np.testing.assert_allclose(apply(Cube(), x)[0].numpy(), [1.0, 8.0])   # fine unrecorded
    gm = GradManager().attach(x)
    with gm:
        with pytest.raises(NotDifferentiableError, match="test_cube.*register_grad_rule"):
            apply(Cube(), x)
    # the library is still usable
    (g,) = grad_of(lambda x: (x * x).sum(), x)
    np.testing.assert_allclose(g.numpy(), [2.0, 4.0])


class Scale(Op):
    name = "test_scale"
    attrs = ("k",)

    def __init__(self, k):
        self.k = k

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * self.k

    def vjp(self, inputs, outputs, grads):
        return [grads[0] * self.k]


def test_path2_registered_rule_and_fallback():
    used = []

    @register_grad_rule(Scale)
    def rule(op, x):
        if op.k < 0:
            used.append("fallback")
            raise GradRuleFallback
        used.append("rule")
        y = apply(op, x)[0]
        return y, lambda dy: dy * op.k * 100     # deliberately distinguishable

    try:
        x = gc.tensor([1.0])
        (g,) = grad_of(lambda x: apply(Scale(2.0), x)[0].sum(), x)
        assert float(g.item()) == 200.0 and used == ["rule"]
        (g,) = grad_of(lambda x: apply(Scale(-3.0), x)[0].sum(), gc.tensor([1.0]))
        assert float(g.item()) == -3.0 and used == ["rule", "fallback"]   # generic graph
    finally:
        _core.unregister_grad_rule(Scale)


def test_unregistering_a_rule_gives_the_ops_own_vjp_back_at_once():
    """gradcore.unregister_grad_rule (public, as registered_grad_rule): the
    next backward of the same op instance takes its vjp (the backward
    cached for the rule is dropped, as registering drops it)."""
    def rule(op, x):
        return apply(op, x)[0], lambda dy: dy * op.k * 100     # deliberately distinguishable

    op, x = Scale(2.0), gc.tensor([1.0])
    gc.register_grad_rule(Scale)(rule)
    try:
        assert gc.registered_grad_rule(Scale) is rule
        (g,) = grad_of(lambda x: apply(op, x)[0].sum(), x)
        assert float(g.item()) == 200.0
    finally:
        gc.unregister_grad_rule(Scale)
    assert gc.registered_grad_rule(Scale) is None
    (g,) = grad_of(lambda x: apply(op, x)[0].sum(), gc.tensor([1.0]))
    assert float(g.item()) == 2.0


def test_rule_returning_wrong_count_names_op():
    @register_grad_rule(Scale)
    def rule(op, x):
        return apply(op, x)[0], lambda dy: (dy, dy)

    try:
        x = gc.tensor([1.0])
        gm = GradManager().attach(x)
        with gm:
            y = apply(Scale(2.0), x)[0]
            with pytest.raises(ValueError, match="test_scale.*2 gradients for 1 input$"):
                gm.backward(y)
    finally:
        _core.unregister_grad_rule(Scale)


def test_broadcast_gradients_reduced_centrally():
    a = gc.tensor(np.random.rand(3, 1).astype("float32"))
    b = gc.tensor(np.random.rand(4).astype("float32"))
    ga, gb = grad_of(lambda a, b: (a * b).sum(), a, b)
    assert ga.shape == (3, 1) and gb.shape == (4,)
    np.testing.assert_allclose(ga.numpy(), np.full((3, 1), b.numpy().sum()), rtol=1e-5)
    np.testing.assert_allclose(gb.numpy(), np.full(4, a.numpy().sum()), rtol=1e-5)


def test_gradient_accumulates_over_uses_without_touching_user_buffers():
    x = gc.tensor([1.0, 2.0])
    dy = gc.tensor([1.0, 1.0])
    before = dy.numpy().copy()
    gm = GradManager().attach(x)
    with gm:
        y = x + x + x * x
        gm.backward(y, dy)
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 6.0])
    np.testing.assert_array_equal(dy.numpy(), before)


def test_shape_mismatch_error_names_op_and_shapes():
    a, b = gc.tensor(np.ones((2, 3))), gc.tensor(np.ones(4))
    with pytest.raises(ValueError, match=r"Elemwise\(add\).*\(2, 3\).*\(4,\)"):
        a + b
    with pytest.raises(ValueError, match=r"MatrixMul.*inner dimensions"):
        F.matmul(gc.tensor(np.ones((2, 3))), gc.tensor(np.ones((4, 2))))


def test_mixed_devices_rejected():
    a = gc.tensor([1.0])
    b = gc.tensor([1.0])
    b._device = "other"
    with pytest.raises(RuntimeError, match="different devices"):
        a + b


def test_inplace_ops_are_recorded():
    x = gc.tensor([1.0, 2.0])
    gm = GradManager().attach(x)
    with gm:
        y = x * 1
        y += x          # y = 2x
        y *= x          # y = 2x^2
        y[0] = y[0] * 3  # y0 = 6x0^2
        gm.backward(y.sum())
    np.testing.assert_allclose(x.grad.numpy(), [12.0, 8.0])


def test_numpy_view_is_read_only():
    x = gc.tensor([1.0, 2.0])
    with pytest.raises(ValueError):
        x.numpy()[0] = 5


def test_state_clean_after_errors():
    x = gc.tensor([1.0])
    gm = GradManager().attach(x)
    with pytest.raises(ValueError):
        with gm:
            y = x * 2
            gm.backward(y, gc.tensor([1.0, 2.0]))   # wrong dy shape
    st = _core._debug_state()
    assert st["recording"] == 0 and st["no_record"] == 0
    with gm:
        gm.backward(x * 2)
    np.testing.assert_allclose(x.grad.numpy(), [2.0])


def test_parameter_modified_in_place_after_save_raises():
    import gradcore.optimizer as optim
    w = gc.Parameter(np.ones((2, 2), "float32"))
    x = gc.tensor(np.ones((3, 2), "float32"))
    gm = GradManager().attach([w, x])
    opt = optim.SGD([w], lr=0.1)
    with gm:
        loss = F.matmul(w, x, transpose_b=True).sum()   # dx would need w: saved
        w.grad = gc.tensor(np.ones((2, 2), "float32"))
        opt.step()                        # writes w's buffer in place
        with pytest.raises(RuntimeError, match=r"MatrixMul.*\(2, 2\).*modified in place"):
            gm.backward(loss)
    # usable again: a fresh recording works
    w.grad = x.grad = None
    with gm:
        gm.backward(F.matmul(x, w).sum())
    np.testing.assert_allclose(w.grad.numpy(), np.full((2, 2), 3.0))


def test_optimizer_updates_reuse_the_parameter_buffer():
    import gradcore.optimizer as optim
    w = gc.Parameter(np.ones(4, "float32"))
    buf = w._data
    opt = optim.SGD([w], lr=0.5, momentum=0.9)
    for _ in range(3):
        gm = GradManager().attach(w)
        with gm:
            gm.backward((w * w).sum())
        opt.step().clear_grad()
    assert w._data is buf and w.grad is None
    # reference: the same momentum SGD in NumPy
    p, v = np.ones(4), None
    for _ in range(3):
        g = 2 * p
        v = g if v is None else 0.9 * v + g
        p = p - 0.5 * v
    np.testing.assert_allclose(w.numpy(), p, rtol=1e-6)


def test_tensor_from_array_does_not_share_the_buffer():
    a = np.ones(3, "float32")
    t = gc.Parameter(a)
    a[0] = 5
    assert t.numpy()[0] == 1


def test_training_loop_does_not_leak():
    import tracemalloc
    import gradcore.module as M
    import gradcore.optimizer as optim
    net = M.Sequential(M.Linear(8, 16), M.ReLU(), M.Linear(16, 3))
    gm = GradManager().attach(net.parameters())
    opt = optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = gc.tensor(np.random.rand(4, 8).astype("float32"))
    y = gc.tensor(np.array([0, 1, 2, 1], "int32"))

    def steps(n):
        for _ in range(n):
            with gm:
                gm.backward(F.cross_entropy(net(x), y))
            opt.step().clear_grad()

    steps(20)                                  # warm caches and pools
    tracemalloc.start()
    steps(100)
    first = tracemalloc.get_traced_memory()[0]
    steps(300)
    second = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert second - first < 64 * 1024, f"memory grew by {second - first} bytes over 300 steps"


def test_softmax_hand_rule_keeps_only_the_output():
    from gradcore.ops import Softmax
    d = TensorDesc((2, 3), "float32", "cpu")
    _, mask, _ = make_backward_graph(Softmax(1), [d], [True], [True])
    assert mask == [False, True, True]


def test_wrongly_shaped_gradient_from_a_plugin_vjp_is_caught_at_its_op():
    class BadVJP(Op):
        name = "test_bad_vjp"

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return x * 2

        def vjp(self, inputs, outputs, grads):
            return [grads[0].sum()]          # wrong: a scalar for a vector input

    x = gc.tensor([1.0, 2.0, 3.0])
    gm = GradManager().attach(x)
    with gm:
        y = apply(BadVJP(), x)[0]
        with pytest.raises(ValueError, match=r"test_bad_vjp: backward returned a gradient of shape \(\) "
                                             r"for input 0 of shape \(3,\)"):
            gm.backward(y.sum())
    with gm:                                  # still usable
        gm.backward((x * 2).sum())
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0, 2.0])


# ---------------------------------------------------------------- operators and in-place ops
def test_in_place_ops_under_two_managers_keep_saved_values(torch):
    # with two keys recording, saved values are tensors (for second order);
    # an in-place op rebinding the user's tensor must not change them
    def run(body):
        x = gc.Tensor([1., 2., 3.], dtype="float64")
        g1, g2 = GradManager().attach([x]), GradManager().attach([x])
        with g2:
            with g1:
                g1.backward(body(x).sum())
        return x.grad.numpy()

    def inplace_mul(x):
        y = x * 2.0
        y *= x
        return y

    def setitem_after_use(x):
        y = x * 2.0
        z = y * y
        y[0] = 10.0
        return z

    for body in (inplace_mul, setitem_after_use):
        t = torch.tensor([1., 2., 3.], dtype=torch.float64, requires_grad=True)
        tx = t.clone()
        if body is inplace_mul:
            ty = tx * 2.0
            ty = ty * tx
        else:
            ty = (tx * 2.0) ** 2
        ty.sum().backward()
        np.testing.assert_allclose(run(body), t.grad.numpy())


def test_bitwise_operators_are_logical_on_bool_and_refuse_other_dtypes():
    a = gc.Tensor([True, False, True])
    b = gc.Tensor([True, True, False])
    assert (a & b).numpy().tolist() == [True, False, False]
    assert (a | b).numpy().tolist() == [True, True, True]
    assert (a ^ b).numpy().tolist() == [False, True, True]
    assert (~a).numpy().tolist() == [False, True, False]
    assert (True & a).numpy().tolist() == [True, False, True]
    assert (False | a).numpy().tolist() == [True, False, True]
    c = gc.Tensor([True, False, True])
    c &= b
    assert c.numpy().tolist() == [True, False, False]
    for bad in (lambda: gc.Tensor([1, 2]) & gc.Tensor([2, 2]), lambda: gc.Tensor([1.0]) | a,
                lambda: ~gc.Tensor([1.0, 2.0]), lambda: a ^ 1):
        with pytest.raises(TypeError, match=r"logical_\w+ .*bool.*shapes"):
            bad()


def test_in_place_ops_rebind_to_another_kind_and_keep_a_wider_same_kind():
    x = gc.Tensor([1, 2, 3])
    alias = x
    # int32 + 1.5 is float32 (gradcore.dtypes): the tensor becomes it, as MegEngine's
    # in-place operators rebind to their result (an int accumulator += a float loss)
    x += 1.5
    assert x is alias and x.dtype == np.float32 and x.numpy().tolist() == [2.5, 3.5, 4.5]
    n = gc.Tensor([4, 6])
    n /= 2
    assert n.dtype == np.float32 and n.numpy().tolist() == [2.0, 3.0]
    f = gc.Tensor([1.0, 2.0])
    f += np.float64(0.5)                         # same kind: cast back, as NumPy does
    assert f.dtype == np.float32 and f.numpy().tolist() == [1.5, 2.5]


def test_floor_div_and_mod_in_place_change_the_tensor_itself():
    x = gc.Tensor([7, 8, 9])
    alias = x
    alias //= 2
    assert x.numpy().tolist() == [3, 4, 4]
    alias %= 3
    assert x.numpy().tolist() == [0, 1, 1]
    y = gc.Tensor([7.5, -1.0])
    gm = GradManager().attach([y])
    with gm:
        z = y * 1.0
        z %= 2.0
        gm.backward(z.sum())
    assert z.numpy().tolist() == [1.5, 1.0] and y.grad.numpy().tolist() == [1.0, 1.0]


def test_python_number_conversions_of_one_element_tensors():
    assert float(gc.Tensor([2])) == 2.0 and isinstance(float(gc.Tensor([2])), float)
    assert int(gc.Tensor([[3.7]])) == 3
    assert int(gc.Tensor(5)) == 5
    with pytest.raises(ValueError, match=r"item\(\) needs a tensor with one element, got shape \(2,\)"):
        float(gc.Tensor([1.0, 2.0]))
    r = round(gc.Tensor([1.26, 2.5, -0.5]))
    assert isinstance(r, gc.Tensor) and r.numpy().tolist() == [1.0, 3.0, -1.0]       # halves away from zero (MegEngine)
    np.testing.assert_allclose(round(gc.Tensor([1.26, 3.14159]), 2).numpy(), [1.26, 3.14], rtol=1e-6)
    assert [0, 1, 2][gc.Tensor(1)] == 1          # 0-d int tensors index Python sequences


class _CubeWithOwnRule(Op):
    """Path 1: the backward closes over the input tensor itself."""
    name = "cube_own_rule"

    def _grad_rule(self, x):
        def backward(dy):
            return dy * 3 * x * x
        return x * x * x, backward


def test_own_rule_keeps_its_input_when_the_caller_rebinds_it():
    x = gc.tensor([1.0, 2.0], dtype="float64")
    gm = GradManager().attach(x)
    with gm:
        h = x * 1
        y = apply(_CubeWithOwnRule(), h)[0].sum()
        h += 10                 # rebinds h; the rule's x must stay the value it used
        gm.backward(y)
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 12.0])


def test_own_rule_with_a_parameter_written_before_backward_raises():
    w = gc.Parameter(np.array([1.0, 2.0]))
    gm = GradManager().attach(w)
    gm.record()
    y = apply(_CubeWithOwnRule(), w)[0].sum()
    w._data -= 0.5              # what an optimizer step does
    _core._bump_version(w)
    with pytest.raises(RuntimeError, match="cube_own_rule.*modified in place"):
        gm.backward(y)
    assert not gm.recording


def test_megengines_any_device_falls_back_to_the_cpu():
    from gradcore import devices
    expect = "cuda" if devices.is_cuda_available() else "cpu"
    for name in ("xpux", "xpu0"):
        assert gc.Tensor([1.0], device=name).device == expect
    with pytest.raises(ValueError, match="unknown device 'tpu0'"):
        gc.Tensor([1.0], device="tpu0")


def test_a_wrong_input_count_never_reaches_a_ufunc_kernel():
    # NumPy would take the extra array as its output buffer and overwrite it
    x, y, z = gc.Tensor([1.0, 2.0]), gc.Tensor([3.0, 4.0]), gc.Tensor([0.0, 0.0])
    with pytest.raises(ValueError, match=r"Elemwise\(add\): takes 2 inputs, got 3 .*\(2,\), \(2,\), \(2,\)"):
        apply(Elemwise("add"), x, y, z)
    with pytest.raises(TypeError, match=r"add\(\) takes .*2 positional arguments"):
        F.add(x, y, z)           # F.add is a def with two parameters
    with pytest.raises(ValueError, match=r"Elemwise\(neg\): takes 1 inputs, got 2"):
        apply(Elemwise("neg"), x, y)
    assert z.numpy().tolist() == [0.0, 0.0] and y.numpy().tolist() == [3.0, 4.0]
