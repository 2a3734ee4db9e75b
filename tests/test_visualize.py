"""gradcore.visualize: the DOT source of the recorded graph (always), and a
rendered SVG where Graphviz's `dot` program is installed."""
import re
import shutil

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
from gradcore.autodiff import Function, GradManager

graphviz = pytest.importorskip("graphviz", reason="gradcore[viz] (the graphviz package) is part of .[test]")


def _labels(src):
    return re.findall(r'label="((?:[^"\\]|\\.)*)"', src)


def test_small_graph_ops_paths_shapes_and_attached_tensors():
    w = gc.Parameter(np.ones((3, 2), np.float32))
    x = gc.tensor(np.ones((4, 3), np.float32))
    gm = GradManager().attach([w])
    with gm:
        with gc.record_details():
            y = F.relu(F.matmul(x, w)).sum()
        g = gc.visualize(y, {"w": w, "x": x})
        src = g.source
        gm.backward(y)
    assert isinstance(g, graphviz.Digraph)
    labels = _labels(src)
    ops = [l.split("\\n")[0] for l in labels if l.startswith("#")]
    assert [o.split(" ", 1)[1].split("(")[0] for o in ops] == ["MatrixMul", "Elemwise", "Reduce"], ops
    assert "Elemwise(relu)" in ops[1] and "mode='sum'" in ops[2]
    assert any("grad path: vjp" in l for l in labels)
    # the attached tensor, named and highlighted, with its shape; x has no gradient: not drawn
    assert re.search(r'label="w\\n\(3, 2\) float32".*fillcolor=lightblue', src)
    assert "x\\n" not in src
    assert any("1 of 2 inputs without gradient" in l for l in labels)
    # the output, and the edges labelled with shapes and dtypes
    assert re.search(r'label="y\\n\(\) float32".*fillcolor=orange', src)
    assert "(4, 2) float32 -> in0" in src
    assert src.count("->") >= 4


def test_shapes_from_the_tape_without_record_details_and_custom_rules():
    class Square(Function):
        def forward(self, x):
            return x * x

        def backward(self, dy):
            return dy * 2

    a = gc.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3))
    gm = GradManager().attach([a])
    with gm:
        y = F.exp(Square()(a)) * a
        src = gc.visualize(y, {"a": a}).source
        gm.backward(y.sum())
    assert "grad path: _grad_rule" in src
    assert "Elemwise(exp)" in src and "Elemwise(mul)" in src
    # exp saves its output, mul both inputs: those edges know their shapes
    assert "(2, 3) float32 -> in0" in src
    assert re.search(r'label="y\\n\(2, 3\) float32"', src)


def test_nested_managers_give_one_cluster_each_and_unrecorded_tensors_say_so():
    x = gc.tensor([1.0, 2.0])
    outer, inner = GradManager().attach(x), GradManager().attach(x)
    with outer, inner:
        y = (x * x).sum()
        src = gc.visualize(y).source
    assert "cluster_0" in src and "cluster_1" in src
    src = gc.visualize(gc.tensor([1.0])).source
    assert "not recorded by any active GradManager" in src
    with pytest.raises(TypeError, match="must be a Tensor"):
        gc.visualize([1.0])


@pytest.fixture
def model_graph():
    net = M.Sequential(M.Conv2d(1, 2, 3), M.ReLU(), M.Flatten(), M.Linear(8, 3))
    gm = GradManager().attach(net.parameters())
    with gm:
        with gc.record_details():
            loss = F.cross_entropy(net(gc.tensor(np.ones((2, 1, 4, 4), np.float32))), gc.tensor([0, 2]))
        g = gc.visualize(loss, dict(net.named_parameters()))
        gm.backward(loss)
    return g


def test_model_graph_names_the_parameters(model_graph):
    src = model_graph.source
    for name in ("0.weight", "0.bias", "3.weight", "3.bias"):
        assert f'label="{name}\\n' in src, name
    assert "Conv" in src and "fillcolor=lightblue" in src


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot program is not installed here "
                    "(apt-get install graphviz); the DOT source is checked by the other tests")
def test_renders_svg_where_dot_exists(model_graph):
    svg = model_graph.pipe(format="svg").decode()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "0.weight" in svg
