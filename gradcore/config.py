"""``gradcore.config``: MegEngine's global switches, set as attributes
(``gc.config.deterministic_kernel = True``).

- ``benchmark_kernel``: choose kernels by profiling (MegEngine's PROFILE
  execution strategy; ``F.debug_param`` reads and sets the same switch)
- ``deterministic_kernel``: only reproducible kernels (REPRODUCIBLE)
- ``benchmark_with_subprocess``: profile in a child process
- ``async_level``: 0, 1 or 2, how far MegEngine runs ops ahead of Python
- ``disable_memory_forwarding``: never let an output share its input's memory

gradcore has one kernel per op and device and runs ops in program order,
so there is nothing for these switches to choose: they are validated,
recorded and read back (programs that set them run unchanged) and change
no result.

Example::

    >>> gc.config.deterministic_kernel = True
    >>> gc.config.deterministic_kernel
    True
    >>> gc.config.deterministic_kernel = False
"""
from __future__ import annotations

import sys
import types

__all__ = ["benchmark_kernel", "deterministic_kernel", "benchmark_with_subprocess", "async_level",
           "disable_memory_forwarding"]

_state = {"benchmark_kernel": False, "deterministic_kernel": False, "benchmark_with_subprocess": False,
          "async_level": 2, "disable_memory_forwarding": False}


def _flag(name: str) -> property:
    def get(mod) -> bool:
        return _state[name]

    def set_(mod, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"gradcore.config.{name} must be True or False, got {value!r}")
        _state[name] = value
    return property(get, set_, doc=f"MegEngine's ``config.{name}`` (recorded; see the module's text).")


def _get_async_level(mod) -> int:
    return _state["async_level"]


def _set_async_level(mod, level: int) -> None:
    if level not in (0, 1, 2) or isinstance(level, bool):
        raise ValueError(f"gradcore.config.async_level must be 0, 1 or 2, got {level!r}")
    _state["async_level"] = level


class _ConfigModule(types.ModuleType):
    # attribute access on this module goes through these properties
    benchmark_kernel = _flag("benchmark_kernel")
    deterministic_kernel = _flag("deterministic_kernel")
    benchmark_with_subprocess = _flag("benchmark_with_subprocess")
    disable_memory_forwarding = _flag("disable_memory_forwarding")
    async_level = property(_get_async_level, _set_async_level,
                           doc="MegEngine's ``config.async_level``: 0, 1 or 2 (recorded).")


sys.modules[__name__].__class__ = _ConfigModule
