"""The functional composites of tests/test_functional_more.py on cuda: each
is made of ops that have CUDA kernels, so outputs, first and second order
gradients on cuda are the cpu's, and everything stays on the device."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F


def _x(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_layer_norm(cuda, matches_cpu):
    matches_cpu(lambda x, w, b: F.nn.layer_norm(x, (3, 4), True, w, b), [_x((2, 3, 4)), _x((3, 4), 1), _x((3, 4), 2)],
                rtol=1e-3, atol=1e-4)
    matches_cpu(lambda x: F.nn.layer_norm(x, 4, affine=False), [_x((3, 4), 3)], rtol=1e-3, atol=1e-4)


def test_group_norm(cuda, matches_cpu):
    matches_cpu(lambda x, w, b: F.nn.group_norm(x, 2, True, w, b), [_x((2, 4, 3)), _x(4, 1), _x(4, 2)],
                rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate"])
def test_pad(cuda, matches_cpu, mode):
    matches_cpu(lambda x: F.sin(F.nn.pad(x, ((1, 0), (2, 3)), mode)), [_x((3, 4))])


def test_pad_keeps_the_device(cuda):
    out = F.nn.pad(gc.Tensor(_x((2, 3)), device="cuda"), ((1, 1), (0, 2)), constant_value=1.5)
    assert out.device == "cuda"
    np.testing.assert_array_equal(out.numpy(), np.pad(_x((2, 3)), ((1, 1), (0, 2)), constant_values=1.5))


@pytest.mark.parametrize("fn", [F.nn.adaptive_avg_pool2d, F.nn.adaptive_max_pool2d], ids=["avg", "max"])
@pytest.mark.parametrize("oshp", [(2, 3), 3])
def test_adaptive_pools(cuda, matches_cpu, fn, oshp):
    matches_cpu(lambda x: fn(x, oshp), [_x((2, 2, 6, 7))])


def test_conv1d(cuda, matches_cpu):
    matches_cpu(lambda x, w, b: F.nn.conv1d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
                [_x((2, 4, 9)), _x((6, 2, 3), 1), _x(6, 2)], rtol=1e-3, atol=1e-4)


def test_pixel_shuffle(cuda, matches_cpu):
    matches_cpu(lambda x: F.nn.pixel_shuffle(x, 2), [_x((2, 8, 2, 3))])


def test_topk_accuracy(cuda):
    logits, target = _x((10, 5)), np.random.default_rng(1).integers(0, 5, 10).astype(np.int32)
    on = F.topk_accuracy(gc.Tensor(logits, device="cuda"), gc.Tensor(target, device="cuda"), (1, 2))
    ref = F.topk_accuracy(gc.Tensor(logits), gc.Tensor(target), (1, 2))
    assert [a.device for a in on] == ["cuda", "cuda"]
    np.testing.assert_allclose([a.item() for a in on], [a.item() for a in ref])


def test_argsort(cuda):
    x = np.random.default_rng(0).permutation(12).reshape(3, 4).astype(np.float32)
    for descending in (False, True):
        out = F.argsort(gc.Tensor(x, device="cuda"), descending)
        assert out.device == "cuda" and out.dtype == np.int32
        np.testing.assert_array_equal(out.numpy(), np.argsort(-x if descending else x, 1))


@pytest.mark.parametrize("shape, k", [((4,), 1), ((3, 5), -1), ((3, 3), 0)])
def test_diag(cuda, matches_cpu, shape, k):
    matches_cpu(lambda x: F.diag(x, k) ** 2, [_x(shape)])


def test_logaddexp(cuda, matches_cpu):
    matches_cpu(F.logaddexp, [_x((3, 4)) * 4, _x((4,), 1) * 4])


def test_atan2(cuda, matches_cpu):
    y, x = _x((20,)), _x((20,), 1)
    y[:3], x[3:6] = 0.0, 0.0
    matches_cpu(F.atan2, [y, x], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("indexing", ["xy", "ij"])
def test_meshgrid(cuda, matches_cpu, indexing):
    matches_cpu(lambda a, b, c: F.stack(F.meshgrid(a, b, c, indexing=indexing)) ** 2,
                [_x(3), _x(2, 1), _x(4, 2)])


def test_cond_take(cuda, matches_cpu):
    mask = np.random.default_rng(3).random((3, 4)) < 0.5
    matches_cpu(lambda m, x: F.cond_take(m, x)[0] ** 2, [mask, _x((3, 4))])
    v, i = F.cond_take(gc.Tensor(mask, device="cuda"), gc.Tensor(_x((3, 4)), device="cuda"))
    assert v.device == i.device == "cuda"
    np.testing.assert_array_equal(i.numpy(), np.flatnonzero(mask))


def test_swapaxes(cuda, matches_cpu):
    matches_cpu(lambda x: F.swapaxes(x, 0, 2) ** 2, [_x((2, 3, 4))])


def test_a_training_step_with_the_newer_modules_matches_the_cpu(cuda):
    """GroupNorm, SiLU, adaptive pooling, LayerNorm, GELU, M.init, AdamW,
    MultiStepLR and clip_grad_norm on the device, against the CPU."""
    import gradcore.module as M
    import gradcore.optimizer as optim
    from gradcore.autodiff import GradManager

    def run(device):
        gc.random.seed(0)
        net = M.Sequential(M.Conv2d(1, 4, 3, padding=1), M.GroupNorm(2, 4), M.SiLU(), M.AdaptiveAvgPool2d(2),
                           M.Flatten(), M.Linear(16, 8), M.LayerNorm(8), M.GELU(), M.Linear(8, 3))
        M.init.xavier_uniform_(net[5].weight)
        net.to(device)
        opt = optim.AdamW(net.parameters(), lr=1e-2)
        sched = optim.MultiStepLR(opt, [2], 0.5)
        gm = GradManager().attach(net.parameters())
        data = np.random.default_rng(0).standard_normal((4, 1, 6, 6)).astype("float32")
        x, y = gc.Tensor(data, device=device), gc.Tensor(np.array([0, 1, 2, 1]), device=device)
        losses = []
        for _ in range(3):
            with gm:
                loss = F.cross_entropy(net(x), y, label_smooth=0.1)
                gm.backward(loss)
            optim.clip_grad_norm(net.parameters(), 1.0)
            opt.step().clear_grad()
            sched.step()
            losses.append(loss.item())
        assert all(p.device == device for p in net.parameters())
        return losses, [p.numpy() for p in net.parameters()]

    cpu_losses, cpu_params = run("cpu")
    dev_losses, dev_params = run("cuda")
    np.testing.assert_allclose(dev_losses, cpu_losses, rtol=1e-5)
    for a, b in zip(dev_params, cpu_params):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("border", ["replicate", "constant", "reflect_101", "wrap"])
def test_remap_and_warp_perspective(cuda, matches_cpu, border):
    rng = np.random.default_rng(4)
    xy = (np.floor(rng.uniform(-3, 6, (2, 3, 4, 2))) + rng.uniform(0.1, 0.9, (2, 3, 4, 2))).astype(np.float32)
    matches_cpu(lambda x, m: F.vision.remap(x, m, border, 0.5), [_x((2, 2, 3, 4)), xy], second_order=False)
    mat = (np.eye(3) + rng.uniform(-0.05, 0.05, (2, 3, 3))).astype(np.float32)
    matches_cpu(lambda x, m: F.vision.warp_perspective(x, m, (3, 5), border_mode=border), [_x((2, 2, 4, 4)), mat],
                second_order=False)


@pytest.mark.parametrize("mode", ["average", "max"])
def test_roi_align_and_pooling(cuda, matches_cpu, mode):
    rois = np.array([[0, 0.5, 0.2, 3.1, 2.9], [1, -1.0, 1.0, 2.0, 5.0], [1, 2.0, 0.0, 3.5, 1.5]], np.float32)
    matches_cpu(lambda x: F.vision.roi_align(x, gc.tensor(rois), (2, 3), mode), [_x((2, 2, 4, 5))],
                second_order=False)
    matches_cpu(lambda x: F.vision.roi_pooling(x, gc.tensor(rois), (2, 2), "max" if mode == "max" else "average"),
                [_x((2, 2, 4, 5))], second_order=False)


@pytest.mark.parametrize("equation, shapes", [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ii->i", [(3, 3)]),
                                              ("...ij,jk", [(2, 3, 4), (4, 2)])])
def test_einsum(cuda, matches_cpu, equation, shapes):
    matches_cpu(lambda *xs: F.einsum(equation, *xs), [_x(s, k) for k, s in enumerate(shapes)], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8])
def test_shifts_stay_on_the_device(cuda, dtype):
    rng = np.random.default_rng(4)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, size=64, dtype=dtype, endpoint=True)
    y = rng.integers(0, info.bits + 3, size=64).astype(dtype)
    gx, gy = gc.Tensor(x, device="cuda"), gc.Tensor(y, device="cuda")
    left, right = F.left_shift(gx, gy), gx >> gy
    assert left.device == "cuda" and right.device == "cuda"
    np.testing.assert_array_equal(left.numpy(), np.left_shift(x, y))
    np.testing.assert_array_equal(right.numpy(), np.right_shift(x, y))


def test_local_conv2d(cuda, matches_cpu):
    matches_cpu(lambda x, w: F.local_conv2d(x, w, None, 1, 1), [_x((2, 4, 3, 3)), _x((2, 4, 4, 2, 2, 2, 3), 1)],
                rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["RGB2GRAY", "YUV2RGB", "RGB2BGR"])
def test_cvt_color(cuda, matches_cpu, mode):
    matches_cpu(lambda x: F.vision.cvt_color(x, mode), [np.abs(_x((2, 3, 4, 3)))], rtol=1e-5, atol=1e-6)


def test_deformable_conv2d(cuda, matches_cpu):
    rng = np.random.default_rng(4)
    offset = rng.uniform(-2, 2, (1, 2 * 2 * 4, 6, 5)).astype(np.float32)      # 2 deformable groups, 2x2 kernel
    mask = rng.uniform(0, 1, (1, 2 * 4, 6, 5)).astype(np.float32)
    matches_cpu(lambda x, w, o, m: F.nn.deformable_conv2d(x, w, o, m, None, 1, (1, 0), 1, 2),
                [_x((1, 4, 5, 6)), _x((4, 2, 2, 2), 1), offset, mask], rtol=1e-3, atol=1e-4)


def test_multi_head_attention(cuda, matches_cpu):
    """MegEngine's flat io_weight_bias with bias_k/bias_v, a zero key, both
    masks, per-head weights: outputs, first and second order on cuda."""
    E, H = 4, 2
    kpm = np.array([[False, True, False], [False, False, False]])

    def f(q, k, v, w, bk, bv, am):
        return F.nn.multi_head_attention(q, k, v, E, H, 0.0, 0.0, w, qbias=True, kbias=True, vbias=True,
                                         obias=True, bias_k=bk, bias_v=bv, add_zero_attn=True, attn_mask=am,
                                         key_padding_mask=gc.Tensor(kpm, device=q.device), need_weights=True)
    matches_cpu(f, [_x((2, 2, E)), _x((2, 3, E), 1), _x((2, 3, E), 2), _x(4 * E * E + 4 * E, 3) * 0.5,
                    _x((1, 1, E), 4), _x((1, 1, E), 5), _x((2, 3), 6)], rtol=1e-3, atol=1e-4)
