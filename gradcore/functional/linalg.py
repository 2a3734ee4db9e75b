"""Matrix products: matmul, dot and linear. Their op: ops/linalg.py.

Example::

    >>> F.matmul(gc.tensor([[1.0, 2.0]]), gc.tensor([[3.0], [4.0]])).numpy()
    array([[11.]], dtype=float32)
"""
from __future__ import annotations

from typing import Optional

from .._core import Tensor, apply as _apply
from ..op import OpError
from ..ops.linalg import SVD, MatrixInverse, MatrixMul
from ._args import _named, _t
from .reduce import sum
from .shape import expand_dims, squeeze
from ..op import ArgumentError

_MatrixMul = MatrixMul     # one op instance per attributes: its caches stay warm


def matmul(inp1: Tensor, inp2: Tensor, transpose_a: bool = False, transpose_b: bool = False,
           compute_mode: str = "default") -> Tensor:
    """Matrix product with NumPy's rules for 1-D operands and broadcast batch axes.
    ``compute_mode`` is accepted for MegEngine compatibility (a float16
    precision hint) and changes nothing here.

    Example::

        >>> a = gc.tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> F.matmul(a, a).numpy()
        array([[ 7., 10.],
               [15., 22.]], dtype=float32)
        >>> F.matmul(a, a, transpose_b=True).numpy()
        array([[ 5., 11.],
               [11., 25.]], dtype=float32)
    """
    if compute_mode not in ("default", "float32"):
        # MegEngine's two modes; anything else is a typo, not a silent default
        raise ArgumentError(f"matmul: compute_mode must be 'default' or 'float32', got {compute_mode!r}")
    a, b = _t(inp1), _t(inp2)
    sa, sb = a.ndim == 1, b.ndim == 1
    if (sa or sb) and a.shape is not None and b.shape is not None and b.ndim and a.ndim:
        # checked here, so that the error shows the vectors as given (not as matrices)
        ka = a.shape[-2 if transpose_a and not sa else -1]
        kb = b.shape[-1 if transpose_b and not sb else (0 if sb else -2)]
        if isinstance(ka, int) and isinstance(kb, int) and ka != kb:
            raise ArgumentError(f"matmul: inner dimensions differ ({ka} and {kb}) for shapes "
                             f"{a.shape} and {b.shape}")
    if sa:
        a = expand_dims(a, 0)
        transpose_a = False
    if sb:
        b = expand_dims(b, 1)
        transpose_b = False
    out = _apply(_MatrixMul(bool(transpose_a), bool(transpose_b)), a, b)[0]
    if sa and sb:
        return squeeze(out, (-2, -1))
    if sa:
        return squeeze(out, -2)
    if sb:
        return squeeze(out, -1)
    return out


def dot(inp1: Tensor, inp2: Tensor) -> Tensor:
    """Inner product of two vectors.

    Example::

        >>> F.dot(gc.tensor([1.0, 2.0, 3.0]), gc.tensor([4.0, 5.0, 6.0])).item()
        32.0
    """
    a, b = _t(inp1), _t(inp2)
    if a.ndim > 1 or b.ndim > 1 or (a.ndim == 1 and b.ndim == 1 and a.shape != b.shape):
        raise ArgumentError(f"dot: expects vectors of the same length, got shapes {a.shape} and {b.shape}")
    return sum(a * b)


def linear(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None, compute_mode: str = "default") -> Tensor:
    """``inp @ weight.T + bias`` (weight is (out_features, in_features));
    ``compute_mode`` as in ``matmul``.

    Example::

        >>> x = gc.tensor([[1.0, 2.0]])
        >>> w, b = gc.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, -1.0]]), gc.tensor([0.0, 0.0, 10.0])
        >>> F.linear(x, w, b).numpy()     # (1, 2) @ (2, 3) + (3,)
        array([[1., 3., 8.]], dtype=float32)
    """
    w = _t(weight, name="linear")
    if w.shape is not None and w.ndim != 2:
        raise ArgumentError(f"linear: weight must be 2-d (out_features, in_features), got shape {w.shape}")
    out = matmul(inp, w, transpose_b=True)
    if bias is None:
        return out
    try:
        return out + bias
    except (OpError, TypeError) as exc:     # a bias that does not fit (out_features,)
        raise _named("linear", exc) from exc


def cross(a: Tensor, b: Tensor, axisa: int = -1, axisb: int = -1, axisc: int = -1,
          axis: Optional[int] = None) -> Tensor:
    """The cross product of (arrays of) 3-vectors along ``axisa`` of ``a``
    and ``axisb`` of ``b`` (2-vectors have a zero third component), put
    along ``axisc``; ``axis`` sets all three. MegEngine's ``F.cross``
    (NumPy's ``np.cross``).

    Example::

        >>> F.cross(gc.tensor([1.0, 2.0, 3.0]), gc.tensor([4.0, 5.0, 6.0])).numpy()
        array([-3.,  6., -3.], dtype=float32)
    """
    from .creation import zeros
    from .shape import concat, stack, transpose

    def moveaxis(x, src, dst):
        nd = x.ndim
        perm = [i for i in range(nd) if i != src % nd]
        perm.insert(dst % nd, src % nd)
        return transpose(x, tuple(perm))
    if axis is not None:
        axisa = axisb = axisc = axis
    a, b = _t(a), _t(b)
    a, b = moveaxis(a, axisa, -1), moveaxis(b, axisb, -1)
    comps = []
    for v in (a, b):
        if v.shape[-1] not in (2, 3):
            raise ArgumentError(f"cross: the vectors must have 2 or 3 components, got shapes {a.shape} and {b.shape}")
        if v.shape[-1] == 2:
            v = concat([v, zeros(v.shape[:-1] + (1,), v.dtype, v.device)], -1)
        comps.append([v[..., i] for i in range(3)])
    (a0, a1, a2), (b0, b1, b2) = comps
    out = stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], -1)
    return moveaxis(out, -1, axisc)


def matinv(inp: Tensor) -> Tensor:
    """The inverse of each square matrix over the last two axes of ``inp``
    (..., n, n), MegEngine's ``F.matinv`` (the ``MatrixInverse`` op); a
    singular matrix gives inf/NaN.

    Example::

        >>> F.matinv(gc.tensor([[1.0, 0.0], [1.0, 1.0]])).numpy()
        array([[ 1.,  0.],
               [-1.,  1.]], dtype=float32)
    """
    x = _t(inp)
    if x.dtype.kind in "biu":
        x = x.astype("float32")
    return _apply(MatrixInverse(), x)[0]



def svd(inp: Tensor, full_matrices: bool = False, compute_uv: bool = True) -> tuple:
    """The singular value decomposition of each matrix over the last two
    axes of ``inp`` (..., M, N), MegEngine's ``F.svd``: ``(U, S, Vh)`` with
    ``inp = U @ diag(S) @ Vh``, S descending; U (..., M, K) and Vh (..., K,
    N) for K = min(M, N), or square with ``full_matrices``. The factors are
    always computed (``compute_uv`` is MegEngine's and changes nothing
    here). Each column of U has its largest entry positive. Differentiable
    (the reduced form; the ``SVD`` op).

    Example::

        >>> u, s, vh = F.svd(gc.tensor([[3.0, 0.0], [0.0, -2.0]]))
        >>> s.numpy(), u.numpy()
        (array([3., 2.], dtype=float32), array([[1., 0.],
               [0., 1.]], dtype=float32))
    """
    x = _t(inp)
    if x.dtype.kind in "biu":
        x = x.astype("float32")
    if x.ndim < 2:
        raise ArgumentError(f"svd: inp must have at least 2 dimensions (..., M, N), got shape {x.shape}")
    return _apply(SVD(full_matrices), x)
