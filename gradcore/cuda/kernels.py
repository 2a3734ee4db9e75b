"""The CUDA kernel builder: every kernel gradcore compiles is written here,
from a declaration (its name, its C parameter list, its body).

A kernel is written once, for every element type, in terms of ``T``: the
source declares ``typedef <ctype> T;`` (the one place the element type
enters; a cast's second type is ``U``) in a namespace of its own, so that
sources of several types share a file, with the ``extern "C" __global__``
function named ``gc_<name>_<ctype>`` (spaces as underscores:
``gc_copy_long_long``); helpers (device functions, templates) go first. The loop that spreads the work comes
from here too: ``over=count`` wraps the body in a grid-stride loop (one
thread per index ``idx``, any grid covers every index), ``per="block"`` in a
block loop (one block per index, uniform for ``__syncthreads``); without
``over`` the body is the whole function. Nothing is substituted into the
text: the body is C, compiled as written.

Sources are built once per op and element type (the kernel cache keys by
source text), never per call.

Example::

    >>> COPY = Kernel("copy", "const T* __restrict__ x, T* __restrict__ y, long long n",
    ...               "y[idx] = x[idx];", over="n")
    >>> print(COPY.source("float"))              # doctest: +NORMALIZE_WHITESPACE
    namespace gc_copy_float_unit {
    typedef float T;
    extern "C" __global__ void gc_copy_float(const T* __restrict__ x, T* __restrict__ y, long long n)
    {
        #pragma unroll 1
        for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n;
             idx += (long long)blockDim.x * gridDim.x) {
            y[idx] = x[idx];
        }
    }
    }  // namespace gc_copy_float_unit
    using namespace gc_copy_float_unit;
"""
from __future__ import annotations

import functools
import re
import textwrap
from dataclasses import dataclass
from typing import Optional

__all__ = ["Kernel", "source", "kernel_name", "kernel_names", "parameters", "tag"]

_HEADER = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(')


def tag(ctype: str) -> str:
    """``ctype`` as it appears in kernel names: ``"long long"`` -> ``long_long``."""
    return "_".join(ctype.split())


def kernel_name(name: str, ctype: str, *more: str) -> str:
    """``gc_<name>_<ctype>`` (``_to_<type>`` per further element type)."""
    return "_to_".join([f"gc_{name}_{tag(ctype)}", *map(tag, more)])


def kernel_names(source: str) -> list:
    """The ``extern "C" __global__`` kernels ``source`` defines (a source
    written by hand included)."""
    return _HEADER.findall(source)


# C parameter types by how the packer lays them out: "p" a pointer, "f"/"d"
# float/double, "1"/"2"/"4"/"8" an integer of that many bytes ("?": any, a struct)
_PARAM_KINDS = {"float": "f", "double": "d", "bool": "1", "char": "1", "signed char": "1", "unsigned char": "1",
                "int8_t": "1", "uint8_t": "1", "short": "2", "unsigned short": "2", "int16_t": "2",
                "uint16_t": "2", "__half": "2", "half": "2", "int": "4", "unsigned": "4", "unsigned int": "4",
                "int32_t": "4", "uint32_t": "4", "long long": "8", "unsigned long long": "8", "long": "8",
                "unsigned long": "8", "int64_t": "8", "uint64_t": "8", "size_t": "8", "ptrdiff_t": "8"}
_TYPEDEF = re.compile(r"typedef\s+([\w ]+?)\s+(\w+)\s*;")
_QUALIFIERS = {"const", "volatile", "__restrict__", "restrict", "__restrict"}


def parameters(source: str, name: str) -> tuple:
    """``(kinds, params)`` of kernel ``name`` in ``source``: its C parameter
    list as written, and one character per parameter saying how a launch
    must pass it ("p" a device array, "f"/"d" float32/float64, "1".."8" an
    integer of that many bytes, "?" anything: a struct); ``T`` and ``U``
    resolved by the source's typedefs. The launcher checks arguments with it.

    Example::

        >>> parameters(Kernel("scale", "const T* x, T* y, T k, long long n", "y[i] = k * x[i];").source("double"),
        ...            "gc_scale_double")
        (b'ppd8', 'const T* x, T* y, T k, long long n')
    """
    m = re.search(r'__global__\s+void\s+' + re.escape(name) + r'\s*\(', source)
    if m is None:
        raise ValueError(f"no kernel {name!r} in the source")
    depth, end = 1, m.end()
    while depth and end < len(source):
        depth += {"(": 1, ")": -1}.get(source[end], 0)
        end += 1
    params = " ".join(source[m.end():end - 1].split())
    types = {alias: ctype for ctype, alias in _TYPEDEF.findall(source[:m.start()])}     # the nearest wins
    kinds = ""
    for param in filter(None, (p.strip() for p in params.split(","))):
        if "*" in param or "[" in param:
            kinds += "p"
            continue
        words = [w for w in param.split() if w not in _QUALIFIERS]
        ctype = " ".join(words[:-1]) if len(words) > 1 else " ".join(words)
        ctype = " ".join(types.get(w, w) for w in ctype.split())
        kinds += _PARAM_KINDS.get(ctype, "?")
    return kinds.encode(), params


def _block(text: str, pad: str) -> str:
    return textwrap.indent(textwrap.dedent(text).strip("\n"), pad) + "\n"


@dataclass(frozen=True)
class Kernel:
    """One ``extern "C" __global__`` kernel: ``name`` (the ``<name>`` of
    ``gc_<name>_<ctype>``), ``params`` (its C parameter list, element type
    ``T``), ``body`` (C statements), and how the threads cover the work:
    ``over`` (a count; None: the body is the whole function), ``index`` (the
    loop variable) and ``per`` ("thread": grid-stride; "block": one block
    per index); ``suffix`` follows the element type in the name;
    ``setup``: statements before the loop."""
    name: str
    params: str
    body: str
    over: Optional[str] = None
    index: str = "idx"
    per: str = "thread"
    suffix: str = ""
    setup: str = ""

    def function(self, ctype: str, *more: str) -> str:
        """The kernel's C function (without the typedefs)."""
        head = f'extern "C" __global__ void {kernel_name(self.name, ctype, *more)}{self.suffix}({self.params})\n{{\n'
        if self.over is None:
            return head + _block(self.body, "    ") + "}\n"
        i = self.index
        # not unrolled: a launch covers its work in about one pass, and the unrolled
        # loop's trip count costs a 64-bit division per thread (more than a memory-bound body)
        if self.per == "block":
            loop = ("    #pragma unroll 1\n"
                    f"    for (long long {i} = blockIdx.x; {i} < {self.over}; {i} += gridDim.x) {{   // uniform per block\n")
        elif self.per == "thread":
            loop = ("    #pragma unroll 1\n"
                    f"    for (long long {i} = blockIdx.x * (long long)blockDim.x + threadIdx.x; {i} < {self.over};\n"
                    f"         {i} += (long long)blockDim.x * gridDim.x) {{\n")
        else:
            raise ValueError(f"Kernel {self.name}: per must be 'thread' or 'block', got {self.per!r}")
        setup = _block(self.setup, "    ") if self.setup.strip() else ""
        return head + setup + loop + _block(self.body, "        ") + "    }\n}\n"

    def source(self, ctype: str, helpers: str = "", U: Optional[str] = None) -> str:
        """The whole source for element type ``ctype`` (see ``source``)."""
        return source(ctype, self, helpers=helpers, U=U)


# memoised: a launcher may declare its kernel on every call; the text is
# built once and the same string returned after (the kernel cache keys by it,
# and a string's hash is computed once)
@functools.lru_cache(maxsize=None)
def source(ctype: str, *kernels: Kernel, helpers: str = "", U: Optional[str] = None) -> str:
    """One CUDA C source: the ``helpers`` (device functions and structs that
    do not name ``T``: templates, guarded by ``#ifndef`` so that sources put
    in one file share them), then a namespace of the source's own holding
    ``typedef ctype T;`` (and ``typedef U U;`` for a kernel between two
    element types, named ``gc_<name>_<T>_to_<U>``) and ``kernels``, then a
    using-directive (``extern "C"``: their symbols are the plain names).
    Sources of any element types may so be put in one file."""
    more = () if U is None else (U,)
    ns = kernel_name(kernels[0].name, ctype, *more) + kernels[0].suffix + "_unit"
    return ((_block(helpers, "") if helpers.strip() else "")
            + f"namespace {ns} {{\ntypedef {ctype} T;\n" + (f"typedef {U} U;\n" if U is not None else "")
            + "".join(k.function(ctype, *more) for k in kernels)
            + f"}}  // namespace {ns}\nusing namespace {ns};\n")
