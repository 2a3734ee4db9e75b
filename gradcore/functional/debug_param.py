"""``F.debug_param``: MegEngine's execution-strategy switches.

MegEngine chooses among several convolution/matmul algorithms by heuristic or
by profiling, optionally only reproducible ones. gradcore has one kernel per
op and device, so the strategy is recorded and read back (programs that set
it run unchanged) but selects nothing. It is the pair of switches
``gradcore.config.benchmark_kernel`` and ``deterministic_kernel``.

Example::

    >>> from gradcore.functional import debug_param
    >>> debug_param.set_execution_strategy("PROFILE_REPRODUCIBLE")
    >>> debug_param.get_execution_strategy()
    <Strategy.PROFILE|REPRODUCIBLE: 6>
    >>> debug_param.set_execution_strategy("HEURISTIC")
"""
from __future__ import annotations

import enum
from typing import Union

from .. import config

__all__ = ["Strategy", "get_execution_strategy", "set_execution_strategy",
           "get_conv_execution_strategy", "set_conv_execution_strategy"]


class Strategy(enum.IntFlag):
    """How an algorithm is chosen: ``HEURISTIC`` or ``PROFILE``, either
    combined with ``REPRODUCIBLE`` (MegEngine's ``Convolution.Strategy``).

    Example::

        >>> from gradcore.functional.debug_param import Strategy
        >>> bool((Strategy.PROFILE | Strategy.REPRODUCIBLE) & Strategy.REPRODUCIBLE)
        True
    """
    HEURISTIC = 1
    PROFILE = 2
    REPRODUCIBLE = 4


def get_execution_strategy() -> Strategy:
    """The strategy last set (``Strategy.HEURISTIC`` until one is).

    Example::

        >>> from gradcore.functional import debug_param
        >>> debug_param.get_execution_strategy()
        <Strategy.HEURISTIC: 1>
    """
    strategy = Strategy.PROFILE if config.benchmark_kernel else Strategy.HEURISTIC
    if config.deterministic_kernel:
        strategy |= Strategy.REPRODUCIBLE
    return strategy


def set_execution_strategy(option: Union[str, Strategy]) -> None:
    """Set the strategy: a :class:`Strategy`, or a string of ``HEURISTIC``,
    ``PROFILE`` and ``REPRODUCIBLE`` joined by ``_`` (``"PROFILE_REPRODUCIBLE"``).

    Example::

        >>> from gradcore.functional import debug_param
        >>> debug_param.set_execution_strategy("HEURISTIC_REPRODUCIBLE")
        >>> debug_param.get_execution_strategy() & debug_param.Strategy.REPRODUCIBLE
        <Strategy.REPRODUCIBLE: 4>
        >>> debug_param.set_execution_strategy("HEURISTIC")
    """
    if isinstance(option, Strategy):
        flags = option
    elif isinstance(option, str):
        flags = Strategy(0)
        for part in option.split("_"):
            if part not in Strategy.__members__:
                raise ValueError(f"set_execution_strategy: unknown option {part!r} in {option!r}; "
                                 f"use {', '.join(Strategy.__members__)}, or combine them with '_'")
            flags |= Strategy[part]
    else:
        raise TypeError(f"set_execution_strategy: option must be a str or a Strategy, got {type(option).__name__}")
    config.benchmark_kernel = bool(flags & Strategy.PROFILE)
    config.deterministic_kernel = bool(flags & Strategy.REPRODUCIBLE)


def get_conv_execution_strategy() -> Strategy:
    """The older name of :func:`get_execution_strategy` (deprecated in MegEngine 1.3).

    Example::

        >>> from gradcore.functional import debug_param
        >>> debug_param.get_conv_execution_strategy() == debug_param.get_execution_strategy()
        True
    """
    return get_execution_strategy()


def set_conv_execution_strategy(option: Union[str, Strategy]) -> None:
    """The older name of :func:`set_execution_strategy` (deprecated in MegEngine 1.3).

    Example::

        >>> from gradcore.functional import debug_param
        >>> debug_param.set_conv_execution_strategy("HEURISTIC")
        >>> debug_param.get_execution_strategy()
        <Strategy.HEURISTIC: 1>
    """
    set_execution_strategy(option)
