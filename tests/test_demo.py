"""The main job: the digits CNN reaches 95% held-out accuracy and writes its
curves (matplotlib) and summary; progress goes through tqdm."""
import io
import re
import subprocess
import sys

import numpy as np
import pytest

from gradcore import demo

pytest.importorskip("matplotlib", reason="the demo extra (matplotlib) is part of .[test]")
pytest.importorskip("tqdm", reason="the demo extra (tqdm) is part of .[test]")


def test_demo_trains_digits_to_95_percent(tmp_path, capsys):
    assert demo.main(["--out", str(tmp_path), "--seed", "0"]) == 0
    summary = (tmp_path / "summary.txt").read_text()
    acc = float(re.search(r"final test accuracy ([0-9.]+)", summary).group(1))
    assert acc >= 0.95, summary
    png = (tmp_path / "training_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    # not a terminal: one plain line per epoch, no carriage-return bar updates
    assert "\r" not in out
    assert len(re.findall(r"^epoch +\d+/15 ", out, re.M)) == 15


def test_digits_ship_with_the_package():
    x, y = demo.load_digits()
    assert x.shape == (1797, 1, 8, 8) and x.dtype == np.float32 and 0 <= x.min() and x.max() == 1
    assert np.bincount(y).min() >= 170        # ten balanced classes
    xtr, ytr, xte, yte = demo.split(x, y, 0.2, 0)
    assert len(xtr) + len(xte) == 1797 and abs(len(xte) - 359) <= 5
    assert set(np.unique(yte)) == set(range(10))


def test_curves_are_drawn_with_log_loss_and_labelled_epochs(tmp_path, monkeypatch):
    from matplotlib.figure import Figure
    figures = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (figures.append(fig), real(fig, *a, **k))[1])
    history = {"train loss": [2.0, 0.5, 0.1], "test loss": [2.1, 0.6, 0.2],
               "train accuracy": [0.3, 0.8, 0.95], "test accuracy": [0.3, 0.75, 0.9]}
    demo.plot_curves(str(tmp_path / "c.png"), history)
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    ax_loss, ax_acc = figures[0].axes
    assert ax_loss.get_yscale() == "log" and ax_acc.get_yscale() == "linear"
    assert ax_loss.get_xlabel() == ax_acc.get_xlabel() == "epoch"
    assert ax_acc.get_ylabel() == "accuracy" and "loss" in ax_loss.get_ylabel()
    np.testing.assert_array_equal(ax_loss.lines[0].get_xdata(), [1, 2, 3])
    np.testing.assert_allclose(ax_acc.lines[1].get_ydata(), history["test accuracy"])
    # drawn without pyplot: nothing registered with its figure manager
    assert "matplotlib.pyplot" not in sys.modules or not sys.modules["matplotlib.pyplot"].get_fignums()


def test_training_leaves_nothing_heavy_loaded_before_the_curves(tmp_path):
    """The demo imports matplotlib only to draw (not while it trains), and
    gives back the host pool's cached blocks and oneDNN's primitives
    before it draws: checked in a child process, where nothing else has
    imported matplotlib."""
    code = ("import sys\n"
            "import gradcore.demo as demo, gradcore.memory as mem\n"
            "from gradcore.cpu import onednn\n"
            "seen = {}\n"
            "def plot(path, history):\n"
            "    seen.update(mpl='matplotlib' in sys.modules, cached=mem.stats()['cached_bytes'],\n"
            "                prims=onednn.stats()['size'])\n"
            "demo.plot_curves = plot\n"
            f"assert demo.main(['--out', {str(tmp_path)!r}, '--epochs', '1']) == 0\n"
            "assert seen == dict(mpl=False, cached=0, prims=0), seen\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def test_progress_bar_draws_on_a_terminal_only(monkeypatch):
    tty = io.StringIO()
    tty.isatty = lambda: True
    monkeypatch.setattr("sys.stdout", tty)
    bar = demo.progress_bar(1, 3, 4)
    for _ in range(4):
        bar.update(1)
    bar.close()
    assert "epoch 1/3" in tty.getvalue() and "\r" in tty.getvalue()
    log = io.StringIO()
    monkeypatch.setattr("sys.stdout", log)
    bar = demo.progress_bar(1, 3, 4)
    bar.update(4)
    bar.close()
    assert log.getvalue() == ""
