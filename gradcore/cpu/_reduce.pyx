"""Full sums and means of small contiguous float arrays (``F.sum(loss)``,
``F.mean(loss)``): the same additions in the same order as NumPy's pairwise
summation, so the same bits, without the ufunc machinery, which costs more
than the additions below a few thousand elements (7,400 instructions for 16
floats, against ~600 here). Anything else goes to NumPy.

Example::

    >>> from gradcore.cpu._reduce import full_sum
    >>> full_sum(np.arange(4, dtype=np.float32))
    array(6., dtype=float32)
"""
cimport numpy as cnp
import numpy as np

cnp.import_array()

ctypedef fused real:
    float
    double

cdef enum:
    # NumPy's pairwise summation adds blocks of up to this many elements
    # with eight running sums, and halves longer runs
    _BLOCK = 128
    # above this the additions cost more than NumPy's call: NumPy does it
    _SMALL = 4096

cdef object _np_sum = np.add.reduce
cdef object _np_mean = np.mean


cdef real _pairwise(const real* a, Py_ssize_t n) noexcept nogil:
    cdef real res, r0, r1, r2, r3, r4, r5, r6, r7
    cdef Py_ssize_t i, half
    if n < 8:
        res = 0
        for i in range(n):
            res += a[i]
        return res
    if n <= _BLOCK:
        r0, r1, r2, r3, r4, r5, r6, r7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
        i = 8
        while i < n - n % 8:
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += a[i]
            i += 1
        return res
    half = n // 2
    half -= half % 8
    return _pairwise(a, half) + _pairwise(a + half, n - half)


cdef inline int _small_float(object x):
    """The NumPy type number of ``x`` when it is a small, C-contiguous,
    native float32/float64 ndarray; else -1."""
    if type(x) is not np.ndarray:
        return -1
    cdef cnp.ndarray a = <cnp.ndarray>x
    cdef int typenum = cnp.PyArray_TYPE(a)
    if typenum != cnp.NPY_FLOAT32 and typenum != cnp.NPY_FLOAT64:
        return -1
    if not cnp.PyArray_ISCARRAY_RO(a) or not cnp.PyArray_ISNOTSWAPPED(a):
        return -1
    cdef cnp.npy_intp n = cnp.PyArray_SIZE(a)
    if n == 0 or n > _SMALL:
        return -1
    return typenum


cdef object _scalar_array(int typenum, double value):
    cdef cnp.ndarray out = cnp.PyArray_SimpleNew(0, NULL, typenum)
    if typenum == cnp.NPY_FLOAT32:
        (<float*>cnp.PyArray_DATA(out))[0] = <float>value
    else:
        (<double*>cnp.PyArray_DATA(out))[0] = value
    return out


cdef double _sum(cnp.ndarray a, int typenum):
    """The sum of ``a``'s elements in its own dtype (NumPy starts from the
    identity: a sum of -0.0 is 0.0), exactly representable as a double."""
    cdef Py_ssize_t n = cnp.PyArray_SIZE(a)
    cdef float s32 = 0
    cdef double s64 = 0
    if typenum == cnp.NPY_FLOAT32:
        s32 += _pairwise(<const float*>cnp.PyArray_DATA(a), n)
        return s32
    s64 += _pairwise(<const double*>cnp.PyArray_DATA(a), n)
    return s64


def full_sum(x):
    """``np.add.reduce(x, axis=None)`` as a 0-d array, bit for bit.

    Example::

        >>> full_sum(np.ones((2, 3), np.float64))
        array(6.)
    """
    cdef int typenum = _small_float(x)
    if typenum < 0:
        return _np_sum(x, axis=None)
    return _scalar_array(typenum, _sum(<cnp.ndarray>x, typenum))


def full_mean(x):
    """``np.mean(x)`` as a 0-d array, bit for bit: the sum in x's dtype,
    divided by the count in float64 and rounded back (NumPy's order).

    Example::

        >>> full_mean(np.arange(4, dtype=np.float32))
        array(1.5, dtype=float32)
    """
    cdef int typenum = _small_float(x)
    if typenum < 0:
        return _np_mean(x)
    return _scalar_array(typenum, _sum(<cnp.ndarray>x, typenum) / <double>cnp.PyArray_SIZE(<cnp.ndarray>x))
