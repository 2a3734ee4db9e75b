"""A whole training step as one CUDA graph (issue 16): ``gradcore.cuda.graphed``.

On the host emulator a capture records the launch sequence (kernels with
their packed parameter buffers, device copies, memsets, GEMMs) and a replay
runs it, so the whole mechanism is tested here: warm-up, capture, input
copy-in, buffer reuse, recapture on new shapes, errors on host syncs, and
N replayed steps equal to N eager steps bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore as gc
import gradcore.cuda as gcuda
import gradcore.functional as F
import gradcore.module as M
from gradcore.autodiff import GradManager
from gradcore.cuda import graphs
from gradcore.demo import DigitsCNN


@pytest.fixture
def gpu(cuda):
    """Each test runs on the emulator (its own graph recorder), the fake GPU
    (PyCudaDriver's stream capture on fake_pycuda's FakeGraphApi) and a real GPU."""
    return cuda


SIZES = [20, 16, 16, 5]
OPTIMIZERS = {"sgd-momentum": lambda ps: gc.optimizer.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4),
              "sgd-nesterov": lambda ps: gc.optimizer.SGD(ps, lr=0.05, momentum=0.8, nesterov=True),
              "adam": lambda ps: gc.optimizer.Adam(ps, lr=1e-2, weight_decay=1e-3),
              "adamw": lambda ps: gc.optimizer.AdamW(ps, lr=1e-2)}


class MLP:
    """An MLP, its GradManager and optimizer, and its training step."""

    def __init__(self, optimizer, seed=0):
        rng = np.random.default_rng(seed)
        self.ws = [gc.Parameter(rng.normal(0, 0.3, (i, o)).astype(np.float32), device="cuda")
                   for i, o in zip(SIZES, SIZES[1:])]
        self.bs = [gc.Parameter(np.zeros(o, np.float32), device="cuda") for o in SIZES[1:]]
        self.params = self.ws + self.bs
        self.gm = GradManager().attach(self.params)
        self.opt = optimizer(self.params)

    def step(self, x, y):
        with self.gm:
            h = x
            for i, (w, b) in enumerate(zip(self.ws, self.bs)):
                h = F.matmul(h, w) + b
                if i < len(self.ws) - 1:
                    h = F.relu(h)
            loss = F.cross_entropy(h, y)
            self.gm.backward(loss)
        self.opt.step().clear_grad()
        return loss


def batches(n, batch=8, seed=1, features=SIZES[0], classes=SIZES[-1]):
    rng = np.random.default_rng(seed)
    return [(gc.Tensor(rng.standard_normal((batch, features)).astype(np.float32), device="cuda"),
             gc.Tensor(rng.integers(0, classes, batch).astype(np.int32), device="cuda")) for _ in range(n)]


def assert_same_state(a: MLP, b: MLP):
    for p, q in zip(a.params, b.params):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    for p, q in zip(a.params, b.params):
        sa, sb = a.opt._state[p], b.opt._state[q]
        assert sorted(sa) == sorted(sb)
        for k in sa:
            if np.isscalar(sa[k]):
                assert sa[k] == sb[k], k
            else:
                np.testing.assert_array_equal(sa[k].numpy(), sb[k].numpy(), err_msg=k)


def side_by_side(optimizer, data, change=lambda i, net: None, warmup=1, **options):
    """An eager and a graphed MLP through the same batches, ``change(i, net)``
    applied to both before step i: the same losses, parameters and optimizer
    state. The graphed step, for its counts."""
    eager, graphed = MLP(OPTIMIZERS[optimizer]), MLP(OPTIMIZERS[optimizer])
    step = gcuda.graphed(graphed.step, warmup=warmup, **options)
    for i, (x, y) in enumerate(data):
        for net in (eager, graphed):
            change(i, net)
        np.testing.assert_array_equal(step(x, y).numpy(), eager.step(x, y).numpy())
    assert_same_state(eager, graphed)
    return step


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_replayed_steps_equal_eager_steps_exactly(gpu, optimizer):
    step = side_by_side(optimizer, batches(7), warmup=2)
    assert (step.eager_calls, step.captures, step.replays) == (2, 1, 4)


def module_training(make_module, lr):
    """A module (seeded) on cuda and its training step with SGD momentum."""
    gc.random.seed(0)
    net = make_module().to("cuda")
    gm = GradManager().attach(net.parameters())
    opt = gc.optimizer.SGD(net.parameters(), lr=lr, momentum=0.9)

    def step(x, y):
        with gm:
            loss = F.cross_entropy(net(x), y)
            gm.backward(loss)
        opt.step().clear_grad()
        return loss
    return net, step


def test_the_demo_cnn_replayed_equals_eager(gpu):
    (m1, eager), (m2, step) = module_training(DigitsCNN, 0.05), module_training(DigitsCNN, 0.05)
    step = gcuda.graphed(step, warmup=1)
    rng = np.random.default_rng(0)
    for _ in range(4):
        x = gc.Tensor(rng.uniform(0, 1, (4, 1, 8, 8)).astype(np.float32), device="cuda")
        y = gc.Tensor(rng.integers(0, 10, 4).astype(np.int32), device="cuda")
        np.testing.assert_array_equal(step(x, y).numpy(), eager(x, y).numpy())
    assert (step.captures, step.replays) == (1, 2)
    for p, q in zip(m1.parameters(), m2.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_a_replay_is_one_graph_launch_and_no_host_copy(gpu):
    net = MLP(OPTIMIZERS["sgd-momentum"])
    step = gcuda.graphed(net.step, warmup=1)
    data = batches(5)
    step(*data[0])
    s0 = gcuda.memory_stats()
    step(*data[1])                                  # the capture
    s1 = gcuda.memory_stats()
    graph = next(iter(step.graphs.values()))
    captured = s1["launches"] - s0["launches"]      # launches made while capturing (recorded, not run) + scalar fills
    if graph.kernels is not None:
        assert graph.kernels + len(graph.scalars) == captured
    assert graph.kernels is None or graph.kernels > 20
    for x, y in data[2:]:
        before = gcuda.memory_stats()
        step(x, y)
        after = gcuda.memory_stats()
        assert after["graph_launches"] == before["graph_launches"] + 1
        assert after["launches"] == before["launches"], "SGD with a fixed lr: no kernel launched outside the graph"
        assert (after["htod"], after["dtoh"]) == (before["htod"], before["dtoh"])
        # copy-in of x and y, copy-out of the loss
        assert after["dtod"] == before["dtod"] + 3
        assert after["driver_allocs"] == before["driver_allocs"]


def captured(optimizer):
    """An MLP, its graphed step (already warmed up and captured), the graph, more batches."""
    net = MLP(OPTIMIZERS[optimizer])
    step = gcuda.graphed(net.step, warmup=1)
    data = batches(5)
    step(*data[0])
    step(*data[1])
    return net, step, next(iter(step.graphs.values())), data[2:]


def test_adam_refreshes_its_bias_corrections_with_two_fills_per_replay(gpu):
    net, step, graph, data = captured("adam")
    before = gcuda.memory_stats()
    step(*data[0])
    after = gcuda.memory_stats()
    assert after["launches"] - before["launches"] == 2            # 1 - beta1**t, 1 - beta2**t: one per group
    assert after["graph_launches"] - before["graph_launches"] == 1
    assert all(net.opt._state[p]["step"] == 3 for p in net.params)
    # shared per group: lr, eps, betas, ... one device scalar each, not one per parameter
    assert len(graph.scalars) < 2 * len(net.params)


def test_input_buffers_are_reused_and_the_new_inputs_copied_in(gpu):
    net, step, graph, data = captured("sgd-momentum")
    ptrs = [b.ptr for b in graph.inputs]
    assert graph.pool.reuses > 0, "the graph's private pool reuses blocks freed during the capture"
    for x, y in data:
        step(x, y)
        assert [b.ptr for b in graph.inputs] == ptrs
        np.testing.assert_array_equal(graph.inputs[0].get(), x.numpy())
        np.testing.assert_array_equal(graph.inputs[1].get(), y.numpy())


def test_the_parameters_updated_are_the_users_tensors(gpu):
    net = MLP(OPTIMIZERS["adam"])
    ids = [id(p) for p in net.params]
    ptrs = [p._data.ptr for p in net.params]
    first = [p.numpy() for p in net.params]
    step = gcuda.graphed(net.step, warmup=1)
    for x, y in batches(5):
        step(x, y)
    assert [id(p) for p in net.params] == ids
    assert [p._data.ptr for p in net.params] == ptrs
    assert all(not np.array_equal(p.numpy(), f) for p, f in zip(net.params, first))


class BNNet(M.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = M.Linear(20, 16), M.BatchNorm1d(16), M.Linear(16, 5)

    def forward(self, x):
        return self.fc2(F.relu(self.bn(self.fc1(x))))


def test_batch_norms_running_statistics_accumulate_over_replays(gpu):
    """Batch norm gives its running statistics new memory every step: the
    capture writes the new values back into the old arrays, so replays
    update the module's own tensors, as eager steps do."""
    (eager_net, eager), (net, step) = module_training(BNNet, 0.1), module_training(BNNet, 0.1)
    step = gcuda.graphed(step, warmup=1)
    stats = None
    for i, (x, y) in enumerate(batches(6)):
        np.testing.assert_array_equal(step(x, y).numpy(), eager(x, y).numpy())
        if i == 1:                      # captured: the tensor keeps its object and memory from now on
            stats = [id(net.bn.running_mean), net.bn.running_mean._data.ptr]
        elif i > 1:
            assert [id(net.bn.running_mean), net.bn.running_mean._data.ptr] == stats
    assert (step.captures, step.replays) == (1, 4)
    for a, b in zip(eager_net.tensors(), net.tensors()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_parameters_given_new_memory_between_calls_recapture(gpu):
    def reload(i, net):                 # what Module.load_state_dict does: new memory for the same Parameter
        if i == 4:
            net.ws[0]._reset(gc.Tensor(np.full(net.ws[0].shape, 0.01, np.float32), device="cuda"))
    assert side_by_side("adam", batches(6), reload).captures == 2


def test_loading_the_optimizers_state_recaptures(gpu):
    saved = {}

    def reload(i, net):                 # new momentum buffers
        if i == 3:
            saved.setdefault("state", net.opt.state_dict())
            net.opt.load_state_dict(saved["state"])
    assert side_by_side("sgd-momentum", batches(6), reload).captures == 2


def test_a_learning_rate_change_needs_no_recapture(gpu):
    def schedule(i, net):
        net.opt.param_groups[0]["lr"] = 0.1 / (1 + i)
    assert side_by_side("sgd-momentum", batches(6), schedule).captures == 1


def test_new_input_shapes_capture_a_new_graph(gpu):
    data = batches(3, batch=8) + batches(3, batch=5, seed=2) + batches(2, batch=8, seed=3)
    step = side_by_side("adam", data)
    assert step.captures == 2 and len(step.graphs) == 2


def test_at_most_max_graphs_are_kept(gpu):
    # the 4th signature is the 1st again, evicted by the 3rd
    data = [b for seed, n in enumerate((8, 5, 3, 8)) for b in batches(3, batch=n, seed=seed)]
    step = side_by_side("sgd-momentum", data, max_graphs=2)
    assert len(step.graphs) == 2 and step.captures == 4


def test_new_input_shapes_raise_when_recapture_is_off(gpu):
    net = MLP(OPTIMIZERS["sgd-momentum"])
    step = gcuda.graphed(net.step, warmup=1, recapture=False)
    for x, y in batches(2):
        step(x, y)
    x, y = batches(1, batch=5)[0]
    with pytest.raises(gcuda.GraphCaptureError, match=r"\(5, 20\) float32.*\(8, 20\) float32.*recapture=False"):
        step(x, y)
    x64 = gc.Tensor(np.zeros((8, 20)), device="cuda")
    with pytest.raises(gcuda.GraphCaptureError, match="float64"):
        step(x64, batches(1)[0][1])


def test_reading_a_value_inside_the_capture_raises_and_names_it(gpu):
    net = MLP(OPTIMIZERS["sgd-momentum"])

    def step(x, y):
        loss = net.step(x, y)
        return loss * float(loss.item())
    g = gcuda.graphed(step, warmup=0)
    x, y = batches(1)[0]
    with pytest.raises(gcuda.GraphCaptureError, match="device-to-host copy.*during CUDA-graph capture"):
        g(x, y)
    be = gcuda.backend()
    assert be.capture is None and graphs.capturing() is None and be.pool.redirect is None
    net.step(x, y).numpy()          # eager work goes on after a failed capture


def test_a_host_upload_inside_the_capture_raises(gpu):
    net = MLP(OPTIMIZERS["sgd-momentum"])

    def step(x):
        y = gc.Tensor(np.zeros(8, np.int32), device="cuda")     # made on the host each call
        return net.step(x, y)
    g = gcuda.graphed(step, warmup=0)
    with pytest.raises(gcuda.GraphCaptureError, match="host-to-device copy"):
        g(batches(1)[0][0])


def test_a_range_check_inside_the_capture_names_its_op(gpu):
    logits = gc.Tensor(np.zeros((4, 3), np.float32), device="cuda")

    def step(y):
        return F.cross_entropy(logits, y + 0)     # labels computed on the device: their range is unknown
    g = gcuda.graphed(step, warmup=0)
    with pytest.raises(gcuda.GraphCaptureError, match=r"^CrossEntropy\(.*device-to-host copy.*CUDA-graph capture"):
        g(gc.Tensor(np.array([0, 1, 2, 1], np.int32), device="cuda"))


def test_an_optimizer_that_cannot_be_captured_says_so(gpu):
    net = MLP(lambda ps: gc.optimizer.Adagrad(ps, lr=0.1))
    g = gcuda.graphed(net.step, warmup=1)
    x, y = batches(1)[0]
    g(x, y)
    with pytest.raises(gcuda.GraphCaptureError, match="Adagrad.step cannot be captured"):
        g(x, y)


def test_a_state_created_in_the_capture_recaptures_the_next_step(gpu):
    """No warm-up: SGD's momentum buffer is created by the captured step (a
    copy of the gradient); replaying that would reset it every step, so the
    next call captures again, now with the buffer updated in place."""
    step = side_by_side("sgd-momentum", batches(5), warmup=0)
    assert (step.captures, step.replays) == (2, 3)


def test_outputs_are_copies_unless_static(gpu):
    net = MLP(OPTIMIZERS["sgd-momentum"])
    data = batches(4)
    step = gcuda.graphed(net.step, warmup=0)
    losses = [step(x, y) for x, y in data[:3]]
    assert len({loss._data.ptr for loss in losses}) == 3
    static_net = MLP(OPTIMIZERS["sgd-momentum"])
    static = gcuda.graphed(static_net.step, warmup=1, static_outputs=True)
    static(*data[0])
    a = static(*data[1])
    value = a.numpy()
    b = static(*data[2])
    assert a._data.ptr == b._data.ptr and not np.array_equal(a.numpy(), value)


def test_the_capture_primitive_records_and_replays(gpu):
    be = gcuda.backend()
    x = be.to_device(np.arange(6, dtype=np.float32))
    with graphs.capture(be) as cap:
        y = x * 2 + 1
    graph = cap.graph
    graph.launch(first=True)
    np.testing.assert_array_equal(y.get(), np.arange(6) * 2 + 1)
    be.copy_into(x, be.to_device(np.full(6, 10, np.float32)))
    graph.launch()
    np.testing.assert_array_equal(y.get(), np.full(6, 21))
    graph.close()


def test_an_allocation_outside_the_graphs_pool_raises(gpu):
    be = gcuda.backend()
    with pytest.raises(RuntimeError, match="allocation of 64 bytes outside the CUDA graph's memory pool"):
        with graphs.capture(be):
            be.driver.alloc(64)
    be.driver.free(be.driver.alloc(64))     # fine again after the capture


def test_a_failed_capture_leaves_no_unfilled_constant(gpu):
    be = gcuda.backend()
    x = be.to_device(np.ones(4, np.float32))
    with pytest.raises(ZeroDivisionError):
        with graphs.capture(be):
            x * 1.2345678          # a new scalar constant: its fill kernel is recorded, not run
            1 / 0
    np.testing.assert_array_equal((x * 1.2345678).get(), np.full(4, 1.2345678, np.float32))
    assert be.capture is None and be.pool.redirect is None and be.pool.held is None and be.launcher.keep is None


@pytest.mark.pool_statistics
def test_blocks_freed_during_the_capture_stay_the_graphs(gpu):
    """An array alive before the capture and dropped inside it: a replay
    still reads its memory, so the pool must not lend it out until the
    graph is gone."""
    be = gcuda.backend()
    a = be.to_device(np.ones(1000, np.float32))
    ptr = a.ptr
    holder = [a]
    del a
    with graphs.capture(be) as cap:
        y = holder.pop() * 3                    # its last reference goes inside the capture
    lent = [be.empty((1000,), np.float32) for _ in range(8)]
    assert ptr not in {b.ptr for b in lent}
    cap.graph.launch(first=True)
    np.testing.assert_array_equal(y.get(), np.full(1000, 3))
    cap.graph.close()
    assert ptr in {be.empty((1000,), np.float32).ptr for _ in range(8)} | {b.ptr for b in lent}


def test_a_dropped_graphed_step_gives_its_memory_back(gpu):
    import gc as pygc
    import weakref
    net, step, graph, data = captured("sgd-momentum")
    pool = graph.pool
    in_use = pool.in_use_bytes
    alive = weakref.ref(graph)
    del step, graph
    pygc.collect()
    assert alive() is None
    assert pool.cached_bytes == 0 and pool.driver_frees > 0     # its free blocks went back to the driver
    assert pool.in_use_bytes <= in_use
    net.step(*data[0]).numpy()          # eager steps go on


def test_a_graph_keeps_what_it_reads_from_another_graphs_pool(gpu):
    """A constant made while graph A was captured lives in A's pool; graph B
    reads it too. Dropped from the cache and A closed, it must stay B's."""
    be = gcuda.backend()
    x = be.to_device(np.ones(4, np.float32))
    with graphs.capture(be) as a:
        x * 7.654321                            # the scalar constant: made (filled) in A
    a.graph.launch(first=True)
    constant = be.scalar(np.float32(7.654321).item(), np.float32)     # as x * 7.654321 made it
    with graphs.capture(be) as b:
        y = x * 7.654321                        # the cached constant, from A's pool
    b.graph.launch(first=True)
    assert any(block is constant._block for block in b.graph._keep)
    block, constant = constant._block, None
    be.forget_filled_constants()
    a.graph.close()
    assert a.graph.pool.in_use_bytes >= block.size, "the block B reads is still in use"
    b.graph.launch()
    np.testing.assert_array_equal(y.get(), np.full(4, 7.654321, np.float32))
    b.graph.close()


def test_results_may_be_parameters_and_must_be_cuda_tensors(gpu):
    net = MLP(OPTIMIZERS["sgd-momentum"])

    def step(x, y):
        return net.step(x, y), net.ws[0]
    g = gcuda.graphed(step, warmup=1)
    for x, y in batches(3):
        loss, w = g(x, y)
        np.testing.assert_array_equal(w.numpy(), net.ws[0].numpy())      # a copy of the updated weight
    assert g.replays == 1 and w is not net.ws[0]
    bad = gcuda.graphed(lambda x: (x * 2).numpy().shape, warmup=0)
    with pytest.raises(gcuda.GraphCaptureError, match="device-to-host"):
        bad(batches(1)[0][0])
    cpu = gcuda.graphed(lambda x: gc.Tensor(np.zeros(2, np.float32)), warmup=0)
    with pytest.raises(gcuda.GraphCaptureError, match="returns a Tensor"):
        cpu(batches(1)[0][0])


def test_graphed_takes_cuda_tensors_only(gpu):
    net = MLP(OPTIMIZERS["sgd-momentum"])
    step = gcuda.graphed(net.step, warmup=0)
    with pytest.raises(gcuda.GraphCaptureError, match="takes cuda tensors"):
        step(gc.Tensor(np.zeros((8, 20), np.float32)), batches(1)[0][1])
