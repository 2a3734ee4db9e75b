"""The generic backward graph (gradient path 3).

``make_backward_graph`` traces an op's VJP definition, or its decomposition
into other ops, on symbolic tensors that carry only dtype and device (shapes
stay unknown, so one graph serves every shape). The graph is then optimised:

- dead code is removed;
- a forward value read only for its shape (``reshape_like(g, x)``) is
  replaced by a zero-stride "shape carrier" made in a *precomp* step right
  after the forward, so the tensor itself is not kept alive;
- what is left decides the save-for-backward mask over
  (inputs, outputs, output grads).

It is compiled into two Python functions by code generation: one calling the
kernels on raw arrays (a backward nobody records), one calling ``apply`` on
Tensors (a backward an older GradManager records, for higher order).
Results are cached under (op, input dtypes, devices, requires-grad mask).
"""
from __future__ import annotations

import itertools
import threading
from typing import List, Optional, Sequence, Tuple

import numpy as np

from . import _core, dtypes
from .cuda import events as _device_events
from . import op as _op_module
from .op import TensorDesc, checked_decompose_result, checked_infer_result, describe, name_the_op, op_label

__all__ = ["make_backward_graph", "BackwardGraph", "SymbolicTensor", "cache_info"]


# ---------------------------------------------------------------- tracing
class Node:
    __slots__ = ("op", "args", "outs")

    def __init__(self, op, args, outs):
        self.op = op          # Op
        self.args = args      # tuple of value ids (int) or Const
        self.outs = outs      # tuple of value ids


class Const:
    """A constant argument in a graph (a Python scalar or small array)."""
    __slots__ = ("value", "dtype")

    def __init__(self, value, dtype=None):
        self.value = value
        self.dtype = dtype      # the dtype it takes where it meets the tensors

    def __repr__(self):
        return f"Const({self.value!r})"


class Trace:
    _local = threading.local()

    def __init__(self):
        self.nodes: List[Node] = []
        self.descs: List[TensorDesc] = []
        # value ids of the traced op's inputs whose gradient the backward
        # does not return (gradcore.op.needs_grad reads it)
        self.no_grad = frozenset()
        self.op = None          # the op whose backward is traced (for error messages)

    def new_value(self, desc: TensorDesc) -> "SymbolicTensor":
        self.descs.append(desc)
        return SymbolicTensor(self, len(self.descs) - 1, desc)


class SymbolicTensor:
    """A tensor known only by dtype, device and (maybe) shape; ops applied to
    it are recorded into a Trace instead of computed."""

    __slots__ = ("trace", "vid", "desc")
    __array_priority__ = 2000

    def __init__(self, trace: Trace, vid: int, desc: TensorDesc):
        self.trace, self.vid, self.desc = trace, vid, desc

    shape = property(lambda self: self.desc.shape)
    dtype = property(lambda self: self.desc.dtype)
    device = property(lambda self: self.desc.device)
    ndim = property(lambda self: self.desc.ndim)

    def __repr__(self):
        return f"SymbolicTensor(v{self.vid}, {self.desc})"

    def _no_value(self, what: str, instead: str):
        op = self.trace.op
        who = repr(op) if op is not None else "a traced backward"
        raise TypeError(f"{who}: a tensor's value is not known while a vjp or decompose is traced, "
                        f"so it has no {what}; {instead}")

    def __bool__(self):
        # a traced graph holds for every value: a Python branch on one would
        # take the same side for every element and every later call
        self._no_value("truth value (Python `if`, `and`, `or`, `not` on a tensor)",
                       "choose elementwise with F.where(cond, a, b)")

    def _as_value(what):
        def read(self, *args, **kwargs):
            # a vjp computed on arrays would be a constant of the graph: wrong
            # at every other input, and with no second order
            self._no_value(what, "write the vjp with gradcore ops (F.*, tensor operators): they are "
                                 "traced into the backward graph, which then holds for every input and "
                                 "every order")
        return read

    numpy = _as_value(".numpy() value")
    item = _as_value(".item() value")
    tolist = _as_value(".tolist() value")
    __array__ = _as_value("NumPy array (np.asarray of a tensor)")
    __float__ = _as_value("float() value")
    __int__ = _as_value("int() value")
    __index__ = _as_value("index value")
    del _as_value

    def _bin(name):
        def fwd(self, other):
            return _core.apply(_operator_op(name), self, other)[0]

        def rev(self, other):
            return _core.apply(_operator_op(name), other, self)[0]
        return fwd, rev

    __add__, __radd__ = _bin("add")
    __sub__, __rsub__ = _bin("sub")
    __mul__, __rmul__ = _bin("mul")
    __truediv__, __rtruediv__ = _bin("div")
    __pow__, __rpow__ = _bin("pow")
    __floordiv__, __rfloordiv__ = _bin("floor_div")
    __mod__, __rmod__ = _bin("mod")
    __lt__, _ = _bin("lt")
    __le__, _ = _bin("le")
    __gt__, _ = _bin("gt")
    __ge__, _ = _bin("ge")
    __eq__, _ = _bin("eq")
    __ne__, _ = _bin("ne")
    __hash__ = object.__hash__

    def __neg__(self):
        return _core.apply(_operator_op("neg"), self)[0]

    def __pos__(self):
        return self

    def __len__(self):
        if not self.desc.shape:
            self._no_value("len() (its shape is not known here, or it is 0-d)", "use F.* ops that take the "
                           "whole tensor")
        return self.desc.shape[0]

    def __abs__(self):
        return _core.apply(_operator_op("abs"), self)[0]

    def _via_hook(name, *lead, swap=False):
        # the operators that are functions, not ops: those Tensor's call, by
        # the same hook names
        # (gradcore.tensor_methods installs them: it sits above this module)
        def operator(self, *args):
            return _tensor_hook(name)(*lead, *((*args, self) if swap else (self, *args)))
        return operator

    __getitem__ = _via_hook("getitem")
    __matmul__, __rmatmul__ = _via_hook("matmul"), _via_hook("matmul", swap=True)
    __invert__ = _via_hook("logical", "not")
    __and__, __rand__ = _via_hook("logical", "and"), _via_hook("logical", "and", swap=True)
    __or__, __ror__ = _via_hook("logical", "or"), _via_hook("logical", "or", swap=True)
    __xor__, __rxor__ = _via_hook("logical", "xor"), _via_hook("logical", "xor", swap=True)
    __lshift__, __rlshift__ = _via_hook("left_shift"), _via_hook("left_shift", swap=True)
    __rshift__, __rrshift__ = _via_hook("right_shift"), _via_hook("right_shift", swap=True)
    del _via_hook, _bin, _

    def __getattr__(self, name):
        return _tensor_method(self, name)


def _operator_op(name):
    from gradcore.ops import operator_op
    return operator_op(name)


# Tensor's methods (``x.sum()``, ``x.reshape(...)``) and operator functions for
# symbolic tensors too: installed by gradcore.tensor_methods when it loads (it
# sits above this module)
_method_lookup = None
_hook_lookup = None


def install_method_lookup(lookup, hooks) -> None:
    """Called by ``gradcore.tensor_methods`` at import: ``lookup(tensor,
    name)`` gives a tensor's method or property, for SymbolicTensor's
    attributes the class itself lacks; ``hooks(name)`` the function behind
    one of Tensor's operators (the compiled core's ``tensor_method`` hook).

    Example::

        >>> install_method_lookup(gradcore.tensor_methods.method, gradcore.tensor_methods._HOOK_FNS.__getitem__)
    """
    global _method_lookup, _hook_lookup
    _method_lookup, _hook_lookup = lookup, hooks


def _tensor_hook(name):
    if _hook_lookup is None:
        raise TypeError("this operator needs Tensor's functions, which are not installed: import gradcore")
    return _hook_lookup(name)


def _tensor_method(self, name):
    if _method_lookup is None:
        raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r} "
                             f"(Tensor's methods are not installed: import gradcore)")
    return _method_lookup(self, name)


def _as_desc(x, device) -> Tuple[Optional[TensorDesc], object]:
    """(desc, const) for a non-symbolic argument inside a trace."""
    if isinstance(x, _core.Tensor):
        return TensorDesc(x.shape, x.dtype, x.device), x.numpy()
    if dtypes.is_weak_scalar(x):
        x = x.item() if isinstance(x, np.generic) else x
        return TensorDesc((), dtypes.result_type(x), device), x
    arr = np.asarray(x)
    return TensorDesc(arr.shape, arr.dtype, device), arr


def trace_apply(op, args):
    trace = next(a.trace for a in args if isinstance(a, SymbolicTensor))
    device = next(a.device for a in args if isinstance(a, SymbolicTensor))
    descs, refs = [], []
    for a in args:
        if isinstance(a, SymbolicTensor):
            if a.trace is not trace:
                raise RuntimeError(f"{op!r}: symbolic tensors from two different traces")
            descs.append(a.desc)
            refs.append(a.vid)
        else:
            d, c = _as_desc(a, device)
            if isinstance(c, (bool, int, float)):
                # weak Python scalars take the dtype of the tensors they meet
                others = [x.dtype for x in args if isinstance(x, SymbolicTensor)]
                d = TensorDesc((), dtypes.result_type(*others, c), device)
            descs.append(d)
            refs.append(Const(c, d.dtype))
    if hasattr(type(op), "input_dtypes") and not _one_float_dtype(descs):
        # the dtype rules, as the core applies them to tensors: casts recorded
        # into the trace, constants made in the dtype wanted
        op, want = op.input_dtypes([d.dtype for d in descs])
        for i, (a, d) in enumerate(zip(args, want)):
            if descs[i].dtype == d:
                continue
            if isinstance(a, SymbolicTensor):
                from gradcore.ops.shape import cast_to
                cast = cast_to(a, d)
                descs[i], refs[i] = cast.desc, cast.vid
            else:
                value = refs[i].value
                descs[i] = TensorDesc(descs[i].shape, d, device)
                refs[i] = Const(value if isinstance(value, (bool, int, float)) else np.asarray(value, d), d)
    out_descs = op.infer(*descs)
    outs = tuple(trace.new_value(d) for d in out_descs)
    trace.nodes.append(Node(op, tuple(refs), tuple(o.vid for o in outs)))
    return outs


def _one_float_dtype(descs) -> bool:
    d0 = descs[0].dtype
    return d0.kind == "f" and all(d.dtype == d0 for d in descs[1:])


# ---------------------------------------------------------------- graphs
class BackwardGraph:
    """The optimised backward of one op: ``precomp`` nodes run right after the
    forward on (inputs, outputs); ``nodes`` run in the backward on the saved
    values, the precomp results and the output grads."""

    def __init__(self, op, n_in, n_out, descs, save_mask, input_has_grad,
                 saved_vids, precomp, nodes, grad_vids):
        self.op = op
        self.n_in, self.n_out = n_in, n_out
        self.descs = descs
        self.save_for_backward = save_mask          # over inputs + outputs + grads
        self.input_has_grad = input_has_grad
        self.saved_vids = saved_vids                # graph inputs kept, in order
        self.precomp = precomp                      # [(source vid, carrier vid)]
        self.nodes = nodes
        self.grad_vids = grad_vids                  # per input: vid or None
        self.integer_input_grads = []               # inputs not float yet given a gradient by the vjp
        self.compiled = None

    def __repr__(self):
        lines = [f"BackwardGraph({self.op!r}) save={self.save_for_backward} "
                 f"input_has_grad={self.input_has_grad}"]
        for src, dst in self.precomp:
            lines.append(f"  precomp v{dst} = shape_of(v{src})")
        for n in self.nodes:
            args = ", ".join(f"v{a}" if isinstance(a, int) else repr(a) for a in n.args)
            outs = ", ".join(f"v{o}" for o in n.outs)
            lines.append(f"  {outs} = {n.op!r}({args})")
        lines.append("  return " + ", ".join("None" if v is None else f"v{v}" for v in self.grad_vids))
        return "\n".join(lines)

    @property
    def ops(self):
        return [n.op for n in self.nodes]


def _zeros_like(x):
    from gradcore.ops import shape as shape_ops
    return _core.apply(shape_ops.ZerosLike(), x)[0]


def _sum_to_like(g, x):
    from gradcore.ops import shape as shape_ops
    return _core.apply(shape_ops.SumToLike(), g, x)[0]


def _vjp(op, inputs, outputs, grads):
    """Symbolic VJP of one op (its own rule, or through its decomposition)."""
    traced = describe(op).traced
    if traced in ("vjp", "decompose"):
        try:
            if traced == "vjp":
                return _checked_vjp_result(op, op.vjp(inputs, outputs, grads))
            return _vjp_of_decomposition(op, inputs, outputs, grads)
        except Exception as exc:
            name_the_op(op, exc, traced)
            raise
    raise _core.NotDifferentiableError(_not_differentiable_msg(op))


def _checked_vjp_result(op, res) -> list:
    """A ``vjp``'s result: a tuple or list holding, per input, a gradient
    built from gradcore ops (traced here) or None; anything else (a bare
    tensor, NumPy arrays, numbers) is refused naming the op, never taken as
    "no gradient"."""
    name = op_label(op)
    if not isinstance(res, (tuple, list)):
        what = "a single tensor: return (g,)" if isinstance(res, SymbolicTensor) else type(res).__name__
        raise TypeError(f"{name}: vjp must return a tuple with one gradient (a Tensor or None) per input, "
                        f"got {what}")
    for i, g in enumerate(res):
        if g is not None and not isinstance(g, SymbolicTensor):
            raise TypeError(f"{name}: vjp returned a {type(g).__name__} as the gradient of input {i}: gradients "
                            f"must be Tensors computed with gradcore ops or gradcore.functional from the vjp's "
                            f"arguments (traced, not run), or None for no gradient")
    return list(res)


def _vjp_of_decomposition(op, inputs, outputs, grads):
    trace = inputs[0].trace
    start = len(trace.nodes)
    res = tuple(checked_decompose_result(op, op.decompose(*inputs), SymbolicTensor))
    fwd_nodes = trace.nodes[start:]
    # the op's real outputs stand in for the decomposition's: no recomputation
    alias = {r.vid: o for r, o in zip(res, outputs)}
    def sym(vid):
        found = alias.get(vid)
        return found if found is not None else SymbolicTensor(trace, vid, trace.descs[vid])
    grad_of = {r.vid: g for r, g in zip(res, grads) if g is not None}
    for node in reversed(fwd_nodes):
        gs = [grad_of.get(o) for o in node.outs]
        if all(g is None for g in gs):
            continue
        outs = [sym(o) for o in node.outs]
        gs = [_zeros_like(o) if g is None else g for g, o in zip(gs, outs)]
        ins = [sym(a) if isinstance(a, int) else a.value for a in node.args]
        in_grads = _vjp(node.op, ins, outs, gs)
        for a, x, g in zip(node.args, ins, in_grads):
            if not isinstance(a, int) or g is None or not isinstance(g, SymbolicTensor):
                continue
            if describe(node.op).reduce_broadcast:
                g = _sum_to_like(g, x)
            prev = grad_of.get(a)
            grad_of[a] = g if prev is None else prev + g
    return [grad_of.get(x.vid) for x in inputs]


def _not_differentiable_msg(op):
    name = op_label(op)
    return (f"op {name} is not differentiable: it has no _grad_rule, no rule registered with "
            f"gradcore.register_grad_rule({type(op).__name__}), and neither a vjp() nor a "
            f"decompose() method to derive a backward graph from; add one of them")


def _derive(op, descs: Sequence[TensorDesc], requires_grad: Sequence[bool]) -> BackwardGraph:
    if describe(op).traced is None:
        raise _core.NotDifferentiableError(_not_differentiable_msg(op))
    trace = Trace()
    trace.op = op
    # shapes stay unknown: the graph must hold for every shape
    ins = [trace.new_value(TensorDesc(None, d.dtype, d.device)) for d in descs]
    trace.no_grad = frozenset(x.vid for x, r in zip(ins, requires_grad) if not r)
    out_descs = checked_infer_result(op, op.infer(*[x.desc for x in ins]))
    outs = [trace.new_value(TensorDesc(None, d.dtype, d.device)) for d in out_descs]
    grads = [trace.new_value(TensorDesc(None, d.dtype, d.device)) for d in out_descs]
    n_in, n_out = len(ins), len(outs)
    in_grads = _vjp(op, ins, outs, grads) if any(requires_grad) else [None] * n_in
    if len(in_grads) != n_in:
        raise ValueError(f"{op!r}: the VJP returned {len(in_grads)} gradient{'s' * (len(in_grads) != 1)} "
                         f"for {n_in} input{'s' * (n_in != 1)}")
    grad_vids = [g.vid if r and isinstance(g, SymbolicTensor) and x.dtype.kind in "fc" else None
                 for g, r, x in zip(in_grads, requires_grad, ins)]
    graph = _optimise(op, trace, n_in, n_out, grad_vids)
    # gradients the vjp computed for integer or bool inputs (dropped here): check_op fails them
    graph.integer_input_grads = [i for i, (g, x) in enumerate(zip(in_grads, ins))
                                 if isinstance(g, SymbolicTensor) and x.dtype.kind not in "fc"]
    return graph


def _optimise(op, trace: Trace, n_in, n_out, grad_vids) -> BackwardGraph:
    n_graph_inputs = n_in + 2 * n_out
    returned = {v for v in grad_vids if v is not None}
    # dead code elimination
    live = set(returned)
    nodes = []
    for node in reversed(trace.nodes):
        if any(o in live for o in node.outs):
            nodes.append(node)
            live.update(a for a in node.args if isinstance(a, int))
    nodes.reverse()
    # forward values read only for their shape become precomputed carriers
    uses = {}
    for node in nodes:
        for pos, a in enumerate(node.args):
            if isinstance(a, int):
                uses.setdefault(a, []).append((node, pos))
    precomp = []
    descs = list(trace.descs)
    for v in range(n_in + n_out):
        us = uses.get(v)
        if not us or v in returned:
            continue
        if all(pos in node.op.shape_only_inputs for node, pos in us):
            descs.append(descs[v])
            carrier = len(descs) - 1
            precomp.append((v, carrier))
            for node, pos in us:
                args = list(node.args)
                args[pos] = carrier
                node.args = tuple(args)
    used = set(returned)
    for node in nodes:
        used.update(a for a in node.args if isinstance(a, int))
    mask = [v in used for v in range(n_graph_inputs)]
    saved_vids = [v for v in range(n_in + n_out) if mask[v]]
    return BackwardGraph(op, n_in, n_out, descs, mask, [v is not None for v in grad_vids], saved_vids,
                         precomp, nodes, grad_vids)


# ---------------------------------------------------------------- codegen
def _compile(graph: BackwardGraph, device: str):
    n_in, n_out = graph.n_in, graph.n_out
    ns = {"_apply": _core.apply, "_one": _one, "_nd": np.ndarray}
    consts = {}
    raw_consts = []

    def arg(a, tensor_mode):
        if isinstance(a, int):
            return f"v{a}"
        name = f"c{len(consts)}"
        consts[name] = a.value if tensor_mode else _raw_const(a)
        if not tensor_mode:
            raw_consts.append(name)
        return name

    reuse = {} if device != "cpu" else _buffer_reuse(graph, n_in, n_out)

    # one saved value travels bare, not in a 1-tuple (and so does the one
    # gradient of a one-output op, and the result for a one-input op)
    kept = list(graph.saved_vids) + [carrier for _, carrier in graph.precomp]
    one_saved = len(kept) == 1

    def body(tensor_mode):
        lines = []
        for k, v in enumerate(kept):
            lines.append(f"    v{v} = s" if one_saved else f"    v{v} = s[{k}]")
        for k in range(n_out):
            v = n_in + n_out + k
            if graph.save_for_backward[v]:
                # one output: the core passes its gradient itself, not a tuple
                lines.append(f"    v{v} = g" if n_out == 1 else f"    v{v} = g[{k}]")
        for i, node in enumerate(graph.nodes):
            args = ", ".join(arg(a, tensor_mode) for a in node.args)
            outs = ", ".join(f"v{o}" for o in node.outs)
            if tensor_mode:
                ns[f"op{i}"] = node.op
                lines.append(f"    {outs}, = _apply(op{i}, {args})")
            else:
                ns[f"k{i}"] = _kernel(node.op, device)
                if len(node.outs) == 1 and not type(node.op).__module__.startswith("gradcore."):
                    # a plugin kernel may return its one output as a 1-tuple
                    lines.append(f"    {outs} = _one(k{i}({args}))")
                elif len(node.outs) == 1:
                    if i in reuse:
                        # a 0-d result comes back as a NumPy scalar: no buffer to reuse
                        r = f"v{reuse[i]}"
                        lines.append(f"    {outs} = k{i}({args}, {r}) if type({r}) is _nd else k{i}({args})")
                    else:
                        lines.append(f"    {outs} = k{i}({args})")
                else:
                    lines.append(f"    {outs}, = k{i}({args})")
        ret = ", ".join("None" if v is None else f"v{v}" for v in graph.grad_vids)
        lines.append(f"    return {ret}" if n_in == 1 else f"    return ({ret},)")
        return "\n".join(lines)

    src = (f"def run_raw(s, g):\n{body(False)}\n\n"
           f"def run_tensor(s, g):\n{body(True)}\n")
    if device != "cpu":
        # kernels take device arrays: the raw-mode constants go over once
        from gradcore import devices
        for name in raw_consts:
            value = consts[name]
            if isinstance(value, (np.ndarray, np.generic)):
                consts[name] = devices.to_device(np.asarray(value), device, constant=True)
    ns.update(consts)
    code = compile(src, f"<backward of {graph.op!r}>", "exec")
    exec(code, ns)
    if device == "cuda":
        # an all-elementwise graph runs as one fused kernel (gradcore.cuda.fusion)
        from gradcore.cuda.fusion import fused_runner
        fused = fused_runner(graph, kept, one_saved)
        if fused is not None:
            ns["run_raw"] = fused
    cb = _core.CompiledBackward()
    cb.save_index = tuple(graph.saved_vids)
    cb.precomp_index = tuple(src for src, _ in graph.precomp) or None
    cb.one_saved = one_saved
    cb.run_raw = ns["run_raw"]
    cb.run_tensor = ns["run_tensor"]
    cb.input_has_grad = tuple(graph.input_has_grad)
    cb.saves_inputs = any(v < n_in for v in graph.saved_vids)
    cb.any_grad = any(graph.input_has_grad)
    cb.reduce_broadcast = describe(graph.op).reduce_broadcast
    cb.kind = describe(graph.op).traced
    # a graph without nodes only routes output grads to inputs (add, sub's x,
    # broadcast, identity): the core does that without calling Python
    first_grad = n_in + n_out
    if not graph.nodes and all(v is None or v >= first_grad for v in graph.grad_vids):
        cb.passthrough = tuple(-1 if v is None else v - first_grad for v in graph.grad_vids)
    if device == "cpu":
        _program(cb, graph, kept, reuse)
    cb.graph = graph
    graph.source = src
    return cb


def _raw_const(a):
    if isinstance(a.value, (bool, int, float)) and a.dtype is not None:
        # a 0-d array of the dtype the tracer resolved: NumPy converts a
        # Python scalar on every call, which costs as much as the kernel
        return np.asarray(a.value, a.dtype)
    return a.value


def _program(cb, graph, kept, reuse):
    """``run_raw`` as an instruction list that the core runs itself, with no
    Python frame and no argument tuples per node (the frame of a generated
    function costs about as much as a small kernel).

    Registers: the kept saved values, then the output grads, then constants
    and node results. Each node is 6 bytes: (nargs, result register, 3
    argument registers, register whose dead buffer may take the result or
    255). ``prog_ret`` holds the register of each input's gradient (255:
    None). Graphs with a multi-output node or a plugin kernel (which may
    return a 1-tuple) keep the generated ``run_raw``."""
    n_in, n_out = graph.n_in, graph.n_out
    for node in graph.nodes:
        if (len(node.outs) != 1 or len(node.args) > 3
                or not type(node.op).__module__.startswith("gradcore.")):
            return
    reg = {v: k for k, v in enumerate(kept)}
    for k in range(n_out):
        reg[n_in + n_out + k] = len(kept) + k
    regs = [None] * len(reg)
    code, kernels = [], []
    for i, node in enumerate(graph.nodes):
        args = []
        for a in node.args:
            if not isinstance(a, int):
                regs.append(_raw_const(a))
                args.append(len(regs) - 1)
            else:
                args.append(reg[a])
        reg[node.outs[0]] = len(regs)
        regs.append(None)
        out = reg[reuse[i]] if i in reuse else 255
        code += [len(args), reg[node.outs[0]]] + args + [0] * (3 - len(args)) + [out]
        kernels.append(_kernel(node.op, "cpu"))
    if len(regs) >= 255:
        return
    cb.prog_kernels = tuple(kernels)
    cb.prog_code = bytes(code)
    cb.prog_regs = regs
    cb.prog_ret = bytes(255 if v is None else reg[v] for v in graph.grad_vids)
    cb.n_kept = len(kept)
    cb.n_out = n_out


def _buffer_reuse(graph, n_in, n_out):
    """Nodes that may write their result into the buffer of one of their
    arguments (NumPy's positional ``out``): a ufunc whose argument is a fresh
    intermediate of this graph, read nowhere later, of the result's dtype,
    and of the full output shape (so the result, which broadcasts over it,
    has exactly its shape). Full shape: the output grads, the outputs, the
    inputs of a unary elementwise op, and any elementwise result with a
    full-shape argument. Saves an allocation per node on the backward."""
    from gradcore.ops.elemwise import Elemwise
    op = graph.op
    full = set(range(n_in, n_in + 2 * n_out))
    if isinstance(op, Elemwise) and op.nin == 1:
        full.add(0)
    last_use = {a: i for i, node in enumerate(graph.nodes) for a in node.args if isinstance(a, int)}
    returned = {v for v in graph.grad_vids if v is not None}
    fresh, reuse = set(), {}
    for i, node in enumerate(graph.nodes):
        elementwise = isinstance(node.op, Elemwise)
        if elementwise and any(isinstance(a, int) and a in full for a in node.args):
            full.update(node.outs)
        if not (elementwise and isinstance(node.op.cpu, np.ufunc) and len(node.outs) == 1):
            continue
        out_dtype = graph.descs[node.outs[0]].dtype
        for a in node.args:
            if (isinstance(a, int) and a in fresh and a in full and last_use.get(a) == i
                    and a not in returned and graph.descs[a].dtype == out_dtype
                    and sum(1 for b in node.args if b == a) == 1):
                reuse[i] = a
                break
        fresh.update(node.outs)
    return reuse


def _one(res):
    return res[0] if type(res) is tuple or type(res) is list else res


def _kernel(op, device):
    if device == "cpu":
        return op.cpu
    from gradcore import devices
    return devices.kernel_for(op, device)


# ---------------------------------------------------------------- cache
_cache = {}
_stats = {"hits": 0, "misses": 0}
# Bounded: the key holds the op and its attributes, so ops made with a new
# attribute value per step (a plugin op with a float attribute from a
# schedule) would otherwise add a graph (a few KiB) per step for ever. The
# least recently used graphs go first; the core's per-op caches keep the
# compiled graphs they use.
_CACHE_LIMIT = 4096


def _cache_key(op, dtypes, devices, requires_grad):
    return (op, tuple(np.dtype(d).str for d in dtypes), tuple(devices), tuple(bool(r) for r in requires_grad))


def _get(op, descs, requires_grad):
    key = _cache_key(op, [d.dtype for d in descs], [d.device for d in descs], requires_grad)
    hit = _cache.pop(key, None)
    if hit is not None:
        _stats["hits"] += 1
        _cache[key] = hit           # most recently used last
        return hit
    _stats["misses"] += 1
    graph = _derive(op, descs, requires_grad)
    graph.compiled = _compile(graph, descs[0].device if descs else "cpu")
    if len(_cache) >= _CACHE_LIMIT:
        # down to three quarters of the limit, least recently used first
        # (dicts keep insertion order)
        drop = len(_cache) - _CACHE_LIMIT + max(1, _CACHE_LIMIT // 4)
        for k in list(itertools.islice(_cache, drop)):
            _cache.pop(k, None)
    _cache[key] = graph
    return graph


def make_backward_graph(op, input_descs: Sequence[TensorDesc], input_requires_grad: Sequence[bool],
                        output_has_grad: Optional[Sequence[bool]] = None):
    """Derive the backward of ``op`` as a graph of ops.

    Returns ``(backward_graph, save_for_backward_mask, input_has_grad)``; the
    mask runs over (inputs, outputs, output grads).

    Example::

        >>> from gradcore.ops import Elemwise
        >>> d = TensorDesc((3,), "float32", "cpu")
        >>> _, mask, has = make_backward_graph(Elemwise("relu"), [d], [True], [True])
        >>> mask
        [False, True, True]
    """
    descs = [d if isinstance(d, TensorDesc) else TensorDesc(*d) for d in input_descs]
    if len(input_requires_grad) != len(descs):
        raise ValueError(f"{op!r}: {len(descs)} input descs but {len(input_requires_grad)} requires-grad flags")
    graph = _get(op, descs, input_requires_grad)
    mask = list(graph.save_for_backward)
    for k, has in enumerate(() if output_has_grad is None else output_has_grad):
        if not has:
            # a missing output grad is zero-filled at run time: not saved
            mask[graph.n_in + graph.n_out + k] = False
    return graph, mask, list(graph.input_has_grad)


def cache_info():
    """Backward graph cache statistics: hits, misses and size."""
    return {"hits": _stats["hits"], "misses": _stats["misses"], "size": len(_cache)}


def clear_cache():
    _cache.clear()
    _core._clear_front_cache()


# compiled graphs hold a backend's arrays (constants): dropped when the backend changes
_device_events.subscribe("backend_changed", clear_cache)


def _core_backward_graph(op, dtypes, device, rg, n):
    """Hook for the compiled dispatcher: the CompiledBackward for one call."""
    descs = [TensorDesc(None, d, device) for d in dtypes]
    requires = [bool(rg >> i & 1) for i in range(n)]
    return _get(op, descs, requires).compiled


def infer_by_tracing(op, descs):
    """Output descriptors of an op declared by ``decompose``: it is traced on
    symbolic inputs (each op inside checks its own inputs). Installed into
    ``gradcore.op`` at import, which sits below this module."""
    trace = Trace()
    trace.op = op
    ins = [trace.new_value(d) for d in descs]
    res = checked_decompose_result(op, op.decompose(*ins), SymbolicTensor)
    return tuple(r.desc for r in res)


_op_module.install_composite_tracer(infer_by_tracing)
