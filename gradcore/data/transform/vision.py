"""Image transforms on NumPy arrays, after
``megengine.data.transform.vision``: images are ``(H, W, C)`` (or
``(H, W)``) arrays; ``ToMode("CHW")`` turns them into the ``(C, H, W)``
that convolutions take. A sample is a tuple whose fields are named by
``order`` (default ``("image",)``; e.g. ``("image", "image_category")``):
fields named ``image``, ``mask`` and ``coords``/``boxes`` are
transformed, ``*category`` and ``*info`` pass through.

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
import numbers
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import numpy as np

from .base import Transform, rng

__all__ = ["VisionTransform", "Compose", "ToMode", "Normalize", "Pad", "RandomCrop",
           "RandomHorizontalFlip", "Resize", "INTER_NEAREST", "INTER_LINEAR"]

# OpenCV's numbers for the interpolation modes, which MegEngine's Resize takes
INTER_NEAREST = 0
INTER_LINEAR = 1
_INTERPOLATIONS = {INTER_NEAREST: "nearest", INTER_LINEAR: "linear", "nearest": "nearest", "linear": "linear"}


def _hw(image: np.ndarray, who: str) -> Tuple[int, int]:
    if not isinstance(image, np.ndarray) or image.ndim not in (2, 3):
        got = f"{type(image).__name__} of shape {getattr(image, 'shape', '?')}"
        raise ValueError(f"{who}: an image must be an (H, W, C) or (H, W) NumPy array, got {got}")
    return image.shape[0], image.shape[1]


class VisionTransform(Transform):
    """The base of the image transforms: ``apply`` sends each field of the
    sample to ``_apply_<kind>`` by the kind ``order`` gives it. Subclasses
    define ``_apply_image`` (and ``_apply_mask``, ``_apply_coords`` where
    they mean something).

    Example::

        >>> class Invert(VisionTransform):
        ...     def _apply_image(self, image): return 1 - image
        >>> Invert().apply(np.zeros((2, 2, 1)))[0, 0, 0]
        1.0
    """

    def __init__(self, order: Optional[Sequence[str]] = None):
        if order is None:
            order = ("image",)
        elif isinstance(order, str) or not isinstance(order, collections.abc.Sequence):
            raise ValueError(f"{type(self).__name__}: order must be a sequence of names, got {order!r}")
        for kind in order:
            if kind == "batch":
                raise ValueError(f"{type(self).__name__}: 'batch' is not a field kind")
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
            raise ValueError(f"{type(self).__name__}: order {self.order} has no 'image' field")
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
            raise ValueError("Compose: shuffle_indices cannot be used with batch_compose")
        self.batch_compose = batch_compose
        if shuffle_indices is not None:
            shuffle_indices = [tuple(i - 1 for i in group) for group in shuffle_indices]
            for group in shuffle_indices:
                if any(not 0 <= i < len(self.transforms) for i in group):
                    raise ValueError(f"Compose: shuffle_indices are 1-based positions in transforms "
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

        >>> ToMode("CHW").apply(np.zeros((8, 8, 3))).shape
        (3, 8, 8)
    """

    def __init__(self, mode: str = "CHW", *, order: Optional[Sequence[str]] = None):
        super().__init__(order)
        if mode != "CHW":
            raise ValueError(f"ToMode: unsupported mode {mode!r} (only 'CHW')")
        self.mode = mode

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        _hw(image, "ToMode")
        if image.ndim == 2:
            return np.ascontiguousarray(image[None])
        return np.ascontiguousarray(np.moveaxis(image, 2, 0))

    _apply_mask = _apply_image

    def _apply_coords(self, coords: np.ndarray) -> np.ndarray:
        return coords


class Normalize(VisionTransform):
    """``(image - mean) / std`` per channel (the last axis), in float32.

    Example::

        >>> Normalize(mean=[1, 2], std=[2, 4]).apply(np.full((1, 1, 2), 3.0))[0, 0]
        array([1.  , 0.25], dtype=float32)
    """

    def __init__(self, mean: Union[float, Sequence[float]] = 0.0, std: Union[float, Sequence[float]] = 1.0, *,
                 order: Optional[Sequence[str]] = None):
        super().__init__(order)
        self.mean = np.array(mean, dtype=np.float32)
        self.std = np.array(std, dtype=np.float32)
        if (self.std == 0).any():
            raise ValueError(f"Normalize: std must not be 0, got {std!r}")

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        _hw(image, "Normalize")
        return ((image - self.mean) / self.std).astype(np.float32, copy=False)

    def _apply_coords(self, coords: np.ndarray) -> np.ndarray:
        return coords

    def _apply_mask(self, mask: np.ndarray) -> np.ndarray:
        return mask


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
            raise ValueError(f"Pad: size must be an int or 2 or 4 ints (top, bottom, left, right), got {size!r}")
        if any(int(s) < 0 for s in size):
            raise ValueError(f"Pad: sizes must not be negative, got {tuple(size)}")
        self.size = tuple(int(s) for s in size)
        self.value = value
        self.mask_value = mask_value

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        _hw(image, "Pad")
        return _pad(image, *self.size, self.value)

    def _apply_mask(self, mask: np.ndarray) -> np.ndarray:
        return _pad(mask, *self.size, self.mask_value)

    def _apply_coords(self, coords: np.ndarray) -> np.ndarray:
        coords = np.array(coords, copy=True)
        coords[:, 0] += self.size[2]
        coords[:, 1] += self.size[0]
        return coords


def _size2(owner: str, size) -> Tuple[int, int]:
    if isinstance(size, numbers.Integral):
        size = (size, size)
    if not (isinstance(size, collections.abc.Sequence) and len(size) == 2) or any(int(s) <= 0 for s in size):
        raise ValueError(f"{owner}: output_size must be a positive int or (height, width), got {size!r}")
    return int(size[0]), int(size[1])


class RandomCrop(VisionTransform):
    """Pad (``padding_size``, as ``Pad``), then crop an ``output_size``
    window at a random place; an image smaller than the window is padded
    at the top and left up to it.

    Example::

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
        coords = np.array(coords, copy=True)
        coords[:, 0] -= self._x
        coords[:, 1] -= self._y
        return coords


class RandomHorizontalFlip(VisionTransform):
    """Mirror left-right with probability ``prob``.

    Example::

        >>> RandomHorizontalFlip(1.0).apply(np.arange(3.0).reshape(1, 3, 1))[0, :, 0]
        array([2., 1., 0.])
    """

    def __init__(self, prob: float = 0.5, *, order: Optional[Sequence[str]] = None):
        super().__init__(order)
        if not 0 <= prob <= 1:
            raise ValueError(f"RandomHorizontalFlip: prob must be in [0, 1], got {prob!r}")
        self.prob = prob

    def _prepare(self, input: Any) -> None:
        self._flipped = bool(rng().random() < self.prob)
        self._w = _hw(self._get_image(input), "RandomHorizontalFlip")[1]

    def _apply_image(self, image: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(image[:, ::-1]) if self._flipped else image

    _apply_mask = _apply_image

    def _apply_coords(self, coords: np.ndarray) -> np.ndarray:
        if not self._flipped:
            return coords
        coords = np.array(coords, copy=True)
        coords[:, 0] = self._w - coords[:, 0]
        return coords


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


class Resize(VisionTransform):
    """Resize images to ``output_size`` (``(height, width)``; an int sets
    the shorter side, keeping the aspect ratio), bilinear
    (``INTER_LINEAR``, OpenCV's pixel geometry) or nearest
    (``INTER_NEAREST``); masks always nearest.

    Example::

        >>> Resize((4, 4)).apply(np.ones((2, 2, 1), np.float32)).shape
        (4, 4, 1)
    """

    def __init__(self, output_size: Union[int, Tuple[int, int]], interpolation: Union[int, str] = INTER_LINEAR, *,
                 order: Optional[Sequence[str]] = None):
        super().__init__(order)
        if isinstance(output_size, numbers.Integral):
            if output_size <= 0:
                raise ValueError(f"Resize: output_size must be positive, got {output_size}")
            self.output_size = int(output_size)
        else:
            self.output_size = _size2("Resize", output_size)
        if interpolation not in _INTERPOLATIONS:
            raise ValueError(f"Resize: interpolation must be INTER_LINEAR or INTER_NEAREST "
                             f"('linear' or 'nearest'), got {interpolation!r}")
        self.interpolation = interpolation

    def _prepare(self, input: Any) -> None:
        h, w = _hw(self._get_image(input), "Resize")
        if isinstance(self.output_size, int):
            s = self.output_size
            th, tw = (s, int(s * w / h)) if h < w else (int(s * h / w), s)
        else:
            th, tw = self.output_size
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
