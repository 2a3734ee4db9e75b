"""Tensor construction helpers: ``tensor`` and ``Parameter``."""
from __future__ import annotations

from ._core import Tensor


# MegEngine's ``tensor`` is its Tensor class itself (``isinstance(x,
# gc.tensor)`` holds): ``gc.tensor([[1, 2], [3, 4]], dtype="float32")``
tensor = Tensor


class Parameter(Tensor):
    """A Tensor that a Module owns and an optimizer updates.

    Example::

        >>> w = gc.Parameter([1.0, 2.0])
        >>> w
        Parameter([1., 2.], dtype=float32, device=cpu)
        >>> isinstance(w, gc.Tensor), isinstance(w * 2, gc.Parameter)
        (True, False)
    """

    def __repr__(self):
        return "Parameter" + super().__repr__()[len("Tensor"):]
