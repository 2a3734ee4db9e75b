"""The op registry, filled through entry points (group ``gradcore.ops``).

The standard library in ``gradcore.ops`` registers itself through the same
entry point group as any third-party plugin. Discovery is lazy: nothing of a
plugin is imported until an op is asked for or the registry is listed.
"""
from __future__ import annotations

import contextlib
import copy
import os
import re
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Dict, List, Optional

from .op import Op, _class_label, describe, positional_arity as _positional_arity

GROUP = "gradcore.ops"
ENV_DISABLE = "GRADCORE_NO_PLUGINS"        # "1": load only the standard library
ENV_BLOCK = "GRADCORE_BLOCK_PLUGINS"       # comma-separated distribution or entry point names to skip
STANDARD_DIST = "gradcore"


class PluginConflictError(RuntimeError):
    """Two distributions register the same op name."""


@dataclass
class OpEntry:
    name: str
    cls: type
    dist: str

    @property
    def grad_path(self) -> str:
        """The op's gradient path (``gradcore.op.GRAD_PATHS``), or "none"."""
        return describe(self.cls).grad_path or "none"

    @property
    def devices(self) -> List[str]:
        return list(describe(self.cls).devices)


@dataclass
class PluginFailure:
    dist: str
    entry_point: str        # the entry point's value (module:function)
    error: str
    name: str = ""          # the entry point's name


@dataclass
class _State:
    ops: Dict[str, OpEntry] = field(default_factory=dict)
    failures: List[PluginFailure] = field(default_factory=list)
    # grad rules a distribution registered (gradcore.register_grad_rule) for op classes
    rules: Dict[str, List[tuple]] = field(default_factory=dict)
    loaded: bool = False
    loading: bool = False
    current_dist: Optional[str] = None


_state = _State()

# the standard library's register(), handed over by gradcore.ops when it loads
# (the registry sits below the op library and imports none of it); run when
# no installed entry point names it (a source tree)
_standard_library = None


def provide_standard_library(register) -> None:
    """Called by ``gradcore.ops`` at import: ``register()`` registers the
    standard ops; the registry runs it when no installed entry point names
    the standard library (running from a source tree).

    Example::

        >>> provide_standard_library(gradcore.ops.register)
    """
    global _standard_library
    _standard_library = register


def register_op(cls=None, *, name: Optional[str] = None):
    """Register an op class under ``name`` (default ``cls.name``); usable as
    a decorator. Called from a plugin's entry point module or function.

    Example::

        @gradcore.registry.register_op
        class Cube(Op):
            name = "cube"
            ...
    """
    def do(c):
        if not (isinstance(c, type) and issubclass(c, Op)):
            what = f"an instance of {type(c).__name__} (register the class: register_op({type(c).__name__}))" \
                if isinstance(c, Op) else f"{c!r}"[:80] + f" (a {type(c).__name__})"
            raise OpDeclarationError(f"register_op expects an op class (a subclass of gradcore.op.Op), got {what}")
        if _state.current_dist is None:
            # called by a script, not by a plugin being loaded: the installed
            # ops first, so that a name they use is refused here, not theirs later
            load()
        key = name or getattr(c, "name", "") or c.__name__
        dist = _state.current_dist or _dist_of_module(c.__module__)
        old = _state.ops.get(key)
        if old is not None and old.cls is not c:
            if old.dist != dist:
                raise PluginConflictError(
                    f"op {key!r} is registered by two distributions: {old.dist!r} and {dist!r}; "
                    f"rename one (class attribute `name`, or register_op(cls, name=...)) or block "
                    f"one with {ENV_BLOCK}")
            raise PluginConflictError(
                f"op {key!r} is registered twice by {dist!r} ({_qualname(old.cls)} and {_qualname(c)}); "
                f"give one of them another `name`")
        validate_op_class(c, key)
        c.dist = dist
        _state.ops[key] = OpEntry(key, c, dist)
        return c
    return do(cls) if cls is not None else do


class OpDeclarationError(TypeError):
    """An op class that cannot work as declared (found when it is registered):
    the message names the op and says what to add or change."""


def _identifier(name) -> str:
    """``name`` made a Python identifier in ASCII: what to suggest instead."""
    s = re.sub(r"\W", "_", str(name), flags=re.ASCII).strip("_") or "MyOp"
    return f"Op{s}" if s[0].isdigit() else s


def _qualname(c) -> str:
    return f"{c.__module__}.{c.__qualname__}"


def _accepts(arity, n: int) -> bool:
    lo, hi = arity
    return hi != -1 and lo <= n and (hi is None or n <= hi)


def _fmt_arity(arity) -> str:
    lo, hi = arity
    if hi == -1:
        return "a required keyword-only argument"
    if hi is None:
        return f"at least {lo} input(s)"
    return f"{lo} input(s)" if lo == hi else f"{lo} to {hi} inputs"


# what gradcore reads from an op or its class besides its methods: an
# instance attribute of one of these names is read as that, not as a parameter
_PROTOCOL_NAMES = frozenset({"name", "nin", "attrs", "dist", "devices", "domain", "check_shapes", "check_params",
                             "check_gradient", "max_grad_order", "examples", "reduce_broadcast", "derived",
                             "shape_only_inputs"})


def validate_op_class(c, key: Optional[str] = None) -> None:
    """Checks made when an op class is registered, each failure an
    ``OpDeclarationError`` naming the op and what to add:

    - no member is a typo of a protocol member the class lacks (``vpj``);
    - an op with a ``vjp`` has ``infer`` (its backward is traced from it);
    - ``vjp`` takes ``(self, inputs, outputs, grads)``;
    - ``_grad_rule`` and ``decompose`` accept the forward's inputs (as many
      as ``cpu``/``infer`` take, when those say);
    - every device in a declared ``devices`` has a kernel (``cpu`` or
      ``decompose`` for "cpu", ``cuda_source`` or ``decompose`` for "cuda");
    - no constructor parameter has the name of a member of the class or of
      the op protocol (``name``, ``nin``, ``devices``, ``infer``...);
    - no ``jvp`` (never called: forward mode comes from the vjp), and some
      forward: a kernel, ``decompose`` or ``_grad_rule`` (not ``Function``'s
      ``forward``/``backward``);
    - the name is an ASCII Python identifier (no spaces, dots or ``::``).

    Example::

        >>> class Bad(Op):
        ...     name = "bad"; devices = ("cpu", "cuda")
        ...     def cpu(self, x): return x
        >>> validate_op_class(Bad)
        OpDeclarationError: op 'bad' declares devices ('cpu', 'cuda') but has no CUDA kernel: ...
    """
    key = key or getattr(c, "name", "") or c.__name__
    where = f"op {key!r} ({_qualname(c)})"
    if not isinstance(c, type):
        raise OpDeclarationError(f"{where}: register_op expects an op class, got {type(c).__name__}")
    if not (isinstance(key, str) and key.isascii() and key.isidentifier()):
        # the name is a key for gradcore.ops.get, `gradcore check NAME`, the
        # table of `gradcore ops` and PyTorch's custom op gradcore::NAME
        raise OpDeclarationError(
            f"{where}: an op's name is a Python identifier in ASCII (letters, digits, _), as it names the "
            f"op in gradcore.ops.get, on the command line and as PyTorch's custom op gradcore::<name>; "
            f"write it as {_identifier(key)!r}")

    desc = describe(c)
    if desc.misspelt:
        raise OpDeclarationError(
            f"{where} defines " + ", ".join(f"{found!r} (did you mean {meant!r}?)" for found, meant in desc.misspelt)
            + ": the op has no member of that name, so what it was meant to do is not done; rename it")
    _check_no_jvp(c, where)
    if desc.traced == "vjp" and not desc.has_infer:
        raise OpDeclarationError(
            f"{where} has a vjp but no shape inference: its backward graph is traced from "
            f"`infer(self, *descs)`, which returns a TensorDesc per output (shape, dtype, device); add it")
    vjp = getattr(c, "vjp", None)
    if vjp is not None and callable(vjp):
        ar = _positional_arity(vjp)
        if ar is not None and not _accepts(ar, 3):
            raise OpDeclarationError(
                f"{where}: vjp must be `def vjp(self, inputs, outputs, grads)` (three arguments: the "
                f"forward inputs, the forward outputs and one gradient per output, and return one "
                f"gradient per input), but it takes {_fmt_arity(ar).replace('input(s)', 'argument(s)')}")

    # _grad_rule and decompose receive the forward's inputs (as many as infer/cpu say)
    for attr in ("_grad_rule", "decompose"):
        fn = getattr(c, attr, None)
        if fn is None or not callable(fn) or desc.arity is None or desc.arity[0] == attr:
            continue
        ar = _positional_arity(fn)
        if ar is None:
            continue
        fattr, (flo, fhi) = desc.arity
        bad = [n for n in range(flo, fhi + 1) if not _accepts(ar, n)]
        if bad:
            raise OpDeclarationError(
                f"{where}: {attr} takes {_fmt_arity(ar)} but the forward ({fattr}) takes "
                f"{_fmt_arity((flo, fhi))}; declare `def {attr}(self, "
                f"{', '.join(f'x{i}' for i in range(fhi)) or '*inputs'})` to receive the forward's inputs")

    src = getattr(c, "cuda_source", None)
    if src is not None and not callable(src):
        raise OpDeclarationError(
            f"{where}: cuda_source must be a method `def cuda_source(self, ctype)` returning the CUDA C "
            f"source for the element type ctype ('float' or 'double'), got a {type(src).__name__}: one "
            f"text cannot serve both float32 and float64 inputs")

    # a parameter stored under the name of a class member is no parameter
    # (equality ignores it) or replaces the member (`self.infer = 2.0`)
    clash = [p for p, _ in desc.params
             if p not in getattr(c, "attrs", ()) and (hasattr(c, p) or p in _PROTOCOL_NAMES)]
    if clash:
        raise OpDeclarationError(
            f"{where}: constructor parameter(s) {', '.join(clash)} named like a member of the op class or "
            f"of the op protocol: stored as `self.{clash[0]} = ...`, it is read as that member (or replaces "
            f"it), and equality and every cache keyed by the op ignore it; rename the parameter")

    samples = _samples(c)
    _check_instance_state(c, where, samples)

    for dev in desc.devices:
        if dev not in ("cpu", "cuda"):
            raise OpDeclarationError(
                f"{where} declares an unknown device {dev!r}; gradcore knows 'cpu' and 'cuda'")
        if dev == "cpu" and "cpu" not in desc.kernels:
            raise OpDeclarationError(
                f"{where} declares devices {desc.devices} but has no CPU kernel: add "
                f"`def cpu(self, *arrays)` (NumPy) or a `decompose`, or drop 'cpu' from devices")
        if dev == "cuda" and "cuda" not in desc.kernels:
            raise OpDeclarationError(
                f"{where} declares devices {desc.devices} but has no CUDA kernel: add "
                f"a method `cuda_source(self, ctype)` returning its CUDA C source, or a `decompose`, "
                f"or drop 'cuda' from devices")
    _check_has_forward(c, where, desc)
    if desc.kernels.get("cuda") == "default launch":
        _check_default_launch(c, where, desc, samples)


def _check_no_jvp(c, where) -> None:
    """A ``jvp`` (ported from JAX's ``custom_jvp`` or PyTorch's
    ``Function.jvp``) is never called: refuse it rather than ignore it."""
    if getattr(c, "jvp", None) is not None:
        raise OpDeclarationError(
            f"{where} defines `jvp`, which gradcore never calls: forward mode (gradcore.jvp) is derived "
            f"from the op's reverse-mode gradient by differentiating it again (docs/op-protocol.md), so a "
            f"jvp would be ignored, and one that disagrees with the vjp would go unnoticed; remove it (or "
            f"rename a helper so that it does not read as a protocol member)")


def _check_has_forward(c, where, desc) -> None:
    """An op with no kernel, decomposition or rule cannot run; often it
    was written in ``Function``'s protocol (``forward``/``backward``)."""
    if desc.kernels:
        return
    ported = [m for m in ("forward", "backward") if getattr(c, m, None) is not None]
    hint = (f"; {' and '.join(f'`{m}`' for m in ported)} belong to gradcore.autodiff.Function's "
            f"protocol (a Function is called, not registered): an op computes in `cpu(self, *arrays)` "
            f"(NumPy) and differentiates with `vjp(self, inputs, outputs, grads)`" if ported else "")
    raise OpDeclarationError(
        f"{where} has no forward: no `cpu(self, *arrays)` kernel, `cuda_source`, `decompose` or "
        f"`_grad_rule`, so applying it can only fail{hint}")


_GLOBAL_KERNEL = re.compile(r"__global__\s+void\s+(\w+)\s*\(")


def _check_default_launch(c, where, desc, samples) -> None:
    """An op with a ``cuda_source`` and no ``cuda`` launcher is launched with
    its inputs, its outputs and ``long long n``: refuse a kernel whose
    parameter list is another (it would read garbage for the rest)."""
    try:
        src = c.cuda_source(samples[0], "float")
    except Exception:
        return                     # a source that needs more than a sample op: checked by check_op
    from .cuda.kernels import parameters
    found = _GLOBAL_KERNEL.findall(src)
    if len(found) > 1:
        raise OpDeclarationError(
            f"{where}: its cuda_source defines {len(found)} kernels ({', '.join(found)}) "
            f"and the op has no launcher; the default launch runs one kernel: add `cuda(self, be, ...)` "
            f"launching them (docs/write-your-first-op.md, section 4)")
    nin = desc.arity[1][1] if desc.arity is not None and desc.arity[1][0] == desc.arity[1][1] else None
    for kname in found:
        kinds, plist = parameters(src, kname)
        params = [p.strip() for p in plist.split(",") if p.strip()]
        # device arrays, then the element count: a 64-bit integer
        ok = (len(kinds) >= 2 and kinds[:-1] == b"p" * (len(kinds) - 1) and kinds[-1:] == b"8"
              and (nin is None or len(kinds) > nin + 1))
        if not ok:
            ins = ", ".join(f"const T* x{i}" for i in range(nin)) if nin is not None else "const T* x..."
            raise OpDeclarationError(
                f"{where}: its CUDA kernel {kname}({', '.join(params)}) does not match the default launch "
                f"({ins}, T* y (one per output), long long n), and the op has no launcher; add "
                f"`cuda(self, be, ...)` that launches it with its own arguments (docs/write-your-first-op.md, "
                f"section 4)")


def _samples(c) -> list:
    """Instances built from ``check_params`` (or the argument-free
    constructor), for the checks that need one; [] when none can be built."""
    if not issubclass(c, Op):
        return []
    params = copy.deepcopy(describe(c).check["check_params"])    # a constructor may change its arguments
    try:
        return [c(*p) if isinstance(p, tuple) else c(**p) for p in params] if params else [c()]
    except Exception:
        return []


_PLAIN_VALUES = (int, float, complex, str, bytes, bool, tuple, frozenset, type(None))


def _check_instance_state(c, where, samples) -> None:
    """Refuse an op whose instances keep a plain value under a private name
    (``self._k = k``): hash and equality cover the public attributes only,
    so two ops differing in it would share caches (the backward graph of
    one used for the other). Checked on the instances ``check_params`` (or
    the argument-free constructor) give; derived values may be declared in
    ``derived = ("_name", ...)``."""
    if not (isinstance(c, type) and issubclass(c, Op)):
        return
    allowed = set(getattr(c, "derived", ()) or ())
    for inst in samples:
        hidden = [k for k, v in vars(inst).items()
                  if k.startswith("_") and not k.startswith("__") and k not in ("_key", "_hash", "_sealed")
                  and k not in allowed and isinstance(v, _PLAIN_VALUES)]
        if hidden:
            name = hidden[0]
            raise OpDeclarationError(
                f"{where} stores {', '.join(hidden)} on its instances outside its attributes: equality, "
                f"hashing and every cache keyed by the op ignore it. Store parameters under public names "
                f"(`self.{name.lstrip('_')} = ...` in __init__); if {name} is derived from the public "
                f"attributes, declare it: `derived = ({name!r},)`")


def _dist_of_module(module: str) -> str:
    top = module.split(".")[0]
    return STANDARD_DIST if top == "gradcore" else top


def _entry_points():
    # (imported here: importlib.metadata costs ~12 ms, and a process that
    # never asks for a plugin op never reads the entry points)
    from importlib import metadata
    return list(metadata.entry_points(group=GROUP))


def _norm(name: str) -> str:
    """A distribution name compared the PEP 503 way (``Foo_Bar`` is ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _blocked() -> set:
    return {_norm(n.strip()) for n in os.environ.get(ENV_BLOCK, "").split(",") if n.strip()}


def _dist_name(ep) -> str:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else ep.module.split(".")[0]


def load(force: bool = False) -> None:
    """Import every plugin (once). Failures are recorded, not raised."""
    if (_state.loaded and not force) or _state.loading:
        return
    _state.loading = True
    if force:
        _state.failures = []
    try:
        # a fixed order (the standard library first, then by distribution
        # name) so that which side of a name conflict is rejected does not
        # depend on how sys.path happens to list the installed packages
        eps = sorted(((_dist_name(ep), ep) for ep in _entry_points()),
                     key=lambda de: (_norm(de[0]) != STANDARD_DIST, _norm(de[0]), de[1].name))
        no_plugins = os.environ.get(ENV_DISABLE, "") not in ("", "0")
        blocked = _blocked()
        has_standard = False
        for dist, ep in eps:
            if _norm(dist) == STANDARD_DIST:
                has_standard = True
            elif no_plugins or _norm(dist) in blocked or _norm(ep.name) in blocked:
                continue
            _load_one(ep, dist)
        if not has_standard and _standard_library is not None:
            # running from a source tree without installed metadata
            with _loading_as(STANDARD_DIST):
                _standard_library()
    finally:
        _state.loading = False
        _state.loaded = True


@contextlib.contextmanager
def _loading_as(dist):
    prev = _state.current_dist
    _state.current_dist = dist
    try:
        yield
    finally:
        _state.current_dist = prev


def _rules_of(classes) -> Dict[type, object]:
    from . import _core
    return {c: r for c in classes if (r := _core.registered_grad_rule(c)) is not None}


def _load_one(ep, dist):
    before = dict(_state.ops)
    known = {e.cls for e in before.values()}
    rules_before = _rules_of(known)
    try:
        with _loading_as(dist):
            obj = ep.load()
            _run_entry_point(ep, obj)
        # which grad rules this plugin installed (for `gradcore check`)
        classes = known | {e.cls for e in _state.ops.values()}
        added = [(c, r) for c, r in _rules_of(classes).items() if rules_before.get(c) is not r]
        # a rule another plugin installed, replaced: the one in force would
        # depend on the load order, silently
        owners = {c: d for d, pairs in _state.rules.items() for c, r in pairs if rules_before.get(c) is r}
        clash = [(c, owners[c]) for c, _ in added if c in owners and _norm(owners[c]) != _norm(dist)]
        if clash:
            from . import _core
            for c, r in rules_before.items():
                _core.register_grad_rule(c)(r)
            for c, _ in added:
                if c not in rules_before:
                    _core.unregister_grad_rule(c)
            raise PluginConflictError(
                "; ".join(f"a grad rule for {c.__name__} is registered by two distributions: {o!r} and {dist!r}"
                          for c, o in clash) + f"; block one with {ENV_BLOCK}")
        if added:
            _state.rules.setdefault(dist, []).extend(added)
    except PluginConflictError as exc:
        _state.ops = before
        _state.failures.append(PluginFailure(dist, ep.value, str(exc), ep.name))
        warnings.warn(f"gradcore plugin {dist!r} was not loaded: {exc}", RuntimeWarning, stacklevel=3)
    except Exception as exc:  # a broken plugin must not break the others
        _state.ops = before
        msg = f"{type(exc).__name__}: {exc}"
        _state.failures.append(PluginFailure(dist, ep.value, msg, ep.name))
        warnings.warn(f"gradcore plugin {dist!r} failed to load ({ep.value}): {msg}",
                      RuntimeWarning, stacklevel=3)


def _run_entry_point(ep, obj) -> None:
    """Run what an entry point names: a function that registers ops (the
    documented form) or a module that registers them when imported. Anything
    else (an op class, an instance, a dict, a function returning op classes
    it did not register) would register nothing, silently: an error naming
    the entry point and saying what to point it at."""
    where = f"entry point {ep.name} = {ep.value}"
    if isinstance(obj, type) and issubclass(obj, Op):
        raise OpDeclarationError(
            f"{where} names the op class {_class_label(obj)} itself, which registers nothing; point it at a "
            f"function that calls register_op({obj.__name__}) (docs/write-your-first-op.md, section 2)")
    if isinstance(obj, ModuleType):
        return                              # its import registered what it registers
    if not callable(obj) or isinstance(obj, (type, Op)):
        raise OpDeclarationError(
            f"{where} names a {type(obj).__name__}, not a function that registers ops; point it at "
            f"a function calling register_op (docs/write-your-first-op.md, section 2)")
    result = obj()
    # what it returns is ignored (`return register_op(C)` returns C), unless
    # it is op classes that were never registered: returned instead
    items = result if isinstance(result, (list, tuple, set)) else [result]
    registered = {e.cls for e in _state.ops.values()}
    ops = [_class_label(x) for x in items if isinstance(x, type) and issubclass(x, Op) and x not in registered]
    if ops:
        raise OpDeclarationError(
            f"{where} returned the op classes {', '.join(ops)} instead of registering them; an entry point "
            f"function registers its ops itself, calling register_op(cls) for each")


def get(name: str) -> type:
    """The op class registered under ``name``.

    Example::

        >>> gradcore.ops.get("Elemwise")
        <class 'gradcore.ops.elemwise.Elemwise'>
    """
    load()
    entry = _state.ops.get(name)
    if entry is None:
        failed = ", ".join(f.dist for f in _state.failures)
        hint = f"; plugins that failed to load: {failed}" if failed else ""
        raise KeyError(f"no op named {name!r} is registered{hint}")
    return entry.cls


def entries() -> List[OpEntry]:
    """Every registered op, sorted by name."""
    load()
    return sorted(_state.ops.values(), key=lambda e: e.name)


def grad_rules(dist: str) -> List[tuple]:
    """``(op class, rule)`` for each grad rule the distribution ``dist``
    registered while it was loaded."""
    load()
    return [pair for d, pairs in _state.rules.items() if _norm(d) == _norm(dist) for pair in pairs]


def entry_point_dists() -> Dict[str, str]:
    """Entry point name -> distribution name, for every ``gradcore.ops`` entry point."""
    return {ep.name: _dist_name(ep) for ep in _entry_points()}


def failures() -> List[PluginFailure]:
    load()
    return list(_state.failures)


@contextlib.contextmanager
def preserved():
    """Restore the registered ops on exit: for tests that register ops.

    Example::

        >>> with gradcore.registry.preserved():
        ...     register_op(MyTestOp)
    """
    load()
    saved = dict(_state.ops)
    try:
        yield
    finally:
        _state.ops.clear()
        _state.ops.update(saved)
