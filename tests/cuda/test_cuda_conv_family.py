"""conv_transpose2d, conv3d, conv1d and interpolate on cuda: cpu vs cuda, values,
first and second order (the gradient ops ConvTranspose -> Convolution /
ConvolutionBackwardFilter, ConvolutionBackwardData/Filter and InterpolateBackward run
in the backward graphs). The second-order runs are marked slow (the
emulator runs every kernel on the host): ``-m "not slow"`` leaves them out."""
from __future__ import annotations

import numpy as np
import pytest

from gradcore.core import apply
from gradcore.ops import ConvTranspose, Convolution, Interpolate


def _rand(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(dtype)


def _op_fn(op):
    return lambda *xs: apply(op, *xs)[0]


# x shape, weight shape, ConvTranspose(stride, padding, output_padding, dilation, groups)
CT_CASES = {
    "plain": ((2, 3, 4, 3), (3, 2, 3, 3), (1, 0, 0, 1, 1)),
    "upsample": ((1, 4, 3, 3), (4, 2, 3, 3), (2, 1, 1, 1, 1)),
    "asymmetric-grouped": ((2, 4, 3, 3), (4, 3, 2, 3), ((2, 3), (1, 0), (1, 2), (1, 2), 2)),
    "pointwise": ((2, 3, 2, 2), (3, 2, 1, 1), (1, 0, 0, 1, 1)),
}


@pytest.mark.parametrize("case", list(CT_CASES))
def test_conv_transpose2d(cuda, matches_cpu, conv_path, case):
    xs, ws, attrs = CT_CASES[case]
    matches_cpu(_op_fn(ConvTranspose(*attrs)), [_rand(*xs), _rand(*ws)], second_order=False)


@pytest.mark.slow
def test_conv_transpose2d_second_order(cuda, matches_cpu, conv_path):
    op = ConvTranspose(2, 1, 1, 1, 2)
    matches_cpu(lambda x, w: apply(op, x, w)[0] ** 2, [_rand(1, 4, 3, 3), _rand(4, 3, 3, 3)],
                rtol=1e-4, atol=1e-4)


C3_CASES = {
    "plain": ((2, 2, 3, 4, 3), (3, 2, 2, 2, 2), (1, 0, 1, 1)),
    "strided-padded-grouped": ((1, 4, 4, 3, 5), (2, 2, 3, 2, 2), ((2, 1, 2), (1, 0, 1), (1, 2, 1), 2)),
}


@pytest.mark.parametrize("attrs", [(1, 0, 1, 2), ((2,), (1,), (2,), 2)])
def test_conv1d(cuda, matches_cpu, conv_path, attrs):
    """1-d runs the 3-d kernels with two leading axes of size 1, on both cuda paths."""
    matches_cpu(_op_fn(Convolution(*attrs)), [_rand(2, 4, 9), _rand(6, 2, 3)], second_order=False)


@pytest.mark.parametrize("case", list(C3_CASES))
def test_conv3d(cuda, matches_cpu, conv_path, case):
    xs, ws, attrs = C3_CASES[case]
    matches_cpu(_op_fn(Convolution(*attrs)), [_rand(*xs), _rand(*ws)], second_order=False)


def test_conv3d_float64(cuda, matches_cpu):
    matches_cpu(_op_fn(Convolution(1, 1, 1, 1)), [_rand(1, 2, 3, 3, 3, dtype=np.float64),
                                             _rand(2, 2, 2, 2, 2, dtype=np.float64)],
                rtol=1e-10, atol=1e-10, second_order=False)


@pytest.mark.slow
def test_conv3d_second_order(cuda, matches_cpu):
    op = Convolution(1, 1, 1, 2)
    matches_cpu(lambda x, w: apply(op, x, w)[0] ** 2, [_rand(1, 2, 3, 3, 2), _rand(2, 1, 2, 2, 2)],
                rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("size", [(7, 9), (2, 3)])
@pytest.mark.parametrize("mode, align_corners", [("nearest", False), ("bilinear", False), ("bilinear", True)])
def test_interpolate(cuda, matches_cpu, size, mode, align_corners):
    matches_cpu(_op_fn(Interpolate(size, mode, align_corners)), [_rand(2, 3, 4, 5)], second_order=False)


@pytest.mark.slow
@pytest.mark.parametrize("mode, align_corners", [("nearest", False), ("bilinear", True)])
def test_interpolate_second_order(cuda, matches_cpu, mode, align_corners):
    op = Interpolate((5, 3), mode, align_corners)
    matches_cpu(lambda x: apply(op, x)[0] ** 2, [_rand(1, 2, 3, 4)])


def test_empty_batch(cuda, matches_cpu):
    matches_cpu(_op_fn(Convolution()), [_rand(0, 2, 3, 3, 3), _rand(2, 2, 2, 2, 2)], second_order=False)
    matches_cpu(_op_fn(Interpolate((4, 4))), [_rand(0, 2, 3, 3)], second_order=False)
