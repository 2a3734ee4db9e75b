"""The module layering (issue 14, item 5): gradcore's modules import each
other without loops, and the device layer (``gradcore.cuda``, ``gradcore.devices``'
backends) sits below the engine: it imports nothing from ``graph``,
``functional``, ``tensor_methods``, ``op``, ``core``, ``autodiff`` or the op
library. Imports inside functions count: a lazy import is still a dependency.
Built from the sources with ``ast`` (the Cython ``.pyx`` files by their
``import``/``cimport`` lines)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# gradcore's package directories: ``gradcore.ops`` is installed from ops/
PACKAGES = {"gradcore": ROOT / "gradcore", "gradcore.ops": ROOT / "ops"}
DEVICE_LAYER = ("gradcore.cuda",)
ENGINE = ("gradcore.graph", "gradcore.functional", "gradcore.tensor_methods", "gradcore.op", "gradcore.core",
          "gradcore.autodiff", "gradcore.ops", "gradcore._core", "gradcore.module", "gradcore.optimizer")


def module_files():
    """module name -> source file, for every module of gradcore."""
    found = {}
    for pkg, root in PACKAGES.items():
        for path in sorted(root.rglob("*")):
            if path.suffix not in (".py", ".pyx") or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([pkg, *parts])
            if name.startswith("gradcore.ops") and pkg == "gradcore":
                continue
            found[name] = path
    return found


def _resolve(module, level, name, is_package):
    if level == 0:
        return name
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


_PYX_IMPORT = re.compile(r"^\s*(?:from\s+(\.*[\w.]*)\s+c?import\s+([\w, ]+)|c?import\s+([\w.]+))", re.M)


def imports_of(module, path, modules):
    """The gradcore modules ``module`` imports (anywhere in its file)."""
    is_package = path.stem == "__init__"
    targets = []
    if path.suffix == ".pyx":
        for frm, names, plain in _PYX_IMPORT.findall(path.read_text()):
            if plain:
                targets.append(plain)
                continue
            level = len(frm) - len(frm.lstrip("."))
            base = _resolve(module, level, frm.lstrip("."), is_package)
            targets += [base] + [f"{base}.{n.strip()}" for n in names.split(",")]
    else:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, node.level, node.module or "", is_package)
                targets += [base] + [f"{base}.{a.name}" for a in node.names]
    found = set()
    for t in targets:
        # the longest gradcore module the name refers to (a module, or a name in one)
        while t and t not in modules:
            t = t.rpartition(".")[0]
        if t and t != module:
            found.add(t)
    return found


def import_graph():
    modules = module_files()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def find_cycle(graph):
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = "done"
        return None
    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def _is_package_parent(a, b):
    """``gradcore.cuda`` importing ``gradcore.cuda.runtime`` is a package
    importing its own modules: not a loop with them."""
    return b.startswith(a + ".") or a.startswith(b + ".")


def test_the_graph_sees_the_known_edges():
    graph = import_graph()
    assert "gradcore.cuda.runtime" in graph["gradcore.cuda"]
    assert "gradcore.cuda._launch" in graph["gradcore.cuda.runtime"]
    assert "gradcore.ops.elemwise" in graph["gradcore.functional"] or \
        any(m.startswith("gradcore.ops") for m in graph.get("gradcore.functional", ()))


def test_the_device_layer_imports_no_engine_module():
    graph = import_graph()
    bad = {m: sorted(t for t in ts if t.startswith(ENGINE))
           for m, ts in graph.items() if m.startswith(DEVICE_LAYER)}
    bad = {m: ts for m, ts in bad.items() if ts}
    assert not bad, f"the device layer imports engine modules: {bad}"


def test_the_device_layer_is_in_no_import_cycle():
    # it imports no engine module (above), so a loop would lie inside it
    graph = import_graph()
    device = {m: {t for t in ts if not _is_package_parent(m, t)}
              for m, ts in graph.items() if m.startswith(DEVICE_LAYER)}
    assert find_cycle(device) is None, find_cycle(device)


def test_there_are_no_import_cycles():
    # layers import downward only; where a lower layer must know of a higher
    # one it offers a hook the higher one fills at import (graph ->
    # op.install_composite_tracer, tensor_methods -> graph.install_method_lookup,
    # ops -> cuda.runtime.install_standard_ops and registry.provide_standard_library,
    # optimizer -> lr_scheduler.accept_optimizer_class)
    graph = import_graph()
    # a package's __init__ imports its modules, and they import each other
    # through the package name: drop package<->own-module edges
    pruned = {m: {t for t in ts if not _is_package_parent(m, t)} for m, ts in graph.items()}
    cycle = find_cycle(pruned)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
