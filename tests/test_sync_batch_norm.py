"""F.nn.sync_batch_norm and M.SyncBatchNorm: in one process they are batch
normalisation (values, gradients, running statistics equal to
BatchNorm2d's, also for (N, C) and (N, C, L) inputs); eps_mode "max"; and
under ``mpirun -n 2`` each rank holding half the batch gets the output,
gradients and running statistics that one process gets from the whole
batch."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
from gradcore.autodiff import GradManager
from gradcore.op import ArgumentError
from gradcore.testing import gradcheck

from test_distributed import MPIRUN, needs_mpi
from test_distributed_functional import _env, _mpirun


def _step(module, x):
    """Output, input gradient, weight gradient and running statistics of one training step."""
    x = gc.tensor(x)
    gm = GradManager().attach([x] + list(module.parameters()))
    with gm:
        y = module(x)
        gm.backward((y * y * y).sum())
    return [y.numpy(), x.grad.numpy(), module.weight.grad.numpy(), module.running_mean.numpy(),
            module.running_var.numpy()]


@pytest.mark.parametrize("shape", [(4, 3, 5, 2), (6, 3), (4, 3, 7)])
def test_one_process_is_batch_norm(shape, rng):
    x = rng.standard_normal(shape)
    sync, plain = M.SyncBatchNorm(3), (M.BatchNorm2d if len(shape) == 4 else M.BatchNorm1d)(3)
    for m in (sync, plain):
        m.weight.set_value(np.linspace(0.5, 1.5, 3).reshape(1, 3, 1, 1).astype("float32"))
    for got, want in zip(_step(sync, x), _step(plain, x)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    sync.eval(), plain.eval()
    np.testing.assert_allclose(sync(gc.tensor(x)).numpy(), plain(gc.tensor(x)).numpy(), rtol=1e-6, atol=1e-6)


def test_eps_mode_max(rng):
    x = rng.standard_normal((5, 2, 3, 3)) * np.array([1.0, 1e-4]).reshape(1, 2, 1, 1)
    rm, rv = gc.tensor(np.zeros((1, 2, 1, 1))), gc.tensor(np.ones((1, 2, 1, 1)))
    y = F.nn.sync_batch_norm(gc.tensor(x), rm, rv, training=True, eps=1e-3, eps_mode="max").numpy()
    m, v = x.mean((0, 2, 3), keepdims=True), x.var((0, 2, 3), keepdims=True)
    np.testing.assert_allclose(y, (x - m) / np.sqrt(np.maximum(v, 1e-3)), rtol=1e-9, atol=1e-12)
    n = x.size // 2
    np.testing.assert_allclose(rv.numpy(), 0.9 + 0.1 * v * n / (n - 1), rtol=1e-9)
    np.testing.assert_allclose(rm.numpy(), 0.1 * m, rtol=1e-9, atol=1e-15)
    gradcheck(lambda a, w: F.nn.sync_batch_norm(a, None, None, w, None, True, eps_mode="max") ** 2,
              [x[:, :1] + 0.5, np.array([1.5]).reshape(1, 1, 1, 1)])
    with pytest.raises(ArgumentError, match="sync_batch_norm: eps_mode must be 'additive' or 'max'"):
        F.nn.sync_batch_norm(gc.tensor(x), rm, rv, eps_mode="min")
    with pytest.raises(ArgumentError, match=r"SyncBatchNorm\(3\): expected input"):
        M.SyncBatchNorm(3)(gc.tensor(x))


WORKER = textwrap.dedent('''
    import json, sys
    import numpy as np
    import gradcore as gc
    import gradcore.distributed as dist
    import gradcore.module as M
    from gradcore.autodiff import GradManager
    dist.init()
    rank = dist.get_rank()
    x = np.random.default_rng(0).standard_normal((8, 3, 4, 2))
    m = M.SyncBatchNorm(3, eps_mode=sys.argv[2])
    m.weight.set_value(np.linspace(0.5, 1.5, 3).reshape(1, 3, 1, 1).astype("float32"))
    xs = gc.tensor(x[rank * 4:(rank + 1) * 4])
    gm = GradManager().attach([xs] + list(m.parameters()))
    with gm:
        y = m(xs)
        gm.backward((y * y * y).sum())
    out = [a.tolist() for a in (y.numpy(), xs.grad.numpy(), m.weight.grad.numpy(), m.running_mean.numpy(),
                                m.running_var.numpy())]
    with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
        json.dump(out, f)
''')


@needs_mpi
@pytest.mark.parametrize("eps_mode", ["additive", "max"])
def test_two_ranks_with_half_a_batch_each_match_one_process_with_all_of_it(tmp_path, eps_mode):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    res = subprocess.run([*_mpirun(2), sys.executable, str(script), str(tmp_path), eps_mode], capture_output=True,
                         text=True, env=_env(), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    one = M.SyncBatchNorm(3, eps_mode=eps_mode)
    one.weight.set_value(np.linspace(0.5, 1.5, 3).reshape(1, 3, 1, 1).astype("float32"))
    y, gx, gw, rm, rv = _step(one, np.random.default_rng(0).standard_normal((8, 3, 4, 2)))
    for r, (ry, rgx, rgw, rrm, rrv) in enumerate(ranks):
        np.testing.assert_allclose(ry, y[r * 4:(r + 1) * 4], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(rgx, gx[r * 4:(r + 1) * 4], rtol=1e-4, atol=1e-4)
        # each rank's weight gradient is its half's share; the allreduce callback would sum them
        np.testing.assert_allclose(rrm, rm, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rrv, rv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.add(ranks[0][2], ranks[1][2]), gw, rtol=1e-4, atol=1e-4)
