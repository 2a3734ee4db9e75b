"""Attention: ``F.nn.scaled_dot_product_attention`` (PyTorch's semantics)
and the multi-head form ``M.MultiHeadAttention`` runs. Compositions of
existing ops (matmul, softmax, where, dropout): gradients of any order
come from those, on every device.

Example::

    >>> q = k = v = gc.tensor(np.ones((2, 3, 4), "float32"))
    >>> F.nn.scaled_dot_product_attention(q, k, v).shape
    (2, 3, 4)
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from .._core import Tensor
from ._args import _t
from .elemwise import where
from .linalg import matmul
from .nn import _check_drop_prob, dropout, softmax

__all__ = ["scaled_dot_product_attention"]


def _attention(q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], add: Optional[Tensor],
               dropout_p: float, is_causal: bool, scale: Optional[float], training: bool,
               name: str) -> Tuple[Tensor, Tensor]:
    """(output, attention weights): softmax(q k^T * scale + add, masked
    where ``keep`` is False) (dropout) @ v."""
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError(f"{name}: query, key and value need at least 2 dimensions (..., L, E), got shapes "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{name}: query and key must share the last dimension and key and value the "
                         f"sequence one, got shapes {q.shape}, {k.shape}, {v.shape}")
    L, S = q.shape[-2], k.shape[-2]
    s = (1.0 / math.sqrt(q.shape[-1])) if scale is None else float(scale)
    scores = matmul(q, k, transpose_b=True) * s
    if is_causal:
        causal = Tensor(np.tril(np.ones((L, S), bool)), device=q.device)
        keep = causal if keep is None else keep & causal
    if add is not None:
        scores = scores + add
    if keep is not None:
        scores = where(keep, scores, float("-inf"))
    attn = softmax(scores, axis=-1)
    if dropout_p and training:
        attn = dropout(attn, dropout_p, True)
    return matmul(attn, v), attn


def _split_mask(name: str, attn_mask, like: Tensor, true_means_keep: bool):
    """A mask as (keep: bool or None, add: float or None)."""
    if attn_mask is None:
        return None, None
    m = _t(attn_mask, like) if not isinstance(attn_mask, Tensor) else attn_mask
    if m.dtype == np.bool_:
        return (m if true_means_keep else ~m), None
    if m.dtype.kind != "f":
        raise TypeError(f"{name}: attn_mask must be bool or floating-point, got {m.dtype}")
    return None, m


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 training: bool = True) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value`` over (..., L, E)
    query and (..., S, E) key, (..., S, Ev) value, PyTorch's semantics:
    ``scale`` defaults to 1 / sqrt(E); a bool ``attn_mask`` (broadcast to
    (..., L, S)) is True where a position takes part, a float one is added
    to the scores; ``is_causal`` masks the upper triangle; ``dropout_p``
    drops attention weights while ``training``.

    Example::

        >>> out = F.nn.scaled_dot_product_attention(q, k, v, is_causal=True)
    """
    name = "scaled_dot_product_attention"
    q, k, v = _t(query), _t(key), _t(value)
    _check_drop_prob(name, dropout_p)
    if is_causal and attn_mask is not None:
        raise ValueError(f"{name}: give attn_mask or is_causal, not both (PyTorch's rule)")
    keep, add = _split_mask(name, attn_mask, q, True)
    return _attention(q, k, v, keep, add, dropout_p, is_causal, scale, training, name)[0]
