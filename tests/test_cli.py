"""``gradcore check DIST`` and ``gradcore doctor`` (``ops`` and ``demo`` are
covered in test_registry.py and test_demo.py)."""
import subprocess
import sys

import numpy as np
import pytest

from gradcore import cli, registry
from gradcore.op import Op


def run(*args):
    return subprocess.run([sys.executable, "-m", "gradcore.cli", *args], capture_output=True, text=True,
                          timeout=600)


def test_check_the_standard_library():
    out = run("check", "gradcore")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split("|")[0].strip() == "op" and "check" in lines[0] and "status" in lines[0]
    assert any(l.startswith("Elemwise ") and "| grad " in l and "passed" in l for l in lines)
    assert any(l.startswith("MatrixMul ") and "gradgrad" in l and "passed" in l for l in lines)
    # every standard op is checked (examples() or generated inputs), nothing skipped for lack of inputs
    assert any(l.startswith("Reduce ") and "| grad " in l and "passed" in l for l in lines)
    assert any(l.startswith("Transpose ") and "| gradgrad " in l and "passed" in l for l in lines)
    assert not any("| inputs " in l or "no examples()" in l for l in lines)
    from gradcore import registry
    n_standard = sum(1 for e in registry.entries() if e.dist == "gradcore")
    assert n_standard >= 52        # the op library's ops, the conv family's included
    assert "0 failed" in out.stdout and f"{n_standard} op(s)" in out.stdout


def test_check_help_explains():
    out = run("check", "--help")
    assert out.returncode == 0
    for key in ("entry point", "generated", "emulator", "not applicable", "Exit status 1"):
        assert key in out.stdout, key


def test_check_usage_and_unknown_distribution():
    out = run("check", "no-such-distribution")
    assert out.returncode == 2 and "no-such-distribution" in out.stderr
    assert run("check").returncode == 2
    assert run("check", "a", "b").returncode == 2


def test_check_of_an_installed_distribution_without_the_entry_point_group_says_so(capsys):
    # numpy is installed and declares entry points, none in the group gradcore.ops
    # (as a plugin whose pyproject.toml misspells the group)
    assert cli.main(["check", "numpy"]) == 2
    err = capsys.readouterr().err
    assert "'numpy' is installed, but registers ops only through an entry point in the group 'gradcore.ops'" in err
    assert "it declares " in err and "'console_scripts'" in err          # f2py's


class _Good(Op):
    name = "CliGood"

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return 2 * x

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 2,)

    @classmethod
    def examples(cls):
        return [(cls(), [np.array([1.0, 2.0])])]


class _Bad(_Good):
    name = "CliBad"

    def vjp(self, inputs, outputs, grads):
        return (grads[0] * 3,)


@pytest.fixture
def fake_dist():
    registry.load()
    saved_ops, saved_failures = dict(registry._state.ops), list(registry._state.failures)
    try:
        yield
    finally:
        registry._state.ops.clear()
        registry._state.ops.update(saved_ops)
        registry._state.failures[:] = saved_failures


def test_check_exit_codes_in_process(fake_dist, capsys):
    with registry._loading_as("cli-fake-good"):
        registry.register_op(_Good)
    with registry._loading_as("cli_fake_bad"):
        registry.register_op(_Bad)
        registry.register_op(_Good, name="CliGood2")
    assert cli.main(["check", "cli-fake-good"]) == 0
    out = capsys.readouterr().out
    assert "CliGood" in out and "failed" not in out.split("\n\n")[0]
    assert cli.main(["check", "cli-fake-bad"]) == 1        # names compared the PEP 503 way
    out = capsys.readouterr().out
    bad = [l for l in out.splitlines() if l.startswith("CliBad ") and "| grad " in l]
    assert bad and "failed" in bad[0] and "gradcheck" in bad[0]
    assert any(l.startswith("CliGood2 ") and "| grad " in l and "passed" in l for l in out.splitlines())


def test_check_takes_the_name_of_one_op(fake_dist, capsys):
    # an author iterating on one op of a package checks it alone by its name
    with registry._loading_as("cli_fake_bad"):
        registry.register_op(_Bad)
        registry.register_op(_Good, name="CliGood2")
    assert cli.main(["check", "CliGood2"]) == 0
    out = capsys.readouterr().out
    assert "CliGood2 " in out and "CliBad" not in out and "CliGood2: 1 op(s)" in out
    assert cli.main(["check", "CliBad"]) == 1
    assert "gradcheck" in capsys.readouterr().out
    assert cli.main(["check", "CliNoSuchOp"]) == 2
    assert "no op is named 'CliNoSuchOp'" in capsys.readouterr().err


def test_check_fails_when_no_check_ran(fake_dist, capsys):
    with registry._loading_as("cli-fake-good"):
        registry.register_op(_Good)
    # no device requested: every check skipped, which is not a pass
    assert cli.main(["check", "cli-fake-good", "--devices", ""]) == 1
    out = capsys.readouterr().out
    assert "no check ran" in out and "0 check(s) passed" in out


def test_check_generates_inputs_for_an_op_without_examples(fake_dist, capsys):
    class NoExamples(_Bad):
        name = "CliNoExamples"
        examples = None
    with registry._loading_as("cli-fake-generated"):
        registry.register_op(NoExamples)
    assert cli.main(["check", "cli-fake-generated", "--seed", "3"]) == 1     # its wrong gradient is caught
    out = capsys.readouterr().out
    assert "generated inputs, seed 3" in out and "gradcheck" in out


def test_check_reports_a_plugin_that_failed_to_load(fake_dist, capsys):
    registry._state.failures.append(registry.PluginFailure("cli-broken", "cli_broken:register",
                                                           "ImportError: nope"))
    assert cli.main(["check", "cli-broken"]) == 1
    assert "ImportError: nope" in capsys.readouterr().out


def test_ops_exit_codes(fake_dist, capsys):
    """`gradcore ops` lists and exits 0; a plugin that failed to load is
    listed and exits 1; an argument it does not take is a usage error (2)."""
    assert cli.main(["ops"]) == 0
    assert cli.main(["ops", "--bogus"]) == 2
    assert "takes no arguments, got --bogus" in capsys.readouterr().err
    registry._state.failures.append(registry.PluginFailure("cli-broken", "cli_broken:register",
                                                           "ImportError: nope"))
    assert cli.main(["ops"]) == 1
    assert "FAILED plugin cli-broken (cli_broken:register): ImportError: nope" in capsys.readouterr().out


def test_doctor_healthy():
    out = run("doctor")
    assert out.returncode == 0, out.stdout + out.stderr
    for key in ("compiled core", "_core", "Cython", "numpy", "BLAS", "host memory pool   on", "PyCUDA", "GPU",
                "nvcc", "mpi4py",
                "registry", "gradcore:", "healthy"):
        assert key in out.stdout, key


def test_doctor_reports_failed_plugins(fake_dist, capsys):
    registry._state.failures.append(registry.PluginFailure("cli-broken", "cli_broken:register",
                                                           "ImportError: nope"))
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "FAILED plugin cli-broken" in out and "problems:" in out
    assert cli.main(["doctor", "extra"]) == 2


def test_help_lists_the_new_commands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "gradcore check DIST" in out and "gradcore doctor" in out


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_ops_help_is_help_not_a_usage_error(flag, capsys):
    assert cli.main(["ops", flag]) == 0          # was exit 2: "takes no arguments, got --help"
    out = capsys.readouterr().out
    assert out.startswith("usage: gradcore ops") and "failed to load" in out
    assert cli.main(["ops", "extra"]) == 2
