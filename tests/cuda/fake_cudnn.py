"""A stand-in for cuDNN on machines without a GPU (as fake_pycuda.py stands
in for PyCUDA), so that gradcore/cuda/cudnn.py runs here: its descriptors,
algorithm choice and cache, workspaces, switches and fallback.

Every function of ``cudnn.PROTOTYPES`` is a C function pointer (a ctypes
callback with the real prototype), so gradcore binds and calls it exactly as
it binds the real library. Memory is the host emulator's (device addresses
are host addresses). Each call checks its arguments against what cuDNN
requires (descriptors made and set, packed strides, shapes that agree with
the convolution or pooling parameters, one data type, a known algorithm
that was offered for this configuration, a workspace at least as large as
the algorithm needs) and computes the result with gradcore's CPU kernels,
blended as cuDNN does: ``out = alpha * result + beta * out``. A float32
convolution whose descriptor allows tensor-op math rounds its operands to
TF32 (10-bit mantissa) first, as an Ampere GPU does, so the precision policy
shows in the numbers. A broken rule is recorded in ``errors`` and the call
fails with CUDNN_STATUS_BAD_PARAM.

The algorithms offered (``HEURISTIC`` in cuDNN's heuristic order, and the
same ones as ``FindEx`` times them, ``MEASURED``) differ in order,
workspace, determinism and math type, so each switch changes the choice.
"""
from __future__ import annotations

import ctypes

import numpy as np

from gradcore.cuda import cudnn
from gradcore.ops import conv as conv_ops
from gradcore.ops import pool as pool_ops

BAD_PARAM, NOT_SUPPORTED = 2000, 3000
HANDLE = 0xC0DE
VERSION = 91234

# (algo, memory, determinism, time): the heuristics' order and FindEx's (by time)
HEURISTIC = [(6, 8192, cudnn.NON_DETERMINISTIC, 1.0), (1, 1024, cudnn.DETERMINISTIC, 2.0),
             (0, 0, cudnn.DETERMINISTIC, 3.0), (5, 512, cudnn.DETERMINISTIC, -1)]     # time -1: not supported
MEASURED = [(1, 1024, cudnn.DETERMINISTIC, 0.2), (6, 8192, cudnn.NON_DETERMINISTIC, 0.4),
            (0, 0, cudnn.DETERMINISTIC, 1.0)]
TENSOR_OP_ALGO = 6      # reports tensor-op math for float32


def tf32(a):
    """float32 rounded to TF32's 10-bit mantissa (round to nearest)."""
    a = np.ascontiguousarray(a, np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return bits.view(np.float32)


class FakeCudnn:
    """The functions of ``cudnn.PROTOTYPES`` as C function pointers (attributes),
    with the record of what they were asked (``calls``) and what broke (``errors``)."""

    def __init__(self):
        self.calls = []                 # (function name, {argument: value})
        self.errors = []
        self.descs = {}                 # handle -> {"kind": ..., settings}
        self.offered = {}               # (direction, configuration) -> {algo: memory}
        self.refuse = lambda direction, config: False      # cuDNN offers nothing for these
        self.refuse_execution = lambda direction, config: False   # ... or fails them with NOT_SUPPORTED
        self.stream_set = False
        self._strings = {}
        self._callbacks = {}
        for name, (restype, argtypes) in cudnn.PROTOTYPES.items():
            impl = getattr(self, "_" + name)
            if restype is ctypes.c_char_p:      # a callback cannot return a char*: the address of a kept buffer
                restype = ctypes.c_void_p
            self._callbacks[name] = ctypes.CFUNCTYPE(restype, *argtypes)(self._guard(name, impl, restype))

    def __getattr__(self, name):
        callbacks = self.__dict__.get("_callbacks", {})
        if name in callbacks:
            return callbacks[name]
        raise AttributeError(name)

    def names(self):
        return [n for n, _ in self.calls]

    def last(self, name):
        return [a for n, a in self.calls if n == name][-1]

    def _guard(self, name, impl, restype):
        def call(*args):
            try:
                return impl(*args)
            except _Refused:
                return NOT_SUPPORTED
            except Exception as exc:        # a callback cannot raise: record it, fail the call
                self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                return BAD_PARAM if restype is ctypes.c_int else 0
        return call

    # ------------------------------------------------------------ library
    def _cudnnGetVersion(self):
        return VERSION

    def _cudnnGetErrorString(self, status):
        text = self._strings.get(status)
        if text is None:
            text = self._strings[status] = ctypes.create_string_buffer(f"FAKE_CUDNN_STATUS_{status}".encode())
        return ctypes.addressof(text)

    def _cudnnCreate(self, out):
        out[0] = HANDLE
        self.calls.append(("cudnnCreate", {}))
        return 0

    def _cudnnDestroy(self, handle):
        return 0

    def _cudnnSetStream(self, handle, stream):
        # the default stream, or a CUDA graph's capture stream while one is captured
        assert handle == HANDLE, f"handle {handle} was not made by cudnnCreate"
        self.stream_set = True
        self.stream = stream or 0
        self.calls.append(("cudnnSetStream", {"stream": self.stream}))
        return 0

    def _check_handle(self, handle):
        assert handle == HANDLE, f"handle {handle} was not made by cudnnCreate"
        assert self.stream_set, "cudnnSetStream was not called"

    # ------------------------------------------------------------ descriptors
    def _create(self, kind, out):
        handle = 0x10000 + len(self.descs)
        self.descs[handle] = {"kind": kind}
        out[0] = handle
        return 0

    def _cudnnCreateTensorDescriptor(self, out):
        return self._create("tensor", out)

    def _cudnnCreateFilterDescriptor(self, out):
        return self._create("filter", out)

    def _cudnnCreateConvolutionDescriptor(self, out):
        return self._create("conv", out)

    def _cudnnCreatePoolingDescriptor(self, out):
        return self._create("pool", out)

    def _desc(self, handle, kind):
        d = self.descs.get(handle)
        assert d is not None and d["kind"] == kind, f"{handle} is not a {kind} descriptor"
        assert len(d) > 1, f"{kind} descriptor {handle} was never set"
        return d

    def _cudnnSetTensorNdDescriptor(self, desc, dtype, nb, dims, strides):
        assert dtype in (cudnn.DATA_FLOAT, cudnn.DATA_DOUBLE) and nb in (4, 5)
        shape, st = tuple(dims[i] for i in range(nb)), tuple(strides[i] for i in range(nb))
        assert min(shape) >= 1, f"dimensions {shape}"
        assert st == tuple(int(np.prod(shape[i + 1:])) for i in range(nb)), f"strides {st} of {shape} are not packed"
        self.descs[desc].update(dtype=dtype, shape=shape)
        return 0

    def _cudnnSetFilterNdDescriptor(self, desc, dtype, fmt, nb, dims):
        assert fmt == cudnn.TENSOR_NCHW and nb in (4, 5)
        self.descs[desc].update(dtype=dtype, shape=tuple(dims[i] for i in range(nb)))
        return 0

    def _cudnnSetConvolutionNdDescriptor(self, desc, n, pads, strides, dilations, mode, compute):
        assert mode == cudnn.CROSS_CORRELATION and n in (2, 3)
        self.descs[desc].update(padding=tuple(pads[i] for i in range(n)), stride=tuple(strides[i] for i in range(n)),
                                dilation=tuple(dilations[i] for i in range(n)), compute=compute, groups=1,
                                math=cudnn.DEFAULT_MATH)
        return 0

    def _cudnnSetConvolutionGroupCount(self, desc, groups):
        assert groups >= 1
        self.descs[desc]["groups"] = groups
        return 0

    def _cudnnSetConvolutionMathType(self, desc, math):
        assert math in (cudnn.DEFAULT_MATH, cudnn.TENSOR_OP_MATH, cudnn.TENSOR_OP_MATH_ALLOW_CONVERSION,
                        cudnn.FMA_MATH)
        self.descs[desc]["math"] = math
        return 0

    def _cudnnSetPoolingNdDescriptor(self, desc, mode, nan, n, window, pads, strides):
        assert nan == cudnn.PROPAGATE_NAN, "max pooling propagates NaN (as the cpu kernels)"
        self.descs[desc].update(mode=mode, kernel=tuple(window[i] for i in range(n)),
                                padding=tuple(pads[i] for i in range(n)), stride=tuple(strides[i] for i in range(n)))
        return 0

    # ------------------------------------------------------------ convolutions
    def _config(self, direction, a, b, conv, out):
        """Check the four descriptors of a ``direction`` call; (x shape, w
        shape, y shape, attrs, numpy dtype, conv descriptor)."""
        kinds = {"forward": ("tensor", "filter", "tensor"), "backward_data": ("filter", "tensor", "tensor"),
                 "backward_filter": ("tensor", "tensor", "filter")}[direction]
        da, db, do = (self._desc(h, k) for h, k in zip((a, b, out), kinds))
        c = self._desc(conv, "conv")
        assert da["dtype"] == db["dtype"] == do["dtype"] == c["compute"], "one data type for all"
        if direction == "forward":
            xs, ws, ys = da["shape"], db["shape"], do["shape"]
        elif direction == "backward_data":
            ws, ys, xs = da["shape"], db["shape"], do["shape"]
        else:
            xs, ys, ws = da["shape"], db["shape"], do["shape"]
        n = len(xs) - 2
        assert len(ws) == len(ys) == len(xs) and len(c["stride"]) == n
        g = c["groups"]
        assert xs[1] == ws[1] * g and ws[0] % g == 0, f"channels: x {xs}, w {ws}, groups {g}"
        want = (xs[0], ws[0]) + tuple((size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, s, p, d in
                                      zip(xs[2:], ws[2:], c["stride"], c["padding"], c["dilation"]))
        assert ys == want, f"output {ys}, the convolution of x {xs} with w {ws} gives {want}"
        attrs = (c["stride"], c["padding"], c["dilation"], g)
        dtype = np.float32 if c["compute"] == cudnn.DATA_FLOAT else np.float64
        return xs, ws, ys, attrs, dtype, c

    def _perf(self, direction, config, table, count, returned, perf, dtype, math):
        assert count == cudnn.ALGO_COUNT[direction], f"asked for {count} results"
        refused = self.refuse(direction, config)
        offered = self.offered.setdefault((direction, config), {})
        for i, (algo, memory, determinism, time) in enumerate(table):
            p = perf[i]
            p.algo, p.memory, p.determinism, p.time = algo, memory, determinism, max(time, 0)
            p.status = NOT_SUPPORTED if (time < 0 or refused) else 0
            # one algorithm reports tensor-op math for float32 even when the descriptor
            # asks for FMA: gradcore must leave it out when TF32 is off
            p.mathType = (cudnn.TENSOR_OP_MATH if algo == TENSOR_OP_ALGO and dtype == np.float32
                          else cudnn.DEFAULT_MATH)
            if p.status == 0:
                offered[algo] = memory
        returned[0] = len(table)
        return 0

    def _get_v7(self, direction, handle, a, b, conv, out, count, returned, perf):
        self._check_handle(handle)
        xs, ws, ys, attrs, dtype, c = self._config(direction, a, b, conv, out)
        config = (xs, ws, attrs, np.dtype(dtype).name)
        self.calls.append((f"get_{direction}", {"config": config, "math": c["math"]}))
        return self._perf(direction, config, HEURISTIC, count, returned, perf, dtype, c["math"])

    def _cudnnGetConvolutionForwardAlgorithm_v7(self, *args):
        return self._get_v7("forward", *args)

    def _cudnnGetConvolutionBackwardDataAlgorithm_v7(self, *args):
        return self._get_v7("backward_data", *args)

    def _cudnnGetConvolutionBackwardFilterAlgorithm_v7(self, *args):
        return self._get_v7("backward_filter", *args)

    def _find(self, direction, handle, a, pa, b, pb, conv, out, pout, count, returned, perf, ws, size):
        self._check_handle(handle)
        xs, ws_shape, ys, attrs, dtype, c = self._config(direction, a, b, conv, out)
        assert pa and pb and pout, "FindEx runs the algorithms on real buffers"
        assert ws or not size, "a workspace size without a workspace"
        config = (xs, ws_shape, attrs, np.dtype(dtype).name)
        self.calls.append((f"find_{direction}", {"config": config, "workspace": size, "math": c["math"]}))
        # the timing runs leave garbage in the output: gradcore must write it again
        shape = self.descs[out]["shape"]
        _array(pout, shape, dtype)[...] = np.nan
        fits = [m for m in MEASURED if m[1] <= size]
        return self._perf(direction, config, fits, count, returned, perf, dtype, c["math"])

    def _cudnnFindConvolutionForwardAlgorithmEx(self, *args):
        return self._find("forward", *args)

    def _cudnnFindConvolutionBackwardDataAlgorithmEx(self, *args):
        return self._find("backward_data", *args)

    def _cudnnFindConvolutionBackwardFilterAlgorithmEx(self, *args):
        return self._find("backward_filter", *args)

    def _workspace(self, direction, handle, a, b, conv, out, algo, size):
        self._check_handle(handle)
        xs, ws, ys, attrs, dtype, _ = self._config(direction, a, b, conv, out)
        offered = self.offered.get((direction, (xs, ws, attrs, np.dtype(dtype).name)), {})
        assert algo in offered, f"algorithm {algo} was not offered for this configuration ({sorted(offered)})"
        size[0] = offered[algo]
        return 0

    def _cudnnGetConvolutionForwardWorkspaceSize(self, *args):
        return self._workspace("forward", *args)

    def _cudnnGetConvolutionBackwardDataWorkspaceSize(self, *args):
        return self._workspace("backward_data", *args)

    def _cudnnGetConvolutionBackwardFilterWorkspaceSize(self, *args):
        return self._workspace("backward_filter", *args)

    def _run(self, direction, handle, alpha, a, pa, b, pb, conv, algo, ws, size, beta, out, pout):
        self._check_handle(handle)
        xs, ws_shape, ys, attrs, dtype, c = self._config(direction, a, b, conv, out)
        config = (xs, ws_shape, attrs, np.dtype(dtype).name)
        offered = self.offered.get((direction, config), {})
        assert algo in offered, f"algorithm {algo} was not offered for this configuration ({sorted(offered)})"
        assert size >= offered[algo], f"workspace of {size} bytes, algorithm {algo} needs {offered[algo]}"
        assert ws or not size, "a workspace size without a workspace"
        al, be = _scalar(alpha, dtype), _scalar(beta, dtype)
        self.calls.append((direction, {"x": xs, "w": ws_shape, "y": ys, "stride": attrs[0], "padding": attrs[1],
                                       "dilation": attrs[2], "groups": attrs[3], "algo": algo, "workspace": size,
                                       "workspace_ptr": ws, "alpha": al, "beta": be, "math": c["math"],
                                       "dtype": np.dtype(dtype).name}))
        if self.refuse_execution(direction, config):
            raise _Refused()
        ta, tb = self.descs[a]["shape"], self.descs[b]["shape"]
        va, vb = _array(pa, ta, dtype).copy(), _array(pb, tb, dtype).copy()
        if dtype == np.float32 and c["math"] != cudnn.FMA_MATH:
            va, vb = tf32(va), tf32(vb)
        if direction == "forward":
            res = conv_ops.Convolution(*attrs).cpu(va, vb)
        elif direction == "backward_data":
            res = conv_ops.ConvolutionBackwardData(*attrs).cpu(vb, va, np.empty(xs, dtype))
        else:
            res = conv_ops.ConvolutionBackwardFilter(*attrs).cpu(vb, va, np.empty(ws_shape, dtype))
        target = _array(pout, self.descs[out]["shape"], dtype)
        target[...] = al * res + (be * target if be else 0)
        return 0

    def _cudnnConvolutionForward(self, *args):
        return self._run("forward", *args)

    def _cudnnConvolutionBackwardData(self, *args):
        return self._run("backward_data", *args)

    def _cudnnConvolutionBackwardFilter(self, *args):
        return self._run("backward_filter", *args)

    # ------------------------------------------------------------ pooling
    def _pool_op(self, p, backward):
        mode = p["mode"]
        args = (p["kernel"], p["stride"], p["padding"])
        if mode in (cudnn.POOLING_MAX, cudnn.POOLING_MAX_DETERMINISTIC):
            return (pool_ops.MaxPool2dBackward if backward else pool_ops.MaxPool2d)(*args)
        avg = "average" if mode == cudnn.POOLING_AVERAGE_INCLUDE_PADDING else "average_count_exclude_padding"
        return (pool_ops.AvgPool2dBackward if backward else pool_ops.AvgPool2d)(*args, avg)

    def _pooled(self, p, xs):
        return xs[:2] + tuple((size + 2 * pad - k) // s + 1 for size, k, s, pad in
                              zip(xs[2:], p["kernel"], p["stride"], p["padding"]))

    def _cudnnPoolingForward(self, handle, pool, alpha, xd, x, beta, yd, y):
        self._check_handle(handle)
        p = self._desc(pool, "pool")
        dx, dy = self._desc(xd, "tensor"), self._desc(yd, "tensor")
        assert dx["dtype"] == dy["dtype"] and len(dx["shape"]) == 4
        assert dy["shape"] == self._pooled(p, dx["shape"]), f"pooled shape {dy['shape']} of {dx['shape']}"
        dtype = np.float32 if dx["dtype"] == cudnn.DATA_FLOAT else np.float64
        al, be = _scalar(alpha, dtype), _scalar(beta, dtype)
        self.calls.append(("pool_forward", {"mode": p["mode"], "kernel": p["kernel"], "stride": p["stride"],
                                            "padding": p["padding"], "x": dx["shape"], "alpha": al, "beta": be}))
        res = self._pool_op(p, False).cpu(_array(x, dx["shape"], dtype).copy())
        target = _array(y, dy["shape"], dtype)
        target[...] = al * res + (be * target if be else 0)
        return 0

    def _cudnnPoolingBackward(self, handle, pool, alpha, yd, y, dyd, dy, xd, x, beta, dxd, dx):
        self._check_handle(handle)
        p = self._desc(pool, "pool")
        ty, tdy, tx, tdx = (self._desc(h, "tensor") for h in (yd, dyd, xd, dxd))
        assert ty["shape"] == tdy["shape"] == self._pooled(p, tx["shape"]) and tx["shape"] == tdx["shape"]
        assert y and dy and x and dx
        dtype = np.float32 if tx["dtype"] == cudnn.DATA_FLOAT else np.float64
        al, be = _scalar(alpha, dtype), _scalar(beta, dtype)
        self.calls.append(("pool_backward", {"mode": p["mode"], "kernel": p["kernel"], "stride": p["stride"],
                                             "padding": p["padding"], "x": tx["shape"], "alpha": al, "beta": be}))
        g = _array(dy, tdy["shape"], dtype).copy()
        op = self._pool_op(p, True)
        if p["mode"] in (cudnn.POOLING_MAX, cudnn.POOLING_MAX_DETERMINISTIC):
            xv = _array(x, tx["shape"], dtype).copy()
            yv = _array(y, ty["shape"], dtype)
            np.testing.assert_array_equal(yv, pool_ops.MaxPool2d(p["kernel"], p["stride"], p["padding"]).cpu(xv),
                                          err_msg="y is not the max pooling of x")
            res = op.cpu(g, xv)
        else:
            res = op.cpu(g, np.empty(tx["shape"], dtype))
        target = _array(dx, tdx["shape"], dtype)
        target[...] = al * res + (be * target if be else 0)
        return 0


    # ------------------------------------------------------------ batch normalisation
    def _bn(self, mode, xd, others, pd, eps):
        """Check a batch-norm call's descriptors; (x shape, param shape, dtype, axes)."""
        assert mode == cudnn.BATCHNORM_SPATIAL, f"mode {mode}"
        tx, tp = self._desc(xd, "tensor"), self._desc(pd, "tensor")
        for h in others:
            assert self._desc(h, "tensor")["shape"] == tx["shape"], "x, y (dy, dx) of one shape"
        xs = tx["shape"]
        assert tp["shape"] == (1, xs[1]) + (1,) * (len(xs) - 2), f"parameters {tp['shape']} for x {xs}"
        assert tp["dtype"] == tx["dtype"], "float parameters for float data, double for double"
        assert eps >= 0
        dtype = np.float32 if tx["dtype"] == cudnn.DATA_FLOAT else np.float64
        return xs, tp["shape"], dtype, tuple(i for i in range(len(xs)) if i != 1)

    def _cudnnBatchNormalizationForwardTraining(self, handle, mode, alpha, beta, xd, x, yd, y, pd, scale, bias,
                                                factor, rmean, rvar, eps, smean, sinv):
        self._check_handle(handle)
        xs, ps, dtype, axes = self._bn(mode, xd, (yd,), pd, eps)
        assert rmean is None and rvar is None, "gradcore updates the running statistics itself"
        assert smean and sinv and x and y and scale and bias
        self.calls.append(("bn_training", {"x": xs, "eps": eps, "alpha": _scalar(alpha, dtype),
                                           "beta": _scalar(beta, dtype)}))
        xv = _array(x, xs, dtype).astype(np.float64)
        m, v = xv.mean(axes, keepdims=True), xv.var(axes, keepdims=True)
        inv = 1 / np.sqrt(v + eps)
        _array(y, xs, dtype)[...] = (xv - m) * inv * _array(scale, ps, dtype) + _array(bias, ps, dtype)
        _array(smean, ps, dtype)[...] = m
        _array(sinv, ps, dtype)[...] = inv
        return 0

    def _cudnnBatchNormalizationForwardInference(self, handle, mode, alpha, beta, xd, x, yd, y, pd, scale, bias,
                                                 mean, var, eps):
        self._check_handle(handle)
        xs, ps, dtype, _ = self._bn(mode, xd, (yd,), pd, eps)
        self.calls.append(("bn_inference", {"x": xs, "eps": eps}))
        m, v = _array(mean, ps, dtype), _array(var, ps, dtype)
        _array(y, xs, dtype)[...] = ((_array(x, xs, dtype) - m) / np.sqrt(v.astype(np.float64) + eps)
                                     * _array(scale, ps, dtype) + _array(bias, ps, dtype))
        return 0

    def _cudnnBatchNormalizationBackward(self, handle, mode, a_data, b_data, a_param, b_param, xd, x, dyd, dy,
                                         dxd, dx, pd, scale, dscale, dbias, eps, smean, sinv):
        self._check_handle(handle)
        xs, ps, dtype, axes = self._bn(mode, xd, (dyd, dxd), pd, eps)
        assert smean and sinv, "the forward's saved statistics are passed back"
        assert [_scalar(a, dtype) for a in (a_data, b_data, a_param, b_param)] == [1, 0, 1, 0]
        self.calls.append(("bn_backward", {"x": xs, "eps": eps}))
        xv, g = _array(x, xs, dtype).astype(np.float64), _array(dy, xs, dtype).astype(np.float64)
        m, inv, w = (_array(p, ps, dtype).astype(np.float64) for p in (smean, sinv, scale))
        xhat = (xv - m) * inv
        db, dw = g.sum(axes, keepdims=True), (g * xhat).sum(axes, keepdims=True)
        count = xv.size // xs[1]
        _array(dx, xs, dtype)[...] = w * inv * (g - (db + xhat * dw) / count)
        _array(dscale, ps, dtype)[...] = dw
        _array(dbias, ps, dtype)[...] = db
        return 0


class _Refused(Exception):
    pass


def _array(ptr, shape, dtype):
    """The device (host emulator) memory at ``ptr`` as a writable array."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    return np.frombuffer((ctypes.c_char * n).from_address(ptr), dtype).reshape(shape)


def _scalar(ptr, dtype):
    """alpha or beta: a float for float32 data, a double for float64 (cuDNN's rule)."""
    kind = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    return kind.from_address(ptr).value


def attach(backend):
    """A FakeCudnn serving ``backend`` (gradcore.cuda.cudnn.attach); returns it."""
    fake = FakeCudnn()
    cudnn.attach(backend, cudnn.Library(fake, "fake cuDNN"))
    return fake
