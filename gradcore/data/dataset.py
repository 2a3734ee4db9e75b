"""Datasets, after ``megengine.data.dataset``: a ``MapDataset`` is indexed
(``dataset[i]``, ``len(dataset)``), a ``StreamDataset`` is iterated.

Example::

    >>> import numpy as np
    >>> from gradcore.data import ArrayDataset
    >>> ds = ArrayDataset(np.zeros((10, 3), np.float32), np.arange(10))
    >>> len(ds), ds[2][1]
    (10, 2)
"""
from __future__ import annotations

import bisect
import itertools
import numbers
from abc import ABC, abstractmethod
from typing import Any, Iterable, Iterator, List, Tuple

from ..op import ArgumentError

__all__ = ["Dataset", "MapDataset", "StreamDataset", "ArrayDataset", "ConcatDataset"]


class Dataset(ABC):
    """The base of every dataset. Subclass ``MapDataset`` (random access)
    or ``StreamDataset`` (iteration only), not this class.

    Example::

        >>> from gradcore.data import ArrayDataset, Dataset
        >>> isinstance(ArrayDataset(np.arange(3)), Dataset)
        True
    """

    @abstractmethod
    def __init__(self) -> None:
        pass


class MapDataset(Dataset):
    """A dataset read by index: define ``__getitem__(index)`` (one sample,
    usually a tuple of arrays) and ``__len__``. Samplers draw indices from
    ``range(len(dataset))``.

    Example::

        >>> from gradcore.data import MapDataset
        >>> class Squares(MapDataset):
        ...     def __init__(self, n): self.n = n
        ...     def __getitem__(self, i): return (np.float32(i * i),)
        ...     def __len__(self): return self.n
        >>> len(Squares(4)), float(Squares(4)[3][0])
        (4, 9.0)
    """

    @abstractmethod
    def __init__(self) -> None:
        pass

    @abstractmethod
    def __getitem__(self, index: int) -> Any:
        pass

    @abstractmethod
    def __len__(self) -> int:
        pass


class StreamDataset(Dataset):
    """A dataset read in order: define ``__iter__`` (yielding samples). It
    has no length and cannot be shuffled; ``DataLoader`` groups its samples
    into batches with a ``StreamSampler``.

    Example::

        >>> from gradcore.data import StreamDataset
        >>> class Counter(StreamDataset):
        ...     def __init__(self, n): self.n = n
        ...     def __iter__(self): return ((np.float32(i),) for i in range(self.n))
        >>> [float(x) for x, in Counter(3)]
        [0.0, 1.0, 2.0]
    """

    @abstractmethod
    def __init__(self) -> None:
        pass

    @abstractmethod
    def __iter__(self) -> Iterator[Any]:
        pass


class ArrayDataset(MapDataset):
    """A dataset over one or more arrays of the same length: sample ``i`` is
    the tuple ``(arrays[0][i], arrays[1][i], ...)``.

    Example::

        >>> from gradcore.data import ArrayDataset
        >>> ds = ArrayDataset(np.ones((5, 2)), np.arange(5))
        >>> x, y = ds[4]
        >>> x.shape, int(y)
        ((2,), 4)
    """

    def __init__(self, *arrays: Any) -> None:
        super().__init__()
        if not arrays:
            raise ValueError("ArrayDataset: give at least one array")
        try:
            lengths = [len(a) for a in arrays]
        except TypeError:
            bad = next(a for a in arrays if not hasattr(a, "__len__"))
            raise TypeError(f"ArrayDataset: each argument must be an array or sequence with a length, "
                            f"got {type(bad).__name__}") from None
        if any(n != lengths[0] for n in lengths):
            raise ValueError(f"ArrayDataset: the arrays' lengths differ: {lengths}")
        self.arrays = arrays

    def __getitem__(self, index: int) -> Tuple:
        return tuple(array[index] for array in self.arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])


class ConcatDataset(MapDataset):
    """Several map-style datasets one after another: indices ``0 ..
    len(datasets[0]) - 1`` read the first, the next ones the second, and so
    on; negative indices count from the end.

    Example::

        >>> from gradcore.data import ConcatDataset, ArrayDataset
        >>> ds = ConcatDataset([ArrayDataset(np.arange(3)), ArrayDataset(np.arange(10, 15))])
        >>> len(ds), int(ds[3][0]), int(ds[-1][0])
        (8, 10, 14)
    """

    def __init__(self, datasets: Iterable[Any]) -> None:
        super().__init__()
        self.datasets = list(datasets)
        if not self.datasets:
            raise ArgumentError("ConcatDataset: datasets must not be empty")
        for i, d in enumerate(self.datasets):
            if isinstance(d, StreamDataset) or not (hasattr(d, "__len__") and hasattr(d, "__getitem__")):
                raise ArgumentError(f"ConcatDataset: datasets[{i}] is a {type(d).__name__}, not a map-style "
                                    f"dataset (StreamDatasets cannot be indexed)")
        # where each dataset ends, to find an index's dataset by bisection
        self.cumulative_sizes: List[int] = list(itertools.accumulate(len(d) for d in self.datasets))

    def __getitem__(self, index: int) -> Any:
        if not isinstance(index, numbers.Integral):
            raise TypeError(f"ConcatDataset: indices must be integers, got {type(index).__name__}")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"ConcatDataset: index {index} is out of range for {n} samples")
        index = int(index) + n if index < 0 else int(index)
        k = bisect.bisect_right(self.cumulative_sizes, index)
        return self.datasets[k][index - (self.cumulative_sizes[k - 1] if k else 0)]

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]
