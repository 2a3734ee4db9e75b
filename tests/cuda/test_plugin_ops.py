"""Ops outside the standard library on cuda: a plugin op with its own
launcher (gradcore-fused-act), a Composite (gradcore-decomp), and an op
with only a ``cuda_source`` in the simple layout (the default launcher)."""
import sys
from pathlib import Path

import numpy as np
import pytest

import gradcore as gc
from gradcore.core import apply
from gradcore.op import Op

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


@pytest.fixture
def plugin_path(monkeypatch):
    for name in ("gradcore-fused-act", "gradcore-decomp"):
        monkeypatch.syspath_prepend(str(PLUGINS / name))
    yield
    for mod in ("gradcore_fused_act", "gradcore_decomp"):
        sys.modules.pop(mod, None)


def test_fused_bias_gelu_on_cuda(cuda, matches_cpu, plugin_path):
    from gradcore_fused_act import fused_bias_gelu
    rng = np.random.default_rng(0)
    x, b = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    matches_cpu(fused_bias_gelu, [x, b])


def test_a_composite_plugin_on_cuda(cuda, matches_cpu, plugin_path):
    import gradcore_decomp
    op = gradcore_decomp.Mish()
    x = np.linspace(-2, 2, 9).astype(np.float32)
    matches_cpu(lambda t: apply(op, t)[0], [x])


class _Cube(Op):
    name = "TestCube"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * x * x

    def cuda_source(self, ctype="float"):
        return (f'extern "C" __global__ void gc_testcube_{ctype}(const {ctype}* x, {ctype}* y, long long n) {{\n'
                "    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
                "    if (i < n) y[i] = x[i] * x[i] * x[i];\n}\n")

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (g * 3 * x * x,)


def test_an_op_with_only_a_cuda_source_runs_with_the_default_launcher(cuda, matches_cpu):
    x = np.linspace(-1.5, 1.5, 600).reshape(2, 300).astype(np.float32)   # more than one block
    matches_cpu(lambda t: apply(_Cube(), t)[0], [x])
    assert apply(_Cube(), gc.Tensor(x, device="cuda"))[0].device == "cuda"
