"""gradcore.optimizer (``optim``): SGD.

Example::

    >>> opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> opt.step().clear_grad()
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Union

import numpy as np

from . import _core
from ._core import Tensor


def _zeros_like(data):
    """Zeros shaped like a parameter's data, on its device."""
    if type(data) is np.ndarray:
        return np.zeros_like(data)
    return data.backend.zeros(data.shape, data.dtype)


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
                    # the raw data (an ndarray, or a DeviceArray on cuda): updated where it lives
                    self._update(p, p.grad._data, group, self._state.setdefault(id(p), {}))
        return self

    def _update(self, param, grad, group, state):
        raise NotImplementedError

    @staticmethod
    def _writable(param: Tensor) -> np.ndarray:
        """The parameter's buffer, for an in-place update (reusing it saves an
        allocation and its page faults every step). The version bump makes a
        backward that saved the old value fail loudly instead of silently."""
        data = param._data
        if type(data) is not np.ndarray:      # a device array: always its own buffer
            _core._bump_version(param)
            return data
        if not data.flags.writeable or not data.flags.owndata:
            data = param._data = data.copy()
        _core._bump_version(param)
        return data


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
        p = self._writable(param)
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * p
        mom = group["momentum"]
        if mom:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.astype(p.dtype, copy=True)
            else:
                buf *= mom
                buf += grad
            grad = grad + mom * buf if group["nesterov"] else buf
        p -= (group["lr"] * grad).astype(p.dtype, copy=False)


class Adam(Optimizer):
    """Adam with bias correction; ``weight_decay`` adds ``wd * param`` to the
    gradient (MegEngine's rule).

    Example::

        >>> opt = Adam(model.parameters(), lr=1e-3)
    """

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError("Adam: lr, eps, weight_decay must be non-negative and betas in [0, 1)")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def _update(self, param, grad, group, state):
        p = self._writable(param)
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * p
        b1, b2 = group["betas"]
        if "exp_avg" not in state:
            state["step"] = 0
            state["exp_avg"] = _zeros_like(p)
            state["exp_avg_sq"] = _zeros_like(p)
        state["step"] += 1
        m, v, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
        m *= b1
        m += (1 - b1) * grad
        v *= b2
        v += (1 - b2) * grad * grad
        m_hat = m / (1 - b1 ** t)
        v_hat = v / (1 - b2 ** t)
        p -= (group["lr"] * m_hat / (np.sqrt(v_hat) + group["eps"])).astype(p.dtype, copy=False)
