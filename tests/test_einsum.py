"""F.einsum (MegEngine's functional.einsum; a composition of transposes,
diagonals, sums and batched matmuls) against torch.einsum in float64: values
and gradients for plain contractions, implicit outputs, the ellipsis (with
broadcasting) and repeated letters (diagonals); against finite differences
(first and second order); and its errors."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from oracle import check_grads, compare_with_torch

torch = pytest.importorskip("torch")

CASES = [
    ("ij->ji", [(2, 3)]),
    ("ij->", [(2, 3)]),
    ("kj,ji", [(4, 5), (5, 3)]),                        # implicit output: "ki"
    ("ik, kj->ij", [(2, 3), (3, 4)]),                   # spaces are ignored
    ("i,j->ij", [(2,), (3,)]),
    ("i,i->", [(4,), (4,)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("pqrs,tuqvr->pstuv", [(2, 3, 4, 5), (6, 7, 3, 8, 4)]),
    ("ik,jkl,il->ij", [(2, 3), (4, 3, 5), (2, 5)]),     # three operands, contracted left to right
    ("...ij->...ji", [(2, 3, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 4, 5), (3, 5, 6)]),  # ellipsis axes broadcast (1 against 2, missing)
    ("i...k,k...j", [(2, 3, 4, 5), (5, 3, 4, 6)]),
    ("ii->i", [(4, 4)]),                                # a repeated letter: the diagonal
    ("ii", [(4, 4)]),                                   # ... summed (the trace)
    ("ijji->ij", [(3, 4, 4, 3)]),
    ("i...i->i...", [(3, 2, 5, 3)]),
    ("iijj,jjkk", [(3, 3, 4, 4), (4, 4, 5, 5)]),
    ("bij,jk->bk", [(2, 3, 4), (4, 5)]),                # "i" of one operand only: summed first
]


@pytest.mark.parametrize("equation, shapes", CASES)
def test_einsum_matches_torch_values_and_grads(equation, shapes):
    rng = np.random.default_rng(len(equation))
    arrays = [rng.standard_normal(s) for s in shapes]
    compare_with_torch(torch, lambda *xs: F.einsum(equation, *xs),
                       lambda *ts: torch.einsum(equation, *ts), arrays, rtol=1e-10, atol=1e-12, need_grads=True)


@pytest.mark.parametrize("equation, shapes", [("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]), ("ii,i->i", [(3, 3), (3,)]),
                                              ("...i,i", [(2, 3), (3,)])])
def test_einsum_grads_match_finite_differences(equation, shapes):
    rng = np.random.default_rng(1)
    check_grads(lambda *xs: F.einsum(equation, *xs), [rng.standard_normal(s) for s in shapes])


def test_einsum_float32_and_list_operands():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = F.einsum("ik,kj->ij", [gc.tensor(a), gc.tensor(b)])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.numpy(), a @ b)


@pytest.mark.parametrize("equation, shapes, needle", [
    ("ij,jk->ik", [(2, 3)], "names 2 operands, got 1"),
    ("ijk->i", [(2, 3)], "names 3 axes, operand 0 has 2"),
    ("ij->k", [(2, 3)], "output letter 'k'"),
    ("ii->i", [(2, 3)], "repeated over axes of sizes [2, 3]"),
    ("ij,jk->ik", [(2, 3), (4, 5)], "letter 'j' has sizes 3 and 4"),
    ("i1->i", [(2, 3)], "bad term"),
])
def test_einsum_errors_name_the_op_and_shapes(equation, shapes, needle):
    xs = [gc.tensor(np.ones(s, np.float32)) for s in shapes]
    with pytest.raises(gc.op.ArgumentError) as info:
        F.einsum(equation, *xs)
    assert str(info.value).startswith("einsum: ") and needle in str(info.value)
