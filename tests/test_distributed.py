"""Data-parallel training over MPI: each test runs a small script under
``mpirun -n 2`` in a subprocess (with a timeout as the guard against hangs)
and checks what the ranks wrote. mpi4py comes with the test extra; OpenMPI
(``mpirun`` and ``libmpi``) is a system package pip cannot install, so the
tests that need it skip, naming it, where it is missing (CI installs it)."""
import ctypes.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import gradcore.distributed as dist

MPIRUN = shutil.which("mpirun") or shutil.which("mpiexec")
# found without loading it: MPI must not be initialised in pytest's process
LIBMPI = ctypes.util.find_library("mpi")
OPENMPI = "OpenMPI, a system package pip cannot install: apt-get install openmpi-bin libopenmpi-dev"


def _have_mpi4py():
    try:
        import mpi4py  # noqa: F401
        return True
    except Exception:
        return False


def _missing():
    """Why the MPI tests cannot run here, or None."""
    if MPIRUN is None or LIBMPI is None:
        return f"needs mpirun and libmpi from {OPENMPI}"
    if not _have_mpi4py():
        return "needs mpi4py, part of the test extra: pip install -e \".[test]\""
    return None


needs_mpi = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))

WORKER = textwrap.dedent(r'''
    import json, os, sys
    import numpy as np
    import gradcore as gc
    import gradcore.functional as F
    import gradcore.module as M
    import gradcore.optimizer as optim
    import gradcore.distributed as dist
    from gradcore.autodiff import GradManager

    mode, out = sys.argv[1], sys.argv[2]
    STEPS, BATCH = 5, 16
    dist.init()
    rank, size = dist.get_rank(), dist.get_world_size()

    def make_model(seed):
        gc.random.seed(seed)
        return M.Sequential(M.Linear(6, 32), M.ReLU(), M.Linear(32, 32), M.ReLU(),
                            M.Linear(32, 4))

    rng = np.random.default_rng(123)
    X = rng.standard_normal((STEPS, BATCH, 6)).astype(np.float32)
    Y = rng.integers(0, 4, (STEPS, BATCH)).astype(np.int32)

    # a different seed per rank: only the broadcast makes the ranks agree
    model = make_model(seed=1 + rank)
    params = list(model.parameters())
    if mode == "mismatch" and rank == 1:
        params = params + [gc.Parameter(np.zeros(3, np.float32))]
    if mode != "mismatch":
        dist.broadcast_parameters(params)
    events = []
    cb = dist.make_allreduce_cb("mean", bucket_bytes=1024, trace=events.append)
    gm = GradManager().attach(params, callbacks=cb)
    gm.register_after_backward_callback(lambda: events.append("backward ended"))
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    mine = dist.shard(BATCH)
    for step in range(STEPS):
        if step == 2 and rank == 1 and mode == "exit_early":
            print("rank 1 leaves early", flush=True)
            sys.exit(0)
        if step == 2 and rank == 1 and mode == "crash":
            print("rank 1 dies", flush=True)
            os._exit(3)
        with gm:
            loss = F.cross_entropy(model(gc.tensor(X[step][mine])), gc.tensor(Y[step][mine]))
            gm.backward(loss)
        opt.step().clear_grad()
        events.append("step done")
    np.savez(os.path.join(out, f"rank{rank}.npz"), *[p.numpy() for p in params])
    with open(os.path.join(out, f"events{rank}.json"), "w") as f:
        json.dump(events, f)
    if rank == 0:
        # the same training in one process on the whole batch
        ref = make_model(seed=1)
        rparams = list(ref.parameters())
        rgm = GradManager().attach(rparams)
        ropt = optim.SGD(rparams, lr=0.1, momentum=0.9)
        for step in range(STEPS):
            with rgm:
                loss = F.cross_entropy(ref(gc.tensor(X[step])), gc.tensor(Y[step]))
                rgm.backward(loss)
            ropt.step().clear_grad()
        np.savez(os.path.join(out, "single.npz"), *[p.numpy() for p in rparams])
    print(f"rank {rank} done", flush=True)
''')


def run_mpi(tmp_path, mode, n=2, timeout=90, dist_timeout="5"):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd = [MPIRUN, "-n", str(n), "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, str(script), mode, str(tmp_path)]
    env = dict(os.environ, GRADCORE_DIST_TIMEOUT=dist_timeout, OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return proc, time.monotonic() - t0


@needs_mpi
def test_two_ranks_match_each_other_and_single_process(tmp_path):
    proc, _ = run_mpi(tmp_path, "train")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r0, r1, single = (np.load(tmp_path / f) for f in ("rank0.npz", "rank1.npz", "single.npz"))
    assert len(r0.files) == len(r1.files) == len(single.files) == 6
    for k in r0.files:
        np.testing.assert_array_equal(r0[k], r1[k])             # identical on every rank
        np.testing.assert_allclose(r0[k], single[k], rtol=1e-4, atol=1e-5)


@needs_mpi
def test_first_allreduce_starts_before_the_backward_ends(tmp_path):
    proc, _ = run_mpi(tmp_path, "train")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        events = json.loads((tmp_path / f"events{rank}.json").read_text())
        first_step = events[:events.index("step done")]
        started = [i for i, e in enumerate(first_step) if e.startswith("allreduce started")]
        ready = [i for i, e in enumerate(first_step) if e.startswith("grad ready")]
        ended = first_step.index("backward ended")
        assert started and len(ready) == 6, first_step
        # communication is in flight while the backward still has gradients to produce
        assert started[0] < ready[-1] < ended, first_step
        assert "at the end of backward" not in first_step[started[0]]
        # the small bucket size gives several buckets; every step ran its backward
        assert len(started) >= 3
        assert sum(e == "backward ended" for e in events) == 5


@needs_mpi
def test_mismatched_parameter_lists_give_a_clear_error(tmp_path):
    proc, elapsed = run_mpi(tmp_path, "mismatch")
    assert proc.returncode != 0
    assert "different parameter lists" in proc.stderr, proc.stderr
    assert "rank 1: 7 parameters" in proc.stderr and "rank 0: 6 parameters" in proc.stderr
    assert elapsed < 60


@needs_mpi
def test_rank_that_exits_early_gives_a_clear_error_not_a_hang(tmp_path):
    proc, elapsed = run_mpi(tmp_path, "exit_early", dist_timeout="3")
    assert proc.returncode != 0
    assert "did not complete within 3 s on rank 0" in proc.stderr, proc.stdout + proc.stderr
    assert "another rank has died" in proc.stderr
    assert elapsed < 60


@needs_mpi
def test_rank_that_dies_ends_the_job_not_a_hang(tmp_path):
    proc, elapsed = run_mpi(tmp_path, "crash", dist_timeout="3")
    assert proc.returncode != 0
    assert "rank 1 dies" in proc.stdout
    assert "rank 0 done" not in proc.stdout
    assert elapsed < 60


def test_shard_is_equal_sized_and_disjoint():
    parts = [dist.shard(10, r, 3) for r in range(3)]
    assert [len(p) for p in parts] == [3, 3, 3]
    assert len(set(np.concatenate(parts))) == 9
    padded = [dist.shard(10, r, 3, drop_remainder=False) for r in range(3)]
    assert [len(p) for p in padded] == [4, 4, 4]
    assert set(np.concatenate(padded)) == set(range(10))
    shuffled = [dist.shard(10, r, 2, shuffle_seed=7) for r in range(2)]
    assert sorted(np.concatenate(shuffled)) == list(range(10))
    assert list(dist.shard(5, 0, 1)) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        dist.shard(10, 3, 3)


def test_module_imports_without_mpi4py_and_says_what_to_install(tmp_path):
    # a fake mpi4py that fails to import, first on the path
    (tmp_path / "mpi4py").mkdir()
    (tmp_path / "mpi4py" / "__init__.py").write_text("raise ImportError('no mpi4py here')\n")
    code = ("import gradcore.distributed as d\n"
            "assert d.is_distributed() is False\n"
            "try:\n    d.init()\nexcept d.DistributedError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "PMIX"))}
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "pip install gradcore[distributed]" in proc.stdout
    assert "MPI" in proc.stdout


def test_single_process_callback_is_a_no_op():
    """In a world of one (no mpirun) the callback leaves gradients unchanged.
    In a subprocess: MPI is initialised there, not in pytest's process."""
    if LIBMPI is None:
        pytest.skip(f"mpi4py needs libmpi from {OPENMPI}")
    if not _have_mpi4py():
        pytest.skip(str(_missing()))
    code = textwrap.dedent("""
        import numpy as np, gradcore as gc, gradcore.distributed as dist
        from gradcore.autodiff import GradManager
        w = gc.Parameter(np.array([1.0, 2.0], np.float32))
        gm = GradManager().attach([w], callbacks=dist.make_allreduce_cb("mean"))
        for _ in range(2):
            with gm:
                gm.backward((w * w).sum())
        assert dist.get_world_size() == 1 and dist.get_rank() == 0
        np.testing.assert_allclose(w.grad.numpy(), [4.0, 8.0])
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "PMIX"))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr


@needs_mpi
def test_demo_trains_data_parallel_on_two_processes(tmp_path):
    env = dict(os.environ, GRADCORE_DIST_TIMEOUT="60")
    proc = subprocess.run([sys.executable, "-m", "gradcore.demo", "--nproc", "2", "--out",
                           str(tmp_path), "--seed", "0"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text()
    assert "2 MPI processes" in summary
    acc = float(re.search(r"final test accuracy ([0-9.]+)", summary).group(1))
    assert acc >= 0.95, summary
    assert proc.stdout.count("final test accuracy") == 1      # only rank 0 prints
