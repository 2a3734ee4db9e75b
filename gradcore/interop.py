"""Zero-copy exchange with NumPy, PyTorch, CuPy, Numba: DLPack and
``__cuda_array_interface__``.

- ``Tensor.__dlpack__`` / ``__dlpack_device__``: ``np.from_dlpack(t)`` and
  ``torch.from_dlpack(t)`` view ``t``'s memory (cpu through NumPy's own
  capsule, cuda through ``gradcore.cuda.dlpack``'s).
- ``Tensor.__cuda_array_interface__`` (cuda tensors only): CuPy and Numba
  view a cuda tensor's memory.
- ``gradcore.from_dlpack(obj)``: a Tensor viewing the memory of anything
  with ``__dlpack__`` (or, on cuda, ``__cuda_array_interface__``), or of a
  DLPack capsule.

Other frameworks (below): ``to_torch`` makes a gradcore op or function of
gradcore tensors a PyTorch function, differentiable by ``torch.autograd`` to
any order; ``from_torch`` makes a PyTorch function a gradcore op;
``to_jax`` makes a gradcore op a JAX function; ``check_torch`` (``gradcore
check --torch``) compares an op's PyTorch form with its native form.

Shared memory carries no history: a Tensor made by ``from_dlpack`` is a
leaf, the exported array has no gradient, and a write through the other
library is not seen by gradcore's in-place checks on values saved for
backward (do not write into a tensor a recorded op still needs).

Writes through the other library are seen by gradcore, but gradcore's own
in-place updates (``t[i] = v``, ``t += 1``, ``t[...] = 0``) are recorded ops:
they give ``t`` a new buffer and leave the old one as it was (a recorded op
may still need the old values for its gradient). A NumPy or PyTorch view
made before the update keeps showing the old values; export again
(``torch.from_dlpack(t)``) after updating, or update through the other
library (``u = torch.from_dlpack(t); u[0] = 5``), which writes into the
shared buffer.

A tensor with negative strides (a reversed view such as ``t[::-1]``) is
not exported as a view: DLPack consumers mishandle negative strides
(PyTorch aborts the process on them), so ``__dlpack__`` raises
``BufferError`` and names the fix, ``t[::-1].copy()``, as NumPy refuses to
export a read-only array. A consumer that asks for a copy (``copy=True``,
e.g. ``np.from_dlpack(t, copy=True)``) gets a contiguous copy.

Example::

    >>> import numpy as np, gradcore as gc
    >>> a = np.zeros(3, np.float32)
    >>> t = gc.from_dlpack(a)
    >>> a[0] = 5
    >>> t.numpy()
    array([5., 0., 0.], dtype=float32)
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _core
from ._core import Tensor, wrap_array

_CPU_DEVICE_TYPES = (1, 3)        # kDLCPU, kDLCUDAHost (host-visible)
_CUDA_DEVICE_TYPES = (2, 13)      # kDLCUDA, kDLCUDAManaged
_CPU = (1, 0)                     # DLPack's (device type, id) of host memory


def tensor_dlpack(self: Tensor, *, stream: Optional[int] = None, max_version: Optional[Tuple[int, int]] = None,
                  dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None):
    """``Tensor.__dlpack__``: a DLPack capsule viewing the tensor's memory
    (the array API standard's signature; ``stream`` must be None on cpu).
    A tensor with negative strides raises ``BufferError`` unless ``copy`` is
    True (then a contiguous copy is exported): see the module docstring.

    Example::

        >>> t = gc.tensor([1.0, 2.0, 3.0])
        >>> np.from_dlpack(t).tolist()
        [1.0, 2.0, 3.0]
    """
    data = self._data
    if self._device == "cpu" and any(s < 0 for s in data.strides):
        if not copy:
            raise BufferError(
                f"__dlpack__: this tensor (shape {tuple(data.shape)}) has negative strides (a reversed view "
                f"such as t[::-1]), which DLPack consumers such as PyTorch cannot import; export a contiguous "
                f"copy: t[::-1].copy() (or ask the consumer for a copy, copy=True)")
        data, copy = np.ascontiguousarray(data), None     # the copy asked for, made here
    return data.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)


def tensor_dlpack_device(self: Tensor) -> Tuple[int, int]:
    """``Tensor.__dlpack_device__``: (device type, device id), e.g. (1, 0) on cpu."""
    return self._data.__dlpack_device__()


def tensor_cuda_array_interface(self: Tensor) -> dict:
    """``Tensor.__cuda_array_interface__``; an AttributeError on a cpu tensor
    (so ``hasattr`` says whether a tensor has one, as CuPy and Numba ask)."""
    if self._device != "cuda":
        raise AttributeError("__cuda_array_interface__: only cuda tensors have one "
                             f"(this tensor is on {self._device}); use __dlpack__ or numpy()")
    return self._data.__cuda_array_interface__


class _Capsule:
    """Gives a bare DLPack capsule the ``__dlpack__`` protocol (NumPy's
    ``from_dlpack`` takes objects, not capsules); ``device`` is read from
    the capsule unless given."""

    __slots__ = ("_capsule", "_device")

    def __init__(self, capsule, device: Optional[Tuple[int, int]] = None):
        if device is None:
            from .cuda import dlpack
            device = dlpack.capsule_device(capsule)
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, **_ignored):
        return self._capsule

    def __dlpack_device__(self):
        return self._device


def _checked_dtype(obj, arr):
    # the same refusal as Tensor(data): complex, strings... are not computed in
    if arr.dtype.kind not in "biuf" or arr.dtype.itemsize > 8:
        raise TypeError(f"gradcore.from_dlpack: {type(obj).__name__} of dtype {arr.dtype} (shape "
                        f"{tuple(arr.shape)}) cannot be shared; gradcore computes in bool, integers and "
                        f"float16/float32/float64")
    return arr


def from_dlpack(obj: Any) -> Tensor:
    """A Tensor sharing memory with ``obj``: a NumPy array, a PyTorch, CuPy
    or JAX array, anything with ``__dlpack__``, a DLPack capsule, or (cuda)
    anything with ``__cuda_array_interface__``. No copy is made; ``obj``'s
    memory stays alive as long as the tensor does.

    Writes through ``obj`` are seen by the tensor. An in-place update on
    gradcore's side (``t[i] = v``, ``t += 1``) is a recorded op that gives
    the tensor a new buffer: ``obj`` keeps the old values and no longer
    shares memory with ``t`` (docs/interop.md).

    The memory is shared, and so are writes: a value that gradcore saved for
    a backward (the input of a ``mul``, say) is read again by that backward,
    so changing ``obj`` in place (``torch``'s ``mul_``, ``copy_``...) between
    the forward and the backward gives a gradient computed from the new
    values. gradcore cannot see the exporter's writes (DLPack carries no
    version counter); clone the buffer first (``gradcore.tensor(obj)``, a
    copy) if the exporter writes it while a recording uses it.

    Example::

        >>> import torch
        >>> t = gc.from_dlpack(torch.arange(3.0))     # shares torch's memory, no copy
        >>> t
        Tensor([0., 1., 2.], dtype=float32, device=cpu)
    """
    if type(obj).__name__ == "PyCapsule":
        obj = _Capsule(obj)
    if hasattr(obj, "__dlpack__"):
        device_type, _device_id = obj.__dlpack_device__()
        if device_type in _CPU_DEVICE_TYPES:
            try:
                arr = np.from_dlpack(obj)
            except (RuntimeError, TypeError, ValueError) as exc:
                if "dtype" not in str(exc):
                    raise
                raise TypeError(f"gradcore.from_dlpack: {type(obj).__name__} of dtype "
                                f"{getattr(obj, 'dtype', '?')} cannot be shared; gradcore computes in bool, "
                                f"integers and float16/float32/float64 (convert first, e.g. "
                                f"x.to(torch.float32))") from None
            return wrap_array(_checked_dtype(obj, arr), "cpu")
        if device_type in _CUDA_DEVICE_TYPES:
            from .cuda import backend, dlpack
            from .cuda.array import DeviceArray
            try:
                capsule = obj.__dlpack__(stream=1, max_version=(dlpack.DLPACK_MAJOR, dlpack.DLPACK_MINOR))
            except TypeError:          # a producer older than DLPack 1.0's max_version
                capsule = obj.__dlpack__(stream=1)
            return wrap_array(_checked_dtype(obj, dlpack.import_capsule(capsule, backend(), DeviceArray)), "cuda")
        raise BufferError(f"gradcore.from_dlpack: {type(obj).__name__} lives on DLPack device type "
                          f"{device_type}; gradcore has cpu (1) and cuda (2)")
    if hasattr(obj, "__cuda_array_interface__"):
        from .cuda import backend, dlpack
        from .cuda.array import DeviceArray
        return wrap_array(_checked_dtype(obj, dlpack.from_interface(obj, backend(), DeviceArray)), "cuda")
    raise TypeError(f"gradcore.from_dlpack: {type(obj).__name__} has neither __dlpack__ nor "
                    f"__cuda_array_interface__")


# ======================================================================
# Other frameworks: gradcore ops as PyTorch (and JAX) functions, PyTorch
# functions as gradcore ops.
#
# How ``to_torch`` works. A ``TorchFunction`` wraps a function of gradcore
# tensors (an op, or any function). Eagerly, a call is one
# ``torch.autograd.Function``: its forward shares the torch inputs' memory
# with gradcore tensors (DLPack), runs the function under a gradcore
# recording (``gradcore.core.Grad``) when an input requires grad, and hands
# the outputs' memory to torch (DLPack); its backward runs that recording's
# backward (first order: the cheap path), or, when torch records the
# backward (``create_graph=True``), calls the TorchFunction of the vjp,
# ``(inputs, output grads) -> input grads``, which is again a function of
# gradcore tensors, and so differentiable in turn, to any order. Under
# ``torch.compile`` and the profiler, an op's TorchFunction runs as a
# ``torch.library.custom_op`` (shape inference from the op's ``infer``,
# backward through ``register_autograd`` into the vjp's custom op); a plain
# function, whose outputs cannot be known without running it, is a graph
# break there.
# ======================================================================

import re as _re
import threading as _threading
from functools import partial
from types import SimpleNamespace
from typing import Callable, Dict, List

_torch_mod = None
_torch_bits = None       # lazily built: the autograd.Function class, the profiler and compiler checks
_custom_names: Dict[str, int] = {}     # custom op base name -> how many ops use it in this process
_exported_ops: Dict[Any, "TorchFunction"] = {}
_export_lock = _threading.Lock()


def _import_torch():
    global _torch_mod
    if _torch_mod is None:
        try:
            import torch
        except ImportError as exc:          # pragma: no cover - torch is a test dependency
            raise ImportError("gradcore.to_torch / gradcore.from_torch need PyTorch: pip install torch") from exc
        _torch_mod = torch
    return _torch_mod


def _describe_torch(t) -> str:
    return f"torch.Tensor of shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def _gc_from_torch(t, where: str) -> Tensor:
    """A gradcore Tensor sharing the memory of the torch tensor ``t``
    (DLPack; no copy, also for strided views)."""
    dev = t.device.type
    if dev == "cpu":
        try:
            arr = np.from_dlpack(_Capsule(_torch_mod._C._to_dlpack(t), _CPU))
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise TypeError(f"{where}: a {_describe_torch(t)} cannot be shared with gradcore "
                            f"({exc}); gradcore has bool, integer, float16, float32 and float64 tensors"
                            ) from None
        return wrap_array(arr, "cpu")
    if dev == "cuda":
        # gradcore's cuda kernels take dense arrays: a strided view is made dense on the GPU
        return from_dlpack(t.detach().contiguous())
    raise TypeError(f"{where}: a {_describe_torch(t)} lives on {dev}; gradcore has cpu and cuda")


def _torch_from_gc(y: Tensor, avoid=()):
    """The torch tensor sharing the memory of gradcore's ``y`` (DLPack); a
    copy instead when that memory is also one of ``avoid`` (arrays the
    caller hands torch separately: an input, another output)."""
    arr = y._data
    if y._device == "cpu":
        for a in avoid:
            if a is arr or ((arr.base is not None or a.base is not None) and np.may_share_memory(arr, a)):
                arr = arr.copy()
                break
        return _torch_mod.utils.dlpack.from_dlpack(_exportable(arr).__dlpack__())
    t = _torch_mod.utils.dlpack.from_dlpack(y)
    for a in avoid:
        if _cuda_shares(t, a):
            return t.clone()
    return t


def _cuda_shares(t, a) -> bool:
    try:
        return t.untyped_storage().data_ptr() == int(a.__cuda_array_interface__["data"][0])
    except Exception:
        return False


def _exportable(arr: np.ndarray) -> np.ndarray:
    """``arr``, or a copy where DLPack cannot carry it to PyTorch: read-only
    (DLPack has no read-only tensors) or with a negative stride (which
    PyTorch's DLPack import does not take; it aborts the process)."""
    if not arr.flags.writeable or (not arr.flags.c_contiguous and any(st < 0 for st in arr.strides)):
        return arr.copy()
    return arr


def _result_tuple(res, where: str):
    """(outputs as a tuple of Tensors, whether the function returned one Tensor)."""
    if isinstance(res, Tensor):
        return (res,), True
    if isinstance(res, (tuple, list)):
        for k, o in enumerate(res):
            if not isinstance(o, Tensor):
                raise TypeError(f"{where}: output {k} is a {type(o).__name__}; a function exported with "
                                f"to_torch returns gradcore Tensors (one, or a tuple)")
        return tuple(res), False
    raise TypeError(f"{where}: returned a {type(res).__name__}; a function exported with to_torch "
                    f"returns gradcore Tensors (one, or a tuple)")


def _gc_vjp(fn: Callable, nargs: int, kwargs: dict, where: str) -> Callable:
    """``(*args, *cotangents) -> gradients``: the vjp of ``fn`` as a function
    of gradcore tensors, so that it is differentiable in turn. ``args`` are
    ``fn``'s positional arguments; one cotangent per floating-point output;
    one gradient per floating-point Tensor argument (zeros where the output
    does not depend on it)."""
    from .core import Grad
    from .functional import zeros_like

    def vjp(*args):
        return _recorded_apart(vjp_here, *args)

    def vjp_here(*args):
        xs, gs = args[:nargs], args[nargs:]
        floats = [i for i, a in enumerate(xs) if isinstance(a, Tensor) and a.dtype.kind == "f"]
        grads: List[Optional[Tensor]] = [None] * nargs
        key = Grad(f"{where} vjp")
        with key:
            for i in floats:
                key.wrt(xs[i], callback=partial(grads.__setitem__, i))
            outs, _ = _result_tuple(fn(*xs, **kwargs), where)
            fouts = [o for o in outs if o.dtype.kind == "f"]
            if len(fouts) != len(gs):
                raise ValueError(f"{where}: {len(gs)} output gradients for {len(fouts)} floating-point outputs")
            if fouts:
                key(fouts, list(gs))
        return tuple(zeros_like(xs[i]) if grads[i] is None else grads[i] for i in floats)

    return vjp


class TorchFunction:
    """A gradcore op or function of gradcore tensors, callable on
    ``torch.Tensor``s and differentiable by ``torch.autograd`` to any order.
    Made by ``gradcore.to_torch``; see there.

    Attributes: ``op`` (the gradcore op, or None for a function),
    ``custom_op`` (the ``torch.library`` custom op that runs it under
    ``torch.compile`` and the profiler; None for a function) and
    ``__wrapped__`` (what was exported).
    """

    def __init__(self, gc_fn: Callable, name: str, op: Any = None, fake: Optional[Callable] = None,
                 wrapped: Any = None):
        self._gc_fn = gc_fn
        self.op = op
        self.__name__ = self.__qualname__ = name
        self.__wrapped__ = wrapped if wrapped is not None else gc_fn
        self.__doc__ = (f"{name} exported to PyTorch by gradcore.to_torch.\n\n"
                        f"{getattr(self.__wrapped__, '__doc__', None) or ''}")
        self._fake = fake
        self._custom = None
        self._vjps: Dict[Any, "TorchFunction"] = {}
        self._label = f"to_torch({name})"

    def __repr__(self):
        return f"<gradcore.to_torch {self.__name__}>"

    # ---- calls
    def __call__(self, *args, **kwargs):
        bits = _torch_bits
        if bits.profiler._is_profiler_enabled or bits.compiling():
            return self._special_call(args, kwargs)
        grad = False
        plain = bits.plain_types
        for a in args:
            if type(a) in plain:
                if a.requires_grad:
                    grad = True
            elif isinstance(a, plain[0]):           # FakeTensor, functorch, subclasses
                return self._special_call(args, kwargs)
        if grad and _torch_mod.is_grad_enabled():
            return bits.Autograd.apply(self, kwargs, *args)
        return self._plain(args, kwargs)

    def _plain(self, args, kwargs):
        """The forward alone, no recording (nothing requires grad)."""
        torch = _torch_mod
        gargs = [_gc_from_torch(a, self._label) if isinstance(a, torch.Tensor) else a for a in args]
        outs, single = _result_tuple(self._gc_fn(*gargs, **kwargs), self._label)
        touts = _export_outputs(outs, gargs)
        return touts[0] if single else touts

    def _special_call(self, args, kwargs):
        """Under torch.compile, the profiler, or a tracing/functorch tensor:
        the custom op where there is one, else an eager call that the
        compiler does not trace (a graph break)."""
        torch = _torch_mod
        # (an op's custom op is registered by to_torch: nothing for the compiler to trace here)
        cop = self._custom if _torch_bits.compiling() else self.custom_op
        if cop is not None and not kwargs and all(isinstance(a, torch.Tensor) for a in args):
            outs = cop(list(args))
            return outs[0] if len(outs) == 1 and self._single else tuple(outs)
        if _torch_bits.compiling():
            return _torch_bits.eager_call(self, args, kwargs)
        with torch.profiler.record_function(self.__name__):
            return self._eager(args, kwargs)

    def _eager(self, args, kwargs):
        torch = _torch_mod
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return _torch_bits.Autograd.apply(self, kwargs, *args)
        return self._plain(args, kwargs)

    # ---- the vjp, itself a TorchFunction
    def _vjp(self, nargs: int, kwargs: dict) -> "TorchFunction":
        key = nargs if not kwargs else None
        tf = self._vjps.get(key) if key is not None else None
        if tf is None:
            name = f"{self.__name__}_vjp{nargs}"
            fake = _like_float_inputs(nargs) if self._fake is not None else None
            tf = TorchFunction(_gc_vjp(self._gc_fn, nargs, kwargs, self._label), name, fake=fake)
            tf._single = False
            if key is not None:
                self._vjps[key] = tf
        return tf

    # ---- the torch.library custom op
    _single = True

    @property
    def custom_op(self):
        """The ``torch.library.custom_op`` running this function (registered
        on first use, as ``gradcore::<name>``), or None for a function
        whose output shapes are known only by running it."""
        if self._custom is None and self._fake is not None:
            with _export_lock:
                if self._custom is None:
                    self._custom = _register_custom_op(self)
        return self._custom


def _like_float_inputs(nargs: int) -> Callable:
    def fake(xs):
        return [x.new_empty(x.shape) for x in xs[:nargs] if x.is_floating_point()]
    return fake


def _export_outputs(outs, gargs) -> tuple:
    """Gradcore outputs (or None) as torch tensors; an output whose memory is
    also an input's or an earlier output's is copied (autograd and custom ops
    need outputs that alias nothing they did not make)."""
    avoid = [a._data for a in gargs if isinstance(a, Tensor)]
    res = []
    for o in outs:
        res.append(None if o is None else _torch_from_gc(o, avoid))
        if o is not None:
            avoid.append(o._data)
    return tuple(res)


def _sanitize(name: str) -> str:
    s = _re.sub(r"\W", "_", name, flags=_re.ASCII).strip("_") or "fn"   # torch schemas are ASCII
    return s if not s[0].isdigit() else f"op_{s}"


def _register_custom_op(tf: TorchFunction):
    torch = _torch_mod
    # the name follows from the op (its label, and for a vjp the arity), not
    # from the order of registration: a compiled graph that torch.compile
    # caches on disk calls custom ops by name, in another process too
    base = _sanitize(tf.__name__)
    k = _custom_names.get(base, 0)
    _custom_names[base] = k + 1
    qualname = f"gradcore::{base}" if k == 0 else f"gradcore::{base}_{k}"

    def impl(xs):
        gargs = [_gc_from_torch(x, tf._label) for x in xs]
        outs, _ = _result_tuple(tf._gc_fn(*gargs), tf._label)
        return list(_export_outputs(outs, gargs))

    impl.__name__ = qualname.split("::")[1]
    impl.__annotations__ = {"xs": List[torch.Tensor], "return": List[torch.Tensor]}
    cop = torch.library.custom_op(qualname, impl, mutates_args=())

    def fake(xs):
        outs = tf._fake(xs)
        # the ops of the backward (and of the backward's backward) exist as
        # soon as the forward is traced: a backward graph that torch.compile
        # loads from its cache, without tracing it, calls them
        n = len(xs)
        vtf = tf._vjp(n, {})
        vtf.custom_op
        vtf._vjp(n + sum(1 for o in outs if o.is_floating_point()), {}).custom_op
        return outs

    cop.register_fake(fake)

    def setup_context(ctx, inputs, output):
        (xs,) = inputs
        ctx.n = len(xs)
        ctx.save_for_backward(*xs, *output)

    def backward(ctx, gouts):
        saved = ctx.saved_tensors
        xs, ys = saved[:ctx.n], saved[ctx.n:]
        gs = [torch.zeros_like(y) if g is None else g
              for g, y in zip(gouts, ys) if y.is_floating_point()]
        grads = iter(tf._vjp(ctx.n, {}).custom_op(list(xs) + gs))
        return [next(grads) if x.is_floating_point() else None for x in xs]

    cop.register_autograd(backward, setup_context=setup_context)
    return cop


class _Recording:
    """Holds the gradcore recording of one exported call until its backward
    runs; ends it when dropped without one (a forward whose result was never
    differentiated), so that no recording stays open."""

    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key

    def __del__(self):
        key = self.key
        if key is not None:
            self.key = None
            try:
                key.exit()
            except Exception:       # interpreter shutdown
                pass


def _record(tf, kwargs, gargs, attach, grads, all_tensors):
    """Run ``tf``'s gradcore function on ``gargs`` under a recording of its
    own, ``attach``ed inputs' gradients landing in ``grads``: (outputs,
    single, the recording (suppressed until the backward), None) or, for a
    function without a gradient, (outputs, single, None, the error)."""
    where = tf._label
    key = _core.GradKey(where)
    key.enter()
    try:
        for i in attach:
            key.attach(gargs[i], partial(grads.__setitem__, i))
        if tf.op is not None and all_tensors:
            outs = _core.apply(tf.op, *gargs)
            single = tf._single and len(outs) == 1
        else:
            outs, single = _result_tuple(tf._gc_fn(*gargs, **kwargs), where)
    except _core.NotDifferentiableError as exc:
        key.exit()
        # as a native op without a derivative: the forward runs, the backward says why not
        outs, single = _result_tuple(tf._gc_fn(*gargs, **kwargs), where)
        return outs, single, None, exc
    except BaseException:
        key.exit()
        raise
    key.suppress()
    return outs, single, _Recording(key), None


_VISIBLE_ALL = 1 << 62


def _recording_blocked() -> bool:
    """Whether a recording entered now, in this thread, would see nothing:
    inside an op's own forward (a ``_grad_rule``, a ``from_torch`` op whose
    function calls back into an exported gradcore op) or a gradcore backward
    (where only older recordings record). An exported call is a computation
    of its own, on tensors of its own: it then records in a fresh thread,
    whose recording state is clean."""
    st = _core._debug_state()
    return st["no_record"] > 0 or st["visible_below"] < _VISIBLE_ALL


def _recorded_apart(fn, *args):
    """``fn(*args)``, in a fresh thread when a recording here would see
    nothing (``_recording_blocked``); its exception raised here."""
    if not _recording_blocked():
        return fn(*args)
    from concurrent.futures import ThreadPoolExecutor       # (rare; ~5 ms to import)
    with ThreadPoolExecutor(1, thread_name_prefix="gradcore-interop") as pool:
        return pool.submit(fn, *args).result()


def _build_torch_bits():
    """The parts that need torch imported: built on the first to_torch."""
    global _torch_bits
    with _export_lock:
        if _torch_bits is None:
            _torch_bits = _make_torch_bits()


def _make_torch_bits():
    torch = _import_torch()
    from torch.autograd import profiler
    bits = SimpleNamespace(profiler=profiler,          # profiler._is_profiler_enabled: its own flag
                           compiling=torch.compiler.is_compiling,
                           plain_types=(torch.Tensor, torch.nn.Parameter))
    is_grad_enabled = torch.is_grad_enabled

    @torch.compiler.disable
    def eager_call(tf, args, kwargs):
        return tf._eager(args, kwargs)
    bits.eager_call = eager_call

    class GradcoreFunction(torch.autograd.Function):
        """torch.autograd's view of one call of an exported gradcore function."""

        @staticmethod
        def forward(ctx, tf, kwargs, *args):
            ctx.set_materialize_grads(False)
            where = tf._label
            needs = ctx.needs_input_grad
            tensor_pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            gargs = [_gc_from_torch(a, where) if isinstance(a, torch.Tensor) else a for a in args]
            grads: List[Optional[Tensor]] = [None] * len(args)
            attach = [i for i in tensor_pos if needs[i + 2]]
            outs, single, rec, not_diff = _recorded_apart(_record, tf, kwargs, gargs, attach, grads,
                                                          len(tensor_pos) == len(args))
            touts = _export_outputs(outs, gargs)
            for o, t in zip(outs, touts):
                if o.dtype.kind != "f":
                    ctx.mark_non_differentiable(t)
            ctx.state = (tf, kwargs, rec, grads, outs, tensor_pos,
                         [None if isinstance(a, torch.Tensor) else a for a in args], not_diff)
            ctx.save_for_backward(*[args[i] for i in tensor_pos], *touts)
            return touts[0] if single else touts

        @staticmethod
        def backward(ctx, *gys):
            saved = ctx.saved_tensors          # torch's check that nothing saved was modified in place
            tf, kwargs, rec, grads, outs, tensor_pos, args, not_diff = ctx.state
            if not_diff is not None:
                raise type(not_diff)(*not_diff.args)
            if rec is not None and rec.key is not None and not is_grad_enabled():
                # first order, and the recording of the forward is still there: its backward
                key, rec.key = rec.key, None
                ys, dys = [], []
                for o, g in zip(outs, gys):
                    if g is not None and o.dtype.kind == "f":
                        ys.append(o)
                        dys.append(_gc_from_torch(g, tf._label))
                key.resume()
                try:
                    if ys:
                        key.backward(ys, dys)
                finally:
                    key.exit()
                ctx.state = (tf, kwargs, None, None, None, tensor_pos, args, None)
                return (None, None) + _export_outputs(grads, dys)
            # torch records this backward (create_graph=True), or a second
            # backward (retain_graph=True): the vjp, as a function torch differentiates
            nin = len(tensor_pos)
            args = list(args)
            for k, i in enumerate(tensor_pos):
                args[i] = saved[k]
            touts = saved[nin:]
            gs = [torch.zeros_like(t) if g is None else g
                  for g, t in zip(gys, touts) if t.is_floating_point()]
            vtf = tf._vjp(len(args), kwargs)
            vgrads = vtf(*args, *gs)
            if isinstance(vgrads, torch.Tensor):
                vgrads = (vgrads,)
            it = iter(vgrads)
            res = [None, None]
            for i, a in enumerate(args):
                g = next(it) if isinstance(a, torch.Tensor) and a.is_floating_point() else None
                res.append(g if ctx.needs_input_grad[i + 2] else None)
            return tuple(res)

    bits.Autograd = GradcoreFunction
    return bits


def _has_infer(op) -> bool:
    """Whether ``op`` has an ``infer`` of its own (output shapes known without running it)."""
    from .op import Op
    return getattr(type(op), "infer", Op.infer) is not Op.infer


def _op_fake(op) -> Optional[Callable]:
    """The custom op's shape function: ``op.infer`` on the inputs'
    descriptors; None when the op has no ``infer`` of its own."""
    from .op import TensorDesc
    if not _has_infer(op):
        return None
    torch = _torch_mod

    def fake(xs):
        descs = [TensorDesc(tuple(int(s) for s in x.shape), _np_dtype(x.dtype),
                            "cpu" if x.device.type == "cpu" else "cuda") for x in xs]
        outs = op.infer(*descs)
        if isinstance(outs, TensorDesc):
            outs = (outs,)
        device = xs[0].device if xs else torch.device("cpu")
        return [torch.empty(d.shape, dtype=_torch_dtype(d.dtype), device=device) for d in outs]
    return fake


def _np_dtype(torch_dtype) -> np.dtype:
    name = str(torch_dtype).replace("torch.", "")
    try:
        return np.dtype(name)
    except TypeError:
        raise TypeError(f"gradcore has no dtype for {torch_dtype}") from None


def _torch_dtype(np_dtype):
    return getattr(_torch_mod, np.dtype(np_dtype).name)


def _built_op(target: Any, where: str, hint: str) -> Any:
    """``target``, or, for an op class, the op built with its defaults."""
    from .op import Op
    if isinstance(target, type) and issubclass(target, Op):
        try:
            return target()
        except TypeError as exc:
            raise TypeError(f"{where}({target.__name__}): the op class cannot be built with its defaults "
                            f"({exc}); pass an instance{hint}") from None
    return target


def to_torch(op_or_function: Any, *, name: Optional[str] = None) -> TorchFunction:
    """A gradcore op, op class (built with its defaults) or function of
    gradcore Tensors, as a function of ``torch.Tensor``s.

    The result is differentiable by ``torch.autograd`` to any order
    (``gradcheck`` and ``gradgradcheck`` pass): its backward is gradcore's
    backward, itself exported, so torch differentiates through it. Inputs
    and outputs cross by DLPack without copies (an op's CPU kernel sees
    PyTorch's buffer), on cpu and cuda; an output that would share memory
    with an input is copied, as for ``torch.library.custom_op``. Integer and
    bool outputs are not differentiable. An error inside gradcore reaches
    the caller as the same exception. Positional arguments that are not
    tensors, and keyword arguments, are passed to a function unchanged.

    An op (not a plain function) is also registered as the
    ``torch.library.custom_op`` ``gradcore::<name>`` (the op's name and
    parameters; ``_1``, ``_2``... for another op of the same name in this
    process), with its backward through ``register_autograd`` (custom ops
    again) and its shapes from the op's ``infer``:
    that form runs under ``torch.compile`` (no graph break) and under the
    profiler (listed by name); ``TorchFunction.custom_op`` is it. A plain
    function is a graph break under ``torch.compile``.

    Equal ops give the same TorchFunction.

    Example::

        >>> import torch, gradcore
        >>> from gradcore.ops import Elemwise
        >>> torch_tanh = gradcore.to_torch(Elemwise("tanh"))
        >>> x = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
        >>> torch_tanh(x).sum().backward()
        >>> torch.allclose(x.grad, 1 - torch.tanh(x.detach()) ** 2)
        True
    """
    from .op import Op
    from .op import op_label
    from ._core import apply
    _build_torch_bits()
    target = op_or_function
    if isinstance(target, type):
        target = _built_op(target, "to_torch", f", e.g. to_torch({target.__name__}(...))")
    if isinstance(target, Op):
        op = target
        with _export_lock:
            tf = _exported_ops.get((op, name))
        if tf is not None:
            return tf
        label = name or op_label(op)

        def run(*xs, **kwargs):
            if kwargs:
                raise TypeError(f"to_torch({label}): an op takes tensors only, got the keyword argument(s) "
                                f"{', '.join(kwargs)}; its parameters are the op's: to_torch({type(op).__name__}"
                                f"(...))")
            for k, x in enumerate(xs):
                if not isinstance(x, Tensor):
                    raise TypeError(f"to_torch({label}): argument {k} is a {type(x).__name__}; "
                                    f"an op takes torch.Tensors")
            outs = apply(op, *xs)
            return outs[0] if len(outs) == 1 else outs

        tf = TorchFunction(run, label, op=op, fake=_op_fake(op), wrapped=op)
        tf._single = True
        tf.custom_op                   # registered now, where the compiler cannot see
        with _export_lock:
            return _exported_ops.setdefault((op, name), tf)
    if isinstance(target, TorchFunction):
        return target
    if not callable(target):
        raise TypeError(f"to_torch: expected a gradcore op, op class or function of gradcore Tensors, "
                        f"got a {type(target).__name__}")
    label = name or getattr(target, "__name__", None) or type(target).__name__
    return TorchFunction(target, label, wrapped=target)


# ---------------------------------------------------------------- from_torch

class _TorchVjp:
    """``(*xs, *cotangents) -> one gradient per floating-point x`` by
    ``torch.autograd.grad`` of ``fn``: what a ``from_torch`` op's backward
    runs (as a ``from_torch`` op again, so that it is differentiable too).
    A value: equal when ``fn`` and the layout are."""

    __slots__ = ("fn", "nin", "out_mask", "__name__")

    def __init__(self, fn, nin: int, out_mask: Tuple[bool, ...]):
        self.fn, self.nin, self.out_mask = fn, nin, out_mask
        self.__name__ = f"{getattr(fn, '__name__', 'fn')}_vjp"

    def __eq__(self, other):
        return (type(other) is _TorchVjp and self.fn == other.fn and self.nin == other.nin
                and self.out_mask == other.out_mask)

    def __hash__(self):
        return hash((_TorchVjp, self.fn, self.nin, self.out_mask))

    def __call__(self, *args):
        torch = _torch_mod
        xs, gs = args[:self.nin], args[self.nin:]
        create_graph = torch.is_grad_enabled()      # called by an outer _TorchVjp: keep differentiable
        with torch.enable_grad():
            # called by an outer _TorchVjp, the inputs are its (differentiated) ones: no detach
            xr = [x if create_graph and x.requires_grad else x.detach().requires_grad_(x.is_floating_point())
                  for x in xs]
            ys = self.fn(*xr)
            ys = (ys,) if isinstance(ys, torch.Tensor) else tuple(ys)
            if len(ys) != len(self.out_mask):
                raise ValueError(f"{self.__name__}: the function returned {len(ys)} outputs, "
                                 f"its forward {len(self.out_mask)}")
            pairs = [(y, g) for y, m, g in zip(ys, self.out_mask, _fill(gs, self.out_mask)) if m]
            wrt = [x for x in xr if x.is_floating_point()]
            live = [(y, g) for y, g in pairs if y.requires_grad]
            if live and wrt:
                grads = torch.autograd.grad([y for y, _ in live], wrt, [g for _, g in live],
                                            allow_unused=True, create_graph=create_graph)
            else:
                grads = [None] * len(wrt)
        return tuple(torch.zeros_like(x) if g is None else g for x, g in zip(wrt, grads))


def _fill(gs, mask):
    it = iter(gs)
    return [next(it) if m else None for m in mask]


def _make_torch_op_class():
    from .op import Op

    class TorchOp(Op):
        """A PyTorch function as a gradcore op (made by ``gradcore.from_torch``):
        the forward runs ``fn`` on torch tensors sharing the inputs' memory
        (DLPack), on the inputs' device; the gradient is ``torch.autograd``'s,
        as another ``TorchOp``, so it is differentiable again."""
        name = "from_torch"
        devices = ("cpu", "cuda")

        def __init__(self, fn, label=""):
            self.fn = fn
            self.label = label or getattr(fn, "__name__", None) or type(fn).__name__

        def _name(self):
            return f"from_torch({self.label})"

        def __repr__(self):
            return self._name()

        def _run(self, arrays, device):
            torch = _torch_mod
            # (a read-only array is copied: DLPack has no read-only tensors)
            ts = [_torch_from_gc(wrap_array(a, device)) for a in arrays]
            try:
                with torch.no_grad():
                    res = self.fn(*ts)
            except Exception as exc:
                shapes = ", ".join(str(tuple(t.shape)) for t in ts)
                exc.add_note(f"in {self._name()} (input shapes: {shapes})")
                raise
            single = isinstance(res, torch.Tensor)
            outs = (res,) if single else res
            if not isinstance(outs, (tuple, list)) or not all(isinstance(o, torch.Tensor) for o in outs):
                raise TypeError(f"{self._name()}: the function must return torch Tensors (one, or a "
                                f"tuple), got {type(res).__name__}")
            ptrs = {t.untyped_storage().data_ptr() for t in ts if t.numel()}
            arrays_out = []
            for o in outs:
                if o.numel() and o.untyped_storage().data_ptr() in ptrs:
                    o = o.clone()          # gradcore's outputs never share an input's memory
                ptrs.add(o.untyped_storage().data_ptr())
                arrays_out.append(_gc_from_torch(o.detach(), self._name())._data)
            return tuple(arrays_out)

        def cpu(self, *arrays):
            return self._run(arrays, "cpu")

        def cuda(self, be, *arrays):
            return self._run(arrays, "cuda")

        def _grad_rule(self, *inputs):
            device = inputs[0].device if inputs else "cpu"
            arrays = self._run([x._data for x in inputs], str(device))
            outs = tuple(wrap_array(a, str(device)) for a in arrays)
            nin = len(inputs)
            float_in = [x.dtype.kind == "f" for x in inputs]

            def backward(*gys):
                mask = tuple(g is not None and o.dtype.kind == "f" for g, o in zip(gys, outs))
                if not any(mask) or not any(float_in):
                    return tuple(None for _ in inputs)
                vop = TorchOp(_TorchVjp(self.fn, nin, mask), f"{self.label}_vjp")
                res = apply_(vop, *inputs, *[g for g, m in zip(gys, mask) if m])
                it = iter(res)
                return tuple(next(it) if f else None for f in float_in)

            return (outs[0] if len(outs) == 1 else outs), backward

    from ._core import apply as apply_
    return TorchOp


_TorchOp = None


def from_torch(fn: Callable, *, name: Optional[str] = None) -> Any:
    """A PyTorch function as a gradcore op: ``fn`` takes and returns
    ``torch.Tensor``s (one, or a tuple); the op runs it on tensors sharing
    the gradcore inputs' memory (DLPack, no copy) on the inputs' device, and
    its gradient is ``torch.autograd``'s (``torch.autograd.grad`` of ``fn``,
    itself run as such an op, so second and higher order gradients work).
    A plugin can wrap an existing PyTorch kernel this way, and one model can
    mix gradcore and PyTorch code. An error inside ``fn`` is raised as is,
    with a note naming the op and the input shapes.

    The op is a value: ``from_torch(f)`` twice gives equal ops (one backward
    cache); ``name`` is its label in errors and ``repr``.

    Example::

        >>> import torch, gradcore
        >>> softplus = gradcore.from_torch(torch.nn.functional.softplus)
        >>> x = gradcore.tensor([0.0, 1.0])
        >>> gm = gradcore.GradManager().attach([x])
        >>> with gm:
        ...     gm.backward(softplus(x).sum())
        >>> x.grad.numpy().round(4)                    # sigmoid(x)
        array([0.5   , 0.7311], dtype=float32)
    """
    global _TorchOp
    _import_torch()
    if not callable(fn):
        raise TypeError(f"from_torch: expected a function of torch Tensors, got a {type(fn).__name__}")
    if _TorchOp is None:
        _TorchOp = _make_torch_op_class()
    return _TorchOp(fn, name or "")


# ---------------------------------------------------------------- JAX

def _gc_callable(op_or_function, where: str):
    """(function of gradcore Tensors returning a tuple of Tensors, op or None, label)."""
    from .op import Op
    from .op import op_label
    from ._core import apply
    target = _built_op(op_or_function, where, "")
    if isinstance(target, Op):
        op = target
        return (lambda *xs: apply(op, *xs)), op, op_label(op)
    if isinstance(target, TorchFunction):
        target = target._gc_fn
    if not callable(target):
        raise TypeError(f"{where}: expected a gradcore op, op class or function of gradcore Tensors, "
                        f"got a {type(target).__name__}")
    label = getattr(target, "__name__", None) or type(target).__name__

    def run(*xs):
        return _result_tuple(target(*xs), f"{where}({label})")[0]
    return run, None, label


def to_jax(op_or_function: Any, *, name: Optional[str] = None) -> Callable:
    """A gradcore op, op class (built with its defaults) or function of
    gradcore Tensors, as a JAX function of arrays (CPU), differentiable by
    ``jax.grad`` / ``jax.vjp`` to any order: the forward runs in gradcore
    through ``jax.pure_callback``, and a ``jax.custom_vjp`` gives gradcore's
    backward, itself exported the same way. Works under ``jax.jit``.

    Output shapes: an op's come from its ``infer``; a plain function is run
    once on zeros per input signature to learn them. One output gives an
    array, several a tuple; integer and bool inputs get ``float0``
    cotangents, as JAX requires.

    Example::

        >>> import jax, jax.numpy as jnp
        >>> from gradcore.ops import Elemwise
        >>> jtanh = gc.to_jax(Elemwise("tanh"))
        >>> float(jax.grad(lambda x: jtanh(x).sum())(jnp.array([0.0, 1.0]))[0])
        1.0
    """
    try:
        import jax
    except ImportError as exc:
        raise ImportError("gradcore.to_jax needs JAX: pip install jax") from exc
    gc_fn, op, label = _gc_callable(op_or_function, "to_jax")
    return _jax_export(jax, gc_fn, op, name or label, None)


def _jax_export(jax, gc_fn, op, label: str, fixed_shapes: Optional[Callable]):
    where = f"to_jax({label})"
    shape_cache: Dict[Any, tuple] = {}

    def out_structs(avals):
        sig = tuple((tuple(a.shape), np.dtype(a.dtype)) for a in avals)
        got = shape_cache.get(sig)
        if got is None:
            if fixed_shapes is not None:
                got = fixed_shapes(sig)
            elif op is not None and _has_infer(op):
                from .op import TensorDesc
                descs = op.infer(*[TensorDesc(s, d, "cpu") for s, d in sig])
                if isinstance(descs, TensorDesc):
                    descs = (descs,)
                got = tuple((tuple(d.shape), np.dtype(d.dtype)) for d in descs)
            else:                      # run once on zeros to learn the outputs
                outs = gc_fn(*[wrap_array(np.zeros(s, d), "cpu") for s, d in sig])
                got = tuple((tuple(o.shape), np.dtype(o.dtype)) for o in outs)
            shape_cache[sig] = got
        return got

    def host(*arrays):
        xs = [wrap_array(np.asarray(a), "cpu") for a in arrays]
        outs = gc_fn(*xs)
        return tuple(np.asarray(o._data) for o in outs)

    vjp_export = {}

    def vjp_of(nargs):
        if nargs not in vjp_export:
            def like_floats(sig):
                return tuple((s, d) for s, d in sig[:nargs] if d.kind == "f")
            vjp_export[nargs] = _jax_export(jax, _gc_vjp(lambda *xs: gc_fn(*xs), nargs, {}, where), None,
                                            f"{label}_vjp", like_floats)
        return vjp_export[nargs]

    @jax.custom_vjp
    def f(*xs):
        return jax.pure_callback(host, tuple(jax.ShapeDtypeStruct(s, d) for s, d in out_structs(xs)), *xs,
                                 vmap_method="sequential")

    def f_fwd(*xs):
        outs = f(*xs)                  # (f, not the callback: differentiable when a jax.grad is outside)
        return outs, (xs, outs)

    def f_bwd(res, gs):
        xs, outs = res
        cots = [g for g, o in zip(gs, outs) if np.dtype(o.dtype).kind == "f"]
        grads = vjp_of(len(xs))(*xs, *cots)
        grads = (grads,) if not isinstance(grads, tuple) else grads
        it = iter(grads)
        return tuple(next(it) if np.dtype(x.dtype).kind == "f" else
                     np.zeros(x.shape, dtype=jax.dtypes.float0) for x in xs)

    f.defvjp(f_fwd, f_bwd)

    def exported(*xs):
        """gradcore, exported to JAX by gradcore.to_jax."""
        outs = f(*[jax.numpy.asarray(x) for x in xs])
        return outs[0] if len(outs) == 1 else outs

    exported.__name__ = exported.__qualname__ = label
    return exported


# ---------------------------------------------------------------- gradcore check --torch

def check_torch(op: Any, seed: int = 0, atol: float = 1e-7, rtol: float = 1e-6):
    """Compare an op's PyTorch form (``to_torch(op)``) with its native form
    on sample inputs (the op's ``examples()``, else inputs generated from
    its declaration with ``seed``, as ``check_op`` does): the outputs
    (float64 and float32) and the first-order gradients (float64, random
    output cotangents from ``seed``) must agree. Returns a
    ``gradcore.testing.CheckReport`` with the checks ``torch values`` and
    ``torch grad``; ``gradcore check --torch DIST`` runs it on every op of
    a distribution.

    Example::

        >>> from gradcore.ops import Elemwise
        >>> check_torch(Elemwise("tanh")).ok
        True
    """
    from .op import op_label
    from .testing import CheckReport, CheckResult, generated_cases, op_examples
    report = CheckReport()
    cls = op if isinstance(op, type) else type(op)
    label = getattr(cls, "name", "") or cls.__name__
    try:
        _import_torch()
        examples = op_examples(op)
        if not isinstance(op, type):
            examples = [e for e in examples if e[0] == op] or [(op,) + tuple(e[1:]) for e in examples[:1]]
        cases = [(e[0], [np.asarray(a) for a in e[1]], e[2] if len(e) > 2 else None) for e in examples] or \
                [(inst, arrays, None) for inst, arrays in generated_cases(op, seed)]
    except Exception as exc:
        for check in ("torch values", "torch grad"):
            report.results.append(CheckResult(label, check, "failed", f"no inputs: {type(exc).__name__}: {exc}"))
        return report
    values, grads = [], []
    for k, (inst, arrays, wrt) in enumerate(cases):
        tag = f"case {k} {op_label(inst)} shapes {', '.join(str(a.shape) for a in arrays)}"
        try:
            v, g = _compare_torch_case(inst, arrays, wrt, seed + k, atol, rtol)
        except Exception as exc:
            v, g = f"failed: {tag}: {type(exc).__name__}: {exc}", "failed: (the values failed)"
        values.append((tag, v))
        grads.append((tag, g))
    for check, rows in (("torch values", values), ("torch grad", grads)):
        bad = [f"{msg[len('failed: '):]}" for _, msg in rows if msg.startswith("failed")]
        passed = [t for t, msg in rows if msg == "passed"]
        if bad:
            report.results.append(CheckResult(label, check, "failed", "; ".join(bad)))
        elif passed:
            report.results.append(CheckResult(label, check, "passed", f"{len(passed)} case(s)"))
        else:
            report.results.append(CheckResult(label, check, "not applicable", rows[0][1].split(": ", 1)[-1]
                                              if rows else "no case"))
    return report


def _compare_torch_case(op, arrays, wrt, seed: int, atol: float, rtol: float):
    from ._core import NotDifferentiableError, apply
    from .core import Grad
    torch = _torch_mod
    tf = to_torch(op)
    rng = np.random.default_rng(seed)
    a64 = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays]
    # values, float64 and float32
    for dt in (np.float64, np.float32):
        arrs = [a.astype(dt) if a.dtype.kind == "f" else a for a in a64]
        native = apply(op, *[wrap_array(a.copy(), "cpu") for a in arrs])
        with torch.no_grad():
            got = tf(*[torch.from_numpy(a.copy()) for a in arrs])
        got = (got,) if isinstance(got, torch.Tensor) else got
        if len(got) != len(native):
            return f"failed: {len(got)} outputs from PyTorch, {len(native)} native", "failed: -"
        for j, (n, t) in enumerate(zip(native, got)):
            tol = (atol, rtol) if dt == np.float64 else (1e-6, 1e-5)
            msg = _mismatch(f"{np.dtype(dt).name} output {j}", n.numpy(), t.numpy(), *tol)
            if msg:
                return "failed: " + msg, "failed: (the values differ)"
    # first-order gradients, float64
    wrt = [i for i, a in enumerate(a64) if a.dtype.kind == "f"] if wrt is None else list(wrt)
    if not wrt:
        return "passed", "not applicable: no floating-point input"
    xs = [wrap_array(a.copy(), "cpu") for a in a64]
    native_grads: List[Optional[Tensor]] = [None] * len(xs)
    key = Grad("check --torch")
    try:
        with key:
            for i in wrt:
                key.wrt(xs[i], callback=partial(native_grads.__setitem__, i))
            outs = apply(op, *xs)
            fouts = [o for o in outs if o.dtype.kind == "f"]
            if not fouts:
                return "passed", "not applicable: no floating-point output"
            cots = [rng.standard_normal(o.shape) for o in fouts]
            key(fouts, [wrap_array(c.astype(o.dtype), "cpu") for c, o in zip(cots, fouts)])
    except NotDifferentiableError as exc:
        return "passed", f"not applicable: not differentiable ({exc})"
    ts = [torch.from_numpy(a.copy()) for a in a64]
    for i in wrt:
        ts[i].requires_grad_()
    res = tf(*ts)
    res = (res,) if isinstance(res, torch.Tensor) else res
    tfouts = [r for r in res if r.is_floating_point()]
    live = [(r, torch.from_numpy(c)) for r, c in zip(tfouts, cots) if r.requires_grad]
    if live:
        tgrads = torch.autograd.grad([r for r, _ in live], [ts[i] for i in wrt], [c for _, c in live],
                                     allow_unused=True)
    else:
        tgrads = [None] * len(wrt)
    for i, tg in zip(wrt, tgrads):
        ng = native_grads[i]
        n = np.zeros(a64[i].shape) if ng is None else ng.numpy()
        t = np.zeros(a64[i].shape) if tg is None else tg.numpy()
        msg = _mismatch(f"gradient of input {i}", n, t, atol, rtol)
        if msg:
            return "passed", "failed: " + msg
    return "passed", "passed"


def _mismatch(what: str, native: np.ndarray, exported: np.ndarray, atol: float, rtol: float) -> str:
    if native.shape != exported.shape:
        return f"{what}: shape {exported.shape} from PyTorch, {native.shape} native"
    if native.dtype != exported.dtype:
        return f"{what}: dtype {exported.dtype} from PyTorch, {native.dtype} native"
    if native.size and not np.allclose(exported, native, atol=atol, rtol=rtol, equal_nan=True):
        diff = np.abs(exported.astype(np.float64) - native.astype(np.float64))
        k = np.unravel_index(int(np.nanargmax(diff)), diff.shape)
        return (f"{what}: worst element {tuple(int(i) for i in k)}: PyTorch {exported[k]!r}, "
                f"native {native[k]!r}")
    return ""
