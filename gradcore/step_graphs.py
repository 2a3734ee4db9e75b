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

from . import _core, devices
from ._core import Tensor
from .cuda import graphs
from .cuda.array import DeviceArray
from .tensor import Parameter


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
