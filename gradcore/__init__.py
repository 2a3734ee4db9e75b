"""gradcore: reverse-mode automatic differentiation with a compiled core.

Example::

    >>> import gradcore as gc
    >>> from gradcore.autodiff import GradManager
    >>> w = gc.Parameter([1.0, 2.0])
    >>> gm = GradManager().attach([w])
    >>> with gm:
    ...     gm.backward((w * w).sum())
    >>> w.grad.numpy()
    array([2., 4.], dtype=float32)
"""
try:
    from . import _core, _host_pool  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "gradcore's compiled core (gradcore._core, gradcore._host_pool) is not built. Build it with "
        "`pip install -e .` (or `pip install .`, or `python setup.py build_ext --inplace`) "
        f"from the source tree. Original error: {exc}") from exc

from . import memory

memory._install_at_import()

from ._core import GradRuleFallback, Tensor, register_grad_rule, registered_grad_rule, unregister_grad_rule
from .op import IndexOpError, OpError
from .tensor import Parameter, tensor
from . import tensor_methods as _tm

_tm.install()

from . import functional, random  # noqa: E402
from . import graph as _graph  # noqa: E402
from .ops import kernel_families as _kernel_families  # noqa: E402

# the standard kernel catalog (below the engine) lists the elementwise rows'
# fused backward kernels, which gradcore.graph traces: handed down here, where
# both are loaded, so that neither imports the other's layer upward
_kernel_families.install_backward_graphs(_graph.make_backward_graph)
from .autodiff import Function, GradManager  # noqa: E402
from .functional import ones_like, zeros_like  # noqa: E402
from .forward_mode import jvp, vjp  # noqa: E402
from . import step_graphs as _step_graphs  # noqa: E402,F401 - gradcore.cuda.graphed's view of tensors
from .visualization import record_details, visualize  # noqa: E402
from .devices import get_default_device, get_device_count, is_cuda_available, set_default_device  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Tensor", "tensor", "Parameter", "GradManager", "Function", "register_grad_rule",
           "unregister_grad_rule", "registered_grad_rule",
           "GradRuleFallback", "functional", "ones_like", "zeros_like", "save", "load", "from_dlpack", "to_torch", "from_torch", "to_jax", "jvp", "vjp", "visualize", "record_details", "OpError", "IndexOpError",
           "is_cuda_available", "get_device_count", "set_default_device", "get_default_device", "get_logger",
           "set_log_level", "set_log_file", "enable_debug_log",
           # MegEngine's megengine.device names, which its top level has too
           "is_cambricon_available", "is_atlas_available", "is_rocm_available", "what_is_xpu", "get_mem_status_bytes",
           "get_cuda_compute_capability", "get_cuda_device_property", "get_cuda_version", "get_cudnn_version",
           "get_cuda_driver_version", "get_allocated_memory", "get_reserved_memory", "get_max_allocated_memory",
           "get_max_reserved_memory", "reset_max_memory_stats", "coalesce_free_memory"]


# functions whose modules load on first use (a third of a warm start on a GPU
# machine is ``import gradcore``): name -> the submodule defining it
_LAZY_FUNCTIONS = {"save": "serialization", "load": "serialization", "from_dlpack": "interop",
                   "from_torch": "interop", "to_torch": "interop", "to_jax": "interop",
                   "get_logger": "logger", "set_log_level": "logger", "set_log_file": "logger",
                   "enable_debug_log": "logger",
                   **{name: "device" for name in __all__[__all__.index("is_cambricon_available"):]}}


def __getattr__(name):
    # heavier submodules, and the functions above, load on first use
    import importlib
    if name in ("module", "optimizer", "config", "core", "testing", "autodiff", "registry", "graph", "ops", "data",
                "distributed", "devices", "device", "amp", "distributions"):
        return importlib.import_module(f"gradcore.{name}")
    if name in _LAZY_FUNCTIONS:
        value = getattr(importlib.import_module(f"gradcore.{_LAZY_FUNCTIONS[name]}"), name)
        globals()[name] = value        # found directly from now on
        return value
    raise AttributeError(f"module 'gradcore' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_FUNCTIONS))
