"""Probability distributions, MegEngine's ``megengine.distributions``: the
``Distribution`` base class and ``Exponential``.

Example::

    >>> from gradcore.distributions import Exponential
    >>> d = Exponential(2.0)
    >>> float(d.mean), d.sample((3,)).shape
    (0.5, (3,))
"""
from __future__ import annotations

from numbers import Number
from typing import Sequence, Tuple, Union

from . import functional as F
from ._core import Tensor
from .random import exponential

__all__ = ["Distribution", "Exponential"]


class Distribution:
    """The base class of distributions: ``batch_shape`` (the shape of a
    batch of independent distributions) and ``event_shape`` (of one
    sample of one of them); subclasses give ``mean``, ``variance``,
    ``sample``, ``log_prob``, ``cdf`` and ``icdf``, and ``stddev`` is the
    square root of ``variance`` unless they give it too.

    Example::

        >>> from gradcore.distributions import Distribution
        >>> Distribution(batch_shape=(2,)).batch_shape
        (2,)
    """

    def __init__(self, batch_shape: Sequence[int] = (), event_shape: Sequence[int] = ()):
        self._batch_shape = tuple(batch_shape)
        self._event_shape = tuple(event_shape)

    @property
    def batch_shape(self) -> Tuple[int, ...]:
        """The shape over which the parameters are batched."""
        return self._batch_shape

    @property
    def event_shape(self) -> Tuple[int, ...]:
        """The shape of one sample of one distribution of the batch."""
        return self._event_shape

    def _missing(self, what: str):
        return NotImplementedError(f"{type(self).__name__} does not define {what}")

    @property
    def mean(self) -> Tensor:
        """The distribution's mean."""
        raise self._missing("mean")

    @property
    def variance(self) -> Tensor:
        """The distribution's variance."""
        raise self._missing("variance")

    @property
    def stddev(self) -> Tensor:
        """The standard deviation: ``variance ** 0.5``."""
        return self.variance ** 0.5

    def sample(self, sample_shape: Sequence[int] = ()) -> Tensor:
        """Samples of shape ``sample_shape + batch_shape + event_shape`` (no gradient)."""
        raise self._missing("sample")

    def log_prob(self, value: Tensor) -> Tensor:
        """The log of the density (or mass) at ``value``."""
        raise self._missing("log_prob")

    def cdf(self, value: Tensor) -> Tensor:
        """The cumulative distribution function at ``value``."""
        raise self._missing("cdf")

    def icdf(self, value: Tensor) -> Tensor:
        """The inverse of ``cdf`` at the probability ``value``."""
        raise self._missing("icdf")


class Exponential(Distribution):
    """The exponential distribution of rate ``rate`` (a number, or a
    tensor or array of rates: a batch), density ``rate * exp(-rate * x)``
    for x >= 0. ``log_prob``, ``cdf`` and ``icdf`` are differentiable in
    ``rate`` and ``value``.

    Example::

        >>> from gradcore.distributions import Exponential
        >>> d = Exponential(gc.tensor([1.0, 2.0]))
        >>> d.sample((5,)).shape
        (5, 2)
        >>> d.log_prob(gc.tensor([0.0, 1.0])).numpy().round(4)
        array([ 0.    , -1.3069], dtype=float32)
        >>> d.cdf(gc.tensor([1.0, 1.0])).numpy().round(4)
        array([0.6321, 0.8647], dtype=float32)
    """

    def __init__(self, rate: Union[Tensor, float]):
        self.rate = rate if isinstance(rate, Tensor) else Tensor(rate)
        if self.rate.dtype.kind != "f":
            self.rate = self.rate.astype("float32")
        if self.rate.size and bool((self.rate <= 0).sum().item()):
            raise ValueError(f"Exponential: rate must be > 0, got {rate!r}")
        super().__init__(batch_shape=() if isinstance(rate, Number) else self.rate.shape)

    @property
    def mean(self) -> Tensor:
        """``1 / rate``."""
        return 1.0 / self.rate

    @property
    def stddev(self) -> Tensor:
        """``1 / rate``."""
        return 1.0 / self.rate

    @property
    def variance(self) -> Tensor:
        """``rate ** -2``."""
        return self.rate ** -2

    def sample(self, sample_shape: Sequence[int] = ()) -> Tensor:
        """``sample_shape + batch_shape`` samples from ``gradcore.random``'s global generator."""
        return exponential(self.rate, tuple(sample_shape))

    def log_prob(self, value: Tensor) -> Tensor:
        """``log(rate) - rate * value``."""
        return F.log(self.rate) - self.rate * value

    def cdf(self, value: Tensor) -> Tensor:
        """``1 - exp(-rate * value)``."""
        return 1.0 - F.exp(-self.rate * value)

    def icdf(self, value: Tensor) -> Tensor:
        """``-log(1 - value) / rate``."""
        return -F.log1p(-value) / self.rate
