"""F.local_conv2d and M.LocalConv2d (MegEngine's locally connected layer)
against PyTorch: the reference is torch's unfold (the windows) contracted
with the untied kernel by torch.einsum, in float64, values and gradients
(for input, weight and bias), groups, padding, stride and dilation; against
finite differences; the layer's weight layout, initialisation and errors."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
from oracle import check_grads, compare_with_torch

torch = pytest.importorskip("torch")


def _torch_local_conv2d(x, w, bias, stride, padding, dilation):
    g, oh, ow, cg, kh, kw, ocg = w.shape
    n = x.shape[0]
    cols = torch.nn.functional.unfold(x, (kh, kw), dilation=dilation, padding=padding, stride=stride)
    cols = cols.reshape(n, g, cg, kh, kw, oh, ow)
    out = torch.einsum("ngcijyx,gyxcijo->ngoyx", cols, w).reshape(n, g * ocg, oh, ow)
    return out if bias is None else out + bias


@pytest.mark.parametrize("groups, stride, padding, dilation", [
    (1, 1, 0, 1), (2, 1, 1, 1), (1, (2, 1), (1, 2), 1), (3, 2, 1, (2, 1))])
def test_local_conv2d_matches_torch(groups, stride, padding, dilation):
    rng = np.random.default_rng(groups)
    n, c, h, w, oc, k = 2, 3 * groups, 6, 5, 2 * groups, (3, 2)
    s = (stride, stride) if isinstance(stride, int) else stride
    p = (padding, padding) if isinstance(padding, int) else padding
    d = (dilation, dilation) if isinstance(dilation, int) else dilation
    oh = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    x = rng.standard_normal((n, c, h, w))
    weight = rng.standard_normal((groups, oh, ow, c // groups, *k, oc // groups))
    bias = rng.standard_normal((1, oc, 1, 1))
    compare_with_torch(torch, lambda a, b, cst: F.local_conv2d(a, b, cst, stride, padding, dilation),
                       lambda a, b, cst: _torch_local_conv2d(a, b, cst, s, p, d), [x, weight, bias],
                       rtol=1e-10, atol=1e-12, need_grads=True)


def test_local_conv2d_grads_match_finite_differences():
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((1, 2, 3, 3)), rng.standard_normal((1, 4, 4, 2, 2, 2, 2))   # padding 1: 4x4 out
    check_grads(lambda a, b: F.local_conv2d(a, b, None, 1, 1), [x, w])


def test_local_conv2d_layer():
    gc.random.seed(0)
    m = M.LocalConv2d(4, 6, 7, 8, 3, stride=(2, 1), padding=1, groups=2)
    assert m.weight.shape == (2, 4, 8, 2, 3, 3, 3) and m.bias is None
    # N(0, 1 / fan_in), fan_in = kh * kw * in_channels as Conv2d's
    assert abs(float(m.weight.numpy().std()) - (1 / 36) ** 0.5) < 0.02
    x = gc.tensor(np.random.default_rng(1).standard_normal((2, 4, 7, 8)).astype("float32"))
    out = m(x)
    assert out.shape == (2, 6, 4, 8)
    np.testing.assert_allclose(out.numpy(), F.local_conv2d(x, m.weight, None, (2, 1), 1).numpy())
    assert "input_height=7" in repr(m)


def test_local_conv2d_errors():
    x = gc.tensor(np.zeros((1, 2, 4, 4), "float32"))
    with pytest.raises(gc.op.ArgumentError, match=r"^local_conv2d: weight \(1, 2, 2, 2, 2, 2, 1\) does not fit"):
        F.local_conv2d(x, gc.tensor(np.zeros((1, 2, 2, 2, 2, 2, 1), "float32")))   # output is (3, 3)
    with pytest.raises(gc.op.ArgumentError, match=r"^local_conv2d: inp must be \(N, C, H, W\)"):
        F.local_conv2d(x, gc.tensor(np.zeros((2, 2, 3, 3), "float32")))
    with pytest.raises(gc.op.ArgumentError, match="^LocalConv2d: zero padding only"):
        M.LocalConv2d(2, 2, 4, 4, 3, padding_mode="reflect")
