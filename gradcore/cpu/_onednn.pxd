# oneDNN's C API as gradcore uses it (gradcore/cpu/_onednn.pyx).
#
# The onednn-cpu-gomp wheel ships lib/libdnnl.so.3 and no headers, so the
# part of the v3.2 C API that gradcore calls is declared here: opaque
# handles, the enumerators it passes (values as in oneDNN 3.2's
# dnnl_common_types.h and dnnl_types.h) and the prototypes of the
# functions, as function-pointer types (the library is opened with dlopen
# and each function found with dlsym: nothing links against libdnnl).
# Cython reads them when it compiles _onednn.pyx. No other module cimports
# them; gradcore/cpu/onednn.py calls the module's functions from Python.
# Cython directives: setup.py, for every compiled module at once.
#
# Contract:
# - a handle is an opaque pointer owned by whoever created it: the module
#   keeps one engine and one stream for the process, each Primitive its
#   primitive and its memory objects (destroyed with it);
# - every call returns a dnnl_status_t; the .pyx turns a failure into a
#   OnednnError naming the call, or into "not supported" (unimplemented)
#   for a configuration oneDNN has no implementation of.
from libc.stdint cimport int64_t

# ---------------------------------------------------------------- handles (opaque)
ctypedef void* dnnl_engine_t
ctypedef void* dnnl_stream_t
ctypedef void* dnnl_memory_desc_t
ctypedef void* dnnl_memory_t
ctypedef void* dnnl_primitive_desc_t
ctypedef void* dnnl_primitive_t
ctypedef void* dnnl_primitive_attr_t
ctypedef void* dnnl_post_ops_t

ctypedef int dnnl_status_t
ctypedef int64_t dnnl_dim_t

cdef enum:
    DNNL_MAX_NDIMS = 12

cdef struct dnnl_exec_arg_t:
    int arg
    dnnl_memory_t memory

cdef struct dnnl_version_t:
    int major
    int minor
    int patch
    const char* hash
    unsigned cpu_runtime
    unsigned gpu_runtime

# ---------------------------------------------------------------- enumerators (oneDNN 3.2)
cdef enum:
    # dnnl_status_t
    dnnl_success = 0
    dnnl_out_of_memory = 1
    dnnl_invalid_arguments = 2
    dnnl_unimplemented = 3
    dnnl_last_impl_reached = 4
    dnnl_runtime_error = 5
    dnnl_not_required = 6
    # dnnl_data_type_t
    dnnl_f32 = 3
    dnnl_u8 = 6
    # dnnl_engine_kind_t
    dnnl_cpu = 1
    # dnnl_stream_flags_t
    dnnl_stream_in_order = 1
    # dnnl_format_tag_t (the first entries: undef, any, then the plain tags a, ab, ...; the
    # channel-blocked ones nCw16c, nChw16c, nCdhw16c, i.e. aBc16b, aBcd16b, aBcde16b)
    dnnl_format_tag_any = 1
    dnnl_aBc16b = 56
    dnnl_aBcd16b = 78
    dnnl_aBcde16b = 121
    # dnnl_prop_kind_t
    dnnl_forward_training = 64
    dnnl_forward_inference = 96
    dnnl_backward = 128
    dnnl_backward_data = 160
    dnnl_backward_weights = 192
    # dnnl_alg_kind_t
    dnnl_convolution_direct = 0x1
    dnnl_eltwise_relu = 0x20
    dnnl_pooling_max = 0x1ff
    dnnl_pooling_avg_include_padding = 0x2ff
    dnnl_pooling_avg_exclude_padding = 0x3ff
    dnnl_resampling_linear = 0x2fff1
    # dnnl_normalization_flags_t
    dnnl_use_global_stats = 0x1
    dnnl_use_scale = 0x2
    dnnl_use_shift = 0x4
    # dnnl_scratchpad_mode_t
    dnnl_scratchpad_mode_library = 0
    dnnl_scratchpad_mode_user = 1
    # dnnl_query_t
    dnnl_query_impl_info_str = 8
    dnnl_query_src_md = 129
    dnnl_query_diff_src_md = 130
    dnnl_query_weights_md = 131
    dnnl_query_diff_weights_md = 132
    dnnl_query_dst_md = 133
    dnnl_query_diff_dst_md = 134
    dnnl_query_workspace_md = 135
    dnnl_query_scratchpad_md = 136
    dnnl_query_exec_arg_md = 255
    # execution argument indices (DNNL_ARG_*)
    DNNL_ARG_SRC = 1
    DNNL_ARG_DST = 17
    DNNL_ARG_WEIGHTS = 33
    DNNL_ARG_BIAS = 41
    DNNL_ARG_MEAN = 49
    DNNL_ARG_VARIANCE = 50
    DNNL_ARG_SCALE = 51
    DNNL_ARG_SHIFT = 52
    DNNL_ARG_WORKSPACE = 64
    DNNL_ARG_SCRATCHPAD = 80
    DNNL_ARG_DIFF_SRC = 129
    DNNL_ARG_DIFF_DST = 145
    DNNL_ARG_DIFF_WEIGHTS = 161
    DNNL_ARG_DIFF_BIAS = 169
    DNNL_ARG_DIFF_SCALE = 255
    DNNL_ARG_DIFF_SHIFT = 256

# ---------------------------------------------------------------- prototypes (as function-pointer types)
ctypedef const dnnl_version_t* (*f_version)() noexcept nogil
ctypedef dnnl_status_t (*f_engine_create)(dnnl_engine_t* engine, int kind, size_t index) noexcept nogil
ctypedef dnnl_status_t (*f_stream_create)(dnnl_stream_t* stream, dnnl_engine_t engine, unsigned flags) noexcept nogil
ctypedef dnnl_status_t (*f_one_handle)(void* handle) noexcept nogil      # *_destroy, dnnl_stream_wait
ctypedef dnnl_status_t (*f_md_create_with_strides)(dnnl_memory_desc_t* md, int ndims, const dnnl_dim_t* dims,
                                                   int data_type, const dnnl_dim_t* strides) noexcept nogil
ctypedef dnnl_status_t (*f_md_create_with_tag)(dnnl_memory_desc_t* md, int ndims, const dnnl_dim_t* dims,
                                               int data_type, int tag) noexcept nogil
ctypedef size_t (*f_md_get_size)(const void* md) noexcept nogil
ctypedef dnnl_status_t (*f_memory_create)(dnnl_memory_t* memory, const void* md, dnnl_engine_t engine,
                                          void* handle) noexcept nogil
ctypedef dnnl_status_t (*f_memory_set_data_handle)(dnnl_memory_t memory, void* handle) noexcept nogil
ctypedef dnnl_status_t (*f_attr_create)(dnnl_primitive_attr_t* attr) noexcept nogil
ctypedef dnnl_status_t (*f_attr_set_scratchpad_mode)(dnnl_primitive_attr_t attr, int mode) noexcept nogil
ctypedef dnnl_status_t (*f_attr_set_post_ops)(dnnl_primitive_attr_t attr, const void* post_ops) noexcept nogil
ctypedef dnnl_status_t (*f_post_ops_create)(dnnl_post_ops_t* post_ops) noexcept nogil
ctypedef dnnl_status_t (*f_post_ops_append_eltwise)(dnnl_post_ops_t post_ops, int alg, float alpha,
                                                    float beta) noexcept nogil
ctypedef dnnl_status_t (*f_conv_fwd_pd)(dnnl_primitive_desc_t* pd, dnnl_engine_t engine, int prop, int alg,
                                        const void* src, const void* weights, const void* bias, const void* dst,
                                        const dnnl_dim_t* strides, const dnnl_dim_t* dilates,
                                        const dnnl_dim_t* padding_l, const dnnl_dim_t* padding_r,
                                        const void* attr) noexcept nogil
ctypedef dnnl_status_t (*f_conv_bwd_data_pd)(dnnl_primitive_desc_t* pd, dnnl_engine_t engine, int alg,
                                             const void* diff_src, const void* weights, const void* diff_dst,
                                             const dnnl_dim_t* strides, const dnnl_dim_t* dilates,
                                             const dnnl_dim_t* padding_l, const dnnl_dim_t* padding_r,
                                             const void* hint_fwd_pd, const void* attr) noexcept nogil
ctypedef dnnl_status_t (*f_conv_bwd_weights_pd)(dnnl_primitive_desc_t* pd, dnnl_engine_t engine, int alg,
                                                const void* src, const void* diff_weights, const void* diff_bias,
                                                const void* diff_dst, const dnnl_dim_t* strides,
                                                const dnnl_dim_t* dilates, const dnnl_dim_t* padding_l,
                                                const dnnl_dim_t* padding_r, const void* hint_fwd_pd,
                                                const void* attr) noexcept nogil
ctypedef dnnl_status_t (*f_pool_fwd_pd)(dnnl_primitive_desc_t* pd, dnnl_engine_t engine, int prop, int alg,
                                        const void* src, const void* dst, const dnnl_dim_t* strides,
                                        const dnnl_dim_t* kernel, const dnnl_dim_t* dilation,
                                        const dnnl_dim_t* padding_l, const dnnl_dim_t* padding_r,
                                        const void* attr) noexcept nogil
ctypedef dnnl_status_t (*f_pool_bwd_pd)(dnnl_primitive_desc_t* pd, dnnl_engine_t engine, int alg,
                                        const void* diff_src, const void* diff_dst, const dnnl_dim_t* strides,
                                        const dnnl_dim_t* kernel, const dnnl_dim_t* dilation,
                                        const dnnl_dim_t* padding_l, const dnnl_dim_t* padding_r,
                                        const void* hint_fwd_pd, const void* attr) noexcept nogil
ctypedef dnnl_status_t (*f_resampling_fwd_pd)(dnnl_primitive_desc_t* pd, dnnl_engine_t engine, int prop,
                                              int alg, const float* factors, const void* src, const void* dst,
                                              const void* attr) noexcept nogil
ctypedef dnnl_status_t (*f_bnorm_fwd_pd)(dnnl_primitive_desc_t* pd, dnnl_engine_t engine, int prop,
                                         const void* src, const void* dst, float epsilon, unsigned flags,
                                         const void* attr) noexcept nogil
ctypedef dnnl_status_t (*f_bnorm_bwd_pd)(dnnl_primitive_desc_t* pd, dnnl_engine_t engine, int prop,
                                         const void* diff_src, const void* diff_dst, const void* src,
                                         float epsilon, unsigned flags, const void* hint_fwd_pd,
                                         const void* attr) noexcept nogil
ctypedef dnnl_status_t (*f_matmul_pd)(dnnl_primitive_desc_t* pd, dnnl_engine_t engine, const void* src,
                                      const void* weights, const void* bias, const void* dst,
                                      const void* attr) noexcept nogil
ctypedef int (*f_md_equal)(const void* lhs, const void* rhs) noexcept nogil
ctypedef dnnl_status_t (*f_reorder_pd)(dnnl_primitive_desc_t* pd, const void* src, dnnl_engine_t src_engine,
                                       const void* dst, dnnl_engine_t dst_engine, const void* attr) noexcept nogil
ctypedef const void* (*f_pd_query_md)(const void* pd, int what, int index) noexcept nogil
ctypedef dnnl_status_t (*f_pd_query)(const void* pd, int what, int index, void* result) noexcept nogil
ctypedef dnnl_status_t (*f_primitive_create)(dnnl_primitive_t* primitive, const void* pd) noexcept nogil
ctypedef dnnl_status_t (*f_primitive_execute)(const void* primitive, dnnl_stream_t stream, int nargs,
                                              const dnnl_exec_arg_t* args) noexcept nogil
ctypedef dnnl_status_t (*f_set_cache_capacity)(int capacity) noexcept nogil
# GNU OpenMP (libgomp, which libdnnl of the -gomp build loads)
ctypedef void (*f_omp_set_num_threads)(int n) noexcept nogil
ctypedef int (*f_omp_get_max_threads)() noexcept nogil
