"""``M.MultiHeadAttention``: MegEngine's interface (inputs batch first,
``attn_dropout`` and ``out_dropout``, ``need_weights`` off by default,
per-head weights (N * heads, L, S)) with PyTorch's numerics and parameter
names and layouts (``in_proj_weight`` (3E, E), ``in_proj_bias`` (3E,),
``out_proj.weight``, ``out_proj.bias``; ``q_proj_weight``/``k_proj_weight``/
``v_proj_weight`` when kdim or vdim differ from embed_dim), so a PyTorch
state_dict loads (``batch_first=False`` takes PyTorch's (L, N, E)).

Example::

    >>> mha = M.MultiHeadAttention(8, 2)
    >>> out, weights = mha(x, x, x, need_weights=True)   # x: (N, L, 8) -> (N, L, 8), (N * 2, L, L)
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from .. import functional as F
from .._core import Tensor
from ..functional.nn import _attention, _split_mask
from ..tensor import Parameter
from .init import xavier_uniform_, zeros_
from .linear import Linear
from .module import Module, _count
from ..op import ArgumentError

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(Module):
    """Multi-head attention, MegEngine's ``M.MultiHeadAttention``:
    ``forward(query, key, value, key_padding_mask=None, attn_mask=None,
    need_weights=False, average_attn_weights=False, is_causal=False)``
    returns ``(output, weights or None)``. Inputs are (N, L, E) ((L, N, E)
    with ``batch_first=False``, PyTorch's default) or unbatched (L, E).
    Masks: a bool ``key_padding_mask`` (N, S) or ``attn_mask`` (L, S) /
    (N * heads, L, S) is True where a position must NOT be attended; float
    masks are added. ``attn_dropout`` drops attention weights and
    ``out_dropout`` the output while training (``dropout=`` is PyTorch's
    name for the first). The weights are per head, (N * heads, L, S),
    unless ``average_attn_weights`` averages them to (N, L, S).

    Example::

        >>> mha = M.MultiHeadAttention(16, 4, batch_first=True)
        >>> q = gc.tensor(np.ones((2, 3, 16), "float32"))
        >>> kv = gc.tensor(np.ones((2, 5, 16), "float32"))
        >>> out, weights = mha(q, kv, kv)
        >>> out.shape, weights
        ((2, 3, 16), None)
    """

    def __init__(self, embed_dim: int, num_heads: int, attn_dropout: float = 0.0, out_dropout: float = 0.0,
                 bias: bool = True, add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: Optional[int] = None, vdim: Optional[int] = None, batch_first: bool = True, *,
                 dropout: Optional[float] = None, **kwargs):
        super().__init__(**kwargs)
        E = self.embed_dim = _count("MultiHeadAttention", "embed_dim", embed_dim, 1)
        self.num_heads = _count("MultiHeadAttention", "num_heads", num_heads, 1)
        if E % self.num_heads:
            raise ArgumentError(f"MultiHeadAttention: embed_dim {E} must be divisible by num_heads {num_heads}")
        if add_bias_kv or add_zero_attn:
            raise ArgumentError("MultiHeadAttention: add_bias_kv and add_zero_attn are not supported (give False)")
        if dropout is not None:
            attn_dropout = dropout
        for what, p in (("attn_dropout", attn_dropout), ("out_dropout", out_dropout)):
            F.nn._check_drop_prob(f"MultiHeadAttention {what}", p)
        self.attn_dropout, self.out_dropout = float(attn_dropout), float(out_dropout)
        self.batch_first, self.head_dim = bool(batch_first), E // self.num_heads
        self.kdim = E if kdim is None else _count("MultiHeadAttention", "kdim", kdim, 1)
        self.vdim = E if vdim is None else _count("MultiHeadAttention", "vdim", vdim, 1)
        self._qkv_same = self.kdim == E and self.vdim == E
        if self._qkv_same:
            self.in_proj_weight = Parameter(np.zeros((3 * E, E), "float32"))
        else:
            self.q_proj_weight = Parameter(np.zeros((E, E), "float32"))
            self.k_proj_weight = Parameter(np.zeros((E, self.kdim), "float32"))
            self.v_proj_weight = Parameter(np.zeros((E, self.vdim), "float32"))
        self.in_proj_bias = Parameter(np.zeros(3 * E, "float32")) if bias else None
        self.out_proj = Linear(E, E, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections, zero biases (PyTorch's init)."""
        if self._qkv_same:
            xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                xavier_uniform_(w)
        if self.in_proj_bias is not None:
            zeros_(self.in_proj_bias)
            zeros_(self.out_proj.bias)

    def _proj(self, x: Tensor, i: int) -> Tensor:
        E = self.embed_dim
        if self._qkv_same:
            w = self.in_proj_weight[i * E:(i + 1) * E]
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[i]
        b = None if self.in_proj_bias is None else self.in_proj_bias[i * E:(i + 1) * E]
        return F.linear(x, w, b)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None, need_weights: bool = False, average_attn_weights: bool = False,
                is_causal: bool = False, maybe_cudnn_style_mask: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """``(output, weights or None)``; ``maybe_cudnn_style_mask`` is
        MegEngine's hint for its cuDNN kernel, with no effect here."""
        name = "MultiHeadAttention"
        q, k, v = (x if isinstance(x, Tensor) else F._t(x, name=name) for x in (query, key, value))
        unbatched = q.ndim == 2
        if unbatched:
            q, k, v = (F.expand_dims(x, 1) for x in (q, k, v))
            if key_padding_mask is not None:
                key_padding_mask = F.expand_dims(key_padding_mask, 0)
        elif self.batch_first:
            q, k, v = (F.transpose(x, (1, 0, 2)) for x in (q, k, v))
        if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or q.shape[-1] != self.embed_dim \
                or k.shape[-1] != self.kdim or v.shape[-1] != self.vdim \
                or k.shape[:2] != v.shape[:2] or q.shape[1] != k.shape[1]:
            order = "N, L" if self.batch_first else "L, N"
            korder = "N, S" if self.batch_first else "S, N"
            raise ArgumentError(f"{name}: expected query ({order}, {self.embed_dim}), key ({korder}, {self.kdim}) and "
                                f"value ({korder}, {self.vdim}), got shapes {tuple(query.shape)}, "
                                f"{tuple(key.shape)}, {tuple(value.shape)}")
        L, N, E = q.shape
        S, H, hd = k.shape[0], self.num_heads, self.head_dim

        def heads(x, n):      # (n, N, E) -> (N, H, n, hd)
            return F.transpose(F.reshape(x, (n, N, H, hd)), (1, 2, 0, 3))
        qh, kh, vh = heads(self._proj(q, 0), L), heads(self._proj(k, 1), S), heads(self._proj(v, 2), S)
        keep, add = _split_mask(name, attn_mask, q, False)
        if keep is not None or add is not None:
            m = keep if keep is not None else add
            if m.ndim == 3:
                if m.shape != (N * H, L, S):
                    raise ArgumentError(f"{name}: a 3-d attn_mask must be ({N * H}, {L}, {S}), got {m.shape}")
                m = F.reshape(m, (N, H, L, S))
            elif m.shape != (L, S):
                raise ArgumentError(f"{name}: attn_mask must be ({L}, {S}) or ({N * H}, {L}, {S}), got {m.shape}")
            keep, add = (m, None) if keep is not None else (None, m)
        if key_padding_mask is not None:
            kp = key_padding_mask if isinstance(key_padding_mask, Tensor) else F._t(key_padding_mask, name=name)
            if kp.shape != (N, S):
                raise ArgumentError(f"{name}: key_padding_mask must be ({N}, {S}), got {kp.shape}")
            kp = F.reshape(kp, (N, 1, 1, S))
            if kp.dtype == np.bool_:
                keep = ~kp if keep is None else keep & ~kp
            else:
                add = kp if add is None else add + kp
        out, attn = _attention(qh, kh, vh, keep, add, self.attn_dropout, is_causal and attn_mask is None, None,
                               self.training, name)
        out = F.reshape(F.transpose(out, (2, 0, 1, 3)), (L, N, E))
        out = self.out_proj(out)
        if self.out_dropout and self.training:
            out = F.nn.dropout(out, self.out_dropout, True)
        if unbatched:
            out = out[:, 0]
        elif self.batch_first:
            out = F.transpose(out, (1, 0, 2))
        weights = None
        if need_weights:
            # (N, H, L, S): averaged over the heads, else MegEngine's (N * H, L, S)
            weights = F.mean(attn, 1) if average_attn_weights else F.reshape(attn, (N * H, L, S))
            if unbatched and average_attn_weights:
                weights = weights[0]
        return out, weights

    def _module_info_string(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, attn_dropout={self.attn_dropout}, "
                f"out_dropout={self.out_dropout}, batch_first={self.batch_first}")
