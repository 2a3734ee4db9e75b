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
