"""MegEngine's module path ``megengine.functional.math``: the same functions
as ``F.<name>`` (they live in gradcore's op-family modules: reduce.py,
indexing.py, linalg.py, elemwise.py, nn.py), for code that imports them
from here.

Example::

    >>> from gradcore.functional.math import argmax, norm
    >>> argmax(gc.tensor([1.0, 3.0, 2.0])).item(), norm(gc.tensor([3.0, 4.0])).item()
    (1, 5.0)
"""
from .elemwise import isinf, isnan
from .elemwise_table import sign
from .indexing import argsort, sort, topk
from .linalg import cross, dot, matinv, matmul, svd
from .nn import normalize
from .reduce import argmax, argmin, max, mean, min, norm, prod, std, sum, var

__all__ = ["argmax", "argmin", "argsort", "cross", "dot", "isinf", "isnan", "matinv", "matmul", "max",
           "mean", "min", "norm", "normalize", "prod", "sign", "sort", "std", "sum", "svd", "topk", "var"]
