"""Differentiable collectives (gradcore.distributed.functional) under ``mpirun -n 2`` and
``-n 3``: each rank computes ``loss_r = sum(w_r * collective(x_r))`` and its gradient; the
test recomputes every rank's output and gradient in one process with ordinary ops on all
the ranks' tensors (concat, split, sums) and compares."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gradcore as gc
import gradcore.distributed as dist
import gradcore.functional as F
from gradcore.autodiff import GradManager

from test_distributed import MPIRUN, needs_mpi

SHAPE = (6, 6)          # divisible by 2 and 3 along both axes
CASES = ["all_reduce_sum", "all_reduce_max", "all_reduce_min", "all_gather", "reduce_scatter_sum",
         "all_to_all", "broadcast", "reduce_sum", "scatter", "gather", "send_recv", "all_to_all_twice"]

WORKER = textwrap.dedent(r'''
    import json, sys
    import numpy as np
    import gradcore as gc
    import gradcore.distributed as dist
    import gradcore.distributed.functional as DF
    from gradcore.autodiff import GradManager

    out, cases = sys.argv[1], sys.argv[2].split(",")
    dist.init(timeout=60)
    rank, size = dist.get_rank(), dist.get_world_size()
    result = {}
    for case in cases:
        x = gc.tensor(np.random.default_rng(10 + rank).standard_normal((6, 6)), dtype="float64")
        w = np.random.default_rng(100 + rank).standard_normal
        seen = []                           # what the leaf's callback got (it reads the gradient)
        gm = GradManager().attach(x, callbacks=lambda t, g: seen.append(g.numpy().copy()) or g)
        with gm:
            if case == "all_reduce_sum":
                y = DF.all_reduce_sum(x)
            elif case == "all_reduce_max":
                y = DF.all_reduce_max(x)
            elif case == "all_reduce_min":
                y = DF.all_reduce_min(x)
            elif case == "all_gather":
                y = DF.all_gather(x, axis=1)
            elif case == "reduce_scatter_sum":
                y = DF.reduce_scatter_sum(x, axis=0)
            elif case == "all_to_all":
                y = DF.all_to_all(x, split_axis=0, concat_axis=1)
            elif case == "all_to_all_twice":    # x's gradient: the adjoint's (in flight) plus x * x's
                y = DF.all_to_all(x, split_axis=1, concat_axis=0)
            elif case == "broadcast":
                y = DF.broadcast(x, root=1)
            elif case == "reduce_sum":
                y = DF.reduce_sum(x, root=1)
            elif case == "scatter":
                y = DF.scatter(x, root=1, axis=1)
            elif case == "gather":
                y = DF.gather(x, root=1, axis=0)
            elif case == "send_recv":       # rank 0 sends to the last rank; the others look on
                if rank == 0:
                    y = DF.remote_send(x, size - 1)
                elif rank == size - 1:
                    dummy = gc.tensor(np.zeros(0, np.float32))
                    gm.attach(dummy)
                    y = DF.remote_recv(0, (6, 6), "float64", inp=dummy)
                else:
                    y = x * 0
            loss = (y * gc.tensor(w(y.shape))).sum()
            if case == "all_to_all_twice":
                loss = loss + (x * x).sum()
            gm.backward(loss)
        result[case] = {"y": y.numpy().tolist(), "shape": list(y.shape),
                        "grad": None if x.grad is None else x.grad.numpy().tolist(),
                        "seen": [a.tolist() for a in seen]}
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)
''')


def _mpirun(n):
    cmd = [MPIRUN, "--oversubscribe", "-n", str(n)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def _env():
    # os.environ is the snapshot Python took at start: a process that initialised MPI (a singleton
    # run, in another test of this worker) has Open MPI's variables in its C environment, which an
    # inherited environment would hand to mpirun (it then exits 1 without a word)
    return dict(os.environ)


def _run(tmp_path, n, cases):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    res = subprocess.run([*_mpirun(n), sys.executable, str(script), str(tmp_path),
                          ",".join(cases)], capture_output=True, text=True, env=_env(), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]


def _reference(case, n):
    """(outputs, gradients) of every rank, computed in one process."""
    xs = [gc.tensor(np.random.default_rng(10 + r).standard_normal(SHAPE), dtype="float64") for r in range(n)]
    gm = GradManager().attach(xs)
    with gm:
        if case == "all_reduce_sum":
            ys = [xs[0] + sum(xs[1:])] * n
        elif case in ("all_reduce_max", "all_reduce_min"):
            reduce = F.max if case.endswith("max") else F.min
            ys = [reduce(F.stack(xs), axis=0)] * n
        elif case == "all_gather":
            ys = [F.concat(xs, axis=1)] * n
        elif case == "reduce_scatter_sum":
            ys = F.split(xs[0] + sum(xs[1:]), n, axis=0)
        elif case == "all_to_all":
            ys = [F.concat([F.split(x, n, axis=0)[r] for x in xs], axis=1) for r in range(n)]
        elif case == "all_to_all_twice":
            ys = [F.concat([F.split(x, n, axis=1)[r] for x in xs], axis=0) for r in range(n)]
        elif case == "broadcast":
            ys = [xs[1]] * n
        elif case == "reduce_sum":
            ys = [xs[0] + sum(xs[1:]) if r == 1 else xs[r] * 0 for r in range(n)]
        elif case == "scatter":
            ys = F.split(xs[1], n, axis=1)
        elif case == "gather":
            ys = [F.concat(xs, axis=0) if r == 1 else gc.tensor(np.zeros(0)) for r in range(n)]
        elif case == "send_recv":
            ys = [gc.tensor(np.zeros(0, np.float32))] + [xs[r] * 0 for r in range(1, n - 1)] + [xs[0]]
        losses = [(y * gc.tensor(np.random.default_rng(100 + r).standard_normal(tuple(y.shape)))).sum()
                  for r, y in enumerate(ys)]
        if case == "all_to_all_twice":
            losses = [loss + (x * x).sum() for loss, x in zip(losses, xs)]
        total = losses[0]
        for loss in losses[1:]:
            total = total + loss
        gm.backward(total)
    return [y.numpy() for y in ys], [None if x.grad is None else x.grad.numpy() for x in xs]


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_and_its_gradient_match_one_process(tmp_path, n):
    ranks = _run(tmp_path, n, CASES)
    for case in CASES:
        ys, grads = _reference(case, n)
        for r in range(n):
            got = ranks[r][case]
            np.testing.assert_allclose(np.array(got["y"]).reshape(got["shape"]), ys[r], rtol=1e-12, atol=1e-12,
                                       err_msg=f"{case}, rank {r} of {n}: output")
            want = grads[r] if grads[r] is not None else np.zeros(SHAPE)
            gotg = np.zeros(SHAPE) if got["grad"] is None else np.array(got["grad"])
            np.testing.assert_allclose(gotg, want, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{case}, rank {r} of {n}: gradient")
            if got["grad"] is not None:
                np.testing.assert_array_equal(got["seen"], [got["grad"]],
                                              err_msg=f"{case}, rank {r} of {n}: the callback's gradient")


BAD = textwrap.dedent(r'''
    import sys
    import numpy as np
    import gradcore as gc
    import gradcore.distributed as dist
    import gradcore.distributed.functional as DF

    dist.init(timeout=20, abort_on_error=False)
    rank = dist.get_rank()
    try:
        DF.all_reduce_sum(gc.tensor(np.zeros(3 + rank, np.float32)))
    except Exception as exc:        # the core names the op and the input shapes around it
        print(f"rank {rank}: {type(exc.__cause__ or exc).__name__}: {exc}", flush=True)
''')


@needs_mpi
def test_shapes_that_differ_across_ranks_are_reported_on_every_rank(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(BAD)
    res = subprocess.run([*_mpirun(2), sys.executable, str(script)], capture_output=True,
                         text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for r in range(2):
        assert (f"rank {r}: DistributedError: AllReduce(mode='sum'): the ranks passed different shapes or "
                f"dtypes (rank 0: (3,) float32; rank 1: (4,) float32)") in res.stdout, res.stdout


def test_outside_an_mpi_run_a_collective_says_how_to_start_one(monkeypatch):
    import gradcore.distributed.functional as DF
    if dist.is_initialized():
        pytest.skip("this process has initialised MPI already")
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_NTASKS", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(dist.DistributedError, match="called outside an MPI run: start the script with `mpirun"):
        DF.all_gather(gc.tensor([1.0, 2.0]))
    with pytest.raises(dist.DistributedError, match="the group Group\\(\\[0, 1\\]\\) does not exist"):
        DF.all_gather(gc.tensor([1.0, 2.0]), group=DF.Group([0, 1]))


MODEL_PARALLEL = textwrap.dedent(r'''
    """An embedding table sharded across the ranks, looked up through all_to_all, beside a
    dense branch; every rank trains on its own batch. With one process (argv[3] == "whole")
    the same model holds the whole table and sums the ranks' losses."""
    import json, sys
    import numpy as np
    import gradcore as gc
    import gradcore.functional as F
    import gradcore.optimizer as optim
    from gradcore.autodiff import GradManager

    out, P, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    V, D, B, FD, STEPS = 6 * P, 4, 5, 3, 4
    rng = np.random.default_rng(0)
    table0 = rng.standard_normal((V, D))
    wd0, wh0 = rng.standard_normal((FD, D)), rng.standard_normal((D, 1))
    ids = rng.integers(0, V, (STEPS, P, B))
    dense = rng.standard_normal((STEPS, P, B, FD))
    target = rng.standard_normal((STEPS, P, B, 1))

    def head(emb, x, wd, wh, t):
        return (((F.relu(emb + F.matmul(x, wd)) @ wh) - t) ** 2).mean()

    if mode == "whole":
        table, wd, wh = (gc.Parameter(a.copy()) for a in (table0, wd0, wh0))
        params = [table, wd, wh]
        gm, opt = GradManager().attach(params), optim.SGD(params, lr=0.1)
        for s in range(STEPS):
            with gm:
                losses = [head(table[ids[s, r]], gc.tensor(dense[s, r]), wd, wh, gc.tensor(target[s, r]))
                          for r in range(P)]
                total = losses[0]
                for l in losses[1:]:
                    total = total + l
                gm.backward(total)
            opt.step().clear_grad()
        result = {"table": table.numpy().tolist(), "wd": wd.numpy().tolist(), "wh": wh.numpy().tolist()}
    else:
        import gradcore.distributed as dist
        import gradcore.distributed.functional as DF
        dist.init(timeout=60)
        r, Vr = dist.get_rank(), V // P
        shard = gc.Parameter(table0[r * Vr:(r + 1) * Vr].copy())
        wd, wh = gc.Parameter(wd0.copy()), gc.Parameter(wh0.copy())
        gm = GradManager().attach([shard])
        gm.attach([wd, wh], callbacks=dist.make_allreduce_cb("sum"))   # replicated: gradients summed
        opt = optim.SGD([shard, wd, wh], lr=0.1)
        for s in range(STEPS):
            local = ids[s].reshape(-1) - r * Vr                 # every rank's ids, in this shard's rows
            mine = (local >= 0) & (local < Vr)
            with gm:
                rows = shard[np.where(mine, local, 0)] * gc.tensor(mine[:, None].astype(np.float64))
                # part k (rank k's ids) goes to rank k; what arrives is summed over the owners
                got = DF.all_to_all(rows, split_axis=0, concat_axis=1)
                emb = got.reshape(B, P, D).sum(axis=1)
                gm.backward(head(emb, gc.tensor(dense[s, r]), wd, wh, gc.tensor(target[s, r])))
            opt.step().clear_grad()
        whole = DF.all_gather(gc.tensor(shard.numpy()), axis=0)
        result = {"table": whole.numpy().tolist(), "wd": wd.numpy().tolist(), "wh": wh.numpy().tolist()}
        if r != 0:
            sys.exit(0)
    with open(f"{out}/{mode}.json", "w") as f:
        json.dump(result, f)
''')


@needs_mpi
def test_a_sharded_embedding_trains_as_one_process_holding_the_whole_table(tmp_path):
    script = tmp_path / "model_parallel.py"
    script.write_text(MODEL_PARALLEL)
    whole = subprocess.run([sys.executable, str(script), str(tmp_path), "2", "whole"], capture_output=True,
                           text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-3000:]
    sharded = subprocess.run([*_mpirun(2), sys.executable, str(script), str(tmp_path), "2",
                              "sharded"], capture_output=True, text=True, env=_env(), timeout=300)
    assert sharded.returncode == 0, sharded.stdout[-2000:] + sharded.stderr[-3000:]
    a = json.loads((tmp_path / "whole.json").read_text())
    b = json.loads((tmp_path / "sharded.json").read_text())
    assert not np.allclose(a["table"], np.random.default_rng(0).standard_normal((12, 4)))   # it trained
    for name in ("table", "wd", "wh"):
        np.testing.assert_allclose(b[name], a[name], rtol=1e-10, atol=1e-12, err_msg=name)


EVENTS = textwrap.dedent(r'''
    """The order of events in a backward: the adjoint all_to_all (posted, then waited for)
    against the dense branch's backward, with the collectives' default priority and with it
    turned off."""
    import json, sys
    import numpy as np
    import gradcore as gc
    import gradcore.functional as F
    import gradcore.distributed as dist
    import gradcore.distributed.functional as DF
    from gradcore.autodiff import Function, GradManager

    out = sys.argv[1]
    dist.init(timeout=60)
    r, P = dist.get_rank(), dist.get_world_size()
    events = []
    kernel = DF.AllToAll.cpu

    def traced(self, x):
        events.append("all_to_all")
        return kernel(self, x)
    DF.AllToAll.cpu = traced

    def traced_wait(wait):
        def waiting(requests, what, *args, **kwargs):
            # every wait for the all_to_all's requests (the shapes' exchange, the data) is one event
            if what.startswith("AllToAll") and events[-1:] != ["wait"]:
                events.append("wait")
            return wait(requests, what, *args, **kwargs)
        return waiting
    # whoever waits: the kernel (DF._wait), or the registry of requests in flight where there is one
    DF._wait = traced_wait(DF._wait)
    try:
        from gradcore.distributed import _pending
        _pending._wait = traced_wait(_pending._wait)
    except ImportError:
        pass

    class Dense(Function):
        def forward(self, x):
            return x * 2

        def backward(self, g):
            events.append("dense backward")
            return g * 2

    result = {}
    for priority in (DF.COLLECTIVE_PRIORITY, 0):
        DF.COLLECTIVE_PRIORITY = priority
        events.clear()
        table = gc.Parameter(np.arange(8.0 * P).reshape(4 * P, 2) + r)
        dense = gc.Parameter(np.ones((3, 2)))
        gm = GradManager().attach([table, dense])
        with gm:
            looked_up = DF.all_to_all(table * 1.0, split_axis=0, concat_axis=0)   # recorded first
            d = Dense()(dense)                                                     # recorded after
            loss = (looked_up.sum() * d).sum()
            events.append("backward starts")
            gm.backward(loss)
        result[str(priority)] = events[events.index("backward starts") + 1:]
    if r == 0:
        with open(f"{out}/events.json", "w") as f:
            json.dump(result, f)
''')


@needs_mpi
def test_the_adjoint_all_to_all_is_posted_before_the_dense_branchs_backward_and_waited_for_after(tmp_path):
    script = tmp_path / "events.py"
    script.write_text(EVENTS)
    res = subprocess.run([*_mpirun(2), sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    events = json.loads((tmp_path / "events.json").read_text())
    from gradcore.distributed.functional import COLLECTIVE_PRIORITY
    # posted first, waited for only when the lookup's backward reads the gradient: the dense
    # branch's backward runs while the data moves
    assert events[str(COLLECTIVE_PRIORITY)] == ["all_to_all", "dense backward", "wait"]
    assert events["0"] == ["dense backward", "all_to_all", "wait"]        # the plain reverse walk


FAILING = textwrap.dedent(r'''
    """A backward that fails in a later node while the adjoint all_to_all is in flight: the
    request is waited for, the error is the node's own, and the next step and collective line
    up on both ranks (no request left behind to hang them, or the exit)."""
    import json, sys
    import numpy as np
    import gradcore as gc
    import gradcore.distributed as dist
    import gradcore.distributed.functional as DF
    from gradcore.autodiff import Function, GradManager

    out = sys.argv[1]
    dist.init(timeout=60, abort_on_error=False)
    r, P = dist.get_rank(), dist.get_world_size()

    class Dense(Function):
        fail = True

        def forward(self, x):
            return x * 2

        def backward(self, g):
            if Dense.fail:
                raise RuntimeError(f"boom in a later backward node on rank {r}")
            return g * 2

    def step():
        table = gc.Parameter(np.arange(8.0 * P).reshape(4 * P, 2) + r)
        dense = gc.Parameter(np.ones((3, 2)))
        gm = GradManager().attach([table, dense])
        with gm:
            # posted first (its priority), read by table * 1.0's backward after Dense's
            looked_up = DF.all_to_all(table * 1.0, split_axis=1, concat_axis=0)
            gm.backward((looked_up.sum() * Dense()(dense)).sum())
        return table.grad.numpy()

    try:
        step()
        error = None
    except RuntimeError as exc:
        error = str(exc)
    try:
        from gradcore.distributed import _pending
        in_flight = _pending.in_flight()
    except ImportError:
        in_flight = 0
    Dense.fail = False
    grad = step()
    total = DF.all_reduce_sum(gc.tensor([1.0])).numpy()
    with open(f"{out}/rank{r}.json", "w") as f:
        json.dump({"error": error, "in_flight": in_flight, "grad": grad.tolist(), "total": total.tolist()}, f)
''')


@needs_mpi
def test_a_backward_failing_while_an_adjoint_is_in_flight_leaves_no_request_behind(tmp_path):
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    res = subprocess.run([*_mpirun(2), sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got["error"] == f"boom in a later backward node on rank {r}"
        assert got["in_flight"] == 0
        # loss = sum(looked_up) * sum(2 * dense) = 12 * sum(looked_up): 12 for every row of the table
        np.testing.assert_array_equal(got["grad"], np.full((8, 2), 12.0))
        assert got["total"] == [2.0]


SECOND_ORDER = textwrap.dedent(r'''
    """Second order through all_to_all: the inner backward, recorded by the outer manager,
    runs its adjoint as a recorded op (waited for in its kernel); the outer backward runs the
    adjoint of that adjoint, in flight."""
    import json, sys
    import numpy as np
    import gradcore as gc
    import gradcore.distributed as dist
    import gradcore.distributed.functional as DF
    from gradcore.autodiff import GradManager

    out = sys.argv[1]
    dist.init(timeout=60)
    r = dist.get_rank()
    x = gc.tensor(np.random.default_rng(10 + r).standard_normal((6, 6)))
    w = np.random.default_rng(100 + r).standard_normal
    v = gc.tensor(np.random.default_rng(200 + r).standard_normal((6, 6)))
    outer, inner = GradManager().attach(x), GradManager().attach(x)
    with outer:
        with inner:
            y = DF.all_to_all(x * x, split_axis=0, concat_axis=1)
            inner.backward((y * y * gc.tensor(w(y.shape))).sum())
        d1, x.grad = x.grad, None
        outer.backward((d1 * v).sum())
    with open(f"{out}/rank{r}.json", "w") as f:
        json.dump({"d1": d1.numpy().tolist(), "d2": x.grad.numpy().tolist()}, f)
''')


@needs_mpi
def test_second_order_through_a_collective_matches_one_process(tmp_path):
    n = 2
    script = tmp_path / "second.py"
    script.write_text(SECOND_ORDER)
    res = subprocess.run([*_mpirun(n), sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    xs = [gc.tensor(np.random.default_rng(10 + r).standard_normal(SHAPE)) for r in range(n)]
    vs = [gc.tensor(np.random.default_rng(200 + r).standard_normal(SHAPE)) for r in range(n)]
    outer, inner = GradManager().attach(xs), GradManager().attach(xs)
    with outer:
        with inner:
            sq = [x * x for x in xs]
            ys = [F.concat([F.split(s, n, axis=0)[r] for s in sq], axis=1) for r in range(n)]
            total = None
            for r, y in enumerate(ys):
                w = gc.tensor(np.random.default_rng(100 + r).standard_normal(tuple(y.shape)))
                term = (y * y * w).sum()
                total = term if total is None else total + term
            inner.backward(total)
        d1s = [x.grad for x in xs]
        for x in xs:
            x.grad = None
        second = (d1s[0] * vs[0]).sum()
        for d1, v in zip(d1s[1:], vs[1:]):
            second = second + (d1 * v).sum()
        outer.backward(second)
    for r in range(n):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        np.testing.assert_allclose(got["d1"], d1s[r].numpy(), rtol=1e-12, atol=1e-12, err_msg=f"rank {r}: d1")
        np.testing.assert_allclose(got["d2"], xs[r].grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=f"rank {r}: d2")


WORLD_OF_ONE = textwrap.dedent(r'''
    import numpy as np
    import gradcore as gc
    import gradcore.distributed as dist
    import gradcore.distributed.functional as DF
    from gradcore.distributed import _pending
    from gradcore.autodiff import GradManager

    dist.init(timeout=30)
    assert dist.get_world_size() == 1
    events = []
    _pending.set_trace(events.append)
    collectives = {"all_reduce_sum": DF.all_reduce_sum, "all_gather": DF.all_gather,
                   "reduce_scatter_sum": DF.reduce_scatter_sum, "all_to_all": DF.all_to_all,
                   "broadcast": DF.broadcast, "reduce_sum": DF.reduce_sum, "scatter": DF.scatter,
                   "gather": DF.gather}
    rng = np.random.default_rng(0)
    for name, fn in collectives.items():
        x = gc.tensor(rng.standard_normal((4, 3)))
        w = rng.standard_normal((4, 3))
        gm = GradManager().attach(x)
        with gm:
            y = fn(x)                           # in a world of one: the identity
            gm.backward((y * gc.tensor(w)).sum() + (x * x).sum())
        np.testing.assert_allclose(y.numpy(), x.numpy(), err_msg=name)
        np.testing.assert_allclose(x.grad.numpy(), w + 2 * x.numpy(), err_msg=name)
    assert _pending.in_flight() == 0
    assert events.count("deferred: " + "AllToAll(split_axis=0, concat_axis=0, adjoint=True)") == 1, events
    assert sum(e.startswith("deferred") for e in events) == sum(e.startswith("completed") for e in events) == 8
    print("ok")
''')


def test_in_a_world_of_one_the_collectives_and_their_deferred_adjoints_are_the_identity():
    """No mpirun: MPI's world of one, in a subprocess (MPI is not initialised in pytest's process)."""
    from test_distributed import LIBMPI, OPENMPI, _have_mpi4py
    if LIBMPI is None or not _have_mpi4py():
        pytest.skip(f"needs mpi4py and libmpi from {OPENMPI}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "PMIX"))}
    proc = subprocess.run([sys.executable, "-c", WORLD_OF_ONE], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr[-3000:]
