"""Interpolate and InterpolateBackward: nearest, bilinear and bicubic
resizing (with and without align_corners, up and down, both axes
independently; trilinear through F) against
PyTorch's interpolate for values and gradients; first and second order
against float64 finite differences; the weights of one axis; bad input."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore
from gradcore.core import TensorDesc, apply, make_backward_graph
from gradcore.ops import Interpolate, InterpolateBackward
from gradcore.ops.vision import axis_weights
from oracle import compare_second_order

TOL = dict(rtol=1e-10, atol=1e-12)
SIZES = [(10, 14), (3, 4), (5, 7), (1, 1), (11, 3), (2, 9), (8, 1)]
MODES = [("nearest", False), ("bilinear", False), ("bilinear", True), ("bicubic", False), ("bicubic", True)]


def interp(size, mode, align_corners):
    op = Interpolate(size, mode, align_corners)
    return lambda x: apply(op, x)[0]


def torch_interp(torch, size, mode, align_corners):
    kw = {} if mode == "nearest" else {"align_corners": align_corners}
    return lambda x: torch.nn.functional.interpolate(x, size=size, mode=mode, **kw)


@pytest.mark.parametrize("mode, align_corners", MODES)
@pytest.mark.parametrize("size", SIZES)
def test_vs_torch(size, mode, align_corners, rng, h, torch):
    x = rng.standard_normal((2, 3, 5, 7))
    h.compare(torch, interp(size, mode, align_corners), torch_interp(torch, size, mode, align_corners), [x],
              need_grads=True, **TOL)


@pytest.mark.parametrize("mode, align_corners", MODES)
def test_single_pixel_input_vs_torch(mode, align_corners, rng, h, torch):
    x = rng.standard_normal((1, 2, 1, 1))
    h.compare(torch, interp((3, 2), mode, align_corners), torch_interp(torch, (3, 2), mode, align_corners), [x],
              need_grads=True, **TOL)


@pytest.mark.parametrize("mode, align_corners", MODES)
def test_second_order_vs_torch(mode, align_corners, rng, torch):
    f, t = interp((7, 3), mode, align_corners), torch_interp(torch, (7, 3), mode, align_corners)
    compare_second_order(torch, lambda x: f(x) ** 3, lambda x: t(x) ** 3, [rng.standard_normal((1, 2, 4, 5))], rng)


@pytest.mark.parametrize("mode, align_corners", MODES)
def test_finite_differences(mode, align_corners, rng, h):
    x = rng.standard_normal((1, 2, 3, 4))
    h.check_grads(interp((5, 3), mode, align_corners), [x])
    h.check_grads(lambda x: interp((2, 6), mode, align_corners)(x) ** 2, [x])
    g = rng.standard_normal((1, 2, 5, 3))
    back = InterpolateBackward((5, 3), mode, align_corners)
    h.check_grads(lambda g, x: apply(back, g ** 2, x)[0], [g, x], wrt=[0])


def test_backward_is_the_adjoint(rng, h):
    """<interp(x), g> == <x, interp_backward(g)>."""
    for mode, ac in MODES:
        x, g = rng.standard_normal((2, 3, 4, 6)), rng.standard_normal((2, 3, 7, 5))
        y = apply(Interpolate((7, 5), mode, ac), gradcore.Tensor(x))[0].numpy()
        gx = apply(InterpolateBackward((7, 5), mode, ac), gradcore.Tensor(g), gradcore.Tensor(x))[0].numpy()
        h.assert_close(np.sum(y * g), np.sum(x * gx), **TOL)


def test_axis_weights():
    np.testing.assert_array_equal(axis_weights(2, 4, "nearest", False), [[1, 0], [1, 0], [0, 1], [0, 1]])
    np.testing.assert_allclose(axis_weights(2, 4, "bilinear", False),
                               [[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]])
    np.testing.assert_allclose(axis_weights(2, 3, "bilinear", True), [[1, 0], [0.5, 0.5], [0, 1]])
    for n_in, n_out in [(3, 7), (5, 2), (1, 4)]:          # every row sums to one
        for mode, ac in MODES:
            np.testing.assert_allclose(axis_weights(n_in, n_out, mode, ac).sum(1), 1.0)


def test_float32(rng, h):
    x = rng.standard_normal((1, 2, 4, 4))
    y32 = interp((6, 6), "bilinear", False)(gradcore.Tensor(x.astype("float32")))
    assert y32.dtype == np.float32
    h.assert_close(y32.numpy(), interp((6, 6), "bilinear", False)(gradcore.Tensor(x)).numpy(), rtol=1e-6, atol=1e-6)


def test_backward_graph_keeps_no_input_values():
    x = TensorDesc((2, 3, 4, 4), "float32", "cpu")
    graph, mask, has = make_backward_graph(Interpolate((8, 8), "bilinear", False), [x], [True], [True])
    assert has == [True] and mask == [False, False, True]        # only dy: x by shape
    assert [type(o) for o in graph.ops] == [InterpolateBackward]


def test_bad_input(h):
    with pytest.raises(ValueError) as ei:
        apply(Interpolate((4, 4)), gradcore.Tensor(np.ones((2, 3, 4))))
    h.check_error(ei, "Interpolate", "4-D", "(2, 3, 4)")
    with pytest.raises(ValueError) as ei:
        apply(Interpolate((4, 4)), gradcore.Tensor(np.ones((1, 1, 2, 2), "int32")))
    h.check_error(ei, "Interpolate", "floating-point")
    with pytest.raises(ValueError) as ei:
        apply(Interpolate((4, 4)), gradcore.Tensor(np.ones((1, 1, 0, 2))))
    h.check_error(ei, "Interpolate", "empty spatial axis", "(1, 1, 0, 2)")
    with pytest.raises(ValueError) as ei:
        apply(InterpolateBackward((4, 4)), gradcore.Tensor(np.ones((1, 1, 3, 4))), gradcore.Tensor(np.ones((1, 1, 2, 2))))
    h.check_error(ei, "InterpolateBackward", "(1, 1, 4, 4)")


@pytest.mark.parametrize("args, needle", [
    (((4,),), "pair"), (((0, 3),), "positive"), (((2, 2), "bilinearish"), "mode"),
    (((2, 2), "nearest", True), "align_corners"),
])
def test_bad_arguments(args, needle):
    with pytest.raises(ValueError, match=needle):
        Interpolate(*args)


# ---------------------------------------------------------------- F
@pytest.mark.parametrize("kw, tkw", [
    (dict(size=(7, 3)), dict(size=(7, 3))),
    (dict(size=6), dict(size=6)),
    (dict(scale_factor=2), dict(scale_factor=2)),
    (dict(scale_factor=(1.5, 0.5)), dict(scale_factor=(1.5, 0.5), recompute_scale_factor=True)),
])
@pytest.mark.parametrize("mode, align_corners", [("nearest", None), ("bilinear", None), ("bilinear", True),
                                                 ("BILINEAR", False), ("bicubic", None)])
def test_functional_vs_torch(kw, tkw, mode, align_corners, rng, h, torch):
    import gradcore.functional as F
    x = rng.standard_normal((2, 2, 4, 5))
    gfn = lambda x: F.vision.interpolate(x, mode=mode, align_corners=align_corners, **kw)
    extra = {} if mode == "nearest" else {"align_corners": bool(align_corners)}
    tfn = lambda x: torch.nn.functional.interpolate(x, mode=mode.lower(), **extra, **tkw)
    h.compare(torch, gfn, tfn, [x], need_grads=True, **TOL)


@pytest.mark.parametrize("kw", [dict(size=9), dict(scale_factor=3), dict(size=(2,))])
@pytest.mark.parametrize("align_corners", [False, True])
def test_functional_linear_vs_torch(kw, align_corners, rng, h, torch):
    import gradcore.functional as F
    x = rng.standard_normal((2, 3, 4))
    gfn = lambda x: F.vision.interpolate(x, mode="linear", align_corners=align_corners, **kw)
    tfn = lambda x: torch.nn.functional.interpolate(x, mode="linear", align_corners=align_corners, **kw)
    h.compare(torch, gfn, tfn, [x], need_grads=True, **TOL)
    h.check_grads(lambda x: gfn(x) ** 2, [x[:1, :1]])


@pytest.mark.parametrize("kw", [dict(size=(5, 3, 7)), dict(scale_factor=2), dict(size=2)])
@pytest.mark.parametrize("align_corners", [None, True])
def test_functional_trilinear_vs_torch(kw, align_corners, rng, h, torch):
    import gradcore.functional as F
    x = rng.standard_normal((2, 2, 3, 4, 5))
    gfn = lambda x: F.vision.interpolate(x, mode="trilinear", align_corners=align_corners, **kw)
    tfn = lambda x: torch.nn.functional.interpolate(x, mode="trilinear", align_corners=bool(align_corners), **kw)
    h.compare(torch, gfn, tfn, [x], need_grads=True, **TOL)


def test_functional_names():
    import gradcore.functional as F
    assert F.interpolate is F.vision.interpolate is F.nn.interpolate


@pytest.mark.parametrize("shape, kw, needle", [
    ((1, 1, 4, 4), dict(), "exactly one of size and scale_factor"),
    ((1, 1, 4, 4), dict(size=3, scale_factor=2), "exactly one"),
    ((1, 1, 4, 4), dict(size=(2, 2, 2)), "2 element"),
    ((1, 1, 4, 4), dict(size=0), ">= 1"),
    ((1, 1, 4, 4), dict(scale_factor=-1), "positive"),
    ((1, 1, 4, 4), dict(scale_factor=0.1), "empty output"),
    ((1, 1, 4, 4), dict(size=2, mode="area"), "mode"),
    ((1, 1, 4, 4), dict(size=2, mode="bicubic", align_corners=False), "align_corners"),     # MegEngine's rule
    ((1, 1, 4, 4, 4), dict(size=2, mode="bilinear"), "4-D"),
    ((1, 1, 4, 4), dict(size=2, mode="trilinear"), "5-D"),
    ((1, 1, 4, 4), dict(size=2, mode="nearest", align_corners=True), "align_corners"),
    ((1, 1, 4), dict(size=2), "4-D"),
    ((1, 1, 4, 4), dict(size=2, mode="linear"), "3-D"),
])
def test_functional_errors(shape, kw, needle):
    import gradcore.functional as F
    with pytest.raises(ValueError) as ei:
        F.vision.interpolate(gradcore.Tensor(np.ones(shape, "float32")), **kw)
    assert needle in str(ei.value) and "interpolate" in str(ei.value)


# ---------------------------------------------------------------- the CPU kernels' paths
@pytest.mark.parametrize("shape, size", [((2, 3, 16, 16), (32, 32)), ((2, 3, 20, 12), (7, 30)),
                                         ((1, 2, 5, 40), (11, 9))])
def test_float32_paths_vs_torch(shape, size, rng, h, torch):
    # float32: the forward on oneDNN where it is loaded, the adjoint by
    # matrix products or gathers per axis
    x = rng.standard_normal(shape).astype(np.float32)
    h.compare(torch, interp(size, "bilinear", False), torch_interp(torch, size, "bilinear", False), [x],
              rtol=2e-5, atol=2e-5, need_grads=True)


@pytest.mark.parametrize("mode, align_corners", MODES)
@pytest.mark.parametrize("adjoint", [False, True])
def test_products_and_gathers_agree(mode, align_corners, adjoint, rng, monkeypatch):
    from gradcore.ops import vision
    op = (InterpolateBackward if adjoint else Interpolate)((9, 12), mode, align_corners)
    ref = rng.standard_normal((2, 3, 6, 5))
    args = [rng.standard_normal((2, 3, 9, 12)), ref] if adjoint else [ref]
    results = []
    for per_tap in (0, 10 ** 6):          # every axis by gathers, then every axis by products
        monkeypatch.setattr(vision, "_DENSE_PER_TAP", per_tap)
        vision._axis_plan.cache_clear()
        results.append(op.cpu(*args))
    vision._axis_plan.cache_clear()
    np.testing.assert_allclose(results[0], results[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_value_stays_at_its_taps(bad, rng, torch):
    # a matrix product would multiply it by every zero weight of its row
    g = rng.standard_normal((1, 2, 32, 32))
    g[0, 1, 5, 7] = bad
    got = InterpolateBackward((32, 32), "bilinear", False).cpu(g, np.zeros((1, 2, 16, 16)))
    x = torch.zeros((1, 2, 16, 16), dtype=torch.float64, requires_grad=True)
    torch.nn.functional.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False).backward(
        torch.tensor(g))
    want = x.grad.numpy()
    assert (np.isfinite(got) == np.isfinite(want)).all()
    assert 0 < (~np.isfinite(got)).sum() <= 4
    np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-12)
