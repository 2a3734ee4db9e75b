"""The transform protocol and the random state of the random transforms.

A transform's ``apply(sample)`` returns the transformed sample;
``apply_batch(samples)`` does each sample of a batch (``DataLoader`` calls
it in the process that loads the batch, before the collator).

Random transforms draw from ``rng()``, a generator private to the data
pipeline: ``DataLoader`` reseeds it before every batch from (its seed, the
epoch, the batch's position), in whichever process (main or worker) loads
the batch. So a batch's augmentation is the same with 0, 1 or 8 workers,
and a resumed loader repeats it exactly.

Example::

    >>> from gradcore.data import transform as T
    >>> T.seed(0)
    >>> T.rng().integers(10)
    8
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence, Tuple

import numpy as np

__all__ = ["Transform", "PseudoTransform", "rng", "seed"]

_rng = np.random.default_rng()
# the seed of the next generator, made when rng() is first called after
# seed(): a batch whose transforms draw nothing costs no generator (making
# one is ~10 us, a tenth of a worker's own cost per batch)
_NOTHING = object()
_pending: Any = _NOTHING


def rng() -> np.random.Generator:
    """The generator that random transforms draw from (write your own
    random transforms with it to get the loader's per-batch seeding).

    Example::

        >>> import gradcore.data.transform as T
        >>> flip = T.rng().random() < 0.5
    """
    global _rng, _pending
    if _pending is not _NOTHING:
        _rng, _pending = np.random.default_rng(_pending), _NOTHING
    return _rng


def seed(n: Any) -> None:
    """Seed ``rng()`` (an int, a sequence of ints, a
    ``numpy.random.SeedSequence``, or None for fresh entropy);
    ``DataLoader`` does this before every batch.

    Example::

        >>> import gradcore.data.transform as T
        >>> T.seed([7, 0, 3])       # loader T.seed 7, epoch 0, batch 3
    """
    global _pending
    _pending = n


class Transform(ABC):
    """The base of the transforms: define ``apply(input)`` for one sample.

    Example::

        >>> from gradcore.data.transform import Transform
        >>> class Double(Transform):
        ...     def apply(self, input): return input * 2
        >>> Double().apply_batch([np.ones(2), np.zeros(2)])[0]
        array([2., 2.])
    """

    def apply_batch(self, inputs: Sequence[Any]) -> Tuple:
        """``apply`` on each sample of a batch.

        Example::

            >>> PseudoTransform().apply_batch([1, 2])
            (1, 2)
        """
        return tuple(self.apply(input) for input in inputs)

    @abstractmethod
    def apply(self, input: Any) -> Any:
        """Transform one sample."""

    def __repr__(self) -> str:
        return type(self).__name__


class PseudoTransform(Transform):
    """The identity, ``DataLoader``'s default transform.

    Example::

        >>> from gradcore.data.transform import PseudoTransform
        >>> PseudoTransform().apply((1, 2))
        (1, 2)
    """

    def apply(self, input: Any) -> Any:
        return input
