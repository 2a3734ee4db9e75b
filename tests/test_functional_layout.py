"""gradcore.functional is a package laid out by op family: the generated
elementwise module is up to date (and so is its compiled build), every
public function is a real def in exactly one module, and F and F.nn expose
what they always did."""
import ast
import doctest
import inspect
from pathlib import Path

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.core import apply
from gradcore.functional import _gen_elemwise_table as gen, elemwise_table
from gradcore.ops import elemwise

PACKAGE = Path(F.__file__).parent
FAMILIES = ("elemwise_table", "elemwise", "shape", "reduce", "linalg", "indexing", "creation", "conv", "vision", "nn", "loss", "rnn")

# F.nn before the split, MegEngine's names
NN_NAMES = {
    "adaptive_avg_pool2d", "adaptive_max_pool2d", "avg_pool2d", "batch_norm", "binary_cross_entropy", "conv1d",
    "conv2d", "cross_entropy", "dropout", "embedding", "gelu", "group_norm", "hinge_loss", "hsigmoid", "hswish",
    "indexing_one_hot", "l1_loss", "layer_norm", "leaky_relu", "linear", "log_softmax", "logsigmoid", "logsoftmax",
    "logsumexp", "max_pool2d", "normalize", "one_hot", "pad", "pixel_shuffle", "prelu", "relu", "relu6",
    "sigmoid", "silu", "softmax", "softplus", "square_loss", "tanh", "topk_accuracy",
    "conv3d", "conv_transpose1d", "conv_transpose2d", "interpolate",
    "rnn_cell", "lstm_cell", "gru_cell", "rnn_layer", "nll_loss", "smooth_l1_loss", "kl_div", "ctc_loss",
    "cosine_similarity", "scaled_dot_product_attention", "instance_norm", "local_response_norm", "general_norm",
    "sliding_window", "sliding_window_transpose", "conv_transpose3d", "remap", "warp_affine", "warp_perspective",
    "sync_batch_norm", "local_conv2d", "region_restricted_conv", "multi_head_attention",
    "deformable_psroi_pooling"}


REGENERATE = ("gradcore/functional/elemwise_table.py is out of date: run "
              "python -m gradcore.functional._gen_elemwise_table, then rebuild its compiled copy "
              "(pip install -e . or python setup.py build_ext --inplace)")


def test_generated_elemwise_module_is_up_to_date():
    assert (PACKAGE / "elemwise_table.py").read_text() == gen.render(), REGENERATE


def test_the_generated_text_does_not_depend_on_numpys_printing():
    # NumPy's array printing differs between versions (and with print
    # options): the generator shows rounded Python floats instead
    with np.printoptions(precision=2, floatmode="fixed", sign="+", legacy="1.13"):
        assert gen.render() == (PACKAGE / "elemwise_table.py").read_text(), REGENERATE


def test_generated_examples_show_no_numpy_array_and_run_as_doctests():
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    docs = {"elemwise_table": elemwise_table.__doc__}
    docs.update((r.mode, getattr(elemwise_table, r.mode).__doc__) for r in gen._rows())
    for name, doc in docs.items():
        test = parser.get_doctest(doc, {"gc": gc, "F": F, "np": np}, name, None, 0)
        assert len(test.examples) == 1, name
        assert not any("array(" in e.want for e in test.examples), test.name
        runner.run(test)
    assert runner.failures == 0


@pytest.mark.parametrize("values, decimals, text", [
    ([0.6666667, 1.5], 4, "[0.6667, 1.5]"),
    ([0.9051482], 3, "[0.905]"),           # tanh(1.5): 0.9051 or 0.9052, by its last bits
    ([0.40546513], 4, "[0.4055]"),         # NumPy 1.x and 2.x print log1p(0.5) differently
])
def test_example_values_are_rounded_away_from_rounding_boundaries(values, decimals, text):
    assert gen._decimals(values, "f") == decimals
    assert repr(gen.shown(values, decimals)) == text


def test_the_loaded_elemwise_module_matches_the_table():
    # a compiled build of an older elemwise_table.py would still be imported first
    assert elemwise_table.TABLE_DIGEST == gen.digest(), \
        f"{elemwise_table.__file__} was built from an older table: rebuild (python setup.py build_ext --inplace)"


@pytest.mark.parametrize("mode", elemwise.modes())
def test_each_table_row_is_a_def_with_hints_and_an_example(mode):
    fn = getattr(F, mode)
    home = "gradcore.functional.elemwise" if mode in gen.HAND_WRITTEN else "gradcore.functional.elemwise_table"
    assert fn.__module__ == home and fn.__name__ == mode
    assert "Example::" in fn.__doc__ and f">>> F.{mode}(" in fn.__doc__
    nin = elemwise.Elemwise(mode).nin
    # (MegEngine's names: x, y, z; inp for the few megengine.functional.nn names so)
    names = list(gen._PARAM_NAMES.get(mode, "xyz"[:nin]))
    assert list(inspect.signature(fn).parameters)[-nin:] == names or mode in gen.HAND_WRITTEN
    if mode not in gen.HAND_WRITTEN:
        assert "Tensor" in str(inspect.signature(fn))
    # the same result as the op itself
    lo, hi = elemwise.ROWS[mode].domain
    args = [gc.tensor(np.array([True, False])) if mode.startswith("logical_") or (mode == "where" and k == 0)
            else gc.tensor(np.array([lo + (hi - lo) * 0.3, lo + (hi - lo) * 0.6], np.float32)) for k in range(nin)]
    np.testing.assert_array_equal(fn(*args).numpy(), apply(elemwise.Elemwise(mode), *args)[0].numpy())


def _top_level_names(module: str) -> set:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_every_public_function_is_defined_in_exactly_one_family_module():
    homes = {}
    for module in FAMILIES:
        for name in _top_level_names(module):
            if not name.startswith("_") and name not in ("TABLE_DIGEST",) and not name.isupper():
                homes.setdefault(name, []).append(module)
    assert {n: m for n, m in homes.items() if len(m) > 1} == {}
    for name in dir(F):
        obj = getattr(F, name)
        if name.startswith("_") or not callable(obj) or isinstance(obj, type) and not issubclass(obj, Exception):
            continue
        if getattr(obj, "__module__", "").startswith("gradcore.functional") and obj.__name__ == name:  # (not an alias)
            assert name in homes, name
            assert obj.__module__ == f"gradcore.functional.{homes[name][0]}", name


def test_no_names_injected_and_no_star_imports():
    for path in PACKAGE.glob("*.py"):
        text = path.read_text()
        assert "globals()" not in text and "setattr(" not in text, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                assert all(a.name != "*" for a in node.names), path.name


def test_f_nn_keeps_megengine_names():
    assert set(F.nn.__all__) == NN_NAMES
    for name in NN_NAMES:
        assert getattr(F.nn, name) is getattr(F, name), name


def test_megengine_aliases_are_the_table_functions():
    assert (F.equal, F.not_equal, F.less, F.less_equal, F.greater, F.greater_equal) == \
        (F.eq, F.ne, F.lt, F.le, F.gt, F.ge)


def test_private_helpers_used_elsewhere_stay_importable():
    # gradcore.module and gradcore.tensor_methods use these
    from gradcore.functional import _check_drop_prob, _Reduce, _t  # noqa: F401
    assert F._t(1.0).dtype == np.float32


def test_error_messages_still_name_the_public_function():
    with pytest.raises(TypeError, match="^roll: "):
        F.roll(gc.tensor([1.0]), 1.5, 0)
    with pytest.raises(TypeError, match="^zeros_like: expected a tensor, got None"):
        F.zeros_like(None)
    with pytest.raises(TypeError, match="^flatten: expected a tensor, got None"):
        F.flatten(None)


def test_the_generated_module_works_uncompiled_too():
    # without a build (or with the .so removed) the plain .py is imported
    import importlib.util
    spec = importlib.util.spec_from_file_location("gradcore.functional._table_source", PACKAGE / "elemwise_table.py")
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)
    assert source.TABLE_DIGEST == gen.digest()
    x, y = gc.tensor([0.5, 2.0]), gc.tensor([1.5, -1.0])
    np.testing.assert_array_equal(source.add(x, y).numpy(), F.add(x, y).numpy())
    np.testing.assert_array_equal(source.exp(x=x).numpy(), F.exp(x).numpy())


# MegEngine's functional.loss and functional.elemwise are modules users reach
# through F (``F.loss.square_loss``, ``F.elemwise.add``): gradcore's modules of
# those names hold every one of their names, the same functions as F's
MEGENGINE_LOSS = ("l1_loss", "square_loss", "cross_entropy", "binary_cross_entropy", "hinge_loss", "ctc_loss")
MEGENGINE_ELEMWISE = (
    "abs", "add", "acos", "asin", "atan", "atan2", "asinh", "acosh", "atanh", "ceil", "clip", "cos", "cosh", "div",
    "equal", "erf", "exp", "expm1", "floor", "floor_div", "greater", "greater_equal", "left_shift", "less",
    "less_equal", "log", "log1p", "logical_and", "logical_not", "logical_or", "logical_xor", "logaddexp", "maximum",
    "minimum", "mod", "mul", "neg", "not_equal", "pow", "right_shift", "round", "sin", "sinh", "sqrt", "square",
    "sub", "tan", "tanh")


@pytest.mark.parametrize("module, names", [("loss", MEGENGINE_LOSS), ("elemwise", MEGENGINE_ELEMWISE)])
def test_megengine_submodule_names_reach_the_same_functions(module, names):
    sub = getattr(F, module)
    missing = [n for n in names if not hasattr(sub, n)]
    assert missing == []
    assert [n for n in names if getattr(sub, n) is not getattr(F, n)] == []


def test_f_loss_values_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    pred, label = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(F.loss.square_loss(gc.tensor(pred), gc.tensor(label)).item(),
                               torch.nn.functional.mse_loss(torch.tensor(pred), torch.tensor(label)).item(), rtol=1e-6)
    cls = np.array([2, 0, 1, 2])
    np.testing.assert_allclose(F.loss.cross_entropy(gc.tensor(pred), gc.tensor(cls)).item(),
                               torch.nn.functional.cross_entropy(torch.tensor(pred), torch.tensor(cls)).item(),
                               rtol=1e-6)
    # probabilities (with_logits=False) take the composed path: log, then one-hot indexing
    probs = np.exp(pred) / np.exp(pred).sum(1, keepdims=True)
    np.testing.assert_allclose(F.loss.cross_entropy(gc.tensor(probs), gc.tensor(cls), with_logits=False).item(),
                               torch.nn.functional.cross_entropy(torch.tensor(pred), torch.tensor(cls)).item(),
                               rtol=1e-5)
    x, y = gc.tensor([1000.0, -3.0]), gc.tensor([1000.0, 2.0])
    np.testing.assert_allclose(F.elemwise.logaddexp(x, y).numpy(),
                               torch.logaddexp(torch.tensor([1000.0, -3.0]), torch.tensor([1000.0, 2.0])).numpy(),
                               rtol=1e-6)
