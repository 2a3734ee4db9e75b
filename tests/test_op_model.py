"""One op model (issue 24): every fact about an op decided once, in its
description; one backward-node kind; one interning layer; and the op kit's
five silent holes closed (items 8a-8e), each test failing on the old code."""
import pathlib
import shutil

import numpy as np
import pytest

import gradcore
import gradcore.functional as F
from gradcore import _core, registry
from gradcore.autodiff import Function, GradManager
from gradcore.core import apply, register_grad_rule
from gradcore._core import unregister_grad_rule
from gradcore.op import GRAD_PATHS, Op, OpDescription, clear_interned, describe
from gradcore.ops import Elemwise, MatrixMul
from gradcore.registry import OpDeclarationError, register_op
from gradcore.testing import check_op

ROOT = pathlib.Path(__file__).resolve().parents[1]
needs_cxx = pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                               reason="the CUDA host emulator needs a C++ compiler")


class Pow(Op):
    name = "ModelPow"
    domain = (0.2, 2.0)

    def __init__(self, p=2.0):
        self.p = float(p)

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x ** self.p

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (g * self.p * x ** (self.p - 1),)


class BadPow(Pow):
    """Right only at the default p = 2."""
    name = "ModelBadPow"

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (g * 2 * x,)


# ---------------------------------------------------------------- 1. the description
def test_every_op_class_is_described_when_defined():
    class Fresh(Op):
        name = "ModelFresh"

        def __init__(self, k=1):
            self.k = k

        def cpu(self, x):
            return x

        def decompose(self, x):
            return x

    d = Fresh.__dict__["_desc"]                  # made by the metaclass, before any registration
    assert isinstance(d, OpDescription) and describe(Fresh) is d and describe(Fresh(3)) is d
    assert d.grad_path == "decompose" and d.params == (("k", 1),)
    assert d.devices == ("cpu", "cuda") and d.kernels == {"cpu": "cpu", "cuda": "decompose"}


def test_one_vocabulary_for_the_gradient_path():
    class Rule(Op):
        name = "ModelRule"

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return x * 2

        def _grad_rule(self, x):
            return apply(self, x), lambda dy: dy * 2

    assert describe(Elemwise).grad_path == "vjp" and describe(Rule).grad_path == "_grad_rule"
    with registry.preserved():
        register_op(Rule)
        entry = {e.name: e for e in registry.entries()}["ModelRule"]
        assert entry.grad_path == "_grad_rule" and entry.devices == ["cpu"]
    try:
        register_grad_rule(MatrixMul)(lambda op, a, b: (apply(op, a, b), lambda g: (None, None)))
        assert describe(MatrixMul).grad_path == "registered rule"
    finally:
        unregister_grad_rule(MatrixMul)
    assert describe(MatrixMul).grad_path == "vjp"
    report = check_op(Pow(3.0), devices=["cpu"])
    assert "via vjp" in report["grad"].message
    x = gradcore.tensor([1.0, 2.0])
    gm = GradManager().attach([x])
    with gm:
        y = Rule()(x)
        nodes = _core._recorded_graph(y)[0][2]
        gm.backward(y.sum())
    assert [n[2] for n in nodes] == ["_grad_rule"] and set(GRAD_PATHS) >= {"_grad_rule", "vjp"}


def test_no_module_re_derives_the_gradient_path_or_devices():
    sources = {p: p.read_text() for p in (ROOT / "gradcore").glob("*.py")}
    sources[ROOT / "gradcore" / "_core.pyx"] = (ROOT / "gradcore" / "_core.pyx").read_text()
    for path, src in sources.items():
        if path.name == "op.py":
            continue
        for needle in ('hasattr(type(op), "_grad_rule")', 'hasattr(self.cls, "vjp")', "_grad_path_of",
                       "_diff_path", "PATH_NAMES", 'has("cuda_source")', "node.path"):
            assert needle not in src, (path.name, needle)


# ---------------------------------------------------------------- 2. one backward-node kind
class BiasAdd(Op):
    """x (N, C) + b (C,), by _grad_rule: the backward returns b's gradient in
    x's shape, not summed by hand."""
    name = "ModelBiasAdd"

    def infer(self, x, b):
        return (x,)

    def cpu(self, x, b):
        return x + b

    def _grad_rule(self, x, b):
        return apply(self, x, b), lambda dy: (dy, dy * 1)


def test_a_grad_rule_gets_central_broadcast_reduction_and_second_order():
    x = gradcore.tensor(np.arange(6.0).reshape(2, 3), dtype="float64")
    b = gradcore.tensor([1.0, 2.0, 3.0], dtype="float64")
    gm = GradManager().attach([x, b])
    with gm:
        gm.backward((BiasAdd()(x, b) * x).sum())
    np.testing.assert_allclose(b.grad.numpy(), x.numpy().sum(0))
    # nested: the rule's backward is recorded, its reduction too
    x.grad = b.grad = None
    outer = GradManager().attach([x])
    with outer:
        inner = GradManager().attach([b])
        with inner:
            inner.backward((BiasAdd()(x, b) * x).sum())
        outer.backward(b.grad.sum())
    np.testing.assert_allclose(x.grad.numpy(), np.ones((2, 3)))     # d sum(x.sum(0)) / dx


def test_a_gradient_of_neither_shape_is_an_error_naming_the_op():
    class Wrong(Function):
        def forward(self, a, b):
            return a * b

        def backward(self, g):
            return g, F.concat([g, g])             # (4,) for b of shape (2,)

    a, b = gradcore.tensor([1.0, 2.0]), gradcore.tensor([3.0, 4.0])
    gm = GradManager().attach([a, b])
    with gm:
        y = Wrong()(a, b)
        with pytest.raises(ValueError, match=r"Wrong: backward returned a gradient of shape \(4,\) for input 1"):
            gm.backward(y.sum())


def test_one_node_kind_and_no_leftover_entry_points():
    assert not hasattr(_core, "_record_custom") and not hasattr(_core, "OpFunction")
    fused = (ROOT / "plugins" / "gradcore-fused-act" / "gradcore_fused_act" / "__init__.py").read_text()
    assert "F.sum(" not in fused                  # no hand-summing of a broadcast gradient


# ---------------------------------------------------------------- 5. one interning layer
def test_one_interning_layer():
    import gradcore.op as op_module
    assert not hasattr(op_module, "interned") and not hasattr(Elemwise, "_instances")
    for path in list((ROOT / "ops").glob("*.py")) + list((ROOT / "gradcore").rglob("*.py")):
        assert "._seal()" not in path.read_text(), path
    mul = Elemwise("mul")
    assert Elemwise("mul") is mul
    clear_interned()
    again = Elemwise("mul")
    assert again == mul and again is not mul and Elemwise("mul") is again


# ---------------------------------------------------------------- 8a. parameters beyond the defaults
def test_check_op_checks_a_class_at_more_than_its_defaults():
    bad = check_op(BadPow, devices=["cpu"])
    assert not bad.ok and bad.status("grad") == "failed"
    assert "ModelBadPow(p=" in bad["grad"].message and "seed 0" in bad["grad"].message
    good = check_op(Pow, devices=["cpu"])
    assert good.ok and len(good.instances) >= 3 and good.instances[0] == "ModelPow(p=2.0)"
    assert "checked at: ModelPow(p=2.0), ModelPow(p=" in good.table()


# ---------------------------------------------------------------- 8b. kernels writing their inputs
def test_check_op_fails_a_kernel_that_writes_its_input():
    class Triple(Op):
        name = "ModelTripleInPlace"

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            x *= 3                                 # the caller's tensor would become 3x
            return x.copy()

        def vjp(self, inputs, outputs, grads):
            return (grads[0] * 3,)

    report = check_op(Triple(), np.linspace(-1, 1, 6).reshape(2, 3), devices=["cpu"])
    assert report.status("forward[cpu]") == "failed"
    assert "changed input 0 (shape (2, 3)) in place" in report["forward[cpu]"].message


# ---------------------------------------------------------------- 8c. a parametrised kernel without a launcher
def test_a_cuda_kernel_with_parameters_needs_a_launcher():
    class Scaled(Op):
        name = "ModelScaledNoLauncher"
        devices = ("cpu", "cuda")

        def __init__(self, k=2.0):
            self.k = float(k)

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return x * self.k

        def vjp(self, inputs, outputs, grads):
            return (grads[0] * self.k,)

        def cuda_source(self, ctype="float"):
            return (f'extern "C" __global__ void gc_scaled_{ctype}(const {ctype}* x, {ctype}* y, '
                    f'{ctype} k, long long n) {{ }}')

    with registry.preserved():
        with pytest.raises(OpDeclarationError) as info:
            register_op(Scaled)
    msg = str(info.value)
    assert "ModelScaledNoLauncher" in msg and "gc_scaled_float(const float* x, float* y, float k, long long n)" in msg
    assert "const T* x0, T* y (one per output), long long n" in msg and "add `cuda(self, be, ...)`" in msg

    class WithLauncher(Scaled):
        name = "ModelScaledLauncher"

        def cuda(self, be, x):
            y = be.empty(x.shape, x.dtype)
            be.launch_n(be.kernel(self, be.ctype(x.dtype)), y.size, x, y, x.dtype.type(self.k), y.size)
            return y

    with registry.preserved():
        register_op(WithLauncher)


# ---------------------------------------------------------------- 8d. decompose on a plain Op
def test_decompose_on_a_plain_op_works():
    class Softsign(Op):
        name = "ModelSoftsign"

        def decompose(self, x):
            return x / (F.abs(x) + 1)

    with registry.preserved():
        register_op(Softsign)
        entry = {e.name: e for e in registry.entries()}["ModelSoftsign"]
        assert (entry.grad_path, entry.devices) == ("decompose", ["cpu", "cuda"])
    x = gradcore.tensor([-2.0, 0.5, 3.0], dtype="float64")
    gm = GradManager().attach([x])
    with gm:
        y = Softsign()(x)
        gm.backward(y.sum())
    np.testing.assert_allclose(y.numpy(), x.numpy() / (np.abs(x.numpy()) + 1))
    np.testing.assert_allclose(x.grad.numpy(), 1 / (np.abs(x.numpy()) + 1) ** 2)
    assert check_op(Softsign, devices=["cpu"]).ok


# ---------------------------------------------------------------- 8e. the pytest plugin checks cuda
class CudaDisagrees(Op):
    name = "ModelCudaDisagrees"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * 2

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 2,)

    def cuda_source(self, ctype="float"):
        return (f'extern "C" __global__ void gc_modelcudadisagrees_{ctype.replace(" ", "_")}('
                f'const {ctype}* x, {ctype}* y, long long n) {{ '
                f'long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] * 3; }}\n')


@needs_cxx
def test_pytest_plugin_runs_cuda_checks_on_the_emulator(monkeypatch):
    from gradcore.pytest_plugin import _run_check
    monkeypatch.delenv("GRADCORE_CUDA", raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"forward\[cuda\] \| failed: .*cuda and cpu values differ"):
        _run_check(CudaDisagrees(), np.linspace(-1, 1, 6), compile_cuda=False)


def test_pytest_plugin_skips_visibly_when_cuda_cannot_run(monkeypatch):
    from gradcore import devices
    from gradcore.pytest_plugin import _run_check
    import gradcore.testing as testing
    monkeypatch.delenv("GRADCORE_CUDA", raising=False)
    monkeypatch.setattr(testing.shutil, "which", lambda name: None)       # no C++ compiler: no emulator
    monkeypatch.setattr(devices, "is_cuda_available", lambda: False)      # and no GPU
    monkeypatch.setattr(devices, "cuda_unavailable_reason", lambda: "no GPU here")
    with pytest.raises(pytest.skip.Exception, match=r"forward\[cuda\] skipped: CUDA unavailable"):
        _run_check(CudaDisagrees(), np.linspace(-1, 1, 6), compile_cuda=False)
