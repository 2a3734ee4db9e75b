"""gradcore's standard op library, one module per family. It registers
itself through the ``gradcore.ops`` entry point group, exactly like a
third-party plugin (see ``register``).

Example::

    >>> from gradcore.ops import Elemwise, get
    >>> get("Elemwise") is Elemwise
    True
"""
from gradcore import registry as _registry
from gradcore.cuda import families as _cuda_families
from gradcore.cuda import runtime as _cuda_runtime
from gradcore.op import describe as _describe

from .conv import Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter, ConvTranspose
from .elemwise import CUDA_HELPERS, Elemwise
from .indexing import (Gather, GatherGrad, IndexingOneHot, IndexingOneHotGrad, Scatter, SetSubtensor, Sort,
                       Subtensor, SubtensorGrad, TopK)
from .linalg import SVD, MatrixInverse, MatrixMul
from .pool import AvgPool2d, AvgPool2dBackward, MaxPool2d, MaxPool2dBackward, MaxPool2dGather
from .nn import (BatchNormBackward, BatchNormInference, BatchNormTraining, LogSoftmax, LogSumExp, Softmax,
                 Standardize, StandardizeAffine, StandardizeAffineBackward, StandardizeBackward)
from .loss import CrossEntropy, CrossEntropyGrad, CTCLoss, CTCLossGrad
from .rnn import (GRUCellGates, GRUCellGatesBackward, LSTMCellGates, LSTMCellGatesBackward, LSTMLayer,
                  LSTMLayerBackward)
from .reduce import ArgReduce, BroadcastBack, CumSum, Reduce
from .vision import DeformablePSROIPooling, DeformablePSROIPoolingBackward, Interpolate, InterpolateBackward
from .shape import (Broadcast, BroadcastToLike, Cast, Concat, Copy, ExpandDims, Identity, Reshape,
                    ReshapeLike, Split, SplitLike, Squeeze, Stack, StopGradient, SumTo, SumToLike,
                    Transpose, Unstack, ZerosLike)

STANDARD_OPS = [
    Elemwise, Reduce, BroadcastBack, ArgReduce, CumSum, MatrixMul, MatrixInverse, SVD, Reshape, ReshapeLike, Transpose, Broadcast,
    BroadcastToLike, SumTo, SumToLike, ZerosLike, ExpandDims, Squeeze, Cast, Copy, Identity,
    StopGradient, Concat, SplitLike, Subtensor, SubtensorGrad, SetSubtensor, IndexingOneHot,
    IndexingOneHotGrad, LogSoftmax, LogSumExp, Softmax,
    Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter, ConvTranspose,
    MaxPool2d, MaxPool2dBackward, MaxPool2dGather, AvgPool2d, AvgPool2dBackward, Interpolate, InterpolateBackward,
    DeformablePSROIPooling, DeformablePSROIPoolingBackward,
    Split, Stack, Unstack, Gather, GatherGrad, Scatter, Sort, TopK,
    BatchNormTraining, BatchNormBackward, BatchNormInference,
    LSTMCellGates, LSTMCellGatesBackward, GRUCellGates, GRUCellGatesBackward, CrossEntropy, CrossEntropyGrad,
    CTCLoss, CTCLossGrad, LSTMLayer, LSTMLayerBackward, Standardize, StandardizeBackward,
    StandardizeAffine, StandardizeAffineBackward,
]


def register():
    """Entry point of the standard library (group ``gradcore.ops``)."""
    for cls in STANDARD_OPS:
        _registry.register_op(cls)


def get(name: str):
    """Find any registered op class by name, plugins' included."""
    return _registry.get(name)


def operator_op(name: str):
    """The op behind a Python operator (``+`` is ``Elemwise("add")``)."""
    return Elemwise(name)


def standard_op(name: str):
    """The op-library class the CUDA backend's array helpers run (``cast``,
    ``broadcast_to``, ``transpose``, ``reduce``, elementwise arithmetic) or
    the elementwise helpers' CUDA source: the device layer does not import
    the op library, the library hands itself over at import
    (``gradcore.cuda.runtime.install_standard_ops``).

    Example::

        >>> standard_op("Cast") is Cast
        True
    """
    return _STANDARD[name]


_STANDARD = {"Cast": Cast, "Broadcast": Broadcast, "Transpose": Transpose, "Reduce": Reduce, "Elemwise": Elemwise,
             "CUDA_HELPERS": CUDA_HELPERS, "describe": _describe}


# the layers below learn of the op library through hooks (they import nothing
# above them): the CUDA backend's helpers and kernel families, and the registry's fallback for a
# source tree without installed entry points
_cuda_runtime.install_standard_ops(standard_op)
# the catalog of standard kernels the kernel cache compiles per family
from . import kernel_families as _kernel_families  # noqa: E402
_cuda_families.install(_kernel_families)
_registry.provide_standard_library(register)
