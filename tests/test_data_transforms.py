"""The MegEngine image transforms beyond the basic ones (resizing and
cropping, flips, noise, colour jitter, lighting) and ConcatDataset.
Deterministic transforms are checked exactly against NumPy written out here;
random ones against the same formula with the draws of the loader's
generator (``T.seed(s)`` makes it ``np.random.default_rng(s)``), for
determinism, and for the range of effects their docstrings promise."""
import doctest
import inspect
import math

import numpy as np
import pytest

from gradcore.data import ArrayDataset, ConcatDataset, DataLoader, MapDataset, SequentialSampler, StreamDataset
from gradcore.data import dataset as dataset_module
from gradcore.data import transform as T
from gradcore.data.transform import vision as V
from gradcore.op import ArgumentError

NEW = ["ShortestEdgeResize", "RandomResize", "RandomResizedCrop", "CenterCrop", "RandomVerticalFlip",
       "GaussianNoise", "BrightnessTransform", "ContrastTransform", "SaturationTransform", "HueTransform",
       "ColorJitter", "Lighting"]

# MegEngine's constructor parameters, in order, with their defaults
SIGNATURES = {
    "ShortestEdgeResize": "(min_size, max_size, sample_style='range', interpolation=1, *, order=None)",
    "RandomResize": "(scale_range, interpolation=1, *, order=None)",
    "RandomResizedCrop": "(output_size, scale_range=(0.08, 1.0), ratio_range=(0.75, 1.3333333333333333), "
                         "interpolation=1, *, order=None)",
    "CenterCrop": "(output_size, *, order=None)",
    "RandomVerticalFlip": "(prob=0.5, *, order=None)",
    "GaussianNoise": "(mean=0.0, std=1.0, *, order=None)",
    "BrightnessTransform": "(value, *, order=None)",
    "ContrastTransform": "(value, *, order=None)",
    "SaturationTransform": "(value, *, order=None)",
    "HueTransform": "(value, *, order=None)",
    "ColorJitter": "(brightness=0, contrast=0, saturation=0, hue=0, *, order=None)",
    "Lighting": "(scale, *, order=None)",
}


def _image(shape=(6, 8, 3), dtype=np.uint8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, shape) if dtype == np.uint8 else rng.random(shape) * 255).astype(dtype)


def _draws(seed):
    """The generator the transforms draw from after ``T.seed(seed)``."""
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- API

@pytest.mark.parametrize("name", NEW)
def test_signatures_exports_and_docs_follow_megengine(name):
    cls = getattr(T, name)
    assert cls is getattr(V, name) and name in T.__all__ and name in V.__all__
    params = inspect.signature(cls).parameters.values()
    shown = []
    for p in params:
        if p.kind is p.KEYWORD_ONLY and "*" not in shown:
            shown.append("*")
        shown.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    assert "(" + ", ".join(shown) + ")" == SIGNATURES[name]
    assert all(p.annotation is not p.empty for p in params)
    assert cls.__doc__ and "Example::" in cls.__doc__


@pytest.mark.parametrize("obj", [getattr(V, n) for n in NEW] + [ConcatDataset], ids=lambda o: o.__name__)
def test_docstring_examples_run(obj):
    module = inspect.getmodule(obj)
    globs = dict(vars(module), T=T, np=np)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    tests = doctest.DocTestFinder(recurse=False).find(obj, obj.__name__, globs=globs)
    assert tests and tests[0].examples
    for test in tests:
        runner.run(test)
    assert runner.failures == 0, f"{obj.__name__}'s docstring example fails"


def test_every_new_transform_keeps_labels_and_gives_the_documented_shapes():
    data = [(_image((10, 12, 3), dtype, seed), np.int64(seed)) for seed in range(3)
            for dtype in (np.uint8, np.float32)]
    order = ("image", "image_category")
    cases = [
        (T.ShortestEdgeResize((6, 8), 100, order=order), None),
        (T.RandomResize((0.5, 1.5), order=order), None),
        (T.RandomResizedCrop((5, 7), order=order), (5, 7)),
        (T.CenterCrop((4, 6), order=order), (4, 6)),
        (T.RandomVerticalFlip(order=order), (10, 12)),
        (T.GaussianNoise(std=0.05, order=order), (10, 12)),
        (T.BrightnessTransform(0.3, order=order), (10, 12)),
        (T.ContrastTransform(0.3, order=order), (10, 12)),
        (T.SaturationTransform(0.3, order=order), (10, 12)),
        (T.HueTransform(0.2, order=order), (10, 12)),
        (T.ColorJitter(0.2, 0.2, 0.2, 0.1, order=order), (10, 12)),
        (T.Lighting(0.1, order=order), (10, 12)),
    ]
    T.seed(0)
    for t, hw in cases:
        for (image, label), (out, out_label) in zip(data, t.apply_batch(data)):
            assert out_label == label and out.dtype == image.dtype and out.shape[2] == 3, t
            if hw is not None:
                assert out.shape[:2] == hw, t


# ---------------------------------------------------------------- flips and crops

def test_random_vertical_flip_flips_images_masks_and_coords():
    img, mask = _image((3, 4, 2)), np.arange(12).reshape(3, 4, 1)
    coords = np.array([[1.0, 0.5], [3.0, 2.0]])
    out, out_mask, out_coords = T.RandomVerticalFlip(1.0, order=("image", "mask", "coords")).apply(
        (img, mask, coords))
    np.testing.assert_array_equal(out, img[::-1])
    np.testing.assert_array_equal(out_mask, mask[::-1])
    np.testing.assert_array_equal(out_coords, [[1.0, 2.5], [3.0, 1.0]])     # y -> H - y
    assert T.RandomVerticalFlip(0.0).apply(img) is img
    T.seed(3)
    flips = [not np.array_equal(T.RandomVerticalFlip().apply(img), img) for _ in range(200)]
    assert 60 < sum(flips) < 140


def test_center_crop_takes_the_middle_with_pythons_rounding():
    img = np.arange(7 * 9).reshape(7, 9, 1)
    out = T.CenterCrop((2, 4)).apply(img)
    # (9 - 4) / 2 = 2.5 and (7 - 2) / 2 = 2.5 both round to 2 (halves to even)
    np.testing.assert_array_equal(out, img[2:4, 2:6])
    np.testing.assert_array_equal(T.CenterCrop((4, 2)).apply(img), img[2:6, 4:6])   # 1.5 -> 2, 3.5 -> 4
    np.testing.assert_array_equal(T.CenterCrop(7).apply(img), img[:, 1:8])
    t = T.CenterCrop((2, 4), order=("image", "mask", "boxes"))
    _, mask, boxes = t.apply((img, img[..., 0], np.array([[3.0, 3.0, 5.0, 4.0]])))
    np.testing.assert_array_equal(mask, img[2:4, 2:6, 0])
    np.testing.assert_array_equal(boxes, [[1.0, 1.0, 3.0, 2.0]])
    with pytest.raises(AssertionError, match=r"CenterCrop: output_size \(8, 4\) is larger than the 7x9 image"):
        T.CenterCrop((8, 4)).apply(img)


def test_shortest_edge_resize_sizes():
    img = _image((2, 4, 3), np.float32)
    # shorter side 4 makes 4x8; max_size 6 then shrinks it to 3x6
    out = T.ShortestEdgeResize(4, max_size=6).apply(img)
    np.testing.assert_array_equal(out, T.Resize((3, 6)).apply(img))
    np.testing.assert_array_equal(T.ShortestEdgeResize(4, max_size=100).apply(img), T.Resize((4, 8)).apply(img))
    tall = _image((9, 3, 3))
    assert T.ShortestEdgeResize(6, max_size=100).apply(tall).shape == (18, 6, 3)
    # "range": a size in [lo, hi]; "choice": one of the sizes, each drawn from the loader's generator
    for seed in range(5):
        T.seed(seed)
        out = T.ShortestEdgeResize((3, 9), max_size=1000).apply(img)
        size = int(_draws(seed).integers(3, 10))
        assert out.shape == (size, 2 * size, 3)
        T.seed(seed)
        out = T.ShortestEdgeResize((2, 5, 11), max_size=1000, sample_style="choice").apply(img)
        assert out.shape[0] == int(_draws(seed).choice((2, 5, 11)))


def test_shortest_edge_resize_scales_masks_nearest_and_coords():
    t = T.ShortestEdgeResize(4, max_size=100, order=("image", "mask", "coords"))
    mask = np.array([[[1], [2]], [[3], [4]]], np.uint8)
    _, out_mask, coords = t.apply((_image((2, 2, 3)), mask, np.array([[1.0, 2.0]])))
    np.testing.assert_array_equal(out_mask[..., 0], mask[..., 0].repeat(2, 0).repeat(2, 1))
    np.testing.assert_array_equal(coords, [[2.0, 4.0]])


def test_random_resize_draws_one_scale_per_sample():
    img = _image((5, 7, 3))
    np.testing.assert_array_equal(T.RandomResize((2.0, 2.0)).apply(img), T.Resize((10, 14)).apply(img))
    for seed in range(5):
        T.seed(seed)
        out = T.RandomResize((0.5, 2.0)).apply(img)
        scale = _draws(seed).uniform(0.5, 2.0)
        th, tw = int(round(5 * scale)), int(round(7 * scale))
        np.testing.assert_array_equal(out, img if (th, tw) == (5, 7) else T.Resize((th, tw)).apply(img))
    with pytest.raises(ValueError, match=r"RandomResize: the 5x7 image would be resized to 0x0"):
        T.RandomResize((0.01, 0.01)).apply(img)


def _window(seed, height, width, scale_range=(0.08, 1.0), ratio_range=(3 / 4, 4 / 3)):
    """RandomResizedCrop's window, drawn by hand."""
    g = _draws(seed)
    for _ in range(10):
        target = g.uniform(*scale_range) * height * width
        ratio = math.exp(g.uniform(math.log(ratio_range[0]), math.log(ratio_range[1])))
        w, h = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            return int(g.integers(0, width - w + 1)), int(g.integers(0, height - h + 1)), w, h
    raise AssertionError("no window fits")


def test_random_resized_crop_crops_the_drawn_window_and_resizes_it():
    img = _image((12, 10, 3))
    for seed in range(6):
        T.seed(seed)
        out = T.RandomResizedCrop((4, 5)).apply(img)
        x, y, w, h = _window(seed, 12, 10)
        np.testing.assert_array_equal(out, T.Resize((4, 5)).apply(img[y:y + h, x:x + w]))
    # the whole image, at the full scale and its own aspect ratio
    square = _image((8, 8, 3), np.float32)
    np.testing.assert_array_equal(T.RandomResizedCrop(8, (1.0, 1.0), (1.0, 1.0)).apply(square), square)
    # masks nearest, coordinates into the output's frame
    T.seed(1)
    t = T.RandomResizedCrop((6, 6), order=("image", "mask", "coords"))
    _, mask, coords = t.apply((img, img[..., :1], np.array([[4.0, 5.0]])))
    x, y, w, h = _window(1, 12, 10)
    np.testing.assert_array_equal(mask, V._resize(img[y:y + h, x:x + w, :1], 6, 6, "nearest"))
    np.testing.assert_allclose(coords, [[(4 - x) * 6 / w, (5 - y) * 6 / h]])


def test_random_resized_crop_falls_back_to_the_centre_clamped_to_the_ratios():
    # a 10x10 image cannot hold a window of ratio 4..5 covering 90..100% of it
    img = np.arange(100, dtype=np.float32).reshape(10, 10, 1)
    out = T.RandomResizedCrop((2, 10), scale_range=(0.9, 1.0), ratio_range=(4.0, 5.0)).apply(img)
    # w = 10, h = round(10 / 4) = 2 (halves to even), y = (10 - 2) // 2
    np.testing.assert_array_equal(out, img[4:6])
    # too tall a ratio: h = 10, w = round(10 * 0.25) = 2, x = 4; then resized to 10x5
    out = T.RandomResizedCrop((10, 5), scale_range=(0.9, 1.0), ratio_range=(0.2, 0.25)).apply(img)
    np.testing.assert_array_equal(out, T.Resize((10, 5)).apply(img[:, 4:6]))


# ---------------------------------------------------------------- noise, colour and lighting

def test_gaussian_noise_is_the_drawn_noise_clipped():
    img = _image((4, 5, 3))
    T.seed(7)
    out = T.GaussianNoise(mean=[0.0, 0.1, -0.1], std=0.05).apply(img)
    noise = _draws(7).normal(np.float32([0.0, 0.1, -0.1]), np.float32(0.05), img.shape) * 255
    np.testing.assert_array_equal(out, np.clip(img + noise.astype(np.float32), 0, 255).astype(np.uint8))
    np.testing.assert_array_equal(T.GaussianNoise(std=0.0).apply(img), img)
    f = _image((4, 5, 3), np.float32)
    T.seed(7)
    assert T.GaussianNoise(std=0.01).apply(f).dtype == np.float32
    with pytest.raises(ValueError, match=r"GaussianNoise: mean \(2,\) and std \(\) do not match the image's "
                                         r"shape \(4, 5, 3\)"):
        T.GaussianNoise(mean=[0.0, 0.1]).apply(img)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_brightness_scales_by_the_drawn_factor(dtype):
    img = _image((4, 5, 3), dtype)
    T.seed(2)
    out = T.BrightnessTransform(0.4).apply(img)
    alpha = _draws(2).uniform(0.6, 1.4)
    np.testing.assert_array_equal(out, (img.astype(np.float32) * alpha).clip(0, 255).astype(dtype))
    assert T.BrightnessTransform(0).apply(img) is img
    # the factor stays in [1 - value, 1 + value] (here on a mid-gray, so nothing clips)
    gray = np.full((2, 2, 3), 100.0, np.float32)
    T.seed(0)
    factors = [T.BrightnessTransform(0.4).apply(gray)[0, 0, 0] / 100 for _ in range(300)]
    assert 0.6 <= min(factors) < 0.65 and 1.35 < max(factors) <= 1.4
    T.seed(0)
    assert min(T.BrightnessTransform(3).apply(gray)[0, 0, 0] for _ in range(300)) >= 0   # max(0, 1 - value)


def _luma(img):
    """The gray level, written out: 0.114 B + 0.587 G + 0.299 R."""
    img = img.astype(np.float64)
    return 0.114 * img[..., 0] + 0.587 * img[..., 1] + 0.299 * img[..., 2]


def test_contrast_blends_with_the_mean_gray_level():
    img = _image((4, 5, 3), np.float32)
    T.seed(4)
    out = T.ContrastTransform(0.5).apply(img)
    alpha = _draws(4).uniform(0.5, 1.5)
    want = (img * alpha + _luma(img).mean() * (1 - alpha)).clip(0, 255)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-3)
    u8 = _image((4, 5, 3))
    T.seed(4)
    want = (u8 * alpha + _luma(u8).mean() * (1 - alpha)).clip(0, 255).astype(np.uint8)   # truncated
    assert np.abs(T.ContrastTransform(0.5).apply(u8).astype(int) - want).max() <= 1
    # a one-channel image is its own gray
    one = _image((4, 5, 1), np.float32)
    T.seed(4)
    np.testing.assert_allclose(T.ContrastTransform(0.5).apply(one),
                               (one * alpha + one.mean() * (1 - alpha)).clip(0, 255), rtol=1e-5)
    with pytest.raises(ValueError, match=r"ContrastTransform: an image must have 1, 3 \(BGR\) or 4 \(BGRA\) "
                                         r"channels, got shape \(4, 5, 2\)"):
        T.ContrastTransform(0.5).apply(_image((4, 5, 2)))


def test_saturation_blends_with_the_gray_image():
    img = _image((4, 5, 3), np.float32)
    T.seed(5)
    out = T.SaturationTransform(0.5).apply(img)
    alpha = _draws(5).uniform(0.5, 1.5)
    want = (img * alpha + _luma(img)[..., None] * (1 - alpha)).clip(0, 255)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-3)
    one = _image((4, 5, 1))
    assert T.SaturationTransform(0.5).apply(one) is one
    # gray pixels stay gray (to float rounding)
    gray = np.repeat(_image((4, 5, 1), np.float32), 3, axis=2)
    np.testing.assert_allclose(T.SaturationTransform(0.9).apply(gray), gray, rtol=1e-5)


def test_bgr_hsv_conversions_on_known_colours():
    colours = np.array([[[0, 0, 255], [0, 255, 0], [255, 0, 0], [0, 255, 255], [40, 40, 40], [0, 0, 0]]],
                       np.uint8)                                     # red, green, blue, yellow, gray, black (BGR)
    h, s, v = V._bgr_to_hsv(colours)
    # hues on 0..255: red 0, green 256/3, blue 512/3 (rounded), yellow 256/6
    assert h.tolist() == [[0, 85, 171, 43, 0, 0]]
    assert s.tolist() == [[255, 255, 255, 255, 0, 0]] and v.tolist() == [[255, 255, 255, 255, 40, 0]]
    # decoding reads hues on 255 (as OpenCV): 85 is exactly a third of the circle
    np.testing.assert_array_equal(V._hsv_to_bgr(np.array([0, 85, 170]), np.full(3, 255), np.full(3, 255)),
                                  [[0, 0, 255], [0, 255, 0], [255, 0, 0]])
    # a half-saturated orange: h = 21 (sector 0 at 21 * 6 / 255 = 0.494), v = 200
    np.testing.assert_array_equal(V._hsv_to_bgr(np.array(21), np.array(128), np.array(200)),
                                  [round(200 * (1 - 128 / 255)), round(200 * (1 - 128 / 255 * (1 - 21 * 6 / 255))),
                                   200])


def test_hue_rotates_hues_and_leaves_grays():
    colours = np.array([[[0, 0, 255], [0, 255, 0], [255, 0, 0]]], np.uint8)
    for seed in range(5):
        T.seed(seed)
        out = T.HueTransform(0.5).apply(colours)
        shift = int(_draws(seed).uniform(-0.5, 0.5) * 255)
        h, s, v = V._bgr_to_hsv(colours)
        np.testing.assert_array_equal(out, V._hsv_to_bgr((h + shift) % 256, s, v))
        assert out.max(axis=2).tolist() == [[255] * 3]               # still fully saturated and bright
    # a shift of a third of the circle (85 of 256 steps) turns red into green
    h, s, v = V._bgr_to_hsv(colours[:, :1])
    np.testing.assert_array_equal(V._hsv_to_bgr((h + 85) % 256, s, v), [[[0, 255, 0]]])
    grays = np.repeat(_image((4, 5, 1)), 3, axis=2)
    T.seed(0)
    np.testing.assert_array_equal(T.HueTransform(0.5).apply(grays), grays)
    # float images go through uint8 and come back in their dtype
    f = colours.astype(np.float32) + 0.7
    T.seed(1)
    out = T.HueTransform(0.3).apply(f)
    T.seed(1)
    assert out.dtype == np.float32 and np.array_equal(out, T.HueTransform(0.3).apply(colours).astype(np.float32))
    one = _image((3, 3, 1))
    assert T.HueTransform(0.5).apply(one) is one
    with pytest.raises(ValueError, match=r"HueTransform: an image must have 3 \(BGR\) channels, got shape "
                                         r"\(3, 3, 4\)"):
        T.HueTransform(0.5).apply(_image((3, 3, 4)))


def test_lighting_adds_the_drawn_pca_shift():
    img = _image((4, 5, 3))
    T.seed(9)
    out = T.Lighting(0.1).apply(img)
    eigval = np.array([0.2175, 0.0188, 0.0045])
    eigvec = np.array([[-0.5836, -0.6948, 0.4203], [-0.5808, -0.0045, -0.8140], [-0.5675, 0.7192, 0.4009]])
    shift = eigvec @ (_draws(9).normal(0, 0.1 * 255, 3) * eigval)
    np.testing.assert_array_equal(out, (img.astype(np.float32) + shift).clip(0, 255).astype(np.uint8))
    assert T.Lighting(0).apply(img) is img
    with pytest.raises(ValueError, match=r"Lighting: an image must have 3 \(BGR\) channels, got shape \(4, 5, 1\)"):
        T.Lighting(0.1).apply(_image((4, 5, 1)))


def test_color_jitter_applies_the_named_jitters_in_a_random_order():
    img = _image((4, 5, 3))
    assert T.ColorJitter().apply(img) is img
    # brightness alone: a factor in [0.7, 1.3]
    gray = np.full((2, 2, 3), 100.0, np.float32)
    T.seed(0)
    factors = [T.ColorJitter(brightness=0.3).apply(gray)[0, 0, 0] / 100 for _ in range(200)]
    assert 0.7 <= min(factors) and max(factors) <= 1.3 and max(factors) - min(factors) > 0.4
    t = T.ColorJitter(0.3, 0.3, 0.3, 0.1)
    assert [type(p).__name__ for p in t.transforms.transforms] == [
        "BrightnessTransform", "ContrastTransform", "SaturationTransform", "HueTransform"]
    T.seed(11)
    first = [t.apply(img) for _ in range(4)]
    T.seed(11)
    assert all(np.array_equal(a, t.apply(img)) for a in first)
    assert len({a.tobytes() for a in first}) == 4
    # inside a Compose it takes the Compose's order
    c = T.Compose([T.ColorJitter(0.3)], order=("image_category", "image"))
    label, out = c.apply((5, img))
    assert label == 5 and out.shape == img.shape


# ---------------------------------------------------------------- argument errors

@pytest.mark.parametrize("make, match", [
    (lambda: T.ShortestEdgeResize(4, 10, sample_style="pick"), "ShortestEdgeResize: sample_style"),
    (lambda: T.ShortestEdgeResize((9, 3), 10), r"ShortestEdgeResize: min_size .* \(9, 3\)"),
    (lambda: T.ShortestEdgeResize(0, 10), "ShortestEdgeResize: min_size"),
    (lambda: T.ShortestEdgeResize(4, 0), "ShortestEdgeResize: max_size"),
    (lambda: T.ShortestEdgeResize(4, 10, interpolation="cubic"), "ShortestEdgeResize: interpolation"),
    (lambda: T.RandomResize((2.0, 1.0)), r"RandomResize: scale_range .* \(2.0, 1.0\)"),
    (lambda: T.RandomResize(1.5), "RandomResize: scale_range"),
    (lambda: T.RandomResizedCrop(4, scale_range=(1.0, 0.5)), "RandomResizedCrop: scale_range"),
    (lambda: T.RandomResizedCrop(4, ratio_range=(0, 1)), "RandomResizedCrop: ratio_range"),
    (lambda: T.RandomResizedCrop(0), "RandomResizedCrop: output_size"),
    (lambda: T.CenterCrop((2, 3, 4)), "CenterCrop: output_size"),
    (lambda: T.RandomVerticalFlip(1.5), r"RandomVerticalFlip: prob must be in \[0, 1\], got 1.5"),
    (lambda: T.GaussianNoise(std=-1), "GaussianNoise: std"),
    (lambda: T.BrightnessTransform(-0.1), "BrightnessTransform: value must be a non-negative number, got -0.1"),
    (lambda: T.ContrastTransform("a"), "ContrastTransform: value"),
    (lambda: T.SaturationTransform(-1), "SaturationTransform: value"),
    (lambda: T.HueTransform(0.6), r"HueTransform: value must be in \[0, 0.5\], got 0.6"),
    (lambda: T.ColorJitter(hue=0.7), r"ColorJitter: hue=0.7: HueTransform: value must be in \[0, 0.5\]"),
    (lambda: T.ColorJitter(brightness=-1), "ColorJitter: brightness=-1"),
    (lambda: T.Lighting(-0.1), "Lighting: scale"),
])
def test_bad_arguments_are_argument_errors_naming_the_transform(make, match):
    with pytest.raises(ArgumentError, match=match) as info:
        make()
    assert isinstance(info.value, ValueError) and isinstance(info.value, AssertionError)


def test_a_non_image_is_refused_by_name():
    for t in (T.CenterCrop(2), T.RandomResizedCrop(2), T.HueTransform(0.1), T.GaussianNoise()):
        with pytest.raises(ArgumentError, match=rf"{type(t).__name__}: an image must be an \(H, W, C\)"):
            t.apply(np.zeros(5))


# ---------------------------------------------------------------- ConcatDataset

class _Stream(StreamDataset):
    def __init__(self):
        pass

    def __iter__(self):
        return iter(())


def test_concat_dataset_indexes_across_its_parts():
    a = ArrayDataset(np.arange(3), np.arange(3) * 10)
    b = ArrayDataset(np.arange(100, 105), np.arange(5) * 10)
    empty = ArrayDataset(np.zeros((0,)))
    ds = ConcatDataset([a, empty, b])
    assert isinstance(ds, MapDataset) and len(ds) == 8 and ds.cumulative_sizes == [3, 3, 8]
    assert [int(ds[i][0]) for i in range(8)] == [0, 1, 2, 100, 101, 102, 103, 104]
    assert [int(ds[i][0]) for i in range(-8, 0)] == [0, 1, 2, 100, 101, 102, 103, 104]
    assert int(ds[np.int64(4)][1]) == 10
    assert [int(x) for x, _ in ds] == [0, 1, 2, 100, 101, 102, 103, 104]     # iteration stops at IndexError
    for bad in (8, -9):
        with pytest.raises(IndexError, match=rf"ConcatDataset: index {bad} is out of range for 8 samples"):
            ds[bad]
    with pytest.raises(TypeError, match="ConcatDataset: indices must be integers, got float"):
        ds[1.0]
    with pytest.raises(ArgumentError, match="ConcatDataset: datasets must not be empty"):
        ConcatDataset([])
    with pytest.raises(ArgumentError, match=r"ConcatDataset: datasets\[1\] is a _Stream"):
        ConcatDataset([a, _Stream()])
    # MegEngine's own check, with the parts' shapes differing
    d1 = ArrayDataset(np.zeros((10, 3, 4, 4)), np.zeros((10, 1)))
    d2 = ArrayDataset(np.zeros((20, 2, 2, 2)), np.zeros((20, 2)))
    both = ConcatDataset([d1, d2])
    assert both[15][0].shape == (2, 2, 2) and both[15][1].shape == (2,) and len(both) == 30


def test_concat_dataset_in_a_loader():
    ds = ConcatDataset([ArrayDataset(np.arange(3, dtype=np.float32)),
                        ArrayDataset(np.arange(10, 13, dtype=np.float32))])
    batches = [b[0].tolist() for b in DataLoader(ds, SequentialSampler(ds, batch_size=4))]
    assert batches == [[0, 1, 2, 10], [11, 12]]
    assert dataset_module.__all__.count("ConcatDataset") == 1


# ---------------------------------------------------------------- DataLoader

def test_new_random_transforms_in_workers_repeat_with_the_seed():
    rng = np.random.default_rng(0)
    ds = ArrayDataset(rng.integers(0, 256, (12, 10, 12, 3), dtype=np.uint8), np.arange(12))
    t = T.Compose([T.RandomResizedCrop((8, 8), scale_range=(0.3, 1.0)), T.RandomVerticalFlip(),
                   T.ColorJitter(0.3, 0.3, 0.3, 0.1), T.GaussianNoise(std=0.02), T.Lighting(0.1),
                   T.ShortestEdgeResize((6, 8), max_size=8), T.CenterCrop(6), T.ToMode("CHW")],
                  order=("image", "image_category"))

    def run(seed, workers=2):
        loader = DataLoader(ds, SequentialSampler(ds, batch_size=4), transform=t, num_workers=workers, seed=seed,
                            timeout=120)
        return [(x.copy(), y.copy()) for x, y in loader]

    first, again, other = run(5), run(5), run(6)
    assert len(first) == 3 and first[0][0].shape == (4, 3, 6, 6) and first[0][0].dtype == np.uint8
    for (xa, ya), (xb, yb) in zip(first, again):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(first, other))
    # and the same as in the main process
    for (xa, _), (xb, _) in zip(first, run(5, workers=0)):
        np.testing.assert_array_equal(xa, xb)
    # the samples of a batch get different draws
    assert len({first[0][0][i].tobytes() for i in range(4)}) == 4


# ---------------------------------------------------------------- against OpenCV, where it is installed

def test_colour_conversions_match_opencv():
    cv2 = pytest.importorskip("cv2", reason="OpenCV is only a reference here, not a dependency")
    rng = np.random.default_rng(0)
    everything = np.stack(np.meshgrid(*[np.arange(256)] * 3, indexing="ij"), -1).reshape(256, -1, 3)
    everything = everything.astype(np.uint8)
    h, s, v = V._bgr_to_hsv(everything)
    np.testing.assert_array_equal(np.stack([h, s, v], -1), cv2.cvtColor(everything, cv2.COLOR_BGR2HSV_FULL))
    back = V._hsv_to_bgr(everything[..., 0], everything[..., 1], everything[..., 2])
    ref = cv2.cvtColor(everything, cv2.COLOR_HSV2BGR_FULL)
    # OpenCV's vector kernel differs in the last bit of a few products
    assert np.abs(back.astype(int) - ref).max() <= 1 and (back != ref).mean() < 1e-5
    x = (rng.random((32, 64, 3)) * 255).astype(np.float32)
    np.testing.assert_allclose(V._gray(x, "test")[..., 0], cv2.cvtColor(x, cv2.COLOR_BGR2GRAY), rtol=1e-6)
