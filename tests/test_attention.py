"""F.nn.scaled_dot_product_attention and M.MultiHeadAttention against
PyTorch (float64, same weights, values and gradients within 1e-6)."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
from gradcore.testing import gradcheck

torch = pytest.importorskip("torch")
TF = torch.nn.functional
TOL = dict(rtol=1e-6, atol=1e-8)


def _run_both(fn_gc, fn_t, arrays, extra_gc=(), extra_t=(), seed=0):
    xs = [gc.tensor(a) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    gm = gc.GradManager().attach(xs + list(extra_gc))
    with gm:
        outs = fn_gc(*xs)
        ws = [np.random.default_rng(seed + i).standard_normal(o.shape) for i, o in enumerate(outs)]
        gm.backward(sum(F.sum(o * gc.tensor(w)) for o, w in zip(outs, ws)))
    outs_t = fn_t(*ts)
    sum((o * torch.tensor(w)).sum() for o, w in zip(outs_t, ws)).backward()
    for o, ot in zip(outs, outs_t):
        np.testing.assert_allclose(o.numpy(), ot.detach().numpy(), **TOL)
    for a, b in zip(xs + list(extra_gc), ts + list(extra_t)):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), **TOL)


@pytest.mark.parametrize("mask", [None, "bool", "float", "causal"])
def test_sdpa_matches_torch(mask):
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((2, 3, 6, 7))
    m_np = {"bool": rng.random((4, 6)) > 0.3, "float": rng.standard_normal((2, 1, 4, 6))}.get(mask)
    if mask == "bool":
        m_np[:, 0] = True                       # no fully masked row
    causal = mask == "causal"
    if causal:
        k, v = k[:, :, :4], v[:, :, :4]

    def g(q, k, v):
        m = None if m_np is None else gc.tensor(m_np)
        return (F.nn.scaled_dot_product_attention(q, k, v, m, is_causal=causal, scale=0.7 if mask else None),)

    def t(q, k, v):
        m = None if m_np is None else torch.tensor(m_np)
        return (TF.scaled_dot_product_attention(q, k, v, m, is_causal=causal, scale=0.7 if mask else None),)
    _run_both(g, t, [q, k, v])


def test_sdpa_finite_differences_dropout_and_errors():
    rng = np.random.default_rng(1)
    q, k, v = (gc.tensor(rng.standard_normal((2, 3, 4))) for _ in range(3))
    assert gradcheck(lambda q, k, v: F.nn.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v])
    gc.random.seed(0)
    a = F.nn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    b = F.nn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert not np.allclose(a.numpy(), b.numpy())
    np.testing.assert_array_equal(F.nn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=False).numpy(),
                                  F.nn.scaled_dot_product_attention(q, k, v).numpy())
    with pytest.raises(ValueError, match="scaled_dot_product_attention: query and key must share"):
        F.nn.scaled_dot_product_attention(q, gc.tensor(np.zeros((2, 3, 5))), v)
    with pytest.raises(ValueError, match="drop_prob"):
        F.nn.scaled_dot_product_attention(q, k, v, dropout_p=1.5)


def _mha_pair(E, H, **kw):
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(E, H, **kw).double()
    m = M.MultiHeadAttention(E, H, **{"batch_first": False, "weight_layout": "pytorch", **kw})  # PyTorch's layouts
    tps = dict(tm.named_parameters())
    names = [n for n, _ in m.named_parameters()]
    assert sorted(names) == sorted(tps)
    for n, p in m.named_parameters():
        p._reset(gc.tensor(tps[n].detach().numpy().copy()))
    return m, tm, [p for _, p in m.named_parameters()], [tps[n] for n in names]


@pytest.mark.parametrize("case", ["plain", "batch_first", "masks", "kvdim", "per_head"])
def test_mha_matches_torch(case):
    E, H, L, S, N = 8, 2, 3, 4, 2
    kw = {"batch_first": True} if case == "batch_first" else {"kdim": 5, "vdim": 6} if case == "kvdim" else {}
    m, tm, ps, tps = _mha_pair(E, H, **kw)
    rng = np.random.default_rng(3)
    bf = case == "batch_first"
    q = rng.standard_normal((N, L, E) if bf else (L, N, E))
    k = rng.standard_normal((N, S, kw.get("kdim", E)) if bf else (S, N, kw.get("kdim", E)))
    v = rng.standard_normal((N, S, kw.get("vdim", E)) if bf else (S, N, kw.get("vdim", E)))
    kpm = am = None
    if case == "masks":
        kpm = np.array([[False, False, True, False], [False, True, False, False]])
        am = rng.standard_normal((L, S))
    avg = case != "per_head"

    def g(q, k, v):
        out, w = m(q, k, v, key_padding_mask=None if kpm is None else gc.tensor(kpm),
                   attn_mask=None if am is None else gc.tensor(am), need_weights=True, average_attn_weights=avg)
        return out, w if avg else F.reshape(w, (N, H, L, S))     # MegEngine's (N * H, L, S) per head

    def t(q, k, v):
        return tm(q, k, v, key_padding_mask=None if kpm is None else torch.tensor(kpm),
                  attn_mask=None if am is None else torch.tensor(am), average_attn_weights=avg)
    _run_both(g, t, [q, k, v], ps, tps)


def test_mha_bool_attn_mask_unbatched_state_dict_and_errors():
    m, tm, _, _ = _mha_pair(8, 4)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 8))                  # unbatched (L, E)
    am = np.triu(np.ones((3, 3), bool), 1)           # True: not attended (PyTorch's MHA rule)
    out, w = m(gc.tensor(x), gc.tensor(x), gc.tensor(x), attn_mask=gc.tensor(am), need_weights=True,
               average_attn_weights=True)
    out_t, w_t = tm(torch.tensor(x), torch.tensor(x), torch.tensor(x), attn_mask=torch.tensor(am))
    np.testing.assert_allclose(out.numpy(), out_t.detach().numpy(), **TOL)
    np.testing.assert_allclose(w.numpy(), w_t.detach().numpy(), **TOL)
    m2 = M.MultiHeadAttention(8, 4)                  # PyTorch's parameters, the default
    m2.load_state_dict(tm.state_dict())
    np.testing.assert_allclose(m2.in_proj_weight.numpy(), tm.in_proj_weight.detach().numpy(), rtol=1e-6)
    m3 = M.MultiHeadAttention(8, 4, weight_layout="megengine")   # the query weight first, as (in, out)
    m3.load_state_dict(tm.state_dict())
    np.testing.assert_allclose(m3.io_weight_bias.numpy()[0, :64].reshape(8, 8),
                               tm.in_proj_weight.detach().numpy()[:8].T, rtol=1e-6)
    with pytest.raises(ValueError, match="MultiHeadAttention: embed_dim 8 must be divisible by num_heads 3"):
        M.MultiHeadAttention(8, 3)
    with pytest.raises(ValueError, match=r"MultiHeadAttention: expected query \(L, N, 8\)"):
        m(gc.tensor(np.zeros((3, 2, 7))), gc.tensor(np.zeros((3, 2, 8))), gc.tensor(np.zeros((3, 2, 8))))
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(2, 3\)"):
        z = gc.tensor(np.zeros((3, 2, 8)))
        m(z, z, z, key_padding_mask=gc.tensor(np.zeros((2, 4), bool)))


def test_mha_follows_megengines_interface():
    """MegEngine's defaults: batch first, no weights unless asked, per-head
    weights (N * heads, L, S); attn_dropout / out_dropout (and PyTorch's
    dropout= for the first); the same values as PyTorch's module."""
    m, tm, _, _ = _mha_pair(8, 2)
    mb = M.MultiHeadAttention(8, 2)
    mb.load_state_dict(tm.state_dict())
    assert mb.batch_first and mb.attn_dropout == 0.0 and mb.out_dropout == 0.0
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 8))                       # (N, L, E)
    out, w = mb(gc.tensor(x), gc.tensor(x), gc.tensor(x))
    assert w is None and out.shape == (2, 3, 8)
    xt = torch.tensor(x).transpose(0, 1)
    out_t, w_t = tm(xt, xt, xt, average_attn_weights=False)
    np.testing.assert_allclose(out.numpy(), out_t.detach().transpose(0, 1).numpy(), **TOL)
    _, w = mb(gc.tensor(x), gc.tensor(x), gc.tensor(x), need_weights=True)
    assert w.shape == (4, 3, 3)
    np.testing.assert_allclose(w.numpy(), w_t.detach().reshape(4, 3, 3).numpy(), **TOL)
    assert M.MultiHeadAttention(8, 2, dropout=0.25).attn_dropout == 0.25
    d = M.MultiHeadAttention(8, 2, attn_dropout=0.5, out_dropout=0.5)
    z = gc.tensor(rng.standard_normal((2, 3, 8)))
    gc.random.seed(0)
    a = d(z, z, z)[0].numpy()
    d.eval()
    b = d(z, z, z)[0].numpy()
    assert not np.allclose(a, b) and np.allclose(b, d(z, z, z)[0].numpy())

