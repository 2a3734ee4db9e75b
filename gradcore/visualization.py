"""``gradcore.visualize(y)``: a Graphviz picture of the backward graph
recorded behind ``y`` (this module is ``gradcore.visualization``).

One box per recorded op (its name, the gradient path it uses, what it
saved for backward), arrows in the forward direction (input -> op ->
output) labelled with the shape and dtype where known, the attached tensors
(the ones a GradManager differentiates for) highlighted in blue and ``y``
in orange. One cluster per recording (GradManager) that tracks ``y``.

Shapes: the tape keeps what the backward needs, not every shape; an edge
whose tensor no backward reads shows ``?`` unless the graph was recorded
inside ``record_details()`` (anomaly mode without the NaN checks), which
keeps each op's input and output shapes and the place its forward was
called (shown as the box's tooltip).

Returns a ``graphviz.Digraph`` (``pip install gradcore[viz]``): ``.source``
is the DOT text, always available; ``.render(format="svg")`` and
``.pipe()`` need Graphviz's ``dot`` program.

Example::

    >>> gm = GradManager().attach([w])                       # doctest: +SKIP
    >>> with gm, gradcore.record_details():                 # doctest: +SKIP
    ...     loss = F.relu(x @ w).sum()
    ...     gradcore.visualize(loss, {"w": w}).render("graph", format="svg")
    ...     gm.backward(loss)
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from . import _core
from .anomaly import detect_anomaly
from .op import op_label

ATTACHED_COLOR, OUTPUT_COLOR, OP_COLOR = "lightblue", "orange", "white"
NL = "\\n"      # DOT's centred line break (the graphviz package keeps backslashes as they are)


def record_details() -> detect_anomaly:
    """A context manager: ops recorded inside keep their input/output shapes
    and forward call site for ``visualize`` (anomaly mode without checks).

    Example::

        >>> x = gc.tensor([1.0, 2.0]); gm = gc.GradManager().attach([x])
        >>> with gm, gc.record_details():
        ...     y = F.relu(x).sum()
        ...     dot = gc.visualize(y, {"x": x}).source     # the boxes carry shapes and call sites
        ...     gm.backward(y)
        >>> "relu" in dot, "(2,)" in dot
        (True, True)
    """
    return detect_anomaly(check_nan=False)


def _meta_text(shape, dtype) -> str:
    if shape is None:
        return "?"
    text = "(" + ", ".join(str(int(n)) for n in shape) + ("," if len(shape) == 1 else "") + ")"
    return text if dtype is None else f"{text} {np.dtype(dtype)}"


def _value_meta(v):
    data = v._data if isinstance(v, _core.Tensor) else v
    shape, dtype = getattr(data, "shape", None), getattr(data, "dtype", None)
    return (tuple(shape), dtype) if shape is not None else None


def _edge_meta(nodes):
    """slot id -> (shape, dtype) from everything the tape knows."""
    meta = {}

    def learn(slot, shape, dtype):
        if slot is None or shape is None:
            return
        old = meta.get(slot)
        if old is None or (old[1] is None and dtype is not None):
            meta[slot] = (tuple(shape), dtype)

    for seq, op, path, ins, outs, in_shapes, out_meta, saved, info in nodes:
        known = ([(ins, info.inputs), (outs, info.outputs)] if info is not None else []) + \
            ([(outs, out_meta)] if out_meta is not None else [])
        for slots, metas in known:
            for slot, (shape, dtype) in zip(slots, metas):
                learn(slot, shape, dtype)
        if saved is not None:
            index, values, one = saved
            values = (values,) if one else tuple(values)[:len(index)]
            for i, v in zip(index, values):
                m = _value_meta(v)
                if m is None or m[0] != tuple(getattr(v, "shape", m[0])) or _is_carrier(v):
                    continue
                slot = ins[i] if i < len(ins) else outs[i - len(ins)] if i - len(ins) < len(outs) else None
                learn(slot, *m)
        if in_shapes is not None:
            for slot, shape in zip(ins, in_shapes):
                learn(slot, shape, None)
    return meta


def _is_carrier(v) -> bool:
    data = v._data if isinstance(v, _core.Tensor) else v
    return isinstance(data, np.ndarray) and data.ndim > 0 and all(s == 0 for s in data.strides) and data.size > 1


def _saved_text(saved, n_inputs) -> str:
    if saved is None:
        return "saves: what its rule keeps"
    index = saved[0]
    if not index:
        return "saves: nothing"
    names = [f"in{i}" if i < n_inputs else f"out{i - n_inputs}" for i in index]
    return "saves: " + ", ".join(names)


def _escape(text: str) -> str:
    # the graphviz package quotes labels but leaves backslashes to DOT
    return text.replace("\\", "\\\\")


def visualize(y: "_core.Tensor", params: Optional[Dict[str, "_core.Tensor"]] = None,
              graph_attr: Optional[dict] = None) -> Any:
    """The recorded backward graph behind ``y`` as a ``graphviz.Digraph``
    (see the module docstring). ``params`` names tensors (e.g.
    ``dict(net.named_parameters())``) so attached ones are labelled.

    Example::

        >>> x = gc.tensor([1.0, 2.0]); gm = gc.GradManager().attach([x])
        >>> with gm:
        ...     y = (x * x).sum()
        ...     g = gc.visualize(y, {"x": x})     # a graphviz.Digraph; .source is its DOT text
        ...     gm.backward(y)
        >>> "mul" in g.source, "Reduce" in g.source
        (True, True)
    """
    try:
        import graphviz
    except ImportError as exc:
        raise ImportError("gradcore.visualize needs the graphviz package: pip install gradcore[viz] "
                          f"(or pip install graphviz) ({exc})") from None
    if not isinstance(y, _core.Tensor):
        raise TypeError(f"gradcore.visualize: y must be a Tensor, got {type(y).__name__}")
    params = dict(params or {})
    names = list(params)
    records = _core._recorded_graph(y, tuple(params[n] for n in names))
    dot = graphviz.Digraph("gradcore", graph_attr={"rankdir": "TB", **(graph_attr or {})},
                           node_attr={"shape": "box", "fontname": "Helvetica", "fontsize": "11"},
                           edge_attr={"fontname": "Helvetica", "fontsize": "9"})
    if not records:
        dot.node("empty", f"{_meta_text(y.shape, y.dtype)}: not recorded by any active GradManager",
                 shape="note")
        return dot
    for k, (key_name, y_slot, nodes, leaves, named_slots) in enumerate(records):
        with dot.subgraph(name=f"cluster_{k}") as sub:
            sub.attr(label=f"recording {k}: {key_name}", style="dashed")
            _draw(sub, f"k{k}_", y, y_slot, nodes, set(leaves), dict(zip(named_slots, names)))
    return dot


def _draw(g, prefix, y, y_slot, nodes, leaves, slot_names):
    producer = {}
    for node in nodes:
        for slot in node[4]:
            producer[slot] = node
    # the part of the tape behind y
    wanted, todo, seen_slots = {}, [y_slot], set()
    while todo:
        slot = todo.pop()
        if slot in seen_slots:
            continue
        seen_slots.add(slot)
        node = producer.get(slot)
        if node is not None and node[0] not in wanted:
            wanted[node[0]] = node
            todo.extend(s for s in node[3] if s is not None)
    meta = _edge_meta(list(wanted.values()))
    meta[y_slot] = (tuple(y.shape), y.dtype)

    def slot_node(slot):
        return f"{prefix}t{abs(hash(slot))}"

    y_label = slot_names.get(y_slot, "y")
    g.node(slot_node(y_slot), f"{y_label}{NL}{_meta_text(*meta[y_slot])}", shape="ellipse", style="filled",
           fillcolor=OUTPUT_COLOR)
    drawn_leaves = set()
    for seq in sorted(wanted):
        _, op, path, ins, outs, in_shapes, out_meta, saved, info = wanted[seq]
        name = op_label(op)
        no_grad = sum(1 for s in ins if s is None)
        lines = [f"#{seq} {name}", f"grad path: {path}", _saved_text(saved, len(ins))]
        if no_grad:
            lines.append(f"{no_grad} of {len(ins)} inputs without gradient")
        attrs = {"style": "filled", "fillcolor": OP_COLOR}
        if info is not None and info.stack:
            frame = info.stack[-1]
            attrs["tooltip"] = _escape(f"forward called at {frame.filename}:{frame.lineno} {frame.line or ''}")
        op_id = f"{prefix}op{seq}"
        g.node(op_id, NL.join(_escape(line) for line in lines), **attrs)
        for j, slot in enumerate(ins):
            if slot is None:
                continue
            src = producer.get(slot)
            if src is not None and src[0] in wanted:
                out_index = src[4].index(slot)
                label = _meta_text(*meta.get(slot, (None, None)))
                if len(src[4]) > 1:
                    label = f"out{out_index}: {label}"
                g.edge(f"{prefix}op{src[0]}", op_id, label=f"{label} -> in{j}")
            else:                       # an attached tensor (or a leaf of an older recording)
                tid = slot_node(slot)
                if slot not in drawn_leaves:
                    drawn_leaves.add(slot)
                    attached = slot in leaves
                    title = slot_names.get(slot, "attached" if attached else "input")
                    g.node(tid, f"{_escape(title)}{NL}{_meta_text(*meta.get(slot, (None, None)))}", shape="ellipse",
                           style="filled", fillcolor=ATTACHED_COLOR if attached else "lightgrey")
                g.edge(tid, op_id, label=f"in{j}")
        if y_slot in outs:
            g.edge(op_id, slot_node(y_slot))
