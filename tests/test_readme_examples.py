"""The README's "Around the engine" examples run as written."""
import re
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
PRELUDE = ("import numpy as np, torch, gradcore as gc, gradcore.functional as F\n"
           "from gradcore.autodiff import GradManager, detect_anomaly\n")


def _examples():
    text = README.read_text()
    section = text[text.index("- Around the engine"):text.index("- Data-parallel training over MPI")]
    return [textwrap.dedent(b) for b in re.findall(r"^ +```python\n(.*?)^ +```", section, re.S | re.M)]


def test_there_are_five_two_line_examples():
    blocks = _examples()
    assert len(blocks) == 5
    assert all(len(b.strip().splitlines()) == 2 for b in blocks)


@pytest.mark.parametrize("k", range(5))
def test_readme_example_runs(k, tmp_path, monkeypatch, capsys):
    pytest.importorskip("graphviz")
    from gradcore.autodiff import AnomalyError
    block = _examples()[k].replace("/tmp/state.gc", str(tmp_path / "state.gc"))
    ns = {}
    exec(PRELUDE, ns)
    if "AnomalyError" in block:
        with pytest.raises(AnomalyError, match=r"Elemwise\(log\)"):
            exec(compile(block, f"README example {k + 1}", "exec"), ns)
        return
    exec(compile(block, f"README example {k + 1}", "exec"), ns)
    if "from_dlpack(torch" in block:
        ns["a"][0] = 7.0
        assert ns["t"].numpy()[0] == 7.0
    if "gc.load" in block:
        assert ns["state"]["step"] == 3
    if "gc.jvp" in block:
        assert ns["tangent"].shape == (2,) and ns["gx"].numpy().tolist() == [2.0, 4.0]
    if "visualize" in block:
        assert "digraph" in capsys.readouterr().out
