"""Proof that gradcore.testing.check_op catches wrong gradients: copies of
standard ops (Softmax, CumSum, MatrixMul) with a bug injected into their
VJP each fail check_op, while the originals pass on the same inputs. The
copies give no inputs of their own beyond what the originals declare
(Softmax's examples(), CumSum's and MatrixMul's generated inputs)."""
import numpy as np
import pytest

from gradcore._core import apply as _apply
from gradcore.ops import CumSum, MatrixMul, Reduce, Softmax, StopGradient
from gradcore.testing import check_op


def _sum_keep(axis, x):
    return _apply(Reduce("sum", axis, True), x)[0]


class SoftmaxWrongConstant(Softmax):
    name = "BugSoftmaxWrongConstant"

    def vjp(self, inputs, outputs, grads):
        (y,), (g,) = outputs, grads
        gy = g * y
        return [gy - y * _sum_keep(self.axis, gy) * 2]          # 2: should be 1


class SoftmaxDroppedTerm(Softmax):
    name = "BugSoftmaxDroppedTerm"

    def vjp(self, inputs, outputs, grads):
        (y,), (g,) = outputs, grads
        return [g * y]                                          # the - y * sum(g * y) term is gone


class SoftmaxSwappedAxis(Softmax):
    name = "BugSoftmaxSwappedAxis"

    def vjp(self, inputs, outputs, grads):
        (y,), (g,) = outputs, grads
        gy = g * y
        wrong = 0 if self.axis in (-1, 1) else -1              # sums along the other axis
        return [gy - y * _sum_keep(wrong, gy)]


class SoftmaxWrongSecondOrder(Softmax):
    name = "BugSoftmaxWrongSecondOrder"

    def vjp(self, inputs, outputs, grads):
        (y,), (g,) = outputs, grads
        y = _apply(StopGradient(), y)[0]                         # right value, no derivative
        gy = g * y
        return [gy - y * _sum_keep(self.axis, gy)]


class CumSumIgnoresReverse(CumSum):
    name = "BugCumSumIgnoresReverse"

    def vjp(self, inputs, outputs, grads):
        return [_apply(CumSum(self.axis, True), grads[0])[0]]   # should be `not self.reverse`: right only when reverse is False


class MatrixMulIgnoresTransposeB(MatrixMul):
    name = "BugMatrixMulIgnoresTransposeB"

    def vjp(self, inputs, outputs, grads):
        (a, b), (g,) = inputs, grads
        mm = lambda x, y, ta=False, tb=False: _apply(MatrixMul(ta, tb), x, y)[0]
        return [mm(g, b, tb=not self.transpose_b), mm(a, g, ta=True)]  # the b side ignores transpose_b


@pytest.mark.parametrize("buggy, original, failing", [
    (SoftmaxWrongConstant, Softmax, "grad"),
    (SoftmaxDroppedTerm, Softmax, "grad"),
    (SoftmaxSwappedAxis, Softmax, "grad"),
    (SoftmaxWrongSecondOrder, Softmax, "gradgrad"),
    (CumSumIgnoresReverse(0, True), CumSum(0, True), "grad"),
    (MatrixMulIgnoresTransposeB(False, True), MatrixMul(False, True), "grad"),
], ids=lambda v: v if isinstance(v, str) else getattr(v, "name", "") or type(v).__name__)
def test_an_injected_gradient_bug_fails_check_op(buggy, original, failing):
    good = check_op(original, devices=["cpu"], compile_cuda=False)
    assert good.ok, good
    assert good.status(failing) == "passed", good
    bad = check_op(buggy, devices=["cpu"], compile_cuda=False)
    assert not bad.ok
    assert bad.status(failing) == "failed", bad
    if failing == "gradgrad":
        # the first derivative is right: only the second order catches it
        assert bad.status("grad") == "passed", bad
    # the failure names the op and what differs (values, or the gradient's shape)
    assert "analytic" in bad[failing].message or "gradient of shape" in bad[failing].message


def test_a_generated_failure_reports_the_seed_and_shapes():
    bad = check_op(CumSumIgnoresReverse(0, True), devices=["cpu"], compile_cuda=False, seed=7)
    msg = bad["grad"].message
    assert "generated inputs, seed 7, shapes" in msg, msg
