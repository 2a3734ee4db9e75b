"""Recurrent layers, MegEngine's ``M.RNNCell``, ``M.LSTMCell``, ``M.RNN``,
``M.LSTM`` (and ``M.GRUCell``, ``M.GRU`` as in PyTorch).

Parameters carry PyTorch's names and layouts, which are also MegEngine's
cells': ``weight_ih`` (G, input), ``weight_hh`` (G, hidden), ``bias_ih``,
``bias_hh`` (G,) for a cell, and ``weight_ih_l{k}``, ``weight_hh_l{k}``,
``bias_ih_l{k}``, ``bias_hh_l{k}`` plus ``_reverse`` for the second direction
of a layer. So a PyTorch ``state_dict`` loads as it is. MegEngine's
``M.RNN``/``M.LSTM`` keep one ``_flatten_weights`` parameter instead (per
layer and direction, in that order: weight_ih, weight_hh, bias_ih, bias_hh,
each row-major, back to back); ``load_state_dict``, of the layer or of a
model holding it, accepts that form too (its ``cells.*`` entries, unused by
MegEngine's forward, are ignored) and ``flatten_weights()`` gives it back.

Example::

    >>> lstm = M.LSTM(10, 20, num_layers=2, bidirectional=True)
    >>> out, (h_n, c_n) = lstm(x)            # x: (T, B, 10) -> out: (T, B, 40)
    >>> sorted(lstm.state_dict())[:2]
    ['bias_hh_l0', 'bias_hh_l0_reverse']
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import functional as F
from .._core import Tensor
from ..functional import rnn as _rnn
from ..tensor import Parameter
from . import init
from .module import Module, _count
from ..op import ArgumentError

__all__ = ["RNNCell", "LSTMCell", "GRUCell", "RNN", "LSTM", "GRU"]


def _as_tensor(name: str, x) -> Tensor:
    return x if isinstance(x, Tensor) else F._t(x, name=name)


class _CellBase(Module):
    """``num_chunks`` gates of ``hidden_size`` each; weights uniform in
    ±1/sqrt(hidden_size) (PyTorch's and MegEngine's init)."""

    num_chunks = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        name = type(self).__name__
        self.input_size = _count(name, "input_size", input_size)
        self.hidden_size = _count(name, "hidden_size", hidden_size, 1)
        self.bias = bool(bias)
        G = self.num_chunks * self.hidden_size
        self.gate_hidden_size = G
        self.weight_ih = Parameter(np.zeros((G, self.input_size), "float32"))
        self.weight_hh = Parameter(np.zeros((G, self.hidden_size), "float32"))
        self.bias_ih = Parameter(np.zeros(G, "float32")) if self.bias else None
        self.bias_hh = Parameter(np.zeros(G, "float32")) if self.bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every weight and bias uniform in [-1/sqrt(hidden_size), 1/sqrt(hidden_size)]."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh):
            if p is not None:
                init.uniform_(p, -bound, bound)

    def _prepare(self, x, hx, n_states: int):
        """(x as (B, I), the states as (B, H), whether x was unbatched)."""
        name = type(self).__name__
        x = _as_tensor(name, x)
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise ArgumentError(f"{name}: expected input (batch, {self.input_size}) or ({self.input_size},), "
                             f"got shape {x.shape}")
        unbatched = x.ndim == 1
        if unbatched:
            x = F.expand_dims(x, 0)
        B = x.shape[0]
        if hx is None:
            states = [F.zeros((B, self.hidden_size), dtype=x.dtype, device=x.device) for _ in range(n_states)]
        else:
            given = list(hx) if n_states > 1 else [hx]
            if len(given) != n_states:
                raise ArgumentError(f"{name}: expected {n_states} initial states, got {len(given)}")
            states = []
            for s in given:
                s = _as_tensor(name, s)
                if unbatched and s.ndim == 1:
                    s = F.expand_dims(s, 0)
                if s.shape != (B, self.hidden_size):
                    raise ArgumentError(f"{name}: expected a state of shape {(B, self.hidden_size)} for input "
                                     f"{x.shape}, got {s.shape}")
                states.append(s)
        return x, states, unbatched

    def _module_info_string(self):
        return f"{self.input_size}, {self.hidden_size}, bias={self.bias}"


class RNNCell(_CellBase):
    """An Elman RNN cell, ``h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh)``
    with act ``tanh`` or ``relu``.

    Example::

        >>> cell = M.RNNCell(10, 20)
        >>> cell(gc.tensor(np.random.randn(3, 10).astype("float32"))).shape
        (3, 20)
    """

    num_chunks = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 **kwargs):
        if nonlinearity not in ("tanh", "relu"):
            raise ArgumentError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, bias, **kwargs)

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        x, (h,), unbatched = self._prepare(input, hx, 1)
        out = F.nn.rnn_cell(x, h, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh, self.nonlinearity)
        return out[0] if unbatched else out


class LSTMCell(_CellBase):
    """A long short-term memory cell (gates i, f, g, o); ``forward(x, (h,
    c))`` returns ``(h', c')``.

    Example::

        >>> cell = M.LSTMCell(10, 20)
        >>> h, c = cell(gc.tensor(np.random.randn(3, 10).astype("float32")))
        >>> c.shape
        (3, 20)
    """

    num_chunks = 4

    def forward(self, input: Tensor, hx: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor]:
        x, (h, c), unbatched = self._prepare(input, hx, 2)
        h2, c2 = F.nn.lstm_cell(x, h, c, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return (h2[0], c2[0]) if unbatched else (h2, c2)


class GRUCell(_CellBase):
    """A gated recurrent unit cell (gates r, z, n, PyTorch's:
    ``n = tanh(x W_in + b_in + r * (h W_hn + b_hn))``, ``h' = (1 - z) n + z h``).

    Example::

        >>> cell = M.GRUCell(10, 20)
        >>> cell(gc.tensor(np.random.randn(3, 10).astype("float32"))).shape
        (3, 20)
    """

    num_chunks = 3

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        x, (h,), unbatched = self._prepare(input, hx, 1)
        out = F.nn.gru_cell(x, h, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return out[0] if unbatched else out


class _RNNBase(Module):
    """Multi-layer, optionally bidirectional recurrent layer over (T, B, I)
    input ((B, T, I) with ``batch_first``), dropout on every layer's output
    but the last's while training."""

    mode = "RNN_TANH"
    num_chunks = 1
    n_states = 1

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, **kwargs):
        super().__init__(**kwargs)
        name = type(self).__name__
        self.input_size = _count(name, "input_size", input_size)
        self.hidden_size = _count(name, "hidden_size", hidden_size, 1)
        self.num_layers = _count(name, "num_layers", num_layers, 1)
        if (not isinstance(dropout, numbers.Number) or isinstance(dropout, bool)
                or not 0 <= dropout < 1):
            raise ArgumentError(f"{name}: dropout must be a number in [0, 1), got {dropout!r}")
        if proj_size:
            raise ArgumentError(f"{name}: proj_size is not supported (give 0), got {proj_size!r}")
        self.bias, self.batch_first = bool(bias), bool(batch_first)
        self.dropout, self.bidirectional = float(dropout), bool(bidirectional)
        self.proj_size = 0
        self.num_directions = 2 if self.bidirectional else 1
        G = self.num_chunks * self.hidden_size
        self.gate_hidden_size = G
        for layer in range(self.num_layers):
            in_size = self.input_size if layer == 0 else self.hidden_size * self.num_directions
            for sfx in self._suffixes(layer):
                setattr(self, "weight_ih" + sfx, Parameter(np.zeros((G, in_size), "float32")))
                setattr(self, "weight_hh" + sfx, Parameter(np.zeros((G, self.hidden_size), "float32")))
                if self.bias:
                    setattr(self, "bias_ih" + sfx, Parameter(np.zeros(G, "float32")))
                    setattr(self, "bias_hh" + sfx, Parameter(np.zeros(G, "float32")))
        self.reset_parameters()

    def _suffixes(self, layer: int) -> List[str]:
        return [f"_l{layer}"] + ([f"_l{layer}_reverse"] if self.bidirectional else [])

    def _weights(self, layer: int, d: int):
        sfx = self._suffixes(layer)[d]
        get = lambda n: getattr(self, n + sfx, None)      # noqa: E731
        return get("weight_ih"), get("weight_hh"), get("bias_ih"), get("bias_hh")

    def _param_names(self) -> List[str]:
        """Parameter names in MegEngine's flat order: per layer and direction,
        weight_ih, weight_hh, bias_ih, bias_hh."""
        names = []
        for layer in range(self.num_layers):
            for sfx in self._suffixes(layer):
                names += [n + sfx for n in ("weight_ih", "weight_hh")]
                if self.bias:
                    names += [n + sfx for n in ("bias_ih", "bias_hh")]
        return names

    def reset_parameters(self) -> None:
        """Every weight and bias uniform in [-1/sqrt(hidden_size), 1/sqrt(hidden_size)]."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for n in self._param_names():
            p = getattr(self, n)
            init.uniform_(p, -bound, bound)

    # ---- MegEngine's flat layout
    def flatten_weights(self) -> np.ndarray:
        """The parameters as MegEngine's ``_flatten_weights``: a
        (gate_hidden_size, columns) float32 array holding, per layer and
        direction, weight_ih, weight_hh, bias_ih, bias_hh back to back.

        Example::

            >>> flat = M.LSTM(4, 3).flatten_weights()     # (12, 4 + 3 + 2)
        """
        flat = np.concatenate([getattr(self, n).numpy().reshape(-1) for n in self._param_names()])
        return flat.reshape(self.gate_hidden_size, -1)

    def _from_flat(self, flat, prefix: str = "") -> Dict[str, np.ndarray]:
        flat = np.asarray(flat.numpy() if isinstance(flat, Tensor) else flat).reshape(-1)
        want = sum(int(np.prod(getattr(self, n).shape)) for n in self._param_names())
        if flat.size != want:
            raise ArgumentError(f"{type(self).__name__}.load_state_dict: {prefix}_flatten_weights has "
                             f"{flat.size} values, this layer's parameters need {want}")
        out, pos = {}, 0
        for n in self._param_names():
            shape = getattr(self, n).shape
            size = int(np.prod(shape))
            out[prefix + n] = flat[pos:pos + size].reshape(shape)
            pos += size
        return out

    def _load_form(self, state_dict: Dict[str, Any], prefix: str) -> Dict[str, Any]:
        """MegEngine's form (``_flatten_weights``, its ``cells.*`` entries
        ignored) and PyTorch's tensors, under ``prefix``, as this layer's
        entries; ``load_state_dict`` of this layer or of a model holding it
        reads them."""
        flat_key = prefix + "_flatten_weights"
        if flat_key in state_dict:
            cells = prefix + "cells."
            rest = {k: v for k, v in state_dict.items() if k != flat_key and not k.startswith(cells)}
            rest.update(self._from_flat(state_dict[flat_key], prefix))
            return rest
        return {k: (v.detach().cpu().numpy() if k.startswith(prefix) and hasattr(v, "detach") and hasattr(v, "cpu")
                    else v) for k, v in state_dict.items()}

    # ---- forward
    def _init_states(self, x: Tensor, hx) -> list:
        name = type(self).__name__
        B = x.shape[1]
        want = (self.num_layers * self.num_directions, B, self.hidden_size)
        if hx is None:
            return [F.zeros(want, dtype=x.dtype, device=x.device) for _ in range(self.n_states)]
        given = list(hx) if self.n_states > 1 else [hx]
        if len(given) != self.n_states:
            raise ArgumentError(f"{name}: expected {self.n_states} initial states, got {len(given)}")
        out = []
        for s in given:
            s = _as_tensor(name, s)
            if s.shape != want:
                raise ArgumentError(f"{name}: expected an initial state of shape {want} (num_layers * "
                                 f"num_directions, batch, hidden_size) for input {x.shape}, got {s.shape}")
            out.append(s)
        return out

    def forward(self, input: Tensor, hx=None):
        name = type(self).__name__
        x = _as_tensor(name, input)
        if x.ndim not in (2, 3) or x.shape[-1] != self.input_size:
            raise ArgumentError(f"{name}: expected input (seq_len, batch, {self.input_size})"
                             f"{' with batch_first: (batch, seq_len, ...)' if self.batch_first else ''} "
                             f"or (seq_len, {self.input_size}), got shape {x.shape}")
        unbatched = x.ndim == 2
        if unbatched:
            x = F.expand_dims(x, 1)
            if hx is not None:
                hx = tuple(F.expand_dims(_as_tensor(name, s), 1) for s in hx) if self.n_states > 1 \
                    else F.expand_dims(_as_tensor(name, hx), 1)
        elif self.batch_first:
            x = F.transpose(x, (1, 0, 2))
        if x.shape[0] == 0:
            raise ArgumentError(f"{name}: the sequence is empty (input shape {tuple(input.shape)})")
        states = self._init_states(x, hx)
        from ..ops.shape import Unstack
        from .._core import apply
        n = self.num_layers * self.num_directions
        per = [apply(Unstack(0, n), s) for s in states]
        hs, cs = [], []
        for layer in range(self.num_layers):
            outs = []
            for d in range(self.num_directions):
                k = layer * self.num_directions + d
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, d)
                out, h, c = _rnn.rnn_layer(self.mode, x, per[0][k], per[1][k] if self.n_states > 1 else None,
                                           w_ih, w_hh, b_ih, b_hh, reverse=d == 1)
                outs.append(out)
                hs.append(h)
                cs.append(c)
            x = outs[0] if len(outs) == 1 else F.concat(outs, axis=2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        h_n = F.stack(hs, 0)
        out = x
        if unbatched:
            out, h_n = out[:, 0], h_n[:, 0]
        elif self.batch_first:
            out = F.transpose(out, (1, 0, 2))
        if self.n_states == 1:
            return out, h_n
        c_n = F.stack(cs, 0)
        return out, (h_n, c_n[:, 0] if unbatched else c_n)

    def _module_info_string(self):
        s = f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"
        for attr, default in (("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False)):
            if getattr(self, attr) != default:
                s += f", {attr}={getattr(self, attr)}"
        return s


class RNN(_RNNBase):
    """A multi-layer Elman RNN (``nonlinearity`` "tanh" or "relu"):
    ``forward(input, h_0=None)`` returns ``(output, h_n)``; output (T, B,
    D * hidden) ((B, T, ...) with ``batch_first``), h_n (D * num_layers, B,
    hidden).

    Example::

        >>> rnn = M.RNN(10, 20, 2, bidirectional=True)
        >>> out, h_n = rnn(gc.tensor(np.random.randn(6, 3, 10).astype("float32")))
        >>> out.shape, h_n.shape
        ((6, 3, 40), (4, 3, 20))
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, **kwargs):
        if nonlinearity not in ("tanh", "relu"):
            raise ArgumentError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.nonlinearity = nonlinearity
        self.mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         **kwargs)


class LSTM(_RNNBase):
    """A multi-layer LSTM: ``forward(input, (h_0, c_0)=None)`` returns
    ``(output, (h_n, c_n))``. Each layer and direction is a matrix product
    (the input projection of every step) and one op for the recurrence
    (``LSTMLayer``).

    Example::

        >>> lstm = M.LSTM(10, 20, batch_first=True)
        >>> out, (h_n, c_n) = lstm(gc.tensor(np.random.randn(3, 6, 10).astype("float32")))
        >>> out.shape, c_n.shape
        ((3, 6, 20), (1, 3, 20))
    """

    mode = "LSTM"
    num_chunks = 4
    n_states = 2


class GRU(_RNNBase):
    """A multi-layer GRU (PyTorch's gates): ``forward(input, h_0=None)``
    returns ``(output, h_n)``.

    Example::

        >>> gru = M.GRU(10, 20, num_layers=2, dropout=0.1)
        >>> out, h_n = gru(gc.tensor(np.random.randn(6, 3, 10).astype("float32")))
        >>> h_n.shape
        (2, 3, 20)
    """

    mode = "GRU"
    num_chunks = 3
