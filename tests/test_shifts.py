"""F.left_shift / F.right_shift and the << >> operators (MegEngine's; a
composition of a power-of-two lookup, mul / floor_div and where): values
against torch.bitwise_left_shift / bitwise_right_shift for counts within the
bit width, against NumPy's shifts (which define them) for counts beyond, for
every integer dtype; dtype promotion, broadcasting and the errors."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F

torch = pytest.importorskip("torch")
DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8]
TORCH = {np.int8: torch.int8, np.int16: torch.int16, np.int32: torch.int32, np.int64: torch.int64,
         np.uint8: torch.uint8}


def _samples(dtype, rng, max_count):
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, size=300, dtype=dtype, endpoint=True)
    x[:4] = [info.min, info.max, 0, 1 if info.min == 0 else -1]
    return x, rng.integers(0, max_count, size=300).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_shifts_within_the_bit_width_match_torch(dtype):
    x, y = _samples(dtype, np.random.default_rng(7), np.iinfo(dtype).bits)
    tx, ty = torch.tensor(x, dtype=TORCH[dtype]), torch.tensor(y, dtype=TORCH[dtype])
    left, right = F.left_shift(gc.tensor(x), gc.tensor(y)), F.right_shift(gc.tensor(x), gc.tensor(y))
    assert left.dtype == dtype and right.dtype == dtype
    np.testing.assert_array_equal(left.numpy(), torch.bitwise_left_shift(tx, ty).numpy())
    np.testing.assert_array_equal(right.numpy(), torch.bitwise_right_shift(tx, ty).numpy())


@pytest.mark.parametrize("dtype", DTYPES)
def test_counts_of_the_bit_width_or_more_match_numpy(dtype):
    bits = np.iinfo(dtype).bits
    x, _ = _samples(dtype, np.random.default_rng(8), bits)
    y = np.random.default_rng(9).integers(bits - 1, min(bits + 20, np.iinfo(dtype).max), size=x.size).astype(dtype)
    np.testing.assert_array_equal(F.left_shift(gc.tensor(x), gc.tensor(y)).numpy(), np.left_shift(x, y))
    np.testing.assert_array_equal(F.right_shift(gc.tensor(x), gc.tensor(y)).numpy(), np.right_shift(x, y))


def test_operators_broadcasting_and_promotion():
    x = gc.tensor(np.array([[1], [-8]], np.int32))
    np.testing.assert_array_equal((x << gc.tensor(np.array([0, 1, 3], np.int8))).numpy(), [[1, 2, 8], [-8, -16, -64]])
    np.testing.assert_array_equal((x >> 2).numpy(), [[0], [-2]])
    np.testing.assert_array_equal((1 << gc.tensor([0, 4])).numpy(), [1, 16])
    np.testing.assert_array_equal((64 >> gc.tensor([1, 3])).numpy(), [32, 8])
    out = F.left_shift(gc.tensor(np.array([3], np.int8)), gc.tensor(np.array([2], np.int32)))
    assert out.dtype == np.int32 and out.numpy().tolist() == [12]


def test_shift_errors_name_the_op():
    with pytest.raises(TypeError, match=r"^left_shift: x and y must be integer tensors, got float32 and int32"):
        F.left_shift(gc.tensor([1.0]), gc.tensor([1]))
    with pytest.raises(TypeError, match=r"^right_shift: "):
        gc.tensor([1]) >> gc.tensor([True])
    with pytest.raises(gc.op.ArgumentError, match=r"^right_shift: shift counts must be >= 0, got -1"):
        F.right_shift(gc.tensor([4, 4]), gc.tensor([1, -1]))
