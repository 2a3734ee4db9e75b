"""gradcore.optimizer (``optim``): SGD, Adam, AdamW, Adagrad, Adadelta, the
learning-rate schedulers (LRScheduler, MultiStepLR, StepLR,
CosineAnnealingLR, LambdaLR, LinearLR), and gradient clipping
(clip_grad_norm, clip_grad_value).

Example::

    >>> opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> opt.step().clear_grad()
"""
from __future__ import annotations

import functools
import sys
from typing import Dict, Iterable, List, Tuple, Union

import numpy as np

from . import _core
from ._core import Tensor
from . import lr_scheduler as _lr_scheduler
from .cuda import graphs as _graphs
from .lr_scheduler import (CosineAnnealingLR, LambdaLR, LinearLR, LRScheduler,  # noqa: F401 - optim.StepLR etc.
                           MultiStepLR, StepLR)
from .op import ArgumentError
from .tensor import Parameter

# MegEngine's path megengine.optimizer.lr_scheduler: gradcore.optimizer is one
# module, so its schedulers module is registered under that name as well
lr_scheduler = _lr_scheduler
sys.modules.setdefault(__name__ + ".lr_scheduler", _lr_scheduler)


def _zeros_like(data):
    """Zeros shaped like a parameter's data, on its device."""
    if type(data) is np.ndarray:
        return np.zeros_like(data)
    return data.backend.zeros(data.shape, data.dtype)


def _to_numpy(data) -> np.ndarray:
    """A NumPy copy of a state array (an ndarray or a device array)."""
    if isinstance(data, Tensor):
        data = data._data
    if type(data) is np.ndarray:
        return data.copy()
    return data.get()


def _state_tensor(data, device) -> Tensor:
    """A Tensor over ``data`` (an ndarray or a device array the optimizer
    owns), no copy: the optimizer updates ``data`` in place and the Tensor,
    which users reach as ``opt._state[param][name]``, sees it."""
    t = Tensor(np.zeros((), np.float32))
    t._data, t._device = data, device
    return t


def _check_hyper(name: str, allow_inf_: bool = False, **values) -> None:
    """Each hyper-parameter is a real number, not NaN (a string or None
    would fail later inside the update with a NumPy message; NaN would turn
    every parameter into NaN, and so would an infinite lr or eps: refused
    unless ``allow_inf_``, for the clipping bounds and norms where inf means
    "none" or the max-norm)."""
    for what, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name}: {what} must be a number, got {type(v).__name__} {v!r}")
        if v != v:
            raise ArgumentError(f"{name}: {what} must be a number, got nan")
        if not allow_inf_ and v in (np.inf, -np.inf):
            # lr=inf turns every parameter into inf or NaN on the first step
            raise ArgumentError(f"{name}: {what} must be finite, got {v}")


def _check_betas(name: str, betas) -> tuple:
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise TypeError(f"{name}: betas must be a pair of numbers (beta1, beta2), got {betas!r}") from None
    _check_hyper(name, beta1=b1, beta2=b2)
    return b1, b2


class _RawState:
    """One parameter's state as the update rules see it: raw arrays in and
    out (updated in place), stored in the underlying dict as Tensors over
    the same arrays, so ``opt._state[param]["momentum_buffer"].numpy()``
    shows the live value, as in MegEngine."""

    __slots__ = ("_d", "_device")

    def __init__(self, d: Dict, device):
        self._d, self._device = d, device

    def __contains__(self, key) -> bool:
        return key in self._d

    def __getitem__(self, key):
        v = self._d[key]
        return v._data if isinstance(v, Tensor) else v

    def __setitem__(self, key, value) -> None:
        if isinstance(value, Tensor) or np.isscalar(value):
            self._d[key] = value
        else:
            self._d[key] = _state_tensor(value, self._device)


class Optimizer:
    """Holds ``param_groups`` (dicts with "params" and hyper-parameters, which
    may be changed between steps) and per-parameter state.

    ``params`` is a Parameter, an iterable of them, a dict
    ``{"params": [...], "lr": ...}`` or an iterable of such dicts (a value a
    group leaves out comes from the optimizer's arguments).

    Example::

        >>> w, b = gc.Parameter([1.0]), gc.Parameter([0.0])
        >>> opt = optim.SGD([{"params": [w]}, {"params": [b], "lr": 0.5}], lr=0.1)
        >>> [group["lr"] for group in opt.param_groups]
        [0.1, 0.5]
    """

    def __init__(self, params: Union[Tensor, Dict, Iterable[Tensor], Iterable[Dict]], defaults: Dict):
        name = type(self).__name__
        if isinstance(params, (Tensor, dict)):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            # a set's order changes between runs, and the state follows that order
            raise TypeError(f"{name}: params must be an ordered collection (a list), not a set")
        try:
            params = list(params)
        except TypeError:
            raise TypeError(f"{name}: params must be a Parameter, a dict or an iterable of them, "
                            f"got {type(params).__name__}") from None
        if not params:
            raise ArgumentError(f"{name}: got an empty parameter list")
        self._defaults = dict(defaults)
        self.param_groups: List[Dict] = []
        # per-parameter state, keyed by the Parameter itself (as MegEngine):
        # {name: Tensor} for arrays (momentum_buffer, exp_avg, ...) and plain
        # numbers for counters ("step"); filled by the first step that updates it
        self._state: Dict[Tensor, Dict] = {}
        if all(isinstance(g, dict) for g in params):
            for g in params:
                self.add_param_group(g)
        elif any(isinstance(g, dict) for g in params):
            raise TypeError(f"{name}: params mixes dicts and tensors")
        else:
            self.add_param_group({"params": params})

    def add_param_group(self, param_group: Dict) -> "Optimizer":
        """Add a group (a dict with "params"); its missing hyper-parameters
        come from the optimizer's arguments."""
        name = type(self).__name__
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise TypeError(f"{name}: a parameter group must be a dict with a 'params' entry")
        ps = param_group["params"]
        if isinstance(ps, (set, frozenset)):
            raise TypeError(f"{name}: params must be an ordered collection (a list), not a set")
        ps = [ps] if isinstance(ps, Tensor) else list(ps)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in ps:
            if not isinstance(p, Parameter):
                # as MegEngine: a plain Tensor is usually a forgotten
                # gc.Parameter(...), and its updates would be lost on the next rebind
                raise TypeError(f"{name}: can only optimize Parameters, got "
                                f"{type(p).__name__}" + (f" of shape {p.shape}" if isinstance(p, Tensor) else ""))
            if p.dtype.kind not in "fc":
                # lr * grad would be truncated to an integer: the parameter would never move
                raise TypeError(f"{name}: parameters must be floating-point, got {p.dtype} "
                                f"(shape {p.shape})")
            if id(p) in seen:
                raise ArgumentError(f"{name}: a parameter of shape {p.shape} appears more than once "
                                 f"in the parameter groups")
            seen.add(id(p))
        group = dict(self._defaults)
        group.update(param_group)
        group["params"] = ps
        self.param_groups.append(group)
        return self

    def clear_grad(self) -> "Optimizer":
        """Set every parameter's ``grad`` to None."""
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
        return self

    def zero_grad(self) -> "Optimizer":
        """Set every existing gradient to zeros (MegEngine's deprecated
        ``zero_grad``; prefer ``clear_grad``)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad = Tensor(_zeros_like(p.grad._data), device=p.grad.device)
        return self

    # whether step() can be captured in a CUDA graph: its update reads every
    # Python value through _scalar/_branch and registers its counters
    _capturable = False
    _capture = None         # the CUDA-graph capture under way during step()

    def step(self) -> "Optimizer":
        """Update every parameter that has a gradient; the others are skipped."""
        self._capture = _graphs.capturing()
        if self._capture is not None and not self._capturable:
            raise _graphs.GraphCaptureError(
                f"{type(self).__name__}.step cannot be captured in a CUDA graph: its update reads Python "
                f"values a replay would not see change (SGD, Adam and AdamW can be captured)")
        try:
            self._step_groups()
            if self._capture is not None:   # load_state_dict gives new state tensors: the graph holds the old
                self._capture.guard(functools.partial(_holds_state, self, self._state),
                                    f"{type(self).__name__}'s state was loaded")
        finally:
            self._capture = None
        return self

    def _step_groups(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not isinstance(p.grad, Tensor):
                    raise TypeError(f"{type(self).__name__}.step: the gradient of a parameter of shape "
                                    f"{p.shape} is a {type(p.grad).__name__}, not a Tensor")
                if p.grad.shape != p.shape:
                    raise ArgumentError(f"{type(self).__name__}.step: a gradient of shape {p.grad.shape} "
                                     f"for a parameter of shape {p.shape}")
                # the raw data (an ndarray, or a DeviceArray on cuda): updated where it lives
                try:
                    self._update(p, p.grad._data, group, _RawState(self._state.setdefault(p, {}), p.device))
                except (TypeError, ValueError) as exc:     # e.g. a hyper-parameter set to a string
                    hyper = {k: v for k, v in group.items() if k != "params"}
                    cls = TypeError if isinstance(exc, TypeError) else ValueError
                    raise cls(f"{type(self).__name__}.step: {exc} (parameter of shape {p.shape}, "
                              f"group {hyper})") from exc

    def _update(self, param, grad, group, state):
        raise NotImplementedError

    def _scalar(self, name: str, group: Dict, raw: Dict, like):
        """The number ``name`` of the update (``_SCALARS[name](group, raw)``:
        a hyper-parameter, a bias correction) as an operand of an update of
        ``like``: the number itself; inside a CUDA-graph capture a device
        scalar that every replay refreshes (a new learning rate needs no new
        capture), one per group, dtype and value."""
        cap, rule = self._capture, _SCALARS[name]
        if cap is None or type(like) is np.ndarray:
            return rule(group, raw)
        return cap.scalar(functools.partial(rule, group, raw), like.dtype, key=(name, id(group), rule(group, raw)))

    def _branch(self, name: str, group: Dict, raw: Dict):
        """``_BRANCHES[name](group, raw)``, a value the update branches on;
        inside a CUDA-graph capture a call where it differs captures again."""
        cap = self._capture
        if cap is None:
            return _BRANCHES[name](group, raw)
        return cap.guard(functools.partial(_BRANCHES[name], group, raw), f"{type(self).__name__}: {name}")

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

    # ---- saving and restoring
    # per-parameter state kept as a number (a step count), not an array
    _counters: Tuple[str, ...] = ("step",)
    # options MegEngine keeps as attributes, outside its param groups: a group
    # saved by MegEngine may lack them (the current value is kept)
    _attribute_options: Tuple[str, ...] = ()

    def _state_dtype(self, param: Tensor) -> np.dtype:
        """The dtype of ``param``'s state arrays (its own, unless the update
        keeps them in another, as LAMBFp16's float32 master copy and moments)."""
        return param.dtype

    def state_dict(self, keep_var: bool = False) -> Dict:
        """``{"param_groups": [...], "state": {index: {...}}}``: hyper-parameters
        per group with the parameters as indices (their order across the
        groups), and each parameter's state as NumPy copies (the state
        Tensors themselves with ``keep_var=True``)."""
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[id(p)] for p in g["params"]]}
                  for g in self.param_groups]
        state = {}
        for p, st in self._state.items():
            if id(p) in index and st:
                state[index[id(p)]] = {k: (v if np.isscalar(v) or keep_var else _to_numpy(v))
                                       for k, v in st.items()}
        return {"param_groups": groups, "state": state}

    def load_state_dict(self, state: Dict) -> None:
        """Restore what ``state_dict`` saved, into an optimizer over parameters
        of the same shapes, grouped the same way."""
        name = type(self).__name__
        if not isinstance(state, dict) or "param_groups" not in state or "state" not in state:
            raise ArgumentError(f"{name}.load_state_dict: expects a dict from state_dict() with 'param_groups' "
                             f"and 'state', got {type(state).__name__}"
                             f"{' with keys ' + str(sorted(map(str, state))) if isinstance(state, dict) else ''}")
        saved_groups = state["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ArgumentError(f"{name}.load_state_dict: {len(saved_groups)} parameter groups saved, "
                             f"this optimizer has {len(self.param_groups)}")
        new_state = {}
        for group, saved in zip(self.param_groups, saved_groups):
            if len(group["params"]) != len(saved["params"]):
                raise ArgumentError(f"{name}.load_state_dict: a saved group has {len(saved['params'])} "
                                 f"parameters, this one {len(group['params'])}")
            # MegEngine's groups lack the options it keeps on the optimizer (SGD's nesterov)
            if not set(saved) <= set(group) or set(group) - set(saved) - set(self._attribute_options):
                raise ArgumentError(f"{name}.load_state_dict: a saved group has keys {sorted(saved)}, "
                                 f"this one {sorted(group)}")
            for p, i in zip(group["params"], saved["params"]):
                st = {}
                for k, v in state["state"].get(i, {}).items():
                    if k in self._counters:
                        # MegEngine saves its step as a float32 scalar array (a Tensor once read
                        # by gradcore.load); the update counts in a Python int
                        st[k] = _count_of(name, k, v)
                        continue
                    if np.isscalar(v):
                        st[k] = v
                        continue
                    v = np.asarray(v.numpy() if isinstance(v, Tensor) else v)
                    if v.shape != p.shape:
                        raise ArgumentError(f"{name}.load_state_dict: state {k!r} of shape {v.shape} "
                                         f"for a parameter of shape {p.shape}")
                    # a private copy where the parameter lives, in the dtype the
                    # update keeps it in (LAMBFp16: float32, not the parameter's)
                    st[k] = Tensor(v.astype(self._state_dtype(p)), device=p.device)
                new_state[p] = st
        for group, saved in zip(self.param_groups, saved_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self._state = new_state


def _count_of(name: str, key: str, value) -> int:
    """A saved step counter as an int: a number, or a one-element array or
    Tensor holding a whole number (MegEngine's float32 ``step``)."""
    v = np.asarray(value.numpy() if isinstance(value, Tensor) else value)
    if v.size != 1 or v.dtype.kind not in "biuf" or float(v.reshape(-1)[0]) != int(v.reshape(-1)[0]):
        raise ArgumentError(f"{name}.load_state_dict: state {key!r} must be a whole number, got "
                            f"{v.dtype} of shape {v.shape}")
    return int(v.reshape(-1)[0])


# schedulers (gradcore.lr_scheduler, below this module) drive Optimizers
_lr_scheduler.accept_optimizer_class(Optimizer)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, Nesterov and weight decay
    (MegEngine's update rule).

    Example::

        >>> w = gc.Parameter([1.0, -2.0])
        >>> gm = gc.GradManager().attach([w])
        >>> with gm:
        ...     gm.backward((w * w).sum())     # gradient 2 * w
        >>> _ = optim.SGD([w], lr=0.1).step().clear_grad()
        >>> w.numpy()
        array([ 0.8, -1.6], dtype=float32)
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0):
        _check_hyper("SGD", lr=lr, momentum=momentum, weight_decay=weight_decay)
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ArgumentError("SGD: lr, momentum and weight_decay must be non-negative")
        if nesterov and momentum == 0:
            raise ArgumentError("SGD: nesterov needs a momentum")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      weight_decay=weight_decay))

    _capturable = True
    _attribute_options = ("nesterov",)

    def _update(self, param, grad, group, state):
        p = self._writable(param)
        raw = state._d
        if self._branch("weight decay", group, raw):
            grad = grad + self._scalar("weight_decay", group, raw, p) * p
        if self._branch("momentum", group, raw):
            if not self._branch("has momentum buffer", group, raw):
                buf = state["momentum_buffer"] = grad.astype(p.dtype, copy=True)
            else:
                buf = state["momentum_buffer"]
                buf *= self._scalar("momentum", group, raw, p)
                buf += grad
            if self._branch("nesterov", group, raw):
                grad = grad + self._scalar("momentum", group, raw, p) * buf
            else:
                grad = buf
        p -= (self._scalar("lr", group, raw, p) * grad).astype(p.dtype, copy=False)


class Adam(Optimizer):
    """Adam with bias correction; ``weight_decay`` adds ``wd * param`` to the
    gradient (MegEngine's rule).

    Example::

        >>> w = gc.Parameter([1.0, -2.0])
        >>> w.grad = gc.tensor([0.5, -4.0])
        >>> _ = optim.Adam([w], lr=0.1).step()     # the first step: lr * sign(g)
        >>> w.numpy()
        array([ 0.9, -1.9], dtype=float32)
    """

    # AdamW: the decay is kept out of the moments and added to the step
    _decoupled_decay = False

    def __init__(self, params, lr: float, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        name = type(self).__name__
        _check_hyper(name, lr=lr, eps=eps, weight_decay=weight_decay)
        betas = _check_betas(name, betas)
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ArgumentError(f"{name}: lr, eps, weight_decay must be non-negative and betas in [0, 1)")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    _capturable = True

    def _update(self, param, grad, group, state):
        p = self._writable(param)
        # every number read from the host goes through _scalar (a device
        # scalar in a CUDA-graph capture, refreshed at each replay)
        raw = state._d
        decay = self._branch("weight decay", group, raw)
        if decay and not self._decoupled_decay:
            grad = grad + self._scalar("weight_decay", group, raw, p) * p
        if not self._branch("has moments", group, raw):
            state["step"] = 0
            state["exp_avg"] = _zeros_like(p)
            state["exp_avg_sq"] = _zeros_like(p)
        state["step"] += 1
        if self._capture is not None:
            self._capture.on_replay(functools.partial(_count_step, raw))
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= self._scalar("beta1", group, raw, p)
        m += self._scalar("1 - beta1", group, raw, p) * grad
        v *= self._scalar("beta2", group, raw, p)
        v += self._scalar("1 - beta2", group, raw, p) * grad * grad
        m_hat = m / self._scalar("1 - beta1 ** step", group, raw, p)
        v_hat = v / self._scalar("1 - beta2 ** step", group, raw, p)
        eps, lr = self._scalar("eps", group, raw, p), self._scalar("lr", group, raw, p)
        if not self._decoupled_decay:
            p -= (lr * m_hat / (np.sqrt(v_hat) + eps)).astype(p.dtype, copy=False)
            return
        delta = m_hat / (np.sqrt(v_hat) + eps)
        if decay:
            delta = delta + self._scalar("weight_decay", group, raw, p) * p
        p -= (lr * delta).astype(p.dtype, copy=False)


def _holds_state(opt: Optimizer, state: Dict) -> bool:
    return opt._state is state


def _count_step(raw_state: Dict) -> None:
    """A replayed CUDA graph's optimizer step: the Python step counter moves on."""
    raw_state["step"] += 1


# the numbers an update reads from the host, as functions of (group, raw
# state): plain values in an eager step, device scalars in a CUDA graph
_SCALARS = {
    "lr": lambda g, s: g["lr"],
    "momentum": lambda g, s: g["momentum"],
    "weight_decay": lambda g, s: g["weight_decay"],
    "eps": lambda g, s: g["eps"],
    "beta1": lambda g, s: g["betas"][0],
    "beta2": lambda g, s: g["betas"][1],
    "1 - beta1": lambda g, s: 1 - g["betas"][0],
    "1 - beta2": lambda g, s: 1 - g["betas"][1],
    "1 - beta1 ** step": lambda g, s: 1 - g["betas"][0] ** s["step"],
    "1 - beta2 ** step": lambda g, s: 1 - g["betas"][1] ** s["step"],
}
# the values an update branches on (a CUDA graph holds one branch: a change recaptures)
_BRANCHES = {
    "weight decay": lambda g, s: bool(g["weight_decay"]),
    "momentum": lambda g, s: bool(g["momentum"]),
    "nesterov": lambda g, s: bool(g["nesterov"]),
    "has momentum buffer": lambda g, s: "momentum_buffer" in s,
    "has moments": lambda g, s: "exp_avg" in s,
}


class AdamW(Adam):
    """Adam with decoupled weight decay (MegEngine's ``AdamW``): each step
    moves the parameter by ``lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay
    * param)``, the decay taken from the parameter before the step and kept
    out of the moment estimates (PyTorch's ``AdamW`` gives the same update).

    Example::

        >>> w = gc.Parameter([1.0, -2.0])
        >>> w.grad = gc.tensor([0.5, -4.0])
        >>> _ = optim.AdamW([w], lr=0.1, weight_decay=0.5).step()     # lr * (sign(g) + 0.5 * w)
        >>> w.numpy()
        array([ 0.85, -1.8 ], dtype=float32)
    """

    _decoupled_decay = True

    def __init__(self, params, lr: float, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, lr, betas, eps, weight_decay)


def _decayed(opt: Optimizer, param, grad, group, state, *buffers):
    """Adagrad's and Adadelta's start of a step: (param's buffer, grad + weight_decay *
    param), the step counted, ``buffers`` made zero on the first step."""
    p = opt._writable(param)
    if group["weight_decay"]:
        grad = grad + group["weight_decay"] * p
    if buffers[0] not in state:
        state["step"] = 0
        for b in buffers:
            state[b] = _zeros_like(p)
    state["step"] += 1
    return p, grad


class Adagrad(Optimizer):
    """Adagrad (MegEngine's rule): ``square_avg += g * g`` and
    ``param -= lr / (1 + (step - 1) * lr_decay) * g / sqrt(square_avg + eps)``,
    where ``g`` is the gradient plus ``weight_decay * param``. (PyTorch adds
    ``eps`` after the square root instead; with the default eps=1e-10 the two
    agree to float32 precision.)

    Example::

        >>> w = gc.Parameter([1.0, -2.0])
        >>> w.grad = gc.tensor([0.5, -4.0])
        >>> _ = optim.Adagrad([w], lr=0.1).step()     # the first step: lr * sign(g)
        >>> w.numpy()
        array([ 0.9, -1.9], dtype=float32)
    """

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0, eps: float = 1e-10,
                 weight_decay: float = 0.0):
        _check_hyper("Adagrad", lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay)
        if lr < 0 or lr_decay < 0 or eps < 0 or weight_decay < 0:
            raise ArgumentError("Adagrad: lr, lr_decay, eps and weight_decay must be non-negative")
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay))

    def _update(self, param, grad, group, state):
        p, grad = _decayed(self, param, grad, group, state, "square_avg")
        square_avg = state["square_avg"]
        square_avg += grad * grad
        clr = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        p -= (clr * grad / np.sqrt(square_avg + group["eps"])).astype(p.dtype, copy=False)


class Adadelta(Optimizer):
    """Adadelta (MegEngine's and PyTorch's rule), with ``g`` the gradient plus
    ``weight_decay * param``::

        square_avg = rho * square_avg + (1 - rho) * g * g
        delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g
        param -= lr * delta
        acc_delta = rho * acc_delta + (1 - rho) * delta * delta

    Example::

        >>> w = gc.Parameter([1.0, -2.0])
        >>> w.grad = gc.tensor([0.5, -4.0])
        >>> _ = optim.Adadelta([w], lr=1.0, rho=0.9).step()
        >>> w.numpy()
        array([ 0.9968378, -1.9968377], dtype=float32)
    """

    def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0):
        _check_hyper("Adadelta", lr=lr, rho=rho, eps=eps, weight_decay=weight_decay)
        if lr < 0 or eps < 0 or weight_decay < 0 or not 0 <= rho <= 1:
            raise ArgumentError("Adadelta: lr, eps and weight_decay must be non-negative and rho in [0, 1]")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay))

    def _update(self, param, grad, group, state):
        p, grad = _decayed(self, param, grad, group, state, "square_avg", "acc_delta")
        rho, eps = group["rho"], group["eps"]
        square_avg, acc_delta = state["square_avg"], state["acc_delta"]
        square_avg *= rho
        square_avg += (1 - rho) * grad * grad
        delta = np.sqrt(acc_delta + eps) / np.sqrt(square_avg + eps) * grad
        p -= (group["lr"] * delta).astype(p.dtype, copy=False)
        acc_delta *= rho
        acc_delta += (1 - rho) * delta * delta


class LAMB(Optimizer):
    """LAMB (layer-wise adaptive moments, for large batches), MegEngine's
    ``optim.LAMB``: Adam's moments and bias correction give the step
    ``r = m_hat / (sqrt(v_hat) + eps) (+ weight_decay * param)``, and each
    parameter moves by ``lr * trust * r`` with ``trust = ||param|| / ||r||``
    (1 when either norm is 0, or when there is no weight decay unless
    ``always_adapt``).

    Example::

        >>> w = gc.Parameter([3.0, -4.0])
        >>> w.grad = gc.tensor([1.0, 1.0])
        >>> _ = optim.LAMB([w], lr=0.1, weight_decay=0.01).step()
        >>> w.numpy().round(4)
        array([ 2.6342, -4.3409], dtype=float32)
    """

    def __init__(self, params, lr: float, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 bias_correction: bool = True, weight_decay: float = 0.0, always_adapt: bool = False):
        name = type(self).__name__
        _check_hyper(name, lr=lr, eps=eps, weight_decay=weight_decay)
        betas = _check_betas(name, betas)
        if lr < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ArgumentError(f"{name}: lr and weight_decay must be non-negative and betas in [0, 1)")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=tuple(betas), eps=eps))
        self.bias_correction, self.always_adapt = bool(bias_correction), bool(always_adapt)

    def _master(self, param, state):
        """The buffer the update writes (LAMBFp16: a float32 copy)."""
        return self._writable(param)

    def _update(self, param, grad, group, state):
        p = self._master(param, state)
        if "exp_avg" not in state:
            state["step"] = 0
            state["exp_avg"], state["exp_avg_sq"] = _zeros_like(p), _zeros_like(p)
        state["step"] += 1
        (b1, b2), step, wd = group["betas"], state["step"], group["weight_decay"]
        grad = grad.astype(p.dtype, copy=False)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= b1
        m += (1 - b1) * grad
        v *= b2
        v += (1 - b2) * grad * grad
        bc1, bc2 = (1 - b1 ** step, 1 - b2 ** step) if self.bias_correction else (1.0, 1.0)
        r = (m / bc1) / (np.sqrt(v / bc2) + group["eps"])
        if wd != 0:
            r = r + wd * p
        trust = 1.0
        if self.always_adapt or wd > 0:
            p_norm, r_norm = float(np.sqrt((p * p).sum())), float(np.sqrt((r * r).sum()))
            if p_norm > 0 and r_norm > 0:
                trust = p_norm / r_norm
        p -= (group["lr"] * trust * r).astype(p.dtype, copy=False)
        if p is not param._data:            # a master copy: the parameter becomes it, in its own dtype
            _core._bump_version(param)
            param._data = p.astype(param.dtype)


class LAMBFp16(LAMB):
    """LAMB for float16 parameters, MegEngine's ``optim.LAMBFp16``: the
    moments and a master copy of each parameter in float32, updated there
    and copied back in float16.

    Example::

        >>> w = gc.Parameter(np.array([3.0, -4.0], "float16"))
        >>> w.grad = gc.tensor(np.array([1.0, 1.0], "float16"))
        >>> _ = optim.LAMBFp16([w], lr=0.1, weight_decay=0.01).step()
        >>> w.dtype, w.numpy()
        (dtype('float16'), array([ 2.635, -4.34 ], dtype=float16))
    """

    def _state_dtype(self, param: Tensor) -> np.dtype:
        return np.dtype(np.float32)

    def _master(self, param, state):
        if "param_fp32" not in state:
            state["param_fp32"] = self._writable(param).astype(np.float32)
        return state["param_fp32"]


# ---------------------------------------------------------------- gradient clipping
def _with_grads(tensors) -> List[Tensor]:
    return [tensors] if isinstance(tensors, Tensor) else list(tensors)


def clip_grad_norm(tensors: Union[Tensor, Iterable[Tensor]], max_norm: float, ord: float = 2.0) -> Tensor:
    """MegEngine's ``optim.clip_grad_norm``: scale the gradients of
    ``tensors`` (a Tensor or an iterable of them; those without a gradient
    are skipped) in place so that their joint ``ord``-norm, taken as if they
    were one vector, is at most ``max_norm``; each gradient is multiplied by
    ``min(max_norm / (total_norm + 1e-6), 1)``. Returns the norm before
    clipping (a Tensor; 0.0 when no tensor has a gradient).

    Example::

        >>> w = gc.Parameter([0.0, 0.0])
        >>> w.grad = gc.tensor([3.0, 4.0])
        >>> optim.clip_grad_norm([w], max_norm=1.0).item()     # the norm before clipping
        5.0
        >>> w.grad.numpy().round(4)
        array([0.6, 0.8], dtype=float32)
    """
    from . import functional as F
    if isinstance(ord, str):        # "inf" / "-inf", as MegEngine's docs allow
        try:
            ord = float(ord)
        except ValueError:
            raise ArgumentError(f"clip_grad_norm: ord must be a number or 'inf'/'-inf', got {ord!r}") from None
    _check_hyper("clip_grad_norm", True, max_norm=max_norm, ord=ord)
    if max_norm < 0:
        # a negative scale would flip every gradient
        raise ArgumentError(f"clip_grad_norm: max_norm must be >= 0, got {max_norm}")
    ts = [t for t in _with_grads(tensors) if t.grad is not None]
    if not ts:
        return Tensor(np.float32(0.0))
    norms = [F.norm(t.grad.detach().reshape(-1), ord=ord) for t in ts]
    total = norms[0] if len(norms) == 1 else F.norm(F.stack(norms), ord=ord)
    scale = F.minimum(max_norm / (total + 1e-6), 1.0)
    for t in ts:
        t.grad._reset((t.grad * scale).astype(t.grad.dtype))
    return total


def clip_grad_value(tensors: Union[Tensor, Iterable[Tensor]], lower: float, upper: float) -> None:
    """MegEngine's ``optim.clip_grad_value``: clip every gradient of
    ``tensors`` (a Tensor or an iterable of them; those without a gradient
    are skipped) into ``[lower, upper]``, in place.

    Example::

        >>> w = gc.Parameter([0.0, 0.0, 0.0])
        >>> w.grad = gc.tensor([-3.0, 0.5, 4.0])
        >>> optim.clip_grad_value([w], lower=-1.0, upper=1.0)
        >>> w.grad.numpy()
        array([-1. ,  0.5,  1. ], dtype=float32)
    """
    from . import functional as F
    _check_hyper("clip_grad_value", True, lower=lower, upper=upper)
    if lower > upper:
        raise ArgumentError(f"clip_grad_value: lower must be <= upper, got lower={lower}, upper={upper}")
    for t in _with_grads(tensors):
        if t.grad is not None:
            t.grad._reset(F.clip(t.grad, lower, upper).astype(t.grad.dtype))
