"""GradManager and Function, with MegEngine's semantics.

Example::

    >>> gm = GradManager().attach(model.parameters())
    >>> with gm:
    ...     loss = F.cross_entropy(model(x), y)
    ...     gm.backward(loss)
    >>> opt.step().clear_grad()
"""
from __future__ import annotations

import threading
import weakref
from _thread import get_ident as _get_ident
from typing import Callable, Iterable, List, Optional, Union

from . import _core
from ._core import Tensor
from ._core import GradKey, _thread_state
from .anomaly import AnomalyError, detect_anomaly, is_anomaly_enabled
from .op import ArgumentTypeError

__all__ = ["GradManager", "GradManagerGroup", "Function", "get_backwarding_grad_manager",
           "detect_anomaly", "is_anomaly_enabled", "AnomalyError", "set_backward_priority",
           "backward_priority"]


def set_backward_priority(tensor: Tensor, priority: int) -> Tensor:
    """Raise the backward of the op that produced ``tensor``: among the nodes
    whose gradients are complete, the backward runs the highest priority
    first, then the latest recorded (PyTorch's sequence-number override).
    The nodes between the outputs and that op are raised with it, so its
    backward starts as soon as it can. Returns ``tensor``. Without any
    priority the backward is the plain reverse walk, at its usual cost.

    Example::

        >>> from gradcore.autodiff import set_backward_priority
        >>> x = gc.tensor([1.0, 2.0]); gm = gc.GradManager().attach([x])
        >>> with gm:
        ...     a = set_backward_priority(F.exp(x), 1)     # its backward first
        ...     gm.backward((a + x * x).sum())
        >>> x.grad.numpy().round(4)     # exp(x) + 2 x
        array([ 4.7183, 11.3891], dtype=float32)
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"set_backward_priority: expected a Tensor, got {type(tensor).__name__}")
    _core._set_node_priority(tensor, _priority(priority, "set_backward_priority"))
    return tensor


class backward_priority:
    """``with backward_priority(p):`` every op recorded inside, in this
    thread, gets backward priority ``p`` (see ``set_backward_priority``);
    contexts nest, the innermost wins.

    Example::

        >>> from gradcore.autodiff import backward_priority
        >>> x = gc.tensor([1.0, 2.0]); gm = gc.GradManager().attach([x])
        >>> with gm:
        ...     with backward_priority(1):
        ...         a = F.exp(x)     # its backward runs before those of lower priority
        ...     gm.backward((a + x * x).sum())
        >>> x.grad.numpy().round(4)     # exp(x) + 2 x
        array([ 4.7183, 11.3891], dtype=float32)
    """

    def __init__(self, priority: int):
        self.priority = _priority(priority, "backward_priority")
        self._previous = []

    def __enter__(self) -> "backward_priority":
        self._previous.append(_core._enter_backward_priority(self.priority))
        return self

    def __exit__(self, *exc) -> None:
        _core._exit_backward_priority(self._previous.pop())


def _priority(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: the priority must be an int, got {type(value).__name__} {value!r}")
    if not -(1 << 31) < value < (1 << 31):
        raise ValueError(f"{name}: the priority must fit in 32 bits, got {value}")
    return value

def _backwarding() -> List["GradManager"]:
    """The managers whose backward runs in the calling thread, innermost last
    (per thread: the core's thread state keeps the list)."""
    return _core._thread_state().backwarding


def get_backwarding_grad_manager() -> Optional["GradManager"]:
    """The GradManager whose ``backward`` is running now in the calling
    thread (innermost), or None (MegEngine's function): lets a callback such
    as gradcore.distributed's allreduce find the manager that called it.

    Example::

        >>> def cb(tensor, grad):
        ...     assert get_backwarding_grad_manager() is gm
        ...     return grad
    """
    managers = _core._thread_state().backwarding
    return managers[-1] if managers else None


def _thread_name() -> str:
    return threading.current_thread().name


class _AttachSpec:
    __slots__ = ("tensor", "callbacks", "on_grad")

    def __init__(self, tensor_ref, callbacks):
        self.tensor = tensor_ref
        self.callbacks = callbacks
        self.on_grad = None       # the Grad callback, made once per spec


class AttachDtypeError(TypeError, AssertionError):
    """Attaching a tensor that cannot have a gradient (an integer or bool
    one). An AssertionError too, which is what MegEngine raises."""


class _ForeignBackward(Exception):
    """A backward from a thread that is not the recording's owner, refused
    before it ran (raised to the caller as a RuntimeError)."""


class GradManager:
    """Records operations on attached tensors and computes their gradients.

    ``attach(tensors, callbacks)`` (callbacks ``cb(tensor, grad) -> grad``
    chain in order), ``record()`` / ``release()`` or ``with gm:``, and
    ``backward(y, dy)`` which accumulates into ``tensor.grad`` and ends the
    recording. Nested managers give higher-order gradients.

    Example::

        >>> w = gc.Parameter([1.0, 3.0])
        >>> gm = gc.GradManager().attach([w])
        >>> with gm:
        ...     gm.backward((w * w).sum())
        >>> w.grad.numpy()
        array([2., 6.], dtype=float32)
    """

    def __init__(self):
        self._attach_specs = {}      # id(tensor) -> _AttachSpec
        self._recording = False
        self._key: Optional[GradKey] = None
        self._gradients = {}
        self._after_backward_callbacks: List[Callable] = []
        # record/backward/release claim the recording under this lock: one
        # manager used from two threads at once raises instead of mixing graphs
        self._lock = threading.Lock()
        self._backward_thread: Optional[int] = None   # ident of the thread in backward
        # what record() attaches: (version, ((tensor ref, gradient callback),
        # ...)) in attach order, made again after a change to the attached
        # set (each change bumps _version after it is made, so a plan built
        # while another thread attaches is stale, never wrong)
        self._version = 0
        self._plan: tuple = (-1, ())

    # ---- attaching
    def attach(self, tensors: Union[Tensor, Iterable[Tensor]], callbacks=None) -> "GradManager":
        if callbacks is None:
            callbacks = []
        elif callable(callbacks):
            callbacks = [callbacks]
        else:
            try:
                callbacks = list(callbacks)
            except TypeError:
                raise TypeError(f"GradManager.attach: callbacks must be a callable or a list of them, "
                                f"got {type(callbacks).__name__}") from None
            for cb in callbacks:
                if not callable(cb):
                    raise TypeError(f"GradManager.attach: a callback is not callable: {cb!r}")
        if isinstance(tensors, Tensor):
            tensors = [tensors]
        try:
            tensors = list(tensors)
        except TypeError:
            raise ArgumentTypeError(f"GradManager.attach: expected a Tensor or an iterable of Tensors, "
                                    f"got {type(tensors).__name__}") from None
        for t in tensors:
            if not isinstance(t, Tensor):
                raise ArgumentTypeError(f"GradManager.attach: expected Tensors, got {type(t).__name__}")
            if t.dtype.kind not in "fc":
                raise AttachDtypeError(f"GradManager.attach: only tensors of floating point dtype can be "
                                       f"attached, got {t.dtype} of shape {t.shape}")
        for t in tensors:
            spec = self._attach_specs.get(id(t))
            new = spec is None
            if new:
                spec = _AttachSpec(weakref.ref(t, self._deleter(id(t))), [])
                self._attach_specs[id(t)] = spec
            spec.callbacks.extend(callbacks)
            self._version += 1
            if new and self._recording:
                with self._lock:
                    if self._key is not None:
                        self._do_record(spec)
        return self

    def _deleter(self, key):
        selfref = weakref.ref(self)

        def drop(_):
            gm = selfref()
            if gm is not None:
                gm._attach_specs.pop(key, None)
                gm._version += 1
        return drop

    def attached_tensors(self) -> List[Tensor]:
        """The attached tensors that are still alive, in attach order."""
        return [t for t in (s.tensor() for s in self._attach_specs.values()) if t is not None]

    def is_attached(self, tensor: Tensor) -> bool:
        return id(tensor) in self._attach_specs

    def register_after_backward_callback(self, callback: Callable) -> "GradManager":
        """``callback()`` runs after every backward, before ``.grad`` is set.

        Example::

            >>> gm = GradManager().register_after_backward_callback(lambda: print("done"))
        """
        if not callable(callback):
            raise TypeError(f"GradManager.register_after_backward_callback: the callback must be callable, "
                            f"got {type(callback).__name__}")
        self._after_backward_callbacks.append(callback)
        return self

    # ---- recording
    def _do_record(self, spec):
        tensor = spec.tensor()
        if tensor is not None:
            self._key.attach(tensor, self._on_grad(spec, tensor))

    def _on_grad(self, spec, tensor):
        """The gradient callback of an attached tensor (made once per spec)."""
        if spec.on_grad is None:
            key, selfref = id(tensor), weakref.ref(self)

            # captures the spec's parts, not the spec: no reference cycle
            def on_grad(grad, tref=spec.tensor, callbacks=spec.callbacks, key=key, dtype=tensor.dtype):
                t = tref()
                # (an identity test first: dtypes are interned, this is per backward)
                if grad.dtype is not dtype and t is not None and grad.dtype != t.dtype:
                    # a float32 tensor used with float64 ones gets a float32
                    # gradient (torch; MegEngine casts before such ops)
                    grad = grad.astype(t.dtype)
                for cb in callbacks:
                    grad = cb(t, grad)
                    # (None: no gradient, as in MegEngine; a future, from
                    # distributed's allreduce; a Tensor must fit the tensor)
                    if isinstance(grad, Tensor) and t is not None and grad.shape != t.shape:
                        raise ValueError(f"GradManager: the callback {getattr(cb, '__name__', cb)!r} "
                                         f"returned a gradient of shape {grad.shape} for an attached "
                                         f"tensor of shape {t.shape}")
                gm = selfref()
                if gm is not None:
                    gm._gradients[key] = grad
            spec.on_grad = on_grad
        return spec.on_grad

    def _attach_plan(self) -> tuple:
        version = self._version         # read first: a change made meanwhile makes the plan stale
        plan = tuple((spec.tensor, self._on_grad(spec, tensor)) for spec in list(self._attach_specs.values())
                     if (tensor := spec.tensor()) is not None)
        self._plan = (version, plan)
        return plan

    def record(self) -> "GradManager":
        """Start recording the ops that the calling thread runs on the
        attached tensors (until ``backward`` or ``release``)."""
        # the locks of record, backward and their end are taken with
        # acquire()/release() in try/finally: `with lock:` costs ~2,000
        # instructions (Lock.__exit__ takes a tuple of arguments), these ~850
        lock = self._lock
        lock.acquire()
        try:
            if self._recording:
                owner, here = self._key.owner_name if self._key is not None else "?", _thread_name()
                if owner == here:
                    raise RuntimeError("GradManager is already recording")
                raise RuntimeError(f"GradManager is already recording, in thread {owner!r}; called again "
                                   f"from thread {here!r}: one manager records one graph at a time. "
                                   f"Give each thread its own GradManager")
            key = GradKey("GradManager")
            key.enter()
            self._key = key
            self._recording = True
            if self._gradients:
                self._gradients = {}
            attach = key.attach
            version, plan = self._plan
            for tref, on_grad in plan if version == self._version else self._attach_plan():
                tensor = tref()
                if tensor is not None:
                    attach(tensor, on_grad)
        finally:
            lock.release()
        return self

    def release(self) -> None:
        """End the recording (``backward`` does it too)."""
        self._release(False)

    def _release(self, own_only: bool) -> None:
        with self._lock:
            if self._backward_thread is not None and self._backward_thread != _get_ident():
                # the backward running in another thread ends the recording
                # when it is done; ending it under its feet would lose its gradients
                return
            if own_only and self._key is not None and not self._key.entered_in_this_thread:
                # `with gm:` ends the recording it started, not one that
                # another thread started after this thread's backward ended it
                return
            key, self._key = self._key, None
            self._recording = False
            if self._gradients:
                self._gradients = {}
        if key is not None:
            key.exit()

    def _end_backward(self) -> None:
        """A backward (of this thread, claimed in ``backward``) ends the recording."""
        lock = self._lock
        lock.acquire()
        try:
            self._backward_thread = None
            key, self._key = self._key, None
            self._recording = False
            if self._gradients:
                self._gradients = {}
        finally:
            lock.release()
        if key is not None:
            key.exit()

    def __del__(self):
        # a manager dropped while recording: nothing can run its backward any
        # more, but its key would stay on the core's list of recording keys
        # and keep recording every op on the attached tensors (a tape that
        # grows for ever). End the recording, as MegEngine's GradKey does
        # when it is destroyed.
        try:
            if self._key is not None:
                self._key.exit()
                self._key = None
        except Exception:       # interpreter shutdown
            pass

    # `with gm:` is record() itself, which returns the manager: no frame more
    __enter__ = record

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._key is None:
            # the common case: backward ended the recording already (a key
            # is set and cleared only together with _recording, under the lock)
            return
        self._release(True)

    @property
    def recording(self) -> bool:
        return self._recording

    # ---- backward
    def backward(self, y=None, dy=None) -> None:
        """Compute the gradients of ``y`` (a Tensor or a list) weighted by
        ``dy`` (default ones) and add them to the attached tensors' ``.grad``.
        Ends the recording. An integer or bool output (argmax's) has no
        gradient and raises a RuntimeError; a float output without history in
        this recording (MegEngine's visibility by order) leaves ``.grad``
        unchanged."""
        lock = self._lock
        lock.acquire()
        try:
            if not self._recording:
                raise RuntimeError("GradManager.backward: no computation history: call record() "
                                   "(or use `with gm:`) before backward; a manager records for one "
                                   "backward only")
            if self._backward_thread is not None:
                raise RuntimeError(f"GradManager.backward: a backward of this manager is already running "
                                   f"(called again from thread {_thread_name()!r}); a manager records "
                                   f"for one backward only: give each thread its own GradManager")
            self._backward_thread = _get_ident()
            key = self._key
        finally:
            lock.release()
        try:
            if dy is None and isinstance(y, Tensor) and key.tracks(y):
                # the common call: one output of this recording, ones as its gradient
                ys, dys = [y], [None]
            else:
                ys, dys = self._checked_outputs(key, y, dy)
        except _ForeignBackward as exc:
            # refused before anything ran: the recording belongs to its
            # owner thread, whose own backward must still work
            with self._lock:
                self._backward_thread = None
            raise RuntimeError(str(exc)) from None
        except BaseException:
            # (a failed backward of the owner ends the recording, whatever
            # failed: the manager is never left recording after an error)
            self._end_backward()
            raise
        # (the backward itself, inline: a method call per backward is ~400 instructions)
        backwarding = _thread_state().backwarding
        backwarding.append(self)
        try:
            key.backward(ys, dys)
            for cb in self._after_backward_callbacks:
                cb()
            specs = self._attach_specs
            given = set()       # ids of the gradient objects handed to a tensor in this backward
            for tid, grad in self._gradients.items():
                if not isinstance(grad, Tensor) and hasattr(grad, "wait"):
                    grad = grad.wait()
                spec = specs.get(tid)
                tensor = spec.tensor() if spec is not None else None
                if tensor is None:
                    continue
                if tensor.grad is None:
                    if id(grad) in given:
                        # one gradient object reached two tensors (y = a + b): each gets
                        # its own, or a later in-place accumulation would show in both;
                        # a recorded copy (``* 1``, exact), so higher orders still see it
                        grad = grad * 1
                    given.add(id(grad))
                    tensor.grad = grad
                else:
                    # MegEngine's ``grad += g``: the same Tensor object is rebound to
                    # the sum, so a reference held to ``p.grad`` sees it
                    tensor.grad += grad
        finally:
            backwarding.pop()
            self._end_backward()

    def _checked_outputs(self, key: GradKey, y, dy):
        if dy is None and isinstance(y, Tensor):
            # the common call, checked already: one output, ones as its gradient
            ys, dys = [y], [None]
        else:
            ys, dys = self._outputs(y, dy)
        if ys and key.recording and not any(key.tracks(t) for t in ys):
            if not key.records_in_this_thread:
                # a backward from another thread than the recording one is fine
                # (the tape is differentiated where it is called), but ops run
                # in another thread were not recorded: say so, not a silent None
                raise _ForeignBackward(
                    f"GradManager.backward: called from thread {_thread_name()!r}, but no output "
                    f"has a history in this manager's recording, which belongs to thread "
                    f"{key.owner_name!r}: a thread's ops are recorded only by the managers "
                    f"that thread called record() on. Run the forward in {key.owner_name!r}, "
                    f"or record with a GradManager of this thread")
            # an integer or bool output (argmax's) can never carry a gradient:
            # raise (as PyTorch's "does not require grad"), not a silent .grad
            # of None. A float output without history stays a no-op: that is
            # MegEngine's visibility by order (a gradient made by an older
            # manager's backward) and an op without gradient (StopGradient)
            t = ys[0]
            if t.dtype.kind in "fc":
                return ys, dys
            why = f"an output of dtype {t.dtype} (an integer or bool result such as argmax's) has no gradient"
            raise RuntimeError(f"GradManager.backward: y (shape {t.shape}, dtype {t.dtype}) has no history "
                               f"in this manager's recording: {why}. Attach the tensors it depends on "
                               f"before computing it, inside `with gm:`")
        return ys, dys

    @staticmethod
    def _outputs(y, dy):
        ys = [] if y is None else list(y) if isinstance(y, (tuple, list)) else [y]
        # (None: ones, made by the core)
        dys = [None] * len(ys) if dy is None else list(dy) if isinstance(dy, (tuple, list)) else [dy]
        for t in ys:
            if not isinstance(t, Tensor):
                raise TypeError(f"GradManager.backward: y must be Tensors, got {type(t).__name__}")
        if len(dys) != len(ys):
            raise ValueError(f"GradManager.backward: {len(ys)} outputs but {len(dys)} output gradients")
        for i, (t, d) in enumerate(zip(ys, dys)):
            if d is None:
                continue
            if not isinstance(d, Tensor):
                try:
                    d = dys[i] = Tensor(d, dtype=t.dtype, device=t.device)
                except (TypeError, ValueError) as exc:
                    raise TypeError(f"GradManager.backward: dy must be a Tensor or array like y "
                                    f"(shape {t.shape}), got {type(d).__name__} ({exc})") from None
            elif d.device != t.device:
                # the output gradient follows its output, as the op results do
                d = dys[i] = d.to(t.device)
            if d.shape != t.shape:
                raise ValueError(f"GradManager.backward: dy of shape {d.shape} for y of shape {t.shape}")
        return ys, dys

    def __or__(self, other: "GradManager") -> "GradManagerGroup":
        if not isinstance(other, (GradManager, GradManagerGroup)):
            return NotImplemented
        return GradManagerGroup([self, other])

    __ror__ = __or__

    def __repr__(self):
        return f"<GradManager attached={len(self._attach_specs)} recording={self._recording}>"


class GradManagerGroup:
    """``gm1 | gm2``: record with several managers at once; none of them
    records the others' backward.

    Example::

        >>> w = gc.Parameter([2.0])
        >>> gm1, gm2 = gc.GradManager().attach([w]), gc.GradManager().attach([w])
        >>> with gm1 | gm2:
        ...     y = w * w * w
        ...     gm2.backward(y)     # gm1 does not record this backward
        >>> w.grad.numpy()
        array([12.], dtype=float32)
    """

    def __init__(self, gms):
        self._gms = []
        for gm in gms:
            self._gms.extend(gm._gms if isinstance(gm, GradManagerGroup) else [gm])

    def __or__(self, other):
        if not isinstance(other, (GradManager, GradManagerGroup)):
            return NotImplemented
        return GradManagerGroup(self._gms + [other])

    __ror__ = __or__

    def __enter__(self):
        _core._set_group_priority(True)
        started = []
        try:
            for gm in self._gms:
                gm.record()
                started.append(gm)
        except BaseException:
            # `with` does not call __exit__ when __enter__ fails: stop the
            # managers this group started, or they would record forever
            for gm in started:
                gm.release()
            raise
        finally:
            _core._set_group_priority(False)
        return self

    def __exit__(self, *exc):
        for gm in self._gms:
            gm.release()


def _nested_recording() -> bool:
    """Whether managers of different ages record now (higher order). Then a
    Function's forward runs with recording on, so that the older managers
    see its ops (as in MegEngine) and what it computed, which the backward
    may read, has a history they can differentiate."""
    keys = [k for k in _core._recording_keys() if k.records_in_this_thread]
    if len(keys) < 2:
        return False
    state = _core._debug_state()
    if state["no_record"] != 1:
        # not inside the core's own-rule call for this op
        return False
    below = state["visible_below"]
    return len({k.priority for k in keys if k.recording and k.priority < below}) > 1


_MISSING = object()


def _snapshot(t: Tensor) -> Tensor:
    """Another Tensor object with ``t``'s value and history."""
    s = Tensor.__new__(Tensor)
    s._reset(t)
    return s


class _Call:
    """What one call of a Function keeps for its backward: its own saved
    tensors (an instance may be called more than once), their versions, and
    which of them are the call's outputs."""
    __slots__ = ("fn", "saved", "versions", "output_index", "outputs", "__weakref__")

    def __init__(self, fn, args, raw_outputs):
        # args: what the forward got (the core's aliases of the caller's inputs)
        self.fn = fn
        self.outputs = self.output_index = self.versions = None
        saved = fn.saved_tensors
        if not saved:
            self.saved = ()
            return
        versions, kept = [], []
        for k, t in enumerate(saved):
            if isinstance(t, Tensor):
                if not any(t is a for a in args):     # inputs: versions checked by the core
                    versions.append((t, t._version))
                    # a saved output: the backward gets the output as returned
                    # to the caller, which carries its history (as in torch,
                    # for higher order)
                    for j, o in enumerate(raw_outputs):
                        if t is o:
                            if self.output_index is None:
                                self.output_index = {}
                            self.output_index[k] = j
                            break
                    # `t += 1` or `t[i] = v` rebinds the tensor object: keep the value saved
                    t = _snapshot(t)
            kept.append(t)
        self.saved = tuple(kept)
        self.versions = versions

    def backward(self, *output_grads):
        fn = self.fn
        for t, v in self.versions or ():
            if t._version != v:
                raise RuntimeError(
                    f"{fn._name()}: a tensor of shape {t.shape} that it saved for backward was "
                    f"modified in place afterwards (version {v} -> {t._version}, e.g. by an "
                    f"optimizer step); run backward before modifying it")
        saved = self.saved
        if self.output_index is not None and self.outputs is not None:
            saved = tuple(self.outputs[self.output_index[k]] if k in self.output_index else t
                          for k, t in enumerate(saved))
        # the instance sees this call's saved tensors only while its
        # backward runs: an instance the user keeps does not keep them alive
        # after the backward
        d = getattr(fn, "__dict__", None)
        prev = d.get("saved_tensors", _MISSING) if d is not None else _MISSING
        fn.saved_tensors = saved
        try:
            res = fn.backward(*output_grads)
        finally:
            if prev is not _MISSING:
                fn.saved_tensors = prev
            elif d is not None:
                d.pop("saved_tensors", None)
        return (res,) if isinstance(res, Tensor) or res is None else res


class Function:
    """A user-defined differentiable operation (MegEngine's Function).

    Subclass it with ``forward(*inputs)`` and ``backward(*output_grads)``;
    ``save_for_backward`` keeps tensors for the backward.

    Example::

        >>> class Square(gc.Function):
        ...     def forward(self, x):
        ...         self.save_for_backward(x); return x * x
        ...     def backward(self, dy):
        ...         (x,) = self.saved_tensors; return dy * 2 * x
        >>> x = gc.tensor([1.0, 3.0]); gm = gc.GradManager().attach([x])
        >>> with gm: gm.backward(Square()(x).sum())
        >>> x.grad.numpy()
        array([2., 6.], dtype=float32)
    """

    saved_tensors: tuple = ()

    def forward(self, *args):
        raise NotImplementedError(f"{type(self).__name__}.forward is not defined")

    def backward(self, *output_grads):
        raise NotImplementedError(f"{type(self).__name__}.backward is not defined")

    def save_for_backward(self, *tensors: Tensor) -> None:
        self.saved_tensors = tensors

    def _name(self) -> str:
        return type(self).__name__

    def _grad_rule(self, *args):
        # the core runs this with recording off; under nested managers the
        # older ones record the forward's ops (see _nested_recording)
        lift = _nested_recording()
        # while recording, the core hands the forward its own Tensor objects
        # (same value and history): `x += 1` after the call rebinds the
        # caller's x, not what the forward kept for the backward (in
        # saved_tensors or in attributes); a Parameter written in place
        # before backward is caught by the core's version check
        if lift:
            _core._no_record_exit()
        try:
            ret = self.forward(*args)
        except BaseException:
            # what a failed forward saved is not kept by the instance
            self.__dict__.pop("saved_tensors", None)
            raise
        finally:
            if lift:
                _core._no_record_enter()
        single = isinstance(ret, Tensor)
        self._single_output = single
        raw = (ret,) if single else tuple(ret) if isinstance(ret, (tuple, list)) else ()
        call = _Call(self, args, raw)
        # the call keeps what the forward saved; the instance does not (an
        # instance kept by the user would keep it alive after backward)
        self.__dict__.pop("saved_tensors", None)
        if call.output_index is not None:
            # __call__ hands the returned outputs over; a weak reference, so
            # that an instance and its calls form no cycle
            self._last_call = weakref.ref(call)
        elif "_last_call" in self.__dict__:
            del self._last_call      # left by a call that did not come through __call__
        return ret, call.backward

    def __call__(self, *args):
        for a in args:
            if not isinstance(a, Tensor):
                # MegEngine's wording ("op ... expect type Tensor as inputs")
                raise TypeError(f"op {type(self).__name__} expect type Tensor as inputs, got "
                                f"{type(a).__name__}")
        outs = _core.apply(self, *args)
        if "_last_call" in self.__dict__:
            call = self.__dict__.pop("_last_call")()
            if call is not None:
                call.outputs = tuple(_snapshot(o) for o in outs)
        return outs[0] if getattr(self, "_single_output", True) and len(outs) == 1 else outs
