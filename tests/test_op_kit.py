"""The op author's kit: gradcore.testing.check_op, the registration checks
in gradcore.registry.register_op, and the pytest plugin (fixture
``check_op``, ``parametrize_ops``), the latter run with pytester."""
import functools

import numpy as np
import pytest

import gradcore
import gradcore.autodiff
import gradcore.functional as F
from gradcore import registry
from gradcore.op import Op, TensorDesc
from gradcore.ops import Elemwise, MatrixMul, Softmax
from gradcore.registry import OpDeclarationError, PluginConflictError, register_op, validate_op_class
from gradcore.testing import CheckReport, OpCheckError, check_op, op_examples

pytest_plugins = ["pytester"]

rng = np.random.default_rng(0)


# ---------------------------------------------------------------- ops under test
class Cube(Op):
    name = "KitCube"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * x * x

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (g * 3 * x * x,)

    def cuda_source(self, ctype="float"):
        return (f'extern "C" __global__ void gc_kitcube_{ctype}(const {ctype}* x, {ctype}* y, long long n) '
                f'{{ long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; '
                f'if (i < n) y[i] = x[i] * x[i] * x[i]; }}\n')

    @classmethod
    def examples(cls):
        return [(cls(), [np.linspace(-1, 1, 6).reshape(2, 3)])]


class WrongGrad(Cube):
    name = "KitWrongGrad"

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (g * 2 * x,)                       # should be 3 x^2


class WrongInfer(Cube):
    name = "KitWrongInfer"

    def infer(self, x):
        return (TensorDesc(x.shape + (1,), x.dtype, x.device),)


class Promotes(Cube):
    name = "KitPromotes"

    def cpu(self, x):
        return (x * x * x).astype(np.float64)      # float32 in, float64 out, undeclared


class Add(Op):
    """A binary op whose kernel error does not name the op."""
    name = "KitAdd"

    def infer(self, a, b):
        if a.shape != b.shape:
            raise self.error("shapes differ", a, b)
        return (a,)

    def cpu(self, a, b):
        if a.shape != b.shape:
            raise ValueError("boom")              # the core prefixes the op's name anyway
        return a + b

    def vjp(self, inputs, outputs, grads):
        return (grads[0], grads[0])


class LaxAdd(Add):
    """infer rejects mismatched shapes, the kernel silently broadcasts."""
    name = "KitLaxAdd"

    def cpu(self, a, b):
        return a + b


class BadInferMessage(Add):
    name = "KitBadInferMessage"

    def infer(self, a, b):
        if a.shape != b.shape:
            raise ValueError("shapes differ")     # does not name the op
        return (a,)


class BadCuda(Cube):
    name = "KitBadCuda"

    def cuda_source(self, ctype="float"):
        return 'extern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n'


class NoGrad(Op):
    name = "KitNoGrad"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return np.floor(x)


# ---------------------------------------------------------------- check_op
def test_a_good_op_passes_every_check():
    report = check_op(Cube(), rng.uniform(-1, 1, (2, 3)))
    assert isinstance(report, CheckReport) and report.ok, report
    for check in ("forward[cpu]", "infer", "dtype", "grad", "gradgrad"):
        assert report.status(check) == "passed", report
    # an elementwise op accepts every shape variant: rejecting nothing is not a pass
    assert report.status("bad_shapes") == "not applicable", report
    assert report.raise_on_failure() is report
    assert "KitCube" in report.table() and "op" in report.table().splitlines()[0]


def test_cuda_is_skipped_with_the_reason_when_unavailable():
    report = check_op(Cube(), rng.uniform(-1, 1, (3,)))
    if gradcore.devices.is_cuda_available():
        assert report.status("forward[cuda]") == "passed"
    else:
        r = report["forward[cuda]"]
        assert r.status == "skipped" and gradcore.devices.cuda_unavailable_reason() in r.message
    assert check_op(Cube(), rng.uniform(-1, 1, (3,)), devices=["cpu"])["forward[cuda]"].message == "not requested"


class WrongCudaKernel(Cube):
    name = "KitWrongCuda"

    def cuda_source(self, ctype="float"):       # squares instead of cubing
        return super().cuda_source(ctype).replace("gc_kitcube_", "gc_kitwrong_").replace(" * x[i] * x[i]", " * x[i]")


def test_check_op_runs_the_cuda_kernel_on_the_emulator(emulated_cuda):
    """Without a GPU, op authors check their CUDA kernel and its gradients
    on the host emulator (GRADCORE_CUDA=emulator gradcore check my-dist)."""
    report = check_op(Cube(), rng.uniform(-1, 1, (2, 3)))
    assert report.status("forward[cuda]") == "passed" and report.status("grad[cuda]") == "passed", report
    bad = check_op(WrongCudaKernel(), rng.uniform(-1, 1, (2, 3)))
    assert bad.status("forward[cuda]") == "failed" and "differ" in bad["forward[cuda]"].message
    assert bad.status("grad[cuda]") == "not applicable" and not bad.ok


def test_the_cuda_source_is_compiled_when_nvcc_is_there():
    from gradcore.testing import nvcc_path
    good = check_op(Cube(), rng.uniform(-1, 1, (3,)))["cuda_compile"]
    bad = check_op(BadCuda(), rng.uniform(-1, 1, (3,)))
    if nvcc_path() is None:
        assert good.status == bad["cuda_compile"].status == "skipped"
        assert "nvcc" in good.message
    else:
        assert good.status == "passed"
        assert bad["cuda_compile"].status == "failed" and "undefined_name" in bad["cuda_compile"].message
        assert not bad.ok
    assert check_op(NoGrad(), rng.uniform(-1, 1, (3,)))["cuda_compile"].message == "the op has no cuda_source"


@pytest.mark.parametrize("op, inputs", [(Elemwise("mul"), [rng.random((2, 3)), rng.random(3)]),
                                        (MatrixMul(), [rng.random((2, 3)), rng.random((3, 4))]),
                                        (Softmax(1), [rng.random((2, 3))])])
def test_standard_ops_pass(op, inputs):
    check_op(op, *inputs).raise_on_failure()


@pytest.mark.parametrize("cls", [Elemwise, MatrixMul, Softmax])
def test_standard_examples(cls):
    assert op_examples(cls)
    check_op(cls).raise_on_failure()


def test_a_wrong_gradient_fails_grad_and_gradgrad():
    report = check_op(WrongGrad(), rng.uniform(0.5, 1, (4,)))
    assert not report.ok
    assert report.status("grad") == "failed" and "gradcheck" in report["grad"].message
    assert report.status("gradgrad") in ("failed", "not applicable")
    assert report.status("forward[cpu]") == "passed"
    with pytest.raises(OpCheckError, match="KitWrongGrad"):
        report.raise_on_failure()


def test_infer_disagreeing_with_the_kernel_fails():
    report = check_op(WrongInfer(), rng.uniform(-1, 1, (2, 2)))
    assert report.status("infer") == "failed"
    assert "infer says shape (2, 2, 1)" in report["infer"].message


def test_undeclared_dtype_promotion_fails():
    report = check_op(Promotes(), rng.uniform(-1, 1, (3,)))
    assert report.status("dtype") == "failed"
    assert "float32 inputs give a float64 output" in report["dtype"].message


def test_bad_shapes_must_be_rejected_by_name_and_consistently():
    ok = check_op(Add(), rng.random((2, 3)), rng.random((2, 3)))
    assert ok["bad_shapes"].status == "passed", ok
    assert "rejected naming the op" in ok["bad_shapes"].message
    # apply consults infer before the kernel: the lax kernel is never reached
    lax = check_op(LaxAdd(), rng.random((2, 3)), rng.random((2, 3)))
    assert lax["bad_shapes"].status == "passed" and "rejected naming the op" in lax["bad_shapes"].message
    unnamed = check_op(BadInferMessage(), rng.random((2, 3)), rng.random((2, 3)))
    assert unnamed["bad_shapes"].status == "failed"
    assert "does not name the op 'KitBadInferMessage'" in unnamed["bad_shapes"].message


def test_non_differentiable_op_skips_gradients():
    report = check_op(NoGrad(), rng.uniform(-1, 1, (3,)))
    assert report.ok
    assert report.status("grad") == "not applicable" and "not differentiable" in report["grad"].message


def test_samples_from_examples_and_float32_samples():
    assert check_op(Cube).ok
    assert check_op(Cube()).ok
    # float32 samples are cast to float64 for the gradient checks
    assert check_op(Cube(), rng.uniform(-1, 1, (3,)).astype(np.float32)).status("grad") == "passed"
    assert check_op(Cube(), gradcore.tensor([0.5, 1.0])).ok
    # no examples(): inputs are generated from the declaration
    generated = check_op(NoGrad())
    assert generated.ok and generated.status("forward[cpu]") == "passed"


# ---------------------------------------------------------------- registration checks
@pytest.fixture
def scratch_registry():
    with registry.preserved():
        yield


def test_vjp_arity_is_checked(scratch_registry):
    class BadVjp(Cube):
        name = "KitBadVjp"

        def vjp(self, grads):
            return grads
    with pytest.raises(OpDeclarationError, match=r"KitBadVjp.*vjp\(self, inputs, outputs, grads\)"):
        register_op(BadVjp)
    assert "KitBadVjp" not in {e.name for e in registry.entries()}


def test_grad_rule_and_decompose_must_take_the_forward_inputs(scratch_registry):
    class BadRule(Op):
        name = "KitBadRule"

        def cpu(self, a, b):
            return a + b

        def _grad_rule(self, a):
            raise AssertionError

    class BadDecomp(Op):
        name = "KitBadDecomp"

        def infer(self, x):
            return (x,)

        def decompose(self, x, y):
            return x
    with pytest.raises(OpDeclarationError, match=r"KitBadRule.*_grad_rule takes 1 input.*forward \(cpu\) takes 2"):
        register_op(BadRule)
    with pytest.raises(OpDeclarationError, match=r"KitBadDecomp.*decompose takes 2"):
        register_op(BadDecomp)

    class GoodRule(Op):
        name = "KitGoodRule"

        def cpu(self, a, b):
            return a + b

        def _grad_rule(self, *inputs):
            raise AssertionError
    register_op(GoodRule)


def test_declared_device_without_kernel(scratch_registry):
    class NoCuda(Op):
        name = "KitNoCuda"
        devices = ("cpu", "cuda")

        def cpu(self, x):
            return x
    with pytest.raises(OpDeclarationError, match=r"KitNoCuda.*no CUDA kernel: add a method `cuda_source\(self, ctype\)`"):
        register_op(NoCuda)

    class NoCpu(Op):
        name = "KitNoCpu"
        devices = ("cpu",)
    with pytest.raises(OpDeclarationError, match=r"KitNoCpu.*no CPU kernel"):
        register_op(NoCpu)

    class Fine(Cube):
        name = "KitFine"
        devices = ("cpu", "cuda")
    register_op(Fine)
    assert gradcore.ops.get("KitFine") is Fine


def test_name_clash_names_both(scratch_registry):
    class One(Cube):
        name = "KitClash"

    class Two(Cube):
        name = "KitClash"
    with registry._loading_as("pkg-one"):
        register_op(One)
    with registry._loading_as("pkg-two"):
        with pytest.raises(PluginConflictError, match=r"KitClash.*pkg-one.*pkg-two.*rename"):
            register_op(Two)
    with registry._loading_as("pkg-one"):
        with pytest.raises(PluginConflictError, match=r"registered twice by 'pkg-one'"):
            register_op(Two)
    with pytest.raises(PluginConflictError, match="Elemwise"):
        register_op(Cube, name="Elemwise")


def test_the_standard_library_passes_registration_checks():
    import gradcore.ops as std
    for cls in std.STANDARD_OPS:
        validate_op_class(cls)
    assert not registry.failures()


# ---------------------------------------------------------------- the pytest plugin
def test_the_plugin_is_registered_as_pytest11():
    from importlib import metadata
    eps = [ep for ep in metadata.entry_points(group="pytest11") if ep.name == "gradcore"]
    assert [ep.value for ep in eps] == ["gradcore.pytest_plugin"]


OPS_MODULE = '''
import numpy as np
from gradcore.op import Op

class Sq(Op):
    name = "PtSq"
    def infer(self, x): return (x,)
    def cpu(self, x): return x * x
    def vjp(self, inputs, outputs, grads): return (grads[0] * 2 * inputs[0],)
    @classmethod
    def examples(cls): return [(cls(), [np.array([0.5, -1.0, 2.0])]), (cls(), [np.ones((2, 2))])]

class BadSq(Sq):
    name = "PtBadSq"
    def vjp(self, inputs, outputs, grads): return (grads[0] * inputs[0],)

class NoExamples(Sq):
    name = "PtNoExamples"
    examples = None
'''


def test_fixture_passes_and_fails(pytester):
    pytester.makepyfile(ptops=OPS_MODULE)
    pytester.makepyfile(test_fixture='''
import numpy as np
from ptops import Sq, BadSq

def test_good(check_op):
    report = check_op(Sq(), np.array([1.0, 2.0]))
    assert report.ok

def test_bad(check_op):
    check_op(BadSq(), np.array([1.0, 2.0]))
''')
    res = pytester.runpytest()
    res.assert_outcomes(passed=1, failed=1)
    res.stdout.fnmatch_lines(["*check_op(PtBadSq)*", "*PtBadSq*grad*failed*gradcheck*"])


def test_parametrize_ops_in_one_line(pytester):
    pytester.makepyfile(ptops=OPS_MODULE)
    pytester.makepyfile(test_all='''
from gradcore.pytest_plugin import parametrize_ops
from ptops import Sq, BadSq, NoExamples

test_ops = parametrize_ops([Sq, BadSq, NoExamples])
''')
    res = pytester.runpytest("-v")
    # an op without examples() is checked on generated inputs, not skipped
    res.assert_outcomes(passed=3, failed=2)
    res.stdout.fnmatch_lines(["*test_ops?PtSq-0?*PASSED*", "*test_ops?PtBadSq-1?*FAILED*",
                              "*PtNoExamples-generated*PASSED*"])


def test_parametrize_ops_by_distribution(pytester):
    pytester.makepyfile(test_dist='''
import pytest
from gradcore.pytest_plugin import op_cases, parametrize_ops

test_std = parametrize_ops("gradcore", devices=["cpu"], compile_cuda=False, second_order=False)

def test_cases_know_their_examples():
    ids = [p.id for p in op_cases("gradcore")]
    assert any(i.startswith("Elemwise(mul)") for i in ids)

def test_unknown_distribution():
    with pytest.raises(pytest.UsageError, match="no-such-dist"):
        op_cases("no-such-dist")
''')
    res = pytester.runpytest()
    outcomes = res.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, res.stdout.str()
    assert outcomes["passed"] >= 2 + 46         # every standard op, by examples() or generated inputs


def test_a_failed_entry_point_is_a_failing_case_and_entry_points_name_their_distribution(monkeypatch):
    """parametrize_ops / op_cases of a distribution one of whose entry
    points failed to load: a case of its own that fails with the error (as
    ``gradcore check`` exits 1), not a warning and one op fewer tested; an
    entry point's name stands for its distribution, as in ``gradcore check``."""
    from gradcore import pytest_plugin, registry
    broken = registry.PluginFailure("gradcore", "gradcore-extra", "ImportError: No module named 'x'")
    monkeypatch.setattr(registry, "failures", lambda: [broken])
    cases = pytest_plugin.op_cases("gradcore")
    load = [c for c in cases if c.id == "load-gradcore-extra"]
    assert len(load) == 1 and len(cases) > 46
    with pytest.raises(pytest.fail.Exception, match="entry point 'gradcore-extra' failed to load: ImportError"):
        pytest_plugin._run_check(*load[0].values)
    monkeypatch.setattr(registry, "entry_point_dists", lambda: {"my-entry-point": "gradcore"})
    assert [c.id for c in pytest_plugin.op_cases("my-entry-point")] == [c.id for c in cases]


# ---------------------------------------------------------------- op parameters, infer guard, calling ops
class KitScale(Op):
    """Written the natural way: the constructor stores its parameter."""
    name = "KitScale"

    def __init__(self, k):
        super().__init__()
        self.k = k

    def infer(self, x):
        if x.dtype.kind != "f":
            raise self.error(f"needs a floating-point input, got {x.dtype}", x)
        return (x,)

    def cpu(self, x):
        return x * self.k

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * self.k,)


def _grad_of(op, x):
    from gradcore.autodiff import GradManager
    t = gradcore.tensor(x)
    gm = GradManager().attach([t])
    with gm:
        gm.backward(op(t).sum())
    return t.grad.numpy()


def test_op_parameters_are_captured_and_both_gradients_are_right():
    three, five = KitScale(3.0), KitScale(5.0)
    assert three != five and hash(three) != hash(five) and three.attrs == ("k",)
    x = np.array([1.0, 2.0], np.float32)
    # twice each: the second call of each reuses its cached backward graph
    for _ in range(2):
        assert np.allclose(_grad_of(three, x), 3.0)
        assert np.allclose(_grad_of(five, x), 5.0)
    assert KitScale(3.0) is three                  # interned: equal ops are one instance
    assert repr(five) == "KitScale(k=5.0)"


def test_ops_are_immutable_and_attributes_must_be_values():
    from gradcore.op import OpDefinitionError
    op = KitScale(2.0)
    with pytest.raises(OpDefinitionError, match="immutable"):
        op.k = 4.0
    with pytest.raises(OpDefinitionError, match="immutable"):
        del op.k
    with pytest.raises(OpDefinitionError, match=r"'?k'? .*not hashable.*tuple"):
        KitScale(np.ones(3))
    # a list is frozen into a tuple: still a value
    assert KitScale([1, 2]) == KitScale((1, 2))


def test_skipping_the_base_initialiser_is_harmless():
    class NoSuper(KitScale):
        name = "KitNoSuper"

        def __init__(self, k):
            self.k = k                              # no super().__init__()
    assert NoSuper(2.0) != NoSuper(3.0)
    assert np.allclose(_grad_of(NoSuper(3.0), np.ones(2, np.float32)), 3.0)


def test_pickled_ops_come_back_equal():
    import pickle
    from gradcore.ops import Reduce
    for op in (KitScale(3.0), Reduce("sum", 1, True), Elemwise("tanh"), Softmax(0)):
        back = pickle.loads(pickle.dumps(op))
        assert back == op and hash(back) == hash(op)


def test_infer_guards_the_plain_forward():
    from gradcore.core import apply
    from gradcore.op import OpError
    ints = gradcore.tensor(np.array([1, 2, 3], np.int64))
    for _ in range(2):                              # the verdict is cached; a rejection is not
        with pytest.raises(OpError, match="KitScale.*floating-point"):
            apply(KitScale(2.0), ints)
    with pytest.raises(OpError, match=r"Elemwise\(add\).*\(2, 3\), \(4,\)"):
        apply(Elemwise("add"), gradcore.tensor(np.ones((2, 3))), gradcore.tensor(np.ones(4)))
    # the accepted shape stays accepted, a new one is checked again
    floats = gradcore.tensor(np.ones(3, np.float32))
    assert apply(KitScale(2.0), floats)[0].numpy().tolist() == [2.0, 2.0, 2.0]


def test_ops_are_callable_and_function_publishes_a_wrapper():
    from gradcore.core import apply
    from gradcore.op import function
    from gradcore.ops import Split
    x = gradcore.tensor(np.array([1.0, 2.0], np.float32))
    assert np.allclose(KitScale(3.0)(x).numpy(), apply(KitScale(3.0), x)[0].numpy())
    scale = function(KitScale)
    assert scale.__name__ == "KitScale" and "KitScale" in scale.__doc__
    assert np.allclose(scale(x, k=4.0).numpy(), [4.0, 8.0])
    # several outputs: the tuple
    parts = Split(0, 2)(gradcore.tensor(np.arange(4.0)))
    assert isinstance(parts, tuple) and len(parts) == 2


def test_constructing_an_equal_op_again_runs_no_python(monkeypatch):
    """Interning: an op constructed per call (``KitScale(3.0)(x)``) is a C
    table lookup once an equal call was seen; the Python constructor (the
    hook that builds, seals and interns) runs once per distinct call."""
    import gradcore.op as op_module
    from gradcore import _op_intern
    built = []

    def counting(cls, args, kwargs):
        built.append((cls.__name__, args, tuple(kwargs.items())))
        return op_module._construct(cls, args, kwargs)

    class KitNoArgs(KitScale):
        name = "KitNoArgs"

        def __init__(self):
            self.k = 2.0

    monkeypatch.setattr(op_module, "_construct", op_module._construct)   # restored afterwards
    _op_intern.install(counting, op_module._describe)
    try:
        op_module.clear_interned()
        calls = [lambda: KitScale(3.0), lambda: KitScale(k=3.0), lambda: KitNoArgs(), lambda: KitScale(3)]
        first = [make() for make in calls]
        for _ in range(5):
            assert [make() for make in calls] == first
            assert all(make() is op for make, op in zip(calls, first))
        assert len(built) == 4, built               # one per distinct call, none on a hit
        assert first[0] is first[1]                 # positional or keyword: one op (interned by value)
        # through tp_call (star-arguments, functools.partial) as through vectorcall
        assert KitScale(*(3.0,)) is first[0] and KitScale(**{"k": 3.0}) is first[0]
        assert functools.partial(KitScale, 3)() is first[3] and KitNoArgs(*()) is first[2]
        k = float("3")                              # an equal argument, another object
        assert KitScale(k) is first[0] and len(built) == 4
        # an unhashable argument is never remembered: built every time, still interned by value
        assert KitScale([1, 2]) is KitScale([1, 2]) and len(built) == 6
        # forgetting: new instances, built again
        op_module.clear_interned()
        assert KitScale(3.0) is not first[0] and KitNoArgs() is not first[2] and len(built) == 8
    finally:
        _op_intern.install(op_module._construct, op_module._describe)


def test_argument_types_are_part_of_the_call_key():
    class KitKeepsType(KitScale):
        name = "KitKeepsType"

        def __init__(self, k):
            self.k = k
            self.integral = isinstance(k, int)

    # 3 == 3.0 and hash(3) == hash(3.0): equal arguments, but not the same op
    for _ in range(3):                              # alternating: neither call evicts the other
        assert KitKeepsType(3).integral is True
        assert KitKeepsType(3.0).integral is False
        assert KitKeepsType(k=3).integral is True and KitKeepsType(k=3.0).integral is False
    assert KitKeepsType(3) is KitKeepsType(k=3) and KitKeepsType(3.0) is not KitKeepsType(3)


def test_calling_an_op_returns_the_output_or_the_tuple_recorded_or_not():
    from gradcore.autodiff import GradManager
    from gradcore.ops import Split
    x = gradcore.tensor(np.arange(4.0, dtype=np.float32))
    gm = GradManager().attach([x])
    for recording in (False, True):
        if recording:
            gm.record()
        y = KitScale(2.0)(x)
        parts = Split(0, 2)(x)
        assert isinstance(y, gradcore.Tensor) and y.numpy().tolist() == [0.0, 2.0, 4.0, 6.0]
        assert isinstance(parts, tuple) and [p.numpy().tolist() for p in parts] == [[0.0, 1.0], [2.0, 3.0]]
        if recording:
            gm.backward(y.sum() + parts[1].sum())
            assert x.grad.numpy().tolist() == [2.0, 2.0, 3.0, 3.0]
            gm.release()


def test_an_op_with_only_a_grad_rule_is_callable():
    class RuleOnly(Op):
        """No cpu kernel: the forward is the op's own _grad_rule."""
        name = "KitRuleOnly"

        def infer(self, x):
            return (x,)

        def _grad_rule(self, x):
            return x * 2.0, lambda g: (g * 2.0,)

    x = gradcore.tensor(np.array([1.0, 3.0], np.float32))
    assert RuleOnly()(x).numpy().tolist() == [2.0, 6.0]
    assert _grad_of(RuleOnly(), x.numpy()).tolist() == [2.0, 2.0]


def test_registration_refuses_parameters_kept_under_private_names(scratch_registry):
    class Hidden(KitScale):
        name = "KitHidden"

        def __init__(self, k=1.0):
            self._k = float(k)             # invisible to hash and equality

    with pytest.raises(OpDeclarationError, match=r"_k.*self\.k = .*derived = \('_k',\)"):
        register_op(Hidden)

    class Derived(KitScale):
        name = "KitDerived"
        derived = ("_half",)

        def __init__(self, k=1.0):
            self.k = float(k)
            self._half = self.k / 2        # derived from k: declared, so accepted

    register_op(Derived)
    assert Derived(2.0) != Derived(4.0)


# ---------------------------------------------------------------- a vjp written with Tensor's operators
class ReverseRows(Op):
    """y = x[::-1] @ w: its vjp uses indexing and @ on the traced gradients."""
    name = "KitReverseRows"

    def infer(self, x, w):
        known = x.shape is not None and w.shape is not None      # None while a backward is traced
        return (TensorDesc((x.shape[0], w.shape[1]) if known else None, x.dtype, x.device),)

    def cpu(self, x, w):
        if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
            raise ValueError(f"KitReverseRows: x (n, k) and w (k, m), got {x.shape} and {w.shape}")
        return x[::-1] @ w

    def vjp(self, inputs, outputs, grads):
        (x, w), (g,) = inputs, grads
        return ((g @ F.transpose(w, (1, 0)))[::-1], F.transpose(x[::-1], (1, 0)) @ g)


class Masked(Op):
    """y = |x| where 0 < x < 2 or x is negative, else 0: a vjp built of
    comparisons joined by & | ~, abs, // and %."""
    name = "KitMasked"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        keep = ((x > 0) & (x < 2)) | ~(x >= 0)
        return np.where(keep, np.abs(x), 0.0).astype(x.dtype)

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        keep = ((x > 0) & (x < 2)) | ~(x >= 0)
        sign = (x > 0).astype(x.dtype) * 2 - 1
        # (3 // 2) % 2 is 1: the integer operators trace too
        one = (abs(sign) * 3) // 2 % 2
        return (F.where(keep, g * sign * one, g * 0),)


def test_a_vjp_may_use_every_tensor_operator():
    """Indexing, @, abs, //, %, & | ~ on the gradients and inputs inside a
    vjp are traced like + and * (they were TypeErrors: "not subscriptable",
    "unsupported operand"), to every order."""
    x = rng.uniform(-1, 1, (4, 3))
    w = rng.uniform(-1, 1, (3, 2))
    report = check_op(ReverseRows(), x, w)
    assert report.status("grad") == report.status("gradgrad") == "passed", report
    report = check_op(Masked(), np.array([-1.5, -0.5, 0.5, 1.5, 2.5, 3.5]))
    assert report.ok, report
    assert report.status("grad") == "passed"


def test_a_traced_tensor_has_a_length_only_where_its_shape_is_known():
    class LenOfGrad(Cube):
        name = "KitLenOfGrad"

        def vjp(self, inputs, outputs, grads):
            return (grads[0] * len(grads[0]),)
    x = gradcore.tensor(np.ones(3))
    gm = gradcore.autodiff.GradManager().attach([x])
    with pytest.raises(TypeError, match=r"KitLenOfGrad.*no len\(\)"):
        with gm:
            gm.backward(LenOfGrad()(x).sum())
