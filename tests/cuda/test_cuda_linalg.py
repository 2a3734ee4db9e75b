"""MatrixMul on cuda: cuBLAS for float32/float64 (every transposition, 1-D
operands, broadcast batch axes, empty dimensions), the direct kernel for
integer and bool products, F.linear; cpu vs cuda, first and second order."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.op import OpError
from gradcore.ops import linalg


def _cpu_cases():
    """The cpu suite's matmul cases (tests/ops/test_linalg.py): the same
    shapes and transpositions run on cuda."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "_linalg_cases", Path(__file__).resolve().parents[1] / "ops" / "test_linalg.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CASES, mod.TRANSPOSES, mod._stored


CASES, TRANSPOSES, _stored = _cpu_cases()


def _operands(sa, sb, ta, tb, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(_stored(sa, ta)).astype(dtype), rng.standard_normal(_stored(sb, tb)).astype(dtype)]


def _mm(ta, tb):
    return lambda a, b: F.matmul(a, b, transpose_a=ta, transpose_b=tb)


@pytest.fixture
def gemm_calls(cuda):
    """Counts the backend's cuBLAS calls (the emulator's or the GPU's; on a
    GPU they go to cuBLAS through C function pointers, so they are counted
    where the backend makes them)."""
    calls = []
    real = cuda.gemm

    def counting(*args):
        calls.append(args)
        return real(*args)
    cuda.gemm = counting
    yield calls
    del cuda.gemm


@pytest.mark.parametrize("sa, sb, ta, tb", CASES)
def test_matmul(cuda, matches_cpu, sa, sb, ta, tb):
    matches_cpu(_mm(ta, tb), _operands(sa, sb, ta, tb))


@pytest.mark.parametrize("ta, tb", TRANSPOSES)
def test_matmul_float64(cuda, matches_cpu, ta, tb):
    matches_cpu(_mm(ta, tb), _operands((2, 3, 5), (5, 4), ta, tb, np.float64), rtol=1e-10, atol=1e-12)


def test_float_products_run_on_cublas(cuda, gemm_calls):
    a, b = _operands((2, 3, 4), (4, 5), False, False)
    got = F.matmul(gc.Tensor(a, device="cuda"), gc.Tensor(b, device="cuda")).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-6)
    assert len(gemm_calls) == 1
    # b shared by the batch: one GEMM of 2 * 3 rows, no batch
    (transa, transb, m, n, k, *_, batch, dtype) = gemm_calls[0]
    assert (m, n, k, batch) == (5, 6, 4, 1) and dtype == np.float32


@pytest.mark.parametrize("sa, sb", [((2, 3, 4), (2, 4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (3, 4, 5))],
                         ids=["batched", "a-shared", "broadcast"])
def test_batched_products_are_one_gemm(cuda, gemm_calls, sa, sb):
    a, b = _operands(sa, sb, False, False)
    got = F.matmul(gc.Tensor(a, device="cuda"), gc.Tensor(b, device="cuda")).numpy()
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-5, atol=1e-6)
    assert len(gemm_calls) == 1


@pytest.mark.parametrize("sa, sb", [((3, 0), (0, 4)), ((0, 4), (4, 3)), ((3, 4), (4, 0)), ((0, 3, 4), (4, 2)),
                                    ((2, 3, 0), (0, 5)), ((0,), (0,))],
                         ids=["k0", "m0", "n0", "batch0", "batched-k0", "1-D-k0"])
def test_matmul_empty(cuda, matches_cpu, gemm_calls, sa, sb):
    """An empty sum is 0 (k = 0 gives zeros); nothing to compute, no GEMM."""
    matches_cpu(_mm(False, False), _operands(sa, sb, False, False))
    assert not gemm_calls


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.uint8, np.bool_])
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
def test_matmul_integer_is_exact(cuda, gemm_calls, dtype, ta, tb):
    """cuBLAS has no integer GEMM: the direct kernel gives NumPy's result
    exactly, wrapping on overflow as NumPy does (int8 here)."""
    rng = np.random.default_rng(1)
    a = rng.integers(-50, 50, _stored((2, 3, 4), ta)).astype(dtype)
    b = rng.integers(-50, 50, _stored((4, 5), tb)).astype(dtype)
    want = F.matmul(gc.Tensor(a), gc.Tensor(b), transpose_a=ta, transpose_b=tb).numpy()
    got = F.matmul(gc.Tensor(a, device="cuda"), gc.Tensor(b, device="cuda"), transpose_a=ta, transpose_b=tb)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), want)
    assert not gemm_calls


def test_matmul_mixed_dtypes(cuda, matches_cpu):
    """The result type is NumPy's (int32 @ float32 is float64)."""
    rng = np.random.default_rng(2)
    a = rng.integers(-5, 5, (2, 3, 4)).astype(np.int32)
    b = rng.standard_normal((4, 2)).astype(np.float32)
    matches_cpu(_mm(False, False), [a, b])
    matches_cpu(_mm(True, False), [b.astype(np.float64), b])     # float64 @ float32


def test_matmul_errors_match_cpu(cuda):
    for device in ("cpu", "cuda"):
        a = gc.Tensor(np.ones((2, 3), np.float32), device=device)
        b = gc.Tensor(np.ones((4, 2), np.float32), device=device)
        with pytest.raises(OpError, match="inner dimensions differ"):
            F.matmul(a, b)
        c = gc.Tensor(np.ones((3, 3, 4), np.float32), device=device)
        with pytest.raises(OpError, match="batch dimensions cannot be broadcast"):
            F.matmul(c, gc.Tensor(np.ones((2, 4, 3), np.float32), device=device))


def test_dtypes_without_kernels_are_a_clear_error(cuda):
    a = gc.Tensor(np.ones((2, 2), np.float16), device="cuda")
    with pytest.raises(TypeError, match="no float16 kernels"):
        F.matmul(a, a)
    # complex tensors are refused when they are made (gradcore.dtypes)
    with pytest.raises(TypeError, match="complex64"):
        gc.Tensor(np.ones((2, 2), np.complex64), device="cuda")


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (4,)])
def test_linear(cuda, matches_cpu, with_bias, shape):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    if with_bias:
        matches_cpu(lambda x, w, b: F.linear(x, w, b), [x, w, rng.standard_normal(5).astype(np.float32)])
    else:
        matches_cpu(lambda x, w: F.linear(x, w), [x, w])


def test_gemm_rows_strided(cuda):
    """gemm_rows with explicit leading dimensions and batch strides: the
    argument mapping onto column-major cuBLAS beyond contiguous operands."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 2, 6))        # matrices a[i, :, :4] (2 x 4), rows 6 apart
    b = rng.standard_normal((5, 4))           # one shared op(b) = b[:3].T, stored (3, 4) rows
    c = np.full((3, 2, 7), 9.0)               # c[i, :, :3], rows 7 apart, beta = 1 adds to it
    da, db, dc = (cuda.to_device(v) for v in (a, b, c))
    linalg.gemm_rows(cuda, np.float64, 2, 3, 4, da.ptr, db.ptr, dc.ptr, tb=True, lda=6, ldb=4, ldc=7,
                     stride_a=12, stride_b=0, stride_c=14, batch=3, beta=1.0)
    want = c.copy()
    want[:, :, :3] += a[:, :, :4] @ b[:3].T
    np.testing.assert_allclose(dc.get(), want, rtol=1e-12)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_direct_source_compiles_with_nvcc(tmp_path):
    src = "\n".join(linalg.direct_matmul_source(T) for T in ("int", "long long", "signed char", "bool", "float"))
    (tmp_path / "mm.cu").write_text(src)
    out = subprocess.run([shutil.which("nvcc"), "--ptx", "-o", str(tmp_path / "mm.ptx"), str(tmp_path / "mm.cu")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "gc_matmul_direct_long_long" in (tmp_path / "mm.ptx").read_text()
