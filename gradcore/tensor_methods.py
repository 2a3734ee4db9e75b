"""The Python side of Tensor: array conversion, the slow dispatch path
(scalars, arrays, symbolic tensors), clear kernel errors, and the methods
that are not on the per-op path (reshape, sum, ...). Installed into the
compiled core as hooks at import."""
from __future__ import annotations

import functools

import numpy as np

from . import _core, graph
from .op import OpError, TensorDesc
from ._core import Tensor
from .cuda.array import DeviceArray

DEFAULT_FLOAT = np.dtype("float32")
DEFAULT_INT = np.dtype("int32")


def norm_device(device) -> str:
    if device is None:
        return "cpu"
    d = str(device).lower()
    if d in ("cpu", "cpu0", "cpux") or d.startswith("cpu"):
        return "cpu"
    if d in ("cuda", "gpu", "gpu0", "cuda0", "cuda:0", "xpux"):
        from . import devices
        devices.require_cuda()
        return "cuda"
    raise ValueError(f"unknown device {device!r}; gradcore knows 'cpu' and 'cuda'")


def to_array(data, dtype=None, device=None):
    """(array, device) for Tensor(data, dtype, device): float32 by default
    for Python numbers and lists, NumPy arrays keep their dtype."""
    dev = norm_device("cuda" if device is None and isinstance(data, DeviceArray) else device)
    if isinstance(data, DeviceArray):
        if dev == "cuda":
            return (data.copy() if dtype is None else data.astype(dtype)), dev
        arr = data.get() if dtype is None else data.get().astype(dtype)
        return arr, dev
    if isinstance(data, np.ndarray):
        # a copy: the tensor must not share a buffer the caller can still write
        arr = np.array(data, dtype=dtype, copy=True)
    elif data is None:
        arr = np.zeros((), dtype or DEFAULT_FLOAT)
    else:
        arr = np.asarray(data)
        if dtype is not None:
            arr = arr.astype(dtype, copy=False)
        elif isinstance(data, np.generic):
            pass
        elif arr.dtype.kind == "f":
            arr = arr.astype(DEFAULT_FLOAT)
        elif arr.dtype.kind in "iu" and arr.dtype.itemsize > 4 and not isinstance(data, np.generic):
            if arr.size == 0 or (arr.min() >= -2**31 and arr.max() < 2**31):
                arr = arr.astype(DEFAULT_INT)
        elif arr.dtype.kind not in "biufc":
            raise TypeError(f"cannot make a Tensor from {type(data).__name__} (dtype {arr.dtype})")
    if dev != "cpu":
        from . import devices
        return devices.to_device(arr, dev), dev
    return arr, dev


def _const_for(x, tensors, device):
    """A history-free Tensor for a non-Tensor argument of an op."""
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        dtypes = [t.dtype for t in tensors]
        dtype = np.result_type(*dtypes, x) if dtypes else to_array(x)[0].dtype
        if device != "cpu":
            return _core.wrap_array(_device_scalar(x, dtype, device))
        return _core.wrap_array(np.asarray(x, dtype), device)
    if isinstance(x, (np.ndarray, np.generic, list, tuple)):
        arr = np.asarray(x)
        if not isinstance(x, (np.ndarray, np.generic)):
            arr = to_array(x)[0]
        if device != "cpu":
            from . import devices
            arr = devices.to_device(arr, device)
        return _core.wrap_array(arr, device)
    return None


_scalars = {}


def _device_scalar(x, dtype, device):
    """A Python scalar operand on a device, uploaded once per (value, dtype):
    constants are never written (in-place operators rebind)."""
    key = (device, type(x), x, np.dtype(dtype).str)
    arr = _scalars.get(key)
    if arr is None:
        from . import devices
        if len(_scalars) > 1024:
            _scalars.clear()
        arr = _scalars[key] = devices.to_device(np.asarray(x, dtype), device)
    return arr


def slow_apply(op, args):
    if any(isinstance(a, graph.SymbolicTensor) for a in args):
        return graph.trace_apply(op, args)
    if hasattr(op, "_grad_rule") and not hasattr(op, "cpu"):
        bad = next(a for a in args if not isinstance(a, Tensor)) if args else None
        if args:
            raise TypeError(f"op {_name(op)} expects Tensor inputs, got {type(bad).__name__}")
    tensors = [a for a in args if isinstance(a, Tensor)]
    device = tensors[0].device if tensors else "cpu"
    conv = []
    for a in args:
        if isinstance(a, Tensor):
            conv.append(a)
            continue
        c = _const_for(a, tensors, device)
        if c is None:
            raise TypeError(f"op {_name(op)}: cannot use an argument of type {type(a).__name__} "
                            f"as a tensor")
        conv.append(c)
    if not conv:
        if hasattr(op, "cpu"):
            out = op.cpu()
            return tuple(_core.wrap_array(o) for o in out) if isinstance(out, tuple) else (_core.wrap_array(out),)
        raise TypeError(f"op {_name(op)}: called without inputs")
    return _core.apply(op, *conv)


def _name(op):
    return op._name() if hasattr(op, "_name") else type(op).__name__


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
    cls = exc.__class__ if isinstance(exc, (ValueError, TypeError, IndexError)) else RuntimeError
    text = str(exc)
    text = text if text.startswith(f"{_name(op)}:") else f"{_name(op)}: {text}"   # named once
    try:
        return cls(f"{text} (input shapes: {shapes})")
    except Exception:
        return RuntimeError(f"{text} (input shapes: {shapes})")


def kernel_for(op, device):
    from . import devices
    return devices.kernel_for(op, device)


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
    perm = _shape_args(perm, "transpose: axes")
    return _F().transpose(self, perm if perm else None)


def to(self, device):
    dev = norm_device(device)
    if dev == self.device:
        return self
    from . import devices
    return devices.copy_to(self, dev)


def astype(self, dtype):
    return _F().astype(self, dtype)


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
}
_PROPS = {
    "T": lambda self: _F().transpose(self, None),
    "requires_grad": lambda self: self._is_recorded() if isinstance(self, Tensor) else False,
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
        dtype = a.dtype if isinstance(a, Tensor) else np.result_type(a)
        if dtype != np.bool_:
            sym = {"not": "~", "and": "&", "or": "|", "xor": "^"}[kind]
            shapes = " and ".join(str(tuple(np.shape(a))) for a in args)
            raise TypeError(f"logical_{kind} ({sym}): operands must be bool tensors, got {dtype} "
                            f"(shapes {shapes}); compare first, e.g. (x > 0) {sym} (y > 0)")
    return getattr(F, f"logical_{kind}")(*args)


def round_(self, ndigits=None):
    """``round(t)``: the tensor rounded half to even, elementwise (F.round);
    ``round(t, n)`` to n decimals."""
    F = _F()
    if not ndigits:
        return F.round(self)
    scale = 10.0 ** ndigits
    return F.round(self * scale) / scale


def bind_op_args(fn, args, kwargs):
    """Positional arguments for an OpFunction called with keywords: its
    inputs are named x, y, z (MegEngine's names; ``inp`` for one input)."""
    names = ("x", "y", "z")[:fn.op.nin]
    kwargs = dict(kwargs)
    if len(names) == 1 and "inp" in kwargs and "x" not in kwargs:
        kwargs["x"] = kwargs.pop("inp")
    bound = list(args)
    for name in names[len(args):]:
        if name not in kwargs:
            raise TypeError(f"{fn.__name__}() missing argument {name!r}")
        bound.append(kwargs.pop(name))
    if kwargs:
        raise TypeError(f"{fn.__name__}() got unexpected keyword argument(s) {', '.join(map(repr, kwargs))}"
                        f"; its inputs are {', '.join(names)}")
    return tuple(bound)


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
    "bind_op_args": bind_op_args,
    "round": round_,
    "matmul": lambda a, b: _F().matmul(a, b),
    "astype": astype,
    "_to_array": to_array,
    "_norm_device": norm_device,
    "_zeros_on": lambda shape, dtype, device: _F().zeros(shape, dtype, device)._data,
    "_ones_on": lambda arr: arr.backend.ones_seed(arr.shape, arr.dtype),
}


_sum_to_op = None


def _sum_to(g, shape):
    global _sum_to_op
    if _sum_to_op is None:
        from gradcore.ops.shape import SumTo
        from gradcore.op import interned
        _sum_to_op = interned(SumTo)
    return _core.apply(_sum_to_op(tuple(shape)), g)[0]


def install():
    from gradcore.ops.elemwise import Elemwise, modes
    _core._install_hooks(
        slow_apply=slow_apply,
        backward_graph=graph._core_backward_graph,
        sum_to=_sum_to,
        add_op=Elemwise("add"),
        kernel_error=kernel_error,
        kernel_for=kernel_for,
        tensor_method=_HOOK_FNS.__getitem__,
        operator_ops={m: Elemwise(m) for m in modes()},
        device_array=DeviceArray,
    )
