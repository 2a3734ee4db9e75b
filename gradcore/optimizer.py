"""gradcore.optimizer (``optim``): SGD.

Example::

    >>> opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> opt.step().clear_grad()
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Union

import numpy as np

from ._core import Tensor


class Optimizer:
    """Holds ``param_groups`` (dicts with "params" and hyper-parameters)."""

    def __init__(self, params: Union[Iterable[Tensor], Iterable[Dict]], defaults: Dict):
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups: List[Dict] = []
        for g in groups:
            group = dict(defaults)
            group.update(g)
            group["params"] = list(group["params"])
            for p in group["params"]:
                if not isinstance(p, Tensor):
                    raise TypeError(f"{type(self).__name__}: parameters must be Tensors, got {type(p).__name__}")
            self.param_groups.append(group)
        self._state: Dict[int, Dict] = {}

    def clear_grad(self) -> "Optimizer":
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
        return self

    zero_grad = clear_grad

    def step(self) -> "Optimizer":
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, p.grad.numpy(), group, self._state.setdefault(id(p), {}))
        return self

    def _update(self, param, grad, group, state):
        raise NotImplementedError

    @staticmethod
    def _assign(param: Tensor, value: np.ndarray) -> None:
        # a new buffer: values saved for a pending backward are never overwritten
        param._data = value.astype(param.dtype, copy=False)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, Nesterov and weight decay
    (MegEngine's update rule)."""

    def __init__(self, params, lr: float, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError("SGD: lr, momentum and weight_decay must be non-negative")
        if nesterov and momentum == 0:
            raise ValueError("SGD: nesterov needs a momentum")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      weight_decay=weight_decay))

    def _update(self, param, grad, group, state):
        p = param.numpy()
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * p
        mom = group["momentum"]
        if mom:
            buf = state.get("momentum_buffer")
            buf = grad.copy() if buf is None else mom * buf + grad
            state["momentum_buffer"] = buf
            grad = grad + mom * buf if group["nesterov"] else buf
        self._assign(param, p - group["lr"] * grad)
