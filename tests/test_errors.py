"""Mistakes a bad-input fuzzer over the public API found answered silently
or unclearly: each is now an exception of the documented type whose
message names the function or op and, for shapes, the shapes; the same
under a recording GradManager, and on the (emulated) cuda device where the
path differs."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore.autodiff import GradManager


def T(a, dtype="float32", device=None):
    return gc.tensor(np.asarray(a, dtype), device=device)


def _recording(fn, *tensors):
    """``fn()`` inside a GradManager recording ``tensors``."""
    gm = GradManager().attach(list(tensors))
    with gm:
        return fn()


@pytest.fixture(params=["plain", "recording"])
def run(request):
    """Calls ``fn`` as is, or inside a recording GradManager."""
    if request.param == "plain":
        return lambda fn, *tensors: fn()
    return _recording


# ---------------------------------------------------------------- non-numeric arrays as operands
@pytest.mark.parametrize("fn, name", [(F.sum, r"(^sum|Reduce\(mode='sum')"), (F.copy, r"(^copy|Copy)"),
                                      (F.softmax, r"(^softmax|Softmax)"), (F.flatten, r"(^flatten|Reshape)"),
                                      (lambda a: T([1.0, 2.0]) + a, r"Elemwise\(add\)")])
@pytest.mark.parametrize("array", [np.array([1 + 2j, 3j]), np.array([object(), 1], dtype=object)],
                         ids=["complex", "object"])
def test_a_complex_or_object_array_operand_is_refused_naming_the_op(fn, name, array):
    # these became complex128/object tensors (or lost the imaginary part);
    # the op's own infer may refuse the dtype first (a ValueError then)
    with pytest.raises((TypeError, ValueError), match=name + r".*(complex128|object)"):
        fn(array)


@pytest.mark.parametrize("fn, name", [(lambda a: F.matmul(T(np.ones((2, 2))), a), "matmul"),
                                      (lambda a: F.conv2d(T(np.ones((1, 2, 3, 3))), a), "conv2d"),
                                      (lambda a: F.concat([T([1.0]), a]), "concat"),
                                      (F.zeros_like, "zeros_like")])
def test_a_complex_array_argument_is_refused_naming_the_function(fn, name):
    # these said "promote_types: dtype complex128 is not supported", or named Tensor
    with pytest.raises(TypeError, match=rf"^{name}: cannot use ndarray .*complex128"):
        fn(np.array([1 + 2j, 3j]))


def test_a_str_array_index_stays_an_index_error():
    x = T(np.ones((3, 2)))
    with pytest.raises(IndexError, match=r"Subtensor.*valid indices.*<U1 \(input shapes: \(3, 2\)"):
        x[np.array("a")]


def test_setitem_with_a_complex_value_is_refused(run):
    x = T(np.ones((2, 3)))
    with pytest.raises(TypeError, match=r"setitem: cannot use ndarray .* float32 and shape \(2, 3\).*complex128"):
        run(lambda: x.__setitem__(0, np.array([1 + 1j, 2, 3])), x)
    np.testing.assert_array_equal(x.numpy(), 1.0)      # nothing written


# ---------------------------------------------------------------- ctc_loss: values out of range
def _ctc(il, label, tl):
    rng = np.random.default_rng(0)
    pred = F.softmax(T(rng.normal(size=(5, 2, 4))), axis=2)
    i = lambda a: T(a, "int32")  # noqa: E731
    return F.ctc_loss(pred, i(il), i(label), i(tl))


@pytest.mark.parametrize("il, label, tl, exc, msg", [
    ([5, 5], [[1, 9], [1, 2]], [2, 2], IndexError, r"label 9 is not one of the 4 classes"),
    ([5, 5], [[1, -1], [1, 2]], [2, 2], IndexError, r"label -1 is not one of the 4 classes"),
    ([9, 5], [[1, 2], [1, 2]], [2, 2], ValueError, r"input_lengths must be in \[0, 5\], got 9"),
    ([5, 5], [[1, 2], [1, 2]], [3, 2], ValueError, r"target_lengths must be in \[0, 2\], got 3"),
    ([5, -1], [[1, 2], [1, 2]], [2, 2], ValueError, r"input_lengths must be in \[0, 5\], got -1"),
])
def test_ctc_loss_refuses_labels_and_lengths_out_of_range(il, label, tl, exc, msg):
    # the recursion clipped them: the loss of another problem, silently
    with pytest.raises(exc, match=r"CTCLoss.*" + msg + r".*\(5, 2, 4\), \(2, 2\), \(2,\), \(2,\)"):
        _ctc(il, label, tl)


def test_ctc_loss_padding_past_a_length_is_not_checked():
    # labels past a sample's length are padding: anything goes there
    assert np.isfinite(_ctc([5, 5], [[1, -1], [1, 2]], [1, 2]).item())


# ---------------------------------------------------------------- optimizers
def test_an_optimizer_takes_only_parameters():
    p = gc.Parameter(np.ones(2, "float32"))
    with pytest.raises(TypeError, match=r"SGD: can only optimize Parameters, got Tensor of shape \(2, 3\)"):
        optim.SGD([p, T(np.ones((2, 3)))], lr=0.1)


@pytest.mark.parametrize("kw", [{"lr": float("inf")}, {"lr": 0.1, "momentum": -float("inf")}])
def test_an_infinite_hyper_parameter_is_refused(kw):
    with pytest.raises(ValueError, match=r"SGD: (lr|momentum) must be finite, got -?inf"):
        optim.SGD([gc.Parameter(np.ones(2, "float32"))], **kw)


def test_clip_grad_norm_still_takes_the_inf_norm():
    p = gc.Parameter(np.ones(2, "float32"))
    p.grad = T([3.0, -4.0])
    assert optim.clip_grad_norm([p], 1.0, float("inf")).item() == 4.0


# ---------------------------------------------------------------- argument checks
@pytest.mark.parametrize("call, name", [
    (lambda x, w: F.conv2d(x, w, compute_mode="foo"), "conv2d"),
    (lambda x, w: F.conv_transpose2d(x, w.transpose(1, 0, 2, 3), compute_mode="foo"), "conv_transpose2d"),
    (lambda x, w: F.nn.conv1d(x[:, :, 0], w[:, :, 0], compute_mode="foo"), "conv1d"),
])
def test_convolutions_check_compute_mode(call, name):
    x, w = T(np.ones((1, 3, 5, 5))), T(np.ones((4, 3, 3, 3)))
    with pytest.raises(ValueError, match=rf"{name}: compute_mode must be 'default' or 'float32', got 'foo'"):
        call(x, w)


def test_expand_dims_refuses_an_axis_named_twice(run):
    x = T(np.ones((2, 3)))
    # it raised "generator raised StopIteration"
    with pytest.raises(ValueError, match=r"ExpandDims.*axis \(0, 0\) names an axis twice .*\(2, 3\)"):
        run(lambda: F.expand_dims(x, (0, 0)), x)


@pytest.mark.parametrize("size, exc, msg", [(2.5, TypeError, "size must be an int or a sequence of ints"),
                                            ((2, 1.0), TypeError, "size must be an int or a sequence of ints"),
                                            ((-1,), ValueError, "size must not be negative")])
def test_random_sizes_are_checked(size, exc, msg):
    # 2.5 was "'float' object is not iterable", -1 NumPy's unnamed message
    with pytest.raises(exc, match=rf"gradcore.random: {msg}, got {size!r}".replace("(", r"\(").replace(")", r"\)")):
        gc.random.normal(size=size)


# ---------------------------------------------------------------- huge allocations
# 2**62 bytes: more than any address space, so the allocation fails however
# the machine overcommits (nothing is touched)
@pytest.mark.parametrize("make, name", [(lambda: M.Linear(2 ** 30, 2 ** 30), "Linear"),
                                        (lambda: M.Embedding(2 ** 30, 2 ** 30), "Embedding"),
                                        (lambda: M.Conv2d(2 ** 15, 2 ** 15, 2 ** 8), "Conv2d")])
def test_a_layer_too_big_to_allocate_names_itself(make, name):
    with pytest.raises(MemoryError, match=rf"^{name}: cannot allocate its parameters.*shape"):
        make()


def test_eye_too_big_to_allocate_names_itself():
    with pytest.raises(MemoryError, match=r"^eye: .*\(got N=1073741824"):
        F.eye(2 ** 30)


# ---------------------------------------------------------------- the cuda paths
def test_a_reduction_over_an_axis_named_twice_is_refused_on_cuda_too(emulated_cuda):
    for device in ("cpu", "cuda"):
        x = T(np.ones((2, 3)), device=device)
        # the method's path on cuda reduced once, silently
        with pytest.raises(ValueError, match=r"Reduce\(mode='mean'.*axis \(0, 0\) names an axis twice .*\(2, 3\)"):
            x.mean(axis=(0, 0))
        with pytest.raises(ValueError, match=r"Reduce\(mode='sum'.*axis \(1, -1\) names an axis twice"):
            x.sum(axis=(1, -1))


def test_a_float_cuda_tensor_as_a_shape_entry_is_a_type_error(emulated_cuda):
    x = T(np.ones((2, 3)), device="cuda")
    # it was "'DeviceArray' object has no attribute '__index__'"
    with pytest.raises(TypeError, match=r"reshape: target_shape entries must be an int"):
        F.reshape(x, T([3.0, 2.0], device="cuda"))
    assert F.reshape(x, (T(3, "int32", device="cuda"), 2)).shape == (3, 2)


# ---------------------------------------------------------------- small ones, named
def test_a_zero_slice_step_names_the_op():
    with pytest.raises(ValueError, match=r"Subtensor.*slice step cannot be zero \(input shapes: \(2, 3\)\)"):
        T(np.ones((2, 3)))[::0]


def test_arange_of_none_is_refused():
    # np.arange(0, None) is empty: a silent empty tensor
    with pytest.raises(TypeError, match=r"arange: stop must be a number, got None"):
        F.arange(None)


def test_array_dataset_of_a_number_names_itself():
    from gradcore.data import ArrayDataset
    with pytest.raises(TypeError, match=r"ArrayDataset: each argument must be an array .* got int"):
        ArrayDataset(5)


def test_non_zero_of_a_0d_tensor_and_general_norm_without_axes_are_named():
    with pytest.raises(ValueError, match=r"non_zero: condition must have at least one dimension"):
        F.non_zero(T(1.0))
    with pytest.raises(TypeError, match=r"general_norm: normalized_axis must be an int or a sequence"):
        F.general_norm(T(np.ones((2, 3))), None)


def test_a_pad_too_big_to_allocate_names_pad():
    # 1.5 * 2**62 bytes for the head: fails in any address space, touches nothing
    with pytest.raises(MemoryError, match=r"^pad: .*\(got pad_width="):
        F.nn.pad(T(np.ones((2, 3))), ((2 ** 59, 2 ** 59), (0, 0)))


def test_a_random_size_larger_than_the_machine_names_gradcore_random():
    # NumPy's own MemoryError named no one (and could take the machine down trying)
    with pytest.raises(MemoryError, match=r"gradcore.random: size \(1000000, 1000000\)"):
        gc.random.normal(size=(10**6, 10**6))
    with pytest.raises(MemoryError, match="gradcore.random"):
        gc.random.RNG(seed=0).uniform(size=(10**7, 10**7))
    assert gc.random.normal(size=(2, 3)).shape == (2, 3)
