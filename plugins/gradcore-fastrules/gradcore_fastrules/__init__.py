"""gradcore-fastrules: a grad rule for an op this package does not own.

An example of gradient path 2: ``register()`` (the entry point
``gradcore.ops: fastrules = gradcore_fastrules:register``, run when the
registry loads plugins, i.e. on the first ``gradcore.ops.get`` /
``gradcore.registry.entries()`` / ``gradcore ops``) registers, with
``gradcore.register_grad_rule``, a rule for the standard
``gradcore.ops.MatrixMul``. The rule takes only plain 2-D float32 CPU
products without transposes: the forward is one ``np.dot`` and the backward
keeps the two operands and nothing else. Anything else (batched, float64,
transposed, another device) raises ``GradRuleFallback`` before doing any
work, and the standard backward graph handles the call.

``stats`` counts how often the rule was used and how often it declined.
"""
from __future__ import annotations

import numpy as np

from gradcore import GradRuleFallback, Tensor, register_grad_rule
from gradcore.core import apply
from gradcore.ops import MatrixMul

__all__ = ["register", "unregister", "matmul_2d_float32_rule", "stats"]

stats = {"used": 0, "fallback": 0}

_F32 = np.dtype(np.float32)
_NT, _TN = MatrixMul(False, True), MatrixMul(True, False)


def matmul_2d_float32_rule(op, a, b):
    """Grad rule for ``MatrixMul``: ``(outputs, backward)`` for a plain
    2-D float32 CPU product; ``GradRuleFallback`` for anything else."""
    if (op.transpose_a or op.transpose_b or a.ndim != 2 or b.ndim != 2
            or a.dtype != _F32 or b.dtype != _F32 or a.device != "cpu" or b.device != "cpu"
            or a.shape[1] != b.shape[0]):
        stats["fallback"] += 1
        raise GradRuleFallback
    stats["used"] += 1
    y = Tensor(np.dot(a.numpy(), b.numpy()))

    def backward(dy):
        if dy is None:
            return None, None
        # gradcore ops: recorded by an outer manager, so second order works
        return apply(_NT, dy, b)[0], apply(_TN, a, dy)[0]

    return (y,), backward


def register():
    """Entry point (group ``gradcore.ops``): install the rule."""
    register_grad_rule(MatrixMul)(matmul_2d_float32_rule)


def unregister():
    from gradcore import _core
    if _core.registered_grad_rule(MatrixMul) is matmul_2d_float32_rule:
        _core.unregister_grad_rule(MatrixMul)
