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
