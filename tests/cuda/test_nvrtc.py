"""Cold start: kernels compiled by NVRTC, the standard ones per family
(gradcore/cuda/nvrtc.py, families.py, cache.py; ops/kernel_families.py).

NVRTC needs neither a GPU nor a driver, so everything here compiles for
real. Counts are the behaviour asserted: a cold training step of the demo's
CNN compiles each family it uses once; a second process compiles nothing.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gradcore.cuda import KernelCache, KernelCompileError, families, nvrtc
from gradcore.devices import nvcc_path

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed (pip install nvidia-cuda-nvrtc)")
needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
HERE = Path(__file__).parent

# the kernel cache's test sources: a kernel, and one that does not compile (at line 5)
from test_cache import BROKEN, SRC as SCALE  # noqa: E402  (tests/cuda is on sys.path, as for fake_pycuda)


def _unit(name, ctype, body="y[0] = (T)x[0];"):
    """A source as the op library writes them: a typedef, a guarded helper, one kernel."""
    return (f"#ifndef GC_TEST_HELPER\n#define GC_TEST_HELPER\nstruct gc_test_pair {{ int a, b; }};\n#endif\n"
            f"typedef {ctype} T;\n"
            f'extern "C" __global__ void {name}(const T* x, T* y, gc_test_pair p) {{ {body} }}\n')


class _Catalog:
    """A small stand-in for ops/kernel_families.py."""
    FAMILIES = ("alpha", "beta")

    def __init__(self, broken=False):
        self.broken = broken

    def family_sources(self, family, ctype):
        tag = ctype.replace(" ", "_")
        units = [_unit(f"gc_{family}{k}_{tag}", ctype) for k in range(3)]
        if self.broken and family == "beta":
            units.append(_unit(f"gc_beta_bad_{tag}", ctype, "y[0] = undefined_name;"))
        return units


@pytest.fixture
def small_catalog(monkeypatch):
    """Install ``_Catalog`` for the test, and put the real catalog back after."""
    saved = (families._catalog, families._index, dict(families._programs))

    def install(catalog):
        families.install(catalog)
        return catalog
    yield install
    families._catalog, families._index = saved[0], saved[1]
    families._programs.clear()
    families._programs.update(saved[2])


# ---------------------------------------------------------------- the binding
@needs_nvrtc
def test_version_and_architectures():
    major, minor = nvrtc.version()
    assert major >= 12 and minor >= 0
    archs = nvrtc.supported_archs()
    assert 80 in archs and 90 in archs
    assert os.path.basename(nvrtc.library_path()).startswith("libnvrtc.so")


@needs_nvrtc
def test_ptx_and_cubin_are_compiled_for_real():
    ptx = nvrtc.compile_program(SCALE, "gc_test_scale", "compute_80")
    assert ptx.ok and ptx.kind == "ptx"
    text = ptx.image.decode()
    assert ".entry gc_test_scale(" in text and ".target sm_80" in text
    cubin = nvrtc.compile_program(SCALE, "gc_test_scale", "sm_90")
    assert cubin.ok and cubin.kind == "cubin"
    assert cubin.image[:4] == b"\x7fELF" and b"gc_test_scale" in cubin.image


@needs_nvrtc
def test_a_rejected_source_gives_the_log():
    out = nvrtc.compile_program(BROKEN, "gc_test_broken", "compute_80")
    assert not out.ok and out.image == b""
    assert 'gc_test_broken.cu(5): error: identifier "undefined_scale" is undefined' in out.log


@needs_nvrtc
def test_a_compile_error_names_the_kernel_and_quotes_the_nvrtc_log(tmp_path):
    cache = KernelCache(tmp_path, compiler="nvrtc")
    with pytest.raises(KernelCompileError) as info:
        cache.get("gc_test_broken", BROKEN)
    exc, msg = info.value, str(info.value)
    assert exc.name == "gc_test_broken" and exc.errors[0][0] == 5
    assert "gc_test_broken" in msg and "line 5" in msg and "y[i] = x[i] * undefined_scale;" in msg
    assert "compiler log" in msg and "1 error detected in the compilation of" in msg
    assert "1 error detected" in exc.log
    assert [p.name for p in tmp_path.iterdir()] == ["nvrtc-version.txt"]


# ---------------------------------------------------------------- the cache on NVRTC
@needs_nvrtc
def test_nvrtc_is_the_default_compiler_and_its_version_is_in_the_key(tmp_path, monkeypatch):
    cache = KernelCache(tmp_path)
    assert cache.compiler() == "nvrtc"
    assert cache.identity() == "nvrtc %d.%d ptx" % nvrtc.version()
    key = cache.key("gc_test_scale", SCALE)
    assert KernelCache(tmp_path, compiler="nvcc").key("gc_test_scale", SCALE) != key
    # the version is remembered next to the cache: a warm start does not load the library for it
    monkeypatch.setattr(nvrtc, "available", lambda: pytest.fail("NVRTC was loaded to read its version"))
    again = KernelCache(tmp_path)
    assert again.compiler() == "nvrtc" and again.key("gc_test_scale", SCALE) == key
    # another NVRTC (another file here: no record of it) is another key
    monkeypatch.undo()
    monkeypatch.setattr(nvrtc, "version", lambda: (99, 1))
    monkeypatch.setattr(nvrtc, "locate", lambda: str(Path(nvrtc.library_path()).parent))
    assert KernelCache(tmp_path).key("gc_test_scale", SCALE) != key


@needs_nvrtc
def test_cubin_output_and_targets(tmp_path):
    cache = KernelCache(tmp_path, arch="sm_90", output="cubin")
    image = cache.get("gc_test_scale", SCALE)
    assert isinstance(image, bytes) and image[:4] == b"\x7fELF"
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".cubin", ".txt"]     # and nvrtc-version.txt
    # a second instance reads the CUBIN back without compiling
    again = KernelCache(tmp_path, arch="sm_90", output="cubin")
    assert again.get("gc_test_scale", SCALE) == image and again.stats["compiles"] == 0
    # a GPU newer than this NVRTC knows: PTX of the newest it knows, JIT-compiled forward
    newest = max(nvrtc.supported_archs())
    assert cache._target("sm_999") == (f"compute_{newest}", "ptx")
    assert cache._target("sm_80") == ("sm_80", "cubin")
    assert KernelCache(tmp_path, arch="sm_80")._target("sm_80") == ("compute_80", "ptx")


# ---------------------------------------------------------------- families, with a small catalog
@needs_nvrtc
def test_a_family_is_one_compile_and_its_members_share_it(tmp_path, small_catalog):
    small_catalog(_Catalog())
    cache = KernelCache(tmp_path, workers=1)
    alpha = families.program("alpha", "float")
    first = cache.program("gc_alpha0_float", alpha.units[0])
    assert cache.stats["compiles"] == 1 and [c[0] for c in cache.compiled] == ["alpha-float"]
    for k in range(3):
        assert f".entry gc_alpha{k}_float(" in first.image
    # the other members: the same program, from memory, no compile
    assert cache.program("gc_alpha2_float", alpha.units[2]) is first
    assert cache.stats["compiles"] == 1
    # another element type is another program; another family another compile
    cache.get("gc_alpha1_double", families.program("alpha", "double").units[1])
    cache.get("gc_beta0_float", families.program("beta", "float").units[0])
    assert cache.stats["compiles"] == 3
    # a new instance (a second process) finds every member on disk through its ref
    warm = KernelCache(tmp_path, workers=1)
    warm.compile = warm._compile_unit = None        # would raise if called
    for k in range(3):
        assert warm.program(f"gc_alpha{k}_float", alpha.units[k]).image == first.image
    assert warm.stats == {"memory_hits": 0, "disk_hits": 3, "compiles": 0}


@needs_nvrtc
def test_a_family_compiles_in_parallel_parts(tmp_path, small_catalog, monkeypatch):
    from gradcore.cuda import cache as cache_mod
    small_catalog(_Catalog())
    monkeypatch.setattr(cache_mod, "PART_MIN_UNITS", 1)
    cache = KernelCache(tmp_path, workers=3)
    alpha = families.program("alpha", "float")
    parts = cache.compile_family(alpha)
    assert len(parts) == 3 and cache.stats["compiles"] == 1
    assert sorted(u for p in parts for u in p.units) == sorted(alpha.units)
    for part in parts:
        (unit,) = part.units
        assert f".entry {families.kernel_names(unit)[0]}(" in part.image
    # the member asks for its own part
    assert cache.program("gc_alpha1_float", alpha.units[1]).units == (alpha.units[1],)


@needs_nvrtc
def test_precompile_builds_every_family_once(tmp_path, small_catalog):
    small_catalog(_Catalog())
    cache = KernelCache(tmp_path)
    assert cache.precompile(ctypes=("float", "int")) == 4
    assert sorted(c[0] for c in cache.compiled) == ["alpha-float", "alpha-int", "beta-float", "beta-int"]
    assert KernelCache(tmp_path).precompile(ctypes=("float", "int")) == 0      # all on disk


@needs_nvrtc
def test_a_broken_family_falls_back_to_kernels_one_by_one(tmp_path, small_catalog):
    small_catalog(_Catalog(broken=True))
    cache = KernelCache(tmp_path, workers=1)
    beta = families.program("beta", "float")
    with pytest.warns(RuntimeWarning, match="beta-float failed to compile as one program"):
        good = cache.get("gc_beta0_float", beta.units[0])
    assert ".entry gc_beta0_float(" in good and ".entry gc_beta1_float(" not in good
    with pytest.raises(KernelCompileError, match="gc_beta_bad_float"):
        cache.get("gc_beta_bad_float", beta.units[-1])


@needs_nvrtc
def test_a_source_outside_the_catalog_compiles_alone(tmp_path, small_catalog):
    small_catalog(_Catalog())
    cache = KernelCache(tmp_path)
    assert ".entry gc_test_scale(" in cache.get("gc_test_scale", SCALE)
    assert [c[0] for c in cache.compiled] == ["gc_test_scale"]


@needs_nvcc
def test_nvcc_is_the_fallback_without_nvrtc(tmp_path, small_catalog, monkeypatch):
    small_catalog(_Catalog())
    monkeypatch.setattr(nvrtc, "available", lambda: False)
    cache = KernelCache(tmp_path, workers=1)
    assert cache.compiler() == "nvcc" and cache.identity() == "nvcc ptx"
    alpha = families.program("alpha", "float")
    ptx = cache.get("gc_alpha1_float", alpha.units[1])
    assert "Cuda compilation tools" in ptx and ".entry gc_alpha0_float(" in ptx
    assert cache.stats["compiles"] == 1 and [c[0] for c in cache.compiled] == ["alpha-float"]


def test_combine_keeps_typedefs_apart_and_guarded_helpers_visible():
    units = [_unit("gc_a", "float"), _unit("gc_b", "double"), _unit("gc_a", "int")]
    text, kept, names = families.combine(units, "test")
    assert names == ("gc_a", "gc_b") and kept == tuple(units[:2])     # gc_a taken: the third is left out
    assert text.count("namespace gc_unit_1 {") == 1 and "namespace gc_unit_2" not in text
    assert "using namespace gc_unit_1;" in text


def test_the_emulator_runs_a_combined_program():
    # the fake GPU runs family programs' kernels from their own sources, but
    # a combined program must be valid C++ for the host compiler too
    import shutil
    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("the CUDA emulator needs g++")
    from gradcore.cuda.emulator import HostDriver
    text, _, names = families.combine([_unit("gc_cf", "float"), _unit("gc_cd", "double")])
    driver = HostDriver()
    module = driver.load("combined", text)
    assert all(driver.function(module, name) is not None for name in names)


# ---------------------------------------------------------------- the standard families
FLOAT_FAMILIES = [f for f in families.family_names() if families.program(f, "float").units]


@needs_nvrtc
@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
@pytest.mark.parametrize("family", FLOAT_FAMILIES)
def test_every_standard_family_compiles(family, arch):
    fam = families.program(family, "float")
    out = nvrtc.compile_program(fam.source, fam.label, arch)
    assert out.ok, f"{fam.label} for {arch}:\n{out.log}"
    ptx = out.image.decode()
    assert f".target sm_{arch[-2:]}" in ptx
    for name in fam.kernels:
        assert f".entry {name}(" in ptx, name


@needs_nvrtc
@pytest.mark.slow
@pytest.mark.parametrize("ctype", [c for c in families.CTYPES if c != "float"])
def test_every_standard_family_compiles_for_every_element_type(ctype):
    for family in families.family_names():
        fam = families.program(family, ctype)
        if not fam.units:
            assert family == "nn" and ctype not in ("float", "double")     # softmax is a float op
            continue
        out = nvrtc.compile_program(fam.source, fam.label, "compute_80")
        assert out.ok, f"{fam.label}:\n{out.log}"
        for name in fam.kernels:
            assert f".entry {name}(".encode() in out.image, name


def test_the_catalog_knows_the_kernels_the_demo_uses():
    fam = families.program("elemwise", "float")
    assert {"gc_add_float", "gc_relu_float", "gc_fill_float"} <= set(fam.kernels)
    assert any(k.startswith("gc_bwd_relu_float_") for k in fam.kernels)
    assert families.family_of(fam.units[0]) is fam
    assert families.family_of(SCALE) is None


# ---------------------------------------------------------------- a training step, cold and warm
_STEP = textwrap.dedent("""\
    import json, sys
    sys.path.insert(0, sys.argv[2])
    import gradcore as gc, gradcore.functional as F, gradcore.optimizer as optim
    from gradcore.autodiff import GradManager
    from gradcore.cuda import nvrtc, runtime
    from gradcore.demo import DigitsCNN, load_digits
    import fake_pycuda
    if sys.argv[3] == "warm":
        def refuse(*args, **kwargs):
            raise SystemExit("NVRTC was run in the warm process")
        nvrtc.compile_program = refuse
    be = fake_pycuda.make_backend()
    fake = be.driver.fake
    # the kernel cache in the test's directory; the emulator's host modules stay in theirs
    be.driver.cache = fake_pycuda._RecordingCache(fake.sources, directory=sys.argv[1], arch=be.driver.arch)
    runtime.use(be)
    x, y = load_digits()
    model = DigitsCNN().to("cuda")
    gm = GradManager().attach(model.parameters())
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with gm:
        loss = F.cross_entropy(model(gc.tensor(x[:16], device="cuda")), gc.tensor(y[:16], device="cuda"))
        gm.backward(loss)
    opt.step().clear_grad()
    loss.item()
    cache = be.driver.cache
    print(json.dumps({"stats": cache.stats, "compiled": [c[0] for c in cache.compiled],
                      "kernels": sorted({k for names in fake.sources.values() for k in names}),
                      "modules": fake.modules}))
    fake_pycuda.close(be)
    """)


def _step(cache_dir, mode):
    out = subprocess.run([sys.executable, "-c", _STEP, str(cache_dir), str(HERE), mode],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_nvrtc
def test_a_cnn_step_compiles_each_family_once_cold_and_nothing_warm(tmp_path):
    import shutil
    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("the fake GPU runs kernels on the emulator, which needs g++")
    cold = _step(tmp_path, "cold")
    compiled = cold["compiled"]
    used = {label.rsplit("-", 1)[0] for label in compiled}
    # one compile per family used, every one a standard family: no kernel compiled alone
    assert len(compiled) == len(set(compiled)) == cold["stats"]["compiles"]
    assert used <= set(families.family_names()), compiled
    assert {"elemwise", "conv", "nn", "reduce"} <= used
    assert all(label.endswith("-float") for label in compiled)
    # each part is loaded as one module, whatever number of its kernels ran
    assert cold["modules"] < len(cold["kernels"])
    warm = _step(tmp_path, "warm")
    assert warm["stats"]["compiles"] == 0 and warm["compiled"] == []
    assert warm["stats"]["disk_hits"] > 0 and warm["kernels"] == cold["kernels"]
