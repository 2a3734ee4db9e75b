"""The tutorial's Python blocks run, in order, in one namespace: what the
docs show is what works."""
import re
from pathlib import Path

import pytest

from gradcore import registry

DOCS = Path(__file__).resolve().parent.parent / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path):
    return BLOCK.findall(path.read_text())


@pytest.fixture
def scratch_registry():
    """The docs register ops; leave the registry as it was."""
    with registry.preserved():
        yield


def test_tutorial_has_code():
    blocks = python_blocks(DOCS / "write-your-first-op.md")
    assert len(blocks) >= 4
    text = "\n".join(blocks)
    for needle in ("def infer", "def cpu", "cuda_source", "def vjp", "register_op", "check_op", "gradcheck",
                   "gradcore.to_torch(MyCube)", "torch.nn.Module", "torch.optim", "from_torch"):
        assert needle in text, needle


@pytest.mark.parametrize("doc", ["write-your-first-op.md"])
def test_doc_python_blocks_run(doc, scratch_registry, capsys):
    ns = {"__name__": f"docs_{doc.replace('-', '_').replace('.', '_')}"}
    for k, block in enumerate(python_blocks(DOCS / doc)):
        try:
            exec(compile(block, f"{doc} (python block {k + 1})", "exec"), ns)
        except Exception as exc:
            pytest.fail(f"{doc}: python block {k + 1} failed: {type(exc).__name__}: {exc}\n{block}")
    # the tutorial's op really passes every check, and its pytest helpers work
    from gradcore.pytest_plugin import _run_check
    ns["test_my_cube"](_run_check)
    assert ns["check_op"](ns["MyCube"]).ok


def test_visualize_doc_runs_and_its_picture_matches():
    pytest.importorskip("graphviz", reason="gradcore[viz] is part of .[test]")
    ns = {"__name__": "docs_visualize_md"}
    for k, block in enumerate(python_blocks(DOCS / "visualize.md")):
        exec(compile(block, f"visualize.md (python block {k + 1})", "exec"), ns)
    src = ns["graph"].source
    svg = (DOCS / "images" / "mlp_graph.svg").read_text()
    # the committed picture is of this graph: the same ops and parameters
    for needle in ("MatrixMul", "Elemwise(relu)", "LogSoftmax", "IndexingOneHot", "0.weight", "2.bias"):
        assert needle in src and needle in svg, needle
    assert "images/mlp_graph.svg" in (DOCS / "visualize.md").read_text()
