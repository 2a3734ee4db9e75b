"""MegEngine's module path ``megengine.functional.tensor``: the same
functions as ``F.<name>`` (they live in gradcore's op-family modules:
creation.py, shape.py, indexing.py, reduce.py, elemwise.py), for code that
imports them from here. MegEngine's complex-number functions (``complex``,
``real``, ``imag``, ``polar``) are not here: gradcore computes in real
dtypes.

Example::

    >>> from gradcore.functional.tensor import arange, concat
    >>> concat([arange(2), arange(1)]).numpy()
    array([0., 1., 0.], dtype=float32)
"""
from .creation import arange, eye, full, full_like, linspace, ones, ones_like, zeros, zeros_like
from .elemwise import where
from .indexing import cond_take, diag, gather, non_zero, scatter
from .reduce import cumsum
from .shape import (broadcast_to, concat, copy, expand_dims, flatten, meshgrid, repeat, reshape, roll, split,
                    squeeze, stack, swapaxes, tile, transpose)

__all__ = ["arange", "broadcast_to", "concat", "cond_take", "non_zero", "copy", "cumsum", "diag", "expand_dims",
           "eye", "flatten", "full", "full_like", "gather", "linspace", "meshgrid", "ones", "ones_like", "repeat",
           "reshape", "roll", "scatter", "split", "squeeze", "stack", "swapaxes", "tile", "transpose", "where",
           "zeros", "zeros_like"]
