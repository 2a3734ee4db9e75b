"""gradcore.cpu.blas.single_threaded(): NumPy's OpenBLAS on one thread in
the scope, its count given back after (nested scopes, several threads, an
exception), nothing changed when off; the LSTM layer ops run their small
per-step products in it and their large ones outside it."""
import os
import threading

import numpy as np
import pytest

from gradcore.cpu import blas
from gradcore.ops import rnn


@pytest.fixture
def two_threads():
    """OpenBLAS at 2 threads for the test (whatever the environment set),
    the count it had restored after."""
    found = blas._lookup()
    if found is None:
        pytest.skip(f"not OpenBLAS here: {blas.status()}")
    before = blas.num_threads()
    found[2](2)
    try:
        yield
    finally:
        found[2](before)


def test_scope_sets_one_thread_and_restores_it(two_threads):
    with blas.single_threaded():
        assert blas.num_threads() == 1
        with blas.single_threaded():
            assert blas.num_threads() == 1
        assert blas.num_threads() == 1          # the inner scope gives nothing back
    assert blas.num_threads() == 2
    with pytest.raises(KeyError):
        with blas.single_threaded():
            raise KeyError("x")
    assert blas.num_threads() == 2


def test_scopes_of_several_threads_restore_the_count_once_all_close(two_threads):
    entered, release = threading.Barrier(3), threading.Event()
    seen = []

    def work():
        with blas.single_threaded():
            entered.wait()
            release.wait()
            seen.append(blas.num_threads())
    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    entered.wait()
    assert blas.num_threads() == 1
    release.set()
    for t in threads:
        t.join()
    assert seen == [1, 1] and blas.num_threads() == 2


def test_scope_off_changes_nothing(two_threads, monkeypatch):
    monkeypatch.setattr(blas, "enabled", False)
    with blas.single_threaded():
        assert blas.num_threads() == 2
    assert "off" in blas.status()


def test_lstm_layer_runs_its_small_products_single_threaded(two_threads, monkeypatch):
    rng = np.random.default_rng(0)
    T, B, H = 3, 2, 4
    gx, h0, c0, w = (rng.standard_normal(s) for s in ((T, B, 4 * H), (B, H), (B, H), (4 * H, H)))
    counts = []
    real = np.matmul
    monkeypatch.setattr(np, "matmul", lambda *a, **k: counts.append(blas.num_threads()) or real(*a, **k))
    hs, cs, gates = rnn._lstm_layer_cpu(False, gx, h0, c0, w)
    rnn._lstm_layer_backward_cpu(False, h0, c0, w, hs, cs, gates, hs, cs, gates)
    # T products forward, T backward on one thread; dw's two products on every thread
    assert counts == [1] * (2 * T) + [2, 2] and blas.num_threads() == 2
    counts.clear()
    monkeypatch.setattr(rnn, "SMALL_GEMM", 0)            # every product large: every thread
    hs2, *_ = rnn._lstm_layer_cpu(False, gx, h0, c0, w)
    assert counts == [2] * T
    np.testing.assert_array_equal(hs2, hs)


@pytest.mark.skipif(not hasattr(os, "fork") or not os.path.isdir("/proc/self/task"),
                    reason="needs fork and /proc to count a child's threads")
def test_one_thread_from_now_in_a_forked_child_starts_no_pool(two_threads):
    _ = np.ones((256, 256)) @ np.ones((256, 256))        # the parent's pool is up
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:            # the child: one thread, OpenBLAS's pool stopped by the fork
        try:
            ok = blas.one_thread_from_now()
            _ = np.ones((256, 256)) @ np.ones((256, 256))
            os.write(w, f"{int(ok)} {blas.num_threads()} {len(os.listdir('/proc/self/task'))}".encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 64).decode().split()
    os.close(r)
    os.waitpid(pid, 0)
    assert got == ["1", "1", "1"]           # count 1, and no thread started for it
    assert blas.num_threads() == 2          # the parent's count is untouched
