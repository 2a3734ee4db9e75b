"""The library's size against a base commit, like for like (issue 24's target).

Counts the lines (``wc -l``) of the library, ``gradcore/``, ``ops/`` and
``plugins/`` (.py/.pyx/.pxd, files git tracks), at a base commit and in the
working tree, and splits today's count in two:

- *the code that was there*: every file that existed at the base, plus the
  files split out of those since (a module moved, not added), with everything
  added to them since, whatever it was for;
- *new capabilities*: whole modules that later issues added (named below with
  their issue), which did not exist in any form at the base.

Growth of an old file for a new capability (``interop.py``'s exports to
PyTorch, ``serialization.py``'s checks, ...) stays in the first part: the
split is conservative. Usage::

    python benchmarks/library_size.py                 # against fab1621, issue 24's filing
    python benchmarks/library_size.py --base HEAD~20 --files
"""
from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("gradcore", "ops", "plugins")
SUFFIXES = (".py", ".pyx", ".pxd")
# issue 24 was filed at this commit: "shrinks from today's 26.8k lines"
FILING = "fab1621"

# Modules moved out of a file that existed at the filing (the same code, elsewhere).
SPLIT_FROM = {
    "gradcore/module/module.py": "gradcore/module/__init__.py",
    "gradcore/module/linear.py": "gradcore/module/__init__.py",
    "gradcore/distributed/__init__.py": "gradcore/distributed.py",
    "ops/pool.py": "ops/conv.py",
    "gradcore/cuda/kernels.py": "the kernel sources of ops/*.py (issue 24, item 3)",
}

# Whole new capabilities, by the issue that asked for them.
CAPABILITY = {
    "gradcore/data/": "28: data loading (datasets, samplers, workers, transforms)",
    "gradcore/cpu/": "25: oneDNN CPU backend, BLAS thread scope",
    "gradcore/distributed/functional.py": "29: differentiable collectives",
    "gradcore/distributed/_pending.py": "29: deferred adjoint collectives",
    "ops/rnn.py": "28: recurrent ops (LSTM layer, cells)",
    "ops/loss.py": "28: losses (CTC, fused cross-entropy)",
    "gradcore/functional/rnn.py": "28: recurrent functional forms",
    "gradcore/functional/loss.py": "28: losses",
    "gradcore/module/rnn.py": "28: RNN/LSTM/GRU modules",
    "gradcore/module/attention.py": "28: MultiHeadAttention",
}


def library_files(rev: str | None) -> dict[str, int]:
    """{path: lines} of the library at ``rev`` (None: the working tree)."""
    if rev is None:
        names = subprocess.run(["git", "ls-files", *LIBRARY], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
        return {n: len((ROOT / n).read_bytes().splitlines()) for n in names
                if n.endswith(SUFFIXES) and (ROOT / n).exists()}
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, *LIBRARY], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    out = {}
    for n in names:
        if n.endswith(SUFFIXES):
            text = subprocess.run(["git", "show", f"{rev}:{n}"], cwd=ROOT, capture_output=True, check=True).stdout
            out[n] = len(text.splitlines())
    return out


def capability_of(path: str) -> str | None:
    """The issue and capability a new module belongs to, or None."""
    for prefix, what in CAPABILITY.items():
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return what
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=FILING, help=f"the base commit (default {FILING}, issue 24's filing)")
    ap.add_argument("--files", action="store_true", help="list every file's lines at the base and now")
    args = ap.parse_args()
    base, now = library_files(args.base), library_files(None)
    old = {p: n for p, n in now.items() if p in base or p in SPLIT_FROM}
    unclassified = [p for p in now if p not in old and capability_of(p) is None]
    new = {p: n for p, n in now.items() if p not in old}
    total_old = sum(old.values())
    print(f"library ({', '.join(LIBRARY)}; {', '.join(SUFFIXES)}), lines (wc -l)\n")
    rows = [(f"at {args.base}", sum(base.values()), ""),
            ("now, in all", sum(now.values()), ""),
            ("now, the code that was there (and splits)", total_old, f"{total_old - sum(base.values()):+,} on the base"),
            ("now, new capabilities", sum(new.values()), "")]
    for label, n, note in rows:
        print(f"  {label:45s}{n:>8,}  {note}")
    by_issue: dict[str, int] = {}
    for p, n in new.items():
        what = capability_of(p) or "not classified"
        by_issue[what] = by_issue.get(what, 0) + n
    for what, n in sorted(by_issue.items()):
        print(f"  {'':45s}{n:>8,}    {what}")
    gone = sorted(set(base) - set(now) - set(SPLIT_FROM.values()))
    if gone:
        print(f"\n  removed since the base: {', '.join(gone)}")
    if unclassified:
        print(f"\n  new files not classified (counted as new capabilities above): {', '.join(unclassified)}")
    if args.files:
        print("\n  file, lines at the base -> now")
        for p in sorted(set(base) | set(now)):
            print(f"    {p:55s} {base.get(p, 0):>6} -> {now.get(p, 0):>6}")


if __name__ == "__main__":
    main()
