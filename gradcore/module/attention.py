"""``M.MultiHeadAttention``: MegEngine's layer (inputs batch first,
``attn_dropout`` and ``out_dropout``, ``need_weights`` off by default,
per-head weights (N * heads, L, S)), in either of two parameter forms:

- ``weight_layout="pytorch"`` (the default, as the spec names PyTorch's
  parameters for the recurrent and attention layers): PyTorch's
  ``in_proj_weight`` (3E, E), ``in_proj_bias`` (3E,),
  ``out_proj.weight``/``out_proj.bias`` (and
  ``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` when kdim or vdim
  differ from embed_dim), ``bias_k``/``bias_v``;
- ``weight_layout="megengine"``: MegEngine's parameters, one flat
  ``io_weight_bias`` (1, n) in the layout of its C++ kernel (query, key,
  value, out weights as (in, out), then the four biases; see
  ``F.nn.multi_head_attention``) and ``bias_k``/``bias_v`` (1, 1, E) with
  ``add_bias_kv``; its ``state_dict`` loads into MegEngine and back.

``load_state_dict`` of either form (of the layer or of a model holding it)
reads the other form's checkpoint too, converting it. PyTorch's numerics;
``batch_first=False`` takes PyTorch's (L, N, E).

Example::

    >>> mha = M.MultiHeadAttention(8, 2, weight_layout="megengine")
    >>> out, weights = mha(x, x, x, need_weights=True)   # x: (N, L, 8) -> (N, L, 8), (N * 2, L, L)
    >>> mha.io_weight_bias.shape                         # 4 weights (8, 8) and 4 biases (8,)
    (1, 288)
    >>> M.MultiHeadAttention(8, 2).in_proj_weight.shape
    (24, 8)
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from .. import functional as F
from .._core import Tensor
from ..functional.nn import _mha_block_shapes, _mha_split, _multi_head_attention
from ..op import ArgumentError
from ..tensor import Parameter
from .init import xavier_normal_, xavier_uniform_, zeros_
from .linear import Linear
from .module import Module, _count

__all__ = ["MultiHeadAttention"]

_LAYOUTS = ("megengine", "pytorch")


def _array(v) -> np.ndarray:
    """A checkpoint value (gradcore or torch tensor, array) as a NumPy array."""
    if isinstance(v, Tensor):
        return v.numpy()
    if hasattr(v, "detach") and hasattr(v, "cpu"):
        return v.detach().cpu().numpy()
    return np.asarray(v)


class MultiHeadAttention(Module):
    """Multi-head attention, MegEngine's ``M.MultiHeadAttention(embed_dim,
    num_heads, attn_dropout=0.0, out_dropout=0.0, bias=True,
    add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None)``:
    ``forward(query, key, value, key_padding_mask=None, attn_mask=None,
    need_weights=False, average_attn_weights=False, is_causal=False,
    maybe_cudnn_style_mask=False)`` returns ``(output, weights or None)``.
    Inputs are (N, L, E) ((L, N, E) with ``batch_first=False``, PyTorch's
    default) or unbatched (L, E). Masks: a bool ``key_padding_mask`` (N, S)
    or ``attn_mask`` (L, S) / (N * heads, L, S) is True where a position
    must NOT be attended; float masks are added. ``attn_dropout`` drops
    attention weights and ``out_dropout`` the output while training
    (``dropout=`` is PyTorch's name for the first). The weights are per
    head, (N * heads, L, S), unless ``average_attn_weights`` averages them
    to (N, L, S). ``add_bias_kv`` appends the learnt ``bias_k``/``bias_v``
    to the projected keys and values, ``add_zero_attn`` a zero key and
    value.

    ``weight_layout`` picks the parameters (module docstring): PyTorch's
    separate projections (the default; PyTorch's per-matrix Xavier init) or
    MegEngine's ``io_weight_bias`` (initialised as MegEngine does, one
    Xavier-uniform draw over the whole (1, n) parameter and zero biases);
    either loads the other's checkpoint.

    Example::

        >>> mha = M.MultiHeadAttention(16, 4)
        >>> q = gc.tensor(np.ones((2, 3, 16), "float32"))
        >>> kv = gc.tensor(np.ones((2, 5, 16), "float32"))
        >>> out, weights = mha(q, kv, kv)
        >>> out.shape, weights
        ((2, 3, 16), None)
        >>> sorted(M.MultiHeadAttention(16, 4).state_dict())
        ['in_proj_bias', 'in_proj_weight', 'out_proj.bias', 'out_proj.weight']
        >>> sorted(M.MultiHeadAttention(16, 4, weight_layout="megengine").state_dict())
        ['io_weight_bias']
    """

    def __init__(self, embed_dim: int, num_heads: int, attn_dropout: float = 0.0, out_dropout: float = 0.0,
                 bias: bool = True, add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: Optional[int] = None, vdim: Optional[int] = None, batch_first: bool = True, *,
                 dropout: Optional[float] = None, weight_layout: str = "pytorch", **kwargs):
        super().__init__(**kwargs)
        name = "MultiHeadAttention"
        E = self.embed_dim = _count(name, "embed_dim", embed_dim, 1)
        self.num_heads = _count(name, "num_heads", num_heads, 1)
        if E % self.num_heads:
            raise ArgumentError(f"{name}: embed_dim {E} must be divisible by num_heads {num_heads}")
        if weight_layout not in _LAYOUTS:
            raise ArgumentError(f"{name}: weight_layout must be one of {_LAYOUTS}, got {weight_layout!r}")
        self.weight_layout = weight_layout
        if dropout is not None:
            attn_dropout = dropout
        for what, p in (("attn_dropout", attn_dropout), ("out_dropout", out_dropout)):
            F.nn._check_drop_prob(f"{name} {what}", p)
        self.attn_dropout, self.out_dropout = float(attn_dropout), float(out_dropout)
        self.batch_first, self.head_dim = bool(batch_first), E // self.num_heads
        self.bias, self.add_bias_kv, self.add_zero_attn = bool(bias), bool(add_bias_kv), bool(add_zero_attn)
        self.kdim = E if kdim is None else _count(name, "kdim", kdim, 1)
        self.vdim = E if vdim is None else _count(name, "vdim", vdim, 1)
        self._qkv_same = self.kdim == E and self.vdim == E
        if weight_layout == "megengine":
            self.weight_bias_len = (2 * E + self.kdim + self.vdim) * E + (4 * E if self.bias else 0)
            self.io_weight_bias = Parameter(np.zeros((1, self.weight_bias_len), "float32"))
        elif self._qkv_same:
            self.in_proj_weight = Parameter(np.zeros((3 * E, E), "float32"))
        else:
            self.q_proj_weight = Parameter(np.zeros((E, E), "float32"))
            self.k_proj_weight = Parameter(np.zeros((E, self.kdim), "float32"))
            self.v_proj_weight = Parameter(np.zeros((E, self.vdim), "float32"))
        if weight_layout == "pytorch":
            self.in_proj_bias = Parameter(np.zeros(3 * E, "float32")) if bias else None
            self.out_proj = Linear(E, E, bias=bias)
        self.bias_k = Parameter(np.zeros((1, 1, E), "float32")) if add_bias_kv else None
        self.bias_v = Parameter(np.zeros((1, 1, E), "float32")) if add_bias_kv else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """MegEngine's init for its form (Xavier-uniform over io_weight_bias
        as one (1, n) tensor, then zero biases; Xavier-uniform bias_k/bias_v),
        PyTorch's for its form (Xavier-uniform per projection, zero biases,
        Xavier-normal bias_k/bias_v)."""
        if self.weight_layout == "megengine":
            xavier_uniform_(self.io_weight_bias)
            if self.bias:
                w = self.io_weight_bias.numpy().copy()
                w[0, self.weight_bias_len - 4 * self.embed_dim:] = 0
                self.io_weight_bias._reset(Tensor(w, device=self.io_weight_bias.device))
            kv_init = xavier_uniform_
        else:
            if self._qkv_same:
                xavier_uniform_(self.in_proj_weight)
            else:
                for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                    xavier_uniform_(w)
            if self.in_proj_bias is not None:
                zeros_(self.in_proj_bias)
                zeros_(self.out_proj.bias)
            kv_init = xavier_normal_
        if self.add_bias_kv:
            kv_init(self.bias_k)
            kv_init(self.bias_v)

    def _shapes(self) -> list:
        E = self.embed_dim
        return _mha_block_shapes(E, self.kdim, self.vdim, self.num_heads, E, E, E, E, *(self.bias,) * 4)

    def _blocks(self) -> list:
        """(wq, wk, wv, wo, bq, bk, bv, bo) as (in, out) weights, views of the parameters."""
        if self.weight_layout == "megengine":
            return _mha_split("MultiHeadAttention", self.io_weight_bias, self._shapes())
        E = self.embed_dim
        if self._qkv_same:
            ws = [self.in_proj_weight[i * E:(i + 1) * E] for i in range(3)]
        else:
            ws = [self.q_proj_weight, self.k_proj_weight, self.v_proj_weight]
        ws = [F.transpose(w, (1, 0)) for w in ws + [self.out_proj.weight]]
        bs = [None] * 4
        if self.in_proj_bias is not None:
            bs = [self.in_proj_bias[i * E:(i + 1) * E] for i in range(3)] + [self.out_proj.bias]
        return ws + bs

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None, need_weights: bool = False, average_attn_weights: bool = False,
                is_causal: bool = False, maybe_cudnn_style_mask: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """``(output, weights or None)``; ``maybe_cudnn_style_mask`` reads
        MegEngine's cuDNN-style masks (see ``F.nn.multi_head_attention``)."""
        name = "MultiHeadAttention"
        q, k, v = (x if isinstance(x, Tensor) else F._t(x, name=name) for x in (query, key, value))
        batched = q.ndim == 3
        if (q.ndim not in (2, 3) or k.ndim != q.ndim or v.ndim != q.ndim or q.shape[-1] != self.embed_dim
                or k.shape[-1] != self.kdim or v.shape[-1] != self.vdim or k.shape[:-1] != v.shape[:-1]
                or (batched and q.shape[0 if self.batch_first else 1] != k.shape[0 if self.batch_first else 1])):
            order = "N, L" if self.batch_first else "L, N"
            korder = "N, S" if self.batch_first else "S, N"
            raise ArgumentError(f"{name}: expected query ({order}, {self.embed_dim}), key ({korder}, {self.kdim}) and "
                                f"value ({korder}, {self.vdim}), got shapes {tuple(query.shape)}, "
                                f"{tuple(key.shape)}, {tuple(value.shape)}")
        if batched and not self.batch_first:
            q, k, v = (F.transpose(x, (1, 0, 2)) for x in (q, k, v))
        E = self.embed_dim
        out, weights = _multi_head_attention(
            name, q, k, v, E, self.num_heads, self.attn_dropout, self.out_dropout, self._blocks(), (E, E, E, E),
            self.bias_k, self.bias_v, self.add_zero_attn, key_padding_mask, attn_mask, bool(need_weights),
            bool(average_attn_weights), bool(is_causal), bool(maybe_cudnn_style_mask), False, self.training)
        if batched and not self.batch_first:
            out = F.transpose(out, (1, 0, 2))
        return out, weights

    # ---- the other form's checkpoints
    def _torch_names(self) -> list:
        w = ["in_proj_weight"] if self._qkv_same else ["q_proj_weight", "k_proj_weight", "v_proj_weight"]
        return w + ["out_proj.weight"] + (["in_proj_bias", "out_proj.bias"] if self.bias else [])

    def _load_form(self, state_dict: Dict[str, Any], prefix: str) -> Dict[str, Any]:
        """A checkpoint of the other weight layout, under ``prefix``, as this
        layer's entries (MegEngine's ``io_weight_bias`` into PyTorch's
        projections or back); a flat (n,) io_weight_bias is read as (1, n)."""
        flat_key = prefix + "io_weight_bias"
        torch_keys = [prefix + n for n in self._torch_names()]
        E = self.embed_dim
        if self.weight_layout == "megengine":
            if flat_key in state_dict:
                flat = _array(state_dict[flat_key])
                if flat.ndim == 1 and flat.size == self.weight_bias_len:
                    return {**state_dict, flat_key: flat.reshape(1, -1)}
                return state_dict
            if not all(k in state_dict for k in torch_keys):
                return state_dict       # load_state_dict names what is missing
            t = {k[len(prefix):]: _array(state_dict[k]) for k in torch_keys}
            if self._qkv_same:
                ws = np.split(t["in_proj_weight"], 3) if t["in_proj_weight"].shape == (3 * E, E) else []
            else:
                ws = [t["q_proj_weight"], t["k_proj_weight"], t["v_proj_weight"]]
            ws.append(t["out_proj.weight"])
            bs = np.split(t["in_proj_bias"], 3) + [t["out_proj.bias"]] if self.bias else []
            want = [s for s in self._shapes() if s is not None]
            parts = [w.T for w in ws] + bs          # PyTorch's (out, in) -> MegEngine's (in, out)
            if [p.shape for p in parts] != want:
                raise ArgumentError(f"MultiHeadAttention.load_state_dict: {prefix}PyTorch's projections of shapes "
                                    f"{[t[n].shape for n in self._torch_names()]} do not fit this layer "
                                    f"(embed_dim {E}, kdim {self.kdim}, vdim {self.vdim}, bias {self.bias})")
            rest = {k: v for k, v in state_dict.items() if k not in torch_keys}
            rest[flat_key] = np.concatenate([p.reshape(-1) for p in parts]).reshape(1, -1)
            return rest
        if flat_key not in state_dict:
            return {k: (_array(v) if k.startswith(prefix) and hasattr(v, "detach") else v)
                    for k, v in state_dict.items()}
        flat = _array(state_dict[flat_key]).reshape(-1)
        blocks = _mha_split(f"MultiHeadAttention.load_state_dict: {flat_key}", Tensor(flat), self._shapes())
        ws = [b.numpy().T for b in blocks[:4]]              # MegEngine's (in, out) -> PyTorch's (out, in)
        rest = {k: v for k, v in state_dict.items() if k != flat_key}
        if self._qkv_same:
            rest[prefix + "in_proj_weight"] = np.concatenate(ws[:3])
        else:
            for n, w in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), ws):
                rest[prefix + n] = w
        rest[prefix + "out_proj.weight"] = ws[3]
        if self.bias:
            rest[prefix + "in_proj_bias"] = np.concatenate([b.numpy() for b in blocks[4:7]])
            rest[prefix + "out_proj.bias"] = blocks[7].numpy()
        return rest

    def _module_info_string(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, attn_dropout={self.attn_dropout}, "
                f"out_dropout={self.out_dropout}, bias={self.bias}, kdim={self.kdim}, vdim={self.vdim}, "
                f"batch_first={self.batch_first}, weight_layout={self.weight_layout!r}")
