"""cuDNN for the convolutions, pooling and batch norm on a GPU (issue 17).

The library is NVIDIA's ``nvidia-cudnn-cu13`` wheel (a dependency of
``gradcore[cuda]``: ``nvidia/cudnn/lib/libcudnn.so.9``), else the system's
(``$CUDA_HOME/lib64``, ``/usr/local/cuda/lib64``, the loader path). Its
legacy descriptor API is bound once, by address: the setup functions
(handles, descriptors, algorithm choice) through ctypes with their C
prototypes (``PROTOTYPES``), the per-call ones (convolutions, pooling,
batch normalisation) from Cython through C function pointers
(``_cudnn.pyx``). Descriptors are made once per shape and cached.

What runs on cuDNN (``gradcore/ops/conv.py`` and ``pool.py`` ask here first and runs its
im2col + cuBLAS path, or its direct kernels, when the answer is None):

- ``conv_forward``, ``conv_backward_data``, ``conv_backward_filter``:
  the N-d Convolution (2-d and 3-d; 1-d as 2-d with a trailing axis of 1),
  its gradients and ConvTranspose (ConvolutionBackwardData), with groups,
  stride, padding and dilation;
- ``pool_forward``/``pool_backward``: max pooling forward (NaN propagates,
  as on the cpu), average pooling forward and backward (both counting
  modes); max pooling backward only with ``max_pool_backward = True`` (how
  cuDNN routes the gradient among tied maxima is not checked against
  gradcore's "first maximum" on a GPU yet);
- ``batch_norm_training``/``batch_norm_backward``/``batch_norm_inference``:
  the BatchNorm ops of ``gradcore/ops/nn.py`` (spatial mode, per channel).

Per backend (one device) there is one ``Context``: its cuDNN handle on the
default stream (every gradcore kernel runs there, so cuDNN is ordered with
them), its descriptors and its algorithm cache. The algorithm of each
(direction, shapes, dtype, attributes, math mode, switches) is chosen once
per process: with ``benchmark`` by timing (``cudnnFind...AlgorithmEx``, a
workspace of at most ``workspace_limit`` bytes), else by cuDNN's heuristics
(``cudnnGet...Algorithm_v7``); with ``deterministic`` only deterministic
algorithms are taken. The workspace comes from gradcore's device memory
pool. A configuration cuDNN refuses (no algorithm, or ``NOT_SUPPORTED``)
is remembered and runs the im2col path; ``status(be)`` and ``gradcore
doctor`` say which path is in use and why.

Precision (as PyTorch's defaults): float32 convolutions may use TF32 tensor
cores (``gradcore.cuda.allow_tf32_conv``, default True: ``CUDNN_DEFAULT_MATH``;
False: ``CUDNN_FMA_MATH``); float64 never does.

Example::

    import gradcore.cuda.cudnn as cudnn
    cudnn.benchmark = True          # time the algorithms once per shape
    cudnn.deterministic = True      # bitwise reproducible gradients
    cudnn.status(gradcore.cuda.backend())   # "in use: cuDNN 9.28.1 (...)"
"""
from __future__ import annotations

import ctypes
import os
import sys
import weakref
from typing import Dict, List, Optional, Tuple

import numpy as np

from . import _cudnn

# ---------------------------------------------------------------- switches
enabled = True              # False: the im2col + cuBLAS path everywhere
benchmark = False           # time the algorithms once per configuration (cudnnFind*Ex)
deterministic = False       # only deterministic algorithms
workspace_limit = 1 << 30   # bytes an algorithm's workspace may take
max_pool_backward = False   # max pooling's backward on cuDNN too (see the module docstring)

# ---------------------------------------------------------------- cuDNN's enums (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h)
SUCCESS = 0
DATA_FLOAT, DATA_DOUBLE = 0, 1
TENSOR_NCHW = 0
CROSS_CORRELATION = 1
DEFAULT_MATH, TENSOR_OP_MATH, TENSOR_OP_MATH_ALLOW_CONVERSION, FMA_MATH = 0, 1, 2, 3
POOLING_MAX, POOLING_AVERAGE_INCLUDE_PADDING, POOLING_AVERAGE_EXCLUDE_PADDING, POOLING_MAX_DETERMINISTIC = 0, 1, 2, 3
NOT_PROPAGATE_NAN, PROPAGATE_NAN = 0, 1
NON_DETERMINISTIC, DETERMINISTIC = 0, 1
BATCHNORM_SPATIAL = 1
ALGO_COUNT = {"forward": 8, "backward_data": 6, "backward_filter": 7}
_DATA_TYPES = {np.dtype(np.float32): DATA_FLOAT, np.dtype(np.float64): DATA_DOUBLE}
_INT32_MAX = (1 << 31) - 1


class CudnnError(RuntimeError):
    """A cuDNN call failed; the message names the call and the shapes."""


class CudnnUnavailable(CudnnError):
    """cuDNN cannot be used here (not installed, or no GPU to create a handle on)."""


class AlgoPerf(ctypes.Structure):
    """``cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t`` (one layout for the three)."""
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int), ("mathType", ctypes.c_int),
                ("reserved", ctypes.c_int * 3)]


_P, _I, _S, _D = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_double
_IA = ctypes.POINTER(ctypes.c_int)
_PP = ctypes.POINTER(ctypes.c_void_p)
_PERF = ctypes.POINTER(AlgoPerf)
_PS = ctypes.POINTER(ctypes.c_size_t)

# name -> (restype, argtypes): the C prototypes of the functions gradcore calls
PROTOTYPES = {
    "cudnnGetVersion": (_S, ()),
    "cudnnGetErrorString": (ctypes.c_char_p, (_I,)),
    "cudnnCreate": (_I, (_PP,)),
    "cudnnDestroy": (_I, (_P,)),
    "cudnnSetStream": (_I, (_P, _P)),
    "cudnnCreateTensorDescriptor": (_I, (_PP,)),
    "cudnnSetTensorNdDescriptor": (_I, (_P, _I, _I, _IA, _IA)),
    "cudnnCreateFilterDescriptor": (_I, (_PP,)),
    "cudnnSetFilterNdDescriptor": (_I, (_P, _I, _I, _I, _IA)),
    "cudnnCreateConvolutionDescriptor": (_I, (_PP,)),
    "cudnnSetConvolutionNdDescriptor": (_I, (_P, _I, _IA, _IA, _IA, _I, _I)),
    "cudnnSetConvolutionGroupCount": (_I, (_P, _I)),
    "cudnnSetConvolutionMathType": (_I, (_P, _I)),
    "cudnnCreatePoolingDescriptor": (_I, (_PP,)),
    "cudnnSetPoolingNdDescriptor": (_I, (_P, _I, _I, _I, _IA, _IA, _IA)),
    # (handle, x/w/dy descriptors, conv, output descriptor, requested, returned*, perf*)
    "cudnnGetConvolutionForwardAlgorithm_v7": (_I, (_P, _P, _P, _P, _P, _I, _IA, _PERF)),
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": (_I, (_P, _P, _P, _P, _P, _I, _IA, _PERF)),
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": (_I, (_P, _P, _P, _P, _P, _I, _IA, _PERF)),
    # (handle, a desc, a, b desc, b, conv, out desc, out, requested, returned*, perf*, workspace, size)
    "cudnnFindConvolutionForwardAlgorithmEx": (_I, (_P, _P, _P, _P, _P, _P, _P, _P, _I, _IA, _PERF, _P, _S)),
    "cudnnFindConvolutionBackwardDataAlgorithmEx": (_I, (_P, _P, _P, _P, _P, _P, _P, _P, _I, _IA, _PERF, _P, _S)),
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": (_I, (_P, _P, _P, _P, _P, _P, _P, _P, _I, _IA, _PERF, _P, _S)),
    # (handle, a desc, b desc, conv, out desc, algo, size*)
    "cudnnGetConvolutionForwardWorkspaceSize": (_I, (_P, _P, _P, _P, _P, _I, _PS)),
    "cudnnGetConvolutionBackwardDataWorkspaceSize": (_I, (_P, _P, _P, _P, _P, _I, _PS)),
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": (_I, (_P, _P, _P, _P, _P, _I, _PS)),
    # (handle, alpha, a desc, a, b desc, b, conv, algo, workspace, size, beta, out desc, out)
    "cudnnConvolutionForward": (_I, (_P, _P, _P, _P, _P, _P, _P, _I, _P, _S, _P, _P, _P)),
    "cudnnConvolutionBackwardData": (_I, (_P, _P, _P, _P, _P, _P, _P, _I, _P, _S, _P, _P, _P)),
    "cudnnConvolutionBackwardFilter": (_I, (_P, _P, _P, _P, _P, _P, _P, _I, _P, _S, _P, _P, _P)),
    # (handle, pooling, alpha, x desc, x, beta, y desc, y)
    "cudnnPoolingForward": (_I, (_P, _P, _P, _P, _P, _P, _P, _P)),
    # (handle, pooling, alpha, y desc, y, dy desc, dy, x desc, x, beta, dx desc, dx)
    "cudnnPoolingBackward": (_I, (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P)),
    # (handle, mode, alpha, beta, x desc, x, y desc, y, param desc, scale, bias, average factor,
    #  running mean, running var, eps, saved mean, saved inverse std)
    "cudnnBatchNormalizationForwardTraining": (_I, (_P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _D, _P, _P, _D,
                                                    _P, _P)),
    # (handle, mode, alpha, beta, x desc, x, y desc, y, param desc, scale, bias, mean, var, eps)
    "cudnnBatchNormalizationForwardInference": (_I, (_P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _D)),
    # (handle, mode, alpha/beta data, alpha/beta params, x desc, x, dy desc, dy, dx desc, dx, param desc,
    #  scale, dscale, dbias, eps, saved mean, saved inverse std)
    "cudnnBatchNormalizationBackward": (_I, (_P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _D,
                                             _P, _P)),
}

_STATUS_NAMES = {0: "SUCCESS", 1001: "NOT_INITIALIZED", 2000: "BAD_PARAM", 3000: "NOT_SUPPORTED",
                 4000: "INTERNAL_ERROR", 5000: "EXECUTION_FAILED"}


# ---------------------------------------------------------------- the library
def candidate_paths() -> List[str]:
    """Where libcudnn may be, most specific first: the ``nvidia-cudnn-cu13``
    wheel (``nvidia/cudnn/lib``), the CUDA toolkit, the loader path (the
    lookup of cuBLAS and NVRTC, ``toolkit.library_candidates``)."""
    from .toolkit import library_candidates
    # the front library only: it loads its sub-libraries (libcudnn_cnn, _ops, ...) itself
    return [p for p in library_candidates("cudnn", "cudnn") if os.path.basename(p).startswith("libcudnn.so")]


class Library:
    """cuDNN's functions, bound once by address with their prototypes
    (``PROTOTYPES``). ``lib`` is anything whose attributes are C functions
    (a ``ctypes.CDLL``, or a test's stand-in of ctypes callbacks)."""

    def __init__(self, lib, path: str = ""):
        self.lib, self.path = lib, path
        self.address: Dict[str, int] = {}       # name -> the C function's address (the compiled calls')
        missing = []
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                address = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
            except AttributeError:
                missing.append(name)
                continue
            self.address[name] = address
            setattr(self, name, ctypes.CFUNCTYPE(restype, *argtypes)(address))
        if missing:
            raise CudnnUnavailable(f"cuDNN at {path or lib} lacks {', '.join(missing)}")

    def version(self) -> int:
        """``cudnnGetVersion()``: major * 10000 + minor * 100 + patch (no GPU needed)."""
        return int(self.cudnnGetVersion())

    def version_text(self) -> str:
        v = self.version()
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"

    def check(self, status: int, what: str) -> None:
        """Raise a CudnnError naming ``what`` unless ``status`` is success."""
        if status != SUCCESS:
            raise CudnnError(f"cuDNN {what} failed: {self.error_string(status)}")

    def error_string(self, status: int) -> str:
        try:
            text = self.cudnnGetErrorString(status)
            return text.decode() if text else f"status {status}"
        except Exception:
            return f"CUDNN_STATUS_{_STATUS_NAMES.get(status, status)}"


_library: Optional[Library] = None
_library_error: Optional[str] = None


def load_library() -> Library:
    """The process's cuDNN (loaded once); raises CudnnUnavailable saying why not."""
    global _library, _library_error
    if _library is not None:
        return _library
    if _library_error is not None:
        raise CudnnUnavailable(_library_error)
    errors = []
    for path in candidate_paths():
        try:
            _library = Library(ctypes.CDLL(path), path)
            return _library
        except (OSError, CudnnUnavailable) as exc:
            errors.append(f"{path}: {exc}")
    _library_error = ("cuDNN was not found: pip install nvidia-cudnn-cu13 (gradcore[cuda] brings it)"
                      + ("; tried " + "; ".join(errors) if errors else ""))
    raise CudnnUnavailable(_library_error)


def version() -> Optional[str]:
    """The cuDNN version found here ("9.28.1"), or None: no GPU needed.
    Example: ``gradcore.cuda.cudnn.version()``."""
    try:
        return load_library().version_text()
    except CudnnUnavailable:
        return None


# ---------------------------------------------------------------- per backend
class Context:
    """cuDNN on one backend (one device): the handle on the default stream,
    descriptors by shape, the algorithm cache, and counts of what ran where."""

    def __init__(self, lib: Library):
        self.lib = lib
        handle = ctypes.c_void_p()
        lib.check(lib.cudnnCreate(ctypes.byref(handle)), "cudnnCreate")
        self.handle = handle.value
        # gradcore's kernels, copies and GEMMs all run on the default stream
        self.stream = 0
        lib.check(lib.cudnnSetStream(self.handle, None), "cudnnSetStream")
        self._tensors: Dict[tuple, int] = {}
        self._filters: Dict[tuple, int] = {}
        self._convs: Dict[tuple, int] = {}
        self._pools: Dict[tuple, int] = {}
        self.algorithms: Dict[tuple, Optional[Tuple[int, int, int]]] = {}   # key -> (algo, workspace, math) | None
        self.plans: Dict[tuple, object] = {}                                 # a call's key -> _ConvPlan | None
        self.refused: Dict[tuple, str] = {}                                  # key -> why, for doctor
        self.calls: Dict[str, int] = {}
        self.fallbacks = 0

    # ------------------------------------------------------------ descriptors
    def _new(self, what: str) -> int:
        """A new descriptor from ``cudnnCreate<what>Descriptor``."""
        desc = ctypes.c_void_p()
        name = f"cudnnCreate{what}Descriptor"
        self.lib.check(getattr(self.lib, name)(ctypes.byref(desc)), name)
        return desc.value

    def _descriptor(self, cache, key, kind, setup) -> int:
        """The descriptor of ``key`` in ``cache``: made the first time by
        ``cudnnCreate<kind>Descriptor`` and ``setup(desc)`` (which sets it)."""
        desc = cache.get(key)
        if desc is None:
            desc = self._new(kind)
            setup(desc)
            cache[key] = desc
        return desc

    def tensor(self, shape, dtype) -> int:
        """A packed (C-contiguous) tensor descriptor of ``shape`` (4-D or 5-D)."""
        shape, lib = tuple(shape), self.lib
        return self._descriptor(self._tensors, (shape, dtype), "Tensor", lambda desc: lib.check(
            lib.cudnnSetTensorNdDescriptor(desc, _DATA_TYPES[dtype], len(shape), _ints(shape), _ints(_strides(shape))),
            f"cudnnSetTensorNdDescriptor{shape}"))

    def filter(self, shape, dtype) -> int:
        """A filter descriptor (O, C / groups, K...) in NCHW order."""
        shape, lib = tuple(shape), self.lib
        return self._descriptor(self._filters, (shape, dtype), "Filter", lambda desc: lib.check(
            lib.cudnnSetFilterNdDescriptor(desc, _DATA_TYPES[dtype], TENSOR_NCHW, len(shape), _ints(shape)),
            f"cudnnSetFilterNdDescriptor{shape}"))

    def convolution(self, attrs, dtype, math) -> int:
        """A cross-correlation descriptor: ``attrs`` (stride, padding,
        dilation, groups), the compute type of ``dtype``, math mode ``math``."""
        lib = self.lib
        stride, padding, dilation, groups = attrs
        what = f"convolution descriptor (stride {stride}, padding {padding}, dilation {dilation}, groups {groups})"

        def setup(desc):
            lib.check(lib.cudnnSetConvolutionNdDescriptor(desc, len(stride), _ints(padding), _ints(stride),
                                                          _ints(dilation), CROSS_CORRELATION, _DATA_TYPES[dtype]), what)
            lib.check(lib.cudnnSetConvolutionGroupCount(desc, groups), what)
            lib.check(lib.cudnnSetConvolutionMathType(desc, math), what)
        return self._descriptor(self._convs, (attrs, dtype, math), "Convolution", setup)

    def pooling(self, mode, kernel, stride, padding) -> int:
        """A pooling descriptor (NaN propagates, as gradcore's max pooling)."""
        lib = self.lib
        return self._descriptor(self._pools, (mode, kernel, stride, padding), "Pooling", lambda desc: lib.check(
            lib.cudnnSetPoolingNdDescriptor(desc, mode, PROPAGATE_NAN, len(kernel), _ints(kernel), _ints(padding),
                                            _ints(stride)),
            f"pooling descriptor (mode {mode}, kernel {kernel}, stride {stride}, padding {padding})"))

    def count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1


def _ints(values):
    values = tuple(int(v) for v in values)
    return (ctypes.c_int * len(values))(*values)


def _strides(shape):
    strides, step = [], 1
    for d in reversed(tuple(shape)):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


_contexts: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # backend -> Context | why not (str)
_attached: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # backend -> Library given by attach()


def attach(be, lib: Optional[Library]) -> None:
    """Use ``lib`` (a ``Library``) for backend ``be`` instead of the one
    found on disk (tests use a stand-in); None forgets the choice. The
    backend's Context is made again on next use."""
    _contexts.pop(be, None)
    if lib is None:
        _attached.pop(be, None)
    else:
        _attached[be] = lib


def refuse(be, reason: str) -> None:
    """Never use cuDNN on backend ``be`` (``why_not(be)`` gives ``reason``):
    for a backend whose device pointers cuDNN cannot read, such as a test
    double of the driver on a machine that has a GPU. Example:
    ``cudnn.refuse(backend, "a fake driver")``."""
    _attached.pop(be, None)
    _contexts[be] = reason


def context(be) -> Optional[Context]:
    """The Context of backend ``be``, or None when cuDNN is not used there
    (``why_not(be)`` says why). Made once per backend."""
    found = _contexts.get(be)
    if found is None:
        found = _contexts[be] = _make_context(be)
    return found if isinstance(found, Context) else None


def _make_context(be):
    lib = _attached.get(be)
    if lib is None:
        if getattr(be.driver, "kind", None) != "gpu":
            return f"the {getattr(be.driver, 'kind', '?')} driver: cuDNN needs a GPU"
        try:
            lib = load_library()
        except CudnnUnavailable as exc:
            return str(exc)
    try:
        return Context(lib)
    except CudnnError as exc:
        return f"cuDNN {lib.version_text()} is there but {exc}"


def why_not(be) -> Optional[str]:
    """None when cuDNN runs the convolutions of backend ``be``, else why not."""
    if not enabled:
        return "gradcore.cuda.cudnn.enabled is False"
    if context(be) is not None:
        return None
    return _contexts.get(be)


def status(be) -> str:
    """One line for ``gradcore doctor``: which convolution path ``be`` uses and why."""
    reason = why_not(be)
    if reason is None:
        ctx = context(be)
        line = f"in use: cuDNN {ctx.lib.version_text()} ({ctx.lib.path or 'attached'})"
        if ctx.refused:
            line += f"; {len(ctx.refused)} configuration(s) refused, run im2col + cuBLAS"
        return line
    return f"not used ({reason}); convolutions run im2col + cuBLAS"


def _usable(be, dtype, *arrays) -> Optional[Context]:
    """The Context when cuDNN may run an op on ``arrays`` of ``dtype``."""
    if not enabled or dtype not in _DATA_TYPES:
        return None
    bind = getattr(be.driver, "bind_thread", None)
    if bind is not None:        # cuDNN runs in the calling thread's context (its handle is made there, too)
        bind()
    ctx = context(be)
    if ctx is None:
        return None
    for a in arrays:        # the legacy API counts elements (and dimensions) in int
        if a.size > _INT32_MAX or max(a.shape, default=0) > _INT32_MAX:
            return None
    # while a CUDA graph is captured, gradcore's work goes to the capture stream: cuDNN's must too,
    # or it runs once during the capture and never in a replay
    stream = getattr(be.driver, "capture_stream", 0) or 0
    if stream != ctx.stream:
        ctx.lib.check(ctx.lib.cudnnSetStream(ctx.handle, stream or None), "cudnnSetStream")
        ctx.stream = stream
    return ctx


def _math(dtype) -> int:
    """FMA_MATH for float32 when ``gradcore.cuda.allow_tf32_conv`` is off, else DEFAULT_MATH."""
    if dtype == np.float32 and not getattr(sys.modules.get("gradcore.cuda"), "allow_tf32_conv", True):
        return FMA_MATH
    return DEFAULT_MATH


# ---------------------------------------------------------------- convolutions
# per direction: the three operands' roles, in cuDNN's argument order
# (a, b) -> out:  forward (x, w) -> y;  backward_data (w, dy) -> dx;  backward_filter (x, dy) -> dw
_CONV_FUNCTIONS = {
    "forward": ("cudnnGetConvolutionForwardAlgorithm_v7", "cudnnFindConvolutionForwardAlgorithmEx",
                "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward"),
    "backward_data": ("cudnnGetConvolutionBackwardDataAlgorithm_v7", "cudnnFindConvolutionBackwardDataAlgorithmEx",
                      "cudnnGetConvolutionBackwardDataWorkspaceSize", "cudnnConvolutionBackwardData"),
    "backward_filter": ("cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                        "cudnnFindConvolutionBackwardFilterAlgorithmEx",
                        "cudnnGetConvolutionBackwardFilterWorkspaceSize", "cudnnConvolutionBackwardFilter"),
}


def conv_forward(be, x, w, attrs):
    """y = conv(x, w) on cuDNN, ``attrs`` = (stride, padding, dilation,
    groups) as tuples per spatial axis (and an int), or None where cuDNN is
    not used for it (the caller runs its own kernels)."""
    oshape = (x.shape[0], w.shape[0]) + tuple(
        (size + 2 * p - d * (k - 1) - 1) // s + 1
        for size, k, s, p, d in zip(x.shape[2:], w.shape[2:], attrs[0], attrs[1], attrs[2]))
    return _convolution(be, "forward", x, w, oshape, attrs, xshape=x.shape, wshape=w.shape)


def conv_backward_data(be, g, w, xshape, attrs):
    """dx (shaped ``xshape``) of conv(x, w) from the output gradient ``g``, or None."""
    return _convolution(be, "backward_data", w, g, tuple(xshape), attrs, xshape=tuple(xshape), wshape=w.shape)


def conv_backward_filter(be, g, x, wshape, attrs):
    """dw (shaped ``wshape``) of conv(x, w) from the output gradient ``g``, or None."""
    return _convolution(be, "backward_filter", x, g, tuple(wshape), attrs, xshape=x.shape, wshape=tuple(wshape))


class _ConvPlan:
    """One convolution configuration, ready to run: the call's address, its
    descriptors, algorithm and workspace, the output's shape. Made once per
    (direction, shapes, attributes, dtype, switches); the per-call path only
    allocates the output and the workspace and makes the call."""
    __slots__ = ("key", "function", "double", "a_desc", "b_desc", "conv", "algo", "size", "out_desc",
                 "out_shape", "what")


def _convolution(be, direction, a, b, out_shape, attrs, xshape, wshape):
    dtype = a.dtype
    ctx = _usable(be, dtype)
    if ctx is None:
        return None
    key = (direction, a.shape, b.shape, out_shape, attrs, dtype, _math(dtype), bool(deterministic),
           bool(benchmark), int(workspace_limit))
    plan = ctx.plans.get(key, False)
    if plan is False:
        plan = ctx.plans[key] = _conv_plan(ctx, be, key, a, b, xshape, wshape)
    if plan is None or plan is _NOT_FOR_CUDNN:
        if plan is None:
            ctx.fallbacks += 1
        return None
    out = be.empty(plan.out_shape, dtype)
    workspace = be.pool.malloc(plan.size) if plan.size else None    # alive until the call is queued (stream order)
    status = _cudnn.convolution(plan.function, ctx.handle, plan.double, plan.a_desc, a.ptr, plan.b_desc, b.ptr,
                                plan.conv, plan.algo, int(workspace) if workspace is not None else 0, plan.size,
                                plan.out_desc, out.ptr)
    del workspace
    if status != SUCCESS:
        return _conv_failed(ctx, plan, status)
    be.written(out)
    ctx.count(plan.what)
    return out


_NOT_FOR_CUDNN = object()      # a configuration cuDNN is not asked about (empty, too large, mixed dtypes)


def _conv_plan(ctx, be, key, a, b, xshape, wshape):
    """The plan of ``key`` (see ``_convolution``); None where cuDNN refused
    the configuration, ``_NOT_FOR_CUDNN`` where it is not asked."""
    direction, _, _, out_shape, attrs, dtype, math = key[:7]
    if b.dtype != dtype or 0 in out_shape or 0 in a.shape or 0 in b.shape:
        return _NOT_FOR_CUDNN
    for shape in (a.shape, b.shape, out_shape):         # the legacy API counts elements (and dimensions) in int
        if np.prod(shape, dtype=np.float64) > _INT32_MAX or max(shape, default=0) > _INT32_MAX:
            return _NOT_FOR_CUDNN
    # the algorithm choice is per configuration (the shapes of x and w; the output's follows)
    choice_key = (direction, tuple(xshape), tuple(wshape), attrs, dtype, math) + key[7:]
    algorithm = ctx.algorithms.get(choice_key, False)
    if algorithm is None:                   # refused before
        return None
    descs = _conv_descriptors(ctx, direction, a, b, out_shape, attrs, dtype, math)
    if algorithm is False:
        out = be.empty(out_shape, dtype)
        algorithm = ctx.algorithms[choice_key] = _choose(ctx, be, direction, choice_key, descs, a, b, out)
        if algorithm is None:
            return None
    algo, size, algo_math = algorithm
    plan = _ConvPlan()
    plan.key, plan.what = choice_key, "conv_" + direction
    plan.function, plan.double = ctx.lib.address[_CONV_FUNCTIONS[direction][3]], dtype == np.float64
    plan.a_desc, plan.b_desc, plan.out_desc = descs[0], descs[1], descs[3]
    plan.conv = descs[2] if algo_math == math else ctx.convolution(attrs, dtype, algo_math)
    plan.algo, plan.size, plan.out_shape = algo, size, tuple(out_shape)
    return plan


def _conv_failed(ctx, plan, status):
    """A convolution call returned ``status``: NOT_SUPPORTED_* makes its
    configuration run the other path from now on (None); anything else raises."""
    direction, xshape, wshape, attrs, dtype = plan.key[:5]
    name = _CONV_FUNCTIONS[direction][3]
    if 3000 <= status < 4000:
        ctx.algorithms[plan.key] = None
        ctx.refused[plan.key] = f"{name}: {ctx.lib.error_string(status)}"
        for k, p in list(ctx.plans.items()):
            if p is plan:
                ctx.plans[k] = None
        ctx.fallbacks += 1
        return None
    ctx.lib.check(status, f"{name} (x {tuple(xshape)}, w {tuple(wshape)}, stride {attrs[0]}, padding {attrs[1]}, "
                          f"dilation {attrs[2]}, groups {attrs[3]}, {dtype}, algorithm {plan.algo})")


def _conv_descriptors(ctx, direction, a, b, out_shape, attrs, dtype, math):
    """(a desc, b desc, conv desc, out desc) in the order the direction's calls take them."""
    conv = ctx.convolution(attrs, dtype, math)
    if direction == "forward":
        return ctx.tensor(a.shape, dtype), ctx.filter(b.shape, dtype), conv, ctx.tensor(out_shape, dtype)
    if direction == "backward_data":
        return ctx.filter(a.shape, dtype), ctx.tensor(b.shape, dtype), conv, ctx.tensor(out_shape, dtype)
    return ctx.tensor(a.shape, dtype), ctx.tensor(b.shape, dtype), conv, ctx.filter(out_shape, dtype)


def _choose(ctx, be, direction, key, descs, a, b, out):
    """(algorithm, workspace bytes, math type) for ``key``, or None (refused)."""
    lib = ctx.lib
    get, find, size_fn, _ = _CONV_FUNCTIONS[direction]
    count = ALGO_COUNT[direction]
    perf = (AlgoPerf * count)()
    returned = ctypes.c_int(0)
    a_desc, b_desc, conv, out_desc = descs
    status = getattr(lib, get)(ctx.handle, a_desc, b_desc, conv, out_desc, count, ctypes.byref(returned), perf)
    if status != SUCCESS:
        ctx.refused[key] = f"{get}: {lib.error_string(status)}"
        return None
    candidates = _acceptable(perf[:returned.value], key)
    if benchmark and candidates:
        # time them on these very arrays, with a workspace the largest acceptable algorithm fits in
        size = max(p.memory for p in candidates)
        workspace = be.pool.malloc(size) if size else None
        returned.value = 0
        status = getattr(lib, find)(ctx.handle, a_desc, a.ptr, b_desc, b.ptr, conv, out_desc, out.ptr, count,
                                    ctypes.byref(returned), perf, int(workspace) if workspace is not None else None,
                                    size)
        del workspace
        if status != SUCCESS:
            ctx.refused[key] = f"{find}: {lib.error_string(status)}"
            return None
        candidates = [p for p in _acceptable(perf[:returned.value], key) if p.memory <= size]
    if not candidates:
        ctx.refused[key] = (f"{get}: no {'deterministic ' if key[6] else ''}algorithm within a workspace of "
                            f"{key[8]} bytes" + (" without TF32" if key[5] == FMA_MATH else ""))
        return None
    best = candidates[0]
    math = key[5] if best.mathType == DEFAULT_MATH or key[5] == FMA_MATH else best.mathType
    conv = ctx.convolution(key[3], key[4], math)
    size = ctypes.c_size_t(0)
    lib.check(getattr(lib, size_fn)(ctx.handle, a_desc, b_desc, conv, out_desc, best.algo, ctypes.byref(size)),
              f"{size_fn}(algorithm {best.algo})")
    return best.algo, size.value, math


def _acceptable(perfs, key) -> List[AlgoPerf]:
    """The algorithms that ran, in cuDNN's order, fitting the switches: the
    workspace limit, determinism, and no tensor-op math when TF32 is off."""
    math, determ, limit = key[5], key[6], key[8]
    return [p for p in perfs
            if p.status == SUCCESS and p.memory <= limit and not (determ and p.determinism != DETERMINISTIC)
            and not (math == FMA_MATH and p.mathType in (TENSOR_OP_MATH, TENSOR_OP_MATH_ALLOW_CONVERSION))]


# ---------------------------------------------------------------- pooling
def _pool_mode(kind: str, backward: bool) -> int:
    if kind == "max":
        return POOLING_MAX_DETERMINISTIC if backward or deterministic else POOLING_MAX
    if kind == "average":
        return POOLING_AVERAGE_INCLUDE_PADDING
    if kind == "average_count_exclude_padding":
        return POOLING_AVERAGE_EXCLUDE_PADDING
    raise ValueError(f"cuDNN pooling: unknown mode {kind!r}")


def pool_forward(be, x, kind, kernel, stride, padding, out_shape):
    """Pooling of ``x`` (``kind``: "max", "average",
    "average_count_exclude_padding") into a new array of ``out_shape``, or None."""
    ctx = _usable(be, x.dtype, x)
    if ctx is None or 0 in x.shape or 0 in out_shape:
        return None
    y = be.empty(out_shape, x.dtype)
    pool = ctx.pooling(_pool_mode(kind, False), kernel, stride, padding)
    ctx.lib.check(_cudnn.pooling_forward(ctx.lib.address["cudnnPoolingForward"], ctx.handle, x.dtype == np.float64,
                                         pool, ctx.tensor(x.shape, x.dtype), x.ptr, ctx.tensor(out_shape, x.dtype),
                                         y.ptr),
                  f"cudnnPoolingForward ({kind}, x {x.shape}, kernel {kernel}, stride {stride}, padding {padding})")
    be.written(y)
    ctx.count("pool_forward")
    return y


def pool_backward(be, g, x, kind, kernel, stride, padding, xshape):
    """The input gradient (``xshape``) of pooling from the output gradient
    ``g``; ``x`` is the input (max pooling reads it; None for average
    pooling, which reads neither x nor y). None where cuDNN is not used."""
    if kind == "max" and (not max_pool_backward or x is None):
        return None
    ctx = _usable(be, g.dtype, g)
    if ctx is None or 0 in g.shape or 0 in xshape:
        return None
    dtype = g.dtype
    if kind == "max":
        y = pool_forward(be, x, kind, kernel, stride, padding, g.shape)   # cuDNN finds the argmax from y and x
        if y is None:
            return None
    dx = be.empty(tuple(xshape), dtype)
    if kind != "max":
        # average pooling reads neither: valid arrays of the right shapes stand in
        x, y = dx, g
    pool = ctx.pooling(_pool_mode(kind, True), kernel, stride, padding)
    gdesc, xdesc = ctx.tensor(g.shape, dtype), ctx.tensor(tuple(xshape), dtype)
    ctx.lib.check(_cudnn.pooling_backward(ctx.lib.address["cudnnPoolingBackward"], ctx.handle, dtype == np.float64,
                                          pool, gdesc, y.ptr, g.ptr, xdesc, x.ptr, dx.ptr),
                  f"cudnnPoolingBackward ({kind}, dy {g.shape}, x {tuple(xshape)}, kernel {kernel}, "
                  f"stride {stride}, padding {padding})")
    be.written(dx)
    ctx.count("pool_backward")
    return dx


# ---------------------------------------------------------------- batch normalisation
def _bn_context(be, x, params, eps):
    """(Context, x's shape as cuDNN takes it, the parameters' shape) when
    cuDNN may run batch normalisation of ``x`` (N, C, ...) with per-channel
    ``params`` (each (1, C, 1, ...)), else None."""
    if x.ndim < 2 or x.ndim > 5 or eps < 0 or 0 in x.shape or any(p.dtype != x.dtype for p in params):
        return None
    ctx = _usable(be, x.dtype, x)
    if ctx is None:
        return None
    shape = tuple(x.shape) + (1,) * (4 - x.ndim)        # (N, C) and (N, C, L): trailing axes of 1
    return ctx, shape, (1, shape[1]) + (1,) * (len(shape) - 2)


def _bn_run(be, x, params, eps, function, out_shapes, call):
    """Run cuDNN's batch-norm ``function`` on ``x`` and its per-channel
    ``params``: ``call(address, handle, double, x desc, param desc,
    *outputs)`` makes the call (its status); the outputs are new arrays of
    ``out_shapes``. None where cuDNN is not used."""
    found = _bn_context(be, x, params, eps)
    if found is None:
        return None
    ctx, shape, pshape = found
    dtype = x.dtype
    outs = [be.empty(s, dtype) for s in out_shapes]
    status = call(ctx.lib.address[function], ctx.handle, dtype == np.float64, ctx.tensor(shape, dtype),
                  ctx.tensor(pshape, dtype), *outs)
    ctx.lib.check(status, f"{function} (x {x.shape}, eps {eps})")
    for a in outs:
        be.written(a)
    ctx.count(function)
    return outs


def batch_norm_training(be, x, weight, bias, eps):
    """(y, batch mean, batch inverse std) of batch normalisation over every
    axis of ``x`` but 1, the statistics shaped like ``weight`` (1, C, 1, ...);
    or None where cuDNN is not used."""
    def call(fn, handle, double, xd, pd, y, mean, invstd):
        return _cudnn.batch_norm_training(fn, handle, double, BATCHNORM_SPATIAL, xd, x.ptr, y.ptr, pd, weight.ptr,
                                          bias.ptr, float(eps), mean.ptr, invstd.ptr)
    return _bn_run(be, x, (weight, bias), eps, "cudnnBatchNormalizationForwardTraining",
                   (x.shape, weight.shape, weight.shape), call)


def batch_norm_inference(be, x, mean, var, weight, bias, eps):
    """Batch normalisation of ``x`` with given statistics (running mean and
    variance, each (1, C, 1, ...)), or None where cuDNN is not used."""
    def call(fn, handle, double, xd, pd, y):
        return _cudnn.batch_norm_inference(fn, handle, double, BATCHNORM_SPATIAL, xd, x.ptr, y.ptr, pd, weight.ptr,
                                           bias.ptr, mean.ptr, var.ptr, float(eps))
    done = _bn_run(be, x, (mean, var, weight, bias), eps, "cudnnBatchNormalizationForwardInference", (x.shape,), call)
    return None if done is None else done[0]


def batch_norm_backward(be, g, x, weight, mean, invstd, eps):
    """(dx, dweight, dbias) of batch normalisation in training from the
    output gradient ``g`` and the forward's saved batch mean and inverse
    std; or None where cuDNN is not used."""
    def call(fn, handle, double, xd, pd, dx, dw, db):
        return _cudnn.batch_norm_backward(fn, handle, double, BATCHNORM_SPATIAL, xd, x.ptr, g.ptr, dx.ptr, pd,
                                          weight.ptr, dw.ptr, db.ptr, float(eps), mean.ptr, invstd.ptr)
    return _bn_run(be, x, (g, weight, mean, invstd), eps, "cudnnBatchNormalizationBackward",
                   (x.shape, weight.shape, weight.shape), call)


def clear_cache(be=None) -> None:
    """Forget the algorithm choices (all backends, or ``be``'s): the next
    call of each configuration chooses again (after switching ``benchmark``
    or ``deterministic`` nothing needs clearing: they are part of the key)."""
    for b, ctx in list(_contexts.items()):
        if isinstance(ctx, Context) and (be is None or b is be):
            ctx.algorithms.clear()
            ctx.plans.clear()
            ctx.refused.clear()


__all__ = ["enabled", "benchmark", "deterministic", "workspace_limit", "max_pool_backward", "Library",
           "Context", "CudnnError", "CudnnUnavailable", "load_library", "version", "candidate_paths", "context",
           "why_not", "status", "attach", "conv_forward", "conv_backward_data", "conv_backward_filter",
           "pool_forward", "pool_backward", "batch_norm_training", "batch_norm_inference", "batch_norm_backward",
           "clear_cache", "PROTOTYPES", "AlgoPerf"]
