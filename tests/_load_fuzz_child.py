"""The fuzz test's runner (tests/test_serialization.py), run as a child
process: it loads each damaged copy of a file in a forked process of its
own, so a crash or a hang is seen and counted, never taken for a result.

Usage: python _load_fuzz_child.py FILE SEED  -> one JSON line of counts."""
import io
import json
import os
import signal
import sys

import numpy as np

import gradcore as gc
from gradcore.serialization import LoadError


def same(a, b):
    """Bit-exact equality of two loaded trees."""
    if type(a) is not type(b):
        return False
    if isinstance(a, gc.Tensor):
        return (a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and a.name == b.name
                and a.numpy().tobytes() == b.numpy().tobytes())
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def cases(data, rng):
    n = len(data)
    for cut in range(n):                                  # every truncation
        yield "truncate", data[:cut]
    for _ in range(300):                                  # single-bit flips
        pos, bit = int(rng.integers(n)), int(rng.integers(8))
        yield "flip", data[:pos] + bytes([data[pos] ^ (1 << bit)]) + data[pos + 1:]
    for _ in range(200):                                  # byte overwrites, 1-8 bytes
        pos, k = int(rng.integers(n)), int(rng.integers(1, 9))
        junk = bytes(rng.integers(0, 256, k, dtype=np.uint8))
        damaged = data[:pos] + junk + data[pos + k:]
        yield "overwrite", damaged[:n]


def main(path, seed):
    data = open(path, "rb").read()
    expected = gc.load(io.BytesIO(data))
    counts = {"load_error": 0, "unchanged": 0, "changed": 0, "other_error": 0, "crash": 0, "cases": 0}
    examples = []
    for kind, damaged in cases(data, np.random.default_rng(seed)):
        if damaged == data:
            continue                                      # an overwrite by the same bytes
        counts["cases"] += 1
        pid = os.fork()
        if pid == 0:                                      # the child: one load, its outcome as exit code
            signal.alarm(20)                              # a hang dies by SIGALRM: counted as a crash
            code = 4
            try:
                out = gc.load(io.BytesIO(damaged))
                code = 1 if same(out, expected) else 2
            except LoadError:
                code = 0
            except BaseException as exc:                  # noqa: BLE001 (what the test counts)
                sys.stderr.write(f"{kind}: {type(exc).__name__}: {exc}\n")
                code = 3
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            outcome = "crash"
        else:
            outcome = {0: "load_error", 1: "unchanged", 2: "changed", 3: "other_error"}.get(
                os.WEXITSTATUS(status), "crash")
        counts[outcome] += 1
        if outcome not in ("load_error", "unchanged") and len(examples) < 5:
            examples.append(f"{kind} -> {outcome}")
    counts["examples"] = examples
    print(json.dumps(counts))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
