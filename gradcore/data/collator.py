"""Collators merge the samples of a batch into batched arrays, after
``megengine.data.Collator``.

Example::

    >>> import numpy as np
    >>> from gradcore.data import Collator
    >>> x, y = Collator().apply([(np.zeros(2), 1), (np.ones(2), 2)])
    >>> x.shape, y
    ((2, 2), array([1, 2]))
"""
from __future__ import annotations

import collections.abc
from typing import Any, Sequence

import numpy as np

__all__ = ["Collator"]


class Collator:
    """The default collator: the samples' arrays are stacked along a new
    first axis; numbers become a 1-d array (Python floats as float64);
    strings and bytes stay a list; tuples and lists are collated field by
    field into a list, named tuples and dicts into their own type.

    Example::

        >>> from gradcore.data import Collator
        >>> batch = Collator().apply([{"x": np.float32(1)}, {"x": np.float32(2)}])
        >>> batch["x"].dtype
        dtype('float32')
    """

    def apply(self, inputs: Sequence[Any]) -> Any:
        """Collate one batch (a sequence of samples of the same structure).

        Example::

            >>> Collator().apply([np.ones((2, 2)), np.ones((2, 2))]).shape
            (2, 2, 2)
        """
        if len(inputs) == 0:
            raise ValueError("Collator: cannot collate an empty batch")
        elem = inputs[0]
        if isinstance(elem, np.ndarray):
            if elem.dtype.kind in "OUS":
                raise TypeError(f"Collator: cannot batch arrays of dtype {elem.dtype}")
            shapes = {a.shape for a in inputs}
            if len(shapes) > 1:
                raise ValueError(f"Collator: the samples' arrays have different shapes {sorted(shapes)}; "
                                 "resize them in a transform or pass your own collator")
            return np.ascontiguousarray(np.stack(inputs))
        if isinstance(elem, (np.generic, int)) and not isinstance(elem, (np.str_, np.bytes_)):
            return np.array(inputs)         # (bool is an int)
        if isinstance(elem, float):
            return np.array(inputs, dtype=np.float64)
        if isinstance(elem, (str, bytes)):
            return list(inputs)
        if isinstance(elem, collections.abc.Mapping):
            return {key: self.apply([d[key] for d in inputs]) for key in elem}
        if isinstance(elem, tuple) and hasattr(elem, "_fields"):          # a named tuple
            return type(elem)(*(self.apply(list(field)) for field in zip(*inputs)))
        if isinstance(elem, collections.abc.Sequence):
            # a list for tuples too, as MegEngine's (and PyTorch's) collator
            return [self.apply(list(field)) for field in zip(*inputs)]
        raise TypeError(f"Collator: samples must hold NumPy arrays, numbers, strings, bytes, dicts, "
                        f"tuples or lists; found {type(elem).__name__}")
