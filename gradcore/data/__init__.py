"""``gradcore.data``: datasets, samplers, transforms and ``DataLoader``, after
``megengine.data``. The package also ships the digits data of the demo
(``digits.npz``, see ``README.txt`` here).

Example::

    >>> import numpy as np
    >>> from gradcore.data import ArrayDataset, RandomSampler, DataLoader
    >>> from gradcore.data import transform as T
    >>> ds = ArrayDataset(np.random.rand(100, 8, 8, 1).astype(np.float32), np.arange(100) % 10)
    >>> loader = DataLoader(ds, RandomSampler(ds, batch_size=32, seed=0),
    ...                     transform=T.Compose([T.RandomHorizontalFlip(), T.ToMode("CHW")],
    ...                                         order=("image", "image_category")),
    ...                     num_workers=2)
    >>> for images, labels in loader:
    ...     pass
    >>> images.shape
    (4, 1, 8, 8)
"""
from . import transform
from .collator import Collator
from .dataloader import DataLoader, WorkerInfo, get_worker_info
from .dataset import ArrayDataset, ConcatDataset, Dataset, MapDataset, StreamDataset
from .sampler import (Infinite, MapSampler, RandomSampler, ReplacementSampler, Sampler, SequentialSampler,
                      StreamSampler)

__all__ = ["Dataset", "MapDataset", "StreamDataset", "ArrayDataset", "ConcatDataset", "Sampler", "MapSampler",
           "SequentialSampler", "RandomSampler", "ReplacementSampler", "StreamSampler", "Infinite",
           "Collator", "DataLoader", "WorkerInfo", "get_worker_info", "transform"]
