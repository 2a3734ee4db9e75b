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

import contextlib

import numpy as np

from gradcore._core import apply
from gradcore.cpu import blas
from gradcore.op import Composite, Op, TensorDesc
from gradcore.cuda.kernels import Kernel

from .elemwise import Elemwise
from .linalg import MatrixMul, gemm_rows
from .reduce import op_int
from .shape import Concat, Split, Stack, Unstack, ZerosLike

__all__ = ["LSTMCellGates", "LSTMCellGatesBackward", "GRUCellGates", "GRUCellGatesBackward", "LSTMLayer",
           "LSTMLayerBackward"]


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


def _np_lstm_gates(gx, gh, H):
    """The LSTM gates i, f, g, o of z = gx + gh (B, 4H) on the cpu."""
    z = gx + gh
    s = _np_sigmoid(z)
    return s[:, :H], s[:, H:2 * H], np.tanh(z[:, 2 * H:3 * H]), s[:, 3 * H:]


def _np_gru_rz(gx, gh, H):
    """The GRU gates r, z of gx + gh (B, 3H) on the cpu."""
    rz = _np_sigmoid(gx[:, :2 * H] + gh[:, :2 * H])
    return rz[:, :H], rz[:, H:]


def _check_one_float_dtype(op, descs):
    """Every input of one floating-point dtype, or an error naming them."""
    for d in descs:
        if d.dtype.kind != "f" or d.dtype != descs[0].dtype:
            raise op.error("needs inputs of one floating-point dtype, got "
                           + ", ".join(str(x.dtype) for x in descs), *descs)


def _check_cell(op, gates, what, *descs, k):
    """Every input of one floating-point dtype; the gate inputs (B, k*H),
    the states (B, H)."""
    _check_one_float_dtype(op, descs)
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
    _cuda_float(op, *arrays)
    x = arrays[0]
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
    reduce_broadcast = False
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
        i, f, g, o = _np_lstm_gates(gx, gh, c.shape[1])
        c2 = f * c + i * g
        return o * np.tanh(c2), c2

    def vjp(self, inputs, outputs, grads):
        dh, dc = (_ap(ZerosLike(), o) if g is None else g for o, g in zip(outputs, grads))
        dz, dcp = apply(LSTMCellGatesBackward(), *inputs, dh, dc)
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
        H = c.shape[1]
        i, f, g, o = _np_lstm_gates(gx, gh, H)
        tc = np.tanh(f * c + i * g)
        dct = dc + dh * o * (1 - tc * tc)
        dz = np.empty_like(gx)
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
    reduce_broadcast = False
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
        r, z = _np_gru_rz(gx, gh, H)
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
        r, z = _np_gru_rz(gx, gh, H)
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


# ---------------------------------------------------------------- LSTM, a whole layer
# One op for the recurrence of a whole sequence: the tape holds one node
# per layer and direction instead of ~10 per step, the per-step work runs in
# preallocated (T, B, ...) buffers with no op dispatch, and the backward
# computes the recurrent weight's gradient as ONE GEMM over every step,
# sum_t dz_t^T h_{t-1} = dZ^T (T*B, 4H) @ H_prev (T*B, H), where a chain of
# per-step ops made T small GEMMs and T accumulations.
# the per-step GEMMs of a layer op run on one BLAS thread when they are at
# most this many multiply-adds (B * 4H * H; LSTM(256, 256) at batch 32 is
# 2^23): a chain of small products joins its threads once per step, which
# costs far more than the split gains where the cores are busy with other
# work (gradcore/cpu/blas.py gives the measurements; at batch 128, 2^25, one
# thread was 3x faster too at load 5). Larger products keep every thread:
# the join costs less next to their work and threads gain more on a quiet
# machine (a judgment: not measured quiet here). 0: never
SMALL_GEMM = 1 << 24


def _step_scope(B: int, G: int, H: int):
    """The BLAS scope of a layer op's per-step products (see SMALL_GEMM)."""
    return blas.single_threaded() if B * G * H <= SMALL_GEMM else contextlib.nullcontext()


def _layer_steps(T: int, reverse: bool):
    """The order the recurrence visits the time steps."""
    return range(T - 1, -1, -1) if reverse else range(T)


def _check_layer(op, descs, what):
    """One floating-point dtype; (T, B, 4H) sequences with T = op.steps and
    (B, H) states for the shapes named in ``what``: a list of "seq4", "seq",
    "state" or "w" per input."""
    _check_one_float_dtype(op, descs)
    if any(d.shape is None for d in descs):
        return
    seq4 = next((d for d, k in zip(descs, what) if k == "seq4"), None)
    if seq4.ndim != 3 or seq4.shape[0] != op.steps or seq4.shape[2] % 4:
        raise op.error(f"the gates must be (steps={op.steps}, batch, 4 * hidden), got {seq4.shape}", *descs)
    T, B, G = seq4.shape
    H = G // 4
    want = {"seq4": (T, B, G), "seq": (T, B, H), "state": (B, H), "w": (G, H)}
    names = {"seq4": "(steps, batch, 4 * hidden)", "seq": "(steps, batch, hidden)", "state": "(batch, hidden)",
             "w": "(4 * hidden, hidden)"}
    for i, (d, k) in enumerate(zip(descs, what)):
        if tuple(d.shape) != want[k]:
            raise op.error(f"input {i} must be {names[k]} = {want[k]}, got {d.shape}", *descs)


def _sigmoid_(x):
    """x := sigmoid(x) in place (overflow of exp(-x) gives the right 0)."""
    np.negative(x, out=x)
    np.exp(x, out=x)
    x += 1
    np.reciprocal(x, out=x)


def _lstm_layer_cpu(reverse, gx, h0, c0, w):
    T, B, G = gx.shape
    H = G // 4
    dt = gx.dtype
    gates, hs, cs = np.empty((T, B, G), dt), np.empty((T, B, H), dt), np.empty((T, B, H), dt)
    # h @ w.T with w.T as a contiguous copy: OpenBLAS runs these (B, H) @ (H, 4H)
    # products about 30% faster than on the transposed view (measured at
    # B=32, H=256), which pays for the copy many times over a sequence
    wt = np.ascontiguousarray(w.T)
    tmp = np.empty((B, H), dt)
    h, c = h0, c0
    with np.errstate(over="ignore"), _step_scope(B, G, H):
        for t in _layer_steps(T, reverse):
            z = gates[t]
            np.matmul(h, wt, out=z)
            z += gx[t]
            # in place: the tanh of g first, then the sigmoid of i, f and o
            g = z[:, 2 * H:3 * H]
            np.tanh(g, out=g)
            _sigmoid_(z[:, :2 * H])
            _sigmoid_(z[:, 3 * H:])
            i, f, o = z[:, :H], z[:, H:2 * H], z[:, 3 * H:]
            cn = cs[t]
            np.multiply(f, c, out=cn)
            np.multiply(i, g, out=tmp)
            cn += tmp
            np.tanh(cn, out=tmp)
            np.multiply(o, tmp, out=hs[t])
            h, c = hs[t], cn
    return hs, cs, gates


def _lstm_layer_backward_cpu(reverse, h0, c0, w, hs, cs, gates, dhs, dcs, dgates):
    T, B, G = gates.shape
    H = G // 4
    dt = gates.dtype
    dz = np.empty((T, B, G), dt)
    dh, dc = np.empty((B, H), dt), np.zeros((B, H), dt)
    tc, a = np.empty((B, H), dt), np.empty((B, H), dt)
    s = np.empty((B, G), dt)
    order = list(_layer_steps(T, reverse))
    with _step_scope(B, G, H):
        for k in range(T - 1, -1, -1):        # the recurrence's steps, last first
            t = order[k]
            cp = c0 if k == 0 else cs[order[k - 1]]
            if k == T - 1:
                dh[...] = dhs[t]
            else:
                dh += dhs[t]                      # dh held the carry from step k + 1
            i, f, g, o = (gates[t][:, j * H:(j + 1) * H] for j in range(4))
            np.tanh(cs[t], out=tc)
            # dc += dcs + dh * o * (1 - tanh(c)^2)
            dc += dcs[t]
            np.multiply(tc, tc, out=a)
            np.subtract(1, a, out=a)
            a *= o
            a *= dh
            dc += a
            # the gradients of the activated gates, then through the activations
            d = dz[t]
            np.multiply(dc, g, out=d[:, :H])
            np.multiply(dc, cp, out=d[:, H:2 * H])
            np.multiply(dc, i, out=d[:, 2 * H:3 * H])
            np.multiply(dh, tc, out=d[:, 3 * H:])
            d += dgates[t]
            np.subtract(1, gates[t], out=s)
            s *= gates[t]                         # a * (1 - a): the sigmoids' derivative
            sg = s[:, 2 * H:3 * H]
            np.multiply(g, g, out=sg)
            np.subtract(1, sg, out=sg)            # 1 - g^2: tanh's
            d *= s
            dc *= f
            np.matmul(d, w, out=dh)               # the carry into step k - 1 (dh0 after the first)
    dw = _dw_cpu(reverse, dz, h0, hs)        # one large product: every thread
    return dz, dh, dc, dw


def _dw_cpu(reverse, dz, h0, hs):
    """sum_t dz_t^T h_prev(t) as one GEMM over the steps that follow another
    (their h_prev is in hs, shifted by one) plus one for the first step (h0)."""
    T, B, G = dz.shape
    H = hs.shape[2]
    first, rest, prev = (T - 1, slice(0, T - 1), slice(1, T)) if reverse else (0, slice(1, T), slice(0, T - 1))
    dw = np.matmul(dz[first].T, h0)
    if T > 1:
        dw += np.matmul(dz[rest].reshape(-1, G).T, hs[prev].reshape(-1, H))
    return dw


_LSTM_LAYER = Kernel("lstmlayerstep", "const T* __restrict__ gx, T* __restrict__ z, const T* cp, "
                     "T* hs, T* cs, long long n, long long H, long long zo, long long so, long long po", """
    // z[zo:] holds h_prev @ w^T (the GEMM just before): add gx, activate in place
    const long long base = zo + idx / H * 4 * H + idx % H;
    const T i = gc_sigmoid(z[base] + gx[base]);
    const T f = gc_sigmoid(z[base + H] + gx[base + H]);
    const T g = tanh(z[base + 2 * H] + gx[base + 2 * H]);
    const T o = gc_sigmoid(z[base + 3 * H] + gx[base + 3 * H]);
    z[base] = i; z[base + H] = f; z[base + 2 * H] = g; z[base + 3 * H] = o;
    const T cn = f * cp[po + idx] + i * g;
    cs[so + idx] = cn;
    hs[so + idx] = o * tanh(cn);""", over="n")
_LSTM_LAYER_BACKWARD = Kernel("lstmlayerstepbackward",
                              "const T* __restrict__ gates, const T* cs, const T* cp, const T* __restrict__ dhs, "
                              "const T* __restrict__ dcs, const T* __restrict__ dgates, T* __restrict__ dz, "
                              "T* __restrict__ dh, T* __restrict__ dc, long long n, long long H, long long zo, "
                              "long long so, long long po", """
    // dh holds the carry dz_{next} @ w (the GEMM before), dc the cell's carry
    const long long base = zo + idx / H * 4 * H + idx % H;
    const T i = gates[base], f = gates[base + H], g = gates[base + 2 * H], o = gates[base + 3 * H];
    const T tc = tanh(cs[so + idx]);
    const T dht = dhs[so + idx] + dh[idx];
    const T dct = dcs[so + idx] + dc[idx] + dht * o * ((T)1 - tc * tc);
    dz[base] = (dct * g + dgates[base]) * i * ((T)1 - i);
    dz[base + H] = (dct * cp[po + idx] + dgates[base + H]) * f * ((T)1 - f);
    dz[base + 2 * H] = (dct * i + dgates[base + 2 * H]) * ((T)1 - g * g);
    dz[base + 3 * H] = (dht * tc + dgates[base + 3 * H]) * o * ((T)1 - o);
    dc[idx] = dct * f;""", over="n")


def _cuda_float(op, *arrays):
    x = arrays[0]
    if x.dtype not in (np.float32, np.float64):
        raise op.error(f"the CUDA kernel takes float32 or float64, got {x.dtype}",
                       *(TensorDesc(a.shape, a.dtype, "cuda") for a in arrays))


class _LayerParams:
    """The parameters an LSTM layer's op and its backward share: the number
    of steps and the direction."""
    attrs = ("steps", "reverse")
    devices = ("cpu", "cuda")

    def __init__(self, steps: int, reverse: bool = False):
        self.steps = op_int(self.name, "steps", steps)
        if self.steps < 1:
            raise ValueError(f"{self.name}: steps must be at least 1, got {self.steps}")
        self.reverse = bool(reverse)


class LSTMLayer(_LayerParams, Op):
    """The recurrence of one LSTM layer (one direction) over a whole
    sequence: (gx, h0, c0, w_hh) -> (hs, cs, gates). gx (T, B, 4H) holds the
    input projections of every step, biases included (x W_ih^T + b_ih +
    b_hh, one GEMM before this op); w_hh is (4H, H). Step t computes
    z = gx[t] + h_prev @ w_hh^T, the gates i, f, g, o = sigmoid, sigmoid,
    tanh, sigmoid of z's four column blocks (PyTorch's order), c = f * c_prev
    + i * g, h = o * tanh(c). Outputs: hs and cs (T, B, H), every step's h
    and c in time order, and gates (T, B, 4H), the activated gates (what the
    backward reads). ``steps`` is T; ``reverse`` runs the steps from T - 1
    down to 0 (the second direction of a bidirectional layer).

    Example::

        >>> import numpy as np, gradcore as gc
        >>> from gradcore.core import apply
        >>> gx = gc.tensor(np.zeros((2, 1, 4)))             # T=2, B=1, H=1
        >>> s = gc.tensor(np.zeros((1, 1)))
        >>> hs, cs, gates = apply(LSTMLayer(2), gx, s, s, gc.tensor(np.zeros((4, 1))))
        >>> cs.numpy().ravel().tolist()                     # c = 0.5 * c_prev + 0.5 * 0
        [0.0, 0.0]
    """
    name = "LSTMLayer"
    reduce_broadcast = False

    @classmethod
    def examples(cls):
        """Sample inputs for ``check_op``: 3 steps, batch 2, hidden 2, both directions."""
        rng = np.random.default_rng(4)
        ins = [rng.standard_normal(s) for s in ((3, 2, 8), (2, 2), (2, 2))] + [rng.standard_normal((8, 2)) * 0.5]
        return [(cls(3), ins), (cls(3, True), ins)]

    def infer(self, gx, h0, c0, w):
        _check_layer(self, (gx, h0, c0, w), ("seq4", "state", "state", "w"))
        T = self.steps
        if gx.shape is None:
            return tuple(TensorDesc(None, gx.dtype, gx.device) for _ in range(3))
        _, B, G = gx.shape
        seq = (T, B, G // 4)
        return (TensorDesc(seq, gx.dtype, gx.device), TensorDesc(seq, gx.dtype, gx.device),
                TensorDesc(gx.shape, gx.dtype, gx.device))

    def cpu(self, gx, h0, c0, w):
        return _lstm_layer_cpu(self.reverse, gx, h0, c0, w)

    def vjp(self, inputs, outputs, grads):
        (gx, h0, c0, w), (hs, cs, gates) = inputs, outputs
        dhs, dcs, dgates = (_ap(ZerosLike(), o) if g is None else g for o, g in zip(outputs, grads))
        # gx is not read: the backward works from the activated gates
        return list(apply(LSTMLayerBackward(self.steps, self.reverse), h0, c0, w, hs, cs, gates,
                          dhs, dcs, dgates))

    def cuda(self, be, gx, h0, c0, w):
        _cuda_float(self, gx, h0, c0, w)
        T, B, G = gx.shape
        H = G // 4
        dt = gx.dtype
        gates, hs, cs = be.empty((T, B, G), dt), be.empty((T, B, H), dt), be.empty((T, B, H), dt)
        if not B:
            return hs, cs, gates
        kernel = be.kernel(self, be.ctype(dt))
        size = dt.itemsize
        hp, cp, po = h0.ptr, c0, 0
        for t in _layer_steps(T, self.reverse):
            # z_t := h_prev @ w^T straight into the gates' buffer; the kernel adds gx
            gemm_rows(be, dt, B, G, H, hp, w.ptr, gates.ptr + t * B * G * size, tb=True)
            be.launch_n(kernel, B * H, gx, gates, cp, hs, cs, B * H, H, t * B * G, t * B * H, po)
            hp, cp, po = hs.ptr + t * B * H * size, cs, t * B * H
        return hs, cs, gates

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_lstmlayerstep_<ctype>(gx, z, cp, hs, cs, n, H, zo, so, po)``:
        one step's gate math after its GEMM, one thread per (batch, hidden)
        element (n = B * H); zo, so, po: the element offsets of the step in
        the gates, of the step in hs and cs, and of c_prev in cp."""
        return _LSTM_LAYER.source(ctype, helpers=_SIGMOID)


class LSTMLayerBackward(_LayerParams, Composite):
    """(h0, c0, w_hh, hs, cs, gates, dhs, dcs, dgates) -> (dgx, dh0, dc0,
    dw_hh): the backward of ``LSTMLayer(steps, reverse)`` from its outputs
    (the activated gates, the cell states) and the gradients of all three
    outputs. dgx (T, B, 4H) is the gradient of the gate pre-activations,
    which is also that of gx; dw_hh = sum_t dgx[t]^T h_prev(t) is one GEMM
    over every step. One op, with CPU and CUDA kernels; a Composite, whose
    decomposition is the per-step math in existing ops, so that every higher
    order is derived.

    Example::

        >>> import numpy as np, gradcore as gc
        >>> from gradcore.core import apply
        >>> z = lambda *s: gc.tensor(np.zeros(s))
        >>> gates = gc.tensor(np.full((1, 1, 4), 0.5))
        >>> dgx, dh0, dc0, dw = apply(LSTMLayerBackward(1), z(1, 1), z(1, 1), z(4, 1), z(1, 1, 1),
        ...                           z(1, 1, 1), gates, gc.tensor(np.ones((1, 1, 1))), z(1, 1, 1), z(1, 1, 4))
        >>> dgx.numpy().ravel().tolist()          # dc = dh * o = 0.5; di = dc * g * i (1 - i), ...
        [0.0625, 0.0, 0.1875, 0.0]
    """
    name = "LSTMLayerBackward"

    @classmethod
    def examples(cls):
        """Sample inputs for ``check_op``: LSTMLayer's forward on its
        examples' inputs (gates in (0, 1) and (-1, 1), as the forward makes
        them) and random output gradients."""
        rng = np.random.default_rng(5)
        out = []
        for op, (gx, h0, c0, w) in LSTMLayer.examples():
            hs, cs, gates = _lstm_layer_cpu(op.reverse, gx, h0, c0, w)
            grads = [rng.standard_normal(a.shape) for a in (hs, cs, gates)]
            out.append((cls(op.steps, op.reverse), [h0, c0, w, hs, cs, gates] + grads))
        return out

    def infer(self, h0, c0, w, hs, cs, gates, dhs, dcs, dgates):
        descs = (h0, c0, w, hs, cs, gates, dhs, dcs, dgates)
        _check_layer(self, descs, ("state", "state", "w", "seq", "seq", "seq4", "seq", "seq", "seq4"))
        return (TensorDesc(gates.shape, gates.dtype, gates.device), TensorDesc(h0.shape, h0.dtype, h0.device),
                TensorDesc(c0.shape, c0.dtype, c0.device), TensorDesc(w.shape, w.dtype, w.device))

    def cpu(self, h0, c0, w, hs, cs, gates, dhs, dcs, dgates):
        return _lstm_layer_backward_cpu(self.reverse, h0, c0, w, hs, cs, gates, dhs, dcs, dgates)

    def decompose(self, h0, c0, w, hs, cs, gates, dhs, dcs, dgates):
        # the kernels' math step by step in existing ops (shapes are unknown
        # while this is traced: ``steps`` unrolls it)
        T = self.steps
        hs_, cs_, gates_, dhs_, dcs_, dgates_ = (_ap(Unstack(0, T), a) for a in (hs, cs, gates, dhs, dcs, dgates))
        if T == 1:
            hs_, cs_, gates_, dhs_, dcs_, dgates_ = ((a,) for a in (hs_, cs_, gates_, dhs_, dcs_, dgates_))
        order = list(_layer_steps(T, self.reverse))
        dz, dh, dc, dw = [None] * T, None, None, None
        for k in range(T - 1, -1, -1):
            t = order[k]
            hp, cp = (h0, c0) if k == 0 else (hs_[order[k - 1]], cs_[order[k - 1]])
            i, f, g, o = _ap(Split(1, 4), gates_[t])
            di, df, dg, do = _ap(Split(1, 4), dgates_[t])
            tc = _tanh(cs_[t])
            dht = dhs_[t] if dh is None else dhs_[t] + dh
            dct = dcs_[t] + dht * o * (1 - tc * tc)
            if dc is not None:
                dct = dct + dc
            d = _ap(Concat(1), (dct * g + di) * i * (1 - i), (dct * cp + df) * f * (1 - f),
                    (dct * i + dg) * (1 - g * g), (dht * tc + do) * o * (1 - o))
            dz[t] = d
            dc = dct * f
            dh = _ap(MatrixMul(), d, w)
            dwt = _ap(MatrixMul(True, False), d, hp)
            dw = dwt if dw is None else dw + dwt
        return _ap(Stack(0), *dz), dh, dc, dw

    def cuda(self, be, h0, c0, w, hs, cs, gates, dhs, dcs, dgates):
        _cuda_float(self, gates, h0, c0, w, hs, cs, dhs, dcs, dgates)
        T, B, G = gates.shape
        H = G // 4
        dt = gates.dtype
        dz, dh, dc, dw = be.empty((T, B, G), dt), be.zeros((B, H), dt), be.zeros((B, H), dt), be.empty((G, H), dt)
        if not B:
            return dz, dh, dc, be.zeros((G, H), dt)
        kernel = be.kernel(self, be.ctype(dt))
        size = dt.itemsize
        order = list(_layer_steps(T, self.reverse))
        for k in range(T - 1, -1, -1):
            t = order[k]
            cp, po = (c0, 0) if k == 0 else (cs, order[k - 1] * B * H)
            be.launch_n(kernel, B * H, gates, cs, cp, dhs, dcs, dgates, dz, dh, dc, B * H, H, t * B * G,
                        t * B * H, po)
            # dh := dz_t @ w, the carry into the step before (dh0 after the first)
            gemm_rows(be, dt, B, H, G, dz.ptr + t * B * G * size, w.ptr, dh.ptr)
        # dw = dz[first]^T h0 + dz[rest]^T hs[prev], one GEMM for all steps but the first
        first, rest, prev = (T - 1, 0, 1) if self.reverse else (0, 1, 0)
        gemm_rows(be, dt, G, H, B, dz.ptr + first * B * G * size, h0.ptr, dw.ptr, ta=True)
        if T > 1:
            gemm_rows(be, dt, G, H, (T - 1) * B, dz.ptr + rest * B * G * size, hs.ptr + prev * B * H * size,
                      dw.ptr, ta=True, beta=1.0)
        return dz, dh, dc, dw

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_lstmlayerstepbackward_<ctype>(gates, cs, cp, dhs, dcs, dgates,
        dz, dh, dc, n, H, zo, so, po)``: one step's gate gradients, one
        thread per (batch, hidden) element (n = B * H), dh holding the carry
        from the step after (the GEMM before) and dc updated in place."""
        return _LSTM_LAYER_BACKWARD.source(ctype, helpers=_SIGMOID)
