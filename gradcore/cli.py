"""The ``gradcore`` command.

    gradcore ops           list every registered op: package, devices, gradient path
    gradcore check DIST    run gradcore.testing.check_op on every op (and check_grad_rule
                           on every grad rule) of an installed distribution or entry
                           point; inputs from examples() or generated; a table
                           op | check | status (gradcore check --help)
    gradcore doctor        the compiled core, NumPy and its BLAS, PyCUDA, GPU, nvcc,
                           mpi4py, and the registry (ops per distribution, failed plugins)
    gradcore demo ...      run the demo (python -m gradcore.demo)

Exit codes: 0 success, 1 a check failed (e.g. a plugin failed to load, an op
failed check_op or had no check run), 2 usage (e.g. an unknown distribution).
"""
from __future__ import annotations

import collections
import sys
from typing import List, Optional


def _ops() -> int:
    entries, failures = _quiet_registry()
    width = max([len(e.name) for e in entries] + [4])
    pwidth = max([len(e.dist) for e in entries] + [12])
    print(f"{'op':<{width}}  {'package':<{pwidth}}  {'devices':<10}  gradient path")
    for e in entries:
        print(f"{e.name:<{width}}  {e.dist:<{pwidth}}  {','.join(e.devices):<10}  {e.grad_path}")
    for f in failures:
        print(f"FAILED plugin {f.dist} ({_entry_point_label(f)}): {f.error}")
    return 1 if failures else 0


def _entry_point_label(failure) -> str:
    """"name = module:function" of a failed entry point (its value alone when the name is unknown)."""
    return f"{failure.name} = {failure.entry_point}" if failure.name else failure.entry_point


def _entry_point_hint(dist: str) -> str:
    """Why an installed distribution registers nothing: its entry points are
    in another group (a typo of ``gradcore.ops``), or it has none."""
    from importlib import metadata
    from .registry import GROUP
    try:
        groups = sorted({ep.group for ep in metadata.distribution(dist).entry_points})
    except metadata.PackageNotFoundError:
        return ""
    found = f"it declares {', '.join(repr(g) for g in groups)}" if groups else "it declares none"
    return (f". The distribution {dist!r} is installed, but registers ops only through an entry point in "
            f"the group {GROUP!r} ([project.entry-points.\"{GROUP}\"] in pyproject.toml); "
            f"{found}")


def _quiet_registry():
    """(entries, failures), without the registry's RuntimeWarnings: the
    commands print each failure themselves."""
    import warnings
    from . import registry
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return registry.entries(), registry.failures()


CHECK_HELP = """usage: gradcore check DIST|OP [--devices cpu,cuda] [--seed N] [--torch]

Run gradcore.testing.check_op on every op the installed distribution DIST
registers, and check_grad_rule on every grad rule it registers for ops it
does not own. DIST is the distribution's name (gradcore-fused-act, or
gradcore for the standard library) or the name of its entry point in the
group gradcore.ops (fused_act, standard), or the name of one registered op
(MyCube: that op alone).

Inputs come from each op's examples(), else are generated from its
declaration (arity, infer, check_params/check_shapes/domain hints) with a
fixed seed (--seed, default 0) that every failure reports. Each op is
checked on the devices it declares; without a GPU, cuda values and
gradients run on the host emulator (GRADCORE_CUDA=emulator) when a C++
compiler is present. --devices limits the devices checked (--devices cuda
still compares the cuda values with the cpu kernel's, the reference).

Statuses: passed; failed; skipped (could not run for a reason outside the
op author's control: no GPU and no emulator, no nvcc, not requested);
not applicable (nothing to test: not differentiable, no cuda kernel...).

--torch compares each op's PyTorch form (gradcore.to_torch) with its
native form instead: values (float64 and float32) and first-order
gradients (float64) on the same inputs (gradcore.interop.check_torch);
it needs PyTorch installed.

Exit status 1 when a plugin of DIST failed to load, a check failed, or an
op had no check run (everything skipped or not applicable); 2 for a usage
error (unknown DIST); 0 otherwise."""


def _parse_check_args(args: List[str]):
    dist, devices, seed = None, None, 0
    it = iter(args)
    for a in it:
        if a in ("-h", "--help"):
            return "help"
        if a == "--devices" or a.startswith("--devices="):
            text = a.split("=", 1)[1] if "=" in a else next(it, "")
            devices = [d.strip() for d in text.split(",") if d.strip()]
        elif a == "--seed":
            seed = int(next(it, "0"))
        elif a.startswith("-") or dist is not None:
            return None
        else:
            dist = a
    return None if dist is None else (dist, devices, seed)


def _check(args: List[str]) -> int:
    from . import registry
    torch_form = "--torch" in args
    args = [a for a in args if a != "--torch"]
    parsed = _parse_check_args(args)
    if parsed == "help":
        print(CHECK_HELP)
        return 0
    if parsed is None:
        print(CHECK_HELP.splitlines()[0], file=sys.stderr)
        return 2
    dist, devices, seed = parsed
    entries, failures = _quiet_registry()
    norm = registry._norm
    dist = registry.entry_point_dists().get(dist, dist)
    mine = [e for e in entries if norm(e.dist) == norm(dist)]
    failed = [f for f in failures if norm(f.dist) == norm(dist)]
    rules = [(c, r) for c, r in registry.grad_rules(dist) if not any(e.cls is c for e in mine)]
    if not mine and not failed and not rules:
        # the name of one registered op: that op alone (an author iterating on one op of a package)
        mine = [e for e in entries if e.name == dist]
    if not mine and not failed and not rules:
        known = sorted({e.dist for e in entries} | set(registry.entry_point_dists().values()))
        print(f"gradcore check: no op is named {dist!r}, and no ops or grad rules are registered by a "
              f"distribution or entry point of that name; known: {', '.join(known) or 'none'}{_entry_point_hint(dist)}", file=sys.stderr)
        return 2
    if torch_form:
        return _check_torch(dist, mine, failed, seed)
    from .testing import cuda_for_checks
    with cuda_for_checks(devices is None or "cuda" in devices) as where_cuda:
        report = _check_all(mine, failed, rules, devices, seed)
    print(report.table())
    n_skip = len(report.skipped)
    reasons = sorted({r.message.split(":")[0] for r in report.skipped})
    print(f"\n{dist}: {len(mine)} op(s), {len(rules)} grad rule(s); {len(report.passed)} check(s) passed, "
          f"{len(report.failed)} failed, {n_skip} skipped{' (' + '; '.join(reasons) + ')' if reasons else ''}, "
          f"{len(report.not_applicable)} not applicable; cuda: {where_cuda}; seed {seed}")
    return 0 if report.ok else 1


def _check_torch(dist, mine, failed, seed) -> int:
    """``gradcore check --torch DIST``: each op's to_torch form against its native form."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"gradcore check --torch: PyTorch does not import ({exc}); pip install torch", file=sys.stderr)
        return 2
    from .interop import check_torch
    report = _run_checks(mine, failed, "torch", lambda cls: check_torch(cls, seed=seed),
                         ("torch", "no check ran (nothing to compare)"))
    print(report.table())
    print(f"\n{dist}: {len(mine)} op(s) compared with their PyTorch form; {len(report.passed)} check(s) "
          f"passed, {len(report.failed)} failed, {len(report.not_applicable)} not applicable; seed {seed}")
    return 0 if report.ok else 1


def _run_checks(mine, failed, check: str, run, nothing_ran: tuple):
    """A report: each failed plugin, then ``run(cls)``'s report of each op
    (an exception fails ``check``; no check that ran fails ``nothing_ran``,
    (check, message))."""
    from .testing import CheckReport, CheckResult
    report = CheckReport([CheckResult(f"<plugin {f.dist}>", "load", "failed", f.error) for f in failed])
    for e in mine:
        try:
            sub = run(e.cls)
        except Exception as exc:
            report.results.append(CheckResult(e.name, check, "failed", f"{type(exc).__name__}: {exc}"))
            continue
        for r in sub.results:
            r.op = e.name
        if not sub.passed and sub.ok:
            sub.results.append(CheckResult(e.name, nothing_ran[0], "failed", nothing_ran[1]))
        report.extend(sub)
    return report


def _check_all(mine, failed, rules, devices, seed):
    from .testing import check_grad_rule, check_op
    report = _run_checks(mine, failed, "check_op", lambda cls: check_op(cls, devices=devices, seed=seed),
                         ("any", "no check ran (every check skipped or not applicable)"))
    for cls, rule in rules:
        report.extend(check_grad_rule(cls, rule, seed=seed))
    return report


def _doctor(args: List[str]) -> int:
    import os
    import platform
    import shutil
    import subprocess
    if args:
        print("usage: gradcore doctor", file=sys.stderr)
        return 2
    problems: List[str] = []

    def line(key, value):
        print(f"{key:<18} {value}")

    line("python", f"{platform.python_version()} ({sys.executable})")
    # the compiled core
    try:
        from . import _core
        path = _core.__file__
        build = []
        src_c = os.path.join(os.path.dirname(path), "_core.c")
        if os.path.exists(src_c):
            with open(src_c) as fh:
                head = fh.readline().strip()
            build.append(head.strip("/* ").strip())
        import datetime
        build.append("built " + datetime.datetime.fromtimestamp(os.path.getmtime(path)).strftime("%Y-%m-%d %H:%M"))
        import sysconfig
        build.append(f"ABI {sysconfig.get_config_var('SOABI')}")
        line("compiled core", path)
        line("core build", ", ".join(build))
    except Exception as exc:
        line("compiled core", f"BROKEN: {type(exc).__name__}: {exc}")
        problems.append("the compiled core does not import (pip install -e . rebuilds it)")
    # NumPy and BLAS
    try:
        import numpy as np
        line("numpy", f"{np.__version__} ({os.path.dirname(np.__file__)})")
        line("BLAS", _blas_info(np))
    except Exception as exc:
        line("numpy", f"BROKEN: {exc}")
        problems.append("NumPy does not import")
    # host memory pool
    try:
        from . import memory
        st = memory.stats()
        line("host memory pool", ("on" if memory.is_enabled() else "off (GRADCORE_HOST_POOL=0)")
             + f", {st['cached_bytes'] >> 20} MiB cached of {st['limit'] >> 20} MiB, "
               f"{st['hits']} hits / {st['misses']} misses")
    except Exception as exc:
        line("host memory pool", f"BROKEN: {type(exc).__name__}: {exc}")
        problems.append("the host memory pool does not load (pip install -e . rebuilds it)")
    # oneDNN: which path the CPU convolutions, pooling and batch norm take, and why
    try:
        from .cpu import onednn
        line("oneDNN (cpu)", onednn.status())
    except Exception as exc:
        line("oneDNN (cpu)", f"unknown ({type(exc).__name__}: {exc}); the NumPy kernels run")
    # the BLAS scope of the recurrent layers' small per-step products
    try:
        from .cpu import blas
        line("BLAS scope", blas.status())
    except Exception as exc:
        line("BLAS scope", f"unknown ({type(exc).__name__}: {exc}); NumPy's BLAS threads are left alone")
    # CUDA
    try:
        import pycuda
        line("PyCUDA", f"importable, {getattr(pycuda, 'VERSION_TEXT', '')} ({os.path.dirname(pycuda.__file__)})")
    except Exception as exc:
        line("PyCUDA", f"not importable ({type(exc).__name__}: {exc}); optional: pip install gradcore[cuda]")
    try:
        from . import devices
        if devices.is_cuda_available():
            from .cuda import runtime
            be = runtime.backend()
            gpu = f"available: {be.name} ({be.driver.kind}, {getattr(be.driver, 'arch', '')})"
        else:
            gpu = f"unavailable: {devices.cuda_unavailable_reason()}"
    except Exception as exc:
        gpu = f"unknown ({type(exc).__name__}: {exc})"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            names = "; ".join(l.strip() for l in out.stdout.splitlines() if l.strip())
            if names:
                gpu += f" (nvidia-smi: {names})"
        except Exception:
            pass
    line("GPU (cuda device)", gpu)
    # cuDNN: found (no GPU needed), and which path the convolutions take
    try:
        from .cuda import cudnn
        found = cudnn.version()
        line("cuDNN", f"{found} ({cudnn.load_library().path})" if found else
             "not found; optional: pip install nvidia-cudnn-cu13 (gradcore[cuda] brings it)")
        if devices.is_cuda_available():
            from .cuda import runtime
            line("convolutions", cudnn.status(runtime.backend()))
        else:
            line("convolutions", "on cuda: no cuda device here")
    except Exception as exc:
        line("cuDNN", f"unknown ({type(exc).__name__}: {exc})")
    from .testing import nvcc_path
    nvcc = nvcc_path()
    if nvcc:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
            ver = [l for l in out.stdout.splitlines() if "release" in l]
            line("nvcc", f"{nvcc} ({ver[-1].strip() if ver else 'version unknown'})")
        except Exception as exc:
            line("nvcc", f"{nvcc} (does not run: {exc})")
    else:
        line("nvcc", "not found (CUDA sources are not compile-checked)")
    # MPI
    try:
        import mpi4py
        from mpi4py import MPI
        line("mpi4py", f"{mpi4py.__version__}, MPI: {MPI.Get_library_version().splitlines()[0].strip()}")
    except Exception as exc:
        line("mpi4py", f"not available ({type(exc).__name__}: {exc}); optional: pip install gradcore[distributed]")
    # registry
    try:
        entries, failures = _quiet_registry()
        per = collections.Counter(e.dist for e in entries)
        line("registry", f"{len(entries)} op(s) from {len(per)} distribution(s)")
        for dist, n in sorted(per.items()):
            line("", f"{dist}: {n} op(s)")
        if "gradcore" not in per:
            problems.append("the standard op library registered no ops")
        for f in failures:
            line("", f"FAILED plugin {f.dist} ({_entry_point_label(f)}): {f.error}")
            problems.append(f"plugin {f.dist!r} failed to load")
    except Exception as exc:
        line("registry", f"BROKEN: {type(exc).__name__}: {exc}")
        problems.append("the registry does not load")
    print()
    if problems:
        print("problems:")
        for p in problems:
            print(f"  - {p}")
        return 1
    print("healthy")
    return 0


def _blas_info(np) -> str:
    parts = []
    try:
        cfg = np.show_config(mode="dicts")
        deps = cfg.get("Build Dependencies", {})
        for key in ("blas", "lapack"):
            d = deps.get(key) or {}
            if d.get("found", True) and d.get("name"):
                parts.append(f"{key}: {d.get('name')} {d.get('version', '')}".strip())
    except Exception:
        pass
    try:
        from threadpoolctl import threadpool_info
        for info in threadpool_info():
            if info.get("user_api") == "blas":
                parts.append(f"runtime {info.get('internal_api')} {info.get('version')}, "
                             f"{info.get('num_threads')} thread(s)")
    except Exception:
        parts.append("threadpoolctl not installed (no runtime thread info)")
    return "; ".join(parts) or "unknown"


def main(argv: Optional[List[str]] = None) -> int:
    """The ``gradcore`` command (``gradcore ops | head`` ends quietly, as Unix tools do).

    Example::

        >>> main(["ops"])           # doctest: +SKIP
    """
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader left: send what Python still flushes at exit nowhere
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "ops":
        if rest in (["-h"], ["--help"]):
            print("usage: gradcore ops\n\nList every registered op: its package, devices and gradient path, "
                  "then each plugin that failed to load and why (exit 1 if one did).")
            return 0
        if rest:
            print(f"usage: gradcore ops (takes no arguments, got {' '.join(rest)})", file=sys.stderr)
            return 2
        return _ops()
    if cmd == "check":
        return _check(rest)
    if cmd == "doctor":
        return _doctor(rest)
    if cmd == "demo":
        from . import demo
        return demo.main(rest)
    print(f"gradcore: unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
