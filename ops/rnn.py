"""Recurrent cells' gate math as fused ops, one op per time step.

The matrix products of a recurrent layer (``x @ W_ih.T`` for the whole
sequence at once, ``h @ W_hh.T`` per step) are ordinary ``MatrixMul``s; what
is left per step, the gate nonlinearities and the state update, runs here
as ONE op with a CPU (NumPy) and a CUDA kernel, and one backward op:

- ``LSTMCellGates``: (gx, gh, c) -> (h', c'), gx and gh the (B, 4H)
  pre-activations of the gates i, f, g, o (PyTorch's order) from the input
  and from the hidden state (biases included), c the (B, H) cell state;
- ``LSTMCellGatesBackward``: (gx, gh, c, dh', dc') -> (d gates, dc);
- ``GRUCellGates``: (gx, gh, h) -> h', gates r, z, n (PyTorch's order, with
  ``n = tanh(gx_n + r * gh_n)``: gh carries b_hh);
- ``GRUCellGatesBackward``: (gx, gh, h, dh') -> (dgx, dgh, dh).

The forward ops' gradients are their backward ops (``vjp``); the backward
ops are declared by decomposition too, so second-order gradients work.

Example::

    >>> import numpy as np, gradcore as gc
    >>> from gradcore.core import apply
    >>> gx = gc.tensor(np.zeros((1, 4)), dtype="float64")
    >>> h, c = apply(LSTMCellGates(), gx, gx, gc.tensor([[1.0]], dtype="float64"))
    >>> float(c.item())             # f * c + i * g with f = i = 0.5, g = 0
    0.5
"""
from __future__ import annotations

import numpy as np

from gradcore._core import apply
from gradcore.op import Op, TensorDesc
from gradcore.cuda.kernels import Kernel

from .elemwise import Elemwise
from .shape import Concat, Split

__all__ = ["LSTMCellGates", "LSTMCellGatesBackward", "GRUCellGates", "GRUCellGatesBackward"]


def _ap(op, *xs):
    out = apply(op, *xs)
    return out[0] if len(out) == 1 else out


def _sig(x):
    return _ap(Elemwise("sigmoid"), x)


def _tanh(x):
    return _ap(Elemwise("tanh"), x)


def _np_sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _check_cell(op, gates, what, *descs, k):
    """Every input of one floating-point dtype; the gate inputs (B, k*H),
    the states (B, H)."""
    for d in descs:
        if d.dtype.kind != "f" or d.dtype != descs[0].dtype:
            raise op.error("needs inputs of one floating-point dtype, got "
                           + ", ".join(str(x.dtype) for x in descs), *descs)
    if any(d.shape is None for d in descs):
        return
    for d in descs:
        if d.ndim != 2:
            raise op.error(f"every input must be 2-D (batch, features); {what}", *descs)
    B, G = descs[0].shape
    if G % k:
        raise op.error(f"the gate inputs must be (batch, {k} * hidden), got {descs[0].shape}; {what}", *descs)
    H = G // k
    for i, d in enumerate(descs):
        want = (B, G) if i < gates else (B, H)
        if tuple(d.shape) != want:
            raise op.error(f"input {i} must be {want}; {what}", *descs)


def _launch(op, be, n, outs, *arrays):
    """Allocate ``outs`` (shapes) like arrays[0], run op's kernel, one thread
    per (batch, hidden) element: args (inputs..., outputs..., n, H)."""
    x = arrays[0]
    if x.dtype not in (np.float32, np.float64):
        raise op.error(f"the CUDA kernel takes float32 or float64, got {x.dtype}",
                       *(TensorDesc(a.shape, a.dtype, "cuda") for a in arrays))
    ys = [be.empty(s, x.dtype) for s in outs]
    H = outs[-1][1] if outs[-1][1] else 1
    if n:
        be.launch_n(be.kernel(op, be.ctype(x.dtype)), n, *arrays, *ys, n, H)
    return ys[0] if len(ys) == 1 else tuple(ys)


# the kernels: one thread per (batch, hidden) element, n = B * H of them;
# ``base`` is the element's first gate in (B, k * H), gate k at base + k * H
_SIGMOID = """
#ifndef GC_SIGMOID
#define GC_SIGMOID
template <class V> __device__ __forceinline__ V gc_sigmoid(V z) { return (V)1 / ((V)1 + exp(-z)); }
#endif
"""
_LSTM = Kernel("lstmcellgates", "const T* __restrict__ gx, const T* __restrict__ gh, const T* __restrict__ c, "
               "T* __restrict__ h2, T* __restrict__ c2, long long n, long long H", """
    const long long base = idx / H * 4 * H + idx % H;
    const T i = gc_sigmoid(gx[base] + gh[base]);
    const T f = gc_sigmoid(gx[base + H] + gh[base + H]);
    const T g = tanh(gx[base + 2 * H] + gh[base + 2 * H]);
    const T o = gc_sigmoid(gx[base + 3 * H] + gh[base + 3 * H]);
    const T cn = f * c[idx] + i * g;
    c2[idx] = cn;
    h2[idx] = o * tanh(cn);""", over="n")
_LSTM_BACKWARD = Kernel("lstmcellgatesbackward", "const T* __restrict__ gx, const T* __restrict__ gh, "
                        "const T* __restrict__ c, const T* __restrict__ dh, const T* __restrict__ dc, "
                        "T* __restrict__ dz, T* __restrict__ dcp, long long n, long long H", """
    const long long base = idx / H * 4 * H + idx % H;
    const T i = gc_sigmoid(gx[base] + gh[base]);
    const T f = gc_sigmoid(gx[base + H] + gh[base + H]);
    const T g = tanh(gx[base + 2 * H] + gh[base + 2 * H]);
    const T o = gc_sigmoid(gx[base + 3 * H] + gh[base + 3 * H]);
    const T tc = tanh(f * c[idx] + i * g);
    const T dct = dc[idx] + dh[idx] * o * ((T)1 - tc * tc);
    dz[base] = dct * g * i * ((T)1 - i);
    dz[base + H] = dct * c[idx] * f * ((T)1 - f);
    dz[base + 2 * H] = dct * i * ((T)1 - g * g);
    dz[base + 3 * H] = dh[idx] * tc * o * ((T)1 - o);
    dcp[idx] = dct * f;""", over="n")
_GRU = Kernel("grucellgates", "const T* __restrict__ gx, const T* __restrict__ gh, const T* __restrict__ h, "
              "T* __restrict__ h2, long long n, long long H", """
    const long long base = idx / H * 3 * H + idx % H;
    const T r = gc_sigmoid(gx[base] + gh[base]);
    const T z = gc_sigmoid(gx[base + H] + gh[base + H]);
    const T nn = tanh(gx[base + 2 * H] + r * gh[base + 2 * H]);
    h2[idx] = ((T)1 - z) * nn + z * h[idx];""", over="n")
_GRU_BACKWARD = Kernel("grucellgatesbackward", "const T* __restrict__ gx, const T* __restrict__ gh, "
                       "const T* __restrict__ h, const T* __restrict__ dh, T* __restrict__ dgx, T* __restrict__ dgh, "
                       "T* __restrict__ dhp, long long n, long long H", """
    const long long base = idx / H * 3 * H + idx % H;
    const T r = gc_sigmoid(gx[base] + gh[base]);
    const T z = gc_sigmoid(gx[base + H] + gh[base + H]);
    const T ghn = gh[base + 2 * H];
    const T nn = tanh(gx[base + 2 * H] + r * ghn);
    const T d = dh[idx];
    const T dan = d * ((T)1 - z) * ((T)1 - nn * nn);
    const T dar = dan * ghn * r * ((T)1 - r);
    const T daz = d * (h[idx] - nn) * z * ((T)1 - z);
    dgx[base] = dar; dgx[base + H] = daz; dgx[base + 2 * H] = dan;
    dgh[base] = dar; dgh[base + H] = daz; dgh[base + 2 * H] = dan * r;
    dhp[idx] = d * z;""", over="n")


# ---------------------------------------------------------------- LSTM
class LSTMCellGates(Op):
    """(gx, gh, c) -> (h', c'): z = gx + gh (B, 4H), gates i, f, g, o =
    sigmoid, sigmoid, tanh, sigmoid of its four column blocks;
    c' = f * c + i * g, h' = o * tanh(c')."""
    name = "LSTMCellGates"
    devices = ("cpu", "cuda")

    @classmethod
    def examples(cls):
        """Sample inputs for ``check_op``: batch 2, hidden 3."""
        rng = np.random.default_rng(0)
        return [(cls(), [rng.standard_normal((2, 12)), rng.standard_normal((2, 12)),
                         rng.standard_normal((2, 3))])]

    def infer(self, gx, gh, c):
        _check_cell(self, 2, "gx, gh: (batch, 4 * hidden), c: (batch, hidden)", gx, gh, c, k=4)
        return (TensorDesc(c.shape, c.dtype, c.device), TensorDesc(c.shape, c.dtype, c.device))

    def cpu(self, gx, gh, c):
        z = gx + gh
        H = c.shape[1]
        s = _np_sigmoid(z)
        i, f, o = s[:, :H], s[:, H:2 * H], s[:, 3 * H:]
        g = np.tanh(z[:, 2 * H:3 * H])
        c2 = f * c + i * g
        return o * np.tanh(c2), c2

    def vjp(self, inputs, outputs, grads):
        (gx, gh, c), (h2, c2), (dh, dc) = inputs, outputs, grads
        from .shape import ZerosLike
        dh = _ap(ZerosLike(), h2) if dh is None else dh
        dc = _ap(ZerosLike(), c2) if dc is None else dc
        dz, dcp = apply(LSTMCellGatesBackward(), gx, gh, c, dh, dc)
        return [dz, dz, dcp]

    def cuda(self, be, gx, gh, c):
        return _launch(self, be, c.size, [c.shape, c.shape], gx, gh, c)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_lstmcellgates_<ctype>(gx, gh, c, h2, c2, n, H)``: one thread
        per (batch, hidden) element, n = B * H."""
        return _LSTM.source(ctype, helpers=_SIGMOID)



class LSTMCellGatesBackward(Op):
    """(gx, gh, c, dh', dc') -> (dz, dc): the backward of LSTMCellGates (the
    gates recomputed from gx + gh); dz is the gradient of both gx and gh."""
    name = "LSTMCellGatesBackward"
    devices = ("cpu", "cuda")

    @classmethod
    def examples(cls):
        """Sample inputs for ``check_op``: batch 2, hidden 3."""
        rng = np.random.default_rng(1)
        return [(cls(), [rng.standard_normal(s) for s in ((2, 12), (2, 12), (2, 3), (2, 3), (2, 3))])]

    def infer(self, gx, gh, c, dh, dc):
        _check_cell(self, 2, "gx, gh: (batch, 4 * hidden), c, dh, dc: (batch, hidden)", gx, gh, c, dh, dc, k=4)
        return (TensorDesc(gx.shape, gx.dtype, gx.device), TensorDesc(c.shape, c.dtype, c.device))

    def cpu(self, gx, gh, c, dh, dc):
        z = gx + gh
        H = c.shape[1]
        s = _np_sigmoid(z)
        i, f, o = s[:, :H], s[:, H:2 * H], s[:, 3 * H:]
        g = np.tanh(z[:, 2 * H:3 * H])
        tc = np.tanh(f * c + i * g)
        dct = dc + dh * o * (1 - tc * tc)
        dz = np.empty_like(z)
        dz[:, :H] = dct * g * i * (1 - i)
        dz[:, H:2 * H] = dct * c * f * (1 - f)
        dz[:, 2 * H:3 * H] = dct * i * (1 - g * g)
        dz[:, 3 * H:] = dh * tc * o * (1 - o)
        return dz, dct * f

    def decompose(self, gx, gh, c, dh, dc):
        zi, zf, zg, zo = _ap(Split(1, 4), gx + gh)
        i, f, g, o = _sig(zi), _sig(zf), _tanh(zg), _sig(zo)
        tc = _tanh(f * c + i * g)
        dct = dc + dh * o * (1 - tc * tc)
        dz = _ap(Concat(1), dct * g * i * (1 - i), dct * c * f * (1 - f), dct * i * (1 - g * g),
                 dh * tc * o * (1 - o))
        return dz, dct * f

    def cuda(self, be, gx, gh, c, dh, dc):
        return _launch(self, be, c.size, [gx.shape, c.shape], gx, gh, c, dh, dc)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_lstmcellgatesbackward_<ctype>(gx, gh, c, dh, dc, dz, dcp, n, H)``:
        one thread per (batch, hidden) element, n = B * H."""
        return _LSTM_BACKWARD.source(ctype, helpers=_SIGMOID)



# ---------------------------------------------------------------- GRU
class GRUCellGates(Op):
    """(gx, gh, h) -> h': gx = x W_ih^T + b_ih and gh = h W_hh^T + b_hh, both
    (B, 3H) in blocks r, z, n; r = sigmoid(gx_r + gh_r), z = sigmoid(gx_z +
    gh_z), n = tanh(gx_n + r * gh_n), h' = (1 - z) * n + z * h (PyTorch's)."""
    name = "GRUCellGates"
    devices = ("cpu", "cuda")

    @classmethod
    def examples(cls):
        """Sample inputs for ``check_op``: batch 2, hidden 3."""
        rng = np.random.default_rng(2)
        return [(cls(), [rng.standard_normal((2, 9)), rng.standard_normal((2, 9)), rng.standard_normal((2, 3))])]

    def infer(self, gx, gh, h):
        _check_cell(self, 2, "gx, gh: (batch, 3 * hidden), h: (batch, hidden)", gx, gh, h, k=3)
        return (TensorDesc(h.shape, h.dtype, h.device),)

    def cpu(self, gx, gh, h):
        H = h.shape[1]
        rz = _np_sigmoid(gx[:, :2 * H] + gh[:, :2 * H])
        r, z = rz[:, :H], rz[:, H:]
        n = np.tanh(gx[:, 2 * H:] + r * gh[:, 2 * H:])
        return (1 - z) * n + z * h

    def vjp(self, inputs, outputs, grads):
        (gx, gh, h), (dh2,) = inputs, grads
        return list(apply(GRUCellGatesBackward(), gx, gh, h, dh2))

    def cuda(self, be, gx, gh, h):
        return _launch(self, be, h.size, [h.shape], gx, gh, h)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_grucellgates_<ctype>(gx, gh, h, h2, n, H)``: one thread per
        (batch, hidden) element, n = B * H."""
        return _GRU.source(ctype, helpers=_SIGMOID)



class GRUCellGatesBackward(Op):
    """(gx, gh, h, dh') -> (dgx, dgh, dh): the backward of GRUCellGates (the
    gates recomputed)."""
    name = "GRUCellGatesBackward"
    devices = ("cpu", "cuda")

    @classmethod
    def examples(cls):
        """Sample inputs for ``check_op``: batch 2, hidden 3."""
        rng = np.random.default_rng(3)
        return [(cls(), [rng.standard_normal(s) for s in ((2, 9), (2, 9), (2, 3), (2, 3))])]

    def infer(self, gx, gh, h, dh2):
        _check_cell(self, 2, "gx, gh: (batch, 3 * hidden), h, dh: (batch, hidden)", gx, gh, h, dh2, k=3)
        return (TensorDesc(gx.shape, gx.dtype, gx.device), TensorDesc(gh.shape, gh.dtype, gh.device),
                TensorDesc(h.shape, h.dtype, h.device))

    def cpu(self, gx, gh, h, dh2):
        H = h.shape[1]
        rz = _np_sigmoid(gx[:, :2 * H] + gh[:, :2 * H])
        r, z = rz[:, :H], rz[:, H:]
        ghn = gh[:, 2 * H:]
        n = np.tanh(gx[:, 2 * H:] + r * ghn)
        dan = dh2 * (1 - z) * (1 - n * n)
        dar = dan * ghn * r * (1 - r)
        daz = dh2 * (h - n) * z * (1 - z)
        dgx = np.concatenate([dar, daz, dan], axis=1)
        dgh = np.concatenate([dar, daz, dan * r], axis=1)
        return dgx, dgh, dh2 * z

    def decompose(self, gx, gh, h, dh2):
        xr, xz, xn = _ap(Split(1, 3), gx)
        hr, hz, hn = _ap(Split(1, 3), gh)
        r, z = _sig(xr + hr), _sig(xz + hz)
        n = _tanh(xn + r * hn)
        dan = dh2 * (1 - z) * (1 - n * n)
        dar = dan * hn * r * (1 - r)
        daz = dh2 * (h - n) * z * (1 - z)
        return _ap(Concat(1), dar, daz, dan), _ap(Concat(1), dar, daz, dan * r), dh2 * z

    def cuda(self, be, gx, gh, h, dh2):
        return _launch(self, be, h.size, [gx.shape, gh.shape, h.shape], gx, gh, h, dh2)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_grucellgatesbackward_<ctype>(gx, gh, h, dh, dgx, dgh, dhp, n, H)``:
        one thread per (batch, hidden) element, n = B * H."""
        return _GRU_BACKWARD.source(ctype, helpers=_SIGMOID)

