"""F.nn.multi_head_attention (MegEngine's flat io_weight_bias) and
M.MultiHeadAttention's MegEngine parameter form.

Oracles: an independent NumPy implementation written from MegEngine's C++
reference kernel (dnn/src/common/multi_head_attn/proxy_forward_base.cpp: the
offsets of the weight and bias blocks, x @ W + b, a loop over the heads),
the values MegEngine's own naive-kernel test expects, PyTorch's
multi_head_attention_forward / nn.MultiheadAttention with the same weights
re-packed (values and gradients, float64, 1e-10), and finite differences
(first and second order)."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
from gradcore.testing import gradcheck, gradgradcheck

torch = pytest.importorskip("torch")
TF = torch.nn.functional
TOL = dict(rtol=1e-10, atol=1e-10)


# ---- the NumPy reference, from the C++ kernel
def _ref_mha(query, key, value, flat, E, H, qp, kp, vp, op, qb, kb, vb, ob, bias_k=None, bias_v=None,
             zero_attn=False, add_mask=None):
    """(output (N, L, out), weights (N, H, L, S')): per batch element and
    head, as MegEngine's reference kernel computes it. ``add_mask`` is an
    additive (N, H, L, S') array or None."""
    N, L, _ = query.shape
    kdim, vdim = key.shape[2], value.shape[2]
    flat = np.asarray(flat, np.float64).reshape(-1)
    end = 0

    def take(rows, cols):
        nonlocal end
        block = flat[end:end + rows * cols].reshape(rows, cols)
        end += rows * cols
        return block
    # the weights first, each (in, out), then the biases, each only beside its weight
    Wq = take(E, qp) if qp else None
    Wk = take(kdim, kp) if kp else None
    Wv = take(vdim, vp) if vp else None
    Wo = take(vp if vp else vdim * H, op) if op else None
    bq = take(1, qp)[0] if qb and qp else None
    bk = take(1, kp)[0] if kb and kp else None
    bv = take(1, vp)[0] if vb and vp else None
    bo = take(1, op)[0] if ob and op else None
    assert end == flat.size, (end, flat.size)
    scale = 1.0 / np.sqrt(E if qp == 0 else E // H)
    outs, weights = [], []
    for n in range(N):
        Q = query[n] @ Wq if qp else query[n]
        K = key[n] @ Wk if kp else key[n]
        V = value[n] @ Wv if vp else value[n]
        Q, K, V = (x if b is None else x + b for x, b in ((Q, bq), (K, bk), (V, bv)))
        if bias_k is not None:
            K = np.vstack([K, bias_k.reshape(1, -1)])
            V = np.vstack([V, bias_v.reshape(1, -1)])
        if zero_attn:
            K = np.vstack([K, np.zeros((1, K.shape[1]))])
            V = np.vstack([V, np.zeros((1, V.shape[1]))])
        dq, dk, dv = (x.shape[1] // H if p else x.shape[1] for x, p in ((Q, qp), (K, kp), (V, vp)))
        Z, ws = [], []
        for h in range(H):
            qh = Q[:, h * dq:(h + 1) * dq] if qp else Q
            kh = K[:, h * dk:(h + 1) * dk] if kp else K
            vh = V[:, h * dv:(h + 1) * dv] if vp else V
            s = qh @ kh.T * scale
            if add_mask is not None:
                s = s + add_mask[n, h]
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            ws.append(p)
            Z.append(p @ vh)
        Z = np.hstack(Z)
        out = Z @ Wo if op else Z
        outs.append(out if bo is None else out + bo)
        weights.append(np.stack(ws))
    return np.stack(outs), np.stack(weights)


def _flat_len(E, kdim, vdim, H, qp, kp, vp, op, qb, kb, vb, ob):
    w = E * qp + kdim * kp + vdim * vp + (vp if vp else vdim * H) * op
    return w + (qp if qb else 0) + (kp if kb else 0) + (vp if vb else 0) + (op if ob else 0)


def _rng(seed):
    return np.random.default_rng(seed)


def test_known_answers_of_megengines_reference_kernel():
    """Inputs and outputs of MegEngine's own naive-kernel test
    (dnn/test/naive/multi_head_attn.cpp): embed 2, kdim 3, every projection 2
    wide, no biases (18 values), 1 and 2 heads, without and with an additive
    (L, S) mask."""
    q = np.array([0.14335328, 0.9446689, 0.5218483, 0.41466194, 0.2645556, 0.7742337, 0.45615032,
                  0.56843394]).reshape(2, 2, 2)
    k = np.array([0.0187898, 0.6176355, 0.6120957, 0.616934, 0.94374806, 0.6818203, 0.3595079, 0.43703195,
                  0.6976312, 0.06022547, 0.6667667, 0.67063785]).reshape(2, 2, 3)
    v = np.array([0.21038257, 0.12892629, 0.31542835, 0.36371076, 0.57019675, 0.43860152, 0.9883738,
                  0.10204481]).reshape(2, 2, 2)
    w = np.array([0.5488135, 0.71518934, 0.60276335, 0.5448832, 0.4236548, 0.6458941, 0.4375872, 0.891773,
                  0.96366274, 0.3834415, 0.79172504, 0.5288949, 0.56804454, 0.92559665, 0.071036056,
                  0.0871293, 0.020218397, 0.83261985])
    mask = np.array([[0.0, -np.inf], [0.0, 0.0]])
    expect = {
        (1, False): ([0.034801412, 0.36719304, 0.03457721, 0.3645532, 0.068083055, 0.61898696, 0.06808451,
                      0.6189755],
                     [0.3729596, 0.6270404, 0.3836875, 0.61631244, 0.50552285, 0.49447718, 0.50534284,
                      0.49465716]),
        (2, False): ([0.03388246, 0.3616359, 0.0336703, 0.3607049, 0.068048045, 0.61852735, 0.06805048,
                      0.61852974],
                     [0.42549428, 0.5745057, 0.438196, 0.561804, 0.39305627, 0.6069437, 0.39609915, 0.60390085,
                      0.50799584, 0.49200416, 0.5077489, 0.49225107, 0.49981424, 0.5001858, 0.49980664,
                      0.50019336]),
        (1, True): ([0.021696962, 0.21289916, 0.03457721, 0.3645532, 0.06407211, 0.6501551, 0.06808451,
                     0.6189755],
                    [1.0, 0.0, 0.3836875, 0.61631244, 1.0, 0.0, 0.50534284, 0.49465716]),
        (2, True): ([0.021696962, 0.21289916, 0.0336703, 0.3607049, 0.06407211, 0.6501551, 0.06805048,
                     0.61852974],
                    [1.0, 0.0, 0.438196, 0.561804, 1.0, 0.0, 0.39609915, 0.60390085, 1.0, 0.0, 0.5077489,
                     0.49225107, 1.0, 0.0, 0.49980664, 0.50019336]),
    }
    for (H, masked), (out_e, w_e) in expect.items():
        out, weights = F.nn.multi_head_attention(
            gc.tensor(q.astype("float32")), gc.tensor(k.astype("float32")), gc.tensor(v.astype("float32")),
            2, H, 0.0, 0.0, gc.tensor(w.astype("float32")), attn_mask=gc.tensor(mask.astype("float32")) if masked
            else None, need_weights=True, training=False)
        assert out.shape == (2, 2, 2) and weights.shape == (2 * H, 2, 2)
        np.testing.assert_allclose(out.numpy().ravel(), out_e, rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(weights.numpy().ravel(), w_e, rtol=2e-6, atol=1e-7)


# (E, kdim, vdim, H, qproj, kproj, vproj, oproj, qbias, kbias, vbias, obias)
CONFIGS = {
    "default": (8, 8, 8, 2, 8, 8, 8, 8, True, True, True, True),
    "kvdim_some_biases": (6, 5, 7, 3, 6, 6, 6, 6, True, False, False, True),
    "other_sizes": (6, 4, 5, 3, 9, 9, 6, 5, False, True, True, False),
    "no_q_projection": (4, 3, 5, 2, 0, 8, 4, 7, False, True, False, True),
    "no_v_or_o_projection": (6, 6, 3, 2, 6, 6, 0, 0, True, True, False, False),
    "v_but_no_o_projection": (6, 6, 3, 3, 6, 6, 9, 0, True, False, True, False),
    "none": (4, 4, 3, 2, 0, 0, 0, 0, False, False, False, False),
}


def _case(cfg, seed, N=2, L=3, S=4, bias_kv=False):
    E, kdim, vdim, H, qp, kp, vp, op, qb, kb, vb, ob = cfg
    rng = _rng(seed)
    q, k, v = rng.standard_normal((N, L, E)), rng.standard_normal((N, S, kdim)), rng.standard_normal((N, S, vdim))
    n = _flat_len(E, kdim, vdim, H, qp, kp, vp, op, qb, kb, vb, ob)
    w = rng.standard_normal((1, n)) * 0.5 if n else None
    bk = rng.standard_normal((1, 1, kp if kp else kdim)) if bias_kv else None
    bv = rng.standard_normal((1, 1, vp if vp else vdim)) if bias_kv else None
    return q, k, v, w, bk, bv


def _kw(cfg):
    E, kdim, vdim, H, qp, kp, vp, op, qb, kb, vb, ob = cfg
    return dict(qproj_size=qp, kproj_size=kp, vproj_size=vp, oproj_size=op, qbias=qb, kbias=kb, vbias=vb, obias=ob)


@pytest.mark.parametrize("extras", ["plain", "bias_kv_zero_attn_masks"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_flat_layout_matches_the_numpy_reference(name, extras):
    cfg = CONFIGS[name]
    E, H = cfg[0], cfg[3]
    more = extras != "plain"
    q, k, v, w, bk, bv = _case(cfg, 1, bias_kv=more)
    N, L, S = q.shape[0], q.shape[1], k.shape[1]
    kw = _kw(cfg)
    am = kpm = add = None
    if more:
        rng = _rng(2)
        am = rng.standard_normal((N * H, L, S))                    # float, per head, the appended keys padded
        kpm = np.zeros((N, S), bool)
        kpm[0, 1] = kpm[1, 3] = True                                # bool: True is not attended
        add = np.concatenate([am.reshape(N, H, L, S), np.zeros((N, H, L, 2))], -1)
        add = add + np.where(np.concatenate([kpm, np.zeros((N, 2), bool)], 1), -np.inf, 0)[:, None, None]
    out, weights = F.nn.multi_head_attention(
        gc.tensor(q), gc.tensor(k), gc.tensor(v), E, H, 0.0, 0.0, None if w is None else gc.tensor(w), **kw,
        bias_k=None if bk is None else gc.tensor(bk), bias_v=None if bv is None else gc.tensor(bv),
        add_zero_attn=more, key_padding_mask=None if kpm is None else gc.tensor(kpm),
        attn_mask=None if am is None else gc.tensor(am), need_weights=True)
    ref_out, ref_w = _ref_mha(q, k, v, w if w is not None else np.zeros(0), E, H, *cfg[4:], bias_k=bk,
                              bias_v=bv, zero_attn=more, add_mask=add)
    np.testing.assert_allclose(out.numpy(), ref_out, **TOL)
    np.testing.assert_allclose(weights.numpy(), ref_w.reshape(N * H, L, -1), **TOL)


@pytest.mark.parametrize("name", ["kvdim_some_biases", "no_q_projection", "v_but_no_o_projection"])
def test_gradients_of_every_input_by_finite_differences(name):
    """First and second order, every input: query, key, value, the flat
    weights, bias_k and bias_v (configurations PyTorch cannot express)."""
    cfg = CONFIGS[name]
    E, H = cfg[0], cfg[3]
    q, k, v, w, bk, bv = _case(cfg, 3, N=1, L=2, S=3, bias_kv=True)
    am = _rng(4).standard_normal((2, 3))

    def f(q, k, v, w, bk, bv):
        return F.nn.multi_head_attention(q, k, v, E, H, 0.0, 0.0, w, **_kw(cfg), bias_k=bk, bias_v=bv,
                                         add_zero_attn=True, attn_mask=gc.tensor(am), need_weights=True,
                                         average_attn_weights=True)
    xs = [gc.tensor(a) for a in (q, k, v, w, bk, bv)]
    assert gradcheck(f, xs, atol=1e-6)
    assert gradgradcheck(lambda *a: f(*a)[0], xs, atol=1e-5)


# ---- against PyTorch, weights re-packed
def _torch_case(seed, E=8, H=2, kdim=None, vdim=None, bias=True, bias_kv=False, N=2, L=3, S=4):
    rng = _rng(seed)
    kdim, vdim = kdim or E, vdim or E
    t = dict(Wq=rng.standard_normal((E, E)), Wk=rng.standard_normal((E, kdim)), Wv=rng.standard_normal((E, vdim)),
             Wo=rng.standard_normal((E, E)))
    if bias:
        t.update(bq=rng.standard_normal(E), bk=rng.standard_normal(E), bv=rng.standard_normal(E),
                 bo=rng.standard_normal(E))
    if bias_kv:
        t.update(bias_k=rng.standard_normal((1, 1, E)), bias_v=rng.standard_normal((1, 1, E)))
    x = dict(q=rng.standard_normal((N, L, E)), k=rng.standard_normal((N, S, kdim)),
             v=rng.standard_normal((N, S, vdim)))
    return t, x


def _pack(t):
    """PyTorch's (out, in) projections into MegEngine's flat layout."""
    parts = [t[n].T for n in ("Wq", "Wk", "Wv", "Wo")] + [t[n] for n in ("bq", "bk", "bv", "bo") if n in t]
    return np.concatenate([p.reshape(-1) for p in parts]).reshape(1, -1)


@pytest.mark.parametrize("case", ["plain", "no_bias", "kvdim", "bias_kv", "zero_attn", "bool_masks",
                                  "float_masks", "mask_3d", "per_head", "causal", "unbatched"])
def test_functional_matches_torch_values_and_gradients(case):
    E, H = 8, 2
    kdim, vdim = (5, 6) if case == "kvdim" else (None, None)
    t, x = _torch_case(10, E, H, kdim, vdim, bias=case != "no_bias", bias_kv=case == "bias_kv")
    N, L, S = x["q"].shape[0], x["q"].shape[1], x["k"].shape[1]
    rng = _rng(11)
    am = kpm = None
    if case == "bool_masks":
        am = rng.random((L, S)) < 0.3
        am[:, 0] = False
        kpm = np.array([[False, False, True, False], [False, True, False, False]])
    elif case == "float_masks":
        am, kpm = rng.standard_normal((L, S)), rng.standard_normal((N, S))
    elif case == "mask_3d":
        am = rng.standard_normal((N * H, L, S))
    elif case == "causal":
        x["k"], x["v"] = x["k"][:, :L], x["v"][:, :L]
    avg = case != "per_head"
    unbatched = case == "unbatched"
    if unbatched:
        x = {n: a[0] for n, a in x.items()}
    flat = _pack(t)
    gx = {n: gc.tensor(a) for n, a in x.items()}
    gw = gc.tensor(flat)
    gkv = [gc.tensor(t[n]) for n in ("bias_k", "bias_v") if n in t]
    gm = gc.GradManager().attach(list(gx.values()) + [gw] + gkv)
    with gm:
        out, weights = F.nn.multi_head_attention(
            gx["q"], gx["k"], gx["v"], E, H, 0.0, 0.0, gw, qbias="bq" in t, kbias="bq" in t, vbias="bq" in t,
            obias="bq" in t, bias_k=gkv[0] if gkv else None, bias_v=gkv[1] if gkv else None,
            add_zero_attn=case == "zero_attn", key_padding_mask=None if kpm is None else gc.tensor(kpm),
            attn_mask=None if am is None else gc.tensor(am), need_weights=True, average_attn_weights=avg,
            is_causal=case == "causal")
        w1, w2 = _rng(12).standard_normal(out.shape), _rng(13).standard_normal(weights.shape)
        gm.backward(F.sum(out * gc.tensor(w1)) + F.sum(weights * gc.tensor(w2)))

    tt = {n: torch.tensor(a, requires_grad=True) for n, a in t.items()}
    tx = {n: torch.tensor(a, requires_grad=True) for n, a in x.items()}
    qkv = [a.unsqueeze(1) if unbatched else a.transpose(0, 1) for a in (tx["q"], tx["k"], tx["v"])]   # (L, N, E)
    same = kdim is None
    t_am = am
    if case == "causal":
        t_am = np.triu(np.ones((L, L), bool), 1)       # PyTorch needs the mask the hint describes
    t_out, t_w = TF.multi_head_attention_forward(
        *qkv, E, H, torch.cat([tt["Wq"], tt["Wk"], tt["Wv"]]) if same else None,
        torch.cat([tt["bq"], tt["bk"], tt["bv"]]) if "bq" in t else None, tt.get("bias_k"), tt.get("bias_v"),
        case == "zero_attn", 0.0, tt["Wo"], tt.get("bo"), training=False,
        key_padding_mask=None if kpm is None else torch.tensor(kpm if not unbatched else kpm[:1]),
        need_weights=True, attn_mask=None if t_am is None else torch.tensor(t_am),
        use_separate_proj_weight=not same, q_proj_weight=tt["Wq"], k_proj_weight=tt["Wk"],
        v_proj_weight=tt["Wv"], average_attn_weights=avg)
    t_out = t_out[:, 0] if unbatched else t_out.transpose(0, 1)
    if not avg:
        t_w = t_w.reshape(N * H, L, -1)
    elif unbatched:
        t_w = t_w[0]
    (t_out * torch.tensor(w1)).sum().add((t_w * torch.tensor(w2)).sum()).backward()
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), **TOL)
    np.testing.assert_allclose(weights.numpy(), t_w.detach().numpy(), **TOL)
    for n in ("q", "k", "v"):
        np.testing.assert_allclose(gx[n].grad.numpy(), tx[n].grad.numpy(), **TOL)
    np.testing.assert_allclose(gw.grad.numpy(), _pack({n: tt[n].grad.numpy() for n in t if n[0] in "Wb"
                                                       and n not in ("bias_k", "bias_v")}), **TOL)
    for g, n in zip(gkv, ("bias_k", "bias_v")):
        np.testing.assert_allclose(g.grad.numpy(), tt[n].grad.numpy(), **TOL)


def test_mask_kinds_agree():
    """A bool mask is the float mask with -inf where True; a mask that
    already covers the appended keys (S + 2 wide) equals the S-wide one with
    zero columns; is_causal without attn_mask is the lower triangle, with
    one it is only a hint (the mask is used)."""
    cfg = CONFIGS["default"]
    q, k, v, w, bk, bv = (None if a is None else gc.tensor(a) for a in _case(cfg, 5, bias_kv=True))
    E, H = 8, 2
    L, S = 3, 4
    rng = _rng(6)
    am_bool = rng.random((L, S)) < 0.4
    am_bool[:, 0] = False

    def run(**kw):
        return F.nn.multi_head_attention(q, k, v, E, H, 0.0, 0.0, w, qbias=True, kbias=True, vbias=True, obias=True,
                                         need_weights=True, **kw)
    ref = run(attn_mask=gc.tensor(np.where(am_bool, -np.inf, 0.0)))
    for got in (run(attn_mask=gc.tensor(am_bool)),):
        np.testing.assert_array_equal(got[0].numpy(), ref[0].numpy())
        np.testing.assert_array_equal(got[1].numpy(), ref[1].numpy())
    am_f = rng.standard_normal((L, S))
    a = run(attn_mask=gc.tensor(am_f), bias_k=bk, bias_v=bv, add_zero_attn=True)
    b = run(attn_mask=gc.tensor(np.pad(am_f, ((0, 0), (0, 2)))), bias_k=bk, bias_v=bv, add_zero_attn=True)
    np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
    assert a[1].shape == (2 * H, L, S + 2)
    kpm = np.array([[False, True, False, False], [True, False, False, False]])
    c = run(key_padding_mask=gc.tensor(kpm))
    d = run(key_padding_mask=gc.tensor(np.where(kpm, -np.inf, 0.0)))
    np.testing.assert_array_equal(c[0].numpy(), d[0].numpy())
    assert (c[1].numpy().reshape(2, H, L, S)[0, :, :, 1] == 0).all()
    causal = run(is_causal=True, attn_mask=None)
    tri = run(attn_mask=gc.tensor(np.triu(np.ones((L, S), bool), 1)))
    np.testing.assert_array_equal(causal[0].numpy(), tri[0].numpy())
    assert (np.triu(causal[1].numpy()[0], 1) == 0).all()
    hinted = run(is_causal=True, attn_mask=gc.tensor(am_f))
    np.testing.assert_array_equal(hinted[0].numpy(), run(attn_mask=gc.tensor(am_f))[0].numpy())
    # a float mask of another dtype is read in the query's
    e = run(attn_mask=gc.tensor(am_f.astype("float32")))
    assert e[0].dtype == np.float64


def test_returns_and_shapes():
    cfg = CONFIGS["default"]
    q, k, v, w, _, _ = (None if a is None else gc.tensor(a) for a in _case(cfg, 7))
    kw = dict(qbias=True, kbias=True, vbias=True, obias=True)
    out, none = F.nn.multi_head_attention(q, k, v, 8, 2, 0.0, 0.0, w, **kw)
    assert none is None and out.shape == (2, 3, 8)
    _, per = F.nn.multi_head_attention(q, k, v, 8, 2, 0.0, 0.0, w, **kw, need_weights=True)
    _, avg = F.nn.multi_head_attention(q, k, v, 8, 2, 0.0, 0.0, w, **kw, need_weights=True,
                                       average_attn_weights=True)
    assert per.shape == (4, 3, 4) and avg.shape == (2, 3, 4)
    np.testing.assert_allclose(avg.numpy(), per.numpy().reshape(2, 2, 3, 4).mean(1), **TOL)
    np.testing.assert_allclose(per.numpy().sum(-1), 1.0, **TOL)
    # unbatched (L, E): (L, E) out, (H, L, S) per head or (L, S) averaged
    o1, w1 = F.nn.multi_head_attention(q[0], k[0], v[0], 8, 2, 0.0, 0.0, w, **kw, need_weights=True)
    np.testing.assert_allclose(o1.numpy(), out.numpy()[0], **TOL)
    assert w1.shape == (2, 3, 4)
    _, w2 = F.nn.multi_head_attention(q[0], k[0], v[0], 8, 2, 0.0, 0.0, w, **kw, need_weights=True,
                                      average_attn_weights=True)
    assert w2.shape == (3, 4)
    # reslink adds the query to the output
    r, _ = F.nn.multi_head_attention(q, k, v, 8, 2, 0.0, 0.0, w, **kw, reslink=True)
    np.testing.assert_allclose(r.numpy(), out.numpy() + q.numpy(), **TOL)
    # the defaults: every *proj_size embed_dim, no biases
    n = 4 * 64
    out0, _ = F.nn.multi_head_attention(q, k, v, 8, 2, 0.0, 0.0, gc.tensor(w.numpy()[:, :n]))
    ref, _ = _ref_mha(q.numpy(), k.numpy(), v.numpy(), w.numpy()[:, :n], 8, 2, 8, 8, 8, 8, False, False, False, False)
    np.testing.assert_allclose(out0.numpy(), ref, **TOL)


def test_dropout_while_training_only():
    cfg = CONFIGS["default"]
    q, k, v, w, _, _ = (None if a is None else gc.tensor(a) for a in _case(cfg, 8))
    kw = dict(qbias=True, kbias=True, vbias=True, obias=True, need_weights=True)
    plain = F.nn.multi_head_attention(q, k, v, 8, 2, 0.0, 0.0, w, **kw)
    off = F.nn.multi_head_attention(q, k, v, 8, 2, 0.5, 0.5, w, **kw, training=False)
    np.testing.assert_array_equal(off[0].numpy(), plain[0].numpy())
    gc.random.seed(3)
    a = F.nn.multi_head_attention(q, k, v, 8, 2, 0.5, 0.0, w, **kw)
    gc.random.seed(3)
    b = F.nn.multi_head_attention(q, k, v, 8, 2, 0.5, 0.0, w, **kw)
    np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
    assert not np.allclose(a[0].numpy(), plain[0].numpy())
    dropped = a[1].numpy()
    assert (dropped == 0).any()
    kept = dropped != 0     # the weights returned are softmax's after its dropout, kept ones scaled by 2
    np.testing.assert_allclose(dropped[kept], 2 * plain[1].numpy()[kept], **TOL)
    gc.random.seed(4)
    o, _ = F.nn.multi_head_attention(q, k, v, 8, 2, 0.0, 0.5, w, **kw)
    z = o.numpy() == 0
    assert z.any() and np.allclose(o.numpy()[~z], 2 * plain[0].numpy()[~z])


def test_cudnn_style_masks():
    """attn_mask (2, L): each query's key window [start, end);
    key_padding_mask (2, N): query and key lengths; rows past a query length
    are zeros."""
    cfg = CONFIGS["default"]
    q, k, v, w, _, _ = _case(cfg, 9, L=3, S=5)
    N, L, S, H = 2, 3, 5, 2
    win = np.array([[0, 1, 0], [2, 4, 5]], np.int32)
    lens = np.array([[3, 2], [5, 3]], np.int32)
    out, weights = F.nn.multi_head_attention(
        gc.tensor(q), gc.tensor(k), gc.tensor(v), 8, H, 0.0, 0.0, gc.tensor(w), **_kw(cfg),
        attn_mask=gc.tensor(win), key_padding_mask=gc.tensor(lens), maybe_cudnn_style_mask=True, need_weights=True)
    keep = np.zeros((N, L, S), bool)
    for n in range(N):
        for i in range(L):
            keep[n, i, win[0, i]:min(win[1, i], lens[1, n])] = True
    add = np.where(keep, 0.0, -np.inf)[:, None].repeat(H, 1)
    add[1, :, 2] = 0.0                                  # past sequence 1's 2 queries: computed, then zeroed
    ref_out, ref_w = _ref_mha(q, k, v, w, 8, H, *cfg[4:], add_mask=add)
    ref_out[1, 2] = 0
    ref_w[1, :, 2] = 0
    np.testing.assert_allclose(out.numpy(), ref_out, **TOL)
    np.testing.assert_allclose(weights.numpy(), ref_w.reshape(N * H, L, S), **TOL)
    with pytest.raises(ValueError, match=r"maybe_cudnn_style_mask needs both attn_mask \(2, 3\)"):
        F.nn.multi_head_attention(gc.tensor(q), gc.tensor(k), gc.tensor(v), 8, H, 0.0, 0.0, gc.tensor(w),
                                  **_kw(cfg), attn_mask=gc.tensor(win), maybe_cudnn_style_mask=True)
    with pytest.raises(ValueError, match="0 <= start < end <= 5"):
        F.nn.multi_head_attention(gc.tensor(q), gc.tensor(k), gc.tensor(v), 8, H, 0.0, 0.0, gc.tensor(w),
                                  **_kw(cfg), attn_mask=gc.tensor(win[::-1].copy()),
                                  key_padding_mask=gc.tensor(lens), maybe_cudnn_style_mask=True)


def test_bad_arguments_name_the_op_and_shapes():
    cfg = CONFIGS["default"]
    q, k, v, w, bk, bv = (None if a is None else gc.tensor(a) for a in _case(cfg, 10, bias_kv=True))
    mha = F.nn.multi_head_attention
    with pytest.raises(ValueError, match=r"multi_head_attention: io_weight_bias of shape \(1, 288\) has 288 values;"
                                         r" query weight \(8, 8\).* need 256"):
        mha(q, k, v, 8, 2, 0.0, 0.0, w)
    with pytest.raises(ValueError, match="qbias needs its projection"):
        mha(q, k, v, 8, 2, 0.0, 0.0, w, qproj_size=0, qbias=True)
    with pytest.raises(ValueError, match="give both bias_k and bias_v"):
        mha(q, k, v, 8, 2, 0.0, 0.0, w, qbias=True, kbias=True, vbias=True, obias=True, bias_k=bk)
    with pytest.raises(ValueError, match=r"bias_k must be \(1, 1, 8\)"):
        mha(q, k, v, 8, 2, 0.0, 0.0, w, qbias=True, kbias=True, vbias=True, obias=True, bias_k=bk[:, :, :4],
            bias_v=bv)
    with pytest.raises(ValueError, match=r"attn_mask must be \(3, 4\) or \(4, 3, 4\)"):
        mha(q, k, v, 8, 2, 0.0, 0.0, w, qbias=True, kbias=True, vbias=True, obias=True,
            attn_mask=gc.tensor(np.zeros((3, 3))))
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(2, 4\)"):
        mha(q, k, v, 8, 2, 0.0, 0.0, w, qbias=True, kbias=True, vbias=True, obias=True,
            key_padding_mask=gc.tensor(np.zeros((2, 3), bool)))
    with pytest.raises(TypeError, match="attn_mask must be bool or floating-point"):
        mha(q, k, v, 8, 2, 0.0, 0.0, w, qbias=True, kbias=True, vbias=True, obias=True,
            attn_mask=gc.tensor(np.zeros((3, 4), "int32")))
    with pytest.raises(ValueError, match=r"expected query \(N, L, 8\)"):
        mha(q[:, :, :6], k, v, 8, 2, 0.0, 0.0, w, qbias=True, kbias=True, vbias=True, obias=True)
    with pytest.raises(ValueError, match="qproj_size 9 must be divisible by num_heads 2"):
        mha(q, k, v, 8, 2, 0.0, 0.0, None, qproj_size=9, kproj_size=0, vproj_size=0, oproj_size=0)
    with pytest.raises(ValueError, match="a head's query width 4"):
        mha(q, k, v, 8, 2, 0.0, 0.0, gc.tensor(np.zeros(64)), kproj_size=0, vproj_size=0, oproj_size=0)
    with pytest.raises(ValueError, match="io_weight_bias is None"):
        mha(q, k, v, 8, 2, 0.0, 0.0, None)
    with pytest.raises(ValueError, match="reslink adds the query"):
        mha(q, k, v, 8, 2, 0.0, 0.0, gc.tensor(np.zeros((1, 3 * 64 + 8 * 5))), oproj_size=5, reslink=True)
    with pytest.raises(ValueError, match="drop_prob must be in"):
        mha(q, k, v, 8, 2, 1.0, 0.0, w, qbias=True, kbias=True, vbias=True, obias=True)


# ---- the module's MegEngine form
def _megengine_state(seed, E=8, kdim=8, vdim=8, bias=True, bias_kv=False):
    """A state_dict as MegEngine's M.MultiHeadAttention saves it: io_weight_bias (1, n), bias_k/bias_v (1, 1, E)."""
    rng = _rng(seed)
    n = (2 * E + kdim + vdim) * E + (4 * E if bias else 0)
    sd = {"io_weight_bias": (rng.standard_normal((1, n)) * 0.3).astype("float32")}
    if bias_kv:
        sd.update(bias_k=rng.standard_normal((1, 1, E)).astype("float32"),
                  bias_v=rng.standard_normal((1, 1, E)).astype("float32"))
    return sd


@pytest.mark.parametrize("kvdim,bias,bias_kv,zero_attn", [((8, 8), True, False, False), ((5, 6), False, True, True),
                                                           ((8, 8), True, True, False)])
def test_module_loads_megengines_state_dict(kvdim, bias, bias_kv, zero_attn):
    E, H = 8, 2
    sd = _megengine_state(20, E, *kvdim, bias, bias_kv)
    m = M.MultiHeadAttention(E, H, bias=bias, add_bias_kv=bias_kv, add_zero_attn=zero_attn, kdim=kvdim[0],
                             vdim=kvdim[1], weight_layout="megengine")
    assert sorted(m.state_dict()) == sorted(sd)
    m.load_state_dict(sd)
    m.eval()
    rng = _rng(21)
    q, k, v = rng.standard_normal((2, 3, E)), rng.standard_normal((2, 4, kvdim[0])), rng.standard_normal((2, 4, kvdim[1]))
    kpm = np.array([[False, False, True, False], [False, False, False, False]])
    out, weights = m(gc.tensor(q.astype("float32")), gc.tensor(k.astype("float32")),
                     gc.tensor(v.astype("float32")), key_padding_mask=gc.tensor(kpm), need_weights=True)
    extra = int(bias_kv) + int(zero_attn)
    add = np.where(np.pad(kpm, ((0, 0), (0, extra))), -np.inf, 0.0)[:, None, None].repeat(H, 1).repeat(3, 2)
    ref_out, ref_w = _ref_mha(q, k, v, sd["io_weight_bias"].astype(np.float64), E, H, E, E, E, E, bias, bias, bias,
                              bias, bias_k=sd.get("bias_k"), bias_v=sd.get("bias_v"), zero_attn=zero_attn,
                              add_mask=add)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(weights.numpy(), ref_w.reshape(2 * H, 3, 4 + extra), rtol=1e-4, atol=1e-5)
    # the same state_dict comes back out, and a flat (n,) io_weight_bias loads as (1, n)
    np.testing.assert_array_equal(m.state_dict()["io_weight_bias"], sd["io_weight_bias"])
    m2 = M.MultiHeadAttention(E, H, bias=bias, add_bias_kv=bias_kv, add_zero_attn=zero_attn, kdim=kvdim[0],
                              vdim=kvdim[1], weight_layout="megengine")
    m2.load_state_dict({**sd, "io_weight_bias": sd["io_weight_bias"].reshape(-1)})
    np.testing.assert_array_equal(m2.io_weight_bias.numpy(), sd["io_weight_bias"])


def test_module_forms_convert_both_ways_and_match_torch():
    """A PyTorch checkpoint into MegEngine's form and MegEngine's into
    PyTorch's form (also nested in a model) give PyTorch's outputs."""
    E, H = 8, 2
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(E, H, add_bias_kv=True, batch_first=True).double()
    with torch.no_grad():
        tm.in_proj_bias.normal_()
        tm.out_proj.bias.normal_()
    x = _rng(30).standard_normal((2, 3, E))
    t_out, t_w = tm(*(torch.tensor(x),) * 3, average_attn_weights=False)
    me = M.MultiHeadAttention(E, H, add_bias_kv=True, weight_layout="megengine")
    me.load_state_dict(tm.state_dict())
    assert set(me.state_dict()) == {"io_weight_bias", "bias_k", "bias_v"}
    pt = M.MultiHeadAttention(E, H, add_bias_kv=True)          # PyTorch's form, the default
    pt.load_state_dict(me.state_dict())
    for m in (me, pt):
        m.eval()
        out, w = m(*(gc.tensor(x.astype("float32")),) * 3, need_weights=True)
        np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(w.numpy(), t_w.detach().reshape(2 * H, 3, 4).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pt.in_proj_weight.numpy(), tm.in_proj_weight.detach().numpy(), rtol=1e-6)

    class Model(M.Module):
        def __init__(self, layout):
            super().__init__()
            self.attn = M.MultiHeadAttention(E, H, kdim=5, vdim=6, weight_layout=layout)
    src, dst = Model("megengine"), Model("pytorch")
    dst.load_state_dict(src.state_dict())
    assert sorted(dst.state_dict()) == ["attn.in_proj_bias", "attn.k_proj_weight", "attn.out_proj.bias",
                                        "attn.out_proj.weight", "attn.q_proj_weight", "attn.v_proj_weight"]
    back = Model("megengine")
    back.load_state_dict(dst.state_dict())
    np.testing.assert_array_equal(back.attn.io_weight_bias.numpy(), src.attn.io_weight_bias.numpy())
    q, k, v = (gc.tensor(_rng(31 + i).standard_normal((2, 3, d)).astype("float32")) for i, d in enumerate((E, 5, 6)))
    np.testing.assert_allclose(src.attn(q, k, v)[0].numpy(), dst.attn(q, k, v)[0].numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="io_weight_bias of shape"):
        Model("pytorch").load_state_dict({"attn.io_weight_bias": np.zeros((1, 10), "float32")})
    with pytest.raises(KeyError, match="missing keys"):
        M.MultiHeadAttention(E, H, weight_layout="megengine").load_state_dict(
            {"in_proj_weight": tm.in_proj_weight.detach()})


def test_module_init_is_megengines_and_gradients_reach_io_weight_bias():
    gc.random.seed(0)
    m = M.MultiHeadAttention(16, 4, add_bias_kv=True, weight_layout="megengine")
    flat = m.io_weight_bias.numpy()
    n_w = 4 * 16 * 16
    assert flat.shape == (1, n_w + 4 * 16) and m.weight_bias_len == flat.shape[1]
    assert (flat[0, n_w:] == 0).all()
    bound = np.sqrt(6.0 / (flat.shape[1] + 1))        # Xavier over the whole (1, n) parameter, as MegEngine
    assert np.abs(flat).max() <= bound and np.abs(flat).max() > 0.9 * bound
    assert m.bias_k.shape == (1, 1, 16) and np.abs(m.bias_k.numpy()).max() <= np.sqrt(6.0 / 32)
    with pytest.raises(ValueError, match="weight_layout must be one of"):
        M.MultiHeadAttention(16, 4, weight_layout="tf")
    x = gc.tensor(_rng(40).standard_normal((2, 3, 16)).astype("float32"))
    gm = gc.GradManager().attach(m.parameters())
    with gm:
        gm.backward(F.sum(m(x, x, x)[0] ** 2))
    assert m.io_weight_bias.grad.shape == (1, n_w + 64) and np.abs(m.io_weight_bias.grad.numpy()).max() > 0
    assert np.abs(m.bias_k.grad.numpy()).max() > 0
