"""A tiny PNG line-plot writer (NumPy + zlib), so the demo draws its curves
without a plotting dependency.

Example::

    >>> write_curves("curves.png", {"loss": [2.3, 1.1, 0.4]}, {"test accuracy": [0.5, 0.9, 0.97]})
"""
from __future__ import annotations

import struct
import zlib
from typing import Dict, Sequence

import numpy as np

# 3x5 bitmap glyphs for the few characters the plots use
_GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001001001001", "8": "111101111101111",
    "9": "111101111001111", ".": "000000000000010", " ": "000000000000000",
    "-": "000000111000000", "%": "101001010100101",
}
for _c, _rows in {"A": "010101111101101", "C": "111100100100111", "E": "111100111100111",
                  "L": "100100100100111", "O": "111101101101111", "P": "111101111100100",
                  "R": "110101110101101", "S": "111100111001111", "T": "111010010010010",
                  "U": "101101101101111", "Y": "101101010010010", "H": "101101111101101",
                  "N": "111101101101101", "I": "111010010010111", "D": "110101101101110",
                  "G": "111100101101111", "M": "101111111101101", "B": "110101110101110",
                  "V": "101101101101010", "X": "101101010101101", "K": "101110100110101",
                  "F": "111100111100100", "W": "101101111111101", "Z": "111001010100111",
                  "J": "001001001101111", "Q": "111101101111001"}.items():
    _GLYPHS[_c] = _rows

_COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14)]


def _text(img, x, y, s, scale=2, colour=(0, 0, 0)):
    for ch in s.upper():
        g = _GLYPHS.get(ch, _GLYPHS[" "])
        for r in range(5):
            for c in range(3):
                if g[r * 3 + c] == "1":
                    img[y + r * scale:y + (r + 1) * scale, x + c * scale:x + (c + 1) * scale] = colour
        x += 4 * scale


def _panel(img, x0, y0, w, h, title, series: Dict[str, Sequence[float]]):
    img[y0:y0 + h, x0] = img[y0 + h - 1, x0:x0 + w] = (0, 0, 0)
    values = [v for s in series.values() for v in s]
    if not values:
        return
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:
        hi = lo + 1.0
    _text(img, x0 + 4, y0 - 14, title)
    _text(img, x0 - 52, y0, f"{hi:.3g}"[:6], scale=1)
    _text(img, x0 - 52, y0 + h - 6, f"{lo:.3g}"[:6], scale=1)
    for k in range(1, 4):  # light grid
        img[y0 + k * h // 4, x0 + 1:x0 + w:3] = (200, 200, 200)
    for idx, (name, s) in enumerate(series.items()):
        colour = _COLOURS[idx % len(_COLOURS)]
        n = len(s)
        xs = np.linspace(x0 + 2, x0 + w - 3, max(n, 2))
        ys = y0 + (h - 3) - (np.asarray(s, float) - lo) / (hi - lo) * (h - 6)
        for i in range(n - 1 if n > 1 else 1):
            xa, ya = xs[i], ys[i]
            xb, yb = (xs[i + 1], ys[i + 1]) if n > 1 else (xs[i], ys[i])
            steps = int(max(abs(xb - xa), abs(yb - ya))) + 1
            for t in np.linspace(0.0, 1.0, steps):
                px, py = int(round(xa + t * (xb - xa))), int(round(ya + t * (yb - ya)))
                img[py - 1:py + 1, px - 1:px + 1] = colour
        _text(img, x0 + w - 150, y0 + 6 + 12 * idx, name[:18], scale=1, colour=colour)


def write_png(path: str, rgb: np.ndarray) -> None:
    """Write an (H, W, 3) uint8 array as a PNG file."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)


def write_curves(path: str, left: Dict[str, Sequence[float]], right: Dict[str, Sequence[float]],
                 left_title: str = "loss", right_title: str = "accuracy") -> None:
    """Two side-by-side line panels (e.g. loss and accuracy per epoch) as a PNG."""
    img = np.full((300, 820, 3), 255, np.uint8)
    _panel(img, 70, 40, 320, 230, left_title, left)
    _panel(img, 480, 40, 320, 230, right_title, right)
    write_png(path, img)
