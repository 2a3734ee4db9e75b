"""gradcore's pytest plugin (entry point group ``pytest11``, so it is active
wherever gradcore is installed).

- fixture ``check_op``: a callable running ``gradcore.testing.check_op``
  that fails the test with the whole report when any check fails, and
  returns the report otherwise;
- ``parametrize_ops(dist_or_ops)``: a ready-made test, parametrized over
  every op of an installed distribution (or over the given op classes,
  instances or ``(op, [inputs])`` pairs), each case taken from the op's
  ``examples()``. A plugin's own suite checks all its ops in one line::

      from gradcore.pytest_plugin import parametrize_ops

      test_my_ops = parametrize_ops("my-gradcore-ops")

  ``op_cases(dist_or_ops)`` gives the same cases as ``pytest.param``s
  ``(op, inputs)`` for a test of one's own::

      @pytest.mark.parametrize("op, inputs", op_cases("my-gradcore-ops"))
      def test_mine(op, inputs, check_op):
          check_op(op, *inputs)
"""
from __future__ import annotations

import re
from typing import Iterable, List, Union

import pytest

__all__ = ["check_op", "parametrize_ops", "op_cases"]


def _run_check(op, *sample_inputs, **kwargs):
    from gradcore.testing import check_op as _check_op
    report = _check_op(op, *sample_inputs, **kwargs)
    if not report.ok:
        pytest.fail(f"gradcore.testing.check_op({op!r}): {report}", pytrace=False)
    return report


@pytest.fixture
def check_op():
    """``check_op(op, *sample_inputs, devices=None, atol=..., rtol=...)``:
    runs ``gradcore.testing.check_op`` and fails the test with the report
    when a check fails; returns the report."""
    return _run_check


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _ops_of_dist(dist: str) -> List[type]:
    from gradcore import registry
    entries = [e for e in registry.entries() if _norm(e.dist) == _norm(dist)]
    if not entries:
        failed = [f for f in registry.failures() if _norm(f.dist) == _norm(dist)]
        if failed:
            raise pytest.UsageError(f"gradcore plugin {dist!r} failed to load: {failed[0].error}")
        known = sorted({e.dist for e in registry.entries()})
        raise pytest.UsageError(f"no gradcore ops are registered by a distribution named {dist!r} "
                                f"(distributions with ops: {', '.join(known)})")
    return [e.cls for e in entries]


def op_cases(dist_or_ops: Union[str, Iterable]) -> list:
    """``pytest.param(op, inputs, id=...)`` for every example of every op:
    ``dist_or_ops`` is a distribution name or an iterable of op classes, op
    instances or ``(op, [inputs])`` pairs. An op without ``examples()``
    becomes one case that is skipped, saying so."""
    from gradcore.testing import op_examples
    items = _ops_of_dist(dist_or_ops) if isinstance(dist_or_ops, str) else list(dist_or_ops)
    params = []
    for item in items:
        if isinstance(item, tuple):
            op, inputs = item[0], list(item[1])
            params.append(pytest.param(op, inputs, id=_id(op)))
            continue
        examples = op_examples(item)
        if not isinstance(item, type):
            examples = [e for e in examples if e[0] == item] or examples[:1]
            examples = [(item,) + tuple(e[1:]) for e in examples]
        if not examples:
            cls = item if isinstance(item, type) else type(item)
            params.append(pytest.param(item, None, id=_id(item), marks=pytest.mark.skip(
                reason=f"{cls.__name__} has no examples(): add a classmethod examples() returning "
                       f"[(op_instance, [input arrays]), ...]")))
            continue
        for k, ex in enumerate(examples):
            params.append(pytest.param(ex[0], list(ex[1]), id=f"{_id(ex[0])}-{k}"))
    return params


def _id(op) -> str:
    from gradcore.testing import _op_label, _op_short_name
    name = _op_short_name(op) if isinstance(op, type) else _op_label(op)
    return re.sub(r"\s+", "", name)[:80]


def parametrize_ops(dist_or_ops: Union[str, Iterable], **check_kwargs):
    """A test function checking every op of ``dist_or_ops`` with
    ``check_op``, one test case per example; assign it to a ``test_`` name.
    ``check_kwargs`` go to ``gradcore.testing.check_op`` (atol, rtol, ...)."""
    params = op_cases(dist_or_ops)

    @pytest.mark.parametrize("op, inputs", params)
    def test_gradcore_op(op, inputs):
        _run_check(op, *inputs, **check_kwargs)

    return test_gradcore_op
