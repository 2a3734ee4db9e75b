"""split, stack, gather, scatter, sort and topk: values and gradients
against PyTorch, first and second order against finite differences, bad
input (the error names the op and the shapes, recorded or not), dtypes, and
the ops' CUDA sources (compiled with nvcc when it is installed, and run on
the host as C++ against the NumPy kernels)."""
from __future__ import annotations


import numpy as np
import pytest

import gradcore
import gradcore.functional as F
from gradcore.ops import Gather, GatherGrad, Scatter, Sort, Split, Stack, TopK, Unstack
from gradcore.testing import gradgradcheck


def T(a):
    return gradcore.Tensor(np.asarray(a))


def perm_index(rng, shape, axis, n):
    """An index of ``shape`` whose entries along ``axis`` are distinct (from
    range(n)): scatter without collisions, so its gradient is well defined."""
    ax = axis % len(shape)
    moved = list(shape)
    k = moved.pop(ax)
    rows = int(np.prod(moved, dtype=np.int64))
    idx = np.stack([rng.permutation(n)[:k] for _ in range(rows)]).reshape(moved + [k])
    return np.ascontiguousarray(np.moveaxis(idx, -1, ax))


# ---------------------------------------------------------------- split
SPLITS = [
    ((6, 3), 3, 0), ((7, 3), 3, 0),              # uneven: 3, 2, 2 (as MegEngine and array_split)
    ((2, 5), [1, 3], 1), ((2, 5), [0, 5], -1),   # empty pieces at both ends
    ((4,), 1, 0), ((4,), [2, 2], 0), ((1, 3, 2), 2, 2), ((3, 1), 1, 1),
]


def _torch_split(torch, t, s, axis):
    return torch.tensor_split(t, s if isinstance(s, int) else list(s), dim=axis)


@pytest.mark.parametrize("shape, s, axis", SPLITS)
def test_split_vs_torch(shape, s, axis, rng, h, torch):
    x = rng.standard_normal(shape)
    pieces = F.split(T(x), s, axis)
    ref = _torch_split(torch, torch.tensor(x), s, axis)
    assert len(pieces) == len(ref)
    for p, r in zip(pieces, ref):
        h.assert_close(p.numpy(), r.numpy(), what="piece")
    # every piece weighted differently, so a misrouted gradient shows
    h.compare(torch, lambda t: F.concat([p * (k + 1.0) for k, p in enumerate(F.split(t, s, axis))], axis),
              lambda t: torch.cat([p * (k + 1.0) for k, p in enumerate(_torch_split(torch, t, s, axis))], axis),
              [x])


def test_split_only_one_piece_used(rng, h, torch):
    """Pieces that get no gradient are zero in the input's gradient."""
    x = rng.standard_normal((2, 7))
    h.compare(torch, lambda t: F.split(t, [2, 5], 1)[1], lambda t: torch.tensor_split(t, [2, 5], 1)[1], [x])


@pytest.mark.parametrize("shape, s, axis", [((5, 2), [1, 3], 0), ((3, 4), 2, 1), ((3,), 3, 0)])
def test_split_grads(shape, s, axis, rng, h):
    h.check_grads(lambda t: F.concat([p * p * (k + 1.0) for k, p in enumerate(F.split(t, s, axis))], axis),
                  [rng.standard_normal(shape)])


def test_split_bad_input(h):
    x = T(np.ones((3, 2)))
    for fn, needle in [(lambda t: F.split(t, 4, 0), "4 sections"), (lambda t: F.split(t, [2, 1], 0), "non-decreasing"),
                       (lambda t: F.split(t, [4], 0), "within"), (lambda t: F.split(t, 2, 2), "axis 2"),
                       (lambda t: F.split(t, 0, 0), "positive")]:
        for record in (False, True):
            ei = h.error_of(fn, x, record)
            h.check_error(ei, "Split", "(3, 2)", needle)


# ---------------------------------------------------------------- stack
@pytest.mark.parametrize("shape, n, axis", [((2, 3), 3, 0), ((2, 3), 2, 1), ((2, 3), 2, 2), ((2, 3), 2, -1),
                                            ((2, 3), 1, -3), ((), 3, 0), ((1,), 2, 0)])
def test_stack_vs_torch(shape, n, axis, rng, h, torch):
    xs = [rng.standard_normal(shape) for _ in range(n)]
    h.compare(torch, lambda *ts: F.stack(ts, axis), lambda *ts: torch.stack(ts, axis), xs)


@pytest.mark.parametrize("shape, axis", [((2, 3), 1), ((), 0), ((3,), -1)])
def test_stack_grads(shape, axis, rng, h):
    h.check_grads(lambda a, b: F.stack([a * b, a], axis) ** 2, [rng.standard_normal(shape), rng.standard_normal(shape)])


def test_stack_mixed_dtypes_promote_and_cast_back(h):
    a, b = np.ones(3, np.float32), np.full(3, 2.0)
    out, grads, _ = h.gc_vjp(lambda x, y: F.stack([x, y]), [a, b])
    assert out.dtype == np.float64
    assert grads[0].dtype == np.float32 and grads[1].dtype == np.float64


def test_stack_bad_input(h):
    y = T(np.ones((3,)))
    ei = h.error_of(lambda t: F.stack([t, y]), T(np.ones((3, 2))), True)
    h.check_error(ei, "Stack", "(3, 2)", "(3,)")
    ei = h.error_of(lambda t: F.stack([t, t], 3), T(np.ones((3, 2))), False)
    h.check_error(ei, "Stack", "(3, 2)", "axis 3")


# ---------------------------------------------------------------- gather
GATHERS = [((3, 4), 1, (3, 5)), ((3, 4), 0, (2, 4)), ((2, 3, 4), 1, (2, 6, 4)), ((2, 3, 4), -1, (2, 3, 2)),
           ((3, 4), 1, (2, 2)),             # smaller than the input outside the axis (torch allows it)
           ((5,), 0, (7,)), ((1, 1), 0, (1, 1)), ((4, 1), 1, (4, 3))]


@pytest.mark.parametrize("shape, axis, ishape", GATHERS)
def test_gather_vs_torch(shape, axis, ishape, rng, h, torch):
    x = rng.standard_normal(shape)
    idx = rng.integers(0, shape[axis], ishape)        # repeated indices: gradients accumulate
    h.compare(torch, lambda t, i: F.gather(t, axis, i), lambda t, i: torch.gather(t, axis % len(shape), i), [x, idx])


@pytest.mark.parametrize("shape, axis, ishape", GATHERS)
def test_gather_grads(shape, axis, ishape, rng, h):
    idx = T(rng.integers(0, shape[axis], ishape))
    h.check_grads(lambda t: F.gather(t, axis, idx) ** 2, [rng.standard_normal(shape)])


def test_gather_negative_indices_wrap(h):
    x = np.arange(6.0).reshape(2, 3)
    out = F.gather(T(x), 1, T([[-1, 0], [-3, -2]]))
    np.testing.assert_array_equal(out.numpy(), [[2.0, 0.0], [3.0, 4.0]])


def test_gather_repeated_indices_accumulate(h):
    _, grads, _ = h.gc_vjp(lambda t: F.gather(t, 0, T([1, 1, 3, 1])), [np.zeros(4)], weight=np.array([1.0, 2.0, 4.0, 8.0]))
    np.testing.assert_array_equal(grads[0], [0.0, 11.0, 0.0, 4.0])


def test_gather_bad_input(h):
    x = T(np.ones((3, 4)))
    cases = [(lambda t: F.gather(t, 1, T(np.zeros((3,), np.int32))), ValueError, "(3,)"),
             (lambda t: F.gather(t, 1, T(np.zeros((4, 2), np.int32))), ValueError, "(4, 2)"),
             (lambda t: F.gather(t, 2, T(np.zeros((3, 4), np.int32))), ValueError, "axis 2"),
             (lambda t: F.gather(t, 1, T(np.zeros((3, 4)))), ValueError, "float64"),
             (lambda t: F.gather(t, 1, T(np.full((3, 2), 4))), IndexError, "size 4")]
    for fn, exc, needle in cases:
        for record in (False, True):
            h.check_error(h.error_of(fn, x, record, exc), "Gather", "(3, 4)", needle)


# ---------------------------------------------------------------- scatter
SCATTERS = [((3, 4), 1, (3, 2)), ((3, 4), 0, (2, 4)), ((2, 3, 4), 1, (2, 2, 4)), ((2, 3, 4), -1, (1, 3, 3)),
            ((4, 5), 1, (2, 3)),            # smaller than the input outside the axis
            ((5,), 0, (5,)), ((1, 1), 1, (1, 1))]


@pytest.mark.parametrize("shape, axis, ishape", SCATTERS)
def test_scatter_vs_torch(shape, axis, ishape, rng, h, torch):
    x, src = rng.standard_normal(shape), rng.standard_normal(ishape)
    idx = perm_index(rng, ishape, axis, shape[axis])
    h.compare(torch, lambda t, i, s: F.scatter(t, axis, i, s),
              lambda t, i, s: torch.scatter(t, axis % len(shape), i, s), [x, idx, src])


@pytest.mark.parametrize("shape, axis, ishape", SCATTERS)
def test_scatter_grads(shape, axis, ishape, rng, h):
    idx = T(perm_index(rng, ishape, axis, shape[axis]))
    h.check_grads(lambda t, s: F.scatter(t * t, axis, idx, s * t.sum()), [rng.standard_normal(shape), rng.standard_normal(ishape)])


def test_scatter_gradient_values():
    """inp's gradient is zero where written; source's is g at its targets."""
    x, src = gradcore.Tensor(np.zeros((2, 3))), gradcore.Tensor(np.array([[5.0], [6.0]]))
    gm = gradcore.GradManager().attach([x, src])
    with gm:
        y = F.scatter(x, 1, T([[2], [0]]), src)
        gm.backward(y, T(np.arange(1.0, 7.0).reshape(2, 3)))
    np.testing.assert_array_equal(y.numpy(), [[0, 0, 5], [6, 0, 0]])
    np.testing.assert_array_equal(x.grad.numpy(), [[1, 2, 0], [0, 5, 6]])
    np.testing.assert_array_equal(src.grad.numpy(), [[3], [4]])


def test_scatter_casts_source_and_keeps_dtype():
    x = T(np.zeros(3, np.float32))
    out = F.scatter(x, 0, T([1]), np.array([2.5]))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.numpy(), [0, 2.5, 0])


def test_scatter_bad_input(h):
    x = T(np.ones((3, 4)))
    cases = [(lambda t: F.scatter(t, 1, T(np.zeros((3, 2), np.int32)), T(np.ones((3, 3)))), ValueError, "(3, 3)"),
             (lambda t: F.scatter(t, 1, T(np.zeros((4, 2), np.int32)), T(np.ones((4, 2)))), ValueError, "(4, 2)"),
             (lambda t: F.scatter(t, 0, T(np.zeros((2,), np.int32)), T(np.ones((2,)))), ValueError, "dimensions"),
             (lambda t: F.scatter(t, 1, T(np.full((3, 1), -5)), T(np.ones((3, 1)))), IndexError, "size 4")]
    for fn, exc, needle in cases:
        for record in (False, True):
            h.check_error(h.error_of(fn, x, record, exc), "Scatter", "(3, 4)", needle)


# ---------------------------------------------------------------- sort
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (1,), (3, 1)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_vs_torch(shape, descending, rng, h, torch):
    x = rng.standard_normal(shape)
    v, i = F.sort(T(x), descending)
    tv, ti = torch.sort(torch.tensor(x), dim=-1, descending=descending, stable=True)
    h.assert_close(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    assert i.dtype == np.int32
    h.compare(torch, lambda t: F.sort(t, descending)[0],
              lambda t: torch.sort(t, dim=-1, descending=descending, stable=True)[0], [x])


def test_sort_is_stable_with_ties(torch):
    x = np.array([[2.0, 1.0, 2.0, 1.0, 0.0]])
    for desc in (False, True):
        v, i = F.sort(T(x), desc)
        ti = torch.sort(torch.tensor(x), descending=desc, stable=True)[1]
        np.testing.assert_array_equal(i.numpy(), ti.numpy())


@pytest.mark.parametrize("shape, descending", [((5,), False), ((3, 4), True), ((2, 1), False)])
def test_sort_grads(shape, descending, rng, h):
    h.check_grads(lambda t: F.sort(t * t, descending)[0] ** 2 * T(np.arange(1.0, shape[-1] + 1)),
                  [rng.standard_normal(shape)])


def test_sort_bad_input(h):
    for record in (False, True):
        h.check_error(h.error_of(lambda t: F.sort(t), T(np.array(1.0)), record), "Sort", "()")


# ---------------------------------------------------------------- topk
TOPKS = [((6,), 3), ((3, 5), 2), ((2, 3, 4), 4), ((3, 5), 1), ((3, 5), 5), ((1,), 1)]


@pytest.mark.parametrize("shape, k", TOPKS)
@pytest.mark.parametrize("descending", [False, True])
def test_topk_vs_torch(shape, k, descending, rng, h, torch):
    x = rng.standard_normal(shape)
    v, i = F.topk(T(x), k, descending=descending)
    tv, ti = torch.topk(torch.tensor(x), k, dim=-1, largest=descending, sorted=True)
    h.assert_close(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    assert i.dtype == np.int32 and v.dtype == np.float64
    h.compare(torch, lambda t: F.topk(t, k, descending=descending)[0],
              lambda t: torch.topk(t, k, dim=-1, largest=descending)[0], [x])


@pytest.mark.parametrize("shape, k", TOPKS)
@pytest.mark.parametrize("descending", [False, True])
def test_topk_kth_only_vs_torch(shape, k, descending, rng, h, torch):
    x = rng.standard_normal(shape)

    def tfn(t):
        return torch.topk(t, k, dim=-1, largest=descending)[0][..., -1]
    v, i = F.topk(T(x), k, descending=descending, kth_only=True)
    assert v.shape == shape[:-1] and i.dtype == np.int32
    np.testing.assert_array_equal(i.numpy(), torch.topk(torch.tensor(x), k, dim=-1, largest=descending)[1][..., -1].numpy())
    h.compare(torch, lambda t: F.topk(t, k, descending=descending, kth_only=True)[0], tfn, [x])


@pytest.mark.parametrize("shape, k", TOPKS)
def test_topk_no_sort(shape, k, rng, h, torch):
    x = rng.standard_normal(shape)
    v, i = F.topk(T(x), k, descending=True, no_sort=True)
    ti = torch.topk(torch.tensor(x), k, dim=-1, largest=True)[1].numpy()
    np.testing.assert_array_equal(i.numpy(), np.sort(ti, -1))        # the same set, in index order
    np.testing.assert_array_equal(v.numpy(), np.take_along_axis(x, np.sort(ti, -1), -1))
    # gradients: sorted order does not matter once the values are summed with their own weights
    h.compare(torch, lambda t: F.sum(F.topk(t, k, descending=True, no_sort=True)[0] ** 2),
              lambda t: (torch.topk(t, k, dim=-1)[0] ** 2).sum(), [x])


@pytest.mark.parametrize("kw", [{}, {"descending": True}, {"kth_only": True}, {"no_sort": True}])
def test_topk_grads(kw, rng, h):
    h.check_grads(lambda t: F.topk(t * t, 2, **kw)[0] ** 2, [rng.standard_normal((3, 4))])
    h.check_grads(lambda t: F.topk(t, 1, **kw)[0] ** 2, [rng.standard_normal((1,))])


def test_topk_bad_input(h):
    x = T(np.ones((2, 3)))
    for fn, needle in [(lambda t: F.topk(t, 4), "k=4"), (lambda t: F.topk(t, 0, kth_only=True), "k=0"),
                       (lambda t: F.topk(t, -1), "k=-1")]:
        for record in (False, True):
            h.check_error(h.error_of(fn, x, record), "TopK", "(2, 3)", needle)
    h.check_error(h.error_of(lambda t: F.topk(t, 1), T(np.array(1.0)), True), "TopK", "()")


# ---------------------------------------------------------------- dtypes
@pytest.mark.parametrize("name, fn", [
    ("split", lambda t: F.split(t, 2, 1)[1]),
    ("stack", lambda t: F.stack([t, t * 2], 1)),
    ("gather", lambda t: F.gather(t, 1, T([[0, 0], [2, 1]]))),
    ("scatter", lambda t: F.scatter(t, 1, T([[2], [0]]), t[:, :1] * 3)),
    ("sort", lambda t: F.sort(t, True)[0]),
    ("topk", lambda t: F.topk(t, 2)[0]),
    ("topk-kth", lambda t: F.topk(t, 2, kth_only=True)[0]),
])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dtype_preserved(name, fn, dtype, rng, h):
    x = rng.standard_normal((2, 3)).astype(dtype)
    out, grads, _ = h.gc_vjp(fn, [x])
    assert out.dtype == np.dtype(dtype) and grads[0].dtype == np.dtype(dtype)


def test_integer_inputs():
    x = T(np.array([[3, 1, 2], [0, 5, 4]], np.int64))
    v, i = F.sort(x, True)
    assert v.dtype == np.int64 and i.dtype == np.int32
    np.testing.assert_array_equal(v.numpy(), [[3, 2, 1], [5, 4, 0]])
    assert F.gather(x, 1, T([[2], [1]])).numpy().tolist() == [[2], [5]]


# ---------------------------------------------------------------- second order through chains
def test_second_order_chain(rng):
    x = gradcore.Tensor(rng.standard_normal((3, 4)))
    idx = T(rng.integers(0, 4, (3, 4)))

    def fn(t):
        a, b = F.split(t, 2, 1)
        s = F.stack([a * b, b], 0)
        g = F.gather(F.reshape(s, (3, 4)) * t, 1, idx)
        return F.topk(F.sort(g * g, True)[0], 3)[0]
    assert gradgradcheck(fn, [x])


# ---------------------------------------------------------------- CUDA sources
def _ops():
    return [Split(0, 2), Stack(0), Unstack(0, 2), Gather(1), GatherGrad(1), Scatter(1), Sort(False),
            TopK(2, False, "sorted")]


NAMES = ["split", "stack", "unstack", "gather", "gather_grad", "scatter", "sort", "topk"]


@pytest.mark.parametrize("ctype", ["float", "double"])
def test_cuda_sources_compile(nvcc_ptx, ctype):
    ptx = nvcc_ptx("\n".join(op.cuda_source(ctype) for op in _ops()), f"indexing_{ctype}")
    for name in NAMES:
        assert f"gc_{name}_{ctype}" in ptx


# the kernels run through their launchers on the host emulator: tests/cuda/test_cuda_indexing.py
