"""Fused backward kernels (gradcore.cuda.fusion), checked without a GPU:

- every elementwise mode's backward graph (each requires-grad mask) fuses
  into one kernel whose source compiles with nvcc;
- the same kernels, compiled as C++ with g++ (a prelude maps the CUDA
  keywords, a launcher loops over a simulated grid of blocks and threads),
  compute what the graph's NumPy ``run_raw`` computes: to 1e-5 in float and
  1e-12 in double;
- a backward of N elementwise nodes is one kernel.
"""
import ctypes
import itertools
import re
import shutil
import subprocess

import numpy as np
import pytest

from gradcore import _core
from gradcore.cuda import fuse_elementwise
from gradcore.devices import nvcc_path
from gradcore.graph import make_backward_graph
from gradcore.op import Op, TensorDesc
from gradcore.ops import shape as shape_ops
from gradcore.ops.elemwise import TABLE, Elemwise

NVCC = nvcc_path()
CXX = shutil.which("g++") or shutil.which("c++")
DTYPE = {"float": np.float32, "double": np.float64}
TOL = {"float": 1e-5, "double": 1e-12}
N = 257                         # not a multiple of the simulated grid
GRID, BLOCK = 3, 7


# ---------------------------------------------------------------- cases
def _elemwise_cases():
    """(op, input dtypes as "T"/"bool", requires-grad mask) for every
    differentiable mode and every non-empty mask of its differentiable inputs."""
    cases = []
    for row in TABLE:
        if row.grads is None or all(g is None for g in row.grads):
            continue
        kinds = ["bool" if (row.mode == "where" and i == 0) else "T" for i in range(len(row.grads))]
        diff = [i for i, g in enumerate(row.grads) if g is not None]
        for r in range(1, len(diff) + 1):
            for chosen in itertools.combinations(diff, r):
                mask = tuple(i in chosen for i in range(len(row.grads)))
                cases.append((row.mode, tuple(kinds), mask))
    return cases


CASES = _elemwise_cases()
CASE_IDS = [f"{m}-{''.join('1' if r else '0' for r in mask)}" for m, _, mask in CASES]


def _E(mode, *args):
    return _core.apply(Elemwise(mode), *args)[0]


class Chain(Op):
    """A test op whose VJP is a chain of 2*depth elementwise ops."""
    name = "TestFusionChain"
    attrs = ("depth",)

    def __init__(self, depth):
        self.depth = depth

    def infer(self, x, w):
        return (x,)

    def cpu(self, x, w):
        return x

    def vjp(self, inputs, outputs, grads):
        x, w = inputs
        g = grads[0]
        for k in range(self.depth):
            g = _E("mul", _E("tanh", g), x) if k % 2 == 0 else _E("add", _E("sin", g), w)
        return [g, _E("mul", g, outputs[0])]


class Decomposed(Op):
    """softplus(x) * sigmoid(x) + x, by decomposition: its backward graph
    carries the SumToLike nodes of a decomposition."""
    name = "TestFusionDecomposed"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        sp = np.logaddexp(x, 0)
        return sp * ((np.tanh(x * 0.5) + 1) * 0.5) + x

    def decompose(self, x):
        return _E("add", _E("mul", _E("softplus", x), _E("sigmoid", x)), x)


def _graph(op, kinds, mask, ctype):
    dt = np.dtype(DTYPE[ctype])
    descs = [TensorDesc(None, np.dtype(bool) if k == "bool" else dt, "cpu") for k in kinds]
    return make_backward_graph(op, descs, list(mask))[0]


def _inputs(op, kinds, ctype, rng):
    dt = DTYPE[ctype]
    lo, hi = op.row.domain if isinstance(op, Elemwise) else (-2.0, 2.0)
    xs = []
    for k in kinds:
        if k == "bool":
            xs.append(rng.random(N) < 0.5)
        else:
            xs.append(rng.uniform(lo, hi, N).astype(dt))
    if isinstance(op, Elemwise) and op.mode in ("maximum", "minimum"):
        xs[1][::5] = xs[0][::5]         # ties take the 0.5 branch
    return xs


def _reference(graph, values, grads):
    """The graph's own NumPy backward, called as the core calls it."""
    # a precomp carrier only stands for its source's shape: the value will do
    saved = [values[v] for v in graph.saved_vids] + [values[src] for src, _ in graph.precomp]
    s = saved[0] if len(saved) == 1 else tuple(saved)
    g = grads[0] if graph.n_out == 1 else tuple(grads)
    res = graph.compiled.run_raw(s, g)
    return (res,) if graph.n_in == 1 else tuple(res)


# ---------------------------------------------------------------- host emulation
_PRELUDE = """
#include <cmath>
#include <cstdint>
using namespace std;
#define __global__
#define __device__
#define __forceinline__ inline
struct gc_dim3 { unsigned int x, y, z; };
static gc_dim3 blockIdx, threadIdx, blockDim, gridDim;
"""


def _launcher(kernel):
    args = [p.name for p in kernel.inputs] + [o.name for o in kernel.outputs] + ["n"]
    return (f'extern "C" void launch_{kernel.name}({kernel.signature()})\n{{\n'
            f"    blockDim = {{{BLOCK}, 1, 1}}; gridDim = {{{GRID}, 1, 1}};\n"
            f"    for (unsigned b = 0; b < {GRID}; ++b)\n"
            f"        for (unsigned t = 0; t < {BLOCK}; ++t) {{\n"
            f"            blockIdx = {{b, 0, 0}}; threadIdx = {{t, 0, 0}};\n"
            f"            {kernel.name}({', '.join(args)});\n"
            f"        }}\n}}\n")


class HostLib:
    """All given fused kernels in one shared library built by g++."""

    def __init__(self, kernels, tmp):
        uniq = {k.name: k for k in kernels}
        src = _PRELUDE + "".join(k.source + _launcher(k) for k in uniq.values())
        cpp, so = tmp / "fused.cpp", tmp / "fused.so"
        cpp.write_text(src)
        out = subprocess.run([CXX, "-O1", "-std=c++17", "-fPIC", "-shared", "-o", str(so), str(cpp)],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-4000:]
        self.lib = ctypes.CDLL(str(so))

    def run(self, kernel, params):
        """params: vid -> array of N elements; returns {input index: grad}."""
        fn = getattr(self.lib, f"launch_{kernel.name}")
        args, outs = [], {}
        for p in kernel.inputs:
            a = np.ascontiguousarray(params[p.vid], dtype=bool if p.ctype == "bool" else DTYPE[p.ctype])
            params[p.vid] = a           # keep alive
            args.append(a.ctypes.data_as(ctypes.c_void_p))
        for o in kernel.outputs:
            outs[o.index] = np.full(N, np.nan, DTYPE[o.ctype])
            args.append(outs[o.index].ctypes.data_as(ctypes.c_void_p))
        fn.argtypes = [ctypes.c_void_p] * (len(args)) + [ctypes.c_longlong]
        fn.restype = None
        fn(*args, N)
        return outs


def _all_kernels(ctype):
    ks = []
    for mode, kinds, mask in CASES:
        ks.append(fuse_elementwise(_graph(Elemwise(mode), kinds, mask, ctype), ctype))
    ks.append(fuse_elementwise(_graph(Chain(12), ("T", "T"), (True, True), ctype), ctype))
    ks.append(fuse_elementwise(_graph(Decomposed(), ("T",), (True,), ctype), ctype, same_shape=True))
    return ks


@pytest.fixture(scope="module", params=["float", "double"])
def host(request, tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler (g++) to emulate the kernels on the host")
    ctype = request.param
    return ctype, HostLib(_all_kernels(ctype), tmp_path_factory.mktemp(f"host_{ctype}"))


def _check(host, op, kinds, mask, same_shape=False, seed=0):
    ctype, lib = host
    graph = _graph(op, kinds, mask, ctype)
    kernel = fuse_elementwise(graph, ctype, same_shape=same_shape)
    assert kernel is not None
    rng = np.random.default_rng(seed)
    xs = _inputs(op, kinds, ctype, rng)
    with np.errstate(all="ignore"):
        ys = op.cpu(*xs)
    ys = [np.asarray(ys, DTYPE[ctype])] if not isinstance(ys, (tuple, list)) else [np.asarray(y) for y in ys]
    gs = [rng.standard_normal(N).astype(DTYPE[ctype]) for _ in ys]
    values = {i: x for i, x in enumerate(xs)}
    values.update({len(xs) + k: y for k, y in enumerate(ys)})
    values.update({len(xs) + len(ys) + k: g for k, g in enumerate(gs)})
    with np.errstate(all="ignore"):
        ref = _reference(graph, {v: a.copy() for v, a in values.items()}, [g.copy() for g in gs])
    got = lib.run(kernel, dict(values))
    assert sorted(got) == [i for i, v in enumerate(graph.grad_vids) if v is not None]
    tol = TOL[ctype]
    for i, d in got.items():
        want = np.broadcast_to(np.asarray(ref[i], DTYPE[ctype]), (N,))
        np.testing.assert_allclose(d, want, rtol=tol, atol=tol, err_msg=f"grad of input {i}\n{kernel.source}")
    return kernel


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("mode,kinds,mask", CASES, ids=CASE_IDS)
def test_fused_matches_numpy_backward(host, mode, kinds, mask):
    kernel = _check(host, Elemwise(mode), kinds, mask)
    assert kernel.source.count("__global__") == 1


def test_every_elementwise_backward_fuses():
    for ctype in ("float", "double"):
        for mode, kinds, mask in CASES:
            k = fuse_elementwise(_graph(Elemwise(mode), kinds, mask, ctype), ctype)
            assert k is not None, (mode, mask)
            assert {o.index for o in k.outputs} == {i for i, r in enumerate(mask) if r}


def test_bool_intermediates_are_typed_bool():
    k = fuse_elementwise(_graph(Elemwise("relu"), ("T",), (True,), "float"), "float")
    # the comparison's value is a bool, its operands of the node's element type
    assert re.search(r"bool v(\d+);.*\n.*typedef float T; const float x = v\d+; .* v\1 = \(bool\)\(x > ", k.source)
    k = fuse_elementwise(_graph(Elemwise("where"), ("bool", "T", "T"), (False, True, True), "double"), "double")
    assert "const bool* __restrict__ s0" in k.source
    assert [(p.role, p.ctype) for p in k.inputs] == [("input", "bool"), ("grad", "double")]
    assert [o.index for o in k.outputs] == [1, 2]


def test_chain_of_n_elementwise_nodes_is_one_kernel(host):
    op = Chain(12)
    graph = _graph(op, ("T", "T"), (True, True), host[0])
    assert len(graph.nodes) >= 24
    kernel = _check(host, op, ("T", "T"), (True, True))
    assert kernel.source.count("__global__") == 1
    assert kernel.n_nodes == len(graph.nodes)
    # the intermediates are locals: the only device arrays are the parameters
    assert len(re.findall(r"\w+\[i\]", kernel.source)) == len(kernel.inputs) + len(kernel.outputs)


def test_decomposition_fuses_in_the_same_shape_class(host):
    ctype = host[0]
    graph = _graph(Decomposed(), ("T",), (True,), ctype)
    assert any(n.op.name == "SumToLike" for n in graph.nodes)
    assert fuse_elementwise(graph, ctype) is None          # shapes unknown: not fusable
    kernel = _check(host, Decomposed(), ("T",), (True,), same_shape=True)
    assert kernel.source.count("__global__") == 1


def test_non_elementwise_graph_is_not_fused():
    from gradcore.ops.reduce import Reduce
    d = TensorDesc(None, np.dtype("float32"), "cpu")
    graph = make_backward_graph(Reduce("sum", 0), [d], [True])[0]
    assert fuse_elementwise(graph) is None
    graph = make_backward_graph(shape_ops.Reshape((2, 3)), [d], [True])[0]
    assert fuse_elementwise(graph) is None


def test_no_gradient_no_kernel():
    graph = _graph(Elemwise("mul"), ("T", "T"), (False, False), "float")
    assert fuse_elementwise(graph) is None


def test_kernel_name_is_deterministic_and_depends_on_structure_and_ctype():
    def name(mode, mask, ctype):
        return fuse_elementwise(_graph(Elemwise(mode), ("T",) * len(mask), mask, ctype), ctype).name
    a = name("mul", (True, True), "float")
    assert a == name("mul", (True, True), "float")
    assert a.startswith("gc_bwd_mul_float_")
    assert re.fullmatch(r"[A-Za-z_]\w*", a)
    assert a != name("mul", (True, False), "float")
    assert name("mul", (True, True), "double") != a
    names = {name(m, mask, c) for m, kinds, mask in CASES if "bool" not in kinds for c in ("float", "double")}
    assert len(names) == 2 * sum(1 for _, kinds, _ in CASES if "bool" not in kinds)
    # same source text in a fresh process: the hash does not depend on ids or addresses
    code = ("from gradcore.graph import make_backward_graph; from gradcore.op import TensorDesc; "
            "from gradcore.ops.elemwise import Elemwise; from gradcore.cuda import fuse_elementwise; "
            "d=TensorDesc(None,'float32','cpu'); "
            "print(fuse_elementwise(make_backward_graph(Elemwise('mul'),[d,d],[True,True])[0]).name)")
    import sys
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == a, out.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("ctype", ["float", "double"])
def test_fused_sources_compile_with_nvcc(tmp_path, ctype):
    kernels = {k.name: k for k in _all_kernels(ctype)}
    src = tmp_path / f"fused_{ctype}.cu"
    src.write_text("".join(k.source for k in kernels.values()))
    ptx = tmp_path / "fused.ptx"
    out = subprocess.run([NVCC, "--ptx", "-arch=sm_80", "-o", str(ptx), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    text = ptx.read_text()
    for name in kernels:
        assert f".entry {name}(" in text
