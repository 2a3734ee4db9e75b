"""Random numbers for every random op (dropout, parameter init).

Example::

    >>> gradcore.random.seed(0)
"""
from __future__ import annotations

import numpy as np

_rng = np.random.default_rng(0)


def seed(n: int) -> None:
    """Seed every random op."""
    global _rng
    _rng = np.random.default_rng(n)


def generator() -> np.random.Generator:
    return _rng


def normal(mean=0.0, std=1.0, size=None, dtype="float32"):
    from ._core import Tensor
    return Tensor(_rng.normal(mean, std, size).astype(dtype))


def uniform(low=0.0, high=1.0, size=None, dtype="float32"):
    from ._core import Tensor
    return Tensor(_rng.uniform(low, high, size).astype(dtype))
