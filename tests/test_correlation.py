"""F.vision.correlation (FlowNet's correlation, MegEngine's op) against a
direct loop over its definition, its gradients against finite differences,
and its argument errors."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.op import ArgumentError
from gradcore.testing import gradcheck


def _reference(d1, d2, k, md, s1, s2, pad, multiply):
    """Out-of-range reads are zeros; each output is the mean over the window and channels."""
    n, c, h, w = d1.shape
    r = (k - 1) // 2
    border = md + r
    oh = -(-(h + 2 * pad - 2 * border) // s1)
    ow = -(-(w + 2 * pad - 2 * border) // s1)
    g = md // s2
    out = np.zeros((n, (2 * g + 1) ** 2, oh, ow))

    def at(d, b, y, x):
        return d[b, :, y, x] if 0 <= y < h and 0 <= x < w else np.zeros(c)

    for b in range(n):
        for ch in range((2 * g + 1) ** 2):
            sy, sx = (ch // (2 * g + 1) - g) * s2, (ch % (2 * g + 1) - g) * s2
            for y in range(oh):
                for x in range(ow):
                    y1, x1 = y * s1 + border - pad, x * s1 + border - pad
                    total = 0.0
                    for i in range(-r, r + 1):
                        for j in range(-r, r + 1):
                            p, q = at(d1, b, y1 + i, x1 + j), at(d2, b, y1 + sy + i, x1 + sx + j)
                            total += (p * q).sum() if multiply else np.abs(p - q).sum()
                    out[b, ch, y, x] = total / (k * k * c)
    return out


@pytest.mark.parametrize("k, md, s1, s2, pad, multiply", [
    (1, 1, 1, 1, 1, True), (3, 4, 2, 2, 2, True), (3, 2, 1, 1, 0, False), (5, 3, 3, 2, 4, True),
    (1, 0, 1, 1, 0, False)])
def test_matches_the_definition(k, md, s1, s2, pad, multiply):
    rng = np.random.default_rng(k * 10 + md)
    d1, d2 = rng.standard_normal((2, 3, 9, 11)), rng.standard_normal((2, 3, 9, 11))
    out = F.vision.correlation(gc.tensor(d1), gc.tensor(d2), kernel_size=k, max_displacement=md, stride1=s1,
                               stride2=s2, pad_size=pad, is_multiply=multiply)
    ref = _reference(d1, d2, k, md, s1, s2, pad, multiply)
    assert out.shape == ref.shape and out.dtype == np.float64
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("multiply", [True, False])
def test_gradients_match_finite_differences(multiply):
    rng = np.random.default_rng(1)
    d1, d2 = rng.standard_normal((1, 2, 6, 7)), rng.standard_normal((1, 2, 6, 7))
    fn = lambda a, b: F.vision.correlation(a, b, kernel_size=3, max_displacement=2, stride1=2, stride2=1,
                                           pad_size=2, is_multiply=multiply)
    assert gradcheck(fn, [gc.tensor(d1), gc.tensor(d2)])


def test_constant_images():
    # MegEngine's cases: ones correlate to 1, and their absolute difference is 0
    ones = gc.tensor(np.ones((1, 1, 3, 3), np.float32))
    assert F.vision.correlation(ones, ones, kernel_size=3, max_displacement=0).numpy().tolist() == [[[[1.0]]]]
    assert F.vision.correlation(ones, ones, kernel_size=3, max_displacement=0,
                                is_multiply=False).numpy().tolist() == [[[[0.0]]]]


def test_bad_arguments():
    x = gc.tensor(np.ones((1, 1, 4, 4), np.float32))
    with pytest.raises(ArgumentError, match="correlation: kernel_size must be odd"):
        F.vision.correlation(x, x, kernel_size=2)
    with pytest.raises(ArgumentError, match=r"correlation: data1 and data2 must be \(N, C, H, W\) of one shape"):
        F.vision.correlation(x, gc.tensor(np.ones((1, 1, 4, 5), np.float32)))
    with pytest.raises(ArgumentError, match="correlation: inputs of shape .* too small"):
        F.vision.correlation(x, x, kernel_size=3, max_displacement=2)
