"""gradcore.data: datasets, samplers, collator, transforms and DataLoader
(worker processes, shared memory, order, errors, clean-up, resuming).

Tests with workers use generous timeouts and never assert on time: CI runs
them on a loaded two-core machine."""
import glob
import multiprocessing
import os
import signal
import sys
import time

import numpy as np
import pytest

import gradcore as gc
from gradcore.data import (ArrayDataset, Collator, DataLoader, Infinite, MapDataset, RandomSampler,
                           ReplacementSampler, SequentialSampler, StreamDataset, StreamSampler)
from gradcore.data import transform as T

posix_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checks /proc and /dev/shm")


def _xy(n=10):
    return ArrayDataset(np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n, dtype=np.int32))


def _segments():
    return set(glob.glob(f"/dev/shm/gcdl{os.getpid()}_*"))


def _assert_gone(pids):
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} is still there"
    assert multiprocessing.active_children() == []


# ---------------------------------------------------------------- datasets and samplers

def test_array_dataset_and_errors():
    ds = _xy(4)
    x, y = ds[3]
    assert x.tolist() == [6.0, 7.0] and y == 3 and len(ds) == 4
    with pytest.raises(ValueError, match="lengths differ"):
        ArrayDataset(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="at least one"):
        ArrayDataset()
    with pytest.raises(TypeError):
        MapDataset()                   # abstract


def test_samplers_batch_size_drop_last_and_megengine_order():
    ds = _xy(7)
    assert list(SequentialSampler(ds, batch_size=3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(SequentialSampler(ds, batch_size=3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]
    assert len(SequentialSampler(ds, batch_size=3)) == 3 and len(SequentialSampler(ds, 3, True)) == 2
    s = RandomSampler(ds, batch_size=3, seed=4)
    first, second = sum(list(s), []), sum(list(s), [])
    # MegEngine draws RandomState(seed).permutation once per epoch
    rs = np.random.RandomState(4)
    assert first == rs.permutation(7).tolist() and second == rs.permutation(7).tolist()
    assert first != second
    assert sorted(ReplacementSampler(ds, batch_size=2, num_samples=6, seed=0).sample()) != list(range(6))
    assert list(SequentialSampler(ds, batch_size=2, indices=[5, 1, 3])) == [[5, 1], [3]]


@pytest.mark.parametrize("kind", ["sequential", "random"])
def test_sharding_by_rank_covers_the_data_once_per_rank(kind):
    ds = _xy(10)
    parts = []
    for rank in range(3):
        if kind == "sequential":
            s = SequentialSampler(ds, batch_size=2, world_size=3, rank=rank)
        else:
            s = RandomSampler(ds, batch_size=2, world_size=3, rank=rank)   # seed 0 on every rank
        parts.append(sum(list(s), []))
        assert len(parts[-1]) == 4 and len(s) == 2
    together = sum(parts, [])
    assert sorted(set(together)) == list(range(10))     # all covered; 2 repeated to even out
    assert len(together) == 12


def test_sampler_errors_are_clear():
    ds = _xy(3)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        SequentialSampler(ds, batch_size=0)
    with pytest.raises(ValueError, match="drop_last"):
        RandomSampler(ds, batch_size=1, drop_last="yes")
    with pytest.raises(ValueError, match="rank must be"):
        SequentialSampler(ds, world_size=2, rank=2)
    with pytest.raises(TypeError, match="StreamSampler"):
        SequentialSampler(iter([1, 2]))
    with pytest.raises(ValueError, match="seed"):
        RandomSampler(ds, seed=-1)
    with pytest.raises(KeyError, match="rng"):
        RandomSampler(ds, seed=0).load_state_dict({})
    with pytest.raises(TypeError, match="map sampler"):
        Infinite(StreamSampler(2))


def test_random_sampler_without_seed_follows_gradcore_random():
    ds = _xy(20)
    gc.random.seed(3)
    a = list(RandomSampler(ds, batch_size=20))
    gc.random.seed(3)
    b = list(RandomSampler(ds, batch_size=20))
    assert a == b


def test_infinite_restarts_reshuffles_and_resumes():
    ds = _xy(5)
    inf = Infinite(RandomSampler(ds, batch_size=2, seed=1))
    it = iter(inf)
    batches = [next(it) for _ in range(7)]
    assert [len(b) for b in batches] == [2, 2, 1, 2, 2, 1, 2]
    assert sorted(sum(batches[:3], [])) == list(range(5)) and batches[:3] != batches[3:6]
    assert len(inf) == np.iinfo(np.int64).max

    inf = Infinite(RandomSampler(ds, batch_size=2, seed=1))
    for _ in range(4):
        next(inf)
    state = inf.state_dict()
    rest = [next(inf) for _ in range(4)]
    other = Infinite(RandomSampler(ds, batch_size=2, seed=99))
    other.load_state_dict(state)
    assert [next(other) for _ in range(4)] == rest


# ---------------------------------------------------------------- collator

def test_collator_follows_megengine():
    c = Collator()
    x, y = c.apply([(np.zeros((2, 3), np.float32), 1), (np.ones((2, 3), np.float32), 2)])
    assert x.shape == (2, 2, 3) and x.dtype == np.float32 and x.flags.c_contiguous
    assert y.tolist() == [1, 2]
    assert c.apply([1.5, 2.5]).dtype == np.float64
    assert c.apply(["a", "b"]) == ["a", "b"]
    d = c.apply([{"v": np.float32(1)}, {"v": np.float32(2)}])
    assert d["v"].dtype == np.float32 and d["v"].tolist() == [1, 2]
    with pytest.raises(ValueError, match="different shapes"):
        c.apply([np.zeros(2), np.zeros(3)])
    with pytest.raises(TypeError, match="found object"):
        c.apply([object(), object()])


# ---------------------------------------------------------------- transforms

def test_transforms_on_numpy_images():
    img = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)          # H=2, W=3, C=2
    assert T.ToMode("CHW").apply(img).shape == (2, 2, 3)
    np.testing.assert_array_equal(T.ToMode().apply(img)[1], img[:, :, 1])
    out = T.Normalize(mean=[1, 2], std=[2, 4]).apply(img)
    np.testing.assert_allclose(out[..., 0], (img[..., 0] - 1) / 2)
    np.testing.assert_allclose(out[..., 1], (img[..., 1] - 2) / 4)
    np.testing.assert_array_equal(T.RandomHorizontalFlip(1.0).apply(img), img[:, ::-1])
    np.testing.assert_array_equal(T.RandomHorizontalFlip(0.0).apply(img), img)
    crop = T.RandomCrop((2, 2), padding_size=1).apply(img)
    assert crop.shape == (2, 2, 2)
    # every crop is a window of the zero-padded image
    padded = np.pad(img, ((1, 1), (1, 1), (0, 0)))
    assert any((padded[y:y + 2, x:x + 2] == crop).all() for y in range(3) for x in range(4))
    big = T.Resize((4, 6)).apply(img)
    assert big.shape == (4, 6, 2) and big.dtype == np.float32
    near = T.Resize((4, 6), T.INTER_NEAREST).apply(img)
    np.testing.assert_array_equal(near, img.repeat(2, 0).repeat(2, 1))
    assert T.Resize(4).apply(img).shape == (4, 6, 2)            # the shorter side to 4
    # a sample with a label: the label passes through
    t = T.Compose([T.RandomHorizontalFlip(1.0), T.ToMode()], order=("image", "image_category"))
    out, label = t.apply((img, 7))
    assert label == 7 and out.shape == (2, 2, 3)


def test_resize_matches_opencv_geometry_against_torch(torch):
    """Bilinear with half-pixel centres is torch's interpolate(align_corners=False)."""
    rng = np.random.default_rng(0)
    img = rng.random((5, 7, 3)).astype(np.float32)
    ours = T.Resize((9, 4)).apply(img)
    ref = torch.nn.functional.interpolate(torch.tensor(img).permute(2, 0, 1)[None], size=(9, 4),
                                          mode="bilinear", align_corners=False)[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_transform_errors_are_clear():
    with pytest.raises(ValueError, match="std must not be 0"):
        T.Normalize(0, 0)
    with pytest.raises(ValueError, match="prob"):
        T.RandomHorizontalFlip(2)
    with pytest.raises(ValueError, match="interpolation"):
        T.Resize(4, interpolation="cubic")
    with pytest.raises(ValueError, match=r"\(H, W, C\)"):
        T.ToMode().apply(np.zeros(3))
    with pytest.raises(NotImplementedError, match="unsupported field kind"):
        T.ToMode(order=("image", "teapot"))


# ---------------------------------------------------------------- DataLoader, in this process

def test_loader_batches_in_the_samplers_order():
    ds = _xy(10)
    batches = list(DataLoader(ds, RandomSampler(ds, batch_size=4, seed=0)))
    order = sum(list(RandomSampler(ds, batch_size=4, seed=0)), [])
    assert [len(y) for _, y in batches] == [4, 4, 2]
    assert sum((y.tolist() for _, y in batches), []) == order
    x, y = batches[0]
    assert x.dtype == np.float32 and y.dtype == np.int32
    np.testing.assert_array_equal(x, ds.arrays[0][y])
    assert len(DataLoader(ds, RandomSampler(ds, batch_size=4))) == 3
    assert len(list(DataLoader(ds))) == 10       # default: one sample per batch


def test_loader_argument_errors():
    ds = _xy(4)
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(ds, num_workers=-1)
    with pytest.raises(ValueError, match="timeout"):
        DataLoader(ds, timeout=-1)
    with pytest.raises(TypeError, match="MapDataset"):
        DataLoader(42)
    with pytest.raises(ValueError, match="StreamSampler is for a StreamDataset"):
        DataLoader(ds, StreamSampler(2))
    with pytest.raises(TypeError, match="transform must have apply_batch"):
        DataLoader(ds, transform=lambda x: x)


class Counting(StreamDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield np.full(2, i, np.float32), i


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_dataset_batches_in_order(workers):
    loader = DataLoader(Counting(7), StreamSampler(batch_size=3), num_workers=workers, timeout=120)
    ys = [y.tolist() for _, y in loader]
    assert ys == [[0, 1, 2], [3, 4, 5], [6]]
    rank1 = DataLoader(Counting(7), StreamSampler(batch_size=2, world_size=2, rank=1))
    assert [y.tolist() for _, y in rank1] == [[1, 3], [5]]
    with pytest.raises(TypeError, match="no length"):
        len(loader)
    with pytest.raises(TypeError, match="cannot be rewound"):
        loader.state_dict()


# ---------------------------------------------------------------- DataLoader with worker processes

class Slow(MapDataset):
    """Sample i takes longer the smaller i is: later batches finish first."""

    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        time.sleep(0.02 * max(0, 4 - i))
        return np.full((3, 3), i, np.float32), np.int64(i), os.getpid()

    def __len__(self):
        return self.n


def test_workers_give_the_same_batches_in_order_through_shared_memory():
    ds = Slow(12)
    serial = list(DataLoader(ds, SequentialSampler(ds, batch_size=2)))
    loader = DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=3, timeout=120)
    parallel = list(loader)
    assert len(parallel) == len(serial) == 6
    for (xs, ys, _), (xp, yp, pids) in zip(serial, parallel):
        np.testing.assert_array_equal(xs, xp)
        np.testing.assert_array_equal(ys, yp)
        assert os.getpid() not in pids.tolist()             # loaded in another process
        # the arrays are views of a shared-memory mapping, not pickled copies
        assert xp.base is not None and not xp.flags.owndata
    workers = {int(p) for _, _, pids in parallel for p in pids}
    assert len(workers) == 3
    _assert_gone(workers)


@posix_only
def test_no_shared_memory_left_after_an_epoch_or_a_break():
    ds = _xy(40)
    before = _segments()
    batches = list(DataLoader(ds, SequentialSampler(ds, batch_size=4), num_workers=2, timeout=120))
    assert len(batches) == 10
    for _ in DataLoader(ds, SequentialSampler(ds, batch_size=4), num_workers=2, timeout=120):
        break                                               # batches in flight are dropped
    assert _segments() == before
    assert multiprocessing.active_children() == []


class Failing(MapDataset):
    def __init__(self, bad):
        self.bad = bad

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"sample {i} is corrupt")
        return np.float32(i), os.getpid()

    def __len__(self):
        return 10


def test_worker_exception_is_raised_with_the_workers_traceback():
    ds = Failing(bad=5)
    loader = DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2, timeout=120)
    seen, pids = [], set()
    with pytest.raises(ValueError) as info:
        for x, p in loader:
            seen.append(x.tolist())
            pids.update(p.tolist())
    msg = str(info.value)
    assert "Caught ValueError in DataLoader worker process" in msg and "batch 2" in msg
    assert isinstance(info.value, RuntimeError)        # as MegEngine's and PyTorch's loaders raise it
    assert "sample 5 is corrupt" in msg and "in __getitem__" in msg and "Traceback" in msg
    assert seen == [[0, 1], [2, 3]]                        # the batches before it came out in order
    _assert_gone(pids)


class WithKeyError(MapDataset):
    def __getitem__(self, i):
        raise KeyError("missing")

    def __init__(self):
        pass

    def __len__(self):
        return 2


def test_worker_keyerror_message_is_readable():
    with pytest.raises(KeyError) as info:
        next(iter(DataLoader(WithKeyError(), num_workers=1, timeout=120)))
    assert "\n" in str(info.value) and "Original traceback" in str(info.value)


def test_breaking_out_and_errors_in_the_loop_leave_no_process():
    ds = Slow(20)
    pids = set()
    for _, _, p in DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2, timeout=120):
        pids.update(p.tolist())
        break
    _assert_gone(pids)
    with pytest.raises(ZeroDivisionError):
        for _, _, p in DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2, timeout=120):
            pids.update(p.tolist())
            1 / 0
    _assert_gone(pids)
    # an iterator left half-way and dropped
    it = iter(DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2, timeout=120))
    _, _, p = next(it)
    pids.update(p.tolist())
    del it
    _assert_gone(pids)


class Hangs(MapDataset):
    def __init__(self, hang_at):
        self.hang_at = hang_at

    def __getitem__(self, i):
        if i == self.hang_at:
            time.sleep(3600)
        return np.float32(i), os.getpid()

    def __len__(self):
        return 8


def test_a_hung_worker_is_reported_after_timeout_and_stopped():
    ds = Hangs(hang_at=2)
    loader = DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2, timeout=3)
    pids = set()
    with pytest.raises(RuntimeError, match=r"DataLoader timeout: no batch from worker 1 .* in 3 s .*batch 1.*hung"):
        for _, p in loader:
            pids.update(p.tolist())
    assert multiprocessing.active_children() == []


class Dies(MapDataset):
    def __init__(self):
        pass

    def __getitem__(self, i):
        if i == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return np.float32(i)

    def __len__(self):
        return 6


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")
def test_a_worker_that_dies_is_reported():
    with pytest.raises(RuntimeError, match=r"DataLoader worker 1 \(pid \d+\) exited unexpectedly: it was killed by signal 9 .*batch 1"):
        list(DataLoader(Dies(), SequentialSampler(Dies(), batch_size=2), num_workers=2, timeout=120))
    assert multiprocessing.active_children() == []


def test_random_transforms_do_not_depend_on_the_number_of_workers():
    rng = np.random.default_rng(0)
    ds = ArrayDataset(rng.random((24, 6, 6, 1)).astype(np.float32), np.arange(24))
    t = T.Compose([T.RandomCrop(6, padding_size=2), T.RandomHorizontalFlip(), T.ToMode("CHW")],
                  order=("image", "image_category"))
    runs = []
    for workers in (0, 1, 3):
        loader = DataLoader(ds, RandomSampler(ds, batch_size=5, seed=1), transform=t, num_workers=workers,
                            seed=123, timeout=120)
        runs.append([list(loader), list(loader)])         # two epochs
    for other in runs[1:]:
        for epoch_a, epoch_b in zip(runs[0], other):
            for (xa, ya), (xb, yb) in zip(epoch_a, epoch_b):
                np.testing.assert_array_equal(xa, xb)
                np.testing.assert_array_equal(ya, yb)
    first, second = runs[0]
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(first, second))   # new crops each epoch
    assert first[0][0].shape == (5, 1, 6, 6)
    # the crops differ between samples: the random state is not reset per sample
    x = first[0][0]
    assert len({x[i].tobytes() for i in range(5)}) == 5


def test_rng_is_made_from_the_seed_when_first_asked():
    T.seed([7, 0, 3])
    a = T.rng().integers(1 << 30, size=4)
    b = T.rng().integers(1 << 30, size=4)                   # the same generator, not reseeded
    want = np.random.default_rng([7, 0, 3]).integers(1 << 30, size=8)
    assert a.tolist() + b.tolist() == want.tolist()
    T.seed(None)                                            # fresh entropy, as default_rng(None)
    assert T.rng().integers(1 << 30, size=4).tolist() != want[:4].tolist()


class GlobalDraws(T.Transform):
    """A transform written for MegEngine: draws from NumPy's and Python's
    global generators."""

    def apply(self, input):
        return input

    def apply_batch(self, inputs):
        import random
        return [(np.float64(np.random.random()), np.float64(random.random())) for _ in inputs]


def test_workers_seed_the_global_generators_per_batch():
    ds = ArrayDataset(np.zeros((12, 1), np.float32))
    draws = []
    for workers in (1, 3):
        loader = DataLoader(ds, SequentialSampler(ds, batch_size=3), transform=GlobalDraws(),
                            collator=_ListCollator(), num_workers=workers, seed=5, timeout=120)
        draws.append([b for b in loader])
    assert draws[0] == draws[1]                              # by (seed, epoch, batch), not by worker
    values = [v for batch in draws[0] for v in batch]
    assert len(set(values)) == len(values)                   # batches and samples differ


class _ListCollator(Collator):
    def apply(self, inputs):
        return [tuple(float(v) for v in sample) for sample in inputs]


def test_spawned_workers_work_with_picklable_datasets():
    ds = _xy(6)
    loader = DataLoader(ds, SequentialSampler(ds, batch_size=4), num_workers=1, timeout=300,
                        multiprocessing_context="spawn")
    ys = [y.tolist() for _, y in loader]
    assert ys == [[0, 1, 2, 3], [4, 5]]


# ---------------------------------------------------------------- resuming a loader

@pytest.mark.parametrize("workers", [0, 2])
def test_loader_resumes_mid_epoch_with_the_same_batches(workers):
    rng = np.random.default_rng(1)
    ds = ArrayDataset(rng.random((30, 4, 4, 1)).astype(np.float32), np.arange(30))
    t = T.Compose([T.RandomHorizontalFlip(), T.ToMode()], order=("image", "image_category"))

    def make(seed):
        return DataLoader(ds, RandomSampler(ds, batch_size=4, seed=seed), transform=t, num_workers=workers,
                          seed=seed, timeout=120)

    whole = make(0)
    reference = [list(whole) for _ in range(3)]

    loader = make(0)
    list(loader)                                # epoch 0
    it = iter(loader)
    head = [next(it) for _ in range(3)]         # part of epoch 1
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["consumed"] == 3
    buf = __import__("io").BytesIO()
    gc.save(state, buf)                         # a plain structure that gradcore.save keeps
    buf.seek(0)
    del it
    resumed = make(77)                          # other seeds: the state overrides them
    resumed.load_state_dict(gc.load(buf))
    rest, epoch2 = list(resumed), list(resumed)
    for (xa, ya), (xb, yb) in zip(reference[1], head + rest):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert len(head + rest) == len(reference[1])
    for (xa, ya), (xb, yb) in zip(reference[2], epoch2):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    # between epochs: the next epoch's number and the sampler's state now
    assert resumed.state_dict()["epoch"] == 3 and resumed.state_dict()["consumed"] == 0
    with pytest.raises(KeyError, match="consumed"):
        resumed.load_state_dict({"seed": 0, "epoch": 0, "sampler": {}})


def test_persistent_workers_serve_several_epochs_and_stop_with_the_loop_or_the_loader():
    import gc as pygc
    ds = Slow(8)
    make = lambda persistent: DataLoader(ds, RandomSampler(ds, batch_size=2, seed=3), num_workers=2, timeout=120,  # noqa: E731
                                         persistent_workers=persistent, seed=1)
    loader, fresh = make(True), make(False)
    epochs = [list(loader) for _ in range(3)]
    pids = [{int(p) for _, _, ps in e for p in ps} for e in epochs]
    assert pids[0] == pids[1] == pids[2] and len(pids[0]) == 2       # the same two processes
    assert len(multiprocessing.active_children()) == 2
    for e_persistent, e_fresh in zip(epochs, [list(fresh) for _ in range(3)]):
        for (xa, ya, _), (xb, yb, _) in zip(e_persistent, e_fresh):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
    for _ in loader:
        break                                                   # a loop left early stops them
    _assert_gone(pids[0])
    list(loader)                                                # new ones for the next epoch
    assert len(multiprocessing.active_children()) == 2
    del loader
    pygc.collect()
    assert multiprocessing.active_children() == []


# ---------------------------------------------------------------- shared-memory slots

def test_slots_are_reused_only_when_their_batches_are_gone():
    # batches kept by the loop must never be overwritten by later ones, and
    # slots whose batches were dropped must be written again (not new ones)
    ds = ArrayDataset(np.arange(80, dtype=np.float32).reshape(40, 2), np.arange(40, dtype=np.int64))
    loader = DataLoader(ds, RandomSampler(ds, batch_size=2, seed=3), num_workers=2, timeout=120,
                        persistent_workers=True, seed=1)
    serial = DataLoader(ds, RandomSampler(ds, batch_size=2, seed=3), seed=1)
    kept, expected = [], []
    for _ in range(3):
        for k, ((x, y), (xs, ys)) in enumerate(zip(loader, serial)):
            np.testing.assert_array_equal(x, xs)
            if k % 3 == 0:
                kept.append((x, y))
                expected.append((xs.copy(), ys.copy()))
    for (x, y), (xs, ys) in zip(kept, expected):
        np.testing.assert_array_equal(x, xs)                # not overwritten by any later batch
        np.testing.assert_array_equal(y, ys)
    pool = loader._pool
    slots = sum(len(r.maps) for r in pool.slots)
    in_use = sum(len(r.in_use()) for r in pool.slots)
    assert in_use == len(kept) == 21                        # the kept batches hold their slots
    # 60 batches went through: the slots of dropped ones were written again
    assert slots <= len(kept) + 2 * (loader.prefetch_factor + 3)
    del kept, x, y
    import gc as pygc
    pygc.collect()
    assert sum(len(r.in_use()) for r in pool.slots) == 0


def test_a_batch_costs_a_small_message():
    # the arrays go through shared memory; the pipe carries a slot number
    # (and the arrays' layout only when it changes)
    ds = _xy(40)
    loader = DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2, timeout=120,
                        persistent_workers=True)
    list(loader)
    pool = loader._pool
    first = pool.received_bytes
    for x, y in loader:
        assert not x.flags.owndata
    steady = (pool.received_bytes - first) / 20
    assert pool.received == 40 and steady < 64, steady


class Growing(MapDataset):
    """Sample i is 24 KB * (i + 1) of the value i, with a name."""

    def __init__(self):
        pass

    def __getitem__(self, i):
        return np.full(3000 * (i + 1), i, np.float64), f"sample {i}"

    def __len__(self):
        return 10


@posix_only
def test_batches_that_grow_get_larger_slots():
    before = _segments()
    batches = list(DataLoader(Growing(), SequentialSampler(Growing(), batch_size=1), num_workers=2, timeout=120))
    for i, (x, names) in enumerate(batches):
        assert x.shape == (1, 3000 * (i + 1)) and (x == i).all() and names == [f"sample {i}"]
    assert _segments() == before


@posix_only
def test_slot_writer_and_reader_reuse_grow_and_never_hand_out_a_buffer_in_use():
    from gradcore.data import _shm
    prefix = f"/gcdl{os.getpid()}_unit_"
    before = _segments()
    writer, reader = _shm.SlotWriter(), _shm.SlotReader()

    def send(batch, n):
        message = writer.write(batch, f"{prefix}{n}")
        return message, reader.read(message)

    m0, a = send([np.full(4, 1.0)], 0)
    m1, b = send([np.full(4, 2.0)], 1)
    assert (m0[0], m1[0]) == (0, 1) and m0[1] is not None     # two new slots: neither was free
    assert m1[3] is None                                     # same layout: not sent again
    del a
    freed = reader.take_freed()
    assert freed == [0] and reader.take_freed() == []
    writer.release(freed)
    m2, c = send([np.full(4, 3.0)], 2)
    assert m2[0] == 0 and m2[1] is None                     # slot 0 written again, no new segment
    assert b[0].tolist() == [2.0] * 4 and c[0].tolist() == [3.0] * 4
    view = c[0][1:]                                           # a view of a view holds the slot too
    del c
    assert reader.take_freed() == [] and reader.in_use() == [0, 1]
    del view
    writer.release(reader.take_freed())
    big = np.arange(40000, dtype=np.float64)                 # 320 KB: slot 0 (64 KB) is too small
    m3, d = send([big], 3)
    assert m3[0] == 0 and m3[1] == f"{prefix}3" and m3[2] >= big.nbytes and m3[3] is not None
    np.testing.assert_array_equal(d[0], big)
    assert b[0].tolist() == [2.0] * 4                        # slot 1 untouched
    del b, d
    assert sorted(reader.take_freed()) == [0, 1]
    assert _segments() == before                              # names unlinked once mapped


def test_workers_started_per_epoch_leave_after_their_last_batch():
    # once the sampler is exhausted the workers are told to leave: they exit
    # by themselves, and what they sent before is still read, in order
    ds = _xy(6)
    loader = DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2, timeout=120)
    it = iter(loader)                       # 3 batches: all sent at once, then the stop
    procs = list(it._workers.procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0              # left on its own, not stopped
    assert [y.tolist() for _, y in it] == [[0, 1], [2, 3], [4, 5]]
    assert multiprocessing.active_children() == []


class BlasThreads(MapDataset):
    def __init__(self):
        pass

    def __getitem__(self, i):
        from gradcore.cpu import blas
        return np.int64(blas.num_threads())

    def __len__(self):
        return 4


def test_workers_run_numpys_blas_on_one_thread():
    from gradcore.cpu import blas
    if blas.num_threads() is None:
        pytest.skip("NumPy's BLAS is not OpenBLAS: its thread count cannot be read")
    counts = np.concatenate(list(DataLoader(BlasThreads(), SequentialSampler(BlasThreads(), batch_size=2),
                                            num_workers=2, timeout=120)))
    assert counts.tolist() == [1, 1, 1, 1]
    assert blas.num_threads() >= 1                          # the parent's count is its own


class ThreadsAfterProduct(MapDataset):
    """A sample: the threads of the process loading it, after a product
    large enough that OpenBLAS would split it over a pool."""

    def __init__(self):
        pass

    def __getitem__(self, i):
        a = np.ones((256, 256))
        _ = a @ a
        return np.int64(len(os.listdir("/proc/self/task")))

    def __len__(self):
        return 4


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc to count a process's threads")
def test_forked_workers_do_not_restart_openblas_threads():
    # OpenBLAS stops its threads at a fork and starts them again to change
    # the count; a new thread spins ~0.1 s: 90 ms of CPU per worker per epoch
    from gradcore.cpu import blas
    if blas._lookup() is None:
        pytest.skip(f"not OpenBLAS here: {blas.status()}")
    before = blas.num_threads()
    blas._lookup()[2](2)            # a parent with a pool of 2
    try:
        _ = np.ones((256, 256)) @ np.ones((256, 256))
        ds = ThreadsAfterProduct()
        threads = np.concatenate(list(DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2,
                                                 timeout=120, multiprocessing_context="fork")))
    finally:
        blas._lookup()[2](before)
    assert threads.tolist() == [1, 1, 1, 1]


def test_preload_gives_tensors_and_a_blocking_stream_times_out():
    """MegEngine's ``preload``: the batches' arrays as Tensors; a stream
    that blocks is reported after ``timeout`` (read in a thread), with or
    without workers."""
    import gradcore as gc
    from gradcore.data import StreamDataset, StreamSampler
    ds = ArrayDataset(np.arange(10, dtype=np.float32).reshape(5, 2), np.arange(5))
    batches = list(DataLoader(ds, SequentialSampler(ds, batch_size=2), preload=True))
    assert len(batches) == 3 and all(isinstance(t, gc.Tensor) for b in batches for t in b)
    assert batches[2][0].numpy().tolist() == [[8.0, 9.0]]

    class Blocking(StreamDataset):
        def __init__(self):
            pass

        def __iter__(self):
            yield (np.zeros(2, np.float32), 0)
            time.sleep(3)
            yield (np.zeros(2, np.float32), 1)
            yield (np.zeros(2, np.float32), 2)

    for workers in (0, 2):
        loader = DataLoader(Blocking(), StreamSampler(batch_size=2), num_workers=workers, timeout=1)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="DataLoader timeout: the stream dataset gave no sample in 1 s"):
            next(iter(loader))
        assert time.monotonic() - start < 10
    # the reading threads end once the stream gives them a sample (nothing reads it any more)
    import threading
    for t in [t for t in threading.enumerate() if t.name == "gradcore-dataloader-stream"]:
        t.join(10)
        assert not t.is_alive()


class _Sharded(StreamDataset):
    """A stream that shards itself by the worker reading it (MegEngine's
    parallel_stream idiom): 0..n-1, each value once over all workers."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        from gradcore.data import get_worker_info
        info = get_worker_info()
        start, step = (info.idx, info.worker) if info is not None else (0, 1)
        for v in range(start, self.n, step):
            yield (np.full(2, v, np.float32), v)


def test_parallel_stream_workers_read_their_own_shards():
    from gradcore.data import StreamSampler, get_worker_info
    assert get_worker_info() is None                  # not in a worker
    for persistent in (False, True):
        loader = DataLoader(_Sharded(20), StreamSampler(batch_size=3), num_workers=2, parallel_stream=True,
                            timeout=60, persistent_workers=persistent)
        for _ in range(2):                             # each epoch from the stream's start
            seen = [int(v) for _, labels in loader for v in labels]
            # batches alternate between the workers until one's shard ends
            assert seen[:6] == [0, 2, 4, 1, 3, 5] and len(seen) == len(set(seen))
            assert set(seen) <= set(range(20)) and len(seen) >= 18


def test_stream_sampler_counts_positions_and_a_batch_larger_than_the_data_is_refused():
    """MegEngine's StreamSampler counts the stream's positions ([0, 1, 2],
    [3, 4, 5], ...); its map samplers refuse fewer samples per rank than a
    batch."""
    it = iter(StreamSampler(batch_size=3))
    assert [next(it) for _ in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    it = iter(StreamSampler(batch_size=2, world_size=2, rank=1))
    assert [next(it), next(it)] == [[1, 3], [5, 7]]
    with pytest.raises(ValueError, match="num_samples should be greater than batch_size"):
        SequentialSampler(ArrayDataset(np.arange(5)), batch_size=6)
    with pytest.raises(ValueError, match=r"num_samples=3 \(per rank\) and batch_size=4"):
        RandomSampler(ArrayDataset(np.arange(5)), batch_size=4, world_size=2, rank=0)
