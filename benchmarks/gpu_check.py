"""The GPU backend on a real GPU in one prepared run (issue 26).

A GPU machine is lent rarely and briefly, so everything it should do is in
this one command, most important first, each step in a child process with
a time limit, its figures written to ``$OUT`` as soon as it ends (a run cut
short still returns what it did)::

    python3 benchmarks/gpu_check.py                 # on the GPU machine (from the project root)
    python benchmarks/gpu_check.py --emulator       # dry run here: the same steps on the host emulator
    python3 benchmarks/gpu_check.py --steps smoke,tests   # a rerun of some steps

Steps, in order: ``setup`` (PyCUDA from ``.gpu/wheels``, the demo's
libraries from ``.gpu/extra``, Cython and setuptools from ``.gpu/build``
where missing, then ``pip install -e .``, whose extensions compile one per
core),
``info`` (GPU, driver, PyTorch, cuDNN, ``gradcore doctor``), ``smoke`` (one
computation per kernel family, values and first/second-order gradients
against the CPU), ``cudnn`` (convolution, pooling and batch norm through
cuDNN, against the CPU), ``graphs`` (a training step captured as a CUDA
graph and replayed, against eager), ``nvrtc_cache`` (the disk cache across
two processes: the second compiles nothing), ``tests`` (``tests/cuda`` with
``-n`` workers), ``demo`` (the demo on cuda from an empty kernel cache and on
the cpu: times and accuracies), ``bench`` (``benchmarks/bench_cuda.py``, with
PyTorch CUDA eager side by side), ``profile`` (per model step: the host's
time to queue it against the synchronised time, launches per step, the
hottest functions by cProfile; ``import gradcore``'s slowest modules).

Results: ``$OUT/gpu_check.json`` (``{"steps": {name: {"ok", "seconds", ...figures}}}``),
``$OUT/gpu_check.log`` (everything printed), ``$OUT/tests_cuda.xml``,
``$OUT/bench_cuda.json``. Without ``$OUT``: ``--out`` (default
``benchmarks/results/gpu_check``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU_DIR = ROOT / ".gpu"
SITE = GPU_DIR / "site"
CARRY_LIMIT = 64 << 20          # what a device call's carry may take in all

# What the GPU machine (no network, no PyCUDA) needs from .gpu: (patterns, any one will do; what it is;
# the step that fails without it). Git ignores .gpu, so it reaches the machine only when the device
# call names it in its carry.
GPU_DIR_NEEDS = [
    (("install-pycuda.sh",), "PyCUDA's installer", "setup"),
    (("wheels/pycuda-*-cp312-*.whl", "wheels/pycuda-*.tar.gz"), "PyCUDA for CPython 3.12 (a wheel, or its source)",
     "setup"),
    *[((f"wheels/{dep}-*.whl",), f"PyCUDA's dependency {dep}", "setup")
      for dep in ("pytools", "platformdirs", "siphash24", "typing_extensions", "mako", "markupsafe")],
    (("extra/matplotlib-*.whl",), "the demo's matplotlib (and its dependencies beside it)", "demo"),
    (("extra/tqdm-*.whl",), "the demo's tqdm", "demo"),
]
PREPARE = ("prepare it on the session's machine (benchmarks/README.md, 'The GPU run': fetch-pycuda.sh and the "
           "demo's wheels into .gpu) and name \".gpu\" in the device call's carry: git ignores it")


def gpu_identity(timeout: float = 20.0):
    """``nvidia-smi``'s name, driver version and memory of each GPU ("NVIDIA H100 80GB HBM3, 580.65.06,
    81559 MiB"), or None: recorded before any step, so a run whose setup fails still names its card."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def missing_from_gpu_dir(gpu_dir: Path = GPU_DIR, steps=("setup", "demo")) -> list:
    """What ``gpu_dir`` lacks of ``GPU_DIR_NEEDS`` for ``steps``: ["what (pattern)", ...]."""
    return [f"{what} ({' or '.join(patterns)})" for patterns, what, step in GPU_DIR_NEEDS
            if step in steps and not any(next(gpu_dir.glob(p), None) for p in patterns)]

# name -> (seconds it may take at most, what it does); the order is the run's order
STEPS = {
    "setup": (180, "PyCUDA and the demo's libraries installed, the project built in place"),
    "info": (60, "the GPU, its driver, PyTorch, cuDNN, gradcore doctor"),
    "smoke": (120, "one computation per kernel family against the cpu (values, 1st and 2nd order)"),
    "cudnn": (90, "cuDNN convolution, pooling, batch norm against the cpu"),
    "graphs": (90, "a training step as a CUDA graph, captured and replayed, against eager"),
    "nvrtc_cache": (120, "the NVRTC disk cache across two processes"),
    "tests": (200, "tests/cuda in parallel"),
    "demo": (90, "the demo on cuda (empty kernel cache) and on the cpu"),
    "bench": (240, "benchmarks/bench_cuda.py, PyTorch CUDA eager side by side"),
    "profile": (90, "where a step's time goes: host enqueue against synchronised, launches, cProfile, import"),
}


# ---------------------------------------------------------------- the parent: runs the steps, keeps the record
class Record:
    """``gpu_check.json`` and ``gpu_check.log`` in ``out``, rewritten after every step."""

    def __init__(self, out: Path, mode: str):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "gpu_check.json"
        self.log = open(out / "gpu_check.log", "a", buffering=1)
        self.data = {"mode": mode, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": {}}
        self.save()

    def say(self, text: str):
        print(text, flush=True)
        self.log.write(text + "\n")

    def step(self, name: str, result: dict):
        self.data["steps"][name] = result
        self.save()

    def save(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def child_env(kind: str, kernel_cache: Path) -> dict:
    env = dict(os.environ)
    paths = [str(SITE)] if SITE.is_dir() else []
    paths += [str(ROOT / "benchmarks")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["GRADCORE_CUDA"] = kind
    env["GRADCORE_KERNEL_CACHE"] = str(kernel_cache)
    if shutil.which("nvcc") is None and os.path.isdir("/usr/local/cuda/bin"):
        env["PATH"] = "/usr/local/cuda/bin" + os.pathsep + env.get("PATH", "")
    return env


def run_command(rec: Record, cmd, env, timeout: float, cwd=ROOT) -> tuple:
    """(exit code or None when it timed out, the last 4000 characters of its output); the
    output streams into the log as it comes."""
    rec.say("$ " + " ".join(map(str, cmd)))
    proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    tail, deadline = [], time.monotonic() + timeout
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        if not sel.select(timeout=min(left, 1.0)):
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        rec.say(line.rstrip("\n"))
        tail.append(line)
        tail = tail[-200:]
    if timed_out:
        import signal
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        rec.say(f"[gpu_check] killed after {timeout:.0f} s")
        return None, "".join(tail)[-4000:]
    proc.wait()
    return proc.returncode, "".join(tail)[-4000:]


def setup(rec: Record, kind: str, timeout: float) -> dict:
    """PyCUDA (prebuilt wheel; source build as fallback), the demo's libraries, the project
    built in place with every core. On the emulator: only checks that gradcore imports."""
    t0 = time.monotonic()
    env = child_env(kind, Path(tempfile.gettempdir()))
    result = {}
    if kind == "gpu":
        probe = subprocess.run([sys.executable, "-c", "import pycuda.driver"], env=env, capture_output=True)
        if probe.returncode != 0:
            missing = missing_from_gpu_dir(GPU_DIR, ("setup",))
            if missing:         # say so at once: the lent machine's minutes are few
                return dict(result, ok=False, error=f"PyCUDA is not installed and {GPU_DIR} lacks: "
                                                    f"{'; '.join(missing)}: {PREPARE}")
            code, _ = run_command(rec, ["bash", GPU_DIR / "install-pycuda.sh", SITE], env, timeout / 2)
            result["pycuda_install_rc"] = code
            if code != 0:
                return dict(result, ok=False, error="PyCUDA did not install")
        result["gpu_dir_missing"] = missing_from_gpu_dir(GPU_DIR, ("demo",))      # the demo step fails without
        extra = sorted(str(p) for p in (GPU_DIR / "extra").glob("*.whl"))
        have = subprocess.run([sys.executable, "-c", "import matplotlib, tqdm"], env=env, capture_output=True)
        if extra and have.returncode != 0:
            code, _ = run_command(rec, [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                        "--target", SITE, *extra], env, 120)
            result["extra_install_rc"] = code
        have = subprocess.run([sys.executable, "-c", "import Cython, setuptools"], env=env, capture_output=True)
        build = sorted(str(p) for p in (GPU_DIR / "build").glob("*.whl"))
        if have.returncode != 0 and build:
            code, _ = run_command(rec, [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                        "--target", SITE, *build], env, 120)
            result["build_tools_install_rc"] = code
        # one build: setup.py compiles the extensions side by side, one per core
        install = [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "-e", "."]
        code, out = run_command(rec, install, env, max(30.0, timeout - (time.monotonic() - t0)))
        if code != 0 and "externally-managed" in out:       # a distribution's Python (PEP 668)
            code, out = run_command(rec, install + ["--break-system-packages"], env,
                                    max(30.0, timeout - (time.monotonic() - t0)))
        result["install_rc"] = code
        if code != 0:
            return dict(result, ok=False, error="pip install -e . failed: " + out[-1500:])
    probe = subprocess.run([sys.executable, "-c", "import gradcore, gradcore.ops; print(gradcore.__file__)"],
                           env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    result["gradcore"] = probe.stdout.strip() or probe.stderr[-1500:]
    return dict(result, ok=probe.returncode == 0, seconds=time.monotonic() - t0)


def preflight(gpu_dir: Path) -> int:
    """Check here what the GPU run will need from ``gpu_dir`` (.gpu), and print the device call that
    carries it; 1 when something is missing or it is too large to carry."""
    missing = missing_from_gpu_dir(gpu_dir)
    for item in missing:
        print(f"[preflight] missing: {item}")
    size = sum(p.stat().st_size for p in gpu_dir.rglob("*") if p.is_file() and "site" not in p.relative_to(
        gpu_dir).parts) if gpu_dir.is_dir() else 0
    print(f"[preflight] {gpu_dir}: {size / 2 ** 20:.1f} MiB (a device call carries at most "
          f"{CARRY_LIMIT / 2 ** 20:.0f} MiB in all)")
    try:        # (a folder outside the checkout, or no git: not known to be ignored)
        ignored = subprocess.run(["git", "check-ignore", "-q", str(gpu_dir)], cwd=ROOT,
                                 stderr=subprocess.DEVNULL).returncode == 0
    except OSError:
        ignored = False
    if ignored:
        print(f"[preflight] git ignores {gpu_dir.name}: name it in the device call's carry, "
              f"e.g. carry=[\"{gpu_dir.name}\"]")
    if missing:
        print(f"[preflight] {PREPARE}")
    ok = not missing and size <= CARRY_LIMIT
    print("[preflight] " + ("ready: bash .gpu/run-on-gpu.sh python3 benchmarks/gpu_check.py --budget 300" if ok
                            else "NOT ready"))
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emulator", action="store_true", help="dry run: the same steps on the host emulator")
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated steps to run (default: all)")
    ap.add_argument("--budget", type=float, default=470.0, help="seconds for the whole run (default 470)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results" / "gpu_check"))
    ap.add_argument("--workers", type=int, default=0, help="pytest -n for tests/cuda (default: cores, at most 16)")
    ap.add_argument("--preflight", action="store_true",
                    help="here, before a GPU is lent: is .gpu complete, and how must the device call carry it")
    ap.add_argument("--gpu-dir", default=str(GPU_DIR), help=argparse.SUPPRESS)     # (tests: another .gpu)
    ap.add_argument("--step", help=argparse.SUPPRESS)           # internal: run one step in this process
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    kind = "emulator" if args.emulator else "gpu"
    if args.preflight:
        return preflight(Path(args.gpu_dir))
    if args.step:
        return run_step_here(args.step, kind, Path(args.result), args)

    out = Path(args.out)
    rec = Record(out, kind)
    if kind == "gpu":
        rec.data["gpu"] = gpu_identity()
        rec.say(f"[gpu_check] GPU: {rec.data['gpu']}")
        rec.save()
    t_start = time.monotonic()
    chosen = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in STEPS]
    if unknown:
        ap.error(f"unknown steps {unknown}; the steps: {', '.join(STEPS)}")
    # empty, of this run only (two runs side by side must not share it), not under $OUT (it would travel back)
    kernel_cache = Path(tempfile.mkdtemp(prefix="gpu_check_kernels_"))
    for name in STEPS:
        if name not in chosen:
            continue
        cap, what = STEPS[name]
        if args.emulator:       # the emulator compiles every kernel with g++ (cold in CI): far slower
            cap *= 6
        left = args.budget - (time.monotonic() - t_start)
        if left < 10:
            rec.say(f"[gpu_check] {name}: not run, the budget is spent")
            rec.step(name, {"ok": None, "skipped": "budget spent"})
            continue
        timeout = min(cap, left)
        rec.say(f"\n[gpu_check] == {name}: {what} (at most {timeout:.0f} s; {time.monotonic() - t_start:.0f} s in)")
        t0 = time.monotonic()
        if name == "setup":
            try:
                result = setup(rec, kind, timeout)
            except Exception:
                result = {"ok": False, "error": traceback.format_exc()[-2000:]}
        else:
            result_file = out / f"step_{name}.json"
            if result_file.exists():
                result_file.unlink()
            cmd = [sys.executable, Path(__file__).resolve(), "--step", name, "--result", result_file,
                   "--out", out, "--workers", str(args.workers), "--budget", str(timeout)]
            if args.emulator:
                cmd.append("--emulator")
            code, tail = run_command(rec, cmd, child_env(kind, kernel_cache), timeout)
            result = json.loads(result_file.read_text()) if result_file.exists() else {}
            result["exit_code"] = code
            if code is None:
                result["ok"] = False
                result["error"] = f"timed out after {timeout:.0f} s"
            elif code != 0 and result.get("ok", True):
                result["ok"] = False
                result.setdefault("error", tail[-2000:])
        result["seconds"] = round(time.monotonic() - t0, 2)
        rec.step(name, result)
        rec.say(f"[gpu_check] {name}: {'ok' if result.get('ok') else 'FAILED'} in {result['seconds']:.1f} s")
        if name == "setup" and not result.get("ok"):
            rec.say("[gpu_check] setup failed: nothing else can run")
            break
    shutil.rmtree(kernel_cache, ignore_errors=True)
    rec.data["total_seconds"] = round(time.monotonic() - t_start, 1)
    rec.save()
    failed = [n for n, r in rec.data["steps"].items() if r.get("ok") is False]
    rec.say(f"\n[gpu_check] done in {rec.data['total_seconds']} s; failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


# ---------------------------------------------------------------- the steps (each in a child process)
def run_step_here(name: str, kind: str, result_file: Path, args) -> int:
    """Run step ``name``; its figures go to ``result_file`` (rewritten as it goes)."""
    result = {"ok": True}

    def save():
        result_file.write_text(json.dumps(result, indent=1, default=str))
    save()
    try:
        STEP_FUNCTIONS[name](kind, result, save, args)
    except Exception:
        result["ok"] = False
        result["error"] = traceback.format_exc()[-3000:]
        print(result["error"], flush=True)
    save()
    return 0 if result["ok"] else 1


def _backend(kind):
    from gradcore.cuda import runtime
    return runtime.use(kind)


def step_info(kind, result, save, args):
    import numpy as np
    be = _backend(kind)
    result["device"] = be.name
    result["driver_kind"] = be.driver.kind
    result["numpy"] = np.__version__
    result["python"] = sys.version.split()[0]
    if kind == "gpu":
        import pycuda.driver as drv
        result["cuda_driver_version"] = drv.get_driver_version()
        dev = drv.Device(0)
        result["compute_capability"] = "%d.%d" % dev.compute_capability()
        result["memory_gib"] = round(dev.total_memory() / 2 ** 30, 1)
    try:
        import torch
        result["torch"] = torch.__version__
        result["torch_cuda"] = torch.cuda.is_available() and torch.cuda.get_device_name(0)
        result["torch_cudnn"] = torch.backends.cudnn.version() if torch.cuda.is_available() else None
    except ImportError:
        result["torch"] = None
    from gradcore.cuda import cudnn
    result["cudnn"] = cudnn.status(be)
    cache = getattr(be.driver, "cache", None)
    result["kernel_compiler"] = cache.compiler() if cache is not None else None
    doctor = subprocess.run([sys.executable, "-m", "gradcore.cli", "doctor"], capture_output=True, text=True,
                            timeout=120)
    print(doctor.stdout + doctor.stderr, flush=True)
    result["doctor_rc"] = doctor.returncode
    for k, v in result.items():
        print(f"  {k}: {v}")


def _family_cases():
    """family -> a function of cuda-test inputs, and its inputs (numpy float32)."""
    import numpy as np
    import gradcore.functional as F
    rng = np.random.default_rng(0)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    return {
        "elemwise": (lambda x, y: F.exp(x) * y + F.tanh(x - y) / (1 + y * y), [r(64, 33), r(64, 33)]),
        "reduce": (lambda x: [x.sum(axis=1), x.max(axis=0), x.mean(), F.logsumexp(x, axis=1)], [r(37, 129)]),
        "nn": (lambda x, w: [F.softmax(x, axis=1), F.gelu(x), F.linear(x, w)], [r(8, 16), r(12, 16)]),
        "shape": (lambda x, y: F.concat([x.transpose(1, 0), y], axis=0).reshape(-1)[3:40],
                  [r(5, 7), r(2, 5)]),
        "indexing": (lambda x: [x[np.array([0, 3, 3, 1])], F.gather(x, 1, np.array([[0, 1], [2, 0], [1, 1], [0, 0]],
                                                                                   np.int32))], [r(4, 6)]),
        "linalg": (lambda a, b: F.matmul(a, b), [r(3, 17, 9), r(3, 9, 5)]),
        "conv": (lambda x, w: F.conv2d(x, w, padding=1), [r(2, 3, 9, 9), r(4, 3, 3, 3)]),
        "vision": (lambda x: F.nn.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
                   [r(1, 2, 5, 5)]),
    }


def _assert_matches_cpu():
    sys.path.insert(0, str(ROOT / "tests" / "cuda"))
    from conftest import assert_cuda_matches_cpu
    return assert_cuda_matches_cpu


def step_smoke(kind, result, save, args):
    from gradcore.cuda import families
    be = _backend(kind)
    check = _assert_matches_cpu()
    fams = {}
    result["families"] = fams
    for fam, (fn, arrays) in _family_cases().items():
        t0 = time.perf_counter()
        try:
            check(fn, arrays, rtol=2e-3, atol=2e-4)
            be.synchronize()
            fams[fam] = {"ok": True}
        except Exception as exc:
            fams[fam] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-1500:]}
            result["ok"] = False
        fams[fam]["seconds"] = round(time.perf_counter() - t0, 3)
        print(f"  {fam:10s} {'ok' if fams[fam]['ok'] else 'FAILED'} {fams[fam]['seconds']:.2f} s"
              + ("" if fams[fam]["ok"] else "  " + fams[fam]["error"][:800]), flush=True)
        save()
    result["second_thread"] = _second_thread_case()
    print(f"  second thread: {result['second_thread']}", flush=True)
    result["ok"] = result["ok"] and result["second_thread"]["ok"]
    save()
    if kind == "gpu":
        # every standard family compiles for float and double (what a test might not reach)
        t0 = time.perf_counter()
        try:
            n = be.driver.cache.precompile(ctypes=("float", "double"))
            result["precompile"] = {"ok": True, "families_compiled": n, "seconds": time.perf_counter() - t0,
                                    "families": families.family_names()}
        except Exception as exc:
            result["precompile"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-3000:]}
            result["ok"] = False
        print(f"  precompile: {result['precompile']}", flush=True)
    result["memory_stats"] = be.memory_stats()


def _second_thread_case() -> dict:
    """An upload, kernels, a GEMM and a read back in a thread of its own, against NumPy. CUDA's
    current context is per thread and PyCUDA's context stack too (it aborts the process when a
    thread ends with a context pushed): only a GPU shows whether gradcore binds it right."""
    import threading
    import numpy as np
    import gradcore as gc
    import gradcore.functional as F
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    box = {}

    def run():
        try:
            x = gc.Tensor(a, device="cuda")
            box["value"] = F.matmul(F.tanh(x), x.transpose(1, 0)).numpy()
        except Exception as exc:
            box["error"] = f"{type(exc).__name__}: {exc}"[-1500:]
    t0 = time.perf_counter()
    thread = threading.Thread(target=run, name="gpu_check-second-thread")
    thread.start()
    thread.join(60)
    out = {"seconds": round(time.perf_counter() - t0, 3)}
    if thread.is_alive():
        return dict(out, ok=False, error="still running after 60 s")
    if "error" in box:
        return dict(out, ok=False, error=box["error"])
    want = np.tanh(a.astype(np.float64)) @ a.T.astype(np.float64)
    out["max_difference"] = float(np.max(np.abs(box["value"] - want)))
    return dict(out, ok=out["max_difference"] <= 1e-5)


def step_cudnn(kind, result, save, args):
    import numpy as np
    import gradcore.functional as F
    from gradcore.cuda import cudnn
    be = _backend(kind)
    result["status"] = cudnn.status(be)
    result["why_not"] = cudnn.why_not(be)
    print(f"  cuDNN: {result['status']} {result['why_not'] or ''}", flush=True)
    check = _assert_matches_cpu()
    rng = np.random.default_rng(1)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    cases = {
        "conv2d 3x3 pad 1": (lambda x, w: F.conv2d(x, w, padding=1), [r(2, 8, 12, 12), r(16, 8, 3, 3)]),
        "conv2d stride 2 dilation 2 groups 2": (lambda x, w: F.conv2d(x, w, stride=2, dilation=2, groups=2),
                                               [r(2, 8, 13, 13), r(6, 4, 3, 3)]),
        "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1),
                             [r(2, 4, 7, 7), r(4, 3, 4, 4)]),
        "max_pool2d": (lambda x: F.max_pool2d(x, 2), [r(2, 3, 8, 8)]),
        "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), [r(2, 3, 9, 9)]),
        "batch_norm training": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                                [r(4, 3, 5, 5), r(1, 3, 1, 1), r(1, 3, 1, 1)]),
    }
    out = {}
    result["cases"] = out
    for name, (fn, arrays) in cases.items():
        t0 = time.perf_counter()
        launches0 = be.memory_stats().get("launches", 0)
        try:
            check(fn, arrays, rtol=5e-3, atol=5e-4)
            be.synchronize()
            out[name] = {"ok": True}
        except Exception as exc:
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-1500:]}
            result["ok"] = False
        out[name]["seconds"] = round(time.perf_counter() - t0, 3)
        out[name]["kernel_launches"] = be.memory_stats().get("launches", 0) - launches0
        print(f"  {name:38s} {'ok' if out[name]['ok'] else 'FAILED'}"
              + ("" if out[name]["ok"] else "  " + out[name]["error"][:800]), flush=True)
        save()


def step_graphs(kind, result, save, args):
    import numpy as np
    import gradcore as gc
    import gradcore.functional as F
    import gradcore.module as M
    import gradcore.optimizer as optim
    from gradcore.autodiff import GradManager
    from gradcore.cuda import graphed
    be = _backend(kind)
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((32, 64)).astype(np.float32) for _ in range(6)]
    ys = [rng.integers(0, 10, 32).astype(np.int32) for _ in range(6)]

    def train(use_graph):
        gc.random.seed(0)
        net = M.Sequential(M.Linear(64, 128), M.ReLU(), M.Linear(128, 10)).to("cuda")
        gm = GradManager().attach(net.parameters())
        opt = optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            with gm:
                loss = F.cross_entropy(net(x), y)
                gm.backward(loss)
            opt.step().clear_grad()
            return loss
        run = graphed(step, warmup=2) if use_graph else step
        losses = [float(run(gc.Tensor(x, device="cuda"), gc.Tensor(y, device="cuda")).numpy())
                  for x, y in zip(xs, ys)]
        return losses, run
    eager, _ = train(False)
    launches0 = be.memory_stats().get("launches", 0)
    graphed_losses, run = train(True)
    result["eager_losses"] = eager
    result["graphed_losses"] = graphed_losses
    result["max_difference"] = float(np.max(np.abs(np.subtract(eager, graphed_losses))))
    result["launches_while_graphed"] = be.memory_stats().get("launches", 0) - launches0
    for attr in ("replays", "captures", "stats"):
        if hasattr(run, attr):
            v = getattr(run, attr)
            result[attr] = v() if callable(v) else v
    result["ok"] = result["max_difference"] <= 1e-4 * max(1.0, max(abs(v) for v in eager))
    print(f"  eager   {eager}\n  graphed {graphed_losses}\n  max difference {result['max_difference']:.3g}",
          flush=True)


NVRTC_CHILD = r"""
import json, time, sys
t0 = time.perf_counter()
import numpy as np, gradcore as gc, gradcore.functional as F
from gradcore.cuda import runtime
be = runtime.use(sys.argv[1])
x = gc.Tensor(np.ones((8, 8), np.float32), device="cuda")
y = (F.exp(x) * 2).sum(axis=1)
z = F.matmul(x, x).max()
w = F.softmax(x, axis=1)
be.synchronize()
cache = getattr(be.driver, "cache", None)
stats = dict(cache.stats) if cache is not None else {}
print(json.dumps({"seconds": time.perf_counter() - t0, "stats": stats,
                  "compiler": cache.compiler() if cache is not None else None}))
"""


def step_nvrtc_cache(kind, result, save, args):
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, GRADCORE_KERNEL_CACHE=cache_dir)
        runs = []
        for i in range(2):
            out = subprocess.run([sys.executable, "-c", NVRTC_CHILD, kind], capture_output=True, text=True,
                                 env=env, timeout=max(10.0, args.budget / 2 - 5))
            if out.returncode != 0:
                raise RuntimeError(f"process {i + 1}: {out.stderr[-2000:]}")
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  process {i + 1}: {runs[-1]}", flush=True)
        result["files"] = len(os.listdir(cache_dir))
    result["first"], result["second"] = runs
    first, second = runs[0]["stats"], runs[1]["stats"]
    if kind == "gpu":
        result["ok"] = first.get("compiles", 0) > 0 and second.get("compiles", 1) == 0 and \
            second.get("disk_hits", 0) > 0
    else:       # the emulator compiles C++ with its own cache: only the timings are figures here
        result["ok"] = True


def step_tests(kind, result, save, args):
    workers = args.workers or min(16, os.cpu_count() or 2)
    xml = Path(args.out) / "tests_cuda.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/cuda", f"--junitxml={xml}",
           "-o", "addopts=", "-rfE", "--durations=15"]
    if workers > 1:
        cmd += ["-n", str(workers)]
    if kind == "gpu":
        cmd += ["-k", "not emulator and not fake"]     # those run in CI; here the GPU's own cases
    else:
        cmd += ["-k", "emulator and not slow", "-x", "--maxfail=5"]
        cmd += ["tests/cuda/test_cuda_elemwise.py", "tests/cuda/test_graphs.py"]
        cmd.remove("tests/cuda")
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, timeout=max(10.0, args.budget - 5))
    result["exit_code"] = proc.returncode
    result.update(_junit_summary(xml))
    result["ok"] = proc.returncode == 0


def _junit_summary(xml: Path) -> dict:
    if not xml.exists():
        return {}
    import xml.etree.ElementTree as ET
    root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    summary = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in suite.iter("testcase"):
        for tag in ("failure", "error"):
            el = case.find(tag)
            if el is not None:
                failed.append({"test": f"{case.get('classname')}::{case.get('name')}",
                               "message": (el.get("message") or "")[:600]})
    summary["failed"] = failed[:80]
    return summary


DEMO_ACCURACY = "held-out accuracy"


PHASES_CHILD = r"""
import json, sys, time
t0 = time.perf_counter(); marks = {}
def mark(name): marks[name] = round(time.perf_counter() - t0, 4)
import numpy as np
import gradcore as gc, gradcore.functional as F, gradcore.optimizer as optim
from gradcore.autodiff import GradManager
from gradcore.demo import DigitsCNN, load_digits
mark("import")
from gradcore.cuda import runtime
be = runtime.use(sys.argv[1]); mark("driver")
x, y = load_digits(); model = DigitsCNN().to("cuda"); mark("model on cuda")
xb, yb = gc.tensor(x[:32], device="cuda"), gc.tensor(y[:32], device="cuda")
h = model.conv1(xb); be.synchronize(); mark("first conv")
gm = GradManager().attach(model.parameters())
opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
with gm:
    gm.backward(F.cross_entropy(model(xb), yb))
opt.step().clear_grad(); be.synchronize(); mark("first step")
if len(sys.argv) > 2:
    import torch
    a = torch.ones(4, 4, device="cuda"); (a @ a).sum().item(); mark("torch after gradcore")
print(json.dumps(marks))
"""


def step_demo(kind, result, save, args):
    """The demo on cuda from an empty kernel cache, then on the cpu: seconds and accuracy."""
    for device in ("cuda", "cpu"):
        with tempfile.TemporaryDirectory() as cache_dir, tempfile.TemporaryDirectory() as out_dir:
            env = dict(os.environ, GRADCORE_KERNEL_CACHE=cache_dir)
            epochs = "15" if kind == "gpu" else "1"
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "gradcore.demo", "--device", device, "--out", out_dir,
                                  "--epochs", epochs], capture_output=True, text=True, env=env,
                                 timeout=max(10.0, args.budget / 2 - 5))
            seconds = time.perf_counter() - t0
            summary = Path(out_dir, "summary.txt")
            text = summary.read_text() if summary.exists() else ""
            result[device] = {"seconds": round(seconds, 2), "exit_code": out.returncode, "summary": text[-1500:]}
            if out.returncode != 0:
                result[device]["error"] = out.stderr[-2000:]
                result["ok"] = False
            print(f"  {device}: {seconds:.2f} s, exit {out.returncode}\n{text}{out.stderr[-1500:] if out.returncode else ''}",
                  flush=True)
            save()
    if result["ok"]:
        import bench_cuda
        # The harness may forbid writing bytecode (PYTHONDONTWRITEBYTECODE): then every process compiles
        # every module from source, which no user's machine does. Warm starts are measured both ways.
        result["harness_writes_bytecode"] = not sys.flags.dont_write_bytecode
        with tempfile.TemporaryDirectory() as cache_dir, tempfile.TemporaryDirectory() as pycache:
            env = dict(os.environ, GRADCORE_KERNEL_CACHE=cache_dir)
            runs = 3 if kind == "gpu" else 1        # the dry run only proves that the step works
            cold = bench_cuda.cnn_start(cache_dir, kind)
            warm = [bench_cuda.cnn_start(cache_dir, kind) for _ in range(runs)]
            cached = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
            cached["PYTHONPYCACHEPREFIX"] = pycache
            warm_cached = [bench_cuda.cnn_start(cache_dir, kind, env=cached) for _ in range(runs + 1)][1:]
            # where a warm start's time goes (the same disk cache, bytecode cached), and PyTorch after gradcore
            phases = subprocess.run([sys.executable, "-c", PHASES_CHILD, kind] + (["torch"] if kind == "gpu" else []),
                                    capture_output=True, text=True, timeout=120, env=cached)
        result["import_to_first_step"] = {"cold_s": cold, "warm_s": statistics.median(warm),
                                          "warm_bytecode_cached_s": statistics.median(warm_cached)}
        print(f"  import to first step: {result['import_to_first_step']}", flush=True)
        result["warm_phases"] = phases.stdout.strip()[-1000:] or f"exit {phases.returncode}: {phases.stderr[-1500:]}"
        print(f"  warm start (bytecode cached), cumulative seconds: {result['warm_phases']}", flush=True)


def step_bench(kind, result, save, args):
    js = Path(args.out) / "bench_cuda.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_cuda.py"), "--json", str(js)]
    cmd += ["--emulator", "--quick"] if kind == "emulator" else ["--repeat", "5", "--target-time", "0.1"]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, timeout=max(10.0, args.budget - 5))
    result["exit_code"] = proc.returncode
    result["ok"] = proc.returncode == 0
    if js.exists():
        result["figures"] = json.loads(js.read_text())


def _profile_cases(kind):
    """name -> (gradcore step, PyTorch step or None): the steps whose time the ``profile`` step splits."""
    import bench_cuda
    import bench_models
    torch_ok = False
    if kind == "gpu":
        try:
            import torch
            torch_ok = torch.cuda.is_available()
        except ImportError:
            pass
    small = kind == "emulator"
    conv = dict(n=2, c=8, h=8, w=8, o=8, k=3) if small else dict(n=32, c=128, h=28, w=28, o=128, k=3)
    cases = {
        "tiny op forward + backward": (bench_cuda.tiny_op_cases("cuda")["forward + backward"],
                                       bench_cuda.torch_tiny_op_cases()["forward + backward"] if torch_ok else None),
        "MLP 784-512-512-10 batch 32": (bench_cuda.gc_mlp(32 if not small else 4),
                                        bench_cuda.torch_mlp(32) if torch_ok else None),
        "MLP 784-512-512-10 batch 128": (bench_cuda.gc_mlp(128 if not small else 4),
                                         bench_cuda.torch_mlp(128) if torch_ok else None),
        "conv2d %dx%dx%dx%d * %dx3x3 fwd+bwd" % (conv["n"], conv["c"], conv["h"], conv["w"], conv["o"]):
            (bench_models.gc_conv("cuda", conv), bench_models.torch_conv("cuda", conv) if torch_ok else None),
    }
    return cases


def _split_time(step, sync, n):
    """(host seconds to queue a step, seconds per step synchronised) over ``n`` steps."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return (t1 - t0) / n, (t2 - t0) / n


def step_profile(kind, result, save, args):
    """Per model step: the host's time to queue it against the synchronised time
    (host-bound when they are close), launches and cuDNN calls per step, the
    hottest functions (cProfile, by own time); then ``import gradcore``'s
    slowest modules (``python -X importtime``)."""
    import cProfile
    import io
    import pstats
    be = _backend(kind)
    sync_torch = None
    if kind == "gpu":
        try:
            import torch
            sync_torch = torch.cuda.synchronize
        except ImportError:
            pass
    n = 200 if kind == "gpu" else 5
    result["cases"] = {}
    for name, (gc_step, torch_step) in _profile_cases(kind).items():
        entry = result["cases"][name] = {}
        for _ in range(3):
            gc_step()
        launches = be.launcher.launches
        gc_step()
        entry["launches_per_step"] = be.launcher.launches - launches
        splits = [_split_time(gc_step, be.synchronize, n) for _ in range(3)]
        entry["gradcore_host_s"], entry["gradcore_step_s"] = min(splits, key=lambda s: s[1])
        if torch_step is not None:
            for _ in range(3):
                torch_step()
            splits = [_split_time(torch_step, sync_torch, n) for _ in range(3)]
            entry["torch_host_s"], entry["torch_step_s"] = min(splits, key=lambda s: s[1])
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(n):
            gc_step()
        be.synchronize()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(22)
        entry["cprofile"] = text.getvalue()[-5000:]
        figures = {k: (round(v * 1e6, 1) if k.endswith("_s") else v) for k, v in entry.items() if k != "cprofile"}
        print(f"  {name} (us): {figures}\n{entry['cprofile']}", flush=True)
        save()
    from gradcore.cuda import cudnn
    ctx = cudnn.context(be)
    if ctx is not None and ctx is not False:
        # the algorithms cuDNN's heuristics chose, then the conv step with them timed (cudnnFind*)
        result["cudnn_algorithms"] = {repr(k[:4]): v for k, v in getattr(ctx, "algorithms", {}).items()}
        conv_name = [k for k in result["cases"] if k.startswith("conv2d")][0]
        cudnn.benchmark = True
        try:
            step = _profile_cases(kind)[conv_name][0]
            for _ in range(3):
                step()
            host, total = min((_split_time(step, be.synchronize, n) for _ in range(3)), key=lambda s: s[1])
            result["cases"][conv_name]["gradcore_benchmark_algorithms_step_s"] = total
            result["cudnn_algorithms_timed"] = {repr(k[:4]): v for k, v in ctx.algorithms.items() if k[7]}
        finally:
            cudnn.benchmark = False
        print(f"  cuDNN algorithms (heuristics): {result['cudnn_algorithms']}\n  timed: "
              f"{result.get('cudnn_algorithms_timed')}; the conv step with them: {total * 1e6:.1f} us", flush=True)
        save()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import gradcore"], capture_output=True,
                          text=True, timeout=60, cwd=tempfile.gettempdir())
    rows = []
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0].strip().split()[-1].isdigit():
            rows.append((int(parts[0].split()[-1]), int(parts[1]), parts[2].strip()))
    rows.sort(reverse=True)
    result["import_total_us"] = max((r[1] for r in rows), default=None)
    result["import_slowest_self_us"] = [[own, name] for own, _, name in rows[:20]]
    print(f"  import gradcore: {result['import_total_us']} us; slowest (own us): {result['import_slowest_self_us']}",
          flush=True)


STEP_FUNCTIONS = {"info": step_info, "smoke": step_smoke, "cudnn": step_cudnn, "graphs": step_graphs,
                  "nvrtc_cache": step_nvrtc_cache, "tests": step_tests, "demo": step_demo, "bench": step_bench,
                  "profile": step_profile}


if __name__ == "__main__":
    sys.exit(main())
