"""The op registry, filled through entry points (group ``gradcore.ops``).

The standard library in ``gradcore.ops`` registers itself through the same
entry point group as any third-party plugin. Discovery is lazy: nothing of a
plugin is imported until an op is asked for or the registry is listed.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Dict, List, Optional

GROUP = "gradcore.ops"
ENV_DISABLE = "GRADCORE_NO_PLUGINS"        # "1": load only the standard library
ENV_BLOCK = "GRADCORE_BLOCK_PLUGINS"       # comma-separated distribution names to skip
STANDARD_DIST = "gradcore"


class PluginConflictError(RuntimeError):
    """Two distributions register the same op name."""


@dataclass
class OpEntry:
    name: str
    cls: type
    dist: str

    @property
    def grad_path(self) -> str:
        from . import _core
        if hasattr(self.cls, "_grad_rule"):
            return "own _grad_rule"
        if _core.registered_grad_rule(self.cls) is not None:
            return "registered rule"
        if hasattr(self.cls, "vjp") or hasattr(self.cls, "decompose"):
            return "backward graph"
        return "none"

    @property
    def devices(self) -> List[str]:
        devs = ["cpu"] if hasattr(self.cls, "cpu") or hasattr(self.cls, "decompose") else []
        if hasattr(self.cls, "cuda_source") or hasattr(self.cls, "decompose"):
            devs.append("cuda")
        return devs


@dataclass
class PluginFailure:
    dist: str
    entry_point: str
    error: str


@dataclass
class _State:
    ops: Dict[str, OpEntry] = field(default_factory=dict)
    failures: List[PluginFailure] = field(default_factory=list)
    loaded: bool = False
    loading: bool = False
    current_dist: Optional[str] = None


_state = _State()


def register_op(cls=None, *, name: Optional[str] = None):
    """Register an op class under ``name`` (default ``cls.name``); usable as
    a decorator. Called from a plugin's entry point module or function.

    Example::

        @gradcore.registry.register_op
        class Cube(Op):
            name = "cube"
            ...
    """
    def do(c):
        key = name or getattr(c, "name", "") or c.__name__
        dist = _state.current_dist or _dist_of_module(c.__module__)
        old = _state.ops.get(key)
        if old is not None and old.cls is not c:
            if old.dist != dist:
                raise PluginConflictError(
                    f"op {key!r} is registered by two distributions: {old.dist!r} and {dist!r}")
            raise PluginConflictError(f"op {key!r} is registered twice by {dist!r}")
        c.dist = dist
        _state.ops[key] = OpEntry(key, c, dist)
        return c
    return do(cls) if cls is not None else do


def _dist_of_module(module: str) -> str:
    top = module.split(".")[0]
    return STANDARD_DIST if top == "gradcore" else top


def _entry_points():
    return list(metadata.entry_points(group=GROUP))


def _blocked() -> set:
    return {n.strip() for n in os.environ.get(ENV_BLOCK, "").split(",") if n.strip()}


def load(force: bool = False) -> None:
    """Import every plugin (once). Failures are recorded, not raised."""
    if (_state.loaded and not force) or _state.loading:
        return
    _state.loading = True
    try:
        eps = _entry_points()
        no_plugins = os.environ.get(ENV_DISABLE, "") not in ("", "0")
        blocked = _blocked()
        has_standard = False
        for ep in eps:
            dist = ep.dist.name if ep.dist is not None else ep.module
            if dist == STANDARD_DIST:
                has_standard = True
            elif no_plugins or dist in blocked:
                continue
            _load_one(ep, dist)
        if not has_standard:
            # running from a source tree without installed metadata
            from gradcore import ops
            with _loading_as(STANDARD_DIST):
                ops.register()
    finally:
        _state.loading = False
        _state.loaded = True


@contextlib.contextmanager
def _loading_as(dist):
    prev = _state.current_dist
    _state.current_dist = dist
    try:
        yield
    finally:
        _state.current_dist = prev


def _load_one(ep, dist):
    before = dict(_state.ops)
    try:
        with _loading_as(dist):
            obj = ep.load()
            if callable(obj) and not isinstance(obj, (ModuleType, type)):
                obj()
    except PluginConflictError as exc:
        _state.ops = before
        _state.failures.append(PluginFailure(dist, ep.value, str(exc)))
        warnings.warn(f"gradcore plugin {dist!r} was not loaded: {exc}", RuntimeWarning, stacklevel=3)
    except Exception as exc:  # a broken plugin must not break the others
        _state.ops = before
        msg = f"{type(exc).__name__}: {exc}"
        _state.failures.append(PluginFailure(dist, ep.value, msg))
        warnings.warn(f"gradcore plugin {dist!r} failed to load ({ep.value}): {msg}",
                      RuntimeWarning, stacklevel=3)


def get(name: str) -> type:
    """The op class registered under ``name``.

    Example::

        >>> gradcore.ops.get("Elemwise")
        <class 'gradcore.ops.elemwise.Elemwise'>
    """
    load()
    entry = _state.ops.get(name)
    if entry is None:
        failed = ", ".join(f.dist for f in _state.failures)
        hint = f"; plugins that failed to load: {failed}" if failed else ""
        raise KeyError(f"no op named {name!r} is registered{hint}")
    return entry.cls


def entries() -> List[OpEntry]:
    """Every registered op, sorted by name."""
    load()
    return sorted(_state.ops.values(), key=lambda e: e.name)


def failures() -> List[PluginFailure]:
    load()
    return list(_state.failures)


def _reset_for_tests():
    global _state
    _state = _State()
