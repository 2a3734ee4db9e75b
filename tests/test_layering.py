"""The module layering (issue 14, item 5; issue 24, item 6): gradcore's
modules import each other without loops, and the device layer
(``gradcore.cuda``, ``gradcore.cpu``, ``gradcore.devices``' backends) sits
below the engine: it imports nothing from ``graph``, ``functional``, ``tensor_methods``, ``op``,
``core``, ``autodiff`` or the op library. Imports inside functions count: a
lazy import is still a dependency.

A package's ``__init__`` counts as a module like any other: ``import
gradcore.ops`` runs ``ops/__init__.py``, so the package imports every module
its ``__init__`` imports, and a module that imports the package (``from
gradcore.ops import X``, or a function of the package) depends on all of
them. Only the parent packages Python imports implicitly before a submodule
are not edges (every submodule would otherwise loop with its package). Built
from the sources with ``ast`` (the Cython ``.pyx`` files by their
``import``/``cimport`` lines)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# gradcore's package directories: ``gradcore.ops`` is installed from ops/
PACKAGES = {"gradcore": ROOT / "gradcore", "gradcore.ops": ROOT / "ops"}
DEVICE_LAYER = ("gradcore.cuda", "gradcore.cpu")
ENGINE = ("gradcore.graph", "gradcore.functional", "gradcore.tensor_methods", "gradcore.op", "gradcore.core",
          "gradcore.autodiff", "gradcore.ops", "gradcore._core", "gradcore.module", "gradcore.optimizer")


def module_files(packages=PACKAGES):
    """module name -> source file, for every module of gradcore (or of
    ``packages``: package name -> its directory)."""
    found = {}
    for pkg, root in packages.items():
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


def _longest_module(name, modules):
    """The longest gradcore module ``name`` names, or "" (not gradcore's)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _from_import(base, names, modules):
    """``from base import n1, n2``: ``base.n`` where that is a module (``from
    . import sibling`` depends on the sibling), else ``base`` itself, whose
    ``__init__`` defines or re-exports the name."""
    found = set()
    for n in names:
        found.add(f"{base}.{n}" if f"{base}.{n}" in modules else _longest_module(base, modules))
    return found


def imports_of(module, path, modules):
    """The gradcore modules ``module`` imports (anywhere in its file)."""
    is_package = path.stem == "__init__"
    found = set()
    if path.suffix == ".pyx":
        for frm, names, plain in _PYX_IMPORT.findall(path.read_text()):
            if plain:
                found.add(_longest_module(plain, modules))
                continue
            level = len(frm) - len(frm.lstrip("."))
            base = _resolve(module, level, frm.lstrip("."), is_package)
            found |= _from_import(base, [n.strip() for n in names.split(",") if n.strip()], modules)
    else:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {_longest_module(a.name, modules) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, node.level, node.module or "", is_package)
                found |= _from_import(base, [a.name for a in node.names], modules)
    # importing gradcore.ops.conv runs gradcore/ops/__init__.py first: every
    # package on the way is imported too, except the importer's own
    # ancestors, which Python has imported before the importer itself
    for target in list(found):
        parts = target.split(".")
        for k in range(1, len(parts)):
            package = ".".join(parts[:k])
            if package in modules and not module.startswith(package + "."):
                found.add(package)
    found.discard("")
    found.discard(module)
    return found


def import_graph(packages=PACKAGES):
    modules = module_files(packages)
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


def test_the_graph_sees_the_known_edges():
    graph = import_graph()
    assert "gradcore.cuda.runtime" in graph["gradcore.cuda"]
    # package -> own module, module -> the packages on the way to another module
    assert "gradcore.functional.shape" in graph["gradcore.functional"]
    assert {"gradcore.ops", "gradcore.ops.shape"} <= graph["gradcore.functional.shape"]
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
    device = {m: ts for m, ts in graph.items() if m.startswith(DEVICE_LAYER)}
    assert find_cycle(device) is None, find_cycle(device)


def test_there_are_no_import_cycles():
    # layers import downward only; where a lower layer must know of a higher
    # one it offers a hook the higher one fills at import (graph ->
    # op.install_composite_tracer, tensor_methods -> graph.install_method_lookup,
    # ops -> cuda.runtime.install_standard_ops and registry.provide_standard_library,
    # optimizer -> lr_scheduler.accept_optimizer_class)
    # package -> own-module edges count (see the module docstring)
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _toy_package(tmp_path, files):
    root = tmp_path / "toy"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return import_graph({"toy": root})


def test_a_module_reading_its_own_package_is_a_loop(tmp_path):
    # the shape of gradcore.module.conv's former ``from . import Module``:
    # the package's __init__ imports conv, and conv reads a name the
    # package's __init__ defines
    graph = _toy_package(tmp_path, {"__init__.py": "from .conv import Conv\nclass Module: pass\n",
                                    "conv.py": "from . import Module\nclass Conv(Module): pass\n"})
    assert graph["toy"] == {"toy.conv"} and graph["toy.conv"] == {"toy"}
    assert find_cycle(graph) == ["toy", "toy.conv", "toy"]


def test_a_lazy_import_through_a_package_is_a_loop(tmp_path):
    # the shape of the former functional.shape -> tensor_methods -> functional
    # loop: both imports inside functions, one of them of a package
    graph = _toy_package(tmp_path, {
        "__init__.py": "",
        "functional/__init__.py": "from .shape import transpose\n",
        "functional/shape.py": "def transpose(x):\n    from ..methods import dimshuffle\n    return dimshuffle(x)\n",
        "methods.py": "def dimshuffle(x):\n    from . import functional\n    return functional\n"})
    assert find_cycle(graph) == ["toy.functional", "toy.functional.shape", "toy.methods", "toy.functional"]


def test_importing_a_submodule_imports_the_packages_on_the_way(tmp_path):
    # the shape of the former graph -> ops -> ops.kernel_families -> graph loop:
    # ``from toy.ops.shape import X`` runs toy/ops/__init__.py first
    graph = _toy_package(tmp_path, {
        "__init__.py": "",
        "graph.py": "def f():\n    from toy.ops.shape import cast\n",
        "ops/__init__.py": "from . import shape, families\n",
        "ops/shape.py": "cast = 1\n",
        "ops/families.py": "def g():\n    from toy.graph import f\n"})
    assert graph["toy.graph"] == {"toy.ops", "toy.ops.shape"}
    assert find_cycle(graph) == ["toy.graph", "toy.ops", "toy.ops.families", "toy.graph"]


def test_a_module_importing_its_sibling_through_the_package_is_no_edge_to_the_package(tmp_path):
    # ``from . import sibling`` names a module: Python imports the package
    # before either, so that is no loop
    graph = _toy_package(tmp_path, {"__init__.py": "from . import a, b\n",
                                    "a.py": "from . import b\n", "b.py": "x = 1\n"})
    assert graph == {"toy": {"toy.a", "toy.b"}, "toy.a": {"toy.b"}, "toy.b": set()}
    assert find_cycle(graph) is None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_import_gradcore_leaves_tool_modules_for_later():
    """`import gradcore` (every standard op, the cpu and the cuda layers)
    does not import what only a compile, a plugin lookup or a library search
    needs: together they were half of its import time (121 -> 55 ms)."""
    import subprocess
    import sys
    # what the interpreter already had (a site-packages `.pth` file may
    # import some of these at startup) is not gradcore's doing
    code = ("import sys; before = set(sys.modules); import gradcore; "
            "print(sorted(m for m in ('importlib.metadata', 'subprocess', 'tempfile', 'concurrent.futures', "
            "'ctypes.util') if m in sys.modules and m not in before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
