"""Every public function and class has a docstring with an example, and
every example runs as a doctest and prints what it shows.

The public API is the public names of the modules below (their ``__all__``,
else every name without a leading underscore) that are functions or
classes defined in gradcore, each object once (under the first name it is
met by); exception classes are exempt. Examples run with ``gc``, ``F``,
``M``, ``optim`` and ``np`` given (the docs' conventions) and import
anything else themselves, in an empty scratch directory they must leave
empty, and with the random generators' states restored afterwards.
"""
import doctest
import importlib
import inspect
import io
import os

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim

MODULES = ["gradcore", "gradcore.functional", "gradcore.functional.nn", "gradcore.functional.vision",
           "gradcore.functional.debug_param", "gradcore.functional.metric",
           "gradcore.module", "gradcore.module.init", "gradcore.optimizer", "gradcore.lr_scheduler",
           "gradcore.autodiff", "gradcore.random", "gradcore.data", "gradcore.data.transform",
           "gradcore.distributed", "gradcore.testing", "gradcore.amp", "gradcore.distributions"]

# examples that need an optional package (not in the test extras): run where it is installed
OPTIONAL = {"gradcore.to_jax": "jax"}

# example lines marked ``# doctest: +SKIP``, per object. Only an example that
# cannot run in a test process (mpirun with several ranks, a GPU) may skip;
# adding one means changing this on purpose.
SKIPPED_LINES = {}

FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS


def public_api():
    """{public name: object}, each object once."""
    found, seen = {}, set()
    for modname in MODULES:
        mod = importlib.import_module(modname)
        names = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
        for n in names:
            obj = getattr(mod, n, None)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if not getattr(obj, "__module__", "").startswith("gradcore"):
                continue
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                continue
            key = (obj.__module__, obj.__qualname__)
            if key not in seen:
                seen.add(key)
                found[f"{modname}.{n}"] = obj
    return found


API = public_api()


def _globals():
    return {"gc": gc, "F": F, "M": M, "optim": optim, "np": np}


def _doctests(name, obj):
    finder = doctest.DocTestFinder(recurse=False)
    return [t for t in finder.find(obj, name, globs=_globals()) if t.examples]


def _skipped(tests):
    return sum(1 for t in tests for ex in t.examples if ex.options.get(doctest.SKIP))


def test_the_public_api_is_collected():
    # the parametrisation below cannot shrink to nothing unnoticed
    assert len(API) >= 300
    for name in ("gradcore.Tensor", "gradcore.GradManager", "gradcore.functional.conv2d",
                 "gradcore.module.Conv2d", "gradcore.optimizer.Adam", "gradcore.data.DataLoader",
                 "gradcore.data.transform.Normalize", "gradcore.distributed.shard",
                 "gradcore.testing.check_op", "gradcore.module.init.xavier_uniform_"):
        assert name in API, name


def test_skipped_example_lines_are_the_listed_ones():
    got = {name: n for name, obj in API.items() if (n := _skipped(_doctests(name, obj)))}
    assert got == SKIPPED_LINES


@pytest.mark.parametrize("name", sorted(API))
def test_public_object_has_a_running_example(name, tmp_path, monkeypatch):
    obj = API[name]
    # its own docstring (inspect.getdoc would fall back to a base class's);
    # a dataclass without one gets its signature as __doc__
    doc = inspect.cleandoc(obj.__doc__ or "")
    assert doc and not doc.startswith(f"{obj.__name__}("), f"{name} has no docstring"
    assert ">>>" in doc, f"{name}'s docstring has no >>> example"
    if inspect.isfunction(obj):
        sig = inspect.signature(obj)
        unhinted = [p.name for p in sig.parameters.values()
                    if p.annotation is inspect.Parameter.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        assert not unhinted, f"{name}: parameters without type hints: {unhinted}"
        assert sig.return_annotation is not inspect.Signature.empty, f"{name}: no return type hint"
    if name in OPTIONAL:
        pytest.importorskip(OPTIONAL[name])
    tests = _doctests(name, obj)
    assert tests, f"{name}: no example found"
    monkeypatch.chdir(tmp_path)
    rng_state, np_state = gc.random.get_rng_state(), np.random.get_state()
    out = io.StringIO()
    try:
        runner = doctest.DocTestRunner(optionflags=FLAGS)
        for t in tests:
            runner.run(t, out=out.write, clear_globs=True)
    finally:
        gc.random.set_rng_state(rng_state)
        np.random.set_state(np_state)
    assert runner.failures == 0, f"{name}'s example:\n{out.getvalue()}"
    assert os.listdir(tmp_path) == [], f"{name}'s example left files behind"
