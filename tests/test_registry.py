"""The standard library registers itself through the gradcore.ops entry point."""
import subprocess
import sys
from importlib import metadata

import gradcore
from gradcore import registry
from gradcore.ops import Elemwise, MatrixMul


def test_standard_library_comes_from_the_entry_point():
    eps = [ep for ep in metadata.entry_points(group="gradcore.ops") if ep.dist.name == "gradcore"]
    assert [ep.value for ep in eps] == ["gradcore.ops:register"]
    assert gradcore.ops.get("Elemwise") is Elemwise
    assert gradcore.ops.get("MatrixMul") is MatrixMul
    entry = {e.name: e for e in registry.entries()}["MatrixMul"]
    assert entry.dist == "gradcore" and entry.grad_path == "vjp"


def test_unknown_op_is_a_clear_error():
    import pytest
    with pytest.raises(KeyError, match="no op named 'nope'"):
        gradcore.ops.get("nope")


def test_cli_lists_ops():
    out = subprocess.run([sys.executable, "-m", "gradcore.cli", "ops"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "Elemwise" in out.stdout and "vjp" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "gradcore.cli", "nonsense"], capture_output=True, text=True)
    assert bad.returncode == 2
