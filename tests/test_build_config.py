"""The compiled modules' build settings (issue 24, item 7): the Cython
compiler directives are set in one place, setup.py, and each ``.pxd`` file
holds declarations its ``.pyx`` needs and says truthfully who cimports it."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for d in ("gradcore", "ops") for p in (ROOT / d).rglob("*") if p.suffix in (".pyx", ".pxd", ".py")
           and "__pycache__" not in p.parts]
DIRECTIVE_LINE = re.compile(r"^#\s*cython\s*:", re.M)


def _setup_call_keywords():
    tree = ast.parse((ROOT / "setup.py").read_text())
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.endswith("_DIRECTIVES")}


def test_no_source_file_sets_cython_directives():
    assert [p.relative_to(ROOT).as_posix() for p in SOURCES if DIRECTIVE_LINE.search(p.read_text())] == []


def test_setup_py_sets_them_for_every_compiled_module():
    directives = _setup_call_keywords()
    assert set(directives) == {"CORE_DIRECTIVES", "PLAIN_DIRECTIVES"}
    assert all(d["language_level"] == 3 for d in directives.values())
    # the generated module keeps Python semantics: it is also imported uncompiled
    assert set(directives["PLAIN_DIRECTIVES"]) == {"language_level"}
    text = (ROOT / "setup.py").read_text()
    assert text.count("cythonize(") == 2 and text.count("compiler_directives=") == 2
    assert "language_level=" not in text.replace('"language_level"', "")
    # every .pyx and the generated module are built
    built = set(re.findall(r'Extension\("[\w.]+", \["([\w/.]+)"\]', text))
    pyx = {p.relative_to(ROOT).as_posix() for p in SOURCES if p.suffix == ".pyx"}
    assert pyx | {"gradcore/functional/elemwise_table.py"} == built


def _cimports_of(module_stem):
    pattern = re.compile(rf"^\s*(from\s+[\w.]*\b{module_stem}\b\s+cimport|cimport\s+[\w.]*\b{module_stem}\b)", re.M)
    return [p.relative_to(ROOT).as_posix() for p in SOURCES if p.suffix in (".pyx", ".pxd")
            and pattern.search(p.read_text())]


def test_each_pxd_declares_what_its_pyx_needs_and_says_who_cimports_it():
    pxds = [p for p in SOURCES if p.suffix == ".pxd"]
    assert pxds
    for pxd in pxds:
        text = pxd.read_text()
        assert pxd.with_suffix(".pyx").exists(), pxd
        code = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        assert code, f"{pxd.name} declares nothing: a contract in comments belongs in its .pyx"
        cimported_by = _cimports_of(pxd.stem)
        if "No other module cimports" in text:
            assert cimported_by == [], (pxd.name, cimported_by)
        else:
            assert cimported_by and all(m in text for m in cimported_by), \
                f"{pxd.name} must name the modules that cimport it: {cimported_by}"
