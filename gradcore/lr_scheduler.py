"""Learning-rate schedulers, MegEngine's ``LRScheduler`` and ``MultiStepLR``
(also importable from ``gradcore.optimizer``).

Example::

    >>> opt = optim.SGD(model.parameters(), lr=0.1)
    >>> sched = optim.MultiStepLR(opt, milestones=[30, 80], gamma=0.1)
    >>> for epoch in range(100):
    ...     train_one_epoch(model, opt)
    ...     sched.step()
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any, Dict, Iterable, List, Optional, Tuple

# gradcore.optimizer's Optimizer, the type a scheduler drives: handed over by
# gradcore.optimizer when it loads (it imports this module to re-export the
# schedulers, so this one imports nothing of it). Until then no optimizer exists.
_optimizer_class: Optional[type] = None


def accept_optimizer_class(cls: type) -> None:
    """Called by ``gradcore.optimizer`` at import: schedulers take instances
    of ``cls`` (its ``Optimizer``) and refuse anything else.

    Example::

        >>> accept_optimizer_class(gradcore.optimizer.Optimizer)
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
    defines ``get_lr()`` (one rate per group, for ``self.current_epoch``)
    and names what ``state_dict`` saves in ``_state_keys``.
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
        self.step()

    def get_lr(self) -> List[float]:
        """The learning rate of each parameter group at ``current_epoch``."""
        raise NotImplementedError(f"{type(self).__name__}.get_lr is not defined")

    def step(self, epoch: Optional[int] = None) -> None:
        """Move to the next epoch (or to ``epoch``) and set each group's lr."""
        self.current_epoch = self.current_epoch + 1 if epoch is None else epoch
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr

    def state_dict(self) -> Dict[str, Any]:
        """The scheduler's settings and epoch count (not the optimizer)."""
        return {key: getattr(self, key) for key in self._state_keys}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved; a missing key raises KeyError
        and changes nothing. The optimizer's lr is restored by the
        optimizer's own ``load_state_dict``."""
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

        >>> opt = optim.SGD(model.parameters(), lr=0.1)
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
            raise ValueError(f"MultiStepLR: milestones must be increasing, got {milestones}")
        self.milestones = milestones
        self.gamma = gamma
        super().__init__(optimizer, current_epoch)

    def get_lr(self) -> List[float]:
        passed = bisect_right(self.milestones, self.current_epoch)
        return [base_lr * self.gamma ** passed for base_lr in self.base_lrs]
