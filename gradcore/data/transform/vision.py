"""Image transforms on NumPy arrays, after
``megengine.data.transform.vision``: images are ``(H, W, C)`` (or
``(H, W)``) arrays; ``ToMode("CHW")`` turns them into the ``(C, H, W)``
that convolutions take. A sample is a tuple whose fields are named by
``order`` (default ``("image",)``; e.g. ``("image", "image_category")``):
fields named ``image``, ``mask`` and ``coords``/``boxes`` are
transformed, ``*category`` and ``*info`` pass through. The colour
transforms take BGR images on the 0..255 scale, as MegEngine's; where
MegEngine calls OpenCV (resizing, gray and HSV conversions) these
reimplement its arithmetic in NumPy (bilinear resizing of uint8 images:
within one level of OpenCV's fixed-point rounding).

Example::

    >>> import numpy as np
    >>> from gradcore.data import transform as T
    >>> t = T.Compose([T.RandomHorizontalFlip(1.0), T.Normalize(mean=0.5, std=0.5), T.ToMode("CHW")],
    ...               order=("image", "image_category"))
    >>> img, label = t.apply((np.ones((4, 4, 1), np.float32), 3))
    >>> img.shape, float(img.max()), label
    ((1, 4, 4), 1.0, 3)
"""
from __future__ import annotations

import collections.abc
import math
import numbers
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import numpy as np

from ...op import ArgumentError
from .base import Transform, rng

__all__ = ["VisionTransform", "Compose", "ToMode", "Normalize", "Pad", "RandomCrop", "RandomHorizontalFlip",
           "RandomVerticalFlip", "Resize", "ShortestEdgeResize", "RandomResize", "RandomResizedCrop", "CenterCrop",
           "GaussianNoise", "BrightnessTransform", "ContrastTransform", "SaturationTransform", "HueTransform",
           "ColorJitter", "Lighting", "INTER_NEAREST", "INTER_LINEAR"]

# OpenCV's numbers for the interpolation modes, which MegEngine's Resize takes
INTER_NEAREST = 0
INTER_LINEAR = 1
_INTERPOLATIONS = {INTER_NEAREST: "nearest", INTER_LINEAR: "linear", "nearest": "nearest", "linear": "linear"}


def _hw(image: np.ndarray, who: str) -> Tuple[int, int]:
    if not isinstance(image, np.ndarray) or image.ndim not in (2, 3):
        got = f"{type(image).__name__} of shape {getattr(image, 'shape', '?')}"
        raise ArgumentError(f"{who}: an image must be an (H, W, C) or (H, W) NumPy array, got {got}")
    return image.shape[0], image.shape[1]


def _unchanged(self, value: Any) -> Any:
    """A field kind a transform passes through (``_apply_<kind> = _unchanged``)."""
    return value


class VisionTransform(Transform):
    """The base of the image transforms: ``apply`` sends each field of the
    sample to ``_apply_<kind>`` by the kind ``order`` gives it. Subclasses
    define ``_apply_image`` (and ``_apply_mask``, ``_apply_coords`` where
    they mean something).

    Example::

        >>> from gradcore.data.transform import VisionTransform
        >>> class Invert(VisionTransform):
        ...     def _apply_image(self, image): return 1 - image
        >>> Invert().apply(np.zeros((1, 2, 1)))[0, :, 0]
        array([1., 1.])
    """

    def __init__(self, order: Optional[Sequence[str]] = None):
        if order is None:
            order = ("image",)
        elif isinstance(order, str) or not isinstance(order, collections.abc.Sequence):
            raise ArgumentError(f"{type(self).__name__}: order must be a sequence of names, got {order!r}")
        for kind in order:
            if kind == "batch":
                raise ArgumentError(f"{type(self).__name__}: 'batch' is not a field kind")
            if kind.endswith("category") or kind.endswith("info"):
                continue
            if self._get_apply(kind) is None:
                raise NotImplementedError(f"{type(self).__name__}: unsupported field kind {kind!r}")
        self.order = tuple(order)

    def apply(self, input: Any) -> Any:
        """Transform one sample: a tuple in ``order``'s layout, or a lone image.

        Example::

            >>> ToMode().apply(np.zeros((2, 3, 1))).shape
            (1, 2, 3)
        """
        self._prepare(input)
        single = not isinstance(input, tuple)
        fields = (input,) if single else input
        out = []
        for i, value in enumerate(fields):
            fn = self._get_apply(self.order[i]) if i < len(self.order) else None
            out.append(value if fn is None else fn(value))
        return out[0] if single and len(out) == 1 else tuple(out)

    def _prepare(self, input: Any) -> None:
        """Draw this sample's random choices (once for all its fields)."""

    def _get_apply(self, kind: str) -> Optional[Callable]:
        return getattr(self, f"_apply_{kind}", None)

    def _get_image(self, input: Any) -> np.ndarray:
        if not isinstance(input, tuple):
            return input
        if "image" not in self.order:
            raise ArgumentError(f"{type(self).__name__}: order {self.order} has no 'image' field")
        return input[self.order.index("image")]

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} does not transform images")

    def _apply_coords(self, coords: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} does not transform coordinates")

    def _apply_mask(self, mask: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} does not transform masks")

    def _apply_boxes(self, boxes: np.ndarray) -> np.ndarray:
        # a box (x0, y0, x1, y1) moves as its four corners do
        corners = np.asarray(boxes, np.float64).reshape(-1, 4)[:, [0, 1, 2, 1, 0, 3, 2, 3]].reshape(-1, 2)
        corners = self._apply_coords(corners).reshape(-1, 4, 2)
        return np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1)


class Compose(VisionTransform):
    """Several transforms one after another (they take this one's
    ``order``). ``shuffle_indices`` (1-based groups, e.g. ``[(1, 2)]``)
    applies each group's transforms in a random order per sample;
    ``batch_compose`` runs each transform over the whole batch in turn.

    Example::

        >>> from gradcore.data.transform import Compose, Normalize, ToMode
        >>> t = Compose([Normalize(0.5, 0.5), ToMode("CHW")])
        >>> t.apply(np.ones((2, 2, 1), np.float32))[0]
        array([[1., 1.],
               [1., 1.]], dtype=float32)
    """

    def __init__(self, transforms: Sequence[VisionTransform] = (), batch_compose: bool = False,
                 shuffle_indices: Optional[Sequence[Sequence[int]]] = None, *,
                 order: Optional[Sequence[str]] = None):
        super().__init__(order)
        self.transforms = list(transforms)
        for t in self.transforms:
            if not isinstance(t, Transform):
                raise TypeError(f"Compose: expected transforms, got {type(t).__name__}")
        self._set_order()
        if batch_compose and shuffle_indices is not None:
            raise ArgumentError("Compose: shuffle_indices cannot be used with batch_compose")
        self.batch_compose = batch_compose
        if shuffle_indices is not None:
            shuffle_indices = [tuple(i - 1 for i in group) for group in shuffle_indices]
            for group in shuffle_indices:
                if any(not 0 <= i < len(self.transforms) for i in group):
                    raise ArgumentError(f"Compose: shuffle_indices are 1-based positions in transforms "
                                        f"(1..{len(self.transforms)}), got {[i + 1 for i in group]}")
        self.shuffle_indices = shuffle_indices

    def _set_order(self) -> None:
        for t in self.transforms:
            if isinstance(t, VisionTransform):
                t.order = self.order
            if isinstance(t, Compose):
                t._set_order()

    def apply_batch(self, inputs: Sequence[Any]) -> Tuple:
        if self.batch_compose:
            for t in self.transforms:
                inputs = t.apply_batch(inputs)
            return tuple(inputs)
        return super().apply_batch(inputs)

    def apply(self, input: Any) -> Any:
        for t in self._ordered():
            input = t.apply(input)
        return input

    def _ordered(self):
        if self.shuffle_indices is None:
            return self.transforms
        source = list(range(len(self.transforms)))
        for group in self.shuffle_indices:
            for src, dst in zip(group, rng().permutation(list(group)).tolist()):
                source[src] = dst
        return [self.transforms[i] for i in source]


class ToMode(VisionTransform):
    """``(H, W, C)`` images (and masks) to ``(C, H, W)`` (``mode="CHW"``,
    the only mode); an ``(H, W)`` image becomes ``(1, H, W)``.

    Example::

        >>> from gradcore.data.transform import ToMode
        >>> ToMode("CHW").apply(np.zeros((8, 8, 3))).shape
        (3, 8, 8)
    """

    def __init__(self, mode: str = "CHW", *, order: Optional[Sequence[str]] = None):
        super().__init__(order)
        if mode != "CHW":
            raise ArgumentError(f"ToMode: unsupported mode {mode!r} (only 'CHW')")
        self.mode = mode

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        _hw(image, "ToMode")
        return np.ascontiguousarray(image[None] if image.ndim == 2 else np.moveaxis(image, 2, 0))

    _apply_mask = _apply_image
    _apply_coords = _unchanged


class Normalize(VisionTransform):
    """``(image - mean) / std`` per channel (the last axis), in float32.

    Example::

        >>> from gradcore.data.transform import Normalize
        >>> Normalize(mean=[1, 2], std=[2, 4]).apply(np.full((1, 1, 2), 3.0))[0, 0]
        array([1.  , 0.25], dtype=float32)
    """

    def __init__(self, mean: Union[float, Sequence[float]] = 0.0, std: Union[float, Sequence[float]] = 1.0, *,
                 order: Optional[Sequence[str]] = None):
        super().__init__(order)
        self.mean = np.array(mean, dtype=np.float32)
        self.std = np.array(std, dtype=np.float32)
        if (self.std == 0).any():
            raise ArgumentError(f"Normalize: std must not be 0, got {std!r}")

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        _hw(image, "Normalize")
        return ((image - self.mean) / self.std).astype(np.float32, copy=False)

    _apply_coords = _apply_mask = _unchanged


def _shifted(coords: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """A copy of the (x, y) rows ``coords`` moved by (dx, dy)."""
    coords = np.array(coords, copy=True)
    coords[:, 0] += dx
    coords[:, 1] += dy
    return coords


def _pad(image: np.ndarray, top: int, bottom: int, left: int, right: int, value) -> np.ndarray:
    if not (top or bottom or left or right):
        return image
    h, w = image.shape[:2]
    value = np.asarray(value)
    dtype = np.result_type(image.dtype, np.float32) if value.dtype.kind == "f" and image.dtype.kind != "f" \
        else image.dtype
    out = np.empty((h + top + bottom, w + left + right) + image.shape[2:], dtype)
    out[...] = value if value.ndim == 0 or image.ndim == 3 else value.reshape(-1)[0]
    out[top:top + h, left:left + w] = image
    return out


class Pad(VisionTransform):
    """Pad images with ``value`` (per channel or one number) and masks with
    ``mask_value``: ``size`` is one int (all four sides), two (bottom,
    right) or four (top, bottom, left, right).

    Example::

        >>> from gradcore.data.transform import Pad
        >>> Pad(1).apply(np.ones((2, 2, 1))).shape
        (4, 4, 1)
    """

    def __init__(self, size: Union[int, Sequence[int]] = 0, value: Any = 0, mask_value: int = 0, *,
                 order: Optional[Sequence[str]] = None):
        super().__init__(order)
        if isinstance(size, numbers.Integral):
            size = (size,) * 4
        elif isinstance(size, collections.abc.Sequence) and len(size) == 2:
            size = (0, size[0], 0, size[1])
        elif not (isinstance(size, collections.abc.Sequence) and len(size) == 4):
            raise ArgumentError(f"Pad: size must be an int or 2 or 4 ints (top, bottom, left, right), got {size!r}")
        if any(int(s) < 0 for s in size):
            raise ArgumentError(f"Pad: sizes must not be negative, got {tuple(size)}")
        self.size = tuple(int(s) for s in size)
        self.value = value
        self.mask_value = mask_value

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        _hw(image, "Pad")
        return _pad(image, *self.size, self.value)

    def _apply_mask(self, mask: np.ndarray) -> np.ndarray:
        return _pad(mask, *self.size, self.mask_value)

    def _apply_coords(self, coords: np.ndarray) -> np.ndarray:
        return _shifted(coords, self.size[2], self.size[0])


def _size2(owner: str, size) -> Tuple[int, int]:
    if isinstance(size, numbers.Integral):
        size = (size, size)
    if not (isinstance(size, collections.abc.Sequence) and len(size) == 2) or any(int(s) <= 0 for s in size):
        raise ArgumentError(f"{owner}: output_size must be a positive int or (height, width), got {size!r}")
    return int(size[0]), int(size[1])


class RandomCrop(VisionTransform):
    """Pad (``padding_size``, as ``Pad``), then crop an ``output_size``
    window at a random place; an image smaller than the window is padded
    at the top and left up to it.

    Example::

        >>> from gradcore.data.transform import seed, RandomCrop
        >>> seed(0)
        >>> RandomCrop(6, padding_size=1).apply(np.ones((6, 6, 1))).shape
        (6, 6, 1)
    """

    def __init__(self, output_size: Union[int, Tuple[int, int]], padding_size: Union[int, Sequence[int]] = 0,
                 padding_value: Any = 0, padding_maskvalue: int = 0, *, order: Optional[Sequence[str]] = None):
        super().__init__(order)
        self.output_size = _size2("RandomCrop", output_size)
        self.pad = Pad(padding_size, padding_value, padding_maskvalue, order=self.order)
        self.padding_value = padding_value
        self.padding_maskvalue = padding_maskvalue

    def apply(self, input: Any) -> Any:
        self.pad.order = self.order
        return super().apply(self.pad.apply(input))

    def _prepare(self, input: Any) -> None:
        self._h, self._w = _hw(self._get_image(input), "RandomCrop")
        th, tw = self.output_size
        self._x = int(rng().integers(0, max(0, self._w - tw) + 1))
        self._y = int(rng().integers(0, max(0, self._h - th) + 1))

    def _crop(self, image: np.ndarray, value) -> np.ndarray:
        th, tw = self.output_size
        image = _pad(image, max(0, th - self._h), 0, max(0, tw - self._w), 0, value)
        return image[self._y:self._y + th, self._x:self._x + tw]

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        return self._crop(image, self.padding_value)

    def _apply_mask(self, mask: np.ndarray) -> np.ndarray:
        return self._crop(mask, self.padding_maskvalue)

    def _apply_coords(self, coords: np.ndarray) -> np.ndarray:
        return _shifted(coords, -self._x, -self._y)


class _RandomFlip(VisionTransform):
    """Mirror along ``_axis`` (0: rows, 1: columns) with probability ``prob``."""

    _axis = 1

    def __init__(self, prob: float = 0.5, *, order: Optional[Sequence[str]] = None):
        super().__init__(order)
        if not isinstance(prob, numbers.Real) or not 0 <= prob <= 1:
            raise ArgumentError(f"{type(self).__name__}: prob must be in [0, 1], got {prob!r}")
        self.prob = prob

    def _prepare(self, input: Any) -> None:
        self._flipped = bool(rng().random() < self.prob)
        self._size = _hw(self._get_image(input), type(self).__name__)[self._axis]

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        if not self._flipped:
            return image
        return np.ascontiguousarray(image[::-1] if self._axis == 0 else image[:, ::-1])

    _apply_mask = _apply_image

    def _apply_coords(self, coords: np.ndarray) -> np.ndarray:
        if not self._flipped:
            return coords
        coords = np.array(coords, copy=True)
        k = 1 - self._axis             # coordinates are (x, y): x runs along axis 1
        coords[:, k] = self._size - coords[:, k]
        return coords


class RandomHorizontalFlip(_RandomFlip):
    """Mirror left-right with probability ``prob``.

    Example::

        >>> from gradcore.data.transform import RandomHorizontalFlip
        >>> RandomHorizontalFlip(1.0).apply(np.arange(3.0).reshape(1, 3, 1))[0, :, 0]
        array([2., 1., 0.])
    """

    _axis = 1


class RandomVerticalFlip(_RandomFlip):
    """Mirror top-bottom with probability ``prob`` (coordinates: ``y``
    becomes ``H - y``).

    Example::

        >>> from gradcore.data.transform import RandomVerticalFlip
        >>> RandomVerticalFlip(1.0).apply(np.arange(3.0).reshape(3, 1, 1))[:, 0, 0]
        array([2., 1., 0.])
    """

    _axis = 0


def _resize(image: np.ndarray, th: int, tw: int, mode: str) -> np.ndarray:
    """OpenCV's geometry: pixel centres at half-integers, the source
    coordinate of target pixel ``i`` is ``(i + 0.5) * h / th - 0.5``."""
    h, w = image.shape[:2]
    if mode == "nearest":
        ys = np.minimum((np.arange(th) * (h / th)).astype(np.int64), h - 1)
        xs = np.minimum((np.arange(tw) * (w / tw)).astype(np.int64), w - 1)
        return image[ys][:, xs]

    def axis(n_out, n_in):
        src = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
        lo = np.floor(src).astype(np.int64)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, (src - lo).astype(np.float32)

    y0, y1, fy = axis(th, h)
    x0, x1, fx = axis(tw, w)
    img = image.astype(np.float32, copy=False)
    shape = (-1, 1) + (1,) * (img.ndim - 2)
    rows = img[y0] * (1 - fy).reshape(shape) + img[y1] * fy.reshape(shape)
    cshape = (1, -1) + (1,) * (img.ndim - 2)
    out = rows[:, x0] * (1 - fx).reshape(cshape) + rows[:, x1] * fx.reshape(cshape)
    if image.dtype.kind in "iu":
        info = np.iinfo(image.dtype)
        return np.clip(np.rint(out), info.min, info.max).astype(image.dtype)
    return out.astype(image.dtype, copy=False)


def _interpolation(owner: str, interpolation: Any) -> Union[int, str]:
    if interpolation not in _INTERPOLATIONS:
        raise ArgumentError(f"{owner}: interpolation must be INTER_LINEAR or INTER_NEAREST "
                            f"('linear' or 'nearest'), got {interpolation!r}")
    return interpolation


def _range(owner: str, name: str, value: Any, low_open: bool = False) -> Tuple[float, float]:
    """A ``(min, max)`` pair with ``0 <= min <= max`` (``0 < min`` where ``low_open``)."""
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        lo = hi = float("nan")
    if not (0 <= lo <= hi) or (low_open and lo == 0):
        raise ArgumentError(f"{owner}: {name} must be (min, max) with {'0 <' if low_open else '0 <='} "
                            f"min <= max, got {value!r}")
    return lo, hi


class _Resizing(VisionTransform):
    """The resizing transforms' shared part: ``_target(h, w)`` (drawing
    what is random) gives the output size; images are resized with
    ``interpolation``, masks nearest, coordinates scaled."""

    interpolation: Union[int, str] = INTER_LINEAR

    def _target(self, h: int, w: int) -> Tuple[int, int]:
        raise NotImplementedError

    def _prepare(self, input: Any) -> None:
        who = type(self).__name__
        h, w = _hw(self._get_image(input), who)
        th, tw = self._target(h, w)
        if th <= 0 or tw <= 0:
            raise ArgumentError(f"{who}: the {h}x{w} image would be resized to {th}x{tw}")
        self._shape = (h, w, th, tw)

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        h, w, th, tw = self._shape
        if (h, w) == (th, tw):
            return image
        return _resize(image, th, tw, _INTERPOLATIONS[self.interpolation])

    def _apply_mask(self, mask: np.ndarray) -> np.ndarray:
        h, w, th, tw = self._shape
        return mask if (h, w) == (th, tw) else _resize(mask, th, tw, "nearest")

    def _apply_coords(self, coords: np.ndarray) -> np.ndarray:
        h, w, th, tw = self._shape
        coords = np.array(coords, dtype=np.float64, copy=True)
        coords[:, 0] *= tw / w
        coords[:, 1] *= th / h
        return coords


class Resize(_Resizing):
    """Resize images to ``output_size`` (``(height, width)``; an int sets
    the shorter side, keeping the aspect ratio), bilinear
    (``INTER_LINEAR``, OpenCV's pixel geometry) or nearest
    (``INTER_NEAREST``); masks always nearest.

    Example::

        >>> from gradcore.data.transform import Resize
        >>> Resize((4, 4)).apply(np.ones((2, 2, 1), np.float32)).shape
        (4, 4, 1)
    """

    def __init__(self, output_size: Union[int, Tuple[int, int]], interpolation: Union[int, str] = INTER_LINEAR, *,
                 order: Optional[Sequence[str]] = None):
        super().__init__(order)
        if isinstance(output_size, numbers.Integral):
            if output_size <= 0:
                raise ArgumentError(f"Resize: output_size must be positive, got {output_size}")
            self.output_size = int(output_size)
        else:
            self.output_size = _size2("Resize", output_size)
        self.interpolation = _interpolation("Resize", interpolation)

    def _target(self, h: int, w: int) -> Tuple[int, int]:
        if isinstance(self.output_size, int):
            s = self.output_size
            return (s, int(s * w / h)) if h < w else (int(s * h / w), s)
        return self.output_size


class ShortestEdgeResize(_Resizing):
    """Resize so that the shorter side is a size drawn per sample from
    ``min_size`` (``sample_style="range"``: an int in ``[min_size[0],
    min_size[1]]``; ``"choice"``: one of ``min_size``; an int: that size),
    keeping the aspect ratio, then shrink so that the longer side is at
    most ``max_size``. Sides are rounded to the nearest int.

    Example::

        >>> import gradcore.data.transform as T
        >>> T.seed(0)
        >>> T.ShortestEdgeResize(4, max_size=6).apply(np.zeros((2, 4, 3), np.uint8)).shape
        (3, 6, 3)
    """

    def __init__(self, min_size: Union[int, Sequence[int]], max_size: int, sample_style: str = "range",
                 interpolation: Union[int, str] = INTER_LINEAR, *, order: Optional[Sequence[str]] = None):
        super().__init__(order)
        if sample_style not in ("range", "choice"):
            raise ArgumentError(f"ShortestEdgeResize: sample_style must be 'range' or 'choice', got {sample_style!r}")
        sizes = (min_size, min_size) if isinstance(min_size, numbers.Integral) else tuple(
            min_size if isinstance(min_size, collections.abc.Sequence) else ())
        if not sizes or any(not isinstance(m, numbers.Integral) or m <= 0 for m in sizes) or \
                sample_style == "range" and (len(sizes) != 2 or sizes[0] > sizes[1]):
            want = "(min, max) with 0 < min <= max" if sample_style == "range" else "positive ints to choose from"
            raise ArgumentError(f"ShortestEdgeResize: min_size must be a positive int or {want}, got {min_size!r}")
        if not isinstance(max_size, numbers.Real) or max_size <= 0:
            raise ArgumentError(f"ShortestEdgeResize: max_size must be a positive number, got {max_size!r}")
        self.min_size = tuple(int(m) for m in sizes)
        self.max_size = max_size
        self.sample_style = sample_style
        self.interpolation = _interpolation("ShortestEdgeResize", interpolation)

    def _target(self, h: int, w: int) -> Tuple[int, int]:
        if self.sample_style == "range":
            size = int(rng().integers(self.min_size[0], self.min_size[1] + 1))
        else:
            size = int(rng().choice(self.min_size))
        scale = size / min(h, w)
        th, tw = (size, scale * w) if h < w else (scale * h, size)
        if max(th, tw) > self.max_size:
            shrink = self.max_size / max(th, tw)
            th, tw = th * shrink, tw * shrink
        return int(round(th)), int(round(tw))


class RandomResize(_Resizing):
    """Resize both sides by one factor drawn per sample, uniformly from
    ``scale_range`` (``(min, max)``); sides are rounded to the nearest int.

    Example::

        >>> import gradcore.data.transform as T
        >>> T.seed(0)
        >>> T.RandomResize((2.0, 2.0)).apply(np.zeros((3, 5, 1), np.float32)).shape
        (6, 10, 1)
    """

    def __init__(self, scale_range: Tuple[float, float], interpolation: Union[int, str] = INTER_LINEAR, *,
                 order: Optional[Sequence[str]] = None):
        super().__init__(order)
        self.scale_range = _range("RandomResize", "scale_range", scale_range, low_open=True)
        self.interpolation = _interpolation("RandomResize", interpolation)

    def _target(self, h: int, w: int) -> Tuple[int, int]:
        scale = rng().uniform(*self.scale_range)
        return int(round(h * scale)), int(round(w * scale))


class RandomResizedCrop(VisionTransform):
    """Crop a random window, then resize it to ``output_size`` (the
    Inception crop): the window covers a fraction of the image's area drawn
    from ``scale_range`` and has an aspect ratio (width / height) drawn
    log-uniformly from ``ratio_range``; after 10 draws that do not fit, the
    centred window of the whole image, clamped to ``ratio_range``.

    Example::

        >>> import gradcore.data.transform as T
        >>> T.seed(0)
        >>> T.RandomResizedCrop(4).apply(np.zeros((10, 8, 3), np.uint8)).shape
        (4, 4, 3)
    """

    def __init__(self, output_size: Union[int, Tuple[int, int]], scale_range: Tuple[float, float] = (0.08, 1.0),
                 ratio_range: Tuple[float, float] = (3.0 / 4, 4.0 / 3), interpolation: Union[int, str] = INTER_LINEAR,
                 *, order: Optional[Sequence[str]] = None):
        super().__init__(order)
        self.output_size = _size2("RandomResizedCrop", output_size)
        self.scale_range = _range("RandomResizedCrop", "scale_range", scale_range)
        self.ratio_range = _range("RandomResizedCrop", "ratio_range", ratio_range, low_open=True)
        self.interpolation = _interpolation("RandomResizedCrop", interpolation)

    def _prepare(self, input: Any) -> None:
        self._box = self._window(*_hw(self._get_image(input), "RandomResizedCrop"))

    def _window(self, height: int, width: int, attempts: int = 10) -> Tuple[int, int, int, int]:
        area = height * width
        log_ratio = (math.log(self.ratio_range[0]), math.log(self.ratio_range[1]))
        for _ in range(attempts):
            target = rng().uniform(*self.scale_range) * area
            ratio = math.exp(rng().uniform(*log_ratio))
            w, h = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
            if 0 < w <= width and 0 < h <= height:
                return int(rng().integers(0, width - w + 1)), int(rng().integers(0, height - h + 1)), w, h
        w, h = width, height
        if width / height < self.ratio_range[0]:
            h = int(round(width / self.ratio_range[0]))
        elif width / height > self.ratio_range[1]:
            w = int(round(height * self.ratio_range[1]))
        return (width - w) // 2, (height - h) // 2, w, h

    def _crop_resize(self, image: np.ndarray, mode: str) -> np.ndarray:
        x, y, w, h = self._box
        th, tw = self.output_size
        image = image[y:y + h, x:x + w]
        return image if (h, w) == (th, tw) else _resize(image, th, tw, mode)

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        return self._crop_resize(image, _INTERPOLATIONS[self.interpolation])

    def _apply_mask(self, mask: np.ndarray) -> np.ndarray:
        return self._crop_resize(mask, "nearest")

    def _apply_coords(self, coords: np.ndarray) -> np.ndarray:
        x, y, w, h = self._box
        coords = np.array(coords, dtype=np.float64, copy=True)
        coords[:, 0] = (coords[:, 0] - x) * (self.output_size[1] / w)
        coords[:, 1] = (coords[:, 1] - y) * (self.output_size[0] / h)
        return coords


class CenterCrop(VisionTransform):
    """Crop the centred ``output_size`` (``(height, width)`` or an int)
    window; the offsets are ``round((W - width) / 2)`` and ``round((H -
    height) / 2)`` with Python's rounding (halves to even), as MegEngine's.

    Example::

        >>> from gradcore.data.transform import CenterCrop
        >>> CenterCrop(2).apply(np.arange(16).reshape(4, 4, 1))[..., 0]
        array([[ 5,  6],
               [ 9, 10]])
    """

    def __init__(self, output_size: Union[int, Tuple[int, int]], *, order: Optional[Sequence[str]] = None):
        super().__init__(order)
        self.output_size = _size2("CenterCrop", output_size)

    def _prepare(self, input: Any) -> None:
        h, w = _hw(self._get_image(input), "CenterCrop")
        th, tw = self.output_size
        if th > h or tw > w:
            raise ArgumentError(f"CenterCrop: output_size {self.output_size} is larger than the {h}x{w} image")
        self._x, self._y = int(round((w - tw) / 2.0)), int(round((h - th) / 2.0))

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        th, tw = self.output_size
        return image[self._y:self._y + th, self._x:self._x + tw]

    _apply_mask = _apply_image

    def _apply_coords(self, coords: np.ndarray) -> np.ndarray:
        return _shifted(coords, -self._x, -self._y)


# ---------------------------------------------------------------- pixel values
# The colour transforms follow MegEngine's: images are BGR on the 0..255
# scale (uint8, or float holding such values); results are clipped to
# [0, 255] and cast back to the input's dtype (uint8: truncated).

def _channels(image: np.ndarray, who: str) -> int:
    _hw(image, who)
    return 1 if image.ndim == 2 else image.shape[2]


# cv2.cvtColor(COLOR_BGR2GRAY)'s float32 weights
_GRAY_B, _GRAY_G, _GRAY_R = (float(np.float32(c)) for c in (0.114, 0.587, 0.299))


def _gray(image: np.ndarray, who: str) -> np.ndarray:
    """The ``(H, W, 1)`` float32 luma of a BGR(A) float32 image (a
    one-channel image is its own), summed as OpenCV's vectorised x86 kernel
    does: ``G*g``, then fused multiply-adds of ``B*b`` and ``R*r`` (float64
    sums rounded to float32 stand in for the fused operations). OpenCV's
    scalar code for a row's last few pixels, and other CPUs, may differ in
    the last bit."""
    c = _channels(image, who)
    if c == 1:
        return image.reshape(image.shape[:2] + (1,))
    if c not in (3, 4):
        raise ArgumentError(f"{who}: an image must have 1, 3 (BGR) or 4 (BGRA) channels, got shape {image.shape}")
    b, g, r = (image[..., k].astype(np.float64) for k in range(3))
    y = (g * _GRAY_G).astype(np.float32)
    y = (b * _GRAY_B + y).astype(np.float32)
    return (r * _GRAY_R + y).astype(np.float32)[..., None]


# OpenCV's 8-bit BGR -> HSV (full hue range, 0..255) works in fixed point
# with these reciprocal tables (12 fractional bits)
_HSV_SHIFT = 12
_k = np.arange(1, 256, dtype=np.float64)
_SDIV = np.concatenate([[0], np.rint((255 << _HSV_SHIFT) / _k)]).astype(np.int64)
_HDIV = np.concatenate([[0], np.rint((256 << _HSV_SHIFT) / (6 * _k))]).astype(np.int64)
del _k


def _bgr_to_hsv(image: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """cv2.cvtColor(image, COLOR_BGR2HSV_FULL) for uint8 (H, W, 3), bit for bit: int64 h, s, v."""
    b, g, r = (image[..., k].astype(np.int64) for k in range(3))
    v = np.maximum(np.maximum(b, g), r)
    diff = v - np.minimum(np.minimum(b, g), r)
    half = 1 << (_HSV_SHIFT - 1)
    s = (diff * _SDIV[v] + half) >> _HSV_SHIFT
    h = np.where(v == r, g - b, np.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    h = (h * _HDIV[diff] + half) >> _HSV_SHIFT
    return np.where(h < 0, h + 256, h), s, v


# which of (v, p, q, t) is (b, g, r) in each sixth of the hue circle
_SECTORS = np.array([[1, 3, 0], [1, 0, 2], [3, 0, 1], [0, 2, 1], [0, 1, 3], [2, 1, 0]])


def _hsv_to_bgr(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """cv2.cvtColor(COLOR_HSV2BGR_FULL) for 8-bit h, s, v: uint8 (H, W, 3).
    Like OpenCV, the hue is decoded as ``h * 6 / 255`` (its encoder uses
    256: a round trip moves hues slightly), in float32, rounded to nearest."""
    f32 = np.float32
    hue = np.fmod(h.astype(f32) * (f32(6) / f32(255)), f32(6))
    s = s.astype(f32) * (f32(1) / f32(255))
    v = v.astype(f32) * (f32(1) / f32(255))
    sector = np.floor(hue)
    frac = hue - sector
    one = f32(1)
    table = np.stack([v, v * (one - s), v * (one - s * frac), v * (one - s * (one - frac))], axis=-1)
    bgr = np.take_along_axis(table, _SECTORS[sector.astype(np.int64)], axis=-1)
    return np.clip(np.rint(bgr * f32(255)), 0, 255).astype(np.uint8)


class _PixelTransform(VisionTransform):
    """A transform of pixel values only: masks, coordinates and boxes pass through."""

    _apply_coords = _apply_mask = _apply_boxes = _unchanged


class GaussianNoise(_PixelTransform):
    """Add Gaussian noise of ``mean`` and ``std`` (numbers or per channel,
    in units of the full 0..255 range: ``std=0.02`` is about 5 levels),
    clip to [0, 255] and cast back to the image's dtype.

    Example::

        >>> import gradcore.data.transform as T
        >>> T.seed(0)
        >>> out = T.GaussianNoise(std=0.02).apply(np.full((8, 8, 3), 128, np.uint8))
        >>> out.dtype, bool(100 < out.min() <= out.max() < 156)
        (dtype('uint8'), True)
    """

    def __init__(self, mean: Union[float, Sequence[float]] = 0.0, std: Union[float, Sequence[float]] = 1.0, *,
                 order: Optional[Sequence[str]] = None):
        super().__init__(order)
        self.mean = np.array(mean, dtype=np.float32)
        self.std = np.array(std, dtype=np.float32)
        if not (self.std >= 0).all():
            raise ArgumentError(f"GaussianNoise: std must not be negative, got {std!r}")

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        _hw(image, "GaussianNoise")
        try:
            fits = np.broadcast_shapes(self.mean.shape, self.std.shape, image.shape) == image.shape
        except ValueError:
            fits = False
        if not fits:
            raise ArgumentError(f"GaussianNoise: mean {self.mean.shape} and std {self.std.shape} do not match "
                                f"the image's shape {image.shape}")
        noise = rng().normal(self.mean, self.std, image.shape) * 255
        return np.clip(image + noise.astype(np.float32), 0, 255).astype(image.dtype, copy=False)


class _Jitter(_PixelTransform):
    """Brightness, contrast and saturation: blend the float32 image with
    ``_other`` by a factor drawn from ``[max(0, 1 - value), 1 + value]``."""

    def __init__(self, value: float, *, order: Optional[Sequence[str]] = None):
        super().__init__(order)
        if not isinstance(value, numbers.Real) or not value >= 0:
            raise ArgumentError(f"{type(self).__name__}: value must be a non-negative number, got {value!r}")
        self.value = value

    def _other(self, image: np.ndarray) -> Any:
        raise NotImplementedError

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        _hw(image, type(self).__name__)
        if self.value == 0:
            return image
        alpha = rng().uniform(max(0.0, 1 - self.value), 1 + self.value)
        image32 = image.astype(np.float32)
        other = self._other(image32)
        out = image32 * alpha if other is None else image32 * alpha + other * (1 - alpha)
        return out.clip(0, 255).astype(image.dtype, copy=False)


class BrightnessTransform(_Jitter):
    """Scale the pixel values by a factor drawn from ``[max(0, 1 - value),
    1 + value]`` (``value=0``: the image unchanged).

    Example::

        >>> import gradcore.data.transform as T
        >>> T.seed(0)
        >>> out = T.BrightnessTransform(0.5).apply(np.full((2, 2, 3), 100, np.uint8))
        >>> 50 <= int(out[0, 0, 0]) <= 150 and len(np.unique(out)) == 1
        True
    """

    def _other(self, image: np.ndarray) -> None:
        return None


class ContrastTransform(_Jitter):
    """Blend the image with its mean gray level (BGR luma, as OpenCV's
    ``COLOR_BGR2GRAY``): ``image * a + mean_gray * (1 - a)``, ``a`` drawn
    from ``[max(0, 1 - value), 1 + value]``.

    Example::

        >>> import gradcore.data.transform as T
        >>> T.seed(0)
        >>> img = np.array([[[50, 50, 50], [150, 150, 150]]], np.float32)   # gray levels 50 and 150
        >>> out = T.ContrastTransform(0.5).apply(img)
        >>> bool(abs(out.mean() - 100) < 1e-4)                                # the mean stays
        True
    """

    def _other(self, image: np.ndarray) -> np.ndarray:
        return _gray(image, "ContrastTransform").mean()


class SaturationTransform(_Jitter):
    """Blend the image with its gray version (BGR luma, as OpenCV's
    ``COLOR_BGR2GRAY``): ``image * a + gray * (1 - a)``, ``a`` drawn from
    ``[max(0, 1 - value), 1 + value]``. A one-channel image is unchanged.

    Example::

        >>> import gradcore.data.transform as T
        >>> T.seed(0)
        >>> T.SaturationTransform(0.5).apply(np.full((2, 2, 3), 77.0, np.float32))[0, 0]   # gray stays gray
        array([77., 77., 77.], dtype=float32)
    """

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        return image if _channels(image, "SaturationTransform") == 1 else super()._apply_image(image)

    def _other(self, image: np.ndarray) -> np.ndarray:
        return _gray(image, "SaturationTransform")


class HueTransform(_PixelTransform):
    """Rotate the hue by a fraction of the circle drawn from ``[-value,
    value]`` (``0 <= value <= 0.5``), through OpenCV's 8-bit full-range HSV
    as MegEngine does (``cv2.cvtColor`` with ``COLOR_BGR2HSV_FULL`` and
    back, reimplemented in NumPy): the image is taken as uint8 (float
    images: clipped to [0, 255] and truncated), the hue (0..255) moves by
    ``int(a * 255)`` steps modulo 256, and the result is cast back to the
    input's dtype. An 8-bit hue is coarse, and OpenCV's decoder reads it on
    a 255 scale although its encoder writes it on 256, so even a zero shift
    changes saturated colours slightly (by up to 9 levels), as in
    MegEngine. A one-channel image is unchanged.

    Example::

        >>> import gradcore.data.transform as T
        >>> T.seed(0)
        >>> out = T.HueTransform(0.5).apply(np.array([[[0, 0, 255]]], np.uint8))   # pure red
        >>> out.shape, int(out.max())                                               # another pure hue
        ((1, 1, 3), 255)
    """

    def __init__(self, value: float, *, order: Optional[Sequence[str]] = None):
        super().__init__(order)
        if not isinstance(value, numbers.Real) or not 0 <= value <= 0.5:
            raise ArgumentError(f"HueTransform: value must be in [0, 0.5], got {value!r}")
        self.value = value

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        c = _channels(image, "HueTransform")
        if self.value == 0 or c == 1:
            return image
        if c != 3:
            raise ArgumentError(f"HueTransform: an image must have 3 (BGR) channels, got shape {image.shape}")
        alpha = rng().uniform(-self.value, self.value)
        image8 = image if image.dtype == np.uint8 else np.clip(image, 0, 255).astype(np.uint8)
        h, s, v = _bgr_to_hsv(image8)
        h = (h + int(alpha * 255)) % 256           # the hue circle wraps at 256 steps
        return _hsv_to_bgr(h, s, v).astype(image.dtype, copy=False)


class ColorJitter(VisionTransform):
    """``BrightnessTransform(brightness)``, ``ContrastTransform(contrast)``,
    ``SaturationTransform(saturation)`` and ``HueTransform(hue)`` (those
    not 0) in a random order per sample.

    Example::

        >>> import gradcore.data.transform as T
        >>> T.seed(0)
        >>> t = T.ColorJitter(brightness=0.2, contrast=0.2, saturation=0.2, hue=0.1)
        >>> out = t.apply(np.random.default_rng(0).integers(0, 256, (4, 4, 3), dtype=np.uint8))
        >>> out.shape, out.dtype
        ((4, 4, 3), dtype('uint8'))
    """

    def __init__(self, brightness: float = 0, contrast: float = 0, saturation: float = 0, hue: float = 0, *,
                 order: Optional[Sequence[str]] = None):
        super().__init__(order)
        parts = []
        jitters = (("brightness", BrightnessTransform, brightness), ("contrast", ContrastTransform, contrast),
                   ("saturation", SaturationTransform, saturation), ("hue", HueTransform, hue))
        for name, cls, value in jitters:
            try:
                if value != 0:
                    parts.append(cls(value))
            except ArgumentError as e:
                raise ArgumentError(f"ColorJitter: {name}={value!r}: {e}") from None
        self.brightness, self.contrast, self.saturation, self.hue = brightness, contrast, saturation, hue
        self.transforms = Compose(parts, shuffle_indices=[tuple(range(1, len(parts) + 1))] if parts else None,
                                  order=self.order)

    def apply(self, input: Any) -> Any:
        # an enclosing Compose sets this transform's order: hand it down
        self.transforms.order = self.order
        self.transforms._set_order()
        return self.transforms.apply(input)


class Lighting(_PixelTransform):
    """AlexNet's PCA lighting noise: add ``eigvec @ (a * eigval)`` to each
    pixel, ``a`` three normal draws of standard deviation ``scale * 255``
    (ImageNet's eigenvectors with the rows in B, G, R order, as MegEngine's);
    clip to [0, 255] and cast back. The image must have 3 channels.

    Example::

        >>> import gradcore.data.transform as T
        >>> T.seed(0)
        >>> out = T.Lighting(0.1).apply(np.full((2, 2, 3), 128, np.uint8))
        >>> out.shape, bool((out == out[0, 0]).all())          # one shift for every pixel
        ((2, 2, 3), True)
    """

    def __init__(self, scale: float, *, order: Optional[Sequence[str]] = None):
        super().__init__(order)
        if not isinstance(scale, numbers.Real) or not scale >= 0:
            raise ArgumentError(f"Lighting: scale must be a non-negative number, got {scale!r}")
        self.scale = scale
        self.eigvec = np.array([[-0.5836, -0.6948, 0.4203],
                                [-0.5808, -0.0045, -0.8140],
                                [-0.5675, 0.7192, 0.4009]])
        self.eigval = np.array([0.2175, 0.0188, 0.0045])

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        c = _channels(image, "Lighting")
        if self.scale == 0:
            return image
        if c != 3:
            raise ArgumentError(f"Lighting: an image must have 3 (BGR) channels, got shape {image.shape}")
        alpha = rng().normal(0.0, self.scale * 255, 3)
        out = image.astype(np.float32) + self.eigvec @ (alpha * self.eigval)
        return out.clip(0, 255).astype(image.dtype, copy=False)
