"""The host memory pool (gradcore/_host_pool.pyx, gradcore/memory.py): NumPy's
allocator for CPU tensors, caching freed blocks of 32 KiB and more."""
import os
import subprocess
import sys
import threading
import tracemalloc

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.memory as mem
from gradcore.autodiff import GradManager

BIG = 1 << 16          # float64 elements: 512 KiB, pooled
SMALL = 16             # 128 bytes: plain malloc


@pytest.fixture(autouse=True)
def _pool_on():
    mem.enable()
    limit = mem.stats()["limit"]
    yield
    mem.set_limit(limit)


def test_importing_gradcore_installs_the_pool():
    assert mem.is_enabled()
    out = subprocess.run([sys.executable, "-c", "import gradcore.memory as m; print(m.is_enabled())"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_the_pool_can_be_left_out_by_environment():
    env = dict(os.environ, GRADCORE_HOST_POOL="0")
    out = subprocess.run([sys.executable, "-c", "import gradcore.memory as m; print(m.is_enabled())"],
                         capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"


def test_a_bad_cache_size_in_the_environment_is_a_clear_error():
    env = dict(os.environ, GRADCORE_HOST_CACHE_MB="lots")
    out = subprocess.run([sys.executable, "-c", "import gradcore"], capture_output=True, text=True, env=env)
    assert out.returncode != 0 and "GRADCORE_HOST_CACHE_MB" in out.stderr


def test_a_freed_large_block_is_handed_out_again():
    a = np.empty(BIG)
    addr = a.ctypes.data
    before = mem.stats()
    del a
    assert mem.stats()["cached_bytes"] >= before["cached_bytes"] + BIG * 8
    b = np.empty(BIG)
    assert b.ctypes.data == addr
    assert mem.stats()["hits"] == before["hits"] + 1


def test_sizes_in_one_class_share_blocks_and_other_sizes_do_not():
    a = np.empty(BIG + 1000, np.uint8)
    addr = a.ctypes.data
    del a
    b = np.empty(BIG + 2000, np.uint8)         # same class: 8 classes per power of two
    assert b.ctypes.data == addr
    del b
    c = np.empty(2 * BIG, np.uint8)            # another class
    assert c.ctypes.data != addr


def test_reused_blocks_are_zeroed_for_zeros():
    a = np.full(BIG, 7.0)
    del a
    z = np.zeros(BIG)
    assert not z.any()


def test_small_arrays_are_kept_apart_from_the_large_ones():
    before = mem.stats()
    for _ in range(100):
        np.empty(SMALL)
    after = mem.stats()
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"])


def test_a_freed_small_block_is_handed_out_again_and_zeroed_for_zeros():
    a = np.full(SMALL, 3.0)
    addr = a.ctypes.data
    del a
    z = np.zeros(SMALL)
    assert z.ctypes.data == addr and not z.any()


def test_numpy_error_state_still_works():
    with np.errstate(divide="raise"):
        with pytest.raises(FloatingPointError):
            np.float64(1.0) / np.zeros(3)
    with np.errstate(all="ignore"):
        assert np.isinf(np.ones(3) / np.zeros(3)).all()


def test_alignment():
    for n in (1, 3, SMALL, 1000, BIG, BIG + 3):
        assert np.empty(n, np.uint8).ctypes.data % 16 == 0
    assert np.empty(BIG + 3, np.uint8).ctypes.data % 64 == 0


@pytest.mark.parametrize("start,end", [(10, 20000), (20000, 10), (BIG, 3 * BIG), (3 * BIG, BIG), (BIG, 10),
                                       (10, BIG)])
def test_resize_keeps_the_contents(start, end):
    a = np.arange(start, dtype=np.float64)
    a.resize(end, refcheck=False)             # NumPy reallocs the data in place
    keep = min(start, end)
    np.testing.assert_array_equal(a[:keep], np.arange(keep, dtype=np.float64))
    if end > start:
        assert not a[start:].any()


def test_the_cache_is_bounded_and_can_be_emptied():
    mem.set_limit(3 * BIG * 8)
    arrays = [np.empty(BIG) for _ in range(6)]
    del arrays
    assert mem.stats()["cached_bytes"] <= 3 * BIG * 8
    mem.empty_cache()
    assert mem.stats()["cached_bytes"] == 0
    mem.set_limit(0)
    a = np.empty(BIG)
    del a
    assert mem.stats()["cached_bytes"] == 0


def test_a_block_that_does_not_fit_empties_the_stale_cache():
    mem.empty_cache()
    mem.set_limit(4 * BIG * 8)
    a, b = np.empty(BIG), np.empty(BIG)
    del a, b                                   # 2 blocks cached
    flushes = mem.stats()["flushes"]
    c = np.empty(3 * BIG)
    del c                                      # does not fit next to them: they go
    s = mem.stats()
    assert s["flushes"] == flushes + 1 and s["cached_bytes"] <= 4 * BIG * 8


def test_set_limit_rejects_negative():
    with pytest.raises(ValueError, match="set_limit"):
        mem.set_limit(-1)


def test_pool_disabled_uses_numpys_allocator_and_frees_correctly_later():
    before = mem.stats()
    with mem.pool_disabled():
        assert not mem.is_enabled()
        a = np.empty(BIG)
    assert mem.is_enabled()
    assert mem.stats()["misses"] == before["misses"]
    del a                                      # freed by NumPy's allocator, not the pool
    assert mem.stats()["cached_bytes"] == before["cached_bytes"]
    b = np.empty(BIG)                          # and pool blocks still work
    b[:] = 1
    assert b.sum() == BIG


def test_threads_allocating_and_freeing_concurrently():
    errors = []
    shared = [np.full(BIG, 1.0) for _ in range(8)]

    def work(seed):
        try:
            mem.enable()
            rng = np.random.default_rng(seed)
            for i in range(300):
                n = int(rng.integers(1, 4)) * BIG
                a = np.full(n, float(i))
                if a[0] != i or a[-1] != i:
                    errors.append("corrupt")
                if i % 50 == 0 and shared:
                    shared.pop()                # freed here, made by the main thread
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_tracemalloc_still_sees_numpy_arrays():
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        a = np.empty(BIG)
        assert tracemalloc.get_traced_memory()[0] - base >= BIG * 8
        del a
        assert tracemalloc.get_traced_memory()[0] - base < BIG * 8
    finally:
        tracemalloc.stop()


def test_a_training_step_reuses_its_buffers():
    """After the first step, every large array of an MLP step comes from the cache."""
    rng = np.random.default_rng(0)
    w1 = gc.Parameter(rng.standard_normal((256, 128)).astype(np.float32) * 0.1)
    w2 = gc.Parameter(rng.standard_normal((10, 256)).astype(np.float32) * 0.1)
    x = gc.tensor(rng.standard_normal((64, 128)).astype(np.float32))
    y = gc.tensor(rng.integers(0, 10, 64))
    gm = GradManager().attach([w1, w2])

    def step():
        w1.grad = w2.grad = None
        with gm:
            loss = F.cross_entropy(F.linear(F.relu(F.linear(x, w1)), w2), y)
            gm.backward(loss)
        return loss.item()

    first = step()
    step()
    before = mem.stats()
    assert step() == first
    after = mem.stats()
    assert after["hits"] > before["hits"]
    assert after["misses"] == before["misses"]


# ------------------------------------------------- no reference cycle per call
# What a step leaves must be freed by reference counting: with the cyclic GC
# off, a cycle made per call is memory that only a later collection returns
# (and gc.collect() finds it). Each case runs once first (caches filled).
@pytest.fixture
def no_cyclic_gc():
    import gc as pygc
    pygc.collect()
    was = pygc.isenabled()
    pygc.disable()
    try:
        yield pygc
    finally:
        if was:
            pygc.enable()


def _cyclic_objects_left(pygc, call, times=3) -> int:
    call()
    pygc.collect()
    for _ in range(times):
        call()
    return pygc.collect()


def test_state_dict_and_deepcopy_leave_no_cycle(no_cyclic_gc):
    import copy
    import io
    import gradcore.module as M

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.a = M.Linear(4, 3)
            self.b = M.Sequential(M.Linear(3, 2), M.BatchNorm1d(2))

    net = Net()

    def call():
        sd = copy.deepcopy(net).state_dict()
        net.load_state_dict(sd)
        f = io.BytesIO()
        gc.save(net.state_dict(keep_var=True), f)
    assert _cyclic_objects_left(no_cyclic_gc, call) == 0


def _emulator():
    import shutil
    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("the CUDA emulator needs g++")
    from gradcore.cuda import runtime
    return runtime


def test_a_cuda_emulator_training_step_leaves_no_cycle(no_cyclic_gc):
    runtime = _emulator()
    runtime.use("emulator")
    try:
        import gradcore.module as M
        import gradcore.optimizer as optim
        net = M.Sequential(M.Linear(8, 16), M.ReLU(), M.Linear(16, 4)).to("cuda")
        gm = GradManager().attach(net.parameters())
        opt = optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        x = gc.tensor(np.random.RandomState(0).randn(5, 8).astype("float32"), device="cuda")

        def step():        # GEMMs forward and backward, elementwise kernel launches
            with gm:
                gm.backward((net(x) ** 2).mean())
            opt.step().clear_grad()
        assert _cyclic_objects_left(no_cyclic_gc, step) == 0
    finally:
        runtime.use(None)


# ---------------------------------- an error handled leaves nothing behind
# An exception held in a local of the frame that raises it is a cycle (frame
# -> exception -> traceback -> frame): that frame's tensors and loader state
# would outlive the handled error until the cyclic GC ran.
def test_an_operand_error_does_not_keep_the_operands(no_cyclic_gc):
    import weakref
    x = gc.tensor(np.ones(3, "float32")) * 2
    ref = weakref.ref(x)
    with pytest.raises(TypeError, match="operand is None"):
        x + None
    del x
    assert ref() is None
    assert no_cyclic_gc.collect() == 0


def _data_classes():
    from gradcore.data import MapDataset, StreamDataset

    class FailsAt(MapDataset):
        """A map dataset failing at one index."""

        def __init__(self, n: int, bad: int):
            self.n, self.bad = n, bad

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if i == self.bad:
                raise ValueError(f"sample {i} is bad")
            return np.full(2, i, "float32")

    class Broken(StreamDataset):
        """A stream that breaks after one sample."""

        def __init__(self):
            pass

        def __iter__(self):
            yield np.zeros(2, "float32")
            raise ValueError("the stream broke")
    return FailsAt, Broken


@pytest.mark.parametrize("kind", ["worker", "stream_with_timeout"])
def test_a_data_loader_error_leaves_no_cycle(kind, no_cyclic_gc):
    from gradcore.data import DataLoader, SequentialSampler, StreamSampler
    FailsAt, Broken = _data_classes()
    if kind == "worker":
        ds = FailsAt(8, 5)

        def make():
            return DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2)
    else:
        ds = Broken()

        def make():
            return DataLoader(ds, StreamSampler(batch_size=1), timeout=30)

    def epoch():
        with pytest.raises(ValueError):
            for _ in make():
                pass
    assert _cyclic_objects_left(no_cyclic_gc, epoch, times=2) == 0


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_cuda_dlpack_exports_leave_no_cycle(max_version, no_cyclic_gc):
    runtime = _emulator()
    runtime.use("emulator")
    try:
        from gradcore.cuda import dlpack
        t = gc.tensor(np.ones((3, 4), "float32"), device="cuda")

        def export():
            cap = (t * 2).__dlpack__(max_version=max_version)      # dropped, not consumed
            del cap
            back = gc.from_dlpack((t + 1).__dlpack__(max_version=max_version))     # consumed
            assert back.shape == (3, 4)
        assert _cyclic_objects_left(no_cyclic_gc, export) == 0
        assert not dlpack._exported        # every capsule's deleter ran
    finally:
        runtime.use(None)


def test_the_onednn_refusals_are_bounded(monkeypatch):
    # a configuration oneDNN refuses is remembered per shape: bounded as the
    # primitive cache, or a program of ever-new shapes grows the table
    from gradcore.cpu import onednn
    monkeypatch.setattr(onednn, "cache_limit", 8)
    onednn.clear_cache()

    def refused():
        raise onednn._onednn.OnednnError("not implemented")
    for i in range(50):
        assert onednn._primitive(("test_refusal", i), refused, 1.0) is None
    assert 0 < len(onednn._refused) <= 8
    onednn.clear_cache()
