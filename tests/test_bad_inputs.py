"""The catalogue of bad inputs: each one must be refused with a clear
exception of the expected type whose message names the function or op.

Every case runs in a child process (a crash, such as a segfault in a kernel,
must not take the test run with it, and is reported as the case's
failure); cases are batched, a batch per child process, so the catalogue
costs a few interpreter starts, not one per case. A child that dies
mid-batch is restarted on the cases after the one that killed it; a case
that hangs is killed after a timeout. The test fails on a crash, a hang, a
silent acceptance, an exception of another type, or a message that does not
name the function."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

# (id, code, expected exception type names (any of), regex the message must match:
# it names the function / op)
CASES = [
    # ---- making tensors
    ("tensor-None", "gc.tensor(None)", ["TypeError"], r"Tensor.*None"),
    ("Tensor-None", "gc.Tensor(None)", ["TypeError"], r"Tensor.*None"),
    ("Parameter-None", "gc.Parameter(None)", ["TypeError"], r"Tensor.*None"),
    ("tensor-str-array", "gc.tensor(np.array(['a', 'b']))", ["TypeError"], r"Tensor.*<U1"),
    ("tensor-str-list", "gc.tensor(['a', 'b'])", ["TypeError"], r"Tensor.*<U1"),
    ("tensor-str", "gc.tensor('abc')", ["TypeError"], r"Tensor.*str"),
    ("tensor-object-array", "gc.tensor(np.array([object(), 1], dtype=object))", ["TypeError"], r"Tensor.*object"),
    ("tensor-ragged-list", "gc.tensor([[1.0], [1.0, 2.0]])", ["TypeError"], r"Tensor.*list"),
    ("tensor-complex-array", "gc.tensor(np.array([1 + 2j], np.complex64))", ["TypeError"], r"Tensor.*complex64"),
    ("tensor-complex-scalar", "gc.tensor(1 + 2j)", ["TypeError"], r"Tensor.*complex"),
    ("tensor-complex-dtype", "gc.tensor([1.0], dtype='complex64')", ["TypeError"], r"Tensor.*complex64"),
    ("tensor-object-dtype", "gc.tensor([1], dtype=object)", ["TypeError"], r"Tensor.*object"),
    ("tensor-datetime", "gc.tensor(np.array(['2020-01-01'], 'datetime64[D]'))", ["TypeError"], r"Tensor.*datetime"),
    ("astype-complex", "gc.tensor([1.0]).astype('complex64')", ["TypeError"], r"astype.*complex64"),
    # ---- operands that are not tensors
    ("exp-None", "F.exp(None)", ["TypeError"], r"exp.*None"),
    ("exp-complex-array", "F.exp(np.array([1j]))", ["TypeError"], r"exp.*complex"),
    ("exp-str", "F.exp('a')", ["TypeError"], r"exp.*str"),
    ("add-str", "gc.tensor([1.0]) + 'a'", ["TypeError"], r"add.*str"),
    ("add-str-array", "gc.tensor([1.0]) + np.array(['a'])", ["TypeError"], r"add.*<U1"),
    ("mul-object-array", "gc.tensor([1.0]) * np.array([object()], dtype=object)", ["TypeError"], r"mul.*object"),
    ("add-complex", "gc.tensor([1.0]) + 1j", ["TypeError"], r"add.*complex"),
    ("add-complex-list", "gc.tensor([1.0]) + [1j]", ["TypeError"], r"add.*complex"),
    ("matmul-None", "F.matmul(gc.tensor(np.ones((2, 2))), None)", ["TypeError"], r"matmul"),
    ("linear-str", "F.linear(gc.tensor(np.ones((2, 2))), 'w')", ["TypeError"], r"linear"),
    ("bool-sub", "gc.tensor([True]) - gc.tensor([False])", ["TypeError"], r"sub.*bool"),
    ("bool-floordiv", "gc.tensor([True]) // gc.tensor([True])", ["TypeError"], r"floor_div.*bool"),
    ("uint64-with-int8", "gc.tensor(np.array([1], np.uint64)) + gc.tensor(np.array([1], np.int8))",
     ["TypeError"], r"add.*uint64.*int8"),
    # ---- sizes and axes
    ("reshape-float-size", "F.reshape(gc.tensor(np.zeros(6)), (2.0, 3))", ["TypeError"], r"reshape"),
    ("reshape-float-size-method", "gc.tensor(np.zeros(6)).reshape((2.0, 3))", ["TypeError"], r"reshape"),
    ("reshape-str-size", "gc.tensor(np.zeros(6)).reshape('a', 3)", ["TypeError"], r"reshape"),
    ("reshape-two-minus-one", "gc.tensor(np.zeros(6)).reshape(-1, -1)", ["ValueError"], r"[Rr]eshape"),
    ("reshape-wrong-size", "gc.tensor(np.zeros(6)).reshape(4, 2)", ["ValueError"], r"[Rr]eshape"),
    ("sum-float-axis", "F.sum(gc.tensor(np.zeros((2, 3))), axis=0.5)", ["TypeError"], r"sum.*axis"),
    ("sum-str-axis", "F.sum(gc.tensor(np.zeros((2, 3))), axis='a')", ["TypeError"], r"sum.*axis"),
    ("sum-axis-out-of-range", "F.sum(gc.tensor(np.zeros((2, 3))), axis=2)", ["ValueError"], r"sum.*axis 2"),
    ("sort-float-axis-tensor", "F.sort(gc.tensor(np.zeros((2, 3))), axis=gc.tensor(1.0))", ["TypeError"], r"sort"),
    ("split-decreasing", "F.split(gc.tensor(np.zeros((2, 6))), [4, 2], axis=1)", ["ValueError"],
     r"Split.*\(4, 2\)"),
    ("split-beyond", "F.split(gc.tensor(np.zeros((2, 6))), [2, 7], axis=1)", ["ValueError"], r"Split.*\(2, 7\)"),
    ("split-too-many", "F.split(gc.tensor(np.zeros((2, 6))), 7, axis=1)", ["ValueError"], r"Split.*7"),
    ("split-zero", "F.split(gc.tensor(np.zeros((2, 6))), 0, axis=1)", ["ValueError"], r"Split.*0"),
    ("split-float", "F.split(gc.tensor(np.zeros((2, 6))), [2.5], axis=1)", ["TypeError"], r"split"),
    ("ones-float-shape", "F.ones((2.5,))", ["TypeError"], r"ones"),
    ("zeros-None-shape", "F.zeros(None)", ["TypeError"], r"zeros"),
    # ---- indices
    ("index-float", "gc.tensor(np.zeros(3))[1.5]", ["IndexError"], r"Subtensor.*float"),
    ("index-float-list", "gc.tensor(np.zeros(3))[[1.0, 2.0]]", ["IndexError"], r"Subtensor.*float"),
    ("index-float-tensor", "gc.tensor(np.zeros(3))[gc.tensor([1.0])]", ["IndexError"], r"Subtensor.*float"),
    ("index-str", "gc.tensor(np.zeros(3))['a']", ["IndexError"], r"Subtensor"),
    ("index-out-of-range", "gc.tensor(np.zeros(3))[3]", ["IndexOpError"], r"Subtensor.*out of"),
    ("index-advanced-out-of-range", "gc.tensor(np.zeros(3))[[0, 3]]", ["IndexOpError"], r"Subtensor.*out of"),
    ("setitem-out-of-range", "t = gc.tensor(np.zeros(3)); t[5] = 1.0", ["IndexOpError"], r"out of"),
    ("setitem-str-value", "t = gc.tensor(np.zeros(3)); t[0] = 'a'", ["ValueError", "TypeError"], r"setitem"),
    ("setitem-complex-value", "t = gc.tensor(np.zeros(3)); t[0] = 1j", ["TypeError"], r"setitem"),
    ("gather-out-of-range", "F.gather(gc.tensor(np.zeros((2, 3))), 1, gc.tensor([[0, 3], [1, 1]]))",
     ["IndexOpError"], r"Gather.*out of range"),
    ("gather-negative-out-of-range", "F.gather(gc.tensor(np.zeros((2, 3))), 1, gc.tensor([[0, -4], [1, 1]]))",
     ["IndexOpError"], r"Gather.*out of range"),
    ("gather-float-index", "F.gather(gc.tensor(np.zeros((2, 3))), 1, gc.tensor([[0.0, 1.0], [1.0, 1.0]]))",
     ["TypeError", "ValueError"], r"[Gg]ather"),
    ("scatter-out-of-range", "x = gc.tensor(np.zeros((2, 3))); F.scatter(x, 1, gc.tensor([[0, 5]] * 2), x[:, :2])",
     ["IndexOpError"], r"Scatter.*out of range"),
    ("one-hot-negative", "F.indexing_one_hot(gc.tensor(np.zeros((2, 3))), gc.tensor([0, -1]), 1)",
     ["IndexOpError"], r"IndexingOneHot.*-1"),
    ("one-hot-out-of-range", "F.indexing_one_hot(gc.tensor(np.zeros((2, 3))), gc.tensor([0, 3]), 1)",
     ["IndexOpError"], r"IndexingOneHot.*3"),
    ("cross-entropy-label-out-of-range", "F.cross_entropy(gc.tensor(np.zeros((2, 3))), gc.tensor([0, 3]))",
     ["IndexError"], r"cross_entropy"),
    # ---- shapes
    ("add-shapes", "gc.tensor(np.zeros(3)) + gc.tensor(np.zeros(4))", ["ValueError"], r"add.*\(3,\).*\(4,\)"),
    ("matmul-shapes", "F.matmul(gc.tensor(np.zeros((2, 3))), gc.tensor(np.zeros((2, 3))))", ["ValueError"],
     r"MatrixMul.*inner"),
    ("conv-int", "F.conv2d(gc.tensor(np.ones((1, 1, 3, 3), 'int32')), gc.tensor(np.ones((1, 1, 2, 2), 'int32')))",
     ["ValueError"], r"conv2d: Convolution.*int32"),
    ("linear-module-shape", "M.Linear(3, 2)(gc.tensor(np.zeros((2, 4))))", ["ValueError"], r"Linear"),
]

BATCH = 32          # cases per child process
TIMEOUT = 120       # seconds per batch

_CHILD = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import numpy as np
    import gradcore as gc
    import gradcore.functional as F
    import gradcore.module as M
    for case_id, code in json.loads(sys.stdin.read()):
        print(json.dumps({"start": case_id}), flush=True)
        try:
            exec(code, {"gc": gc, "F": F, "M": M, "np": np})
            result = {"id": case_id, "raised": None}
        except BaseException as exc:
            result = {"id": case_id, "raised": type(exc).__name__,
                      "types": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
        print(json.dumps(result), flush=True)
""")


def _run_batch(cases):
    """{case id: result} for ``cases`` run in child processes: a child that
    crashes or hangs takes only the case it was running with it."""
    results, todo = {}, list(cases)
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    while todo:
        proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        try:
            out, err = proc.communicate(json.dumps([(c[0], c[1]) for c in todo]), timeout=TIMEOUT)
            hung = False
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            hung = True
        started = None
        for line in out.splitlines():
            msg = json.loads(line)
            if "start" in msg:
                started = msg["start"]
            else:
                results[msg["id"]] = msg
                started = None
        done = {c[0] for c in todo if c[0] in results}
        if started is not None:
            # the case the child was running when it died or hung
            what = "hung" if hung else f"crashed (exit status {proc.returncode})"
            results[started] = {"id": started, "crash": f"{what}: {err[-2000:]}"}
            done.add(started)
        elif len(done) < len(todo):
            # died before starting a case (e.g. at import): every remaining case fails with it
            for c in todo:
                if c[0] not in done:
                    results[c[0]] = {"id": c[0], "crash": f"child failed (exit {proc.returncode}): {err[-2000:]}"}
            break
        todo = [c for c in todo if c[0] not in done]
    return results


@pytest.fixture(scope="module")
def outcomes():
    results = {}
    for start in range(0, len(CASES), BATCH):
        results.update(_run_batch(CASES[start:start + BATCH]))
    return results


def test_case_ids_are_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case_id, code, types, needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_clearly(outcomes, case_id, code, types, needle):
    import re
    res = outcomes[case_id]
    assert "crash" not in res, f"{code}: {res.get('crash')}"
    assert res["raised"] is not None, f"{code}: accepted silently"
    assert any(t in res["types"] for t in types), f"{code}: raised {res['raised']} ({res['message']}), expected {types}"
    assert re.search(needle, res["message"]), f"{code}: message does not name the function: {res['message']!r}"


def test_the_runner_reports_a_crash_and_a_silent_acceptance():
    """The harness itself: a case that kills its process is reported as a
    crash, the cases after it still run, an accepted one is seen as such."""
    res = _run_batch([("ok", "1 + 1", [], ""), ("boom", "import os; os.abort()", [], ""),
                      ("after", "raise ValueError('f: x')", [], "")])
    assert res["ok"]["raised"] is None
    assert "crash" in res["boom"]
    assert res["after"]["raised"] == "ValueError"
