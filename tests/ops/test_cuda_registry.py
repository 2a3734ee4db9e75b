"""Every standard op in the registry carries a CUDA C kernel source
(``cuda_source(ctype)``, compiled at run time by the CUDA backend): the whole
registry's sources, for float and double, compile with nvcc in one
translation unit, and every kernel is in the PTX. (Every op's launcher runs
its kernels on the host emulator in tests/cuda; the fallback GEMM, which
needs real threads for __syncthreads, runs here with std::thread blocks.)"""
import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

from gradcore import registry
from gradcore.ops import conv, indexing, linalg, loss, nn, reduce, rnn, shape, vision
from gradcore.ops import pool as pool_ops
from gradcore.ops import elemwise as ew
from gradcore.ops.indexing import split_index

CTYPES = ("float", "double")
KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(')


def _instances():
    """op name -> representative instances (their static attributes are
    compiled into the kernels, so the variants matter)."""
    sub_basic, _ = split_index((slice(1, None), 0))
    sub_adv, _ = split_index(([0, 2, 2],))
    conv_attrs = ((2, 1), (1, 2), (1, 2), 2)
    pool = ((3, 2), (2, 1), (1, 1))
    conv3d_attrs = ((2, 1, 1), (1, 0, 2), (1, 2, 1), 2)
    return {
        "Elemwise": [ew.Elemwise(r.mode) for r in ew.TABLE],
        "Reduce": [reduce.Reduce(m, (0, 2), k) for m in ("sum", "mean", "max", "min", "prod") for k in (False, True)]
        + [reduce.Reduce("sum")],
        "BroadcastBack": [reduce.BroadcastBack((1,), False, False), reduce.BroadcastBack(None, True, True)],
        "ArgReduce": [reduce.ArgReduce("argmax", 1), reduce.ArgReduce("argmin")],
        "CumSum": [reduce.CumSum(1), reduce.CumSum(0, True)],
        "MatrixMul": [linalg.MatrixMul(ta, tb) for ta in (False, True) for tb in (False, True)],
        "MatrixInverse": [linalg.MatrixInverse()],
        "SVD": [linalg.SVD()],
        "Reshape": [shape.Reshape((3, -1))],
        "ReshapeLike": [shape.ReshapeLike()],
        "Transpose": [shape.Transpose((1, 0, 2)), shape.Transpose(())],
        "Broadcast": [shape.Broadcast((2, 3)), shape.Broadcast(())],
        "BroadcastToLike": [shape.BroadcastToLike()],
        "SumTo": [shape.SumTo((1, 3)), shape.SumTo(())],
        "SumToLike": [shape.SumToLike()],
        "ZerosLike": [shape.ZerosLike()],
        "ExpandDims": [shape.ExpandDims((0, 2))],
        "Squeeze": [shape.Squeeze(None), shape.Squeeze(0)],
        "Cast": [shape.Cast(d) for d in ("float32", "float64", "int32", "int64", "bool")],
        "Identity": [shape.Identity()],
        "Copy": [shape.Copy("cpu")],
        "StopGradient": [shape.StopGradient()],
        "Concat": [shape.Concat(1)],
        "SplitLike": [shape.SplitLike(0)],
        "Split": [shape.Split(0, 2)],
        "Stack": [shape.Stack(1)],
        "Unstack": [shape.Unstack(1, 2)],
        "Subtensor": [indexing.Subtensor(sub_basic), indexing.Subtensor(sub_adv),
                      indexing.Subtensor(sub_adv, last_only=True)],
        "SubtensorGrad": [indexing.SubtensorGrad(sub_basic), indexing.SubtensorGrad(sub_adv)],
        "SetSubtensor": [indexing.SetSubtensor(sub_adv)],
        "IndexingOneHot": [indexing.IndexingOneHot(1), indexing.IndexingOneHot(0, True)],
        "IndexingOneHotGrad": [indexing.IndexingOneHotGrad(1, False)],
        "Gather": [indexing.Gather(1)],
        "GatherGrad": [indexing.GatherGrad(1)],
        "Scatter": [indexing.Scatter(1)],
        "Sort": [indexing.Sort(False), indexing.Sort(True)],
        "TopK": [indexing.TopK(2, False, m) for m in indexing.TOPK_MODES],
        "LogSoftmax": [nn.LogSoftmax(1)],
        "Softmax": [nn.Softmax(1)],
        "LogSumExp": [nn.LogSumExp(-1), nn.LogSumExp(0, True)],
        "BatchNormTraining": [nn.BatchNormTraining()],
        "BatchNormBackward": [nn.BatchNormBackward()],
        "BatchNormInference": [nn.BatchNormInference()],
        "Convolution": [conv.Convolution(*conv_attrs), conv.Convolution(*conv3d_attrs)],
        "ConvolutionBackwardData": [conv.ConvolutionBackwardData(*conv_attrs)],
        "ConvolutionBackwardFilter": [conv.ConvolutionBackwardFilter(*conv3d_attrs)],
        "MaxPool2d": [pool_ops.MaxPool2d(*pool)],
        "MaxPool2dBackward": [pool_ops.MaxPool2dBackward(*pool)],
        "MaxPool2dGather": [pool_ops.MaxPool2dGather(*pool)],
        "AvgPool2d": [pool_ops.AvgPool2d(*pool)],
        "AvgPool2dBackward": [pool_ops.AvgPool2dBackward(*pool)],
        "ConvTranspose": [conv.ConvTranspose(2, 1, 1, (1, 2), 2)],
        "Interpolate": [vision.Interpolate((4, 5), m, a) for m, a in (("nearest", False), ("bilinear", True))],
        "InterpolateBackward": [vision.InterpolateBackward((4, 5), "bilinear", False)],
        "DeformablePSROIPooling": [vision.DeformablePSROIPooling(False, 3, 3, 3, 2, 1.0, 0.1)],
        "DeformablePSROIPoolingBackward": [vision.DeformablePSROIPoolingBackward(False, 3, 3, 3, 2, 1.0, 0.1)],
        "LSTMCellGates": [rnn.LSTMCellGates()],
        "LSTMCellGatesBackward": [rnn.LSTMCellGatesBackward()],
        "GRUCellGates": [rnn.GRUCellGates()],
        "GRUCellGatesBackward": [rnn.GRUCellGatesBackward()],
        "LSTMLayer": [rnn.LSTMLayer(3), rnn.LSTMLayer(3, True)],
        "LSTMLayerBackward": [rnn.LSTMLayerBackward(3), rnn.LSTMLayerBackward(3, True)],
        "CrossEntropy": [loss.CrossEntropy(1)],
        "CrossEntropyGrad": [loss.CrossEntropyGrad(1)],
        "CTCLoss": [loss.CTCLoss(0)],
        "CTCLossGrad": [loss.CTCLossGrad(0)],
    }


INSTANCES = _instances()


def _standard():
    return {e.name: e.cls for e in registry.entries() if e.dist == "gradcore"}


# standard ops whose cuda path is their decomposition (a NumPy fast path on the cpu only)
CUDA_BY_DECOMPOSITION = {"Standardize": "layer/group norm's statistics: Reduce and elementwise kernels on cuda",
                         "StandardizeBackward": "the same, for its backward",
                         "StandardizeAffine": "layer/group norm with its affine scale and shift: the same",
                         "StandardizeAffineBackward": "the same, for its backward"}


def test_every_standard_op_has_a_cuda_source():
    missing = sorted(name for name, cls in _standard().items() if not callable(getattr(cls, "cuda_source", None))
                     and name not in CUDA_BY_DECOMPOSITION)
    assert not missing, f"standard ops without a cuda_source: {missing}"
    for name in CUDA_BY_DECOMPOSITION:
        assert callable(getattr(_standard()[name], "decompose", None)), name


def test_every_standard_op_has_instances_here():
    missing = sorted(set(_standard()) - set(INSTANCES) - set(CUDA_BY_DECOMPOSITION))
    assert not missing, f"standard ops without instances in {__file__}: {missing}"
    modes = {op.mode for op in INSTANCES["Elemwise"]}
    assert modes == {r.mode for r in ew.TABLE}


def _translation_unit(ctypes_=CTYPES):
    """(source, kernel names): every instance's source for every ctype;
    a variant whose kernel names are taken already is renamed apart."""
    parts, names, seen = [], [], {}
    for op_name in sorted(INSTANCES):
        for k, op in enumerate(INSTANCES[op_name]):
            for T in ctypes_:
                src = op.cuda_source(T)
                found = KERNEL.findall(src)
                assert found, f"{op!r}: no extern \"C\" __global__ kernel in its {T} source"
                for n in found:
                    assert n.startswith("gc_"), f"{op!r}: kernel {n} is not named gc_<op>_<ctype>"
                if any(n in seen for n in found):
                    if all(seen.get(n) == src for n in found):
                        continue          # the very same source: nothing new
                    for n in found:
                        src = re.sub(rf"\b{n}\(", f"{n}__v{k}(", src)
                    found = [f"{n}__v{k}" for n in found]
                for n in found:
                    assert n not in seen, f"kernel {n} defined twice"
                    seen[n] = src
                parts.append(src)     # each source declares its T in a namespace of its own
                names.extend(found)
    return "\n".join(parts), names


def test_kernel_names_follow_the_convention():
    for op_name, ops in INSTANCES.items():
        for op in ops:
            for T in CTYPES:
                for n in KERNEL.findall(op.cuda_source(T)):
                    assert T in n, f"{op!r}: kernel {n} does not name its ctype {T}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_every_source_compiles_with_nvcc(tmp_path):
    src, names = _translation_unit()
    path = tmp_path / "registry.cu"
    path.write_text(src)
    out = subprocess.run([shutil.which("nvcc"), "--ptx", "-o", str(tmp_path / "out.ptx"), str(path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-6000:]
    ptx = (tmp_path / "out.ptx").read_text()
    entries = set(re.findall(r"\.entry\s+(\w+)\s*\(", ptx))
    missing = [n for n in names if n not in entries]
    assert not missing, f"kernels missing from the PTX: {missing}"
    # every standard op contributed at least one kernel
    assert len(names) >= 2 * len(_standard())


# ---------------------------------------------------------------- on the host
_HOST_PRELUDE = """
#include <cmath>
using std::exp; using std::log;
struct gc_dim3 { long long x, y, z; };
static const gc_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define __global__
#define __device__
template <class T> static T atomicAdd(T* p, T v) { T old = *p; *p += v; return old; }
"""


class _Dims(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int), ("d", ctypes.c_longlong * 8)]


def _dims(shp):
    return _Dims(len(shp), (ctypes.c_longlong * 8)(*shp))


L = ctypes.c_longlong


def _ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


# Every op's launcher runs its kernels through the host emulator in
# tests/cuda (gradcore/cuda/emulator.py); here only what that cannot run:
# the fallback GEMM needs real threads for __syncthreads.


def test_host_run_cast(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src = _HOST_PRELUDE + shape.Cast("float32").cuda_source("double") + shape.Cast("int32").cuda_source("double")
    (tmp_path / "c.cpp").write_text(src)
    out = subprocess.run([cxx, "-x", "c++", "-shared", "-fPIC", "-o", str(tmp_path / "c.so"), str(tmp_path / "c.cpp")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    so = ctypes.CDLL(str(tmp_path / "c.so"))
    x = np.array([1.5, -2.7, 1e-40, 3.0])
    y = np.empty(4, np.float32)
    so.gc_cast_double_to_float(_ptr(x), _ptr(y), L(4))
    np.testing.assert_array_equal(y, x.astype(np.float32))
    yi = np.empty(4, np.int32)
    so.gc_cast_double_to_int(_ptr(x), _ptr(yi), L(4))
    np.testing.assert_array_equal(yi, x.astype(np.int32))


# a block of real threads (std::thread, a std::barrier for __syncthreads,
# __shared__ as statics shared by the block's threads), blocks in turn
_BLOCK_PRELUDE = """
#include <barrier>
#include <thread>
#include <vector>
struct gc_dim3 { long long x, y, z; };
static thread_local gc_dim3 threadIdx;
static gc_dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* gc_bar;
#define __global__
#define __shared__ static
#define __syncthreads() gc_bar->arrive_and_wait()
template <class F> static void gc_launch(gc_dim3 grid, gc_dim3 block, F f) {
    gridDim = grid; blockDim = block;
    for (long long z = 0; z < grid.z; ++z) for (long long y = 0; y < grid.y; ++y) for (long long x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        std::barrier<> bar(block.x * block.y);
        gc_bar = &bar;
        std::vector<std::thread> ts;
        for (long long ty = 0; ty < block.y; ++ty) for (long long tx = 0; tx < block.x; ++tx)
            ts.emplace_back([=] { threadIdx = {tx, ty, 0}; f(); });
        for (auto& t : ts) t.join();
    }
}
"""


def test_host_run_tiled_matmul(tmp_path):
    """The fallback GEMM with real 16 x 16 thread blocks, every transposition,
    broadcast batch axes and fewer z blocks than batches."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    combos = [(ta, tb) for ta in (False, True) for tb in (False, True)]
    src = _BLOCK_PRELUDE
    for k, (ta, tb) in enumerate(combos):
        src += linalg.MatrixMul(ta, tb).cuda_source("double").replace("gc_matmul_double(", f"gc_matmul_double_{k}(")
        src += (f'extern "C" void launch_{k}(const double* a, const double* b, double* c, long long M, long long N,'
                " long long K, gc_dims bs, gc_dims as, gc_dims bst, long long gz) {\n"
                "    gc_launch({(N + GC_TILE - 1) / GC_TILE, (M + GC_TILE - 1) / GC_TILE, gz}, {GC_TILE, GC_TILE, 1},\n"
                f"              [&] {{ gc_matmul_double_{k}(a, b, c, M, N, K, bs, as, bst); }});\n}}\n")
    (tmp_path / "mm.cpp").write_text(src)
    lib = tmp_path / "mm.so"
    out = subprocess.run([cxx, "-std=c++20", "-pthread", "-x", "c++", "-shared", "-fPIC", "-O1", "-o", str(lib),
                          str(tmp_path / "mm.cpp")], capture_output=True, text=True, timeout=120)
    if out.returncode and "barrier" in out.stderr:
        pytest.skip("no C++20 <barrier>")
    assert out.returncode == 0, out.stderr[-4000:]
    so = ctypes.CDLL(str(lib))
    rng = np.random.default_rng(0)
    M, N, K = 20, 7, 19                       # two tile rows, partial tiles, K over a tile
    for k, (ta, tb) in enumerate(combos):
        a = rng.standard_normal((2, 1) + ((K, M) if ta else (M, K)))
        b = rng.standard_normal((3,) + ((N, K) if tb else (K, N)))
        want = linalg.MatrixMul(ta, tb).cpu(a, b)
        bs = want.shape[:-2]
        # element strides over the output's batch axes, right-aligned, 0 where broadcast
        strides = lambda x: [0] * (len(bs) + 2 - x.ndim) + [0 if n == 1 else s // x.itemsize
                                                            for n, s in zip(x.shape[:-2], x.strides[:-2])]
        c = np.full(want.shape, np.nan)
        getattr(so, f"launch_{k}")(_ptr(a), _ptr(b), _ptr(c), L(M), L(N), L(K), _dims(bs), _dims(strides(a)),
                                   _dims(strides(b)), L(4))
        np.testing.assert_allclose(c, want, rtol=1e-12, atol=1e-12)
