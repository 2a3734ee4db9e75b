"""Matrix products: matmul, dot, linear and einsum (a composition of
transposes, diagonals, sums and batched matmuls). Their op: ops/linalg.py.

Example::

    >>> F.matmul(gc.tensor([[1.0, 2.0]]), gc.tensor([[3.0], [4.0]])).numpy()
    array([[11.]], dtype=float32)
"""
from __future__ import annotations

import math
from typing import Optional

from .._core import Tensor, apply as _apply
from ..op import OpError
from ..ops.linalg import SVD, MatrixInverse, MatrixMul
from ._args import _check_compute_mode, _named, _t
from .creation import arange
from .reduce import sum
from .shape import broadcast_to, expand_dims, reshape, squeeze, transpose
from ..op import ArgumentError
from ..dtypes import autocast_dtypes

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
    _check_compute_mode("matmul", compute_mode)
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
    amp = autocast_dtypes()
    if amp is not None and isinstance(bias, Tensor) and bias.dtype.kind == "f":
        # MegEngine's linear: under autocast the bias is cast to the low
        # precision too, so the result stays float16 as the product is
        bias = bias.astype(amp[0])
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
            v = concat([v, zeros(v.shape[:-1] + (1,), dtype=v.dtype, device=v.device)], -1)
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


# ---- einsum
def _einsum_parse(equation: str, shapes: list) -> tuple:
    """``(letters of each operand, output letters)`` of an einsum equation, the
    ellipsis expanded to one stand-in letter per axis (right-aligned over the
    operands, broadcast as NumPy's) and an implicit output made NumPy's way:
    the ellipsis axes, then the letters seen once, in alphabetical order."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ArgumentError(f"einsum: equation {equation!r} names {len(terms)} operands, got {len(shapes)}")
    n_ell = 0
    for term, shape in zip(terms, shapes):
        if "..." in term:
            n_ell = max(n_ell, len(shape) - len(term.replace("...", "")))
    # stand-ins for ellipsis axes: characters no equation can use as a letter
    ell = [chr(0x100 + i) for i in range(n_ell)]
    letters = []
    for k, (term, shape) in enumerate(zip(terms, shapes)):
        named = term.replace("...", "")
        if not all(c.isalpha() for c in named) or term.count("...") > 1 or "." in named:
            raise ArgumentError(f"einsum: bad term {term!r} in {equation!r} (letters and one '...' only)")
        if "..." in term:
            k_ell = len(shape) - len(named)
            if k_ell < 0:
                raise ArgumentError(f"einsum: term {term!r} has more letters than operand {k}'s "
                                    f"{len(shape)} axes (shape {tuple(shape)})")
            head, _, tail = term.partition("...")
            letters.append(list(head) + ell[n_ell - k_ell:] + list(tail))
        else:
            if len(named) != len(shape):
                raise ArgumentError(f"einsum: term {term!r} names {len(named)} axes, operand {k} has "
                                    f"{len(shape)} (shape {tuple(shape)})")
            letters.append(list(named))
    if arrow:
        if not all(c.isalpha() for c in out.replace("...", "")) or out.count("...") > 1:
            raise ArgumentError(f"einsum: bad output {out!r} in {equation!r}")
        head, dots, tail = out.partition("...")
        out_letters = list(head) + (ell if dots else []) + list(tail)
        seen = {c for term in letters for c in term}
        for c in out_letters:
            if c not in seen or out_letters.count(c) > 1:
                raise ArgumentError(f"einsum: output letter {c!r} of {equation!r} is not in any input "
                                    f"or repeated")
    else:
        counts = {}
        for term in letters:
            for c in term:
                counts[c] = counts.get(c, 0) + 1
        out_letters = ell + sorted(c for c, n in counts.items() if n == 1 and c not in ell)
    return letters, out_letters


def _einsum_diagonal(x: Tensor, names: list) -> tuple:
    """``x`` with each letter repeated in ``names`` taken once: its diagonal
    (the repeated axes moved to the front and indexed by one arange)."""
    while len(set(names)) < len(names):
        c = next(c for c in names if names.count(c) > 1)
        where_c = [i for i, n in enumerate(names) if n == c]
        size = x.shape[where_c[0]]
        if any(x.shape[i] != size for i in where_c):
            raise ArgumentError(f"einsum: letter {c!r} repeated over axes of sizes "
                                f"{[x.shape[i] for i in where_c]}")
        rest = [i for i in range(x.ndim) if i not in where_c]
        x = transpose(x, where_c + rest)
        idx = arange(size, dtype="int32", device=x.device)
        x = x[(idx,) * len(where_c)]
        names = [c] + [names[i] for i in rest]
    return x, names


def _einsum_pair(a: Tensor, an: list, b: Tensor, bn: list, keep: set) -> tuple:
    """The product of ``a`` and ``b`` summed over their shared letters not in
    ``keep``, as one batched matmul: (batch, a's own, summed) @ (batch,
    summed, b's own)."""
    batch = [c for c in an if c in bn and c in keep]
    summed = [c for c in an if c in bn and c not in keep]
    a_own = [c for c in an if c not in bn]
    b_own = [c for c in bn if c not in an]
    size = {}
    for c, n in list(zip(an, a.shape)) + list(zip(bn, b.shape)):
        if size.get(c, 1) != 1 and n not in (1, size[c]):
            raise ArgumentError(f"einsum: letter {c!r} has sizes {size[c]} and {n} in two operands")
        size[c] = max(size.get(c, 1), n)
    a = broadcast_to(transpose(a, [an.index(c) for c in batch + a_own + summed]),
                     [size[c] for c in batch] + [a.shape[an.index(c)] for c in a_own] + [size[c] for c in summed])
    b = broadcast_to(transpose(b, [bn.index(c) for c in batch + summed + b_own]),
                     [size[c] for c in batch + summed] + [b.shape[bn.index(c)] for c in b_own])

    nb, na = math.prod(a.shape[:len(batch)]), math.prod(a.shape[len(batch):len(batch) + len(a_own)])
    ns, nown = math.prod(a.shape[len(batch) + len(a_own):]), math.prod(b.shape[len(batch) + len(summed):])
    out = matmul(reshape(a, (nb, na, ns)), reshape(b, (nb, ns, nown)))
    shape = tuple(a.shape[:len(batch) + len(a_own)]) + tuple(b.shape[len(batch) + len(summed):])
    return reshape(out, shape), batch + a_own + b_own


def einsum(equation: str, *operands: Tensor) -> Tensor:
    """Einstein summation, MegEngine's (and NumPy's) ``einsum``: ``equation``
    names each operand's axes by letters, ``...`` stands for the axes not
    named (broadcast across operands), a letter repeated within one operand
    takes its diagonal, and letters missing from the output (after ``->``;
    without it: the letters seen once, in alphabetical order, after the
    ellipsis axes) are summed over. Operands are contracted left to right,
    each pair as one batched matmul, so gradients flow as through matmul.

    Example::

        >>> a, b = gc.tensor([[1.0, 2.0], [3.0, 4.0]]), gc.tensor([[5.0], [6.0]])
        >>> F.einsum("ik,kj->ij", a, b).numpy()
        array([[17.],
               [39.]], dtype=float32)
    """
    if not isinstance(equation, str):
        raise TypeError(f"einsum: equation must be a str, got {type(equation).__name__}")
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])      # einsum(eq, [a, b]) as well as einsum(eq, a, b)
    if not operands:
        raise ArgumentError("einsum: needs at least one operand")
    xs = [_t(x) for x in operands]
    letters, out = _einsum_parse(equation, [x.shape for x in xs])
    try:
        terms = [_einsum_diagonal(x, names) for x, names in zip(xs, letters)]
        counts = {}
        for _, names in terms:
            for c in names:
                counts[c] = counts.get(c, 0) + 1
        # a letter of one operand only, not in the output, is summed over first
        pending = []
        for x, names in terms:
            lone = [i for i, c in enumerate(names) if counts[c] == 1 and c not in out]
            if lone:
                x, names = sum(x, lone), [c for i, c in enumerate(names) if i not in lone]
            pending.append((x, names))
        x, names = pending[0]
        for k in range(1, len(pending)):
            keep = set(out).union(*[set(n) for _, n in pending[k + 1:]])
            # letters of the running result neither kept nor in the next operand: summed first
            lone = [i for i, c in enumerate(names) if c not in keep and c not in pending[k][1]]
            if lone:
                x, names = sum(x, lone), [c for i, c in enumerate(names) if i not in lone]
            b, bn = pending[k]
            lone = [i for i, c in enumerate(bn) if c not in keep and c not in names]
            if lone:
                b, bn = sum(b, lone), [c for i, c in enumerate(bn) if i not in lone]
            x, names = _einsum_pair(x, names, b, bn, keep)
        extra = [i for i, c in enumerate(names) if c not in out]
        if extra:
            x, names = sum(x, extra), [c for i, c in enumerate(names) if i not in extra]
        return transpose(x, [names.index(c) for c in out]) if names != out else x
    except OpError as exc:
        raise _named("einsum", exc) from exc
