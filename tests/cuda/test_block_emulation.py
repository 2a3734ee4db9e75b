"""Block-cooperative kernels on the host emulator (gradcore/cuda/emulator_blocks.py):
``__syncthreads``, ``__shared__`` (static and dynamic), the warp intrinsics,
and the errors a GPU would hang on; then the block reductions that rely on
them (ops/reduce.py, ops/nn.py) on awkward sizes, against the cpu."""
import shutil
import subprocess

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.cuda import emulator_blocks
from gradcore.cuda._launch import pack_params
from gradcore.ops import nn, reduce as red

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="the CUDA emulator needs g++")

SOURCE = r"""
extern "C" __global__ void reverse_in_block(const float* x, float* y) {
    __shared__ float s[256];
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    s[threadIdx.x] = x[i];
    __syncthreads();                       // without it, thread 0 reads s[255] before it is written
    y[i] = s[blockDim.x - 1 - threadIdx.x];
}
extern "C" __global__ void reverse_no_barrier(const float* x, float* y) {
    __shared__ float s[256];
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    s[threadIdx.x] = x[i];
    y[i] = s[blockDim.x - 1 - threadIdx.x];
}
extern "C" __global__ void first_block_writes(int* y) {
    __shared__ int s[1];
    if (blockIdx.x == 0 && threadIdx.x == 0) s[0] = 7;
    __syncthreads();
    y[blockIdx.x * blockDim.x + threadIdx.x] = s[0];
}
extern "C" __global__ void shuffles(const int* x, int* out) {
    // out: 8 results per thread
    const int t = threadIdx.x + blockDim.x * threadIdx.y, lane = t & 31;
    int v = x[t], down = v, xr = v;
    for (int o = 16; o > 0; o >>= 1) down += __shfl_down_sync(0xffffffffu, down, o);
    for (int o = 16; o > 0; o >>= 1) xr += __shfl_xor_sync(0xffffffffu, xr, o);
    int up = v;                            // inclusive scan in segments of 16
    for (int o = 1; o < 16; o <<= 1) { int u = __shfl_up_sync(0xffffffffu, up, o, 16); if ((lane & 15) >= o) up += u; }
    int* o = out + 8 * t;
    o[0] = down; o[1] = xr; o[2] = up;
    o[3] = __shfl_sync(0xffffffffu, v, 3);
    o[4] = __shfl_sync(0xffffffffu, v, 5, 8);
    o[5] = (int)__ballot_sync(0xffffffffu, v % 3 == 0);
    o[6] = __any_sync(0xffffffffu, v == 40) + 2 * __all_sync(0xffffffffu, v >= 0);
    __syncwarp();
    o[7] = __shfl_down_sync(0xffffffffu, (double)v * 0.5, 1) * 2;     // 8-byte values
}
extern "C" __global__ void barrier_votes(const int* x, int* out) {
    const int v = x[threadIdx.x];
    int* o = out + 3 * threadIdx.x;
    o[0] = __syncthreads_count(v > 10);
    o[1] = __syncthreads_and(v >= 0);
    o[2] = __syncthreads_or(v == 99);
}
extern "C" __global__ void partial_masks(const int* x, int* out) {
    const int lane = threadIdx.x & 31;
    int v = x[threadIdx.x];
    if (lane < 16) v += __shfl_xor_sync(0x0000ffffu, v, 1);      // half the warp, then all of it
    out[2 * threadIdx.x] = v;
    out[2 * threadIdx.x + 1] = __shfl_down_sync(0xffffffffu, v, 16);
}
extern "C" __global__ void dynamic_rotate(const float* x, float* y, int n) {
    extern __shared__ float buf[];
    buf[threadIdx.x] = x[threadIdx.x] * 2;
    __syncthreads();
    y[threadIdx.x] = buf[(threadIdx.x + 1) % n];
}
extern "C" __global__ void dynamic_untouched(float* y) {
    extern __shared__ float buf[];
    y[threadIdx.x] = buf[threadIdx.x];
}
extern "C" __global__ void exit_before_barrier(float* y) {
    if (threadIdx.x < 16) return;
    __syncthreads();
    y[threadIdx.x] = 1;
}
extern "C" __global__ void divergent_barriers(float* y) {
    if (threadIdx.x < 16) { __syncthreads(); }
    else { __syncthreads(); }              // (barriers are told apart by their source line)
    y[threadIdx.x] = 1;
}
extern "C" __global__ void warp_deadlock(float* y) {
    if (threadIdx.x < 16) { y[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1); }
    else { __syncthreads(); }
}
extern "C" __global__ void mask_of_missing_lanes(float* y) {
    y[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1);
}
extern "C" __global__ void plain_copy(const float* x, float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += blockDim.x * (long long)gridDim.x)
        y[i] = x[i];
}
"""


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    """A fresh host driver and the test module loaded on it."""
    from gradcore.cuda.emulator import HostDriver
    driver = HostDriver(tmp_path_factory.mktemp("blocks"))
    module = driver.load("block_tests", SOURCE)
    return driver, module


class _Run:
    def __init__(self, driver, module):
        self.driver, self.module = driver, module
        self.buffers = []

    def device(self, host):
        host = np.ascontiguousarray(host)
        alloc = self.driver.alloc(host.nbytes)
        self.buffers.append(alloc)
        self.driver.htod(int(alloc), host)
        return alloc

    def launch(self, kernel, grid, block, *args, shared=0):
        params = [np.uint64(int(a)) if not isinstance(a, np.generic) else a for a in args]
        self.driver.launch(self.driver.function(self.module, kernel), grid + (1,) * (3 - len(grid)),
                           block + (1,) * (3 - len(block)), pack_params(params), shared)

    def get(self, alloc, like):
        out = np.empty_like(like)
        self.driver.dtoh(out, int(alloc))
        return out


@pytest.fixture
def run(emu):
    return _Run(*emu)


def test_barrier_orders_the_threads_of_a_block(run):
    x = np.arange(3 * 256, dtype=np.float32)
    dx, dy = run.device(x), run.device(np.zeros_like(x))
    run.launch("reverse_in_block", (3,), (256,), dx, dy)
    np.testing.assert_array_equal(run.get(dy, x), x.reshape(3, 256)[:, ::-1].ravel())
    # the same kernel without the barrier reads shared memory not yet written
    # in this block: the poison (NaN), not the values a one-pass emulation
    # or the previous block would have left
    run.launch("reverse_no_barrier", (3,), (256,), dx, dy)
    got = run.get(dy, x).reshape(3, 256)
    assert np.isnan(got[:, :128]).all()
    np.testing.assert_array_equal(got[:, 128:], x.reshape(3, 256)[:, 127::-1])


def test_shared_memory_is_per_block(run):
    y = np.zeros(4 * 32, np.int32)
    dy = run.device(y)
    run.launch("first_block_writes", (4,), (32,), dy)
    got = run.get(dy, y).reshape(4, 32)
    assert (got[0] == 7).all()
    assert (got[1:] == -1).all()        # 0xff bytes: nothing of block 0 leaks into the others


@pytest.mark.parametrize("block", [(64, 1), (32, 2)])
def test_warp_intrinsics(run, block):
    n = block[0] * block[1]
    x = np.random.default_rng(0).integers(0, 50, n).astype(np.int32)
    out = np.zeros((n, 8), np.int32)
    dx, dout = run.device(x), run.device(out)
    run.launch("shuffles", (1,), block, dx, dout)
    got = run.get(dout, out)
    w = x.reshape(-1, 32)
    lanes = np.arange(32)
    # __shfl_down_sync tree: lane 0 holds the warp's sum
    np.testing.assert_array_equal(got[::32, 0], w.sum(1))
    # butterfly: every lane holds it
    np.testing.assert_array_equal(got[:, 1], np.repeat(w.sum(1), 32))
    # inclusive scan within each 16-lane segment (__shfl_up_sync, width 16)
    np.testing.assert_array_equal(got[:, 2], np.cumsum(x.reshape(-1, 16), 1).ravel())
    np.testing.assert_array_equal(got[:, 3], np.repeat(w[:, 3], 32))
    # width 8: lane 5 of each group of 8
    np.testing.assert_array_equal(got[:, 4], np.repeat(x.reshape(-1, 8)[:, 5], 8))
    ballot = np.array([sum(1 << int(i) for i in lanes[row % 3 == 0]) for row in w], np.uint32).view(np.int32)
    np.testing.assert_array_equal(got[:, 5], np.repeat(ballot, 32))
    vote = (w == 40).any(1).astype(np.int32) + 2 * (w >= 0).all(1)
    np.testing.assert_array_equal(got[:, 6], np.repeat(vote, 32))
    # down by one: the last lane of each warp keeps its own value
    expect = np.concatenate([np.append(row[1:], row[-1]) for row in w])
    np.testing.assert_array_equal(got[:, 7], expect)


def test_barrier_votes(run):
    x = np.arange(96, dtype=np.int32) % 50
    out = np.zeros((96, 3), np.int32)
    dx, dout = run.device(x), run.device(out)
    run.launch("barrier_votes", (2,), (96,), dx, dout)       # two blocks: the counts start afresh
    got = run.get(dout, out)
    np.testing.assert_array_equal(got, np.tile([[(x > 10).sum(), 1, 0]], (96, 1)))


def test_warp_operations_of_part_of_a_warp(run):
    x = np.arange(64, dtype=np.int32) * 3
    out = np.zeros(128, np.int32)
    dx, dout = run.device(x), run.device(out)
    run.launch("partial_masks", (1,), (64,), dx, dout)
    got = run.get(dout, out).reshape(64, 2)
    lane = np.arange(64) % 32
    v = np.where(lane < 16, x + x[np.arange(64) ^ 1], x)
    np.testing.assert_array_equal(got[:, 0], v)
    np.testing.assert_array_equal(got[:, 1], np.where(lane < 16, v[np.minimum(np.arange(64) + 16, 63)], v))


def test_dynamic_shared_memory(run):
    x = np.arange(1, 9, dtype=np.float32)
    dx, dy = run.device(x), run.device(np.zeros_like(x))
    run.launch("dynamic_rotate", (1,), (8,), dx, dy, np.int32(8), shared=8 * 4)
    np.testing.assert_array_equal(run.get(dy, x), np.roll(2 * x, -1))
    run.launch("dynamic_untouched", (1,), (8,), dy, shared=8 * 4)
    assert np.isnan(run.get(dy, x)).all()        # poisoned before each block
    with pytest.raises(RuntimeError, match="too much shared memory"):
        run.launch("dynamic_rotate", (1,), (8,), dx, dy, np.int32(8), shared=48 * 1024 + 4)


@pytest.mark.parametrize("shared", [0, 4 * 4])
def test_a_launch_that_forgets_the_dynamic_shared_size_is_an_error(run, shared):
    # on a GPU the writes past the launch's size fault or corrupt memory; the
    # emulator's buffer is 48 KiB whatever the size, so they used to pass unseen
    x = np.arange(1, 9, dtype=np.float32)
    dx, dy = run.device(x), run.device(np.zeros_like(x))
    with pytest.raises(RuntimeError, match=rf"dynamic_rotate.*wrote byte {shared} of the dynamic shared "
                                           rf"memory .* the launch gave it {shared} bytes: .*shared="):
        run.launch("dynamic_rotate", (1,), (8,), dx, dy, np.int32(8), shared=shared)
    run.launch("dynamic_rotate", (1,), (8,), dx, dy, np.int32(8), shared=8 * 4)   # and a right launch after it
    np.testing.assert_array_equal(run.get(dy, x), np.roll(2 * x, -1))


@pytest.mark.parametrize("kernel, block, message", [
    ("exit_before_barrier", 32, r"thread \(0, 0, 0\) exited while 16 threads .* wait at __syncthreads \(line \d+\)"),
    ("divergent_barriers", 32,
     r"threads wait at different __syncthreads: thread \(0, 0, 0\) at line \d+, thread \(16, 0, 0\)"),
    ("warp_deadlock", 32, r"deadlock: thread \(\d+, 0, 0\) waits in a warp operation"),
    ("mask_of_missing_lanes", 16,
     r"thread \(0, 0, 0\): line \d+: a warp operation's mask 0xffffffff names lanes that do not exist "
     r"in a block of 16 threads"),
])
def test_missed_barriers_are_errors_not_hangs(run, kernel, block, message):
    y = np.zeros(32, np.float32)
    dy = run.device(y)
    with pytest.raises(RuntimeError, match=f"kernel {kernel} .*block \\(0, 0, 0\\): {message}"):
        run.launch(kernel, (1,), (block,), dy)
    # the fibers stopped half-way are started afresh: the next launch is right
    x = np.arange(256, dtype=np.float32)
    dx, dz = run.device(x), run.device(np.zeros_like(x))
    run.launch("reverse_in_block", (1,), (256,), dx, dz)
    np.testing.assert_array_equal(run.get(dz, x), x[::-1])


def test_plain_kernels_keep_the_single_pass(emu):
    driver, module = emu
    assert module.cooperative          # the module above uses barriers
    plain = driver.load("plain", SOURCE[SOURCE.index('extern "C" __global__ void plain_copy'):])
    assert not plain.cooperative
    assert driver.kernel_handle(driver.function(plain, "plain_copy"))[0] == "host"
    # a cooperative kernel goes through the driver's launch (shared size, errors)
    assert driver.kernel_handle(driver.function(module, "reverse_in_block")) == ("python", 0)


def test_source_scan_and_rewrite():
    assert not emulator_blocks.is_cooperative("y[i] = x[i];")
    for word in ("__syncthreads()", "__shared__ int s[2];", "__shfl_xor_sync(m, v, 1)", "__ballot_sync(m, p)",
                 "__syncwarp()"):
        assert emulator_blocks.is_cooperative(word)
    src = "a\n  extern __shared__ __align__(16) unsigned char smem[];\nb\n"
    out = emulator_blocks.rewrite_dynamic_shared(src)
    assert out.count("\n") == src.count("\n")
    assert "unsigned char* const smem = reinterpret_cast<unsigned char*>(gc_emu_dynamic_shared);" in out


# ---------------------------------------------------------------- the block reductions
SIZES = (1, 31, 32, 33, 1023, 1025)      # up to 32: a thread per output; above: blocks
FN = {"sum": F.sum, "mean": F.mean, "max": F.max, "min": F.min, "prod": F.prod}


def _x(shape, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (rng.uniform(0.9, 1.1, shape) * rng.choice([-1, 1], shape)).astype(dtype)


@pytest.mark.parametrize("n", SIZES)
def test_reductions_on_awkward_sizes(cuda, matches_cpu, n):
    for mode, fn in FN.items():
        x = _x((3, n))
        matches_cpu(lambda t: fn(t, axis=1), [x], second_order=False)             # a block per row
        matches_cpu(lambda t: fn(t, axis=0), [_x((n, 35), 1)], second_order=False)  # column tiles
        matches_cpu(lambda t: fn(t), [x], second_order=False)
    matches_cpu(lambda t: F.var(t, axis=1), [_x((2, n))], second_order=False)
    matches_cpu(lambda t: F.norm(t, axis=0), [_x((n, 3))], second_order=False)


@pytest.mark.parametrize("n", SIZES)
def test_row_ops_on_awkward_sizes(cuda, matches_cpu, n):
    x = _x((4, n)) * 3
    for fn in (lambda t: F.softmax(t, axis=1), lambda t: F.log_softmax(t, axis=1),
               lambda t: F.logsumexp(t, axis=1), lambda t: F.softmax(t, axis=0)):
        matches_cpu(fn, [x], second_order=False)
    labels = np.arange(4) % n
    matches_cpu(lambda t: F.cross_entropy(t, gc.Tensor(labels, device=t.device)), [x], second_order=False)


def test_reductions_of_nothing(cuda, matches_cpu):
    with np.errstate(all="ignore"):
        for fn in (F.sum, F.prod, F.mean):
            matches_cpu(lambda t: fn(t, axis=1), [np.zeros((3, 0), np.float32)], second_order=False)
            matches_cpu(lambda t: fn(t, axis=0), [np.zeros((0, 40), np.float32)], second_order=False)
        matches_cpu(lambda t: F.softmax(t, axis=1), [np.zeros((0, 5), np.float32)], second_order=False)


def test_integer_and_bool_reductions(cuda):
    rng = np.random.default_rng(3)
    # (all C types compile with nvcc: test_block_kernels_compile_with_nvcc_for_every_type)
    for dtype in (np.int8, np.int32, np.uint8, np.bool_):
        x = rng.integers(0, 3, (40, 70)).astype(dtype)     # axis 0: column tiles; 1 and None: rows
        t = gc.Tensor(x, device="cuda")
        for fn in (F.sum, F.max, F.min):
            for axis in (None, 0, 1):
                np.testing.assert_array_equal(fn(t, axis=axis).numpy(), fn(gc.Tensor(x), axis=axis).numpy(),
                                              err_msg=f"{fn.__name__} {np.dtype(dtype)} axis {axis}")


def test_big_rows_two_passes(cuda, matches_cpu, monkeypatch):
    # a long axis with few outputs: partial sums, then those; with the knob
    # lowered, three passes
    x = _x((70_001,), 2, np.float64)
    launched = cuda.driver.launched if hasattr(cuda.driver, "launched") else None
    for mode in ("sum", "mean", "max", "min"):
        matches_cpu(lambda t: FN[mode](t), [x], rtol=1e-10, atol=1e-10, second_order=False)
    monkeypatch.setattr(red, "_SERIAL", 16)       # 70001 -> 64 partials -> 4 -> 1
    monkeypatch.setattr(red, "_PARALLEL", 64)
    y = gc.Tensor(x, device="cuda")
    if launched is not None:
        launched.clear()
    np.testing.assert_allclose(F.sum(y).numpy(), x.sum(), rtol=1e-12)
    if launched is not None:
        # long chunks: a block per (row, part); short ones: a thread per output
        assert [k for k in launched if k.startswith("gc_reduce_")] == [
            "gc_reduce_rows_sum_double", "gc_reduce_sum_double", "gc_reduce_sum_double"]
    cols = x[:70_000].reshape(10_000, 7)         # column tiles, in passes too
    np.testing.assert_allclose(F.mean(gc.Tensor(cols, device="cuda"), axis=0).numpy(), cols.mean(0), rtol=1e-12)


@pytest.mark.slow
def test_big_reductions(cuda, matches_cpu):
    x = _x((300, 4097), 4)
    for fn in (lambda t: F.sum(t, axis=1), lambda t: F.max(t, axis=0), lambda t: F.mean(t),
               lambda t: F.log_softmax(t, axis=1), lambda t: F.softmax(t, axis=0)):
        matches_cpu(fn, [x], second_order=False, rtol=1e-4, atol=1e-5)
    matches_cpu(lambda t: F.sum(t), [_x((1 << 20,), 5)], rtol=1e-4, atol=1e-3, second_order=False)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_block_kernels_compile_with_nvcc_for_every_type(tmp_path):
    """The registry test compiles float and double; the block reductions'
    shuffles of small types (bool, char, short) need their promotion."""
    from gradcore.cuda.runtime import CTYPES
    parts = []
    for ctype in CTYPES.values():
        for mode in ("sum", "mean", "max", "min", "prod"):
            parts.append(red.Reduce(mode).cuda_source(ctype))
    for op in (nn.LogSoftmax(1), nn.Softmax(1), nn.LogSumExp(1)):
        parts.append(op.cuda_source("float"))
    path = tmp_path / "blocks.cu"
    path.write_text("\n".join(parts))
    out = subprocess.run([shutil.which("nvcc"), "--ptx", "-o", str(tmp_path / "out.ptx"), str(path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    ptx = (tmp_path / "out.ptx").read_text()
    assert "shfl.sync.bfly" in ptx and "bar.sync" in ptx


@pytest.mark.parametrize("shape, perm", [((1, 1), (1, 0)), ((31, 33), (1, 0)), ((64, 32), (1, 0)),
                                         ((3, 33, 65), (0, 2, 1)), ((2, 1, 40, 3), (0, 3, 2, 1)),
                                         ((2, 3, 4), (1, 0, 2))])
def test_transposes(cuda, matches_cpu, shape, perm):
    x = _x(shape)
    matches_cpu(lambda t: F.transpose(t, perm), [x], second_order=False)
    for dtype in (np.bool_, np.int8, np.float64):
        y = (x > 0).astype(dtype) if dtype is np.bool_ else (x * 50).astype(dtype)
        np.testing.assert_array_equal(F.transpose(gc.Tensor(y, device="cuda"), perm).numpy(), y.transpose(perm))


def test_matrix_transposes_use_tiles(cuda):
    if not hasattr(cuda.driver, "launched"):
        pytest.skip("the kernel trace is the emulator's")
    cuda.driver.launched.clear()
    x = gc.Tensor(_x((70, 45)), device="cuda")
    F.transpose(x, (1, 0)).numpy()
    F.transpose(gc.Tensor(_x((2, 3, 4)), device="cuda"), (1, 0, 2)).numpy()
    assert [k for k in cuda.driver.launched if "transpose" in k] == ["gc_transpose_tiled_float", "gc_transpose_float"]


def test_block_kernels_to_second_order(cuda, matches_cpu):
    # axes longer than 32: the forward and the reductions of the backward run
    # as block kernels (rows and column tiles)
    x = _x((3, 40))
    for mode, fn in FN.items():
        for axis in (1, 0, None):
            matches_cpu(lambda t: fn(t, axis=axis), [x if axis != 0 else x.T.copy()], rtol=1e-4, atol=1e-4)
    for fn in (lambda t: F.softmax(t, axis=1), lambda t: F.log_softmax(t, axis=1), lambda t: F.logsumexp(t, axis=1),
               lambda t: F.var(t, axis=1)):
        matches_cpu(fn, [x], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_test_kernels_are_cuda(tmp_path):
    """The kernels above are what nvcc compiles, not an emulator dialect."""
    path = tmp_path / "tests.cu"
    path.write_text(SOURCE)
    out = subprocess.run([shutil.which("nvcc"), "--ptx", "-o", str(tmp_path / "out.ptx"), str(path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]


def test_block_kernels_in_a_captured_cuda_graph(cuda):
    """A graphed training step whose loss runs block kernels (40 classes:
    the cross-entropy's rows and its gradient's by blocks; a batch of 48:
    the mean's block) replays them exactly as eager steps run them."""
    import gradcore.cuda as gcuda
    from gradcore.autodiff import GradManager

    def net():
        rng = np.random.default_rng(0)
        w = gc.Parameter(rng.normal(0, 0.3, (24, 40)).astype(np.float32), device="cuda")
        gm, opt = GradManager().attach([w]), gc.optimizer.SGD([w], lr=0.1)

        def step(x, y):
            with gm:
                loss = F.cross_entropy(F.matmul(x, w), y)
                gm.backward(loss)
            opt.step().clear_grad()
            return loss
        return w, step

    (w_eager, eager), (w_graphed, step) = net(), net()
    step = gcuda.graphed(step, warmup=1)
    rng = np.random.default_rng(1)
    if hasattr(cuda.driver, "launched"):
        cuda.driver.launched.clear()
    for _ in range(4):
        x = gc.Tensor(rng.standard_normal((48, 24)).astype(np.float32), device="cuda")
        y = gc.Tensor(rng.integers(0, 40, 48).astype(np.int32), device="cuda")
        np.testing.assert_array_equal(step(x, y).numpy(), eager(x, y).numpy())
    np.testing.assert_array_equal(w_graphed.numpy(), w_eager.numpy())
    assert step.replays >= 2
    if hasattr(cuda.driver, "launched"):
        assert {"gc_cross_entropy_rows_float_i32", "gc_cross_entropy_grad_rows_float_i32"} <= set(cuda.driver.launched)
