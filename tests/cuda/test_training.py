"""Whole training runs on cuda give the cpu's results: the demo's CNN with
SGD (momentum) and Adam, an MLP with batch norm and dropout, and the demo
command itself with ``--device cuda``."""
import os
import subprocess
import sys

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore.autodiff import GradManager
from gradcore.demo import DigitsCNN, load_digits


def _train(device, make_model, make_opt, steps, batch=16, seed=0):
    gc.random.seed(seed)
    model = make_model().to(device)
    gm = GradManager().attach(model.parameters())
    opt = make_opt(model.parameters())
    x, y = load_digits()
    losses = []
    for s in range(steps):
        idx = slice(s * batch, (s + 1) * batch)
        with gm:
            loss = F.cross_entropy(model(gc.tensor(x[idx], device=device)), gc.tensor(y[idx], device=device))
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(loss.item())
    for p in model.parameters():
        assert p.device == device
    return losses, [p.numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_the_demo_cnn_trains_the_same_on_cuda(cuda, opt):
    make_opt = (lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9)) if opt == "sgd" else \
        (lambda ps: optim.Adam(ps, lr=1e-3))
    cpu_losses, cpu_params = _train("cpu", DigitsCNN, make_opt, 6)
    cuda_losses, cuda_params = _train("cuda", DigitsCNN, make_opt, 6)
    np.testing.assert_allclose(cuda_losses, cpu_losses, rtol=1e-4)
    assert cuda_losses[-1] < cuda_losses[0]
    for a, b in zip(cuda_params, cpu_params):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


class _MLP(M.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = M.Linear(64, 32)
        self.bn = M.BatchNorm2d(32)
        self.fc2 = M.Linear(32, 10)

    def forward(self, x):
        h = self.fc1(F.flatten(x, 1))
        h = F.flatten(self.bn(F.reshape(h, (h.shape[0], 32, 1, 1))), 1)
        return self.fc2(F.dropout(F.relu(h), 0.2, self.training))


def test_an_mlp_with_batch_norm_and_dropout_trains_the_same_on_cuda(cuda):
    make_opt = lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4)  # noqa: E731
    cpu_losses, cpu_params = _train("cpu", _MLP, make_opt, 5)
    cuda_losses, cuda_params = _train("cuda", _MLP, make_opt, 5)
    np.testing.assert_allclose(cuda_losses, cpu_losses, rtol=1e-4)
    for a, b in zip(cuda_params, cpu_params):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_the_demo_command_on_cuda(cuda, tmp_path):
    if getattr(cuda.driver, "fake", None) is not None:
        pytest.skip("the fake GPU exists in this process only; the demo runs in another")
    env = dict(os.environ, GRADCORE_CUDA=cuda.driver.kind)
    outs = {}
    for name, args in (("cpu", ["--device", "cpu"]), ("cuda", ["--device", "cuda"]),
                       ("graphed", ["--device", "cuda", "--cuda-graph"])):
        res = subprocess.run([sys.executable, "-m", "gradcore.demo", "--epochs", "1", *args,
                              "--out", str(tmp_path / name)], capture_output=True, text=True, env=env,
                             timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        outs[name] = (tmp_path / name / "summary.txt").read_text()
    pick = lambda text, key: next(line for line in text.splitlines() if line.startswith(key))  # noqa: E731
    assert "device cuda" in outs["cuda"] and "CUDA graphs" in outs["graphed"]
    for key in ("final train loss", "final test accuracy"):
        assert pick(outs["cuda"], key) == pick(outs["cpu"], key)
        assert pick(outs["graphed"], key) == pick(outs["cuda"], key)    # CUDA graphs: the same steps


def test_jvp_and_vjp_take_a_cotangent_or_tangent_from_another_device(cuda):
    # it follows its output / primal, as GradManager.backward's dy does
    # (a cpu cotangent for a cuda output failed inside a kernel's argument packing)
    x = gc.tensor([1.0, 2.0], device="cuda")
    _, vjp_fn = gc.vjp(lambda t: F.sum(t * t), x)
    (gx,) = vjp_fn(gc.tensor(1.0))
    assert gx.device == "cuda"
    np.testing.assert_allclose(gx.numpy(), [2.0, 4.0])
    _, tangent = gc.jvp(lambda t: t * t, (x,), (gc.tensor([1.0, 1.0]),))
    assert tangent.device == "cuda"
    np.testing.assert_allclose(tangent.numpy(), [2.0, 4.0])
    _, vjp_fn = gc.vjp(lambda t: F.sum(t * t), gc.tensor([1.0, 2.0]))
    np.testing.assert_allclose(vjp_fn(gc.tensor(1.0, device="cuda"))[0].numpy(), [2.0, 4.0])
