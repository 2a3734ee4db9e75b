"""The standard library's CUDA kernels, by family: every source an op of
a family may ask the backend to compile, for one element type.

The kernel cache compiles a family's sources together, as one program
(``gradcore.cuda.families``), the first time any of them is needed: a
cold start then costs one compile per family and element type instead of
one per kernel. An op whose source depends on an attribute lists one
instance per value that changes the source (a reduction's mode, a pool's
averaging mode...); attributes that only reach the kernel as arguments
(shapes, axes, strides) need one instance. A source missing here still
works: it is compiled on its own when first needed.

Example::

    >>> from gradcore.ops.kernel_families import FAMILIES, family_sources
    >>> "gc_add_float" in "".join(family_sources("elemwise", "float"))
    True
"""
from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np

from . import conv, elemwise, indexing, linalg, loss, nn, pool, reduce, shape, vision

__all__ = ["FAMILIES", "family_sources", "install_backward_graphs"]

_FLOAT = ("float", "double")

# gradcore.graph traces the backward graphs the fused kernels come from; it
# sits above the op library (it builds backwards out of these ops), so it is
# handed down here by ``install_backward_graphs`` instead of imported
_make_backward_graph = None


def install_backward_graphs(make_backward_graph: Callable) -> None:
    """Give the catalog gradcore.graph's ``make_backward_graph``, from which
    the elementwise family's fused backward kernels are traced; ``import
    gradcore`` calls it, after loading both.

    Example::

        >>> from gradcore.graph import make_backward_graph
        >>> install_backward_graphs(make_backward_graph)
    """
    global _make_backward_graph
    _make_backward_graph = make_backward_graph


def _dtype_of(ctype: str) -> np.dtype:
    return np.dtype(next(name for name, c in shape.CUDA_CTYPES.items() if c == ctype))


def _computes_in(row, dtype: np.dtype) -> bool:
    """Whether the launcher runs ``row`` in ``dtype`` for inputs of ``dtype``
    (as ``Elemwise._cuda_plan`` chooses: sqrt of int32 runs in double, so
    gc_sqrt_int is never asked for, and would not compile)."""
    op = elemwise.Elemwise(row.mode)
    n = elemwise._arity(row)
    ins = ((np.dtype(bool),) if row.mode == "where" else ()) + (dtype,) * (n - (row.mode == "where"))
    out = op._numpy_dtype(ins)
    if out is None:
        return False
    compute = np.result_type(*ins) if out == np.bool_ and row.mode != "where" else out
    return compute == dtype


def _fused_backwards(ctype: str) -> List[str]:
    """The one-kernel backward of every row on inputs of one float type
    (``gradcore.cuda.fusion``): what a training step's elementwise ops ask for."""
    from gradcore.cuda.fusion import fuse_elementwise
    from gradcore.op import TensorDesc
    if _make_backward_graph is None:
        raise RuntimeError("gradcore.ops.kernel_families: no backward graphs installed "
                           "(import gradcore installs gradcore.graph's)")
    desc = TensorDesc(None, _dtype_of(ctype).name, "cpu")
    sources = []
    for row in elemwise.TABLE:
        if row.out_dtype == "bool" or row.mode == "where":
            continue
        n = elemwise._arity(row)
        try:
            graph = _make_backward_graph(elemwise.Elemwise(row.mode), [desc] * n, [True] * n)[0]
        except Exception:       # a row without a derivative
            continue
        kernel = fuse_elementwise(graph, None)
        if kernel is not None:
            sources.append(kernel.source)
    return sources


def _elemwise(ctype: str) -> List[str]:
    from gradcore.cuda.runtime import fill_source
    dtype = _dtype_of(ctype)
    rows = [elemwise.cuda_source(row, ctype) for row in elemwise.TABLE if _computes_in(row, dtype)]
    fused = _fused_backwards(ctype) if ctype in _FLOAT else []
    return rows + [fill_source(ctype)] + fused


def _reduce(ctype: str) -> List[str]:
    # a reduction's three kernels (a thread per output, a block per row, per
    # columns) are each the source of a module of their own
    sources = [reduce.Reduce(mode).kernel_source(ctype, kind) for mode in ("sum", "mean", "prod", "max", "min")
               for kind in ("thread", "rows", "cols")]
    ops = [reduce.BroadcastBack(1, keepdims, mean) for keepdims in (False, True) for mean in (False, True)]
    ops += [reduce.ArgReduce(mode) for mode in ("argmax", "argmin")]
    ops += [reduce.CumSum(0, reverse) for reverse in (False, True)]
    return sources + [op.cuda_source(ctype) for op in ops]


def _linalg(ctype: str) -> List[str]:
    return [linalg.MatrixMul().cuda_source(ctype), linalg.direct_matmul_source(ctype)]


def _shape(ctype: str) -> List[str]:
    from gradcore.cuda.runtime import CTYPES
    ops = [shape.Reshape((-1,)), shape.ReshapeLike(), shape.Transpose((1, 0)), shape.Broadcast((1,)),
           shape.BroadcastToLike(), shape.SumTo((1,)), shape.SumToLike(), shape.ZerosLike(), shape.ExpandDims(0),
           shape.Squeeze(), shape.Copy(), shape.Identity(), shape.StopGradient(), shape.Concat(0),
           shape.SplitLike(0), shape.Split(0, 2), shape.Stack(0), shape.Unstack(0, 2)]
    cast = shape.Cast("float32")
    return ([op.cuda_source(ctype) for op in ops]
            + [cast.cuda_source(ctype, to) for to in dict.fromkeys(CTYPES.values())])


def _indexing(ctype: str) -> List[str]:
    spec = (("s", 1, 3, None),)
    ops = [indexing.Subtensor(spec), indexing.Subtensor((("t", 0),), last_only=True), indexing.SubtensorGrad(spec),
           indexing.SetSubtensor(spec),
           indexing.IndexingOneHot(1), indexing.IndexingOneHotGrad(1, False), indexing.Gather(0),
           indexing.GatherGrad(0), indexing.Scatter(0), indexing.Sort(False), indexing.Sort(True)]
    ops += [indexing.TopK(1, descending, mode) for descending in (False, True) for mode in indexing.TOPK_MODES]
    return [op.cuda_source(ctype) for op in ops]


def _nn(ctype: str) -> List[str]:
    if ctype not in _FLOAT:         # softmax and logsumexp are float ops
        return []
    # softmax, log_softmax, logsumexp and the fused cross-entropy (forward and
    # gradient, int32 and int64 labels): a thread per row or a block per row,
    # each the source of a module of its own; batch norm's kernels
    rows = [nn._row_source(kind, ctype, per) for kind in nn._ROW_NAMES.values() for per in ("thread", "block")]
    rows += [loss._ce_source(kind, ctype, label, per) for kind in loss._CE_KINDS for label in loss._CE_SUFFIX
             for per in ("thread", "block")]
    return rows + [nn.batch_norm_source(ctype)]


def _conv(ctype: str) -> List[str]:
    # one source per op for every number of spatial axes; ConvTranspose runs the data gradient's
    ops = [conv.Convolution(), conv.ConvolutionBackwardData(), conv.ConvolutionBackwardFilter(),
           pool.MaxPool2d(2), pool.MaxPool2dBackward(2), pool.MaxPool2dGather(2)]
    ops += [cls(2, mode=mode) for cls in (pool.AvgPool2d, pool.AvgPool2dBackward) for mode in pool.AVG_MODES]
    return [op.cuda_source(ctype) for op in ops] + [conv.gemm_source(ctype)]


def _vision(ctype: str) -> List[str]:
    # align_corners applies to bilinear only
    return [cls((2, 2), mode=mode, align_corners=corners).cuda_source(ctype)
            for cls in (vision.Interpolate, vision.InterpolateBackward)
            for mode in vision.INTERPOLATE_MODES for corners in ((False, True) if mode == "bilinear" else (False,))]


FAMILIES: Dict[str, Callable[[str], List[str]]] = {
    "elemwise": _elemwise, "reduce": _reduce, "nn": _nn, "shape": _shape, "indexing": _indexing,
    "linalg": _linalg, "conv": _conv, "vision": _vision,
}


def family_sources(family: str, ctype: str) -> List[str]:
    """The CUDA C sources of ``family``'s kernels for element type ``ctype``
    (duplicates removed, in a stable order)."""
    try:
        make = FAMILIES[family]
    except KeyError:
        raise KeyError(f"no CUDA kernel family {family!r} (families: {', '.join(FAMILIES)})") from None
    return list(dict.fromkeys(make(ctype)))
