"""No host round-trips in a training step (issue 14, item 2): after warm-up,
forward, backward and the optimizer step on cuda make no host-to-device and
no device-to-host copy unless the user reads a value. Counted by the
backend (``gradcore.cuda.memory_stats()``), on every driver under test."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore as gc
import gradcore.cuda as gcuda
import gradcore.functional as F
from gradcore.autodiff import GradManager
from gradcore.demo import DigitsCNN


def copies():
    s = gcuda.memory_stats()
    return s["htod"], s["dtoh"]


def mlp_step(rng, optimizer):
    sizes = [20, 16, 16, 5]
    ws = [gc.Parameter(rng.normal(0, 0.3, (i, o)).astype(np.float32), device="cuda")
          for i, o in zip(sizes, sizes[1:])]
    bs = [gc.Parameter(np.zeros(o, np.float32), device="cuda") for o in sizes[1:]]
    x = gc.Tensor(rng.standard_normal((8, 20)).astype(np.float32), device="cuda")
    y = gc.Tensor(rng.integers(0, 5, 8).astype(np.int32), device="cuda")
    gm = GradManager().attach(ws + bs)
    opt = optimizer(ws + bs)

    def step():
        with gm:
            h = x
            for i, (w, b) in enumerate(zip(ws, bs)):
                h = F.matmul(h, w) + b
                if i < len(ws) - 1:
                    h = F.relu(h)
            loss = F.cross_entropy(h, y)
            gm.backward(loss)
        opt.step().clear_grad()
        return loss
    return step


OPTIMIZERS = {"sgd-momentum": lambda ps: gc.optimizer.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4),
              "adam": lambda ps: gc.optimizer.Adam(ps, lr=1e-3)}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_mlp_steps_make_no_host_copies(cuda, optimizer):
    step = mlp_step(np.random.default_rng(0), OPTIMIZERS[optimizer])
    for _ in range(2):                   # warm-up: kernels, seeds, scalar constants
        step()
    before = copies()
    for _ in range(3):
        loss = step()
    assert copies() == before, f"copies (htod, dtoh) {before} -> {copies()}"
    loss.item()                          # the user reads a value: one copy back
    assert copies() == (before[0], before[1] + 1)


def test_the_demo_cnn_steps_make_no_host_copies(cuda):
    gc.random.seed(0)
    rng = np.random.default_rng(0)
    model = DigitsCNN().to("cuda")
    gm = GradManager().attach(model.parameters())
    opt = gc.optimizer.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = gc.Tensor(rng.uniform(0, 1, (4, 1, 8, 8)).astype(np.float32), device="cuda")
    y = gc.Tensor(rng.integers(0, 10, 4).astype(np.int32), device="cuda")

    def step():
        with gm:
            gm.backward(F.cross_entropy(model(x), y))
        opt.step().clear_grad()
    step()
    step()
    before = copies()
    step()
    assert copies() == before, f"copies (htod, dtoh) {before} -> {copies()}"


def test_a_new_batch_costs_its_upload_only(cuda):
    """The demo's loop uploads each batch (the user's data); its labels'
    range check then needs no copy back."""
    step_rng = np.random.default_rng(1)
    w = gc.Parameter(step_rng.normal(0, 0.3, (6, 3)).astype(np.float32), device="cuda")
    gm = GradManager().attach([w])
    opt = gc.optimizer.SGD([w], lr=0.1)

    def step():
        x = gc.tensor(step_rng.standard_normal((5, 6)).astype(np.float32), device="cuda")
        y = gc.tensor(step_rng.integers(0, 3, 5).astype(np.int32), device="cuda")
        with gm:
            gm.backward(F.cross_entropy(F.matmul(x, w), y))
        opt.step().clear_grad()
    step()
    before = copies()
    step()
    assert copies() == (before[0] + 2, before[1])


def test_labels_written_in_place_are_checked_again(cuda):
    logits = gc.Tensor(np.zeros((3, 4), np.float32), device="cuda")
    y = gc.Tensor(np.array([0, 1, 3], np.int32), device="cuda")
    F.cross_entropy(logits, y)
    before = copies()
    F.cross_entropy(logits, y)
    assert copies() == before            # the range is known
    y._data += 7                         # written on the device: the range must be read again
    with pytest.raises(IndexError, match="out of range"):
        F.cross_entropy(logits, y)
    assert copies()[1] == before[1] + 1


@pytest.mark.pool_statistics
def test_memory_stats_reports_the_allocator_and_copies(cuda):
    s0 = gcuda.memory_stats()
    for key in ("in_use_bytes", "cached_bytes", "peak_bytes", "driver_allocs", "driver_frees", "reuses",
                "htod", "dtoh", "htod_bytes", "dtoh_bytes", "dtod", "memset", "launches"):
        assert key in s0, key
    a = gc.Tensor(np.ones(1000, np.float32), device="cuda")
    s1 = gcuda.memory_stats()
    assert s1["htod"] == s0["htod"] + 1 and s1["htod_bytes"] == s0["htod_bytes"] + 4000
    assert s1["in_use_bytes"] >= s0["in_use_bytes"] + 4000 and s1["peak_bytes"] >= s1["in_use_bytes"]
    a.numpy()
    assert gcuda.memory_stats()["dtoh"] == s1["dtoh"] + 1
    del a
    assert gcuda.memory_stats()["cached_bytes"] >= 4000
    freed = gcuda.empty_cache()
    s2 = gcuda.memory_stats()
    assert freed >= 4000 and s2["cached_bytes"] == 0 and s2["driver_frees"] > s1["driver_frees"]


def test_filled_tensors_are_made_on_the_device(cuda):
    """zeros/ones/full and the *_like forms on cuda are a memset or a fill
    kernel: no host array is uploaded (they appear inside training steps,
    e.g. the zero gradient of a multi-output op's unused output)."""
    x = gc.Tensor(np.ones((3, 4), np.float32), device="cuda")
    makers = [lambda: F.zeros((3, 4), device="cuda"), lambda: F.ones((2,), dtype="int32", device="cuda"),
              lambda: F.full((2, 2), 7.5, device="cuda"), lambda: F.zeros_like(x), lambda: F.ones_like(x),
              lambda: F.full_like(x, -2)]
    for make in makers:                  # warm-up: the fill kernel is compiled once
        make()
    before = copies()
    made = [make() for make in makers]
    assert copies() == before, f"copies (htod, dtoh) {before} -> {copies()}"
    expected = [np.zeros((3, 4)), np.ones(2), np.full((2, 2), 7.5), np.zeros((3, 4)), np.ones((3, 4)),
                np.full((3, 4), -2)]
    for t, want in zip(made, expected):
        assert t.device == "cuda"
        np.testing.assert_array_equal(t.numpy(), want)
    assert made[1].dtype == np.int32 and made[2].dtype == np.float32


def test_multi_output_op_backward_makes_no_host_copies(cuda):
    """A backward where some outputs of a multi-output op got no gradient
    (batch norm in training: its mean and inverse std) fills their zeros on
    the device."""
    gc.random.seed(0)
    net = gc.module.Sequential(gc.module.Conv2d(1, 4, 3, padding=1), gc.module.BatchNorm2d(4),
                               gc.module.ReLU()).to("cuda")
    gm = GradManager().attach(net.parameters())
    x = gc.Tensor(np.random.default_rng(0).standard_normal((2, 1, 5, 5)).astype(np.float32), device="cuda")

    def step():
        with gm:
            gm.backward(F.sum(net(x)))
    for _ in range(2):
        step()
    before = copies()
    for _ in range(2):
        step()
    assert copies() == before, f"copies (htod, dtoh) {before} -> {copies()}"
