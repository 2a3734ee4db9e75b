"""gradcore.to_jax: gradcore ops and functions as JAX functions, ``jax.grad``
equal to gradcore's gradient (also second order, under jit and vmap).
JAX is not a test dependency: without it these tests skip, saying so."""
import re
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (optional: pip install jax); "
                                         "gradcore.to_jax is tested where it is")
jnp = pytest.importorskip("jax.numpy")

import gradcore  # noqa: E402
import gradcore.functional as F  # noqa: E402
from gradcore import registry  # noqa: E402
from gradcore.autodiff import GradManager  # noqa: E402
from gradcore.op import Op, OpError  # noqa: E402
from gradcore.ops import Elemwise, MatrixMul  # noqa: E402


class Cube(Op):
    name = "JaxCube"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x * x * x

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (g * 3 * x * x,)


def gradcore_grad(fn, *arrays):
    xs = [gradcore.tensor(a) for a in arrays]
    gm = GradManager().attach(xs)
    with gm:
        gm.backward(fn(*xs).sum())
    return [x.grad.numpy() for x in xs]


def test_values_and_grad_equal_gradcore():
    jc = gradcore.to_jax(Cube)
    x = np.array([0.5, -1.0, 2.0], np.float32)
    np.testing.assert_allclose(np.asarray(jc(jnp.asarray(x))), x ** 3)
    g = jax.grad(lambda v: jc(v).sum())(jnp.asarray(x))
    (ref,) = gradcore_grad(lambda t: Cube()(t), x)
    np.testing.assert_allclose(np.asarray(g), ref, rtol=1e-6)
    assert np.asarray(g).dtype == np.float32


def test_second_order_jit_and_vmap():
    jc = gradcore.to_jax(Cube())
    x = jnp.array([0.5, -1.0, 2.0])
    gg = jax.jit(jax.grad(lambda v: jax.grad(lambda u: jc(u).sum())(v).sum()))(x)
    np.testing.assert_allclose(np.asarray(gg), 6 * np.asarray(x), rtol=1e-6)
    batched = jax.vmap(jc)(jnp.arange(6.0).reshape(2, 3))
    np.testing.assert_allclose(np.asarray(batched), np.arange(6.0).reshape(2, 3) ** 3)


def test_binary_op_and_function_with_several_outputs():
    mm = gradcore.to_jax(MatrixMul())
    a = np.random.default_rng(0).uniform(-1, 1, (2, 3)).astype(np.float32)
    b = np.random.default_rng(1).uniform(-1, 1, (3, 4)).astype(np.float32)
    ga, gb = jax.grad(lambda p, q: mm(p, q).sum(), argnums=(0, 1))(jnp.asarray(a), jnp.asarray(b))
    ra, rb = gradcore_grad(lambda p, q: F.matmul(p, q), a, b)
    np.testing.assert_allclose(np.asarray(ga), ra, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gb), rb, rtol=1e-6)
    f = gradcore.to_jax(lambda p: (F.tanh(p), (p * p).sum()))
    t, s = f(jnp.asarray(a))
    np.testing.assert_allclose(np.asarray(t), np.tanh(a), rtol=1e-6)
    g = jax.grad(lambda p: f(p)[0].sum() + f(p)[1])(jnp.asarray(a))
    np.testing.assert_allclose(np.asarray(g), 1 - np.tanh(a) ** 2 + 2 * a, rtol=1e-5)


def test_standard_op_against_jax_own_derivative():
    jt = gradcore.to_jax(Elemwise("tanh"))
    x = jnp.linspace(-2.0, 2.0, 9)
    g = jax.grad(lambda v: jt(v).sum())(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(lambda v: jnp.tanh(v).sum())(x)), rtol=1e-6)


def test_errors_surface():
    mm = gradcore.to_jax(MatrixMul())
    with pytest.raises(OpError, match=r"MatrixMul.*\(2, 3\)"):
        mm(jnp.ones((2, 3)), jnp.ones((2, 3)))
    with pytest.raises(TypeError, match="to_jax: expected a gradcore op"):
        gradcore.to_jax(3)


def test_tutorial_jax_block_runs():
    """The tutorial's JAX example (a ``python jax`` block, run here and not
    by test_docs, which runs without JAX) after the tutorial's own blocks."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "write-your-first-op.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    jax_blocks = re.findall(r"^```python jax\n(.*?)^```", text, re.S | re.M)
    assert jax_blocks and "to_jax" in jax_blocks[0]
    ns = {"__name__": "docs_jax"}
    with registry.preserved():
        for k, block in enumerate(blocks):
            exec(compile(block, f"write-your-first-op.md (python block {k + 1})", "exec"), ns)
        for block in jax_blocks:
            exec(compile(block, "write-your-first-op.md (python jax block)", "exec"), ns)
