"""``F.vision``: resizing images, MegEngine's ``functional.vision``.

Example::

    >>> F.vision.interpolate(x, scale_factor=2, mode="nearest")
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .._core import Tensor, apply as _apply
from ..ops.vision import Interpolate
from ._args import _int_arg, _int_tuple, _t
from .shape import expand_dims, reshape, squeeze, transpose
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


def interpolate(inp: Tensor, size=None, scale_factor=None, mode: str = "bilinear",
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
