"""Random programs against PyTorch: seeded sequences of elementwise ops,
reductions, matmuls and index assignments (with broadcasting of the value,
extra leading size-1 dims included), values and gradients of every input in
float64. Each program is small; the seeds are fixed so a failure replays."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager

N_PROGRAMS = 60
N_STEPS = 12
SHAPE = (3, 4)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _index_and_value_shape(rng):
    """An index into a (3, 4) tensor and a value shape that broadcasts to the
    indexed part, sometimes with extra leading size-1 dims."""
    kind = rng.integers(0, 5)
    if kind == 0:
        index, part = (slice(0, 1),), (1, 4)
    elif kind == 1:
        index, part = (slice(None), slice(1, 3)), (3, 2)
    elif kind == 2:
        index, part = (1,), (4,)
    elif kind == 3:
        index, part = (slice(None), 2), (3,)
    else:
        index, part = ([0, 2],), (2, 4)
    # broadcast some axes of the value (size 1), and maybe add leading 1s
    value = tuple(1 if rng.random() < 0.4 else n for n in part)
    value = (1,) * int(rng.integers(0, 3)) + value
    return index, value


def _program(rng):
    """A list of steps, each ``(kind, args)`` over registers 0..k."""
    steps = []
    n_regs = 2
    for _ in range(N_STEPS):
        kind = ["binary", "unary", "reduce", "matmul", "setitem", "setitem"][int(rng.integers(0, 6))]
        a, b = int(rng.integers(0, n_regs)), int(rng.integers(0, n_regs))
        if kind == "binary":
            steps.append(("binary", (["add", "sub", "mul", "maximum"][int(rng.integers(0, 4))], a, b)))
        elif kind == "unary":
            steps.append(("unary", (["tanh", "sin", "sigmoid", "square"][int(rng.integers(0, 4))], a)))
        elif kind == "reduce":
            steps.append(("reduce", (["sum", "mean", "max"][int(rng.integers(0, 3))], int(rng.integers(0, 2)), a)))
        elif kind == "matmul":
            steps.append(("matmul", (a, b)))
        else:
            index, value_shape = _index_and_value_shape(rng)
            steps.append(("setitem", (a, index, value_shape, int(rng.integers(0, 1 << 30)))))
        n_regs += 1
    return steps


def _run(steps, lib, x0, x1, values):
    """Run the program with ``lib`` ("gc" or a torch module); every register
    holds a (3, 4) tensor; returns the final scalar."""
    is_gc = lib == "gc"
    regs = [x0, x1]
    for (kind, args) in steps:
        if kind == "binary":
            mode, a, b = args
            x, y = regs[a], regs[b]
            if is_gc:
                out = {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
                       "maximum": lambda: F.maximum(x, y)}[mode]()
            else:
                out = {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
                       "maximum": lambda: lib.maximum(x, y)}[mode]()
        elif kind == "unary":
            mode, a = args
            x = regs[a]
            if mode == "square":
                out = x * x
            elif is_gc:
                out = getattr(F, mode)(x)
            else:
                out = getattr(lib, mode)(x)
        elif kind == "reduce":
            mode, axis, a = args
            x = regs[a]
            if is_gc:
                red = getattr(F, mode)(x, axis=axis, keepdims=True)
            else:
                red = x.amax(dim=axis, keepdim=True) if mode == "max" else getattr(x, mode)(dim=axis, keepdim=True)
            out = x * 0.5 + red          # back to (3, 4)
        elif kind == "matmul":
            a, b = args
            x, y = regs[a], regs[b]
            out = (F.matmul(x, y, transpose_b=True) if is_gc else x @ y.T)   # (3, 3)
            out = (F.matmul(out, y) if is_gc else out @ y) * 0.1                # (3, 4)
        else:
            a, index, value_shape, seed = args
            value = values[(seed, value_shape)]
            out = regs[a] * 1.0
            out[index] = value
        regs.append(out)
    total = regs[-1]
    for r in regs[2:-1]:
        total = total + r * 0.01
    return (total * total).sum() if is_gc else (total * total).sum()


@pytest.mark.parametrize("seed", range(N_PROGRAMS))
def test_random_program_values_and_gradients_match_torch(torch, seed):
    rng = np.random.default_rng(seed)
    steps = _program(rng)
    x0_np, x1_np = rng.uniform(-1, 1, SHAPE), rng.uniform(-1, 1, SHAPE)
    values_np = {}
    for kind, args in steps:
        if kind == "setitem":
            _, _, value_shape, vseed = args
            values_np[(vseed, value_shape)] = np.random.default_rng(vseed).uniform(-1, 1, value_shape)

    gx = [gc.tensor(x0_np), gc.tensor(x1_np)]
    gvals = {k: gc.tensor(v) for k, v in values_np.items()}
    gm = GradManager().attach(gx + list(gvals.values()))
    with gm:
        y = _run(steps, "gc", gx[0], gx[1], gvals)
        gm.backward(y)

    tx = [torch.tensor(x0_np, requires_grad=True), torch.tensor(x1_np, requires_grad=True)]
    tvals = {k: torch.tensor(v, requires_grad=True) for k, v in values_np.items()}
    ty = _run(steps, torch, tx[0], tx[1], tvals)
    ty.backward()

    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    for got, t in [(g.grad, t) for g, t in zip(gx, tx)] + [(gvals[k].grad, tvals[k]) for k in values_np]:
        want = t.grad
        if want is None or got is None:
            # an input the result does not depend on: None on one side, None or zeros on the other
            assert all(v is None or not np.asarray(v.numpy() if hasattr(v, "numpy") else v).any()
                       for v in (got, want)), steps
            continue
        assert got.shape == tuple(want.shape), steps       # a value's gradient in its own shape
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-12)


def test_the_programs_cover_index_assignment_with_broadcasting():
    """Not a check of gradcore: that the generator really produces the
    cases (value broadcast on an axis, extra leading size-1 dims)."""
    broadcast, leading = 0, 0
    for seed in range(N_PROGRAMS):
        for kind, args in _program(np.random.default_rng(seed)):
            if kind == "setitem":
                value_shape = args[2]
                broadcast += 1 in value_shape
                leading += len(value_shape) > 2 or (len(value_shape) == 2 and args[1] in ((1,), (slice(None), 2)))
    assert broadcast > 20 and leading > 20
