# The contract of gradcore/_core.pyx.
#
# No other extension module cimports the core, so it has no .pxd: everything
# here is reached from Python (a cdef class declared in a .pxd would have to
# carry its attributes there too, and callers would bind to its layout).
# What the rest of gradcore may rely on is the Python-level surface below;
# anything else in this file (names starting with "_" that are not listed)
# is private and may change. Cython directives: setup.py, for every compiled
# module at once.
#
# Classes
#   Tensor            the array type; fields _data, _device, grad, _version
#                     are read and written by gradcore's Python modules
#   OpBase            compiled base of gradcore.op.Op (per-op caches)
#   GradKey           one recording (a tape): enter/exit/attach/backward,
#                     tracks, is_attached, recording, phase, owner_name,
#                     records_in_this_thread, entered_in_this_thread
#   CompiledBackward  a backward graph ready to run (filled by gradcore.graph)
#   GradRuleFallback, NotDifferentiableError
#
# Functions
#   apply, apply1, wrap_array, shape_carrier, broadcast_view, broadcast_like
#   register_grad_rule, unregister_grad_rule, registered_grad_rule
#   _install_hooks       called once at import by the Python modules
#   _rule_run_tensor, _rule_run_raw
#                        a grad rule's backward as a CompiledBackward (every
#                        gradient form runs through the same node kind)
#   _clear_scalar_cache, _set_node_priority,
#   _enter_backward_priority, _exit_backward_priority
#   _set_anomaly, _anomaly_enabled
#   _set_pending_hooks, _set_pending_count, _in_raw_backward
#                        results still in flight (gradcore.distributed's
#                        deferred adjoint collectives), see "Deferred results"
#   _thread_state        the calling thread's recording state (see below)
#   _set_group_priority, _no_record_enter, _no_record_exit
#   _recording_keys, _debug_state, _clear_front_cache, _recorded_graph,
#   _bump_version, _rebuild_tensor (pickling)
#
# Threads (docs/core.md, "Threading model")
#   Per thread (_ThreadState, looked up by a cached thread-ident compare):
#   no-record depth, the visibility bound of the backward in progress, the
#   group priority while a GradManager group enters, the managers whose
#   backward runs in the thread. A GradKey records only ops run by the
#   thread that entered it (its owner); its backward may run in any thread.
#   Shared: the list of recording keys, the priority and node counters, the
#   backward-graph caches (_bw_front, OpBase._cb_cache/_last_key/_last_cb),
#   the rule registries, the small-array caches. Every shared read-modify-
#   write is C code with no point where the GIL can change hands in between,
#   or a cache whose racing fills store equal values.
"""The compiled heart of gradcore: Tensor, the tape, GradFn nodes, gradient
slots and op dispatch.

Only what runs once per op (``apply``) or once per node (the backward walk)
lives here; everything else (tracing, backward graphs, the registry,
GradManager) is plain Python that installs itself through ``_install_hooks``.

Ownership, chosen so that there are no reference cycles between tensors and
nodes::

    Tensor --> GradSlot <-- GradFn.dest0/dest1/dests / GradFn.slots <-- GradKey.tape

A slot never points at the node that fills it, so dropping a tensor never
keeps a node alive and a node never keeps its outputs alive.
"""
cimport cython
cimport numpy as cnp
from cpython.ref cimport Py_INCREF, PyObject
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
import heapq
import numpy as np
from weakref import ref as _weakref
import threading as _threading
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.long cimport PyLong_AsLongLongAndOverflow

cnp.import_array()

cdef extern from "Python.h":
    PyObject* PyList_GET_ITEM(object lst, Py_ssize_t i)   # borrowed
    object PyObject_Vectorcall(object f, PyObject** args, size_t nargsf, PyObject* kwnames)

cdef extern from "numpy/arrayobject.h":
    object PyArray_NewFromDescr(PyObject* subtype, PyObject* descr, int nd, cnp.npy_intp* dims,
                                cnp.npy_intp* strides, void* data, int flags, PyObject* obj)

cdef object _ndarray = np.ndarray
cdef object _np_add = np.add
cdef object _np_asarray = np.asarray
cdef object _np_dtype = np.dtype
cdef object _np_zeros = np.zeros
cdef object _np_broadcast_shapes = np.broadcast_shapes

# ---------------------------------------------------------------- hooks
# Filled by the Python side (gradcore.graph, gradcore.tensor_utils, ...).
cdef object _h_slow_apply = None      # (op, args) -> outputs, for non-Tensor args
cdef object _h_backward_graph = None  # (op, dtypes, device, rg) -> CompiledBackward
cdef object _h_sum_to = None          # (Tensor g, shape) -> Tensor, recorded
cdef object _h_add = None             # op used to accumulate in tensor mode
cdef object _h_kernel_error = None    # (op, args, exc) -> exception to raise
cdef object _h_kernel_for = None      # (op, device) -> kernel callable
cdef object _h_getattr = None         # (name) -> python-level Tensor method impl
cdef object _h_infer_check = None     # (op, args) -> None; raises the op's error (op.infer on the inputs)
cdef object _h_describe = None        # (op or class) -> its OpDescription (gradcore.op.describe)
cdef object _h_promote = None         # (op, args) -> (op, args cast by the dtype rules)
cdef object _h_autocast = None        # (op, args) -> args cast for gradcore.amp; None while autocast is off
cdef dict _operator_ops = {}
# the hottest operator ops, read without a dict lookup per call
cdef object _op_add = None, _op_sub = None, _op_mul = None, _op_div = None, _op_pow = None


cdef void _set_hot_ops():
    global _op_add, _op_sub, _op_mul, _op_div, _op_pow
    _op_add = _operator_ops.get("add")
    _op_sub = _operator_ops.get("sub")
    _op_mul = _operator_ops.get("mul")
    _op_div = _operator_ops.get("div")
    _op_pow = _operator_ops.get("pow")


def _install_hooks(**hooks):
    """Called once by gradcore's Python modules to plug their parts in."""
    global _h_slow_apply, _h_backward_graph, _h_sum_to, _h_add
    global _h_kernel_error, _h_kernel_for, _h_getattr, _device_array, _h_promote
    global _h_infer_check, _h_describe, _h_device_scalar, _h_autocast, _copy_op, _named_devices
    for name, fn in hooks.items():
        if name == "slow_apply": _h_slow_apply = fn
        elif name == "backward_graph": _h_backward_graph = fn
        elif name == "sum_to": _h_sum_to = fn
        elif name == "add_op": _h_add = fn
        elif name == "kernel_error": _h_kernel_error = fn
        elif name == "kernel_for": _h_kernel_for = fn
        elif name == "tensor_method": _h_getattr = fn
        elif name == "device_array": _device_array = fn
        elif name == "infer_check": _h_infer_check = fn
        elif name == "describe": _h_describe = fn
        elif name == "promote": _h_promote = fn
        elif name == "device_scalar": _h_device_scalar = fn
        elif name == "autocast": _h_autocast = fn      # installed (and removed: None) by gradcore.amp
        elif name == "copy_op": _copy_op = fn          # ops.shape.Copy: its output is on its target device
        elif name == "named_devices": _named_devices = fn  # "cpu" -> MegEngine's name for it (devices.py)
        elif name == "operator_ops":
            _operator_ops.update(fn)
            _set_hot_ops()
        else:
            raise KeyError(f"unknown core hook {name!r}")


# ---------------------------------------------------------------- state
# Shared by all threads (each read or written by C code between two points
# where the GIL can change hands, so no thread sees a half-done update):
cdef list _recording = []          # GradKeys currently recording, of every thread
cdef long _next_priority = 0       # keys are ordered by age, process-wide
cdef Py_ssize_t _seq = 0           # global sequence number of recorded nodes
cdef unsigned long long _next_serial = 0   # numbers the threads' states
cdef dict _grad_rules = {}         # op type -> registered rule (path 2)
cdef dict _bw_front = {}           # (id(op), device, dtypes, rg) -> (op, CompiledBackward)
# anomaly mode (gradcore.anomaly): off, recording pays one flag check per node
cdef bint _anomaly = False
cdef object _h_anomaly = None      # .capture(op, inputs, outputs) -> info; .check(op, info, grads, n)
# Deferred results (docs/core.md, "Deferred results"): gradient buffers that
# a request still in flight writes (gradcore.distributed's adjoint
# collectives post MPI requests and return their output buffer at once).
# The core imports nothing of who defers: the registry installs its hooks
# and keeps the count; the core calls them only while the count is not 0,
# so a backward with nothing in flight pays one C int test per node.
cdef Py_ssize_t _n_pending = 0
cdef object _h_pending = None      # .before_node(grads, reads) .settle(g) .settle_all(exc)


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define GC_RARELY(x) __builtin_expect(!!(x), 0)
    #else
    #define GC_RARELY(x) (x)
    #endif
    """
    # a branch the compiler lays out off the hot path (something in flight)
    bint GC_RARELY(bint x)
cdef str CPU = "cpu"
cdef str CUDA = "cuda"
# gradcore.cuda.DeviceArray (set when the CUDA backend is imported): the
# only data type besides ndarray a Tensor holds; its device is "cuda"
cdef object _device_array = None
cdef object _copy_op = None        # the class ops.shape.Copy (a hook)
# "cpu"/"cuda" -> the LogicalDevice MegEngine names it by ("cpu0:0"), read by
# Tensor.device without a Python call (a hook: devices.py's table)
cdef dict _named_devices = {}

# Per thread (see "Threading model" in docs/core.md): what the thread that
# records has in progress. A key records only ops run in the thread that
# entered it.
cdef long VISIBLE_ALL = 1 << 62


@cython.final
@cython.no_gc
cdef class _ThreadState:
    """One thread's recording state. At rest (no call of gradcore running in
    the thread) it is always no_record 0, visible_below VISIBLE_ALL,
    group_priority None and backwarding empty: every change is undone in a
    ``finally``."""
    cdef unsigned long long serial    # what a GradKey's owner is compared with
    cdef Py_ssize_t no_record         # >0 while a _grad_rule runs its own forward
    cdef long visible_below           # during a backward: only older keys record
    cdef object group_priority        # set while a GradManager group enters
    cdef public list backwarding      # GradManagers whose backward runs here, innermost last
    cdef public str thread_name       # for error messages
    cdef long backward_priority       # of the nodes recorded now (backward_priority(p) contexts)
    cdef bint raw_backward            # a raw-mode backward walks here: kernels see arrays only the core reads

    def __cinit__(self):
        global _next_serial
        _next_serial += 1
        self.serial = _next_serial
        self.visible_below = VISIBLE_ALL
        self.backwarding = []

    def __dealloc__(self):
        # the thread ended (its thread-local let go of this state): a new
        # thread may get the same ident, so the cache must not answer it
        global _last_ident, _last_state
        if _last_state == <PyObject*>self:
            _last_ident = 0
            _last_state = NULL


# The state of the thread that looked last: a thread-ident compare per op on
# the single-thread path; the thread-local is read only on a thread switch.
# Borrowed: the thread-local of its thread owns it (see __dealloc__).
cdef unsigned long _last_ident = 0
cdef PyObject* _last_state = NULL
cdef object _thread_local = _threading.local()


cdef inline _ThreadState _ts():
    """The calling thread's recording state."""
    if PyThread_get_thread_ident() == _last_ident:
        return <_ThreadState>_last_state
    return _ts_switch()


cdef _ThreadState _ts_switch():
    global _last_ident, _last_state
    cdef _ThreadState st = getattr(_thread_local, "state", None)
    if st is None:
        st = _ThreadState()
        st.thread_name = _threading.current_thread().name
        _thread_local.state = st
    # no point where the GIL can change hands from here to the return: the
    # pair (ident, state) is never seen half written
    _last_ident = 0
    _last_state = <PyObject*>st
    _last_ident = PyThread_get_thread_ident()
    return st


def _thread_state():
    """The calling thread's recording state (for gradcore.autodiff and tests)."""
    return _ts()


class GradRuleFallback(Exception):
    """Raised by a registered grad rule to decline; the generic backward
    graph is used instead.

    Example::

        @register_grad_rule(MyOp)
        def rule(op, x):
            if x.ndim != 2:
                raise GradRuleFallback
            ...
    """


class NotDifferentiableError(RuntimeError):
    """An op with no gradient path was used on a recorded tensor."""


def register_grad_rule(op_type):
    """Register ``rule(op, *inputs) -> (outputs, backward)`` for every op of
    ``op_type`` (path 2). The rule may raise ``GradRuleFallback`` before
    running anything to let the generic backward graph handle the call.

    Example::

        @gradcore.register_grad_rule(MyOp)
        def my_rule(op, x):
            y = apply(op, x)[0]          # recording is off in here
            return (y,), lambda dy: dy * 2
    """
    # a rule keyed by anything but an op class (an instance, a name) would
    # never be looked up: the op would silently keep its own gradient
    if not (isinstance(op_type, type) and issubclass(op_type, OpBase)):
        what = (f"an instance of {type(op_type).__name__}: pass the class, register_grad_rule({type(op_type).__name__})"
                if isinstance(op_type, OpBase) else f"{op_type!r} (a {type(op_type).__name__})")
        raise TypeError(f"register_grad_rule expects an op class (a subclass of gradcore.op.Op), got {what}")

    def deco(rule):
        if not callable(rule):
            raise TypeError(f"register_grad_rule({op_type.__name__}): the rule must be a function "
                            f"rule(op, *inputs) -> (outputs, backward), got {type(rule).__name__}")
        _grad_rules[op_type] = rule
        _bw_front.clear()
        return rule
    return deco


def unregister_grad_rule(op_type):
    """Remove a rule registered with ``register_grad_rule`` (none: nothing
    happens); ops of ``op_type`` differentiate by their own vjp again.

    Example::

        gradcore.unregister_grad_rule(MyOp)
        assert gradcore.registered_grad_rule(MyOp) is None
    """
    _grad_rules.pop(op_type, None)
    _bw_front.clear()


def registered_grad_rule(op_type):
    """The rule registered for ``op_type``, or None.

    Example::

        rule = gradcore.registered_grad_rule(MyOp)    # my_rule, or None
    """
    return _grad_rules.get(op_type)


cdef class GradSlot
cdef class GradKey


# ---------------------------------------------------------------- Tensor
class _Uninitialised:
    """The data of a Tensor made by ``Tensor.__new__`` and never given any:
    every use of it raises one clear TypeError (not an AttributeError on
    None, and never a read of memory that is not there)."""
    __slots__ = ()

    def _fail(self, *args, **kwargs):
        raise TypeError("an uninitialised Tensor (made by Tensor.__new__, never given data) cannot be "
                        "used; make tensors with gradcore.Tensor(data) or gradcore.tensor(data)")

    def __getattr__(self, name):
        self._fail()

    __bool__ = __len__ = __iter__ = __getitem__ = __index__ = __float__ = __int__ = __array__ = _fail


cdef object _UNINITIALISED = _Uninitialised()


@cython.freelist(1024)
@cython.no_gc
cdef class Tensor:
    """An n-dimensional array that gradients can flow through.
    ``Tensor(data, dtype=None, device=None, is_const=False, no_cache=False,
    name=None, format="default")``, MegEngine's parameters in MegEngine's
    order: ``is_const`` and ``no_cache`` (hints to its graph compiler about
    constants) are accepted and change nothing here; ``format`` must be
    "default", gradcore's one memory layout.

    Example::

        >>> x = gc.Tensor([1.0, 2.0])
        >>> (x * x).sum().item()
        5.0
    """
    cdef public object _data      # numpy.ndarray on cpu
    cdef public object _device
    cdef public object grad
    cdef object _name
    # bumped by every write into _data's buffer (optimizer steps); values
    # saved for backward remember it, so a write in between is caught
    cdef public long _version
    # the slot of each GradKey this tensor is part of: almost always one, so
    # the first is a field and only further ones go to a list
    cdef GradSlot _slot
    cdef list _more_slots
    # set by _reset: this object shares another tensor's history but is a
    # different node; attaching it gives it a leaf slot of its own
    cdef bint _alias
    cdef object __weakref__
    __array_priority__ = 1000

    def __cinit__(self):
        self._data = _UNINITIALISED

    def __init__(self, data=None, dtype=None, device=None, is_const=False, no_cache=False, name=None,
                 format="default"):
        if format != "default":
            raise ValueError(f"Tensor: format must be 'default' (gradcore has one memory layout), got {format!r}")
        if isinstance(data, Tensor):
            src = <Tensor>data
            if dtype is not None and _np_dtype(dtype) != src._data.dtype:
                # MegEngine: a Tensor made from a Tensor keeps its dtype (astype converts)
                raise RuntimeError(f"Tensor: the data is a Tensor of dtype {src._data.dtype}, not "
                                   f"{_np_dtype(dtype)}; convert it with .astype() first")
            if device is not None:
                device = _h_getattr("_norm_device")(device)
                if _logical(device) != _logical(src._device):
                    # MegEngine: a Tensor made from a Tensor stays on its device
                    raise RuntimeError(f"Tensor: the data is a Tensor on {src.device}, not on {device}; "
                                       f"move it with .to({str(device)!r}) first")
            # its own buffer: in-place updates of one never show in the other
            self._data, self._device = _h_getattr("_to_array")(src._data, dtype, src._device)
        else:
            self._data, self._device = _h_getattr("_to_array")(data, dtype, device)
        self._name = name

    # -- metadata
    @property
    def name(self):
        """The tensor's name ("" when it has none, as MegEngine)."""
        return "" if self._name is None else self._name

    @name.setter
    def name(self, value):
        self._name = value

    @property
    def shape(self):
        return self._data.shape

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def ndim(self):
        return self._data.ndim

    @property
    def size(self):
        return self._data.size

    @property
    def device(self):
        """Where the tensor is, named as MegEngine does ("cpu0:0", "cpu1:0",
        "gpu0:0"); it equals gradcore's name for it ("cpu", "cuda") too."""
        if type(self._device) is str:
            return _named_devices.get(self._device, self._device)
        return self._device

    def numpy(self):
        """The value as a read-only NumPy array (a view, no copy)."""
        arr = self._data
        if type(arr) is not _ndarray:
            arr = arr.get()         # a device array: a host copy
            arr.flags.writeable = False
            return arr
        if arr.flags.writeable:
            arr = arr.view()
            arr.flags.writeable = False
        return arr

    def item(self, *index):
        """The one element as a Python number; ``t.item(i, j)`` is ``t[i, j].item()`` (MegEngine's)."""
        if index:
            return self[index if len(index) > 1 else index[0]].item()
        if self._data.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self._data.shape}")
        return self._data.item()

    def detach(self):
        """A tensor with the same value and no gradient history."""
        return _wrap(self._data, self._device)

    def _is_recorded(self):
        """True when some live GradKey tracks this tensor."""
        for s in _slots_of(self):
            if (<GradSlot>s).key.state == 1:
                return True
        return False

    def _reset(self, Tensor other):
        """Rebind this tensor to ``other``'s value and history (MegEngine's
        idiom). The old buffer is never written, so values saved for backward
        stay valid. This object stays a different node: attached afterwards it
        is a leaf of its own and receives a gradient only through ops that
        consumed it, never through ops that consumed ``other``."""
        self._rebind(other)
        self._alias = other._slot is not None

    cdef void _rebind(self, Tensor other):
        # in-place ops: ``other`` is a temporary whose history becomes ours
        self._data = other._data
        self._device = other._device
        self._slot = other._slot
        self._more_slots = None if other._more_slots is None else list(other._more_slots)

    def __repr__(self):
        body = np.array2string(self.numpy(), separator=", ", prefix="Tensor(")
        return f"Tensor({body}, dtype={self._data.dtype}, device={self._device})"

    def __len__(self):
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __bool__(self):
        return bool(self._data)

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __round__(self, ndigits=None):
        return _h_getattr("round")(self, ndigits)

    # math.floor / math.ceil elementwise, as MegEngine's tensors
    def __floor__(self):
        return _h_getattr("floor")(self)

    def __ceil__(self):
        return _h_getattr("ceil")(self)

    def __index__(self):
        return self._data.__index__()

    def __hash__(self):
        return id(self) >> 4

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        # np.add(tensor, array) and the like: a Tensor, as in MegEngine
        return _h_getattr("array_ufunc")(self, ufunc, method, inputs, kwargs)

    def __array__(self, dtype=None, copy=None):
        arr = self._data if type(self._data) is _ndarray else self._data.get()   # a device copies to host
        return arr if dtype is None else arr.astype(dtype)

    def __reduce__(self):
        return (_rebuild_tensor, (type(self), np.array(self.numpy()), self._device, self._name))

    # -- operators: the hot ones go straight to the compiled dispatcher
    def __add__(self, other): return _apply1(_op_add, (self, other))
    def __radd__(self, other): return _apply1(_op_add, (other, self))
    def __sub__(self, other): return _apply1(_op_sub, (self, other))
    def __rsub__(self, other): return _apply1(_op_sub, (other, self))
    def __mul__(self, other): return _apply1(_op_mul, (self, other))
    def __rmul__(self, other): return _apply1(_op_mul, (other, self))
    def __truediv__(self, other): return _apply1(_op_div, (self, other))
    def __rtruediv__(self, other): return _apply1(_op_div, (other, self))
    def __pow__(self, other, mod=None): return _apply1(_op_pow, (self, other))
    def __rpow__(self, other, mod=None): return _apply1(_op_pow, (other, self))
    def __matmul__(self, other): return _h_getattr("matmul")(self, other)
    def __rmatmul__(self, other): return _h_getattr("matmul")(other, self)
    def __floordiv__(self, other): return _binary("floor_div", self, other)
    def __rfloordiv__(self, other): return _binary("floor_div", other, self)
    def __mod__(self, other): return _binary("mod", self, other)
    def __rmod__(self, other): return _binary("mod", other, self)
    def __neg__(self): return _unary("neg", self)
    def __pos__(self): return self
    def __abs__(self): return _unary("abs", self)
    # & | ^ ~ are logical on bool tensors; other dtypes are refused (not cast)
    def __invert__(self): return _h_getattr("logical")("not", self)
    def __and__(self, other): return _h_getattr("logical")("and", self, other)
    def __rand__(self, other): return _h_getattr("logical")("and", other, self)
    def __or__(self, other): return _h_getattr("logical")("or", self, other)
    def __ror__(self, other): return _h_getattr("logical")("or", other, self)
    def __xor__(self, other): return _h_getattr("logical")("xor", self, other)
    def __rxor__(self, other): return _h_getattr("logical")("xor", other, self)
    # << >> on integer tensors (MegEngine's F.left_shift / F.right_shift)
    def __lshift__(self, other): return _h_getattr("left_shift")(self, other)
    def __rlshift__(self, other): return _h_getattr("left_shift")(other, self)
    def __rshift__(self, other): return _h_getattr("right_shift")(self, other)
    def __rrshift__(self, other): return _h_getattr("right_shift")(other, self)

    def __richcmp__(self, other, int op):
        if other is None and (op == 2 or op == 3):
            # t == None is False (t != None True), as in Python and PyTorch
            return op == 3
        name = ("lt", "le", "eq", "ne", "gt", "ge")[op]
        return _binary(name, self, other)

    # in-place operators record like their out-of-place form, then rebind
    def __iadd__(self, other): return self._inplace(_binary("add", self, other))
    def __isub__(self, other): return self._inplace(_binary("sub", self, other))
    def __imul__(self, other): return self._inplace(_binary("mul", self, other))
    def __itruediv__(self, other): return self._inplace(_binary("div", self, other))
    def __ipow__(self, other): return self._inplace(_binary("pow", self, other))
    def __imatmul__(self, other): return self._inplace(_h_getattr("matmul")(self, other))
    def __ifloordiv__(self, other): return self._inplace(_binary("floor_div", self, other))
    def __imod__(self, other): return self._inplace(_binary("mod", self, other))
    def __iand__(self, other): return self._inplace(self & other)
    def __ior__(self, other): return self._inplace(self | other)
    def __ixor__(self, other): return self._inplace(self ^ other)

    def _inplace(self, Tensor result):
        if result._data.dtype != self._data.dtype and np.can_cast(result._data.dtype, self._data.dtype,
                                                                 casting="same_kind"):
            # a wider result of the same kind keeps the tensor's dtype (a float32
            # parameter stays float32); another kind (int += 1.5) becomes the
            # result's, as MegEngine's in-place operators rebind to their result
            result = _h_getattr("astype")(result, self._data.dtype)
        if result._data.shape != self._data.shape:
            raise ValueError(f"in-place op: result shape {result._data.shape} does not match "
                             f"the tensor's shape {self._data.shape}")
        self._rebind(result)
        self._alias = False
        return self

    def __getitem__(self, index):
        return _h_getattr("getitem")(self, index)

    def __setitem__(self, index, value):
        self._rebind(_h_getattr("setitem")(self, index, value))
        self._alias = False

    # common methods, implemented in gradcore.tensor_methods
    def reshape(self, *shape): return _h_getattr("reshape")(self, *shape)
    def transpose(self, *perm): return _h_getattr("transpose")(self, *perm)
    def flatten(self, start_axis=0, end_axis=-1): return _h_getattr("flatten")(self, start_axis, end_axis)
    def sum(self, axis=None, keepdims=False): return _reduce(self, "sum", axis, keepdims)
    def mean(self, axis=None, keepdims=False): return _reduce(self, "mean", axis, keepdims)
    def max(self, axis=None, keepdims=False): return _reduce(self, "max", axis, keepdims)
    def min(self, axis=None, keepdims=False): return _reduce(self, "min", axis, keepdims)
    def prod(self, axis=None, keepdims=False): return _reduce(self, "prod", axis, keepdims)
    def astype(self, dtype): return _h_getattr("astype")(self, dtype)
    def to(self, device): return _h_getattr("to")(self, device)

    @property
    def T(self):
        return _h_getattr("T")(self)

    def __getattr__(self, name):
        # the rarer Python-level methods live in gradcore.tensor_methods
        return _h_getattr("method")(self, name)


cdef dict _reduce_ops = {}


cdef object _reduce(Tensor t, str mode, axis, keepdims):
    if type(axis) is list:
        axis = tuple(axis)
    key = (mode, axis, bool(keepdims))
    op = _reduce_ops.get(key)
    if op is None:
        op = _h_getattr("reduce_op")(mode, axis, bool(keepdims))
        _reduce_ops[key] = op
    return _apply1(op, (t,))


def _rebuild_tensor(cls, data, device, name):
    t = cls.__new__(cls)
    (<Tensor>t)._data = data if device == CPU else _h_getattr("_to_array")(data, None, device)[0]
    (<Tensor>t)._device = device
    (<Tensor>t)._name = name
    return t


def _bump_version(Tensor t):
    """Record that ``t``'s buffer was written in place."""
    t._version += 1


cdef inline Tensor _wrap(object arr, object device):
    # the device follows the data (a Copy op's output is on its target device)
    cdef Tensor t = Tensor.__new__(Tensor)
    if type(arr) is _ndarray:
        t._device = CPU
    elif type(arr) is _device_array:
        t._device = CUDA
    else:
        arr = _np_asarray(arr)
        t._device = CPU
    if type(device) is not str and device is not None and device == t._device:
        # a logical device (devices.LogicalDevice, MegEngine's "cpu1") on the
        # physical one the data is on: the output stays on it
        t._device = device
    t._data = arr
    return t


def wrap_array(arr, device="cpu"):
    """Wrap an ndarray (no copy) into a Tensor without history."""
    return _wrap(arr, device)


cdef object _binary(str name, a, b):
    return _apply1(_operator_ops[name], (a, b))


cdef object _unary(str name, a):
    return _apply1(_operator_ops[name], (a,))


# ---------------------------------------------------------------- ops
cdef class OpBase:
    """The compiled base of ``gradcore.op.Op``: per-op caches the dispatcher
    reads without touching Python attributes (the CPU kernel, whether the op
    has its own ``_grad_rule``, the last backward graph used)."""
    cdef object _cpu_kernel
    cdef bint _cpu_takes_op       # _cpu_kernel is the class's function: call it with the op
    cdef Py_ssize_t _nin          # inputs the op takes (its ``nin``), -1 any, -2 unknown
    cdef signed char _own_rule    # -1 unknown, else _rule_kind
    cdef signed char _promotes    # has input_dtypes (gradcore.dtypes): -1 unknown, 0 no, 1 yes
    cdef long long _last_key
    cdef object _last_cb
    cdef dict _cb_cache
    cdef signed char _infer_state  # -1 unknown, 0 the forward does not consult infer, 1 it does
    cdef unsigned long long _infer_last   # descriptor key of the last inputs infer accepted (0: none)
    cdef dict _infer_ok           # descriptor keys infer accepted (bounded) -> how many outputs it declared
    cdef Py_ssize_t _infer_nout   # outputs infer declared for the last inputs (-1: not known)

    def __cinit__(self):
        self._own_rule = -1
        self._promotes = -1
        self._last_key = -1
        self._nin = -2
        self._infer_state = -1
        self._infer_nout = -1

    def __call__(self, *args):
        """``op(x, ...)``: ``apply(op, x, ...)``, the output itself when the
        op has one, else the tuple of outputs."""
        return _apply_unwrapped(self, args, False)

    def _clear_caches(self):
        self._cpu_kernel = None
        self._cpu_takes_op = False
        self._own_rule = -1
        self._promotes = -1
        self._last_key = -1
        self._last_cb = None
        self._cb_cache = None
        self._infer_state = -1
        self._infer_last = 0
        self._infer_ok = None
        self._infer_nout = -1


cdef unsigned long long _desc_key(tuple args, object device):
    """A 64-bit hash of the inputs' dtypes and shapes (and the device): the
    key under which an op remembers that its ``infer`` accepted them."""
    cdef unsigned long long h = 14695981039346656037ULL
    cdef cnp.ndarray arr
    cdef int k
    if device is not CPU:
        h = (h ^ <unsigned long long>hash(device)) * 1099511628211ULL
    for a in args:
        data = (<Tensor>a)._data
        if type(data) is _ndarray:
            arr = <cnp.ndarray>data
            h = (h ^ <unsigned long long>(cnp.PyArray_TYPE(arr) + 1)) * 1099511628211ULL
            h = (h ^ <unsigned long long>(cnp.PyArray_NDIM(arr) + 1000)) * 1099511628211ULL
            for k in range(cnp.PyArray_NDIM(arr)):
                h = (h ^ <unsigned long long>cnp.PyArray_DIMS(arr)[k]) * 1099511628211ULL
        else:
            # a device array: its shape and dtype apart (no tuple, and never
            # str(dtype), which costs microseconds)
            h = (h ^ <unsigned long long>hash(data.shape)) * 1099511628211ULL
            k = _dtype_num(data)
            h = (h ^ (<unsigned long long>(k + 1) if k >= 0 else <unsigned long long>hash(data.dtype))) * 1099511628211ULL
        h = (h ^ 0x9e3779b97f4a7c15ULL) * 1099511628211ULL
    return h | 1


cdef int _guard_infer(OpBase op, tuple args, object device) except -1:
    """Run the op's ``infer`` on the inputs' descriptors before its kernel,
    once per distinct (dtypes, shapes, device): the verdict is cached on the op."""
    if op._infer_state < 0:
        op._infer_state = 1 if _h_describe(op).has_infer else 0
    if op._infer_state == 0:
        return 0
    cdef unsigned long long key = _desc_key(args, device)
    if key == op._infer_last:
        return 0
    nout = None if op._infer_ok is None else op._infer_ok.get(key)
    if nout is None:
        nout = _h_infer_check(op, args)
        if op._infer_ok is None or len(op._infer_ok) > 256:
            op._infer_ok = {}
        op._infer_ok[key] = nout
    op._infer_nout = nout
    op._infer_last = key
    return 0


cdef object _check_output_count(OpBase op, object res, tuple args):
    """A kernel's result against the outputs ``infer`` declared: a forgotten
    output would otherwise reach the backward graph, which reads one
    gradient per declared output."""
    cdef Py_ssize_t got = len(res) if type(res) is tuple or type(res) is list else 1
    if got != op._infer_nout:
        # an op computed by its decompose: say so, the author wrote no kernel
        what = "its decompose" if set(_h_describe(op).kernels.values()) == {"decompose"} else "the kernel"
        raise _h_kernel_error(op, args, ValueError(
            f"infer declares {op._infer_nout} output{'s' * (op._infer_nout != 1)}, {what} returned {got}"))
    return res


# ---------------------------------------------------------------- slots
@cython.final
@cython.no_gc
@cython.freelist(1024)
cdef class GradSlot:
    """Receives and accumulates the gradient of one tensor under one key."""
    cdef GradKey key
    cdef object grad          # raw array (raw mode) or Tensor (tensor mode)
    cdef bint owned           # grad is a buffer only this slot can see
    cdef bint leaf            # attached with wrt(): fires a callback
    cdef bint reaches         # some attached tensor is behind this slot
    cdef Py_ssize_t pending   # producers still to run in this backward
    cdef object callback
    cdef object tensor_ref    # weakref to an attached tensor, for inspection
    cdef tuple shape          # an attached tensor's shape: its gradient must have it
    cdef object device        # an attached tensor's device: its gradient is put there
    cdef bint made_by_attach  # a leaf's own slot; else an op's output slot, whose
                              # gradient its op still reads after the tensor's callback


cdef inline GradSlot _new_slot(GradKey key):
    cdef GradSlot s = GradSlot.__new__(GradSlot)
    s.key = key
    return s


cdef inline GradSlot _slot_for(Tensor t, GradKey key):
    if t._slot is None:
        return None
    if t._slot.key is key:
        return t._slot
    if t._more_slots is not None:
        for s in t._more_slots:
            if (<GradSlot>s).key is key:
                return <GradSlot>s
    return None


cdef inline void _add_slot(Tensor t, GradSlot s):
    if t._slot is None:
        t._slot = s
    elif t._more_slots is None:
        t._more_slots = [s]
    else:
        t._more_slots.append(s)


cdef list _slots_of(Tensor t):
    if t._slot is None:
        return []
    if t._more_slots is None:
        return [t._slot]
    return [t._slot] + t._more_slots


# ---------------------------------------------------------------- nodes
@cython.final
@cython.no_gc
@cython.freelist(2048)
cdef class GradFn:
    """One recorded op on one tape. Final and pooled: recording an op costs
    one allocation from the free list."""
    cdef object op
    cdef CompiledBackward backward   # how its backward runs: a graph or a user's function
    cdef object saved         # what the backward reads: the value itself when it is one, else a tuple
    cdef bint saved_tensors   # saved values are Tensors (several keys recorded the op)
    cdef GradSlot slot0       # the output slot when there is one output
    cdef tuple slots          # one per forward output, when there are several
    # the slot of each forward input (None: no gradient goes there): two
    # fields for up to two inputs, a tuple only for more (no tuple per op)
    cdef GradSlot dest0, dest1
    cdef tuple dests
    cdef Py_ssize_t nin
    cdef tuple in_shapes
    cdef tuple out_meta       # (shape, dtype) per output, to zero-fill missing grads
    cdef object device
    cdef list versions        # (tensor, version) of saved tensors whose buffer may be written
    cdef Py_ssize_t seq
    cdef long priority        # backward priority: higher runs first among ready nodes (0: none)
    cdef bint reaches
    cdef object debug_info    # anomaly mode only: its hook's record (forward stack, shapes)

    cdef inline void clear(self):
        self.op = None
        self.backward = None
        self.saved = None
        self.slots = None
        self.slot0 = None
        self.dest0 = None
        self.dest1 = None
        self.dests = None
        self.in_shapes = None
        self.out_meta = None
        self.versions = None
        self.debug_info = None

    @property
    def op_(self):
        return self.op


@cython.final
cdef class CompiledBackward:
    """A node's backward, the one kind every gradient path ends in: a
    backward graph built by gradcore.graph (``vjp``, ``decompose``), or a
    user's function of the output gradients (``_grad_rule``, a registered
    rule, ``Function``: ``_rule_cb``)."""
    cdef public str kind               # the gradient path it came from (gradcore.op.GRAD_PATHS)
    cdef public bint user_fn           # a user's function: gets None for a missing output
                                       # gradient, and what it returns is checked
    cdef public tuple save_index      # indices into inputs + outputs
    cdef public tuple precomp_index   # inputs/outputs kept only as shape carriers, or None
    cdef public object run_raw        # (saved, grads) -> grads per input (arrays)
    cdef public object run_tensor     # same on Tensors, recorded by outer keys
    cdef public tuple input_has_grad
    cdef public bint saves_inputs     # some forward input is in save_index
    cdef public tuple passthrough     # per input: index of the output grad it is, or -1
    cdef public bint one_saved        # exactly one saved value: kept bare, not in a tuple
    cdef public bint any_grad
    cdef public bint reduce_broadcast # grads may come back in a broadcast shape
    cdef public object graph          # the BackwardGraph it was compiled from
    # run_raw as an instruction list (gradcore.graph._program), or None
    cdef public tuple prog_kernels
    cdef public bytes prog_code
    cdef public list prog_regs        # register template: constants preloaded
    cdef public bytes prog_ret
    cdef public Py_ssize_t n_kept, n_out


# ---------------------------------------------------------------- keys
cdef class GradKey:
    """One recording: a tape of GradFn nodes. Used through ``Grad``."""
    cdef public str name
    cdef list tape
    cdef list leaves          # slots made by attach(): emptied at exit
    cdef public long priority
    cdef int state            # 0 new, 1 recording, 2 finished
    cdef bint suppressed
    cdef bint ran_backward
    cdef bint in_backward     # its backward walk runs now (in some thread)
    cdef bint prioritized     # some node on its tape has a backward priority: the ordered walk
    cdef unsigned long long owner   # serial of the state of the thread that entered it
    cdef public str owner_name      # that thread's name, for error messages
    cdef object __weakref__

    def __init__(self, name=None):
        self.name = name or "grad"
        self.tape = []
        self.leaves = []
        self.state = 0

    @property
    def recording(self):
        return self.state == 1 and not self.ran_backward

    @property
    def phase(self):
        """0: not entered yet, 1: recording, 2: finished."""
        return self.state

    @property
    def tape_length(self):
        return len(self.tape)

    @property
    def records_in_this_thread(self):
        """Whether ops run by the calling thread can be recorded by this key
        (it is recording and was entered by this thread)."""
        return self.state == 1 and not self.ran_backward and self.owner == _ts().serial

    @property
    def entered_in_this_thread(self):
        """Whether the calling thread entered this key."""
        return self.state != 0 and self.owner == _ts().serial

    def enter(self):
        """Start recording the ops that the calling thread runs."""
        global _next_priority
        if self.state != 0:
            raise RuntimeError(f"{self.name}: a Grad can be entered only once")
        cdef _ThreadState ts = _ts()
        if ts.group_priority is not None:
            self.priority = ts.group_priority
        else:
            _next_priority += 1
            self.priority = _next_priority
        self.owner = ts.serial
        self.owner_name = ts.thread_name
        self.state = 1
        _recording.append(self)

    def exit(self):
        """End the recording (from any thread)."""
        if self.state == 1:
            _recording.remove(self)
        self.state = 2
        if not self.in_backward:
            # (a backward walking the tape in another thread, or calling
            # this from a callback, clears it itself when it ends)
            self._drop_tape()
        # the GC cannot see through slots (no_gc): drop what they hold
        for s in self.leaves:
            (<GradSlot>s).callback = None
            (<GradSlot>s).grad = None
        self.leaves = []

    def suppress(self):
        self.suppressed = True

    def resume(self):
        self.suppressed = False

    cdef void _drop_tape(self):
        cdef GradFn node
        for node in self.tape:
            if node is not None:
                node.clear()
        self.tape = []

    def attach(self, Tensor t, callback=None):
        """Track ``t`` as a leaf of this recording; ``callback(grad)`` fires
        once its gradient is complete."""
        if self.state == 2 or self.ran_backward:
            raise RuntimeError(f"{self.name}: cannot attach to a Grad whose recording has finished")
        cdef GradSlot s = _slot_for(t, self)
        if s is not None and t._alias and not (s.made_by_attach and s.tensor_ref is not None
                                              and s.tensor_ref() is t):
            # an alias made by _reset shares the slot of the tensor it was
            # reset from; it gets its own, so gradients reach it only
            # through ops that consumed this very object
            _drop_slot(t, s)
            s = None
        if s is None:
            s = _new_slot(self)
            s.made_by_attach = True
            if t._alias:
                s.tensor_ref = _weakref(t)
            _prune_slots(t)
            _add_slot(t, s)
            self.leaves.append(s)
        s.leaf = True
        s.shape = t._data.shape
        s.device = t._device
        s.reaches = True
        if callback is not None:
            if s.callback is None:
                s.callback = callback
            else:
                s.callback = _chain(s.callback, callback)

    def is_attached(self, Tensor t):
        cdef GradSlot s = _slot_for(t, self)
        return s is not None and s.leaf

    def tracks(self, Tensor t):
        """Whether ``t`` is attached to or was computed under this recording."""
        return _slot_for(t, self) is not None

    def backward(self, ys, dys):
        _run_backward(self, list(ys), list(dys))


def _chain(first, second):
    def both(grad):
        first(grad)
        second(grad)
    return both


cdef void _drop_slot(Tensor t, GradSlot s):
    others = [o for o in _slots_of(t) if o is not s]
    t._slot = others[0] if others else None
    t._more_slots = others[1:] or None


cdef void _prune_slots(Tensor t):
    # slots of finished recordings are dead weight on long-lived tensors
    if t._slot is None:
        return
    live = [s for s in _slots_of(t) if (<GradSlot>s).key.state == 1]
    t._slot = live[0] if live else None
    t._more_slots = live[1:] or None


def _set_anomaly(hooks):
    """Anomaly mode on (``hooks``: gradcore.anomaly's capture/check) or off (None)."""
    global _anomaly, _h_anomaly
    _h_anomaly = hooks
    _anomaly = hooks is not None


def _anomaly_enabled():
    return _anomaly


def _set_pending_hooks(hooks):
    """Plug in the registry of deferred results (``hooks``: an object with
    ``before_node(grads, reads)``, ``settle(g)`` and ``settle_all(exc)``), or
    unplug it (None). The core calls them only while ``_set_pending_count``
    says something is in flight."""
    global _h_pending, _n_pending
    _h_pending = hooks
    if hooks is None:
        _n_pending = 0


def _set_pending_count(Py_ssize_t n):
    """How many deferred results are in flight (the registry keeps it up to date)."""
    global _n_pending
    _n_pending = n if _h_pending is not None else 0


def _in_raw_backward():
    """True while the calling thread runs a raw-mode backward (gradients are
    arrays that only the core reads until the backward hands them on): where a
    kernel may return a buffer that a request is still filling."""
    return _ts().raw_backward


def _recording_keys():
    return list(_recording)


def _set_group_priority(enable):
    """GradManager groups (``gm | gm2``) share one priority so that neither
    records the other's backward (for the calling thread's group)."""
    global _next_priority
    cdef _ThreadState ts = _ts()
    if enable:
        _next_priority += 1
        ts.group_priority = _next_priority
    else:
        ts.group_priority = None


# ---------------------------------------------------------------- dispatch
cdef inline bint _key_records(GradKey k, _ThreadState ts):
    return (k.state == 1 and not k.suppressed and not k.ran_backward and k.owner == ts.serial
            and k.priority < ts.visible_below)


cdef object _recorders(tuple args, _ThreadState ts):
    """The keys that record an op on ``args`` run by the thread of ``ts``:
    None, one GradKey, or a list."""
    cdef object keys = None
    cdef Tensor t
    cdef GradSlot s
    for a in args:
        t = <Tensor>a
        s = t._slot
        if s is None:
            continue
        if _key_records(s.key, ts):
            keys = _add_key(keys, s.key)
        if t._more_slots is not None:
            for o in t._more_slots:
                s = <GradSlot>o
                if _key_records(s.key, ts):
                    keys = _add_key(keys, s.key)
    return keys


cdef inline object _add_key(object keys, GradKey key):
    if keys is None or keys is key:
        return key
    if type(keys) is GradKey:
        return [keys, key]
    if key not in <list>keys:
        (<list>keys).append(key)
    return keys


def apply(op, *args):
    """Run ``op`` on tensors and return a tuple of output tensors; records
    the op on every recording GradManager that tracks one of the inputs.

    Example::

        >>> from gradcore.ops import Elemwise
        >>> (y,) = apply(Elemwise("mul"), x, x)
    """
    return _apply(op, args)


def apply1(op, *args):
    """``apply(op, *args)[0]`` for an op with one output, without building
    the output tuple: the entry point of the generated elementwise functions
    (gradcore/functional/elemwise_table.py), one call into compiled code.

    Example::

        >>> from gradcore.ops import Elemwise
        >>> y = apply1(Elemwise("mul"), x, x)
    """
    return _apply1(op, args)


from types import MethodType as _MethodType


cdef object _kernel_call(op, tuple args, object device):
    cdef Py_ssize_t n = len(args)
    cdef Tensor t0
    cdef Py_ssize_t nin
    if isinstance(op, OpBase):
        # a wrong input count must not reach a ufunc kernel: NumPy would
        # take the extra array as its output buffer and overwrite it
        nin = (<OpBase>op)._nin
        if nin == -2:
            nin = getattr(op, "nin", -1)
            (<OpBase>op)._nin = nin
        if nin >= 0 and nin != n:
            raise _h_kernel_error(op, args, TypeError(f"takes {nin} inputs, got {n}"))
        if (<OpBase>op)._infer_state != 0:
            _guard_infer(<OpBase>op, args, device)
    cdef bint takes_op = False
    if device is CPU or device == CPU:
        if isinstance(op, OpBase):
            kernel = (<OpBase>op)._cpu_kernel
            if kernel is None:
                kernel = op.cpu
                if type(kernel) is _MethodType and kernel.__self__ is op:
                    # not the bound method: op -> method -> op would be a
                    # cycle, leaving every op to the cyclic GC
                    kernel = kernel.__func__
                    (<OpBase>op)._cpu_takes_op = True
                (<OpBase>op)._cpu_kernel = kernel
            takes_op = (<OpBase>op)._cpu_takes_op
        else:
            kernel = op.cpu
    else:
        kernel = _h_kernel_for(op, device)
    try:
        if takes_op:
            if n == 1:
                res = kernel(op, (<Tensor>args[0])._data)
            elif n == 2:
                res = kernel(op, (<Tensor>args[0])._data, (<Tensor>args[1])._data)
            else:
                res = kernel(op, *[(<Tensor>a)._data for a in args])
        elif n == 1:
            res = kernel((<Tensor>args[0])._data)
        elif n == 2:
            res = kernel((<Tensor>args[0])._data, (<Tensor>args[1])._data)
        else:
            res = kernel(*[(<Tensor>a)._data for a in args])
    except Exception as exc:
        raise _h_kernel_error(op, args, exc) from exc
    if isinstance(op, OpBase) and (<OpBase>op)._infer_state == 1 and (<OpBase>op)._infer_nout >= 0:
        return _check_output_count(<OpBase>op, res, args)
    return res


cdef inline tuple _wrap_outputs(object res, object device):
    if type(res) is tuple or type(res) is list:
        return tuple([_wrap(r, device) for r in res])
    return (_wrap(res, device),)


cdef inline object _logical(object device):
    # what tells logical devices apart (devices.logical_name)
    return device if type(device) is str else device.logical


cdef object _common_device(op, tuple args):
    cdef object dev = (<Tensor>args[0])._device
    cdef Tensor t
    for a in args:
        t = <Tensor>a
        if t._device is not dev and (t._device != dev or ((type(t._device) is not str or type(dev) is not str)
                                                          and _logical(t._device) != _logical(dev))):
            raise RuntimeError(
                f"{_op_name(op)}: inputs are on different devices "
                f"({', '.join(str((<Tensor>x)._device) for x in args)}); "
                f"move them with .to(device) first")
    if type(op) is _copy_op and (type(dev) is not str or type((<object>op).device) is not str):
        # a copy from or to a logical device: its output is wrapped on the target
        # (both devices' kernels of Copy are the same host/device transfer)
        return (<object>op).device
    return dev


cdef str _count(Py_ssize_t n, str noun):
    """``1 input``, ``2 inputs``: counts in messages."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


cdef str _op_name(op):
    try:
        return op._name()
    except Exception:
        return type(op).__name__


cdef tuple _apply(op, tuple args):
    return <tuple>_dispatch(op, args, False)


# ---------------------------------------------------------------- Python scalars
# A Python float or int operand of float32/float64 tensors (``x * 0.5``,
# ``1 - x``, ``x ** 2``) is converted here, in C, to what the slow path
# (tensor_methods._const_for) makes of it: a 0-d array of the tensors' dtype
# (scalars are weak), on the cpu read-only and shared, on a device the
# backend's cached constant. Everything else (bool, NumPy scalars, integer or
# float16 tensors, mixed dtypes, a float32 overflow, symbolic tensors) takes
# the slow path. The constants are kept in a small direct-mapped table: a
# slot is invalidated, then its key, then its object written, then marked
# valid, with the slot's previous object held until then (its release is
# the only point where another thread could run), so no thread sees a slot
# whose key and object disagree.
DEF _SC_SIZE = 64
cdef unsigned long long _sc_bits[_SC_SIZE]
cdef int _sc_tag[_SC_SIZE]          # typenum * 4 + device code * 2 + is_int; -1 invalid
cdef list _sc_obj = [None] * _SC_SIZE
cdef object _h_device_scalar = None  # (value, dtype, device) -> constant device array
for _i in range(_SC_SIZE):
    _sc_tag[_i] = -1


def _clear_scalar_cache():
    """Forget the cached scalar constants (the backend changed)."""
    cdef int i
    for i in range(_SC_SIZE):
        _sc_tag[i] = -1
    for i in range(_SC_SIZE):
        _sc_obj[i] = None


cdef union _DoubleBits:
    double d
    unsigned long long u
    long long i


cdef object _scalar_const(object x, int tn, int devcode, object device):
    """The constant array for the Python float/int ``x`` among tensors of
    type number ``tn`` on ``device``, or None for the slow path."""
    cdef _DoubleBits b
    cdef int is_int
    cdef int overflow = 0
    cdef double v
    cdef long long iv
    if type(x) is float:
        v = <double>x
        b.d = v
        is_int = 0
        if tn == cnp.NPY_FLOAT and v == v and (v > 3.4028234663852886e38 or v < -3.4028234663852886e38) \
                and v - v == 0.0:
            return None         # NumPy warns of the overflow: the slow path does that
    else:
        iv = PyLong_AsLongLongAndOverflow(x, &overflow)
        if overflow:
            return None
        b.i = iv
        v = <double>iv
        is_int = 1
    cdef int tag = tn * 4 + devcode * 2 + is_int
    cdef unsigned long long h = (b.u ^ (b.u >> 29) ^ (b.u >> 47)) * 0x9E3779B97F4A7C15ULL
    cdef int k = <int>((h >> 58) ^ <unsigned long long>tag) & (_SC_SIZE - 1)
    if _sc_tag[k] == tag and _sc_bits[k] == b.u:
        return _sc_obj[k]
    cdef cnp.ndarray arr
    if devcode == 0:
        arr = cnp.PyArray_EMPTY(0, NULL, tn, 0)
        # an int as NumPy converts it: to a double, then to the dtype
        if tn == cnp.NPY_FLOAT:
            (<float*>cnp.PyArray_DATA(arr))[0] = <float>v
        else:
            (<double*>cnp.PyArray_DATA(arr))[0] = v
        cnp.PyArray_CLEARFLAGS(arr, cnp.NPY_ARRAY_WRITEABLE)
        obj = arr
    else:
        obj = _h_device_scalar(x, cnp.PyArray_DescrFromType(tn), device)
    # the slot's old object is held here until the slot is whole: the store
    # below does not release it, so no finalizer (no other thread) runs
    # between the writes
    old = _sc_obj[k]
    _sc_tag[k] = -1
    _sc_bits[k] = b.u
    _sc_obj[k] = obj
    _sc_tag[k] = tag
    del old
    return obj


cdef tuple _with_scalars(tuple args):
    """``args`` with its Python float/int operands made constant Tensors,
    or None when the slow path must convert them."""
    cdef Py_ssize_t n = len(args)
    cdef Py_ssize_t i
    cdef int tn = -1
    cdef int devcode
    cdef Tensor t
    device = None
    for i in range(n):
        a = args[i]
        if type(a) is Tensor or isinstance(a, Tensor):
            t = <Tensor>a
            if tn == -1:
                tn = _dtype_num(t._data)
                if tn != cnp.NPY_FLOAT and tn != cnp.NPY_DOUBLE:
                    return None
                device = t._device
            elif _dtype_num(t._data) != tn:
                return None
        elif type(a) is not float and type(a) is not int:
            return None
    if tn == -1:
        return None
    if device is CPU:
        devcode = 0
    elif device is CUDA or device == CUDA:
        if _h_device_scalar is None:
            return None
        devcode = 1
    elif device == CPU:
        devcode = 0
    else:
        return None
    cdef tuple res = PyTuple_New(n)
    for i in range(n):
        a = args[i]
        if type(a) is float or type(a) is int:
            c = _scalar_const(a, tn, devcode, device)
            if c is None:
                return None
            a = _wrap(c, device)
        Py_INCREF(a)
        PyTuple_SET_ITEM(res, i, a)
    return res


cdef object _dispatch(op, tuple args, bint one):
    """The outputs of ``op`` on ``args``: a tuple, or the first output
    itself when ``one`` (then a recorded single-output op makes no tuple)."""
    cdef Py_ssize_t n = len(args)
    cdef Py_ssize_t i
    cdef tuple conv
    if n == 0:
        return _first(_h_slow_apply(op, args), one)
    for i in range(n):
        if type(args[i]) is not Tensor and not isinstance(args[i], Tensor):
            # Python scalars among float tensors: converted in C (an op whose
            # forward is its rule refuses non-Tensors on the slow path)
            conv = None
            if isinstance(op, OpBase) and _rule_kind(op) != 2:
                conv = _with_scalars(args)
            if conv is None:
                return _first(_h_slow_apply(op, args), one)
            args = conv
            break
    if _h_autocast is not None:
        # gradcore.amp's autocast: matmul/conv inputs to the low precision,
        # the precision-hungry elementwise ops' to the high (recorded casts)
        args = _h_autocast(op, args)
    if _needs_promotion(op, args):
        # the dtype rules (gradcore.dtypes): the op casts its inputs (recorded
        # casts, so each input's gradient comes back in its own dtype) or
        # hands over to another op
        op, args = _h_promote(op, args)
    device = _common_device(op, args)
    keys = None
    cdef _ThreadState ts
    if _recording:
        ts = _ts()
        if ts.no_record == 0:
            keys = _recorders(args, ts)
    if keys is None:
        if _rule_kind(op) == 2:
            return _first(_run_own_rule(op, args, device)[0], one)
        return _outputs(_kernel_call(op, args, device), device, one)
    return _record(op, args, device, keys, one)


cdef inline object _first(object outs, bint one):
    return outs[0] if one else outs


cdef inline object _outputs(object res, object device, bint one):
    if not one:
        return _wrap_outputs(res, device)
    if type(res) is tuple or type(res) is list:
        return _wrap(res[0], device)
    return _wrap(res, device)


cdef object _apply1(op, tuple args):
    """``_apply(op, args)[0]`` without the output tuple."""
    return _apply_unwrapped(op, args, True)


cdef inline object _single_or_all(tuple outs, bint first_only):
    return outs[0] if first_only or len(outs) == 1 else outs


cdef object _apply_unwrapped(op, tuple args, bint first_only):
    """The output itself when ``op`` has one (or when ``first_only``), else
    the tuple of outputs: ``apply1`` and ``op(*args)``, without the output
    tuple on the common path."""
    cdef Py_ssize_t n = len(args)
    cdef Py_ssize_t i
    if n == 0 or _h_autocast is not None or (_recording and _ts().no_record == 0):
        return _dispatch(op, args, True) if first_only else _single_or_all(_apply(op, args), False)
    for i in range(n):
        if type(args[i]) is not Tensor:
            return _single_or_all(_apply(op, args), first_only)
    # an op with its own _grad_rule (its forward, maybe without a cpu kernel) or
    # inputs the dtype rules cast: the general path
    if _has_own_rule(op) or _needs_promotion(op, args):
        return _single_or_all(_apply(op, args), first_only)
    device = _common_device(op, args)
    res = _kernel_call(op, args, device)
    if type(res) is tuple or type(res) is list:
        if first_only or len(res) == 1:
            return _wrap(res[0], device)
        return _wrap_outputs(res, device)
    return _wrap(res, device)


cdef bint _needs_promotion(op, tuple args):
    """Whether ``op`` has ``input_dtypes`` and its inputs are not all of
    one floating dtype (the case every kernel computes as the rules say)."""
    cdef OpBase ob
    cdef int tn
    cdef Py_ssize_t i
    if not isinstance(op, OpBase):
        return False
    ob = <OpBase>op
    if ob._promotes < 0:
        ob._promotes = hasattr(type(op), "input_dtypes")
    if not ob._promotes:
        return False
    data = (<Tensor>args[0])._data
    tn = _dtype_num(data)
    if tn >= 0:
        if tn != cnp.NPY_FLOAT and tn != cnp.NPY_DOUBLE and tn != cnp.NPY_FLOAT16:
            return True
        for i in range(1, len(args)):
            if _dtype_num((<Tensor>args[i])._data) != tn:
                return True
        return False
    dt = data.dtype
    if dt.kind != "f":
        return True
    for i in range(1, len(args)):
        if (<Tensor>args[i])._data.dtype != dt:
            return True
    return False


cdef signed char _rule_kind(op):
    """0: no _grad_rule of its own; 1: one; 2: one that is also its forward
    (no cpu kernel). From the op's description, cached on the op."""
    cdef OpBase ob
    if isinstance(op, OpBase):
        ob = <OpBase>op
        if ob._own_rule < 0:
            d = _h_describe(op)
            ob._own_rule = 2 if d.forward_by_rule else 1 if d.grad_rule else 0
        return ob._own_rule
    d = _h_describe(op)
    return 2 if d.forward_by_rule else 1 if d.grad_rule else 0


cdef inline bint _has_own_rule(op):
    return _rule_kind(op) != 0


cdef tuple _run_own_rule(op, tuple args, device):
    """Path 1 forward: the op computes itself; nothing inside is recorded.
    Its ``infer`` runs first, as before any kernel."""
    if isinstance(op, OpBase) and (<OpBase>op)._infer_state != 0:
        _guard_infer(<OpBase>op, args, device)
    cdef _ThreadState ts = _ts()
    ts.no_record += 1
    try:
        res = op._grad_rule(*args)
    finally:
        ts.no_record -= 1
    return _split_rule_result(op, res, device)


cdef tuple _split_rule_result(op, res, device):
    if not isinstance(res, tuple) or len(res) != 2:
        raise TypeError(f"{_op_name(op)}: a grad rule must return (outputs, backward), got {type(res).__name__}")
    outs, backward = res
    if isinstance(outs, Tensor):
        outs = (outs,)
    elif isinstance(outs, (tuple, list)):
        for o in outs:
            if not isinstance(o, Tensor):
                raise TypeError(f"{_op_name(op)}: forward outputs must be Tensors, got {type(o).__name__}")
    else:
        raise TypeError(f"{_op_name(op)}: forward outputs must be Tensors, got {type(outs).__name__}")
    if not callable(backward):
        raise TypeError(f"{_op_name(op)}: the backward returned by the grad rule is not callable")
    for o in outs:
        if (<Tensor>o)._device is not device and (<Tensor>o)._device != device:
            raise RuntimeError(
                f"{_op_name(op)}: its grad rule's forward returned an output on {(<Tensor>o)._device} "
                f"for inputs on {device}: compute it with gradcore ops on the input tensors (as "
                f"`apply(op, x)` or F functions), not with NumPy on `.numpy()`, or declare "
                f"`devices = (\"cpu\",)`")
    # fresh wrappers: an output may be an input, which must keep its own history
    wrapped = tuple([_wrap((<Tensor>o)._data, (<Tensor>o)._device) for o in outs])
    return wrapped, backward


cdef int _rg_mask(tuple args, GradKey key):
    cdef int mask = 0
    cdef Py_ssize_t i
    for i in range(len(args)):
        if _slot_for(<Tensor>args[i], key) is not None:
            mask |= 1 << i
    return mask


cdef inline int _type_num(object arr):
    if type(arr) is _ndarray:
        return cnp.PyArray_TYPE(<cnp.ndarray>arr)
    return -1


cdef inline int _dtype_num(object arr):
    # the NumPy type number of an ndarray's, or of any array's NumPy dtype
    # (a device array's): a C field read, where dtype comparisons cost calls;
    # -1 for a dtype that is not NumPy's
    if type(arr) is _ndarray:
        return cnp.PyArray_TYPE(<cnp.ndarray>arr)
    dt = arr.dtype
    if isinstance(dt, cnp.dtype):
        return (<cnp.dtype>dt).type_num
    return -1


cdef CompiledBackward _graph_for(op, tuple args, object device, int rg):
    cdef Py_ssize_t n = len(args)
    cdef Py_ssize_t i
    cdef int tn
    cdef long long low
    # fast key: one int from the op's identity, the input type numbers and
    # the requires-grad mask (the op is kept alive in the value)
    if n <= 3 and device is CPU:
        low = rg | (n << 3)
        for i in range(n):
            tn = _type_num((<Tensor>args[i])._data)
            if tn < 0 or tn > 255:
                low = -1
                break
            low |= (<long long>tn) << (5 + 8 * i)
        if low >= 0 and isinstance(op, OpBase):
            return _graph_for_op(<OpBase>op, low, args, device, rg)
        if low >= 0:
            ikey = (id(op) << 32) | low
            hit = _bw_front.get(ikey)
            if hit is not None and (<tuple>hit)[0] is op:
                return <CompiledBackward>(<tuple>hit)[1]
            cb = _graph_for_slow(op, args, device, rg)
            _bw_front[ikey] = (op, cb)
            return cb
    return _graph_for_slow(op, args, device, rg)


cdef CompiledBackward _graph_for_op(OpBase op, long long low, tuple args, object device, int rg):
    if op._last_key == low:
        return <CompiledBackward>op._last_cb
    cdef dict cache = op._cb_cache
    if cache is None:
        cache = op._cb_cache = {}
    cb = cache.get(low)
    if cb is None:
        # cached on the op itself: not in _bw_front, which would keep the
        # op (and whatever it holds) alive after the user drops it. (The
        # local dict: another thread may reset op._cb_cache meanwhile.)
        cb = _graph_for_slow(op, args, device, rg, False)
        cache[low] = cb
    # ops are shared by threads: the pair is invalidated first, so that a
    # thread switch while the old graph is released never shows the new
    # key with the old graph
    op._last_key = -1
    op._last_cb = cb
    op._last_key = low
    return <CompiledBackward>cb


cdef CompiledBackward _graph_for_slow(op, tuple args, object device, int rg, bint front=True):
    cdef Py_ssize_t n = len(args)
    if n == 1:
        dtypes = ((<Tensor>args[0])._data.dtype,)
    elif n == 2:
        dtypes = ((<Tensor>args[0])._data.dtype, (<Tensor>args[1])._data.dtype)
    else:
        dtypes = tuple([(<Tensor>a)._data.dtype for a in args])
    if not front:
        return <CompiledBackward>_h_backward_graph(op, dtypes, device, rg, n)
    fkey = (id(op), device, dtypes, rg)
    hit = _bw_front.get(fkey)
    if hit is not None and (<tuple>hit)[0] is op:
        return <CompiledBackward>(<tuple>hit)[1]
    cb = _h_backward_graph(op, dtypes, device, rg, n)
    if len(_bw_front) > 8192:
        _bw_front.clear()
    _bw_front[fkey] = (op, cb)
    return <CompiledBackward>cb


cdef object _record(op, tuple args, object device, object keys, bint one):
    cdef _ThreadState ts
    cdef Py_ssize_t n = len(args)
    cdef Py_ssize_t i, j
    cdef bint one_key = type(keys) is GradKey
    cdef Py_ssize_t nk = 1 if one_key else len(<list>keys)
    cdef GradKey key
    cdef GradFn node
    cdef GradSlot s
    cdef Tensor t
    cdef CompiledBackward cb = None
    rule = None
    backward = None
    cdef tuple outs = None    # None: one output, out0, and no tuple made
    out0 = None

    # choose the gradient path, in the SPEC's order; a rule's backward
    # becomes a CompiledBackward like a graph's (one node kind)
    if _has_own_rule(op):
        # the rule's backward closes over its inputs: give it tensors of its
        # own, which a later in-place op on the caller's cannot rebind
        outs, backward = _run_own_rule(op, _aliases(args), device)
        cb = _OWN_RULE_CB
    else:
        rule = _grad_rules.get(type(op)) if _grad_rules else None
        if rule is not None:
            ts = _ts()
            ts.no_record += 1
            try:
                res = rule(op, *_aliases(args))
            except GradRuleFallback:
                res = None
            finally:
                ts.no_record -= 1
            if res is not None:
                outs, backward = _split_rule_result(op, res, device)
                cb = _REGISTERED_RULE_CB

    graphs = None
    cdef bint by_rule = cb is not None
    if not by_rule:
        # one graph per key: their requires-grad masks may differ
        if one_key:
            cb = _graph_for(op, args, device, _rg_mask(args, <GradKey>keys))
            if not cb.any_grad:
                return _outputs(_kernel_call(op, args, device), device, one)
        else:
            graphs = []
            any_grad = False
            for key in keys:
                cb = _graph_for(op, args, device, _rg_mask(args, key))
                graphs.append(cb)
                if cb.any_grad:
                    any_grad = True
            if not any_grad:
                return _outputs(_kernel_call(op, args, device), device, one)
        res = _kernel_call(op, args, device)
        if type(res) is tuple or type(res) is list:
            outs = _wrap_outputs(res, device)
        else:
            out0 = _wrap(res, device)
    if outs is not None and len(outs):
        out0 = outs[0]

    cdef tuple in_shapes = None
    cdef Py_ssize_t nout = 1 if outs is None else len(outs)
    if by_rule or (cb.reduce_broadcast and _needs_reduction(args, out0, cb.input_has_grad if one_key else None)):
        in_shapes = tuple([(<Tensor>a)._data.shape for a in args])
    out_meta = None
    if nout > 1:
        out_meta = tuple([((<Tensor>o)._data.shape, (<Tensor>o)._data.dtype) for o in outs])
    # several keys: save Tensors so that older keys can differentiate the backward
    cdef bint save_tensors = nk > 1
    cdef bint as_tensors
    cdef list save_later = None
    cdef GradFn node0 = None
    cdef list nodes = None

    for i in range(nk):
        key = <GradKey>keys if one_key else <GradKey>(<list>keys)[i]
        node = GradFn.__new__(GradFn)
        node.op = op
        node.device = device
        node.in_shapes = in_shapes
        node.out_meta = out_meta
        if not by_rule:
            if nk > 1:
                cb = <CompiledBackward>graphs[i]
            if not cb.any_grad:
                continue
            node.backward = cb
            _set_dests(node, args, key, cb.input_has_grad)
            as_tensors = save_tensors and _older_key_in(keys, key)
            if as_tensors:
                # saved once every key's output slots exist: the saved
                # outputs must carry the history older keys differentiate
                if save_later is None:
                    save_later = []
                save_later.append(node)
            else:
                node.saved = _save(cb, args, outs, out0, False)
            node.saved_tensors = as_tensors
            if cb.saves_inputs:
                node.versions = _versions_of(cb, args)
        else:
            node.backward = cb
            node.saved = _rule_saved(op, backward, device, n, len(outs))
            node.saved_tensors = True        # kept as given, not wrapped nor unwrapped
            _set_dests(node, args, key, None)
            # the rule may have kept any input (as its own alias): a
            # Parameter written in place before backward is caught
            node.versions = _param_versions(args)
        _make_slots(node, outs, out0, key)
        if _anomaly:
            node.debug_info = _h_anomaly.capture(op, args, out0 if outs is None else outs)
        if one_key:
            node0 = node
        else:
            if nodes is None:
                nodes = [None] * nk
            nodes[i] = node
    if save_later is not None:
        for node in save_later:
            node.saved = _alias_saved(_save(node.backward, args, outs, out0, True),
                                      node.backward.one_saved)
    # each node complete, linked into its tape last (see _link)
    if one_key:
        if node0 is not None:
            _link(node0, <GradKey>keys)
    elif nodes is not None:
        for i in range(nk):
            if nodes[i] is not None:
                _link(<GradFn>nodes[i], <GradKey>(<list>keys)[i])
    if outs is None:
        return out0 if one else (out0,)
    return outs[0] if one else outs


cdef inline void _make_slots(GradFn node, tuple outs, object out0, GradKey key):
    """Output slots of a new node (on output tensors no other code has seen
    yet); _link connects it to its inputs."""
    cdef GradSlot s
    if outs is None or len(outs) == 1:
        s = _new_slot(key)
        _add_slot(<Tensor>out0, s)
        node.slot0 = s          # one output: a field, no tuple
        return
    slots = []
    for o in outs:
        s = _new_slot(key)
        slots.append(s)
        _add_slot(<Tensor>o, s)
    node.slots = tuple(slots)


cdef Py_ssize_t _priority_contexts = 0     # backward_priority() contexts open in any thread


def _enter_backward_priority(long priority):
    """Nodes recorded by this thread get ``priority`` until the matching exit;
    returns the previous value (gradcore.autodiff.backward_priority)."""
    global _priority_contexts
    cdef _ThreadState ts = _ts()
    cdef long previous = ts.backward_priority
    ts.backward_priority = priority
    _priority_contexts += 1
    return previous


def _exit_backward_priority(long previous):
    global _priority_contexts
    _ts().backward_priority = previous
    _priority_contexts -= 1


def _set_node_priority(Tensor t, long priority):
    """Give the node that produced ``t`` (on every key recording it) the
    backward priority ``priority``; the number of nodes changed."""
    cdef GradSlot s
    cdef GradFn node
    cdef GradKey key
    cdef Py_ssize_t i, found = 0
    for s in _slots_of(t):
        key = s.key
        if key.tape is None:
            continue
        for i in range(len(key.tape) - 1, -1, -1):     # the producer is usually recent
            node = <GradFn>key.tape[i]
            if node is None:
                continue
            if node.slot0 is s or (node.slots is not None and any(o is s for o in node.slots)):
                node.priority = priority
                if priority:
                    key.prioritized = True
                found += 1
                break
    return found


cdef int _link(GradFn node, GradKey key) except -1:
    """Put a complete node on ``key``'s tape: every input slot gets one more
    pending producer, and the node reaches an attached tensor when one of its
    input slots does (so backward needs no pre-pass).

    From the check to the append nothing allocates or calls Python code, so
    the GIL cannot change hands: a backward of ``key`` started in another
    thread (which sets ran_backward before it reads the tape) either sees
    the whole node or none of it, never a pending count without its node."""
    global _seq
    if key.state != 1 or key.ran_backward:
        raise RuntimeError(
            f"{key.name}: {_op_name(node.op)} was being recorded (in thread "
            f"{_ts().thread_name!r}) when the recording ended: its backward started or it was "
            f"released from another thread while an op was running. Finish the forward before "
            f"calling backward from another thread")
    cdef GradSlot s
    cdef bint r = False
    cdef Py_ssize_t j
    for j in range(node.nin):
        s = _dest(node, j)
        if s is not None:
            s.pending += 1
            if s.reaches:
                r = True
    node.reaches = r
    if node.slot0 is not None:
        node.slot0.reaches = r
    else:
        for j in range(len(node.slots)):
            (<GradSlot>node.slots[j]).reaches = r
    _seq += 1
    node.seq = _seq
    node.priority = 0
    if _priority_contexts:
        node.priority = _ts().backward_priority
        if node.priority:
            key.prioritized = True
    key.tape.append(node)
    return 0


cdef inline bint _dims_differ(cnp.ndarray a, cnp.ndarray b):
    """Whether two ndarrays differ in shape (a C compare of their dims)."""
    cdef int k, nd = cnp.PyArray_NDIM(a)
    if nd != cnp.PyArray_NDIM(b):
        return True
    for k in range(nd):
        if cnp.PyArray_DIMS(a)[k] != cnp.PyArray_DIMS(b)[k]:
            return True
    return False


cdef bint _needs_reduction(tuple args, object out, tuple has_grad):
    """Whether some input's shape differs from the output's (so its
    gradient must be summed down in the backward). ``has_grad``: the inputs
    that get a gradient (the others, a scalar operand's 0-d constant, need
    no reduction), or None for all."""
    cdef Tensor t
    cdef object od = (<Tensor>out)._data
    cdef Py_ssize_t j
    if type(od) is not _ndarray:
        return True
    for j in range(len(args)):
        if has_grad is not None and not has_grad[j]:
            continue
        t = <Tensor>args[j]
        if type(t._data) is not _ndarray or _dims_differ(<cnp.ndarray>t._data, <cnp.ndarray>od):
            return True
    return False


cdef inline void _set_dests(GradFn node, tuple args, GradKey key, tuple has_grad):
    cdef Py_ssize_t n = len(args)
    node.nin = n
    if n > 2:
        node.dests = _dests(args, key, has_grad)
        return
    if n > 0 and (has_grad is None or has_grad[0]):
        node.dest0 = _slot_for(<Tensor>args[0], key)
    if n > 1 and (has_grad is None or has_grad[1]):
        node.dest1 = _slot_for(<Tensor>args[1], key)


cdef inline GradSlot _dest(GradFn node, Py_ssize_t j):
    if node.dests is not None:
        return <GradSlot>node.dests[j]
    return node.dest0 if j == 0 else node.dest1


cdef tuple _dests(tuple args, GradKey key, tuple has_grad):
    cdef Py_ssize_t n = len(args)
    cdef tuple res = PyTuple_New(n)
    cdef Py_ssize_t j
    cdef object d
    for j in range(n):
        if has_grad is not None and not has_grad[j]:
            d = None
        else:
            d = _slot_for(<Tensor>args[j], key)
        Py_INCREF(d)
        PyTuple_SET_ITEM(res, j, d)
    return res


cdef bint _older_key_in(object keys, GradKey key):
    if type(keys) is GradKey:
        return False
    for k in keys:
        if (<GradKey>k).priority < key.priority:
            return True
    return False


cdef list _versions_of(CompiledBackward cb, tuple args):
    """Saved inputs that are Parameters (whose buffers optimizers update in
    place): remember their versions."""
    cdef list res = None
    cdef Py_ssize_t n = len(args)
    for i in cb.save_index:
        if <Py_ssize_t>i < n and type(args[i]) is not Tensor:
            if res is None:
                res = []
            res.append((args[i], (<Tensor>args[i])._version))
    return res


cdef list _param_versions(tuple args):
    cdef list res = None
    for a in args:
        if type(a) is not Tensor:
            if res is None:
                res = []
            res.append((a, (<Tensor>a)._version))
    return res


cdef void _check_versions(GradFn node) except *:
    for t, v in node.versions:
        if (<Tensor>t)._version != v:
            raise RuntimeError(
                f"{_op_name(node.op)}: an input of shape {(<Tensor>t)._data.shape} that this op saved "
                f"for backward was modified in place afterwards (version {v} -> {(<Tensor>t)._version}, "
                f"e.g. by an optimizer step); run backward before modifying it")


cdef inline object _io(tuple args, tuple outs, object out0, Py_ssize_t idx):
    """Input or output number ``idx``, counting the inputs first."""
    cdef Py_ssize_t n = len(args)
    if idx < n:
        return args[idx]
    return out0 if outs is None else outs[idx - n]


cdef Tensor _alias(Tensor t):
    # what a second-order backward saves: the value and its history as they
    # are now, in a tensor of its own, since an in-place op later rebinds the
    # user's tensor object (Tensor._reset) and must not change what was saved
    cdef Tensor a = Tensor.__new__(Tensor)
    a._data = t._data
    a._device = t._device
    a._version = t._version
    a._slot = t._slot
    a._more_slots = None if t._more_slots is None else list(t._more_slots)
    return a


cdef tuple _aliases(tuple args):
    return tuple([_alias(<Tensor>a) for a in args])


cdef object _alias_saved(object saved, bint one):
    # what _save kept as the caller's tensor objects, as aliases (_alias)
    if one:
        return _alias(<Tensor>saved)
    return tuple([_alias(<Tensor>v) for v in <tuple>saved])


cdef inline object _save(CompiledBackward cb, tuple args, tuple outs, object out0, bint as_tensors):
    cdef Py_ssize_t n = len(args)
    cdef tuple index = cb.save_index
    cdef Py_ssize_t k, idx, ns = len(index)
    cdef object v
    cdef tuple res
    cdef tuple pre = cb.precomp_index
    if cb.one_saved and pre is None:
        idx = <Py_ssize_t>index[0]
        v = _io(args, outs, out0, idx)
        return v if as_tensors else (<Tensor>v)._data
    if pre is None:
        res = PyTuple_New(ns)
        for k in range(ns):
            idx = <Py_ssize_t>index[k]
            v = _io(args, outs, out0, idx)
            if not as_tensors:
                v = (<Tensor>v)._data
            Py_INCREF(v)
            PyTuple_SET_ITEM(res, k, v)
        return res
    cdef list vals = []
    for k in range(ns):
        idx = <Py_ssize_t>index[k]
        v = _io(args, outs, out0, idx)
        vals.append(v if as_tensors else (<Tensor>v)._data)
    # the precomp part: what is read only for its shape is kept as a carrier
    for k in range(len(pre)):
        idx = <Py_ssize_t>pre[k]
        v = shape_carrier((<Tensor>(_io(args, outs, out0, idx)))._data)
        vals.append(_wrap(v, (<Tensor>args[0])._device) if as_tensors else v)
    return vals[0] if cb.one_saved else tuple(vals)


@cython.final
@cython.freelist(256)
cdef class _RuleBackward:
    """What a rule's node saves: the user's backward function and what
    running it needs (the node's CompiledBackward is shared, see _rule_cb)."""
    cdef object op, fn, device
    cdef Py_ssize_t nin
    cdef bint one


cdef _RuleBackward _rule_saved(op, fn, device, Py_ssize_t nin, Py_ssize_t nout):
    cdef _RuleBackward rb = _RuleBackward.__new__(_RuleBackward)
    rb.op, rb.fn, rb.device, rb.nin, rb.one = op, fn, device, nin, nout == 1
    return rb


def _rule_run_tensor(_RuleBackward rb, grads):
    """A user's backward on Tensors (recorded by older keys): checked."""
    res = _check_user_grads(rb.op, rb.fn(grads) if rb.one else rb.fn(*grads), rb.nin)
    return res[0] if rb.nin == 1 else res


def _rule_run_raw(_RuleBackward rb, grads):
    """A user's backward in raw mode: arrays wrapped in, checked, unwrapped out."""
    if rb.one:
        grads = (grads,)
    res = rb.fn(*[None if g is None else _wrap(g, rb.device) for g in grads])
    res = tuple([None if g is None else (<Tensor>g)._data for g in _check_user_grads(rb.op, res, rb.nin)])
    return res[0] if rb.nin == 1 else res


cdef CompiledBackward _rule_cb(str kind):
    """The backward of every node whose rule gave ``fn(*output_grads)``
    (paths 1 and 2), one per kind: its saved value is the node's
    _RuleBackward (kept as given, like saved Tensors); its gradients come
    back in the inputs' shapes or their broadcast shape, summed centrally
    like a graph's."""
    cdef CompiledBackward cb = CompiledBackward.__new__(CompiledBackward)
    cb.run_raw = _rule_run_raw
    cb.run_tensor = _rule_run_tensor
    cb.save_index = ()
    cb.one_saved = True
    cb.any_grad = True
    cb.reduce_broadcast = True
    cb.user_fn = True
    cb.kind = kind
    return cb


cdef CompiledBackward _OWN_RULE_CB = _rule_cb("_grad_rule")
cdef CompiledBackward _REGISTERED_RULE_CB = _rule_cb("registered rule")


# ---------------------------------------------------------------- backward
cdef bint _reducible(tuple gs, tuple shape):
    """Whether a gradient of shape ``gs`` sums down to ``shape`` (leading
    axes, and axes where ``shape`` has 1)."""
    cdef Py_ssize_t lead = len(gs) - len(shape), i
    if lead < 0:
        return False
    for i in range(len(shape)):
        if shape[i] != gs[i + lead] and shape[i] != 1:
            return False
    return True


cdef object _sum_to_raw(op, object g, tuple shape, Py_ssize_t j=-1, object in_shapes=None):
    cdef tuple gs = g.shape
    if gs == shape:
        return g
    if not _reducible(gs, shape):
        raise _shape_error(op, g, shape, j, in_shapes)
    cdef Py_ssize_t lead = len(gs) - len(shape), i
    axes = list(range(lead))
    for i in range(len(shape)):
        if shape[i] == 1 and gs[i + lead] != 1:
            axes.append(i + lead)
    r = g.sum(axis=tuple(axes))
    if type(r) is not _ndarray and type(r) is not _device_array:
        r = _np_asarray(r)
    return r.reshape(shape)


cdef object _shape_error(op, g, shape, Py_ssize_t j=-1, object in_shapes=None):
    which = f"input {j}" if j >= 0 else "an input"
    return ValueError(f"{_op_name(op)}: backward returned a gradient of shape {tuple(g.shape)} "
                      f"for {which} of shape {tuple(shape)}{_expected_shapes(shape, in_shapes)}")


cdef str _expected_shapes(shape, in_shapes):
    # (errors only) what a gradient may be: a reduction over broadcast inputs whose
    # gradient is merely broadcastable (dy[..., None] * x) needs telling which shape
    try:
        full = tuple(_np_broadcast_shapes(*in_shapes)) if in_shapes else tuple(shape)
    except Exception:
        full = tuple(shape)
    if full == tuple(shape):
        return ": return it in that shape"
    return (f": return it in that shape or in the inputs' broadcast shape {full}, which the core sums "
            f"down; one that only broadcasts to {full} is not expanded: broadcast it first "
            f"(`g * x + F.zeros_like(x * w)` for inputs x and w)")


cdef void _check_reducible(GradFn node, object g, Py_ssize_t j) except *:
    """A gradient not of its input's shape is summed down to it when the
    backward returns gradients in the broadcast shape: a graph's that says
    so, or a user's function whose gradient has the inputs' broadcast shape."""
    cdef CompiledBackward cb = node.backward
    if not cb.reduce_broadcast or (cb.user_fn and tuple(g.shape) != _np_broadcast_shapes(*node.in_shapes)):
        raise _shape_error(node.op, g, node.in_shapes[j], j, node.in_shapes if cb.reduce_broadcast else None)


cdef void _settle2(object a, object b) except *:
    # (out of line: the accumulation inlined into every backward step stays small)
    _h_pending.settle(a)
    _h_pending.settle(b)


cdef void _before_node(GradFn node, object grads) except *:
    _h_pending.before_node(grads, node.backward.passthrough is None)


cdef inline void _acc_raw(GradSlot s, object g):
    if s.grad is None:
        s.grad = g
        s.owned = False
        return
    if GC_RARELY(_n_pending != 0):
        # adding reads both gradients: a deferred one is completed first
        _settle2(s.grad, g)
    if s.owned:
        _np_add(s.grad, g, out=s.grad)
    else:
        r = s.grad + g
        if type(r) is not _ndarray and type(r) is not _device_array:
            r = _np_asarray(r)
        s.grad = r
        s.owned = True


cdef inline void _acc_tensor(GradSlot s, object g):
    if s.grad is None:
        s.grad = g
    else:
        s.grad = _apply(_h_add, (s.grad, g))[0]


cdef void _fire(GradSlot s, bint tensor_mode, object device, list kept) except *:
    g = s.grad
    s.owned = False
    if s.made_by_attach:
        s.grad = None
    else:
        # an attached intermediate: the op that made it still reads this
        # gradient to carry it further back (MegEngine's semantics)
        kept.append(s)
    if g is None or s.callback is None:
        return
    if GC_RARELY(_n_pending != 0):
        # the gradient leaves the core (a callback, the user): completed first
        _h_pending.settle(g)
    # backward graphs are trusted per node (standard and plugin ops alike, so
    # both cost the same); a wrongly shaped gradient is caught here, at the
    # tensor it would land on
    shape = (<Tensor>g)._data.shape if tensor_mode else g.shape
    if s.shape is not None and shape != s.shape:
        raise ValueError(f"{s.key.name}: the gradient for an attached tensor of shape {s.shape} "
                         f"has shape {shape}: an op's backward returned a wrongly shaped gradient "
                         f"(gradcore.testing.check_op finds which)")
    if not tensor_mode:
        # on the attached tensor's (logical) device, not the consuming op's (a Copy's target)
        g = _wrap(g, device if s.device is None else s.device)
    s.callback(g)


cdef object _check_user_grads(op, res, Py_ssize_t n):
    """Validate the count and kind of what a user backward (paths 1 and 2)
    returned; shapes are checked where the gradients land (_check_reducible)."""
    if res is None or isinstance(res, Tensor):
        res = (res,)
    elif isinstance(res, list):
        res = tuple(res)
    elif not isinstance(res, tuple):
        raise TypeError(f"{_op_name(op)}: backward must return a Tensor, None or a tuple of them, "
                        f"got {type(res).__name__}")
    if len(res) != n:
        raise ValueError(f"{_op_name(op)}: backward returned {_count(len(res), 'gradient')} for "
                         f"{_count(n, 'input')}")
    for i in range(n):
        g = res[i]
        if g is None:
            continue
        if not isinstance(g, Tensor):
            raise TypeError(f"{_op_name(op)}: gradient {i} returned by backward is a "
                            f"{type(g).__name__}, expected a Tensor or None")
    return res


cdef inline object _node_grads(GradFn node, bint tensor_mode):
    """Collect the node's output gradients (the gradient itself for a node
    with one output, else a tuple, zero-filling the missing ones for backward
    graphs) and empty its slots. None: no gradient arrived."""
    cdef GradSlot s
    cdef list grads = []
    cdef bint any_g = False
    cdef Py_ssize_t i
    if node.slot0 is not None:
        s = node.slot0
        g = s.grad
        if g is None:
            return None
        s.grad = None
        s.owned = False
        return g
    for i in range(len(node.slots)):
        s = <GradSlot>node.slots[i]
        g = s.grad
        s.grad = None
        s.owned = False
        if g is not None:
            any_g = True
        grads.append(g)
    if not any_g:
        return None
    if node.out_meta is not None and not node.backward.user_fn:
        for i in range(len(grads)):
            if grads[i] is None:
                shape, dtype = node.out_meta[i]
                z = _np_zeros(shape, dtype) if node.device is CPU or node.device == CPU else \
                    _h_getattr("_zeros_on")(shape, dtype, node.device)
                grads[i] = _wrap(z, node.device) if tensor_mode else z
    return tuple(grads)


cdef object _run_node(GradFn node, object grads, bint tensor_mode):
    """Run a node's backward: the input gradient itself for a node with one
    input, else a tuple of them."""
    cdef CompiledBackward cb = node.backward
    cdef Py_ssize_t n = node.nin
    cdef Py_ssize_t k
    cdef bint one = node.slot0 is not None
    if cb.passthrough is not None:
        if n == 1:
            return None if <Py_ssize_t>cb.passthrough[0] < 0 else (grads if one else grads[<Py_ssize_t>cb.passthrough[0]])
        res = PyTuple_New(n)
        for k in range(n):
            if <Py_ssize_t>cb.passthrough[k] < 0:
                v = None
            else:
                v = grads if one else grads[<Py_ssize_t>cb.passthrough[k]]
            Py_INCREF(v)
            PyTuple_SET_ITEM(res, k, v)
        return res
    saved = node.saved
    if node.versions is not None:
        _check_versions(node)
    if tensor_mode:
        if not node.saved_tensors:
            saved = _wrap(saved, node.device) if cb.one_saved else \
                tuple([_wrap(v, node.device) for v in saved])
        return cb.run_tensor(saved, grads)
    if node.saved_tensors:
        saved = _unwrap(saved) if cb.one_saved else tuple([_unwrap(v) for v in saved])
    if cb.prog_kernels is not None:
        return _run_prog(cb, saved, grads)
    return cb.run_raw(saved, grads)


cdef object _run_prog(CompiledBackward cb, object saved, object grads):
    """What ``cb.run_raw(saved, grads)`` computes, without its Python frame:
    each kernel is called by vectorcall on borrowed references from a
    register list (see gradcore.graph._program for the encoding)."""
    cdef list regs = cb.prog_regs[:]
    cdef const unsigned char* code = cb.prog_code
    cdef const unsigned char* ret = cb.prog_ret
    cdef PyObject* argv[4]
    cdef Py_ssize_t k, j, nargs, nk = cb.n_kept, n_ret = len(cb.prog_ret)
    cdef unsigned char r
    if cb.one_saved:
        regs[0] = saved
    else:
        for k in range(nk):
            regs[k] = (<tuple>saved)[k]
    if cb.n_out == 1:
        regs[nk] = grads
    else:
        for k in range(cb.n_out):
            regs[nk + k] = (<tuple>grads)[k]
    for k in range(len(cb.prog_kernels)):
        nargs = code[0]
        for j in range(nargs):
            argv[j] = PyList_GET_ITEM(regs, code[2 + j])
        r = code[5]
        if r != 255 and type(regs[r]) is _ndarray:
            # a dead intermediate of the right shape and dtype: write into it
            argv[nargs] = PyList_GET_ITEM(regs, r)
            nargs += 1
        regs[code[1]] = PyObject_Vectorcall(cb.prog_kernels[k], argv, nargs, NULL)
        code += 6
    if n_ret == 1:
        return None if ret[0] == 255 else regs[ret[0]]
    res = PyTuple_New(n_ret)
    for k in range(n_ret):
        v = None if ret[k] == 255 else regs[ret[k]]
        Py_INCREF(v)
        PyTuple_SET_ITEM(res, k, v)
    return res


cdef inline object _unwrap(object v):
    return (<Tensor>v)._data if isinstance(v, Tensor) else v


cdef bint _shape_differs(object a, object b):
    """Whether arrays ``a`` and ``b`` differ in shape (C compare for ndarrays)."""
    if a is b:
        return False
    if type(a) is _ndarray and type(b) is _ndarray:
        return _dims_differ(<cnp.ndarray>a, <cnp.ndarray>b)
    return tuple(a.shape) != tuple(b.shape)


cdef void _backward_step(GradFn node, bint tensor_mode, list kept) except *:
    """Run one node's backward: its gradients go to its input slots, and an
    attached tensor whose last producer this was gets its callback."""
    cdef GradSlot s
    cdef Py_ssize_t j, nd
    cdef bint like_output
    grads = _node_grads(node, tensor_mode) if node.reaches else None
    if grads is not None:
        # an op whose gradients may come back broadcast, recorded with every
        # input that gets a gradient in its output's shape (no in_shapes):
        # each gradient must have that shape. A wrong one is the op's
        # backward's mistake, named here, not broadcast silently further on
        like_output = node.in_shapes is None and node.slot0 is not None and node.backward.reduce_broadcast
        if GC_RARELY(_n_pending != 0):
            # a deferred gradient is completed before a backward reads it; a
            # node that only routes its gradient on (passthrough) leaves it in flight
            _before_node(node, grads)
        res = _run_node(node, grads, tensor_mode)
        nd = node.nin
        if _anomaly:
            if GC_RARELY(_n_pending != 0):
                _h_pending.settle(res)
            _h_anomaly.check(node.op, node.debug_info, res, nd)
        if nd != 1 and len(res) != nd:
            raise ValueError(f"{_op_name(node.op)}: backward returned {_count(len(res), 'gradient')} "
                             f"for {_count(nd, 'input')}")
        for j in range(nd):
            d = _dest(node, j)
            if d is None:
                continue
            g = res if nd == 1 else res[j]
            if g is None:
                continue
            if tensor_mode:
                if node.in_shapes is not None and (<Tensor>g)._data.shape != node.in_shapes[j]:
                    _check_reducible(node, g._data, j)
                    if not _reducible(g._data.shape, node.in_shapes[j]):
                        # else SumTo's own error, naming SumTo rather than the op whose backward it is
                        raise _shape_error(node.op, g._data, node.in_shapes[j], j, node.in_shapes)
                    g = _h_sum_to(g, node.in_shapes[j])
                elif like_output and _shape_differs((<Tensor>g)._data, (<Tensor>grads)._data):
                    raise _shape_error(node.op, (<Tensor>g)._data, (<Tensor>grads)._data.shape, j)
                _acc_tensor(<GradSlot>d, g)
            else:
                if node.in_shapes is not None and g.shape != node.in_shapes[j]:
                    _check_reducible(node, g, j)
                    if GC_RARELY(_n_pending != 0):
                        _h_pending.settle(g)
                    g = _sum_to_raw(node.op, g, node.in_shapes[j], j, node.in_shapes)
                elif like_output and _shape_differs(g, grads):
                    raise _shape_error(node.op, g, grads.shape, j)
                _acc_raw(<GradSlot>d, g)
    for j in range(node.nin):
        s = _dest(node, j)
        if s is not None:
            s.pending -= 1
            if s.pending == 0 and s.leaf:
                _fire(s, tensor_mode, node.device, kept)


cdef object _heappush = heapq.heappush
cdef object _heappop = heapq.heappop


cdef inline tuple _outputs_of(GradFn node):
    return (node.slot0,) if node.slot0 is not None else node.slots


cdef void _ordered_walk(list tape, Py_ssize_t nt, bint tensor_mode, list kept) except *:
    """The backward when some node has a priority: among the nodes whose
    gradients are complete (every consumer of their outputs has run), the
    highest priority first, then the latest recorded. A node's priority is
    raised to that of any node it was computed from, so the path from the
    outputs down to a raised node is raised too and its backward starts as
    soon as it can. With every priority 0 this is the reverse walk."""
    cdef dict owner = {}            # id(output slot) -> index of its node on the tape
    cdef list effective = [0] * nt
    cdef list remaining = [0] * nt  # outputs of each node still waiting for gradients
    cdef list ready = []
    cdef GradFn node
    cdef GradSlot s
    cdef Py_ssize_t i, j, k, waiting
    cdef long p
    for i in range(nt):
        node = <GradFn>tape[i]
        p = node.priority
        for j in range(node.nin):
            s = _dest(node, j)
            if s is not None:
                k = owner.get(id(s), -1)
                if k >= 0 and <long>effective[k] > p:
                    p = effective[k]
        effective[i] = p
        waiting = 0
        for o in _outputs_of(node):
            owner[id(o)] = i
            if (<GradSlot>o).pending > 0:
                waiting += 1
        remaining[i] = waiting
        if waiting == 0:
            _heappush(ready, (-p, -node.seq, i))
    while ready:
        i = _heappop(ready)[2]
        node = <GradFn>tape[i]
        tape[i] = None
        _backward_step(node, tensor_mode, kept)
        for j in range(node.nin):
            s = _dest(node, j)
            if s is not None and s.pending == 0:
                k = owner.pop(id(s), -1)
                if k >= 0:
                    remaining[k] = <Py_ssize_t>remaining[k] - 1
                    if remaining[k] == 0:
                        _heappush(ready, (-<long>effective[k], -(<GradFn>tape[k]).seq, k))


cdef void _run_backward(GradKey key, list ys, list dys) except *:
    cdef GradFn node
    cdef GradSlot s
    cdef Tensor y
    cdef Py_ssize_t i, j, nd, nt
    cdef list tape
    cdef _ThreadState ts = _ts()
    if len(ys) != len(dys):
        raise ValueError(f"{key.name}: got {len(ys)} outputs but {len(dys)} output gradients")
    if key.state != 1:
        raise RuntimeError(f"{key.name}: backward on a Grad that is not recording "
                           f"(it was released or never entered)")
    if key.ran_backward:
        raise RuntimeError(f"{key.name}: backward was already called for this recording; "
                           f"record again to compute new gradients")
    # claimed: from the check above to reading the tape's length, no point
    # where the GIL can change hands, so two threads never walk one tape and
    # a node linked in another thread is either on it whole or not at all
    key.ran_backward = True
    key.in_backward = True
    tape = key.tape
    nt = len(tape)

    # an older key still recording this thread's ops sees this backward:
    # run it on Tensors
    cdef bint tensor_mode = False
    for k in _recording:
        if k is not key and _key_records(<GradKey>k, ts) and (<GradKey>k).priority < key.priority:
            tensor_mode = True
            break

    cdef list roots = []
    cdef list kept = []
    cdef long saved_visible = ts.visible_below
    cdef bint saved_raw = ts.raw_backward
    ts.raw_backward = not tensor_mode
    try:
        # (reachability and pending producer counts were set when each node
        # was recorded: _link)
        # seed the output gradients
        for i in range(len(ys)):
            y = ys[i]
            if not isinstance(y, Tensor):
                raise TypeError(f"{key.name}: backward outputs must be Tensors, got {type(y).__name__}")
            s = _slot_for(y, key)
            if s is None:
                continue
            dy = dys[i]
            if dy is None:
                dy = _wrap(_ones_like(y._data), y._device)
            elif not isinstance(dy, Tensor):
                dy = Tensor(dy, dtype=y._data.dtype, device=y._device)
            if (<Tensor>dy)._data.shape != y._data.shape:
                raise ValueError(f"{key.name}: output gradient of shape {(<Tensor>dy)._data.shape} "
                                 f"for an output of shape {y._data.shape}")
            if tensor_mode:
                _acc_tensor(s, dy)
            else:
                _acc_raw(s, (<Tensor>dy)._data)
            if s.leaf and s.pending == 0:
                roots.append((s, y._device))
        # an attached output gets its gradient before the op that made it
        # reads it (and carries it on)
        for s, device in roots:
            _fire(s, tensor_mode, device, kept)
        ts.visible_below = key.priority
        if key.prioritized:
            _ordered_walk(tape, nt, tensor_mode, kept)
        else:
            # reverse walk: the order of a backward without priorities
            for i in range(nt - 1, -1, -1):
                node = <GradFn>tape[i]
                tape[i] = None
                _backward_step(node, tensor_mode, kept)
                # the tape held the only reference: the node and what it saved
                # are freed here, back to the pool
        if GC_RARELY(_n_pending != 0):
            # nothing leaves a backward in flight: what no node read (a
            # gradient nobody needs) is completed here
            _h_pending.settle_all(None)
    except BaseException as exc:
        if GC_RARELY(_n_pending != 0):
            # a backward that fails leaves no request behind (an MPI request
            # left in flight hangs the next collective or the exit); the
            # registry waits for them, keeps quiet about its own errors and
            # the original exception goes on
            _h_pending.settle_all(exc)
        raise
    finally:
        ts.raw_backward = saved_raw
        ts.visible_below = saved_visible
        for s in kept:
            s.grad = None
        for o in key.tape:
            if o is not None:
                (<GradFn>o).clear()
        key.tape = []
        key.in_backward = False


# ---------------------------------------------------------------- array helpers
cdef object _np_empty = np.empty
cdef object _ZERO_BUF = np.zeros(16, np.uint8)


cdef dict _carriers = {}


def shape_carrier(object arr):
    """A zero-stride array with ``arr``'s shape and dtype that holds one
    element: what a backward graph keeps of a tensor it reads only the shape
    of. Read-only, so equal ones are shared."""
    if type(arr) is not _ndarray and type(arr) is _device_array:
        return arr.backend.shape_only(arr.shape, arr.dtype)
    key = (arr.shape, arr.dtype)
    c = _carriers.get(key)
    if c is None:
        shape = arr.shape
        c = _ndarray(shape, arr.dtype, _ZERO_BUF, 0, (0,) * len(shape))
        c.flags.writeable = False
        if len(_carriers) > 1024:
            _carriers.clear()
        _carriers[key] = c
    return c



cdef dict _ones_cache = {}


cdef object _ones_like(object arr):
    """Ones shaped like ``arr`` (the default output gradient); small ones are
    cached read-only (a seed is never written: slots do not own it)."""
    if type(arr) is not _ndarray:
        return _h_getattr("_ones_on")(arr)
    key = (arr.shape, arr.dtype)
    out = _ones_cache.get(key)
    if out is not None:
        return out
    out = _np_empty(arr.shape, arr.dtype)
    out.fill(1)
    if out.size <= 256:
        out.flags.writeable = False
        if len(_ones_cache) > 256:
            _ones_cache.clear()
        _ones_cache[key] = out
    return out


def broadcast_view(object arr, tuple shape):
    """A read-only zero-stride view of ``arr`` broadcast to ``shape`` (what
    ``np.broadcast_to`` returns, without its Python overhead).

    Example::

        >>> broadcast_view(np.float32(2.0), (2, 3)).strides
        (0, 0)
    """
    return _broadcast_view(arr, shape)


def broadcast_like(object arr, object ref):
    """``broadcast_view(arr, ref.shape)``: the CPU kernel of a full sum's
    backward (no Python frame per call).

    Example::

        >>> broadcast_like(np.float32(1.0), np.zeros((2, 3))).shape
        (2, 3)
    """
    return _broadcast_view(arr, ref.shape)


cdef object _broadcast_view(object arr, tuple shape):
    if type(arr) is not _ndarray:
        arr = _np_asarray(arr)
    cdef cnp.ndarray a = <cnp.ndarray>arr
    cdef int nd = cnp.PyArray_NDIM(a)
    cdef Py_ssize_t want_nd = len(shape)
    cdef Py_ssize_t lead = want_nd - nd
    cdef Py_ssize_t k
    cdef cnp.npy_intp have, want
    if lead < 0:
        raise ValueError(f"cannot broadcast shape {arr.shape} to {shape}")
    strides = [0] * want_nd
    same = lead == 0
    for k in range(nd):
        have = cnp.PyArray_DIMS(a)[k]
        want = shape[lead + k]
        if have == want:
            strides[lead + k] = cnp.PyArray_STRIDES(a)[k]
        elif have == 1:
            same = False
        else:
            raise ValueError(f"cannot broadcast shape {arr.shape} to {shape}")
    if same:
        return arr
    if want_nd > 32:
        out = np.broadcast_to(arr, shape)
        out.flags.writeable = False
        return out
    # built with the C API: the ndarray constructor and the flags setter
    # cost more than the rest of a small reduction's backward
    cdef cnp.npy_intp dims[32]
    cdef cnp.npy_intp st[32]
    for k in range(want_nd):
        dims[k] = shape[k]
        st[k] = strides[k]
    cdef PyObject* descr = <PyObject*>cnp.PyArray_DESCR(a)
    Py_INCREF(<object>descr)    # PyArray_NewFromDescr steals it
    out = PyArray_NewFromDescr(<PyObject*>_ndarray, descr, <int>want_nd, dims, st,
                               cnp.PyArray_DATA(a), 0, NULL)
    cnp.set_array_base(<cnp.ndarray>out, arr)
    cnp.PyArray_CLEARFLAGS(<cnp.ndarray>out, cnp.NPY_ARRAY_WRITEABLE)
    return out


# ---------------------------------------------------------------- misc
def _no_record_enter():
    """Stop recording the calling thread's ops (nests; undo with _no_record_exit)."""
    cdef _ThreadState ts = _ts()
    ts.no_record += 1


def _no_record_exit():
    cdef _ThreadState ts = _ts()
    ts.no_record -= 1


def _debug_state():
    """Internal counters, for tests: the keys recording in every thread, and
    the calling thread's counters."""
    cdef _ThreadState ts = _ts()
    return {"recording": len(_recording), "no_record": ts.no_record,
            "visible_below": ts.visible_below, "front_cache": len(_bw_front)}


def _clear_front_cache():
    _bw_front.clear()


def _recorded_graph(Tensor y, tuple named=()):
    """What gradcore.visualize draws: for each live recording of ``y``,
    (key name, y's slot id, nodes, leaf slot ids, slot ids of ``named``);
    a node is (seq, op, gradient path (gradcore.op.GRAD_PATHS), input slot ids, output slot ids, in_shapes,
    out_meta, (save_index, saved, one_saved) or None, debug_info). Slot ids
    are only compared with each other."""
    res = []
    cdef GradFn node
    cdef GradSlot d
    cdef GradKey key
    cdef CompiledBackward cb
    for s in _slots_of(y):
        key = (<GradSlot>s).key
        if key.state != 1:
            continue
        nodes = []
        for n in key.tape:
            if n is None:
                continue
            node = <GradFn>n
            ins = []
            for j in range(node.nin):
                d = _dest(node, j)
                ins.append(None if d is None else id(d))
            outs = (id(node.slot0),) if node.slot0 is not None else tuple([id(o) for o in node.slots])
            cb = node.backward
            saved = None if cb.user_fn else (cb.save_index, node.saved, cb.one_saved)
            nodes.append((node.seq, node.op, cb.kind, tuple(ins), outs, node.in_shapes, node.out_meta,
                          saved, node.debug_info))
        named_ids = []
        for t in named:
            d = _slot_for(<Tensor>t, key)
            named_ids.append(None if d is None else id(d))
        res.append((key.name, id(s), nodes, [id(l) for l in key.leaves], named_ids))
    return res
