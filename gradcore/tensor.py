"""Tensor construction helpers: ``tensor`` and ``Parameter``."""
from __future__ import annotations

from ._core import Tensor


def tensor(data, dtype=None, device=None) -> Tensor:
    """Make a Tensor (float32 by default for Python numbers).

    Example::

        >>> gradcore.tensor([[1, 2], [3, 4]], dtype="float32").shape
        (2, 2)
    """
    return Tensor(data, dtype=dtype, device=device)


class Parameter(Tensor):
    """A Tensor that a Module owns and an optimizer updates."""

    def __repr__(self):
        return "Parameter" + super().__repr__()[len("Tensor"):]
