"""Recurrent cells and layers as functions (``F.nn.rnn_cell``,
``F.nn.lstm_cell``, ``F.nn.gru_cell``; ``M.RNN``/``M.LSTM``/``M.GRU`` run
``rnn_layer`` per layer and direction). Weights in PyTorch's (and
MegEngine's) layout: ``w_ih`` (G, input), ``w_hh`` (G, hidden), biases (G,),
G = gates * hidden, gates in the order i, f, g, o (LSTM) and r, z, n (GRU).

The gate math of one step is one fused op (ops/rnn.py: ``LSTMCellGates``,
``GRUCellGates``); the input projection of a whole sequence is one matrix
product, so a step costs a matrix product and a fused cell op. An LSTM
layer runs its whole recurrence as ONE op (``LSTMLayer``, and one backward
op): the tape holds a few nodes per layer and direction whatever the
sequence's length, and the backward's weight gradients are one matrix
product each over all the steps.

Example::

    >>> import numpy as np, gradcore as gc, gradcore.functional as F
    >>> x, h, c = (gc.tensor(np.zeros((2, 3))) for _ in range(3))
    >>> w_ih, w_hh = gc.tensor(np.zeros((12, 3))), gc.tensor(np.zeros((12, 3)))
    >>> h1, c1 = F.nn.lstm_cell(x, h, c, w_ih, w_hh)
    >>> h1.shape
    (2, 3)
"""
from __future__ import annotations

import functools
from typing import List, Optional, Sequence, Tuple

from .._core import Tensor, apply as _apply
from ..dtypes import promote_types
from ..op import OpError
from ..ops.rnn import GRUCellGates, LSTMCellGates, LSTMLayer
from ..ops.shape import Unstack
from ._args import _t
from .elemwise_table import relu, tanh
from .linalg import matmul
from .shape import astype, reshape, stack
from ..op import ArgumentError

__all__ = ["rnn_cell", "lstm_cell", "gru_cell", "rnn_layer"]

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _check(name: str, x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, gates: int, xshape=None) -> None:
    """x (batch, input) (or ``xshape``, a step's shape), h (batch, hidden),
    weights (gates * hidden, input) and (gates * hidden, hidden)."""
    xs = tuple(x.shape) if xshape is None else xshape
    if len(xs) != 2 or h.ndim != 2 or w_ih.ndim != 2 or w_hh.ndim != 2:
        raise ArgumentError(f"{name}: expected input (batch, input_size), state (batch, hidden_size) and 2-d "
                         f"weights, got shapes {xs}, {h.shape}, {w_ih.shape}, {w_hh.shape}")
    H = h.shape[1]
    if w_ih.shape != (gates * H, xs[1]) or w_hh.shape != (gates * H, H) or h.shape[0] != xs[0]:
        raise ArgumentError(f"{name}: for input {xs} and state {h.shape}, w_ih must be "
                         f"{(gates * H, xs[1])} and w_hh {(gates * H, H)}, got {w_ih.shape} and "
                         f"{w_hh.shape}")


def _proj(x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
    out = matmul(x, w, transpose_b=True)
    return out if b is None else out + b


def _bias_sum(b_ih: Optional[Tensor], b_hh: Optional[Tensor]) -> Optional[Tensor]:
    if b_ih is None:
        return b_hh
    return b_ih if b_hh is None else b_ih + b_hh


def rnn_cell(inp: Tensor, hx: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Optional[Tensor] = None,
             b_hh: Optional[Tensor] = None, nonlinearity: str = "tanh") -> Tensor:
    """One Elman RNN step: ``act(inp @ w_ih.T + b_ih + hx @ w_hh.T + b_hh)``,
    act ``tanh`` or ``relu``.

    Example::

        >>> x, h = gc.tensor([[1.0, 2.0]]), gc.tensor([[0.0]])
        >>> w_ih, w_hh = gc.tensor([[1.0, -1.0]]), gc.tensor([[1.0]])
        >>> F.nn.rnn_cell(x, h, w_ih, w_hh, nonlinearity="relu").numpy()     # relu(1 - 2 + 0)
        array([[0.]], dtype=float32)
        >>> F.nn.rnn_cell(x, h, w_ih, w_hh).numpy().round(4)                 # tanh(-1)
        array([[-0.7616]], dtype=float32)
    """
    x, h, wi, wh = _t(inp), _t(hx), _t(w_ih), _t(w_hh)
    if nonlinearity not in ("tanh", "relu"):
        raise ArgumentError(f"rnn_cell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    _check("rnn_cell", x, h, wi, wh, 1)
    z = _proj(x, wi, _bias_sum(b_ih, b_hh)) + matmul(h, wh, transpose_b=True)
    return tanh(z) if nonlinearity == "tanh" else relu(z)


def lstm_cell(inp: Tensor, hx: Tensor, cx: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Optional[Tensor] = None,
              b_hh: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """One LSTM step (PyTorch's gates i, f, g, o): returns ``(h', c')``.

    Example::

        >>> x, h = gc.tensor(np.ones((2, 3), "float32")), gc.tensor(np.zeros((2, 4), "float32"))
        >>> c = gc.tensor(np.ones((2, 4), "float32"))
        >>> w_ih, w_hh = gc.tensor(np.zeros((16, 3), "float32")), gc.tensor(np.zeros((16, 4), "float32"))
        >>> h1, c1 = F.nn.lstm_cell(x, h, c, w_ih, w_hh)     # zero weights: gates 0.5, g = 0
        >>> c1.numpy()[0], h1.shape     # c' = f * c + i * g
        (array([0.5, 0.5, 0.5, 0.5], dtype=float32), (2, 4))
    """
    x, h, c, wi, wh = _t(inp), _t(hx), _t(cx), _t(w_ih), _t(w_hh)
    _check("lstm_cell", x, h, wi, wh, 4)
    h2, c2 = _apply(LSTMCellGates(), _proj(x, wi, _bias_sum(b_ih, b_hh)), matmul(h, wh, transpose_b=True), c)
    return h2, c2


def gru_cell(inp: Tensor, hx: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Optional[Tensor] = None,
             b_hh: Optional[Tensor] = None) -> Tensor:
    """One GRU step (PyTorch's gates r, z, n; ``n = tanh(x W_in + b_in + r *
    (h W_hn + b_hn))``): returns ``h'``.

    Example::

        >>> x, h = gc.tensor(np.ones((2, 3), "float32")), gc.tensor(np.ones((2, 4), "float32"))
        >>> w_ih, w_hh = gc.tensor(np.zeros((12, 3), "float32")), gc.tensor(np.zeros((12, 4), "float32"))
        >>> F.nn.gru_cell(x, h, w_ih, w_hh).numpy()     # zero weights: z = 0.5, n = 0, so h' = h / 2
        array([[0.5, 0.5, 0.5, 0.5],
               [0.5, 0.5, 0.5, 0.5]], dtype=float32)
    """
    x, h, wi, wh = _t(inp), _t(hx), _t(w_ih), _t(w_hh)
    _check("gru_cell", x, h, wi, wh, 3)
    return _apply(GRUCellGates(), _proj(x, wi, b_ih), _proj(h, wh, b_hh), h)[0]


def rnn_layer(mode: str, inp: Tensor, h0: Tensor, c0: Optional[Tensor], w_ih: Tensor, w_hh: Tensor,
              b_ih: Optional[Tensor] = None, b_hh: Optional[Tensor] = None,
              reverse: bool = False) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """One direction of one recurrent layer over a sequence ``inp`` (T, B, I):
    returns ``(output (T, B, H), h_n, c_n)`` (c_n None but for "LSTM").
    ``mode``: "RNN_TANH", "RNN_RELU", "LSTM" or "GRU"; ``reverse`` runs the
    sequence backwards (the ``_reverse`` direction of a bidirectional
    layer), its outputs still in time order.

    Example::

        >>> x = gc.tensor(np.ones((5, 2, 3), "float32"))     # (T, B, I)
        >>> h0 = gc.tensor(np.zeros((2, 4), "float32"))
        >>> w_ih, w_hh = gc.tensor(np.full((4, 3), 0.1, "float32")), gc.tensor(np.full((4, 4), 0.1, "float32"))
        >>> out, h_n, c_n = F.nn.rnn_layer("RNN_TANH", x, h0, None, w_ih, w_hh)
        >>> out.shape, h_n.shape, c_n
        ((5, 2, 4), (2, 4), None)
    """
    if mode not in _GATES:
        raise ArgumentError(f"rnn_layer: mode must be one of {sorted(_GATES)}, got {mode!r}")
    x, h, wi, wh = _t(inp), _t(h0), _t(w_ih), _t(w_hh)
    if x.ndim != 3:
        raise ArgumentError(f"rnn_layer: expected input (seq_len, batch, input_size), got shape {x.shape}")
    T, B, _ = x.shape
    _check(f"rnn_layer ({mode})", x, h, wi, wh, _GATES[mode], xshape=(B, x.shape[2]))
    if T == 0:
        raise ArgumentError(f"rnn_layer: the sequence is empty (input shape {x.shape})")
    # the input projection of every step in one product (for LSTM and the
    # plain RNN both biases go here; GRU's b_hh stays inside r * (...))
    bias = b_ih if mode == "GRU" else _bias_sum(b_ih, b_hh)
    gx = _proj(reshape(x, (T * B, x.shape[2])), wi, bias)
    c = _t(c0) if c0 is not None else None
    if mode == "LSTM" and c is None:
        raise ArgumentError("rnn_layer: LSTM needs the initial cell state c0")
    if mode == "LSTM":
        return _lstm_layer(reshape(gx, (T, B, gx.shape[1])), h, c, wh, reverse)
    steps = _apply(Unstack(0, T), reshape(gx, (T, B, gx.shape[1])))
    outs: List[Optional[Tensor]] = [None] * T
    for t in (reversed(range(T)) if reverse else range(T)):
        if mode == "GRU":
            h = _apply(GRUCellGates(), steps[t], _proj(h, wh, b_hh), h)[0]
        else:
            z = steps[t] + matmul(h, wh, transpose_b=True)
            h = tanh(z) if mode == "RNN_TANH" else relu(z)
        outs[t] = h
    return stack(outs, 0), h, None


def _lstm_layer(gx: Tensor, h0: Tensor, c0: Tensor, w_hh: Tensor, reverse: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """The recurrence of one LSTM layer as one ``LSTMLayer`` op on the gate
    inputs gx (T, B, 4H): (every step's h, the last step's h and c)."""
    T = gx.shape[0]
    # the op takes one dtype: the operands promoted to a common one, as the
    # matrix products around them promote (float64 input, float32 weights)
    dtype = functools.reduce(promote_types, (x.dtype for x in (h0, c0, w_hh)), gx.dtype)
    gx, h0, c0, w_hh = (x if x.dtype == dtype else astype(x, dtype) for x in (gx, h0, c0, w_hh))
    hs, cs, _gates = _apply(LSTMLayer(T, reverse), gx, h0, c0, w_hh)
    last = 0 if reverse else T - 1
    return hs, hs[last], cs[last]
