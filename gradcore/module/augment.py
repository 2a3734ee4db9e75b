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


class Mixup(Module):
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

    def __init__(self, beta: float, seed: Optional[int] = None):
        super().__init__()
        self.beta = beta
        self._rng = _rng(seed)
        self.lamb: Optional[Tensor] = None

    def sample(self, batch: int) -> Tensor:
        """``batch`` draws of Beta(beta, beta)."""
        return self._rng.beta(self.beta, self.beta, size=(batch,))

    def forward(self, data1: Tensor, label1: Tensor, data2: Tensor, label2: Tensor) -> Tuple[Tensor, Tensor]:
        data1, data2 = _images("Mixup", data1), _images("Mixup", data2)
        if tuple(data1.shape) != tuple(data2.shape):
            raise ArgumentError(f"Mixup: data1 and data2 must have one shape, got {tuple(data1.shape)} "
                                f"and {tuple(data2.shape)}")
        batch = data1.shape[0]
        self.lamb = lamb = self.sample(batch)
        label = lamb * label1 + (1.0 - lamb) * label2
        w = lamb.reshape(batch, 1, 1, 1)
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
        _check_range("Emboss", "alpha", alpha)
        _check_range("Emboss", "strength", strength)
        self.alpha, self.strength = alpha, strength
        self._rng = _rng(seed)

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
        _check_range("Sharpen", "alpha", alpha)
        _check_range("Sharpen", "lightness", lightness)
        self.alpha, self.lightness = alpha, lightness
        self._rng = _rng(seed)

    def get_kernel(self, inp: Tensor, c: int) -> Tensor:
        alpha, lightness = self._get_parameter(self.alpha), self._get_parameter(self.lightness)
        effect = np.full((3, 3), -1.0)
        effect[1, 1] = 8 + lightness
        return self._blend(effect, alpha, c)
