"""MegEngine's image augmentation layers (gradcore.module.augment): values
against NumPy written out here (flips, turns, blends, contrast), the random
ones by their seeds, shapes and the statistics of large draws."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.module as M
from gradcore.op import ArgumentError
from oracle import check_grads


def _nhwc(rng, shape=(2, 3, 4, 2)):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("vertical, horizontal", [(True, True), (True, False), (False, True), (False, False)])
def test_flip_vs_numpy(vertical, horizontal, rng):
    x = _nhwc(rng)
    want = x[:, ::-1] if vertical else x
    want = want[:, :, ::-1] if horizontal else want
    np.testing.assert_array_equal(M.Flip(vertical, horizontal)(gc.Tensor(x)).numpy(), want)


@pytest.mark.parametrize("clockwise", [True, False])
def test_rot90_vs_numpy(clockwise, rng):
    x = _nhwc(rng)
    # np.rot90 over (H, W) turns counterclockwise for k=1
    want = np.rot90(x, k=-1 if clockwise else 1, axes=(1, 2))
    np.testing.assert_array_equal(M.Rot90(clockwise)(gc.Tensor(x)).numpy(), want)


def test_rotate_by_half_turn_and_zero_vs_numpy(rng):
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(M.Rotate(180.0)(gc.Tensor(x)).numpy(), x[:, :, ::-1, ::-1], atol=1e-5)
    np.testing.assert_allclose(M.Rotate()(gc.Tensor(x)).numpy(), x, atol=1e-6)


def test_random_flips_by_probability_and_seed(rng):
    x = _nhwc(rng)
    t = gc.Tensor(x)
    np.testing.assert_array_equal(M.RandomHorizontalFlip(1.0)(t).numpy(), x[:, :, ::-1])
    np.testing.assert_array_equal(M.RandomVerticalFlip(1.0)(t).numpy(), x[:, ::-1])
    assert M.RandomHorizontalFlip(0.0)(t) is t and M.RandomVerticalFlip(0.0)(t) is t
    # one draw of the global generator per call: gc.random.seed makes it repeat
    outs = []
    for _ in range(2):
        gc.random.seed(7)
        outs.append([bool((M.RandomHorizontalFlip()(t).numpy() == x).all()) for _ in range(20)])
    assert outs[0] == outs[1] and 0 < sum(outs[0]) < 20


def test_flip_gradient():
    check_grads(lambda x: M.Flip()(x) * M.Rot90()(x).transpose(0, 2, 1, 3),
                [np.arange(16.0).reshape(1, 2, 2, 4) / 7])


def _mix(rng, layer, shape, beta, seed):
    """Two random batches through a Mixup/Cutmix layer; its lamb checked
    against a beta generator of the same seed and the labels' mix."""
    d1, d2 = rng.standard_normal(shape), rng.standard_normal(shape)
    l1, l2 = rng.standard_normal(shape[0]), rng.standard_normal(shape[0])
    data, label = layer(*(gc.Tensor(a.astype(np.float32)) for a in (d1, l1, d2, l2)))
    lamb = layer.lamb.numpy().astype(np.float64)
    np.testing.assert_array_equal(lamb, gc.random.RNG(seed).beta(beta, beta, size=(shape[0],)).numpy())
    np.testing.assert_allclose(label.numpy(), lamb * l1 + (1 - lamb) * l2, rtol=1e-5, atol=1e-6)
    return d1, d2, data, lamb


def test_mixup_mixes_with_its_beta_draws(rng):
    m = M.Mixup(0.5, seed=3)
    d1, d2, data, lamb = _mix(rng, m, (4, 2, 3, 3), 0.5, 3)
    l1 = np.zeros(4)
    assert ((lamb >= 0) & (lamb <= 1)).all()
    w = lamb.reshape(4, 1, 1, 1)
    np.testing.assert_allclose(data.numpy(), w * d1 + (1 - w) * d2, rtol=1e-5, atol=1e-6)
    with pytest.raises(ArgumentError, match="Mixup: data1 and data2"):
        m(gc.Tensor(d1), gc.Tensor(l1), gc.Tensor(d2[:2]), gc.Tensor(l1))


def test_linear_contrast_fixed_alpha():
    v = np.arange(0, 256, 15).astype(np.uint8).reshape(1, 1, 2, 9)   # 0 .. 255
    out = M.LinearContrast(1.5)(gc.Tensor(v)).numpy()
    assert out.dtype == np.uint8
    want = np.clip(127 + 1.5 * (v.astype(np.float64) - 127), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(out, want)
    f = np.linspace(-2, 2, 12, dtype=np.float32).reshape(1, 3, 2, 2)
    np.testing.assert_allclose(M.LinearContrast(0.25)(gc.Tensor(f)).numpy(), 0.25 * f)   # about 0
    u16 = np.array([0, 40000, 65535], np.uint16).reshape(1, 1, 1, 3)
    np.testing.assert_array_equal(M.LinearContrast(0.5)(gc.Tensor(u16)).numpy(),
                                  (32767 + 0.5 * (u16.astype(np.float64) - 32767)).astype(np.uint16))


@pytest.mark.parametrize("per_channel", [False, True])
def test_linear_contrast_drawn_alpha(per_channel, rng):
    x = rng.uniform(1, 2, (5, 3, 4, 4)).astype(np.float32)
    out = M.LinearContrast((0.6, 0.8), per_channel=per_channel, seed=1)(gc.Tensor(x)).numpy()
    ratio = out / x
    per = ratio.reshape(5, 3, -1)
    np.testing.assert_allclose(per, per[:, :, :1].repeat(16, 2), rtol=1e-5)   # one alpha per image/channel
    assert ((per >= 0.6 - 1e-6) & (per < 0.8 + 1e-6)).all()
    same_over_channels = np.allclose(per[:, 0, 0], per[:, 2, 0])
    assert same_over_channels != per_channel


@pytest.mark.parametrize("cls, kw", [(M.AdditiveGaussianNoise, dict(mean=1.0, std=2.0)),
                                     (M.AdditiveLaplaceNoise, dict(mean=1.0, std=2.0)),
                                     (M.AdditivePoissonNoise, dict(lam=3.0))])
@pytest.mark.parametrize("per_channel", [False, True])
def test_additive_noise_statistics(cls, kw, per_channel):
    x = np.full((8, 2, 64, 64), 5.0, np.float32)
    out = cls(per_channel=per_channel, seed=0, **kw)(gc.Tensor(x)).numpy()
    noise = (out - x).astype(np.float64)
    assert np.array_equal(noise[:, 0], noise[:, 1]) != per_channel
    again = cls(per_channel=per_channel, seed=0, **kw)(gc.Tensor(x)).numpy()
    np.testing.assert_array_equal(out, again)
    n = noise[:, 0].ravel()
    if cls is M.AdditivePoissonNoise:
        assert (n >= 0).all() and (n == np.round(n)).all()
        assert abs(n.mean() - 3.0) < 0.1 and abs(n.var() - 3.0) < 0.2
    elif cls is M.AdditiveGaussianNoise:
        assert abs(n.mean() - 1.0) < 0.08 and abs(n.std() - 2.0) < 0.08
    else:
        # Laplace(1, b=2): median 1, mean absolute deviation b, variance 2 b^2
        assert abs(np.median(n) - 1.0) < 0.08 and abs(np.abs(n - 1.0).mean() - 2.0) < 0.08
        assert abs(n.var() - 8.0) < 0.6


def _conv3x3_reflect(x, k):
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="reflect")
    out = np.zeros_like(x, dtype=np.float64)
    h, w = x.shape[2:]
    for i in range(3):
        for j in range(3):
            out += k[i, j] * p[:, :, i:i + h, j:j + w]
    return out


@pytest.mark.parametrize("alpha, s", [(1.0, 0.0), (0.7, 0.5), (0.0, 1.3)])
def test_emboss_vs_numpy(alpha, s, rng):
    x = rng.uniform(0, 1, (2, 3, 5, 6)).astype(np.float32)
    effect = np.array([[-1 - s, -s, 0], [-s, 1, s], [0, s, 1 + s]])
    ident = np.zeros((3, 3))
    ident[1, 1] = 1
    want = _conv3x3_reflect(x.astype(np.float64), alpha * effect + (1 - alpha) * ident)
    np.testing.assert_allclose(M.Emboss(alpha, s)(gc.Tensor(x)).numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("alpha, lightness", [(1.0, 1.0), (0.4, 0.7)])
def test_sharpen_vs_numpy(alpha, lightness, rng):
    x = rng.uniform(0, 1, (1, 2, 4, 4)).astype(np.float32)
    effect = -np.ones((3, 3))
    effect[1, 1] = 8 + lightness
    ident = np.zeros((3, 3))
    ident[1, 1] = 1
    want = _conv3x3_reflect(x.astype(np.float64), alpha * effect + (1 - alpha) * ident)
    np.testing.assert_allclose(M.Sharpen(alpha, lightness)(gc.Tensor(x)).numpy(), want, rtol=1e-5, atol=1e-5)


def test_blend_keeps_integer_dtype_clipped_and_draws_in_range(rng):
    x = rng.integers(0, 256, (1, 1, 4, 4)).astype(np.uint8)
    out = M.Sharpen(1.0, 1.0)(gc.Tensor(x)).numpy()
    assert out.dtype == np.uint8
    want = np.clip(_conv3x3_reflect(x.astype(np.float64), np.array([[-1, -1, -1], [-1, 9, -1], [-1, -1, -1]])),
                   0, 255).astype(np.uint8)
    np.testing.assert_array_equal(out, want)
    # drawn alpha in [0.6, 0.8): between the two ends' results
    xf = rng.uniform(0, 1, (1, 1, 4, 4)).astype(np.float32)
    lo, hi = (M.Emboss(a, 1.0)(gc.Tensor(xf)).numpy() for a in (0.6, 0.8))
    mid = M.Emboss((0.6, 0.8), 1.0, seed=2)(gc.Tensor(xf)).numpy()
    assert ((mid >= np.minimum(lo, hi) - 1e-5) & (mid <= np.maximum(lo, hi) + 1e-5)).all()


def test_emboss_gradient_in_the_image():
    check_grads(lambda x: M.Emboss(0.5, 0.3)(x), [np.arange(18.0).reshape(1, 2, 3, 3) / 5])


@pytest.mark.parametrize("make", [lambda: M.LinearContrast(True), lambda: M.Emboss((1, 2, 3), 1.0),
                                  lambda: M.Sharpen(1.0, "x"), lambda: M.Mixup(1.0, seed=1.5)])
def test_bad_parameters_are_refused(make):
    with pytest.raises(ArgumentError):
        make()


def test_non_image_input_is_refused():
    with pytest.raises(ArgumentError, match=r"Flip: expected a 4-d image Tensor, got \(2, 2\)"):
        M.Flip()(gc.Tensor(np.zeros((2, 2), np.float32)))


# ---------------------------------------------------------------- Cutmix, Dilation, GaussianBlur
def test_cutmix_takes_its_box_from_data2(rng):
    m = M.Cutmix(0.7, seed=5)
    d1, d2, data, lamb = _mix(rng, m, (3, 2, 9, 7), 0.7, 5)
    # the box: centres from a uniform generator of the same seed, halves of floor(H sqrt(1 - lamb))
    u = gc.random.RNG(5)
    cy, cx = np.floor(u.uniform(0, 9, (3,)).numpy()), np.floor(u.uniform(0, 7, (3,)).numpy())
    rat = np.sqrt(1 - lamb)
    hh, hw = np.floor(9 * rat) // 2, np.floor(7 * rat) // 2
    want = d1.astype(np.float32).copy()
    for i in range(3):
        r0, r1 = int(max(cy[i] - hh[i], 0)), int(min(cy[i] + hh[i], 9))
        c0, c1 = int(max(cx[i] - hw[i], 0)), int(min(cx[i] + hw[i], 7))
        assert tuple(m.box[i]) == (r0, r1, c0, c1)
        want[i, :, r0:r1, c0:c1] = d2[i, :, r0:r1, c0:c1]
    np.testing.assert_array_equal(data.numpy(), want)


def _dilate_numpy(x, k, mode, value):
    kh, kw = k.shape
    pads = ((0, 0), (0, 0), (kh // 2, kh - 1 - kh // 2), (kw // 2, kw - 1 - kw // 2))
    npmode = {"BORDER_CONSTANT": "constant", "BORDER_REPLICATE": "edge", "BORDER_REFLECT": "symmetric",
              "BORDER_REFLECT_101": "reflect", "BORDER_WRAP": "wrap"}[mode]
    p = np.pad(x, pads, mode=npmode, **({"constant_values": value} if npmode == "constant" else {}))
    h, w = x.shape[2:]
    return np.max([p[:, :, i:i + h, j:j + w] for i, j in zip(*np.nonzero(k))], axis=0)


@pytest.mark.parametrize("mode", ["BORDER_CONSTANT", "BORDER_REPLICATE", "BORDER_REFLECT",
                                  "BORDER_REFLECT_101", "BORDER_WRAP"])
@pytest.mark.parametrize("iterations", [1, 2])
def test_dilation_vs_numpy(mode, iterations, rng):
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    k = np.array([[0, 1, 0, 0], [1, 1, 1, 0], [0, 1, 0, 1]], np.float32)   # even width: anchor at k // 2
    want = x
    for _ in range(iterations):
        want = _dilate_numpy(want, k, mode, -0.5)
    out = M.Dilation(iterations, mode, border_value=-0.5)(gc.Tensor(x), gc.Tensor(k)).numpy()
    np.testing.assert_array_equal(out, want)


def test_dilation_gradient_and_bad_input(rng):
    check_grads(lambda x: M.Dilation()(x, gc.Tensor(np.ones((3, 3), np.float32))),
                [rng.permutation(24).reshape(1, 2, 3, 4) / 5.0])
    with pytest.raises(ArgumentError, match="Dilation: kernel must be 2-d"):
        M.Dilation()(gc.Tensor(np.zeros((1, 1, 3, 3), np.float32)), gc.Tensor(np.zeros((3, 3), np.float32)))
    with pytest.raises(ArgumentError, match="Dilation: border mode"):
        M.Dilation(border_type="BORDER_TRANSPARENT")


def _gauss_numpy(n, sigma):
    # OpenCV's documented kernel: fixed tables for small sizes with sigma <= 0
    fixed = {3: [0.25, 0.5, 0.25], 5: [1 / 16, 4 / 16, 6 / 16, 4 / 16, 1 / 16]}
    if sigma <= 0 and n in fixed:
        return np.array(fixed[n])
    s = sigma if sigma > 0 else 0.3 * ((n - 1) / 2 - 1) + 0.8
    g = np.exp(-(np.arange(n) - (n - 1) / 2) ** 2 / (2 * s * s))
    return g / g.sum()


@pytest.mark.parametrize("ksize, sx, sy, mode", [(3, 0, 0, "REPLICATE"), ((5, 3), 1.2, 0, "REFLECT"),
                                                 ((3, 7), 0.8, 2.0, "REFLECT_101"), (5, 0, 0, "CONSTANT"),
                                                 ((1, 9), 0, 0, "WRAP")])
def test_gaussian_blur_vs_numpy(ksize, sx, sy, mode, rng):
    x = rng.uniform(0, 10, (2, 6, 8, 3)).astype(np.float32)
    kh, kw = (ksize, ksize) if isinstance(ksize, int) else ksize
    k = np.outer(_gauss_numpy(kh, sy if sy > 0 else sx), _gauss_numpy(kw, sx))
    npmode = {"REPLICATE": "edge", "REFLECT": "symmetric", "REFLECT_101": "reflect", "CONSTANT": "constant",
              "WRAP": "wrap"}[mode]
    p = np.pad(x.astype(np.float64), ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)), mode=npmode)
    want = sum(k[i, j] * p[:, i:i + 6, j:j + 8] for i in range(kh) for j in range(kw))
    out = M.GaussianBlur(ksize, sx, sy, mode)(gc.Tensor(x)).numpy()
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_gaussian_blur_uint8_fixed_point_and_gradient(rng):
    x = rng.integers(0, 256, (1, 4, 5, 2)).astype(np.uint8)
    out = M.GaussianBlur(3)(gc.Tensor(x)).numpy()
    assert out.dtype == np.uint8
    # taps 64, 128, 64 (of 256 each way), the sum rounded by 2^16
    k = np.outer([64, 128, 64], [64, 128, 64])
    p = np.pad(x.astype(np.int64), ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
    acc = sum(k[i, j] * p[:, i:i + 4, j:j + 5] for i in range(3) for j in range(3))
    np.testing.assert_array_equal(out, np.clip((acc + 32768) >> 16, 0, 255))
    check_grads(lambda t: M.GaussianBlur((3, 5), 1.0, border_mode="REFLECT")(t), [rng.standard_normal((1, 3, 4, 2))])
    with pytest.raises(ArgumentError, match="GaussianBlur: kernel sizes must be odd"):
        M.GaussianBlur(4)
    # a size of 0 comes from sigma: 8 sigma + 1 rounded half up, made odd (OpenCV's)
    assert M.GaussianBlur(0, 0.5).kernel_size == (5, 5)
    assert M.GaussianBlur((0, 3), 0.75, 0.25).kernel_size == (3, 3)


# ---------------------------------------------------------------- CropAndPad, FillPoly
@pytest.mark.parametrize("mode, align", [("bilinear", False), ("bilinear", True), ("nearest", False)])
def test_crop_and_pad_vs_torch(mode, align, rng, torch):
    x = rng.standard_normal((3, 2, 10, 8)).astype(np.float32)
    percent = np.array([0.2, -0.2, 0.0], np.float32)
    pad_val = np.array([1.5, -2.0, 7.0], np.float32)
    out = M.CropAndPad(mode, align)(gc.Tensor(x), gc.Tensor(percent), gc.Tensor(pad_val)).numpy()
    tf = torch.nn.functional
    want = []
    for i, p in enumerate(percent):
        rh, rw = int(abs(p) * 10 + 0.5), int(abs(p) * 8 + 0.5)
        img = x[i:i + 1]
        if p > 0:
            img = np.pad(img, ((0, 0), (0, 0), (rh, rh), (rw, rw)), constant_values=pad_val[i])
        elif rh or rw:
            img = img[:, :, rh:10 - rh, rw:8 - rw]
        t = torch.from_numpy(np.ascontiguousarray(img))
        if img.shape[2:] != (10, 8):
            t = tf.interpolate(t, size=(10, 8), mode=mode, **({"align_corners": align} if mode == "bilinear" else {}))
        want.append(t.numpy())
    np.testing.assert_allclose(out, np.concatenate(want), rtol=1e-5, atol=1e-5)


def test_crop_and_pad_gradient_and_bad_input(rng):
    check_grads(lambda x: M.CropAndPad()(x, gc.Tensor(np.array([0.25, -0.25], np.float32))),
                [rng.standard_normal((2, 1, 4, 4))])
    with pytest.raises(ArgumentError, match="CropAndPad: percent needs one value per image"):
        M.CropAndPad()(gc.Tensor(np.zeros((2, 1, 4, 4), np.float32)), gc.Tensor(np.zeros(1, np.float32)))
    with pytest.raises(ArgumentError, match="CropAndPad: mode"):
        M.CropAndPad("bicubic")


def test_fill_poly_triangle_and_rectangle():
    img = np.full((2, 3, 9, 9), 7, np.int32)
    tri = gc.Tensor(np.array([[0, 0], [5, 0], [5, 5]], np.int32))
    out = M.FillPoly()(gc.Tensor(img), [tri], gc.Tensor(np.array([255, 255, 200], np.int32))).numpy()
    # by hand: row y holds the triangle from column y to column 5 (outline included)
    want_mask = np.zeros((9, 9), bool)
    for y in range(6):
        want_mask[y, y:6] = True
    for n in range(2):
        for ch, colour in enumerate([255, 255, 200]):
            np.testing.assert_array_equal(out[n, ch], np.where(want_mask, colour, 7))
    rect = gc.Tensor(np.array([[1, 1], [4, 1], [4, 3], [1, 3]], np.int32))
    out = M.FillPoly()(gc.Tensor(np.zeros((1, 1, 6, 6), np.float32)), [rect], gc.Tensor([2.0])).numpy()[0, 0]
    want = np.zeros((6, 6), np.float32)
    want[1:4, 1:5] = 2.0
    np.testing.assert_array_equal(out, want)


def _even_odd_inside(px, py, poly):
    inside = False
    for (x0, y0), (x1, y1) in zip(poly, np.roll(poly, 1, axis=0)):
        if (y0 > py) != (y1 > py) and px < x0 + (py - y0) * (x1 - x0) / (y1 - y0):
            inside = not inside
    return inside


def _dist_to_outline(px, py, poly):
    best = np.inf
    for a, b in zip(poly, np.roll(poly, 1, axis=0)):
        a, b = a.astype(float), b.astype(float)
        t = np.clip(np.dot([px, py] - a, b - a) / max(np.dot(b - a, b - a), 1e-12), 0, 1)
        best = min(best, np.hypot(*([px, py] - (a + t * (b - a)))))
    return best


def test_fill_poly_concave_polygon_away_from_the_outline():
    poly = np.array([[2, 2], [28, 4], [16, 14], [26, 27], [3, 24], [9, 13]])   # concave
    out = M.FillPoly()(gc.Tensor(np.zeros((1, 1, 30, 30), np.float32)), [gc.Tensor(poly)],
                       gc.Tensor([1.0])).numpy()[0, 0]
    checked = 0
    for y in range(30):
        for x in range(30):
            if _dist_to_outline(x, y, poly) > 1.5:
                assert out[y, x] == float(_even_odd_inside(x, y, poly)), (x, y)
                checked += 1
            elif _dist_to_outline(x, y, poly) < 0.3:
                assert out[y, x] == 1.0, (x, y)     # the outline is drawn
    assert checked > 500
    with pytest.raises(ArgumentError, match="FillPoly: color needs one value per channel"):
        M.FillPoly()(gc.Tensor(np.zeros((1, 2, 4, 4), np.float32)), [gc.Tensor(poly)], gc.Tensor([1.0]))
