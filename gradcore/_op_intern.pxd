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

cdef class OpMeta(type):
    pass
