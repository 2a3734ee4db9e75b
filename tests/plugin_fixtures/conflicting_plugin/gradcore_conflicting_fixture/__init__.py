"""Test fixture: registers ``ConflictFixtureOp`` (a new name) and then
``Mish``, the name gradcore-decomp's op already has. The registry must
reject the plugin as a whole, naming both distributions, and roll back
``ConflictFixtureOp`` too."""
import numpy as np

from gradcore.op import Op


class ConflictFixtureOp(Op):
    name = "ConflictFixtureOp"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x.copy()

    def vjp(self, inputs, outputs, grads):
        return list(grads)


class Mish(Op):
    name = "Mish"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return np.tanh(x)


def register():
    from gradcore.registry import register_op
    register_op(ConflictFixtureOp)
    register_op(Mish)
