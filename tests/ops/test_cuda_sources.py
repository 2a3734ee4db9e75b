"""Every elementwise row's generated CUDA kernel compiles with nvcc (the
CUDA backend compiles the same sources at run time with PyCUDA)."""
import shutil
import subprocess

import pytest

from gradcore.ops.elemwise import TABLE, cuda_source

nvcc = shutil.which("nvcc")


@pytest.mark.parametrize("ctype", ["float", "double"])
def test_elemwise_sources_compile(nvcc_ptx, ctype):
    # one translation unit for the whole table: one nvcc run instead of 40
    ptx = nvcc_ptx("\n".join(_isolated(row, ctype) for row in TABLE), f"elemwise_{ctype}")
    for row in TABLE:
        assert f"gc_{row.mode}_{ctype}" in ptx


def _isolated(row, ctype):
    # each kernel in its own scope for its typedef; extern "C" names stay global
    body = cuda_source(row, ctype)
    return body.replace(f"typedef {ctype} T;\n", f"#define T {ctype}\n", 1) + "#undef T\n"


def test_a_broken_source_fails_to_compile(tmp_path):
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    path = tmp_path / "bad.cu"
    path.write_text('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n')
    out = subprocess.run([nvcc, "--ptx", "-o", str(tmp_path / "o.ptx"), str(path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
