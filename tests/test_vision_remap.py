"""F.vision.remap and what is built on it (warp_perspective, warp_affine,
rotate) and resize: values against a loop-by-loop reference of MegEngine's
naive kernels (its border rules written as MegEngine writes them, a loop
per fold), against PyTorch's grid_sample where the two agree (replicate ~
"border", constant 0 ~ "zeros", bilinear, align_corners=True), MegEngine's
documented examples; gradients in the image, the map and the matrices
against float64 finite differences, second order too; integer images;
errors naming the function."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager
from gradcore.op import ArgumentError
from gradcore.testing import gradcheck, gradgradcheck

BORDERS = ["replicate", "constant", "reflect", "reflect_101", "wrap"]


def _border(p: int, n: int, mode: str) -> int:
    """MegEngine's border_interpolate, loop for loop (-1: outside, constant)."""
    if 0 <= p < n:
        return p
    if mode == "replicate":
        return 0 if p < 0 else n - 1
    if mode in ("reflect", "reflect_101"):
        delta = int(mode == "reflect_101")
        if n == 1:
            return 0
        while not 0 <= p < n:
            p = -p - 1 + delta if p < 0 else n - 1 - (p - n) - delta
        return p
    if mode == "wrap":
        return p % n
    return -1


def reference_remap(x, xy, border="replicate", scalar=0.0, interp="linear"):
    n, c, h, w = x.shape
    out = np.zeros((n, c) + xy.shape[1:3])

    def pixel(b, ch, r, q):
        r, q = _border(r, h, border), _border(q, w, border)
        return scalar if r < 0 or q < 0 else x[b, ch, r, q]
    for b in range(n):
        for i in range(xy.shape[1]):
            for j in range(xy.shape[2]):
                px, py = xy[b, i, j]
                for ch in range(c):
                    if interp == "nearest":
                        out[b, ch, i, j] = pixel(b, ch, int(np.round(py)), int(np.round(px)))
                        continue
                    q, r = int(np.floor(px)), int(np.floor(py))
                    v, u = px - q, py - r
                    out[b, ch, i, j] = (pixel(b, ch, r, q) * (1 - v) * (1 - u) + pixel(b, ch, r, q + 1) * (1 - u) * v
                                        + pixel(b, ch, r + 1, q) * (1 - v) * u + pixel(b, ch, r + 1, q + 1) * u * v)
    return out


def _points(rng, shape, low=-7.0, high=9.0):
    """Coordinates off the pixel grid (no point on a kink of the blend)."""
    return np.floor(rng.uniform(low, high, shape)) + rng.uniform(0.05, 0.95, shape)


@pytest.mark.parametrize("interp", ["linear", "nearest"])
@pytest.mark.parametrize("border", BORDERS)
@pytest.mark.parametrize("hw", [(3, 4), (1, 5), (2, 1)])
def test_remap_matches_megengine_reference(border, interp, hw, rng):
    x = rng.standard_normal((2, 3) + hw)
    xy = _points(rng, (2, 4, 5, 2))
    xy[0, 0, 0] = [1.0, 2.0]            # on the grid
    xy[0, 0, 1] = [-20.5, 31.25]        # far outside: the folds repeat
    got = F.vision.remap(gc.tensor(x), gc.tensor(xy), border, 1.25, interp).numpy()
    np.testing.assert_allclose(got, reference_remap(x, xy, border, 1.25, interp), rtol=1e-12, atol=1e-12)


def test_nearest_rounds_half_to_even(rng):
    x = np.arange(8.0).reshape(1, 1, 1, 8)
    xy = np.array([[[[0.5, 0.0], [1.5, 0.0], [2.5, 0.0], [2.51, 0.0]]]])
    got = F.vision.remap(gc.tensor(x), gc.tensor(xy), interp_mode="nearest").numpy().ravel()
    assert got.tolist() == [0.0, 2.0, 2.0, 3.0]


def test_megengine_examples():
    x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
    xy = gc.tensor(np.array([[[[1., 0.], [0., 1.]], [[0., 1.], [0., 1.]]]], "float32"))
    assert F.vision.remap(x, xy).numpy().tolist() == [[[[1.0, 4.0], [4.0, 4.0]]]]
    m = gc.tensor(np.array([[[1., 0., 1.], [0., 1., 1.], [0., 0., 1.]]], "float32"))
    out = F.vision.warp_perspective(x, m, (2, 2))
    assert out.dtype == np.float32 and out.numpy().tolist() == [[[[5.0, 6.0], [9.0, 10.0]]]]
    assert F.vision.resize(x, gc.tensor([2, 2])).numpy().tolist() == [[[[2.5, 4.5], [10.5, 12.5]]]]
    assert F.nn.remap is F.vision.remap and F.nn.warp_perspective is F.vision.warp_perspective
    assert F.nn.warp_affine is F.vision.warp_affine


@pytest.mark.parametrize("border", ["replicate", "constant"])
def test_remap_matches_torch_grid_sample(border, rng, torch):
    x = rng.standard_normal((2, 3, 4, 5))
    xy = _points(rng, (2, 3, 6, 2), -2.0, 6.0)
    h, w = x.shape[2:]
    grid = np.stack([xy[..., 0] * 2 / (w - 1) - 1, xy[..., 1] * 2 / (h - 1) - 1], -1)
    tx, tg = torch.tensor(x, requires_grad=True), torch.tensor(grid, requires_grad=True)
    ty = torch.nn.functional.grid_sample(tx, tg, mode="bilinear", align_corners=True,
                                         padding_mode="border" if border == "replicate" else "zeros")
    g = rng.standard_normal(ty.shape)
    ty.backward(torch.tensor(g))
    gx, gxy = gc.tensor(x), gc.tensor(xy)
    gm = GradManager().attach([gx, gxy])
    with gm:
        y = F.vision.remap(gx, gxy, border)
        gm.backward(y, gc.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    # torch's grid is normalised: its gradient is the map's scaled by the normalisation
    scale = np.array([2 / (w - 1), 2 / (h - 1)])
    np.testing.assert_allclose(gxy.grad.numpy(), tg.grad.numpy() * scale, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("border", BORDERS)
def test_remap_gradients_first_and_second_order(border, rng):
    x = rng.standard_normal((1, 2, 3, 4))
    xy = _points(rng, (1, 2, 3, 2), -4.0, 6.0)

    def f(a, b):
        return F.vision.remap(a, b, border, 0.5) ** 2
    gradcheck(f, [x, xy])
    gradgradcheck(f, [x, xy])


def test_nearest_has_no_gradient_in_the_map(rng):
    x, xy = gc.tensor(rng.standard_normal((1, 1, 3, 3))), gc.tensor(_points(rng, (1, 2, 2, 2), 0, 2))
    gm = GradManager().attach([x, xy])
    with gm:
        gm.backward(F.vision.remap(x, xy, interp_mode="nearest").sum())
    assert x.grad.numpy().sum() == 4.0 and (xy.grad is None or not xy.grad.numpy().any())


def reference_warp(x, mat, out_hw, border="replicate", value=0.0):
    oh, ow = out_hw
    hh, ww = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
    xy = []
    for m in mat:
        m = np.vstack([m, [0.0, 0.0, 1.0]]) if m.shape[0] == 2 else m
        d = m[2, 0] * ww + m[2, 1] * hh + m[2, 2]
        xy.append(np.stack([(m[0, 0] * ww + m[0, 1] * hh + m[0, 2]) / d,
                            (m[1, 0] * ww + m[1, 1] * hh + m[1, 2]) / d], -1))
    return reference_remap(x, np.array(xy), border, value)


@pytest.mark.parametrize("border", BORDERS)
def test_warp_perspective_values_and_gradients(border, rng):
    x = rng.standard_normal((2, 2, 5, 6))
    mat = np.eye(3) + rng.uniform(-0.1, 0.1, (2, 3, 3))
    mat[:, :2, 2] += [[0.4, -0.3], [1.3, 0.6]]
    got = F.vision.warp_perspective(gc.tensor(x), gc.tensor(mat), (4, 7), border_mode=border, border_val=0.7)
    np.testing.assert_allclose(got.numpy(), reference_warp(x, mat, (4, 7), border, 0.7), rtol=1e-10, atol=1e-12)
    gradcheck(lambda a, m: F.vision.warp_perspective(a, m, (3, 4), border_mode=border), [x[:1], mat[:1]])


def test_warp_perspective_mat_idx_and_nhwc(rng):
    x = rng.standard_normal((2, 3, 4, 5))
    mat = np.eye(3)[None].repeat(3, 0) + rng.uniform(-0.05, 0.05, (3, 3, 3))
    idx = [1, 0, 1]
    got = F.vision.warp_perspective(gc.tensor(x), gc.tensor(mat), (4, 4), mat_idx=idx).numpy()
    np.testing.assert_allclose(got, reference_warp(x[idx], mat, (4, 4)), rtol=1e-10, atol=1e-12)
    nhwc = F.vision.warp_perspective(gc.tensor(x[idx].transpose(0, 2, 3, 1)), gc.tensor(mat), (4, 4), format="NHWC")
    np.testing.assert_allclose(nhwc.numpy(), got.transpose(0, 2, 3, 1), rtol=1e-12)
    # the gradient reaches each image through its matrices
    gx = gc.tensor(x)
    gm = GradManager().attach([gx])
    with gm:
        gm.backward(F.vision.warp_perspective(gx, gc.tensor(np.eye(3)[None].repeat(3, 0)), (4, 5), mat_idx=idx).sum())
    np.testing.assert_allclose(gx.grad.numpy(), np.stack([np.ones((3, 4, 5)), 2 * np.ones((3, 4, 5))]))


def test_warp_affine_nhwc_default_and_rotate(rng):
    x = rng.standard_normal((2, 4, 5, 3))         # NHWC
    mat = np.array([[[0.9, 0.1, 0.5], [-0.2, 1.1, -0.4]], [[1.0, 0.0, 2.0], [0.0, 1.0, 1.0]]])
    got = F.vision.warp_affine(gc.tensor(x), gc.tensor(mat), (3, 6), border_mode="reflect")
    want = reference_warp(x.transpose(0, 3, 1, 2), mat, (3, 6), "reflect").transpose(0, 2, 3, 1)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    img = np.arange(12.0).reshape(1, 1, 3, 4)
    # about the centre (1.5, 1): a half turn lands every pixel on a pixel
    np.testing.assert_allclose(F.vision.rotate(gc.tensor(img), 180.0).numpy(), img[..., ::-1, ::-1], atol=1e-9)
    assert np.allclose(F.vision.rotate(gc.tensor(img), 0.0).numpy(), img)


def test_integer_images_are_rounded_and_saturated():
    x = np.array([[[[0, 255], [10, 20]]]], np.uint8)
    xy = np.array([[[[0.5, 0.0], [0.75, 0.0], [0.5, 0.5]]]], np.float32)
    got = F.vision.remap(gc.tensor(x), gc.tensor(xy))
    assert got.dtype == np.uint8
    assert got.numpy().ravel().tolist() == [128, 191, 71]       # 127.5, 191.25, 71.25 rounded half to even
    x8 = np.array([[[[-128, 127]]]], np.int8)
    const = F.vision.remap(gc.tensor(x8), gc.tensor(np.array([[[[5.0, 0.0]]]], np.float32)), "constant", 300.0)
    assert const.numpy().ravel().tolist() == [127]              # saturated


def test_resize_modes_formats_and_max_size(rng):
    x = rng.standard_normal((1, 2, 5, 6)).astype("float32")
    for mode in ("bilinear", "nearest", "bicubic"):
        want = F.vision.interpolate(gc.tensor(x), (3, 8), mode=mode).numpy()
        np.testing.assert_array_equal(F.vision.resize(gc.tensor(x), (3, 8), imode=mode).numpy(), want)
        nhwc = F.vision.resize(gc.tensor(x.transpose(0, 2, 3, 1)), (3, 8), format="NHWC", imode=mode)
        np.testing.assert_array_equal(nhwc.numpy(), want.transpose(0, 2, 3, 1))
    assert F.vision.resize(gc.tensor(x), (3, 8), max_size=4).shape == (1, 2, 3, 4)


def test_bad_arguments_name_the_function(rng):
    x = gc.tensor(rng.standard_normal((1, 2, 3, 3)))
    with pytest.raises(ArgumentError, match=r"remap: .*map_xy \(N, OH, OW, 2\).*\(1, 2, 3, 3\).*\(1, 2, 2, 3\)"):
        F.vision.remap(x, gc.tensor(np.zeros((1, 2, 2, 3))))
    with pytest.raises(ArgumentError, match="remap: .*batch|remap: expected"):
        F.vision.remap(x, gc.tensor(np.zeros((2, 2, 2, 2))))
    with pytest.raises(ArgumentError, match="remap: border_mode must be one of .*'mirror'"):
        F.vision.remap(x, gc.tensor(np.zeros((1, 2, 2, 2))), "mirror")
    with pytest.raises(ArgumentError, match=r"warp_perspective: mat must be \(batch, 3, 3\)"):
        F.vision.warp_perspective(x, gc.tensor(np.zeros((1, 2, 3))), (2, 2))
    with pytest.raises(ArgumentError, match="warp_affine: mat has 2 matrices for 1 images"):
        F.vision.warp_affine(x, gc.tensor(np.zeros((2, 2, 3))), (2, 2), format="NCHW")
    with pytest.raises(ArgumentError, match="rotate: interp_mode must be 'bilinear'"):
        F.vision.rotate(x, 30.0, interp_mode="area")


# ---------------------------------------------------------------- regions of interest
def reference_roi_align(x, rois, out_hw, mode, scale, samples, aligned):
    """MegEngine's naive roi_align, loop for loop (float32 box arithmetic)."""
    f32 = np.float32
    ph_n, pw_n = out_hw
    sh, sw = samples
    k, (n, c, h, w) = len(rois), x.shape
    out = np.zeros((k, c, ph_n, pw_n))
    off = f32(0.5 if aligned else 0.0)

    def interp(img, yy, xx):
        y0, x0 = int(np.floor(yy)), int(np.floor(xx))
        px = [[img[r, q] if 0 <= r < h and 0 <= q < w else 0.0 for q in (x0, x0 + 1)] for r in (y0, y0 + 1)]
        top = px[0][0] + (px[0][1] - px[0][0]) * (xx - x0)
        bottom = px[1][0] + (px[1][1] - px[1][0]) * (xx - x0)
        return top + (bottom - top) * (yy - y0)
    for i, roi in enumerate(np.asarray(rois, f32)):
        b = int(roi[0])
        sw0, sh0 = roi[1] * f32(scale) - off, roi[2] * f32(scale) - off
        ew, eh = roi[3] * f32(scale) - off, roi[4] * f32(scale) - off
        bh, bw = max(eh - sh0, f32(0)) / f32(ph_n), max(ew - sw0, f32(0)) / f32(pw_n)
        for ch in range(c):
            for p in range(ph_n):
                for q in range(pw_n):
                    vals = [interp(x[b, ch], float(sh0 + bh * (p + f32(1) / f32(sh) * (a + f32(0.5)))),
                                   float(sw0 + bw * (q + f32(1) / f32(sw) * (e + f32(0.5)))))
                            for a in range(sh) for e in range(sw)]
                    out[i, ch, p, q] = max(vals) if mode == "max" else np.mean(vals)
    return out


def reference_roi_pooling(x, rois, out_hw, mode, scale):
    f32 = np.float32
    ph_n, pw_n = out_hw
    k, (n, c, h, w) = len(rois), x.shape
    out = np.zeros((k, c, ph_n, pw_n))
    for i, roi in enumerate(np.asarray(rois, f32)):
        b = int(roi[0])
        x1, y1, x2, y2 = (int(np.round(v * f32(scale))) for v in roi[1:])
        rw, rh = max(x2 - x1 + 1, 1), max(y2 - y1 + 1, 1)
        bh, bw = f32(rh) / f32(ph_n), f32(rw) / f32(pw_n)
        for p in range(ph_n):
            for q in range(pw_n):
                hs = min(max(int(np.floor(f32(p) * bh)) + y1, 0), h)
                he = min(max(int(np.ceil(f32(p + 1) * bh)) + y1, 0), h)
                ws = min(max(int(np.floor(f32(q) * bw)) + x1, 0), w)
                we = min(max(int(np.ceil(f32(q + 1) * bw)) + x1, 0), w)
                region = x[b, :, hs:he, ws:we].reshape(c, -1)
                if region.shape[1]:
                    out[i, :, p, q] = region.max(1) if mode == "max" else region.mean(1)
    return out


def _boxes(rng, k, n, h, w, spread=1.3):
    x1, y1 = rng.uniform(-2, w * spread, k), rng.uniform(-2, h * spread, k)
    return np.stack([rng.integers(0, n, k), x1, y1, x1 + rng.uniform(0, w, k), y1 + rng.uniform(0, h, k)], 1)


@pytest.mark.parametrize("mode", ["average", "max"])
@pytest.mark.parametrize("scale, samples, aligned", [(1.0, (2, 2), True), (0.5, (1, 3), False), (1.5, (3, 1), True)])
def test_roi_align_matches_megengine_reference(mode, scale, samples, aligned, rng):
    x = rng.standard_normal((2, 3, 7, 9))
    rois = _boxes(rng, 6, 2, 7, 9)
    got = F.vision.roi_align(gc.tensor(x), gc.tensor(rois), (3, 2), mode, scale, samples, aligned).numpy()
    np.testing.assert_allclose(got, reference_roi_align(x, rois, (3, 2), mode, scale, samples, aligned),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mode", ["max", "average"])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_roi_pooling_matches_megengine_reference(mode, scale, rng):
    x = rng.standard_normal((2, 3, 7, 9))
    rois = _boxes(rng, 6, 2, 7 / scale, 9 / scale)
    rois[0, 1:] = [10.0, 10.0, 3.0, 2.0]           # malformed: one pixel
    got = F.vision.roi_pooling(gc.tensor(x), gc.tensor(rois), (3, 4), mode, scale).numpy()
    np.testing.assert_allclose(got, reference_roi_pooling(x, rois, (3, 4), mode, scale), rtol=1e-12, atol=1e-12)


def test_roi_megengine_examples_gradients_and_errors(rng):
    np.random.seed(42)
    inp, rois = gc.Tensor(np.random.randn(1, 1, 128, 128)), gc.Tensor(np.random.random((4, 5)))
    assert F.vision.roi_pooling(inp, rois, (2, 2)).numpy()[0].round(4).tolist() == [[[-0.1383, -0.1383],
                                                                                     [-0.5035, -0.5035]]]
    assert F.vision.roi_align(inp, rois, (2, 2)).numpy()[0].round(4).tolist() == [[[0.175, 0.175],
                                                                                   [0.1359, 0.1359]]]
    x = rng.standard_normal((2, 2, 5, 6))
    boxes = gc.tensor(_boxes(rng, 3, 2, 5, 6))
    for mode in ("average", "max"):
        gradcheck(lambda a: F.vision.roi_align(a, boxes, (2, 2), mode) ** 2, [x])
        gradcheck(lambda a: F.vision.roi_pooling(a, boxes, (2, 3), mode) ** 2, [x])
    assert F.vision.roi_align(gc.tensor(x), gc.tensor(np.zeros((0, 5))), 2).shape == (0, 2, 2, 2)
    with pytest.raises(ArgumentError, match=r"roi_align: expected inp \(N, C, H, W\) and rois \(K, 5\)"):
        F.vision.roi_align(gc.tensor(x), gc.tensor(np.zeros((3, 4))), 2)
    with pytest.raises(ArgumentError, match=r"roi_pooling: a box's image index is outside \[0, 2\)"):
        F.vision.roi_pooling(gc.tensor(x), gc.tensor([[2.0, 0, 0, 1, 1]]), 2)


def test_replicate_border_has_torchs_zero_slope_on_the_edge(torch):
    """An identity warp (a spatial transformer's start): points exactly on
    the first row and column; torch's border padding gives them slope 0."""
    img = np.arange(12.0).reshape(1, 1, 3, 4) ** 1.5
    mat = np.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    gx, gm_ = gc.tensor(img), gc.tensor(mat)
    gm = GradManager().attach([gm_])
    with gm:
        gm.backward(F.vision.warp_affine(gx, gm_, (3, 4), format="NCHW").sum())
    tm = torch.tensor(mat, requires_grad=True)
    hh, ww = torch.meshgrid(torch.arange(3.0, dtype=torch.float64), torch.arange(4.0, dtype=torch.float64),
                            indexing="ij")
    px = tm[0, 0, 0] * ww + tm[0, 0, 1] * hh + tm[0, 0, 2]
    py = tm[0, 1, 0] * ww + tm[0, 1, 1] * hh + tm[0, 1, 2]
    grid = torch.stack([px * 2 / 3 - 1, py * 2 / 2 - 1], -1)[None]      # pixels -> torch's [-1, 1]
    torch.nn.functional.grid_sample(torch.tensor(img), grid, padding_mode="border", align_corners=True).sum().backward()
    np.testing.assert_allclose(gm_.grad.numpy(), tm.grad.numpy(), rtol=1e-10, atol=1e-10)


def test_integer_images_resize_as_floats_rounded_back(rng):
    img = rng.integers(0, 256, (1, 3, 5, 6)).astype(np.uint8)
    for mode in ("bilinear", "nearest", "bicubic"):
        got = F.vision.resize(gc.tensor(img), (7, 4), imode=mode)
        want = F.vision.interpolate(gc.tensor(img.astype("float32")), (7, 4), mode=mode).numpy()
        assert got.dtype == np.uint8
        # rounded halves away from zero (MegEngine's rounding converter: C's round)
        np.testing.assert_array_equal(got.numpy(), np.clip(np.floor(want + 0.5), 0, 255).astype(np.uint8))
