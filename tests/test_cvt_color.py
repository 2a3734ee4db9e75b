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
    with pytest.raises(TypeError, match=r"^cvt_color: mode RGB2YUV computes on floating images, got uint8"):
        F.vision.cvt_color(gc.tensor(np.zeros((1, 1, 1, 3), "uint8")), "RGB2YUV")
    with pytest.raises(gc.op.ArgumentError, match=r"^cvt_color: inp must be images \(N, H, W, C\)"):
        F.vision.cvt_color(gc.tensor(np.zeros((1, 3), "float32")), "RGB2GRAY")
