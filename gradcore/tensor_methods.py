"""The Python side of Tensor: array conversion, the slow dispatch path
(scalars, arrays, symbolic tensors), clear kernel errors, and the methods
that are not on the per-op path (reshape, sum, ...). Installed into the
compiled core as hooks at import."""
from __future__ import annotations

import functools

import numpy as np

from . import _core, devices, dtypes, graph, interop
from .op import IndexOpError, OpError, TensorDesc, describe, op_label
from ._core import Tensor
from .cuda.array import DeviceArray
from .cuda.graphs import GraphCaptureError
from .cuda import events as _device_events
from .devices import filled, norm_device, same_device
from .dtypes import DEFAULT_FLOAT, DEFAULT_INT


def to_array(data, dtype=None, device=None):
    """(array, device) for Tensor(data, dtype, device): float32 by default
    for Python numbers and lists, NumPy arrays keep their dtype."""
    dev = norm_device("cuda" if device is None and isinstance(data, DeviceArray) else device)
    if isinstance(data, DeviceArray):
        if dev == "cuda":
            return (data.copy() if dtype is None else data.astype(dtype)), dev
        return (data.get() if dtype is None else data.get().astype(dtype)), dev
    if dtype is not None:
        dtype = dtypes.check_dtype(dtype, "Tensor")
    if data is None:
        raise TypeError("Tensor: cannot make a Tensor from None (give a number, a list or an array)")
    if isinstance(data, np.ndarray):
        _check_data_dtype(data.dtype, data)
        # a copy: the tensor must not share a buffer the caller can still write
        arr = np.array(data, dtype=dtype, copy=True)
    else:
        try:
            arr = np.asarray(data)
        except (ValueError, TypeError) as exc:
            raise TypeError(f"Tensor: cannot make a Tensor from {type(data).__name__}: {exc}") from None
        _check_data_dtype(arr.dtype, data)
        if dtype is not None:
            arr = arr.astype(dtype, copy=False)
        elif isinstance(data, np.generic):
            pass
        elif arr.dtype.kind == "f":
            arr = arr.astype(DEFAULT_FLOAT)
        elif arr.dtype.kind in "iu" and arr.dtype.itemsize > 4:
            if arr.size == 0 or (arr.min() >= -2**31 and arr.max() < 2**31):
                arr = arr.astype(DEFAULT_INT)
    if dev != "cpu":
        return devices.to_device(arr, dev), dev
    return arr, dev


def _check_data_dtype(dtype, data):
    """Refuse data gradcore does not compute in (complex, strings, objects,
    dates...) with a TypeError naming Tensor, before anything is made."""
    if dtype.kind not in "biuf" or dtype.itemsize > 8:
        what = type(data).__name__
        raise TypeError(f"Tensor: cannot make a Tensor from {what} of dtype {dtype}; gradcore computes "
                        f"in bool, integers and float16/float32/float64")


def _const_for(x, tensors, device):
    """A history-free Tensor for a non-Tensor argument of an op. A Python or
    NumPy scalar is weak: it takes the tensors' dtype unless it is of a
    higher category (gradcore.dtypes.result_type)."""
    if dtypes.is_weak_scalar(x):
        dtype = dtypes.scalar_dtype(tuple([t.dtype for t in tensors]), x)
        if isinstance(x, np.generic):
            x = x.item()
        if device != "cpu":
            return _core.wrap_array(_device_scalar(x, dtype, device))
        return _core.wrap_array(np.asarray(x, dtype), device)
    if isinstance(x, (np.ndarray, np.generic, list, tuple)):
        arr = np.asarray(x) if isinstance(x, (np.ndarray, np.generic)) else to_array(x)[0]
        # an array keeps its dtype here: complex, object or str data must not
        # become a tensor (Tensor() refuses the same)
        _check_data_dtype(arr.dtype, x)
        if device != "cpu":
            arr = devices.to_device(arr, device)
        return _core.wrap_array(arr, device)
    return None


_scalars = {}
# the cached device scalars belong to one backend: dropped when it changes
_device_events.subscribe("backend_changed", _scalars.clear)
_device_events.subscribe("backend_changed", _core._clear_scalar_cache)


def _device_scalar(x, dtype, device):
    """A Python scalar operand on a device, uploaded once per (value, dtype):
    constants are never written (in-place operators rebind)."""
    key = (device, type(x), x, np.dtype(dtype).str)
    arr = _scalars.get(key)
    if arr is None:
        if len(_scalars) > 1024:
            _scalars.clear()
        be = devices.require_cuda() if device == "cuda" else None
        if be is not None and hasattr(be, "constant_scalar"):
            arr = _scalars[key] = be.constant_scalar(x, dtype)
        else:
            arr = _scalars[key] = devices.to_device(np.asarray(x, dtype), device, constant=True)
    return arr


def _none_operand_error(op, args) -> TypeError:
    # made here and raised by the caller: an exception held in a local of the
    # frame raising it is a cycle (frame -> exception -> traceback -> frame)
    # keeping that frame's tensors until the cyclic GC runs
    exc = TypeError("the operand is None and is not supported.")
    exc.add_note(f"(in op {op_label(op)}, with operands "
                 f"{', '.join('None' if x is None else repr(getattr(x, 'shape', type(x).__name__)) for x in args)})")
    return exc


def slow_apply(op, args):
    if any(isinstance(a, graph.SymbolicTensor) for a in args):
        return graph.trace_apply(op, args)
    if describe(op).forward_by_rule and args:
        bad = next(a for a in args if not isinstance(a, Tensor))
        raise TypeError(f"op {op_label(op)} expect type Tensor as inputs, got {type(bad).__name__}")
    tensors = [a for a in args if isinstance(a, Tensor)]
    device = tensors[0]._device if tensors else "cpu"   # the raw device: .device renames "cpu" as "cpu0:0"
    conv = []
    for k, a in enumerate(args):
        if isinstance(a, Tensor):
            conv.append(a)
            continue
        if isinstance(a, (list, tuple)) and _holds_tensor(a):
            # np.asarray would stack them into a constant: no gradient, float32
            raise TypeError(f"op {op_label(op)}: argument {k} is a {type(a).__name__} holding Tensors, which would "
                            f"become one constant tensor without gradient; pass the Tensors as arguments of their "
                            f"own (apply(op, *tensors), op(*tensors)), or stack them first (F.stack)")
        if a is None:
            if not tensors:
                # no tensor at all (F.exp(None)): the op is named
                raise TypeError(f"op {op_label(op)}: the operand is None and is not supported.")
            # MegEngine's exact message for `t + None` and the like (its tests
            # compare the whole text); the op and the shapes are in a note,
            # which a traceback shows
            raise _none_operand_error(op, args)
        try:
            c = _const_for(a, tensors, device)
        except (OverflowError, TypeError, ValueError) as exc:
            raise _operand_error(op, args, a, exc) from None
        if c is None:
            raise TypeError(f"op {op_label(op)}: cannot use an argument of type {type(a).__name__} "
                            f"as a tensor")
        conv.append(c)
    if not conv:
        if hasattr(op, "cpu"):
            out = op.cpu()
            return tuple(_core.wrap_array(o) for o in out) if isinstance(out, tuple) else (_core.wrap_array(out),)
        raise TypeError(f"op {op_label(op)}: called without inputs")
    return _core.apply(op, *conv)


def _holds_tensor(seq, depth: int = 0) -> bool:
    """Whether a (nested) list or tuple operand holds a Tensor."""
    return depth < 8 and any(isinstance(v, Tensor) or (isinstance(v, (list, tuple)) and _holds_tensor(v, depth + 1))
                             for v in seq)


def _operand_error(op, args, bad, exc):
    """The error for a non-Tensor operand ``bad`` that cannot be a tensor (a
    complex, object or str array): the op's own, when its ``infer`` refuses
    that dtype (an index of str is an IndexError, as NumPy's), else ``exc``
    naming the op. Only the error path pays for this."""
    try:
        descs = [TensorDesc(a.shape, a.dtype, a.device) if isinstance(a, Tensor)
                 else TensorDesc(np.shape(a), np.asarray(a).dtype, "cpu") for a in args]
        op.infer(*descs)
    except OpError as err:
        return err
    except Exception:
        pass        # no infer, or one that cannot judge these: exc below
    return type(exc)(f"op {op_label(op)}: cannot use {bad!r} as an operand: {exc}")


def kernel_error(op, args, exc):
    descs = [TensorDesc(a.shape, a.dtype, a.device) for a in args]
    if hasattr(op, "infer"):
        try:
            op.infer(*descs)
        except OpError as err:
            return err
        except Exception:
            pass
    if isinstance(exc, OpError):
        return exc
    shapes = ", ".join(str(d.shape) for d in descs)
    cls = exc.__class__ if isinstance(exc, (ValueError, TypeError, IndexError, GraphCaptureError)) else RuntimeError
    if issubclass(cls, IndexError):
        cls = IndexOpError        # one type for every index out of range
    text = str(exc)
    text = text if text.startswith(f"{op_label(op)}:") else f"{op_label(op)}: {text}"   # named once
    if not text.endswith(f"(input shapes: {shapes})"):
        text = f"{text} (input shapes: {shapes})"      # once: a nested op's error may carry them
    try:
        return cls(text)
    except Exception:
        return RuntimeError(text)


# ---------------------------------------------------------------- methods
_functional = None


def _F():
    global _functional
    if _functional is None:
        from . import functional
        _functional = functional
    return _functional


def _shape_args(shape, what="reshape: shape"):
    """Dims given as varargs, or as one tuple, list, ndarray or Tensor
    (MegEngine accepts all of these), as a tuple of Python ints."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, np.ndarray, Tensor)):
        shape = shape[0]
        if isinstance(shape, (np.ndarray, Tensor)):
            shape = np.asarray(shape).reshape(-1).tolist()
    out = []
    for d in shape:
        try:
            out.append(d.__index__())     # ints, NumPy ints, 0-d integer Tensors; never a float
        except (AttributeError, TypeError):
            raise TypeError(f"{what} entries must be integers, got {d!r} in {tuple(shape)}") from None
    return tuple(out)


def reshape(self, *shape):
    return _F().reshape(self, _shape_args(shape))


def transpose(self, *perm):
    if len(perm) == 1 and isinstance(perm[0], (tuple, list)):
        perm = tuple(perm[0])
    if any(isinstance(p, str) for p in perm):
        # MegEngine's pattern: 'x' adds an axis, a left-out axis of size 1 is dropped
        return _F().transpose(self, perm)
    perm = _shape_args(perm, "transpose: axes")
    # fewer axes than the tensor has: F.transpose drops the left-out axes of size 1
    return _F().transpose(self, perm if perm else None)


def to(self, device):
    dev = norm_device(device)
    if same_device(dev, self._device):
        return self
    # recorded: the gradient is copied back to the source device
    from gradcore.ops.shape import Copy
    return _core.apply(Copy(dev), self)[0]


def astype(self, dtype):
    return _F().astype(self, dtype)


def set_value(self, value) -> None:
    """Give this tensor ``value`` (a Tensor, or data made a tensor of this
    one's dtype and device), MegEngine's ``Tensor.set_value``: the old
    buffer is never written (what a backward saved stays valid).

    Example::

        >>> w = gc.Parameter([1.0, 2.0]); w.set_value([3.0, 4.0]); w.numpy()
        array([3., 4.], dtype=float32)
    """
    if not isinstance(value, Tensor):
        value = Tensor(value, dtype=self.dtype, device=self.device)
    self._reset(value)


def reset_zero(self) -> None:
    """Set every element to 0, MegEngine's ``Tensor.reset_zero``.

    Example::

        >>> x = gc.tensor([1.0, 2.0]); x.reset_zero(); x.numpy()
        array([0., 0.], dtype=float32)
    """
    self._reset(_F().zeros_like(self))


_METHODS = {
    "reshape": reshape,
    "transpose": transpose,
    "flatten": lambda self, start_axis=0, end_axis=-1: _F().flatten(self, start_axis, end_axis),
    "sum": lambda self, axis=None, keepdims=False: _F().sum(self, axis, keepdims),
    "mean": lambda self, axis=None, keepdims=False: _F().mean(self, axis, keepdims),
    "max": lambda self, axis=None, keepdims=False: _F().max(self, axis, keepdims),
    "min": lambda self, axis=None, keepdims=False: _F().min(self, axis, keepdims),
    "prod": lambda self, axis=None, keepdims=False: _F().prod(self, axis, keepdims),
    "broadcast_to": lambda self, *shape: _F().broadcast_to(self, _shape_args(shape, "broadcast_to: shape")),
    "expand_dims": lambda self, axis: _F().expand_dims(self, axis),
    "squeeze": lambda self, axis=None: _F().squeeze(self, axis),
    "astype": astype,
    "to": to,
    "abs": lambda self: _F().abs(self),
    "exp": lambda self: _F().exp(self),
    "log": lambda self: _F().log(self),
    "copy": lambda self: _F().copy(self),
    "tolist": lambda self: self.numpy().tolist(),
    "set_value": set_value,
    "reset_zero": reset_zero,
    "__dlpack__": interop.tensor_dlpack,
    "__dlpack_device__": interop.tensor_dlpack_device,
}
_PROPS = {
    "T": lambda self: _F().transpose(self, None),
    "requires_grad": lambda self: self._is_recorded() if isinstance(self, Tensor) else False,
    "__cuda_array_interface__": interop.tensor_cuda_array_interface,
    # MegEngine's memory format of a tensor: gradcore has the one, row-major
    "format": lambda self: "default",
}


def method(self, name):
    prop = _PROPS.get(name)
    if prop is not None:
        return prop(self)
    fn = _METHODS.get(name)
    if fn is None:
        raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")
    return functools.partial(fn, self)


def getitem(self, index):
    return _F().getitem(self, index)


def setitem(self, index, value):
    return _F().setitem(self, index, value)


def logical(kind, x, y=None):
    """``& | ^ ~`` on tensors: logical on bool tensors, as MegEngine defines
    them; for any other dtype a TypeError (no silent cast to bool)."""
    F = _F()
    args = (x,) if kind == "not" else (x, y)
    for a in args:
        dtype = getattr(a, "dtype", None)         # a Tensor's, an array's, a traced tensor's
        if dtype is None:
            dtype = np.result_type(a)
        if dtype != np.bool_:
            sym = {"not": "~", "and": "&", "or": "|", "xor": "^"}[kind]
            shapes = " and ".join(str(tuple(np.shape(a))) for a in args)
            raise TypeError(f"logical_{kind} ({sym}): operands must be bool tensors, got {dtype} "
                            f"(shapes {shapes}); compare first, e.g. (x > 0) {sym} (y > 0)")
    return getattr(F, f"logical_{kind}")(*args)


def round_(self, ndigits=None):
    """``round(t)``: the tensor rounded elementwise, halves away from zero (F.round, as MegEngine's);
    ``round(t, n)`` to n decimals."""
    F = _F()
    if not ndigits:
        return F.round(self)
    scale = 10.0 ** ndigits
    return F.round(self * scale) / scale


# NumPy ufuncs that are gradcore elementwise modes, with the same NumPy
# semantics (dtype rules included)
_UFUNC_MODES = {
    "add": "add", "subtract": "sub", "multiply": "mul", "true_divide": "div", "divide": "div",
    "floor_divide": "floor_div", "remainder": "mod", "power": "pow", "negative": "neg",
    "absolute": "abs", "equal": "eq", "not_equal": "ne", "less": "lt", "less_equal": "le",
    "greater": "gt", "greater_equal": "ge", "maximum": "maximum", "minimum": "minimum",
    "exp": "exp", "log": "log", "log1p": "log1p", "expm1": "expm1", "sqrt": "sqrt",
    "square": "square", "sin": "sin", "cos": "cos", "tan": "tan", "arcsin": "asin",
    "arccos": "acos", "arctan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh",
    "arcsinh": "asinh", "arccosh": "acosh", "arctanh": "atanh", "floor": "floor", "ceil": "ceil",
    "sign": "sign",
}
_ufunc_ops = {}


def array_ufunc(self, ufunc, method, inputs, kwargs):
    """``Tensor.__array_ufunc__``: ``np.add(tensor, array)`` and the other
    ufuncs that are gradcore elementwise ops return a Tensor on the tensor's
    device (recorded, like the operator), as in MegEngine; any other ufunc,
    method (``reduce``, ``at``, ...) or an ``out=`` argument runs in NumPy on
    the host values, as before."""
    mode = _UFUNC_MODES.get(ufunc.__name__)
    if method == "__call__" and not kwargs and mode is not None and len(inputs) == ufunc.nin:
        op = _ufunc_ops.get(mode)
        if op is None:
            from gradcore.ops.elemwise import Elemwise
            op = _ufunc_ops[mode] = Elemwise(mode)
        return _core.apply(op, *inputs)[0]
    host = [np.asarray(i.numpy()) if isinstance(i, Tensor) else i for i in inputs]
    if "out" in kwargs:
        kwargs = dict(kwargs)
        kwargs["out"] = tuple(np.asarray(o.numpy()) if isinstance(o, Tensor) else o
                              for o in kwargs["out"])
    return getattr(ufunc, method)(*host, **kwargs)


def _reduce_op(mode, axis, keepdims):
    from .functional import _Reduce
    return _Reduce(mode, axis, keepdims)


_HOOK_FNS = {
    "method": method,
    "reduce_op": _reduce_op,
    "T": _PROPS["T"],
    **{name: _METHODS[name] for name in ("reshape", "transpose", "flatten", "sum", "mean", "max",
                                          "min", "prod", "to")},
    "getitem": getitem,
    "setitem": setitem,
    "logical": logical,
    "array_ufunc": array_ufunc,
    "round": round_,
    "floor": lambda t: _F().floor(t),
    "ceil": lambda t: _F().ceil(t),
    "matmul": lambda a, b: _F().matmul(a, b),
    "left_shift": lambda a, b: _F().left_shift(a, b),
    "right_shift": lambda a, b: _F().right_shift(a, b),
    "astype": astype,
    "_to_array": to_array,
    "_norm_device": norm_device,
    # zeros for an output no gradient reached: made on its device (no upload)
    "_zeros_on": lambda shape, dtype, device: filled(shape, 0, dtype, device),
    "_ones_on": lambda arr: arr.backend.ones_seed(arr.shape, arr.dtype),
}


_sum_to_op = None


def _sum_to(g, shape):
    global _sum_to_op
    if _sum_to_op is None:
        from gradcore.ops.shape import SumTo
        _sum_to_op = SumTo
    return _core.apply(_sum_to_op(tuple(shape)), g)[0]


def promote(op, args):
    """The core's dtype hook: ``(op, args)`` with each input cast (a
    recorded Cast) to the dtype ``op.input_dtypes`` asks for."""
    from gradcore.ops.shape import cast_to
    op, want = op.input_dtypes([a.dtype for a in args])
    cast = dtypes.cast_inputs(args, want, cast_to)
    return op, (args if cast is None else cast)


def install():
    from gradcore.ops.elemwise import Elemwise, modes
    _core._install_hooks(
        slow_apply=slow_apply,
        device_scalar=_device_scalar,
        backward_graph=graph._core_backward_graph,
        sum_to=_sum_to,
        add_op=Elemwise("add"),
        kernel_error=kernel_error,
        kernel_for=devices.kernel_table.lookup,    # called per op on cuda: compiled, no argument tuple
        tensor_method=_HOOK_FNS.__getitem__,
        operator_ops={m: Elemwise(m) for m in modes()},
        device_array=DeviceArray,
        promote=promote,
        named_devices=devices._NAMED,
    )
    graph.install_method_lookup(method, _HOOK_FNS.__getitem__)   # SymbolicTensor has Tensor's methods and operators
