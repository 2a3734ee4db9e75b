"""MegEngine's signatures, defaults and exception types where gradcore had
its own (found by comparing with MegEngine's sources function by
function): keyword calls and MegEngine's own idioms work as written there."""
import inspect

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim

# the positional parameters (and defaults) as megengine.functional declares them
SIGNATURES = {
    F.hswish: "(x)", F.hsigmoid: "(x)", F.relu6: "(x)", F.prelu: "(x, y)",
    F.softplus: "(inp)", F.logsigmoid: "(inp)",
    F.sort: "(inp, descending=False, dim=-1)",
    F.topk: "(inp, k, descending=True, kth_only=False, no_sort=False)",
    F.nn.ctc_loss: "(pred, pred_lengths, label, label_lengths, blank=0, reduction='mean')",
}


@pytest.mark.parametrize("fn, want", list(SIGNATURES.items()), ids=lambda v: getattr(v, "__name__", ""))
def test_signatures_are_megengines(fn, want):
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    got = "(" + ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params) + ")"
    assert got.startswith(want[:-1]), got


def test_topk_gives_the_largest_by_default():
    x = gc.tensor([2.0, 4, 6, 8, 7, 5, 3, 1])
    values, indices = F.topk(x, 3)
    assert values.numpy().tolist() == [8, 7, 6] and indices.numpy().tolist() == [3, 4, 2]
    assert F.topk(x, 2, descending=False)[0].numpy().tolist() == [1, 2]


def test_sort_takes_dim_and_keyword_calls_work():
    x = gc.tensor([[3.0, 1.0], [0.0, 2.0]])
    assert F.sort(x, dim=0)[0].numpy().tolist() == [[0.0, 1.0], [3.0, 2.0]]
    assert F.sort(x, axis=0)[0].numpy().tolist() == [[0.0, 1.0], [3.0, 2.0]]
    assert F.softplus(inp=gc.tensor([0.0])).numpy()[0] == pytest.approx(np.log(2))
    assert F.prelu(x=gc.tensor([-2.0, 3.0]), y=gc.tensor([0.25])).numpy().tolist() == [-0.5, 3.0]
    assert F.hswish(x=gc.tensor([4.0])).numpy().tolist() == [4.0]


def test_cross_entropy_label_smooth_none_is_none():
    pred, label = gc.tensor([[1.0, 2.0, 0.5]]), gc.tensor([1])
    assert F.nn.cross_entropy(pred, label, label_smooth=None).item() == F.nn.cross_entropy(pred, label).item()


def test_tensor_is_the_class_and_has_megengines_methods():
    x = gc.tensor([1.0, 2.0])
    assert gc.tensor is gc.Tensor and isinstance(x, gc.tensor)
    assert x.tolist() == [1.0, 2.0] and x.format == "default"
    w = gc.Parameter([1.0, 2.0])
    w.set_value([3, 4])
    assert w.dtype == np.float32 and w.numpy().tolist() == [3.0, 4.0] and isinstance(w, gc.Parameter)
    w.reset_zero()
    assert w.numpy().tolist() == [0.0, 0.0]


def test_linear_takes_compute_mode_and_fan_in_skips_the_groups_of_6d_weights():
    assert M.Linear(3, 4, compute_mode="float32").compute_mode == "float32"
    with pytest.raises(ValueError, match="compute_mode"):
        M.Linear(3, 4, compute_mode="fast")
    w = gc.tensor(np.zeros((2, 2, 1, 5, 7, 9), np.float32))      # a grouped conv3d weight
    assert M.init.calculate_fan_in_and_fan_out(w) == (315, 630)


@pytest.mark.parametrize("call", [
    lambda: F.nn.dropout(gc.tensor([1.0]), 1.5),
    lambda: optim.SGD(M.Linear(2, 2).parameters(), lr=-1.0),
    lambda: F.nn.interpolate(gc.tensor(np.ones((1, 1, 4, 4))), size=(8, 8), mode="linear"),
    lambda: F.nn.cross_entropy(gc.tensor(np.ones((2, 3))), gc.tensor(np.zeros((2, 3), np.int32))),
], ids=["dropout", "sgd", "interpolate", "cross_entropy"])
def test_argument_errors_are_megengines_assertion_errors_and_value_errors(call):
    with pytest.raises(AssertionError):
        call()
    with pytest.raises(ValueError):
        call()


def test_non_zero_and_one_argument_where():
    c = gc.tensor(np.array([[1, 0, 2], [0, 0, 3]]))
    assert F.non_zero(c).numpy().tolist() == [[0, 0], [0, 2], [1, 2]]
    rows, cols = F.non_zero(c, as_tuple=True)
    assert rows.dtype == np.int32 and rows.numpy().tolist() == [0, 0, 1] and cols.numpy().tolist() == [0, 2, 2]
    (i,) = F.where(gc.tensor([True, False, True]))
    assert i.numpy().tolist() == [0, 2]


def test_cross_matches_numpy_and_its_gradient_is_right():
    from gradcore.testing import gradcheck
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 3, 2)), rng.standard_normal((4, 3, 2))
    np.testing.assert_allclose(F.cross(gc.tensor(a), gc.tensor(b), axis=1).numpy(), np.cross(a, b, axis=1))
    a2, b3 = rng.standard_normal((5, 2)), rng.standard_normal((5, 3))
    want = np.cross(np.concatenate([a2, np.zeros((5, 1))], 1), b3)
    np.testing.assert_allclose(F.cross(gc.tensor(a2), gc.tensor(b3)).numpy(), want)
    assert gradcheck(lambda x, y: F.cross(x, y, axisa=0, axisb=1, axisc=0), [gc.tensor(rng.standard_normal((3, 4))),
                                                                             gc.tensor(rng.standard_normal((4, 3)))])


def test_instance_and_local_response_norm_match_torch():
    import torch
    from gradcore.testing import gradcheck
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 3, 3))
    np.testing.assert_allclose(F.nn.instance_norm(gc.tensor(x), False).numpy(),
                               torch.nn.functional.instance_norm(torch.tensor(x)).numpy(), rtol=1e-10, atol=1e-12)
    w, b = rng.standard_normal(6), rng.standard_normal(6)
    np.testing.assert_allclose(F.nn.instance_norm(gc.tensor(x), True, gc.tensor(w), gc.tensor(b)).numpy(),
                               torch.nn.functional.instance_norm(torch.tensor(x), weight=torch.tensor(w),
                                                                 bias=torch.tensor(b)).numpy(), rtol=1e-10, atol=1e-12)
    # MegEngine's alpha is PyTorch's divided by the window's size
    got = F.nn.local_response_norm(gc.tensor(x), 5, 2.0, 1e-2, 0.75).numpy()
    want = torch.nn.functional.local_response_norm(torch.tensor(x), 5, alpha=5e-2, beta=0.75, k=2.0).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert gradcheck(lambda t: F.nn.local_response_norm(t, 3, 1.0, 0.5, 0.75), [gc.tensor(x[:1, :4])])
    y = M.LocalResponseNorm(kernel_size=3, k=1.0, alpha=1e-4, beta=0.75)(gc.tensor(np.arange(25.0).reshape(1, 1, 5, 5)))
    assert y.numpy()[0, 0, 0, 1] == pytest.approx(0.999925, rel=1e-6)     # MegEngine's docstring value


def test_vision_flip_and_rot90_are_megengines_nhwc():
    x = gc.tensor(np.arange(4.0).reshape(1, 2, 2, 1))
    assert F.vision.flip(x).numpy().reshape(-1).tolist() == [3.0, 2.0, 1.0, 0.0]
    assert F.vision.flip(x, vertical=False).numpy().reshape(-1).tolist() == [1.0, 0.0, 3.0, 2.0]
    assert F.vision.rot90(x).numpy().reshape(-1).tolist() == [2.0, 0.0, 3.0, 1.0]
    img = np.random.default_rng(2).standard_normal((2, 3, 5, 4))
    np.testing.assert_array_equal(F.vision.rot90(gc.tensor(img)).numpy(), np.rot90(img, -1, axes=(1, 2)))
    np.testing.assert_array_equal(F.vision.rot90(gc.tensor(img), False).numpy(), np.rot90(img, 1, axes=(1, 2)))


def test_megengines_fused_and_helper_modules():
    rng = np.random.default_rng(3)
    x = gc.tensor(rng.standard_normal((2, 8, 5, 5)))
    up = M.ConvTransposeRelu2d(8, 4, 3)
    np.testing.assert_allclose(up(x).numpy(), F.relu(M.ConvTranspose2d.forward(up, x)).numpy())
    for cls, relu in ((M.ConvTransposeBn2d, False), (M.ConvTransposeBnRelu2d, True)):
        block = cls(8, 4, 3, stride=2)
        want = block.bn(block.conv_transpose2d(x))
        np.testing.assert_allclose(block(x).numpy(), (F.relu(want) if relu else want).numpy(), rtol=1e-6)
    assert sorted(M.ConvTransposeBn2d(8, 4, 3).state_dict()) == [
        "bn.bias", "bn.running_mean", "bn.running_var", "bn.weight", "conv_transpose2d.bias",
        "conv_transpose2d.weight"]
    y = gc.tensor(rng.standard_normal((6, 4)))
    lr = M.LinearRelu(4, 3)
    np.testing.assert_allclose(lr(y).numpy(), F.relu(M.Linear.forward(lr, y)).numpy())
    for cls, relu in ((M.LinearBn1d, False), (M.LinearBnRelu1d, True)):
        block = cls(4, 3)
        want = block.bn(block.linear(y))
        np.testing.assert_allclose(block(y).numpy(), (F.relu(want) if relu else want).numpy(), rtol=1e-6)
    # MegEngine's state_dict names, its unused block bias included
    assert sorted(M.LinearBn1d(4, 3).state_dict()) == ["bias", "bn.bias", "bn.running_mean", "bn.running_var",
                                                      "bn.weight", "linear.bias", "linear.weight"]
    a, b = gc.tensor([1.0, -3.0]), gc.tensor([2.0, 1.0])
    assert M.Elemwise("add")(a, b).numpy().tolist() == [3.0, -2.0]
    assert M.Elemwise("FUSE_ADD_RELU")(a, b).numpy().tolist() == [3.0, 0.0]
    np.testing.assert_allclose(M.Elemwise("h_swish")(a).numpy(), F.hswish(a).numpy())    # MegEngine's mode names
    np.testing.assert_allclose(M.Elemwise("TRUE_DIV")(a, b).numpy(), (a / b).numpy())
    with pytest.raises(ValueError, match="Elemwise: no elementwise function named 'frobnicate'"):
        M.Elemwise("frobnicate")
    assert M.Concat()([a, b], axis=0).numpy().tolist() == [1.0, -3.0, 2.0, 1.0]


def test_general_norm_is_layer_norm_and_instance_norm_by_its_axes():
    import torch
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 4, 5))
    w, b = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    got = F.nn.general_norm(gc.tensor(x), (2, 3), True, gc.tensor(w), gc.tensor(b)).numpy()
    want = torch.nn.functional.layer_norm(torch.tensor(x), (4, 5), torch.tensor(w), torch.tensor(b)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(F.nn.general_norm(gc.tensor(x), (2, 3), affine=False).numpy(),
                               F.nn.instance_norm(gc.tensor(x), False).numpy(), rtol=1e-10, atol=1e-12)
    m = M.GeneralNorm((3,), 1)
    assert sorted(m.state_dict()) == ["bias", "weight"] and m.weight.shape == (3,)
    np.testing.assert_allclose(m(gc.tensor(x)).numpy(), F.nn.general_norm(gc.tensor(x), 1, False).numpy(),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="general_norm: weight and bias must have the normalised axes' shape"):
        F.nn.general_norm(gc.tensor(x), 1, True, gc.tensor(np.ones(4)), gc.tensor(np.ones(4)))


def test_nms_keeps_megengines_boxes():
    x = np.zeros((100, 4))
    np.random.seed(42)
    x[:, :2] = np.random.rand(100, 2) * 20
    x[:, 2:] = np.random.rand(100, 2) * 20 + 100
    scores = gc.tensor(np.random.rand(100))
    assert F.vision.nms(gc.tensor(x), scores, iou_thresh=0.7).numpy().tolist() == [75, 69]   # MegEngine's example
    rng = np.random.default_rng(5)
    corners = rng.uniform(0, 50, (60, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(5, 30, (60, 2))], 1)
    s = rng.random(60)

    def reference(thresh):          # the definition, box by box
        kept = []
        for i in np.argsort(-s, kind="stable"):
            ok = True
            for j in kept:
                w = max(0.0, min(boxes[i, 2], boxes[j, 2]) - max(boxes[i, 0], boxes[j, 0]))
                h = max(0.0, min(boxes[i, 3], boxes[j, 3]) - max(boxes[i, 1], boxes[j, 1]))
                area = lambda k: (boxes[k, 2] - boxes[k, 0]) * (boxes[k, 3] - boxes[k, 1])
                if w * h / (area(i) + area(j) - w * h) > thresh:
                    ok = False
                    break
            if ok:
                kept.append(int(i))
        return kept
    for thresh in (0.1, 0.3, 0.6):
        got = F.vision.nms(gc.tensor(boxes), gc.tensor(s), thresh)
        assert got.dtype == np.int32 and got.numpy().tolist() == reference(thresh)
    assert F.vision.nms(gc.tensor(boxes), gc.tensor(s), 0.3, max_output=3).numpy().tolist() == reference(0.3)[:3]
    with pytest.raises(ValueError, match=r"nms: expected boxes \(N, 4\)"):
        F.vision.nms(gc.tensor(boxes[:, :3]), gc.tensor(s), 0.5)


def test_matinv_values_and_gradients_match_torch():
    import torch
    rng = np.random.default_rng(6)
    a = rng.standard_normal((2, 3, 4, 4)) + 4 * np.eye(4)
    np.testing.assert_allclose(F.matinv(gc.tensor(a)).numpy(), np.linalg.inv(a), rtol=1e-12, atol=1e-14)
    x = gc.tensor(a)
    w = rng.standard_normal(a.shape)
    gm = gc.GradManager().attach([x])
    with gm:
        gm.backward(F.sum(F.matinv(x) * gc.tensor(w)))
    xt = torch.tensor(a, requires_grad=True)
    (torch.linalg.inv(xt) * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert F.matinv(gc.tensor([[1, 0], [1, 1]])).numpy().tolist() == [[1.0, 0.0], [-1.0, 1.0]]   # ints: float32
    with pytest.raises(ValueError, match="MatrixInverse: needs square matrices"):
        F.matinv(gc.tensor(np.ones((2, 3))))


@pytest.mark.parametrize("k, p, s, d", [(3, 1, 1, 1), ((2, 3), (0, 1), (2, 1), (1, 2)), (2, 0, 2, 1)])
def test_sliding_window_and_its_transpose_are_torchs_unfold_and_fold(k, p, s, d):
    import torch
    from gradcore.testing import gradcheck
    x = np.random.default_rng(7).standard_normal((2, 3, 7, 6))
    w = F.sliding_window(gc.tensor(x), k, p, s, d).numpy()
    u = torch.nn.functional.unfold(torch.tensor(x), k, d, p, s).numpy()        # (N, C * KH * KW, OH * OW)
    n, c, oh, ow, kh, kw = w.shape
    np.testing.assert_array_equal(w, u.reshape(n, c, kh, kw, oh, ow).transpose(0, 1, 4, 5, 2, 3))
    folded = F.sliding_window_transpose(gc.tensor(w), (7, 6), k, p, s, d).numpy()
    np.testing.assert_allclose(folded, torch.nn.functional.fold(torch.tensor(u), (7, 6), k, d, p, s).numpy(),
                               rtol=1e-12)
    assert gradcheck(lambda t: F.sliding_window(t, k, p, s, d), [gc.tensor(x[:1, :1])])
    assert gradcheck(lambda t: F.sliding_window_transpose(t, (7, 6), k, p, s, d), [gc.tensor(w[:1, :1])])
    with pytest.raises(ValueError, match="sliding_window_transpose: inp must be windows"):
        F.sliding_window_transpose(gc.tensor(w[..., :1]), (7, 6), k, p, s, d)


def test_top_level_device_helpers_logger_and_lazy_subpackages(monkeypatch):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import gradcore as mge; d = mge.data.DataLoader; "
                          "print(mge.distributed.is_distributed(), mge.get_default_device(), "
                          "mge.get_device_count('cpu') >= 1, mge.get_logger().name)"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "cpu", "True", "gradcore"], out.stderr
    assert gc.is_cuda_available() == gc.devices.is_cuda_available()
    with pytest.raises(ValueError, match="get_device_count: unknown device type 'tpu'"):
        gc.get_device_count("tpu")
    monkeypatch.setattr(gc.devices, "_default_device", "cpu")
    gc.set_default_device("cpu0")
    assert gc.get_default_device() == "cpu" and gc.tensor([1.0]).device == "cpu"


def test_default_device_places_new_tensors(emulated_cuda, monkeypatch):
    monkeypatch.setattr(gc.devices, "_default_device", "cpu")
    gc.set_default_device("gpu0")
    assert gc.tensor([1.0]).device == "cuda" and F.zeros((2,)).device == "cuda"
    assert gc.Tensor([1.0], device="cpu").device == "cpu"
    assert gc.get_device_count("gpu") >= 1


def test_item_with_an_index_math_floor_and_ceil_seed_keyword_and_attach_errors():
    import math
    t = gc.tensor([[1.5, -2.5], [3.0, 4.0]])
    assert t.item(1, 0) == 3.0 and gc.tensor([7]).item(0) == 7
    assert math.floor(t).numpy().tolist() == [[1.0, -3.0], [3.0, 4.0]]
    assert math.ceil(t).numpy().tolist() == [[2.0, -2.0], [3.0, 4.0]]
    gc.random.seed(seed=3)
    a = gc.random.normal(size=(2,)).numpy()
    gc.random.seed(3)
    assert gc.random.normal(size=(2,)).numpy().tolist() == a.tolist()
    for bad in (np.ones(3), 3):
        with pytest.raises(AssertionError, match="GradManager.attach: expected"):
            gc.GradManager().attach(bad)
        with pytest.raises(TypeError):
            gc.GradManager().attach(bad)


# MegEngine's logical devices (megengine.device; functional/test_tensor.py::
# test_concat_stack_device, core/test_tensor_wrapper.py::test_tensor_construct_tensor)

def test_logical_devices_are_named_as_megengine_and_kept_by_ops(monkeypatch):
    monkeypatch.setattr(gc.devices, "_default_device", "cpu")
    a = gc.Tensor(np.arange(8, dtype="float32").reshape(2, 4), device="cpu0")
    b = gc.Tensor(np.arange(8, 16, dtype="float32").reshape(2, 4), device="cpu1")
    plain = gc.tensor(np.ones((2, 4), "float32"))
    # MegEngine's names; each also equals gradcore's physical name
    assert (str(a.device), str(b.device), str(plain.device)) == ("cpu0:0", "cpu1:0", "cpu0:0")
    assert b.device == "cpu" and b.device == "cpu1" and b.device == "cpu1:0" and b.device != "cpu2"
    assert str(gc.Tensor(1.0, device="cpu0:1").device) == "cpu0:1"
    assert str(gc.Tensor(1.0, device="xpu1").device) == "xpu1:0"
    assert str(gc.Tensor(1.0, device="cpux").device) == "cpu0:0"
    # "cpu0" is the default cpu: it mixes with tensors made without a device
    np.testing.assert_array_equal((a + plain).numpy(), a.numpy() + 1)
    # ops keep the logical device, Python scalars included, reductions too
    for out in (b * 2 + 1, b + b, -b, b.sum(), F.exp(b), b[0], b.reshape(8)):
        assert str(out.device) == "cpu1:0"
    np.testing.assert_allclose((b * 2 + 1).numpy(), np.arange(8, 16).reshape(2, 4) * 2 + 1)
    assert str(F.zeros((2,), device="cpu2").device) == "cpu2:0"
    assert str(F.full((2,), 3.0, device="cpu0:1").device) == "cpu0:1"
    with pytest.raises(RuntimeError, match=r"Elemwise.*different devices \(cpu, cpu1:0\)"):
        a + b


def test_a_python_scalar_on_the_left_keeps_the_tensors_raw_device():
    # `2 * x` converted its scalar on x.device (the MegEngine name, "cpu0:0")
    # instead of x's own device: its result printed device=cpu0:0 where
    # `x * 2` prints device=cpu
    x = gc.tensor([1, 2])
    for out in (2 * x, 1 + x, 2 ** x, 2.0 ** x, 1 - x):
        assert repr(out).endswith(f"device={x._device})") and out._device is x._device
    b = gc.Tensor([1.0, 2.0], device="cpu1")
    assert str((2 ** b).device) == "cpu1:0" and str((2 * b).device) == "cpu1:0"


def test_concat_stack_on_logical_devices(monkeypatch):
    monkeypatch.setattr(gc.devices, "_default_device", "cpu")
    rng = np.random.default_rng(0)
    x1, x2, x3 = (rng.random((2, 2, 2)).astype("float32") for _ in range(3))
    d1, d2, d3 = gc.Tensor(x1, device="cpu0"), gc.Tensor(x2, device="cpu1"), gc.Tensor(x3, device="cpu0")
    for func, ref in ((F.concat, np.concatenate), (F.stack, np.stack)):
        # device=: the inputs are moved there, from different devices too
        out = func([d1, d2], device="cpu1")
        assert str(out.device) == "cpu1:0"
        np.testing.assert_array_equal(out.numpy(), ref([x1, x2]))
        out = func([d1, d3])
        assert str(out.device) == "cpu0:0"
        np.testing.assert_array_equal(out.numpy(), ref([x1, x3]))
        with pytest.raises(RuntimeError, match="different devices"):
            func([d1, d2])


def test_tensor_from_tensor_keeps_its_device_and_dtype():
    x = gc.Tensor(0, dtype=np.float32, device="xpu0:1", name="MyName")
    assert gc.Tensor(x.astype(np.int32)).dtype == np.int32
    with pytest.raises(RuntimeError, match="dtype int32, not float32"):
        gc.Tensor(x.astype(np.int32), dtype=np.float32)
    assert gc.Tensor(x).name == "" and gc.Tensor(x, name="N2").name == "N2"
    moved = x.to("xpu0:2")
    assert str(moved.device) == "xpu0:2" and str(x.device) == "xpu0:1"
    with pytest.raises(RuntimeError, match="on xpu0:2, not on xpu0:1"):
        gc.Tensor(moved, device="xpu0:1")
    assert gc.Tensor(moved).device == moved.device and str(gc.Tensor(moved).device) == "xpu0:2"
    assert x.to("xpu0:1") is x


def test_gradient_comes_back_to_the_attached_tensors_device(monkeypatch):
    monkeypatch.setattr(gc.devices, "_default_device", "cpu")
    wv = np.array([1.0, -2.0, 0.5])
    for dev in ("cpu", "cpu2"):
        w = gc.Parameter(wv.astype("float32"), device=dev)
        gm = gc.GradManager().attach([w])
        with gm:
            # y = sum((w on cpu1)^2 * 3): dy/dw = 6 w, whatever device w is on
            moved = w.to("cpu1")
            assert str(moved.device) == "cpu1:0"
            gm.backward((moved * moved * 3).sum())
        assert w.grad.device == w.device and str(w.grad.device) == str(w.device)
        np.testing.assert_allclose(w.grad.numpy(), 6 * wv, rtol=1e-6)


def test_logical_device_set_default_and_pickle(monkeypatch):
    import pickle
    monkeypatch.setattr(gc.devices, "_default_device", "cpu")
    gc.set_default_device("cpu3")
    t = gc.tensor([1.0, 2.0])
    assert str(t.device) == "cpu3:0" and str(gc.get_default_device()) == "cpu3:0"
    back = pickle.loads(pickle.dumps(t))
    assert str(back.device) == "cpu3:0"
    np.testing.assert_array_equal(back.numpy(), [1.0, 2.0])
    gc.set_default_device("cpu0")
    assert gc.get_default_device() == "cpu" and str(gc.tensor([1.0]).device) == "cpu0:0"
    with pytest.raises(ValueError, match="unknown device 'tpu0'"):
        gc.tensor([1.0], device="tpu0")
