"""Every standard op in the registry carries a CUDA C kernel source
(``cuda_source(ctype)``, compiled at run time by the CUDA backend): the whole
registry's sources, for float and double, compile with nvcc in one
translation unit, and every kernel is in the PTX. The simplest kernels are
also run on the host (compiled as C++, one simulated thread looping over the
grid) against the ops' NumPy kernels."""
import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

from gradcore import registry
from gradcore.ops import conv, indexing, linalg, nn, reduce, shape
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
    return {
        "Elemwise": [ew.Elemwise(r.mode) for r in ew.TABLE],
        "Reduce": [reduce.Reduce(m, (0, 2), k) for m in ("sum", "mean", "max", "min", "prod") for k in (False, True)]
        + [reduce.Reduce("sum")],
        "BroadcastBack": [reduce.BroadcastBack((1,), False, False), reduce.BroadcastBack(None, True, True)],
        "ArgReduce": [reduce.ArgReduce("argmax", 1), reduce.ArgReduce("argmin")],
        "CumSum": [reduce.CumSum(1), reduce.CumSum(0, True)],
        "MatrixMul": [linalg.MatrixMul(ta, tb) for ta in (False, True) for tb in (False, True)],
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
        "StopGradient": [shape.StopGradient()],
        "Concat": [shape.Concat(1)],
        "SplitLike": [shape.SplitLike(0)],
        "Split": [shape.Split(0, 2)],
        "Stack": [shape.Stack(1)],
        "Unstack": [shape.Unstack(1, 2)],
        "Subtensor": [indexing.Subtensor(sub_basic), indexing.Subtensor(sub_adv)],
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
        "Conv2d": [conv.Conv2d(*conv_attrs)],
        "Conv2dBackwardData": [conv.Conv2dBackwardData(*conv_attrs)],
        "Conv2dBackwardFilter": [conv.Conv2dBackwardFilter(*conv_attrs)],
        "MaxPool2d": [conv.MaxPool2d(*pool)],
        "MaxPool2dBackward": [conv.MaxPool2dBackward(*pool)],
        "MaxPool2dGather": [conv.MaxPool2dGather(*pool)],
        "AvgPool2d": [conv.AvgPool2d(*pool)],
        "AvgPool2dBackward": [conv.AvgPool2dBackward(*pool)],
    }


INSTANCES = _instances()


def _standard():
    return {e.name: e.cls for e in registry.entries() if e.dist == "gradcore"}


def test_every_standard_op_has_a_cuda_source():
    missing = sorted(name for name, cls in _standard().items() if not callable(getattr(cls, "cuda_source", None)))
    assert not missing, f"standard ops without a cuda_source: {missing}"


def test_every_standard_op_has_instances_here():
    missing = sorted(set(_standard()) - set(INSTANCES))
    assert not missing, f"standard ops without instances in {__file__}: {missing}"
    modes = {op.mode for op in INSTANCES["Elemwise"]}
    assert modes == {r.mode for r in ew.TABLE}


def _isolated(src, ctype):
    # an elementwise row's `typedef T` would clash between rows and ctypes:
    # a macro instead, undefined after the kernel (extern "C" names stay global)
    if f"typedef {ctype} T;\n" in src:
        src = src.replace(f"typedef {ctype} T;\n", f"#define T {ctype}\n", 1) + "#undef T\n"
    return src


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
                parts.append(_isolated(src, T))
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


class _Host:
    """The double kernels of ``ops`` compiled as C++; ``k(i)`` is op i's
    (only) kernel, renamed apart."""

    def __init__(self, tmp_path, ops):
        cxx = shutil.which("g++") or shutil.which("c++")
        if cxx is None:
            pytest.skip("no C++ compiler")
        src, self.names = _HOST_PRELUDE, []
        for i, op in enumerate(ops):
            s = op.cuda_source("double")
            (name,) = KERNEL.findall(s)
            src += s.replace(f"{name}(", f"{name}__{i}(") + "\n"
            self.names.append(f"{name}__{i}")
        (tmp_path / "k.cpp").write_text(src)
        lib = tmp_path / "k.so"
        out = subprocess.run([cxx, "-x", "c++", "-shared", "-fPIC", "-O1", "-o", str(lib), str(tmp_path / "k.cpp")],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-4000:]
        self.so = ctypes.CDLL(str(lib))

    def __call__(self, i, *args):
        conv_ = [_ptr(a) if isinstance(a, np.ndarray) else a for a in args]
        getattr(self.so, self.names[i])(*conv_)


def _around(shp, axis):
    """(outer, n, inner) of a contiguous shape around ``axis``."""
    ax = axis % len(shp)
    return (L(int(np.prod(shp[:ax], dtype=np.int64))), L(shp[ax]), L(int(np.prod(shp[ax + 1:], dtype=np.int64))))


def test_host_run_matches_numpy(tmp_path):
    rng = np.random.default_rng(0)
    reduces = [reduce.Reduce(m, 1) for m in ("sum", "mean", "max", "min", "prod")]
    ops = reduces + [
        shape.Transpose((2, 0, 1)), shape.Broadcast((2, 3, 4)), shape.BroadcastToLike(), shape.SumTo((3, 1)),
        shape.SumToLike(), reduce.BroadcastBack((0, 2), False, True), reduce.BroadcastBack(None, False, False),
        nn.LogSoftmax(1), nn.LogSumExp(1), shape.Concat(1), shape.SplitLike(1), shape.ZerosLike(),
        shape.Reshape((6,)), indexing.IndexingOneHot(1), indexing.IndexingOneHotGrad(1, False),
        indexing.Subtensor(split_index(([0, 2, 2],))[0]), indexing.SubtensorGrad(split_index(([0, 2, 2],))[0]),
        indexing.SetSubtensor(split_index(([0, 2, 2],))[0]),
    ]
    run = _Host(tmp_path, ops)
    at, seen = {}, {}                 # "Transpose0" -> the first Transpose's position in ops
    for i, op in enumerate(ops):
        k = seen[type(op)] = seen.get(type(op), -1) + 1
        at[f"{type(op).__name__}{k}"] = i
    x = rng.standard_normal((2, 3, 4))
    x[0, 1, 2] = np.nan               # max / min propagate NaN like NumPy
    for i, op in enumerate(reduces):
        y = np.full((2, 4), -7.0)
        run(i, x, y, *_around(x.shape, 1))
        np.testing.assert_allclose(y, op.cpu(x), rtol=1e-12)
    x = rng.standard_normal((2, 3, 4))

    # transpose
    y = np.empty((4, 2, 3))
    run(at["Transpose0"], x, y, _dims(x.shape))
    np.testing.assert_array_equal(y, x.transpose(2, 0, 1))

    # broadcast with a static shape and like a reference
    b = rng.standard_normal((3, 1))
    y = np.empty((2, 3, 4))
    run(at["Broadcast0"], b, y, _dims(b.shape))
    np.testing.assert_array_equal(y, np.broadcast_to(b, (2, 3, 4)))
    y = np.empty((2, 3, 4))
    run(at["BroadcastToLike0"], b, y, _dims(b.shape), _dims((2, 3, 4)))
    np.testing.assert_array_equal(y, np.broadcast_to(b, (2, 3, 4)))

    # sum over broadcast axes
    y = np.empty((3, 1))
    run(at["SumTo0"], x, y, _dims(x.shape))
    np.testing.assert_allclose(y, shape.sum_to(x, (3, 1)), rtol=1e-12)
    y = np.empty((2, 1, 4))
    run(at["SumToLike0"], x, y, _dims(x.shape), _dims((2, 1, 4)))
    np.testing.assert_allclose(y, shape.sum_to(x, (2, 1, 4)), rtol=1e-12)

    # broadcast back of a mean over non-adjacent axes, and of a full sum
    g = rng.standard_normal(3)
    y = np.empty((2, 3, 4))
    run(at["BroadcastBack0"], g, y, _dims((2, 3, 4)))
    np.testing.assert_allclose(y, ops[at["BroadcastBack0"]].cpu(g, x), rtol=1e-12)
    g0 = np.asarray(1.5)
    y = np.empty((2, 3, 4))
    run(at["BroadcastBack1"], g0, y, _dims((2, 3, 4)))
    np.testing.assert_array_equal(y, np.full((2, 3, 4), 1.5))

    # log_softmax and logsumexp over the middle axis
    y = np.empty_like(x)
    run(at["LogSoftmax0"], x, y, *_around(x.shape, 1))
    np.testing.assert_allclose(y, nn.LogSoftmax(1).cpu(x), rtol=1e-12, atol=1e-12)
    y = np.empty((2, 4))
    run(at["LogSumExp0"], x, y, *_around(x.shape, 1))
    np.testing.assert_allclose(y, np.log(np.exp(x).sum(1)), rtol=1e-12)

    # concat and split along axis 1, one launch per piece
    a, c = rng.standard_normal((2, 1, 4)), rng.standard_normal((2, 2, 4))
    y = np.empty((2, 3, 4))
    for piece, off in ((a, 0), (c, 1)):
        outer, _, inner = _around(piece.shape, 1)
        run(at["Concat0"], piece, y, outer, L(3), L(off), L(piece.shape[1]), inner)
    np.testing.assert_array_equal(y, np.concatenate([a, c], 1))
    for piece, off in ((a, 0), (c, 1)):
        out = np.empty_like(piece)
        outer, _, inner = _around(piece.shape, 1)
        run(at["SplitLike0"], y, out, outer, L(3), L(off), L(piece.shape[1]), inner)
        np.testing.assert_array_equal(out, piece)

    # fill and copy
    y = np.full((2, 3), 5.0)
    run(at["ZerosLike0"], y, L(y.size))
    np.testing.assert_array_equal(y, 0)
    z = rng.standard_normal((2, 3))
    y = np.empty(6)
    run(at["Reshape0"], z, y, L(6))
    np.testing.assert_array_equal(y, z.reshape(6))

    # indexing_one_hot and its gradient, a negative index included
    xi = rng.standard_normal((3, 4))
    index = np.array([0, -1, 2], np.int32)
    y = np.empty(3)
    run(at["IndexingOneHot0"], xi, index, y, *_around(xi.shape, 1))
    np.testing.assert_array_equal(y, indexing.IndexingOneHot(1).cpu(xi, index.astype(np.int64)))
    gi = rng.standard_normal(3)
    y = np.full((3, 4), np.nan)
    run(at["IndexingOneHotGrad0"], gi, index, y, *_around(xi.shape, 1))
    np.testing.assert_array_equal(y, indexing.IndexingOneHotGrad(1, False).cpu(gi, xi, index.astype(np.int64) % 4))

    # subtensor family by host-computed flat offsets: x[[0, 2, 2]] of a (3, 2)
    xs = rng.standard_normal((3, 2))
    rows = np.array([0, 2, 2])
    offsets = np.arange(xs.size).reshape(xs.shape)[rows].ravel().astype(np.int64)
    sub = ops[at["Subtensor0"]]
    y = np.empty((3, 2))
    run(at["Subtensor0"], xs, offsets, y, L(offsets.size))
    np.testing.assert_array_equal(y, sub.cpu(xs, rows))
    gs = rng.standard_normal((3, 2))
    y = np.zeros((3, 2))
    run(at["SubtensorGrad0"], gs, offsets, y, L(offsets.size))
    np.testing.assert_allclose(y, ops[at["SubtensorGrad0"]].cpu(gs, xs, rows), rtol=1e-12)
    value = rng.standard_normal(2)                     # broadcast over the 3 selected rows
    vpos = np.broadcast_to(np.arange(value.size), (3, 2)).ravel()
    last = {o: i for i, o in enumerate(offsets)}     # the last write of a repeated offset wins
    keep = np.array(sorted(last.values()))
    y = xs.copy()
    run(at["SetSubtensor0"], value, offsets[keep].copy(), vpos[keep].astype(np.int64), y, L(keep.size))
    np.testing.assert_array_equal(y, ops[at["SetSubtensor0"]].cpu(xs, value, rows))


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
