"""oneDNN's CPU primitives (gradcore/cpu/onednn.py) at the function level:
against PyTorch (CPU) and against gradcore's NumPy kernels, and the
binding's cache, switches and fallbacks."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from gradcore.cpu import onednn

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.skipif(onednn.why_not() is not None, reason=f"oneDNN: {onednn.why_not()}")

RTOL, ATOL = 1e-4, 1e-4


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def close(a, b, rtol=RTOL, atol=ATOL):
    b = b.detach().numpy() if hasattr(b, "detach") else b
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def _torch_conv(x, w, stride, padding, dilation, groups):
    fn = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.ndim]
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    y = fn(xt, wt, None, stride, padding, dilation, groups)
    g = torch.tensor(rnd(*y.shape, seed=7))
    dx, dw = torch.autograd.grad(y, (xt, wt), g)
    return y, g.numpy(), dx, dw


CONV_CASES = [
    ((2, 32, 9, 10), (32, 32, 3, 3), 1, 1, 1, 1),                       # channels that fill the blocks
    ((2, 32, 9, 10), (48, 8, 3, 3), 2, 1, 1, 4),
    ((2, 16, 5, 6, 7), (16, 16, 3, 3, 3), 1, 1, 1, 1),
    # x shape, w shape, stride, padding, dilation, groups
    ((2, 3, 17), (4, 3, 3), 1, 1, 1, 1),
    ((2, 4, 20), (6, 2, 5), 2, 2, 2, 2),
    ((2, 3, 9, 11), (5, 3, 3, 3), 1, 1, 1, 1),
    ((3, 4, 12, 10), (8, 1, 3, 2), (2, 1), (1, 0), (1, 2), 4),          # depthwise-like, asymmetric
    ((2, 6, 13, 13), (4, 3, 5, 5), 3, 2, 1, 2),                         # stride leaves a remainder
    ((2, 3, 7, 8, 9), (4, 3, 3, 3, 3), 1, 1, 1, 1),
    ((1, 4, 9, 8, 7), (6, 2, 2, 3, 2), (2, 1, 2), (1, 1, 0), (1, 2, 1), 2),
]


@pytest.fixture(params=["auto", "plain", "blocked"])
def layout(request, monkeypatch):
    """Each convolution test in each layout (NumPy's, oneDNN's blocked one with reorders, the rule's choice)."""
    monkeypatch.setattr(onednn, "conv_layout", request.param)
    return request.param


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV_CASES)
def test_convolution_three_directions_match_torch(xs, ws, stride, padding, dilation, groups, layout):
    x, w = rnd(*xs), rnd(*ws, seed=1)
    y, g, dx, dw = _torch_conv(x, w, stride, padding, dilation, groups)
    close(onednn.conv_forward(x, w, stride, padding, dilation, groups), y)
    close(onednn.conv_backward_data(g, w, x.shape, stride, padding, dilation, groups), dx)
    close(onednn.conv_backward_weights(g, x, w.shape, stride, padding, dilation, groups), dw)


def test_convolution_bias_and_relu_fused(layout):
    x, w, b = rnd(2, 3, 8, 8), rnd(4, 3, 3, 3, seed=1), rnd(4, seed=2)
    want = F.relu(F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), 1, 1))
    close(onednn.conv_forward(x, w, 1, 1, 1, 1, bias=b, relu=True), want)
    g = rnd(2, 4, 8, 8, seed=3)
    dw, db = onednn.conv_backward_weights(g, x, w.shape, 1, 1, 1, 1, bias=True)
    close(db, g.sum(axis=(0, 2, 3)))


@pytest.mark.parametrize("xs, ws, stride, padding, out_pad, dilation, groups", [
    ((2, 4, 6, 6), (4, 3, 4, 4), 2, 1, 0, 1, 1),
    ((2, 4, 5, 7), (4, 2, 3, 3), 2, 1, 1, 1, 2),
    ((2, 2, 9), (2, 3, 3), 3, 0, 2, 2, 1),
    ((1, 2, 4, 3, 5), (2, 2, 3, 3, 3), 2, 1, 1, 1, 1),
])
def test_transposed_convolution_matches_torch(xs, ws, stride, padding, out_pad, dilation, groups, layout):
    x, w = rnd(*xs), rnd(*ws, seed=1)
    fn = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}[x.ndim]
    want = fn(torch.tensor(x), torch.tensor(w), None, stride, padding, out_pad, groups, dilation)
    close(onednn.conv_transpose(x, w, stride, padding, out_pad, dilation, groups), want)


POOL_CASES = [((2, 3, 8, 8), 2, 2, 0), ((2, 3, 9, 7), 3, 2, 1), ((1, 2, 10, 11), (3, 2), (2, 3), (1, 0)),
              ((2, 2, 11), 3, 2, 1), ((1, 2, 5, 6, 7), 2, 2, 1)]


@pytest.mark.parametrize("xs, k, s, p", POOL_CASES)
def test_max_pooling_matches_torch_first_maximum_on_ties(xs, k, s, p):
    # small integers: most windows hold tied maxima
    x = np.random.default_rng(0).integers(0, 3, xs).astype(np.float32)
    fn = {3: F.max_pool1d, 4: F.max_pool2d, 5: F.max_pool3d}[x.ndim]
    xt = torch.tensor(x, requires_grad=True)
    y = fn(xt, k, s, p)
    g = rnd(*y.shape, seed=5)
    (dx,) = torch.autograd.grad(y, xt, torch.tensor(g))
    close(onednn.pool_forward(x, "max", k, s, p), y)
    close(onednn.pool_backward(g, x, "max", k, s, p), dx, 1e-6, 1e-7)   # overlapping windows: summation order


@pytest.mark.parametrize("xs, k, s, p", POOL_CASES)
@pytest.mark.parametrize("kind", ["average", "average_count_exclude_padding"])
def test_average_pooling_matches_torch(xs, k, s, p, kind):
    x = rnd(*xs)
    fn = {3: F.avg_pool1d, 4: F.avg_pool2d, 5: F.avg_pool3d}[x.ndim]
    xt = torch.tensor(x, requires_grad=True)
    y = fn(xt, k, s, p, count_include_pad=kind == "average")
    g = rnd(*y.shape, seed=5)
    (dx,) = torch.autograd.grad(y, xt, torch.tensor(g))
    close(onednn.pool_forward(x, kind, k, s, p), y)
    close(onednn.pool_backward(g, None, kind, k, s, p, xshape=x.shape), dx)


def test_max_pooling_over_nan_leaves_it_to_numpy():
    x = rnd(1, 1, 4, 4)
    x[0, 0, 1, 1] = np.nan
    assert onednn.pool_forward(x, "max", 2, 2, 0) is None
    assert onednn.pool_backward(rnd(1, 1, 2, 2), x, "max", 2, 2, 0) is None


@pytest.mark.parametrize("shape", [(8, 3, 5, 4), (16, 5), (4, 3, 7), (2, 3, 4, 3, 2), (4, 16, 3, 5), (2, 32, 3, 2, 2),
                                   (3, 20, 7)])
@pytest.mark.parametrize("bn_layout", ["auto", "plain", "blocked"])
def test_batch_norm_matches_torch(shape, bn_layout, monkeypatch):
    monkeypatch.setattr(onednn, "bn_layout", bn_layout)
    x, w, b = rnd(*shape) * 3 + 1, rnd(shape[1], seed=1), rnd(shape[1], seed=2)
    pshape = (1, shape[1]) + (1,) * (len(shape) - 2)
    eps = 1e-5
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    y = F.batch_norm(xt, None, None, wt, bt, training=True, eps=eps)
    g = rnd(*shape, seed=3)
    dx, dw, db = torch.autograd.grad(y, (xt, wt, bt), torch.tensor(g))
    out, mean, invstd = onednn.batch_norm_training(x, w.reshape(pshape), b.reshape(pshape), eps)
    close(out, y)
    axes = tuple(i for i in range(len(shape)) if i != 1)
    close(mean.reshape(-1), x.mean(axis=axes))
    close(invstd.reshape(-1), 1 / np.sqrt(x.var(axis=axes) + eps), 1e-4, 1e-5)
    gx, gw, gb = onednn.batch_norm_backward(g, x, w.reshape(pshape), mean, invstd, eps)
    close(gx, dx)
    close(gw.reshape(-1), dw, 1e-4, 1e-3)
    close(gb.reshape(-1), db, 1e-4, 1e-3)
    m, v = rnd(shape[1], seed=4), np.abs(rnd(shape[1], seed=5)) + 0.5
    want = F.batch_norm(torch.tensor(x), torch.tensor(m), torch.tensor(v), torch.tensor(w), torch.tensor(b),
                        training=False, eps=eps)
    got = onednn.batch_norm_inference(x, *(a.reshape(pshape) for a in (m, v, w, b)), eps)
    close(got, want)


def test_float64_empty_and_unsupported_run_numpy():
    x, w = rnd(2, 3, 8, 8), rnd(4, 3, 3, 3)
    assert onednn.conv_forward(x.astype(np.float64), w.astype(np.float64), 1, 1, 1, 1) is None
    assert onednn.conv_forward(x[:0], w, 1, 1, 1, 1) is None
    assert onednn.pool_forward(x[:, :0], "max", 2, 2, 0) is None
    assert onednn.batch_norm_training(x.astype(np.float64), *(np.ones((1, 3, 1, 1)),) * 2, 1e-5) is None


def test_blocked_layout_where_the_rule_says(monkeypatch):
    monkeypatch.setattr(onednn, "conv_layout", "auto")
    onednn.clear_cache()
    x, w = rnd(2, 32, 8, 8), rnd(32, 32, 3, 3)
    onednn.conv_forward(x, w, 1, 1, 1, 1)
    (prim,) = onednn._cache.values()
    assert prim.blocked == (0, 1, 2)       # src, weights, dst reordered around the run
    onednn.clear_cache()
    onednn.conv_backward_data(rnd(2, 16, 8, 8), rnd(16, 3, 3, 3), (2, 3, 8, 8), 1, 1, 1, 1)
    (prim,) = onednn._cache.values()
    assert prim.blocked == ()              # 3 input channels: plain


def test_primitives_cached_with_statistics():
    onednn.clear_cache()
    x, w = rnd(2, 3, 8, 8), rnd(4, 3, 3, 3)
    before = onednn.stats()
    y1 = onednn.conv_forward(x, w, 1, 1, 1, 1)
    mid = onednn.stats()
    y2 = onednn.conv_forward(x, w, 1, 1, 1, 1)
    after = onednn.stats()
    assert mid["misses"] == before["misses"] + 1 and after["hits"] == mid["hits"] + 1
    assert after["size"] == 1 and after["limit"] == onednn.cache_limit
    np.testing.assert_array_equal(y1, y2)        # deterministic


def test_cache_is_bounded():
    onednn.clear_cache()
    old = onednn.cache_limit
    onednn.cache_limit = 2
    try:
        evictions = onednn.stats()["evictions"]
        for n in (1, 2, 3, 4):
            onednn.conv_forward(rnd(n, 2, 5, 5), rnd(2, 2, 3, 3), 1, 0, 1, 1)
        st = onednn.stats()
        assert st["size"] == 2 and st["evictions"] == evictions + 2
    finally:
        onednn.cache_limit = old
        onednn.clear_cache()


def test_switch_off_in_process():
    x, w = rnd(2, 3, 8, 8), rnd(4, 3, 3, 3)
    onednn.enabled = False
    try:
        assert onednn.conv_forward(x, w, 1, 1, 1, 1) is None
        assert "switched off" in onednn.status()
    finally:
        onednn.enabled = True
    assert onednn.status().startswith("oneDNN 3.")


def test_environment_switch_and_doctor():
    env = dict(os.environ, GRADCORE_ONEDNN="0")
    code = "import gradcore.cpu.onednn as o; print(o.status())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "NumPy kernels" in out.stdout and "GRADCORE_ONEDNN=0" in out.stdout
    out = subprocess.run([sys.executable, "-m", "gradcore.cli", "doctor"], capture_output=True, text=True)
    assert "oneDNN" in out.stdout


def test_threads_share_a_primitive():
    """Python threads running one cached primitive at once get the same results."""
    import threading
    x, w = rnd(4, 32, 12, 12), rnd(32, 32, 3, 3, seed=1)
    want = onednn.conv_forward(x, w, 1, 1, 1, 1)
    outs, errors = [], []

    def work():
        try:
            for _ in range(20):
                outs.append(onednn.conv_forward(x, w, 1, 1, 1, 1))
        except Exception as exc:       # pragma: no cover - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(outs) == 80
    for y in outs:
        np.testing.assert_array_equal(y, want)


def test_thread_count_from_the_environment():
    env = dict(os.environ, GRADCORE_ONEDNN_THREADS="1")
    code = "import gradcore.cpu.onednn as o; print(o.num_threads())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


@pytest.mark.slow
def test_op_tests_pass_with_onednn_switched_off():
    """The op library's tests of the families oneDNN runs, again on the NumPy
    kernels (GRADCORE_ONEDNN=0): the suite runs them on oneDNN, this on
    both paths (CI runs the README's command, so the second run lives here)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = [os.path.join("tests", "ops", f) for f in ("test_conv.py", "test_conv3d.py", "test_conv_transpose.py",
                                                       "test_conv_bias.py", "test_conv_relu.py", "test_nn.py",
                                                       "test_boundaries.py", "test_interpolate.py")]
    env = dict(os.environ, GRADCORE_ONEDNN="0")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *files], cwd=root,
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_missing_or_broken_library_runs_numpy():
    """Where libdnnl is absent or does not load, the ops run their NumPy
    kernels and the status says why (checked in a child process: the
    library loads once per process)."""
    code = ("import numpy as np, gradcore, gradcore.functional as F\n"
            "import gradcore.cpu.onednn as o\n"
            "o.candidate_paths = lambda loader=True: ['/nonexistent/libdnnl.so.3', o.__file__]\n"
            "y = F.conv2d(gradcore.tensor(np.ones((1, 2, 4, 4), np.float32)), "
            "gradcore.tensor(np.ones((3, 2, 3, 3), np.float32)), padding=1)\n"
            "assert float(y.numpy()[0, 0, 1, 1]) == 18.0 and o.stats()['misses'] == 0\n"
            "print(o.status())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "NumPy kernels" in out.stdout and "does not load" in out.stdout and "/nonexistent" in out.stdout


def test_a_primitive_is_made_under_the_thread_count_it_runs_with(monkeypatch):
    """set_num_threads(1) with OpenMP's default of more: the primitive is
    made for one thread (oneDNN splits its work at creation; one made for
    two threads but run on one took 3-6 ms instead of ~20 us) and runs
    on one."""
    x, w, g = rnd(32, 1, 8, 8), rnd(16, 1, 3, 3, seed=1), rnd(32, 16, 8, 8, seed=2)
    monkeypatch.setattr(onednn, "grain", 0)         # no grain: the setting alone decides
    onednn.set_num_threads(1)
    try:
        onednn.clear_cache()
        onednn.conv_backward_weights(g, x, w.shape, 1, 1, 1, 1)
    finally:
        onednn.set_num_threads(0)
    (key, prim), = onednn._cache.items()
    assert key[-1] == 1 and prim.threads == 1


def _threads_of(kind):
    return [(k[-1], p.threads) for k, p in onednn._cache.items() if k[0] == kind]


@pytest.mark.parametrize("grain", [4e6, 0, float("inf")])
def test_small_primitives_run_on_one_thread(grain, monkeypatch):
    """The grain policy: a primitive below ``grain`` multiply-adds (the
    digits CNN's 1-channel layer: 3e5) is made and run on one thread, a
    large one (2 GMAC) on all; pooling and batch norm count their elements
    at POOL_COST / BN_COST. The values do not depend on it."""
    onednn.set_num_threads(2)
    monkeypatch.setattr(onednn, "grain", grain)
    try:
        onednn.clear_cache()
        small_x, small_w = rnd(32, 1, 8, 8), rnd(16, 1, 3, 3, seed=1)
        big_x, big_w = rnd(16, 64, 32, 32), rnd(64, 64, 3, 3, seed=1)
        ys = onednn.conv_forward(small_x, small_w, 1, 1, 1)
        yb = onednn.conv_forward(big_x, big_w, 1, 1, 1)
        small = onednn._conv_work(ys.shape, small_w.shape)
        big = onednn._conv_work(yb.shape, big_w.shape)
        assert small < 4e6 < big
        want = [1 if small < grain else 2, 1 if big < grain else 2]
        assert [t for t, _ in _threads_of("conv")] == want
        assert [p for _, p in _threads_of("conv")] == want
        assert onednn.threads_for(small) == want[0] and onednn.threads_for(big) == want[1]
        onednn.pool_forward(big_x, "max", 2, 2, 0)
        pool = onednn._pool_work(big_x.shape, (16, 64, 16, 16), (2, 2))
        assert pool == (16 * 64 * 16 * 16 * 4 + big_x.size) * onednn.POOL_COST
        assert [t for t, _ in _threads_of("pool")] == [1 if pool < grain else 2]
        onednn.batch_norm_inference(big_x, *(np.ones((1, 64, 1, 1), np.float32),) * 4, 1e-5)
        assert [t for t, _ in _threads_of("bn")] == [1 if big_x.size * onednn.BN_COST < grain else 2]
        close(onednn.conv_forward(big_x, big_w, 1, 1, 1), _torch_conv(big_x, big_w, 1, 1, 1, 1)[0], atol=1e-3)
        close(ys, _torch_conv(small_x, small_w, 1, 1, 1, 1)[0])
    finally:
        onednn.set_num_threads(0)


def test_grain_from_the_environment():
    code = ("import gradcore.cpu.onednn as o; o.load(); print(o.grain, o.threads_for(10), o.threads_for(1e9))")
    env = dict(os.environ, GRADCORE_ONEDNN_GRAIN="1e3", GRADCORE_ONEDNN_THREADS="2")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1000.0", "1", "2"]
    env["GRADCORE_ONEDNN_GRAIN"] = "many"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode != 0 and "GRADCORE_ONEDNN_GRAIN" in out.stderr


def test_onednn_keeps_no_primitive_cache_of_its_own():
    """gradcore's cache is the one cache: oneDNN's own (1024 primitives by
    default) would keep every primitive and its JIT code past
    clear_cache() and cache_limit."""
    import ctypes
    lib = ctypes.CDLL(onednn.library_path())        # the loaded library: the same handle
    capacity = ctypes.c_int(-1)
    assert lib.dnnl_get_primitive_cache_capacity(ctypes.byref(capacity)) == 0
    assert capacity.value == 0


def test_thread_setting():
    onednn.set_num_threads(1)
    try:
        assert onednn.num_threads() == 1
        x, w = rnd(4, 8, 16, 16), rnd(8, 8, 3, 3)
        y1 = onednn.conv_forward(x, w, 1, 1, 1, 1)
    finally:
        onednn.set_num_threads(0)
    y2 = onednn.conv_forward(x, w, 1, 1, 1, 1)
    close(y1, y2)


# ---------------------------------------------------------------- through the ops, on both paths
import gradcore  # noqa: E402
import gradcore.functional as GF  # noqa: E402
from gradcore.autodiff import GradManager  # noqa: E402

from oracle import compare_with_torch  # noqa: E402

OP_CASES = {
    "conv1d": (lambda x, w: GF.conv1d(x, w, stride=2, padding=1, dilation=2),
               lambda x, w: F.conv1d(x, w, stride=2, padding=1, dilation=2), [(2, 16, 19), (32, 16, 3)]),
    "conv2d": (lambda x, w: GF.conv2d(x, w, padding=1), lambda x, w: F.conv2d(x, w, padding=1),
               [(2, 16, 9, 8), (32, 16, 3, 3)]),
    "conv2d first layer": (lambda x, w: GF.conv2d(x, w, stride=2), lambda x, w: F.conv2d(x, w, stride=2),
                           [(2, 3, 11, 12), (8, 3, 5, 5)]),
    "conv2d grouped": (lambda x, w: GF.conv2d(x, w, padding=1, groups=4),
                       lambda x, w: F.conv2d(x, w, padding=1, groups=4), [(2, 32, 7, 7), (64, 8, 3, 3)]),
    "conv3d": (lambda x, w: GF.conv3d(x, w, padding=1), lambda x, w: F.conv3d(x, w, padding=1),
               [(2, 16, 5, 6, 4), (16, 16, 3, 3, 3)]),
    "conv_transpose2d": (lambda x, w: GF.conv_transpose2d(x, w, stride=2, padding=1),
                         lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1),
                         [(2, 32, 6, 5), (32, 16, 4, 4)]),
    # the bias inside the convolution primitive, its gradient from the weight-gradient primitive
    "conv1d bias (O,)": (lambda x, w, b: GF.conv1d(x, w, b, stride=2, padding=1, groups=2),
                         lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1, groups=2),
                         [(2, 16, 19), (32, 8, 3), (32,)]),
    "conv2d bias (1, O, 1, 1)": (lambda x, w, b: GF.conv2d(x, w, b, padding=1),
                                 lambda x, w, b: F.conv2d(x, w, b.reshape(-1), padding=1),
                                 [(2, 16, 9, 8), (32, 16, 3, 3), (1, 32, 1, 1)]),
    "conv2d bias first layer": (lambda x, w, b: GF.conv2d(x, w, b, stride=2),
                                lambda x, w, b: F.conv2d(x, w, b, stride=2), [(2, 3, 11, 12), (8, 3, 5, 5), (8,)]),
    "conv2d bias relu": (lambda x, w, b: GF.conv2d(x, w, b, padding=1, nonlinear_mode="relu"),
                         lambda x, w, b: F.relu(F.conv2d(x, w, b, padding=1)),
                         [(2, 16, 9, 8), (32, 16, 3, 3), (32,)]),
    "conv3d bias": (lambda x, w, b: GF.conv3d(x, w, b, padding=1), lambda x, w, b: F.conv3d(x, w, b, padding=1),
                    [(2, 16, 5, 6, 4), (16, 16, 3, 3, 3), (16,)]),
    "max_pool2d": (lambda x: GF.max_pool2d(x, 3, 2, 1), lambda x: F.max_pool2d(x, 3, 2, 1), [(2, 4, 9, 10)]),
    "avg_pool2d": (lambda x: GF.avg_pool2d(x, 3, 2, 1, mode="average"),
                   lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=True), [(2, 4, 9, 10)]),
    "avg_pool2d exclude padding": (lambda x: GF.avg_pool2d(x, 3, 2, 1),
                                   lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), [(2, 4, 9, 10)]),
    "conv2d + max_pool2d": (lambda x, w: GF.max_pool2d(GF.conv2d(x, w, padding=1), 2),
                            lambda x, w: F.max_pool2d(F.conv2d(x, w, padding=1), 2), [(2, 16, 8, 6), (16, 16, 3, 3)]),
    "conv2d + avg_pool2d + batch_norm": (
        lambda x, w, a, b: GF.batch_norm(GF.avg_pool2d(GF.conv2d(x, w, padding=1), 2), None, None, a, b,
                                         training=True),
        lambda x, w, a, b: F.batch_norm(F.avg_pool2d(F.conv2d(x, w, padding=1), 2, count_include_pad=False), None,
                                        None, a.reshape(-1), b.reshape(-1), training=True),
        [(4, 16, 8, 6), (16, 16, 3, 3), (1, 16, 1, 1), (1, 16, 1, 1)]),
    "interpolate bilinear": (lambda x: GF.vision.interpolate(x, size=(11, 6)),
                             lambda x: F.interpolate(x, size=(11, 6), mode="bilinear", align_corners=False),
                             [(2, 3, 7, 9)]),
    "batch_norm": (lambda x, w, b: GF.batch_norm(x, None, None, w, b, training=True),
                   lambda x, w, b: F.batch_norm(x, None, None, w.reshape(-1), b.reshape(-1), training=True),
                   [(8, 4, 5, 3), (1, 4, 1, 1), (1, 4, 1, 1)]),
}


@pytest.fixture(params=["oneDNN", "NumPy"])
def path(request, monkeypatch):
    """The op's cpu kernels on oneDNN, or switched off (GRADCORE_ONEDNN=0's path)."""
    monkeypatch.setattr(onednn, "enabled", request.param == "oneDNN")
    return request.param


def _count():
    st = onednn.stats()
    return st["hits"] + st["misses"]


@pytest.mark.parametrize("case", list(OP_CASES))
def test_ops_match_torch_on_both_paths(case, path):
    gfn, tfn, shapes = OP_CASES[case]
    arrays = [rnd(*s, seed=i) for i, s in enumerate(shapes)]
    before = _count()
    compare_with_torch(torch, gfn, tfn, arrays, rtol=2e-4, atol=2e-4, need_grads=True)
    assert (_count() > before) == (path == "oneDNN")


def _second_order(gfn, arrays, w1, w2):
    xs = [gradcore.Tensor(a) for a in arrays]
    outer = GradManager().attach(xs)
    with outer:
        inner = GradManager().attach(xs)
        with inner:
            inner.backward((gfn(*xs) * gradcore.Tensor(w1)).sum())
        firsts = [x.grad for x in xs]
        for x in xs:
            x.grad = None
        outer.backward(sum((g * gradcore.Tensor(w)).sum() for g, w in zip(firsts, w2)))
    return [np.zeros(x.shape, np.float32) if x.grad is None else x.grad.numpy() for x in xs]


@pytest.mark.parametrize("case", ["conv2d", "conv2d first layer", "conv3d", "conv_transpose2d", "max_pool2d",
                                  "conv1d bias (O,)", "conv2d bias (1, O, 1, 1)", "conv3d bias",
                                  "avg_pool2d", "batch_norm", "conv2d + max_pool2d", "conv2d bias relu",
                                  "conv2d + avg_pool2d + batch_norm"])
def test_second_order_gradients_unchanged(case, monkeypatch):
    """The backward ops are ops whose cpu kernels run oneDNN too: a
    backward-of-backward on the oneDNN path equals the NumPy path's and
    PyTorch's (float32 throughout)."""
    gfn, tfn, shapes = OP_CASES[case]
    arrays = [rnd(*s, seed=i) for i, s in enumerate(shapes)]
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal(gfn(*[gradcore.Tensor(a) for a in arrays]).shape).astype(np.float32)
    w2 = [rng.standard_normal(a.shape).astype(np.float32) for a in arrays]
    before = _count()
    ours = _second_order(gfn, arrays, w1, w2)
    assert _count() > before
    monkeypatch.setattr(onednn, "enabled", False)
    numpy_path = _second_order(gfn, arrays, w1, w2)
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    firsts = torch.autograd.grad((tfn(*ts) * torch.tensor(w1)).sum(), ts, create_graph=True)
    total = sum((g * torch.tensor(w)).sum() for g, w in zip(firsts, w2))
    theirs = [np.zeros(t.shape) if s is None else s.numpy()
              for t, s in zip(ts, torch.autograd.grad(total, ts, allow_unused=True))]
    scale = max(float(np.abs(t).max()) for t in theirs) or 1.0
    for i, (a, b, c) in enumerate(zip(ours, numpy_path, theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4 * scale, err_msg=f"oneDNN vs NumPy, input {i}")
        np.testing.assert_allclose(a, c, rtol=1e-3, atol=1e-4 * scale, err_msg=f"oneDNN vs torch, input {i}")


@pytest.fixture(params=[1, 2])
def threads(request):
    onednn.set_num_threads(request.param)
    yield request.param
    onednn.set_num_threads(0)


@pytest.mark.parametrize("form", [(8,), (1, 8, 1, 1)])
def test_conv_bias_runs_inside_the_primitives(form, layout, threads, monkeypatch):
    """F.conv2d with a bias: one forward primitive made with the bias, and
    where the weight gradient runs on one thread one weight-gradient
    primitive with the bias gradient (on more, the plain one and a NumPy
    sum: fuse_bias_gradient); the values PyTorch's."""
    onednn.clear_cache()
    monkeypatch.setattr(onednn, "grain", 0)      # the thread count is the setting's
    x, w, b = rnd(2, 16, 7, 6), rnd(8, 16, 3, 3, seed=1), rnd(*form, seed=2)
    xs = [gradcore.Tensor(a) for a in (x, w, b)]
    gm = GradManager().attach(xs)
    with gm:
        y = GF.conv2d(*xs, padding=1)
        gm.backward((y * gradcore.Tensor(rnd(*y.shape, seed=3))).sum())
    keys = list(onednn._cache)
    assert [k[8] for k in keys if k[:2] == ("conv", 0)] == [True]       # forward: with the bias
    # weights: and the bias gradient, on one thread
    assert [k[9] for k in keys if k[:2] == ("conv", 2)] == [threads == 1]
    ts = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    ty = F.conv2d(ts[0], ts[1], ts[2].reshape(-1), padding=1)
    (ty * torch.tensor(rnd(*y.shape, seed=3))).sum().backward()
    close(y.numpy(), ty)
    for a, t in zip(xs, ts):
        close(a.grad.numpy(), t.grad)


def test_demo_training_steps_agree_on_both_paths(monkeypatch):
    """The digits CNN (conv, max pooling) trained 30 SGD steps from one
    initialisation on oneDNN and on the NumPy kernels: losses and
    parameters agree to float32 rounding (the paths then drift apart as
    any two float32 summation orders do)."""
    import gradcore.optimizer as optim
    from gradcore.demo import DigitsCNN, load_digits
    x, y = load_digits()

    def run(on):
        monkeypatch.setattr(onednn, "enabled", on)
        gradcore.random.seed(0)
        np.random.seed(0)
        model = DigitsCNN()
        gm = GradManager().attach(model.parameters())
        opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses = []
        for i in range(30):
            with gm:
                loss = GF.cross_entropy(model(gradcore.tensor(x[i * 32:(i + 1) * 32])),
                                        gradcore.tensor(y[i * 32:(i + 1) * 32]))
                gm.backward(loss)
            opt.step().clear_grad()
            losses.append(float(loss.numpy()))
        return np.array(losses), [p.numpy().copy() for p in model.parameters()]
    before = _count()
    a, pa = run(True)
    assert _count() > before
    b, pb = run(False)
    np.testing.assert_allclose(a, b, rtol=1e-5)
    for p, q in zip(pa, pb):
        np.testing.assert_allclose(p, q, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- matmul
@pytest.mark.parametrize("ta, tb", [(False, False), (False, True), (True, False), (True, True)])
def test_matmul_reads_transposed_views_in_place(ta, tb, monkeypatch):
    """onednn.matmul on row-major and transposed (``.T``) operands, as
    MatrixMul passes them: one primitive per layout, the values NumPy's."""
    monkeypatch.setattr(onednn, "matmul_min", 0)
    onednn.clear_cache()
    a, b = rnd(48, 40), rnd(40, 24, seed=1)
    av = np.ascontiguousarray(a.T).T if ta else a
    bv = np.ascontiguousarray(b.T).T if tb else b
    assert av.flags.c_contiguous != ta and bv.flags.c_contiguous != tb
    c = onednn.matmul(av, bv)
    close(c, a @ b, rtol=1e-5, atol=1e-4)
    ((key, _),) = onednn._cache.items()
    assert key[2] == ((1, 48) if ta else (40, 1)) and key[4] == ((1, 40) if tb else (24, 1))


@pytest.mark.parametrize("sa, sb", [((3, 0), (0, 4)), ((2, 3, 0), (0, 5)), ((0, 3, 4), (4, 2)), ((3, 4), (4, 0))])
def test_matrix_mul_op_with_empty_operands(sa, sb, monkeypatch):
    """Empty float32 products (no rows, no columns, an empty sum) stay
    NumPy's: the same shapes and zeros, with oneDNN's threshold at 0."""
    monkeypatch.setattr(onednn, "matmul_min", 0)
    a, b = np.ones(sa, np.float32), np.ones(sb, np.float32)
    y = GF.matmul(gradcore.Tensor(a), gradcore.Tensor(b)).numpy()
    np.testing.assert_array_equal(y, np.matmul(a, b))
    assert y.shape == np.matmul(a, b).shape


def test_matmul_below_its_threshold_and_off_float32_is_numpys():
    a, b = rnd(16, 8), rnd(8, 4, seed=1)
    assert 16 * 8 * 4 < onednn.matmul_min
    assert onednn.matmul(a, b) is None
    big = rnd(128, 128)
    assert onednn.matmul(big.astype(np.float64), big.astype(np.float64)) is None
    assert onednn.matmul(big, rnd(127, 128)) is None           # inner dimensions differ
    close(onednn.matmul(big, big), big @ big, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shapes, ta, tb", [(((128, 784), (512, 784)), False, True),     # linear: x @ w.T
                                             (((128, 512), (512, 784)), False, False),   # its data gradient
                                             (((128, 512), (128, 784)), True, False),    # its weight gradient
                                             (((8, 32, 64), (96, 64)), False, True)])   # batched rows, one b
def test_matrix_mul_op_on_both_paths(shapes, ta, tb, path):
    """MatrixMul through the tape, on oneDNN (above matmul_min) and NumPy:
    the product and both gradients PyTorch's."""
    a, b = rnd(*shapes[0]), rnd(*shapes[1], seed=1)
    before = onednn.stats()["misses"] + onednn.stats()["hits"]
    xs = [gradcore.Tensor(v) for v in (a, b)]
    gm = GradManager().attach(xs)
    g = None
    with gm:
        y = GF.matmul(xs[0], xs[1], transpose_a=ta, transpose_b=tb)
        g = rnd(*y.shape, seed=2)
        gm.backward((y * gradcore.Tensor(g)).sum())
    used = onednn.stats()["misses"] + onednn.stats()["hits"] - before
    assert (used >= 1) == (path == "oneDNN")
    ts = [torch.tensor(v, requires_grad=True) for v in (a, b)]
    ty = (ts[0].transpose(-1, -2) if ta else ts[0]) @ (ts[1].transpose(-1, -2) if tb else ts[1])
    (ty * torch.tensor(g)).sum().backward()
    close(y.numpy(), ty, rtol=1e-4, atol=1e-3)
    for v, t in zip(xs, ts):
        close(v.grad.numpy(), t.grad, rtol=1e-4, atol=1e-3)


def _library_rss_kb():
    lib, total, cur = os.path.realpath(onednn.library_path()), 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                cur = len(head) >= 6 and head[1] == "r-xp" and os.path.realpath(head[5]) == lib
            elif cur and head[0] == "Rss:":
                total += int(head[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and madvise are Linux's")
def test_clear_cache_gives_back_the_library_code_pages():
    """clear_cache() drops libdnnl's resident code pages (the demo's peak:
    ~20 MB of them); the next primitive faults them back and computes the
    same values."""
    x, w = rnd(4, 16, 9, 9), rnd(32, 16, 3, 3, seed=1)
    y = onednn.conv_forward(x, w, 1, 1, 1)
    before = _library_rss_kb()
    onednn.clear_cache()
    after = _library_rss_kb()
    assert before > 1024 and after < before / 2, (before, after)
    np.testing.assert_array_equal(onednn.conv_forward(x, w, 1, 1, 1), y)
    assert _library_rss_kb() > after
    assert onednn.drop_code_pages() > 0


def test_small_blas_products_run_in_the_one_thread_scope(monkeypatch):
    """The grain for NumPy's BLAS: a float32 product OpenBLAS would split
    (over 2^18 multiply-adds) but below onednn.grain, not on oneDNN (below
    matmul_min), runs inside blas.single_threaded(); a tiny one and a
    large float64 one do not. Counted by wrapping the scope."""
    from gradcore.cpu import blas
    from gradcore.ops import linalg as linalg_ops
    entered = []
    real = blas.single_threaded

    def counting():
        entered.append(1)
        return real()
    monkeypatch.setattr(blas, "single_threaded", counting)
    mm = lambda a, b: GF.matmul(gradcore.Tensor(a), gradcore.Tensor(b)).numpy()
    mid = (rnd(100, 128), rnd(128, 64, seed=1))              # 819,200 multiply-adds
    assert linalg_ops._OPENBLAS_ONE_THREAD < 100 * 128 * 64 < min(onednn.matmul_min, onednn.grain)
    close(mm(*mid), mid[0] @ mid[1], rtol=1e-5, atol=1e-5)
    assert len(entered) == 1
    mm(rnd(8, 8), rnd(8, 8))
    big = rnd(256, 256).astype(np.float64)
    mm(big, big)                                             # 1.7e7: every thread
    assert len(entered) == 1
