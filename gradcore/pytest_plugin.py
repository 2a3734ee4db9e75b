"""gradcore's pytest plugin (entry point group ``pytest11``, so it is active
wherever gradcore is installed).

- fixture ``check_op``: a callable running ``gradcore.testing.check_op``
  (the cuda checks on the GPU, else on the host emulator, as ``gradcore
  check`` does) that fails the test with the whole report when any check
  fails, skips it with the reason when a cuda check could not run, and
  returns the report otherwise;
- ``parametrize_ops(dist_or_ops)``: a ready-made test, parametrized over
  every op of an installed distribution (or over the given op classes,
  instances or ``(op, [inputs])`` pairs), each case taken from the op's
  ``examples()``, or generated from its declaration when it has none; an
  entry point of the distribution that failed to load is a failing case of
  its own (``load-<entry point>``). ``dist_or_ops`` may also name an entry
  point, as ``gradcore check`` accepts. A plugin's own suite checks all its
  ops in one line::

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
from typing import Iterable, Union

import pytest

__all__ = ["check_op", "parametrize_ops", "op_cases"]


def _run_check(op, *sample_inputs, **kwargs):
    """check_op where ``gradcore check`` runs it: the cuda checks on the GPU,
    else on the host emulator; a failed check fails the test, a cuda check
    that could not run skips it, with the reason."""
    from gradcore.testing import check_op as _check_op, cuda_for_checks
    if isinstance(op, _LoadFailure):
        pytest.fail(str(op), pytrace=False)
    devices = kwargs.get("devices")
    with cuda_for_checks(devices is None or "cuda" in devices):
        report = _check_op(op, *sample_inputs, **kwargs)
    if not report.ok:
        pytest.fail(f"gradcore.testing.check_op({op!r}): {report}", pytrace=False)
    skipped = [r for r in report.skipped if r.check in ("forward[cuda]", "grad[cuda]")
               and r.message != "not requested"]
    if skipped:
        pytest.skip(f"gradcore.testing.check_op({op!r}): {skipped[0].check} skipped: {skipped[0].message}")
    return report


@pytest.fixture
def check_op():
    """``check_op(op, *sample_inputs, devices=None, atol=..., rtol=...)``:
    runs ``gradcore.testing.check_op`` and fails the test with the report
    when a check fails; returns the report."""
    return _run_check


class _LoadFailure:
    """A case standing for an entry point of the distribution that failed
    to load: its test fails with the error (``gradcore check`` fails it too)."""

    def __init__(self, failure):
        self.failure = failure

    def __str__(self):
        f = self.failure
        return f"gradcore plugin {f.dist!r}: entry point {f.entry_point!r} failed to load: {f.error}"


def _ops_of_dist(dist: str) -> list:
    """The op classes a distribution (or the entry point named ``dist``)
    registered, then a ``_LoadFailure`` per entry point of it that failed."""
    from gradcore import registry
    _norm = registry._norm
    dist = registry.entry_point_dists().get(dist, dist)
    entries = [e for e in registry.entries() if _norm(e.dist) == _norm(dist)]
    failed = [_LoadFailure(f) for f in registry.failures() if _norm(f.dist) == _norm(dist)]
    if not entries and not failed:
        known = sorted({e.dist for e in registry.entries()} | set(registry.entry_point_dists().values()))
        raise pytest.UsageError(f"no gradcore ops are registered by a distribution or entry point named "
                                f"{dist!r} (known: {', '.join(known)})")
    return [e.cls for e in entries] + failed


def op_cases(dist_or_ops: Union[str, Iterable]) -> list:
    """``pytest.param(op, inputs, id=...)`` for every example of every op:
    ``dist_or_ops`` is a distribution (or entry point) name or an iterable
    of op classes, op instances or ``(op, [inputs])`` pairs; an entry point
    of the distribution that failed to load is a case that fails. An op without ``examples()``
    becomes one case with ``inputs`` None: check_op generates its inputs."""
    from gradcore.testing import op_examples
    items = _ops_of_dist(dist_or_ops) if isinstance(dist_or_ops, str) else list(dist_or_ops)
    params = []
    for item in items:
        if isinstance(item, _LoadFailure):
            params.append(pytest.param(item, None, id=f"load-{item.failure.name or item.failure.entry_point}"))
            continue
        if isinstance(item, tuple):
            op, inputs = item[0], list(item[1])
            params.append(pytest.param(op, inputs, id=_id(op)))
            continue
        examples = op_examples(item)
        if not isinstance(item, type):
            examples = [e for e in examples if e[0] == item] or examples[:1]
            examples = [(item,) + tuple(e[1:]) for e in examples]
        if not examples:
            # inputs generated by check_op from the op's declaration (or a
            # failure saying what to add when none can be built): never a skip
            params.append(pytest.param(item, None, id=f"{_id(item)}-generated"))
            continue
        for k, ex in enumerate(examples):
            params.append(pytest.param(ex[0], list(ex[1]), id=f"{_id(ex[0])}-{k}"))
    return params


def _id(op) -> str:
    from gradcore.op import op_label
    from gradcore.testing import _op_short_name
    name = _op_short_name(op) if isinstance(op, type) else op_label(op)
    return re.sub(r"\s+", "", name)[:80]


def parametrize_ops(dist_or_ops: Union[str, Iterable], **check_kwargs):
    """A test function checking every op of ``dist_or_ops`` with
    ``check_op``, one test case per example; assign it to a ``test_`` name.
    ``check_kwargs`` go to ``gradcore.testing.check_op`` (atol, rtol, ...)."""
    params = op_cases(dist_or_ops)

    @pytest.mark.parametrize("op, inputs", params)
    def test_gradcore_op(op, inputs):
        _run_check(op, *(inputs or ()), **check_kwargs)

    return test_gradcore_op
