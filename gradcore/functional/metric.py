"""``F.metric``: MegEngine's module path of the metrics; the functions are
defined with the losses in F.nn.

Example::

    >>> import gradcore as gc, gradcore.functional as F
    >>> logits = gc.tensor([[0.1, 0.9], [0.8, 0.2]])
    >>> float(F.metric.topk_accuracy(logits, gc.tensor([1, 1], dtype="int32")))
    0.5
"""
from .nn import topk_accuracy

__all__ = ["topk_accuracy"]
