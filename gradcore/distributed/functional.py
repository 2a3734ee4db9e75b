"""Differentiable collectives over MPI, with MegEngine's names
(``megengine.distributed.functional``): they sit inside a model and their
backward is the adjoint collective::

    import gradcore.distributed as dist
    import gradcore.distributed.functional as DF

    dist.init()                                  # under mpirun -n N
    y = DF.all_to_all(x, split_axis=0, concat_axis=1)
    z = DF.all_reduce_sum(y)                     # every rank: the sum over ranks
    gm.backward(loss(z))                         # the adjoints run as collectives too

Each collective is an op (``gradcore.op.Op``) whose CPU kernel calls MPI
with non-blocking requests waited for up to a deadline (``dist.init(timeout=)``
or ``GRADCORE_DIST_TIMEOUT``), so a rank that died or called something else
gives a :class:`~gradcore.distributed.DistributedError` instead of a hang.
Before the data moves, the ranks exchange the shape and dtype each one
passes; a mismatch is reported on every rank, naming the ranks and shapes.

| forward | its adjoint (the backward) |
| --- | --- |
| ``all_reduce_sum`` | ``all_reduce_sum`` |
| ``all_reduce_max`` / ``min`` | the summed gradient where a rank holds the extreme (ties share it) |
| ``all_gather(axis)`` | ``reduce_scatter_sum(axis)`` |
| ``reduce_scatter_sum(axis)`` | ``all_gather(axis)`` |
| ``all_to_all(split_axis, concat_axis)`` | ``all_to_all(concat_axis, split_axis)`` |
| ``broadcast(root)`` | ``reduce_sum(root)`` |
| ``reduce_sum(root)`` | ``broadcast(root)`` |
| ``scatter(root, axis)`` | ``gather(root, axis)`` |
| ``gather(root, axis)`` | ``scatter(root, axis)`` |
| ``remote_send(dest)`` | a receive of the gradient from ``dest`` |
| ``remote_recv(src)`` | a send of the gradient to ``src`` |

Every collective's node gets backward priority ``COLLECTIVE_PRIORITY``
(``gradcore.autodiff.set_backward_priority``): its adjoint is posted as
soon as its gradient is complete, before independent backward work recorded
later, so the communication overlaps that work's backward. In a backward
(raw mode: no older GradManager records it) the adjoint does not wait for
its request either: its kernel returns the output buffer at once, registered
as in flight (``gradcore.distributed._pending``), and it is waited for only
when something reads it (the backward of the op that made the collective's
input, an addition to another gradient, a leaf's callback, the end of the
backward). ``DEFER_ADJOINTS = False`` makes the adjoints wait in their
kernel, as the forward collectives always do.

Every rank must run the same collectives in the same order, forward and
backward. Rooted results (``gather``, ``reduce_sum``) are the data on the
root and, on the other ranks, an empty tensor (``gather``) or zeros
(``reduce_sum``) where MegEngine returns None: pass them to
``gm.backward`` with the rank's other outputs so that the adjoint runs on
every rank. ``remote_send`` returns such a token too. Collectives run on
``cpu`` tensors; groups other than the whole world (``WORLD``) are not
supported yet and are refused by name.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from .. import _core
from ..autodiff import set_backward_priority
from ..op import Op, TensorDesc
from . import DistributedError, _pending, _state, _wait, launched_by_mpi

__all__ = ["WORLD", "Group", "all_reduce_sum", "all_reduce_max", "all_reduce_min", "all_gather",
           "reduce_scatter_sum", "all_to_all", "broadcast", "reduce_sum", "scatter", "gather",
           "remote_send", "remote_recv"]

# the backward priority of a collective's node: its adjoint is posted as soon as its gradient is
# complete, before independent backward work recorded later (0 turns it off)
COLLECTIVE_PRIORITY = 1 << 16
# an adjoint collective in a raw-mode backward returns its buffer with its request in flight, waited for
# when the buffer is read (False: it waits in its kernel, as before)
DEFER_ADJOINTS = True

_MAXDIM = 16
_TAG_HEADER, _TAG_DATA = 7301, 7302      # point-to-point tags of remote_send / remote_recv


class Group:
    """A set of ranks a collective runs over. Only the whole world
    (``WORLD``) exists for now."""

    def __init__(self, ranks: Optional[Sequence[int]] = None):
        self.ranks = None if ranks is None else tuple(int(r) for r in ranks)

    def __repr__(self):
        return "WORLD" if self.ranks is None else f"Group({list(self.ranks)})"


WORLD = Group()


# ---------------------------------------------------------------- MPI plumbing
def _comm(name: str):
    """The communicator; a clear error when this is no MPI run."""
    if _state.comm is None:
        if launched_by_mpi() == 0:
            raise DistributedError(f"{name}: called outside an MPI run: start the script with "
                                   f"`mpirun -n N python script.py` (or call gradcore.distributed.init() "
                                   f"first for a world of one)")
        from . import init
        init()
    return _state.comm


def _group(group, name: str) -> None:
    if group is None or group is WORLD or (isinstance(group, Group) and group.ranks is None):
        return
    raise DistributedError(f"{name}: the group {group!r} does not exist: only WORLD (every rank) is "
                           f"supported")


def _header(a: np.ndarray) -> np.ndarray:
    if a.ndim > _MAXDIM:
        raise DistributedError(f"collectives take at most {_MAXDIM} dimensions, got {a.ndim}")
    h = np.full(_MAXDIM + 2, -1, np.int64)
    h[0], h[1] = a.ndim, a.dtype.num
    h[2:2 + a.ndim] = a.shape
    return h


# NumPy's type numbers of the dtypes a collective may carry (headers send the number)
_DTYPES = {np.dtype(t).num: np.dtype(t) for t in (np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                                   np.uint32, np.int64, np.uint64, np.float16, np.float32,
                                                   np.float64)}


def _describe(h: np.ndarray) -> str:
    ndim, num = int(h[0]), int(h[1])
    return f"{tuple(int(d) for d in h[2:2 + ndim])} {_DTYPES.get(num, f'dtype #{num}')}"


def _agreement(comm, what: str, a: np.ndarray, compare_shapes: bool = True):
    """Post the exchange of every rank's shape and dtype (or dtype only) of ``a``. Returns the
    request and ``check()``, which waits for it and raises the same error on every rank, naming
    them, when they differ."""
    mine = _header(a)
    every = np.empty((comm.Get_size(), mine.size), np.int64)
    request = comm.Iallgather(mine, every)

    def check(mine=mine):           # (holds mine: MPI reads it until the exchange completes)
        _wait(request, f"{what} (exchanging shapes)")
        keys = every if compare_shapes else every[:, :2]
        if not (keys == keys[0]).all():
            listing = "; ".join(f"rank {r}: {_describe(h)}" for r, h in enumerate(every))
            raise DistributedError(f"{what}: the ranks passed different {'shapes or ' if compare_shapes else ''}"
                                   f"dtypes ({listing})")
    return request, check


def _agree(comm, what: str, a: np.ndarray, compare_shapes: bool = True) -> None:
    """Every rank passes the same shape and dtype (or the same dtype only), or every rank
    raises the same error naming them."""
    _agreement(comm, what, a, compare_shapes)[1]()


def _world_size() -> int:
    return _state.size if _state.comm is not None else max(1, launched_by_mpi())


def _rank() -> int:
    return _state.rank if _state.comm is not None else 0


_MPI_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


class _Collective(Op):
    """What every collective shares: a CPU kernel only, a name in errors, and how a kernel
    completes: waiting for its request (a forward), or handing its buffer out in flight (an
    adjoint in a raw-mode backward). An op made with ``adjoint=True`` (by a ``vjp``) is the
    backward of another collective."""

    devices = ("cpu",)

    def _mark_adjoint(self, adjoint: bool) -> None:
        # an attribute only when set: it is part of the op's identity (forward and adjoint differ)
        if adjoint:
            self.adjoint = True

    def _check_dtype(self, x):
        if x.dtype == np.bool_ or x.dtype.kind not in "iuf":
            raise self.error(f"needs a numeric (integer or floating-point) tensor, got {x.dtype}", x)

    def _deferring(self) -> bool:
        # only in a raw-mode backward: there the output is an array that only the core reads
        # (and completes first); recorded by an older manager it would be a Tensor anyone reads
        return DEFER_ADJOINTS and getattr(self, "adjoint", False) and _core._in_raw_backward()

    def _complete(self, comm, described: np.ndarray, post, out: np.ndarray, finish=None,
                  keep: tuple = ()) -> np.ndarray:
        """Agree with the other ranks on ``described``'s shape and dtype, post the data's
        request(s) (``post()``), and return ``out`` once complete (``finish()`` fills it
        from what arrived, when it is not the buffer MPI writes itself). An adjoint in a
        raw-mode backward posts both requests and returns ``out`` at once, in flight: the
        shapes are checked, the data waited for and ``finish()`` run when it is read."""
        what = repr(self)
        if self._deferring():
            request, check = _agreement(comm, what, described)
            posted = post()
            posted = posted if isinstance(posted, list) else [posted]
            return _pending.defer(out, [request] + posted, what, check, finish, keep)
        _agree(comm, what, described)
        _wait(post(), what)
        if finish is not None:
            finish()
        return out


# ---------------------------------------------------------------- the ops
class AllReduce(_Collective):
    """The elementwise sum, maximum or minimum over the ranks, on every rank."""

    def __init__(self, mode: str = "sum", adjoint: bool = False):
        if mode not in _MPI_OPS:
            raise ValueError(f"AllReduce: mode must be one of {sorted(_MPI_OPS)}, got {mode!r}")
        self.mode = mode
        self._mark_adjoint(adjoint)

    def infer(self, x):
        self._check_dtype(x)
        return (x,)

    def cpu(self, x):
        comm = _comm(repr(self))
        x = np.ascontiguousarray(x)
        out = np.empty_like(x)
        return self._complete(comm, x, lambda: comm.Iallreduce(x, out, op=getattr(_state.MPI, _MPI_OPS[self.mode])),
                              out, keep=(x,))

    def vjp(self, inputs, outputs, grads):
        (x,), (y,), (g,) = inputs, outputs, grads
        if self.mode == "sum":
            return (AllReduce("sum", adjoint=True)(g),)
        # (max, min: the sum is read at once below, so it is no deferred adjoint)
        total = AllReduce("sum")(g)
        held = (x == y).astype(g.dtype)            # the ranks holding the extreme share its gradient
        return (total * held / AllReduce("sum")(held),)


class _AlongAxis(_Collective):
    """A collective that splits or concatenates along ``axis``."""

    def __init__(self, axis: int = 0, adjoint: bool = False):
        self.axis = int(axis)
        self._mark_adjoint(adjoint)


class AllGather(_AlongAxis):
    """Every rank's tensor, concatenated along ``axis`` in rank order, on every rank."""

    def infer(self, x):
        return _resized(self, x, grow=self.axis)

    def cpu(self, x):
        comm = _comm(repr(self))
        x = np.ascontiguousarray(x)
        parts = np.empty((comm.Get_size(),) + x.shape, x.dtype)
        out, finish = _concatenated(parts, self.axis)
        return self._complete(comm, x, lambda: comm.Iallgather(x, parts), out, finish, keep=(x, parts))

    def vjp(self, inputs, outputs, grads):
        return (ReduceScatterSum(self.axis, adjoint=True)(grads[0]),)


class ReduceScatterSum(_AlongAxis):
    """The sum over the ranks, split along ``axis`` into one part per rank: rank r gets part r."""

    def infer(self, x):
        return _resized(self, x, shrink=self.axis)

    def cpu(self, x):
        comm = _comm(repr(self))
        parts = np.ascontiguousarray(np.stack(np.split(x, comm.Get_size(), axis=self.axis)))
        total = np.empty_like(parts)
        # (part r of a C-contiguous stack is contiguous: the buffer MPI writes, no copy)
        return self._complete(comm, np.ascontiguousarray(x), lambda: comm.Iallreduce(parts, total, op=_state.MPI.SUM),
                              total[comm.Get_rank()], keep=(parts, total))

    def vjp(self, inputs, outputs, grads):
        return (AllGather(self.axis, adjoint=True)(grads[0]),)


class AllToAll(_Collective):
    """Split along ``split_axis`` into one part per rank, send part k to rank k, and
    concatenate what arrives along ``concat_axis`` in rank order."""

    def __init__(self, split_axis: int = 0, concat_axis: int = 0, adjoint: bool = False):
        self.split_axis, self.concat_axis = int(split_axis), int(concat_axis)
        self._mark_adjoint(adjoint)

    def infer(self, x):
        return _resized(self, x, shrink=self.split_axis, grow=self.concat_axis)

    def cpu(self, x):
        comm = _comm(repr(self))
        send = np.ascontiguousarray(np.stack(np.split(x, comm.Get_size(), axis=self.split_axis)))
        recv = np.empty_like(send)
        out, finish = _concatenated(recv, self.concat_axis)
        return self._complete(comm, np.ascontiguousarray(x), lambda: comm.Ialltoall(send, recv), out, finish,
                              keep=(send, recv))

    def vjp(self, inputs, outputs, grads):
        return (AllToAll(self.concat_axis, self.split_axis, adjoint=True)(grads[0]),)


class _Rooted(_Collective):
    """A collective with a root rank whose output is shaped as its input."""

    def __init__(self, root: int = 0, adjoint: bool = False):
        self.root = int(root)
        self._mark_adjoint(adjoint)

    def infer(self, x):
        self._check_dtype(x)
        _check_root(self, self.root)
        return (x,)


class Broadcast(_Rooted):
    """The root's tensor on every rank (every rank passes one of the same shape and dtype)."""

    def cpu(self, x):
        comm = _comm(repr(self))
        buf = np.array(x, copy=True, order="C")
        return self._complete(comm, buf, lambda: comm.Ibcast(buf, root=self.root), buf)

    def vjp(self, inputs, outputs, grads):
        return (ReduceSum(self.root, adjoint=True)(grads[0]),)


class ReduceSum(_Rooted):
    """The sum over the ranks on the root; zeros of the same shape on the other ranks."""

    def cpu(self, x):
        comm = _comm(repr(self))
        x = np.ascontiguousarray(x)
        out = np.zeros_like(x)
        # (off the root MPI should not write the receive buffer; zeros all the same)
        finish = None if comm.Get_rank() == self.root else (lambda: out.fill(0))
        return self._complete(comm, x, lambda: comm.Ireduce(x, out, op=_state.MPI.SUM, root=self.root), out,
                              finish, keep=(x,))

    def vjp(self, inputs, outputs, grads):
        return (Broadcast(self.root, adjoint=True)(grads[0]),)


class _RootedLike(_Collective):
    """A rooted collective along ``axis`` whose output is shaped as its second input, ``like``."""

    def __init__(self, root: int = 0, axis: int = 0, adjoint: bool = False):
        self.root, self.axis = int(root), int(axis)
        self._mark_adjoint(adjoint)

    def infer(self, x, like):
        self._check_dtype(x)
        _check_root(self, self.root)
        return (TensorDesc(like.shape, x.dtype, x.device),)


class Scatter(_RootedLike):
    """``Scatter(root, axis)(src, like)``: the root's ``src`` split along ``axis`` into one
    part per rank, part r on rank r, shaped as ``like`` (the other ranks' ``src`` is not read)."""

    def cpu(self, src, like):
        comm = _comm(repr(self))
        out = np.empty(like.shape, src.dtype)
        parts = None
        if comm.Get_rank() == self.root:
            size = comm.Get_size()
            if like.ndim == 0 or src.ndim != like.ndim or src.shape[self.axis] != like.shape[self.axis] * size:
                # (after the shapes' exchange, which every rank takes part in)
                _agree(comm, repr(self), out)
                raise DistributedError(f"{self!r}: the root's tensor {src.shape} does not split into "
                                       f"{comm.Get_size()} parts of {like.shape}")
            parts = np.ascontiguousarray(np.stack(np.split(src, comm.Get_size(), axis=self.axis)))
        return self._complete(comm, out, lambda: comm.Iscatter(parts, out, root=self.root), out, keep=(parts,))

    def vjp(self, inputs, outputs, grads):
        return (Gather(self.root, self.axis, adjoint=True)(grads[0], inputs[0]), None)


class Gather(_RootedLike):
    """``Gather(root, axis)(x, like)``: every rank's ``x`` concatenated along ``axis`` in rank
    order on the root, shaped as ``like``; zeros shaped as ``like`` on the other ranks."""

    def cpu(self, x, like):
        comm = _comm(repr(self))
        x = np.ascontiguousarray(x)
        if comm.Get_rank() == self.root:
            parts = np.empty((comm.Get_size(),) + x.shape, x.dtype)
            out, finish = _concatenated(parts, self.axis)
        else:
            parts, out, finish = None, np.zeros(like.shape, x.dtype), None
        return self._complete(comm, x, lambda: comm.Igather(x, parts, root=self.root), out, finish,
                              keep=(x, parts))

    def vjp(self, inputs, outputs, grads):
        return (Scatter(self.root, self.axis, adjoint=True)(grads[0], inputs[0]), None)


class RemoteSend(_Collective):
    """Send ``x`` to rank ``dest``; the output is an empty token whose backward receives the
    gradient of ``x`` from ``dest``."""

    def __init__(self, dest: int):
        self.dest = int(dest)

    def infer(self, x):
        self._check_dtype(x)
        _check_peer(self, self.dest)
        return (TensorDesc((0,), np.dtype(np.float32), x.device),)

    def cpu(self, x):
        comm = _comm(repr(self))
        x = np.ascontiguousarray(x)
        _wait([comm.Isend(_header(x), dest=self.dest, tag=_TAG_HEADER),
               comm.Isend(x, dest=self.dest, tag=_TAG_DATA)], repr(self))
        return np.zeros(0, np.float32)

    def vjp(self, inputs, outputs, grads):
        (x,), (g,) = inputs, grads
        return (RemoteRecv(self.dest, adjoint=True)(g, x),)


class RemoteRecv(_Collective):
    """``RemoteRecv(src)(token, like)``: a tensor shaped and typed as ``like`` from rank
    ``src`` (the sender's shape and dtype are checked). Its backward sends the gradient to
    ``src`` and returns it as the token's gradient (an empty tensor)."""

    def __init__(self, src: int, adjoint: bool = False):
        self.src = int(src)
        self._mark_adjoint(adjoint)

    def infer(self, token, like):
        _check_peer(self, self.src)
        return (TensorDesc(like.shape, like.dtype, like.device),)

    def cpu(self, token, like):
        comm = _comm(repr(self))
        header = np.empty(_MAXDIM + 2, np.int64)
        out = np.empty(like.shape, like.dtype)
        if self._deferring():
            return self._deferred_recv(comm, header, out)
        _wait(comm.Irecv(header, source=self.src, tag=_TAG_HEADER), repr(self))
        if not (header == _header(out)).all():
            # take the data off the wire all the same, so that the next message is not this one
            ndim = int(header[0])
            junk = np.empty(tuple(int(d) for d in header[2:2 + ndim]), _DTYPES.get(int(header[1]), np.uint8))
            _wait(comm.Irecv(junk, source=self.src, tag=_TAG_DATA), repr(self))
            raise self._mismatch(header, out)
        _wait(comm.Irecv(out, source=self.src, tag=_TAG_DATA), repr(self))
        return out

    def _mismatch(self, header, out) -> DistributedError:
        return DistributedError(f"{self!r}: rank {self.src} sent {_describe(header)}, this rank expected "
                                f"{_describe(_header(out))}")

    def _deferred_recv(self, comm, header, out):
        # both receives at once, so that the data moves while the backward goes on (the sender
        # sent the gradient's header and data in its forward's adjoint); the header is checked
        # when the buffer is read
        what = repr(self)
        header_request = comm.Irecv(header, source=self.src, tag=_TAG_HEADER)
        data_request = comm.Irecv(out, source=self.src, tag=_TAG_DATA)

        def check():
            _wait(header_request, what)
            if not (header == _header(out)).all():
                try:        # the data off the wire: it arrives, or is cut to this buffer's size with an MPI error
                    _wait(data_request, what)
                except Exception:
                    pass
                raise self._mismatch(header, out)
        return _pending.defer(out, [header_request, data_request], what, check, keep=(header,))

    def vjp(self, inputs, outputs, grads):
        # the token's gradient (zeros of its shape) depends on the send, so the send runs
        sent = RemoteSend(self.src)(grads[0])
        return (sent.sum().astype(inputs[0].dtype) + inputs[0] * 0, None)


def _concatenated(parts: np.ndarray, axis: int):
    """``(out, finish)``: the buffer that will hold ``parts`` (one per rank, stacked along
    a new first axis) concatenated along ``axis``, and what fills it once they arrived (None
    along axis 0: the stack itself, viewed, is the result)."""
    if axis % (parts.ndim - 1) == 0:
        return parts.reshape((-1,) + parts.shape[2:]), None
    shape = list(parts.shape[1:])
    shape[axis] *= parts.shape[0]
    out = np.empty(shape, parts.dtype)
    return out, lambda: np.concatenate(list(parts), axis=axis, out=out)


def _resized(op, x, shrink: Optional[int] = None, grow: Optional[int] = None) -> tuple:
    """``x``'s description with axis ``shrink`` divided by the number of ranks (which it must be
    a multiple of) and axis ``grow`` multiplied by it: the output of a split and/or concatenation
    over the ranks."""
    op._check_dtype(x)
    if x.shape is None:
        return (TensorDesc(None, x.dtype, x.device),)
    size, shape = _world_size(), list(x.shape)
    if shrink is not None:
        s = _axis(op, x, shrink)
        if shape[s] % size:
            raise op.error(f"axis {shrink} has {shape[s]} elements, not a multiple of the {size} ranks", x)
        shape[s] //= size
    if grow is not None:
        shape[_axis(op, x, grow)] *= size
    return (TensorDesc(tuple(shape), x.dtype, x.device),)


def _axis(op, x, axis: int) -> int:
    if not -x.ndim <= axis < x.ndim:
        raise op.error(f"axis {axis} is out of range for a tensor of {x.ndim} dimensions", x)
    return axis % x.ndim


def _check_root(op, root: int) -> None:
    size = _world_size()
    if not 0 <= root < size:
        raise op.error(f"root {root} is not a rank of the world of {size}")


def _check_peer(op, peer: int) -> None:
    size = _world_size()
    if not 0 <= peer < size:
        raise op.error(f"rank {peer} is not a rank of the world of {size}")
    if peer == _rank():
        raise op.error(f"rank {peer} is this rank: send to and receive from another rank")


# ---------------------------------------------------------------- the functions (MegEngine's names)
def _raised(out: _core.Tensor) -> _core.Tensor:
    if COLLECTIVE_PRIORITY:
        set_backward_priority(out, COLLECTIVE_PRIORITY)
    return out


def _tensor(inp, name: str, group=WORLD) -> _core.Tensor:
    """``inp``, checked to be a Tensor (and ``group`` the world), with MPI running."""
    _group(group, name)
    if not isinstance(inp, _core.Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(inp).__name__}")
    _comm(name)
    return inp


def all_reduce_sum(inp: _core.Tensor, group: Group = WORLD) -> _core.Tensor:
    """The elementwise sum of ``inp`` over the ranks, on every rank. Example:
    ``all_reduce_sum(gc.tensor([float(rank)]))`` is ``[0 + 1 + ...]`` everywhere."""
    return _raised(AllReduce("sum")(_tensor(inp, "all_reduce_sum", group)))


def all_reduce_max(inp: _core.Tensor, group: Group = WORLD) -> _core.Tensor:
    """The elementwise maximum over the ranks, on every rank; its gradient goes to the rank(s)
    holding the maximum (shared evenly among ties). Example: ``all_reduce_max(x)``."""
    return _raised(AllReduce("max")(_tensor(inp, "all_reduce_max", group)))


def all_reduce_min(inp: _core.Tensor, group: Group = WORLD) -> _core.Tensor:
    """The elementwise minimum over the ranks, on every rank (gradient as ``all_reduce_max``).
    Example: ``all_reduce_min(x)``."""
    return _raised(AllReduce("min")(_tensor(inp, "all_reduce_min", group)))


def all_gather(inp: _core.Tensor, group: Group = WORLD, axis: int = 0) -> _core.Tensor:
    """Every rank's ``inp`` concatenated along ``axis`` in rank order, on every rank.
    Example: with 2 ranks, ``all_gather(x)`` of shape (3,) has shape (6,)."""
    return _raised(AllGather(axis)(_tensor(inp, "all_gather", group)))


def reduce_scatter_sum(inp: _core.Tensor, group: Group = WORLD, axis: int = 0) -> _core.Tensor:
    """The sum over the ranks split along ``axis``: rank r gets part r. Example: with 2
    ranks, ``reduce_scatter_sum(x)`` of shape (4,) has shape (2,)."""
    return _raised(ReduceScatterSum(axis)(_tensor(inp, "reduce_scatter_sum", group)))


def all_to_all(inp: _core.Tensor, group: Group = WORLD, split_axis: int = 0,
               concat_axis: int = 0) -> _core.Tensor:
    """Split ``inp`` along ``split_axis`` into one part per rank, send part k to rank k,
    concatenate what arrives along ``concat_axis`` (rank order). Example: a table's rows
    sharded by rank, looked up by every rank: ``all_to_all(rows, split_axis=0, concat_axis=0)``."""
    return _raised(AllToAll(split_axis, concat_axis)(_tensor(inp, "all_to_all", group)))


def broadcast(inp: _core.Tensor, group: Group = WORLD, root: int = 0) -> _core.Tensor:
    """The root's ``inp`` on every rank (each rank passes a tensor of that shape and dtype).
    Example: ``broadcast(x, root=0)``."""
    return _raised(Broadcast(root)(_tensor(inp, "broadcast", group)))


def reduce_sum(inp: _core.Tensor, group: Group = WORLD, root: int = 0) -> _core.Tensor:
    """The sum over the ranks on ``root``; zeros of the same shape elsewhere (MegEngine:
    None). Example: ``total = reduce_sum(x, root=0)``."""
    return _raised(ReduceSum(root)(_tensor(inp, "reduce_sum", group)))


def scatter(inp: _core.Tensor, group: Group = WORLD, root: int = 0, axis: int = 0) -> _core.Tensor:
    """The root's ``inp`` split along ``axis`` into one part per rank: rank r gets part r
    (every rank passes a tensor of the root's shape; only the root's is read). Example: with 2
    ranks, ``scatter(x)`` of shape (4, 3) is (2, 3) on each."""
    x = _tensor(inp, "scatter", group)
    size = _world_size()
    shape = list(x.shape)
    if not shape or not -len(shape) <= axis < len(shape) or shape[axis] % size:
        raise DistributedError(f"scatter: a tensor of shape {tuple(x.shape)} does not split along axis "
                               f"{axis} into {size} equal parts")
    shape[axis] //= size
    return _raised(Scatter(root, axis)(x, _core.Tensor(np.zeros(shape, np.dtype(x.dtype)))))


def gather(inp: _core.Tensor, group: Group = WORLD, root: int = 0, axis: int = 0) -> _core.Tensor:
    """Every rank's ``inp`` concatenated along ``axis`` (rank order) on ``root``; on the other
    ranks an empty tensor (MegEngine: None) to pass to ``gm.backward`` with the rank's other
    outputs, so that the adjoint scatter runs there too. Example: ``g = gather(x, root=0)``."""
    x = _tensor(inp, "gather", group)
    shape = list(x.shape)
    if not shape or not -len(shape) <= axis < len(shape):
        raise DistributedError(f"gather: axis {axis} is out of range for a tensor of shape {tuple(shape)}")
    if _rank() == root:
        shape[axis] *= _world_size()
    else:
        shape = [0]
    return _raised(Gather(root, axis)(x, _core.Tensor(np.zeros(shape, np.dtype(x.dtype)))))


def remote_send(inp: _core.Tensor, dest_rank: int) -> _core.Tensor:
    """Send ``inp`` to rank ``dest_rank``. Returns an empty token: pass it to ``gm.backward``
    (with the rank's other outputs, if any) so that the gradient coming back from
    ``dest_rank`` reaches ``inp``. Example: ``token = remote_send(x, 1)``."""
    return _raised(RemoteSend(dest_rank)(_tensor(inp, "remote_send")))


def remote_recv(src_rank: int, shape: Sequence[int], dtype="float32", device: Optional[str] = None,
                inp: Optional[_core.Tensor] = None) -> _core.Tensor:
    """A tensor of ``shape`` and ``dtype`` sent by rank ``src_rank`` (its shape and dtype are
    checked against the sender's). For a gradient to flow back to the sender, give an ``inp``
    tracked by the recording GradManager (an empty float32 tensor attached to it; as
    MegEngine's dummy input). Example: ``y = remote_recv(0, (2, 3), "float32", inp=dummy)``."""
    _comm("remote_recv")
    if device not in (None, "cpu"):
        raise DistributedError(f"remote_recv: collectives run on the cpu, got device {device!r}")
    token = inp if inp is not None else _core.Tensor(np.zeros(0, np.float32))
    if not isinstance(token, _core.Tensor):
        raise TypeError(f"remote_recv: inp must be a Tensor, got {type(token).__name__}")
    like = _core.Tensor(np.zeros(tuple(int(d) for d in shape), np.dtype(dtype)))
    return _raised(RemoteRecv(src_rank)(token, like))
