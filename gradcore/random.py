"""Random numbers for every random op (dropout, parameter init).

``get_rng_state()`` / ``set_rng_state()`` save and restore the generator,
so that a run resumed from a checkpoint draws the same dropout masks as
one that was never interrupted.

Example::

    >>> gradcore.random.seed(0)
    >>> state = gradcore.random.get_rng_state()
    >>> a = gradcore.random.uniform(size=3).numpy()
    >>> gradcore.random.set_rng_state(state)
    >>> (gradcore.random.uniform(size=3).numpy() == a).all()
    True
"""
from __future__ import annotations

import copy
import math
import operator
import os
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Union

import numpy as np

from .op import ArgumentError

if TYPE_CHECKING:     # annotations only: the functions import _core when called
    from ._core import Tensor

_rng = np.random.default_rng(0)


def seed(seed: int) -> None:
    """Seed every random op (MegEngine's ``random.seed(seed)``).

    Example::

        >>> gc.random.seed(42)
    """
    global _rng
    _rng = np.random.default_rng(seed)


def generator() -> np.random.Generator:
    """The generator every random op draws from.

    Example::

        >>> keep = gc.random.generator().random((2, 3)) >= 0.5
    """
    return _rng


def get_rng_state() -> Dict[str, Any]:
    """The generator's state: a dict of strings and ints (NumPy's
    bit-generator state), which ``gradcore.save`` writes as it is.

    Example::

        >>> import io
        >>> gc.random.seed(7)
        >>> buf = io.BytesIO(); gc.save({"rng": gc.random.get_rng_state()}, buf)
        >>> a = gc.random.uniform(size=3).numpy()
        >>> gc.random.set_rng_state(gc.load(io.BytesIO(buf.getvalue()))["rng"])
        >>> bool((gc.random.uniform(size=3).numpy() == a).all())     # the same draws again
        True
    """
    return copy.deepcopy(_rng.bit_generator.state)


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore a state from ``get_rng_state``: the following random numbers
    are the ones that followed when it was taken.

    Example::

        >>> state = gc.random.get_rng_state()
        >>> a = gc.random.normal(size=2).numpy()
        >>> gc.random.set_rng_state(state)
        >>> bool((gc.random.normal(size=2).numpy() == a).all())
        True
    """
    global _rng
    if not isinstance(state, dict) or "bit_generator" not in state:
        raise TypeError(f"set_rng_state: expected a state from get_rng_state() (a dict with "
                        f"'bit_generator'), got {type(state).__name__}")
    name = state["bit_generator"]
    bit_generator = getattr(np.random, str(name), None)
    if not (isinstance(bit_generator, type) and issubclass(bit_generator, np.random.BitGenerator)):
        raise ValueError(f"set_rng_state: unknown bit generator {name!r}")
    new = bit_generator()
    try:
        new.state = copy.deepcopy(state)
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"set_rng_state: not a valid {name} state: {exc}") from None
    _rng = np.random.Generator(new)


class RNG:
    """A source of random tensors, MegEngine's ``megengine.random.RNG``:
    with a ``seed``, a generator of its own; without, the global one that
    ``seed()`` seeds (and ``get_rng_state`` saves). The module's
    ``uniform``, ``normal``, ``gamma``, ``beta``, ``poisson``,
    ``permutation`` and ``shuffle`` are those of the global one. Draws are
    float32 (``permutation`` int32 by default), made on the host and moved
    to ``device`` (the default device when None).

    Example::

        >>> rng = gc.random.RNG(seed=100)
        >>> rng.uniform(size=(2, 2)).shape
        (2, 2)
    """

    def __init__(self, seed: Optional[int] = None, device: Optional[str] = None):
        self._generator = None if seed is None else np.random.default_rng(seed)
        self._device = device

    def _gen(self) -> np.random.Generator:
        return self._generator if self._generator is not None else _rng

    def _tensor(self, array, dtype="float32", like=None):
        from ._core import Tensor
        device = self._device if self._device is not None else getattr(like, "device", None)
        return Tensor(np.asarray(array).astype(dtype), device=device)

    def uniform(self, low: float = 0, high: float = 1, size: Optional[Sequence[int]] = None):
        """Uniform on [low, high); ``size`` None is (1,), as MegEngine's.

        Example::

            >>> gradcore.random.uniform(size=(2, 2)).shape
            (2, 2)
        """
        if not low < high:
            raise RandomArgumentError(f"uniform: low {low} must be less than high {high}")
        return self._tensor(self._gen().uniform(low, high, _size(size)))

    def normal(self, mean: float = 0, std: float = 1, size: Optional[Sequence[int]] = None):
        """Gaussian N(mean, std); ``size`` None is (1,), as MegEngine's.

        Example::

            >>> gradcore.random.normal(0, 1, (3,)).shape
            (3,)
        """
        return self._tensor(self._gen().normal(mean, std, _size(size)))

    def gamma(self, shape, scale=1, size: Optional[Sequence[int]] = None):
        """Gamma(shape, scale): the output is ``size`` followed by the
        broadcast shape of ``shape`` and ``scale`` (numbers or tensors).

        Example::

            >>> gradcore.random.gamma(2.0, 1.0, size=(2, 2)).shape
            (2, 2)
        """
        k, theta = _positive("gamma", "shape", shape), _positive("gamma", "scale", scale)
        out = _param_shape(size, k, theta)
        return self._tensor(self._gen().gamma(k, theta, out), like=_first_tensor(shape, scale))

    def beta(self, alpha, beta, size: Optional[Sequence[int]] = None):
        """Beta(alpha, beta), shaped as ``gamma``'s.

        Example::

            >>> gradcore.random.beta(2.0, 1.0, size=3).shape
            (3,)
        """
        a, b = _positive("beta", "alpha", alpha), _positive("beta", "beta", beta)
        return self._tensor(self._gen().beta(a, b, _param_shape(size, a, b)), like=_first_tensor(alpha, beta))

    def poisson(self, lam, size: Optional[Sequence[int]] = None):
        """Poisson(lam) counts as float32, shaped as ``gamma``'s.

        Example::

            >>> gradcore.random.poisson(2.0, size=(1, 3)).shape
            (1, 3)
        """
        lm = _positive("poisson", "lam", lam)
        return self._tensor(self._gen().poisson(lm, _param_shape(size, lm)), like=_first_tensor(lam))

    def exponential(self, rate=1.0, size: Optional[Sequence[int]] = None):
        """Exponential(rate) (mean 1 / rate), shaped as ``gamma``'s.

        Example::

            >>> gradcore.random.exponential(2.0, size=(2, 3)).shape
            (2, 3)
        """
        lam = _positive("exponential", "rate", rate)
        return self._tensor(self._gen().exponential(1.0 / lam, _param_shape(size, lam)), like=_first_tensor(rate))

    def multinomial(self, input, num_samples: int, replacement: bool = False):
        """``num_samples`` int32 category indices per row of ``input``
        ((k,) or (rows, k) non-negative weights), drawn in proportion to
        the weights, with or without replacement; MegEngine's ``multinomial``.

        Example::

            >>> gradcore.random.multinomial(gc.tensor([1.0, 2.0, 3.0, 4.0]), 2).shape
            (2,)
        """
        from ._core import Tensor
        w = np.asarray(input.numpy() if isinstance(input, Tensor) else input, np.float64)
        if w.ndim not in (1, 2) or w.shape[-1] == 0:
            raise RandomArgumentError(f"multinomial: input must be (k,) or (rows, k) weights, got shape {w.shape}")
        if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
            raise RandomArgumentError(f"multinomial: num_samples must be a positive int, got {num_samples!r}")
        rows = w.reshape(-1, w.shape[-1])
        if rows.shape[0] == 0:          # no rows: no samples
            return self._tensor(np.zeros((0, num_samples)), dtype="int32", like=_first_tensor(input))
        if (rows < 0).any() or not (rows.sum(1) > 0).all():
            raise RandomArgumentError("multinomial: the weights must be non-negative with a positive sum per row")
        if not replacement and num_samples > (rows > 0).sum(1).min():
            raise RandomArgumentError(f"multinomial: {num_samples} samples without replacement from rows with "
                                      f"fewer non-zero weights")
        gen = self._gen()
        out = np.stack([gen.choice(rows.shape[1], num_samples, replace=bool(replacement), p=r / r.sum())
                        for r in rows]).astype(np.int32)
        return self._tensor(out[0] if w.ndim == 1 else out, dtype="int32", like=_first_tensor(input))

    def permutation(self, n, *, dtype: str = "int32"):
        """A random permutation of ``range(n)`` (int32, int16 or float32),
        or, for a tensor ``n``, a copy of it shuffled along its first axis.

        Example::

            >>> sorted(gradcore.random.permutation(4).numpy().tolist())
            [0, 1, 2, 3]
        """
        from ._core import Tensor
        if isinstance(n, Tensor):
            return self._tensor(self._gen().permutation(_rows(n)), dtype=n.dtype, like=n)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise RandomArgumentError(f"permutation: n must be an int >= 0 or a Tensor, got {n!r}")
        if str(np.dtype(dtype)) not in ("int32", "int16", "float32"):
            raise RandomArgumentError(f"permutation: dtype must be int32, int16 or float32, got {dtype}")
        return self._tensor(self._gen().permutation(int(n)), dtype=dtype)

    def shuffle(self, inp) -> None:
        """Shuffle ``inp`` in place along its first axis (as an in-place
        op: a tensor saved for a backward is told apart, as after ``+=``).

        Example::

            >>> x = gradcore.tensor(np.arange(10)); gradcore.random.shuffle(x)
        """
        from ._core import Tensor
        if not isinstance(inp, Tensor):
            raise TypeError(f"shuffle: expected a Tensor, got {type(inp).__name__}")
        inp[...] = self._tensor(self._gen().permutation(_rows(inp)), dtype=inp.dtype, like=inp)


class RandomArgumentError(ArgumentError):
    """A distribution's argument out of its domain: a ValueError, and the
    AssertionError MegEngine raises for it."""


def _size(size) -> tuple:
    """``size`` as a shape: ints >= 0 (int() would truncate 2.5, and a
    float or negative size fails inside NumPy with a message naming no one)."""
    if size is None:
        return (1,)
    try:
        shape = (operator.index(size),)
    except TypeError:
        try:
            shape = tuple(map(operator.index, size))
        except TypeError:
            raise TypeError(f"gradcore.random: size must be an int or a sequence of ints, got {size!r}") from None
    if any(n < 0 for n in shape):
        raise RandomArgumentError(f"gradcore.random: size must not be negative, got {size!r}")
    # NumPy's MemoryError for an impossible size names no one: say whose it is first
    # (float64 samples: 8 bytes each, more than the machine has)
    total = 8 * math.prod(shape)
    if total > _machine_memory():
        raise MemoryError(f"gradcore.random: size {shape} needs {total / 2**30:.3g} GiB of samples, more than "
                          f"this machine's {_machine_memory() / 2**30:.3g} GiB")
    return shape


def _machine_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def _first_tensor(*values):
    from ._core import Tensor
    return next((v for v in values if isinstance(v, Tensor)), None)


def _positive(name: str, what: str, value) -> np.ndarray:
    from ._core import Tensor
    arr = value.numpy() if isinstance(value, Tensor) else np.asarray(value, np.float64)
    if arr.size and not (arr > 0).all():
        raise RandomArgumentError(f"{name}: {what} must be > 0, got {value!r}")
    return arr.astype(np.float64)


def _param_shape(size, *params) -> tuple:
    """MegEngine's output shape: ``size`` (an int n is (n,); None or 0 is
    nothing) followed by the parameters' broadcast shape."""
    base = np.broadcast_shapes(*[p.shape for p in params])
    if size is None or (isinstance(size, (int, np.integer)) and size == 0):
        return base
    return _size(size) + base


def _rows(t) -> np.ndarray:
    a = t.numpy()
    if a.ndim == 0 or a.shape[0] == 0:
        raise RandomArgumentError(f"permutation/shuffle: the tensor needs a first axis of size > 0, "
                                  f"got shape {a.shape}")
    return a


_default = RNG()


def uniform(low: float = 0, high: float = 1, size: Optional[Sequence[int]] = None) -> Tensor:
    """``RNG().uniform`` on the global generator.

    Example::

        >>> gc.random.uniform(size=3).shape
        (3,)
    """
    return _default.uniform(low, high, size)


def normal(mean: float = 0, std: float = 1, size: Optional[Sequence[int]] = None) -> Tensor:
    """``RNG().normal`` on the global generator.

    Example::

        >>> gc.random.normal(size=(2,)).shape
        (2,)
    """
    return _default.normal(mean, std, size)


def gamma(shape: Union[float, Tensor], scale: Union[float, Tensor] = 1,
          size: Optional[Sequence[int]] = None) -> Tensor:
    """``RNG().gamma`` on the global generator.

    Example::

        >>> gc.random.gamma(2.0, size=(2,)).shape
        (2,)
    """
    return _default.gamma(shape, scale, size)


def beta(alpha: Union[float, Tensor], beta: Union[float, Tensor], size: Optional[Sequence[int]] = None) -> Tensor:  # noqa: F811 (MegEngine's names)
    """``RNG().beta`` on the global generator.

    Example::

        >>> gc.random.beta(2.0, 3.0, size=2).shape
        (2,)
    """
    return _default.beta(alpha, beta, size)


def poisson(lam: Union[float, Tensor], size: Optional[Sequence[int]] = None) -> Tensor:
    """``RNG().poisson`` on the global generator.

    Example::

        >>> gc.random.poisson(3.0, size=2).shape
        (2,)
    """
    return _default.poisson(lam, size)


def exponential(rate: Union[float, Tensor] = 1.0, size: Optional[Sequence[int]] = None) -> Tensor:
    """``RNG().exponential`` on the global generator.

    Example::

        >>> gc.random.exponential(1.5, size=3).shape
        (3,)
    """
    return _default.exponential(rate, size)


def multinomial(input: Tensor, num_samples: int, replacement: bool = False) -> Tensor:  # noqa: A002 (MegEngine's name)
    """``RNG().multinomial`` on the global generator.

    Example::

        >>> gc.random.multinomial(gc.tensor([[1.0, 0.0], [0.0, 1.0]]), 1).numpy().tolist()
        [[0], [1]]
    """
    return _default.multinomial(input, num_samples, replacement)


def permutation(n: Union[int, Tensor], *, dtype: str = "int32") -> Tensor:
    """``RNG().permutation`` on the global generator.

    Example::

        >>> gc.random.permutation(5).shape
        (5,)
    """
    return _default.permutation(n, dtype=dtype)


def shuffle(inp: Tensor) -> None:
    """``RNG().shuffle`` on the global generator: ``inp`` in place.

    Example::

        >>> gc.random.seed(0)
        >>> x = gc.tensor([1.0, 2.0, 3.0, 4.0])
        >>> gc.random.shuffle(x)     # in place
        >>> sorted(x.numpy().tolist()), x.shape
        ([1.0, 2.0, 3.0, 4.0], (4,))
    """
    _default.shuffle(inp)
