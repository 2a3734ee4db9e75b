"""CUDA graphs: a whole training step captured once, then replayed with one
launch and no host work per op.

``graphed(step)`` wraps a step function (forward, ``GradManager.backward``,
optimizer step)::

    @gradcore.cuda.graphed
    def train_step(x, y):
        with gm:
            loss = F.cross_entropy(model(x), y)
            gm.backward(loss)
        opt.step().clear_grad()
        return loss

    for x, y in batches:                 # cuda tensors
        loss = train_step(x, y)          # calls 1-2 eager, 3 captured, then replayed

- The first ``warmup`` calls with a given input signature run eagerly
  (kernels compiled, optimizer state created, scalar constants cached).
- The next one is captured: ``capture(backend)`` switches the driver to
  stream capture (the emulator records each node; on a GPU a capture stream
  and ``cuStreamBeginCapture``), every allocation comes from a ``MemoryPool``
  private to the graph, and blocks freed meanwhile are held by the graph (a
  captured kernel reads them at every replay). The captured step has not
  run yet: the graph is then launched once.
- Later calls copy the new inputs into the graph's input buffers (device to
  device), refresh the scalars the step reads from the host (``Capture.scalar``:
  the learning rate, Adam's bias corrections; a fill kernel each, only when
  the value changed), redo the Python side effects the step registered
  (``Capture.on_replay``: Adam's step counter) and launch the graph.
- Outputs are copied out of the graph's buffers (``static_outputs=True``
  returns the buffers themselves, overwritten by the next replay).

Safety: a new input shape, dtype or device captures a new graph (kept per
signature, ``max_graphs``), or raises ``GraphCaptureError`` with
``recapture=False``; a host copy, a value read or a synchronisation inside
the capture raises ``GraphCaptureError`` naming the op; a value the step
branched on (``Capture.guard``) that changes makes the next call recapture.

The device layer knows nothing of tensors: the engine installs an adapter
(``install_adapter``; gradcore/step_graphs.py) that finds the device array
of a tensor, wraps an array as a tensor, and names the running op.
"""
from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any, Callable, Iterator, List, Optional

import numpy as np

from . import runtime
from .memory import MemoryPool

__all__ = ["GraphCaptureError", "Capture", "CudaGraph", "GraphedStep", "capture", "capturing", "graphed",
           "install_adapter"]


class GraphCaptureError(RuntimeError):
    """Something in a step cannot be captured in (or replayed as) a CUDA graph."""


class GraphInvalidated(Exception):
    """A value the captured step depended on changed: the graph must be captured again."""


_active: Optional["Capture"] = None      # the capture under way (one at a time per process)


def capturing() -> Optional["Capture"]:
    """The CUDA-graph capture under way, or None (code that reads Python
    values into a step asks, to register them: ``Capture.scalar``).

    Example::

        cap = capturing()
        lr = group["lr"] if cap is None else cap.scalar(lambda: group["lr"], np.float32)
    """
    return _active


class Capture:
    """The state of one capture: the graph's private memory pool, the op
    running (named in errors), and what each replay must redo on the host."""

    def __init__(self, backend):
        self.backend = backend
        self.pool = MemoryPool(_PoolAllocator(backend.driver))      # the graph's own memory
        self.current_op = None                      # set by the engine's adapter
        self.scalars: List[list] = []               # [0-d device array, compute(), value last written]
        self.hooks: List[Callable[[], None]] = []
        self.guards: List[tuple] = []
        self._keyed = {}
        self.graph: Optional[CudaGraph] = None      # set when the capture ends without error

    def refuse(self, what: str) -> None:
        """Raise the error for ``what`` (a host copy, a synchronisation) inside the capture."""
        op = self.current_op
        what = (f"{runtime._op_label(op)}: {what}" if op is not None
                else f"{what} outside any forward op (in a backward, or in Python code on device arrays)")
        raise GraphCaptureError(f"{what} during CUDA-graph capture: it would wait for the host, and a "
                                f"replayed graph does no host work. Move it out of the graphed step, or keep "
                                f"the value on the device")

    def scalar(self, compute: Callable[[], Any], dtype, key=None) -> Any:
        """A 0-d device array of ``compute()`` (a Python number read from
        the host, e.g. a learning rate), refreshed before every replay when
        its value changed: the step reads it from device memory, so a new
        value needs no new capture. Calls with the same ``key`` share one
        array (one refresh). Example: ``cap.scalar(lambda: group["lr"], np.float32)``."""
        dtype = np.dtype(dtype)
        if key is not None and (key, dtype) in self._keyed:
            return self._keyed[key, dtype]
        array = self.empty_outside((), dtype)
        self.scalars.append([array, compute, None])
        if key is not None:
            self._keyed[key, dtype] = array
        return array

    def empty_outside(self, shape, dtype):
        """An array NOT from the graph's pool, for memory written outside the
        graph (a scalar filled before each replay, a constant uploaded now):
        the graph's pool lends a block again once freed inside the capture, so
        a replay's earlier kernels would overwrite it."""
        pool, driver = self.backend.pool, self.backend.driver
        redirect, pool.redirect = pool.redirect, None
        driver.capture_allocating = True
        try:
            return self.backend.empty(shape, dtype)
        finally:
            pool.redirect = redirect
            driver.capture_allocating = False

    def on_replay(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the host before every replay: a Python side effect
        of the step that the graph cannot redo (a step counter). Example:
        ``cap.on_replay(functools.partial(count_step, state))``."""
        self.hooks.append(fn)

    def guard(self, compute: Callable[[], Any], what: str) -> Any:
        """``compute()`` now; a later call where it differs captures anew (a
        value the step branched on: ``what`` names it). Example:
        ``if cap.guard(lambda: bool(group["momentum"]), "momentum on"): ...``."""
        value = compute()
        self.guards.append((compute, value, what))
        return value


class _PoolAllocator:
    """The driver as a graph's private pool sees it: the allocations a
    capture permits (the drivers refuse any other while capturing, e.g. an
    op calling ``driver.alloc`` itself: the graph would not own that memory)."""

    def __init__(self, driver):
        self.driver = driver

    def alloc(self, nbytes: int):
        self.driver.capture_allocating = True
        try:
            return self.driver.alloc(nbytes)
        finally:
            self.driver.capture_allocating = False

    def free(self, allocation) -> None:
        self.driver.free(allocation)


class CudaGraph:
    """A captured step, ready to replay: the driver's executable graph, its
    private pool, the blocks it reads that it must keep alive, and the host
    work each replay redoes (``Capture``)."""

    def __init__(self, cap: Capture, driver_graph, held, keep):
        self.backend = cap.backend
        self.pool = cap.pool
        self.driver_graph = driver_graph
        self.scalars, self.hooks, self.guards = cap.scalars, cap.hooks, cap.guards
        self._held = held                   # (address, size) freed in the main pool during capture
        self._keep = list({id(b): b for b in keep}.values())    # Blocks of arrays the captured kernels read
        self.kernels = getattr(driver_graph, "kernels", None)
        self.inputs: List = []              # the graph's input buffers (DeviceArrays)
        self.outputs: List = []             # its output buffers
        self.out_spec = None

    def check(self) -> None:
        """Raise ``GraphInvalidated`` when a guarded value changed."""
        for compute, value, what in self.guards:
            if compute() != value:
                raise GraphInvalidated(what)

    def launch(self, first: bool = False) -> None:
        """Replay: the host side effects (not on the ``first`` launch, whose
        Python part ran during the capture), the changed scalars, one graph launch."""
        if not first:
            for hook in self.hooks:
                hook()
        be = self.backend
        for entry in self.scalars:
            value = entry[1]()
            if first or value != entry[2]:
                be.fill(entry[0], value)
                entry[2] = value
        self.driver_graph.launch()
        be.graph_launches += 1

    def close(self) -> None:
        """Destroy the driver's graph and give its memory back."""
        if self.driver_graph is None:
            return
        self.driver_graph.destroy()
        self.driver_graph = None
        self.backend.pool.release_held(self._held)
        self._held, self._keep, self.inputs, self.outputs, self.scalars = [], [], [], [], []
        self.pool.empty_cache()

    def __del__(self):
        try:
            self.close()
        except Exception:       # interpreter shutdown
            pass


@contextlib.contextmanager
def capture(backend=None) -> Iterator[Capture]:
    """Capture the device work done inside the block into a ``CudaGraph``
    (``cap.graph`` after the block; not run yet: ``cap.graph.launch(first=True)``).

    Example::

        with capture() as cap:
            y = x * 2                 # recorded, not run
        cap.graph.launch(first=True)  # now y holds x * 2
    """
    global _active
    be = backend or runtime.backend()
    if _active is not None:
        raise GraphCaptureError("a CUDA graph is already being captured (captures do not nest)")
    begin = getattr(be.driver, "begin_capture", None)
    if begin is None:
        raise GraphCaptureError(f"the cuda driver {be.driver!r} cannot capture CUDA graphs")
    be.synchronize()
    cap = Capture(be)
    pool, keep = be.pool, []
    begin(be.launcher)
    _active, be.capture, be.launcher.keep, be.launcher.own_pool = cap, cap, keep, cap.pool
    pool.redirect, pool.held = cap.pool, []
    ok = False
    try:
        yield cap
        ok = True
    finally:
        _active, be.capture, be.launcher.keep, be.launcher.own_pool = None, None, None, None
        held, pool.redirect, pool.held = pool.held, None, None
        driver_graph = be.driver.end_capture(be.launcher)
        if ok:
            cap.graph = CudaGraph(cap, driver_graph, held, keep)
        else:
            driver_graph.destroy()
            pool.release_held(held)
            # constants made inside the capture were filled by recorded
            # kernels that will never run
            be.forget_filled_constants()


# ---------------------------------------------------------------- the engine's adapter
class _NoEngine:
    """What the device layer knows alone: device arrays are the inputs."""

    @staticmethod
    def array_of(obj):
        return obj if isinstance(obj, runtime.DeviceArray) else None

    data_of = array_of

    @staticmethod
    def wrap(array):
        return array

    @staticmethod
    def bound_tensors(roots):
        return []

    @staticmethod
    def rebind(obj, array):
        raise TypeError("no tensors without the engine")

    @staticmethod
    def naming_ops(cap):
        return contextlib.nullcontext()


_adapter = _NoEngine


def install_adapter(adapter) -> None:
    """The engine's view of tensors for ``graphed`` (gradcore/step_graphs.py):
    ``array_of(obj)`` (an input's device array, None for anything passed as
    it is), ``data_of(obj)`` (a result's device array: any cuda tensor's,
    None for anything else), ``bound_tensors(roots)`` ((tensor, device array)
    for every cuda tensor reachable from ``roots``: the step, its arguments), ``rebind(tensor, array)``, ``wrap(array)`` (a tensor over ``array``), ``naming_ops(cap)``
    (a context setting ``cap.current_op`` while each op runs).
    Example: ``install_adapter(TensorAdapter)`` (gradcore/step_graphs.py does it)."""
    global _adapter
    _adapter = adapter


# ---------------------------------------------------------------- pytrees of arguments and results
def _flatten(obj, leaves: list):
    """``obj``'s structure (tuples, lists, dicts nested), its leaves appended to ``leaves``."""
    if type(obj) in (tuple, list):
        return (type(obj), tuple(_flatten(o, leaves) for o in obj))
    if type(obj) is dict:
        return (dict, tuple((k, _flatten(v, leaves)) for k, v in obj.items()))
    leaves.append(obj)
    return None


def _unflatten(spec, leaves: Iterator):
    if spec is None:
        return next(leaves)
    kind, parts = spec
    if kind is dict:
        return {k: _unflatten(s, leaves) for k, s in parts}
    return kind(_unflatten(s, leaves) for s in parts)


class _Bindings:
    """The cuda tensors alive before a capture and the arrays they held.

    A step that gives a tensor new memory (batch norm's running statistics,
    ``t._reset(new)``) would leave a replay reading the old array and writing
    the new one: never accumulating. So after the step (still capturing) the
    new value is copied into the old array (a device copy, captured) and the
    tensor is bound to its old array again: the replay updates it in place.
    Called after each later call's replay check, it says whether every
    tensor the graph reads still holds its array (else: capture again)."""

    def __init__(self, pairs):
        self.pairs = [(weakref.ref(t), array) for t, array in pairs]

    def write_back(self, be, name: str) -> None:
        for ref, old in self.pairs:
            t = ref()
            if t is None:
                continue
            new = _adapter.data_of(t)
            if new is old:
                continue
            if new is None or new.shape != old.shape or new.dtype != old.dtype:
                what = "cpu data" if new is None else f"an array of shape {new.shape} {new.dtype.name}"
                raise GraphCaptureError(f"graphed {name}: the step replaced the data of a tensor of shape "
                                        f"{old.shape} {old.dtype.name} with {what}; a replay cannot")
            be.copy_into(old, new)
            _adapter.rebind(t, old)

    def keep_only(self, graph: "CudaGraph") -> None:
        """Keep the tensors whose arrays the graph reads (the others cannot matter to it)."""
        read = {id(b) for b in graph._keep}
        self.pairs = [(ref, array) for ref, array in self.pairs if id(array._block) in read]

    def __call__(self) -> bool:
        for ref, array in self.pairs:
            t = ref()
            if t is not None and _adapter.data_of(t) is not array:
                return False
        return True


class GraphedStep:
    """A step function run as CUDA graphs (see the module docstring and
    ``graphed``). ``graphs``: signature -> CudaGraph; ``captures``,
    ``replays``, ``eager_calls``: counts."""

    def __init__(self, step: Callable, warmup: int = 2, recapture: bool = True, max_graphs: int = 8,
                 static_outputs: bool = False):
        if warmup < 0:
            raise ValueError(f"graphed: warmup must be >= 0, got {warmup}")
        self.step, self.warmup, self.recapture = step, int(warmup), bool(recapture)
        self.__name__ = getattr(step, "__name__", type(step).__name__)
        self.max_graphs, self.static_outputs = int(max_graphs), bool(static_outputs)
        self.graphs = {}
        self._calls = {}
        self.captures = self.replays = self.eager_calls = 0
        functools.update_wrapper(self, step)

    def __repr__(self):
        return f"graphed({getattr(self.step, '__qualname__', self.step)!r}, {len(self.graphs)} graphs)"

    def _signature(self, leaves, spec):
        sig = []
        for i, leaf in enumerate(leaves):
            array = _adapter.array_of(leaf)
            if array is not None:
                sig.append(("array", array.shape, array.dtype.str, id(array.backend)))
                continue
            try:
                hash(leaf)
            except TypeError:
                raise TypeError(f"graphed {self.__name__}: argument leaf {i} is a {type(leaf).__name__}, "
                                f"neither a cuda tensor nor hashable (values other than tensors are part "
                                f"of what a graph was captured for)") from None
            sig.append(("value", type(leaf), leaf))
        return (spec, tuple(sig))

    def __call__(self, *args, **kwargs):
        leaves: list = []
        spec = _flatten((args, kwargs), leaves)
        sig = self._signature(leaves, spec)
        graph = self.graphs.get(sig)
        if graph is not None:
            try:
                graph.check()
            except GraphInvalidated:
                self._drop(sig)
                return self._capture(sig, leaves, spec)
            return self._replay(graph, leaves)
        if self.graphs and not self.recapture:
            raise GraphCaptureError(f"graphed {self.__name__}: inputs {self._describe(sig)} differ from those "
                                    f"the graph was captured for ({self._describe(next(iter(self.graphs)))}), "
                                    f"and recapture=False")
        calls = self._calls[sig] = self._calls.get(sig, 0) + 1
        if calls <= self.warmup:
            self.eager_calls += 1
            return self.step(*args, **kwargs)
        return self._capture(sig, leaves, spec)

    @staticmethod
    def _describe(sig) -> str:
        return ", ".join(f"{s[1]} {np.dtype(s[2]).name}" if s[0] == "array" else repr(s[2]) for s in sig[1])

    def _drop(self, sig) -> None:
        graph = self.graphs.pop(sig, None)
        if graph is not None:
            graph.close()

    def _capture(self, sig, leaves, spec):
        arrays = [_adapter.array_of(leaf) for leaf in leaves]
        present = [a for a in arrays if a is not None]
        be = present[0].backend if present else runtime.backend()
        if len(self.graphs) >= self.max_graphs:
            self._drop(next(iter(self.graphs)))
        # the graph's input buffers: allocated and filled before the capture
        inputs = [None if a is None else a.copy() for a in arrays]
        for a, buf in zip(arrays, inputs):
            if a is not None:
                be.share_extent(buf, a)     # labels' known range: no read back in a range check
        bindings = _Bindings(_adapter.bound_tensors([self.step, leaves]))
        call_leaves = [leaf if a is None else _adapter.wrap(buf) for leaf, a, buf in zip(leaves, arrays, inputs)]
        args, kwargs = _unflatten(spec, iter(call_leaves))
        with capture(be) as cap, _adapter.naming_ops(cap):
            result = self.step(*args, **kwargs)
            bindings.write_back(be, self.__name__)
            out_leaves: list = []
            out_spec = _flatten(result, out_leaves)
            outputs = []
            for i, leaf in enumerate(out_leaves):
                array = _adapter.data_of(leaf)
                if array is None and leaf is not None:
                    raise GraphCaptureError(f"graphed {self.__name__}: the step returns a {type(leaf).__name__} "
                                            f"(result leaf {i}); a replayed graph returns only cuda tensors "
                                            f"(and None)")
                outputs.append(array)
        graph = cap.graph
        bindings.keep_only(graph)
        graph.guards.append((bindings, True, "a tensor the graph reads was given new memory (load_state_dict, "
                                             "_reset): captured again"))
        graph.inputs, graph.outputs, graph.out_spec = inputs, outputs, out_spec
        self.graphs[sig] = graph
        self.captures += 1
        graph.launch(first=True)
        return self._results(graph)

    def _replay(self, graph: CudaGraph, leaves):
        be = graph.backend
        for leaf, buf in zip(leaves, graph.inputs):
            if buf is not None:
                src = _adapter.array_of(leaf)
                if src.ptr != buf.ptr and src.nbytes:
                    be.copy_on_device(buf.ptr, src.ptr, src.nbytes)
        graph.launch()
        self.replays += 1
        return self._results(graph)

    def _results(self, graph: CudaGraph):
        outs = [None if a is None else _adapter.wrap(a if self.static_outputs else a.copy())
                for a in graph.outputs]
        return _unflatten(graph.out_spec, iter(outs))


def graphed(step: Optional[Callable] = None, *, warmup: int = 2, recapture: bool = True, max_graphs: int = 8,
            static_outputs: bool = False):
    """Run ``step`` (a whole training step on cuda tensors) as a CUDA graph:
    ``warmup`` eager calls, one captured, then replays (see the module
    docstring). Usable as ``@graphed`` or ``@graphed(warmup=1, recapture=False)``.

    - ``recapture``: a call with new input shapes/dtypes/devices (or other
      argument values) captures a new graph (kept, at most ``max_graphs``);
      False raises ``GraphCaptureError`` instead.
    - ``static_outputs``: return the graph's own output buffers (no copy;
      the next replay overwrites them) instead of copies.

    Example::

        step = graphed(train_step, warmup=1)
        losses = [step(x, y) for x, y in batches]
    """
    if step is None:
        return functools.partial(graphed, warmup=warmup, recapture=recapture, max_graphs=max_graphs,
                                 static_outputs=static_outputs)
    return GraphedStep(step, warmup=warmup, recapture=recapture, max_graphs=max_graphs,
                       static_outputs=static_outputs)
