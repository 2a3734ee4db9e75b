"""Deferred results: buffers that a non-blocking MPI request is still filling.

The adjoint collectives of ``gradcore.distributed.functional`` post their
request in a raw-mode backward and return their output buffer at once, so
that the backward goes on with independent work while the data moves; the
buffer is registered here with its request(s). The core (which imports
nothing of this package) calls the hooks installed below before anything
reads such a buffer:

- ``before_node(grads, reads)``: a backward node is about to run on
  ``grads``: complete the ones in flight that it reads, and test the others
  (many MPI libraries progress a request only inside MPI calls);
- ``settle(g)``: a gradient is about to be added to another, or to leave
  the core (a leaf's callback, GradManager, the user): complete it;
- ``settle_all(exc)``: the backward ends (``exc`` None) or fails (``exc``
  the exception): complete everything still in flight, so that no request
  outlives the backward.

Every wait has the deadline of ``gradcore.distributed.init(timeout=)`` and
raises the same :class:`~gradcore.distributed.DistributedError` as the
collectives' own waits. The core calls the hooks only while
``_core._set_pending_count`` says something is in flight: with nothing
deferred, a backward pays one C int test per node.

Example (what an adjoint kernel does)::

    out = np.empty_like(send)
    request = comm.Ialltoall(send, out)
    return defer(out, [request], "AllToAll(...)")      # the gradient, not complete yet
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

from .. import _core
from . import DistributedError, _state
from . import _wait as _dist_wait

__all__ = ["defer", "in_flight", "settle_all", "set_trace"]


def _wait(requests, what: str) -> None:
    """The collectives' wait (a Test loop with the deadline); a module-level
    name so that a trace can wrap it."""
    _dist_wait(requests, what)


class _Entry:
    """One deferred result: the buffer handed out, the requests that fill it,
    a check to run first (the shapes the ranks exchanged) and a finish to run
    after (copying what arrived into the buffer)."""
    __slots__ = ("result", "requests", "what", "check", "finish", "keep", "tested")

    def __init__(self, result, requests, what, check, finish, keep):
        self.result = result
        self.requests = requests
        self.what = what
        self.check = check
        self.finish = finish
        self.keep = keep             # the buffers MPI reads and writes (mpi4py holds no reference)
        self.tested = False          # every request seen complete by a progress test


# id(result) -> entry, in the order the requests were posted (dicts keep it);
# the entry holds the result, so its id stays its own while it is here
_entries: Dict[int, _Entry] = {}
_trace: Optional[Callable[[str], None]] = None


def set_trace(trace: Optional[Callable[[str], None]]) -> None:
    """Call ``trace(event)`` with "deferred: <collective>" when an adjoint
    collective returns its buffer unfinished and "completed: <collective>"
    when it is waited for (None: stop). For tests and profiling.

    Example::

        events = []
        set_trace(events.append)
        gm.backward(loss)        # ['deferred: AllToAll(...)', ..., 'completed: AllToAll(...)']
        set_trace(None)
    """
    global _trace
    _trace = trace


def defer(result, requests: Sequence, what: str, check: Optional[Callable[[], None]] = None,
          finish: Optional[Callable[[], None]] = None, keep: tuple = ()):
    """Register ``result``, a buffer that ``requests`` (non-blocking MPI
    requests, already posted) are filling, and return it. Before anything
    reads it, the core has the registry run ``check()`` (which may wait for
    some of the requests itself), wait for the requests (up to the deadline)
    and run ``finish()``. ``keep``: the arrays the requests read or write,
    held until then.

    Example::

        out = np.empty_like(x)
        return defer(out, [comm.Iallreduce(x, out, op=MPI.SUM)], "AllReduce(mode='sum')", keep=(x,))
    """
    _entries[id(result)] = _Entry(result, list(requests), what, check, finish, keep)
    _core._set_pending_count(len(_entries))
    if _trace is not None:
        _trace(f"deferred: {what}")
    return result


def in_flight() -> int:
    """How many deferred results are not completed yet (0 outside a backward).

    Example::

        gm.backward(loss)
        assert in_flight() == 0
    """
    return len(_entries)


def _complete(e: _Entry) -> None:
    # (the entry is out of the registry already: a failure is not retried)
    if e.check is not None:
        e.check()
    _wait(e.requests, e.what)
    if e.finish is not None:
        e.finish()
    if _trace is not None:
        _trace(f"completed: {e.what}")


def _settle_one(key: int) -> None:
    e = _entries.pop(key, None)
    if e is None:
        return
    try:
        _complete(e)
    finally:
        _core._set_pending_count(len(_entries))


def settle(g) -> None:
    """Complete ``g`` (an array, or a tuple of them, or anything else) if it
    is a deferred result; the core's hook before a gradient is read."""
    if type(g) is tuple:
        for x in g:
            if id(x) in _entries:
                _settle_one(id(x))
    elif id(g) in _entries:
        _settle_one(id(g))


def _progress() -> None:
    # a Test drives MPI libraries that progress only inside MPI calls; an
    # error here (a request that failed) is left for the wait to report
    MPI = _state.MPI
    for e in list(_entries.values()):
        if not e.tested:
            try:
                e.tested = MPI.Request.Testall(e.requests)
            except Exception:
                e.tested = True


def before_node(grads, reads: bool) -> None:
    """The core's hook before a backward node runs on ``grads``: complete
    those it reads, test the rest."""
    if reads:
        settle(grads)
    if _entries:
        _progress()


def settle_all(exc: Optional[BaseException] = None) -> None:
    """Complete every deferred result, in the order they were posted. With
    ``exc`` (the backward is failing) errors are not raised: the caller
    re-raises ``exc``; after a deadline error the rest is not waited for
    (the other ranks are gone) and every request is given up on.

    Example: ``settle_all()`` at the end of a backward."""
    if exc is None:
        while _entries:
            _settle_one(next(iter(_entries)))
        return
    entries: List[_Entry] = list(_entries.values())
    _entries.clear()
    _core._set_pending_count(0)
    if getattr(exc, "timed_out", False) or getattr(exc.__cause__, "timed_out", False):
        return                     # a rank did not answer: a second deadline would not help
    requests = [r for e in entries for r in e.requests]
    try:
        # all at once: one deadline, not one per request
        _wait(requests, f"{len(entries)} deferred collective(s) of a failed backward")
    except Exception:
        pass


class _Hooks:
    """What the core calls (see the module's docstring)."""
    before_node = staticmethod(before_node)
    settle = staticmethod(settle)
    settle_all = staticmethod(settle_all)


_core._set_pending_hooks(_Hooks())
