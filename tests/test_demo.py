"""The main job: the digits CNN reaches 95% held-out accuracy and writes its
curves and summary."""
import re
import struct
import zlib

import numpy as np

from gradcore import demo
from gradcore.plot import write_png


def test_demo_trains_digits_to_95_percent(tmp_path, capsys):
    assert demo.main(["--out", str(tmp_path), "--seed", "0"]) == 0
    summary = (tmp_path / "summary.txt").read_text()
    acc = float(re.search(r"final test accuracy ([0-9.]+)", summary).group(1))
    assert acc >= 0.95, summary
    png = (tmp_path / "training_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "epoch 15/15" in capsys.readouterr().out


def test_digits_ship_with_the_package():
    x, y = demo.load_digits()
    assert x.shape == (1797, 1, 8, 8) and x.dtype == np.float32 and 0 <= x.min() and x.max() == 1
    assert np.bincount(y).min() >= 170        # ten balanced classes
    xtr, ytr, xte, yte = demo.split(x, y, 0.2, 0)
    assert len(xtr) + len(xte) == 1797 and abs(len(xte) - 359) <= 5
    assert set(np.unique(yte)) == set(range(10))


def test_png_writer_round_trip(tmp_path):
    img = np.zeros((3, 4, 3), np.uint8)
    img[1, 2] = (10, 20, 30)
    write_png(str(tmp_path / "a.png"), img)
    data = (tmp_path / "a.png").read_bytes()
    w, h = struct.unpack(">II", data[16:24])
    assert (w, h) == (4, 3)
    idat = data[data.index(b"IDAT") + 4:data.index(b"IEND") - 8]
    rows = zlib.decompress(idat)
    assert rows[1 * 13 + 1 + 2 * 3:1 * 13 + 1 + 3 * 3] == bytes([10, 20, 30])
