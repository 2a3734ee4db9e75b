"""Samplers, after ``megengine.data.sampler``: a sampler yields the indices
of one batch at a time (it carries ``batch_size`` and ``drop_last``), and
shards the data by rank for data-parallel training
(``gradcore.distributed``).

Every sampler's state (its random generator) is saved by ``state_dict()``
and restored by ``load_state_dict()``, plain dicts of ints and arrays that
``gradcore.save`` writes; ``DataLoader.state_dict`` uses them to resume in
the middle of an epoch.

Example::

    >>> import numpy as np
    >>> from gradcore.data import ArrayDataset, SequentialSampler, RandomSampler
    >>> ds = ArrayDataset(np.arange(5))
    >>> list(SequentialSampler(ds, batch_size=2))
    [[0, 1], [2, 3], [4]]
    >>> list(RandomSampler(ds, batch_size=2, drop_last=True, seed=0))
    [[2, 0], [1, 3]]
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np

__all__ = ["Sampler", "MapSampler", "SequentialSampler", "RandomSampler", "ReplacementSampler",
           "StreamSampler", "Infinite"]


def _check_positive_int(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")


def _world(owner: str, world_size: Optional[int], rank: Optional[int]):
    """(world_size, rank): the given ones, else gradcore.distributed's when
    this process is one of several ranks, else (1, 0)."""
    if world_size is None or rank is None:
        from .. import distributed as dist
        on = dist.is_distributed()
        if world_size is None:
            world_size = dist.get_world_size() if on else 1
        if rank is None:
            rank = dist.get_rank() if on else 0
    _check_positive_int(owner, "world_size", world_size)
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
        raise ValueError(f"{owner}: rank must be an integer in [0, {world_size}), got {rank!r}")
    return int(world_size), int(rank)


class Sampler:
    """The base of the samplers: iterate it for lists of indices, one list
    per batch. Subclasses define ``__iter__`` and ``__len__``.

    Example::

        >>> from gradcore.data import Sampler
        >>> class Evens(Sampler):
        ...     def __iter__(self): return iter([[0, 2], [4]])
        ...     def __len__(self): return 2
        >>> list(Evens())
        [[0, 2], [4]]
    """

    def __iter__(self) -> Iterator[List[int]]:
        raise NotImplementedError(f"{type(self).__name__}.__iter__ is not defined")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__}.__len__ is not defined")

    def state_dict(self) -> Dict[str, Any]:
        """What ``load_state_dict`` needs to repeat the batches that follow
        (a sampler without random state saves nothing).

        Example::

            >>> SequentialSampler(ArrayDataset(np.arange(3))).state_dict()
            {}
        """
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved.

        Example::

            >>> s = SequentialSampler(ArrayDataset(np.arange(3)))
            >>> s.load_state_dict(s.state_dict())
        """
        if not isinstance(state, dict):
            raise TypeError(f"{type(self).__name__}.load_state_dict: expected a dict, "
                            f"got {type(state).__name__}")


class MapSampler(Sampler):
    """A sampler over a map dataset (``len(dataset)`` samples), as
    MegEngine's ``MapSampler``: ``sample()`` gives the order of all indices
    for one epoch; the indices are then sharded (each of ``world_size``
    ranks takes every ``world_size``-th index, starting at ``rank``, after
    the list was padded by wrapping around so that every rank gets
    ``ceil(n / world_size)``), and cut into batches of ``batch_size`` (the
    last one smaller, or dropped with ``drop_last``).

    ``world_size`` and ``rank`` default to ``gradcore.distributed``'s when
    the process is one of several MPI ranks. ``seed`` seeds the sampler's
    own generator (NumPy's ``RandomState``, as MegEngine's, so a seed gives
    MegEngine's order); without one it is drawn from ``gradcore.random``
    (so ``gradcore.random.seed`` makes it repeatable), except that several
    ranks use 0 so that they agree.

    Example::

        >>> from gradcore.data import SequentialSampler, ArrayDataset
        >>> s = SequentialSampler(ArrayDataset(np.arange(5)), batch_size=2, world_size=2, rank=1)
        >>> list(s)        # rank 1 of 2: indices 1, 3 and 0 (wrapped around)
        [[1, 3], [0]]
    """

    def __init__(self, dataset: Any, batch_size: int = 1, drop_last: bool = False,
                 num_samples: Optional[int] = None, world_size: Optional[int] = None,
                 rank: Optional[int] = None, seed: Optional[int] = None):
        name = type(self).__name__
        _check_positive_int(name, "batch_size", batch_size)
        if not isinstance(drop_last, bool):
            raise ValueError(f"{name}: drop_last must be True or False, got {drop_last!r}")
        if num_samples is not None:
            _check_positive_int(name, "num_samples", num_samples)
        try:
            n = len(dataset)
        except TypeError:
            raise TypeError(f"{name}: the dataset must have a length (a MapDataset), got "
                            f"{type(dataset).__name__}; a StreamDataset takes a StreamSampler") from None
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.drop_last = drop_last
        self.world_size, self.rank = _world(name, world_size, rank)
        self.num_samples = int(math.ceil((n if num_samples is None else num_samples) / self.world_size))
        if self.num_samples < self.batch_size:
            # (MegEngine's check: not even one full batch per rank)
            raise ValueError(f"{name}: num_samples should be greater than batch_size, but got "
                             f"num_samples={self.num_samples} (per rank) and batch_size={self.batch_size}")
        if seed is None:
            if self.world_size > 1:
                seed = 0              # every rank must draw the same order
            else:
                from .. import random as _random
                seed = int(_random.generator().integers(2 ** 32))
        elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 32:
            raise ValueError(f"{name}: seed must be an integer in [0, 2**32), got {seed!r}")
        self.seed = int(seed)
        self.rng = np.random.RandomState(self.seed)

    def sample(self) -> List[int]:
        """All indices of one epoch, in order (before sharding).

        Example::

            >>> SequentialSampler(ArrayDataset(np.arange(3))).sample()
            [0, 1, 2]
        """
        raise NotImplementedError(f"{type(self).__name__}.sample is not defined")

    def scatter(self, indices: List[int]) -> List[int]:
        """This rank's share of ``indices``: padded by wrapping to
        ``num_samples * world_size``, then every ``world_size``-th from
        ``rank``.

        Example::

            >>> SequentialSampler(ArrayDataset(np.arange(5)), world_size=2, rank=0).scatter([0, 1, 2, 3, 4])
            [0, 2, 4]
        """
        total = self.num_samples * self.world_size
        if not indices:
            return []
        indices = (indices * -(-total // len(indices)))[:total]
        return indices[self.rank::self.world_size]

    def batch(self) -> Iterator[List[int]]:
        """The batches of one epoch (lists of indices).

        Example::

            >>> list(SequentialSampler(ArrayDataset(np.arange(3)), batch_size=2).batch())
            [[0, 1], [2]]
        """
        indices = [int(i) for i in self.sample()]
        if self.world_size > 1:
            indices = self.scatter(indices)
        step = self.batch_size
        batches = [indices[i:i + step] for i in range(0, len(indices), step)]
        if self.drop_last and batches and len(batches[-1]) < step:
            batches.pop()
        return iter(batches)

    def __iter__(self) -> Iterator[List[int]]:
        return self.batch()

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return int(math.ceil(self.num_samples / self.batch_size))

    def state_dict(self) -> Dict[str, Any]:
        """The generator's state, ``{"rng": ...}`` (NumPy ``RandomState``
        state as a dict of ints and a uint32 array).

        Example::

            >>> s = RandomSampler(ArrayDataset(np.arange(4)), seed=1)
            >>> sorted(s.state_dict())
            ['rng']
        """
        return {"rng": self.rng.get_state(legacy=False)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the generator's state saved by ``state_dict``: the next
        epoch's order is the one the saved sampler would have drawn.

        Example::

            >>> s = RandomSampler(ArrayDataset(np.arange(4)), seed=1)
            >>> saved = s.state_dict()
            >>> first = list(s)
            >>> s.load_state_dict(saved)
            >>> list(s) == first
            True
        """
        super().load_state_dict(state)
        if "rng" not in state:
            raise KeyError(f"{type(self).__name__}.load_state_dict: key 'rng' is missing "
                           f"(got keys {sorted(state)})")
        try:
            self.rng.set_state(state["rng"])
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"{type(self).__name__}.load_state_dict: 'rng' is not a NumPy "
                             f"RandomState state: {exc}") from None


class _IndexedSampler(MapSampler):
    """A map sampler over ``range(len(dataset))`` or the given ``indices``."""

    def __init__(self, dataset: Any, batch_size: int, drop_last: bool, indices: Optional[Sequence[int]],
                 world_size: Optional[int], rank: Optional[int], seed: Optional[int]):
        if indices is not None and not isinstance(indices, (Sequence, np.ndarray)):
            raise ValueError(f"{type(self).__name__}: indices must be None or a sequence, "
                             f"got {type(indices).__name__}")
        super().__init__(dataset, batch_size, drop_last, None if indices is None else len(indices),
                         world_size, rank, seed)
        self.indices = indices


class SequentialSampler(_IndexedSampler):
    """The indices in order (``range(len(dataset))``, or ``indices``), cut
    into batches.

    Example::

        >>> from gradcore.data import SequentialSampler, ArrayDataset
        >>> list(SequentialSampler(ArrayDataset(np.arange(5)), batch_size=2, drop_last=True))
        [[0, 1], [2, 3]]
    """

    def __init__(self, dataset: Any, batch_size: int = 1, drop_last: bool = False,
                 indices: Optional[Sequence[int]] = None, world_size: Optional[int] = None,
                 rank: Optional[int] = None):
        # no random state; seed 0 so that building one draws nothing from gradcore.random
        super().__init__(dataset, batch_size, drop_last, indices, world_size, rank, seed=0)

    def sample(self) -> List[int]:
        return list(range(len(self.dataset))) if self.indices is None else list(self.indices)

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        Sampler.load_state_dict(self, state)


class RandomSampler(_IndexedSampler):
    """The indices in a new random order every epoch (without
    replacement), cut into batches. With the same ``seed`` the order is
    MegEngine's (``RandomState(seed).permutation``).

    Example::

        >>> from gradcore.data import RandomSampler, ArrayDataset
        >>> s = RandomSampler(ArrayDataset(np.arange(6)), batch_size=3, seed=0)
        >>> list(s), list(s)      # a new order each epoch
        ([[5, 2, 1], [3, 0, 4]], [[1, 3, 4], [0, 2, 5]])
    """

    def __init__(self, dataset: Any, batch_size: int = 1, drop_last: bool = False,
                 indices: Optional[Sequence[int]] = None, world_size: Optional[int] = None,
                 rank: Optional[int] = None, seed: Optional[int] = None):
        super().__init__(dataset, batch_size, drop_last, indices, world_size, rank, seed)

    def sample(self) -> List[int]:
        return self.rng.permutation(len(self.dataset) if self.indices is None else np.asarray(self.indices)).tolist()


class ReplacementSampler(MapSampler):
    """``num_samples`` indices drawn with replacement, uniformly or in
    proportion to ``weights`` (one per sample, need not sum to 1).

    Example::

        >>> from gradcore.data import ReplacementSampler, ArrayDataset
        >>> s = ReplacementSampler(ArrayDataset(np.arange(3)), batch_size=2, num_samples=4,
        ...                        weights=[0, 0, 1], seed=0)
        >>> list(s)
        [[2, 2], [2, 2]]
    """

    def __init__(self, dataset: Any, batch_size: int = 1, drop_last: bool = False,
                 num_samples: Optional[int] = None, weights: Optional[Sequence[float]] = None,
                 world_size: Optional[int] = None, rank: Optional[int] = None,
                 seed: Optional[int] = None):
        super().__init__(dataset, batch_size, drop_last, num_samples, world_size, rank, seed)
        if weights is not None:
            w = np.asarray(weights, dtype=np.float64)
            if w.shape != (len(dataset),):
                raise ValueError(f"ReplacementSampler: weights must have one value per sample "
                                 f"({len(dataset)}), got shape {w.shape}")
            if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
                raise ValueError("ReplacementSampler: weights must be finite, non-negative and not all 0")
            weights = w / w.sum()
        self.weights = weights

    def sample(self) -> List[int]:
        n = len(self.dataset)
        # every rank draws the whole list and keeps its share: the same
        # generator on every rank gives disjoint shares
        size = self.num_samples * self.world_size
        if self.weights is None:
            return self.rng.randint(n, size=size).tolist()
        return self.rng.choice(n, size=size, p=self.weights).tolist()


class StreamSampler(Sampler):
    """Batches for a ``StreamDataset``, MegEngine's: the stream's positions
    counted from 0 in batches of ``batch_size`` ([0, 1, 2], [3, 4, 5], ...).
    With ``world_size`` ranks each batch spans ``batch_size * world_size``
    consecutive samples, of which this rank keeps those at ``rank, rank +
    world_size, ...``; ``DataLoader`` reads the stream.

    Example::

        >>> from gradcore.data import StreamSampler
        >>> it = iter(StreamSampler(batch_size=2, world_size=2, rank=1))
        >>> next(it), next(it)
        ([1, 3], [5, 7])
    """

    def __init__(self, batch_size: int = 1, world_size: Optional[int] = None, rank: Optional[int] = None):
        _check_positive_int("StreamSampler", "batch_size", batch_size)
        self.batch_size = int(batch_size)
        self.world_size, self.rank = _world("StreamSampler", world_size, rank)

    def __iter__(self) -> Iterator[List[int]]:
        span = self.batch_size * self.world_size
        for start in itertools.count(0, span):
            yield list(range(start + self.rank, start + span, self.world_size))

    def __len__(self) -> int:
        raise TypeError("StreamSampler: a stream has no length")


class Infinite(Sampler):
    """Repeats ``sampler`` for ever: when an epoch ends the next one starts
    (a ``RandomSampler`` reshuffles). ``len()`` is the largest int64.

    Example::

        >>> from gradcore.data import Infinite, SequentialSampler, ArrayDataset
        >>> it = iter(Infinite(SequentialSampler(ArrayDataset(np.arange(3)), batch_size=2)))
        >>> [next(it) for _ in range(3)]
        [[0, 1], [2], [0, 1]]
    """

    def __init__(self, sampler: MapSampler):
        if not isinstance(sampler, Sampler) or isinstance(sampler, (Infinite, StreamSampler)):
            raise TypeError(f"Infinite: expected a map sampler (SequentialSampler, RandomSampler, ...), "
                            f"got {type(sampler).__name__}")
        self.sampler = sampler
        self.batch_size = getattr(sampler, "batch_size", None)
        self.dataset = getattr(sampler, "dataset", None)
        self._iter: Optional[Iterator[List[int]]] = None
        self._pass_state: Optional[Dict[str, Any]] = None    # the inner sampler's state when this pass began
        self._position = 0                                   # batches yielded in this pass
        self._skip = 0                                       # batches to pass over after a load

    def _new_pass(self) -> None:
        self._pass_state = self.sampler.state_dict()
        self._iter = iter(self.sampler)
        self._position = 0

    def __iter__(self) -> "Infinite":
        return self

    def __next__(self) -> List[int]:
        if self._iter is None:
            self._new_pass()
        while True:
            try:
                indices = next(self._iter)
            except StopIteration:
                if self._position == 0 and self._skip == 0:
                    raise RuntimeError("Infinite: the wrapped sampler yields no batch") from None
                self._new_pass()
                continue
            self._position += 1
            if self._skip:
                self._skip -= 1
                continue
            return indices

    def __len__(self) -> int:
        return int(np.iinfo(np.int64).max)

    def state_dict(self) -> Dict[str, Any]:
        """The wrapped sampler's state when the current pass began, and how
        many batches of the pass were drawn.

        Example::

            >>> inf = Infinite(SequentialSampler(ArrayDataset(np.arange(3))))
            >>> inf.state_dict()
            {'sampler': {}, 'position': 0}
        """
        if self._iter is None:
            return {"sampler": self.sampler.state_dict(), "position": self._skip}
        return {"sampler": self._pass_state, "position": self._position}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from a saved ``state_dict``: the next batch is the one
        that followed when it was saved.

        Example::

            >>> inf = Infinite(SequentialSampler(ArrayDataset(np.arange(3))))
            >>> inf.load_state_dict({"sampler": {}, "position": 2})
            >>> next(inf)
            [2]
        """
        super().load_state_dict(state)
        for key in ("sampler", "position"):
            if key not in state:
                raise KeyError(f"Infinite.load_state_dict: key {key!r} is missing (got keys {sorted(state)})")
        self.sampler.load_state_dict(state["sampler"])
        self._iter, self._pass_state, self._position = None, None, 0
        self._skip = int(state["position"])
