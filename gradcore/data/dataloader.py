"""``DataLoader``, after ``megengine.data.DataLoader``: batches of a dataset,
loaded in the main process or in worker processes.

With ``num_workers > 0`` each iteration (epoch) starts that many worker
processes, as MegEngine's ``DataLoader`` does: each epoch's workers see the
dataset, transform and collator as they are when it starts. With
``persistent_workers=True`` they are started once and kept for the next
epochs while the loader lives (as in PyTorch): an epoch then costs no
process start-up (forking, the first batch's wait, the copy-on-write of the
parent's memory that the forked workers share), but changes to the dataset
or transform after the first epoch do not reach them.

The parent hands out batches (lists of indices) round-robin, keeping
``prefetch_factor`` batches per worker in flight; a worker reads the
samples, transforms and collates them and writes the arrays into one of its
shared-memory slots, which it reuses (see ``gradcore.data._shm``); the pipe
carries a message of some 30 bytes. The parent yields the batches in the
sampler's order, whatever order they finish in, as views of its mapping of
the slot, without a copy: a slot is written again only after every array of
its batch is gone (keeping batches is allowed and only costs their memory).
Workers are stopped when the epoch ends (unless persistent), when the loop
is left (``break``, an exception, the iterator dropped), when the loader is
dropped, and at exit.

Random transforms draw from ``gradcore.data.transform.rng()``, reseeded
before every batch from ``(seed, epoch, batch position)``: the batches do
not depend on the number of workers, and ``state_dict()`` /
``load_state_dict()`` resume a loader in the middle of an epoch with
exactly the batches an uninterrupted run would have seen.

Example::

    >>> import numpy as np
    >>> from gradcore.data import ArrayDataset, RandomSampler, DataLoader
    >>> ds = ArrayDataset(np.arange(10, dtype=np.float32).reshape(10, 1), np.arange(10))
    >>> loader = DataLoader(ds, RandomSampler(ds, batch_size=4, seed=0), num_workers=2)
    >>> [y.tolist() for x, y in loader]
    [[2, 8, 4, 9], [1, 6, 7, 3], [0, 5]]
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import random as _pyrandom
import select
import signal
import sys
import time
import traceback
import uuid
import weakref
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from ..cpu import blas as _blas
from . import _shm
from . import transform as _transform
from .collator import Collator
from .dataset import ArrayDataset, StreamDataset
from .sampler import MapSampler, Sampler, SequentialSampler, StreamSampler
from .transform import PseudoTransform, Transform

__all__ = ["DataLoader"]

# how often a waiting parent looks at its workers (and a worker at its parent)
_POLL_S = 1.0
# how long stopping waits for workers to leave on their own before killing them
_JOIN_S = 2.0
_STOP = pickle.dumps(None)      # the task that tells a worker to leave


class DataLoader:
    """Iterate over ``dataset`` in batches.

    - ``sampler`` gives the indices of each batch and carries the batch
      size (default: ``SequentialSampler(dataset, batch_size=1)``; a
      ``StreamDataset`` takes a ``StreamSampler``);
    - ``transform`` (a ``gradcore.data.transform.Transform``) is applied to
      the samples of a batch, ``collator`` merges them (default
      ``Collator``: arrays stacked, tuples give lists);
    - ``num_workers`` worker processes load batches ahead (0: in this
      process); ``timeout`` (seconds, 0 for none) is how long to wait for
      a batch before reporting the worker as hung;
    - ``seed`` seeds the random transforms (default: drawn from
      ``gradcore.random``); ``prefetch_factor`` batches per worker are
      in flight; ``multiprocessing_context`` picks the start method
      (default ``"fork"`` where there is one, which needs nothing
      pickled; with ``"spawn"`` the dataset and transforms must pickle);
      ``persistent_workers`` keeps the workers from one epoch to the next
      (saves their start-up each epoch; a loop left early still stops
      them). It is off by default, as workers are started per epoch in
      MegEngine (and PyTorch): the workers of each epoch see the loader's
      dataset and transforms as they are then. Turn it on for speed when
      they do not change between epochs; ``preload`` (MegEngine's) gives
      the batches' arrays as gradcore Tensors (the next batch converted
      while the current one is used). A ``StreamDataset`` is read in this
      process, its samples shared out among the workers, or with
      ``parallel_stream`` (MegEngine's) by each worker itself, each epoch
      from the start (a stream shards itself by ``get_worker_info()``;
      the epoch ends when a worker's stream does); with a ``timeout`` the
      reading in this process runs in a thread, so that a stream that
      blocks is reported after ``timeout`` as well.

    Batches come out as NumPy arrays (as MegEngine's); with workers, they
    are views of shared memory that the workers write again only once the
    batch's arrays are all gone. Workers run NumPy's BLAS on one thread
    (``gradcore.cpu.blas.single_threaded``), as PyTorch's do. An error in
    a worker is raised here with the worker's traceback.

    Example::

        >>> from gradcore.data import ArrayDataset, DataLoader, SequentialSampler
        >>> ds = ArrayDataset(np.zeros((5, 2), np.float32), np.arange(5))
        >>> for x, y in DataLoader(ds, SequentialSampler(ds, batch_size=2)):
        ...     print(x.shape, y)
        (2, 2) [0 1]
        (2, 2) [2 3]
        (1, 2) [4]
    """

    def __init__(self, dataset: Any, sampler: Optional[Sampler] = None, transform: Optional[Transform] = None,
                 collator: Optional[Collator] = None, num_workers: int = 0, timeout: float = 0,
                 preload: bool = False, parallel_stream: bool = False, *,
                 seed: Optional[int] = None, prefetch_factor: int = 2,
                 multiprocessing_context: Optional[str] = None, persistent_workers: bool = False):
        self._stream = isinstance(dataset, StreamDataset)
        if not self._stream and not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError(f"DataLoader: dataset must be a MapDataset (with __getitem__ and __len__) "
                            f"or a StreamDataset, got {type(dataset).__name__}")
        if sampler is None:
            sampler = StreamSampler(batch_size=1) if self._stream else SequentialSampler(dataset, batch_size=1)
        if not isinstance(sampler, Sampler):
            raise TypeError(f"DataLoader: sampler must be a gradcore.data Sampler, got {type(sampler).__name__}")
        if self._stream and not isinstance(sampler, StreamSampler):
            raise ValueError(f"DataLoader: a StreamDataset needs a StreamSampler, got {type(sampler).__name__}")
        if not self._stream and isinstance(sampler, StreamSampler):
            raise ValueError("DataLoader: a StreamSampler is for a StreamDataset; "
                             f"{type(dataset).__name__} takes SequentialSampler, RandomSampler, ...")
        transform = PseudoTransform() if transform is None else transform
        if not hasattr(transform, "apply_batch"):
            raise TypeError(f"DataLoader: transform must have apply_batch (a Transform), "
                            f"got {type(transform).__name__}")
        collator = Collator() if collator is None else collator
        if not hasattr(collator, "apply"):
            raise TypeError(f"DataLoader: collator must have apply (a Collator), got {type(collator).__name__}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
            raise ValueError(f"DataLoader: num_workers must be an integer >= 0, got {num_workers!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise ValueError(f"DataLoader: timeout must be a number of seconds >= 0, got {timeout!r}")
        if isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int) or prefetch_factor < 1:
            raise ValueError(f"DataLoader: prefetch_factor must be an integer >= 1, got {prefetch_factor!r}")
        if num_workers > 0 and not _shm.available():
            raise RuntimeError("DataLoader: worker processes need POSIX shared memory, which this "
                               "platform lacks; use num_workers=0")
        if multiprocessing_context is None:
            multiprocessing_context = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        elif multiprocessing_context not in multiprocessing.get_all_start_methods():
            raise ValueError(f"DataLoader: multiprocessing_context must be one of "
                             f"{multiprocessing.get_all_start_methods()}, got {multiprocessing_context!r}")
        if seed is None:
            from .. import random as _random
            seed = int(_random.generator().integers(2 ** 63))
        self.dataset = dataset
        self.sampler = sampler
        self.transform = transform
        self.collator = collator
        self.num_workers = int(num_workers)
        self.timeout = timeout
        self.seed = int(seed)
        self.prefetch_factor = prefetch_factor
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = bool(persistent_workers)
        self.preload, self.parallel_stream = bool(preload), bool(parallel_stream)
        self._pool: Optional[_Workers] = None      # persistent workers between epochs
        self._epoch = 0             # the epoch the next iteration is
        self._skip = 0              # batches of that epoch already consumed (after a load)
        self._current: Optional[weakref.ref] = None

    def __len__(self) -> int:
        if self._stream:
            raise TypeError("DataLoader: a StreamDataset has no length")
        return len(self.sampler)

    def __iter__(self) -> "_BaseIter":
        previous = self._current() if self._current is not None else None
        if previous is not None and self.persistent_workers and not previous._finished:
            previous._shutdown()        # its workers cannot serve two epochs at once
        epoch, skip = self._epoch, self._skip
        self._epoch, self._skip = epoch + 1, 0
        sampler_state = None if self._stream else self.sampler.state_dict()
        cls = _ParallelIter if self.num_workers > 0 else _SerialIter
        it = cls(self, epoch, skip, sampler_state)
        self._current = weakref.ref(it)
        return _Preloaded(it) if self.preload else it

    # ------------------------------------------------------------ resuming
    def state_dict(self) -> Dict[str, Any]:
        """Where the loader is: its seed, the epoch, how many batches of it
        were consumed, and the sampler's state at the epoch's start (plain
        ints, dicts and arrays, for ``gradcore.save``). Taken in the middle
        of an epoch, a loader that loads it yields the rest of that epoch.

        Example::

            >>> loader = DataLoader(ds, RandomSampler(ds, batch_size=2, seed=0))
            >>> it = iter(loader); first = next(it)
            >>> state = loader.state_dict()
            >>> state["epoch"], state["consumed"]
            (0, 1)
        """
        if self._stream:
            raise TypeError("DataLoader.state_dict: a StreamDataset cannot be rewound, so its "
                            "loader has no state to resume from")
        it = self._current() if self._current is not None else None
        if it is not None and not it._finished:
            return {"seed": self.seed, "epoch": it.epoch, "consumed": it.position,
                    "sampler": it.sampler_state}
        return {"seed": self.seed, "epoch": self._epoch, "consumed": self._skip,
                "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state_dict()``: the next iteration yields the
        batches that followed when it was taken.

        Example::

            >>> loader2 = DataLoader(ds, RandomSampler(ds, batch_size=2, seed=5))
            >>> loader2.load_state_dict(state)
            >>> rest = list(loader2)          # the epoch's other batches
        """
        if self._stream:
            raise TypeError("DataLoader.load_state_dict: a StreamDataset cannot be rewound")
        if not isinstance(state, dict):
            raise TypeError(f"DataLoader.load_state_dict: expected a dict, got {type(state).__name__}")
        missing = [k for k in ("seed", "epoch", "consumed", "sampler") if k not in state]
        if missing:
            raise KeyError(f"DataLoader.load_state_dict: missing keys {missing} (got {sorted(state)})")
        self.sampler.load_state_dict(state["sampler"])
        self.seed, self._epoch, self._skip = int(state["seed"]), int(state["epoch"]), int(state["consumed"])
        self._current = None


# ---------------------------------------------------------------- loading one batch

class WorkerInfo:
    """Which worker process this is, MegEngine's ``WorkerInfo``: ``idx``
    (0 .. worker - 1), ``worker`` (how many), ``seed`` (the loader's).
    Read-only.

    Example::

        >>> from gradcore.data import WorkerInfo
        >>> info = WorkerInfo(idx=1, worker=4, seed=7)
        >>> list(range(10))[info.idx::info.worker]
        [1, 5, 9]
    """

    __slots__ = ("idx", "worker", "seed")

    def __init__(self, idx: int, worker: int, seed: int):
        object.__setattr__(self, "idx", idx)
        object.__setattr__(self, "worker", worker)
        object.__setattr__(self, "seed", seed)

    def __setattr__(self, key, value):
        raise RuntimeError(f"Cannot assign attributes to {type(self).__name__} objects")

    def __repr__(self):
        return f"WorkerInfo(idx={self.idx}, worker={self.worker}, seed={self.seed})"


_worker_info: Optional[WorkerInfo] = None


def get_worker_info() -> Optional[WorkerInfo]:
    """In a DataLoader worker process, its ``WorkerInfo``; None elsewhere
    (MegEngine's ``get_worker_info``): a ``StreamDataset`` read with
    ``parallel_stream=True`` shards itself by ``idx`` and ``worker``.

    Example::

        >>> from gradcore.data import get_worker_info
        >>> data = list(range(6))
        >>> info = get_worker_info()          # None outside a DataLoader worker
        >>> data[info.idx::info.worker] if info is not None else data
        [0, 1, 2, 3, 4, 5]
    """
    return _worker_info


class _StreamEnd(Exception):
    """A worker's own stream (``parallel_stream``) has no more samples."""


def _seed_batch(seed: int, epoch: int, position: int, in_worker: bool) -> None:
    # rng()'s generator is made from (seed, epoch, position) when a
    # transform first asks for it
    _transform.seed((seed, epoch, position))
    if in_worker:
        # transforms written for MegEngine draw from NumPy's and Python's
        # global generators; in a worker those belong to the loader. (In the
        # main process they are the user's and are left alone.) Their seed
        # is a mix of the three numbers (splitmix64's finaliser): a
        # SeedSequence for it cost 8 us a batch
        s = _mix64(_mix64(_mix64(seed) ^ epoch) ^ position) >> 32
        np.random.seed(s)
        _pyrandom.seed(s)


def _mix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def _is_plain_arrays(loader: DataLoader) -> bool:
    """An ArrayDataset of numeric NumPy arrays with no transform and the
    default collator: a batch is one fancy index per array, which gives
    what stacking the samples would (same values, dtypes and layout)."""
    ds = loader.dataset
    return (type(ds) is ArrayDataset and type(loader.transform) is PseudoTransform
            and type(loader.collator) is Collator
            and all(type(a) is np.ndarray and a.ndim >= 1 and a.dtype.kind in "biufc" for a in ds.arrays))


class _Job:
    """What loading a batch needs, and nothing else: a worker gets this
    (pickled under "spawn"), not the loader with its sampler and iterators."""

    __slots__ = ("dataset", "transform", "collator", "stream", "plain", "gather", "own_stream", "_own")

    def __init__(self, loader: DataLoader):
        self.dataset, self.transform, self.collator = loader.dataset, loader.transform, loader.collator
        self.stream = loader._stream
        # each worker iterates the stream itself (MegEngine's parallel_stream)
        self.own_stream = loader._stream and loader.parallel_stream and loader.num_workers > 0
        self._own = None            # (epoch, this worker's iterator of the stream)
        self.plain = _is_plain_arrays(loader)
        # an ArrayDataset's samples: one fancy index per array, then rows
        # (the values of dataset[i], at a third of the cost; rows of a copy,
        # so a transform that writes into its samples never writes into the
        # dataset, in this process or in a persistent worker's)
        ds = loader.dataset
        self.gather = (type(ds) is ArrayDataset
                       and all(type(a) is np.ndarray and a.ndim >= 1 for a in ds.arrays))

    def __getstate__(self):
        return {k: getattr(self, k) for k in self.__slots__ if k != "_own"}

    def __setstate__(self, state):
        self._own = None
        for k, v in state.items():
            setattr(self, k, v)

    def load(self, seed: int, epoch: int, position: int, payload: List, in_worker: bool) -> Any:
        """The batch at ``position`` of ``epoch``: ``payload`` is its
        indices (map dataset) or its samples (stream)."""
        _seed_batch(seed, epoch, position, in_worker)
        if self.own_stream:
            # payload: how many samples; from this worker's own iterator of
            # the stream, made anew each epoch
            if self._own is None or self._own[0] != epoch:
                self._own = (epoch, iter(self.dataset))
            samples = list(itertools.islice(self._own[1], payload))
            if not samples:
                raise _StreamEnd
        elif self.stream:
            samples = payload
        elif self.plain:
            idx = np.asarray(payload, dtype=np.int64)
            return [a[idx] for a in self.dataset.arrays]
        elif self.gather:
            idx = np.asarray(payload, dtype=np.int64)
            samples = list(zip(*[a[idx] for a in self.dataset.arrays]))
        else:
            samples = [self.dataset[i] for i in payload]
        return self.collator.apply(self.transform.apply_batch(samples))


# ---------------------------------------------------------------- iterators

def _tasks(loader: DataLoader, skip: int) -> Iterator[List]:
    """The payload of every batch after the first ``skip``."""
    if not loader._stream:
        batches = iter(loader.sampler)
        for _ in range(skip):
            if next(batches, None) is None:
                break
        yield from batches
        return
    if loader.parallel_stream and loader.num_workers > 0:
        # the workers read the stream themselves: a batch's task is its size
        for offsets in loader.sampler:
            yield len(offsets)
        return
    stream = iter(loader.dataset)
    per_batch = loader.sampler.batch_size * loader.sampler.world_size
    if loader.timeout:
        stream = _TimedStream(stream, loader.timeout)
    for offsets in loader.sampler:
        chunk = list(itertools.islice(stream, per_batch))
        # the sampler counts positions in the stream: this chunk's are offsets modulo its span
        mine = [chunk[k % per_batch] for k in offsets if k % per_batch < len(chunk)]
        if not mine:
            return
        yield mine
        if len(chunk) < per_batch:
            return


class _TimedStream:
    """A stream's samples read ahead by a daemon thread (a queue of a few):
    ``next`` raises the loader's timeout error when none comes in time,
    where the stream itself would block the loader for ever."""

    def __init__(self, stream, timeout: float):
        import queue
        import threading
        self.timeout, self.queue = timeout, queue.Queue(maxsize=64)
        self.stopped = stop = threading.Event()     # set when the loader gave up: the thread ends

        def put(item, q=self.queue):
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    pass
            return False

        def pump():
            try:
                for sample in stream:
                    if stop.is_set() or not put(("item", sample)):
                        return
                put(("end", None))
            except BaseException as exc:       # the stream's own error, raised where it is read
                put(("error", exc))
        self.thread = threading.Thread(target=pump, name="gradcore-dataloader-stream", daemon=True)
        self.thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        import queue
        try:
            kind, value = self.queue.get(timeout=self.timeout)
        except queue.Empty:
            # the thread stops once the stream gives it its next sample
            self.stopped.set()
            raise RuntimeError(f"DataLoader timeout: the stream dataset gave no sample in {self.timeout} s") from None
        if kind == "item":
            return value
        if kind == "error":
            try:
                raise value
            finally:
                # this frame must not keep the exception: its traceback keeps the frame
                del value
        raise StopIteration


def _as_tensors(batch):
    """``batch`` with its NumPy arrays made Tensors (``preload``), its
    structure kept as the shared-memory slots take it apart."""
    from .._core import Tensor
    arrays: List[np.ndarray] = []
    spec = _shm._flatten(batch, arrays)
    return _shm._rebuild(spec, [Tensor(a) for a in arrays])


class _Preloaded:
    """An epoch's batches as Tensors, the next one converted ahead
    (MegEngine's ``preload``); ends with the epoch it wraps."""

    def __init__(self, it):
        self.it, self.ahead = it, None

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.it)

    def __next__(self):
        if self.ahead is None:
            self.ahead = _as_tensors(next(self.it))
        batch, self.ahead = self.ahead, None
        try:
            self.ahead = _as_tensors(next(self.it))
        except StopIteration:
            pass
        return batch


class _BaseIter:
    """One epoch: yields the batches in order; ``position`` counts the
    batches yielded (from the epoch's start, skipped ones included)."""

    def __init__(self, loader: DataLoader, epoch: int, skip: int, sampler_state):
        self.loader = loader
        self.epoch = epoch
        self.seed = loader.seed
        self.position = skip
        self.sampler_state = sampler_state
        self._finished = False
        self._job = _Job(loader)
        # a generator that held ``self`` would make a cycle, and a loop left
        # with ``break`` would keep the workers until the garbage collector ran
        self._payloads = _tasks(loader, skip)

    def __iter__(self) -> "_BaseIter":
        return self

    def __len__(self) -> int:
        return len(self.loader)


class _SerialIter(_BaseIter):
    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        try:
            payload = next(self._payloads)
        except StopIteration:
            self._finished = True
            raise
        batch = self._job.load(self.seed, self.epoch, self.position, payload, in_worker=False)
        self.position += 1
        return batch


_RAISED_AS: Dict[type, type] = {}


def _raised_as(cls: type) -> type:
    """``cls`` made a RuntimeError too (an IndexError in a worker is caught
    by ``except IndexError`` and by MegEngine's and PyTorch's ``except
    RuntimeError``); ``cls`` itself where it cannot be."""
    if issubclass(cls, RuntimeError):
        return cls
    both = _RAISED_AS.get(cls)
    if both is None:
        try:
            both = type(cls.__name__, (cls, RuntimeError), {"__module__": cls.__module__})
        except TypeError:         # incompatible layouts (an OSError subclass): the type itself
            both = cls
        _RAISED_AS[cls] = both
    return both


def _worker_error(wid: int, position: int, info: Dict[str, Any]) -> BaseException:
    """The exception a worker's error is raised as here (the caller raises it:
    held in a local of the raising frame it would be a reference cycle)."""
    msg = (f"Caught {info['name']} in DataLoader worker process {wid} (batch {position} of the epoch).\n"
           f"Original traceback (in the worker process):\n{info['traceback']}")
    try:
        cls = pickle.loads(info["cls"])
        # (KeyError's str() is the repr of its argument: keep the lines readable)
        exc = _raised_as(cls)(_PlainStr(msg) if cls is KeyError else msg)
    except Exception:   # no type sent, one that does not unpickle here, or a constructor wanting other arguments
        exc = RuntimeError(msg)
    return exc


class _PlainStr(str):
    def __repr__(self) -> str:
        return str(self)


def _worker_loop(wid: int, workers: int, seed: int, job: _Job, task_conn, result_conn, prefix: str,
                 parent_pid: int) -> None:
    """A worker process: take (seed, epoch, position, payload, freed slots)
    tasks until None, send back each batch's slot message or its error."""
    # Ctrl-C reaches the whole process group; the parent stops the workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _worker_info
    _worker_info = WorkerInfo(wid, workers, seed)
    try:
        # NumPy's BLAS on one thread in the workers (as PyTorch's workers): a
        # worker per core, each with a BLAS thread per core, would
        # oversubscribe the cores that the training process needs (and
        # without restarting OpenBLAS's thread pool, stopped by the fork)
        _blas.one_thread_from_now()
        _serve(job, task_conn, result_conn, prefix, parent_pid)
    except KeyboardInterrupt:
        return


def _serve(job: _Job, task_conn, result_conn, prefix: str, parent_pid: int) -> None:
    slots = _shm.SlotWriter()
    # one poll object for the whole life of the worker (Connection.poll
    # builds a selector on every call)
    poller = select.poll()
    poller.register(task_conn.fileno(), select.POLLIN)
    while True:
        if not poller.poll(_POLL_S * 1000):
            if os.getppid() != parent_pid:       # the parent died: nobody will read
                return
            continue
        try:
            task = pickle.loads(task_conn.recv_bytes())
        except EOFError:
            return
        if task is None:
            return
        seed, epoch, position, payload, freed = task
        slots.release(freed)
        try:
            batch = job.load(seed, epoch, position, payload, in_worker=True)
            message = ("ok", position, slots.write(batch, _segment_name(prefix, epoch, position)))
        except _StreamEnd:
            message = ("end", position, None)
        except Exception as exc:
            try:
                cls = pickle.dumps(type(exc))
            except Exception:
                cls = None
            message = ("err", position, {"name": type(exc).__name__, "cls": cls,
                                         "traceback": traceback.format_exc()})
        try:
            result_conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, OSError):
            return


def _segment_name(prefix: str, epoch: int, position: int) -> str:
    return f"{prefix}{epoch}_{position}"


class _Workers:
    """The processes, pipes and shared-memory slots of one epoch (or of
    several, persistent); ``stop()`` is idempotent and references neither
    the iterator nor the loader, so it can run from their finalizers."""

    def __init__(self):
        self.procs: List = []
        self.task_conns: List = []
        self.result_conns: List = []
        self.slots: List[_shm.SlotReader] = []      # per worker
        self.prefix = ""
        self.pending: set = set()       # segment names offered to tasks whose result is not read yet
        self.stopped = False
        # one poll object over the result pipes and the processes' sentinels,
        # made once (multiprocessing.connection.wait builds a selector per call)
        self.poller = select.poll()
        self.fds: Dict[int, tuple] = {}              # fd -> (is a sentinel, worker id)
        self.dead: set = set()                       # workers whose sentinel fired
        # what the batches cost to receive: messages and their pickled bytes
        self.received = 0
        self.received_bytes = 0

    def add(self, proc, task_conn, result_conn) -> None:
        wid = len(self.procs)
        self.procs.append(proc)
        self.task_conns.append(task_conn)
        self.result_conns.append(result_conn)
        self.slots.append(_shm.SlotReader())
        for fd, sentinel in ((result_conn.fileno(), False), (proc.sentinel, True)):
            self.poller.register(fd, select.POLLIN)
            self.fds[fd] = (sentinel, wid)

    def alive(self) -> bool:
        return not self.stopped and not self.dead and all(p.is_alive() for p in self.procs)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for conn in self.task_conns:
            try:
                # never block here: a hung worker's pipe may be full of tasks
                os.set_blocking(conn.fileno(), False)
                conn.send(None)
            except (BrokenPipeError, BlockingIOError, OSError, ValueError):
                pass
        deadline = time.monotonic() + _JOIN_S
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(_JOIN_S)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self.task_conns + self.result_conns:
            try:
                conn.close()
            except OSError:
                pass
        # slots created for batches never read (all writers are gone now);
        # the slots already mapped stay until their last batch is dropped
        for name in self.pending:
            _shm.discard(name)
        self.pending.clear()


class _ParallelIter(_BaseIter):
    def __init__(self, loader: DataLoader, epoch: int, skip: int, sampler_state):
        super().__init__(loader, epoch, skip, sampler_state)
        pool = loader._pool if loader.persistent_workers else None
        reuse = pool is not None and pool.alive()
        self._workers = pool if reuse else _Workers()
        # an epoch left unfinished stops its workers, persistent or not
        self._finalizer = weakref.finalize(self, self._workers.stop)
        self._ready: Dict[int, tuple] = {}          # position -> (worker id, message)
        self._owner: Dict[int, int] = {}            # position -> worker id, for batches in flight
        self._next_send = skip
        self._exhausted = False
        if not reuse and loader.persistent_workers:
            if pool is not None:
                pool.stop()
            loader._pool = self._workers
            weakref.finalize(loader, self._workers.stop)
        try:
            if not reuse:
                self._start()
            self._fill()
        except BaseException:
            self._shutdown()
            raise

    def _fill(self) -> None:
        """Send tasks until ``prefetch_factor`` per started worker are in flight."""
        started = len(self._workers.procs)
        while (len(self._owner) < started * self.loader.prefetch_factor
               and self._next_send % self.loader.num_workers < started and self._send_one()):
            pass

    def _start(self) -> None:
        loader, w = self.loader, self._workers
        ctx = multiprocessing.get_context(loader.multiprocessing_context)
        # short (macOS allows 31 characters) and unique per epoch and process
        w.prefix = f"/gcdl{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        for wid in range(loader.num_workers):
            task_r, task_w = ctx.Pipe(duplex=False)
            result_r, result_w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker_loop, name=f"gradcore-dataloader-{wid}", daemon=True,
                            args=(wid, loader.num_workers, loader.seed, _Job(loader), task_r, result_w, w.prefix,
                                  os.getpid()))
            p.start()
            task_r.close()
            result_w.close()
            w.add(p, task_w, result_r)
            # its first batch is under way while the next worker is forked
            self._fill()

    def _send_one(self) -> bool:
        if self._exhausted:
            return False
        try:
            payload = next(self._payloads)
        except StopIteration:
            self._exhausted = True
            if not self.loader.persistent_workers:
                # no more tasks: the workers leave after their last batch,
                # while the loop uses the last batches (not at the end)
                for conn in self._workers.task_conns:
                    try:
                        conn.send_bytes(_STOP)
                    except OSError:         # a dead worker: _wait_for reports it
                        pass
            return False
        position, w = self._next_send, self._workers
        wid = position % self.loader.num_workers
        # the name under which the worker may create a slot for this batch
        w.pending.add(_segment_name(w.prefix, self.epoch, position))
        self._owner[position] = wid
        task = (self.seed, self.epoch, position, payload, w.slots[wid].take_freed())
        w.task_conns[wid].send_bytes(pickle.dumps(task, pickle.HIGHEST_PROTOCOL))
        self._next_send += 1
        return True

    def _shutdown(self) -> None:
        self._finished = True
        self._finalizer()       # runs _workers.stop once

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        try:
            position, w = self.position, self._workers
            if position >= self._next_send:       # nothing in flight: the epoch is over
                if self.loader.persistent_workers:
                    self._finished = True
                    self._finalizer.detach()      # the workers wait for the next epoch
                else:
                    self._shutdown()
                raise StopIteration
            wid, message = self._wait_for(position)
            self._owner.pop(position, None)
            status, _, body = message
            segment = _segment_name(w.prefix, self.epoch, position)
            if status != "ok":
                w.pending.discard(segment)
                if status == "err":
                    raise _worker_error(wid, position, body)
                self._shutdown()        # "end": a worker's own stream ended (parallel_stream), so does the epoch
                raise StopIteration
            batch = w.slots[wid].read(body)
            # read (mapped and unlinked, if it made a slot): no longer pending
            w.pending.discard(segment)
            self.position += 1
            self._send_one()
            return batch
        except StopIteration:
            raise
        except BaseException:
            self._shutdown()
            raise

    def _wait_for(self, position: int):
        loader, w = self.loader, self._workers
        start = time.monotonic()
        while position not in self._ready:
            owner = self._owner.get(position)
            if owner in w.dead:
                self._raise_died(owner, position)
            wait_s = _POLL_S
            if loader.timeout:
                left = loader.timeout - (time.monotonic() - start)
                if left <= 0:
                    self._raise_timeout(position)
                wait_s = min(wait_s, left)
            for fd, _ in w.poller.poll(wait_s * 1000):
                sentinel, wid = w.fds[fd]
                if sentinel:
                    # what it sent before dying is still in its pipe
                    conn = w.result_conns[wid]
                    while conn.poll() and self._receive(wid, conn):
                        pass
                    w.dead.add(wid)
                    w.poller.unregister(fd)
                elif not self._receive(wid, w.result_conns[wid]):
                    w.poller.unregister(fd)        # its end closed: the sentinel follows
        return self._ready.pop(position)

    def _receive(self, wid: int, conn) -> bool:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return False
        message = pickle.loads(data)
        w = self._workers
        w.received += 1
        w.received_bytes += len(data)
        self._ready[message[1]] = (wid, message)
        return True

    def _raise_timeout(self, position: int) -> None:
        wid = self._owner.get(position)
        pid = self._workers.procs[wid].pid if wid is not None else None
        raise RuntimeError(f"DataLoader timeout: no batch from worker {wid} (pid {pid}) in {self.loader.timeout} s "
                           f"(waiting for batch {position} of epoch {self.epoch}); the worker may be hung. "
                           f"All workers were stopped.")

    def _raise_died(self, wid: int, position: int) -> None:
        proc = self._workers.procs[wid]
        proc.join(_JOIN_S)          # its sentinel fired: reap it, for the exit code
        code = proc.exitcode
        how = (f"was killed by signal {-code}" if code is not None and code < 0
               else f"exited with code {code}")
        raise RuntimeError(f"DataLoader worker {wid} (pid {self._workers.procs[wid].pid}) exited unexpectedly: "
                           f"it {how} while loading batch {position} of epoch {self.epoch}. All workers were "
                           f"stopped.")
