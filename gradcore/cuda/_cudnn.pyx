# Cython directives: setup.py, for every compiled module at once.
"""cuDNN's per-call functions through C function pointers (the contract is
in ``_cudnn.pxd``): the convolutions, pooling and batch normalisation that
``gradcore/cuda/cudnn.py`` runs, without ctypes' per-call argument
conversion. Addresses, handles, descriptors and pointers are ints."""
from libc.stdint cimport uintptr_t


# alpha and beta: cuDNN reads them (as the data type's C type) during the call
cdef float _F1 = 1, _F0 = 0
cdef double _D1 = 1, _D0 = 0


cdef inline const void* _one(bint double):
    return <const void*>&_D1 if double else <const void*>&_F1


cdef inline const void* _zero(bint double):
    return <const void*>&_D0 if double else <const void*>&_F0


def convolution(uintptr_t fn, uintptr_t handle, bint double, uintptr_t a_desc, uintptr_t a, uintptr_t b_desc,
                uintptr_t b, uintptr_t conv_desc, int algo, uintptr_t workspace, size_t workspace_size,
                uintptr_t out_desc, uintptr_t out) -> int:
    """``cudnnConvolution{Forward,BackwardData,BackwardFilter}`` at ``fn``
    (one signature): out = conv(a, b) with alpha 1, beta 0."""
    return (<conv_fn_t><void*>fn)(<void*>handle, _one(double), <void*>a_desc, <const void*>a, <void*>b_desc,
                                  <const void*>b, <void*>conv_desc, algo, <void*>workspace, workspace_size,
                                  _zero(double), <void*>out_desc, <void*>out)


def pooling_forward(uintptr_t fn, uintptr_t handle, bint double, uintptr_t pool_desc, uintptr_t x_desc,
                    uintptr_t x, uintptr_t y_desc, uintptr_t y) -> int:
    """``cudnnPoolingForward`` at ``fn``."""
    return (<pool_fwd_t><void*>fn)(<void*>handle, <void*>pool_desc, _one(double), <void*>x_desc, <const void*>x,
                                   _zero(double), <void*>y_desc, <void*>y)


def pooling_backward(uintptr_t fn, uintptr_t handle, bint double, uintptr_t pool_desc, uintptr_t y_desc,
                     uintptr_t y, uintptr_t dy, uintptr_t x_desc, uintptr_t x, uintptr_t dx) -> int:
    """``cudnnPoolingBackward`` at ``fn`` (dy shares y's descriptor, dx x's)."""
    return (<pool_bwd_t><void*>fn)(<void*>handle, <void*>pool_desc, _one(double), <void*>y_desc, <const void*>y,
                                   <void*>y_desc, <const void*>dy, <void*>x_desc, <const void*>x, _zero(double),
                                   <void*>x_desc, <void*>dx)


def batch_norm_training(uintptr_t fn, uintptr_t handle, bint double, int mode, uintptr_t x_desc, uintptr_t x,
                        uintptr_t y, uintptr_t p_desc, uintptr_t scale, uintptr_t bias, double eps,
                        uintptr_t save_mean, uintptr_t save_invstd) -> int:
    """``cudnnBatchNormalizationForwardTraining`` at ``fn``; no running
    statistics (gradcore updates them), y shares x's descriptor."""
    return (<bn_train_t><void*>fn)(<void*>handle, mode, _one(double), _zero(double), <void*>x_desc, <const void*>x,
                                   <void*>x_desc, <void*>y, <void*>p_desc, <const void*>scale, <const void*>bias,
                                   0.0, NULL, NULL, eps, <void*>save_mean, <void*>save_invstd)


def batch_norm_inference(uintptr_t fn, uintptr_t handle, bint double, int mode, uintptr_t x_desc, uintptr_t x,
                         uintptr_t y, uintptr_t p_desc, uintptr_t scale, uintptr_t bias, uintptr_t mean,
                         uintptr_t var, double eps) -> int:
    """``cudnnBatchNormalizationForwardInference`` at ``fn``; y shares x's descriptor."""
    return (<bn_infer_t><void*>fn)(<void*>handle, mode, _one(double), _zero(double), <void*>x_desc, <const void*>x,
                                   <void*>x_desc, <void*>y, <void*>p_desc, <const void*>scale, <const void*>bias,
                                   <const void*>mean, <const void*>var, eps)


def batch_norm_backward(uintptr_t fn, uintptr_t handle, bint double, int mode, uintptr_t x_desc, uintptr_t x,
                        uintptr_t dy, uintptr_t dx, uintptr_t p_desc, uintptr_t scale, uintptr_t dscale,
                        uintptr_t dbias, double eps, uintptr_t saved_mean, uintptr_t saved_invstd) -> int:
    """``cudnnBatchNormalizationBackward`` at ``fn``; dy and dx share x's descriptor."""
    return (<bn_bwd_t><void*>fn)(<void*>handle, mode, _one(double), _zero(double), _one(double), _zero(double),
                                 <void*>x_desc, <const void*>x, <void*>x_desc, <const void*>dy, <void*>x_desc,
                                 <void*>dx, <void*>p_desc, <const void*>scale, <void*>dscale, <void*>dbias, eps,
                                 <const void*>saved_mean, <const void*>saved_invstd)
