"""F.deformable_conv2d and M.DeformableConv2d (MegEngine's modulated
deformable convolution, DCNv2): values against a NumPy transcription of the
definition (every tap bilinearly sampled, corners off the image 0, points
outside (-1, H) x (-1, W) 0); values and gradients for input, weight,
offset, mask and bias against PyTorch (grid_sample in pixel coordinates with
zero padding, which samples the same way, then an einsum), in float64; the
gradients against finite differences; the layer and the errors."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
from oracle import check_error, check_grads, compare_with_torch

torch = pytest.importorskip("torch")


def _geometry(h, w, k, stride, padding, dilation):
    oh = (h + 2 * padding[0] - dilation[0] * (k[0] - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (k[1] - 1) - 1) // stride[1] + 1
    return oh, ow


def _numpy_dcn(x, w, offset, mask, stride, padding, dilation, groups):
    """The definition, one output element at a time."""
    n, c, h, wd = x.shape
    if w.ndim == 5:
        w = w.reshape((-1,) + w.shape[2:])
    oc, cg, kh, kw = w.shape
    oh, ow = offset.shape[2:]
    dg = offset.shape[1] // (2 * kh * kw)

    def pixel(img, yy, xx):
        return img[yy, xx] if 0 <= yy < h and 0 <= xx < wd else 0.0

    def sample(img, y, xq):
        if not (-1 < y < h and -1 < xq < wd):
            return 0.0
        y0, x0 = int(np.floor(y)), int(np.floor(xq))
        ly, lx = y - y0, xq - x0
        return ((1 - ly) * (1 - lx) * pixel(img, y0, x0) + (1 - ly) * lx * pixel(img, y0, x0 + 1)
                + ly * (1 - lx) * pixel(img, y0 + 1, x0) + ly * lx * pixel(img, y0 + 1, x0 + 1))

    out = np.zeros((n, oc, oh, ow))
    for b in range(n):
        for o in range(oc):
            g = o // (oc // groups)
            for yo in range(oh):
                for xo in range(ow):
                    acc = 0.0
                    for ci in range(cg):
                        ch = g * cg + ci
                        d = ch // (c // dg)
                        for i in range(kh):
                            for j in range(kw):
                                t = i * kw + j
                                y = yo * stride[0] - padding[0] + i * dilation[0] + offset[b, d * 2 * kh * kw + 2 * t, yo, xo]
                                xq = xo * stride[1] - padding[1] + j * dilation[1] + offset[b, d * 2 * kh * kw + 2 * t + 1, yo, xo]
                                acc += w[o, ci, i, j] * mask[b, d * kh * kw + t, yo, xo] * sample(x[b, ch], y, xq)
                    out[b, o, yo, xo] = acc
    return out


def _torch_dcn(x, w, offset, mask, bias, stride, padding, dilation, groups):
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    oh, ow = offset.shape[2:]
    taps = kh * kw
    dg = offset.shape[1] // (2 * taps)
    i = torch.arange(kh, dtype=x.dtype).repeat_interleave(kw)[:, None, None] * dilation[0]
    j = torch.arange(kw, dtype=x.dtype).repeat(kh)[:, None, None] * dilation[1]
    by = torch.arange(oh, dtype=x.dtype)[None, :, None] * stride[0] - padding[0] + i      # (taps, OH, 1)
    bx = torch.arange(ow, dtype=x.dtype)[None, None, :] * stride[1] - padding[1] + j      # (taps, 1, OW)
    off = offset.reshape(n, dg, taps, 2, oh, ow)
    ys, xs = off[:, :, :, 0] + by, off[:, :, :, 1] + bx                                     # (N, DG, taps, OH, OW)
    # grid_sample with align_corners: -1 and 1 are the centres of the first and last pixels
    grid = torch.stack([2 * xs / (wd - 1) - 1, 2 * ys / (h - 1) - 1], -1).reshape(n * dg, taps * oh, ow, 2)
    sampled = torch.nn.functional.grid_sample(x.reshape(n * dg, c // dg, h, wd), grid, mode="bilinear",
                                              padding_mode="zeros", align_corners=True)
    sampled = sampled.reshape(n, dg, c // dg, taps, oh, ow) * mask.reshape(n, dg, 1, taps, oh, ow)
    cols = sampled.reshape(n, groups, cg, kh, kw, oh, ow)
    out = torch.einsum("ngcijyx,gocij->ngoyx", cols, w.reshape(groups, oc // groups, cg, kh, kw))
    return out.reshape(n, oc, oh, ow) + bias


CASES = [  # groups, deformable groups, kernel, stride, padding, dilation
    (1, 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 1, (2, 3), (2, 1), (0, 1), (1, 1)),
    (1, 2, (3, 2), (1, 2), (2, 1), (2, 1)),
    (2, 2, (1, 1), (1, 1), (0, 0), (1, 1)),
]


def _inputs(rng, groups, dg, k, stride, padding, dilation, n=2, h=5, w=6):
    c, oc = 2 * groups * dg, 2 * groups
    oh, ow = _geometry(h, w, k, stride, padding, dilation)
    taps = k[0] * k[1]
    x = rng.standard_normal((n, c, h, w))
    weight = rng.standard_normal((oc, c // groups) + k)
    # offsets up to 2.5 pixels: many points leave the image, some entirely
    offset = rng.uniform(-2.5, 2.5, (n, 2 * dg * taps, oh, ow))
    mask = rng.uniform(0, 1, (n, dg * taps, oh, ow))
    bias = rng.standard_normal((1, oc, 1, 1))
    return x, weight, offset, mask, bias


@pytest.mark.parametrize("groups, dg, k, stride, padding, dilation", CASES)
def test_deformable_conv2d_matches_its_definition(groups, dg, k, stride, padding, dilation):
    x, weight, offset, mask, _ = _inputs(np.random.default_rng(groups * 10 + dg), groups, dg, k, stride, padding,
                                         dilation)
    got = F.deformable_conv2d(gc.tensor(x), gc.tensor(weight), gc.tensor(offset), gc.tensor(mask), None, stride,
                              padding, dilation, groups).numpy()
    np.testing.assert_allclose(got, _numpy_dcn(x, weight, offset, mask, stride, padding, dilation, groups),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("groups, dg, k, stride, padding, dilation", CASES)
def test_deformable_conv2d_values_and_grads_match_torch(groups, dg, k, stride, padding, dilation):
    arrays = _inputs(np.random.default_rng(groups + 3 * dg), groups, dg, k, stride, padding, dilation)
    compare_with_torch(torch, lambda x, w, o, m, b: F.deformable_conv2d(x, w, o, m, b, stride, padding, dilation,
                                                                        groups),
                       lambda x, w, o, m, b: _torch_dcn(x, w, o, m, b, stride, padding, dilation, groups),
                       list(arrays), rtol=1e-9, atol=1e-10, need_grads=True)


def test_deformable_conv2d_grads_match_finite_differences():
    rng = np.random.default_rng(7)
    x, weight, offset, mask, bias = _inputs(rng, 1, 1, (2, 2), (1, 1), (1, 1), (1, 1), n=1, h=3, w=3)
    # keep sampled points off the integer grid, where bilinear sampling has a kink
    offset = np.round(offset) + rng.uniform(0.2, 0.8, offset.shape)
    check_grads(lambda a, b, o, m: F.deformable_conv2d(a, b, o, m, None, 1, 1), [x, weight, offset, mask],
                second=False)


def test_zero_offsets_and_unit_mask_give_conv2d():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 4, 6, 5)), rng.standard_normal((2, 3, 2, 3, 3))      # MegEngine's grouped weight
    offset, mask = np.zeros((2, 18, 3, 3)), np.ones((2, 9, 3, 3))
    got = F.deformable_conv2d(gc.tensor(x), gc.tensor(w), gc.tensor(offset), gc.tensor(mask), stride=2, padding=1,
                              groups=2)
    want = F.conv2d(gc.tensor(x), gc.tensor(w), stride=2, padding=1, groups=2)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


def test_deformable_conv2d_layer():
    gc.random.seed(0)
    m = M.DeformableConv2d(4, 6, 3, padding=1, groups=2)
    assert m.weight.shape == (2, 3, 2, 3, 3) and m.bias.shape == (1, 6, 1, 1)
    rng = np.random.default_rng(2)
    x = gc.tensor(rng.standard_normal((1, 4, 5, 5)).astype("float32"))
    offset = gc.tensor(rng.uniform(-1, 1, (1, 18, 5, 5)).astype("float32"))
    mask = gc.tensor(rng.uniform(0, 1, (1, 9, 5, 5)).astype("float32"))
    out = m(x, offset, mask)
    assert out.shape == (1, 6, 5, 5) and out.dtype == np.float32
    np.testing.assert_allclose(out.numpy(), F.deformable_conv2d(x, m.weight, offset, mask, m.bias, 1, 1, 1, 2).numpy())
    gm = gc.GradManager().attach(m.parameters())
    with gm:
        gm.backward(m(x, offset, mask).sum())
    assert m.weight.grad is not None and m.weight.grad.shape == m.weight.shape


def test_deformable_conv2d_errors():
    x, w = gc.tensor(np.zeros((1, 2, 4, 4), "float32")), gc.tensor(np.zeros((3, 2, 3, 3), "float32"))
    with pytest.raises(ValueError) as e:
        F.deformable_conv2d(x, w, F.zeros((1, 17, 2, 2)), F.ones((1, 9, 2, 2)))
    check_error(e, "deformable_conv2d", "(1, 17, 2, 2)")
    with pytest.raises(ValueError) as e:
        F.deformable_conv2d(x, w, F.zeros((1, 18, 2, 2)), F.ones((1, 9, 3, 3)))
    check_error(e, "deformable_conv2d", "(1, 9, 3, 3)")
    with pytest.raises(ValueError) as e:
        F.deformable_conv2d(x, gc.tensor(np.zeros((3, 3, 3, 3), "float32")), F.zeros((1, 18, 2, 2)),
                            F.ones((1, 9, 2, 2)))
    check_error(e, "deformable_conv2d", "(3, 3, 3, 3)", "(1, 2, 4, 4)")
    with pytest.raises(ValueError) as e:
        F.deformable_conv2d(x, w, F.zeros((1, 18, 2, 2)), F.ones((1, 9, 2, 2)), conv_mode="convolution")
    check_error(e, "deformable_conv2d", "conv_mode")


def test_a_point_on_the_edge_of_the_sampling_region_reads_zero_and_passes_no_gradient():
    # MegEngine samples only points strictly inside (-1, H) x (-1, W): at
    # row -1 exactly the value is 0 and so is its gradient, though row 0 is
    # a bilinear neighbour
    x = gc.tensor(np.arange(1.0, 10.0).reshape(1, 1, 3, 3))
    offset = np.zeros((1, 2, 3, 3))
    offset[0, 0, 0, 0], offset[0, 1, 0, 0] = -1.0, 0.5        # output (0, 0) reads (-1, 0.5)
    offset = gc.tensor(offset)
    gm = gc.GradManager().attach([offset])
    with gm:
        out = F.deformable_conv2d(x, gc.tensor(np.ones((1, 1, 1, 1))), offset, gc.tensor(np.ones((1, 1, 3, 3))))
        gm.backward(out[0, 0, 0, 0])
    assert float(out[0, 0, 0, 0]) == 0.0
    np.testing.assert_array_equal(offset.grad.numpy(), np.zeros((1, 2, 3, 3)))
