# Op construction's fast path (gradcore/_op_intern.pyx).
#
# Contract:
#   - ``OpMeta`` is the metaclass of ``gradcore.op.Op``. ``Cls(*args, **kwargs)``
#     returns the instance remembered for the same class and the same
#     arguments (equal values of the same types, keywords in the same order)
#     when there is one, running no Python code; otherwise it calls the hook
#     installed with ``install(construct, describe)``: ``construct(cls, args, kwargs)``
#     builds, seals and interns the op, and may ``remember(cls, args, kwargs,
#     op, limit)`` it.
#   - A call with an unhashable argument is never remembered; it always
#     reaches the hook (which may still intern the op by value).
#   - Every class OpMeta creates is called through vectorcall (the same
#     answers as ``OpMeta.__call__``, which star-argument calls reach): a
#     positional call with the very argument objects of the class's last
#     remembered positional call returns that instance after an identity
#     check, with no allocation.
#   - ``forget_all()`` forgets everything (``gradcore.op.clear_interned``).
#   - Every class OpMeta creates is described by ``describe(cls)`` when it is
#     defined: gradcore.op's OpDescription.
#   - Nothing here knows what an op is; the hook decides what is remembered.
#
# (Nothing cimports this module, so it has no .pxd; Cython directives are
# set in setup.py, for every compiled module at once.)
"""Op construction's fast path: ``Cls(*args)`` for an op class is a table
lookup in C when an equal op was built before (the contract is in the
comment above). Building, sealing and interning a new op is plain Python, in
``gradcore.op._construct``; this module only remembers its answers.

Example::

    >>> Scale(3.0) is Scale(3.0)      # the second call runs no Python code
    True
"""

# cls -> the instance built without arguments
cdef dict _no_arg = {}
# cls -> {args: (instance, type of each argument)}, for positional calls
cdef dict _by_args = {}
# cls -> {(args, types, keyword items): instance}, for calls with keywords and
# positional calls whose arguments equal an entry of _by_args of other types
cdef dict _by_call = {}
cdef object _construct = None
cdef object _describe = None      # gradcore.op._describe: the class's OpDescription


cdef tuple _typed_key(tuple args, dict kwargs):
    """The arguments, their types and the keyword items: Scale(k=3) and
    Scale(k=3.0) are equal arguments but may build different ops."""
    cdef list types = [type(a) for a in args]
    if kwargs:
        for v in kwargs.values():
            types.append(type(v))
        return (args, tuple(types), tuple(kwargs.items()))
    return (args, tuple(types), ())


cdef object _typed_lookup(cls, tuple args, dict kwargs):
    """The instance remembered in _by_call for this call, or None."""
    cdef dict table = _by_call.get(cls)
    if table is None:
        return None
    try:
        return table.get(_typed_key(args, kwargs))
    except TypeError:                  # an unhashable argument (a list)
        return None


cdef inline bint _same_types(tuple entry, tuple args):
    """Whether ``args`` have the types remembered in ``entry`` (after the
    instance): Scale(3) and Scale(3.0) are equal arguments of other types."""
    cdef Py_ssize_t i
    for i in range(len(args)):
        if type(args[i]) is not entry[i + 1]:
            return False
    return True


cdef object _call(cls, tuple args, dict kwargs, bint* by_args=NULL):
    """``cls(*args, **kwargs)``: the remembered instance, else the construct
    hook's; ``by_args[0]`` says whether _by_args answered (then the arguments
    are hashable and of the remembered types)."""
    cdef dict table
    cdef tuple entry = None
    if kwargs:
        hit = _typed_lookup(cls, args, kwargs)
    elif not args:
        hit = _no_arg.get(cls)
    else:
        hit = None
        table = _by_args.get(cls)
        if table is not None:
            try:
                entry = table.get(args)
            except TypeError:              # an unhashable argument (a list)
                pass
            if entry is not None:
                if _same_types(entry, args):
                    if by_args is not NULL:
                        by_args[0] = True
                    return entry[0]
                hit = _typed_lookup(cls, args, kwargs)     # Scale(3) after Scale(3.0)
    if hit is not None:
        return hit
    return _construct(cls, args, kwargs)


# ---- vectorcall: ``Scale(3.0)`` from Python code reaches _vectorcall with the
# arguments in an array (no tuple, no dict, no argument parsing); the common
# case, the same argument objects as the class's last positional call (a
# constant such as 3.0 is one object), needs no allocation nor hashing at all.
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF


cdef extern from *:
    """
    static void gc_opmeta_enable_vectorcall(PyObject* meta) {
        PyTypeObject* t = (PyTypeObject*)meta;
        t->tp_vectorcall_offset = offsetof(PyTypeObject, tp_vectorcall);
        t->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
    }
    static void gc_opmeta_set_vectorcall(PyObject* cls, void* f) {
        ((PyTypeObject*)cls)->tp_vectorcall = (vectorcallfunc)f;
    }
    """
    void gc_opmeta_enable_vectorcall(object meta)
    void gc_opmeta_set_vectorcall(object cls, void* f)
    Py_ssize_t PyVectorcall_NARGS(size_t nargsf)
    object PyTuple_New(Py_ssize_t n)
    void PyTuple_SET_ITEM(object t, Py_ssize_t i, object v)   # steals: the caller increfs
    Py_ssize_t PyTuple_GET_SIZE(object t)
    PyObject* PyTuple_GET_ITEM(object t, Py_ssize_t i)

# cls -> [instance, the argument tuple of its last positional call that
# _by_args answered]: the next call with the very same objects is that
# instance. A list, updated in place: no allocation when the objects change
cdef dict _last_args = {}


cdef tuple _args_tuple(PyObject** argv, Py_ssize_t n):
    args = PyTuple_New(n)
    for i in range(n):
        Py_INCREF(<object>argv[i])
        PyTuple_SET_ITEM(args, i, <object>argv[i])
    return args


cdef PyObject* _vectorcall(PyObject* cls_ptr, PyObject** argv, size_t nargsf, PyObject* kwnames) except NULL:
    cdef object cls = <object>cls_ptr
    cdef Py_ssize_t n = PyVectorcall_NARGS(nargsf), i, nkw
    cdef object result
    cdef list last
    cdef tuple last_args
    cdef bint by_args = False
    if kwnames is NULL:
        if n == 0:
            result = _no_arg.get(cls)
            if result is None:
                result = _construct(cls, (), {})
        else:
            result = None
            last = _last_args.get(cls)
            if last is not None:
                last_args = <tuple>last[1]
                if PyTuple_GET_SIZE(last_args) == n:
                    for i in range(n):
                        if PyTuple_GET_ITEM(last_args, i) != argv[i]:
                            break
                    else:
                        result = last[0]
            if result is None:
                args = _args_tuple(argv, n)
                result = _call(cls, args, {}, &by_args)
                if by_args:
                    if last is None:
                        _last_args[cls] = [result, args]
                    else:
                        last[0] = result
                        last[1] = args
    else:
        nkw = PyTuple_GET_SIZE(<object>kwnames)
        args = _args_tuple(argv, n)
        kwargs = {}
        for i in range(nkw):
            kwargs[<object>PyTuple_GET_ITEM(<object>kwnames, i)] = <object>argv[n + i]
        result = _call(cls, args, kwargs)
    Py_INCREF(result)
    return <PyObject*>result


cdef class OpMeta(type):
    """The metaclass of ``gradcore.op.Op``: it describes every op class when
    it is defined (``gradcore.op.describe``), and constructing an op returns
    the one instance equal to it (interned), so per-op caches are hit when
    an op is constructed per call, as in ``MyOp()(x)`` or ``Scale(3.0)(x)``."""

    def __init__(cls, *args, **kwargs):
        super().__init__(*args, **kwargs)
        gc_opmeta_set_vectorcall(cls, <void*>_vectorcall)
        if _describe is not None:
            _describe(cls)

    def __call__(cls, *args, **kwargs):
        return _call(cls, args, kwargs)


gc_opmeta_enable_vectorcall(OpMeta)


def install(construct, describe) -> None:
    """Set the function that builds an op on a table miss,
    ``construct(cls, args, kwargs)``, and the one that describes an op
    class, ``describe(cls)``."""
    global _construct, _describe
    _construct = construct
    _describe = describe


def remember(cls, tuple args, dict kwargs, inst, Py_ssize_t limit) -> None:
    """Answer ``cls(*args, **kwargs)`` with ``inst`` from now on. A class's
    table is emptied when it holds more than ``limit`` entries; a call with
    an unhashable argument is not remembered."""
    if not args and not kwargs:
        _no_arg[cls] = inst
        return
    try:
        if not kwargs:
            table = _table(_by_args, cls, limit)
            entry = table.get(args)
            if entry is None or _same_types(entry, args):
                table[args] = (inst,) + tuple([type(a) for a in args])
                return
            # equal arguments of other types than the entry's: kept by type
        _table(_by_call, cls, limit)[_typed_key(args, kwargs)] = inst
    except TypeError:                  # an unhashable argument
        pass


cdef dict _table(dict tables, cls, Py_ssize_t limit):
    cdef dict table = tables.get(cls)
    if table is None:
        table = tables[cls] = {}
    elif len(table) > limit:
        table.clear()
    return table


def forget_all() -> None:
    """Forget every remembered instance (``gradcore.op.clear_interned``)."""
    _last_args.clear()
    _no_arg.clear()
    _by_args.clear()
    _by_call.clear()
