"""MegEngine's own module and optimizer test cases, restated for gradcore.

Each test here re-checks a case from MegEngine's unit and integration tests
(imperative/python/test/unit/module/*, unit/optimizer/*, integration/
test_optimizer.py, test_sgd_momentum.py, test_lr_scheduler.py, test_bn.py,
test_hello_world.py, test_detach.py, test_save_load.py, unit/random/
test_rng.py) and a few of the examples in MegEngine's module docstrings: the
same arguments and model structures, with the expected values worked out
here independently (NumPy, or PyTorch where it is the natural oracle).

Left out: quantized/QAT modules, tracing, distributed (SyncBatchNorm),
float16-specific cases, and APIs gradcore does not have (ConvTranspose2d,
LocalConv2d, M.Elemwise, M.init, Parameter.set_value, LAMB,
CosineAnnealingLR).

Traversal order is MegEngine's (attribute names sorted at each level,
depth first): test_traversal_order_is_megengines_sorted_order pins it, the
other traversal tests check the content.
"""
import logging
import pickle
from bisect import bisect_right
from collections import OrderedDict

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
import gradcore.random as grandom
from gradcore import Parameter, Tensor
from gradcore.autodiff import GradManager


def _close(actual, expected, atol=5e-6, rtol=5e-6):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), atol=atol, rtol=rtol)


# ======================================================= unit/module/test_module.py
class MLP(M.Module):
    def __init__(self):
        super().__init__()
        self.dense0 = M.Linear(28, 50)
        self.dense1 = M.Linear(50, 20)

    def forward(self, x):
        return self.dense1(F.relu(self.dense0(x)))


class Inner(M.Module):
    def __init__(self):
        super().__init__()
        self.bn = M.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(x)


class Outer(M.Module):
    """An inner module, a BatchNorm, a Parameter and a plain Tensor (a buffer)."""

    def __init__(self):
        super().__init__()
        self.i = Inner()
        self.bn = M.BatchNorm2d(4)
        self.param = Parameter(np.ones(1, dtype=np.float32))
        self.buff = Tensor(np.ones(1, dtype=np.float32))

    def forward(self, x):
        return self.bn(self.i(x))


def _ids(objs):
    return sorted(id(o) for o in objs)


def _resolve(root, dotted):
    obj = root
    for part in dotted.split("."):
        if isinstance(obj, (list, tuple)):
            obj = obj[int(part)]
        elif isinstance(obj, dict):
            obj = obj[part]
        else:
            obj = getattr(obj, part)
    return obj


def test_module_traversal_contents():
    m = Outer()
    assert _ids(m.children()) == _ids([m.bn, m.i])
    assert sorted(n for n, _ in m.named_children()) == ["bn", "i"]
    mods = list(m.modules())
    assert mods[0] is m and _ids(mods) == _ids([m, m.bn, m.i, m.i.bn])
    named = dict(m.named_modules())
    assert set(named) == {"", "bn", "i", "i.bn"}
    assert all(_resolve(m, k) is v for k, v in named.items() if k)
    prefixed = list(m.named_modules(prefix="x"))
    assert prefixed[0] == ("x", m)
    assert sorted(k for k, _ in prefixed) == ["x", "x.bn", "x.i", "x.i.bn"]
    assert _ids(m.buffers()) == _ids([m.bn.running_mean, m.bn.running_var, m.buff,
                                      m.i.bn.running_mean, m.i.bn.running_var])
    assert list(m.buffers(recursive=False)) == [m.buff]
    assert sorted(k for k, _ in m.named_buffers()) == [
        "bn.running_mean", "bn.running_var", "buff", "i.bn.running_mean", "i.bn.running_var"]
    assert _ids(m.parameters()) == _ids([m.bn.bias, m.bn.weight, m.i.bn.bias, m.i.bn.weight, m.param])
    named_p = dict(m.named_parameters())
    assert sorted(named_p) == ["bn.bias", "bn.weight", "i.bn.bias", "i.bn.weight", "param"]
    assert all(_resolve(m, k) is v for k, v in named_p.items())
    assert _ids(m.tensors()) == _ids(list(m.parameters()) + list(m.buffers()))
    named_t = dict(m.named_tensors())
    assert sorted(named_t) == sorted(list(named_p) + [k for k, _ in m.named_buffers()])
    assert all(_resolve(m, k) is v for k, v in named_t.items())


def test_module_train_eval_and_apply():
    m = Outer()
    m.eval()
    assert not (m.training or m.bn.training or m.i.training or m.i.bn.training)
    m.bn.train()
    assert not m.training and m.bn.training and not m.i.bn.training
    m.eval()
    m.i.train()
    assert not m.training and not m.bn.training and m.i.training and m.i.bn.training
    m.eval()
    m.train()
    assert m.training and m.bn.training and m.i.bn.training

    def off(mod):
        mod.training = False

    m.apply(off)
    assert not m.bn.training and not m.i.bn.training


def test_reused_submodule_is_listed_once():
    m = Outer()
    m.h = m.i
    assert _ids(m.modules()) == _ids([m, m.bn, m.i, m.i.bn])
    named = list(m.named_modules())
    assert len(named) == 4
    assert all(_resolve(m, k) is v for k, v in named if k)
    # the shared module appears under one of its two names
    assert {k for k, v in named if v is m.i} <= {"h", "i"}


def test_traversal_is_stable():
    m = Outer()
    first = list(m.modules())
    for _ in range(100):
        assert list(m.modules()) == first


def test_forward_hooks_modify_inputs_and_outputs():
    net = Outer()
    counts = {"pre": 0, "post": 0}
    handles = []

    def pre(module, inputs):
        counts["pre"] += 1
        return tuple(x + 1 for x in inputs)

    def post(module, inputs, outputs):
        counts["post"] += 1
        outputs += 1
        return outputs

    net.apply(lambda mod: handles.append(mod.register_forward_pre_hook(pre)))
    net.apply(lambda mod: handles.append(mod.register_forward_hook(post)))
    shape = (1, 4, 1, 1)
    x = gc.tensor(np.zeros(shape, dtype=np.float32))
    y = net(x)
    assert counts == {"pre": 4, "post": 4}
    # net's pre-hook, then i's, then i.bn's: i.bn sees x + 3
    # (one element per channel: batch mean 3, normalised output 0)
    np.testing.assert_allclose(net.i.bn.running_mean.numpy(), np.full(shape, 0.1 * 3, np.float32), rtol=1e-6)
    # i.bn's and i's post-hooks (+2), then bn's pre-hook (+1): bn sees 0 + 3
    np.testing.assert_allclose(net.bn.running_mean.numpy(), np.full(shape, 0.1 * 3, np.float32), rtol=1e-6)
    # bn's and net's post-hooks add 2 to bn's output 0
    np.testing.assert_allclose(y.numpy(), np.full(shape, 2.0, np.float32))
    assert len(handles) == 8
    for h in handles:
        h.remove()
    net(x)
    assert counts == {"pre": 4, "post": 4}


class Inner2(M.Module):
    def __init__(self):
        super().__init__()
        self.bn = M.BatchNorm2d(4)
        self.test_bool_key = {True: 1, False: 0}     # non-str keys, but nothing to name

    def forward(self, x):
        return self.bn(x)


class Nested(M.Module):
    def __init__(self):
        super().__init__()
        self.bn = M.BatchNorm2d(4)
        self.a = [
            M.BatchNorm2d(4),
            {"x": M.BatchNorm2d(4), "y": [M.BatchNorm2d(4), Inner2()], "z": 0},
            (Inner2(),),
        ]

    def forward(self, x):
        return x


def _nested_expected(m):
    return [
        ("", m, None),
        ("a.0", m.a[0], m),
        ("a.1.x", m.a[1]["x"], m),
        ("a.1.y.0", m.a[1]["y"][0], m),
        ("a.1.y.1", m.a[1]["y"][1], m),
        ("a.1.y.1.bn", m.a[1]["y"][1].bn, m.a[1]["y"][1]),
        ("a.2.0", m.a[2][0], m),
        ("a.2.0.bn", m.a[2][0].bn, m.a[2][0]),
        ("bn", m.bn, m),
    ]


def _by_name(triples):
    return sorted((k, id(v), id(p)) for k, v, p in triples)


def test_modules_inside_lists_dicts_and_tuples():
    m = Nested()
    want = _nested_expected(m)
    got = list(m.named_modules())
    assert sorted((k, id(v)) for k, v in got) == sorted((k, id(v)) for k, v, _ in want)


def test_flatten_yields_only_tensors_and_modules():
    m = Nested()
    others = list(m._flatten(with_key=True, predicate=lambda o: not isinstance(o, (Tensor, M.Module))))
    assert others == []


def test_with_parent():
    m = Nested()
    want = _nested_expected(m)
    got = list(m.named_modules(with_parent=True))
    assert got[0] == ("", m, None)
    assert _by_name(got) == _by_name(want)
    got = list(m.modules(with_parent=True))
    assert got[0] == (m, None)
    assert sorted((id(v), id(p)) for v, p in got) == sorted((id(v), id(p)) for _, v, p in want)
    # the other iterators take it too
    assert {(id(p), id(o)) for p, o in m.parameters(with_parent=True)} == \
        {(id(mod.weight), id(mod)) for _, mod, _ in want[1:] if isinstance(mod, M.BatchNorm2d)} | \
        {(id(mod.bias), id(mod)) for _, mod, _ in want[1:] if isinstance(mod, M.BatchNorm2d)}


def test_module_with_sequential_names():
    class WithSeq(M.Module):
        def __init__(self):
            super().__init__()
            self.bn = M.BatchNorm2d(4)
            self.seq = M.Sequential(M.BatchNorm2d(4), Inner2())

        def forward(self, x):
            return x

    m = WithSeq()
    assert list(m.named_modules()) == [
        ("", m), ("bn", m.bn), ("seq", m.seq), ("seq.0", m.seq[0]),
        ("seq.1", m.seq[1]), ("seq.1.bn", m.seq[1].bn)]


def test_sequential_named_children_keep_ordered_dict_keys():
    layers = OrderedDict()
    layers["name0"] = M.Linear(20, 10)
    layers["name1"] = M.Linear(10, 5)
    layers["name2"] = M.Linear(5, 1)
    names = [k for k, _ in M.Sequential(layers).named_children()]
    assert names == ["name0", "name1", "name2"]


def test_state_dict_round_trip_and_strictness():
    data = gc.tensor(np.random.random((2, 28)).astype("float32"))
    mlp = MLP()
    pred0 = mlp(data)
    state = pickle.loads(pickle.dumps(mlp.state_dict()))
    state["extra"] = None
    mlp1 = MLP()
    mlp1.load_state_dict(state, strict=False)
    _close(mlp1(data).numpy(), pred0.numpy())
    with pytest.raises(KeyError):
        mlp1.load_state_dict(state)          # "extra" is not a key of MLP
    del state["extra"]
    del state["dense0.bias"]
    with pytest.raises(KeyError):
        mlp1.load_state_dict(state)          # "dense0.bias" is missing


def test_non_str_dict_key_holding_a_tensor_is_an_error():
    class Bad(M.Module):
        def __init__(self):
            super().__init__()
            self.error_tensor_key = {True: gc.tensor([]), False: 0}

        def forward(self, x):
            return x

    with pytest.raises(AssertionError, match="keys for Tensor and Module must be str, error key: True"):
        list(Bad()._flatten())


class SharedConv(M.Module):
    def __init__(self, conv=M.Conv2d):
        super().__init__()
        self.conv0 = conv(1, 1, kernel_size=3, bias=False)
        self.conv1 = conv(1, 1, kernel_size=3, bias=False)
        self.conv1.weight = self.conv0.weight

    def forward(self, x):
        return x


@pytest.mark.parametrize("conv, shape", [(M.Conv2d, (1, 1, 8, 8)), (M.Conv1d, (1, 1, 8))])
def test_shared_parameter_survives_pickling(conv, shape):
    net = SharedConv(conv)
    assert net.conv0.weight is net.conv1.weight
    data = gc.tensor(np.random.random(shape).astype(np.float32))
    np.testing.assert_array_equal(net.conv0(data).numpy(), net.conv1(data).numpy())
    net1 = pickle.loads(pickle.dumps(net))
    assert net1.conv0.weight is net1.conv1.weight
    np.testing.assert_array_equal(net1.conv0(data).numpy(), net1.conv1(data).numpy())
    conv0, conv1 = pickle.loads(pickle.dumps(net.conv0)), pickle.loads(pickle.dumps(net.conv1))
    assert conv0.weight is not conv1.weight
    np.testing.assert_array_equal(conv0(data).numpy(), conv1(data).numpy())


def test_pickled_module_predicts_the_same():
    data = gc.tensor(np.random.random((2, 28)).astype("float32"))
    mlp = MLP()
    pred0 = pickle.loads(pickle.dumps(mlp))(data)     # pickled before any forward
    pred1 = mlp(data)
    pred2 = pickle.loads(pickle.dumps(mlp))(data)     # and after one
    _close(pred0.numpy(), pred1.numpy())
    _close(pred0.numpy(), pred2.numpy())


def test_repr_of_a_model():
    class ConvModel(M.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = M.Conv2d(3, 128, 3, stride=2, bias=False)
            self.conv2 = M.Conv2d(3, 128, 3, padding=1, bias=False)
            self.conv3 = M.Conv2d(3, 128, 3, dilation=2, bias=False)
            self.bn1 = M.BatchNorm2d(128)
            self.bn2 = M.BatchNorm1d(128)
            self.dropout = M.Dropout(drop_prob=0.1)
            self.softmax = M.Softmax(axis=100)
            self.pooling = M.MaxPool2d(kernel_size=2, padding=0)
            self.submodule1 = M.Sequential(M.Dropout(drop_prob=0.1), M.Softmax(axis=100))
            self.fc1 = M.Linear(512, 1024)

        def forward(self, x):
            return x

    expected = "\n".join([
        "ConvModel(",
        "  (conv1): Conv2d(3, 128, kernel_size=(3, 3), stride=(2, 2), bias=False)",
        "  (conv2): Conv2d(3, 128, kernel_size=(3, 3), padding=(1, 1), bias=False)",
        "  (conv3): Conv2d(3, 128, kernel_size=(3, 3), dilation=(2, 2), bias=False)",
        "  (bn1): BatchNorm2d(128, eps=1e-05, momentum=0.9, affine=True, track_running_stats=True)",
        "  (bn2): BatchNorm1d(128, eps=1e-05, momentum=0.9, affine=True, track_running_stats=True)",
        "  (dropout): Dropout(drop_prob=0.1)",
        "  (softmax): Softmax(axis=100)",
        "  (pooling): MaxPool2d(kernel_size=2, stride=2, padding=0)",
        "  (submodule1): Sequential(",
        "    (0): Dropout(drop_prob=0.1)",
        "    (1): Softmax(axis=100)",
        "  )",
        "  (fc1): Linear(in_features=512, out_features=1024, bias=True)",
        ")",
    ])
    assert repr(ConvModel()) == expected


def test_repr_of_modules_in_containers():
    class ConvModel(M.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = M.Conv2d(3, 128, 3, padding=1, bias=False)
            self.conv2 = M.Conv2d(3, 128, 3, dilation=2, bias=False)
            self.bn1 = M.BatchNorm1d(128)
            self.bn2 = M.BatchNorm2d(128)
            self.pooling = M.MaxPool2d(kernel_size=2, padding=0)
            layers = OrderedDict()
            layers["depthwise"] = M.Conv2d(256, 256, 3, 1, 0, groups=256, bias=False)
            layers["pointwise"] = M.Conv2d(256, 256, kernel_size=1, stride=1, padding=0, bias=True)
            self.submodule1 = M.Sequential(layers)
            self.list1 = [M.Dropout(drop_prob=0.1), [M.Softmax(axis=100)]]
            self.tuple1 = (M.Dropout(drop_prob=0.1), (M.Softmax(axis=100), M.Dropout(drop_prob=0.2)))
            self.dict1 = {"Dropout": M.Dropout(drop_prob=0.1)}
            self.fc1 = M.Linear(512, 1024)

        def forward(self, x):
            return x

    bn = "eps=1e-05, momentum=0.9, affine=True, track_running_stats=True"
    expected = "\n".join([
        "ConvModel(",
        "  (conv1): Conv2d(3, 128, kernel_size=(3, 3), padding=(1, 1), bias=False)",
        "  (conv2): Conv2d(3, 128, kernel_size=(3, 3), dilation=(2, 2), bias=False)",
        f"  (bn1): BatchNorm1d(128, {bn})",
        f"  (bn2): BatchNorm2d(128, {bn})",
        "  (pooling): MaxPool2d(kernel_size=2, stride=2, padding=0)",
        "  (submodule1): Sequential(",
        "    (depthwise): Conv2d(256, 256, kernel_size=(3, 3), groups=256, bias=False)",
        "    (pointwise): Conv2d(256, 256, kernel_size=(1, 1))",
        "  )",
        "  (list1.0): Dropout(drop_prob=0.1)",
        "  (list1.1.0): Softmax(axis=100)",
        "  (tuple1.0): Dropout(drop_prob=0.1)",
        "  (tuple1.1.0): Softmax(axis=100)",
        "  (tuple1.1.1): Dropout(drop_prob=0.2)",
        "  (dict1.Dropout): Dropout(drop_prob=0.1)",
        "  (fc1): Linear(in_features=512, out_features=1024, bias=True)",
        ")",
    ])
    assert repr(ConvModel()) == expected


def test_repr_after_resetting_an_attribute():
    class ResetAttr(M.Module):
        def __init__(self, module_last):
            super().__init__()
            if module_last:
                self.a = None
                self.a = M.Linear(3, 5)
            else:
                self.a = M.Linear(3, 5)
                self.a = None

        def forward(self, x):
            return self.a(x) if self.a else x

    assert repr(ResetAttr(True)) == "ResetAttr(\n  (a): Linear(in_features=3, out_features=5, bias=True)\n)"
    assert repr(ResetAttr(False)) == "ResetAttr()"


def test_repr_after_reassigning_a_submodule():
    class ConvModel1(M.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = M.Conv2d(3, 128, 3, bias=False)
            self.conv2 = M.Conv2d(3, 128, 3, padding=1, bias=False)
            self.conv1 = M.Conv2d(3, 256, 3, dilation=2, bias=False)

        def forward(self, x):
            return x

    assert repr(ConvModel1()) == (
        "ConvModel1(\n"
        "  (conv1): Conv2d(3, 256, kernel_size=(3, 3), dilation=(2, 2), bias=False)\n"
        "  (conv2): Conv2d(3, 128, kernel_size=(3, 3), padding=(1, 1), bias=False)\n"
        ")")


def test_repr_lists_a_module_under_every_name():
    class ConvModel2(M.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = M.Conv2d(3, 128, 3, bias=False)
            self.conv2 = self.conv1
            self.conv3 = self.conv1

        def forward(self, x):
            return x

    line = "Conv2d(3, 128, kernel_size=(3, 3), bias=False)"
    assert repr(ConvModel2()) == (
        f"ConvModel2(\n  (conv1): {line}\n  (conv2): {line}\n  (conv3): {line}\n)")


def test_repr_after_deleting_a_submodule():
    class ConvModel3(M.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = M.Conv2d(3, 128, 3, bias=False)
            self.softmax = M.Softmax(100)

        def forward(self, x):
            return x

    net = ConvModel3()
    del net.softmax
    assert repr(net) == "ConvModel3(\n  (conv1): Conv2d(3, 128, kernel_size=(3, 3), bias=False)\n)"


def test_replace_param():
    class Two(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(3, 2)
            self.scale = Parameter(np.ones(2, np.float32))

        def forward(self, x):
            return self.fc(x) * self.scale

    m = Two()
    order = list(m.parameters())             # fc.bias, fc.weight, scale (sorted names)
    assert order == [m.fc.bias, m.fc.weight, m.scale]
    new_bias = Parameter(np.full(2, 5.0, np.float32))
    new_scale = Parameter(np.full(2, 3.0, np.float32))
    assert m.replace_param({0: new_bias, 2: new_scale}, 0) == 3
    assert m.fc.bias is new_bias and m.scale is new_scale and m.fc.weight is order[1]
    with pytest.raises(ValueError):
        m.replace_param({0: Parameter(np.zeros((9, 9), np.float32))}, 0)


def test_traversal_order_is_megengines_sorted_order():
    m = Outer()
    assert list(m.children()) == [m.bn, m.i]
    assert [k for k, _ in m.named_parameters()] == ["bn.bias", "bn.weight", "i.bn.bias", "i.bn.weight",
                                                   "param"]
    m.h = m.i
    assert [k for k, _ in m.named_modules()] == ["", "bn", "h", "h.bn"]
    n = Nested()
    assert [k for k, _ in n.named_modules()] == [k for k, _, _ in _nested_expected(n)]
    m = Outer()
    assert [k for k, _ in m.named_tensors()] == [
        "bn.bias", "bn.running_mean", "bn.running_var", "bn.weight", "buff",
        "i.bn.bias", "i.bn.running_mean", "i.bn.running_var", "i.bn.weight", "param"]
    assert list(m.parameters()) == [m.bn.bias, m.bn.weight, m.i.bn.bias, m.i.bn.weight, m.param]
    assert [k for k, _ in m.named_buffers()] == [
        "bn.running_mean", "bn.running_var", "buff", "i.bn.running_mean", "i.bn.running_var"]
    assert list(m.buffers()) == [m.bn.running_mean, m.bn.running_var, m.buff,
                                 m.i.bn.running_mean, m.i.bn.running_var]
    assert list(m.modules()) == [m, m.bn, m.i, m.i.bn]
    assert [k for k, _ in m.named_children()] == ["bn", "i"]


def test_shared_tensor_listed_once_under_its_first_sorted_name_but_state_dict_keeps_both():
    m = Outer()
    m.i.bn.weight = m.bn.weight              # shared between two sub-modules
    m.alias = m.param                        # and twice in one module
    names = [k for k, _ in m.named_parameters()]
    assert names == ["alias", "bn.bias", "bn.weight", "i.bn.bias"]
    assert list(m.parameters()) == [m.param, m.bn.bias, m.bn.weight, m.i.bn.bias]
    # MegEngine's state_dict order: a module's own tensors (sorted), then each
    # sub-module's state (sorted by name); a tensor shared by two sub-modules under both
    # names, one held twice by the same module once (its first name)
    assert list(m.state_dict()) == [
        "alias", "buff",
        "bn.bias", "bn.running_mean", "bn.running_var", "bn.weight",
        "i.bn.bias", "i.bn.running_mean", "i.bn.running_var", "i.bn.weight"]
    # an optimizer built from parameters() updates each shared tensor once
    opt = optim.SGD(m.parameters(), lr=0.5)
    gm = GradManager().attach(m.parameters())
    with gm:
        x = gc.tensor(np.random.default_rng(0).normal(size=(3, 4, 2, 2)).astype("float32"))
        gm.backward((m(x) ** 2).sum() * m.param.sum())
    opt.step()
    other = Outer()
    other.i.bn.weight = other.bn.weight
    other.alias = other.param
    other.load_state_dict(m.state_dict())
    for (k, a), (k2, b) in zip(m.named_tensors(), other.named_tensors()):
        assert k == k2
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(m.param.numpy(), np.ones(1))          # the step did change it


# ===================================================== unit/module/test_batchnorm.py
def _bn_expected(xv, axes, momentum, eps, running_mean, running_var):
    """Batch-normalised xv and the updated running statistics (MegEngine's
    momentum convention, unbiased running variance)."""
    mean = xv.mean(axis=axes, keepdims=True)
    var = xv.var(axis=axes, keepdims=True)
    n = xv.size // xv.shape[1]
    y = (xv - mean) / np.sqrt(var + eps)
    running_mean = momentum * running_mean + (1 - momentum) * mean
    running_var = momentum * running_var + (1 - momentum) * var * n / (n - 1)
    return y, running_mean, running_var


@pytest.mark.parametrize("cls, data_shape, axes", [
    (M.BatchNorm1d, (3, 8, 4), (0, 2)),
    (M.BatchNorm2d, (3, 8, 16, 16), (0, 2, 3)),
])
def test_batchnorm_training_then_eval(cls, data_shape, axes):
    nr_chan, momentum = 8, 0.9
    bn = cls(nr_chan, momentum=momentum)
    stat_shape = (1, nr_chan) + (1,) * (len(data_shape) - 2)
    running_mean = np.zeros(stat_shape, np.float64)
    running_var = np.ones(stat_shape, np.float64)
    for _ in range(3):
        xv = np.random.normal(loc=2.3, size=data_shape).astype(np.float32)
        y_want, running_mean, running_var = _bn_expected(xv.astype(np.float64), axes, momentum, bn.eps,
                                                         running_mean, running_var)
        y = bn(gc.tensor(xv))
        _close(y.numpy(), y_want, atol=5e-5, rtol=5e-5)
        _close(bn.running_mean.numpy().reshape(-1), running_mean.reshape(-1))
        _close(bn.running_var.numpy().reshape(-1), running_var.reshape(-1))
    # training off: the running statistics normalise and stay as they are
    mean_before, var_before = bn.running_mean.numpy().copy(), bn.running_var.numpy().copy()
    bn.training = False
    xv = np.random.normal(loc=2.3, size=data_shape).astype(np.float32)
    data = gc.tensor(xv)
    y1, y2 = bn(data), bn(data)
    np.testing.assert_array_equal(y1.numpy(), y2.numpy())
    np.testing.assert_array_equal(bn.running_mean.numpy(), mean_before)
    np.testing.assert_array_equal(bn.running_var.numpy(), var_before)
    _close(y1.numpy(), (xv - running_mean) / np.sqrt(running_var + bn.eps), atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("cls, data_shape, axes", [
    (M.BatchNorm1d, (3, 8, 4), (0, 2)),
    (M.BatchNorm2d, (3, 8, 16, 16), (0, 2, 3)),
])
def test_batchnorm_without_running_stats_uses_batch_stats_always(cls, data_shape, axes):
    bn = cls(8, track_running_stats=False)
    for i in range(4):
        if i == 2:
            bn.training = False
        xv = np.random.normal(loc=2.3, size=data_shape).astype(np.float32)
        x64 = xv.astype(np.float64)
        want = (x64 - x64.mean(axis=axes, keepdims=True)) / np.sqrt(x64.var(axis=axes, keepdims=True) + bn.eps)
        _close(bn(gc.tensor(xv)).numpy(), want, atol=5e-5, rtol=5e-5)


# ============================================================ integration/test_bn.py
def test_frozen_batchnorm_changes_nothing():
    m = M.BatchNorm2d(3, freeze=True)
    saved = [t.numpy().copy() for t in (m.running_var, m.running_mean, m.weight, m.bias)]
    gm = GradManager().attach(m.parameters())
    opt = optim.SGD(m.parameters(), lr=1.0)
    opt.clear_grad()
    data = np.random.random((6, 3, 2, 2)).astype("float32")
    with gm:
        loss = m(data).mean()
        gm.backward(loss)
    opt.step()
    for t, before in zip((m.running_var, m.running_mean, m.weight, m.bias), saved):
        np.testing.assert_array_equal(t.numpy(), before)
    # running mean 0 and variance 1: the output is the input (up to eps)
    np.testing.assert_almost_equal(loss.numpy(), data.mean(), 5)


def test_batchnorm_no_track_stat_trains():
    m = M.BatchNorm2d(3, track_running_stats=False)
    gm = GradManager().attach(m.parameters())
    opt = optim.SGD(m.parameters(), lr=1.0)
    opt.clear_grad()
    data = np.random.random((6, 3, 2, 2)).astype("float32")
    with gm:
        loss = m(data).sum()
        gm.backward(loss)
    opt.step()
    assert m.running_mean is None and m.running_var is None


def test_batchnorm_tracking_turned_off_later_leaves_stats_alone():
    m = M.BatchNorm2d(3)
    m.track_running_stats = False
    saved_var, saved_mean = m.running_var.numpy().copy(), m.running_mean.numpy().copy()
    gm = GradManager().attach(m.parameters())
    opt = optim.SGD(m.parameters(), lr=1.0)
    opt.clear_grad()
    data = np.random.random((6, 3, 2, 2)).astype("float32")
    with gm:
        loss = m(data).sum()
        gm.backward(loss)
    opt.step()
    np.testing.assert_array_equal(m.running_var.numpy(), saved_var)
    np.testing.assert_array_equal(m.running_mean.numpy(), saved_mean)
    # and the batch statistics normalise, in eval too
    m.eval()
    x64 = data.astype(np.float64)
    want = (x64 - x64.mean((0, 2, 3), keepdims=True)) / np.sqrt(x64.var((0, 2, 3), keepdims=True) + m.eps)
    want = want * m.weight.numpy() + m.bias.numpy()
    _close(m(data).numpy(), want, atol=5e-5, rtol=5e-5)


def test_batchnorm_tracking_cannot_be_turned_on_later():
    m = M.BatchNorm2d(3, track_running_stats=False)
    m.track_running_stats = True
    with pytest.raises(Exception):
        m(np.random.random((6, 3, 2, 2)).astype("float32"))


# ===================================================== unit/module/test_activation.py
def test_leaky_relu():
    data = np.array([-8, -12, 6, 10]).astype(np.float32)
    out = M.LeakyReLU(0.1)(gc.tensor(data))
    np.testing.assert_allclose(out.numpy(), np.maximum(0, data) + 0.1 * np.minimum(0, data), rtol=1e-7)


def test_activation_docstring_examples():
    data = gc.tensor(np.array([-2, -1, 0, 1, 2]).astype(np.float32))
    v = np.array([-2, -1, 0, 1, 2], np.float64)
    _close(M.Softmax()(data).numpy(), np.exp(v) / np.exp(v).sum(), atol=1e-6)
    _close(M.Sigmoid()(data).numpy(), 1 / (1 + np.exp(-v)), atol=1e-6)
    _close(M.SiLU()(data).numpy(), v / (1 + np.exp(-v)), atol=1e-6)
    from math import erf
    _close(M.GELU()(data).numpy(), [x * 0.5 * (1 + erf(x / np.sqrt(2))) for x in v], atol=1e-5)
    np.testing.assert_array_equal(M.ReLU()(data).numpy(), [0, 0, 0, 1, 2])
    _close(M.PReLU()(gc.tensor(np.array([-1.2, -3.7, 2.7], np.float32))).numpy(), [-0.3, -0.925, 2.7], atol=1e-6)
    _close(M.LeakyReLU(0.01)(gc.tensor(np.array([-8, -12, 6, 10], np.float32))).numpy(),
           [-0.08, -0.12, 6.0, 10.0], atol=1e-6)
    assert M.PReLU().weight.shape == (1,) and M.PReLU(3).weight.shape == (1, 3, 1, 1)


# ================================================== unit/module/test_normalization.py
def test_group_norm_keeps_the_shape(torch):
    input_shape = (2, 100, 128, 128)
    x_np = np.random.rand(*input_shape).astype(np.float32)
    x = gc.tensor(x_np)
    for groups in [2, 5, 10, 50]:
        out = M.GroupNorm(groups, input_shape[1])(x)
        assert out.shape == input_shape
        if groups == 5:
            want = torch.nn.functional.group_norm(torch.tensor(x_np), groups, eps=1e-5).numpy()
            _close(out.numpy(), want, atol=1e-4, rtol=1e-4)


def test_layer_norm_keeps_the_shape(torch):
    # MegEngine's case normalises a (2, 100, 128, 128) input with LayerNorm(100);
    # gradcore (like PyTorch) needs normalized_shape to be the trailing axes,
    # so the trailing axis is used here.
    input_shape = (2, 100, 128, 128)
    x_np = np.random.rand(*input_shape).astype(np.float32)
    out = M.LayerNorm(input_shape[-1])(gc.tensor(x_np))
    assert out.shape == input_shape
    want = torch.nn.functional.layer_norm(torch.tensor(x_np), (input_shape[-1],), eps=1e-5).numpy()
    _close(out.numpy(), want, atol=1e-4, rtol=1e-4)


def test_instance_norm_keeps_the_shape(torch):
    input_shape = (2, 100, 128, 128)
    x_np = np.random.rand(*input_shape).astype(np.float32)
    out = M.InstanceNorm(input_shape[1])(gc.tensor(x_np))
    assert out.shape == input_shape
    want = torch.nn.functional.instance_norm(torch.tensor(x_np), eps=1e-5).numpy()
    _close(out.numpy(), want, atol=1e-4, rtol=1e-4)


def _group_norm_reference(x, groups, weight, bias, eps=1e-5):
    """Group normalisation in float64: per sample and group, over the group's
    channels and the spatial axes, biased variance; then per-channel affine."""
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    y = (g - g.mean(axis=2, keepdims=True)) / np.sqrt(g.var(axis=2, keepdims=True) + eps)
    y = y.reshape(x.shape)
    if weight is not None:
        y = y * weight.reshape(1, c, 1, 1) + bias.reshape(1, c, 1, 1)
    return y


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("kind", ["group", "instance"])
def test_group_and_instance_norm_values_and_gradients(torch, kind, affine):
    channels = 256 if kind == "group" else 4
    weight_np = np.random.uniform(-0.5, 0.5, channels).astype(np.float32)
    bias_np = np.random.uniform(-0.5, 0.5, channels).astype(np.float32)
    inp = np.random.uniform(-0.5, 0.5, (2, channels, 10, 16)).astype("float32")
    dy = np.random.uniform(-0.5, 0.5, inp.shape).astype("float32")
    m = M.GroupNorm(channels, channels, affine=affine) if kind == "group" else \
        M.InstanceNorm(channels, affine=affine)
    m.weight = Parameter(weight_np)
    m.bias = Parameter(bias_np)
    x = gc.tensor(inp)
    gm = GradManager().attach([*m.parameters(), x])
    want = _group_norm_reference(inp.astype(np.float64), channels, weight_np if affine else None, bias_np)
    xt = torch.tensor(inp, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(weight_np, dtype=torch.float64, requires_grad=True)
    bt = torch.tensor(bias_np, dtype=torch.float64, requires_grad=True)
    yt = torch.nn.functional.group_norm(xt, channels, wt if affine else None, bt if affine else None, eps=1e-5)
    (yt * torch.tensor(dy, dtype=torch.float64)).sum().backward()
    for _ in range(2):          # twice: gradients come out the same each time
        with gm:
            y = m(x)
            gm.backward(y, gc.tensor(dy))
        _close(y.numpy(), want, atol=1e-5, rtol=1e-4)
        _close(x.grad.numpy(), xt.grad.numpy(), atol=1e-4, rtol=1e-3)
        if affine:
            _close(m.weight.grad.numpy(), wt.grad.numpy(), atol=1e-4, rtol=1e-4)
            _close(m.bias.grad.numpy(), bt.grad.numpy(), atol=1e-4, rtol=1e-4)
        else:
            assert m.weight.grad is None and m.bias.grad is None
        x.grad = None
        for p in m.parameters():
            p.grad = None


# ========================================================= unit/module/test_pool2d.py
@pytest.mark.parametrize("batch, chans, size, kernel, stride, padding", [
    (10, 4, 5, 2, 2, 1),
    (10, 4, 6, 2, 2, 0),
    (10, 16, 14, 2, 2, 0),
])
def test_avg_pool2d_average_mode_counts_padding(batch, chans, size, kernel, stride, padding):
    pool = M.AvgPool2d(kernel, stride=stride, padding=padding, mode="average")
    inp = np.random.normal(size=(batch, chans, size, size)).astype(np.float32)
    out = pool(gc.tensor(inp)).numpy()
    osz = (size + 2 * padding - kernel) // stride + 1
    padded = np.pad(inp, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    want = np.zeros((batch, chans, osz, osz), np.float32)
    for oh in range(osz):
        for ow in range(osz):
            win = padded[:, :, oh * stride:oh * stride + kernel, ow * stride:ow * stride + kernel]
            want[:, :, oh, ow] = win.sum(axis=(2, 3)) / (kernel * kernel)
    _close(out, want, atol=1e-5)


def test_pooling_docstring_examples():
    x = gc.tensor(np.arange(16).astype("float32").reshape(1, 1, 4, 4))
    np.testing.assert_array_equal(M.MaxPool2d(kernel_size=3, stride=1, padding=0)(x).numpy(),
                                  [[[[10, 11], [14, 15]]]])
    x = gc.tensor(np.arange(12).astype(np.float32).reshape(1, 1, 3, 4))
    out = M.AvgPool2d(kernel_size=2, stride=2, padding=[1, 0], mode="average")(x)
    _close(out.numpy(), [[[[0.25, 1.25], [6.5, 8.5]]]])
    # the stride a pool keeps (and prints) defaults to its kernel size
    assert M.MaxPool2d(3).stride == 3 and M.AvgPool2d(2).stride == 2
    assert repr(M.AvgPool2d(2)) == ("AvgPool2d(kernel_size=2, stride=2, padding=0, "
                                    "mode=average_count_exclude_padding)")


# ======================================================= conv docstring examples
def test_conv_docstring_shapes():
    m = M.Conv1d(in_channels=3, out_channels=1, kernel_size=3)
    assert m(gc.tensor(np.arange(0, 24).astype("float32").reshape(2, 3, 4))).shape == (2, 1, 2)
    m = M.Conv2d(in_channels=3, out_channels=1, kernel_size=3)
    assert m(gc.tensor(np.arange(0, 96).astype("float32").reshape(2, 3, 4, 4))).shape == (2, 1, 2, 2)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_conv2d_padding_mode(torch, mode):
    x_np = np.random.normal(size=(2, 3, 6, 7)).astype(np.float32)
    m = M.Conv2d(3, 4, 3, padding=(1, 2), padding_mode=mode)
    tm = torch.nn.Conv2d(3, 4, 3, padding=(1, 2), padding_mode=mode)
    with torch.no_grad():
        tm.weight.copy_(torch.tensor(m.weight.numpy()))
        tm.bias.copy_(torch.tensor(m.bias.numpy().reshape(-1)))
    _close(m(gc.tensor(x_np)).numpy(), tm(torch.tensor(x_np)).detach().numpy(), atol=1e-5, rtol=1e-5)


# ======================================================= integration/test_optimizer.py
class Simple(M.Module):
    def __init__(self):
        super().__init__()
        self.a = Parameter(np.array([1.23], np.float32))

    def forward(self, x):
        return x * self.a


class _SGDCheck:
    def __init__(self, lr, momentum=0.0, weight_decay=0.0):
        self.lr, self.momentum, self.wd = lr, momentum, weight_decay
        self.buf = None

    def __call__(self, before, grad, after, step):
        g = grad + self.wd * before            # weight decay is an L2 term in the gradient
        if self.momentum:
            self.buf = g if self.buf is None else self.momentum * self.buf + g
            g = self.buf
        np.testing.assert_allclose(after, before - self.lr * g, rtol=1e-6, atol=1e-6)


class _AdamCheck:
    def __init__(self, lr, betas, eps, weight_decay=0.0, decoupled=False):
        self.lr, self.betas, self.eps, self.wd, self.decoupled = lr, betas, eps, weight_decay, decoupled
        self.m = self.v = 0.0

    def __call__(self, before, grad, after, step):
        b1, b2 = self.betas
        g = grad if self.decoupled else grad + self.wd * before
        self.m = b1 * self.m + (1 - b1) * g
        self.v = b2 * self.v + (1 - b2) * g * g
        delta = (self.m / (1 - b1 ** step)) / (np.sqrt(self.v / (1 - b2 ** step)) + self.eps)
        if self.decoupled:
            delta = delta + self.wd * before
        np.testing.assert_allclose(after, before - self.lr * delta, rtol=1e-6, atol=1e-6)


class _AdagradCheck:
    def __init__(self, lr, eps, lr_decay, weight_decay=0.0):
        self.lr, self.eps, self.lr_decay, self.wd = lr, eps, lr_decay, weight_decay
        self.s = 0.0

    def __call__(self, before, grad, after, step):
        g = grad + self.wd * before
        self.s = self.s + g * g
        clr = self.lr / (1 + (step - 1) * self.lr_decay)
        np.testing.assert_allclose(after, before - clr * g / np.sqrt(self.s + self.eps), rtol=1e-6, atol=1e-6)


class _AdadeltaCheck:
    def __init__(self, lr, eps, rho, weight_decay=0.0):
        self.lr, self.eps, self.rho, self.wd = lr, eps, rho, weight_decay
        self.s = self.acc = 0.0

    def __call__(self, before, grad, after, step):
        g = grad + self.wd * before
        self.s = self.rho * self.s + (1 - self.rho) * g * g
        delta = np.sqrt(self.acc + self.eps) / np.sqrt(self.s + self.eps) * g
        self.acc = self.rho * self.acc + (1 - self.rho) * delta * delta
        np.testing.assert_allclose(after, before - self.lr * delta, rtol=1e-6, atol=1e-6)


def _run_optimizer(opt_cls, kwargs, check, update_lr):
    """Three steps of ``opt_cls`` on Simple with loss sum(x * a), each step
    checked against ``check`` (fed float64 copies); with ``update_lr`` every
    group's lr grows by 0.01 before the second step."""
    net = Simple()
    opt = opt_cls(net.parameters(), **kwargs)
    gm = GradManager().attach(net.parameters())
    for i in range(3):
        if update_lr and i == 1:
            for group in opt.param_groups:
                group["lr"] += 0.01
            check.lr += 0.01
        data = gc.tensor(np.random.random((2, 28)).astype(np.float32))
        opt.clear_grad()
        with gm:
            gm.backward(net(data).sum())
        before = net.a.numpy().astype(np.float64)
        opt.step()
        grad = net.a.grad.numpy().astype(np.float64)
        np.testing.assert_allclose(grad, data.numpy().astype(np.float64).sum(), rtol=1e-5)
        check(before, grad, net.a.numpy().astype(np.float64), i + 1)


@pytest.mark.parametrize("update_lr", [False, True])
@pytest.mark.parametrize("kwargs", [
    {"momentum": 0.9, "lr": 0.01},
    {"lr": 0.01},
    {"weight_decay": 0.1, "lr": 0.01},
])
def test_sgd_steps(kwargs, update_lr):
    _run_optimizer(optim.SGD, kwargs, _SGDCheck(**kwargs), update_lr)


@pytest.mark.parametrize("update_lr", [False, True])
@pytest.mark.parametrize("kwargs", [
    {"betas": (0.8, 0.9), "eps": 1e-04, "lr": 0.01},
    {"betas": (0.8, 0.9), "eps": 1e-04, "lr": 0.01, "weight_decay": 0.1},
])
def test_adam_steps(kwargs, update_lr):
    _run_optimizer(optim.Adam, kwargs, _AdamCheck(**kwargs), update_lr)


@pytest.mark.parametrize("update_lr", [False, True])
@pytest.mark.parametrize("kwargs", [
    {"betas": (0.8, 0.9), "eps": 1e-04, "lr": 0.01},
    {"betas": (0.8, 0.9), "eps": 1e-04, "lr": 0.01, "weight_decay": 0.1},
])
def test_adamw_steps(kwargs, update_lr):
    kwargs = dict(kwargs)
    kwargs.setdefault("weight_decay", 1e-2)       # AdamW's default decay
    _run_optimizer(optim.AdamW, kwargs, _AdamCheck(decoupled=True, **kwargs), update_lr)


@pytest.mark.parametrize("update_lr", [False, True])
@pytest.mark.parametrize("kwargs", [
    {"lr": 0.01, "eps": 1e-06, "lr_decay": 0.01},
    {"lr": 0.01, "eps": 1e-06, "lr_decay": 0.0},
    {"lr": 0.01, "eps": 1e-06, "lr_decay": 0.01, "weight_decay": 0.1},
])
def test_adagrad_steps(kwargs, update_lr):
    _run_optimizer(optim.Adagrad, kwargs, _AdagradCheck(**kwargs), update_lr)


@pytest.mark.parametrize("update_lr", [False, True])
@pytest.mark.parametrize("kwargs", [
    {"lr": 1.0, "eps": 1e-06, "rho": 0.9},
    {"lr": 1.0, "eps": 1e-06, "rho": 0.9, "weight_decay": 0.9},
])
def test_adadelta_steps(kwargs, update_lr):
    _run_optimizer(optim.Adadelta, kwargs, _AdadeltaCheck(**kwargs), update_lr)


# ===================================================== integration/test_sgd_momentum.py
def test_sgd_momentum_buffer():
    net = Simple()
    opt = optim.SGD(net.parameters(), lr=1.0, momentum=0.9)
    opt.clear_grad()
    gm = GradManager().attach(net.parameters())
    data = gc.tensor([2.34])
    with gm:
        gm.backward(net(data))
    opt.step()
    # first step: the buffer is the gradient, d(x * a)/da = x
    np.testing.assert_almost_equal(opt._state[net.a]["momentum_buffer"].numpy(), [2.34])
    # inference does not touch it; a is now 1.23 - 2.34
    loss = net(data)
    np.testing.assert_almost_equal(loss.numpy(), [2.34 * (1.23 - 2.34)], 5)
    np.testing.assert_almost_equal(opt._state[net.a]["momentum_buffer"].numpy(), [2.34])
    opt.clear_grad()
    with gm:
        loss = net(data)
        gm.backward(loss)
    opt.step()
    np.testing.assert_almost_equal(loss.numpy(), [2.34 * (1.23 - 2.34)], 5)
    np.testing.assert_almost_equal(opt._state[net.a]["momentum_buffer"].numpy(), [0.9 * 2.34 + 2.34], 5)


# ======================================================= integration/test_lr_scheduler.py
def test_multi_step_lr():
    net = Simple()
    opt = optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    sched = optim.MultiStepLR(opt, [3, 6, 8])
    for epoch in range(10):
        for group in opt.param_groups:
            np.testing.assert_almost_equal(np.float32(group["lr"]),
                                           np.float32(0.01 * 0.1 ** bisect_right([3, 6, 8], epoch)))
        sched.step()


# ======================================================= unit/optimizer/test_clip_grad.py
class ClipNet(M.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = M.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = M.BatchNorm2d(64)
        self.avgpool = M.AvgPool2d(kernel_size=5, stride=5, padding=0)
        self.fc = M.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.avg_pool2d(self.avgpool(x), 22)
        return self.fc(F.flatten(x, 1))


def _clipnet_grads(reduce):
    net = ClipNet()
    x = gc.tensor(np.random.randn(10, 3, 224, 224).astype("float32"))
    gm = GradManager().attach(net.parameters())
    opt = optim.SGD(net.parameters(), 1e-3, momentum=0.9)
    with gm:
        out = net(x)
        gm.backward(out.sum() if reduce == "sum" else out.mean())
    backups = {id(p): p.grad.numpy().astype(np.float64) for p in net.parameters()}
    return net, opt, backups


def test_clip_grad_norm():
    net, opt, backups = _clipnet_grads("sum")
    total = optim.clip_grad_norm(net.parameters(), max_norm=1.0, ord=2)
    want_total = np.sqrt(sum((g ** 2).sum() for g in backups.values()))
    np.testing.assert_allclose(float(total.numpy()), want_total, rtol=1e-5)
    scale = 1.0 / float(total.numpy())
    for p in net.parameters():
        np.testing.assert_allclose(p.grad.numpy(), backups[id(p)] * scale, rtol=1e-5, atol=1e-7)
    opt.step().clear_grad()


def test_clip_grad_value():
    net, opt, backups = _clipnet_grads("mean")
    optim.clip_grad_value(net.parameters(), lower=-2, upper=5)
    for p in net.parameters():
        np.testing.assert_allclose(p.grad.numpy(), np.clip(backups[id(p)], -2, 5), rtol=1e-6)
    opt.step().clear_grad()


def _fake_params(torch):
    shapes = [(1,), (3, 3), (5, 5, 5), (6, 7, 8, 9)]
    grads = [np.random.randn(*s).astype("float32") for s in shapes]
    ours, theirs = [], []
    for g in grads:
        t = torch.ones(g.shape)
        t.grad = torch.tensor(g.copy())
        theirs.append(t)
        p = F.ones(g.shape)
        p.grad = gc.tensor(g.copy())
        ours.append(p)
    return ours, theirs


def test_clip_grad_norm_matches_torch(torch):
    ours, theirs = _fake_params(torch)
    want = torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type=2.0)
    got = optim.clip_grad_norm(ours, max_norm=1.0, ord=2.0)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-4)
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), atol=1e-7)


def test_clip_grad_value_matches_torch(torch):
    ours, theirs = _fake_params(torch)
    torch.nn.utils.clip_grad_value_(theirs, clip_value=0.5)
    optim.clip_grad_value(ours, lower=-0.5, upper=0.5)
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), atol=1e-7)


def test_clip_grad_edge_cases():
    p = Parameter(np.ones(3, np.float32))
    assert float(optim.clip_grad_norm(p, 1.0).numpy()) == 0.0       # no gradient: norm 0, nothing done
    p.grad = gc.tensor(np.array([0.3, -0.4, 0.0], np.float32))     # norm 0.5 < max_norm: unchanged
    optim.clip_grad_norm([p], max_norm=1.0)
    _close(p.grad.numpy(), [0.3, -0.4, 0.0], atol=1e-6)
    total = optim.clip_grad_norm(p, max_norm=0.2, ord="inf")        # inf-norm 0.4, halved
    _close(total.numpy(), 0.4)
    _close(p.grad.numpy(), [0.15, -0.2, 0.0], atol=1e-6)


# ====================== integration/test_hello_world.py, test_detach.py, test_save_load.py
def test_hello_world():
    net = Simple()
    opt = optim.SGD(net.parameters(), lr=1.0)
    opt.clear_grad()
    gm = GradManager().attach(net.parameters())
    with gm:
        gm.backward(net(gc.tensor([2.34])))
    opt.step()
    np.testing.assert_almost_equal(net.a.numpy(), np.array([1.23 - 2.34], np.float32))


def test_detach_blocks_the_gradient():
    class TwoScalars(M.Module):
        def __init__(self):
            super().__init__()
            self.a = Parameter(np.float32(1.0))
            self.b = Parameter(np.float32(1.0))

        def forward(self, x):
            return (x * self.a).detach() * self.b

    net = TwoScalars()
    opt = optim.SGD(net.parameters(), lr=1.0)
    opt.clear_grad()
    gm = GradManager().attach(net.parameters())
    with gm:
        gm.backward(net(gc.tensor(np.ones((10, 10), np.float32))).sum())
    opt.step()
    assert net.a.grad is None
    np.testing.assert_array_equal(net.a.numpy(), np.float32(1.0))
    np.testing.assert_array_equal(net.b.numpy(), np.float32(1.0 - 10.0 * 10.0))


def test_save_load_model_and_optimizer():
    net = Simple()
    opt = optim.SGD(net.parameters(), lr=1.0, momentum=0.9)
    opt.clear_grad()
    gm = GradManager().attach(net.parameters())
    with gm:
        gm.backward(net(gc.tensor([2.34])))
    opt.step()
    checkpoint = pickle.loads(pickle.dumps(
        {"name": "simple", "state_dict": net.state_dict(), "opt_state": opt.state_dict()}))
    net2 = Simple()
    net2.load_state_dict(checkpoint["state_dict"])
    opt2 = optim.SGD(net2.parameters(), lr=1.0, momentum=0.9)
    opt2.load_state_dict(checkpoint["opt_state"])
    np.testing.assert_array_equal(opt2._state[net2.a]["momentum_buffer"].numpy(), [np.float32(2.34)])
    gm2 = GradManager().attach(net2.parameters())
    with gm2:
        gm2.backward(net2(gc.tensor([1.23])))
    opt2.step()
    # a = (1.23 - 2.34) - (0.9 * 2.34 + 1.23)
    np.testing.assert_allclose(net2.a.numpy(), [1.23 - 2.34 - (0.9 * 2.34 + 1.23)], rtol=1e-5)
    # the live state, and keep_var hands out those very tensors
    kept = opt2.state_dict(keep_var=True)["state"][0]["momentum_buffer"]
    assert kept is opt2._state[net2.a]["momentum_buffer"]


# ============================================================ unit/random/test_rng.py
def test_seed():
    grandom.seed(10)
    out1 = grandom.uniform(size=[10, 10])
    out2 = grandom.uniform(size=[10, 10])
    assert not (out1.numpy() == out2.numpy()).all()
    grandom.seed(10)
    out3 = grandom.uniform(size=[10, 10])
    np.testing.assert_allclose(out1.numpy(), out3.numpy(), atol=1e-6)
    grandom.seed(11)
    out4 = grandom.uniform(size=[10, 10])
    assert not (out1.numpy() == out4.numpy()).all()


def test_seed_fixes_parameter_init_and_dropout():
    grandom.seed(3)
    w1 = M.Linear(4, 5).weight.numpy().copy()
    d1 = F.dropout(F.ones((100,)), 0.5, training=True).numpy().copy()
    grandom.seed(3)
    w2 = M.Linear(4, 5).weight.numpy().copy()
    d2 = F.dropout(F.ones((100,)), 0.5, training=True).numpy().copy()
    np.testing.assert_array_equal(w1, w2)
    np.testing.assert_array_equal(d1, d2)


@pytest.mark.parametrize("shape", [(0,), (0, 0, 0), (10, 0, 10)])
def test_random_empty_shapes(shape):
    grandom.seed(1024)
    assert grandom.uniform(0, 1, shape).shape == shape
    assert grandom.normal(0, 1, shape).shape == shape


def test_sliding_window_modules_batch_matmul_activation_and_quant_stubs():
    x = gc.tensor(np.arange(18, dtype="float32").reshape(1, 2, 3, 3))
    blocks = M.SlidingWindow(2, padding=1, stride=2)(x)
    np.testing.assert_array_equal(blocks.numpy(), F.sliding_window(x, 2, 1, 2).numpy())
    back = M.SlidingWindowTranspose((3, 3), 2, padding=1, stride=2)(blocks)
    np.testing.assert_array_equal(back.numpy(), F.sliding_window_transpose(blocks, (3, 3), 2, 1, 2).numpy())
    gc.random.seed(0)
    m = M.BatchMatMulActivation(2, 3, 4, nonlinear_mode="relu")
    assert [n for n, _ in m.named_parameters()] == ["bias", "weight"] and m.weight.shape == (2, 4, 3)
    m.bias.set_value(np.array([0.5, -0.5, 1.0, 0.0], "float32"))
    inp = np.random.default_rng(0).standard_normal((2, 3, 4)).astype("float32")
    want = np.maximum(m.weight.numpy() @ inp + m.bias.numpy(), 0)
    np.testing.assert_allclose(m(gc.tensor(inp)).numpy(), want, rtol=1e-6)
    assert 0.3 < m.weight.numpy().std() < 0.9          # N(0, 1/3)
    with pytest.raises(ValueError, match="nonlinear_mode must be 'identity' or 'relu'"):
        M.BatchMatMulActivation(1, 2, 2, nonlinear_mode="tanh")
    assert M.QuantStub()(x) is x and M.DequantStub()(x) is x


def test_load_state_dict_not_strict_reports_unused_and_missing(caplog):
    # MegEngine's strict=False loads what matches and logs a warning naming
    # the unused keys and the missing ones; a silent load hid misspelt keys
    mlp = MLP()
    state = mlp.state_dict()
    del state["dense0.bias"]
    state["dense9.weight"] = np.zeros((2, 2), "float32")
    with caplog.at_level(logging.WARNING, logger="gradcore"):
        mlp.load_state_dict(state, strict=False)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "unused" in text and "dense9.weight" in text
    assert "missing" in text and "dense0.bias" in text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gradcore"):
        mlp.load_state_dict(mlp.state_dict(), strict=False)      # everything matches: nothing to report
    assert not caplog.records
