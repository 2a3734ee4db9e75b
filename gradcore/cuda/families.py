"""Kernel families: the standard kernels compiled together, one program
per family and element type (``elemwise``/``float``, ``conv``/``double``...).

Compiling is the cold start's cost, and most of a compile is fixed cost
(starting the compiler, parsing, setting up code generation), so the kernel
cache compiles a family's kernels as ONE translation unit the first time
any of them is needed: a training step pays one compile per family it uses
instead of one per kernel.

The op library (above this layer) owns the catalog: ``install(catalog)``
hands over ``catalog.FAMILIES`` (names) and ``catalog.family_sources(family,
ctype)``; ``gradcore.devices`` installs ``gradcore.ops.kernel_families``.

One translation unit out of many sources: each source goes in a namespace
of its own (``gc_unit_<k>``), so its ``typedef ... T;`` and helper
functions do not collide with another's, followed by ``using namespace
gc_unit_<k>;`` so that definitions a later source skips through an include
guard (``#ifndef GC_DIMS_DEFINED``) stay visible to it. ``extern "C"``
kernels keep their plain names. A source whose kernel name another source
already took is left out (it compiles on its own when needed).
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .kernels import kernel_names, tag

__all__ = ["Family", "install", "installed", "family_names", "program", "family_of", "kernel_names", "combine"]

CTYPES = ("float", "double", "signed char", "short", "int", "long long", "unsigned char", "unsigned short",
          "unsigned int", "unsigned long long", "bool")

_catalog = None
_lock = threading.Lock()
_programs: Dict[Tuple[str, str], "Family"] = {}
_index: Optional[Dict[str, Tuple[str, str]]] = None     # sha256 of a member source -> (family, ctype)


@dataclass(frozen=True)
class Family:
    """One family's program for one element type: ``label``
    ("elemwise-float"), ``source`` (the combined translation unit),
    ``units`` (the member sources it holds, in order), ``kernels`` (every
    kernel name it defines)."""
    family: str
    ctype: str
    source: str
    units: Tuple[str, ...]
    kernels: Tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.family}-{tag(self.ctype)}"


def combine(sources: Sequence[str], title: str = "") -> Tuple[str, Tuple[str, ...], Tuple[str, ...]]:
    """(one translation unit, the sources it holds, their kernel names) for
    ``sources`` (see the module docstring). Example::

        >>> text, units, names = combine(['extern "C" __global__ void a() {}',
        ...                               'extern "C" __global__ void b() {}'])
        >>> names
        ('a', 'b')
    """
    parts = []
    units, names = [], []
    taken = set()
    for source in dict.fromkeys(sources):
        own = kernel_names(source)
        if not own or taken.intersection(own):
            continue
        k = len(units)
        parts.append(f"namespace gc_unit_{k} {{\n{source}\n}}  // namespace gc_unit_{k}\n"
                     f"using namespace gc_unit_{k};\n")
        units.append(source)
        names += own
        taken.update(own)
    if title:
        parts.insert(0, f"// gradcore kernel family {title}: {len(units)} sources in one program\n")
    return "".join(parts), tuple(units), tuple(names)


def install(catalog) -> None:
    """Hand over the op library's kernel catalog: an object with
    ``FAMILIES`` (family names) and ``family_sources(family, ctype)``."""
    global _catalog, _index
    with _lock:
        _catalog = catalog
        _index = None
        _programs.clear()


def installed() -> bool:
    """Whether a catalog is installed (without one every kernel compiles alone)."""
    return _catalog is not None


def family_names() -> List[str]:
    """The installed families' names (empty without a catalog)."""
    return list(_catalog.FAMILIES) if _catalog is not None else []


def program(family: str, ctype: str) -> Family:
    """The program of ``family`` for C element type ``ctype``, built once."""
    key = (family, ctype)
    prog = _programs.get(key)
    if prog is None:
        if _catalog is None:
            raise RuntimeError("no kernel family catalog is installed (import gradcore first)")
        label = f"{family}/{ctype}"
        text, units, kernels = combine(_catalog.family_sources(family, ctype), label)
        prog = _programs.setdefault(key, Family(family, ctype, text, units, kernels))
    return prog


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def family_of(source: str) -> Optional[Family]:
    """The family program that holds ``source``, or None (a kernel outside
    the catalog: a plugin's, a fused backward, a source of an attribute
    value the catalog does not list). The index of every family and element
    type is built on the first call (tens of milliseconds: only a cold
    cache asks)."""
    global _index
    if _catalog is None:
        return None
    index = _index
    if index is None:
        with _lock:
            if _index is None:
                built = {}
                for family in _catalog.FAMILIES:
                    for ctype in CTYPES:
                        for unit in program(family, ctype).units:
                            built.setdefault(_digest(unit), (family, ctype))
                _index = built
            index = _index
    hit = index.get(_digest(source))
    return program(*hit) if hit is not None else None
