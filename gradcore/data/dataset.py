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

from abc import ABC, abstractmethod
from typing import Any, Iterator, Tuple

__all__ = ["Dataset", "MapDataset", "StreamDataset", "ArrayDataset"]


class Dataset(ABC):
    """The base of every dataset. Subclass ``MapDataset`` (random access)
    or ``StreamDataset`` (iteration only), not this class.

    Example::

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

        >>> class Squares(MapDataset):
        ...     def __init__(self, n): self.n = n
        ...     def __getitem__(self, i): return (np.float32(i * i),)
        ...     def __len__(self): return self.n
        >>> Squares(4)[3]
        (9.0,)
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

        >>> class Counter(StreamDataset):
        ...     def __init__(self, n): self.n = n
        ...     def __iter__(self): return ((np.float32(i),) for i in range(self.n))
        >>> list(Counter(2))
        [(0.0,), (1.0,)]
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

        >>> ds = ArrayDataset(np.ones((5, 2)), np.arange(5))
        >>> x, y = ds[4]
        >>> x.shape, int(y)
        ((2,), 4)
    """

    def __init__(self, *arrays: Any) -> None:
        super().__init__()
        if not arrays:
            raise ValueError("ArrayDataset: give at least one array")
        lengths = [len(a) for a in arrays]
        if any(n != lengths[0] for n in lengths):
            raise ValueError(f"ArrayDataset: the arrays' lengths differ: {lengths}")
        self.arrays = arrays

    def __getitem__(self, index: int) -> Tuple:
        return tuple(array[index] for array in self.arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])
