"""F.vision.cvt_color (MegEngine's float modes and channel copies): values
against an independent NumPy reference written as one affine map per mode
(MegEngine's coefficients, from its naive kernels), gradients against finite
differences in float64, dtypes and the errors. PyTorch has no cvt_color."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from oracle import check_grads

# (matrix from input to output channels, offset): out = x @ A + b
_GRAY = np.array([[0.299], [0.587], [0.114]])
_Y = np.array([0.114, 0.587, 0.299])
AFFINE = {
    "RGB2GRAY": (_GRAY, np.zeros(1)),
    "BGR2GRAY": (_GRAY[::-1], np.zeros(1)),
    "RGB2YUV": (np.stack([_Y, 0.492 * (np.eye(3)[0] - _Y), 0.877 * (np.eye(3)[2] - _Y)], 1), np.array([0, 0.5, 0.5])),
    "YUV2RGB": (np.array([[1, 1, 1], [2.032, -0.395, 0], [0, -0.581, 1.140]]),
                -0.5 * np.array([2.032, -0.395 - 0.581, 1.140])),
}
SELECT = {"GRAY2RGB": (1, [0, 0, 0]), "RGB2BGR": (3, [2, 1, 0]), "BGR2RGB": (3, [2, 1, 0]),
          "RGBA2RGB": (4, [0, 1, 2]), "RGBA2BGR": (4, [2, 1, 0])}


@pytest.mark.parametrize("mode", sorted(AFFINE))
def test_float_modes_match_the_affine_reference(mode):
    x = np.random.default_rng(0).random((2, 3, 4, 3))
    a, b = AFFINE[mode]
    np.testing.assert_allclose(F.vision.cvt_color(gc.tensor(x), mode).numpy(), x @ a + b, rtol=1e-12, atol=1e-12)
    out = F.vision.cvt_color(gc.tensor(x.astype(np.float32)), mode.lower())       # (any case)
    assert out.dtype == np.float32 and out.shape == (2, 3, 4, a.shape[1])
    np.testing.assert_allclose(out.numpy(), x @ a + b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", sorted(AFFINE))
def test_float_mode_grads_match_finite_differences(mode):
    check_grads(lambda x: F.vision.cvt_color(x, mode), [np.random.default_rng(1).random((1, 2, 2, 3))])


@pytest.mark.parametrize("mode", sorted(SELECT))
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_channel_modes_copy_channels_of_any_dtype(mode, dtype):
    channels, order = SELECT[mode]
    x = np.random.default_rng(2).integers(0, 255, (2, 3, 2, channels)).astype(dtype)
    out = F.vision.cvt_color(gc.tensor(x), mode)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.numpy(), x[..., order])


def test_cvt_color_errors():
    with pytest.raises(gc.op.ArgumentError, match=r"^cvt_color: mode must be one of"):
        F.vision.cvt_color(gc.tensor(np.zeros((1, 1, 1, 3), "float32")), "RGB2HSV")
    with pytest.raises(gc.op.ArgumentError, match=r"^cvt_color: mode RGB2GRAY takes images of 3 channel\(s\), "
                                                  r"got shape \(1, 1, 1, 4\)"):
        F.vision.cvt_color(gc.tensor(np.zeros((1, 1, 1, 4), "float32")), "RGB2GRAY")
    with pytest.raises(TypeError, match=r"^cvt_color: mode RGB2YUV computes on uint8 or floating images, got int32"):
        F.vision.cvt_color(gc.tensor(np.zeros((1, 1, 1, 3), "int32")), "RGB2YUV")
    with pytest.raises(TypeError, match=r"^cvt_color: mode RGBA2GRAY computes on uint8 images, got float32"):
        F.vision.cvt_color(gc.tensor(np.zeros((1, 1, 1, 4), "float32")), "RGBA2GRAY")
    with pytest.raises(gc.op.ArgumentError, match=r"^cvt_color: inp must be images \(N, H, W, C\)"):
        F.vision.cvt_color(gc.tensor(np.zeros((1, 3), "float32")), "RGB2GRAY")


def _pixels_u8(channels, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (2, 16, 16, channels)).astype(np.uint8)
    x[0, 0, :3, :3] = np.diag([255, 255, 255])[:, :3]      # pure red, green, blue
    return x


def test_uint8_gray_is_opencvs_fixed_point():
    x = _pixels_u8(4)
    rgb = x[..., :3].astype(np.int64)
    # the exact weighted sum, rounded: the fixed-point result may differ from it by its one rounding step
    exact = np.floor(rgb @ np.array([0.299, 0.587, 0.114]) + 0.5)
    for mode, src, order in (("RGB2GRAY", x[..., :3], [0, 1, 2]), ("BGR2GRAY", x[..., 2::-1], [0, 1, 2]),
                             ("RGBA2GRAY", x, [0, 1, 2])):
        out = F.vision.cvt_color(gc.tensor(np.ascontiguousarray(src)), mode).numpy()
        assert out.dtype == np.uint8 and out.shape == x.shape[:3] + (1,)
        assert np.abs(out[..., 0].astype(int) - exact).max() <= 1
        # OpenCV's documented values for the pure primaries: 76, 150, 29
        assert out[0, 0, :3, 0].tolist() == [76, 150, 29]
        # per pixel, in Python integers: (r * 4899 + g * 9617 + b * 1868 + 2 ** 13) >> 14
        r, g, b = (int(v) for v in x[1, 3, 4, :3])
        assert int(out[1, 3, 4, 0]) == (r * 4899 + g * 9617 + b * 1868 + 8192) >> 14


def test_uint8_yuv_follows_the_float_formulas():
    # (not a round trip: MegEngine's RGB2YUV weighs channel 0 as blue, its YUV2RGB writes red there)
    x = _pixels_u8(3)
    yuv = F.vision.cvt_color(gc.tensor(x), "RGB2YUV")
    assert yuv.dtype == np.uint8
    # MegEngine's float formulas on [0, 1] images, scaled: within one step of
    # the fixed-point ones, once the float chroma offset 0.5 (127.5 of 255)
    # is moved to uint8's 128
    ref = F.vision.cvt_color(gc.tensor(x.astype(np.float32) / 255), "RGB2YUV").numpy() * 255
    ref[..., 1:] += 0.5
    assert np.abs(yuv.numpy().astype(float) - np.clip(ref, 0, 255)).max() <= 1.01
    back = F.vision.cvt_color(yuv, "YUV2RGB").numpy().astype(int)
    yuv_f = yuv.numpy().astype(np.float32)
    yuv_f[..., 1:] -= 0.5
    ref_back = F.vision.cvt_color(gc.tensor(yuv_f / 255), "YUV2RGB").numpy() * 255
    assert np.abs(back - np.clip(ref_back, 0, 255)).max() <= 1.01
    # saturated, not wrapped: far-off chroma stays within 0..255 at the ends
    extreme = gc.tensor(np.array([[[[255, 255, 255], [0, 0, 0]]]], np.uint8))
    # by hand: G = 255 + floor((127 * -9519 + 127 * -6472 + 8192) / 2^14) = 255 - 124 = 131, R and B
    # above 255; G = 0 + floor((128 * 9519 + 128 * 6472 + 8192) / 2^14) = 125, R and B below 0
    assert F.vision.cvt_color(extreme, "YUV2RGB").numpy().tolist() == [[[[255, 131, 255], [0, 125, 0]]]]


# ---- YUV 4:2:0 modes (MegEngine's naive uint8 kernels): a reference that walks
# the flat buffer as those kernels do, pixel by pixel, with Python ints

def _yuv420_reference(img, out, fmt, bt601):
    ih, w = img.shape
    h = ih // 3 * 2
    buf = [int(v) for v in img.reshape(-1)]
    res = np.zeros((h, w, 1 if out == "GRAY" else 3), np.uint8)
    sat = lambda t: max(0, min(255, t))     # noqa: E731
    for i in range(h):
        for j in range(w):
            y = buf[i * w + j]
            if out == "GRAY":
                res[i, j, 0] = y
                continue
            if fmt in ("NV12", "NV21"):
                base = (h + i // 2) * w + (j // 2) * 2      # the pair of this 2x2 block
                a, b = buf[base], buf[base + 1]
                u, v = (a, b) if fmt == "NV12" else (b, a)
            else:
                k = (i // 2) * (w // 2) + j // 2             # its index in a (H/2, W/2) plane
                p1, p2 = buf[h * w + k], buf[h * w + h * w // 4 + k]
                u, v = (p1, p2) if fmt == "YU12" else (p2, p1)
            if bt601:
                y1 = (y * 0x0101 * 18997) >> 16
                b_ = sat((u * 128 + y1 - 128 * 128 - 1160) >> 6)
                g_ = sat((-(u * 25 + v * 52) + y1 + 25 * 128 + 52 * 128 - 1160) >> 6)
                r_ = sat((v * 102 + y1 - 102 * 128 - 1160) >> 6)
            else:
                r_ = sat(y + ((359 * (v - 128)) >> 8))
                g_ = sat(y - ((88 * (u - 128) + 183 * (v - 128)) >> 8))
                b_ = sat(y + ((454 * (u - 128)) >> 8))
            res[i, j] = (r_, g_, b_) if out == "RGB" else (b_, g_, r_)
    return res


YUV_MODES = [(f"{pre}YUV2{out}_{fmt}", out, fmt, pre == "BT601_") for pre in ("", "BT601_")
             for out in ("GRAY", "RGB", "BGR") for fmt in ("NV12", "NV21", "YU12", "YV12")
             if not (pre and out == "GRAY")] + [("YCrCb2RGB", "RGB", "NV21", False),
                                                 ("YCrCb2BGR", "BGR", "NV21", False)]


@pytest.mark.parametrize("mode, out, fmt, bt601", YUV_MODES)
def test_yuv420_modes_match_the_kernel_walk(mode, out, fmt, bt601):
    rng = np.random.default_rng(7)
    # extremes included: the saturation at 0 and 255 is exercised
    img = rng.integers(0, 256, (2, 12, 6, 1)).astype(np.uint8)
    img[0, :2, :2, 0], img[0, 8, :4, 0] = 255, (0, 255, 255, 0)
    got = F.vision.cvt_color(gc.tensor(img), mode).numpy()
    assert got.dtype == np.uint8 and got.shape == (2, 8, 6, 1 if out == "GRAY" else 3)
    for k in range(2):
        np.testing.assert_array_equal(got[k], _yuv420_reference(img[k, ..., 0], out, fmt, bt601))


def test_yuv420_mode_errors():
    img = gc.tensor(np.zeros((1, 9, 4, 1), np.uint8))
    with pytest.raises(gc.op.ArgumentError, match=r"cvt_color: mode YUV2RGB_YV12 takes images \(N, 3H/2, W, 1\)"):
        F.vision.cvt_color(img, "YUV2RGB_YV12")          # planar: 3H/2 a multiple of 6
    assert F.vision.cvt_color(img, "YUV2RGB_NV12").shape == (1, 6, 4, 3)
    with pytest.raises(gc.op.ArgumentError, match="takes images"):
        F.vision.cvt_color(gc.tensor(np.zeros((1, 6, 3, 1), np.uint8)), "YUV2RGB_NV21")   # odd width
    with pytest.raises(TypeError, match="mode YUV2BGR_NV12 computes on uint8 images, got float32"):
        F.vision.cvt_color(gc.tensor(np.zeros((1, 6, 4, 1), np.float32)), "YUV2BGR_NV12")
