"""Loss ops: the connectionist temporal classification loss (``F.nn.ctc_loss``).

- ``CTCLoss(blank)``: (log_probs (T, N, C), targets (N, S) int, input_lengths
  (N,) int, target_lengths (N,) int) -> nll (N,), the negative log
  likelihood of each target sequence (the alpha recursion in log space;
  inf where no alignment exists);
- ``CTCLossGrad(blank)``: (..., nll, g) -> the gradient of sum(g * nll)
  with respect to log_probs, from the alpha and beta recursions:
  ``-g[n] * sum over s with l'(s) = c of exp(alpha + beta - lp + nll)`` for
  t < input_length, 0 elsewhere and for a sample whose nll is infinite.

This is the true gradient with respect to ``log_probs``; PyTorch's
``ctc_loss`` returns ``exp(log_probs)`` plus this, the gradient with respect to
the logits of a log_softmax, which agrees once chained through a
log_softmax (the usual case, tested). As in PyTorch there is no second
order: ``CTCLossGrad`` declares no gradient.

Example::

    >>> import numpy as np, gradcore as gc
    >>> from gradcore.core import apply
    >>> lp = gc.tensor(np.log(np.full((2, 1, 2), 0.5)))
    >>> (nll,) = apply(CTCLoss(0), lp, gc.tensor([[1]]), gc.tensor([2]), gc.tensor([1]))
    >>> round(float(np.exp(-nll.item())), 4)      # paths "1-", "-1", "11" of 4
    0.75
"""
from __future__ import annotations

import numpy as np

from gradcore._core import apply
from gradcore.op import Op, TensorDesc
from gradcore.cuda.kernels import Kernel

__all__ = ["CTCLoss", "CTCLossGrad"]


def _check(op, lp, targets, il, tl, *more):
    if lp.dtype.kind != "f":
        raise op.error(f"log_probs must be floating-point, got {lp.dtype}", lp, targets, il, tl, *more)
    for what, d in (("targets", targets), ("input_lengths", il), ("target_lengths", tl)):
        if d.dtype.kind not in "iu":
            raise op.error(f"{what} must be an integer tensor, got {d.dtype}", lp, targets, il, tl, *more)
    if lp.shape is None or targets.shape is None or il.shape is None or tl.shape is None:
        return
    if lp.ndim != 3:
        raise op.error(f"log_probs must be (T, N, C), got shape {lp.shape}", lp, targets, il, tl, *more)
    N = lp.shape[1]
    if targets.ndim != 2 or targets.shape[0] != N or tuple(il.shape) != (N,) or tuple(tl.shape) != (N,):
        raise op.error(f"for log_probs {lp.shape}, targets must be ({N}, S) and the lengths ({N},)",
                       lp, targets, il, tl, *more)
    if lp.shape[2] < 1:
        raise op.error("log_probs needs at least one class (the blank)", lp, targets, il, tl)


def _lse(*xs):
    m = np.maximum.reduce(xs)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = sum(np.exp(x - safe) for x in xs)
        return np.where(np.isneginf(m), -np.inf, np.log(s) + safe)


def _ctc_setup(lp, targets, il, tl, blank):
    T, N, C = lp.shape
    S = targets.shape[1]
    L = 2 * S + 1
    il = np.clip(np.asarray(il, np.int64), 0, T)
    tl = np.clip(np.asarray(tl, np.int64), 0, S)
    ext = np.full((N, L), blank, np.int64)
    ext[:, 1::2] = np.clip(targets, 0, C - 1)
    valid = np.arange(L)[None, :] < (2 * tl + 1)[:, None]
    lpe = lp[:, np.arange(N)[:, None], ext]                 # (T, N, L)
    lpe = np.where(valid[None], lpe, -np.inf)
    skip = np.zeros((N, L), bool)
    skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    return T, N, C, L, il, tl, ext, lpe, skip


def _ctc_alpha(lpe, skip, T, N, L):
    alpha = np.full((T, N, L), -np.inf, lpe.dtype)
    if T == 0:
        return alpha
    alpha[0, :, :2] = lpe[0, :, :2]
    neg = np.full((N, 1), -np.inf, lpe.dtype)
    for t in range(1, T):
        a = alpha[t - 1]
        a1 = np.concatenate([neg, a[:, :-1]], 1)
        a2 = np.where(skip, np.concatenate([neg, neg, a[:, :-2]], 1)[:, :L], -np.inf)
        alpha[t] = _lse(a, a1, a2) + lpe[t]
    return alpha


def _ctc_nll(alpha, il, tl, N):
    n = np.arange(N)
    last = alpha[np.maximum(il - 1, 0), n]                   # (N, L)
    end = last[n, 2 * tl]
    end2 = np.where(tl > 0, last[n, np.maximum(2 * tl - 1, 0)], -np.inf)
    ll = _lse(end, end2)
    ll = np.where(il > 0, ll, np.where(tl == 0, 0.0, -np.inf))
    return -ll


class CTCLoss(Op):
    """(log_probs (T, N, C), targets (N, S), input_lengths (N,),
    target_lengths (N,)) -> the per-sample negative log likelihood (N,)."""
    name = "CTCLoss"
    devices = ("cpu", "cuda")
    attrs = ("blank",)
    max_grad_order = 1      # CTCLossGrad declares no gradient: check_op's gradgrad is not applicable

    def __init__(self, blank: int = 0):
        self.blank = int(blank)

    @classmethod
    def examples(cls):
        """Sample inputs for ``check_op``: T 5, N 2, C 3, repeated labels and a shorter sample."""
        rng = np.random.default_rng(0)
        x = rng.standard_normal((5, 2, 3))
        lp = x - np.log(np.exp(x).sum(-1, keepdims=True))
        return [(cls(0), [lp, np.array([[1, 1], [2, 0]]), np.array([5, 4]), np.array([2, 1])])]

    def infer(self, lp, targets, il, tl):
        _check(self, lp, targets, il, tl)
        n = None if lp.shape is None else (lp.shape[1],)
        return (TensorDesc(n, lp.dtype, lp.device),)

    def cpu(self, lp, targets, il, tl):
        T, N, C, L, il, tl, ext, lpe, skip = _ctc_setup(lp, targets, il, tl, self.blank)
        return _ctc_nll(_ctc_alpha(lpe, skip, T, N, L), il, tl, N).astype(lp.dtype)

    def vjp(self, inputs, outputs, grads):
        (lp, targets, il, tl), (nll,), (g,) = inputs, outputs, grads
        (d,) = apply(CTCLossGrad(self.blank), lp, targets, il, tl, nll, g)
        return [d, None, None, None]

    def cuda(self, be, lp, targets, il, tl):
        return _ctc_launch(self, be, lp, targets, il, tl)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_ctcloss_<ctype>(lp, targets, il, tl, nll, work, T, N, C, S, blank)``:
        one thread per sample, the alpha recursion in log space over a
        (N, 2, 2S+1) workspace of two rows; lengths and targets int64."""
        return _ctc_source(ctype, backward=False)


class CTCLossGrad(Op):
    """(log_probs, targets, input_lengths, target_lengths, nll, g) -> the
    gradient of sum(g * nll) with respect to log_probs (T, N, C).
    Declares no gradient of its own (as PyTorch's ctc_loss: no double backward)."""
    name = "CTCLossGrad"
    devices = ("cpu", "cuda")
    attrs = ("blank",)

    def __init__(self, blank: int = 0):
        self.blank = int(blank)

    @classmethod
    def examples(cls):
        """Sample inputs for ``check_op`` (the nll of CTCLoss's example)."""
        (op, (lp, t, il, tl)), = CTCLoss.examples()
        nll = CTCLoss(0).cpu(lp, t, il, tl)
        return [(cls(0), [lp, t, il, tl, nll, np.array([1.0, 0.5])])]

    def infer(self, lp, targets, il, tl, nll, g):
        _check(self, lp, targets, il, tl, nll, g)
        if lp.shape is not None and nll.shape is not None and g.shape is not None:
            if tuple(nll.shape) != (lp.shape[1],) or tuple(g.shape) != (lp.shape[1],):
                raise self.error(f"nll and g must be ({lp.shape[1]},)", lp, targets, il, tl, nll, g)
        return (TensorDesc(lp.shape, lp.dtype, lp.device),)

    def cpu(self, lp, targets, il, tl, nll, g):
        T, N, C, L, il, tl, ext, lpe, skip = _ctc_setup(lp, targets, il, tl, self.blank)
        alpha = _ctc_alpha(lpe, skip, T, N, L)
        beta = np.full((T, N, L), -np.inf, lp.dtype)
        n = np.arange(N)
        neg = np.full((N, 1), -np.inf, lp.dtype)
        skip2 = np.concatenate([skip[:, 2:], np.zeros((N, 2), bool)], 1)   # skip of s + 2
        for t in range(T - 1, -1, -1):
            if t < T - 1:
                b = beta[t + 1]
                b1 = np.concatenate([b[:, 1:], neg], 1)
                b2 = np.where(skip2, np.concatenate([b[:, 2:], neg, neg], 1)[:, :L], -np.inf)
                beta[t] = np.where((t < il - 1)[:, None], _lse(b, b1, b2) + lpe[t], -np.inf)
            start = (il - 1 == t)
            if start.any():
                k = n[start]
                beta[t, k, 2 * tl[k]] = lpe[t, k, 2 * tl[k]]
                has = k[tl[k] > 0]
                beta[t, has, 2 * tl[has] - 1] = lpe[t, has, 2 * tl[has] - 1]
        nll = np.asarray(nll, lp.dtype)
        ok = np.isfinite(nll)
        with np.errstate(invalid="ignore", over="ignore"):
            occ = np.exp(alpha + beta - lpe + np.where(ok, nll, 0)[None, :, None])
        occ = np.where(np.isfinite(alpha + beta)[...] & ok[None, :, None], occ, 0.0)
        onehot = (ext[:, :, None] == np.arange(C)[None, None, :]).astype(lp.dtype)   # (N, L, C)
        grad = -np.einsum("tns,nsc->tnc", occ, onehot)
        return (grad * np.asarray(g, lp.dtype)[None, :, None]).astype(lp.dtype)

    def cuda(self, be, lp, targets, il, tl, nll, g):
        return _ctc_launch(self, be, lp, targets, il, tl, nll, g)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_ctclossgrad_<ctype>(lp, targets, il, tl, nll, g, grad, work, T, N, C, S, blank)``:
        one thread per sample: alpha forward into a (N, T, 2S+1) workspace,
        then beta backward (two rows) accumulating the gradient of its
        (T, C) slice, zeroed first."""
        return _ctc_source(ctype, backward=True)


def _ctc_launch(op, be, lp, targets, il, tl, nll=None, g=None):
    if lp.dtype not in (np.float32, np.float64):
        raise op.error(f"the CUDA kernel takes float32 or float64 log_probs, got {lp.dtype}",
                       TensorDesc(lp.shape, lp.dtype, "cuda"))
    T, N, C = lp.shape
    S = targets.shape[1]
    L = 2 * S + 1
    targets, il, tl = (be.cast(a, np.dtype("int64")) for a in (targets, il, tl))
    T_ = be.ctype(lp.dtype)
    if nll is None:
        out = be.empty((N,), lp.dtype)
        work = be.empty((max(N * 2 * L, 1),), lp.dtype)
        if N:
            be.launch_n(be.kernel(op, T_), N, lp, targets, il, tl, out, work, T, N, C, S, op.blank)
        return out
    out = be.empty((T, N, C), lp.dtype)
    work = be.empty((max(N * (T + 2) * L, 1),), lp.dtype)
    if N:
        be.launch_n(be.kernel(op, T_), N, lp, targets, il, tl, nll, g, out, work, T, N, C, S, op.blank)
    return out


# the CTC kernels: one thread per sample n (a grid-stride loop over N); the
# label of extended position s for sample n, its log prob at t, and whether
# s may be reached from s - 2
_CTC_HELPERS = r"""
#ifndef GC_CTC_HELPERS
#define GC_CTC_HELPERS
template <class V> static __device__ V gc_ctc_lse(V a, V b) {
    if (isinf(a) && a < 0) return b;
    if (isinf(b) && b < 0) return a;
    V m = a > b ? a : b;
    return m + log(exp(a - m) + exp(b - m));
}
#define GC_LAB(s) ((s) % 2 == 0 ? blank : (targets[n * S + (s) / 2] < 0 ? 0 : \
    (targets[n * S + (s) / 2] >= C ? C - 1 : targets[n * S + (s) / 2])))
#define GC_LP(t, s) lp[((t) * N + n) * C + GC_LAB(s)]
#define GC_SKIP(s) ((s) >= 2 && GC_LAB(s) != blank && GC_LAB(s) != GC_LAB((s) - 2))
#endif
"""
_CTC = Kernel('ctcloss', 'const T* __restrict__ lp, const long long* __restrict__ targets, '
              'const long long* __restrict__ il, const long long* __restrict__ tl, T* __restrict__ nll, '
              'T* __restrict__ work, long long Tmax, long long N, long long C, long long S, long long blank', """
    const T NEG = -INFINITY;
    long long Tn = il[n] < 0 ? 0 : (il[n] > Tmax ? Tmax : il[n]);
    long long Sn = tl[n] < 0 ? 0 : (tl[n] > S ? S : tl[n]);
    const long long Ln = 2 * Sn + 1, LL = 2 * S + 1;
    T* a0 = work + n * 2 * LL; T* a1 = a0 + LL;
    if (Tn == 0) { nll[n] = Sn == 0 ? 0 : INFINITY; continue; }
    for (long long s = 0; s < Ln; ++s) a0[s] = s < 2 ? GC_LP(0, s) : NEG;
    for (long long t = 1; t < Tn; ++t) {
        for (long long s = 0; s < Ln; ++s) {
            T v = a0[s];
            if (s >= 1) v = gc_ctc_lse(v, a0[s - 1]);
            if (GC_SKIP(s)) v = gc_ctc_lse(v, a0[s - 2]);
            a1[s] = v + GC_LP(t, s);
        }
        T* tmp = a0; a0 = a1; a1 = tmp;
    }
    T ll = a0[Ln - 1];
    if (Sn > 0) ll = gc_ctc_lse(ll, a0[Ln - 2]);
    nll[n] = -ll;""", over="N", index="n")
_CTC_GRAD = Kernel('ctclossgrad', 'const T* __restrict__ lp, const long long* __restrict__ targets, '
                   'const long long* __restrict__ il, const long long* __restrict__ tl, const T* __restrict__ nll, '
                   'const T* __restrict__ g, T* __restrict__ grad, T* __restrict__ work, long long Tmax, '
                   'long long N, long long C, long long S, long long blank', """
    const T NEG = -INFINITY;
    long long Tn = il[n] < 0 ? 0 : (il[n] > Tmax ? Tmax : il[n]);
    long long Sn = tl[n] < 0 ? 0 : (tl[n] > S ? S : tl[n]);
    const long long Ln = 2 * Sn + 1, LL = 2 * S + 1;
    for (long long t = 0; t < Tmax; ++t) for (long long k = 0; k < C; ++k) grad[(t * N + n) * C + k] = 0;
    const T total = nll[n];
    if (Tn == 0 || isinf(total) || isnan(total)) continue;
    T* alpha = work + n * (Tmax + 2) * LL;
    T* b0 = alpha + Tmax * LL; T* b1 = b0 + LL;
    for (long long s = 0; s < Ln; ++s) alpha[s] = s < 2 ? GC_LP(0, s) : NEG;
    for (long long t = 1; t < Tn; ++t)
        for (long long s = 0; s < Ln; ++s) {
            T v = alpha[(t - 1) * LL + s];
            if (s >= 1) v = gc_ctc_lse(v, alpha[(t - 1) * LL + s - 1]);
            if (GC_SKIP(s)) v = gc_ctc_lse(v, alpha[(t - 1) * LL + s - 2]);
            alpha[t * LL + s] = v + GC_LP(t, s);
        }
    for (long long s = 0; s < Ln; ++s) b0[s] = (s == Ln - 1 || (Sn > 0 && s == Ln - 2)) ? GC_LP(Tn - 1, s) : NEG;
    for (long long t = Tn - 1; t >= 0; --t) {
        if (t < Tn - 1) {
            for (long long s = 0; s < Ln; ++s) {
                T v = b0[s];
                if (s + 1 < Ln) v = gc_ctc_lse(v, b0[s + 1]);
                if (s + 2 < Ln && GC_SKIP(s + 2)) v = gc_ctc_lse(v, b0[s + 2]);
                b1[s] = v + GC_LP(t, s);
            }
            T* tmp = b0; b0 = b1; b1 = tmp;
        }
        for (long long s = 0; s < Ln; ++s) {
            const T ab = alpha[t * LL + s] + b0[s];
            if (isinf(ab)) continue;
            grad[(t * N + n) * C + GC_LAB(s)] -= g[n] * exp(ab - GC_LP(t, s) + total);
        }
    }""", over="N", index="n")

def _ctc_source(ctype: str, backward: bool) -> str:
    return (_CTC_GRAD if backward else _CTC).source(ctype, helpers=_CTC_HELPERS)
