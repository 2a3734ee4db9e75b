"""gradcore.distributions.Exponential against torch.distributions.Exponential:
shapes, moments, log_prob/cdf/icdf and their gradients."""
import numpy as np
import pytest
import torch

import gradcore as gc
from gradcore.autodiff import GradManager
from gradcore.distributions import Distribution, Exponential


def test_sample_shapes_and_moments():
    rate = np.float32([[0.5, 1.0], [2.0, 5.0]])
    d = Exponential(rate)
    assert d.batch_shape == (2, 2) and d.event_shape == ()
    assert d.sample().shape == (2, 2) and d.sample((7,)).shape == (7, 2, 2)
    assert Exponential(0.2).sample((3,)).shape == (3,) and Exponential(0.2).batch_shape == ()
    gc.random.seed(3)
    s = d.sample((100000,)).numpy()
    t = torch.distributions.Exponential(torch.tensor(rate))
    np.testing.assert_allclose(d.mean.numpy(), t.mean.numpy(), rtol=1e-6)
    np.testing.assert_allclose(d.variance.numpy(), t.variance.numpy(), rtol=1e-6)
    np.testing.assert_allclose(d.stddev.numpy(), t.stddev.numpy(), rtol=1e-6)
    np.testing.assert_allclose(s.mean(0), t.mean.numpy(), rtol=3e-2)
    np.testing.assert_allclose(s.var(0), t.variance.numpy(), rtol=6e-2)
    assert (s >= 0).all()


def test_log_prob_cdf_icdf_and_gradients_as_torch():
    rate, value, p = np.float64([0.5, 2.0, 3.0]), np.float64([0.1, 1.0, 2.5]), np.float64([0.1, 0.5, 0.9])
    r, v = gc.Parameter(rate), gc.Parameter(value)
    tr, tv = torch.tensor(rate, requires_grad=True), torch.tensor(value, requires_grad=True)
    d, t = Exponential(r), torch.distributions.Exponential(tr)
    gm = GradManager().attach([r, v])
    with gm:
        out = d.log_prob(v) + d.cdf(v)
        gm.backward(out.sum())
    ref = t.log_prob(tv) + t.cdf(tv)
    ref.sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(r.grad.numpy(), tr.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(v.grad.numpy(), tv.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(d.icdf(gc.tensor(p)).numpy(), t.icdf(torch.tensor(p)).detach().numpy(), rtol=1e-10)


def test_bad_rate_and_the_abstract_base():
    with pytest.raises(ValueError, match="Exponential: rate must be > 0"):
        Exponential(np.float32([1.0, -1.0]))
    base = Distribution((3,))
    assert base.batch_shape == (3,)
    with pytest.raises(NotImplementedError, match="does not define sample"):
        base.sample()
    with pytest.raises(NotImplementedError, match="does not define mean"):
        base.mean
