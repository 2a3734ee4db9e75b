"""Data-parallel training over MPI (mpi4py), MegEngine's ``dist`` API.

Run the same script on N processes with ``mpirun -n N python train.py``;
every process trains on its shard of the data and the gradients are averaged
with MPI allreduce, overlapped with the backward pass::

    import gradcore.distributed as dist

    dist.init()                                   # from the MPI environment
    model = Net()
    dist.broadcast_parameters(model.parameters())  # rank 0's initial values everywhere
    gm = GradManager().attach(model.parameters(), callbacks=dist.make_allreduce_cb("mean"))
    mine = dist.shard(len(dataset), shuffle_seed=epoch)   # this rank's indices
    ...

How the overlap works: the core fires a parameter's callback as soon as the
last producer of its gradient has run in the backward. The callback copies
the gradient into its bucket (parameters are grouped per dtype, in reverse
attach order, up to ``bucket_bytes``) and, once every gradient of a bucket is
there, starts a non-blocking ``Iallreduce`` of the whole bucket, while the
backward goes on with the earlier layers. At the end of
``GradManager.backward`` (an after-backward callback) the remaining buckets
are sent, with zeros and a "no gradient here" flag for a parameter that got
no gradient on this rank, so every rank always sends the same buckets in the
same order, and everything is waited for. The callback returns a future
(``.wait()`` gives the reduced Tensor), which GradManager waits for.

Nothing waits forever: every wait is a ``Test`` loop with a deadline
(``timeout``, default ``GRADCORE_DIST_TIMEOUT`` or 120 s). On a timeout (a
rank died, exited early or is stuck) or when the ranks attached different
parameters (checked once, by exchanging a signature of count, shapes and
dtypes), a :class:`DistributedError` with a clear message is raised; by
default an uncaught exception then aborts the whole MPI job
(``MPI_Abort``), so no rank is left hanging in ``MPI_Finalize``.

mpi4py is optional (``pip install gradcore[distributed]``, plus an MPI
library such as OpenMPI); importing this module works without it.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
import weakref
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Union

import numpy as np

from .._core import Tensor

__all__ = [
    "DistributedError", "init", "is_distributed", "is_initialized", "get_rank",
    "get_world_size", "barrier", "broadcast_parameters", "allreduce", "shard",
    "make_allreduce_cb", "AllreduceCallback", "launched_by_mpi",
]

INSTALL_HINT = ("gradcore.distributed needs mpi4py and an MPI library: "
                "pip install gradcore[distributed] (or pip install mpi4py), and install "
                "an MPI implementation, e.g. apt-get install openmpi-bin libopenmpi-dev")

# environment variables that MPI launchers set: (size variable, rank variable)
_LAUNCHER_ENV = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),    # Open MPI
    ("PMI_SIZE", "PMI_RANK"),                            # MPICH, Intel MPI (hydra)
    ("PMIX_SIZE", "PMIX_RANK"),
    ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"),      # MVAPICH
    ("SLURM_NTASKS", "SLURM_PROCID"),                    # srun
)


class DistributedError(RuntimeError):
    """A distributed run cannot go on: mpi4py missing, ranks that disagree,
    or a rank that did not answer within the timeout."""


def _default_timeout() -> float:
    try:
        return float(os.environ.get("GRADCORE_DIST_TIMEOUT", "120"))
    except ValueError:
        return 120.0


class _State:
    MPI = None           # the mpi4py.MPI module
    world = None         # COMM_WORLD
    comm = None          # our own duplicate of it: our collectives never mix with the user's
    rank = 0
    size = 1
    timeout = None


_state = _State()


def _import_mpi():
    try:
        from mpi4py import MPI          # initialises MPI
    except ImportError as exc:
        raise DistributedError(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from None
    except Exception as exc:            # mpi4py there but no working MPI library
        raise DistributedError(f"{INSTALL_HINT}; importing mpi4py.MPI failed: "
                               f"{type(exc).__name__}: {exc}") from None
    return MPI


def launched_by_mpi() -> int:
    """The world size an MPI launcher (mpirun, mpiexec, srun) announced in the
    environment, or 0 when this process was not started by one. Needs no mpi4py.

    Example::

        >>> import gradcore.distributed as dist
        >>> dist.launched_by_mpi()     # mpirun -n 4 python train.py: 4
        0
    """
    for size_var, rank_var in _LAUNCHER_ENV:
        if size_var in os.environ and (rank_var in os.environ or size_var != "SLURM_NTASKS"):
            try:
                return int(os.environ[size_var])
            except ValueError:
                continue
    return 0


def init(timeout: Optional[float] = None, abort_on_error: bool = True) -> None:
    """Initialise from the MPI environment (``mpirun -n N python train.py``);
    a plain ``python train.py`` is a world of one. Idempotent.

    ``timeout``: seconds any collective of this module may wait for the other
    ranks before raising :class:`DistributedError` (default
    ``GRADCORE_DIST_TIMEOUT`` or 120). ``abort_on_error``: when the world has
    more than one rank, an uncaught exception on any rank prints its traceback
    and calls ``MPI_Abort``, which ends every rank at once (as ``python -m
    mpi4py`` does) instead of leaving the others to time out.

    Example::

        >>> import gradcore.distributed as dist
        >>> dist.init()     # once, before the first collective (get_rank etc. call it too)
        >>> dist.is_initialized(), dist.get_world_size()
        (True, 1)
    """
    if timeout is not None:
        _state.timeout = float(timeout)
    if _state.comm is not None:
        return
    MPI = _import_mpi()
    _state.MPI = MPI
    _state.world = MPI.COMM_WORLD
    _state.comm = MPI.COMM_WORLD.Dup()
    _state.rank = _state.comm.Get_rank()
    _state.size = _state.comm.Get_size()
    if _state.timeout is None:
        _state.timeout = _default_timeout()
    if abort_on_error and _state.size > 1:
        _install_abort_hook()


def _install_abort_hook():
    previous = sys.excepthook

    def hook(tp, value, tb):
        try:
            previous(tp, value, tb)
            sys.stderr.write(f"gradcore.distributed: uncaught {tp.__name__} on rank {_state.rank} "
                             f"of {_state.size}: aborting the MPI job\n")
            sys.stderr.flush()
            sys.stdout.flush()
        finally:
            _state.world.Abort(1)
    sys.excepthook = hook


def is_initialized() -> bool:
    """Whether this process has joined the world (``init``, which
    ``get_rank`` and the collectives call when needed).

    Example::

        >>> import gradcore.distributed as dist
        >>> dist.init()
        >>> dist.is_initialized()
        True
    """
    return _state.comm is not None


def is_distributed() -> bool:
    """True when this process is one of several MPI ranks. Never raises for a
    plain single process without mpi4py; under an MPI launcher with more than
    one rank it initialises (and says what to install when mpi4py is missing).

    Example::

        >>> import gradcore.distributed as dist
        >>> dist.is_distributed()     # True only under mpirun with several ranks
        False
    """
    if _state.comm is not None:
        return _state.size > 1
    if launched_by_mpi() > 1:
        init()
        return _state.size > 1
    return False


def _comm():
    if _state.comm is None:
        init()
    return _state.comm


def get_rank() -> int:
    """This process's rank in the world (0 .. world size - 1).

    Example::

        >>> import gradcore.distributed as dist
        >>> dist.get_rank()     # under mpirun -n 4: 0, 1, 2 or 3
        0
    """
    _comm()
    return _state.rank


def get_world_size() -> int:
    """The number of processes.

    Example::

        >>> import gradcore.distributed as dist
        >>> dist.get_world_size()     # a plain python process is a world of one
        1
    """
    _comm()
    return _state.size


def _wait(requests, what: str, timeout=None) -> None:
    """Wait for MPI requests, testing in a loop up to a deadline."""
    MPI = _state.MPI
    if not isinstance(requests, list):
        requests = [requests]
    if MPI.Request.Testall(requests):
        return
    limit = float(timeout) if timeout is not None else (_state.timeout or _default_timeout())
    deadline = time.monotonic() + limit
    spins = 0
    while not MPI.Request.Testall(requests):
        spins += 1
        if spins > 200:
            if time.monotonic() > deadline:
                err = DistributedError(
                    f"gradcore.distributed: {what} did not complete within {limit:g} s on rank "
                    f"{_state.rank} of {_state.size}: another rank has died, exited early or is "
                    f"stuck (a straggler slower than the timeout can be given more time with "
                    f"GRADCORE_DIST_TIMEOUT or init(timeout=...))")
                err.timed_out = True     # (a failing backward waits no further: _pending.settle_all)
                try:
                    raise err
                finally:
                    del err     # no frame -> exception -> traceback -> frame cycle
            time.sleep(0.0002 if spins < 5000 else 0.002)


def barrier(timeout: Optional[float] = None) -> None:
    """A barrier with a deadline.

    Example::

        >>> import gradcore.distributed as dist
        >>> dist.barrier(timeout=10)     # returns once every rank reached it (here the only one)
    """
    comm = _comm()
    _wait(comm.Ibarrier(), "barrier", timeout)


def allreduce(array: Union[np.ndarray, Tensor], op: str = "sum", timeout: Optional[float] = None) -> np.ndarray:
    """Allreduce a NumPy array (or Tensor) over the ranks: "sum", "mean",
    "max" or "min". Returns a new array.

    Example::

        >>> import gradcore.distributed as dist
        >>> dist.allreduce(np.array([1.0, 2.0]), "sum")     # on N ranks: the sum of their arrays
        array([1., 2.])
    """
    comm = _comm()
    MPI = _state.MPI
    a = np.ascontiguousarray(array.numpy() if isinstance(array, Tensor) else np.asarray(array))
    out = np.empty_like(a)
    mpi_op = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
    _wait(comm.Iallreduce(a, out, op=mpi_op), f"allreduce ({op})", timeout)
    if op == "mean":
        out = out / _state.size if out.dtype.kind != "f" else np.divide(out, _state.size, out=out)
    return out


# ---------------------------------------------------------------- signatures

def _signature(tensors: Sequence[Tensor]):
    count = len(tensors)
    total = sum(int(t.size) for t in tensors)
    desc = repr([(tuple(t.shape), str(t.dtype)) for t in tensors]).encode()
    digest = int.from_bytes(hashlib.sha1(desc).digest()[:7], "little")
    return np.array([digest, count, total], dtype=np.int64)


def _check_same_parameters(tensors: Sequence[Tensor], what: str, timeout=None) -> None:
    """Every rank must pass the same count, shapes and dtypes: exchange a
    signature (non-blocking allgather with a deadline) and compare."""
    comm = _comm()
    mine = _signature(tensors)
    allsig = np.empty((_state.size, 3), np.int64)
    _wait(comm.Iallgather(mine, allsig), f"the parameter check of {what} (every rank must take "
          f"part; none answered from some rank)", timeout)
    if (allsig == mine).all():
        return
    lines = [f"  rank {r}: {int(s[1])} parameters, {int(s[2])} elements, signature {int(s[0]):x}"
             + ("  <- this rank" if r == _state.rank else "")
             for r, s in enumerate(allsig)]
    raise DistributedError(
        f"gradcore.distributed: {what}: the ranks have different parameter lists (count, shapes "
        f"or dtypes differ); every rank must build the same model and attach the same "
        f"parameters in the same order:\n" + "\n".join(lines))


# ---------------------------------------------------------------- broadcast

def broadcast_parameters(params: Iterable[Tensor], root: int = 0, timeout: Optional[float] = None) -> None:
    """Give every rank ``root``'s values of ``params`` (call it on every rank
    after building the model, before training). The parameter lists are
    checked to match first.

    Example::

        >>> import gradcore.distributed as dist
        >>> net = M.Linear(2, 1)
        >>> dist.broadcast_parameters(net.parameters())     # every rank gets rank 0's weights
        >>> net.weight.shape
        (1, 2)
    """
    params = list(params)
    comm = _comm()
    if _state.size == 1:
        return
    _check_same_parameters(params, "broadcast_parameters", timeout)
    from .. import _core
    by_dtype: Dict[np.dtype, List[Tensor]] = {}
    for p in params:
        by_dtype.setdefault(np.dtype(p.dtype), []).append(p)
    for dtype, group in by_dtype.items():
        if _state.rank == root:
            buf = np.concatenate([np.asarray(p.numpy(), dtype).ravel() for p in group])
        else:
            buf = np.empty(sum(int(p.size) for p in group), dtype)
        _wait(comm.Ibcast(buf, root=root), f"broadcast_parameters ({dtype})", timeout)
        if _state.rank != root:
            ends = np.cumsum([int(p.size) for p in group])
            for p, part in zip(group, np.split(buf, ends[:-1])):
                value = part.reshape(p.shape).copy()
                p._data = value if p.device == "cpu" else Tensor(value, device=p.device)._data
                _core._bump_version(p)


# ---------------------------------------------------------------- sharding

def shard(n_items: int, rank: Optional[int] = None, world_size: Optional[int] = None,
          shuffle_seed: Optional[int] = None, drop_remainder: bool = True) -> np.ndarray:
    """The indices of ``n_items`` items that this rank owns: equal-sized,
    disjoint contiguous blocks of ``arange(n_items)`` (or of a permutation of
    it when ``shuffle_seed`` is given; every rank must pass the same seed).
    With ``drop_remainder`` the last ``n_items % world_size`` items are left
    out; otherwise the blocks are padded by wrapping around to the start.

    Example::

        >>> import gradcore.distributed as dist
        >>> dist.shard(10, rank=1, world_size=3)
        array([3, 4, 5])
        >>> dist.shard(10, rank=2, world_size=3, drop_remainder=False)     # padded from the start
        array([8, 9, 0, 1])
    """
    on = is_initialized() or launched_by_mpi() > 1
    if rank is None:
        rank = get_rank() if on else 0
    if world_size is None:
        world_size = get_world_size() if on else 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"shard: rank {rank} is not in a world of {world_size}")
    order = (np.random.default_rng(shuffle_seed).permutation(n_items) if shuffle_seed is not None
             else np.arange(n_items))
    if drop_remainder:
        per = n_items // world_size
    else:
        per = -(-n_items // world_size)
        if per * world_size > n_items and n_items > 0:
            order = np.concatenate([order, order[:per * world_size - n_items]])
    return order[rank * per:(rank + 1) * per]


# ---------------------------------------------------------------- allreduce callback

class _Bucket:
    __slots__ = ("index", "dtype", "params", "offsets", "nelem", "buf", "remaining", "request", "done")

    def __init__(self, index, dtype):
        self.index, self.dtype = index, dtype
        self.params = []          # positions in the layout
        self.offsets = []
        self.nelem = self.remaining = 0
        self.buf = self.request = None
        self.done = False


class _Future:
    """What the callback returns: ``wait()`` gives the reduced gradient."""
    __slots__ = ("_cb", "_state", "_pos")

    def __init__(self, cb, state, pos):
        self._cb, self._state, self._pos = cb, state, pos

    def wait(self):
        return self._cb._result(self._state, self._pos)


class _GMState:
    """The layout of one GradManager's attached parameters, and this backward's buckets."""

    def __init__(self, params, bucket_bytes):
        self.ids = tuple(id(p) for p in params)
        self.refs = params                 # strong refs only while a backward is running
        self.pos = {id(p): i for i, p in enumerate(params)}
        self.shapes = [tuple(p.shape) for p in params]
        self.sizes = [int(p.size) for p in params]
        self.devices = [p.device for p in params]
        self.bucket_of: List[int] = [0] * len(params)
        self.buckets: List[_Bucket] = []
        # reverse attach order: the order gradients arrive in, for a model
        # whose parameters are attached in forward order
        open_bucket: Dict[np.dtype, _Bucket] = {}
        for i in reversed(range(len(params))):
            dtype = np.dtype(params[i].dtype)
            b = open_bucket.get(dtype)
            nbytes = self.sizes[i] * dtype.itemsize
            if b is None or (b.nelem and (b.nelem * dtype.itemsize + nbytes) > bucket_bytes):
                b = _Bucket(len(self.buckets), dtype)
                self.buckets.append(b)
                open_bucket[dtype] = b
            self.bucket_of[i] = b.index
            b.offsets.append(b.nelem)
            b.params.append(i)
            b.nelem += self.sizes[i]
        self.active = False
        self.next_send = 0
        self.arrived = None
        self.results = None
        self.checked = False


class AllreduceCallback:
    """``cb(tensor, grad) -> future`` for ``GradManager.attach(params,
    callbacks=cb)``; made by :func:`make_allreduce_cb`.

    Example::

        >>> import gradcore.distributed as dist
        >>> w = gc.Parameter([1.0, 2.0])
        >>> gm = gc.GradManager().attach([w], callbacks=[dist.make_allreduce_cb("mean")])
        >>> with gm:
        ...     gm.backward((w * w).sum())     # the gradient averaged over the ranks
        >>> w.grad.numpy()     # one process: its own
        array([2., 4.], dtype=float32)
    """

    def __init__(self, reduce_method: str = "mean", bucket_bytes: int = 512 * 1024,
                 timeout: Optional[float] = None, trace: Optional[Callable[[str], None]] = None):
        if reduce_method not in ("mean", "sum"):
            raise ValueError(f"make_allreduce_cb: reduce_method must be 'mean' or 'sum', "
                             f"got {reduce_method!r}")
        if bucket_bytes <= 0:
            raise ValueError("make_allreduce_cb: bucket_bytes must be positive")
        self.reduce_method = reduce_method
        self.bucket_bytes = int(bucket_bytes)
        self.timeout = timeout
        self.trace = trace
        self._states = weakref.WeakKeyDictionary()     # GradManager -> _GMState
        self._registered = weakref.WeakSet()
        # statistics, for benchmarks: seconds spent waiting for reductions at
        # the end of backward, and number of buckets sent in total / early
        # and bytes: in all, sent during the backward, already reduced when it ended
        self.stats = {"wait_s": 0.0, "buckets": 0, "early_buckets": 0, "backwards": 0,
                      "bytes_total": 0, "bytes_sent_early": 0, "bytes_done_at_end": 0}

    # -- per backward
    def _gm_state(self, gm) -> _GMState:
        params = [t for t in gm.attached_tensors()
                  if any(c is self for c in gm._attach_specs[id(t)].callbacks)]
        st = self._states.get(gm)
        if st is None or st.ids != tuple(id(p) for p in params):
            st = self._states[gm] = _GMState(params, self.bucket_bytes)
        else:
            st.refs = params
        if gm not in self._registered:
            self._registered.add(gm)
            gm.register_after_backward_callback(self._after_backward_for(gm))
        return st

    def _begin(self, st: _GMState) -> None:
        _comm()
        if not st.checked:
            _check_same_parameters(st.refs, "make_allreduce_cb (the attached parameters)",
                                   self.timeout)
            st.checked = True
        st.active = True
        st.next_send = 0
        st.arrived = [False] * len(st.sizes)
        st.results = [None] * len(st.sizes)
        for b in st.buckets:
            # gradients, then one presence flag per parameter (1 where this
            # rank has a gradient): after the sum, > 0 where any rank had one
            b.buf = np.zeros(b.nelem + len(b.params), b.dtype)
            b.remaining = len(b.params)
            b.request = None
            b.done = False
        self.stats["backwards"] += 1

    def _start(self, st: _GMState, b: _Bucket, early: bool) -> None:
        MPI = _state.MPI
        b.request = _state.comm.Iallreduce(MPI.IN_PLACE, b.buf, op=MPI.SUM)
        self.stats["buckets"] += 1
        if early:
            self.stats["early_buckets"] += 1
        if self.trace is not None:
            self.trace(f"allreduce started: bucket {b.index} ({len(b.params)} params, "
                       f"{b.nelem} {b.dtype} elements){'' if early else ' at the end of backward'}")

    def _send_ready(self, st: _GMState) -> None:
        # buckets go out strictly in index order, the same on every rank
        # (MPI wants collectives started in the same order everywhere)
        while st.next_send < len(st.buckets) and st.buckets[st.next_send].remaining == 0:
            self._start(st, st.buckets[st.next_send], early=True)
            st.next_send += 1

    def __call__(self, tensor, grad):
        from ..autodiff import get_backwarding_grad_manager
        gm = get_backwarding_grad_manager()
        if gm is None:
            raise DistributedError("the allreduce callback runs inside GradManager.backward: "
                                   "attach it with GradManager().attach(params, callbacks=cb)")
        st = self._states.get(gm)
        if st is None or not st.active:
            st = self._gm_state(gm)
            self._begin(st)
        if _state.size == 1 and self.trace is None:
            st.arrived[st.pos[id(tensor)]] = True
            return grad
        pos = st.pos.get(id(tensor))
        if pos is None:
            raise DistributedError("allreduce callback: a tensor that is not attached with it")
        if self.trace is not None:
            self.trace(f"grad ready: parameter {pos}")
        if st.arrived[pos]:
            raise DistributedError("allreduce callback: a gradient arrived twice in one backward")
        st.arrived[pos] = True
        b = st.buckets[st.bucket_of[pos]]
        k = b.params.index(pos)
        off = b.offsets[k]
        g = grad._data if (isinstance(grad, Tensor) and isinstance(grad._data, np.ndarray)) \
            else np.asarray(grad.numpy() if isinstance(grad, Tensor) else grad)
        if g.shape != st.shapes[pos]:
            g = np.broadcast_to(g, st.shapes[pos])
        b.buf[off:off + st.sizes[pos]].reshape(st.shapes[pos])[...] = g
        b.buf[b.nelem + k] = 1
        b.remaining -= 1
        if b.remaining == 0:
            self._send_ready(st)
        # let MPI progress the reductions in flight while the backward goes on
        reqs = [x.request for x in st.buckets[:st.next_send] if x.request is not None and not x.done]
        if reqs:
            _state.MPI.Request.Testall(reqs)
        return _Future(self, st, pos)

    def _after_backward_for(self, gm):
        gmref = weakref.ref(gm)

        def after_backward():
            g = gmref()
            if g is not None:
                self._finish(g)
        return after_backward

    def _finish(self, gm) -> None:
        """End of backward: send what is left (zeros for gradients this rank
        does not have), wait for everything, hand every parameter that got a
        gradient on any rank its reduced gradient."""
        st = self._states.get(gm)
        if st is None or not st.active:
            st = self._gm_state(gm)
            if not st.sizes:
                return
            self._begin(st)          # no gradient at all on this rank: still take part
        try:
            if _state.size == 1 and self.trace is None:
                return
            # how much was already reduced when the backward ended (overlap)
            stats = self.stats
            for b in st.buckets[:st.next_send]:
                nbytes = b.buf.nbytes
                stats["bytes_sent_early"] += nbytes
                if b.request.Test():
                    stats["bytes_done_at_end"] += nbytes
            stats["bytes_total"] += sum(b.buf.nbytes for b in st.buckets)
            for b in st.buckets[st.next_send:]:
                self._start(st, b, early=False)
            st.next_send = len(st.buckets)
            t0 = time.perf_counter()
            _wait([b.request for b in st.buckets],
                  f"the gradient allreduce ({len(st.buckets)} buckets, "
                  f"{sum(b.nelem for b in st.buckets)} elements)", self.timeout)
            self.stats["wait_s"] += time.perf_counter() - t0
            scale = 1.0 / _state.size if self.reduce_method == "mean" else None
            for b in st.buckets:
                b.done = True
                presence, grads = b.buf[b.nelem:], b.buf[:b.nelem]
                if scale is not None:
                    grads *= b.dtype.type(scale)
                for k, pos in enumerate(b.params):
                    if presence[k] > 0:
                        off = b.offsets[k]
                        st.results[pos] = grads[off:off + st.sizes[pos]].reshape(st.shapes[pos])
            # a parameter with no gradient here but one elsewhere: give it the reduced one
            for pos, p in enumerate(st.refs):
                if not st.arrived[pos] and st.results[pos] is not None:
                    gm._gradients[id(p)] = self._result(st, pos)
        finally:
            st.active = False
            st.refs = []

    def _result(self, st: _GMState, pos: int):
        res = st.results[pos]
        if res is None:
            raise DistributedError("allreduce: the reduction of this gradient is not there "
                                   "(wait() called before the end of GradManager.backward)")
        if isinstance(res, Tensor):
            return res
        device = st.devices[pos]
        if str(device) == "cpu":
            t = Tensor.__new__(Tensor)
            t._data = res
            t._device = device
        else:
            t = Tensor(res, device=device)
        st.results[pos] = t
        return t


def make_allreduce_cb(reduce_method: str = "mean", bucket_bytes: int = 512 * 1024,
                      timeout: Optional[float] = None,
                      trace: Optional[Callable[[str], None]] = None) -> AllreduceCallback:
    """A callback for ``GradManager.attach(params, callbacks=...)`` that
    allreduces every gradient over the ranks ("mean" averages, "sum" adds).

    Gradients are packed into buckets (per dtype, up to ``bucket_bytes``);
    a full bucket is sent with a non-blocking ``Iallreduce`` at once, during
    the backward; the rest is sent and everything is waited for at the end of
    ``GradManager.backward``. ``timeout`` (seconds) bounds every wait.
    ``trace(event)``, if given, is called with "allreduce started: ...",
    "grad ready: ..." events (for tests and profiling).

    Example::

        >>> import gradcore.distributed as dist
        >>> cb = dist.make_allreduce_cb("sum")
        >>> w = gc.Parameter([3.0]); gm = gc.GradManager().attach([w], callbacks=[cb])
        >>> with gm:
        ...     gm.backward(w * w)
        >>> w.grad.numpy()     # summed over the ranks: one process, 2 * 3
        array([6.], dtype=float32)
    """
    return AllreduceCallback(reduce_method, bucket_bytes, timeout, trace)
