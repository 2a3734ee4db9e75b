"""``F.vision``: MegEngine's ``functional.vision``: resizing images
(interpolate, resize), sampling them at given points (remap, and the
warps and rotate built on it), regions of interest (roi_align,
roi_pooling), flips, nms, colour conversions (cvt_color), FlowNet's
correlation. Everything but interpolate is composed of ops
that have both kernels, so it differentiates to any order on every device.

Example::

    >>> F.vision.interpolate(x, scale_factor=2, mode="nearest")
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from .._core import Tensor, apply as _apply
from ..ops.vision import Interpolate
from ._args import _int_arg, _int_tuple, _t
from .elemwise import where
from .elemwise_table import floor, logical_and, maximum, minimum, mod, round
from .indexing import gather
from .conv import avg_pool2d
from .creation import zeros
from .reduce import mean
from .shape import (astype, broadcast_to, concat, expand_dims, reshape, squeeze, stack, stop_gradient,
                    transpose)
from ..op import ArgumentError

_Interpolate = Interpolate


def _resize_sizes(x: Tensor, size, scale_factor, n: int) -> tuple:
    """The output's ``n`` trailing sizes for ``interpolate``: ``size`` as
    given, or floor(input size * scale factor)."""
    if (size is None) == (scale_factor is None):
        raise ArgumentError("interpolate: give exactly one of size and scale_factor, "
                         f"got size={size!r}, scale_factor={scale_factor!r}")
    if size is not None:
        out = _int_tuple("interpolate", "size", size)
        out = out * n if len(out) == 1 else out
        if len(out) != n:
            raise ArgumentError(f"interpolate: size must have {n} element(s) for a {x.ndim}-D input, got {size!r}")
        return tuple(_int_arg("interpolate", "size", s, 1) for s in out)
    factors = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * n
    if len(factors) != n or not all(isinstance(f, (int, float, np.integer, np.floating)) and not isinstance(f, bool)
                                    and f > 0 for f in factors):
        raise ArgumentError(f"interpolate: scale_factor must be a positive number or {n} of them, got {scale_factor!r}")
    out = tuple(int(np.floor(s * float(f))) for s, f in zip(x.shape[-n:], factors))
    if min(out) < 1:
        raise ArgumentError(f"interpolate: scale_factor {scale_factor!r} gives an empty output {out} "
                         f"for input shape {x.shape}")
    return out


def interpolate(inp: Tensor, size: Optional[Union[int, Sequence[int]]] = None,
                scale_factor: Optional[Union[float, Sequence[float]]] = None, mode: str = "bilinear",
                align_corners: Optional[bool] = None) -> Tensor:
    """Resize ``inp`` to ``size`` or by ``scale_factor`` (output size
    floor(input size * factor)), MegEngine's ``F.vision.interpolate``:
    ``mode`` "bilinear", "bicubic" or "nearest" for (N, C, H, W) input,
    "linear" for (N, C, W), "trilinear" for (N, C, D, H, W).
    ``align_corners`` (the linear modes only, as MegEngine; default False)
    maps the corner pixels' centres onto each other. Source positions follow
    the output/input size ratio (PyTorch's ``recompute_scale_factor=True``);
    "bicubic" is PyTorch's (a = -0.75, edges repeated).

    Example::

        >>> x = gc.tensor(np.array([[[[1.0, 2.0]]]], "float32"))
        >>> F.vision.interpolate(x, scale_factor=2, mode="nearest").numpy()
        array([[[[1., 1., 2., 2.],
                 [1., 1., 2., 2.]]]], dtype=float32)
    """
    x = _t(inp)
    if x.dtype.kind in "iu":
        # integer images (uint8 most often): resized in float32, rounded and saturated back
        return _to_integer(interpolate(astype(x, "float32"), size, scale_factor, mode, align_corners), x.dtype)
    mode = mode.lower() if isinstance(mode, str) else mode
    modes = ("nearest", "bilinear", "bicubic", "linear", "trilinear")
    if mode not in modes:
        raise ArgumentError(f"interpolate: mode must be one of {', '.join(map(repr, modes))}, got {mode!r}")
    if align_corners is not None and mode not in ("bilinear", "linear", "trilinear"):
        raise ArgumentError(f"interpolate: align_corners can only be set in the linear modes "
                            f"('bilinear', 'linear', 'trilinear'), not {mode!r}")
    corners = bool(align_corners)
    want = {"linear": 3, "trilinear": 5}.get(mode, 4)
    if x.ndim != want:
        layout = {3: "(N, C, W)", 4: "(N, C, H, W)", 5: "(N, C, D, H, W)"}[want]
        raise ArgumentError(f"interpolate: mode {mode!r} needs a {want}-D {layout} input, got shape {x.shape}")
    if mode == "linear":
        (ow,) = _resize_sizes(x, size, scale_factor, 1)
        op = _Interpolate((1, ow), "bilinear", corners)
        return squeeze(_apply(op, expand_dims(x, -2))[0], -2)
    if mode == "trilinear":
        # separable: (H, W) with the depth folded into the channels, then
        # the depth with (H, W) flattened into one axis that stays as it is
        od, oh, ow = _resize_sizes(x, size, scale_factor, 3)
        n, c, d, h, w = x.shape
        y = _apply(_Interpolate((oh, ow), "bilinear", corners), reshape(x, (n, c * d, h, w)))[0]
        y = _apply(_Interpolate((od, oh * ow), "bilinear", corners), reshape(y, (n, c, d, oh * ow)))[0]
        return reshape(y, (n, c, od, oh, ow))
    return _apply(_Interpolate(_resize_sizes(x, size, scale_factor, 2), mode, corners), x)[0]


def _to_integer(y: Tensor, dtype) -> Tensor:
    """A float result computed for an integer image, rounded (half to even)
    and saturated into ``dtype``, as MegEngine's rounding converter."""
    info = np.iinfo(dtype)
    return astype(minimum(maximum(round(y), float(info.min)), float(info.max)), dtype)


def _images(name: str, inp) -> Tensor:
    """``inp`` as a tensor of NHWC images, or an error naming ``name``."""
    x = _t(inp)
    if x.ndim != 4:
        raise ArgumentError(f"{name}: inp must be images (N, H, W, C), got shape {x.shape}")
    return x


def flip(inp: Tensor, vertical: bool = True, horizontal: bool = True) -> Tensor:
    """Images (N, H, W, C) reversed top to bottom (``vertical``) and/or left
    to right (``horizontal``), MegEngine's ``F.vision.flip`` (NHWC).

    Example::

        >>> x = gc.tensor(np.arange(4.0).reshape(1, 2, 2, 1))
        >>> F.vision.flip(x).numpy().reshape(-1).tolist()
        [3.0, 2.0, 1.0, 0.0]
    """
    x = _images("flip", inp)
    rows = slice(None, None, -1) if vertical else slice(None)
    cols = slice(None, None, -1) if horizontal else slice(None)
    return x[:, rows, cols]


def rot90(inp: Tensor, clockwise: bool = True) -> Tensor:
    """Images (N, H, W, C) turned by 90 degrees (clockwise, else
    counterclockwise) into (N, W, H, C), MegEngine's ``F.vision.rot90``.

    Example::

        >>> x = gc.tensor(np.arange(4.0).reshape(1, 2, 2, 1))
        >>> F.vision.rot90(x).numpy().reshape(-1).tolist()
        [2.0, 0.0, 3.0, 1.0]
    """
    x = _images("rot90", inp)
    t = transpose(x, (0, 2, 1, 3))
    return t[:, :, ::-1] if clockwise else t[:, ::-1]


# cvt_color's float modes, MegEngine's formulas per pixel (c: the input's
# channels, last axis)
def _rgb2yuv(c):
    # (MegEngine weighs channel 0 by 0.114 here, as in BGR2GRAY)
    y = c[0] * 0.114 + c[1] * 0.587 + c[2] * 0.299
    return [y, (c[0] - y) * 0.492 + 0.5, (c[2] - y) * 0.877 + 0.5]


def _yuv2rgb(c):
    cr, cb = c[1] - 0.5, c[2] - 0.5
    return [c[0] + cr * 2.032, c[0] + cb * -0.581 + cr * -0.395, c[0] + cb * 1.140]


_CVT_ARITHMETIC = {    # mode: (input channels, output channels from the input's)
    "RGB2GRAY": (3, lambda c: [c[0] * 0.299 + c[1] * 0.587 + c[2] * 0.114]),
    "BGR2GRAY": (3, lambda c: [c[2] * 0.299 + c[1] * 0.587 + c[0] * 0.114]),
    "RGB2YUV": (3, _rgb2yuv),
    "YUV2RGB": (3, _yuv2rgb),
}
# MegEngine's uint8 modes: 14-bit fixed point, each sum rounded by
# ``descale`` (add half, shift right: a floor), then saturated to 0..255
_SHIFT = 14


def _descale(v):
    return (v + (1 << (_SHIFT - 1))) // (1 << _SHIFT)


def _gray_u8(r, g, b):
    return [_descale(r * 4899 + g * 9617 + b * 1868)]


def _rgb2yuv_u8(c):
    y = _descale(c[0] * 1868 + c[1] * 9617 + c[2] * 4899)     # channel 0 weighed as blue, as in floats
    return [y, _descale((c[0] - y) * 8061 + (128 << _SHIFT)), _descale((c[2] - y) * 14369 + (128 << _SHIFT))]


def _yuv2rgb_u8(c):
    cr, cb = c[1] - 128, c[2] - 128
    return [c[0] + _descale(cr * 33292), c[0] + _descale(cb * -9519 + cr * -6472), c[0] + _descale(cb * 18678)]


_CVT_UINT8 = {         # mode: (input channels, int32 outputs from the int32 input channels)
    "RGB2GRAY": (3, lambda c: _gray_u8(c[0], c[1], c[2])),
    "BGR2GRAY": (3, lambda c: _gray_u8(c[2], c[1], c[0])),
    "RGBA2GRAY": (4, lambda c: _gray_u8(c[0], c[1], c[2])),
    "RGB2YUV": (3, _rgb2yuv_u8),
    "YUV2RGB": (3, _yuv2rgb_u8),
}
_CVT_SELECT = {        # mode: (input channels, the input channel of each output channel)
    "GRAY2RGB": (1, [0, 0, 0]), "RGB2BGR": (3, [2, 1, 0]), "BGR2RGB": (3, [2, 1, 0]),
    "RGBA2RGB": (4, [0, 1, 2]), "RGBA2BGR": (4, [2, 1, 0]),
}


# MegEngine's YUV 4:2:0 modes (uint8 only): an image (N, 3H/2, W, 1) holds the
# luma plane (H rows) then the chroma of each 2x2 block: interleaved pairs in
# H/2 rows (NV12 U,V; NV21 and YCrCb V,U) or two planes one after the other
# (YU12 U then V; YV12 V then U), each (H/2, W/2) in row-major order
_YUV420 = {}        # mode: (output, layout, BT.601 limited range)
for _fmt in ("NV12", "NV21", "YU12", "YV12"):
    for _out in ("GRAY", "RGB", "BGR"):
        _YUV420[f"YUV2{_out}_{_fmt}"] = (_out, _fmt, False)
        if _out != "GRAY":
            _YUV420[f"BT601_YUV2{_out}_{_fmt}"] = (_out, _fmt, True)
_YUV420.update({"YCRCB2RGB": ("RGB", "NV21", False), "YCRCB2BGR": ("BGR", "NV21", False)})


def _yuv420_to_color(x: Tensor, key: str) -> Tensor:
    """cvt_color's YUV 4:2:0 modes (``_YUV420``) on uint8 images."""
    out, fmt, bt601 = _YUV420[key]
    n, ih, w, c = x.shape
    planar = fmt in ("YU12", "YV12")
    if c != 1 or ih % (6 if planar else 3) or w % 2:
        raise ArgumentError(f"cvt_color: mode {key} takes images (N, 3H/2, W, 1) with W even and H a multiple of "
                            f"{4 if planar else 2}, got shape {x.shape}")
    if x.dtype != np.uint8:
        raise TypeError(f"cvt_color: mode {key} computes on uint8 images, got {x.dtype} (shape {x.shape})")
    h = ih // 3 * 2
    if out == "GRAY":
        return x[:, :h]
    luma = x[:, :h, :, 0].astype("int32")
    chroma = x[:, h:, :, 0].astype("int32")
    if planar:
        flat = reshape(chroma, (n, h * w // 2))
        first, second = (reshape(flat[:, k * (h * w // 4):(k + 1) * (h * w // 4)], (n, h // 2, w // 2))
                         for k in (0, 1))
    else:
        pairs = reshape(chroma, (n, h // 2, w // 2, 2))
        first, second = pairs[..., 0], pairs[..., 1]
    u, v = (first, second) if fmt in ("NV12", "YU12") else (second, first)
    # each chroma sample serves its 2x2 block of luma
    u, v = (reshape(broadcast_to(reshape(t, (n, h // 2, 1, w // 2, 1)), (n, h // 2, 2, w // 2, 2)), (n, h, w))
            for t in (u, v))
    if bt601:
        # BT.601 limited range in libyuv's 6-bit fixed point (MegEngine's constants);
        # ``// 64`` is the arithmetic shift right by 6
        y1 = (luma * (257 * 18997)) // 65536
        ygb = -1160
        r = (v * 102 + y1 + (-102 * 128 + ygb)) // 64
        g = (-(u * 25 + v * 52) + y1 + ((25 + 52) * 128 + ygb)) // 64
        b = (u * 128 + y1 + (-128 * 128 + ygb)) // 64
    else:
        # JPEG's full-range YCbCr, 8-bit fixed point; each term shifted (floored) on its own
        du, dv = u - 128, v - 128
        r = luma + (dv * 359) // 256
        g = luma - (du * 88 + dv * 183) // 256
        b = luma + (du * 454) // 256
    rgb = [minimum(maximum(t, 0), 255) for t in ((r, g, b) if out == "RGB" else (b, g, r))]
    return stack(rgb, axis=3).astype("uint8")


def cvt_color(inp: Tensor, mode: str = "") -> Tensor:
    """Images (N, H, W, C) converted between colour formats, MegEngine's
    ``F.vision.cvt_color``: "RGB2GRAY" and "BGR2GRAY" (0.299 R + 0.587 G +
    0.114 B), "RGB2YUV" and "YUV2RGB" (MegEngine's float formulas, offsets
    of 0.5) on floating images; the same and "RGBA2GRAY" on uint8 images
    in MegEngine's 14-bit fixed point (OpenCV's weights, rounded,
    saturated); "GRAY2RGB", "RGB2BGR", "BGR2RGB", "RGBA2RGB" and
    "RGBA2BGR" (channels copied) on any dtype; MegEngine's YUV 4:2:0 modes
    on uint8 images (N, 3H/2, W, 1) to (N, H, W, 1 or 3): "YUV2GRAY_<f>",
    "YUV2RGB_<f>", "YUV2BGR_<f>" (JPEG's full-range YCbCr), "BT601_YUV2RGB_<f>"
    and "BT601_YUV2BGR_<f>" (BT.601 limited range), with <f> one of NV12,
    NV21, YU12, YV12, and "YCrCb2RGB"/"YCrCb2BGR" (NV21), MegEngine's fixed
    point. The result has the input's dtype; the channel count is the
    mode's output's.

    Example::

        >>> x = gc.tensor(np.array([[[[1.0, 0.0, 0.0]]]], "float32"))    # one red pixel
        >>> F.vision.cvt_color(x, "RGB2GRAY").numpy().reshape(-1).tolist()
        [0.29899999499320984]
        >>> u8 = gc.tensor(np.array([[[[255, 0, 0], [10, 200, 30]]]], "uint8"))
        >>> F.vision.cvt_color(u8, "RGB2GRAY").numpy().reshape(-1).tolist()
        [76, 124]
        >>> nv12 = gc.tensor(np.array([100, 100, 100, 100, 128, 128], "uint8").reshape(1, 3, 2, 1))
        >>> F.vision.cvt_color(nv12, "YUV2RGB_NV12").numpy().reshape(-1).tolist()[:3]    # grey: no chroma
        [100, 100, 100]
    """
    x = _images("cvt_color", inp)
    key = mode.upper() if isinstance(mode, str) else mode
    if key in _YUV420:
        return _yuv420_to_color(x, key)
    modes = sorted(set(_CVT_ARITHMETIC) | set(_CVT_UINT8)) + sorted(_CVT_SELECT) + sorted(_YUV420)
    if key not in modes:
        raise ArgumentError(f"cvt_color: mode must be one of {modes}, got {mode!r}")
    uint8 = x.dtype == np.uint8 and key in _CVT_UINT8
    table = _CVT_UINT8 if uint8 or key not in _CVT_ARITHMETIC and key not in _CVT_SELECT else \
        _CVT_ARITHMETIC if key in _CVT_ARITHMETIC else _CVT_SELECT
    channels, how = table[key]
    if x.shape[3] != channels:
        raise ArgumentError(f"cvt_color: mode {key} takes images of {channels} channel(s), got shape {x.shape}")
    if key in _CVT_SELECT:
        return x[..., how]
    if uint8:
        xi = x.astype("int32")
        out = stack(how([xi[..., k] for k in range(channels)]), axis=3)
        return minimum(maximum(out, 0), 255).astype("uint8")
    if x.dtype.kind != "f" or key not in _CVT_ARITHMETIC:
        kinds = "uint8 or floating" if key in _CVT_UINT8 and key in _CVT_ARITHMETIC else \
            "uint8" if key in _CVT_UINT8 else "floating"
        raise TypeError(f"cvt_color: mode {key} computes on {kinds} images, got {x.dtype} (shape {x.shape}); "
                        f"cast first, e.g. x.astype('float32')")
    return stack(how([x[..., k] for k in range(channels)]), axis=3)


def nms(boxes: Tensor, scores: Tensor, iou_thresh: float, max_output: Optional[int] = None) -> Tensor:
    """Non-maximum suppression, MegEngine's ``F.vision.nms``: the int32
    indices of the boxes (N, 4) as (x1, y1, x2, y2) kept, by decreasing
    ``scores`` (N,): a box is dropped when its IoU with a kept box of a
    higher score exceeds ``iou_thresh``; at most ``max_output`` (None:
    all). Computed on the host (no gradient: indices).

    Example::

        >>> boxes = gc.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
        >>> F.vision.nms(boxes, gc.tensor([0.9, 0.8, 0.7]), iou_thresh=0.5).numpy()
        array([0, 2], dtype=int32)
    """
    b, s = _t(boxes), _t(scores)
    if b.ndim != 2 or b.shape[1] != 4 or s.ndim != 1 or s.shape[0] != b.shape[0]:
        raise ArgumentError(f"nms: expected boxes (N, 4) and scores (N,), got shapes {b.shape} and {s.shape}")
    limit = b.shape[0] if max_output is None else _int_arg("nms", "max_output", max_output, 1)
    x1, y1, x2, y2 = np.asarray(b.numpy(), np.float64).T
    area = (x2 - x1) * (y2 - y1)
    order = np.argsort(-np.asarray(s.numpy(), np.float64), kind="stable")
    alive = np.ones(len(order), bool)              # by position in order
    keep = []
    for k, i in enumerate(order):
        if not alive[k]:
            continue
        keep.append(i)
        if len(keep) == limit:
            break
        rest = order[k + 1:]
        w = np.clip(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), 0, None)
        h = np.clip(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), 0, None)
        inter = w * h
        with np.errstate(invalid="ignore", divide="ignore"):
            iou = inter / (area[i] + area[rest] - inter)
        alive[k + 1:] &= ~(iou > iou_thresh)
    return Tensor(np.asarray(keep, np.int32), device=b.device)


# ---- sampling at given coordinates: remap and the warps built on it

REMAP_BORDERS = ("replicate", "constant", "reflect", "reflect_101", "wrap")
REMAP_MODES = ("linear", "nearest")
# coordinates are clamped into +-2**22 first: integers stay exact in float32,
# and an inf or a huge coordinate folds (reflect, wrap) without overflowing
_COORD_LIMIT = float(2 ** 22)


def _round_half_to_even(p: Tensor) -> Tensor:
    """p rounded to the nearest integer, halves to even (MegEngine's remap
    rounds so; ``F.round`` takes them away from zero)."""
    low = floor(p)
    frac = p - low                          # exact
    up = where(mod(low, 2.0) == 0, low, low + 1)       # a half: to the even neighbour
    return where(frac > 0.5, low + 1, where(frac < 0.5, low, up))


def _fold(p: Tensor, n: int, border_mode: str) -> Tensor:
    """Integer-valued coordinates ``p`` (float) brought into [0, n) by the
    border mode (OpenCV's, as MegEngine's ``border_interpolate``)."""
    if border_mode in ("replicate", "constant") or n == 1:
        return minimum(maximum(p, 0.0), float(n - 1))
    if border_mode == "wrap":
        return mod(p, float(n))
    edge = int(border_mode == "reflect_101")       # 1: the edge pixel is not repeated
    q = mod(p, float(2 * n - 2 * edge))
    # past the image, q mirrors back to (2n - 1 - edge) - q
    return where(q >= float(n), float(2 * n - 1 - edge) - q, q)


def remap(inp: Tensor, map_xy: Tensor, border_mode: str = "replicate", scalar: float = 0.0,
          interp_mode: str = "linear") -> Tensor:
    """Images ``inp`` (N, C, H, W) sampled at the points ``map_xy`` (N, OH,
    OW, 2) of (column, row) coordinates into (N, C, OH, OW), MegEngine's
    ``F.vision.remap``.

    ``interp_mode`` "linear" blends the four pixels around a point by its
    distances to them; "nearest" reads the pixel at the coordinates rounded
    half to even (MegEngine's kernels). A pixel outside the image reads, by
    ``border_mode``, the edge ("replicate"), ``scalar`` ("constant"), the
    image mirrored with its edge ("reflect", fedcba|abcdef) or without
    ("reflect_101", fedcb|abcdef), or the image repeated ("wrap").

    Built from gathers of the flattened image and a blend, so it runs on
    every device and differentiates to any order: in ``inp`` (a
    scatter-add) and, for "linear", in ``map_xy`` (the blend's slopes).
    Integer images are sampled in float32, rounded and saturated back.

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> xy = gc.tensor(np.array([[[[1., 0.], [0., 1.]], [[0., 1.], [0., 1.]]]], "float32"))
        >>> F.vision.remap(x, xy).numpy()
        array([[[[1., 4.],
                 [4., 4.]]]], dtype=float32)
    """
    x, xy = _t(inp), _t(map_xy)
    border, imode = str(border_mode).lower(), str(interp_mode).lower()
    if border not in REMAP_BORDERS:
        raise ArgumentError(f"remap: border_mode must be one of {', '.join(REMAP_BORDERS)}, got {border_mode!r}")
    if imode not in REMAP_MODES:
        raise ArgumentError(f"remap: interp_mode must be one of {', '.join(REMAP_MODES)}, got {interp_mode!r}")
    shapes = f"(inp {x.shape}, map_xy {xy.shape})"
    if x.ndim != 4 or xy.ndim != 4 or xy.shape[-1] != 2 or x.shape[0] != xy.shape[0]:
        raise ArgumentError(f"remap: expected inp (N, C, H, W) and map_xy (N, OH, OW, 2), got {shapes}")
    if 0 in x.shape[2:]:
        raise ArgumentError(f"remap: inp has an empty spatial axis, nothing to sample {shapes}")
    if x.dtype.kind not in "iuf" or xy.dtype.kind != "f":
        raise ArgumentError(f"remap: needs a numeric inp and a floating-point map_xy, got {x.dtype} and {xy.dtype}")
    dtype = x.dtype
    if dtype.kind in "iu":
        x = astype(x, "float32")
    if xy.dtype != x.dtype:
        xy = astype(xy, x.dtype)
    n, c, h, w = x.shape
    oh, ow = xy.shape[1:3]
    flat = reshape(x, (n, c, h * w))
    # (column, row); a NaN coordinate reads outside the image
    col, row = (minimum(maximum(where(p != p, -1.0, p), -_COORD_LIMIT), _COORD_LIMIT)
                for p in (xy[..., 0], xy[..., 1]))
    if border == "replicate":
        # the point clamped into the image first: the same values as clamping
        # each pixel read, and PyTorch's border padding's slope (0 on the edge
        # and past it) for the gradient to the map
        col = where(col <= 0.0, 0.0, where(col >= float(w - 1), float(w - 1), col))
        row = where(row <= 0.0, 0.0, where(row >= float(h - 1), float(h - 1), row))
    if imode == "nearest":
        taps = [(_round_half_to_even(row), _round_half_to_even(col), None)]
    else:
        r0, c0 = stop_gradient(floor(row)), stop_gradient(floor(col))
        u, v = row - r0, col - c0           # the blend's weights carry the gradient to map_xy
        taps = [(r0, c0, (1 - u) * (1 - v)), (r0, c0 + 1, (1 - u) * v),
                (r0 + 1, c0, u * (1 - v)), (r0 + 1, c0 + 1, u * v)]
    out = None
    for r, q, weight in taps:
        index = astype(_fold(r, h, border) * float(w) + _fold(q, w, border), "int32")
        index = broadcast_to(reshape(index, (n, 1, oh * ow)), (n, c, oh * ow))
        val = reshape(gather(flat, 2, index), (n, c, oh, ow))
        if border == "constant":
            inside = logical_and(logical_and(r >= 0.0, r <= float(h - 1)), logical_and(q >= 0.0, q <= float(w - 1)))
            val = where(reshape(inside, (n, 1, oh, ow)), val, float(scalar))
        if weight is not None:
            val = val * reshape(weight, (n, 1, oh, ow))
        out = val if out is None else out + val
    return _to_integer(out, dtype) if dtype.kind in "iu" else out


def _out_hw(name: str, out_shape) -> tuple:
    if isinstance(out_shape, Tensor):
        out_shape = out_shape.numpy().tolist()
    hw = _int_tuple(name, "out_shape", out_shape)
    if len(hw) == 1:
        hw = hw * 2
    if len(hw) != 2:
        raise ArgumentError(f"{name}: out_shape must be (height, width), got {out_shape!r}")
    return tuple(_int_arg(name, "out_shape", v, 1) for v in hw)


def _warp(name: str, inp, mat, rows: int, out_shape, mat_idx, border_mode, border_val, format: str,
          interp_mode: str) -> Tensor:
    """Remap ``inp`` at the points ``mat`` (B, rows, 3) sends the output
    pixel grid to: (x, y) = (m0 w + m1 h + m2, m3 w + m4 h + m5), divided by
    m6 w + m7 h + m8 for a perspective (rows 3)."""
    x, m = _t(inp), _t(mat)
    if format not in ("NCHW", "NHWC"):
        raise ArgumentError(f"{name}: format must be 'NCHW' or 'NHWC', got {format!r}")
    if x.ndim != 4:
        raise ArgumentError(f"{name}: inp must be 4-D images ({format}), got shape {x.shape}")
    if m.ndim != 3 or m.shape[1:] != (rows, 3):
        raise ArgumentError(f"{name}: mat must be (batch, {rows}, 3), got shape {m.shape}")
    if format == "NHWC":
        x = transpose(x, (0, 3, 1, 2))
    if x.dtype == np.float16:       # computed in float32, as MegEngine
        x = astype(x, "float32")
    if x.dtype.kind == "f" and m.dtype != x.dtype:
        m = astype(m, x.dtype)
    elif m.dtype.kind != "f":
        m = astype(m, "float32")
    if mat_idx is not None:
        x = x[_t(mat_idx)]          # the image of each matrix
    elif m.shape[0] != x.shape[0]:
        if m.shape[0] != 1:
            raise ArgumentError(f"{name}: mat has {m.shape[0]} matrices for {x.shape[0]} images "
                                f"(give one per image, one for all, or mat_idx)")
        m = broadcast_to(m, (x.shape[0], rows, 3))
    oh, ow = _out_hw(name, out_shape)
    b = m.shape[0]
    mode = "linear" if interp_mode == "bilinear" else interp_mode
    if rows == 2 and format == "NHWC" and x.shape[1] in (1, 2, 3) and x.dtype in (np.float32, np.uint8):
        # MegEngine's CPU kernel for these (OpenCV's) puts the points on a
        # 1/32 pixel grid, which its tests expect: the same grid here (no
        # gradient to the matrices on it; MegEngine's warp_affine has none)
        grid = Tensor(_opencv_affine_points(m.numpy(), oh, ow, mode == "nearest"), device=x.device)
        return transpose(remap(x, grid, border_mode, border_val, mode), (0, 2, 3, 1))
    gw = np.arange(ow, dtype=m.dtype).reshape(1, 1, ow)
    gh = np.arange(oh, dtype=m.dtype).reshape(1, oh, 1)

    def entry(i, j):
        return reshape(m[:, i, j], (b, 1, 1))
    # MegEngine's order of operations: (m0 * w + m1 * h) + m2
    px = entry(0, 0) * gw + entry(0, 1) * gh + entry(0, 2)
    py = entry(1, 0) * gw + entry(1, 1) * gh + entry(1, 2)
    if rows == 3:
        d = entry(2, 0) * gw + entry(2, 1) * gh + entry(2, 2)
        px, py = px / d, py / d
    out = remap(x, stack([px, py], -1), border_mode, border_val, mode)
    return transpose(out, (0, 2, 3, 1)) if format == "NHWC" else out


def _opencv_affine_points(mat: np.ndarray, oh: int, ow: int, nearest: bool) -> np.ndarray:
    """The (B, OH, OW, 2) points of OpenCV's warpAffine (MegEngine's CPU
    kernel): each coordinate in 1/1024 units, rounded (half to even), then
    on a 1/32 grid (rounded to nearest, half up), a whole pixel for
    "nearest"; float32 matrices computed in double, as there."""
    m = np.asarray(mat, np.float32).astype(np.float64)
    xs, ys = np.arange(ow), np.arange(oh)
    delta = 512 if nearest else 16
    points = []
    for row in (0, 1):
        along_x = np.rint(m[:, row, 0, None] * xs * 1024).astype(np.int64)                   # (B, OW)
        along_y = np.rint((m[:, row, 1, None] * ys + m[:, row, 2, None]) * 1024).astype(np.int64) + delta
        units = along_y[:, :, None] + along_x[:, None, :]                                   # (B, OH, OW)
        if nearest:
            points.append(np.clip(units >> 10, -32768, 32767))
        else:
            thirty_seconds = units >> 5
            # OpenCV keeps the whole pixel in a short, the fraction apart
            points.append(np.clip(thirty_seconds >> 5, -32768, 32767) + (thirty_seconds & 31) / 32.0)
    return np.stack(points, -1).astype(np.float32)


def warp_perspective(inp: Tensor, mat: Tensor, out_shape: Union[int, Sequence[int]],
                     mat_idx: Optional[Union[Tensor, Sequence[int]]] = None, border_mode: str = "replicate",
                     border_val: float = 0.0, format: str = "NCHW", interp_mode: str = "linear") -> Tensor:
    """Images warped by perspective matrices ``mat`` (B, 3, 3), MegEngine's
    ``F.vision.warp_perspective``: output pixel (h, w) of image n reads the
    input at ((m0 w + m1 h + m2) / d, (m3 w + m4 h + m5) / d), d = m6 w +
    m7 h + m8 (the inverse of what ``cv2.warpPerspective`` takes), output
    ``out_shape`` (OH, OW). ``mat_idx`` (B,) picks the input image of each
    matrix; border and interpolation as ``remap``. Differentiable in the
    images and in ``mat``.

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> shift = gc.tensor(np.array([[[1., 0., 1.], [0., 1., 1.], [0., 0., 1.]]], "float32"))
        >>> F.vision.warp_perspective(x, shift, (2, 2)).numpy()
        array([[[[ 5.,  6.],
                 [ 9., 10.]]]], dtype=float32)
    """
    return _warp("warp_perspective", inp, mat, 3, out_shape, mat_idx, border_mode, border_val, format,
                 interp_mode)


def warp_affine(inp: Tensor, mat: Tensor, out_shape: Union[int, Sequence[int]],
                border_mode: str = "replicate", border_val: float = 0.0, format: str = "NHWC",
                interp_mode: str = "linear") -> Tensor:
    """Images (NHWC by default, as MegEngine's) warped by affine matrices
    ``mat`` (B, 2, 3): output pixel (h, w) reads the input at (m0 w + m1 h
    + m2, m3 w + m4 h + m5), MegEngine's ``F.vision.warp_affine``; border
    and interpolation as ``remap``. Differentiable (MegEngine's is
    forward-only).

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 4, 4, 1))
        >>> shift = gc.tensor(np.array([[[1., 0., 1.], [0., 1., 1.]]], "float32"))
        >>> F.vision.warp_affine(x, shift, (2, 2)).numpy().reshape(2, 2)
        array([[ 5.,  6.],
               [ 9., 10.]], dtype=float32)
    """
    return _warp("warp_affine", inp, mat, 2, out_shape, None, border_mode, border_val, format, interp_mode)


def rotate(inp: Tensor, angle: float = 0.0, format: str = "NCHW", interp_mode: str = "bilinear") -> Tensor:
    """Images turned by ``angle`` degrees about their centre, the same size,
    zeros where no input pixel lands, MegEngine's ``F.vision.rotate``
    (bilinear; MegEngine's "area" mode for NHWC is not implemented).

    Example::

        >>> x = gc.tensor(np.arange(9, dtype="float32").reshape(1, 1, 3, 3))
        >>> F.vision.rotate(x, 180.0).numpy().round(4).reshape(3, 3)
        array([[8., 7., 6.],
               [5., 4., 3.],
               [2., 1., 0.]], dtype=float32)
    """
    if interp_mode != "bilinear":
        raise ArgumentError(f"rotate: interp_mode must be 'bilinear', got {interp_mode!r}")
    x = _t(inp)
    if x.ndim != 4 or format not in ("NCHW", "NHWC"):
        raise ArgumentError(f"rotate: inp must be 4-D images in format 'NCHW' or 'NHWC', got shape {x.shape} "
                            f"and format {format!r}")
    height, width = x.shape[2:] if format == "NCHW" else x.shape[1:3]
    a = float(angle) / 180.0 * np.pi
    cx, cy = (width - 1) / 2, (height - 1) / 2
    mat = np.array([[[np.cos(a), -np.sin(a), (1 - np.cos(a)) * cx + np.sin(a) * cy],
                     [np.sin(a), np.cos(a), -np.sin(a) * cx + (1 - np.cos(a)) * cy]]],
                   x.dtype if x.dtype.kind == "f" else "float32")
    return warp_affine(x, Tensor(mat, device=x.device), (height, width), border_mode="constant", format=format)


def resize(inp: Tensor, size: Union[int, Sequence[int]], format: str = "NCHW", imode: str = "bilinear",
           max_size: Optional[int] = None) -> Tensor:
    """Images resized to ``size`` (OH, OW), MegEngine's
    ``F.vision.resize``: ``interpolate`` without corner alignment, modes
    "bilinear", "nearest", "bicubic", or the names of MegEngine's Resize op
    for them, "linear" and "cubic" (``M.Resize``'s default is "linear");
    NCHW or NHWC; ``max_size`` caps each output side (MegEngine's rule).

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> F.vision.resize(x, (2, 2)).numpy()
        array([[[[ 2.5,  4.5],
                 [10.5, 12.5]]]], dtype=float32)
    """
    if isinstance(size, Tensor):
        size = size.numpy().tolist()
    hw = _int_tuple("resize", "size", size)
    if max_size is not None:
        hw = tuple(min(v, _int_arg("resize", "max_size", max_size, 1)) for v in hw)
    if format not in ("NCHW", "NHWC"):
        raise ArgumentError(f"resize: format must be 'NCHW' or 'NHWC', got {format!r}")
    # MegEngine's Resize op names the 2-D modes "linear" and "cubic"
    imode = {"linear": "bilinear", "cubic": "bicubic"}.get(imode, imode)
    x = _t(inp)
    if format == "NHWC":
        return transpose(interpolate(transpose(x, (0, 3, 1, 2)), hw, mode=imode), (0, 2, 3, 1))
    return interpolate(x, hw, mode=imode)


# ---- regions of interest: values at computed points of each box's image

def _rois(name: str, x: Tensor, rois) -> tuple:
    """``rois`` (K, 5) as host arrays: the image of each box (int) and its
    (x1, y1, x2, y2) in float32 (MegEngine computes its boxes in float)."""
    r = _t(rois)
    if x.ndim != 4 or r.ndim != 2 or r.shape[1] != 5:
        raise ArgumentError(f"{name}: expected inp (N, C, H, W) and rois (K, 5) as (index, x1, y1, x2, y2), "
                            f"got shapes {x.shape} and {r.shape}")
    host = np.asarray(r.numpy(), np.float32)
    index = host[:, 0].astype(np.int64)
    if index.size and (index.min() < 0 or index.max() >= x.shape[0]):
        raise ArgumentError(f"{name}: a box's image index is outside [0, {x.shape[0]}): {index.tolist()}")
    return index, host[:, 1:]


def _gather_weighted(x: Tensor, flat, weights) -> Tensor:
    """sum_t weights[m, t] * x's pixel flat[m, t] (an index into N * H * W):
    (M, C) from x (N, C, H, W); flat and weights (M, T) host arrays. A fixed
    sparse linear map of x: its gradient is the scatter-add of the same."""
    n, c, h, w = x.shape
    m, taps = flat.shape
    rows = reshape(transpose(x, (0, 2, 3, 1)), (n * h * w, c))
    picked = reshape(rows[Tensor(flat.reshape(-1).astype(np.int32), device=x.device)], (m, taps, c))
    scale = Tensor(weights.astype(x.dtype).reshape(m, taps, 1), device=x.device)
    return (picked * scale).sum(axis=1)


def roi_align(inp: Tensor, rois: Tensor, output_shape: Union[int, Sequence[int]], mode: str = "average",
              spatial_scale: float = 1.0, sample_points: Union[int, Sequence[int]] = 2,
              aligned: bool = True) -> Tensor:
    """RoIAlign (Mask R-CNN), MegEngine's ``F.vision.roi_align``: for each
    box of ``rois`` (K, 5) as (image index, x1, y1, x2, y2), scaled by
    ``spatial_scale`` (and shifted by -0.5 when ``aligned``), each of the
    ``output_shape`` (PH, PW) bins is the average (or ``mode`` "max") of
    ``sample_points`` (SH, SW) bilinear samples at the centres of its
    sub-bins; pixels outside the image read 0. Output (K, C, PH, PW);
    differentiable in ``inp`` (the boxes are positions, not learnt).

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> F.vision.roi_align(x, gc.tensor([[0, 0.5, 0.5, 2.5, 2.5]]), 1, sample_points=1).numpy()
        array([[[[5.]]]], dtype=float32)
    """
    x = _t(inp)
    mode = str(mode).lower()
    if mode not in ("average", "max"):
        raise ArgumentError(f"roi_align: mode must be 'average' or 'max', got {mode!r}")
    ph, pw = _out_hw("roi_align", output_shape)
    sh, sw = _out_hw("roi_align", sample_points)
    index, boxes = _rois("roi_align", x, rois)
    n, c, h, w = x.shape
    f32 = np.float32
    offset = f32(0.5 if aligned else 0.0)
    start = boxes[:, :2] * f32(spatial_scale) - offset                  # (K, 2) as (w, h)
    size = np.maximum(boxes[:, 2:] * f32(spatial_scale) - offset - start, f32(0))
    bin_w, bin_h = size[:, 0] / f32(pw), size[:, 1] / f32(ph)
    # sample centres, MegEngine's float arithmetic: start + bin * (p + (s + 0.5) / S)
    hs = start[:, 1, None] + bin_h[:, None] * (np.repeat(np.arange(ph, dtype=f32), sh)
                                               + f32(1.0) / f32(sh) * (np.tile(np.arange(sh, dtype=f32), ph) + f32(0.5)))
    ws = start[:, 0, None] + bin_w[:, None] * (np.repeat(np.arange(pw, dtype=f32), sw)
                                               + f32(1.0) / f32(sw) * (np.tile(np.arange(sw, dtype=f32), pw) + f32(0.5)))
    k = len(index)
    yy = np.broadcast_to(hs[:, :, None], (k, ph * sh, pw * sw)).astype(np.float64)
    xx = np.broadcast_to(ws[:, None, :], (k, ph * sh, pw * sw)).astype(np.float64)
    y0, x0 = np.floor(yy), np.floor(xx)
    u, v = yy - y0, xx - x0
    flat, weights = [], []
    for dy, dx, wt in ((0, 0, (1 - u) * (1 - v)), (0, 1, (1 - u) * v), (1, 0, u * (1 - v)), (1, 1, u * v)):
        r, q = y0 + dy, x0 + dx
        inside = (r >= 0) & (r < h) & (q >= 0) & (q < w)            # outside the image: 0
        flat.append(index[:, None, None] * (h * w) + np.where(inside, r * w + q, 0).astype(np.int64))
        weights.append(np.where(inside, wt, 0.0))
    flat = np.stack(flat, -1).reshape(-1, 4)
    samples = _gather_weighted(x, flat, np.stack(weights, -1).reshape(-1, 4))     # (K * PH*SH * PW*SW, C)
    samples = transpose(reshape(samples, (k, ph, sh, pw, sw, c)), (0, 5, 1, 3, 2, 4))
    samples = reshape(samples, (k, c, ph, pw, sh * sw))
    return samples.max(axis=4) if mode == "max" else samples.mean(axis=4)


def roi_pooling(inp: Tensor, rois: Tensor, output_shape: Union[int, Sequence[int]], mode: str = "max",
                scale: float = 1.0) -> Tensor:
    """RoI pooling (Fast R-CNN), MegEngine's ``F.vision.roi_pooling``: each
    box of ``rois`` (K, 5) as (image index, x1, y1, x2, y2), scaled by
    ``scale`` and rounded to whole pixels (at least 1 x 1), is cut into
    ``output_shape`` (PH, PW) bins of whole pixels (floor of the start,
    ceiling of the end, inside the image), each pooled by ``mode`` "max" or
    "average" (0 for an empty bin). Output (K, C, PH, PW); differentiable in
    ``inp``.

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> F.vision.roi_pooling(x, gc.tensor([[0, 0, 0, 3, 3]]), (2, 2)).numpy()
        array([[[[ 5.,  7.],
                 [13., 15.]]]], dtype=float32)
    """
    x = _t(inp)
    mode = str(mode).lower()
    if mode not in ("max", "average"):
        raise ArgumentError(f"roi_pooling: mode must be 'max' or 'average', got {mode!r}")
    ph, pw = _out_hw("roi_pooling", output_shape)
    index, boxes = _rois("roi_pooling", x, rois)
    n, c, h, w = x.shape
    f32 = np.float32
    corners = np.round(boxes * f32(scale)).astype(np.int64)                # (K, 4): x1, y1, x2, y2
    extent = np.maximum(corners[:, 2:] - corners[:, :2] + 1, 1)            # (K, 2): width, height

    def bins(p: int, extent_, start, limit):
        """(K, p) start and end of each bin along one axis, inside [0, limit]."""
        size = extent_.astype(f32)[:, None] / f32(p)
        lo = np.floor(np.arange(p, dtype=f32) * size).astype(np.int64) + start[:, None]
        hi = np.ceil(np.arange(1, p + 1, dtype=f32) * size).astype(np.int64) + start[:, None]
        return np.clip(lo, 0, limit), np.clip(hi, 0, limit)
    h_lo, h_hi = bins(ph, extent[:, 1], corners[:, 1], h)
    w_lo, w_hi = bins(pw, extent[:, 0], corners[:, 0], w)
    k = len(index)
    bh = max(int((h_hi - h_lo).max(initial=0)), 1)
    bw = max(int((w_hi - w_lo).max(initial=0)), 1)
    rr = h_lo[:, :, None] + np.arange(bh)                  # (K, PH, BH)
    qq = w_lo[:, :, None] + np.arange(bw)                  # (K, PW, BW)
    r_in, q_in = rr < h_hi[:, :, None], qq < w_hi[:, :, None]
    inside = r_in[:, :, None, :, None] & q_in[:, None, :, None, :]           # (K, PH, PW, BH, BW)
    flat = (index[:, None, None, None, None] * (h * w) + np.minimum(rr, h - 1)[:, :, None, :, None] * w
            + np.minimum(qq, w - 1)[:, None, :, None, :])
    flat = np.where(inside, flat, 0).reshape(-1, 1)
    values = reshape(_gather_weighted(x, flat, np.ones(flat.shape)), (k, ph, pw, bh * bw, c))
    values = transpose(values, (0, 4, 1, 2, 3))                                # (K, C, PH, PW, B)
    mask = Tensor(inside.reshape(k, 1, ph, pw, bh * bw), device=x.device)
    count = inside.reshape(k, 1, ph, pw, bh * bw).sum(-1)
    if mode == "max":
        best = where(mask, values, np.asarray(-np.inf, x.dtype)).max(axis=4)
        return where(Tensor(count > 0, device=x.device), best, np.asarray(0, x.dtype))
    total = where(mask, values, np.asarray(0, x.dtype)).sum(axis=4)
    return total / Tensor(np.maximum(count, 1).astype(x.dtype), device=x.device)


def _zero_pad_hw(x: Tensor, p: int) -> Tensor:
    """``x`` (N, C, H, W) with ``p`` zeros around H and W."""
    if p == 0:
        return x
    n, c, h, w = x.shape
    side = zeros((n, c, h, p), dtype=x.dtype, device=x.device)
    x = concat([side, x, side], axis=3)
    row = zeros((n, c, p, w + 2 * p), dtype=x.dtype, device=x.device)
    return concat([row, x, row], axis=2)


def correlation(data1: Tensor, data2: Tensor, kernel_size: int = 1, max_displacement: int = 1, stride1: int = 1,
                stride2: int = 1, pad_size: int = 0, is_multiply: bool = True) -> Tensor:
    """FlowNet's correlation layer, MegEngine's ``F.vision.correlation``:
    for each position of ``data1`` (N, C, H, W, zero-padded by
    ``pad_size``; every ``stride1``-th one whose ``kernel_size`` window
    displaced by up to ``max_displacement`` stays inside) and each
    displacement (dy, dx) in multiples of ``stride2`` up to
    ``max_displacement``, the mean over the window and the channels of
    ``data1 * data2`` (``is_multiply``) or ``|data1 - data2|``, with
    ``data2``'s window displaced. Output channel ``(dy / stride2 + D) * (2D
    + 1) + dx / stride2 + D``, D = max_displacement // stride2. Composed of
    slices, products and average pooling: it differentiates on every device.

    Example::

        >>> a = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> out = F.vision.correlation(a, a, kernel_size=1, max_displacement=1, pad_size=1)
        >>> out.shape       # 9 displacements, over all 4 x 4 positions
        (1, 9, 4, 4)
        >>> out[0, 4].numpy()           # no displacement: a * a
        array([[  0.,   1.,   4.,   9.],
               [ 16.,  25.,  36.,  49.],
               [ 64.,  81., 100., 121.],
               [144., 169., 196., 225.]], dtype=float32)
    """
    a, b = _t(data1), _t(data2)
    k = _int_arg("correlation", "kernel_size", kernel_size, low=1)
    md = _int_arg("correlation", "max_displacement", max_displacement, low=0)
    s1 = _int_arg("correlation", "stride1", stride1, low=1)
    s2 = _int_arg("correlation", "stride2", stride2, low=1)
    pad = _int_arg("correlation", "pad_size", pad_size, low=0)
    if k % 2 == 0:
        raise ArgumentError(f"correlation: kernel_size must be odd, got {k}")
    if a.ndim != 4 or a.shape != b.shape:
        raise ArgumentError(f"correlation: data1 and data2 must be (N, C, H, W) of one shape, got {a.shape} "
                            f"and {b.shape}")
    if a.dtype.kind != "f" or b.dtype.kind != "f":
        a, b = a.astype("float32") if a.dtype.kind != "f" else a, b.astype("float32") if b.dtype.kind != "f" else b
    hp, wp = a.shape[2] + 2 * pad, a.shape[3] + 2 * pad
    border = md + (k - 1) // 2
    if hp - 2 * border < 1 or wp - 2 * border < 1:
        raise ArgumentError(f"correlation: inputs of shape {a.shape} padded by {pad} are too small for "
                            f"kernel_size={k} and max_displacement={md}")
    a, b = _zero_pad_hw(a, pad), _zero_pad_hw(b, pad)
    # the rows and columns any window centred on an output position covers
    base = a[:, :, md:hp - md, md:wp - md]
    d = md // s2
    maps = []
    for dy in range(-d, d + 1):
        for dx in range(-d, d + 1):
            oy, ox = dy * s2, dx * s2
            moved = b[:, :, md + oy:hp - md + oy, md + ox:wp - md + ox]
            per = base * moved if is_multiply else abs(base - moved)
            maps.append(mean(per, 1, True))
    # the window mean with stride1: its windows fit exactly, no padding counted
    return avg_pool2d(concat(maps, axis=1), k, stride=s1, mode="average")
