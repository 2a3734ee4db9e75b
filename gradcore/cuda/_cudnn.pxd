# The compiled per-call path of cuDNN (gradcore/cuda/_cudnn.pyx).
#
# What this file is for: the C prototypes of the cuDNN functions that
# _cudnn.pyx calls through pointers, which Cython reads when it compiles
# _cudnn.pyx. No other module cimports them; gradcore/cuda/cudnn.py calls
# the module's functions from Python. Cython directives: setup.py, for every
# compiled module at once.
#
# Contract (of _cudnn.pyx's functions: convolution, pooling_forward,
# pooling_backward, batch_norm_training, batch_norm_inference,
# batch_norm_backward):
# - every function takes the address of a cuDNN function (resolved once by
#   gradcore/cuda/cudnn.py's Library, with that function's C prototype), the
#   cuDNN handle, and descriptors and device pointers as integers, and returns
#   the cudnnStatus_t of the call; it never raises for a status (the caller
#   names the call and the shapes in its error);
# - alpha = 1 and beta = 0 are passed as the C type cuDNN reads for the data
#   type: double for float64 data (``double=True``), float otherwise;
# - nothing is retained: descriptors, workspaces and arrays stay owned (and
#   alive for the call) by the caller.

ctypedef int (*conv_fn_t)(void* handle, const void* alpha, void* a_desc, const void* a, void* b_desc,
                          const void* b, void* conv_desc, int algo, void* workspace, size_t workspace_size,
                          const void* beta, void* out_desc, void* out)
ctypedef int (*pool_fwd_t)(void* handle, void* pool_desc, const void* alpha, void* x_desc, const void* x,
                           const void* beta, void* y_desc, void* y)
ctypedef int (*pool_bwd_t)(void* handle, void* pool_desc, const void* alpha, void* y_desc, const void* y,
                           void* dy_desc, const void* dy, void* x_desc, const void* x, const void* beta,
                           void* dx_desc, void* dx)
ctypedef int (*bn_train_t)(void* handle, int mode, const void* alpha, const void* beta, void* x_desc,
                           const void* x, void* y_desc, void* y, void* p_desc, const void* scale,
                           const void* bias, double factor, void* running_mean, void* running_var, double eps,
                           void* save_mean, void* save_invstd)
ctypedef int (*bn_infer_t)(void* handle, int mode, const void* alpha, const void* beta, void* x_desc,
                           const void* x, void* y_desc, void* y, void* p_desc, const void* scale,
                           const void* bias, const void* mean, const void* var, double eps)
ctypedef int (*bn_bwd_t)(void* handle, int mode, const void* alpha_data, const void* beta_data,
                         const void* alpha_param, const void* beta_param, void* x_desc, const void* x,
                         void* dy_desc, const void* dy, void* dx_desc, void* dx, void* p_desc, const void* scale,
                         void* dscale, void* dbias, double eps, const void* saved_mean, const void* saved_invstd)
