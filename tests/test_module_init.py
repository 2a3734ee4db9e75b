"""gradcore.module.init (MegEngine's megengine.module.init)."""
import math

import numpy as np
import pytest

import gradcore
import gradcore.autodiff
import gradcore.module as M
from gradcore.module import init


def test_fill_zeros_ones_keep_the_tensor_object_and_dtype():
    fc = M.Linear(3, 4)
    w = fc.weight
    init.fill_(w, 0.5)
    assert fc.weight is w and w.dtype == np.float32
    np.testing.assert_array_equal(w.numpy(), np.full((4, 3), 0.5))
    init.zeros_(fc.bias)
    init.ones_(w)
    assert fc.bias.numpy().tolist() == [0, 0, 0, 0] and (w.numpy() == 1).all()
    assert M.init is init


@pytest.mark.parametrize("shape, fans", [
    ((8, 3), (3, 8)),                       # Linear (out, in)
    ((6, 4, 3, 3), (36, 54)),               # Conv2d (out, in, kh, kw)
    ((2, 3, 2, 3, 3), (18, 27)),            # grouped Conv2d: one group's channels
    ((5, 2, 7), (14, 35)),                  # Conv1d
])
def test_fan_in_and_fan_out(shape, fans, torch):
    t = gradcore.Tensor(np.zeros(shape, np.float32))
    assert init.calculate_fan_in_and_fan_out(t) == fans
    assert init.calculate_correct_fan(t, "FAN_OUT") == fans[1]
    if len(shape) != 5:
        assert torch.nn.init._calculate_fan_in_and_fan_out(torch.zeros(shape)) == fans


def test_fan_errors():
    with pytest.raises(ValueError, match=r"at least 2 dimensions, got shape \(3,\)"):
        init.calculate_fan_in_and_fan_out(gradcore.Tensor(np.zeros(3)))
    with pytest.raises(ValueError, match="fan_in' or 'fan_out'"):
        init.calculate_correct_fan(gradcore.Tensor(np.zeros((2, 2))), "fan_avg")


def test_gains_match_torch(torch):
    for name in ("linear", "conv2d", "sigmoid", "tanh", "relu", "leaky_relu"):
        assert init.calculate_gain(name) == pytest.approx(torch.nn.init.calculate_gain(name))
    assert init.calculate_gain("leaky_relu", 0.2) == pytest.approx(math.sqrt(2 / 1.04))
    with pytest.raises(ValueError, match="unsupported nonlinearity 'selu2'"):
        init.calculate_gain("selu2")
    with pytest.raises(ValueError, match="not a number"):
        init.calculate_gain("leaky_relu", True)


@pytest.mark.parametrize("fn, args, bound_or_std", [
    (init.uniform_, (-0.3, 0.2), None),
    (init.normal_, (1.0, 0.05), None),
    (init.xavier_uniform_, (), ("uniform", math.sqrt(6 / (200 + 300)))),
    (init.xavier_normal_, (2.0,), ("normal", 2.0 * math.sqrt(2 / (200 + 300)))),
    (init.msra_uniform_, (), ("uniform", math.sqrt(3) * math.sqrt(2) / math.sqrt(200))),
    (init.msra_normal_, (0, "fan_out", "relu"), ("normal", math.sqrt(2) / math.sqrt(300))),
])
def test_random_initialisers_have_their_distribution(fn, args, bound_or_std):
    gradcore.random.seed(3)
    w = gradcore.Tensor(np.zeros((300, 200), np.float32))
    fn(w, *args)
    v = w.numpy()
    assert v.dtype == np.float32 and v.shape == (300, 200)
    if fn is init.uniform_:
        assert v.min() >= -0.3 and v.max() < 0.2 and abs(v.mean() + 0.05) < 0.01
    elif fn is init.normal_:
        assert abs(v.mean() - 1.0) < 0.002 and abs(v.std() - 0.05) < 0.002
    else:
        kind, s = bound_or_std
        if kind == "uniform":
            assert -s <= v.min() and v.max() <= s and v.max() > 0.98 * s
            assert abs(v.std() - s / math.sqrt(3)) < 0.02 * s
        else:
            assert abs(v.std() - s) < 0.02 * s and abs(v.mean()) < 0.02 * s
    # seeded: the same draws again
    gradcore.random.seed(3)
    w2 = gradcore.Tensor(np.zeros((300, 200), np.float32))
    fn(w2, *args)
    np.testing.assert_array_equal(w2.numpy(), v)


def test_an_initialised_parameter_trains():
    fc = M.Linear(4, 1)
    init.msra_uniform_(fc.weight, a=math.sqrt(5))
    init.zeros_(fc.bias)
    gm = gradcore.autodiff.GradManager().attach(fc.parameters())
    x = gradcore.Tensor(np.ones((2, 4), np.float32))
    with gm:
        gm.backward(fc(x).sum())
    np.testing.assert_allclose(fc.weight.grad.numpy(), np.full((1, 4), 2.0))
    np.testing.assert_allclose(fc.bias.grad.numpy(), [2.0])


def test_init_is_an_attribute_of_the_module_package():
    import subprocess
    import sys
    code = "import gradcore.module as M; M.init.zeros_(M.Linear(2, 2).bias); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
