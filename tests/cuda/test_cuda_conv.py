"""conv2d (im2col + cuBLAS, and the direct kernels), max_pool2d and
avg_pool2d on cuda: cpu vs cuda, first and second order (the gradient ops
Conv2dBackwardData/Filter, MaxPool2dBackward/Gather, AvgPool2dBackward run
in the backward graphs)."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.op import OpError
from gradcore.ops import conv, pool
from gradcore.cuda import runtime


def _rand(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(dtype)


# (x shape, weight shape, stride, padding, dilation, groups)
CONV_CASES = {
    "plain": ((2, 3, 5, 6), (4, 3, 3, 2), 1, 0, 1, 1),
    "stride-padding": ((2, 3, 6, 5), (4, 3, 3, 3), 2, 1, 1, 1),
    "asymmetric": ((1, 2, 7, 6), (3, 2, 2, 3), (2, 1), (1, 2), (1, 2), 1),
    "dilation": ((2, 2, 7, 7), (2, 2, 3, 3), 1, 2, 2, 1),
    "groups": ((2, 4, 5, 5), (6, 2, 3, 3), 1, 1, 1, 2),
    "depthwise": ((2, 3, 5, 4), (3, 1, 3, 3), (1, 2), 1, 1, 3),
    "pointwise": ((2, 4, 3, 3), (5, 4, 1, 1), 1, 0, 1, 1),
    "pointwise-groups": ((2, 4, 3, 3), (4, 2, 1, 1), 1, 0, 1, 2),
    "1x1-strided": ((1, 2, 5, 5), (3, 2, 1, 1), 2, 0, 1, 1),
    "size-1": ((1, 1, 1, 1), (1, 1, 1, 1), 1, 0, 1, 1),
    "padding-only-input": ((1, 2, 1, 2), (2, 2, 3, 3), 1, 1, 1, 1),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv2d(cuda, matches_cpu, conv_path, case):
    xs, ws, stride, padding, dilation, groups = CONV_CASES[case]
    matches_cpu(lambda x, w: F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups),
                [_rand(*xs), _rand(*ws)], rtol=1e-4, atol=1e-4)


def test_conv2d_bias_and_5d_weight(cuda, matches_cpu, conv_path):
    x, w, b = _rand(2, 4, 5, 5), _rand(2, 3, 2, 3, 3), _rand(1, 6, 1, 1)
    matches_cpu(lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2), [x, w, b], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n, form", [(1, "O"), (2, "O"), (2, "1O11"), (3, "1O11")])
def test_conv_bias_in_the_op_both_orders(cuda, matches_cpu, conv_path, n, form):
    """The bias as Convolution's third input: added on cuda after the
    convolution, its gradient one reduction beside the filter gradient."""
    x, w, b = _rand(2, 4, *(5,) * n), _rand(6, 2, *(3,) * n, seed=1), _rand(6, seed=2)
    if form != "O":
        b = b.reshape((1, 6) + (1,) * n)
    fn = {1: F.nn.conv1d, 2: F.conv2d, 3: F.conv3d}[n]
    matches_cpu(lambda x, w, b: fn(x, w, b, stride=2, padding=1, groups=2) ** 2, [x, w, b], rtol=1e-4, atol=1e-4)


def test_conv_bias_frozen_weight_and_empty_batch(cuda, matches_cpu):
    x, w, b = _rand(2, 3, 5, 5), _rand(4, 3, 3, 3, seed=1), _rand(1, 4, 1, 1, seed=2)
    matches_cpu(lambda x, b: F.conv2d(x, gc.Tensor(w, device=x.device), b, padding=1) ** 2, [x, b],
                rtol=1e-4, atol=1e-4)
    matches_cpu(lambda x, w, b: F.conv2d(x, w, b, padding=1), [_rand(0, 3, 5, 5), w, b], rtol=1e-4, atol=1e-4)


def test_conv2d_float64(cuda, matches_cpu, conv_path):
    x, w = _rand(2, 4, 6, 5, dtype=np.float64), _rand(6, 2, 3, 2, dtype=np.float64)
    matches_cpu(lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2), [x, w],
                rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", ["stride-padding", "groups", "pointwise"])
def test_conv2d_in_image_chunks(cuda, matches_cpu, monkeypatch, case):
    """Scratch matrices for one image at a time: the forward and the data
    gradient in pieces, the filter gradient summed over chunks (beta = 1)."""
    monkeypatch.setattr(conv, "CUDA_CHUNK_ELEMS", 1)
    xs, ws, stride, padding, dilation, groups = CONV_CASES[case]
    x = _rand(3, *xs[1:])
    matches_cpu(lambda x, w: F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups),
                [x, _rand(*ws)], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs, ws, padding", [((0, 3, 4, 4), (2, 3, 3, 3), 0), ((2, 3, 4, 4), (0, 3, 3, 3), 0),
                                             ((2, 0, 4, 4), (2, 0, 3, 3), 0), ((2, 3, 0, 4), (2, 3, 1, 1), 1)],
                         ids=["no-images", "no-filters", "no-channels", "no-rows-but-padding"])
def test_conv2d_empty(cuda, matches_cpu, conv_path, xs, ws, padding):
    matches_cpu(lambda x, w: F.conv2d(x, w, padding=padding), [_rand(*xs), _rand(*ws)])


def test_conv2d_runs_on_cublas(cuda, monkeypatch):
    from gradcore.cuda import cudnn
    monkeypatch.setattr(cudnn, "enabled", False)     # on a GPU cuDNN would run it: this is the other path
    calls = []
    real = cuda.gemm        # the backend's cuBLAS calls (on a GPU through C function pointers)
    monkeypatch.setattr(cuda, "gemm", lambda *a: (calls.append(a), real(*a))[1], raising=False)
    x, w = _rand(2, 4, 5, 5), _rand(6, 2, 3, 3)
    got = F.conv2d(gc.Tensor(x, device="cuda"), gc.Tensor(w, device="cuda"), groups=2).numpy()
    np.testing.assert_allclose(got, F.conv2d(gc.Tensor(x), gc.Tensor(w), groups=2).numpy(), rtol=1e-4, atol=1e-5)
    assert len(calls) == 2                     # one GEMM per group, batched over the images


def test_conv_errors_match_cpu(cuda):
    for device in ("cpu", "cuda"):
        x = gc.Tensor(_rand(1, 3, 5, 5), device=device)
        with pytest.raises(OpError, match="channel mismatch"):
            F.conv2d(x, gc.Tensor(_rand(2, 2, 3, 3), device=device))
        with pytest.raises(OpError, match="larger than the padded input"):
            F.conv2d(x, gc.Tensor(_rand(2, 3, 7, 3), device=device))
        with pytest.raises(OpError, match="floating-point"):
            F.conv2d(gc.Tensor(np.ones((1, 1, 3, 3), np.int32), device=device),
                     gc.Tensor(np.ones((1, 1, 1, 1), np.int32), device=device))
        with pytest.raises(OpError, match="padding"):
            F.max_pool2d(x, 2, padding=2)


def test_float16_is_a_clear_error(cuda, conv_path):
    x = gc.Tensor(np.ones((1, 1, 4, 4), np.float16), device="cuda")
    for fn in (lambda x: F.conv2d(x, x), lambda x: F.max_pool2d(x, 2), lambda x: F.avg_pool2d(x, 2)):
        with pytest.raises(TypeError, match="no float16 kernels"):
            fn(x)


# ---------------------------------------------------------------- pooling
# (x shape, kernel_size, stride, padding)
POOL_CASES = {
    "2x2": ((2, 3, 4, 4), 2, None, 0),
    "overlapping": ((2, 2, 5, 6), 3, 1, 1),
    "asymmetric": ((1, 2, 7, 6), (3, 2), (2, 1), (1, 1)),
    "ragged": ((1, 2, 5, 5), 2, 2, 0),           # the last row/column never pooled
    "global": ((2, 3, 3, 3), 3, None, 0),
    "size-1": ((1, 1, 1, 1), 1, None, 0),
    "empty": ((0, 2, 4, 4), 2, None, 0),
}


@pytest.mark.parametrize("case", list(POOL_CASES))
def test_max_pool2d(cuda, matches_cpu, case):
    xs, k, s, p = POOL_CASES[case]
    matches_cpu(lambda x: F.max_pool2d(x, k, s, p), [_rand(*xs)])


def test_max_pool2d_ties_and_nan(cuda, matches_cpu):
    """The first maximum of a window gets the gradient, a NaN wins: as on the CPU."""
    x = np.zeros((1, 2, 4, 4), np.float32)
    x[0, 0, 1:3, 1:3] = 1.0
    x[0, 1, 0, 3] = np.nan
    matches_cpu(lambda x: F.max_pool2d(x, 2, 1), [x])
    matches_cpu(lambda x: F.max_pool2d(x, 3, 1, 1), [x], second_order=False)


def test_max_pool2d_float64(cuda, matches_cpu):
    matches_cpu(lambda x: F.max_pool2d(x * x, 3, 2, 1), [_rand(2, 2, 5, 5, dtype=np.float64)], rtol=1e-12)


@pytest.mark.parametrize("mode", pool.AVG_MODES)
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_avg_pool2d(cuda, matches_cpu, case, mode):
    xs, k, s, p = POOL_CASES[case]
    matches_cpu(lambda x: F.avg_pool2d(x, k, s, p, mode=mode), [_rand(*xs)])


def test_avg_pool2d_float64(cuda, matches_cpu):
    matches_cpu(lambda x: F.avg_pool2d(x * x, 3, 1, 1), [_rand(2, 2, 4, 5, dtype=np.float64)], rtol=1e-12)


def test_small_cnn(cuda, matches_cpu):
    """conv -> relu -> max pool -> conv -> avg pool -> linear -> cross entropy."""
    def net(x, w1, w2, fc):
        h = F.max_pool2d(F.relu(F.conv2d(x, w1, padding=1)), 2)
        h = F.avg_pool2d(F.conv2d(h, w2, groups=2), 2)
        return F.cross_entropy(F.linear(F.reshape(h, (2, -1)), fc), np.array([1, 0]))
    matches_cpu(net, [_rand(2, 2, 6, 6), _rand(4, 2, 3, 3), _rand(4, 2, 1, 1), _rand(3, 4)], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_gemm_source_compiles_with_nvcc(tmp_path):
    (tmp_path / "k.cu").write_text(conv.gemm_source("float") + conv.gemm_source("double"))
    out = subprocess.run([shutil.which("nvcc"), "--ptx", "-o", str(tmp_path / "k.ptx"), str(tmp_path / "k.cu")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    ptx = (tmp_path / "k.ptx").read_text()
    assert all(f"gc_{k}_{T}" in ptx for k in ("im2col", "col2im") for T in ("float", "double"))


# ---------------------------------------------------------------- one compiled kernel per C type
# Two configurations (attributes and shapes all different): (conv attributes,
# x shape, weight shape), (pool attributes, x shape, avg mode).
CONFIGS = {
    "a": ((((1, 1), (0, 0), (1, 1), 1), (2, 3, 5, 5), (4, 3, 3, 3)), ((2, None, 0), (2, 2, 4, 4), "average")),
    "b": ((((2, 1), (1, 2), (1, 2), 2), (1, 4, 7, 6), (6, 2, 2, 3)),
          (((3, 2), (2, 1), (1, 1)), (1, 3, 6, 5), "average_count_exclude_padding")),
}


# the same for the transposed, 3-d and 1-d convolutions: (ConvTranspose attributes,
# x shape, weight shape), (3-d attributes, x shape, weight shape), (1-d ...)
CONFIGS_MORE = {
    "a": (((1, 0, 0, 1, 1), (2, 3, 4, 4), (3, 2, 3, 3)), ((1, 0, 1, 1), (1, 2, 3, 4, 3), (3, 2, 2, 2, 2)),
          ((1, 0, 1, 1), (2, 3, 7), (4, 3, 3))),
    "b": (((2, 1, 1, (1, 2), 2), (1, 4, 3, 3), (4, 3, 2, 3)),
          (((2, 1, 1), (1, 0, 1), (1, 2, 1), 2), (1, 4, 4, 3, 5), (2, 2, 3, 2, 2)),
          (((2,), (1,), (2,), 2), (1, 4, 9), (6, 2, 3))),
}


def _instances(config, dtype=np.float32):
    """Instances of every op class of conv.py and pool.py for ``config`` (the
    convolution and its gradients in 2-d, 3-d and 1-d), with inputs: [(op, arrays)]."""
    (attrs, xs, ws), (pool_attrs, ps, mode) = CONFIGS[config]
    (ct, cxs, cws), conv3d, conv1d = CONFIGS_MORE[config]
    out = []
    for seed, (a, xs_, ws_) in enumerate(((attrs, xs, ws), conv3d, conv1d)):
        x, w = _rand(*xs_, dtype=dtype, seed=10 * seed + 1), _rand(*ws_, dtype=dtype, seed=10 * seed + 2)
        g = _rand(*conv.Convolution(*a).cpu(x, w).shape, dtype=dtype, seed=10 * seed + 3)
        out += [(conv.Convolution(*a), [x, w]), (conv.ConvolutionBackwardData(*a), [g, w, x]),
                (conv.ConvolutionBackwardFilter(*a), [g, x, w])]
    p = _rand(*ps, dtype=dtype, seed=40)
    gp = _rand(*pool.MaxPool2d(*pool_attrs).cpu(p).shape, dtype=dtype, seed=41)
    return out + [(pool.MaxPool2d(*pool_attrs), [p]), (pool.MaxPool2dBackward(*pool_attrs), [gp, p]),
                  (pool.MaxPool2dGather(*pool_attrs), [_rand(*ps, dtype=dtype, seed=42), p]),
                  (pool.AvgPool2d(*pool_attrs, mode), [p]), (pool.AvgPool2dBackward(*pool_attrs, mode), [gp, p]),
                  (conv.ConvTranspose(*ct), [_rand(*cxs, dtype=dtype, seed=43), _rand(*cws, dtype=dtype, seed=44)])]


@pytest.mark.parametrize("ctype", ["float", "double"])
def test_one_source_per_class_and_ctype(ctype):
    """The attributes, shapes and number of spatial axes are kernel
    arguments: every instance of an op class has the same source (the
    backend loads one module for all)."""
    sources = {}
    for (a, _), (b, _) in zip(_instances("a"), _instances("b")):
        assert type(a) is type(b) and a != b
        sources.setdefault(type(a), set()).update({a.cuda_source(ctype), b.cuda_source(ctype)})
    assert set(sources) == set(conv.CONV_OPS) | set(pool.POOL_OPS)
    assert all(len(v) == 1 for v in sources.values()), sources
    # the classes' kernels differ, but ConvTranspose runs ConvolutionBackwardData's
    assert len(set.union(*sources.values())) == len(sources) - 1
    assert sources[conv.ConvTranspose] == sources[conv.ConvolutionBackwardData]


def test_each_source_compiles_once(fresh_backend, monkeypatch):
    """Both configurations of every op (the convolutions on both cuda paths)
    load and compile each kernel source once: the second one adds nothing."""
    be, loads = fresh_backend
    from gradcore.cuda import cudnn
    monkeypatch.setattr(cudnn, "enabled", False)     # gradcore's own kernels (on a GPU cuDNN runs these)
    counts = []
    for config in CONFIGS:
        for gemm in (True, False):
            monkeypatch.setattr(conv, "CUDA_GEMM", gemm)
            for op, arrays in _instances(config):
                got = op.cuda(be, *[be.to_device(a) for a in arrays]).get()
                np.testing.assert_allclose(got, op.cpu(*arrays), rtol=1e-4, atol=1e-5, err_msg=repr(op))
        counts.append((len(loads), len(be._modules)))
    # the weight gradient's ones are filled on the device (the fill kernel)
    want = {op.cuda_source("float") for op, _ in _instances("a")} | {conv.gemm_source("float"),
                                                                       runtime.fill_source("float")}
    assert len(loads) == len(set(loads)) and set(loads) == want
    assert counts == [(len(want), len(want))] * 2
    if be.driver.kind == "emulator":
        assert be.driver.stats["compiles"] == len(want)
