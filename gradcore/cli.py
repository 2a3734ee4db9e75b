"""The ``gradcore`` command.

    gradcore ops        list every registered op: package, devices, gradient path
    gradcore demo ...   run the demo (python -m gradcore.demo)

Exit codes: 0 success, 1 a check failed (e.g. a plugin failed to load), 2 usage.
"""
from __future__ import annotations

import sys
from typing import List, Optional


def _ops() -> int:
    from . import registry
    entries = registry.entries()
    width = max([len(e.name) for e in entries] + [4])
    print(f"{'op':<{width}}  {'package':<12}  {'devices':<10}  gradient path")
    for e in entries:
        print(f"{e.name:<{width}}  {e.dist:<12}  {','.join(e.devices):<10}  {e.grad_path}")
    failures = registry.failures()
    for f in failures:
        print(f"FAILED plugin {f.dist} ({f.entry_point}): {f.error}")
    return 1 if failures else 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "ops":
        return _ops()
    if cmd == "demo":
        from . import demo
        return demo.main(rest)
    print(f"gradcore: unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
