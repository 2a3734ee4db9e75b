"""MegEngine's image layers over NCHW tensors that gradcore has: Resize,
Remap and DeformablePSROIPooling (the modules of ``F.vision.resize``,
``F.vision.remap`` and ``F.deformable_psroi_pooling``)."""
from __future__ import annotations

from typing import Sequence, Union

from .. import functional as F
from .._core import Tensor
from ..functional.shape import stack
from ..op import ArgumentError
from .module import Module


class Resize(Module):
    """Resize images to ``size`` (OH, OW), MegEngine's ``M.Resize``:
    ``F.vision.resize(x, size, format, imode)``; ``imode`` "linear" (the
    default, bilinear), "nearest" or "cubic" (also by their F names).

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> M.Resize([2, 2])(x).numpy()
        array([[[[ 2.5,  4.5],
                 [10.5, 12.5]]]], dtype=float32)
    """

    def __init__(self, size: Union[Sequence[int], Tensor], format: str = "NCHW", imode: str = "linear"):
        super().__init__()
        if format not in ("NCHW", "NHWC"):
            raise ArgumentError(f"Resize: format must be 'NCHW' or 'NHWC', got {format!r}")
        self.size = size.numpy().tolist() if isinstance(size, Tensor) else list(size)
        self.format, self.imode = format, imode

    def forward(self, inp: Tensor) -> Tensor:
        return F.vision.resize(inp, self.size, self.format, self.imode)


class Remap(Module):
    """Relocate pixels of NCHW images, MegEngine's ``M.Remap``: the output
    at (y, x) is the input sampled at column ``map_1[n, y, x]`` and row
    ``map_2[n, y, x]``, or, where ``map_2`` is empty, at the (column, row)
    pair ``map_1[n, y, x]`` (``F.vision.remap``'s ``map_xy``).

    Example::

        >>> inp = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> x_map = gc.tensor([[[1, 0], [0, 0]]], dtype="float32")
        >>> y_map = gc.tensor([[[1, 1], [1, 1]]], dtype="float32")
        >>> M.Remap()(inp, x_map, y_map).numpy()
        array([[[[5., 4.],
                 [4., 4.]]]], dtype=float32)
    """

    def forward(self, inp: Tensor, map_1: Tensor, map_2: Tensor, interpolation: str = "linear",
                borderMode: str = "replicate", borderValue: float = 0.0) -> Tensor:
        if map_1.size == 0 or (map_2.size and tuple(map_1.shape) != tuple(map_2.shape)):
            raise ArgumentError(f"Remap: map_1 must be non-empty and map_2 empty or of map_1's shape, got "
                                f"{tuple(map_1.shape)} and {tuple(map_2.shape)}")
        map_xy = stack([map_1, map_2], map_1.ndim) if map_2.size else map_1
        return F.vision.remap(inp, map_xy, borderMode, borderValue, interpolation)


class DeformablePSROIPooling(Module):
    """Deformable position-sensitive RoI pooling, MegEngine's
    ``M.DeformablePSROIPooling``: ``forward(inp, rois, trans)`` is
    ``F.deformable_psroi_pooling`` with the constructor's settings.

    Example::

        >>> pool = M.DeformablePSROIPooling(False, 2, 2, 2, 1, 1.0)
        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> pool(x, gc.tensor([[0., 0, 0, 3, 3]]), F.zeros((1, 2, 2, 2))).numpy()
        array([[[[0. , 1.5],
                 [6. , 7.5]]]], dtype=float32)
    """

    def __init__(self, no_trans: bool, part_size: int, pooled_h: int, pooled_w: int, sample_per_part: int,
                 spatial_scale: float, trans_std: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.no_trans, self.part_size = no_trans, part_size
        self.pooled_h, self.pooled_w = pooled_h, pooled_w
        self.sample_per_part, self.spatial_scale, self.trans_std = sample_per_part, spatial_scale, trans_std

    def forward(self, inp: Tensor, rois: Tensor, trans: Tensor) -> Tensor:
        return F.deformable_psroi_pooling(inp, rois, trans, self.no_trans, self.part_size, self.pooled_h,
                                          self.pooled_w, self.sample_per_part, self.spatial_scale, self.trans_std)
