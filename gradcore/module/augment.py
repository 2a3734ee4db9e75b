"""MegEngine's image augmentation layers (``megengine.module.vision``) over
NCHW tensors, NHWC for the flips and turns as ``F.vision.flip``/``rot90``:
Flip, RandomHorizontalFlip, RandomVerticalFlip, Rot90, Rotate, Mixup,
LinearContrast, the additive noises (Gaussian, Laplace, Poisson) and the
3x3 blends Emboss and Sharpen. Random parameters come from a
``gradcore.random.RNG`` of the layer's ``seed``, or from the global
generator (``gc.random.seed``) without one."""
from __future__ import annotations

import numbers
from typing import Optional, Sequence, Tuple, Union

import numpy as np

from .. import functional as F
from .. import random as _random
from .._core import Tensor
from ..op import ArgumentError
from .module import Module

Range = Union[float, Tuple[float, float]]


def _images(name: str, inp) -> Tensor:
    if not isinstance(inp, Tensor) or inp.ndim != 4:
        raise ArgumentError(f"{name}: expected a 4-d image Tensor, got "
                            f"{tuple(inp.shape) if isinstance(inp, Tensor) else type(inp).__name__}")
    return inp


class Flip(Module):
    """Images (N, H, W, C) reversed top to bottom (``vertical``) and/or left
    to right (``horizontal``), MegEngine's ``M.Flip`` (``F.vision.flip``).

    Example::

        >>> x = gc.tensor(np.arange(4, dtype="float32").reshape(1, 2, 2, 1))
        >>> M.Flip()(x).numpy().reshape(-1).tolist()
        [3.0, 2.0, 1.0, 0.0]
    """

    def __init__(self, vertical: bool = True, horizontal: bool = True):
        super().__init__()
        self.vertical, self.horizontal = vertical, horizontal

    def forward(self, inp: Tensor) -> Tensor:
        return F.vision.flip(_images("Flip", inp), self.vertical, self.horizontal)


class _RandomFlip(Module):
    _vertical = _horizontal = False

    def __init__(self, prob: float = 0.5):
        super().__init__()
        self.prob = prob

    def forward(self, inp: Tensor) -> Tensor:
        # one draw for the whole batch, from the global generator (gc.random.seed)
        if _random.uniform(size=(1,)).item() < self.prob:
            return F.vision.flip(_images(type(self).__name__, inp), self._vertical, self._horizontal)
        return inp


class RandomHorizontalFlip(_RandomFlip):
    """Images (N, H, W, C) flipped left to right with probability ``prob``
    (one draw per call), MegEngine's ``M.RandomHorizontalFlip``. (MegEngine's
    own passes ``horizontal=True`` to ``flip`` and so also flips top to
    bottom; this one flips as its documentation says.)

    Example::

        >>> x = gc.tensor(np.arange(4, dtype="float32").reshape(1, 2, 2, 1))
        >>> M.RandomHorizontalFlip(prob=1.0)(x).numpy().reshape(-1).tolist()
        [1.0, 0.0, 3.0, 2.0]
    """
    _horizontal = True


class RandomVerticalFlip(_RandomFlip):
    """Images (N, H, W, C) flipped top to bottom with probability ``prob``
    (one draw per call), MegEngine's ``M.RandomVerticalFlip``.

    Example::

        >>> x = gc.tensor(np.arange(4, dtype="float32").reshape(1, 2, 2, 1))
        >>> M.RandomVerticalFlip(prob=1.0)(x).numpy().reshape(-1).tolist()
        [2.0, 3.0, 0.0, 1.0]
    """
    _vertical = True


class Rot90(Module):
    """Images (N, H, W, C) turned by 90 degrees, clockwise or not, into
    (N, W, H, C), MegEngine's ``M.Rot90`` (``F.vision.rot90``).

    Example::

        >>> x = gc.tensor(np.arange(4, dtype="float32").reshape(1, 2, 2, 1))
        >>> M.Rot90()(x).numpy().reshape(-1).tolist()
        [2.0, 0.0, 3.0, 1.0]
    """

    def __init__(self, clockwise: bool = True):
        super().__init__()
        self.clockwise = clockwise

    def forward(self, inp: Tensor) -> Tensor:
        return F.vision.rot90(_images("Rot90", inp), self.clockwise)


class Rotate(Module):
    """Images turned by ``angle`` degrees about their centre, MegEngine's
    ``M.Rotate`` (``F.vision.rotate``).

    Example::

        >>> x = gc.tensor(np.arange(9, dtype="float32").reshape(1, 1, 3, 3))
        >>> M.Rotate(180.0)(x).numpy().round(4).reshape(-1).tolist()
        [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    """

    def __init__(self, angle: float = 0.0, format: str = "NCHW", interp_mode: str = "bilinear"):
        super().__init__()
        self.angle, self.format, self.interp_mode = angle, format, interp_mode

    def forward(self, inp: Tensor) -> Tensor:
        return F.vision.rotate(_images("Rotate", inp), self.angle, self.format, self.interp_mode)


def _rng(seed: Optional[int]) -> _random.RNG:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise ArgumentError(f"seed must be an int or None, got {seed!r}")
    return _random.RNG(seed)


def _check_range(name: str, what: str, param) -> None:
    """A number, or a pair (a, b) to draw from uniformly on [a, b)."""
    if isinstance(param, bool) or not (isinstance(param, numbers.Real) or
                                       (isinstance(param, tuple) and len(param) == 2)):
        raise ArgumentError(f"{name}: {what} must be a number or a pair (low, high), got {param!r}")


class _MixBatches(Module):
    """Mixup's and Cutmix's draws: ``lamb`` per sample from Beta(beta, beta)
    and the labels mixed by it."""

    def __init__(self, beta: float, seed: Optional[int] = None):
        super().__init__()
        self.beta = beta
        self._rng = _rng(seed)
        self.lamb: Optional[Tensor] = None

    def sample(self, batch: int) -> Tensor:
        """``batch`` draws of Beta(beta, beta)."""
        return self._rng.beta(self.beta, self.beta, size=(batch,))

    def _draw(self, data1: Tensor, label1: Tensor, data2: Tensor, label2: Tensor):
        name = type(self).__name__
        data1, data2 = _images(name, data1), _images(name, data2)
        if tuple(data1.shape) != tuple(data2.shape):
            raise ArgumentError(f"{name}: data1 and data2 must have one shape, got {tuple(data1.shape)} "
                                f"and {tuple(data2.shape)}")
        self.lamb = lamb = self.sample(data1.shape[0])
        return data1, data2, lamb, lamb * label1 + (1.0 - lamb) * label2


class Mixup(_MixBatches):
    """Mixup of two batches: with ``lamb`` drawn per sample from
    Beta(``beta``, ``beta``), data ``lamb * data1 + (1 - lamb) * data2`` and
    labels mixed alike, MegEngine's ``M.Mixup`` (NCHW data, (N,) labels).
    The draw of the last call is kept in ``self.lamb``.

    Example::

        >>> m = M.Mixup(3, seed=0)
        >>> d1, d2 = gc.tensor(np.ones((2, 3, 4, 4), "float32")), gc.tensor(np.zeros((2, 3, 4, 4), "float32"))
        >>> data, label = m(d1, gc.tensor([1.0, 1.0]), d2, gc.tensor([0.0, 0.0]))
        >>> lamb = m.lamb.numpy()
        >>> data.shape, np.allclose(data.numpy(), lamb.reshape(2, 1, 1, 1)), np.allclose(label.numpy(), lamb)
        ((2, 3, 4, 4), True, True)
    """

    def forward(self, data1: Tensor, label1: Tensor, data2: Tensor, label2: Tensor) -> Tuple[Tensor, Tensor]:
        data1, data2, lamb, label = self._draw(data1, label1, data2, label2)
        w = lamb.reshape(-1, 1, 1, 1)
        return w * data1 + (1.0 - w) * data2, label


def _center(dtype: np.dtype) -> float:
    """The value contrast scales about, MegEngine's: 0 for floats and signed
    integers, the middle of the range for unsigned ones."""
    if dtype.kind == "u":
        return int(np.iinfo(dtype).min + 0.5 * np.iinfo(dtype).max)
    return 0


class LinearContrast(Module):
    """Contrast: each pixel ``v`` to ``center + alpha * (v - center)``,
    MegEngine's ``M.LinearContrast`` on NCHW images. ``alpha`` is a number,
    or a pair (a, b) drawn from uniformly on [a, b) per image (per image and
    channel with ``per_channel``). ``center`` is 127 for uint8 images (the
    result clipped to [0, 255]), the middle of the range for other unsigned
    dtypes and 0 for floats and signed integers, as MegEngine's; the dtype is
    kept.

    Example::

        >>> x = gc.tensor(np.array([0, 100, 127, 200, 255], "uint8").reshape(1, 1, 1, 5))
        >>> M.LinearContrast(alpha=2.0)(x).numpy().reshape(-1).tolist()
        [0, 73, 127, 255, 255]
    """

    def __init__(self, alpha: Range, per_channel: bool = False, seed: Optional[int] = None):
        super().__init__()
        _check_range("LinearContrast", "alpha", alpha)
        self.alpha, self.per_channel = alpha, per_channel
        self._rng = _rng(seed)

    def _alpha(self, size: Sequence[int]) -> Tensor:
        if isinstance(self.alpha, tuple):
            return self._rng.uniform(self.alpha[0], self.alpha[1], size)
        return F.full(tuple(size), float(self.alpha), dtype="float32")

    def forward(self, inp: Tensor) -> Tensor:
        x = _images("LinearContrast", inp)
        n, c = x.shape[0], x.shape[1]
        alpha = self._alpha((n, c if self.per_channel else 1, 1, 1))
        dtype = np.dtype(x.dtype)
        if dtype == np.uint8:
            out = F.clip(127 + (x.astype("float32") - 127) * alpha, 0, 255)
            return out.astype("uint8")
        center = _center(dtype)
        return (center + (x.astype("float32") - center) * alpha).astype(dtype)


class AdditiveElemwise(Module):
    """Base of the additive noises: ``inp + noise``, the noise drawn by
    ``sample(shape)`` per pixel of each image, one draw shared by the
    channels of a pixel unless ``per_channel`` (NCHW images).

    Example::

        >>> class Ones(M.AdditiveElemwise):
        ...     def sample(self, size):
        ...         return F.ones(size)
        >>> Ones()(gc.tensor(np.zeros((1, 2, 1, 1), "float32"))).numpy().reshape(-1).tolist()
        [1.0, 1.0]
    """

    def __init__(self, per_channel: bool = False):
        super().__init__()
        self.per_channel = per_channel

    def sample(self, size: Sequence[int]) -> Tensor:
        """Noise of shape ``size`` (float32)."""
        raise NotImplementedError(f"{type(self).__name__}: an AdditiveElemwise defines sample(size)")

    def forward(self, inp: Tensor) -> Tensor:
        x = _images(type(self).__name__, inp)
        n, c, h, w = x.shape
        if self.per_channel:
            noise = self.sample((n, c, h, w))
        else:
            noise = F.broadcast_to(self.sample((n, 1, h, w)), (n, c, h, w))
        return x + noise.to(x.device)


class AdditiveGaussianNoise(AdditiveElemwise):
    """Adds normal noise N(``mean``, ``std``²), MegEngine's
    ``M.AdditiveGaussianNoise`` (see ``AdditiveElemwise`` for
    ``per_channel``).

    Example::

        >>> out = M.AdditiveGaussianNoise(std=0.1, seed=0)(gc.tensor(np.zeros((2, 3, 8, 8), "float32")))
        >>> out.shape, bool((out.numpy()[:, 0] == out.numpy()[:, 2]).all())  # one draw for the channels
        ((2, 3, 8, 8), True)
    """

    def __init__(self, mean: float = 0.0, std: float = 1.0, per_channel: bool = False,
                 seed: Optional[int] = None):
        super().__init__(per_channel)
        self.mean, self.std = mean, std
        self._rng = _rng(seed)

    def sample(self, size: Sequence[int]) -> Tensor:
        return self._rng.normal(self.mean, self.std, size)


class AdditiveLaplaceNoise(AdditiveElemwise):
    """Adds Laplace noise of location ``mean`` and scale ``std``
    (``mean - std * sign(u) * log(1 - |u|)`` for ``u`` uniform on (-1, 1)),
    MegEngine's ``M.AdditiveLaplaceNoise`` (see ``AdditiveElemwise``).

    Example::

        >>> out = M.AdditiveLaplaceNoise(std=0.1, per_channel=True, seed=0)(
        ...     gc.tensor(np.zeros((2, 3, 8, 8), "float32")))
        >>> out.shape, bool((out.numpy()[:, 0] == out.numpy()[:, 2]).all())
        ((2, 3, 8, 8), False)
    """

    def __init__(self, mean: float = 0.0, std: float = 1.0, per_channel: bool = False,
                 seed: Optional[int] = None):
        super().__init__(per_channel)
        self.mean, self.std = mean, std
        self._rng = _rng(seed)

    def sample(self, size: Sequence[int]) -> Tensor:
        # from just above -1: log(1 - |u|) stays finite
        u = self._rng.uniform(float(np.finfo(np.float32).eps) - 1.0, 1.0, size)
        return self.mean - self.std * F.sign(u) * F.log(1 - F.abs(u))


class AdditivePoissonNoise(AdditiveElemwise):
    """Adds Poisson noise of rate ``lam`` (non-negative whole numbers),
    MegEngine's ``M.AdditivePoissonNoise`` (see ``AdditiveElemwise``).

    Example::

        >>> out = M.AdditivePoissonNoise(lam=2.0, seed=0)(gc.tensor(np.zeros((1, 1, 4, 4), "float32")))
        >>> o = out.numpy()
        >>> bool((o >= 0).all()), bool((o == np.round(o)).all())
        (True, True)
    """

    def __init__(self, lam: float = 1.0, per_channel: bool = False, seed: Optional[int] = None):
        super().__init__(per_channel)
        self.lam = lam
        self._rng = _rng(seed)

    def sample(self, size: Sequence[int]) -> Tensor:
        return self._rng.poisson(F.full((), float(self.lam), dtype="float32"), size)


def _cast_back(x: Tensor, dtype: np.dtype) -> Tensor:
    """A float result to the input's dtype, MegEngine's: bool by > 0.5;
    integers and float16 clipped to their range first."""
    if dtype == np.bool_:
        return x > 0.5
    if dtype.kind in "ui" or dtype == np.float16:
        info = np.iinfo(dtype) if dtype.kind in "ui" else np.finfo(dtype)
        return F.clip(x, float(info.min), float(info.max)).astype(dtype)
    return x


class ActiveBlur(Module):
    """Base of the 3x3 blends: ``get_kernel(inp, C)`` gives a (C, 1, 1, 3, 3)
    kernel applied to each channel of NCHW images, reflect-padded by one so
    that the size is kept (MegEngine's ``M.ActiveBlur``). Numbers or pairs
    (a, b), drawn uniformly on [a, b) once per call, set its parameters.

    Example::

        >>> class Same(M.ActiveBlur):
        ...     def get_kernel(self, inp, c):
        ...         return F.broadcast_to(gc.tensor([[0., 0, 0], [0, 1, 0], [0, 0, 0]]), (c, 1, 1, 3, 3))
        >>> x = gc.tensor(np.arange(8, dtype="float32").reshape(1, 2, 2, 2))
        >>> bool((Same()(x).numpy() == x.numpy()).all())
        True
    """

    _rng: Optional[_random.RNG] = None

    def _set_parameters(self, seed: Optional[int], **params: Range) -> None:
        for what, value in params.items():
            _check_range(type(self).__name__, what, value)
            setattr(self, what, value)
        self._rng = _rng(seed)

    def _get_parameter(self, param: Range) -> float:
        if isinstance(param, tuple):
            return float(self._rng.uniform(param[0], param[1]).item())
        return float(param)

    def get_kernel(self, inp: Tensor, c: int) -> Tensor:
        """The (c, 1, 1, 3, 3) kernel for this call."""
        raise NotImplementedError(f"{type(self).__name__}: an ActiveBlur defines get_kernel(inp, c)")

    def forward(self, inp: Tensor) -> Tensor:
        x = _images(type(self).__name__, inp)
        c = x.shape[1]
        padded = F.pad(x.astype("float32") if x.dtype.kind != "f" else x,
                       pad_width=((0, 0), (0, 0), (1, 1), (1, 1)), mode="reflect")
        # MegEngine's grouped (C, 1, 1, 3, 3) as the plain depthwise (C, 1, 3, 3)
        kernel = self.get_kernel(x, c).astype(padded.dtype).reshape(c, 1, 3, 3)
        return _cast_back(F.conv2d(padded, kernel, groups=c), np.dtype(x.dtype))

    def _blend(self, effect: np.ndarray, alpha: float, c: int) -> Tensor:
        # alpha * effect + (1 - alpha) * identity, one copy per channel
        ident = np.zeros((3, 3), np.float32)
        ident[1, 1] = 1
        k = (alpha * effect + (1 - alpha) * ident).astype(np.float32)
        return Tensor(np.broadcast_to(k, (c, 1, 1, 3, 3)).copy())


class Emboss(ActiveBlur):
    """Emboss blended with the image: the kernel ``alpha * E + (1 - alpha) *
    I`` with ``E = [[-1-s, -s, 0], [-s, 1, s], [0, s, 1+s]]`` for strength
    ``s``, MegEngine's (and imgaug's) ``Emboss`` (see ``ActiveBlur``).

    Example::

        >>> x = gc.tensor(np.arange(9, dtype="float32").reshape(1, 1, 3, 3))
        >>> M.Emboss(alpha=1.0, strength=0.0)(x).numpy().reshape(-1).tolist()
        [0.0, 3.0, 2.0, 9.0, 12.0, 11.0, 6.0, 9.0, 8.0]
    """

    def __init__(self, alpha: Range, strength: Range, seed: Optional[int] = None):
        super().__init__()
        self._set_parameters(seed, alpha=alpha, strength=strength)

    def get_kernel(self, inp: Tensor, c: int) -> Tensor:
        alpha, s = self._get_parameter(self.alpha), self._get_parameter(self.strength)
        effect = np.array([[-1 - s, -s, 0], [-s, 1, s], [0, s, 1 + s]], np.float64)
        return self._blend(effect, alpha, c)


class Sharpen(ActiveBlur):
    """Sharpening blended with the image: the kernel ``alpha * S + (1 -
    alpha) * I`` with ``S`` -1 around and ``8 + lightness`` at the centre,
    MegEngine's (and imgaug's) ``Sharpen`` (see ``ActiveBlur``).

    Example::

        >>> x = gc.tensor(np.full((1, 1, 3, 3), 2.0, "float32"))
        >>> M.Sharpen(alpha=1.0, lightness=1.5)(x).numpy().reshape(-1).tolist()  # flat: times lightness
        [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    """

    def __init__(self, alpha: Range, lightness: Range, seed: Optional[int] = None):
        super().__init__()
        self._set_parameters(seed, alpha=alpha, lightness=lightness)

    def get_kernel(self, inp: Tensor, c: int) -> Tensor:
        alpha, lightness = self._get_parameter(self.alpha), self._get_parameter(self.lightness)
        effect = np.full((3, 3), -1.0)
        effect[1, 1] = 8 + lightness
        return self._blend(effect, alpha, c)


class Cutmix(_MixBatches):
    """Cutmix of two batches (NCHW data, (N,) labels), MegEngine's
    ``M.Cutmix``: per sample, ``lamb`` from Beta(``beta``, ``beta``), a box
    of ``floor(H * sqrt(1 - lamb))`` by ``floor(W * sqrt(1 - lamb))`` (its
    halves truncated) centred at a uniformly drawn pixel and clipped to the
    image takes its pixels from ``data2``; labels are mixed as
    ``lamb * label1 + (1 - lamb) * label2``, as MegEngine's (not by the
    clipped box's area). The last call's draws are kept in ``self.lamb`` and
    the box in ``self.box`` ((N, 4): row start, row end, column start,
    column end).

    Example::

        >>> m = M.Cutmix(1.0, seed=0)
        >>> d1, d2 = gc.tensor(np.zeros((2, 1, 8, 8), "float32")), gc.tensor(np.ones((2, 1, 8, 8), "float32"))
        >>> data, label = m(d1, gc.tensor([1.0, 1.0]), d2, gc.tensor([0.0, 0.0]))
        >>> r0, r1, c0, c1 = m.box[0]
        >>> bool(data.numpy()[0].sum() == (r1 - r0) * (c1 - c0)), data.shape, label.shape
        (True, (2, 1, 8, 8), (2,))
    """

    def __init__(self, beta: float, seed: Optional[int] = None):
        super().__init__(beta, seed)
        # a second generator of the same seed for the centres, as MegEngine's
        self._uniform_rng = _rng(seed)
        self.box: Optional[np.ndarray] = None

    def forward(self, data1: Tensor, label1: Tensor, data2: Tensor, label2: Tensor) -> Tuple[Tensor, Tensor]:
        data1, data2, lamb, label = self._draw(data1, label1, data2, label2)
        n, _, h, w = data1.shape
        rat = np.sqrt(1.0 - lamb.numpy().astype(np.float64))
        half_h, half_w = np.floor(h * rat) // 2, np.floor(w * rat) // 2
        cy = np.floor(self._uniform_rng.uniform(0, h, (n,)).numpy())
        cx = np.floor(self._uniform_rng.uniform(0, w, (n,)).numpy())
        box = np.stack([np.clip(cy - half_h, 0, h), np.clip(cy + half_h, 0, h),
                        np.clip(cx - half_w, 0, w), np.clip(cx + half_w, 0, w)], 1).astype(np.int64)
        self.box = box
        rows, cols = np.arange(h), np.arange(w)
        inside = (((rows[None, :, None] >= box[:, 0, None, None]) & (rows[None, :, None] < box[:, 1, None, None]))
                  & ((cols[None, None, :] >= box[:, 2, None, None]) & (cols[None, None, :] < box[:, 3, None, None])))
        mask = Tensor(inside[:, None])
        return F.where(mask, data2, data1), label


_BORDERS = ("REPLICATE", "REFLECT", "REFLECT_101", "WRAP", "CONSTANT")


def _border_index(name: str, length: int, before: int, after: int, mode: str) -> np.ndarray:
    """Source index of each position of an axis extended by ``before`` and
    ``after`` under OpenCV's (and MegEngine's) border ``mode``; -1 for
    CONSTANT's outside positions."""
    if mode not in _BORDERS:
        raise ArgumentError(f"{name}: border mode must be one of {', '.join(_BORDERS)}, got {mode!r}")
    p = np.arange(-before, length + after)
    out = p.copy()
    outside = (p < 0) | (p >= length)
    if mode == "REPLICATE":
        out = np.clip(p, 0, length - 1)
    elif mode == "CONSTANT":
        out[outside] = -1
    elif mode == "WRAP":
        out = np.mod(p, length)
    elif length == 1:
        out[:] = 0
    else:
        # REFLECT repeats the edge pixel (cba|abc), REFLECT_101 does not (cb|abc): periodic
        delta = 1 if mode == "REFLECT_101" else 0
        period = 2 * length - 2 * delta
        q = np.mod(p, period)
        out = np.where(q < length, q, period - 1 + delta - q)
    return out


def _extend(name: str, x: Tensor, kh: int, kw: int, mode: str, value: float) -> Tensor:
    """NCHW ``x`` extended by ``kh // 2`` rows and ``kw // 2`` columns
    before, the rest of the kernel after, filled by the border ``mode``."""
    h, w = x.shape[2], x.shape[3]
    (t, b), (l, r) = (kh // 2, kh - 1 - kh // 2), (kw // 2, kw - 1 - kw // 2)
    if mode == "CONSTANT":
        _border_index(name, h, t, b, mode)   # (checks the mode)
        return F.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), mode="constant", constant_value=value)
    rows, cols = _border_index(name, h, t, b, mode), _border_index(name, w, l, r, mode)
    return x[:, :, rows][:, :, :, cols]


class Dilation(Module):
    """Morphological dilation of NCHW images, MegEngine's ``M.Dilation``:
    each pixel becomes the largest one under the non-zero entries of a 2-d
    ``kernel`` anchored at its centre, ``iterations`` times; outside the
    image, ``border_type`` (OpenCV's "BORDER_CONSTANT" with
    ``border_value``, "BORDER_REPLICATE", "BORDER_REFLECT",
    "BORDER_REFLECT_101", "BORDER_WRAP").

    Example::

        >>> img = gc.tensor(np.arange(9, dtype="float32").reshape(1, 1, 3, 3))
        >>> M.Dilation()(img, gc.tensor(np.ones((3, 3), "float32"))).numpy().reshape(3, 3)
        array([[4., 5., 5.],
               [7., 8., 8.],
               [7., 8., 8.]], dtype=float32)
    """

    def __init__(self, iterations: int = 1, border_type: str = "BORDER_CONSTANT", border_value: float = 0.0):
        super().__init__()
        if isinstance(iterations, bool) or not isinstance(iterations, numbers.Integral) or iterations < 1:
            raise ArgumentError(f"Dilation: iterations must be an int >= 1, got {iterations!r}")
        mode = border_type[len("BORDER_"):] if border_type.startswith("BORDER_") else border_type
        _border_index("Dilation", 1, 0, 0, mode)
        self.iterations, self.border_type, self.border_value = int(iterations), border_type, border_value
        self._mode = mode

    def forward(self, inp: Tensor, kernel: Tensor) -> Tensor:
        x = _images("Dilation", inp)
        k = np.asarray(kernel.numpy() if isinstance(kernel, Tensor) else kernel)
        if k.ndim != 2 or not k.any():
            raise ArgumentError(f"Dilation: kernel must be 2-d with a non-zero entry, got shape {k.shape}")
        h, w = x.shape[2], x.shape[3]
        taps = list(zip(*np.nonzero(k)))
        for _ in range(self.iterations):
            ext = _extend("Dilation", x, k.shape[0], k.shape[1], self._mode, self.border_value)
            out = None
            for i, j in taps:
                win = ext[:, :, i:i + h, j:j + w]
                out = win if out is None else F.maximum(out, win)
            x = out
        return x


def _gaussian_taps(n: int, sigma: float) -> np.ndarray:
    """OpenCV's getGaussianKernel: for sigma <= 0 and odd n <= 7 its fixed
    table, else exp(-x^2 / (2 sigma^2)) normalised, sigma <= 0 meaning
    0.3 * ((n - 1) / 2 - 1) + 0.8."""
    table = {1: [1.0], 3: [0.25, 0.5, 0.25], 5: [0.0625, 0.25, 0.375, 0.25, 0.0625],
             7: [0.03125, 0.109375, 0.21875, 0.28125, 0.21875, 0.109375, 0.03125]}
    if sigma <= 0 and n in table:
        t = np.array(table[n], np.float32)
    else:
        s = sigma if sigma > 0 else ((n - 1) * 0.5 - 1) * 0.3 + 0.8
        x = np.arange(n) - (n - 1) * 0.5
        t = np.exp(-0.5 / (s * s) * x * x).astype(np.float32)
    # float32 taps summed and scaled in double, as MegEngine's
    return (t * (1.0 / float(t.astype(np.float64).sum()))).astype(np.float32)


class GaussianBlur(Module):
    """Gaussian blur of NHWC images (floating point or uint8), MegEngine's
    ``M.GaussianBlur`` (OpenCV's ``GaussianBlur``): a ``kernel_size``
    (height, width; odd, or 0 to derive it from sigma) separable kernel of
    standard deviations ``sigma_x`` (along the width) and ``sigma_y`` (0:
    ``sigma_x``; both 0: from the size); outside the image ``border_mode``
    ("REPLICATE", "REFLECT", "REFLECT_101", "WRAP", "CONSTANT" (zeros)).
    uint8 images are blurred in MegEngine's 8-bit fixed point.

    Example::

        >>> x = gc.tensor(np.arange(25, dtype="float32").reshape(1, 5, 5, 1))
        >>> M.GaussianBlur(3)(x).numpy()[0, :, :, 0]
        array([[ 1.5 ,  2.25,  3.25,  4.25,  5.  ],
               [ 5.25,  6.  ,  7.  ,  8.  ,  8.75],
               [10.25, 11.  , 12.  , 13.  , 13.75],
               [15.25, 16.  , 17.  , 18.  , 18.75],
               [19.  , 19.75, 20.75, 21.75, 22.5 ]], dtype=float32)
    """

    def __init__(self, kernel_size: Union[int, Tuple[int, int]], sigma_x: float = 0, sigma_y: float = 0,
                 border_mode: str = "REPLICATE"):
        super().__init__()
        ks = (kernel_size, kernel_size) if isinstance(kernel_size, numbers.Integral) else tuple(kernel_size)
        if len(ks) != 2:
            raise ArgumentError(f"GaussianBlur: kernel_size must be an int or (height, width), got {kernel_size!r}")
        _border_index("GaussianBlur", 1, 0, 0, border_mode)
        kh, kw = (int(v) for v in ks)
        sx = max(float(sigma_x), 0.0)
        sy = max(float(sigma_y), 0.0) if sigma_y > 0 else sx
        # a size of 0 from its sigma, as OpenCV's (4 sigma each side for floats)
        if kw <= 0 and sx > 0:
            kw = int(sx * 8 + 1 + 0.5) | 1
        if kh <= 0 and sy > 0:
            kh = int(sy * 8 + 1 + 0.5) | 1
        if kh <= 0 or kw <= 0 or kh % 2 == 0 or kw % 2 == 0:
            raise ArgumentError(f"GaussianBlur: kernel sizes must be odd and positive (or 0 with a sigma), "
                                f"got {kernel_size!r} with sigmas {sigma_x}, {sigma_y}")
        self.kernel_size, self.sigma_x, self.sigma_y, self.border_mode = (kh, kw), sigma_x, sigma_y, border_mode
        self._ky, self._kx = _gaussian_taps(kh, sy), _gaussian_taps(kw, sx)

    def forward(self, inp: Tensor) -> Tensor:
        x = _images("GaussianBlur", inp)
        dtype = np.dtype(x.dtype)
        if dtype.kind != "f" and dtype != np.uint8:
            raise ArgumentError(f"GaussianBlur: images must be floating point or uint8, got {dtype}")
        kh, kw = self.kernel_size
        if dtype == np.uint8:
            # MegEngine's fixed point: taps scaled by 2^8 and truncated, the sum rounded by 2^16
            ky = (self._ky * 256).astype(np.int64)
            kx = (self._kx * 256).astype(np.int64)
            taps = Tensor(np.outer(ky, kx).astype(np.float64))
            xf = x.astype("float64")
        else:
            taps = Tensor(np.outer(self._ky.astype(np.float64), self._kx.astype(np.float64)).astype(dtype))
            xf = x
        nchw = xf.transpose(0, 3, 1, 2)
        c = nchw.shape[1]
        ext = _extend("GaussianBlur", nchw, kh, kw, self.border_mode, 0.0)
        weight = F.broadcast_to(taps.reshape(1, 1, kh, kw), (c, 1, kh, kw))
        out = F.conv2d(ext, weight, groups=c).transpose(0, 2, 3, 1)
        if dtype == np.uint8:
            return F.clip(F.floor((out + 32768) / 65536), 0, 255).astype("uint8")
        return out


def _round_half_away(v: float) -> int:
    return int(v + 0.5) if v > 0 else int(v - 0.5)


class CropAndPad(Module):
    """Crop or pad each NCHW image and resize it back to (H, W), MegEngine's
    ``M.CropAndPad``: for sample ``n``, ``percent[n] > 0`` pads
    ``round(H * p)`` rows and ``round(W * p)`` columns on each side with
    ``pad_val[n]`` (zeros when None), ``percent[n] <= 0`` crops as many;
    the result is resized to (H, W) by ``mode`` ("bilinear" or "nearest",
    ``F.vision.interpolate``'s, with ``align_corners``).

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> M.CropAndPad(mode="nearest")(x, gc.tensor([-0.25])).numpy()[0, 0]
        array([[ 5.,  5.,  6.,  6.],
               [ 5.,  5.,  6.,  6.],
               [ 9.,  9., 10., 10.],
               [ 9.,  9., 10., 10.]], dtype=float32)
    """

    def __init__(self, mode: str = "bilinear", align_corners: bool = False):
        super().__init__()
        if mode not in ("bilinear", "nearest"):
            raise ArgumentError(f"CropAndPad: mode must be 'bilinear' or 'nearest', got {mode!r}")
        self.mode, self.align_corners = mode, align_corners

    def forward(self, inp: Tensor, percent: Tensor, pad_val: Optional[Tensor] = None) -> Tensor:
        x = _images("CropAndPad", inp)
        n, c, h, w = x.shape
        per = np.asarray(percent.numpy() if isinstance(percent, Tensor) else percent, np.float64).reshape(-1)
        if per.size < n:
            raise ArgumentError(f"CropAndPad: percent needs one value per image, got {per.size} for {n} images")
        pads = None
        if pad_val is not None and (not isinstance(pad_val, Tensor) or pad_val.size):
            pads = pad_val if isinstance(pad_val, Tensor) else Tensor(np.asarray(pad_val, np.float32))
            pads = pads.reshape(-1).astype(x.dtype)
        outs = []
        for i in range(n):
            img = x[i:i + 1]
            rh, rw = _round_half_away(h * abs(per[i])), _round_half_away(w * abs(per[i]))
            if per[i] > 0:
                # pad with this image's value: a constant pad of 0, then the border set to it
                inner = F.pad(img, ((0, 0), (0, 0), (rh, rh), (rw, rw)))
                if pads is not None:
                    border = np.ones((1, 1, h + 2 * rh, w + 2 * rw), bool)
                    border[:, :, rh:rh + h, rw:rw + w] = False
                    inner = F.where(Tensor(border), F.broadcast_to(pads[i], inner.shape), inner)
                img = inner
            elif rh or rw:
                if 2 * rh >= h or 2 * rw >= w:
                    raise ArgumentError(f"CropAndPad: cropping {per[i]} of a {h}x{w} image leaves nothing")
                img = img[:, :, rh:h - rh, rw:w - rw]
            if tuple(img.shape[2:]) != (h, w):
                img = F.vision.interpolate(img, size=(h, w), mode=self.mode,
                                           align_corners=self.align_corners if self.mode == "bilinear" else None)
            outs.append(img)
        return F.concat(outs, axis=0) if n > 1 else outs[0]


def _poly_mask(pts: np.ndarray, h: int, w: int) -> np.ndarray:
    """The pixels of a polygon as MegEngine's (OpenCV-derived) fill draws
    them: the outline by a DDA walk from each vertex to the next (the end
    excluded: it starts the next edge), the inside by the crossings of the
    non-horizontal edges with the row, each truncated to an integer, a
    pixel being inside when it lies right of an odd number of them. An edge
    counts on rows y0 <= y < y1 (MegEngine's kernel counts only y0 < y < y1,
    which leaves an unfilled row through every vertex where the outline
    goes on down, as at (9, 13) of a concave polygon; gradcore fills it)."""
    mask = np.zeros((h, w), bool)
    inside = np.zeros((h, w), bool)
    rows, cols = np.arange(h), np.arange(w)
    for i in range(len(pts)):
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        length = max(abs(x1 - x0), abs(y1 - y0))
        if length:
            steps = np.arange(length)
            px = np.floor(x0 + 0.5 + steps * (x1 - x0) / length).astype(np.int64)
            py = np.floor(y0 + 0.5 + steps * (y1 - y0) / length).astype(np.int64)
            ok = (px >= 0) & (px < w) & (py >= 0) & (py < h)
            mask[py[ok], px[ok]] = True
        if y0 == y1:
            continue
        (ey0, ex), ey1 = ((y0, x0), y1) if y0 < y1 else ((y1, x1), y0)
        live = (rows >= ey0) & (rows < ey1)
        cross = np.trunc(ex + (rows - ey0) * ((x1 - x0) / (y1 - y0))).astype(np.int64)
        inside ^= live[:, None] & (cols[None, :] > cross[:, None])
    return mask | inside


class FillPoly(Module):
    """Fill polygons in NCHW images, MegEngine's ``M.FillPoly``: ``pts`` is
    a list of (K, 2) integer (x, y) vertex tensors; every image of the
    batch gets each polygon (its outline and its inside) in ``color`` (one
    value per channel), drawn as MegEngine's kernel draws but for its rows
    through vertices (see ``_poly_mask``); the rest is ``img``.

    Example::

        >>> img = gc.tensor(np.zeros((1, 1, 4, 4), "int32"))
        >>> M.FillPoly()(img, [gc.tensor([[0, 0], [3, 0], [3, 3]])], gc.tensor([1])).numpy()[0, 0]
        array([[1, 1, 1, 1],
               [0, 1, 1, 1],
               [0, 0, 1, 1],
               [0, 0, 0, 1]], dtype=int32)
    """

    def forward(self, img: Tensor, pts: Sequence[Tensor], color: Tensor) -> Tensor:
        x = _images("FillPoly", img)
        n, c, h, w = x.shape
        col = color if isinstance(color, Tensor) else Tensor(np.asarray(color))
        if col.ndim != 1 or col.shape[0] != c:
            raise ArgumentError(f"FillPoly: color needs one value per channel ({c}), got shape {tuple(col.shape)}")
        mask = np.zeros((h, w), bool)
        for p in pts:
            a = np.asarray(p.numpy() if isinstance(p, Tensor) else p)
            if a.ndim != 2 or a.shape[1] != 2 or a.shape[0] < 1:
                raise ArgumentError(f"FillPoly: each polygon must be (K, 2) points (x, y), got shape {a.shape}")
            mask |= _poly_mask(a.astype(np.int64), h, w)
        return F.where(Tensor(mask[None, None]), col.astype(x.dtype).reshape(1, c, 1, 1), x)
