"""Writes gradcore/functional/elemwise_table.py: one ``def`` per row of
ops/elemwise.py's TABLE (``F.exp``, ``F.add``, ...), each with type hints and
a docstring whose example output is computed here.

The examples show Python lists of values rounded to a few decimals
(``.numpy().astype(float).round(4).tolist()``), never NumPy's printing of an
array: the text is then the same under every NumPy the project supports
(NumPy's float32 printing and its last-digit results for some functions
differ between versions), and each example still runs as a doctest. A value
that sits so close to a rounding boundary that a last-bit difference could
move it is shown with fewer decimals.

Run it after changing the table::

    python -m gradcore.functional._gen_elemwise_table

tests/test_functional_layout.py fails while the checked-in file differs from
what this writes. The generated module is also compiled by setup.py (Cython,
pure-Python mode): a compiled ``def`` costs no Python frame, so ``F.exp`` costs
what the former ``_core.OpFunction`` wrapper did (benchmarks/README.md)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

OUT = Path(__file__).with_name("elemwise_table.py")
HAND_WRITTEN = ("where",       # elemwise.py: it checks that its mask is a bool tensor
                "atan2")       # elemwise.py: MegEngine names its inputs (y, x)
_CANDIDATES = (-1.5, -0.5, 0.5, 1.0, 1.5, 2.5)
_DECIMALS = 4
# a float32 result may differ in its last bits between NumPy builds: a shown
# value must stay the same for any result within this relative distance
_WOBBLE = 2e-6           # about 16 float32 ulps: more than NumPy builds differ by


def _rows():
    from gradcore.ops import elemwise
    return [r for r in elemwise.TABLE if r.mode not in HAND_WRITTEN]


def digest(rows=None) -> str:
    """A digest of the rows the generated functions come from: the compiled
    module carries it too, so a stale build is caught (the test compares)."""
    from gradcore.ops.elemwise import _arity
    rows = _rows() if rows is None else rows
    text = "\n".join(f"{r.mode}:{_arity(r)}:{r.numpy}:{r.out_dtype}" for r in rows)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _sample(row, k: int, nin: int) -> list:
    """Example inputs: bools for the logical rows, else two values inside
    the row's gradcheck domain."""
    if row.mode.startswith("logical_"):
        return [[True, True, False], [True, False, False]][k] if nin > 1 else [True, False]
    lo, hi = row.domain
    inside = [v for v in _CANDIDATES if lo < v < hi] or [(lo + hi) / 2]
    if k == 0 or len(inside) < 3:
        values = [inside[0], inside[-1]] if len(inside) > 1 else inside * 2
        return values if k == 0 else values[::-1]
    return inside[1:3]


def _decimals(values, mode: str) -> int:
    """The most decimals (up to _DECIMALS) at which every value rounds the
    same way wherever its last bits land."""
    for decimals in range(_DECIMALS, -1, -1):
        if all(round(v * (1 - _WOBBLE), decimals) == round(v * (1 + _WOBBLE), decimals) == round(v, decimals)
               for v in values):
            return decimals
    raise ValueError(f"F.{mode}'s example values {values} cannot be shown stably: change _CANDIDATES")


def shown(values, decimals: int) -> list:
    """``values`` as the example prints them: Python floats rounded to
    ``decimals`` (what ``.astype(float).round(decimals).tolist()`` gives).

    Example::

        >>> shown([0.6666667, 1.5], 4)
        [0.6667, 1.5]
    """
    out = [round(float(v), decimals) for v in values]
    if any(v == 0 and str(v).startswith("-") for v in out):
        # the sign of a zero may differ between builds
        raise ValueError(f"an example value rounds to -0.0 ({values}): change _CANDIDATES")
    return out


def _example(row, nin: int) -> tuple:
    import gradcore as gc
    from gradcore._core import apply1
    from gradcore.ops.elemwise import Elemwise
    inputs = [_sample(row, k, nin) for k in range(nin)]
    out = apply1(Elemwise(row.mode), *[gc.tensor(v) for v in inputs]).numpy()
    call = ", ".join(f"gc.tensor({v!r})" for v in inputs)
    if out.dtype == np.bool_:
        return f">>> F.{row.mode}({call}).numpy().tolist()", repr([bool(v) for v in out.tolist()])
    values = [float(v) for v in out.tolist()]
    decimals = _decimals(values, row.mode)
    return (f">>> F.{row.mode}({call}).numpy().astype(float).round({decimals}).tolist()",
            repr(shown(values, decimals)))


# MegEngine names these functions' input ``inp`` (megengine.functional.nn),
# the others ``x``, ``y``: a keyword call works as it does there
_PARAM_NAMES = {"softplus": ("inp",), "logsigmoid": ("inp",)}


def _function(row, nin: int) -> str:
    names = _PARAM_NAMES.get(row.mode, tuple("xyz"[:nin]))
    params = ", ".join(f"{n}: Tensor" for n in names)
    call, result = _example(row, nin)
    what = "true where" if row.out_dtype == "bool" else "elementwise"
    return (f'def {row.mode}({params}) -> Tensor:\n'
            f'    """{what.capitalize()} ``{row.numpy}``: the ``Elemwise("{row.mode}")`` op\n'
            f'    (kernels and gradient in ops/elemwise.py); numbers are accepted as inputs too.\n\n'
            f'    Example::\n\n'
            f'        {call}\n'
            f'        {result}\n'
            f'    """\n'
            f'    return _apply1(_OP_{row.mode.upper()}, {", ".join(names)})\n')


def render() -> str:
    from gradcore.ops.elemwise import _arity
    rows = _rows()
    ops = "\n".join(f'_OP_{r.mode.upper()} = Elemwise("{r.mode}")' for r in rows)
    functions = "\n\n".join(_function(r, _arity(r)) for r in rows)
    return f'''# Generated by gradcore/functional/_gen_elemwise_table.py from ops/elemwise.py's TABLE.
# Do not edit: change the table, then run
#     python -m gradcore.functional._gen_elemwise_table
# (tests/test_functional_layout.py fails while this file is out of date).
# setup.py compiles this module (Cython): a compiled def costs no Python frame per call.
"""The elementwise functions of gradcore.functional, one per row of the
table in ops/elemwise.py (``where`` is written by hand in elemwise.py).

Example::

    >>> F.mul(gc.tensor([1.0, 2.0]), 3.0).numpy().tolist()
    [3.0, 6.0]
"""
from __future__ import annotations

from .._core import Tensor, apply1 as _apply1
from ..ops.elemwise import Elemwise

TABLE_DIGEST = "{digest(rows)}"

# one op instance per row: the per-op caches stay warm
{ops}


{functions}'''


def main() -> None:
    OUT.write_text(render())
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
