"""gradcore.random: MegEngine's megengine.random API (RNG, uniform, normal,
gamma, beta, poisson, permutation, shuffle) on NumPy's generator."""
import numpy as np
import pytest

import gradcore as gc
from gradcore import random as R


def test_size_none_is_one_element_and_shapes_follow_megengine():
    assert R.uniform().shape == (1,) and R.normal().shape == (1,)
    assert R.uniform(size=(2, 3)).shape == (2, 3) and R.normal(0, 1, 4).shape == (4,)
    shape, scale = gc.tensor([[1.0], [10.0]]), gc.tensor([1.0, 5.0])
    assert R.gamma(2.0, size=(2, 2)).shape == (2, 2)
    assert R.gamma(shape, scale).shape == (2, 2)              # the parameters' broadcast shape
    assert R.gamma(shape, scale, size=2).shape == (2, 2, 2)   # size, then that shape
    assert R.beta(2.0, 1.0, size=3).shape == (3,)
    assert R.poisson(gc.tensor([[1.0, 1.0], [10.0, 10.0]]), size=(1, 3)).shape == (1, 3, 2, 2)
    for t in (R.uniform(size=2), R.normal(size=2), R.gamma(1.0, size=2), R.beta(1.0, 1.0, size=2),
              R.poisson(1.0, size=2)):
        assert t.dtype == np.float32


def test_values_follow_their_distributions():
    gc.random.seed(3)
    u = R.uniform(2.0, 3.0, size=20000).numpy()
    assert u.min() >= 2.0 and u.max() < 3.0 and abs(u.mean() - 2.5) < 0.01
    g = R.gamma(2.0, 3.0, size=20000).numpy()
    assert abs(g.mean() - 6.0) < 0.2
    b = R.beta(2.0, 6.0, size=20000).numpy()
    assert abs(b.mean() - 0.25) < 0.01
    p = R.poisson(4.0, size=20000).numpy()
    assert abs(p.mean() - 4.0) < 0.1 and (p == np.round(p)).all()


def test_permutation_and_shuffle():
    p = R.permutation(10)
    assert p.dtype == np.int32 and sorted(p.numpy().tolist()) == list(range(10))
    assert R.permutation(5, dtype="float32").dtype == np.float32
    x = gc.tensor(np.arange(18).reshape(6, 3))
    y = R.permutation(x)                    # a shuffled copy along the first axis
    assert y.shape == (6, 3) and sorted(y.numpy()[:, 0].tolist()) == [0, 3, 6, 9, 12, 15]
    assert (x.numpy() == np.arange(18).reshape(6, 3)).all()
    R.shuffle(x)                            # in place, rows kept whole
    rows = x.numpy()
    assert sorted(rows[:, 0].tolist()) == [0, 3, 6, 9, 12, 15] and (rows[:, 1] == rows[:, 0] + 1).all()


def test_an_rng_with_a_seed_is_its_own_stream_and_without_one_the_global():
    a = R.RNG(seed=100).uniform(size=5).numpy()
    assert (R.RNG(seed=100).uniform(size=5).numpy() == a).all()
    gc.random.seed(7)
    first = R.RNG().normal(size=4).numpy()
    gc.random.seed(7)
    assert (R.normal(size=4).numpy() == first).all()


def test_arguments_out_of_their_domain_are_assertion_and_value_errors():
    for call in (lambda: R.uniform(1.0, 0.0), lambda: R.gamma(-1.0), lambda: R.beta(1.0, 0.0),
                 lambda: R.poisson(-2.0), lambda: R.permutation(-1), lambda: R.permutation(3, dtype="int64")):
        with pytest.raises(AssertionError):
            call()
        with pytest.raises(ValueError):
            call()


def test_exponential_and_multinomial():
    gc.random.seed(5)
    e = R.exponential(2.0, size=20000).numpy()
    assert e.dtype == np.float32 and e.min() >= 0 and abs(e.mean() - 0.5) < 0.02
    assert R.exponential(gc.tensor([[1.0], [4.0]]), size=3).shape == (3, 2, 1)
    for shape in ((0,), (10, 0, 10)):       # empty sizes, as MegEngine's test
        for t in (R.uniform(0, 1, shape), R.normal(0, 1, shape), R.gamma(2, 1, shape), R.beta(2, 1, shape),
                  R.poisson(2, shape), R.exponential(1.5, shape)):
            assert t.shape == shape
    counts = np.bincount(R.multinomial(gc.tensor([1.0, 2.0, 3.0, 4.0]), 20000, replacement=True).numpy(),
                         minlength=4) / 20000
    np.testing.assert_allclose(counts, [0.1, 0.2, 0.3, 0.4], atol=0.02)
    rows = R.multinomial(gc.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]), 2)
    assert rows.dtype == np.int32 and rows.shape == (2, 2)
    assert R.multinomial(gc.tensor(np.ones((0, 10))), 2).shape == (0, 2)
    assert sorted(rows.numpy()[0].tolist()) == [0, 1] and sorted(rows.numpy()[1].tolist()) == [1, 2]
    with pytest.raises(AssertionError):
        R.multinomial(gc.tensor([1.0, 0.0]), 2)         # without replacement: one non-zero weight
