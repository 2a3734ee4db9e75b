"""``M.Linear``, in a module of its own (MegEngine's layout) so that layers
built on it (attention) import it without importing the package."""
from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from .._core import Tensor
from ..tensor import Parameter
from . import init
from .module import Module, _count
from ..op import ArgumentError


class Linear(Module):
    """``y = x @ weight.T + bias`` with weight of shape (out_features, in_features)
    drawn from N(0, 1 / in_features) and bias of shape (out_features,) at zero.

    Example::

        >>> fc = M.Linear(4, 3)
        >>> fc.weight.shape, fc.bias.numpy()
        ((3, 4), array([0., 0., 0.], dtype=float32))
        >>> fc(gc.tensor(np.ones((2, 4), "float32"))).shape
        (2, 3)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, compute_mode: str = "default",
                 **kwargs):
        super().__init__(**kwargs)
        # MegEngine's: "float32" accumulates float16 products in float32, which
        # gradcore's kernels always do; kept for the module's description
        if compute_mode not in ("default", "float32"):
            raise ArgumentError(f"Linear: compute_mode must be 'default' or 'float32', got {compute_mode!r}")
        self.compute_mode = compute_mode
        self.in_features = _count("Linear", "in_features", in_features)
        self.out_features = _count("Linear", "out_features", out_features)
        self.weight = Parameter(np.zeros((self.out_features, self.in_features), "float32"))
        self.bias = Parameter(np.zeros(self.out_features, "float32")) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.normal_(self.weight, 0.0, math.sqrt(1.0 / max(self.in_features, 1)))   # (in_features=0: empty)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x):
        if not isinstance(x, Tensor):
            x = F._t(x, name="Linear")
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ArgumentError(f"{self!r}: expected input whose last dimension is {self.in_features}, "
                             f"got shape {x.shape}")
        return F.linear(x, self.weight, self.bias)

    def _module_info_string(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class LinearRelu(Linear):
    """Linear followed by ReLU, MegEngine's ``M.LinearRelu``: the same
    parameters and names as ``Linear``.

    Example::

        >>> y = M.LinearRelu(4, 3)(gc.tensor(np.ones((2, 4), "float32")))
        >>> y.shape, bool((y.numpy() >= 0).all())
        ((2, 3), True)
    """

    def forward(self, x):
        return F.relu(super().forward(x))

