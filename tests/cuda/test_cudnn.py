"""cuDNN (gradcore/cuda/cudnn.py) without a GPU.

- The real library: found in the ``nvidia-cudnn-cu13`` wheel, every bound
  function resolves, ``cudnnGetVersion`` answers; ``cudnnCreate`` fails
  without a GPU and the backend falls back to im2col + cuBLAS, saying why.
- Everything above the library against a fake cuDNN (fake_cudnn.py: C
  function pointers with cuDNN's prototypes, checking each call's
  arguments, computing with the CPU kernels, rounding float32 operands to
  TF32 where the math mode allows tensor ops): the descriptors, the
  algorithm choice and its cache, the switches (benchmark, deterministic,
  workspace limit, TF32), the workspace from the memory pool, the fallback
  for refused configurations, first- and second-order gradients through the
  ops, pooling, and what ``gradcore doctor`` reports.
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil

import numpy as np
import pytest

import gradcore as gc
import gradcore.cuda
import gradcore.functional as F
from gradcore.cuda import cudnn, runtime

import fake_cudnn


from gpu_probe import gpu_unavailable_reason  # noqa: E402

# these check what happens where cuDNN cannot start; a GPU runs the real thing (and the tests below)

def _skip_on_a_gpu():
    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is here: cudnnCreate succeeds (the cuDNN tests on the GPU cover it)")

needs_cxx = pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                               reason="the CUDA emulator needs g++")


def _wheel_version():
    try:
        return importlib.metadata.version("nvidia-cudnn-cu13")
    except importlib.metadata.PackageNotFoundError:
        return None


def _rand(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- the real library
@pytest.mark.skipif(_wheel_version() is None, reason="nvidia-cudnn-cu13 is not installed (pip install gradcore[cuda])")
def test_the_library_loads_from_the_wheel_and_reports_its_version():
    paths = cudnn.candidate_paths()
    assert paths and os.path.join("nvidia", "cudnn", "lib", "libcudnn.so") in paths[0]
    lib = cudnn.load_library()          # every function of PROTOTYPES resolved, or this raises
    assert set(cudnn.PROTOTYPES) <= set(vars(lib))
    major, minor, patch = (int(p) for p in _wheel_version().split(".")[:3])
    assert lib.version() == major * 10000 + minor * 100 + patch
    assert cudnn.version() == f"{major}.{minor}.{patch}"
    assert "NOT_SUPPORTED" in lib.error_string(3000)


@pytest.mark.skipif(_wheel_version() is None, reason="nvidia-cudnn-cu13 is not installed")
def test_without_a_gpu_cudnnCreate_fails_and_the_reason_is_kept():
    _skip_on_a_gpu()
    lib = cudnn.load_library()
    with pytest.raises(cudnn.CudnnError, match="cudnnCreate failed: CUDNN_STATUS_"):
        cudnn.Context(lib)


def test_a_library_missing_functions_is_refused_by_name():
    class Partial:
        cudnnGetVersion = fake_cudnn.FakeCudnn().cudnnGetVersion
    with pytest.raises(cudnn.CudnnUnavailable, match="lacks .*cudnnCreate"):
        cudnn.Library(Partial(), "partial")


@needs_cxx
def test_the_emulator_runs_the_im2col_path_and_says_so():
    be = runtime.use("emulator")
    try:
        assert cudnn.context(be) is None
        assert cudnn.why_not(be) == "the emulator driver: cuDNN needs a GPU"
        assert cudnn.status(be).startswith("not used (") and "im2col + cuBLAS" in cudnn.status(be)
    finally:
        runtime.use(None)


@needs_cxx
@pytest.mark.skipif(_wheel_version() is None, reason="nvidia-cudnn-cu13 is not installed")
def test_gradcores_gpu_driver_without_a_gpu_falls_back_with_the_reason():
    """The PyCUDA driver on the fake pycuda: a "gpu" backend, so the real
    libcudnn is loaded and cudnnCreate tried; it fails (no device) and the
    convolutions run im2col + cuBLAS, correct."""
    from gradcore.devices import nvcc_path
    _skip_on_a_gpu()
    if nvcc_path() is None:
        pytest.skip("the fake GPU needs nvcc")
    import fake_pycuda
    be = fake_pycuda.make_backend()
    cudnn.attach(be, None)      # undo the fake's refusal: the real library is tried, as on a GPU driver
    runtime.use(be)
    try:
        reason = cudnn.why_not(be)
        assert reason.startswith(f"cuDNN {cudnn.version()} is there but cuDNN cudnnCreate failed")
        x, w = _rand(2, 3, 5, 5), _rand(4, 3, 3, 3)
        y = F.conv2d(gc.Tensor(x, device="cuda"), gc.Tensor(w, device="cuda"), padding=1)
        np.testing.assert_allclose(y.numpy(), F.conv2d(gc.Tensor(x), gc.Tensor(w), padding=1).numpy(),
                                   rtol=1e-5, atol=1e-5)
        assert any(n.startswith("gc_im2col") for n, *_ in be.driver.fake.launches)
    finally:
        fake_pycuda.close(be)
        runtime.use(None)


# ---------------------------------------------------------------- the fake cuDNN
@pytest.fixture
def fake(monkeypatch):
    """The emulator backend with the fake cuDNN attached (switches at their defaults)."""
    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("the CUDA emulator needs g++")
    for name, value in (("enabled", True), ("benchmark", False), ("deterministic", False),
                        ("workspace_limit", 1 << 30), ("max_pool_backward", False)):
        monkeypatch.setattr(cudnn, name, value)
    monkeypatch.setattr(gradcore.cuda, "allow_tf32_conv", True)
    be = runtime.use("emulator")
    f = fake_cudnn.attach(be)
    f.backend = be
    yield f
    cudnn.attach(be, None)
    runtime.use(None)
    assert f.errors == [], "the fake cuDNN saw malformed calls:\n" + "\n".join(f.errors)


def test_cudnn_follows_a_cuda_graphs_capture_stream(fake, monkeypatch):
    """While a graph is captured, cuDNN's work must go to the capture stream (else it runs once,
    during the capture, and a replay skips it: found on an H100); afterwards, the default stream."""
    be = fake.backend
    x, w = gc.Tensor(_rand(1, 2, 5, 5), device="cuda"), gc.Tensor(_rand(3, 2, 3, 3), device="cuda")
    F.conv2d(x, w)
    assert fake.stream == 0
    monkeypatch.setattr(type(be.driver), "capture_stream", 0x5EED, raising=False)
    F.conv2d(x, w), F.max_pool2d(x, 2)
    assert fake.stream == 0x5EED
    monkeypatch.setattr(type(be.driver), "capture_stream", 0, raising=False)
    F.conv2d(x, w)
    assert fake.stream == 0
    streams = [c[1]["stream"] for c in fake.calls if c[0] == "cudnnSetStream"]
    assert streams == [0, 0x5EED, 0]          # set when it changes, not per call


def _conv_cpu64(x, w, **kw):
    return F.conv2d(gc.Tensor(x.astype(np.float64)), gc.Tensor(w.astype(np.float64)), **kw).numpy()


def test_conv2d_runs_on_cudnn_with_the_arguments_it_needs(fake):
    x, w = _rand(2, 4, 7, 6), _rand(6, 2, 3, 2)
    kw = dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
    y = F.conv2d(gc.Tensor(x, device="cuda"), gc.Tensor(w, device="cuda"), **kw)
    np.testing.assert_allclose(y.numpy(), _conv_cpu64(x, w, **kw), rtol=5e-3, atol=5e-3)   # TF32 allowed
    call = fake.last("forward")
    assert call["x"] == (2, 4, 7, 6) and call["w"] == (6, 2, 3, 2) and call["y"] == tuple(y.shape)
    assert (call["stride"], call["padding"], call["dilation"], call["groups"]) == ((2, 1), (1, 0), (1, 2), 2)
    assert (call["alpha"], call["beta"]) == (1.0, 0.0)
    # the heuristics' first algorithm, its workspace from the pool, tensor-op math (it asked for it)
    assert call["algo"] == 6 and call["workspace"] == 8192 and call["workspace_ptr"]
    assert call["math"] == cudnn.TENSOR_OP_MATH
    assert fake.names().count("cudnnCreate") == 1 and not fake.names().count("im2col")
    assert cudnn.context(fake.backend).calls == {"conv_forward": 1}


def test_the_algorithm_is_chosen_once_per_configuration(fake):
    x, w = gc.Tensor(_rand(1, 2, 5, 5), device="cuda"), gc.Tensor(_rand(3, 2, 3, 3), device="cuda")
    for _ in range(3):
        F.conv2d(x, w, padding=1)
    assert fake.names().count("get_forward") == 1 and fake.names().count("forward") == 3
    F.conv2d(x, w, padding=0)                        # another configuration: chosen again
    assert fake.names().count("get_forward") == 2
    x64 = gc.Tensor(_rand(1, 2, 5, 5, dtype=np.float64), device="cuda")
    F.conv2d(x64, w.astype("float64"), padding=1)    # another dtype too
    assert fake.names().count("get_forward") == 3 and fake.last("forward")["dtype"] == "float64"


def test_deterministic_takes_only_deterministic_algorithms(fake, monkeypatch):
    monkeypatch.setattr(cudnn, "deterministic", True)
    F.conv2d(gc.Tensor(_rand(1, 2, 5, 5), device="cuda"), gc.Tensor(_rand(3, 2, 3, 3), device="cuda"))
    assert fake.last("forward")["algo"] == 1 and fake.last("forward")["workspace"] == 1024


def test_benchmark_times_the_algorithms_once_and_takes_the_fastest(fake, monkeypatch):
    monkeypatch.setattr(cudnn, "benchmark", True)
    x, w = _rand(2, 3, 6, 6), _rand(4, 3, 3, 3)
    for _ in range(2):
        y = F.conv2d(gc.Tensor(x, device="cuda"), gc.Tensor(w, device="cuda"), padding=1)
    assert fake.names().count("find_forward") == 1
    assert fake.last("find_forward")["workspace"] == 8192          # the largest acceptable algorithm fits
    assert fake.last("forward")["algo"] == 1                       # the fastest measured, not the heuristic's 6
    # FindEx left NaN in its output buffer: the result was written again
    np.testing.assert_allclose(y.numpy(), _conv_cpu64(x, w, padding=1), rtol=5e-3, atol=5e-3)


def test_the_workspace_limit_bounds_the_choice(fake, monkeypatch):
    monkeypatch.setattr(cudnn, "workspace_limit", 0)
    F.conv2d(gc.Tensor(_rand(1, 2, 5, 5), device="cuda"), gc.Tensor(_rand(3, 2, 3, 3), device="cuda"))
    call = fake.last("forward")
    assert call["algo"] == 0 and call["workspace"] == 0 and call["workspace_ptr"] is None


def test_tf32_is_the_default_for_float32_convolutions_and_can_be_turned_off(fake, monkeypatch):
    # values whose products TF32 rounds visibly
    x = (1 + np.arange(2 * 3 * 6 * 6).reshape(2, 3, 6, 6) * 1e-4).astype(np.float32)
    w = (1 + np.arange(4 * 3 * 3 * 3).reshape(4, 3, 3, 3) * 1e-4).astype(np.float32)
    ref = _conv_cpu64(x, w, padding=1)
    on = F.conv2d(gc.Tensor(x, device="cuda"), gc.Tensor(w, device="cuda"), padding=1).numpy()
    err_on = np.abs(on - ref).max() / np.abs(ref).max()
    assert 1e-5 < err_on < 2e-3                     # TF32: 10-bit mantissa, float32 accumulation
    monkeypatch.setattr(gradcore.cuda, "allow_tf32_conv", False)
    off = F.conv2d(gc.Tensor(x, device="cuda"), gc.Tensor(w, device="cuda"), padding=1).numpy()
    assert np.abs(off - ref).max() / np.abs(ref).max() < 1e-6
    call = fake.last("forward")
    assert call["math"] == cudnn.FMA_MATH and call["algo"] == 1    # the tensor-op algorithm is left out
    assert fake.last("get_forward")["math"] == cudnn.FMA_MATH


def test_float64_never_uses_tensor_op_math(fake):
    x, w = _rand(1, 2, 5, 5, dtype=np.float64), _rand(3, 2, 3, 3, dtype=np.float64)
    y = F.conv2d(gc.Tensor(x, device="cuda"), gc.Tensor(w, device="cuda"))
    np.testing.assert_allclose(y.numpy(), _conv_cpu64(x, w), rtol=1e-12, atol=1e-12)
    assert fake.last("forward")["math"] == cudnn.DEFAULT_MATH


CASES = {
    "plain": ((2, 3, 6, 5), (4, 3, 3, 3), 1, 1, 1, 1),
    "strided-dilated": ((2, 2, 9, 8), (3, 2, 3, 2), (2, 1), (1, 2), (2, 1), 1),
    "groups": ((2, 4, 5, 5), (6, 2, 3, 3), 1, 1, 1, 2),
    "depthwise": ((1, 3, 6, 5), (3, 1, 3, 3), 2, 1, 1, 3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_conv2d_gradients_to_second_order_on_cudnn(fake, monkeypatch, matches_cpu, case):
    """First and second order through Convolution, ConvolutionBackwardData and
    ConvolutionBackwardFilter, all three on cuDNN, TF32 off (float32 tolerance)."""
    monkeypatch.setattr(gradcore.cuda, "allow_tf32_conv", False)
    xs, ws, stride, padding, dilation, groups = CASES[case]
    matches_cpu(lambda x, w: F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups),
                [_rand(*xs), _rand(*ws)], rtol=1e-4, atol=1e-4)
    calls = cudnn.context(fake.backend).calls
    # second order: the data gradient's weight gradient is a filter gradient, and back
    assert calls == {"conv_forward": 1, "conv_backward_data": 2, "conv_backward_filter": 2}
    for direction in ("forward", "backward_data", "backward_filter"):
        call = fake.last(direction)
        assert call["groups"] == groups and call["math"] == cudnn.FMA_MATH


@pytest.mark.parametrize("form", [(6,), (1, 6, 1, 1)])
def test_conv2d_with_bias_on_cudnn_both_orders(fake, monkeypatch, matches_cpu, form):
    """The bias in the Convolution op: cuDNN runs the same bias-free plans
    (one forward, one filter gradient at first order) and the bias is one
    broadcast add after it, its gradient one reduction."""
    monkeypatch.setattr(gradcore.cuda, "allow_tf32_conv", False)
    b = _rand(*form, seed=3)
    matches_cpu(lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2) ** 2, [_rand(2, 4, 5, 5), _rand(6, 2, 3, 3), b],
                rtol=1e-4, atol=1e-4)
    calls = cudnn.context(fake.backend).calls
    assert calls["conv_forward"] >= 1 and calls["conv_backward_filter"] >= 1
    x, w = gc.Tensor(_rand(2, 4, 5, 5), device="cuda"), gc.Tensor(_rand(6, 2, 3, 3), device="cuda")
    asked = fake.names().count("get_forward")
    F.conv2d(x, w, gc.Tensor(b, device="cuda"), padding=1, groups=2)
    F.conv2d(x, w, None, padding=1, groups=2)
    assert fake.names().count("get_forward") == asked      # one plan with or without the bias


def test_float32_gradients_with_tf32_within_its_tolerance(fake, matches_cpu):
    matches_cpu(lambda x, w: F.conv2d(x, w, padding=1), [_rand(2, 3, 5, 5), _rand(4, 3, 3, 3)],
                rtol=2e-2, atol=2e-2, second_order=False)
    assert fake.last("backward_filter")["math"] == cudnn.TENSOR_OP_MATH


def test_conv1d_conv_transpose2d_and_conv3d_run_on_cudnn(fake, monkeypatch, matches_cpu):
    monkeypatch.setattr(gradcore.cuda, "allow_tf32_conv", False)
    matches_cpu(lambda x, w: F.conv1d(x, w, stride=2, padding=1, dilation=1, groups=2),
                [_rand(2, 4, 9), _rand(6, 2, 3)], rtol=1e-4, atol=1e-4)
    assert fake.last("forward")["x"] == (2, 4, 9, 1) and fake.last("forward")["padding"] == (1, 0)
    matches_cpu(lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1, groups=2),
                [_rand(1, 4, 4, 3), _rand(4, 3, 3, 3)], rtol=1e-4, atol=1e-4)
    data = fake.last("backward_data")        # the transposed convolution is the data gradient
    assert data["y"] == (1, 4, 4, 3) and data["x"] == (1, 6, 8, 6)
    matches_cpu(lambda x, w: F.conv3d(x, w, stride=(1, 2, 1), padding=1),
                [_rand(1, 2, 4, 5, 4), _rand(3, 2, 2, 3, 2)], rtol=1e-4, atol=1e-4)
    assert fake.last("forward")["w"] == (3, 2, 2, 3, 2) and fake.last("backward_filter")["x"] == (1, 2, 4, 5, 4)


def test_a_refused_configuration_runs_the_im2col_path(fake, monkeypatch, matches_cpu):
    monkeypatch.setattr(gradcore.cuda, "allow_tf32_conv", False)
    fake.refuse = lambda direction, config: config[2][3] > 1          # nothing offered for groups > 1
    be = fake.backend
    matches_cpu(lambda x, w: F.conv2d(x, w, padding=1, groups=2), [_rand(2, 4, 5, 5), _rand(4, 2, 3, 3)],
                rtol=1e-4, atol=1e-4)
    ctx = cudnn.context(be)
    assert "conv_forward" not in ctx.calls and ctx.fallbacks > 0
    assert any("no algorithm" in why for why in ctx.refused.values())
    assert "configuration(s) refused, run im2col + cuBLAS" in cudnn.status(be)
    asked = fake.names().count("get_forward")
    F.conv2d(gc.Tensor(_rand(2, 4, 5, 5), device="cuda"), gc.Tensor(_rand(4, 2, 3, 3), device="cuda"), padding=1,
             groups=2)
    assert fake.names().count("get_forward") == asked                 # remembered: not asked again
    F.conv2d(gc.Tensor(_rand(2, 4, 5, 5), device="cuda"), gc.Tensor(_rand(4, 4, 3, 3), device="cuda"), padding=1)
    assert ctx.calls["conv_forward"] == 1                              # groups=1 still on cuDNN


def test_an_execution_refused_with_not_supported_falls_back_once(fake):
    fake.refuse_execution = lambda direction, config: direction == "forward"
    x, w = _rand(1, 2, 5, 5), _rand(3, 2, 3, 3)
    for _ in range(2):
        y = F.conv2d(gc.Tensor(x, device="cuda"), gc.Tensor(w, device="cuda"))
        np.testing.assert_allclose(y.numpy(), _conv_cpu64(x, w), rtol=1e-5, atol=1e-5)
    assert fake.names().count("forward") == 1          # tried once, then the im2col path
    assert any("cudnnConvolutionForward: FAKE_CUDNN_STATUS_3000" in v for v in cudnn.context(fake.backend).refused.values())


def test_other_errors_raise_naming_the_call_and_shapes(fake):
    bad = fake._callbacks["cudnnConvolutionForward"]
    fake._callbacks["cudnnConvolutionForward"] = type(bad)(lambda *args: fake_cudnn.BAD_PARAM)
    cudnn.attach(fake.backend, cudnn.Library(fake, "fake cuDNN"))     # bind the failing function
    with pytest.raises(RuntimeError, match=r"Convolution.*cuDNN cudnnConvolutionForward \(x \(1, 2, 5, 5\), w \(3, 2, 3, 3\), "
                                               r"stride \(1, 1\).*algorithm 6\) failed: FAKE_CUDNN_STATUS_2000") as info:
        F.conv2d(gc.Tensor(_rand(1, 2, 5, 5), device="cuda"), gc.Tensor(_rand(3, 2, 3, 3), device="cuda"))
    assert isinstance(info.value.__cause__, cudnn.CudnnError)
    fake._callbacks["cudnnConvolutionForward"] = bad


def test_switched_off_nothing_runs_on_cudnn(fake, monkeypatch):
    monkeypatch.setattr(cudnn, "enabled", False)
    F.conv2d(gc.Tensor(_rand(1, 2, 5, 5), device="cuda"), gc.Tensor(_rand(3, 2, 3, 3), device="cuda"))
    F.max_pool2d(gc.Tensor(_rand(1, 2, 4, 4), device="cuda"), 2)
    assert [n for n in fake.names() if n != "cudnnCreate"] == []
    assert cudnn.why_not(fake.backend) == "gradcore.cuda.cudnn.enabled is False"


def test_empty_and_integer_problems_stay_on_gradcores_kernels(fake):
    y = F.conv2d(gc.Tensor(np.zeros((0, 2, 5, 5), np.float32), device="cuda"),
                 gc.Tensor(_rand(3, 2, 3, 3), device="cuda"))
    assert y.shape == (0, 3, 3, 3)
    assert "forward" not in fake.names()


# ---------------------------------------------------------------- pooling
@pytest.mark.parametrize("mode", ["average_count_exclude_padding", "average"])
def test_average_pooling_forward_and_backward_on_cudnn(fake, matches_cpu, mode):
    matches_cpu(lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, mode=mode), [_rand(2, 3, 7, 6)],
                rtol=1e-5, atol=1e-5)
    want = {"average": cudnn.POOLING_AVERAGE_INCLUDE_PADDING,
            "average_count_exclude_padding": cudnn.POOLING_AVERAGE_EXCLUDE_PADDING}[mode]
    for what in ("pool_forward", "pool_backward"):
        call = fake.last(what)
        assert call["mode"] == want and call["kernel"] == (3, 3) and call["stride"] == (2, 2)
        assert call["padding"] == (1, 1) and (call["alpha"], call["beta"]) == (1.0, 0.0)


def test_max_pooling_forward_on_cudnn_backward_on_gradcores_kernel(fake, matches_cpu):
    x = _rand(2, 3, 6, 6)
    x[0, 0, :2, :2] = 1.5                       # a tie: gradcore's gradient goes to the first maximum
    matches_cpu(lambda x: F.max_pool2d(x, 2), [x], rtol=1e-6, atol=1e-6)
    assert fake.last("pool_forward")["mode"] == cudnn.POOLING_MAX
    assert "pool_backward" not in fake.names()


def test_max_pooling_backward_on_cudnn_when_switched_on(fake, monkeypatch, matches_cpu):
    monkeypatch.setattr(cudnn, "max_pool_backward", True)
    matches_cpu(lambda x: F.max_pool2d(x, 3, stride=2, padding=1), [_rand(2, 3, 7, 7)], rtol=1e-6, atol=1e-6)
    call = fake.last("pool_backward")
    assert call["mode"] == cudnn.POOLING_MAX_DETERMINISTIC and call["x"] == (2, 3, 7, 7)


# ---------------------------------------------------------------- doctor
def test_doctor_reports_the_convolution_path(capsys):
    from gradcore import cli
    cli.main(["doctor"])
    out = capsys.readouterr().out
    lines = {l.split(None, 1)[0]: l for l in out.splitlines() if l.strip()}
    if _wheel_version() is not None:
        assert lines["cuDNN"].split(None, 1)[1].startswith(f"{cudnn.version()} (") and "libcudnn.so" in lines["cuDNN"]
    conv = lines["convolutions"]
    if gpu_unavailable_reason() is None and _wheel_version() is not None:
        assert conv.split(None, 1)[1].startswith(f"in use: cuDNN {cudnn.version()}")
    else:
        assert "im2col + cuBLAS" in conv or "no cuda device" in conv      # no GPU here: never "in use"


# ---------------------------------------------------------------- the other half of the policy: matmul
@needs_cxx
def test_matmul_stays_float32_unless_allowed(monkeypatch):
    """``allow_tf32_matmul`` (default False) sets cuBLAS's math mode on the
    GPU driver when it changes, before the next GEMM, and only then."""
    from gradcore.devices import nvcc_path
    if nvcc_path() is None:
        pytest.skip("the fake GPU needs nvcc")
    import fake_pycuda
    be = fake_pycuda.make_backend()
    modes = []
    monkeypatch.setattr(be.driver, "blas_tf32", modes.append, raising=False)
    runtime.use(be)
    try:
        a, b = gc.Tensor(_rand(3, 4), device="cuda"), gc.Tensor(_rand(4, 2), device="cuda")
        F.matmul(a, b)
        assert modes == []                                  # the default: cuBLAS's own (no TF32)
        monkeypatch.setattr(gradcore.cuda, "allow_tf32_matmul", True)
        F.matmul(a, b), F.matmul(a, b)
        monkeypatch.setattr(gradcore.cuda, "allow_tf32_matmul", False)
        F.matmul(a, b)
        assert modes == [True, False]
    finally:
        fake_pycuda.close(be)
        runtime.use(None)


def test_cublas_math_mode_values():
    from gradcore.cuda import blas
    calls = []

    class Lib:
        @staticmethod
        def cublasSetMathMode(handle, mode):
            calls.append((handle, mode))
            return 0
    cub = blas.Cublas.__new__(blas.Cublas)
    cub.lib, cub.handle = Lib(), 0x42
    cub.set_tf32(True)
    cub.set_tf32(False)
    assert calls == [(0x42, 3), (0x42, 0)]      # CUBLAS_TF32_TENSOR_OP_MATH, CUBLAS_DEFAULT_MATH


# ---------------------------------------------------------------- every case of the im2col tests, on cuDNN
def _im2col_cases():
    import test_cuda_conv
    return test_cuda_conv.CONV_CASES


@pytest.mark.parametrize("case", list(_im2col_cases()))
def test_the_im2col_cases_on_cudnn(fake, monkeypatch, matches_cpu, case):
    monkeypatch.setattr(gradcore.cuda, "allow_tf32_conv", False)
    xs, ws, stride, padding, dilation, groups = _im2col_cases()[case]
    matches_cpu(lambda x, w: F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups),
                [_rand(*xs), _rand(*ws)], rtol=1e-4, atol=1e-4)
    assert cudnn.context(fake.backend).calls["conv_forward"] == 1


# ---------------------------------------------------------------- batch normalisation
@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 4), (3, 2, 7), (2, 3, 2, 3, 2)])
def test_batch_norm_training_on_cudnn_to_second_order(fake, matches_cpu, shape):
    c = shape[1]
    w, b = _rand(c) + 2, _rand(c)
    matches_cpu(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True, eps=1e-3), [_rand(*shape), w, b],
                rtol=1e-4, atol=1e-4)
    calls = cudnn.context(fake.backend).calls
    assert calls["cudnnBatchNormalizationForwardTraining"] == 1 and calls["cudnnBatchNormalizationBackward"] >= 1
    pad = shape + (1,) * (4 - len(shape))
    assert fake.last("bn_training")["x"] == pad and fake.last("bn_backward")["eps"] == pytest.approx(1e-3)


def test_batch_norm_running_statistics_and_inference_on_cudnn(fake):
    x, w, b = _rand(8, 3, 4, 4), _rand(3) + 1, _rand(3)

    def run(device):
        rm = gc.Tensor(np.zeros(3, np.float32), device=device)
        rv = gc.Tensor(np.ones(3, np.float32), device=device)
        args = [gc.Tensor(a, device=device) for a in (x, w, b)]
        y = F.batch_norm(args[0], rm, rv, args[1], args[2], training=True, momentum=0.8)
        yi = F.batch_norm(args[0], rm, rv, args[1], args[2], training=False)
        return [t.numpy() for t in (y, rm, rv, yi)]

    for got, want in zip(run("cuda"), run("cpu")):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    calls = cudnn.context(fake.backend).calls
    assert calls["cudnnBatchNormalizationForwardTraining"] == 1
    assert calls["cudnnBatchNormalizationForwardInference"] == 1


def test_a_batch_norm_module_trains_on_cudnn(fake):
    import gradcore.module as M
    bn = M.BatchNorm2d(3)
    bn.to("cuda")
    x = gc.Tensor(_rand(4, 3, 3, 3), device="cuda")
    gm = gc.GradManager().attach(bn.parameters())
    with gm:
        gm.backward(F.sum(bn(x) * x))
    assert all(p.grad is not None for p in bn.parameters())
    assert cudnn.context(fake.backend).calls["cudnnBatchNormalizationBackward"] == 1


@needs_cxx
def test_batch_norm_without_cudnn_runs_gradcores_kernels(matches_cpu):
    """The emulator (no cuDNN): reductions and the fused per-element kernels."""
    be = runtime.use("emulator")
    try:
        matches_cpu(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                    [_rand(3, 2, 4, 3), _rand(2), _rand(2)], rtol=1e-4, atol=1e-4)
        names = {k.name for k in be._kernels.values()}
        assert {"gc_batch_norm_apply_float", "gc_batch_norm_grad_input_float"} <= names
    finally:
        runtime.use(None)
