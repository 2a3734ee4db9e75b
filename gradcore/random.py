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
from typing import Any, Dict

import numpy as np

_rng = np.random.default_rng(0)


def seed(n: int) -> None:
    """Seed every random op.

    Example::

        >>> gradcore.random.seed(42)
    """
    global _rng
    _rng = np.random.default_rng(n)


def generator() -> np.random.Generator:
    """The generator every random op draws from.

    Example::

        >>> keep = gradcore.random.generator().random((2, 3)) >= 0.5
    """
    return _rng


def get_rng_state() -> Dict[str, Any]:
    """The generator's state: a dict of strings and ints (NumPy's
    bit-generator state), which ``gradcore.save`` writes as it is.

    Example::

        >>> gc.save({"model": model.state_dict(), "rng": gc.random.get_rng_state()}, "ckpt.gc")
    """
    return copy.deepcopy(_rng.bit_generator.state)


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore a state from ``get_rng_state``: the following random numbers
    are the ones that followed when it was taken.

    Example::

        >>> gc.random.set_rng_state(gc.load("ckpt.gc")["rng"])
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


def normal(mean=0.0, std=1.0, size=None, dtype="float32"):
    from ._core import Tensor
    return Tensor(_rng.normal(mean, std, size).astype(dtype))


def uniform(low=0.0, high=1.0, size=None, dtype="float32"):
    from ._core import Tensor
    return Tensor(_rng.uniform(low, high, size).astype(dtype))
