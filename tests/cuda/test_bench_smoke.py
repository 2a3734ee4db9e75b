"""benchmarks/bench_cuda.py runs end to end (on the host emulator here: a
smoke test of the script, its timings mean nothing there)."""
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_cuda.py"


def test_bench_cuda_runs_on_the_emulator(cuda):
    if cuda.driver.kind != "emulator":
        pytest.skip("on a GPU, run the benchmark itself")
    out = subprocess.run([sys.executable, str(SCRIPT), "--emulator", "--quick"], capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    for line in ("forward + backward x * a", "sum over rows", "softmax rows", "MLP 784-512-512-10", "start-up",
                 "host cost of a tiny op", "training steps as CUDA graphs", "graphed / gradcore eager"):
        assert line in out.stdout, out.stdout


def test_bench_cuda_conv_cases_run_on_the_emulator(cuda):
    """Issue 17's cases (conv2d shapes, the demo's epoch), shrunk on the emulator."""
    if cuda.driver.kind != "emulator":
        pytest.skip("on a GPU, run the benchmark itself")
    out = subprocess.run([sys.executable, str(SCRIPT), "--emulator", "--quick", "--conv-only"], capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    for line in ("convolutions: not used (the emulator driver", "conv2d 2x4x6x6 * 4x3x3 fwd+bwd",
                 "demo digits CNN, 2 steps"):
        assert line in out.stdout, out.stdout


GPU_CHECK = SCRIPT.parent / "gpu_check.py"


def test_gpu_check_dry_mode_runs_every_step_on_the_emulator(tmp_path):
    """benchmarks/gpu_check.py --emulator: the GPU run's steps on the host emulator, so the first run
    on a lent GPU works the first time. ``tests`` (a pytest run inside this one) is left out here;
    every other step must pass and leave its record."""
    import json
    import shutil
    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("the CUDA emulator needs g++")
    steps = ["setup", "info", "smoke", "cudnn", "graphs", "nvrtc_cache", "demo", "bench"]
    out = subprocess.run([sys.executable, str(GPU_CHECK), "--emulator", "--out", str(tmp_path), "--budget", "1500",
                          "--steps", ",".join(steps)], capture_output=True, text=True, timeout=1800)
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert record["mode"] == "emulator" and list(record["steps"]) == steps
    failed = {name: r.get("error") for name, r in record["steps"].items() if r.get("ok") is not True}
    assert failed == {}
    assert set(record["steps"]["smoke"]["families"]) == {"elemwise", "reduce", "nn", "shape", "indexing", "linalg",
                                                          "conv", "vision"}
    assert record["steps"]["smoke"]["second_thread"]["ok"] is True
    assert record["steps"]["graphs"]["max_difference"] == 0.0
    assert record["steps"]["demo"]["cuda"]["exit_code"] == 0
    start = record["steps"]["demo"]["import_to_first_step"]
    assert start["cold_s"] > 0 and start["warm_s"] > 0 and start["warm_bytecode_cached_s"] > 0
    assert "tiny op forward" in record["steps"]["bench"]["figures"]["cases"]
    assert (tmp_path / "gpu_check.log").read_text().count("[gpu_check] ==") == len(steps)


def test_gpu_check_refuses_an_unknown_step(tmp_path):
    out = subprocess.run([sys.executable, str(GPU_CHECK), "--emulator", "--out", str(tmp_path), "--steps", "smok"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown steps ['smok']" in out.stderr


def _gpu_check():
    sys.path.insert(0, str(GPU_CHECK.parent))
    import gpu_check
    return gpu_check


def _fill_gpu_dir(gpu_dir):
    """A .gpu as benchmarks/README.md prepares it (empty files with the right names)."""
    names = ["install-pycuda.sh", "wheels/pycuda-2026.1-cp312-cp312-linux_x86_64.whl",
             "extra/matplotlib-3.11.2-cp312-cp312-manylinux2014_x86_64.whl", "extra/tqdm-4.70.1-py3-none-any.whl"]
    names += [f"wheels/{dep}-1.0-py3-none-any.whl"
              for dep in ("pytools", "platformdirs", "siphash24", "typing_extensions", "mako", "markupsafe")]
    for name in names:
        (gpu_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (gpu_dir / name).write_bytes(b"")


def test_gpu_check_preflight_names_what_the_gpu_folder_lacks(tmp_path):
    # .gpu is git-ignored: a device call without it in its carry, or with an incomplete one, spent
    # the lent machine's start on "No such file" (the preflight runs here, before)
    gpu_dir = tmp_path / ".gpu"
    gpu_dir.mkdir()
    cmd = [sys.executable, str(GPU_CHECK), "--preflight", "--gpu-dir", str(gpu_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "NOT ready" in out.stdout
    for what in ("PyCUDA for CPython 3.12", "PyCUDA's dependency pytools", "the demo's tqdm", "install-pycuda.sh"):
        assert what in out.stdout, out.stdout
    _fill_gpu_dir(gpu_dir)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "missing" not in out.stdout and "ready: bash .gpu/run-on-gpu.sh" in out.stdout


def test_gpu_check_setup_stops_at_once_without_pycuda_or_its_wheels(tmp_path, monkeypatch):
    probe = subprocess.run([sys.executable, "-c", "import pycuda.driver"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("PyCUDA is installed here: setup would not look for its wheels")
    gpu_check = _gpu_check()
    monkeypatch.setattr(gpu_check, "GPU_DIR", tmp_path / ".gpu")
    monkeypatch.setattr(gpu_check, "SITE", tmp_path / ".gpu" / "site")
    rec = gpu_check.Record(tmp_path / "out", "gpu")
    result = gpu_check.setup(rec, "gpu", 60)
    assert result["ok"] is False and "PyCUDA is not installed" in result["error"]
    assert "PyCUDA for CPython 3.12" in result["error"] and "carry" in result["error"]
    assert "pycuda_install_rc" not in result          # the installer was not even started
    assert gpu_check.missing_from_gpu_dir(tmp_path / ".gpu", ("demo",)) == [
        "the demo's matplotlib (and its dependencies beside it) (extra/matplotlib-*.whl)",
        "the demo's tqdm (extra/tqdm-*.whl)"]


def test_gpu_check_second_thread_case_on_the_fake_gpu():
    # the smoke step's thread case, where contexts are per thread as on a GPU (fake_pycuda)
    import shutil
    from gradcore.cuda import runtime
    from gradcore.devices import nvcc_path
    if nvcc_path() is None or not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("the fake GPU needs nvcc and g++")
    import fake_pycuda
    be = fake_pycuda.make_backend()
    runtime.use(be)
    try:
        case = _gpu_check()._second_thread_case()
        assert case["ok"] is True, case
    finally:
        fake_pycuda.close(be)
        runtime.use(None)


def test_gpu_check_names_the_gpu_from_nvidia_smi(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _gpu_check().gpu_identity() == "NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert _gpu_check().gpu_identity() is None
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert _gpu_check().gpu_identity() is None
