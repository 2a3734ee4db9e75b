"""Tensor construction helpers: ``tensor`` and ``Parameter``."""
from __future__ import annotations

from ._core import Tensor


# MegEngine's ``tensor`` is its Tensor class itself (``isinstance(x,
# gc.tensor)`` holds): ``gc.tensor([[1, 2], [3, 4]], dtype="float32")``
tensor = Tensor


class Parameter(Tensor):
    """A Tensor that a Module owns and an optimizer updates."""

    def __repr__(self):
        return "Parameter" + super().__repr__()[len("Tensor"):]
