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
