"""The op suite's fixtures: the ``h`` fixture hands tests the reference
computations of tests/oracle.py (finite differences through
gradcore.testing, or PyTorch), so a wrong op makes a test fail."""
from __future__ import annotations

import types
from pathlib import Path

import pytest

from oracle import (assert_close, check_error, check_grads, compare_with_torch, error_of, gc_vjp,
                    to_torch, torch_vjp)

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    # a NumPy kernel computing 0/0, log(-1), inf-inf... is an op bug here
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.filterwarnings("error::RuntimeWarning"))


@pytest.fixture
def h():
    return types.SimpleNamespace(gc_vjp=gc_vjp, torch_vjp=torch_vjp, to_torch=to_torch,
                                 assert_close=assert_close, compare=compare_with_torch,
                                 check_grads=check_grads, check_error=check_error,
                                 error_of=error_of)


@pytest.fixture
def nvcc_ptx(tmp_path):
    """Compile CUDA source text with ``nvcc --ptx`` (skip without nvcc);
    assert it compiles and return the PTX text."""
    import shutil
    import subprocess
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")

    def compile_(source, name="kernels"):
        path, out = tmp_path / f"{name}.cu", tmp_path / f"{name}.ptx"
        path.write_text(source)
        res = subprocess.run([nvcc, "--ptx", "-o", str(out), str(path)],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-4000:]
        return out.read_text()
    return compile_
