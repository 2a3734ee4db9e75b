"""Fused backward kernels (CUDA backend issue, item 4).

A generic backward graph (``gradcore.graph.BackwardGraph``) whose nodes are
all ``Elemwise`` ops is turned into ONE CUDA C kernel: every node becomes a
local variable computed from the row's CUDA expression
(``gradcore.ops.elemwise.TABLE``), and the kernel writes every input
gradient the graph returns. A backward of N elementwise ops then launches
one kernel instead of N, and the intermediates never touch device memory.

Contract with the backend (the launcher is GPU-side work, not here):

- every parameter is a contiguous array of ``n`` elements, ``n`` being the
  output's element count. Inputs that broadcast are expanded by the backend
  before the launch, and gradients of broadcast inputs are summed down to the
  input's shape after it (the core does that centrally anyway);
- parameters come in the order of ``FusedKernel.inputs`` (saved values and
  output gradients), then ``FusedKernel.outputs`` (input gradients), then
  ``long long n``;
- the kernel is a grid-stride loop: any grid covers every element.

Only scalar constants are fused; a graph with a non-elementwise node, an
array constant or an integer/complex value gives ``None`` (the backend runs
that graph node by node).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from ._launch import FusedRunner
from .kernels import Kernel, kernel_name

__all__ = ["FusedKernel", "KernelParam", "KernelOutput", "fuse_elementwise", "ctype_of"]

_CTYPES = {"float32": "float", "float64": "double", "float16": "__half", "bool": "bool"}
# ops that are the identity (or zero) when every value has the output's shape
_SAME_SHAPE_IDENTITY = ("SumToLike", "BroadcastToLike", "ReshapeLike", "Identity", "StopGradient")


@dataclass(frozen=True)
class KernelParam:
    """One input parameter of a fused kernel.

    ``role`` is ``"input"`` / ``"output"`` (a saved forward input / output,
    ``index`` its position among the op's inputs / outputs; ``saved_pos`` its
    position in ``graph.saved_vids``, i.e. in the saved tuple the core keeps)
    or ``"grad"`` (the gradient of output ``index``)."""
    name: str
    role: str
    index: int
    vid: int
    ctype: str
    saved_pos: Optional[int] = None


@dataclass(frozen=True)
class KernelOutput:
    """One output parameter: the gradient of the op's input ``index``."""
    name: str
    index: int
    vid: int
    ctype: str


@dataclass(frozen=True)
class FusedKernel:
    name: str
    source: str
    inputs: Tuple[KernelParam, ...]
    outputs: Tuple[KernelOutput, ...]
    ctype: str
    n_nodes: int
    structure: str          # the canonical text the name's hash is taken of

    def signature(self) -> str:
        """The C parameter list (for launchers and host-side emulation)."""
        return _c_params(self.inputs, self.outputs)


def _c_params(inputs, outputs) -> str:
    return ", ".join([f"const {p.ctype}* __restrict__ {p.name}" for p in inputs]
                     + [f"{o.ctype}* __restrict__ {o.name}" for o in outputs] + ["long long n"])


def ctype_of(dtype, ctype: str) -> Optional[str]:
    """The C type of a graph value of ``dtype`` when floating values are
    ``ctype``; None for a dtype the fused kernel does not handle."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return "bool"
    if dt.kind == "f":
        return ctype
    return None


def _literal(value, ctype: str) -> Optional[str]:
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            return None
        value = value.item()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or ctype == "bool":
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        v = float(value)
        if math.isnan(v):
            text = "(0.0 / 0.0)"
        elif math.isinf(v):
            text = "(1.0 / 0.0)" if v > 0 else "(-1.0 / 0.0)"
        else:
            text = repr(v)      # round-trips a double exactly
        return f"(({ctype}){text})"
    return None


def _structure(graph, ctype: str, same_shape: bool) -> Optional[str]:
    """A canonical text of the graph: op identities, wiring, constants,
    dtypes, the returned gradients and the element type."""
    parts = [f"ctype={ctype}", f"same_shape={same_shape}", f"n_in={graph.n_in}", f"n_out={graph.n_out}",
             "dtypes=" + ",".join(np.dtype(d.dtype).str for d in graph.descs),
             "saved=" + ",".join(map(str, graph.saved_vids)),
             "grads=" + ",".join("-" if v is None else str(v) for v in graph.grad_vids)]
    for node in graph.nodes:
        args = []
        for a in node.args:
            if isinstance(a, int):
                args.append(f"v{a}")
            else:
                dt = "" if a.dtype is None else np.dtype(a.dtype).str
                args.append(f"c({np.asarray(a.value).tolist()!r}:{dt})")
        key = getattr(node.op, "_key", None)
        op_id = repr(key) if key is not None else repr(node.op)
        parts.append(f"{','.join(f'v{o}' for o in node.outs)}={op_id}({','.join(args)})")
    return "\n".join(parts)


def _op_label(op) -> str:
    label = getattr(op, "mode", None) or getattr(op, "name", "") or type(op).__name__
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in str(label))[:24]


def fuse_elementwise(graph, ctype: Optional[str] = "float", same_shape: bool = False) -> Optional[FusedKernel]:
    """One CUDA kernel computing all the input gradients ``graph`` returns, or
    None when the graph cannot be fused (a node that is not ``Elemwise``, an
    array constant, a value that is neither floating nor bool).

    ``ctype`` is the C type of the floating values ("float", "double"); None
    takes it from the graph (float32 -> float, float64 -> double).

    ``same_shape=True`` builds the variant for the shapes class where every
    forward input has the output's shape: there the shape ops a decomposition
    leaves in a graph (``SumToLike``, ``BroadcastToLike``, ``ReshapeLike``,
    ``Identity``, ``StopGradient``) pass their first argument through and
    ``ZerosLike`` is 0, so they fuse too. (A decomposition with a reduction
    keeps a non-elementwise node and is not fused.)
    """
    from .runtime import standard_op
    describe = standard_op("describe")          # gradcore.op.describe: an Elemwise op's row

    if ctype is None:
        floats = {np.dtype(d.dtype) for d in graph.descs if np.dtype(d.dtype).kind == "f"}
        if len(floats) != 1:
            return None
        ctype = _CTYPES.get(floats.pop().name)
        if ctype is None:
            return None
    if not any(v is not None for v in graph.grad_vids):
        return None
    if getattr(graph, "precomp", None) and not same_shape:
        # carriers only feed shape ops, which only the same-shape variant fuses
        return None

    def vtype(vid):
        return ctype_of(graph.descs[vid].dtype, ctype)

    n_in, n_out = graph.n_in, graph.n_out
    first_grad = n_in + n_out
    alias = {}          # vid -> the vid (or literal) it stands for (identity shape ops)
    consts = {}         # vid -> literal, for ZerosLike
    body: List[str] = []
    reads = []          # graph-input vids read as values, in first-read order

    def ref(a):
        if isinstance(a, int):
            a = alias.get(a, a)
            if a in consts:
                return consts[a]
            if a < first_grad + n_out and a not in reads:   # a graph input
                reads.append(a)
            return f"v{a}"
        lit = _literal(a.value, ctype_of(a.dtype, ctype) if a.dtype is not None else ctype)
        if lit is None:
            raise _Unfusable()
        return lit

    try:
        for node in graph.nodes:
            row = describe(node.op).row(node.op)
            if row is not None and len(node.outs) == 1:
                out = node.outs[0]
                t = vtype(out)
                if t is None:
                    return None
                args = [ref(a) for a in node.args]
                arg_types = [vtype(a) if isinstance(a, int) else ctype_of(a.dtype, ctype) if a.dtype is not None else ctype
                             for a in node.args]
                if any(at is None for at in arg_types):
                    return None
                # the row's expression reads x, y, z and its element type T
                # (the output's, or for a predicate its first non-bool
                # argument's): bound as locals of a block of its own
                node_t = t if t != "bool" else next((at for at in arg_types if at != "bool"), ctype)
                binds = "".join(f" const {at} {name} = {a};" for name, at, a in zip("xyz", arg_types, args))
                body += [f"{t} v{out};   // {node.op._name()}",
                         f"{{ typedef {node_t} T;{binds} v{out} = ({t})({row.cuda}); }}"]
            elif same_shape and getattr(node.op, "name", None) in _SAME_SHAPE_IDENTITY and len(node.outs) == 1:
                src = node.args[0]
                if not isinstance(src, int):
                    return None
                alias[node.outs[0]] = alias.get(src, src)
            elif same_shape and getattr(node.op, "name", None) == "ZerosLike" and len(node.outs) == 1:
                t = vtype(node.outs[0])
                if t is None:
                    return None
                consts[node.outs[0]] = "false" if t == "bool" else f"(({t})0)"
            else:
                return None
        outputs = []
        out_lines = []
        for i, v in enumerate(graph.grad_vids):
            if v is None:
                continue
            t = vtype(v)
            if t is None or t == "bool":
                return None
            outputs.append(KernelOutput(f"d{i}", i, v, t))
            out_lines.append(f"d{i}[i] = {ref(v)};")
    except _Unfusable:
        return None

    saved_pos = {v: k for k, v in enumerate(graph.saved_vids)}
    inputs = []
    # parameter order: saved values in saved order, then output grads
    for v in sorted(reads):
        t = vtype(v)
        if t is None:
            return None
        if v < n_in:
            inputs.append(KernelParam(f"s{v}", "input", v, v, t, saved_pos.get(v)))
        elif v < first_grad:
            inputs.append(KernelParam(f"s{v}", "output", v - n_in, v, t, saved_pos.get(v)))
        else:
            inputs.append(KernelParam(f"g{v - first_grad}", "grad", v - first_grad, v, t))

    structure = _structure(graph, ctype, same_shape)
    import hashlib          # (here: ~6 ms to import, and only a cuda backward fuses)
    digest = hashlib.sha256(structure.encode()).hexdigest()[:16]
    label = f"bwd_{_op_label(graph.op)}"
    loads = [f"const {p.ctype} v{p.vid} = {p.name}[i];" for p in inputs]
    kernel = Kernel(label, _c_params(inputs, outputs), "\n".join(loads + body + out_lines), over="n", index="i",
                    suffix=f"_{digest}")
    name = kernel_name(label, ctype) + kernel.suffix
    # the rows' helper functions (gc_pow, ...)
    source = f"// fused backward of {graph.op!r} ({len(graph.nodes)} nodes, {ctype})\n" + kernel.source(
        ctype, helpers=standard_op("CUDA_HELPERS"))
    return FusedKernel(name, source, tuple(inputs), tuple(outputs), ctype, len(graph.nodes), structure)


class _Unfusable(Exception):
    pass


def fused_runner(graph, kept: List[int], one_saved: bool):
    """A ``run_raw(s, g)`` for the cuda device that computes every input
    gradient of ``graph`` with ONE launch of its fused kernel, or None when
    the graph does not fuse. ``kept``/``one_saved`` say how the core hands
    over the saved values (``graph.compiled``'s layout, see graph._compile).

    The parameters are expanded to the output's shape first (a no-op when
    they have it, the usual case); the core sums the gradients of broadcast
    inputs down to their shapes afterwards, as for every elementwise op.
    """
    kernel = fuse_elementwise(graph, None)
    if kernel is None:
        return None
    position = {v: k for k, v in enumerate(kept)}
    n_in, n_out = graph.n_in, graph.n_out
    # per parameter: (a saved value?, its index; None: the only one)
    fetch = [(False, None if n_out == 1 else p.index) if p.role == "grad" else
             (True, None if one_saved else position[p.vid]) for p in kernel.inputs]
    out_dtypes = [np.dtype(graph.descs[o.vid].dtype) for o in kernel.outputs]
    # the dtype each parameter is compiled for: a gradient may arrive in a
    # wider type (a float32 input of a float64 sum gets a float64 gradient)
    param_dtypes = [np.dtype(graph.descs[p.vid].dtype) for p in kernel.inputs]
    slot_of = {o.index: k for k, o in enumerate(kernel.outputs)}
    grad_order = [None if v is None else slot_of[i] for i, v in enumerate(graph.grad_vids)]
    # the per-call part is compiled (gradcore/cuda/_launch.pyx)
    run_raw = FusedRunner(graph.op, kernel.ctype, kernel.name, kernel.source,
                          fetch, param_dtypes, out_dtypes, grad_order, n_in == 1)
    run_raw.fused_kernel = kernel
    return run_raw
