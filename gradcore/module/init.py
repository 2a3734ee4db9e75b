"""Parameter initialisation, MegEngine's ``megengine.module.init``.

Each function replaces a tensor's value in place (the tensor object stays
the one modules and optimizers hold) with draws from gradcore's seeded
generator (``gradcore.random.seed``), in the tensor's dtype.

Example::

    >>> import gradcore.module as M
    >>> fc = M.Linear(4, 2)
    >>> M.init.xavier_uniform_(fc.weight)
    >>> M.init.zeros_(fc.bias)
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import numpy as np

from .. import random as _random
from .._core import Tensor
from ..op import ArgumentError

__all__ = ["fill_", "zeros_", "ones_", "uniform_", "normal_", "calculate_gain",
           "calculate_fan_in_and_fan_out", "calculate_correct_fan", "xavier_uniform_",
           "xavier_normal_", "msra_uniform_", "msra_normal_"]


def _set(tensor: Tensor, values: np.ndarray) -> None:
    tensor._reset(Tensor(np.asarray(values, dtype=tensor.dtype), device=tensor.device))


def fill_(tensor: Tensor, val: Union[int, float]) -> None:
    """Set every element of ``tensor`` to ``val``.

    Example::

        >>> fc = M.Linear(2, 3)
        >>> M.init.fill_(fc.bias, 0.5)
        >>> fc.bias.numpy()
        array([0.5, 0.5, 0.5], dtype=float32)
    """
    _set(tensor, np.full(tensor.shape, val))


def zeros_(tensor: Tensor) -> None:
    """Set ``tensor`` to 0 everywhere.

    Example::

        >>> w = gc.Parameter(np.ones(3, "float32"))
        >>> M.init.zeros_(w)
        >>> w.numpy()
        array([0., 0., 0.], dtype=float32)
    """
    fill_(tensor, 0)


def ones_(tensor: Tensor) -> None:
    """Set ``tensor`` to 1 everywhere.

    Example::

        >>> w = gc.Parameter(np.zeros(3, "float32"))
        >>> M.init.ones_(w)
        >>> w.numpy()
        array([1., 1., 1.], dtype=float32)
    """
    fill_(tensor, 1)


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> None:
    """Draw ``tensor`` from U(a, b).

    Example::

        >>> w = gc.Parameter(np.zeros((4, 4), "float32"))
        >>> M.init.uniform_(w, -0.1, 0.1)
        >>> bool((np.abs(w.numpy()) <= 0.1).all())
        True
    """
    _set(tensor, _random.generator().uniform(a, b, tensor.shape))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> None:
    """Draw ``tensor`` from N(mean, std²).

    Example::

        >>> gc.random.seed(0)
        >>> w = gc.Parameter(np.zeros((100, 100), "float32"))
        >>> M.init.normal_(w, mean=1.0, std=0.01)
        >>> round(float(w.numpy().mean()), 2), round(float(w.numpy().std()), 2)
        (1.0, 0.01)
    """
    _set(tensor, _random.generator().normal(mean, std, tensor.shape))


def calculate_gain(nonlinearity: str, param: Optional[Union[int, float]] = None) -> float:
    """The recommended gain for a nonlinearity: 1 for linear layers and
    sigmoid, 5/3 for tanh, sqrt(2) for relu, sqrt(2 / (1 + slope²)) for
    leaky_relu (slope ``param``, default 0.01).

    Example::

        >>> M.init.calculate_gain("relu")
        1.4142135623730951
    """
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise ArgumentError(f"calculate_gain: negative_slope {param!r} is not a number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    raise ArgumentError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def calculate_fan_in_and_fan_out(tensor: Tensor) -> Tuple[int, int]:
    """(fan_in, fan_out) of a weight: (in, out) for a Linear's (out, in);
    in and out channels times the kernel size for a convolution's
    (out, in, *kernel); a grouped weight (groups, out/groups, in/groups,
    *kernel) counts one group's channels.

    Example::

        >>> M.init.calculate_fan_in_and_fan_out(M.Linear(3, 8).weight)
        (3, 8)
    """
    shape = tuple(tensor.shape)
    if len(shape) < 2:
        raise ArgumentError(f"calculate_fan_in_and_fan_out: needs a tensor with at least 2 dimensions, "
                         f"got shape {shape}")
    if len(shape) >= 5:
        # MegEngine's rule: the first dimension of a 5-d or 6-d weight is
        # taken for a grouped convolution's groups and left out (a plain
        # conv3d weight included, as there)
        shape = shape[1:]
    receptive = int(np.prod(shape[2:], dtype=np.int64)) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    """fan_in or fan_out of ``tensor`` (``mode`` "fan_in" or "fan_out").

    Example::

        >>> w = gc.Parameter(np.zeros((8, 3, 5, 5), "float32"))     # a conv weight (out, in, kh, kw)
        >>> M.init.calculate_correct_fan(w, "fan_in"), M.init.calculate_correct_fan(w, "fan_out")
        (75, 200)
    """
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ArgumentError(f"calculate_correct_fan: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> None:
    """Glorot uniform: U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)).

    Example::

        >>> fc = M.Linear(4, 3)
        >>> M.init.xavier_uniform_(fc.weight)     # U(-1, 1) for fan_in + fan_out = 6
        >>> bool((np.abs(fc.weight.numpy()) <= 1.0).all())
        True
    """
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    a = math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))
    uniform_(tensor, -a, a)


def xavier_normal_(tensor: Tensor, gain: float = 1.0) -> None:
    """Glorot normal: N(0, std²), std = gain * sqrt(2 / (fan_in + fan_out)).

    Example::

        >>> gc.random.seed(0)
        >>> w = gc.Parameter(np.zeros((200, 300), "float32"))
        >>> M.init.xavier_normal_(w)     # std sqrt(2 / (300 + 200)) = 0.063
        >>> round(float(w.numpy().std()), 3)
        0.063
    """
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)))


def _msra_std(tensor: Tensor, a: float, mode: str, nonlinearity: str) -> float:
    return calculate_gain(nonlinearity, a) / math.sqrt(calculate_correct_fan(tensor, mode))


def msra_uniform_(tensor: Tensor, a: float = 0, mode: str = "fan_in",
                  nonlinearity: str = "leaky_relu") -> None:
    """He (Kaiming) uniform: U(-b, b), b = sqrt(3) * gain / sqrt(fan)
    (PyTorch's ``kaiming_uniform_``).

    Example::

        >>> conv = M.Conv2d(3, 8, 3)
        >>> M.init.msra_uniform_(conv.weight, a=np.sqrt(5))     # bound sqrt(6 / (1 + 5) / 27) = 1 / sqrt(27)
        >>> bool(np.abs(conv.weight.numpy()).max() <= 1 / np.sqrt(27))
        True
    """
    bound = math.sqrt(3.0) * _msra_std(tensor, a, mode, nonlinearity)
    uniform_(tensor, -bound, bound)


def msra_normal_(tensor: Tensor, a: float = 0, mode: str = "fan_in",
                 nonlinearity: str = "leaky_relu") -> None:
    """He (Kaiming) normal: N(0, std²), std = gain / sqrt(fan)
    (PyTorch's ``kaiming_normal_``).

    Example::

        >>> gc.random.seed(0)
        >>> conv = M.Conv2d(64, 64, 3)
        >>> M.init.msra_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
        >>> round(float(conv.weight.numpy().std()), 3)     # sqrt(2 / (64 * 3 * 3)) = 0.059
        0.059
    """
    normal_(tensor, 0.0, _msra_std(tensor, a, mode, nonlinearity))
