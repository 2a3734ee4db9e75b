"""The engine's side of CUDA graphs (``gradcore.cuda.graphed``, in the
device layer: gradcore/cuda/graphs.py): what a tensor is to the graph
wrapper. The device layer knows nothing of tensors, so this module hands it
an adapter (``graphs.install_adapter``) when gradcore is imported:

- ``array_of(obj)``: the device array of a cuda Tensor argument (copied into
  the graph's input buffer at each call); None for a Parameter (passed as it
  is: the optimizer updates it in place, the user holds the same object) and
  for any other value (part of the graph's signature);
- ``data_of(obj)``: the device array of a result (any cuda Tensor, a
  Parameter included), None for anything else;
- ``bound_tensors(roots)``, ``rebind(tensor, array)``: the cuda Tensors the
  step can reach, with their arrays, found once per capture; a step that gives a tensor new
  memory (batch norm's running statistics) is written back into the old
  array, so the replay updates the user's tensor in place;
- ``wrap(array)``: a Tensor over a device array (inputs during the capture,
  results after a replay);
- ``naming_ops(cap)``: while the step is captured, each op run through the
  core's dispatch is named in ``cap.current_op``, so a host round-trip
  inside the capture is reported with the op that made it.

Example::

    >>> step = gradcore.cuda.graphed(train_step)      # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import functools
import types

import numpy as np

from . import _core, devices
from ._core import Tensor
from .cuda import graphs
from .cuda.array import DeviceArray
from .tensor import Parameter


_LEAVES = (str, bytes, int, float, complex, bool, type(None), np.ndarray, np.generic, DeviceArray, type,
           types.ModuleType, types.BuiltinFunctionType)


def reachable_tensors(roots) -> list:
    """The Tensors a step can reach (once per capture): through containers,
    objects' attributes (modules, optimizers, GradManagers), closures, the
    globals a function names, bound methods and partials, from ``roots``
    (the step and its arguments). Tensors cannot be found through the
    garbage collector: they are not GC-tracked objects.

    Example: ``reachable_tensors([train_step])`` lists the model's
    parameters and buffers and the optimizer's state."""
    found, seen, todo = {}, set(), list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, _LEAVES):
            continue
        seen.add(id(obj))
        if isinstance(obj, Tensor):
            found[id(obj)] = obj
        elif isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, types.FunctionType):
            todo.extend(cell.cell_contents for cell in obj.__closure__ or () if _filled(cell))
            names = obj.__globals__
            todo.extend(names[n] for n in obj.__code__.co_names if n in names)
            todo.extend(obj.__defaults__ or ())
        elif isinstance(obj, types.MethodType):
            todo += [obj.__self__, obj.__func__]
        elif isinstance(obj, functools.partial):
            todo += [obj.func, *obj.args, *obj.keywords.values()]
        else:
            attrs = getattr(obj, "__dict__", None)
            if isinstance(attrs, dict):
                todo.append(attrs)
    return list(found.values())


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:          # a closure variable not assigned yet
        return False
    return True


class TensorAdapter:
    """Tensors as ``gradcore.cuda.graphs.GraphedStep`` sees them (module docstring)."""

    @staticmethod
    def array_of(obj):
        if isinstance(obj, DeviceArray):
            return obj
        if not isinstance(obj, Tensor) or isinstance(obj, Parameter):
            return None
        data = obj._data
        if not isinstance(data, DeviceArray):
            raise graphs.GraphCaptureError(f"a graphed step takes cuda tensors; got a tensor of shape {obj.shape} "
                                           f"on {obj.device} (move the batch with .to('cuda') before the call)")
        return data

    @staticmethod
    def data_of(obj):
        if isinstance(obj, DeviceArray):
            return obj
        if isinstance(obj, Tensor) and isinstance(obj._data, DeviceArray):
            return obj._data
        return None

    @staticmethod
    def bound_tensors(roots):
        return [(t, t._data) for t in reachable_tensors(roots) if isinstance(t._data, DeviceArray)]

    @staticmethod
    def rebind(tensor, array) -> None:
        tensor._data = array

    @staticmethod
    def wrap(array) -> Tensor:
        t = Tensor.__new__(Tensor)
        t._data, t._device = array, "cuda"
        return t

    @staticmethod
    @contextlib.contextmanager
    def naming_ops(cap):
        table = devices.kernel_table

        def kernel_for(op, device):
            kernel = table(op, device)
            if device == "cpu":
                return kernel

            def run(*arrays):
                outer, cap.current_op = cap.current_op, op
                try:
                    return kernel(*arrays)
                finally:
                    cap.current_op = outer
            return run
        _core._install_hooks(kernel_for=kernel_for)
        try:
            yield
        finally:
            _core._install_hooks(kernel_for=table)


graphs.install_adapter(TensorAdapter)
