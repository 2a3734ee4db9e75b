"""Learning-rate schedulers: MegEngine's ``LRScheduler`` and ``MultiStepLR``,
and PyTorch's ``StepLR``, ``CosineAnnealingLR``, ``LambdaLR`` and
``LinearLR`` (linear warm-up), all importable from ``gradcore.optimizer``.

The rates are PyTorch's step for step, bit for bit: where PyTorch updates
the rate from the previous one (``StepLR``, ``CosineAnnealingLR``,
``LinearLR``: its "chainable" form), so do these, with the same
arithmetic; ``step(epoch)`` with an explicit epoch uses the closed form, as
PyTorch's does.

Example::

    >>> opt = optim.SGD(model.parameters(), lr=0.1)
    >>> sched = optim.MultiStepLR(opt, milestones=[30, 80], gamma=0.1)
    >>> for epoch in range(100):
    ...     train_one_epoch(model, opt)
    ...     sched.step()
"""
from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union
from .op import ArgumentError

# gradcore.optimizer's Optimizer, the type a scheduler drives: handed over by
# gradcore.optimizer when it loads (it imports this module to re-export the
# schedulers, so this one imports nothing of it). Until then no optimizer exists.
_optimizer_class: Optional[type] = None


def accept_optimizer_class(cls: type) -> None:
    """Called by ``gradcore.optimizer`` at import: schedulers take instances
    of ``cls`` (its ``Optimizer``) and refuse anything else.

    Example::

        >>> from gradcore.lr_scheduler import accept_optimizer_class
        >>> accept_optimizer_class(optim.Optimizer)
    """
    global _optimizer_class
    _optimizer_class = cls


class LRScheduler:
    """Base class of the schedulers: sets ``lr`` in every parameter group of
    ``optimizer`` from the epoch count.

    Each group's starting rate is kept in it as ``initial_lr`` (added when
    ``current_epoch`` is -1, required when resuming from a later epoch) and
    listed in ``base_lrs``. Construction calls ``step()`` once, so the
    optimizer starts at the rate of epoch ``current_epoch + 1``. A subclass
    defines ``get_lr()`` (one rate per group, for ``self.current_epoch``;
    it may read the groups' current ``lr``, which ``step()`` is about to
    replace) and names what ``state_dict`` saves in ``_state_keys``; one
    whose ``get_lr`` is such an update also defines ``_closed_form_lr()``,
    which ``step(epoch)`` uses.

    Example::

        >>> class Halving(optim.LRScheduler):
        ...     def get_lr(self):
        ...         return [lr * 0.5 ** self.current_epoch for lr in self.base_lrs]
        >>> opt = optim.SGD([gc.Parameter([1.0])], lr=1.0)
        >>> sched = Halving(opt); sched.step(); sched.step()
        >>> opt.param_groups[0]["lr"]
        0.25
    """

    _state_keys: Tuple[str, ...] = ("current_epoch",)

    def __init__(self, optimizer: "gradcore.optimizer.Optimizer", current_epoch: int = -1):
        if _optimizer_class is None or not isinstance(optimizer, _optimizer_class):
            raise TypeError(f"{type(self).__name__}: optimizer must be an Optimizer, "
                            f"got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.current_epoch = current_epoch
        if current_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"{type(self).__name__}: param_groups[{i}] has no 'initial_lr', "
                                   f"needed to resume at current_epoch={current_epoch}")
        self.base_lrs: List[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self._step_count = 0
        self._last_lr: List[float] = []
        # the constructor's step keeps the current rates in PyTorch's updating
        # schedulers (even when resuming at a later epoch): they read this flag
        self._initial = True
        try:
            self.step()
        finally:
            self._initial = False

    def get_lr(self) -> List[float]:
        """The learning rate of each parameter group at ``current_epoch``."""
        raise NotImplementedError(f"{type(self).__name__}.get_lr is not defined")

    def _closed_form_lr(self) -> List[float]:
        """The rates at ``current_epoch`` computed from ``base_lrs`` alone
        (for ``step(epoch)``); the same as ``get_lr`` unless that one
        updates the current rates."""
        return self.get_lr()

    def step(self, epoch: Optional[int] = None) -> None:
        """Move to the next epoch (or to ``epoch``) and set each group's lr.

        Example::

            >>> sched.step()
        """
        self._step_count += 1
        if epoch is None:
            self.current_epoch += 1
            lrs = self.get_lr()
        else:
            self.current_epoch = epoch
            lrs = self._closed_form_lr()
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> List[float]:
        """The rates the last ``step()`` set, one per group (PyTorch's name).

        Example::

            >>> sched.get_last_lr()
            [0.1]
        """
        return list(self._last_lr)

    def state_dict(self) -> Dict[str, Any]:
        """The scheduler's settings and epoch count (not the optimizer).

        Example::

            >>> state = sched.state_dict()
        """
        return {key: getattr(self, key) for key in self._state_keys}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved; a missing key raises KeyError
        and changes nothing. The optimizer's lr is restored by the
        optimizer's own ``load_state_dict``.

        Example::

            >>> sched.load_state_dict(state)
        """
        for key in self._state_keys:
            if key not in state_dict:
                raise KeyError(f"{type(self).__name__}.load_state_dict: key {key!r} is missing")
        for key in self._state_keys:
            setattr(self, key, state_dict[key])


class MultiStepLR(LRScheduler):
    """Multiplies each group's initial learning rate by ``gamma`` once for
    every milestone reached: at epoch ``e`` the rate is
    ``initial_lr * gamma ** (number of milestones <= e)``.

    Example::

        >>> opt = optim.SGD([gc.Parameter([1.0])], lr=0.1)
        >>> sched = optim.MultiStepLR(opt, milestones=[2, 4], gamma=0.5)
        >>> lrs = []
        >>> for epoch in range(6):
        ...     lrs.append(opt.param_groups[0]["lr"])
        ...     sched.step()
        >>> lrs
        [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]
    """

    _state_keys = ("milestones", "gamma", "current_epoch")

    def __init__(self, optimizer: "gradcore.optimizer.Optimizer", milestones: Iterable[int], gamma: float = 0.1,
                 current_epoch: int = -1):
        milestones = list(milestones)
        if milestones != sorted(milestones):
            raise ArgumentError(f"MultiStepLR: milestones must be increasing, got {milestones}")
        self.milestones = milestones
        self.gamma = gamma
        super().__init__(optimizer, current_epoch)

    def get_lr(self) -> List[float]:
        passed = bisect_right(self.milestones, self.current_epoch)
        return [base_lr * self.gamma ** passed for base_lr in self.base_lrs]


def _check_number(owner: str, name: str, value: Any, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not (low < value if low_open else low <= value) or value > high:
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        raise ArgumentError(f"{owner}: {name} must be a number in {interval}, got {value!r}")


def _check_count(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ArgumentError(f"{owner}: {name} must be a positive integer, got {value!r}")


class StepLR(LRScheduler):
    """Multiplies the rate by ``gamma`` every ``step_size`` epochs: at
    epoch ``e`` it is ``initial_lr * gamma ** (e // step_size)``.

    Example::

        >>> opt = optim.SGD([gc.Parameter([1.0])], lr=1.0)
        >>> sched = optim.StepLR(opt, step_size=2, gamma=0.5)
        >>> lrs = []
        >>> for epoch in range(5):
        ...     lrs.append(opt.param_groups[0]["lr"])
        ...     sched.step()
        >>> lrs
        [1.0, 1.0, 0.5, 0.5, 0.25]
    """

    _state_keys = ("step_size", "gamma", "current_epoch")

    def __init__(self, optimizer: "gradcore.optimizer.Optimizer", step_size: int, gamma: float = 0.1,
                 current_epoch: int = -1):
        _check_count("StepLR", "step_size", step_size)
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, current_epoch)

    def get_lr(self) -> List[float]:
        # PyTorch's update from the current rate (bitwise the same rates)
        e = self.current_epoch
        if e == 0 or e % self.step_size != 0:
            return [group["lr"] for group in self.optimizer.param_groups]
        return [group["lr"] * self.gamma for group in self.optimizer.param_groups]

    def _closed_form_lr(self) -> List[float]:
        return [base_lr * self.gamma ** (self.current_epoch // self.step_size) for base_lr in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the initial rate down to ``eta_min`` over
    ``T_max`` epochs (and back up over the next ``T_max``, as PyTorch's):
    ``eta_min + (initial_lr - eta_min) * (1 + cos(pi * e / T_max)) / 2``,
    computed as PyTorch does, from the previous rate.

    Example::

        >>> opt = optim.SGD([gc.Parameter([1.0])], lr=1.0)
        >>> sched = optim.CosineAnnealingLR(opt, T_max=4)
        >>> lrs = []
        >>> for epoch in range(5):
        ...     lrs.append(round(opt.param_groups[0]["lr"], 4))
        ...     sched.step()
        >>> lrs
        [1.0, 0.8536, 0.5, 0.1464, 0.0]
    """

    _state_keys = ("T_max", "eta_min", "current_epoch")

    def __init__(self, optimizer: "gradcore.optimizer.Optimizer", T_max: int, eta_min: float = 0.0,
                 current_epoch: int = -1):
        _check_count("CosineAnnealingLR", "T_max", T_max)
        _check_number("CosineAnnealingLR", "eta_min", eta_min, 0.0, math.inf)
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, current_epoch)

    def get_lr(self) -> List[float]:
        e, T, eta_min = self.current_epoch, self.T_max, self.eta_min
        groups = self.optimizer.param_groups
        if self._initial:
            return [group["lr"] for group in groups]
        if self._step_count == 1 and e > 0:           # PyTorch keeps this case; not reached after __init__
            return [eta_min + (base_lr - eta_min) * (1 + math.cos(e * math.pi / T)) / 2
                    for base_lr in self.base_lrs]
        if (e - 1 - T) % (2 * T) == 0:                # leaving the minimum: the ratio below is 0/0
            return [group["lr"] + (base_lr - eta_min) * (1 - math.cos(math.pi / T)) / 2
                    for base_lr, group in zip(self.base_lrs, groups)]
        ratio = (1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T))
        return [ratio * (group["lr"] - eta_min) + eta_min for group in groups]

    def _closed_form_lr(self) -> List[float]:
        e, T, eta_min = self.current_epoch, self.T_max, self.eta_min
        return [eta_min + (base_lr - eta_min) * (1 + math.cos(math.pi * e / T)) / 2 for base_lr in self.base_lrs]


class LambdaLR(LRScheduler):
    """The rate is ``initial_lr * lr_lambda(epoch)``; ``lr_lambda`` is one
    function or one per parameter group. Its ``state_dict`` holds the epoch
    count only (functions are not saved: build the scheduler with them,
    then load).

    Example::

        >>> opt = optim.SGD([gc.Parameter([1.0])], lr=0.1)
        >>> sched = optim.LambdaLR(opt, lambda e: (e + 1) / 4 if e < 3 else 1.0)     # warm-up
        >>> lrs = []
        >>> for epoch in range(5):
        ...     lrs.append(round(opt.param_groups[0]["lr"], 4)); sched.step()
        >>> lrs
        [0.025, 0.05, 0.075, 0.1, 0.1]
    """

    _state_keys = ("current_epoch",)

    def __init__(self, optimizer: "gradcore.optimizer.Optimizer",
                 lr_lambda: Union[Callable[[int], float], Sequence[Callable[[int], float]]],
                 current_epoch: int = -1):
        n = len(getattr(optimizer, "param_groups", ()))
        if callable(lr_lambda):
            lambdas = [lr_lambda] * n
        else:
            lambdas = list(lr_lambda)
            if len(lambdas) != n or not all(callable(f) for f in lambdas):
                raise ArgumentError(f"LambdaLR: lr_lambda must be a function or one function per parameter "
                                 f"group ({n}), got {lr_lambda!r}")
        self.lr_lambdas = lambdas
        super().__init__(optimizer, current_epoch)

    def get_lr(self) -> List[float]:
        return [base_lr * f(self.current_epoch) for f, base_lr in zip(self.lr_lambdas, self.base_lrs)]


class LinearLR(LRScheduler):
    """Linear warm-up (or decay): the rate goes from ``initial_lr *
    start_factor`` to ``initial_lr * end_factor`` in ``total_iters`` steps,
    then stays (PyTorch's ``LinearLR``, its arithmetic included).

    Example::

        >>> opt = optim.SGD([gc.Parameter([1.0])], lr=1.0)
        >>> sched = optim.LinearLR(opt, start_factor=0.25, total_iters=3)
        >>> lrs = []
        >>> for epoch in range(5):
        ...     lrs.append(opt.param_groups[0]["lr"])
        ...     sched.step()
        >>> lrs
        [0.25, 0.5, 0.75, 1.0, 1.0]
    """

    _state_keys = ("start_factor", "end_factor", "total_iters", "current_epoch")

    def __init__(self, optimizer: "gradcore.optimizer.Optimizer", start_factor: float = 1.0 / 3,
                 end_factor: float = 1.0, total_iters: int = 5, current_epoch: int = -1):
        _check_number("LinearLR", "start_factor", start_factor, 0.0, 1.0, low_open=True)
        _check_number("LinearLR", "end_factor", end_factor, 0.0, 1.0)
        _check_count("LinearLR", "total_iters", total_iters)
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, current_epoch)

    def get_lr(self) -> List[float]:
        e, groups = self.current_epoch, self.optimizer.param_groups
        if e == 0:
            return [group["lr"] * self.start_factor for group in groups]
        if self._initial or e > self.total_iters:
            return [group["lr"] for group in groups]
        delta = self.end_factor - self.start_factor
        factor = 1.0 + delta / (self.total_iters * self.start_factor + (e - 1) * delta)
        return [group["lr"] * factor for group in groups]

    def _closed_form_lr(self) -> List[float]:
        e = min(self.total_iters, self.current_epoch)
        factor = self.start_factor + (self.end_factor - self.start_factor) * e / self.total_iters
        return [base_lr * factor for base_lr in self.base_lrs]
