"""Mistakes a new op author makes, found by writing plugins from the docs
alone: each gives a clear error naming the op, or the central mechanism
makes the op right; none passes silently."""
import re

import numpy as np
import pytest

import gradcore
import gradcore.functional as F
from gradcore.op import Op, TensorDesc, describe
from gradcore.registry import OpDeclarationError, PluginConflictError, register_op, validate_op_class
from gradcore.testing import check_op


class BroadcastMul(Op):
    """x * w with broadcasting; its vjp returns gradients in the broadcast shape."""
    name = "MistakeBroadcastMul"

    def infer(self, x, w):
        shape = None if x.shape is None or w.shape is None else np.broadcast_shapes(x.shape, w.shape)
        return (TensorDesc(shape, x.dtype, x.device),)

    def cpu(self, x, w):
        return x * w

    def vjp(self, inputs, outputs, grads):
        (x, w), (g,) = inputs, grads
        return (g * w, g * x)


def test_a_vjp_may_return_broadcast_shaped_gradients_they_are_summed_down():
    assert describe(BroadcastMul).reduce_broadcast
    x = gradcore.tensor(np.arange(6.0).reshape(2, 3))
    w = gradcore.tensor([1.0, 2.0, 3.0])
    gm = gradcore.GradManager().attach([x, w])
    with gm:
        gm.backward(BroadcastMul()(x, w).sum())
    np.testing.assert_allclose(w.grad.numpy(), x.numpy().sum(axis=0))
    np.testing.assert_allclose(x.grad.numpy(), np.broadcast_to(w.numpy(), (2, 3)))


class WrongShapeGrad(Op):
    name = "MistakeWrongShapeGrad"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * 2

    def vjp(self, inputs, outputs, grads):
        return (F.sum(grads[0] * 2, axis=0),)     # (3,) for an input of shape (2, 3)


def test_a_wrongly_shaped_vjp_gradient_is_named_at_its_op_not_broadcast_on():
    x = gradcore.tensor(np.ones((2, 3)))
    w = gradcore.tensor(np.arange(6.0).reshape(2, 3))
    gm = gradcore.GradManager().attach([x])
    with pytest.raises(ValueError, match=r"MistakeWrongShapeGrad: backward returned a gradient of shape \(3,\) "
                                         r"for input 0 of shape \(2, 3\)"):
        with gm:
            gm.backward((WrongShapeGrad()(x * w) * w).sum())


class BranchingVjp(Op):
    name = "MistakeBranchingVjp"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return np.abs(x)

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (g if x > 0 else -g,)              # a Python branch on a traced tensor


def test_a_python_branch_on_a_traced_tensor_is_refused_naming_the_op():
    x = gradcore.tensor([-1.0, 2.0])
    gm = gradcore.GradManager().attach([x])
    with pytest.raises(TypeError, match="MistakeBranchingVjp: .*no truth value.*F.where"):
        with gm:
            gm.backward(BranchingVjp()(x).sum())


class ArrayVjp(Op):
    """A vjp written on NumPy arrays: a constant of the traced graph."""
    name = "MistakeArrayVjp"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * x

    def vjp(self, inputs, outputs, grads):
        return (2 * inputs[0].numpy() * grads[0].numpy(),)


class AsarrayVjp(ArrayVjp):
    name = "MistakeAsarrayVjp"

    def vjp(self, inputs, outputs, grads):
        return (np.asarray(inputs[0]) * 2 * grads[0],)


@pytest.mark.parametrize("op, what", [(ArrayVjp, r"\.numpy\(\) value"), (AsarrayVjp, "NumPy array")])
def test_reading_a_traced_tensors_value_is_refused_naming_the_op(op, what):
    x = gradcore.tensor([-1.0, 2.0])
    gm = gradcore.GradManager().attach([x])
    with pytest.raises(TypeError, match=f"{op.name}: .*no {what}.*gradcore ops"):
        with gm:
            gm.backward(op()(x).sum())


def _cube_body(cls_name, **members):
    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x ** 3
    return type(cls_name, (Op,), dict(name=cls_name, infer=infer, cpu=cpu, **members))


@pytest.mark.parametrize("member, meant", [("vpj", "vjp"), ("grad_rule", "_grad_rule"), ("decompse", "decompose"),
                                           ("example", "examples"), ("check_param", "check_params")])
def test_a_misspelt_protocol_member_is_refused_at_registration(member, meant):
    cls = _cube_body("MistakeTypo", **{member: lambda self, *a: None})
    assert (member, meant) in describe(cls).misspelt
    with pytest.raises(OpDeclarationError, match=f"defines '{member}' \\(did you mean '{meant}'\\?\\)"):
        validate_op_class(cls)


def test_protocol_members_and_helpers_are_not_taken_for_typos():
    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 3 * inputs[0] * inputs[0],)
    cls = _cube_body("MistakeNoTypo", vjp=vjp, _vjp_helper=lambda self: None, scale=2.0,
                     samples=lambda self: None, _cpu=lambda self: None, gpu=lambda self: None)
    assert describe(cls).misspelt == ()
    validate_op_class(cls)
    from gradcore.op import Op as Base
    seen, todo = set(), [Base]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    flagged = [c.__name__ for c in seen if describe(c).misspelt and not c.__name__.startswith("Mistake")]
    assert flagged == []                          # no standard op is taken for a typo


def test_a_vjp_without_infer_is_refused_at_registration():
    class NoInfer(Op):
        name = "MistakeNoInfer"

        def cpu(self, x):
            return x * 2

        def vjp(self, inputs, outputs, grads):
            return (grads[0] * 2,)
    with pytest.raises(OpDeclarationError, match="MistakeNoInfer.*has a vjp but no shape inference.*infer"):
        validate_op_class(NoInfer)


class Flagged(Op):
    name = "MistakeFlagged"

    def __init__(self, square=False):
        self.square = bool(square)

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * x if self.square else x * 2

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 2,)                    # right for square=False only


def test_a_bool_parameter_is_checked_at_its_other_value_too():
    report = check_op(Flagged)
    assert not report.ok and report.status("grad") == "failed"
    assert "MistakeFlagged(square=True)" in str(report)


def test_registering_a_standard_name_from_a_script_is_refused_and_the_standard_library_stays():
    class Clash(Op):
        name = "Elemwise"

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return x
    with pytest.raises(PluginConflictError, match="'Elemwise' is registered by two distributions"):
        register_op(Clash)
    assert gradcore.ops.get("Convolution").__name__ == "Convolution"
    assert gradcore.ops.get("Elemwise") is not Clash


_LEAKY_SOURCE = """
extern "C" __global__ void gc_mistakeleaky_{ctype}(const {ctype}* x, {ctype}* y, {ctype} alpha, long long n) {{
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0 ? x[i] : alpha * x[i];
}}
"""


class Leaky(Op):
    """A parametrised CUDA kernel with its launcher; the launcher passes alpha
    as a float32 whatever the element type (right for float only)."""
    name = "MistakeLeaky"
    devices = ("cpu", "cuda")

    def __init__(self, alpha=0.1):
        self.alpha = float(alpha)

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return np.where(x > 0, x, self.alpha * x)

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (F.where(x > 0, g, g * self.alpha),)

    def cuda_source(self, ctype="float"):
        return _LEAKY_SOURCE.format(ctype=ctype)

    def cuda(self, be, x):
        y = be.empty(x.shape, x.dtype)
        kernel = be.kernel(self, be.ctype(x.dtype))
        be.launch_n(kernel, y.size, x, y, np.float32(self.alpha), y.size)    # the mistake: not x.dtype.type
        return y


class _Double(Op):
    """y = 2 x, right on the cpu: the base of the mistakes below, each in
    one more member."""
    name = "MistakeDouble"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * 2

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 2,)


def _one_thread_per_element(name: str, ctype: str, x_param: str, body: str) -> str:
    """A kernel ``name_ctype(x_param, ctype* y, long long n)`` running
    ``body`` with ``i`` its thread's element (the mistakes are in the body)."""
    return (f'extern "C" __global__ void {name}_{ctype}({x_param}, {ctype}* y, long long n) {{\n'
            f'    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n'
            f'    {body}\n}}\n')


class InPlaceCuda(_Double):
    name = "MistakeInPlaceCuda"
    devices = ("cpu", "cuda")

    def cuda_source(self, ctype="float"):
        return _one_thread_per_element("gc_mistakeinplace", ctype, f"{ctype}* x",
                                       "if (i < n) { x[i] = 2 * x[i]; y[i] = x[i]; }")


def test_a_cuda_kernel_writing_its_input_fails_check_op(emulated_cuda):
    report = check_op(InPlaceCuda(), np.array([1.0, 2.0, 3.0]))
    assert report.status("forward[cuda]") == "failed"
    assert "the cuda kernel changed input 0" in report["forward[cuda]"].message


class OffByOneCuda(_Double):
    """Right values, and one element written past the output's end
    (``i <= n``): on a GPU that lands in the allocator's slack, unseen."""
    name = "MistakeOffByOne"
    devices = ("cpu", "cuda")

    def cuda_source(self, ctype="float"):
        return _one_thread_per_element("gc_mistakeoffbyone", ctype, f"const {ctype}* x",
                                       "if (i <= n) y[i] = 2 * x[i < n ? i : 0];")


def test_a_cuda_kernel_writing_past_the_end_fails_check_op(emulated_cuda):
    report = check_op(OffByOneCuda(), np.array([1.0, 2.0, 3.0]))
    assert report.status("forward[cuda]") == "failed"
    message = report["forward[cuda]"].message
    assert "a kernel wrote past the end of output 0 ((3,), float64): 24 bytes, written at byte 24" in message
    assert "`i < n` is missing or off by one" in message
    assert report.status("forward[cpu]") == "passed"


def test_the_write_guard_is_gone_after_check_op(emulated_cuda):
    from gradcore.cuda import runtime
    check_op(OffByOneCuda(), np.array([1.0, 2.0, 3.0]))
    assert runtime.backend().pool.redirect is None


def test_a_launcher_right_for_float32_only_fails_the_float64_cuda_check(emulated_cuda):
    report = check_op(Leaky(0.25), np.array([-2.0, 1.0, -6.0]))
    assert report.status("forward[cuda]") == "failed"
    message = report["forward[cuda]"].message
    assert "float64 inputs" in message and "float32 inputs" not in message
    assert "gc_mistakeleaky_double" in message and "got a float32" in message


class ForgetfulLauncher(Leaky):
    name = "MistakeForgetful"

    def cuda(self, be, x):
        y = be.empty(x.shape, x.dtype)
        be.launch_n(be.kernel(self, be.ctype(x.dtype)), y.size, x, y, y.size)    # alpha forgotten
        return y


def test_launch_arguments_are_checked_against_the_kernels_parameters(emulated_cuda):
    x = gradcore.tensor(np.array([-2.0, 1.0], np.float32), device="cuda")
    with pytest.raises(TypeError, match=r"MistakeForgetful\(alpha=0.1\): kernel gc_mistakeleaky_float\(const float\* x, "
                                        r"float\* y, float alpha, long long n\) takes 4 arguments, got 3"):
        ForgetfulLauncher()(x)
    np.testing.assert_allclose(Leaky(0.5)(x).numpy(), [-1.0, 1.0])      # the right call passes
    from gradcore.cuda import runtime
    be = runtime.backend()
    kernel = be.kernel(Leaky(0.5), "float")
    assert (kernel.kinds, kernel.params) == (b"ppf8", "const float* x, float* y, float alpha, long long n")
    with pytest.raises(TypeError, match=r"argument 1 \(float\* y\) takes no Python int: pass a device array"):
        be.launch_n(kernel, 2, x._data, 3, np.float32(0.5), 2)


def test_a_cpu_only_op_on_cuda_is_told_what_to_add(emulated_cuda):
    class CpuOnly(Op):
        name = "MistakeCpuOnly"

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return x * 2
    with pytest.raises(NotImplementedError, match="MistakeCpuOnly has no cuda kernel: give it a `cuda_source`"):
        CpuOnly()(gradcore.tensor([1.0], device="cuda"))


def test_an_infer_returning_a_bare_desc_is_told_to_return_a_tuple():
    class BareDesc(Op):
        name = "MistakeBareDesc"

        def infer(self, x):
            return x                              # should be (x,)

        def cpu(self, x):
            return x * 2
    with pytest.raises(TypeError, match=r"MistakeBareDesc: infer must return a tuple of TensorDesc, one per output; "
                                        r"got a TensorDesc: return \(desc,\)"):
        BareDesc()(gradcore.tensor([1.0]))


# ---------------------------------------------------------------- a string parameter's other values
def _mode_scale(annotated: bool):
    from typing import Literal

    class ModeScale(Op):
        """x * 2 ("double") or x * 3 ("triple"); the vjp is right for "double" only."""
        name = "ModeScaleTrial"
        attrs = ("mode",)

        if annotated:
            def __init__(self, mode: Literal["double", "triple"] = "double"):
                self.mode = mode
        else:
            def __init__(self, mode="double"):
                self.mode = mode

        def infer(self, x):
            return (TensorDesc(x.shape, x.dtype, x.device),)

        def cpu(self, x):
            return x * (2 if self.mode == "double" else 3)

        def vjp(self, inputs, outputs, grads):
            return [grads[0] * 2]
    return ModeScale


def test_a_string_parameter_without_its_values_fails_check_op_naming_it():
    report = check_op(_mode_scale(annotated=False), devices=["cpu"])
    assert not report.ok and report.status("inputs") == "failed"
    assert "mode='double'" in report["inputs"].message and "Literal" in report["inputs"].message


def test_a_literal_parameter_is_checked_at_each_value():
    cls = _mode_scale(annotated=True)
    assert describe(cls).choices() == {"mode": ("double", "triple")}
    report = check_op(cls, devices=["cpu"])
    assert report.status("grad") == "failed" and "mode='triple'" in report["grad"].message


class HostArrayFromCuda(_Double):
    """A cuda kernel that computes the right values in host memory."""
    name = "MistakeHostArrayFromCuda"

    def cuda(self, be, x):
        from gradcore import devices
        return devices.to_host(x) * 2


def test_a_cuda_kernel_returning_host_memory_fails_check_op(emulated_cuda):
    # its values are right; the tensor it makes would silently live on the cpu
    report = check_op(HostArrayFromCuda)
    assert report.status("forward[cuda]") == "failed"
    assert "infer says device cuda, the cuda kernel returned it on cpu" in report["forward[cuda]"].message


class WrongCountExamples(_Double):
    """examples() giving two inputs to a one-input op."""
    name = "MistakeWrongCountExamples"

    @classmethod
    def examples(cls):
        return [(cls(), [np.ones(3)]), (cls(), [np.ones(3), np.ones(3)])]


def test_examples_with_the_wrong_input_count_are_named():
    report = check_op(WrongCountExamples, devices=["cpu"])
    assert report.status("inputs") == "failed"
    assert "example 1 gives 2 input(s)" in report["inputs"].message and "takes 1" in report["inputs"].message


class AffineByRule(Op):
    """y = x * w + b with its forward in its _grad_rule (MegEngine's style: no cpu kernel)."""
    name = "MistakeAffineByRule"
    check_shapes = (((2, 3), (3,), (3,)),)

    def infer(self, x, w, b):
        if x.shape is not None and (len(x.shape) != 2 or w.shape != x.shape[-1:] or b.shape != w.shape):
            raise self.error("x must be 2-d, w and b match the last dimension of x", x, w, b)
        return (TensorDesc(x.shape, x.dtype, x.device),)

    def _grad_rule(self, x, w, b):
        y = x * w + b
        return y, lambda dy: (dy * w, F.sum(dy * x, axis=0), F.sum(dy, axis=0))


def test_a_forward_by_rule_runs_its_infer_first_and_works_on_cuda(emulated_cuda):
    """An op whose forward is its _grad_rule: its infer guards it like a
    kernel (the error names the op), and its default devices include cuda,
    where gradcore ops run it; registration accepts it; check_op passes."""
    d = describe(AffineByRule)
    assert d.devices == ("cpu", "cuda") and d.kernels == {"cpu": "_grad_rule", "cuda": "_grad_rule"}
    validate_op_class(AffineByRule)
    x, w, b = np.ones((4, 6)), np.ones(3), np.ones(3)
    with pytest.raises(ValueError, match="MistakeAffineByRule: x must be 2-d, w and b match"):
        AffineByRule()(gradcore.tensor(x), gradcore.tensor(w), gradcore.tensor(b))
    xs = [gradcore.tensor(np.arange(6.0).reshape(2, 3), device="cuda"), gradcore.tensor([1.0, 2.0, 3.0], device="cuda"),
          gradcore.tensor([0.5, 0.5, 0.5], device="cuda")]
    y = AffineByRule()(*xs)
    assert y.device == "cuda"      # (str() gives MegEngine's name, "gpu0:0")
    np.testing.assert_allclose(y.numpy(), np.arange(6.0).reshape(2, 3) * [1, 2, 3] + 0.5)
    report = check_op(AffineByRule)
    assert report.ok, report


class NumpyRule(Op):
    """The tutorial's old mistake: a rule's forward computed in NumPy."""
    name = "MistakeNumpyRule"

    def infer(self, x):
        return (x,)

    def _grad_rule(self, x):
        return gradcore.Tensor(x.numpy() ** 3), lambda dy: dy * 3 * x * x


def test_a_rule_forward_on_another_device_than_its_inputs_is_refused_naming_the_op(emulated_cuda):
    x = gradcore.tensor([1.0, 2.0], device="cuda")
    with pytest.raises(RuntimeError, match=r"MistakeNumpyRule: its grad rule's forward returned an output on "
                                           r"cpu for inputs on cuda"):
        NumpyRule()(x)
    gm = gradcore.GradManager().attach([x])
    with pytest.raises(RuntimeError, match="MistakeNumpyRule: its grad rule's forward returned"):
        with gm:
            gm.backward(NumpyRule()(x).sum())


class DecomposeDisagrees(Op):
    """A cpu kernel and a decompose (the reference) that disagree; the vjp is the decompose's."""
    name = "MistakeDecomposeDisagrees"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * x + 1.0          # the decompose says x * x

    def decompose(self, x):
        return x * x

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 2 * inputs[0],)


def test_a_cpu_kernel_disagreeing_with_its_decompose_fails_check_op():
    report = check_op(DecomposeDisagrees, devices=["cpu"])
    assert report.status("forward[cpu]") == "failed"
    assert "the cpu kernel and its decompose (the op's reference definition) differ by up to 1" in \
        report["forward[cpu]"].message
    # the standard ops that keep a decompose beside their kernels agree with it
    from gradcore.ops.nn import LogSoftmax, Softmax
    for cls in (Softmax, LogSoftmax):
        assert check_op(cls, devices=["cpu"], second_order=False).status("forward[cpu]") == "passed"


class UntraceableDecompose(Op):
    name = "MistakeUntraceableDecompose"

    def decompose(self, x):
        if x.numpy().sum() > 0:          # reads a value: cannot be traced
            return x * 2
        return x


def test_check_op_shows_the_error_that_refused_every_generated_input():
    with pytest.raises(Exception, match=r"the first: TypeError: MistakeUntraceableDecompose: a tensor's value "
                                        r"is not known"):
        report = check_op(UntraceableDecompose, devices=["cpu"])
        raise AssertionError(report["inputs"].message)


class StringCudaSource(_Double):
    name = "MistakeStringCudaSource"
    cuda_source = 'extern "C" __global__ void gc_s(const float* x, float* y, long long n) {}'


def test_a_cuda_source_that_is_text_not_a_method_is_refused_at_registration():
    with pytest.raises(OpDeclarationError, match=r"cuda_source must be a method `def cuda_source\(self, ctype\)`"):
        validate_op_class(StringCudaSource)


def test_the_emulator_knows_the_fast_math_intrinsics(emulated_cuda):
    """__expf & co. compile and run on the host emulator (glibc declares
    some of those names without exporting them: a load error before)."""
    class FastMath(Op):
        name = "MistakeFastMath"

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return np.clip(np.exp(x) * 0.1, 0, 1) + np.log(1 + x * x) / 2 + np.sin(x) * np.cos(x) + 3

        def cuda_source(self, ctype="float"):
            return (f'extern "C" __global__ void gc_fast_math_{ctype}(const {ctype}* x, {ctype}* y, long long n) {{\n'
                    "  for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)\n"
                    "    y[i] = __saturatef(__expf(x[i]) * 0.1f) + __fdividef(__logf(1.0f + x[i] * x[i]), 2.0f)"
                    " + __sinf(x[i]) * __cosf(x[i]) + __popc(7) + __clz(1) * 0 + __ffs(0);\n}\n")

    x = np.linspace(-2, 2, 7).astype(np.float32)
    got = FastMath()(gradcore.tensor(x, device="cuda")).numpy()
    np.testing.assert_allclose(got, FastMath().cpu(x), rtol=1e-5)


def test_a_backward_leaving_gradcore_is_named_as_the_likely_cause_of_a_zero_second_order():
    from gradcore.autodiff import Function
    from gradcore.testing import GradcheckError, gradcheck, gradgradcheck

    class CubeViaNumpy(Function):
        def forward(self, x):
            self.save_for_backward(x)
            return x * x * x

        def backward(self, dy):
            (x,) = self.saved_tensors
            return gradcore.Tensor(3 * x.numpy() ** 2) * dy     # leaves gradcore: no second order

    x = gradcore.tensor([0.5, 1.5], dtype="float64")
    assert gradcheck(lambda t: CubeViaNumpy()(t), [x])
    with pytest.raises(GradcheckError, match="zero everywhere: a backward that computes with NumPy"):
        gradgradcheck(lambda t: CubeViaNumpy()(t), [x])


class PowRightAtTwoOnly(Op):
    """The tutorial's MyBadPow, its examples() building it with the default only."""
    name = "MistakePowRightAtTwoOnly"

    def __init__(self, p: float = 2.0):
        self.p = float(p)

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x ** self.p

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 2 * inputs[0],)          # right at p = 2 only

    @classmethod
    def examples(cls):
        return [(cls(), [np.array([0.5, 1.5, 2.5])])]


def test_examples_at_the_defaults_only_still_check_other_parameter_values():
    report = check_op(PowRightAtTwoOnly, devices=["cpu"], second_order=False)
    assert report.status("grad") == "failed", report
    assert "parameters derived from the defaults" in report["grad"].message
    assert len(report.instances) == 3          # the default and two derived values of p


# ---------------------------------------------------------------- found by the third docs-only plugin
class OneForTwo(_Double):
    """infer declares two outputs, the kernel forgets the second."""
    name = "MistakeOneForTwo"

    def infer(self, x):
        return (x, x)

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 2 + grads[1],)


def test_a_kernel_returning_fewer_outputs_than_infer_declares_is_an_error_not_a_crash():
    x = gradcore.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match=r"MistakeOneForTwo: infer declares 2 outputs, the kernel returned 1"):
        OneForTwo()(x)
    gm = gradcore.GradManager().attach([x])
    with pytest.raises(ValueError, match=r"MistakeOneForTwo: infer declares 2 outputs, the kernel returned 1"):
        with gm:
            gm.backward(OneForTwo()(x)[0].sum())
    report = check_op(OneForTwo(), np.array([1.0, 2.0]))
    assert report.status("forward[cpu]") == "failed" and "the kernel returned 1" in report["forward[cpu]"].message


class DecomposeOneForTwo(Op):
    """infer declares two outputs, its decompose returns one."""
    name = "MistakeDecomposeOneForTwo"

    def infer(self, x):
        return (x, x)

    def decompose(self, x):
        return (x * 2,)


def test_a_decompose_returning_fewer_outputs_than_infer_declares_names_the_decompose():
    # it said "the kernel returned 1" to an author who wrote no kernel
    with pytest.raises(ValueError, match=r"MistakeDecomposeOneForTwo: infer declares 2 outputs, its decompose "
                                         r"returned 1"):
        DecomposeOneForTwo()(gradcore.tensor([1.0, 2.0]))


class VjpOf(_Double):
    """A vjp returning ``kind``: a NumPy array, a float, a bare tensor or None."""
    name = "MistakeVjpOf"
    attrs = ("kind",)

    def __init__(self, kind="numpy"):
        self.kind = kind

    def vjp(self, inputs, outputs, grads):
        return {"numpy": (np.full(2, 2.0),), "float": (2.0,), "bare": grads[0] * 2, "none": None}[self.kind]


@pytest.mark.parametrize("kind, message", [
    ("numpy", "vjp returned a ndarray as the gradient of input 0: gradients must be Tensors"),
    ("float", "vjp returned a float as the gradient of input 0"),
    ("bare", r"vjp must return a tuple with one gradient \(a Tensor or None\) per input, got a single tensor: "
             r"return \(g,\)"),
    ("none", "vjp must return a tuple with one gradient .* got NoneType")])
def test_a_vjp_returning_no_tuple_of_tensors_is_refused_naming_the_op(kind, message):
    x = gradcore.tensor([1.0, 2.0])
    gm = gradcore.GradManager().attach([x])
    with pytest.raises(TypeError, match=f"MistakeVjpOf\\(kind='{kind}'\\): {message}"):
        with gm:
            gm.backward(VjpOf(kind)(x).sum())


class RowSum(Op):
    """A reduction whose vjp broadcasts the gradient back with zeros_like (the tutorial's way)."""
    name = "MistakeRowSum"

    def infer(self, x):
        return (TensorDesc(None if x.shape is None else x.shape[:-1], x.dtype, x.device),)

    def cpu(self, x):
        return x.sum(-1)

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (F.zeros_like(x) + F.expand_dims(g, -1),)


def test_the_like_functions_work_on_traced_tensors_so_a_reduction_vjp_broadcasts_back():
    x = gradcore.tensor([[1.0, np.inf, 2.0], [0.5, 1.0, -1.0]])
    gm = gradcore.GradManager().attach([x])
    with gm:
        gm.backward((RowSum()(x) * gradcore.tensor([2.0, 3.0])).sum())
    assert x.grad.numpy().tolist() == [[2.0, 2.0, 2.0], [3.0, 3.0, 3.0]]      # no NaN from the inf
    check_op(RowSum(), np.random.default_rng(0).standard_normal((2, 3))).raise_on_failure()
    for like, value in ((F.ones_like, 1.0), (lambda t: F.full_like(t, 2.5), 2.5)):
        class Filled(_Double):
            name = "MistakeFilledLike"

            def vjp(self, inputs, outputs, grads):
                return (grads[0] * like(inputs[0]),)
        y = gradcore.tensor([1.0, -2.0])
        gm = gradcore.GradManager().attach([y])
        with gm:
            gm.backward(Filled()(y).sum())
        assert y.grad.numpy().tolist() == [value, value]


class CudaCube(Op):
    name = "MistakeCudaCube"
    devices = ("cpu", "cuda")

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * x * x

    def cuda_source(self, ctype="float"):
        from gradcore.cuda.kernels import Kernel
        return Kernel("mistakecube", "const T* x, T* y, long long n", "y[i] = x[i] * x[i] * x[i];",
                      over="n", index="i").source(ctype)

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 3 * inputs[0] * inputs[0],)


def test_check_op_on_cuda_alone_still_checks_the_cuda_gradients(emulated_cuda):
    report = check_op(CudaCube(), np.linspace(-1, 1, 6).reshape(2, 3), devices=["cuda"])
    assert report.status("grad[cuda]") == "passed"
    assert report.status("grad") == "skipped" and report["grad"].message == "cpu not requested"


def test_the_wrong_input_count_is_named_at_the_op_not_its_python_class():
    with pytest.raises(TypeError, match=r"MistakeBroadcastMul: takes 2 inputs, got 1"):
        BroadcastMul()(gradcore.tensor([1.0]))


def test_a_plugin_may_be_blocked_by_its_entry_point_name(monkeypatch):
    from gradcore import registry

    class EP:
        name, value, dist = "probe-broken", "probe_missing:register", None
        module = "probe_missing"

        def load(self):
            raise ImportError("No module named 'probe_missing'")
    monkeypatch.setattr(registry, "_entry_points", lambda: [EP()])
    monkeypatch.setattr(registry, "_state", registry._State())
    with pytest.warns(RuntimeWarning, match="probe_missing:register"):
        registry.load(force=True)
    assert [(f.name, f.entry_point) for f in registry.failures()] == [("probe-broken", "probe_missing:register")]
    monkeypatch.setenv("GRADCORE_BLOCK_PLUGINS", "probe-broken")
    registry.load(force=True)
    assert registry.failures() == []


# ---- round 4 (docs/write-your-first-op.md, docs/cuda.md; repros in /work/trial-repros/round4/)

class Poly(Op):
    """c0 * x + c1 * x**2 with its coefficients stored as a list."""
    name = "MistakePolyList"

    def __init__(self, coeffs=(1.0, 2.0)):
        self.coeffs = list(coeffs)

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return self.coeffs[0] * x + self.coeffs[1] * x * x

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (g * (self.coeffs[0] + 2 * self.coeffs[1] * x),)


def test_a_list_parameter_is_frozen_so_the_op_cannot_drift_from_its_cached_gradient():
    op = Poly([1.0, 2.0])
    x = gradcore.tensor([0.5, 1.0], dtype="float64")
    gm = gradcore.GradManager().attach([x])
    with gm:
        gm.backward(op(x).sum())          # caches the backward graph under op
    assert op.coeffs == (1.0, 2.0)        # stored as the tuple it is hashed as
    with pytest.raises(TypeError):
        op.coeffs[1] = 10.0               # a list here changed the forward, not the cached backward
    x.grad = None
    with gm:
        gm.backward(Poly([1.0, 2.0])(x).sum())
    np.testing.assert_allclose(x.grad.numpy(), 1.0 + 4.0 * x.numpy())


class TransposedGrad(WrongShapeGrad):
    name = "MistakeTransposedGrad"

    def vjp(self, inputs, outputs, grads):
        return (F.transpose(grads[0] * 2, (1, 0)),)


def test_a_vjp_returning_a_transposed_gradient_is_a_shape_error_naming_the_op():
    # F.transpose on a traced tensor (rank unknown) crashed with "'<' not supported
    # between instances of 'int' and 'NoneType'", naming nothing
    x = gradcore.tensor(np.ones((2, 3)))
    gm = gradcore.GradManager().attach([x])
    with pytest.raises(ValueError, match=r"MistakeTransposedGrad: backward returned a gradient of shape "
                                         r"\(3, 2\) for input 0 of shape \(2, 3\)"):
        with gm:
            gm.backward(TransposedGrad()(x).sum())


class MisspeltGrad(TransposedGrad):
    """a misspelt tensor method in the vjp: the error must say whose vjp."""
    name = "MistakeMisspeltGrad"

    def vjp(self, inputs, outputs, grads):
        return (grads[0].reshpe((2, 3)) * 2,)


def test_an_error_raised_inside_a_vjp_names_the_op():
    x = gradcore.tensor(np.ones((2, 3)))
    gm = gradcore.GradManager().attach([x])
    with pytest.raises(AttributeError, match=r"^MistakeMisspeltGrad: in its vjp: .*has no attribute 'reshpe'"):
        with gm:
            gm.backward(MisspeltGrad()(x).sum())


class MulThenSum(Op):
    """a Composite-style op: its infer is derived from the decomposition."""
    name = "MistakeMulThenSum"

    def decompose(self, x, w):
        return F.sum(x * w, axis=-1)


def test_a_decomposed_ops_shape_error_names_the_op_not_only_the_op_inside():
    with pytest.raises(ValueError, match=r"^MistakeMulThenSum: in its decomposition: Elemwise\(mul\): "
                                         r"shapes cannot be broadcast"):
        MulThenSum()(gradcore.tensor(np.ones((2, 6))), gradcore.tensor(np.ones(3)))
    assert check_op(MulThenSum, devices=["cpu"]).status("bad_shapes") == "passed"


class ForgetsItsParameter(Op):
    """y = x ** p whose gradient is right only at p = 2."""
    name = "MistakeForgetsP"
    domain = (0.2, 2.0)

    def __init__(self, p=2.0):
        self.p = float(p)

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x ** self.p

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 2 * inputs[0],)


def test_one_mistake_over_every_instance_and_shape_is_reported_compactly():
    # the message held one full copy per (instance, input shape): dozens of
    # lines in one cell of `gradcore check`'s table
    report = check_op(ForgetsItsParameter, devices=["cpu"])
    msg = report["grad"].message
    assert report.status("grad") == "failed" and "MistakeForgetsP(p=" in msg
    assert msg.count("GradcheckError") <= 4 and "more failure(s) of this check" in msg


class Table(Op):
    """an op without inputs: a constant table of n values."""
    name = "MistakeTable"

    def __init__(self, n=3):
        self.n = int(n)

    def infer(self):
        return (TensorDesc((self.n,), np.dtype("float32"), "cpu"),)

    def cpu(self):
        return np.arange(self.n, dtype=np.float32)


class OffByOneTable(Table):
    name = "MistakeOffByOneTable"

    def cpu(self):
        return np.arange(self.n + 1, dtype=np.float32)


def test_an_op_without_inputs_is_checked_not_refused_for_want_of_inputs():
    # check_op generated at least one input for every op: "no generated input
    # was accepted (tried shapes )", and `gradcore check` failed the op
    report = check_op(Table)
    assert report.ok and report.status("forward[cpu]") == "passed" and report.status("infer") == "passed"
    bad = check_op(OffByOneTable)
    assert bad.status("infer") == "failed" and "MistakeOffByOneTable" in bad["infer"].message


class CudaTriple(CudaCube):
    """its cuda kernel computes 3x where the cpu kernel computes x**3."""
    name = "MistakeCudaTriple"

    def cuda_source(self, ctype="float"):
        from gradcore.cuda.kernels import Kernel
        return Kernel("mistaketriple", "const T* x, T* y, long long n", "y[i] = x[i] * 3;",
                      over="n", index="i").source(ctype)


def test_check_op_on_cuda_alone_compares_the_cuda_values_with_the_cpu_kernel(emulated_cuda):
    # `gradcore check --devices cuda`: forward[cuda] compared with nothing and
    # passed any values; infer and dtype said "the forward did not run"
    report = check_op(CudaTriple(), np.linspace(-1, 1, 6).reshape(2, 3), devices=["cuda"])
    assert report.status("forward[cuda]") == "failed"
    assert "cuda and cpu values differ" in report["forward[cuda]"].message
    assert report.status("infer") == "passed" and report.status("dtype") == "passed"
    assert check_op(CudaCube(), np.linspace(-1, 1, 6).reshape(2, 3), devices=["cuda"]).ok


class TanhOp(Op):
    name = "MistakeTanhOp"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return np.tanh(x)

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * (1 - outputs[0] * outputs[0]),)


def tanh_rule_reading_its_output(op, x):
    y = F.tanh(x)                       # computed with recording off: no history
    return (y,), lambda dy: dy * (1 - y * y)


def tanh_rule_from_its_input(op, x):
    y = F.tanh(x)
    return (y,), lambda dy: dy * (1 - F.tanh(x) ** 2)


def test_check_grad_rule_checks_second_order():
    # the rule's first order is right, its second order zero: `gradcore check`
    # passed it (rule[accepted]) while check_op of the op failed gradgrad
    from gradcore.testing import check_grad_rule
    try:
        gradcore.register_grad_rule(TanhOp)(tanh_rule_reading_its_output)
        report = check_grad_rule(TanhOp, tanh_rule_reading_its_output)
        assert report.status("rule[accepted]") == "failed"
        assert "second order" in report["rule[accepted]"].message
        assert "registered rule's) backward that reads a value its forward computed" in report["rule[accepted]"].message
        gradcore.register_grad_rule(TanhOp)(tanh_rule_from_its_input)
        assert check_grad_rule(TanhOp, tanh_rule_from_its_input).status("rule[accepted]") == "passed"
    finally:
        from gradcore import _core
        _core.unregister_grad_rule(TanhOp)


class DictParam(Op):
    name = "MistakeDictParam"

    def __init__(self, table=None):
        self.table = dict(table or {"a": 1.0})

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * self.table["a"]


def test_an_unhashable_parameter_error_names_the_op_as_the_other_messages_do():
    from gradcore.op import OpDefinitionError
    with pytest.raises(OpDefinitionError, match=r"^MistakeDictParam \(class DictParam\): op attribute\(s\) "
                                                 r"table are not hashable \(dict\)"):
        DictParam()


# ---- round 5 (a plugin family, index inputs, entry points; repros in /work/trial-repros/round5/)

class PrivateScale(Op):
    """y = k * x with k stored under a private name: not a parameter."""
    name = "MistakePrivateScale"

    def __init__(self, k=1.0):
        self._k = float(k)

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * self._k

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * self._k,)


def test_an_op_storing_its_parameter_privately_is_refused_when_a_second_value_is_built():
    from gradcore.op import OpDefinitionError
    x = gradcore.tensor([1.0, 2.0])
    np.testing.assert_allclose(PrivateScale(2.0)(x).numpy(), [2.0, 4.0])
    assert PrivateScale(2) is PrivateScale(2.0)           # the same value: the same op
    with pytest.raises(OpDefinitionError, match=r"MistakePrivateScale.*_k=3\.0 is ignored by the op's equality"):
        PrivateScale(3.0)                                  # was PrivateScale(2.0), silently


class NamedLikeDist(Op):
    name = "MistakeNamedLikeDist"

    def __init__(self, dist=1.0):
        self.dist = float(dist)

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * self.dist


@pytest.mark.parametrize("param", ["name", "dist", "nin", "devices", "domain", "infer", "cpu", "examples"])
def test_a_parameter_named_like_a_protocol_member_is_refused_naming_it(param):
    ns = {}
    exec(f"class Clash(Op):\n"
         f"    name = 'MistakeClash_{param}'\n"
         f"    def __init__(self, {param}=2.0): self.{param} = {param}\n"
         f"    def infer(self, x): return (x,)\n"
         f"    def cpu(self, x): return x * 2\n", {"Op": Op}, ns)
    with pytest.raises(OpDeclarationError, match=rf"MistakeClash_{param}.*constructor parameter\(s\) {param} "
                                                 rf"named like a member"):
        validate_op_class(ns["Clash"])


def test_a_parameter_named_like_a_class_attribute_is_not_silently_shared():
    from gradcore.op import OpDefinitionError
    x = gradcore.tensor([1.0])
    assert NamedLikeDist(2.0)(x).numpy().tolist() == [2.0]
    with pytest.raises(OpDefinitionError, match=r"MistakeNamedLikeDist.*dist=3\.0"):
        NamedLikeDist(3.0)
    assert check_op(NamedLikeDist).status("declaration") == "failed"


class MistakeTypoUnregistered(Op):
    name = "MistakeMistakeTypoUnregistered"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * 2

    def vpj(self, inputs, outputs, grads):
        return (grads[0] * 2,)


def test_check_op_holds_an_unregistered_op_to_the_declaration_rules():
    report = check_op(MistakeTypoUnregistered(), np.array([1.0, 2.0]))
    assert not report.ok
    assert report.status("declaration") == "failed" and "'vpj' (did you mean 'vjp'?)" in report["declaration"].message
    assert report.status("forward[cpu]") == "passed"       # the other checks still run


@pytest.mark.parametrize("bad, says", [(int, "got <class 'int'> (a type)"),
                                        (lambda x: x, "(a function)"),
                                        (None, "got None")])
def test_register_op_refuses_what_is_not_an_op_class(bad, says):
    with pytest.raises(OpDeclarationError, match=r"register_op expects an op class") as exc:
        register_op(bad) if bad is not None else register_op(None, name="x")(None)
    assert says in str(exc.value)
    with pytest.raises(OpDeclarationError, match=r"got an instance of MistakeTypoUnregistered \(register the class"):
        register_op(MistakeTypoUnregistered())


@pytest.mark.parametrize("target, says", [
    ("class", "names the op class MistakeEntryPointOp (class EntryOp) itself, which registers nothing"),
    ("dict", "names a dict, not a function that registers ops"),
    ("returns", "returned the op classes MistakeEntryPointOp (class EntryOp) instead of registering them")])
def test_an_entry_point_that_is_not_a_register_function_is_a_load_failure(monkeypatch, target, says):
    from gradcore import registry

    class EntryOp(Op):
        name = "MistakeEntryPointOp"

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return x

    obj = {"class": EntryOp, "dict": {"ops": [EntryOp]}, "returns": lambda: [EntryOp]}[target]

    class EP:
        name, value, dist = "probe-" + target, "probe_mod:thing", None
        module = "probe_mod"

        def load(self):
            return obj
    monkeypatch.setattr(registry, "_entry_points", lambda: [EP()])
    monkeypatch.setattr(registry, "_state", registry._State())
    with pytest.warns(RuntimeWarning, match="probe_mod:thing"):
        registry.load(force=True)
    (failure,) = registry.failures()
    assert failure.name == "probe-" + target and says in failure.error
    assert "MistakeEntryPointOp" not in [e.name for e in registry.entries()]


class IntTimes(Op):
    """y = x * idx, idx an integer tensor; the vjp wrongly differentiates idx."""
    name = "MistakeIntTimes"

    def infer(self, x, idx):
        return (x,)

    def cpu(self, x, idx):
        return (x * idx).astype(x.dtype)

    def vjp(self, inputs, outputs, grads):
        (x, idx), (g,) = inputs, grads
        return (g * idx, g * x)


def test_a_vjp_gradient_for_an_integer_input_fails_check_op():
    report = check_op(IntTimes(), np.array([0.5, 1.0, 2.0]), np.array([1, 2, 3]))
    assert report.status("grad") == "failed"
    assert "gradient for input 1, of dtype int64" in report["grad"].message


class RowsOf(Op):
    """y = x[idx]: an index out of range for a reshaped x is a value check."""
    name = "MistakeRowsOf"

    def infer(self, x, idx):
        if idx.dtype.kind not in "iu":
            raise self.error("idx must be integer", x, idx)
        if x.shape is None or idx.shape is None:
            return (TensorDesc(None, x.dtype, x.device),)
        return (TensorDesc(tuple(idx.shape) + tuple(x.shape[1:]), x.dtype, x.device),)

    def cpu(self, x, idx):
        return x[idx]

    def vjp(self, inputs, outputs, grads):
        return (None, None)


def test_bad_shapes_takes_an_index_out_of_range_naming_the_op_as_a_rejection():
    report = check_op(RowsOf(), np.ones((5, 3)), np.array([0, 4]))
    assert report.status("bad_shapes") == "passed", report["bad_shapes"].message


@pytest.mark.parametrize("key, says", [("instance", "got an instance of MatrixMul: pass the class"),
                                        ("name", "got 'MatrixMul' (a str)"),
                                        ("int", "got <class 'int'> (a type)")])
def test_a_grad_rule_for_what_is_not_an_op_class_is_refused(key, says):
    from gradcore.ops import MatrixMul
    target = {"instance": MatrixMul(), "name": "MatrixMul", "int": int}[key]
    with pytest.raises(TypeError, match="register_grad_rule expects an op class") as exc:
        gradcore.register_grad_rule(target)(lambda op, a, b: None)     # was never looked up: silent
    assert says in str(exc.value)
    assert gradcore.registered_grad_rule(MatrixMul) is None
    with pytest.raises(TypeError, match=r"register_grad_rule\(MatrixMul\): the rule must be a function"):
        gradcore.register_grad_rule(MatrixMul)(3)


@pytest.mark.parametrize("ret, says", [("None", "got NoneType"), ("2.0", "got float"),
                                        ("x.numpy()", "got ndarray"), ("(x * 2, None)", "got NoneType as output 1"),
                                        ("()", "got no output")])
def test_a_decompose_returning_no_tensors_is_named_in_the_forward_and_the_backward(ret, says):
    ns = {}
    exec(f"class D(Op):\n    name = 'MistakeDecomposeReturns'\n    def decompose(self, x): return {ret}\n",
         {"Op": Op}, ns)
    x = gradcore.tensor([1.0, 2.0])
    with pytest.raises(TypeError, match="MistakeDecomposeReturns: decompose must return its outputs") as exc:
        ns["D"]()(x)                              # was: 'NoneType' object is not iterable / has no '_data'
    assert says in str(exc.value)
    gm = gradcore.GradManager().attach([x])
    # recorded, the decomposition is traced first (where .numpy() has its own error)
    traced = r"no \.numpy\(\) value" if ret == "x.numpy()" else "decompose must return its outputs"
    with pytest.raises(TypeError, match=f"MistakeDecomposeReturns: .*{traced}"):
        with gm:
            gm.backward(gradcore.core.apply(ns["D"](), x)[0].sum())


class ScaleByLaunch(Op):
    """y = a * x with a launcher whose grid is given as `grid`."""
    name = "MistakeScaleByLaunch"
    devices = ("cpu", "cuda")

    def __init__(self, grid=(1,)):
        self.grid = grid

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * 2

    def cuda_source(self, ctype="float"):
        from gradcore.cuda.kernels import Kernel
        return Kernel("mistakescale", "const T* x, T* y, long long n", "y[i] = 2 * x[i];",
                      over="n", index="i").source(ctype)

    def cuda(self, be, x):
        y = be.empty(x.shape, x.dtype)
        be.launch(be.kernel(self, be.ctype(x.dtype)), self.grid, (128,), x, y, y.size)
        return y


@pytest.mark.parametrize("grid, says", [(4, "got grid=4"), ((-1,), "got grid=(-1,)"),
                                        # (n + 127) / 128: a float size was truncated (1.99 blocks ran as 1)
                                        ((1.99,), "got grid=(1.99,)")])
def test_a_launch_with_a_grid_that_is_not_a_tuple_of_sizes_says_what_it_takes(emulated_cuda, grid, says):
    x = gradcore.tensor([1.0, 2.0], device="cuda")
    with pytest.raises(ValueError, match=r"MistakeScaleByLaunch\(grid=.*\): gc_mistakescale_float: the grid and "
                                         r"the block are tuples of 1 to 3 non-negative ints") as exc:
        ScaleByLaunch(grid)(x)               # was: "object of type 'int' has no len()"
    assert says in str(exc.value)
    np.testing.assert_allclose(ScaleByLaunch((1,))(x).numpy(), [2.0, 4.0])
    np.testing.assert_allclose(ScaleByLaunch((np.int64(1),))(x).numpy(), [2.0, 4.0])     # any integer type


def test_a_grad_rule_two_plugins_register_for_one_op_is_a_conflict_not_a_silent_replacement(monkeypatch):
    from gradcore import registry
    from gradcore.ops import MatrixMul
    standard = [ep for ep in registry._entry_points() if registry._dist_name(ep) == "gradcore"]

    def rule_a(op, a, b):
        raise gradcore.GradRuleFallback

    def rule_b(op, a, b):
        raise gradcore.GradRuleFallback

    def plugin(name, rule):
        class EP:
            value, dist, module = f"{name}:register", None, name

            def load(self):
                return lambda: gradcore.register_grad_rule(MatrixMul)(rule)   # returns the rule: fine
        EP.name = name
        return EP()
    monkeypatch.setattr(registry, "_entry_points", lambda: standard + [plugin("rules_a", rule_a),
                                                                          plugin("rules_b", rule_b)])
    monkeypatch.setattr(registry, "_state", registry._State())
    try:
        with pytest.warns(RuntimeWarning, match="rules_b"):
            registry.load(force=True)
        (failure,) = registry.failures()
        assert failure.name == "rules_b"
        assert "a grad rule for MatrixMul is registered by two distributions: 'rules_a' and 'rules_b'" in failure.error
        assert gradcore.registered_grad_rule(MatrixMul) is rule_a          # was rule_b, silently
    finally:
        gradcore.unregister_grad_rule(MatrixMul)


# ---------------------------------------------------------------- round six

class _Square(Op):
    name = "MistakeSquare6"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * x

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 2 * inputs[0],)


def test_an_op_defining_a_jvp_is_refused_it_would_be_ignored():
    # ported from JAX's custom_jvp or torch.autograd.Function.jvp: gradcore never calls it,
    # so a jvp disagreeing with the vjp passed every check
    class WithJvp(_Square):
        name = "MistakeWithJvp"

        def jvp(self, inputs, outputs, tangents):
            return (tangents[0] * 3 * inputs[0],)
    with pytest.raises(OpDeclarationError, match=r"'MistakeWithJvp'.*defines `jvp`, which gradcore never calls"):
        validate_op_class(WithJvp)
    report = check_op(WithJvp, devices=["cpu"])
    assert report.status("declaration") == "failed" and not report.ok


def test_an_op_written_as_a_function_forward_backward_is_refused_it_has_no_forward():
    class TorchStyle(Op):
        name = "MistakeTorchStyle"

        def infer(self, x):
            return (x,)

        def forward(self, x):
            return x * x

        def backward(self, g):
            return g * 2
    with pytest.raises(OpDeclarationError, match=r"'MistakeTorchStyle'.*has no forward.*`forward` and `backward` "
                                                 r"belong to gradcore.autodiff.Function's protocol"):
        validate_op_class(TorchStyle)      # was registered; applying it: "object has no attribute 'cpu'"

    class Empty(Op):
        name = "MistakeEmpty"
    with pytest.raises(OpDeclarationError, match=r"'MistakeEmpty'.*has no forward: no `cpu"):
        validate_op_class(Empty)


class _Positive(_Square):
    name = "MistakePositive6"

    def __init__(self, p=2.0):
        if p <= 0:
            raise ValueError("p must be positive")
        self.p = float(p)

    def cpu(self, x):
        return x * self.p

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * self.p,)


@pytest.mark.parametrize("params, says", [
    ([{"p": 3.0}, {"q": 1.0}], r"check_params\[1\] = \{'q': 1.0\}: the constructor refuses it \(TypeError"),
    ([{"p": -1.0}], r"check_params\[0\] = \{'p': -1.0\}: the constructor refuses it \(ValueError: p must be positive"),
    ({"p": 3.0}, r"check_params is a dict; it is a list"),
    ([3.0], r"check_params\[0\] = 3.0 is a float; each entry is a dict"),
])
def test_check_params_the_constructor_refuses_fail_the_inputs_check_naming_the_entry(params, says):
    cls = type("Bad", (_Positive,), {"name": "MistakeBadCheckParams", "check_params": params})
    report = check_op(cls, devices=["cpu"])        # was: the bare ValueError/TypeError from __init__
    assert report.status("inputs") == "failed"
    assert re.search(r"check_op\(MistakeBadCheckParams\): " + says, report["inputs"].message)


_CALLS = [0]


def _count_call():
    _CALLS[0] += 1
    return _CALLS[0]


@pytest.mark.parametrize("kernel", [
    lambda self, x: x * (1 + 0.01 * np.random.default_rng().standard_normal(x.shape)).astype(x.dtype),
    lambda self, x: x + _count_call(),       # state kept between calls
], ids=["random", "stateful"])
def test_a_kernel_that_is_not_deterministic_fails_forward_saying_so(kernel):
    cls = type("Noisy", (_Square,), {"name": "MistakeNoisy6", "cpu": kernel})
    report = check_op(cls, devices=["cpu"])
    msg = report["forward[cpu]"].message
    # was: "float32 and float64 results differ by up to ..." and gradients off by 1e4
    assert report.status("forward[cpu]") == "failed"
    assert "two runs on the same inputs give different output 0" in msg and "not deterministic" in msg
    assert check_op(_Square, devices=["cpu"]).ok       # a deterministic kernel passes


def test_an_emulator_compile_error_quotes_the_kernel_line_not_the_prelude_and_no_temporary_path(emulated_cuda):
    from gradcore.cuda.kernels import Kernel

    class Broken(_Square):
        name = "MistakeBrokenCuda6"
        devices = ("cpu", "cuda")

        def cuda_source(self, ctype="float"):
            return Kernel("mistakebroken6", "const T* x, T* y, long long n", "T v = x[i]\n y[i] = v;",
                          over="n", index="i").source(ctype)
    with pytest.raises(RuntimeError) as exc:
        Broken()(gradcore.tensor([1.0, 2.0], device="cuda"))
    msg = str(exc.value)
    assert "MistakeBrokenCuda6" in msg and "| y[i] = v;" in msg
    log = msg.split("compiler log:")[1]
    assert "#include" not in log and "gradcore-emu-" not in log     # was: "8 | #include <cstdio>", /tmp/... paths


def test_gradients_returned_in_the_wrong_order_fail_grad_with_a_hint():
    # two inputs of one shape: no shape error catches the swap; finite differences do
    class Swapped(Op):
        name = "MistakeSwapped6"

        def infer(self, x, w):
            if x.shape is not None and w.shape is not None and x.shape != w.shape:
                raise self.error("needs inputs of one shape", x, w)
            return (x,)

        def cpu(self, x, w):
            return x * np.exp(w)

        def vjp(self, inputs, outputs, grads):
            (x, w), (g,) = inputs, grads
            return (g * x * F.exp(w), g * F.exp(w))         # (d/dw, d/dx): swapped
    report = check_op(Swapped, devices=["cpu"])
    assert report.status("grad") == "failed"
    assert ("input 0's analytic gradient is input 1's numerical one: the backward returns the gradients "
            "in the wrong order?") in report["grad"].message


class _RowDot(Op):
    """sum(x * w, last axis) of broadcasting x, w; its vjp returns g[..., None] * w and
    g[..., None] * x: broadcastable to the inputs' broadcast shape, not in it."""
    name = "MistakeRowDot6"

    def infer(self, x, w):
        if x.shape is None or w.shape is None:
            return (TensorDesc(None, x.dtype, x.device),)
        try:
            shape = tuple(np.broadcast_shapes(x.shape, w.shape))
        except ValueError:
            raise self.error("inputs do not broadcast", x, w) from None
        return (TensorDesc(shape[:-1], x.dtype, x.device),)

    def cpu(self, x, w):
        return (x * w).sum(axis=-1)

    def vjp(self, inputs, outputs, grads):
        (x, w), (g,) = inputs, grads
        g = F.expand_dims(g, -1)
        return (g * w, g * x)


def test_a_reduction_gradient_only_broadcastable_names_the_input_and_the_broadcast_shape():
    says = (r"MistakeRowDot6: backward returned a gradient of shape \(3, 1\) for input 1 of shape \(1, 4\): "
            r"return it in that shape or in the inputs' broadcast shape \(3, 4\)")
    x, w = gradcore.tensor(np.ones((3, 1))), gradcore.tensor(np.ones((1, 4)))
    gm = gradcore.GradManager().attach([x, w])
    with pytest.raises(ValueError, match=says):            # was: "for an input of shape (1, 4)"
        with gm:
            gm.backward(_RowDot()(x, w).sum())
    # recorded by an outer manager (the backward runs as ops): was SumTo's error, naming SumTo
    outer, inner = gradcore.GradManager().attach([x, w]), gradcore.GradManager().attach([x, w])
    with pytest.raises(ValueError, match=says):
        with outer:
            with inner:
                inner.backward(_RowDot()(x, w).sum())
    # inputs whose broadcast shape the gradients have: summed down, first and second order
    assert check_op(_RowDot(), np.arange(6.0).reshape(2, 3), np.array([1.0, 2.0, 3.0]), devices=["cpu"]).ok


# ---------------------------------------------------------------- round 7: parameter kinds, layouts, names, versions
class _Poly(Op):
    """sum_k c_k x**k: a tuple of floats parameter."""
    name = "MistakePoly7"

    def __init__(self, coeffs=(0.0, 1.0)):
        self.coeffs = tuple(float(c) for c in coeffs)

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return sum(c * x ** k for k, c in enumerate(self.coeffs)) + np.zeros_like(x)

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        d = F.zeros_like(x)
        for k, c in enumerate(self.coeffs[1:], start=1):
            d = d + k * c * x ** (k - 1)
        return (g * d,)


def test_a_tuple_of_floats_parameter_is_checked_at_other_values_and_lengths():
    class LinearOnly(_Poly):           # the gradient of the linear term alone: right at the default
        name = "MistakePolyLinearOnly7"

        def vjp(self, inputs, outputs, grads):
            return (grads[0] * self.coeffs[1],)
    assert check_op(_Poly, devices=["cpu"]).ok
    report = check_op(LinearOnly, devices=["cpu"])     # was: passed, checked at coeffs=(0.0, 1.0) only
    assert report.status("grad") == "failed"
    assert any(i.count(",") == 2 for i in report.instances)      # one coefficient more


def test_a_tuple_of_ints_parameter_is_checked_at_other_values():
    class Windowed(Op):
        name = "MistakeWindowed7"

        def __init__(self, kernel_size=(1, 1)):
            self.kernel_size = tuple(int(k) for k in kernel_size)

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return x * float(np.prod(self.kernel_size))

        def vjp(self, inputs, outputs, grads):
            return (grads[0],)             # forgets the factor: right at (1, 1) only
    report = check_op(Windowed, devices=["cpu"])
    assert report.status("grad") == "failed"
    assert len(report.instances) == 3 and "MistakeWindowed7(kernel_size=(1, 1))" in report.instances


def test_a_none_parameter_is_checked_when_annotated_optional_and_refused_unannotated():
    from typing import Optional

    class Scaled(Op):
        name = "MistakeOptionalScale7"

        def __init__(self, scale: Optional[float] = None):
            self.scale = scale if scale is None else float(scale)

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return x if self.scale is None else x * self.scale

        def vjp(self, inputs, outputs, grads):
            return (grads[0],)             # forgets scale
    report = check_op(Scaled, devices=["cpu"])
    assert report.status("grad") == "failed" and "scale=None" not in report.instances[1]

    def unannotated(self, scale=None):
        self.scale = scale
    bare = type("Bare", (Scaled,), {"name": "MistakeOptionalScaleBare7", "__init__": unannotated})
    report = check_op(bare, devices=["cpu"])           # was: passed, scale=None only
    assert report.status("inputs") == "failed"
    assert "scale=None would be checked at the default only" in report["inputs"].message


def test_a_dtype_parameter_with_a_float32_output_is_not_failed_by_finite_differences():
    from typing import Literal

    class CastTo(Op):
        name = "MistakeCastTo7"

        def __init__(self, dtype: Literal["float32", "float64"] = "float32"):
            self.dtype = dtype

        def infer(self, x):
            return (TensorDesc(x.shape, np.dtype(self.dtype), x.device),)

        def cpu(self, x):
            return (x * 3).astype(self.dtype)

        def vjp(self, inputs, outputs, grads):
            return (F.astype(grads[0], inputs[0].dtype) * 3,)
    report = check_op(CastTo, devices=["cpu"])         # was: grad failed at dtype='float32', |diff| 0.009
    assert report.ok and report.status("grad") == "passed"
    assert "not checked: MistakeCastTo7(dtype='float32'): output 0 is float32" in report["grad"].message


def test_a_variadic_op_is_checked_with_several_inputs():
    class Stack0(Op):
        name = "MistakeConcat7"

        def infer(self, *xs):
            if any(x.shape is None for x in xs):
                return (TensorDesc(None, xs[0].dtype, xs[0].device),)
            if len({x.shape[1:] for x in xs}) != 1:
                raise self.error("inputs differ beyond axis 0", *xs)
            return (TensorDesc((sum(x.shape[0] for x in xs),) + xs[0].shape[1:], xs[0].dtype, xs[0].device),)

        def cpu(self, *xs):
            return np.concatenate(xs, axis=0)

        def vjp(self, inputs, outputs, grads):
            return tuple(gradcore.ops.SplitLike(0)(grads[0], *inputs)) if len(inputs) > 1 else (grads[0],)

    class Bad(Stack0):
        name = "MistakeConcatBad7"

        def vjp(self, inputs, outputs, grads):
            return (grads[0],) if len(inputs) == 1 else tuple(F.zeros_like(x) for x in inputs)
    assert check_op(Stack0, devices=["cpu"]).ok
    report = check_op(Bad, devices=["cpu"])            # was: passed, one input only
    assert report.status("grad") == "failed" and "(2, 3), (2, 3)" in report["grad"].message


def test_a_reordered_atomic_sum_passes_the_determinism_check():
    rng = np.random.default_rng()

    class AtomicRowSum(Op):
        name = "MistakeAtomicRowSum7"

        def infer(self, x):
            return (TensorDesc(x.shape[:-1] if x.shape is not None else None, x.dtype, x.device),)

        def cpu(self, x):
            y = np.zeros(x.shape[:-1], x.dtype)
            for j in rng.permutation(x.shape[-1]):     # the order atomicAdd would take
                y += x[..., j]
            return y

        def vjp(self, inputs, outputs, grads):
            return (F.zeros_like(inputs[0]) + F.expand_dims(grads[0], -1),)

        @classmethod
        def examples(cls):
            x = np.random.default_rng(1).standard_normal((4, 50))
            x[:, -1] = -x[:, :-1].sum(-1)           # sums that cancel: their rounding shows
            return [(cls(), [x])]
    report = check_op(AtomicRowSum, devices=["cpu"])   # was: "not deterministic" for 1.7e-15
    assert report.status("forward[cpu]") == "passed", report["forward[cpu]"].message


def test_a_kernel_that_reads_inputs_as_c_contiguous_fails_forward():
    class CContiguous(_Double):
        name = "MistakeCContiguous7"

        def cpu(self, x):       # the buffer read in memory order: a transposed input gets scrambled
            flat = np.lib.stride_tricks.as_strided(x, shape=(x.size,), strides=(x.itemsize,))
            return flat.reshape(x.shape) * 2
    report = check_op(CContiguous, devices=["cpu"])    # was: passed; wrong for x.T
    assert report.status("forward[cpu]") == "failed"
    assert "in Fortran order or strided" in report["forward[cpu]"].message
    assert "np.ascontiguousarray" in report["forward[cpu]"].message
    assert check_op(_Double, devices=["cpu"]).status("forward[cpu]") == "passed"


def test_a_decompose_applying_the_op_itself_is_one_clear_error():
    class Recursive(Op):
        name = "MistakeRecursive7"

        def decompose(self, x):
            return Recursive()(x) * 1
    x = gradcore.tensor(np.ones((2, 3)))
    with pytest.raises(TypeError, match=r"^MistakeRecursive7: its decompose (applies|recursed).* MistakeRecursive7 "
                                        r"itself.*\(input shapes: \(2, 3\)\)$"):
        Recursive()(x)                 # was: RecursionError, "(input shapes: (2, 3))" repeated ~300 times
    with pytest.raises(TypeError, match=r"MistakeRecursive7: its decompose applies MistakeRecursive7 itself"):
        Recursive().infer(TensorDesc((2, 3), "float32", "cpu"))


def test_a_vjp_reading_a_shape_through_a_helper_says_shapes_are_none_while_traced():
    class Upsample(_Double):
        name = "MistakeUpsample7"

        def vjp(self, inputs, outputs, grads):
            return (F.repeat(grads[0], 1, axis=-1),)     # reads ndim: None while traced
    x = gradcore.tensor(np.ones((2, 3)))
    gm = gradcore.GradManager().attach([x])
    with pytest.raises(TypeError, match=r"MistakeUpsample7: in its vjp: .*NoneType.*while a vjp is traced, "
                                        r"shapes and ndim are None"):
        with gm:
            gm.backward(Upsample()(x).sum())


@pytest.mark.parametrize("name", ["My Op", "my.op", "pkg::op", "1op", "Ünï"])
def test_an_op_name_that_is_not_an_identifier_is_refused(name):
    cls = type("Named", (_Double,), {"name": name})
    with pytest.raises(OpDeclarationError, match=r"an op's name is a Python identifier in ASCII"):
        register_op(cls)               # was: registered (and "Ünï" a UnicodeDecodeError in to_torch)
    assert check_op(cls, devices=["cpu"]).status("declaration") == "failed"


def test_a_constructor_changing_its_arguments_does_not_change_check_params():
    class Mutating(_Double):
        name = "MistakeMutating7"
        check_params = [{"coeffs": [1.0, 2.0]}, {"coeffs": [3.0]}]

        def __init__(self, coeffs=(1.0,)):
            coeffs = coeffs if isinstance(coeffs, list) else list(coeffs)
            coeffs.append(0.0)
            self.coeffs = tuple(coeffs)
    report = check_op(Mutating, devices=["cpu"])
    assert Mutating.check_params == [{"coeffs": [1.0, 2.0]}, {"coeffs": [3.0]}]
    assert report.instances == ["MistakeMutating7(coeffs=(1.0, 2.0, 0.0))", "MistakeMutating7(coeffs=(3.0, 0.0))"]


class _Clip7(_Double):
    """Version 1 of a plugin's op (the test replaces its constructor by version 2's)."""
    name = "MistakeClip7"

    def __init__(self, lo=0.0):
        self.lo = float(lo)


def test_loading_an_op_saved_by_another_version_of_its_class_names_both_parameter_lists(monkeypatch):
    import io
    buf = io.BytesIO()
    gradcore.save({"op": _Clip7(0.5)}, buf)

    def upgraded(self, low=0.0, high=1.0):      # version 2 renamed the parameter
        self.low, self.high = float(low), float(high)
    monkeypatch.setattr(_Clip7, "__init__", upgraded)
    buf.seek(0)
    with pytest.raises(gradcore.serialization.LoadError,
                       match=r"MistakeClip7: a saved MistakeClip7\(lo=0.5\) cannot be rebuilt: the installed class "
                             r".*has the parameters \(low, high\)"):
        gradcore.load(buf, weights_only=False)     # was: loaded; its first call an AttributeError on 'low'


class _GroupSum(Op):
    """Sums of groups of k along the last axis (not differentiable: the
    inputs are what is checked here); infer refuses lengths k does not divide."""
    name = "MistakeGroupSum7"
    check_params = [{"k": 2}, {"k": 7}]

    def __init__(self, k=2):
        self.k = int(k)

    def infer(self, x):
        if x.shape is None:
            return (TensorDesc(None, x.dtype, x.device),)
        if x.ndim == 0 or x.shape[-1] % self.k:
            raise self.error(f"the last axis must be a multiple of {self.k}", x)
        return (TensorDesc(x.shape[:-1] + (x.shape[-1] // self.k,), x.dtype, x.device),)

    def cpu(self, x):
        return x.reshape(x.shape[:-1] + (x.shape[-1] // self.k, self.k)).sum(-1)


def test_a_check_params_instance_no_generated_input_reaches_fails_inputs_naming_it():
    report = check_op(_GroupSum, devices=["cpu"])      # was: passed, k=7 never checked
    assert report.status("inputs") == "failed"
    assert "no generated input with elements was accepted for MistakeGroupSum7(k=7)" in report["inputs"].message


def test_an_op_whose_only_accepted_generated_input_is_empty_is_not_passed():
    class EvenOnly(_GroupSum):
        name = "MistakeEvenOnly7"
        check_params = [{"k": 9}]
        check_shapes = [((0, 9),), ((2, 4),)]          # infer accepts the 0-size one alone
    report = check_op(EvenOnly, devices=["cpu"])       # was: passed on a 0-size input alone
    assert report.status("inputs") == "failed"


def test_a_list_of_tensors_given_to_an_op_is_refused_not_stacked_into_a_constant():
    class Cat(Op):
        name = "MistakeListConcat7"

        def infer(self, *xs):
            return (TensorDesc(None if any(x.shape is None for x in xs) else
                               (sum(x.shape[0] for x in xs),) + xs[0].shape[1:], xs[0].dtype, xs[0].device),)

        def cpu(self, *xs):
            return np.concatenate(xs, axis=0)
    a = gradcore.tensor(np.ones((2, 4)))
    # was: the list became one float32 constant of shape (2, 2, 4): no gradient reached a
    with pytest.raises(TypeError, match=r"op MistakeListConcat7: argument 0 is a list holding Tensors, which would "
                                        r"become one constant tensor without gradient"):
        Cat()([a, a * 2])
    with pytest.raises(TypeError, match=r"argument 1 is a list holding Tensors"):
        a + [a, a]                     # was: a gradient of 2 where 4 is right
    assert Cat()(a, a * 2).shape == (4, 4) and (a + [1.0, 2.0, 3.0, 4.0]).shape == (2, 4)
