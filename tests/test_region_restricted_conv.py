"""F.nn.region_restricted_conv (MegEngine's): with one region everywhere it
is PyTorch's grouped conv2d (values and gradients); with regions, a loop
over its definition; gradients against finite differences; bad input."""
import numpy as np
import pytest
import torch

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager
from gradcore.op import ArgumentError
from gradcore.testing import gradcheck

CASES = [dict(stride=1, padding=0, dilation=1, groups=1), dict(stride=2, padding=1, dilation=1, groups=3),
         dict(stride=(1, 2), padding=(2, 1), dilation=(2, 1), groups=3)]


def _out_hw(h, w, k, stride, padding, dilation):
    s, p, d = (np.broadcast_to(v, 2) for v in (stride, padding, dilation))
    return tuple(int((n + 2 * p[i] - d[i] * (k - 1) - 1) // s[i] + 1) for i, n in enumerate((h, w)))


@pytest.mark.parametrize("case", CASES)
def test_one_region_is_torch_grouped_conv2d(case):
    rng = np.random.default_rng(0)
    g = case["groups"]
    x, w, b = rng.standard_normal((2, 6, 7, 8)), rng.standard_normal((g, 4, 6 // g, 3, 3)), \
        rng.standard_normal((1, g * 4, 1, 1))
    oh, ow = _out_hw(7, 8, 3, case["stride"], case["padding"], case["dilation"])
    rin, rout = np.full((2, 7, 8), 5, np.int32), np.full((2, oh, ow), 5, np.int32)
    xs, ws, bs = gc.Parameter(x), gc.Parameter(w), gc.Parameter(b)
    gm = GradManager().attach([xs, ws, bs])
    with gm:
        out = F.nn.region_restricted_conv(xs, ws, gc.tensor(rin), gc.tensor(rout), bs, **case)
        gm.backward((out * out).sum())
    tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (x, w, b))
    ref = torch.nn.functional.conv2d(tx, tw.reshape(-1, 6 // g, 3, 3), None, case["stride"], case["padding"],
                                     case["dilation"], g) + tb
    (ref * ref).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-10, atol=1e-10)
    for got, want in ((xs.grad, tx.grad), (ws.grad, tw.grad), (bs.grad, tb.grad)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-9)


def _reference(x, w, rin, rout, stride, padding, dilation, groups):
    n, c, h, wd = x.shape
    g, ocg, icg, kh, kw = w.shape
    oh, ow = rout.shape[1:]
    out = np.zeros((n, g * ocg, oh, ow))
    for b in range(n):
        for oc in range(g * ocg):
            grp = oc // ocg
            for y in range(oh):
                for xx in range(ow):
                    for i in range(kh):
                        for j in range(kw):
                            iy, ix = y * stride - padding + i * dilation, xx * stride - padding + j * dilation
                            if 0 <= iy < h and 0 <= ix < wd and rin[b, iy, ix] == rout[b, y, xx]:
                                out[b, oc, y, xx] += (w[grp, oc % ocg, :, i, j] *
                                                      x[b, grp * icg:(grp + 1) * icg, iy, ix]).sum()
    return out


@pytest.mark.parametrize("stride, padding, dilation, groups", [(1, 0, 1, 1), (2, 1, 1, 2), (1, 2, 2, 4)])
def test_regions_match_the_definition(stride, padding, dilation, groups):
    rng = np.random.default_rng(stride + padding)
    x, w = rng.standard_normal((2, 4, 6, 7)), rng.standard_normal((groups, 2, 4 // groups, 3, 3))
    oh, ow = _out_hw(6, 7, 3, stride, padding, dilation)
    rin, rout = rng.integers(0, 3, (2, 6, 7)).astype(np.int32), rng.integers(0, 3, (2, oh, ow)).astype(np.int32)
    out = F.nn.region_restricted_conv(gc.tensor(x), gc.tensor(w), gc.tensor(rin), gc.tensor(rout), stride=stride,
                                      padding=padding, dilation=dilation, groups=groups)
    np.testing.assert_allclose(out.numpy(), _reference(x, w, rin, rout, stride, padding, dilation, groups),
                               rtol=1e-12, atol=1e-12)
    rin_t, rout_t = gc.tensor(rin), gc.tensor(rout)
    assert gradcheck(lambda a, b: F.nn.region_restricted_conv(a, b, rin_t, rout_t, stride=stride, padding=padding,
                                                              dilation=dilation, groups=groups),
                     [gc.tensor(x), gc.tensor(w)])


def test_bad_inputs():
    x, w = gc.tensor(np.ones((1, 2, 4, 4), np.float32)), gc.tensor(np.ones((2, 1, 1, 3, 3), np.float32))
    rin, rout = gc.tensor(np.ones((1, 4, 4), np.int32)), gc.tensor(np.ones((1, 2, 2), np.int32))
    assert F.region_restricted_conv(x, w, rin, rout, groups=2).shape == (1, 2, 2, 2)
    with pytest.raises(ArgumentError, match=r"region_restricted_conv: inp must be \(N, C, H, W\) and weight"):
        F.nn.region_restricted_conv(x, w, rin, rout, groups=1)
    with pytest.raises(ArgumentError, match=r"region_restricted_conv: rout must be an integer tensor of shape "
                                            r"\(1, 2, 2\)"):
        F.nn.region_restricted_conv(x, w, rin, gc.tensor(np.ones((1, 3, 3), np.int32)), groups=2)
    with pytest.raises(ArgumentError, match="region_restricted_conv: rin must be an integer tensor"):
        F.nn.region_restricted_conv(x, w, gc.tensor(np.ones((1, 4, 4), np.float32)), rout, groups=2)


# ---- M.RegionRestrictedConv (MegEngine's module/conv.py layer)

def test_module_layout_init_and_forward():
    import gradcore.module as M
    rr = M.RegionRestrictedConv(6, 4, (3, 2), groups=2, bias=True, stride=2, padding=1, dilation=1)
    # MegEngine's names and the grouped layout, one group too
    assert [n for n, _ in rr.named_parameters()] == ["bias", "weight"]
    assert rr.weight.shape == (2, 2, 3, 3, 2) and rr.bias.shape == (1, 4, 1, 1)
    assert M.RegionRestrictedConv(3, 5, 3).weight.shape == (1, 5, 3, 3, 3)
    assert M.RegionRestrictedConv(3, 5, 3, bias=False).bias is None
    np.testing.assert_array_equal(rr.bias.numpy(), 0)
    big = M.RegionRestrictedConv(64, 64, 3, groups=1)
    # N(0, 1 / (kh * kw * in_channels))
    assert abs(big.weight.numpy().std() - np.sqrt(1 / (9 * 64))) < 0.003
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 7, 6)).astype("float32")
    rr.bias.set_value(rng.standard_normal((1, 4, 1, 1)).astype("float32"))
    oh, ow = (7 + 2 - 3) // 2 + 1, (6 + 2 - 2) // 2 + 1
    rin = rng.integers(0, 3, (2, 7, 6)).astype("int32")
    rout = rng.integers(0, 3, (2, oh, ow)).astype("int32")
    out = rr(gc.tensor(x), gc.tensor(rin), gc.tensor(rout))
    want = _reference(x.astype("float64"), rr.weight.numpy().astype("float64"), rin, rout, 2, 1, 1, 2) \
        + rr.bias.numpy()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


def test_module_gradients_reach_weight_and_bias():
    import gradcore.module as M
    rr = M.RegionRestrictedConv(2, 2, 2, groups=2)
    rng = np.random.default_rng(4)
    x = gc.tensor(rng.standard_normal((1, 2, 3, 3)).astype("float32"))
    rin, rout = gc.tensor(np.zeros((1, 3, 3), "int32")), gc.tensor(np.zeros((1, 2, 2), "int32"))
    gm = GradManager().attach(rr.parameters())
    with gm:
        gm.backward(rr(x, rin, rout).sum())
    # one region: d sum / d bias is the output positions, d sum / d w the input windows' sums
    np.testing.assert_allclose(rr.bias.grad.numpy(), np.full((1, 2, 1, 1), 4.0))
    xv = x.numpy()[0]
    win = np.stack([[[xv[c, i:i + 2, j:j + 2] for j in range(2)] for i in range(2)] for c in range(2)]).sum((1, 2))
    np.testing.assert_allclose(rr.weight.grad.numpy().reshape(2, 2, 2), win, rtol=1e-5)
    with pytest.raises(ArgumentError, match="RegionRestrictedConv: padding_mode"):
        M.RegionRestrictedConv(2, 2, 2, padding_mode="circular")
