"""The CUDA kernel cache (gradcore.cuda.cache): nvcc -> PTX, in memory and on
disk, keyed by gradcore's key; a second instance or process reads the PTX
without running nvcc; compile errors quote the CUDA source line; writes are
atomic under concurrent processes."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gradcore.cuda import cache as cache_mod
from gradcore.cuda import KernelCache, KernelCompileError, cache_key, default_directory
from gradcore.devices import nvcc_path

NVCC = nvcc_path()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")

SRC = textwrap.dedent("""\
    extern "C" __global__ void gc_test_scale(const float* __restrict__ x, float* __restrict__ y, long long n)
    {
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
             i += (long long)blockDim.x * gridDim.x)
            y[i] = x[i] * 2.0f;
    }
    """)

BROKEN = textwrap.dedent("""\
    extern "C" __global__ void gc_test_broken(const float* x, float* y, long long n)
    {
        long long i = threadIdx.x;
        if (i < n)
            y[i] = x[i] * undefined_scale;
    }
    """)

FAKE_PTX = "//\n// fake\n.version 8.0\n.target sm_80\n.address_size 64\n"


def _no_compiler(*args, **kwargs):
    raise AssertionError(f"the compiler was invoked: {args!r}")


def _ptx_files(d):
    return sorted(p.name for p in Path(d).glob("*.ptx"))


# ---------------------------------------------------------------- keys
def test_key_changes_with_every_part():
    base = cache_key("gc_test_scale", SRC, ["float32"], "nd1:contig", "sm_80")
    assert base == cache_key("gc_test_scale", SRC, ["float32"], "nd1:contig", "sm_80")
    variants = [
        cache_key("gc_test_other", SRC, ["float32"], "nd1:contig", "sm_80"),
        cache_key("gc_test_scale", SRC + "// edit\n", ["float32"], "nd1:contig", "sm_80"),
        cache_key("gc_test_scale", SRC, ["float64"], "nd1:contig", "sm_80"),
        cache_key("gc_test_scale", SRC, ["float32"], "nd2:strided", "sm_80"),
        cache_key("gc_test_scale", SRC, ["float32"], "nd1:contig", "sm_90"),
        cache_key("gc_test_scale", SRC, ["float32"], "nd1:contig", "sm_80", ["-lineinfo"]),
    ]
    assert len({base, *variants}) == len(variants) + 1
    import numpy as np
    # dtypes as NumPy dtypes or strings give the same key
    assert cache_key("k", SRC, [np.float32]) == cache_key("k", SRC, [np.dtype("float32")]) == cache_key("k", SRC, ["float32"])


def test_directory_default_env_and_argument(tmp_path, monkeypatch):
    monkeypatch.delenv("GRADCORE_KERNEL_CACHE", raising=False)
    assert default_directory() == Path("~/.cache/gradcore/kernels").expanduser()
    assert KernelCache().directory == default_directory()
    monkeypatch.setenv("GRADCORE_KERNEL_CACHE", str(tmp_path / "env"))
    assert KernelCache().directory == tmp_path / "env"
    assert KernelCache(tmp_path / "arg").directory == tmp_path / "arg"


# ---------------------------------------------------------------- without nvcc
def test_disk_hit_and_memory_hit_with_a_fake_compiler(tmp_path, monkeypatch):
    calls = []
    c1 = KernelCache(tmp_path)
    monkeypatch.setattr(c1, "compile", lambda name, source, arch=None: calls.append(name) or FAKE_PTX)
    assert c1.get("k", SRC, ["float32"]) == FAKE_PTX
    assert c1.get("k", SRC, ["float32"]) == FAKE_PTX
    assert calls == ["k"] and c1.stats == {"memory_hits": 1, "disk_hits": 0, "compiles": 0}
    assert len(_ptx_files(tmp_path)) == 1
    c2 = KernelCache(tmp_path)
    monkeypatch.setattr(c2, "compile", _no_compiler)
    assert c2.get("k", SRC, ["float32"]) == FAKE_PTX
    assert c2.stats["disk_hits"] == 1
    assert c2.contains("k", SRC, ["float32"]) and not c2.contains("k", SRC, ["float64"])


def test_a_corrupt_file_is_recompiled(tmp_path, monkeypatch):
    c = KernelCache(tmp_path)
    path = c.path_for(c.key("k", SRC), "k")
    tmp_path.mkdir(exist_ok=True)
    path.write_text("garbage, half a file")
    monkeypatch.setattr(c, "compile", lambda name, source, arch=None: FAKE_PTX)
    assert c.get("k", SRC) == FAKE_PTX
    assert path.read_text() == FAKE_PTX


def test_missing_nvcc_is_a_clear_error_only_when_compiling(tmp_path, monkeypatch):
    # neither NVRTC nor nvcc
    from gradcore.cuda import nvrtc, toolkit
    monkeypatch.setattr(toolkit, "nvcc_path", lambda: None)
    monkeypatch.setattr(nvrtc, "available", lambda: False)
    c = KernelCache(tmp_path)
    with pytest.raises(RuntimeError, match="nvcc was not found"):
        c.get("k", SRC)


def test_parse_errors_quotes_the_source_line():
    log = ('/tmp/x/k.cu(5): error: identifier "undefined_scale" is undefined\n'
           "          y[i] = x[i] * undefined_scale;\n"
           "                        ^\n\n"
           "1 error detected in the compilation of \"/tmp/x/k.cu\".\n")
    errs = cache_mod.parse_errors(log, BROKEN, "k.cu")
    assert errs == [(5, "        y[i] = x[i] * undefined_scale;", 'identifier "undefined_scale" is undefined')]
    exc = KernelCompileError("gc_test_broken", errs, log, "sm_80")
    assert "gc_test_broken" in str(exc) and "line 5" in str(exc) and "y[i] = x[i] * undefined_scale;" in str(exc)


_WRITER = textwrap.dedent("""\
    import sys
    from pathlib import Path
    from gradcore.cuda.cache import KernelCache
    c = KernelCache(sys.argv[1])
    path = Path(sys.argv[2])
    body = sys.argv[3] * 200000
    for _ in range(60):
        c._write(path, ".version 8.0\\n.target sm_80\\n" + body + "\\n// end\\n")
    """)


def test_concurrent_writers_never_expose_a_partial_file(tmp_path):
    path = tmp_path / "k-shared.ptx"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(path), ch])
             for ch in "ab"]
    seen = 0
    while any(p.poll() is None for p in procs):
        text = KernelCache._read(path)
        if text is not None:
            seen += 1
            assert text.endswith("// end\n") and len(text) == len(".version 8.0\n.target sm_80\n") + 200000 + 8
            assert len(set(text.split("\n")[2])) == 1
    assert all(p.wait() == 0 for p in procs)
    assert KernelCache._read(path) is not None
    assert [p.name for p in tmp_path.iterdir()] == [path.name]      # no temporary files left


# ---------------------------------------------------------------- with nvcc
@needs_nvcc
def test_cold_compile_writes_ptx_and_a_second_instance_reads_it(tmp_path, monkeypatch):
    c1 = KernelCache(tmp_path)
    ptx = c1.get("gc_test_scale", SRC, ["float32"], "nd1:contig")
    assert c1.stats["compiles"] == 1
    assert ".entry gc_test_scale(" in ptx and ".target sm_80" in ptx
    files = _ptx_files(tmp_path)
    assert len(files) == 1 and files[0].startswith("gc_test_scale-")
    assert (tmp_path / files[0]).read_text() == ptx
    # a second instance finds it on disk: nvcc is not run
    monkeypatch.setattr(subprocess, "run", _no_compiler)      # (the cache imports subprocess where it runs nvcc)
    c2 = KernelCache(tmp_path)
    assert c2.get("gc_test_scale", SRC, ["float32"], "nd1:contig") == ptx
    assert c2.stats == {"memory_hits": 0, "disk_hits": 1, "compiles": 0}


@needs_nvcc
def test_a_second_process_does_not_recompile(tmp_path):
    env = dict(os.environ, GRADCORE_KERNEL_CACHE=str(tmp_path))
    script = textwrap.dedent(f"""\
        import sys, json, subprocess
        from gradcore.cuda import cache
        if sys.argv[1] == "warm":
            real = subprocess.run
            def boom(cmd, *a, **k):
                if "--ptx" in cmd:      # asking nvcc its version is fine
                    raise SystemExit("nvcc was run in the warm process")
                return real(cmd, *a, **k)
            subprocess.run = boom
        c = cache.KernelCache()
        ptx = c.get("gc_test_scale", {SRC!r}, ["float32"], "nd1:contig")
        print(json.dumps(c.stats))
        """)
    import json
    cold = subprocess.run([sys.executable, "-c", script, "cold"], env=env, capture_output=True, text=True, timeout=300)
    assert cold.returncode == 0, cold.stderr
    assert json.loads(cold.stdout)["compiles"] == 1
    warm = subprocess.run([sys.executable, "-c", script, "warm"], env=env, capture_output=True, text=True, timeout=300)
    assert warm.returncode == 0, warm.stderr
    assert json.loads(warm.stdout) == {"memory_hits": 0, "disk_hits": 1, "compiles": 0}


@needs_nvcc
def test_arch_dtype_and_source_are_separate_entries(tmp_path):
    c = KernelCache(tmp_path)
    a = c.get("gc_test_scale", SRC, ["float32"])
    b = c.get("gc_test_scale", SRC, ["float32"], arch="sm_90")
    assert ".target sm_80" in a and ".target sm_90" in b
    c.get("gc_test_scale", SRC, ["float64"])
    c.get("gc_test_scale", SRC.replace("2.0f", "3.0f"), ["float32"])
    assert c.stats["compiles"] == 4 and len(_ptx_files(tmp_path)) == 4


@needs_nvcc
def test_broken_source_raises_with_the_line_quoted(tmp_path):
    c = KernelCache(tmp_path)
    with pytest.raises(KernelCompileError) as info:
        c.get("gc_test_broken", BROKEN, ["float32"])
    exc = info.value
    assert exc.name == "gc_test_broken"
    assert exc.errors and exc.errors[0][0] == 5
    assert "undefined_scale" in exc.errors[0][2]
    msg = str(exc)
    assert "gc_test_broken" in msg and "line 5" in msg and "y[i] = x[i] * undefined_scale;" in msg
    assert _ptx_files(tmp_path) == []


@needs_nvcc
def test_two_processes_compiling_the_same_kernel(tmp_path):
    script = textwrap.dedent(f"""\
        import sys
        from gradcore.cuda.cache import KernelCache
        ptx = KernelCache(sys.argv[1]).get("gc_test_scale", {SRC!r}, ["float32"])
        assert ".entry gc_test_scale(" in ptx
        """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)]) for _ in range(2)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    files = [p.name for p in tmp_path.iterdir() if p.name != "nvrtc-version.txt"]
    assert len(files) == 1 and files[0].endswith(".ptx")
    assert ".entry gc_test_scale(" in (tmp_path / files[0]).read_text()


@needs_nvcc
def test_a_fused_backward_kernel_through_the_cache(tmp_path):
    from gradcore.cuda import fuse_elementwise
    from gradcore.graph import make_backward_graph
    from gradcore.op import TensorDesc
    from gradcore.ops.elemwise import Elemwise
    d = TensorDesc(None, "float32", "cpu")
    k = fuse_elementwise(make_backward_graph(Elemwise("gelu"), [d], [True])[0])
    ptx = KernelCache(tmp_path).get(k.name, k.source, ["float32"], "same_shape:contig")
    assert f".entry {k.name}(" in ptx


def test_ptx_from_another_nvcc_is_recompiled(tmp_path, monkeypatch):
    """The PTX header names the nvcc that made it; a cache entry made by
    another version is compiled again, and without nvcc any entry serves."""
    old = "//\n// Cuda compilation tools, release 12.0, V12.0.76\n//\n" + FAKE_PTX
    new = "//\n// Cuda compilation tools, release 13.0, V13.0.88\n//\n" + FAKE_PTX
    c = KernelCache(tmp_path, compiler="nvcc")
    path = c.path_for(c.key("k", SRC), "k")
    tmp_path.mkdir(exist_ok=True)
    path.write_text(old)
    monkeypatch.setattr(c, "nvcc_version", lambda: "Cuda compilation tools, release 13.0, V13.0.88")
    monkeypatch.setattr(c, "compile", lambda name, source, arch=None: new)
    assert c.get("k", SRC) == new and c.stats["compiles"] == 0 and path.read_text() == new
    c2 = KernelCache(tmp_path, compiler="nvcc")
    monkeypatch.setattr(c2, "nvcc_version", lambda: "Cuda compilation tools, release 13.0, V13.0.88")
    monkeypatch.setattr(c2, "compile", _no_compiler)
    assert c2.get("k", SRC) == new and c2.stats["disk_hits"] == 1
    path.write_text(old)
    c3 = KernelCache(tmp_path, compiler="nvcc")
    monkeypatch.setattr(c3, "nvcc_version", lambda: None)
    monkeypatch.setattr(c3, "compile", _no_compiler)
    assert c3.get("k", SRC) == old
