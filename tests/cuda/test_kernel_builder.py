"""The CUDA kernel builder (issue 24, item 3): every kernel of the op library
is declared by its parameters and body; the header, the element type and the
loop come from gradcore/cuda/kernels.py alone, and nothing patches
identifiers into kernel text."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import gradcore  # noqa: F401
from gradcore.cuda import kernels
from gradcore.cuda.kernels import Kernel, kernel_name, kernel_names, source
from gradcore.op import describe
from gradcore.ops import elemwise, reduce, shape

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = sorted([*ROOT.glob("ops/*.py"), *ROOT.glob("gradcore/cuda/*.py"), *ROOT.glob("plugins/*/*/*.py")])
BUILDER = ROOT / "gradcore" / "cuda" / "kernels.py"


def _text(path):
    return path.read_text()


def test_headers_and_loops_are_written_in_one_place():
    # a kernel header being written, a grid-stride or block loop
    patterns = [re.compile(r'extern \\?"C\\?" __global__ void \{'), re.compile(r"__global__ void gc_\w*\{"),
                re.compile(r"blockIdx\.x \* \(long long\)blockDim\.x \+ threadIdx\.x"),
                re.compile(r"= blockIdx\.x; \w+ < [^;]*; \w+ \+= gridDim\.x")]
    offenders = [f"{p.relative_to(ROOT)}: {pat.pattern}" for p in LIBRARY if p != BUILDER
                 for pat in patterns if pat.search(_text(p))]
    assert not offenders, offenders


def test_no_identifier_patching_in_kernel_text():
    # the four old templating styles: a T replaced in a fragment, a
    # placeholder formatted in, a ctype pasted into a name, a regex on identifiers
    patterns = [re.compile(r'\.replace\("T"'), re.compile(r'\.replace\("HIT"'), re.compile(r"\{T\}"),
                re.compile(r"\.format\((ind|first|k)="), re.compile(r'replace\(" ", "_"\)|replace\(\' \', \'_\'\)'),
                re.compile(r"_IDENT\.sub|re\.sub\(.*row")]
    offenders = [f"{p.relative_to(ROOT)}: {pat.pattern}" for p in LIBRARY if p != BUILDER
                 for pat in patterns if pat.search(_text(p))]
    assert not offenders, offenders


def test_fusion_reads_rows_through_the_op_description():
    assert "node.op.row" not in _text(ROOT / "gradcore" / "cuda" / "fusion.py")
    mul = elemwise.Elemwise("mul")
    assert describe(mul).elementwise and describe(mul).row(mul) is elemwise.ROWS["mul"]
    assert describe(reduce.Reduce).row(reduce.Reduce("sum")) is None


def test_a_declaration_gives_the_header_the_type_and_the_loop():
    k = Kernel("scale", "const T* __restrict__ x, T* __restrict__ y, T a, long long n", "y[i] = a * x[i];",
               over="n", index="i")
    src = k.source("unsigned long long")
    assert kernel_names(src) == ["gc_scale_unsigned_long_long"]
    assert "typedef unsigned long long T;" in src
    assert "for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;" in src
    assert "        y[i] = a * x[i];\n" in src
    block = Kernel("rows", "const T* x, long long rows", "__syncthreads();", over="rows", per="block",
                   setup="__shared__ T s[32];").source("float")
    assert ("    __shared__ T s[32];\n    #pragma unroll 1\n"
            "    for (long long idx = blockIdx.x; idx < rows; idx += gridDim.x)") in block
    whole = Kernel("one", "T* y", "y[0] = (T)1;").source("double")
    assert "{\n    y[0] = (T)1;\n}\n" in whole
    cast = Kernel("cast", "const T* x, U* y, long long n", "y[idx] = (U)x[idx];", over="n").source("float", U="int")
    assert kernel_names(cast) == ["gc_cast_float_to_int"] and "typedef int U;" in cast
    with pytest.raises(ValueError, match="per must be"):
        Kernel("bad", "long long n", "", over="n", per="warp").source("float")


def test_names_stay_gc_name_ctype():
    assert kernel_name("copy", "long long") == "gc_copy_long_long"
    assert kernel_names(shape.Copy().cuda_source("signed char")) == ["gc_copy_signed_char"]
    assert kernel_names(elemwise.cuda_source(elemwise.ROWS["add"], "double")) == ["gc_add_double"]
    assert kernel_names(reduce.Reduce("max").cuda_source("int")) == [
        "gc_reduce_max_int", "gc_reduce_rows_max_int", "gc_reduce_cols_max_int"]
    assert kernel_names(shape.Cast("int32").cuda_source("double")) == ["gc_cast_double_to_int"]


def test_sources_of_several_types_share_one_file():
    # each source's T lives in a namespace of its own: no typedef clash
    text = source("float", Kernel("a", "T* y", "y[0] = 0;")) + source("double", Kernel("a", "T* y", "y[0] = 0;"))
    assert text.count("namespace gc_a_float_unit {") == 1 and text.count("namespace gc_a_double_unit {") == 1
    assert kernels.__all__ == ["Kernel", "source", "kernel_name", "kernel_names", "parameters", "tag"]
