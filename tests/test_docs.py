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
    for needle in ("MatrixMul", "Elemwise(relu)", "CrossEntropy(axis=1", "Reduce(mode=", "0.weight", "2.bias"):
        assert needle in src and needle in svg, needle
    assert "images/mlp_graph.svg" in (DOCS / "visualize.md").read_text()


def test_interop_doc_runs_and_shows_what_it_says(capsys):
    ns = {"__name__": "docs_interop_md"}
    for k, block in enumerate(python_blocks(DOCS / "interop.md")):
        exec(compile(block, f"interop.md (python block {k + 1})", "exec"), ns)
    out = capsys.readouterr().out
    assert out.splitlines() == ["[5.0, 0.0, 0.0]", "[1.0, 2.0, 3.0]"]
    assert ns["t"].numpy().tolist() == [10.0, 3.0, 4.0]
    assert ns["u"].tolist() == [4.0, 3.0, 10.0]         # the copy of t[::-1]


def test_op_protocol_doc_runs_and_shows_each_path(capsys):
    from gradcore import _core
    ns = {"__name__": "docs_op_protocol_md"}
    try:
        for k, block in enumerate(python_blocks(DOCS / "op-protocol.md")):
            exec(compile(block, f"op-protocol.md (python block {k + 1})", "exec"), ns)
    finally:
        if "Double" in ns:
            _core.unregister_grad_rule(ns["Double"])
    assert capsys.readouterr().out.splitlines() == [
        "Square [2.0, 6.0]", "SquareByRule [2.0, 6.0]", "Double [2.0, 2.0]", "[True, False, True] [True]"]


ROOT = DOCS.parent
# a path in the docs: in backticks, a Markdown link target, or any ../ path
_PATH = re.compile(r"`([^`\s]+/[^`\s]*)`|\]\(([^)#\s]+)\)|(?<![\w.])(\.\./[\w./-]+)")


def _markdown_files():
    skip = {"build", "demo_out", ".git", ".pytest_cache"}
    return [p for p in ROOT.rglob("*.md") if not skip.intersection(p.relative_to(ROOT).parts)
            and "egg-info" not in str(p)]


def test_docs_point_nowhere_outside_the_repository():
    # the docs stand on their own (issue 24, item 9): no reference to a file
    # outside the checkout (../shared/SPEC.md was one), and no scratch file
    # of a machine that ran something once (/tmp/...)
    bad = []
    for path in _markdown_files():
        text = path.read_text()
        for m in _PATH.finditer(text):
            ref = next(g for g in m.groups() if g)
            if ref.startswith(("http://", "https://", "mailto:")):
                continue
            if ref.startswith(("/tmp/", "/work/", "/home/", "/root/")) and ref != "/tmp/state.gc":
                bad.append((path.name, ref))     # (the README's example writes /tmp/state.gc)
            elif ".." in Path(ref).parts:
                target = (path.parent / ref).resolve()
                if not target.is_relative_to(ROOT.resolve()):
                    bad.append((path.name, ref))
        if "SPEC.md" in text:
            bad.append((path.name, "SPEC.md"))
    assert bad == [], bad
    assert (DOCS / "op-protocol.md").exists()


def test_benchmarks_readme_leads_with_the_current_figures():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[0] == "Current figures", headings
    # the history lives in the changelog, which every figure's row points to
    assert "CHANGELOG.md" in text and not re.search(r"^### \d{4}-\d\d-\d\d", text, re.M)
    assert re.search(r"^### \d{4}-\d\d-\d\d", (ROOT / "benchmarks" / "CHANGELOG.md").read_text(), re.M)
def test_serialization_doc_runs():
    ns = {"__name__": "docs_serialization_md"}
    blocks = python_blocks(DOCS / "serialization.md")
    assert blocks
    for k, block in enumerate(blocks):
        exec(compile(block, f"serialization.md (python block {k + 1})", "exec"), ns)
    assert ns["state"]["step"] == 3
