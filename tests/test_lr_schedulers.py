"""Learning-rate schedules (gradcore.optimizer): StepLR, CosineAnnealingLR,
LambdaLR, LinearLR and the LRScheduler base, equal to PyTorch's rates step
for step (bit for bit: the same arithmetic), with state_dict resume."""
import math

import numpy as np
import pytest

import gradcore as gc
import gradcore.optimizer as optim

CASES = [
    ("StepLR", dict(step_size=3, gamma=0.3)),
    ("StepLR", dict(step_size=1, gamma=0.7)),
    ("CosineAnnealingLR", dict(T_max=7, eta_min=0.001)),
    ("CosineAnnealingLR", dict(T_max=3)),                     # past T_max: back up, as PyTorch's
    ("LambdaLR", dict(lr_lambda=lambda e: 0.95 ** e if e >= 2 else (e + 1) / 3)),
    ("LinearLR", dict(start_factor=0.1, total_iters=6)),
    ("LinearLR", dict(start_factor=1.0, end_factor=0.2, total_iters=4)),
    ("MultiStepLR", dict(milestones=[2, 5], gamma=0.5)),
]


def _pair(torch, lrs=(0.1, 0.37)):
    a, b = gc.Parameter([1.0]), gc.Parameter([2.0])
    opt = optim.SGD([{"params": [a], "lr": lrs[0]}, {"params": [b], "lr": lrs[1]}], lr=lrs[0], momentum=0.9)
    ta, tb = torch.tensor([1.0], requires_grad=True), torch.tensor([2.0], requires_grad=True)
    topt = torch.optim.SGD([{"params": [ta], "lr": lrs[0]}, {"params": [tb], "lr": lrs[1]}], lr=lrs[0],
                           momentum=0.9)
    return opt, topt


@pytest.mark.parametrize("kind,kwargs", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_rates_equal_pytorch_step_for_step(torch, kind, kwargs):
    opt, topt = _pair(torch)
    sched = getattr(optim, kind)(opt, **kwargs)
    tsched = getattr(torch.optim.lr_scheduler, kind)(topt, **kwargs)
    exact = kind != "MultiStepLR"        # MultiStepLR keeps MegEngine's closed form (within 1 ulp)
    for epoch in range(20):
        ours = [g["lr"] for g in opt.param_groups]
        theirs = [g["lr"] for g in topt.param_groups]
        if exact:
            assert ours == theirs, f"epoch {epoch}: {ours} != {theirs}"
        else:
            np.testing.assert_allclose(ours, theirs, rtol=1e-15, err_msg=f"epoch {epoch}")
        assert sched.get_last_lr() == ours
        opt.step()
        topt.step()
        sched.step()
        tsched.step()


@pytest.mark.parametrize("kind,kwargs", [CASES[0], CASES[2], CASES[5]], ids=["StepLR", "Cosine", "LinearLR"])
def test_explicit_epoch_uses_the_closed_form_as_pytorch(torch, kind, kwargs):
    import warnings
    opt, topt = _pair(torch)
    sched = getattr(optim, kind)(opt, **kwargs)
    tsched = getattr(torch.optim.lr_scheduler, kind)(topt, **kwargs)
    for epoch in (4, 1, 9, 2):
        sched.step(epoch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # PyTorch's deprecation of step(epoch)
            tsched.step(epoch)
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in topt.param_groups]


def test_cosine_formula_and_warm_up_values():
    opt = optim.SGD([gc.Parameter([1.0])], lr=1.0)
    sched = optim.CosineAnnealingLR(opt, T_max=10, eta_min=0.1)
    for e in range(11):
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * e / 10)) / 2)
        sched.step()
    opt = optim.SGD([gc.Parameter([1.0])], lr=2.0)
    warm = optim.LinearLR(opt, start_factor=0.25, total_iters=3)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        warm.step()
    assert seen == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0, 2.0])


@pytest.mark.parametrize("kind,kwargs", [CASES[0], CASES[2], CASES[4], CASES[5]],
                         ids=["StepLR", "Cosine", "LambdaLR", "LinearLR"])
def test_state_dict_resume_continues_the_same_rates(kind, kwargs):
    opt = optim.SGD([gc.Parameter([1.0])], lr=0.5)
    sched = getattr(optim, kind)(opt, **kwargs)
    for _ in range(5):
        sched.step()
    saved_sched, saved_opt = sched.state_dict(), opt.state_dict()
    assert saved_sched["current_epoch"] == 5
    ahead = []
    for _ in range(8):
        sched.step()
        ahead.append(opt.param_groups[0]["lr"])

    opt2 = optim.SGD([gc.Parameter([1.0])], lr=0.5)
    sched2 = getattr(optim, kind)(opt2, **kwargs)
    opt2.load_state_dict(saved_opt)
    sched2.load_state_dict(saved_sched)
    again = []
    for _ in range(8):
        sched2.step()
        again.append(opt2.param_groups[0]["lr"])
    assert again == ahead


def test_schedulers_are_in_gradcore_optimizer_and_check_their_arguments():
    for name in ("LRScheduler", "StepLR", "MultiStepLR", "CosineAnnealingLR", "LambdaLR", "LinearLR"):
        assert issubclass(getattr(optim, name), optim.LRScheduler)
    opt = optim.SGD([gc.Parameter([1.0])], lr=1.0)
    with pytest.raises(ValueError, match="step_size must be a positive integer"):
        optim.StepLR(opt, step_size=0)
    with pytest.raises(ValueError, match="T_max"):
        optim.CosineAnnealingLR(opt, T_max=0)
    with pytest.raises(ValueError, match="start_factor"):
        optim.LinearLR(opt, start_factor=0)
    with pytest.raises(ValueError, match="one function per parameter group"):
        optim.LambdaLR(opt, [lambda e: 1.0, lambda e: 1.0])
    with pytest.raises(TypeError, match="Optimizer"):
        optim.StepLR([gc.Parameter([1.0])], step_size=1)
    with pytest.raises(KeyError, match="step_size"):
        optim.StepLR(opt, step_size=2).load_state_dict({"gamma": 0.1, "current_epoch": 3})
