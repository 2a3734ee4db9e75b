"""F.deformable_psroi_pooling, M.DeformablePSROIPooling and the ops behind
them (ops.vision.DeformablePSROIPooling and its backward): values against a
loop-by-loop reference written from MegEngine's naive kernel, gradients
against finite differences of that reference, cpu against the cuda kernels
(host emulator without a GPU), MegEngine's test call, and the errors."""
import math

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
from gradcore.core import apply
from gradcore._core import NotDifferentiableError
from gradcore.op import OpError
from gradcore.ops.vision import DeformablePSROIPooling, DeformablePSROIPoolingBackward
from gradcore.testing import cuda_for_checks


def _c_round(v):
    """C's round: halves away from zero."""
    return math.copysign(math.floor(abs(v) + 0.5), v)


def reference(x, rois, trans, no_trans, part_size, pooled_h, pooled_w, spp, scale, trans_std):
    """One loop per output element and sample, as MegEngine's naive kernel
    (float64 throughout): returns (out, count)."""
    n_img, c_n, h_n, w_n = x.shape
    r_n = rois.shape[0]
    out = np.zeros((r_n, c_n, pooled_h, pooled_w))
    count = np.zeros_like(out)
    for r in range(r_n):
        img = int(rois[r, 0])              # truncated, as C's cast
        x1, y1, x2, y2 = (_c_round(v) for v in rois[r, 1:])
        left, top = x1 * scale - 0.5, y1 * scale - 0.5
        roi_w = max((x2 + 1) * scale - 0.5 - left, 0.1)
        roi_h = max((y2 + 1) * scale - 0.5 - top, 0.1)
        bin_w, bin_h = roi_w / pooled_w, roi_h / pooled_h
        for c in range(c_n):
            plane = x[img, c]
            for ph in range(pooled_h):
                for pw in range(pooled_w):
                    tx = ty = 0.0
                    if not no_trans:
                        part_h = int(math.floor(np.float32(ph) / np.float32(pooled_h) * np.float32(part_size)))
                        part_w = int(math.floor(np.float32(pw) / np.float32(pooled_w) * np.float32(part_size)))
                        tx = trans[r, 0, part_h, part_w] * trans_std
                        ty = trans[r, 1, part_h, part_w] * trans_std
                    wstart = pw * bin_w + left + tx * roi_w
                    hstart = ph * bin_h + top + ty * roi_h
                    total, kept = 0.0, 0
                    for i in range(spp):
                        for j in range(spp):
                            w = wstart + j * bin_w / spp
                            h = hstart + i * bin_h / spp
                            if w < -0.5 or w > w_n - 0.5 or h < -0.5 or h > h_n - 0.5:
                                continue
                            w = min(max(w, 0.0), w_n - 1.0)
                            h = min(max(h, 0.0), h_n - 1.0)
                            h0, h1, w0, w1 = math.floor(h), math.ceil(h), math.floor(w), math.ceil(w)
                            dh, dw = h - h0, w - w0
                            total += ((1 - dw) * (1 - dh) * plane[h0, w0] + (1 - dw) * dh * plane[h1, w0]
                                      + dw * (1 - dh) * plane[h0, w1] + dw * dh * plane[h1, w1])
                            kept += 1
                    out[r, c, ph, pw] = total / kept if kept else 0.0
                    count[r, c, ph, pw] = kept
    return out, count


# (no_trans, part_size, pooled_h, pooled_w, sample_per_part, spatial_scale, trans_std)
CASES = [
    (False, 3, 3, 3, 2, 1.0, 0.3),
    (True, 3, 3, 3, 2, 1.0, 0.3),
    (False, 2, 2, 3, 3, 0.8, 0.2),      # parts coarser than the bins, a scale
    (False, 1, 2, 2, 1, 0.5, 1.0),      # one part, one sample, large offsets
    (True, 1, 4, 3, 3, 1.3, 0.1),
]


def _inputs(params, seed=0, dtype="float64"):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 3, 6, 7))
    # corners away from halves (rounded: a jump there); a box partly outside
    # the image (samples dropped), a tiny one, one covering the image
    rois = np.array([[0, 1.2, 0.9, 4.1, 5.2], [1, -2.1, 2.0, 3.3, 7.8], [1, 0.0, 0.0, 6.0, 5.0],
                     [0, 3.0, 3.0, 3.0, 3.0]])
    ph, pw = params[2], params[3]
    trans = rng.uniform(-1, 1, (5, 2, ph, pw))
    return x.astype(dtype), rois.astype(dtype), trans.astype(dtype)


def _f(x, rois, trans, params):
    return F.deformable_psroi_pooling(x, rois, trans, *params)


@pytest.mark.parametrize("params", CASES)
def test_values_match_the_loop_reference(params):
    x, rois, trans = _inputs(params)
    want, want_count = reference(x, rois, trans, *params)
    got = _f(gc.tensor(x), gc.tensor(rois), gc.tensor(trans), params)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    out, count = apply(DeformablePSROIPooling(*params), gc.tensor(x), gc.tensor(rois), gc.tensor(trans))
    np.testing.assert_array_equal(count.numpy(), want_count)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=1e-12)
    # float32, MegEngine's dtype: the same values to float32 precision
    got32 = _f(*(gc.tensor(a.astype("float32")) for a in (x, rois, trans)), params)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32.numpy(), want, rtol=1e-4, atol=1e-4)


def test_samples_are_dropped_and_counted():
    # box 1 reaches past the image: some bins keep every sample, some a few,
    # some none (0 out); the kernel's counts agree with the reference's
    params = CASES[0]
    x, rois, trans = _inputs(params)
    out, count = reference(x, rois, trans, *params)
    assert set(np.unique(count[1])) == {0, 1, 2, 4}
    assert not out[count == 0].any()
    _, got = apply(DeformablePSROIPooling(*params), *(gc.tensor(a) for a in (x, rois, trans)))
    np.testing.assert_array_equal(got.numpy(), count)


def test_hand_computed_values():
    # a 4 x 4 ramp, box (0, 0)-(3, 3): left = top = -0.5, size 4, bins 2 wide;
    # one sample per bin at -0.5 (clamped to 0) and 1.5 on each axis
    x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
    rois = gc.tensor([[0., 0, 0, 3, 3]])
    y = F.deformable_psroi_pooling(x, rois, F.zeros((1, 2, 2, 2)), False, 2, 2, 2, 1, 1.0)
    np.testing.assert_array_equal(y.numpy(), [[[[0, 1.5], [6, 7.5]]]])
    # trans 2.5 in x moves every sample 2.5 * trans_std 0.1 * width 4 = 1 pixel
    # right, before the clamp: columns -0.5 + 1 and 1.5 + 1, rows 0 and 1.5
    trans = np.zeros((1, 2, 2, 2), "float32")
    trans[0, 0] = 2.5
    y = F.deformable_psroi_pooling(x, rois, gc.tensor(trans), False, 2, 2, 2, 1, 1.0)
    np.testing.assert_allclose(y.numpy(), [[[[0.5, 2.5], [6.5, 8.5]]]], rtol=1e-6)
    # no_trans ignores trans
    y = F.deformable_psroi_pooling(x, rois, gc.tensor(trans), True, 2, 2, 2, 1, 1.0)
    np.testing.assert_array_equal(y.numpy(), [[[[0, 1.5], [6, 7.5]]]])


def _numeric_grad(fn, a, eps=1e-6):
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        hi, lo = a.copy(), a.copy()
        hi[i] += eps
        lo[i] -= eps
        g[i] = (fn(hi) - fn(lo)) / (2 * eps)
    return g


@pytest.mark.parametrize("params", CASES[:4])
def test_gradients_match_finite_differences_of_the_reference(params):
    x, rois, trans = _inputs(params)
    x, rois, trans = x[:, :2, :5, :5], rois[:3], trans[:3]     # small: the reference is a loop
    weight = np.random.default_rng(1).standard_normal((3, 2) + params[2:4])
    xt, tt, rt = gc.tensor(x), gc.tensor(trans), gc.tensor(rois)
    gm = gc.GradManager().attach([xt, tt, rt])
    with gm:
        y = _f(xt, rt, tt, params)
        gm.backward((y * gc.tensor(weight)).sum())
    loss = lambda xx, tr: float((reference(xx, rois, tr, *params)[0] * weight).sum())
    np.testing.assert_allclose(xt.grad.numpy(), _numeric_grad(lambda a: loss(a, trans), x), atol=1e-7)
    want_t = _numeric_grad(lambda a: loss(x, a), trans)
    np.testing.assert_allclose(tt.grad.numpy(), want_t, rtol=1e-6, atol=1e-7)
    if params[0]:
        assert not tt.grad.numpy().any()            # no_trans: the offsets are not read
    else:
        assert np.abs(want_t).max() > 1e-3          # the check compares something
    assert rt.grad is None                          # boxes are positions, as MegEngine's backward


@pytest.mark.parametrize("params", CASES)
def test_cuda_kernels_match_cpu(params):
    # forward and both gradients on cuda (the host emulator without a GPU)
    with cuda_for_checks():
        for dtype, tol in (("float64", 1e-12), ("float32", 1e-5)):
            arrays = _inputs(params, seed=2, dtype=dtype)
            g = np.random.default_rng(3).standard_normal((4, 3) + params[2:4]).astype(dtype)
            results = []
            for device in ("cpu", "cuda"):
                x, rois, trans = (gc.tensor(a, device=device) for a in arrays)
                out, count = apply(DeformablePSROIPooling(*params), x, rois, trans)
                gx, gt = apply(DeformablePSROIPoolingBackward(*params), x, rois, trans, gc.tensor(g, device=device))
                results.append([t.numpy() for t in (out, count, gx, gt)])
            for cpu, cuda in zip(*results):
                np.testing.assert_allclose(cuda, cpu, rtol=tol, atol=tol)


def test_check_op(check_op):
    check_op(DeformablePSROIPooling)
    check_op(DeformablePSROIPoolingBackward)


def test_megengine_test_call():
    # MegEngine's test_functional.py::test_deformable_psroi_pooling
    rng = np.random.default_rng(0)
    inp = rng.random((1, 256, 64, 64)).astype("float32")
    rois = rng.random((1, 5)).astype("float32")
    trans = rng.random((24, 2, 7, 7)).astype("float32")
    y = F.deformable_psroi_pooling(gc.tensor(inp), gc.tensor(rois), gc.tensor(trans), False, 7, 7, 7, 4,
                                   1.0 / 64, 0.1)
    assert y.shape == (1, 256, 7, 7) and y.dtype == np.float32
    # spot check against the reference: image 0.65 is image 0 (truncated), the corners round to 0 or 1
    want, _ = reference(inp[:, :4].astype("float64"), rois.astype("float64"), trans.astype("float64"),
                        False, 7, 7, 7, 4, 1.0 / 64, 0.1)
    np.testing.assert_allclose(y.numpy()[:, :4], want, rtol=1e-5, atol=1e-6)


def test_module_and_functional_names():
    params = CASES[2]
    x, rois, trans = (gc.tensor(a) for a in _inputs(params))
    pool = M.DeformablePSROIPooling(*params)
    assert (pool.no_trans, pool.part_size, pool.pooled_h, pool.pooled_w, pool.sample_per_part,
            pool.spatial_scale, pool.trans_std) == params
    np.testing.assert_array_equal(pool(x, rois, trans).numpy(), F.nn.deformable_psroi_pooling(x, rois, trans,
                                                                                             *params).numpy())
    assert M.DeformablePSROIPooling(True, 1, 2, 2, 1, 1.0).trans_std == 0.1      # MegEngine's default
    assert F.deformable_psroi_pooling is F.nn.deformable_psroi_pooling


def test_channels_are_not_grouped_by_bin():
    # MegEngine's op pools channel c from channel c (out is (R, C, PH, PW)):
    # C need not be a multiple of the bins, unlike the R-FCN paper's layout
    params = (False, 3, 3, 3, 2, 1.0, 0.3)
    x, rois, trans = _inputs(params)
    y = _f(gc.tensor(x[:, :2]), gc.tensor(rois), gc.tensor(trans), params)
    assert y.shape == (4, 2, 3, 3)


def test_integer_rois_are_taken_as_inps_dtype():
    x, rois, trans = _inputs(CASES[0])
    r = np.round(rois).astype("int32")
    got = _f(gc.tensor(x), gc.tensor(r), gc.tensor(trans), CASES[0])
    np.testing.assert_allclose(got.numpy(), reference(x, r.astype("float64"), trans, *CASES[0])[0], rtol=1e-12)


def test_second_order_is_refused_naming_the_op():
    x, rois, trans = (gc.tensor(a) for a in _inputs(CASES[0]))
    outer, inner = gc.GradManager().attach([x]), gc.GradManager().attach([x])
    with pytest.raises(NotDifferentiableError, match="DeformablePSROIPoolingBackward"):
        with outer:
            with inner:
                inner.backward((_f(x, rois, trans, CASES[0]) ** 2).sum())
            outer.backward((x.grad ** 2).sum())


@pytest.mark.parametrize("shapes, message", [
    (((2, 3, 6, 7), (4, 4), (5, 2, 3, 3)), "rois must be \\(R, 5\\)"),
    (((2, 3, 6, 7), (4, 5, 1), (5, 2, 3, 3)), "rois must be 2-D"),
    (((3, 6, 7), (4, 5), (5, 2, 3, 3)), "inp must be 4-D"),
    (((2, 3, 6, 7), (4, 5), (5, 2, 3, 2)), "trans must be \\(R, 2, pooled_h, pooled_w\\)"),
    (((2, 3, 6, 7), (4, 5), (5, 1, 3, 3)), "trans must be \\(R, 2, pooled_h, pooled_w\\)"),
    (((2, 3, 6, 7), (4, 5), (3, 2, 3, 3)), "trans has offsets for 3 boxes, rois has 4"),
    (((2, 3, 6, 7), (4, 5), (5, 2, 3)), "trans must be 4-D"),
])
def test_bad_shapes_are_refused_naming_the_op_and_shapes(shapes, message):
    x, rois, trans = (gc.tensor(np.zeros(s)) for s in shapes)
    with pytest.raises(OpError, match=message) as info:
        F.deformable_psroi_pooling(x, rois, trans, False, 3, 3, 3, 2, 1.0)
    assert "DeformablePSROIPooling" in str(info.value) and str(shapes[1]) in str(info.value)


def test_bad_arguments_are_refused():
    x, rois, trans = (gc.tensor(a) for a in _inputs(CASES[0]))
    with pytest.raises(ValueError, match="DeformablePSROIPooling: part_size \\(4\\) must be at most pooled_h"):
        F.deformable_psroi_pooling(x, rois, trans, False, 4, 3, 3, 2, 1.0)
    # without offsets the parts are not used
    assert F.deformable_psroi_pooling(x, rois, trans, True, 4, 3, 3, 2, 1.0).shape == (4, 3, 3, 3)
    with pytest.raises(ValueError, match="must be positive"):
        F.deformable_psroi_pooling(x, rois, trans, False, 3, 3, 3, 0, 1.0)
    with pytest.raises(TypeError, match="DeformablePSROIPooling: pooled_h must be an int"):
        F.deformable_psroi_pooling(x, rois, trans, False, 3, 2.5, 3, 2, 1.0)
    with pytest.raises(OpError, match="image index is outside \\[0, 2\\)"):
        F.deformable_psroi_pooling(x, gc.tensor([[2., 0, 0, 1, 1]]), trans, False, 3, 3, 3, 2, 1.0)
    with pytest.raises(OpError, match="needs floating-point inp"):
        F.deformable_psroi_pooling(gc.tensor(np.zeros((1, 1, 4, 4), "int32")), rois, trans, True, 3, 3, 3, 2, 1.0)
