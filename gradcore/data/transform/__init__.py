"""``gradcore.data.transform``: sample transforms for ``DataLoader``, after
``megengine.data.transform``. Random transforms draw from ``rng()``, which
the loader seeds per batch (see ``gradcore.data.transform.base``).

Example::

    >>> from gradcore.data import transform as T
    >>> t = T.Compose([T.RandomCrop(8, padding_size=1), T.RandomHorizontalFlip(),
    ...                T.Normalize(mean=0.5, std=0.25), T.ToMode("CHW")])
"""
from .base import PseudoTransform, Transform, rng, seed
from .vision import (INTER_LINEAR, INTER_NEAREST, BrightnessTransform, CenterCrop, ColorJitter, Compose,
                     ContrastTransform, GaussianNoise, HueTransform, Lighting, Normalize, Pad, RandomCrop,
                     RandomHorizontalFlip, RandomResize, RandomResizedCrop, RandomVerticalFlip, Resize,
                     SaturationTransform, ShortestEdgeResize, ToMode, VisionTransform)

__all__ = ["Transform", "PseudoTransform", "VisionTransform", "Compose", "ToMode", "Normalize", "Pad",
           "RandomCrop", "RandomHorizontalFlip", "RandomVerticalFlip", "Resize", "ShortestEdgeResize",
           "RandomResize", "RandomResizedCrop", "CenterCrop", "GaussianNoise", "BrightnessTransform",
           "ContrastTransform", "SaturationTransform", "HueTransform", "ColorJitter", "Lighting",
           "INTER_NEAREST", "INTER_LINEAR", "rng", "seed"]
