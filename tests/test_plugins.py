"""The example plugins under plugins/ and the two broken fixtures under
tests/plugin_fixtures/, installed with pip and found through their real
``gradcore.ops`` entry points.

The packages are pip-installed once per session into a private target
folder (``pip install --target``: real dist-info metadata and entry points)
that only the subprocesses of these tests put on their path. Installing them
into the running interpreter instead would leave a broken plugin (which
makes ``gradcore ops`` exit 1) and a MatrixMul grad rule behind for every
later test and every later run. Every check runs in a fresh interpreter, so
the registry state is clean each time.
"""
import importlib.metadata
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [
    ROOT / "plugins" / "gradcore-fused-act",
    ROOT / "plugins" / "gradcore-decomp",
    ROOT / "plugins" / "gradcore-fastrules",
    ROOT / "tests" / "plugin_fixtures" / "broken_plugin",
    ROOT / "tests" / "plugin_fixtures" / "conflicting_plugin",
]
PLUGIN_MODULES = ["gradcore_fused_act", "gradcore_decomp", "gradcore_fastrules",
                  "gradcore_broken_fixture", "gradcore_conflicting_fixture"]
BROKEN, CONFLICTING = "gradcore-test-broken", "gradcore-test-conflicting"


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory):
    """A folder holding the five packages, installed by pip."""
    for mod in ("pip", "setuptools"):
        # asked of the installed distributions, not by find_spec: setuptools'
        # distutils hack answers find_spec("pip") by switching this process to
        # the standard library's distutils, which later broke torch.compile's
        # inductor in the same pytest worker
        try:
            importlib.metadata.version(mod)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{mod} is not installed in this interpreter, so the plugins cannot be pip-installed")
    site = tmp_path_factory.mktemp("plugin_site")
    src = tmp_path_factory.mktemp("plugin_src")
    for pkg in PACKAGES:
        # build from a copy: an in-tree build would leave build/ and
        # *.egg-info/ in the source tree
        copy = src / pkg.name
        shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
               "--disable-pip-version-check", "--no-input", "--target", str(site), str(copy)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        except subprocess.TimeoutExpired:
            pytest.skip(f"pip install of {pkg.name} timed out")
        if res.returncode != 0:
            pytest.skip(f"pip install of {pkg.name} failed (exit {res.returncode}): "
                        f"{(res.stderr or res.stdout).strip()[-1500:]}")
    return site


def _env(site, **extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRADCORE_NO_PLUGINS", "GRADCORE_BLOCK_PLUGINS", "PYTHONWARNINGS")}
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env.update(extra)
    return env


def run_py(site, code, **env):
    """Run ``code`` in a fresh interpreter that sees the installed plugins."""
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env=_env(site, **env), cwd=str(site.parent), timeout=120)
    assert res.returncode == 0, f"subprocess failed:\n{res.stdout}\n{res.stderr}"
    return res


def test_packages_are_installed_with_entry_points(plugin_site):
    run_py(plugin_site, """
        from importlib import metadata
        eps = {ep.dist.name: ep.value for ep in metadata.entry_points(group="gradcore.ops")}
        assert eps["gradcore-fused-act"] == "gradcore_fused_act:register", eps
        assert eps["gradcore-decomp"] == "gradcore_decomp:register", eps
        assert eps["gradcore-fastrules"] == "gradcore_fastrules:register", eps
        assert eps["gradcore-test-broken"] == "gradcore_broken_fixture:register", eps
        assert eps["gradcore-test-conflicting"] == "gradcore_conflicting_fixture:register", eps
        assert eps["gradcore"] == "gradcore.ops:register", eps
    """)


def test_discovery_through_entry_points(plugin_site):
    run_py(plugin_site, """
        import warnings
        import gradcore
        from gradcore import registry
        from gradcore.ops import MatrixMul
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fused = gradcore.ops.get("FusedBiasGelu")
            mish = gradcore.ops.get("Mish")
            entries = {e.name: e for e in registry.entries()}
            registry.entries(); registry.failures(); gradcore.ops.get("Elemwise")
        import gradcore_fused_act, gradcore_decomp
        assert fused is gradcore_fused_act.FusedBiasGelu
        assert mish is gradcore_decomp.Mish
        e = entries["FusedBiasGelu"]
        assert (e.dist, e.grad_path, e.devices) == ("gradcore-fused-act", "_grad_rule", ["cpu", "cuda"]), e
        e = entries["Mish"]
        assert (e.dist, e.grad_path) == ("gradcore-decomp", "decompose"), e
        assert fused.dist == "gradcore-fused-act" and mish.dist == "gradcore-decomp"
        # fastrules owns no op: it gives the standard MatrixMul a registered rule
        e = entries["MatrixMul"]
        assert e.cls is MatrixMul and (e.dist, e.grad_path) == ("gradcore", "registered rule"), e
        assert entries["Elemwise"].grad_path == "vjp"
        # each failing plugin is reported once, however often the registry is asked
        msgs = [str(w.message) for w in caught]
        assert sum("gradcore-test-broken" in m for m in msgs) == 1, msgs
        assert sum("gradcore-test-conflicting" in m for m in msgs) == 1, msgs
        assert sorted(f.dist for f in registry.failures()) == ["gradcore-test-broken", "gradcore-test-conflicting"]
    """)


def test_discovery_is_lazy(plugin_site):
    run_py(plugin_site, f"""
        import sys
        import numpy as np
        import gradcore as gc
        import gradcore.functional as F
        from gradcore import _core
        from gradcore.autodiff import GradManager
        from gradcore.ops import MatrixMul
        plugins = {PLUGIN_MODULES!r}
        x = gc.tensor(np.random.rand(3, 3).astype("float32"))
        gm = GradManager().attach([x])
        with gm:
            y = F.sum(F.relu(F.matmul(x, x)) * 2)
            gm.backward(y)
        assert x.grad is not None
        loaded = [m for m in plugins if m in sys.modules]
        assert loaded == [], loaded
        assert _core.registered_grad_rule(MatrixMul) is None
        # asking for an op loads them
        gc.ops.get("Elemwise")
        assert {{"gradcore_fused_act", "gradcore_decomp", "gradcore_fastrules"}} <= set(sys.modules)
        assert _core.registered_grad_rule(MatrixMul) is not None
    """)


def test_broken_plugin_is_reported_and_the_rest_works(plugin_site):
    res = run_py(plugin_site, """
        import numpy as np
        import pytest
        import gradcore as gc
        import gradcore.functional as F
        from gradcore import registry
        fails = [f for f in registry.failures() if f.dist == "gradcore-test-broken"]
        assert len(fails) == 1, registry.failures()
        assert fails[0].entry_point == "gradcore_broken_fixture:register"
        assert fails[0].error.startswith("ImportError: ") and "libnotthere.so" in fails[0].error, fails[0]
        # every other op works: standard ones, and the other plugins'
        from gradcore_fused_act import fused_bias_gelu
        from gradcore_decomp import mish
        x = gc.tensor(np.ones((2, 3), "float32"))
        assert fused_bias_gelu(x, gc.tensor(np.zeros(3, "float32"))).shape == (2, 3)
        assert mish(x).shape == (2, 3)
        assert F.matmul(x, F.transpose(x, (1, 0))).shape == (2, 2)
        with pytest.raises(KeyError, match="failed to load: gradcore-test-broken"):
            gc.ops.get("NoSuchOp")
    """)
    # the warning, once, with the distribution name and the error
    lines = [ln for ln in res.stderr.splitlines() if "gradcore-test-broken" in ln]
    assert len(lines) == 1 and "ImportError" in lines[0] and "libnotthere.so" in lines[0], res.stderr


def test_conflicting_plugin_is_rejected_naming_both(plugin_site):
    run_py(plugin_site, """
        import pytest
        import gradcore
        from gradcore import registry
        import gradcore_decomp
        fails = [f for f in registry.failures() if f.dist == "gradcore-test-conflicting"]
        assert len(fails) == 1, registry.failures()
        assert "'Mish'" in fails[0].error, fails[0]
        assert "gradcore-decomp" in fails[0].error and "gradcore-test-conflicting" in fails[0].error, fails[0]
        # the first claimant keeps the name; the rejected plugin is rolled back as a whole
        assert gradcore.ops.get("Mish") is gradcore_decomp.Mish
        with pytest.raises(KeyError):
            gradcore.ops.get("ConflictFixtureOp")
        names = {e.name: e.dist for e in registry.entries()}
        assert "gradcore-test-conflicting" not in names.values()
        assert names["FusedBiasGelu"] == "gradcore-fused-act" and names["Elemwise"] == "gradcore"
    """)


def test_no_plugins_loads_only_the_standard_library(plugin_site):
    run_py(plugin_site, f"""
        import sys
        import pytest
        import gradcore
        from gradcore import registry
        entries = registry.entries()
        assert entries and {{e.dist for e in entries}} == {{"gradcore"}}
        assert registry.failures() == []
        with pytest.raises(KeyError, match="'Mish'"):
            gradcore.ops.get("Mish")
        assert {{e.name: e for e in entries}}["MatrixMul"].grad_path == "vjp"
        assert not [m for m in {PLUGIN_MODULES!r} if m in sys.modules]
    """, GRADCORE_NO_PLUGINS="1")


def test_block_plugins_skips_the_named_distributions(plugin_site):
    # both fixtures blocked (one written the underscore way): nothing fails
    run_py(plugin_site, """
        import sys
        import gradcore
        from gradcore import registry
        assert registry.failures() == [], registry.failures()
        assert gradcore.ops.get("Mish").dist == "gradcore-decomp"
        assert "gradcore_broken_fixture" not in sys.modules and "gradcore_conflicting_fixture" not in sys.modules
    """, GRADCORE_BLOCK_PLUGINS="gradcore-test-broken, gradcore_test_conflicting")
    # gradcore-decomp blocked: the fixture's Mish no longer conflicts
    run_py(plugin_site, """
        import sys
        import gradcore
        from gradcore import registry
        assert "gradcore_decomp" not in sys.modules
        assert gradcore.ops.get("Mish").dist == "gradcore-test-conflicting"
        assert gradcore.ops.get("FusedBiasGelu").dist == "gradcore-fused-act"
        assert [f.dist for f in registry.failures()] == ["gradcore-test-broken"], registry.failures()
    """, GRADCORE_BLOCK_PLUGINS="gradcore-decomp")


def _cli(site, **env):
    return subprocess.run([sys.executable, "-m", "gradcore.cli", "ops"], capture_output=True, text=True,
                          env=_env(site, **env), cwd=str(site.parent), timeout=120)


def test_cli_lists_plugin_ops_and_failures(plugin_site):
    res = _cli(plugin_site)
    assert res.returncode == 1, (res.stdout, res.stderr)
    rows = {ln.split()[0]: ln.split() for ln in res.stdout.splitlines() if ln.strip()}
    assert rows["FusedBiasGelu"][1:] == ["gradcore-fused-act", "cpu,cuda", "_grad_rule"], rows
    assert rows["Mish"][1:3] == ["gradcore-decomp", "cpu,cuda"] and "decompose" in " ".join(rows["Mish"])
    assert "registered rule" in " ".join(rows["MatrixMul"])
    both = res.stdout + res.stderr
    broken = [ln for ln in both.splitlines() if BROKEN in ln]
    assert len(broken) == 1 and broken[0].startswith("FAILED plugin gradcore-test-broken"), both
    assert "ImportError" in broken[0] and "libnotthere.so" in broken[0]
    conflict = [ln for ln in both.splitlines() if CONFLICTING in ln]
    assert len(conflict) == 1 and "gradcore-decomp" in conflict[0], both
    ok = _cli(plugin_site, GRADCORE_BLOCK_PLUGINS=f"{BROKEN},{CONFLICTING}")
    assert ok.returncode == 0 and "FAILED" not in ok.stdout and "FusedBiasGelu" in ok.stdout, ok.stdout + ok.stderr


def test_plugin_ops_values_and_gradients(plugin_site):
    run_py(plugin_site, """
        import math
        import numpy as np
        import pytest
        import gradcore as gc
        from gradcore.op import OpError
        from gradcore.testing import gradcheck, gradgradcheck
        from gradcore_fused_act import FusedBiasGelu, fused_bias_gelu
        from gradcore_decomp import mish

        rng = np.random.default_rng(0)
        def gelu_ref(h):
            return 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))

        # FusedBiasGelu (own _grad_rule): values, float32 and float64
        x, b = rng.standard_normal((3, 4)), rng.standard_normal(4)
        for dt, tol in (("float64", 1e-12), ("float32", 1e-6)):
            y = fused_bias_gelu(gc.tensor(x, dtype=dt), gc.tensor(b, dtype=dt))
            assert y.dtype == np.dtype(dt)
            np.testing.assert_allclose(y.numpy(), gelu_ref(x + b), rtol=tol, atol=tol)
        for shape in [(3, 4), (2, 1, 4), (4,)]:
            xs = [gc.tensor(rng.standard_normal(shape) * 1.5, dtype="float64"),
                  gc.tensor(rng.standard_normal(4), dtype="float64")]
            assert gradcheck(fused_bias_gelu, xs)
            assert gradgradcheck(fused_bias_gelu, xs)
        with pytest.raises(OpError, match="FusedBiasGelu"):
            fused_bias_gelu(gc.tensor(np.ones((2, 3))), gc.tensor(np.ones(4)))
        assert "gc_fused_bias_gelu_float" in FusedBiasGelu().cuda_source("float")

        # Mish (Composite, backward graph derived from the decomposition)
        x = rng.standard_normal((3, 5)) * 2
        np.testing.assert_allclose(mish(gc.tensor(x, dtype="float64")).numpy(),
                                   x * np.tanh(np.logaddexp(x, 0)), rtol=1e-12, atol=1e-12)
        for shape in [(3, 5), (), (0, 2)]:
            xs = [gc.tensor(rng.standard_normal(shape), dtype="float64")]
            assert gradcheck(mish, xs)
            assert gradgradcheck(mish, xs)
        with pytest.raises(OpError, match="Mish"):
            mish(gc.tensor(np.arange(3), dtype="int32"))
    """)


def test_fastrules_rule_is_used_for_2d_float32_and_falls_back_otherwise(plugin_site):
    run_py(plugin_site, """
        import numpy as np
        import gradcore as gc
        import gradcore.functional as F
        from gradcore.autodiff import GradManager
        from gradcore.testing import gradcheck, gradgradcheck
        gc.ops.get("MatrixMul")                  # load the plugins: installs the rule
        from gradcore_fastrules import stats

        rng = np.random.default_rng(1)
        def grads(a, b, dt, **kw):
            ta, tb = gc.tensor(a, dtype=dt), gc.tensor(b, dtype=dt)
            gm = GradManager().attach([ta, tb])
            with gm:
                y = F.matmul(ta, tb, **kw)
                gm.backward(y, gc.tensor(np.ones(y.shape), dtype=dt))
            return y, ta.grad, tb.grad

        a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
        ones = np.ones((3, 5))

        # plain 2-D float32: the rule runs, gradients are right
        stats.update(used=0, fallback=0)
        y, ga, gb = grads(a, b, "float32")
        assert stats == {"used": 1, "fallback": 0}, stats
        assert y.dtype == ga.dtype == gb.dtype == np.float32
        np.testing.assert_allclose(y.numpy(), a @ b, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ga.numpy(), ones @ b.T, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(gb.numpy(), a.T @ ones, rtol=1e-5, atol=1e-5)

        # not recording: the plain kernel runs, no rule
        F.matmul(gc.tensor(a, dtype="float32"), gc.tensor(b, dtype="float32"))
        assert stats == {"used": 1, "fallback": 0}, stats

        # float64, transposed, batched: the rule declines, gradients still right
        stats.update(used=0, fallback=0)
        y, ga, gb = grads(a, b, "float64")
        np.testing.assert_allclose(ga.numpy(), ones @ b.T, rtol=1e-12)
        y, ga, gb = grads(a.T.copy(), b, "float32", transpose_a=True)
        np.testing.assert_allclose(ga.numpy(), (ones @ b.T).T, rtol=1e-5, atol=1e-5)
        a3, b3 = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 5))
        y, ga, gb = grads(a3, b3, "float32")
        np.testing.assert_allclose(gb.numpy(), np.swapaxes(a3, 1, 2) @ np.ones((2, 3, 5)), rtol=1e-5, atol=1e-5)
        assert stats["used"] == 0 and stats["fallback"] == 3, stats

        # float64 first and second order (fallback path)
        xs = [gc.tensor(a, dtype="float64"), gc.tensor(b, dtype="float64")]
        assert gradcheck(F.matmul, xs) and gradgradcheck(F.matmul, xs)

        # first and second order through the rule: float32 inside, checked
        # in float64 outside (bilinear, so coarse differences are exact up to rounding)
        stats.update(used=0, fallback=0)
        f32 = lambda p, q: F.astype(F.matmul(F.astype(p, "float32"), F.astype(q, "float32")) ** 2, "float64")
        assert gradcheck(f32, xs, eps=1e-2, atol=2e-3, rtol=2e-3)
        assert gradgradcheck(f32, xs, eps=1e-2, atol=2e-3, rtol=2e-3)
        assert stats["used"] > 0, stats
    """)


def test_fused_act_cuda_source_compiles(plugin_site, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    res = run_py(plugin_site, """
        from gradcore_fused_act import FusedBiasGelu
        print(FusedBiasGelu().cuda_source("float") + FusedBiasGelu().cuda_source("double"))
    """)
    src = tmp_path / "fused.cu"
    src.write_text(res.stdout)
    out = subprocess.run([nvcc, "--ptx", "-o", str(tmp_path / "fused.ptx"), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    ptx = (tmp_path / "fused.ptx").read_text()
    assert "gc_fused_bias_gelu_float" in ptx and "gc_fused_bias_gelu_double" in ptx


@pytest.mark.parametrize("name, dist, expect", [
    ("fused_act", "gradcore-fused-act", ["FusedBiasGelu", "| grad "]),
    ("gradcore-decomp", "gradcore-decomp", ["Mish", "| gradgrad "]),
    # a grad-rule-only plugin: its rule against MatrixMul's own gradient, and its fallback
    ("gradcore-fastrules", "gradcore-fastrules", ["rule[accepted] | passed", "rule[fallback] | passed"]),
])
def test_gradcore_check_passes_each_example_plugin(plugin_site, name, dist, expect):
    """``gradcore check`` by entry-point or distribution name: every check
    runs (no op skipped for missing examples), none fails."""
    res = subprocess.run([sys.executable, "-m", "gradcore.cli", "check", name], capture_output=True, text=True,
                         env=_env(plugin_site, GRADCORE_BLOCK_PLUGINS=f"{BROKEN},{CONFLICTING}"),
                         cwd=str(plugin_site.parent), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = res.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"{dist}:") and " 0 failed" in summary, summary
    assert " 0 check(s) passed" not in summary and "no examples()" not in res.stdout
    for text in expect:
        assert any(text in line and "passed" in line for line in res.stdout.splitlines()), (text, res.stdout)
