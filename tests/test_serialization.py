"""gradcore.save / gradcore.load: round trips, map_location, the restricted
unpickler, and clear errors on foreign or truncated files."""
import io
import os
import pickle

import numpy as np
import pytest

import gradcore as gc
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore.autodiff import GradManager
from gradcore.serialization import MAGIC, LoadError


def _roundtrip(obj, **kw):
    buf = io.BytesIO()
    gc.save(obj, buf)
    buf.seek(0)
    return gc.load(buf, **kw)


def test_tensors_and_nested_containers_round_trip(tmp_path):
    obj = {"t": gc.tensor([[1.0, 2.0], [3.0, 4.0]]), "p": gc.Parameter(np.arange(3.0)),
           "i": gc.tensor([1, 2], dtype="int32"), "nested": [(np.float32(1.5), {"x": np.eye(2)}), "s", None],
           "set": {1, 2}, "c": 1 + 2j}
    obj["t"].name = "tee"
    path = tmp_path / "obj.gc"
    gc.save(obj, str(path))
    back = gc.load(path)
    assert type(back["p"]) is gc.Parameter and type(back["t"]) is gc.Tensor
    np.testing.assert_array_equal(back["t"].numpy(), obj["t"].numpy())
    assert back["t"].dtype == np.float32 and back["t"].name == "tee" and back["t"].device == "cpu"
    assert back["i"].dtype == np.int32
    np.testing.assert_array_equal(back["p"].numpy(), np.arange(3.0, dtype=np.float32))
    assert back["nested"][0][0] == np.float32(1.5) and back["nested"][1:] == ["s", None]
    np.testing.assert_array_equal(back["nested"][0][1]["x"], np.eye(2))
    assert back["set"] == {1, 2} and back["c"] == 1 + 2j
    # a loaded tensor owns its buffer
    back["t"]._data[0, 0] = 9
    assert obj["t"].numpy()[0, 0] == 1


def test_module_and_optimizer_state_resume_training():
    gc.random.seed(0)
    net = M.Sequential(M.Linear(3, 4), M.ReLU(), M.Linear(4, 2))
    opt = optim.Adam(net.parameters(), lr=0.1)
    gm = GradManager().attach(net.parameters())
    x = gc.tensor(np.random.default_rng(0).normal(size=(5, 3)))

    def step(net, opt, gm):
        with gm:
            gm.backward((net(x) ** 2).mean())
        opt.step().clear_grad()

    step(net, opt, gm)
    saved = _roundtrip({"net": net.state_dict(), "opt": opt.state_dict()})
    net2 = M.Sequential(M.Linear(3, 4), M.ReLU(), M.Linear(4, 2))
    opt2 = optim.Adam(net2.parameters(), lr=0.5)
    net2.load_state_dict(saved["net"])
    opt2.load_state_dict(saved["opt"])
    gm2 = GradManager().attach(net2.parameters())
    step(net, opt, gm)
    step(net2, opt2, gm2)
    for a, b in zip(net.parameters(), net2.parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)


def test_map_location_forms(monkeypatch):
    # the file records the device; map_location rewrites it before the
    # tensor is rebuilt (recorded through _rebuild_tensor's device argument)
    import gradcore.serialization as ser
    seen = []
    real = ser._rebuild_tensor
    monkeypatch.setattr(ser, "_rebuild_tensor", lambda cls, d, dev, n: seen.append(dev) or real(cls, d, "cpu", n))
    t = gc.tensor([1.0])
    _roundtrip(t)
    _roundtrip(t, map_location="cuda")
    _roundtrip(t, map_location={"cpu": "cuda:0"})
    _roundtrip(t, map_location=lambda dev: dev + "!")
    assert seen == ["cpu", "cuda", "cuda:0", "cpu!"]
    with pytest.raises(TypeError, match="map_location"):
        _roundtrip(t, map_location=3)


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_malicious_pickle_is_refused_by_default(tmp_path):
    payload = MAGIC + pickle.dumps({"w": np.ones(2), "evil": _Boom()})
    path = tmp_path / "evil.gc"
    path.write_bytes(payload)
    with pytest.raises(LoadError, match=r"refused to load the global (posix|os|nt)\.system"):
        gc.load(path)
    # a Module is code too: refused unless trusted
    gc.save(M.Linear(2, 2), str(tmp_path / "m.gc"))
    with pytest.raises(LoadError, match="weights_only=False"):
        gc.load(tmp_path / "m.gc")
    assert isinstance(gc.load(tmp_path / "m.gc", weights_only=False), M.Linear)


def test_foreign_and_truncated_files(tmp_path):
    foreign = tmp_path / "x.npy"
    np.save(foreign, np.ones(3))
    with pytest.raises(LoadError, match="not written by gradcore.save"):
        gc.load(foreign)
    (tmp_path / "plain.pkl").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(LoadError, match="not written by gradcore.save"):
        gc.load(tmp_path / "plain.pkl")
    buf = io.BytesIO()
    gc.save({"w": gc.tensor(np.ones((10, 10)))}, buf)
    data = buf.getvalue()
    for cut in (5, len(MAGIC) + 3, len(data) // 2, len(data) - 1):
        (tmp_path / "cut.gc").write_bytes(data[:cut])
        with pytest.raises(LoadError, match="truncated"):
            gc.load(tmp_path / "cut.gc")
    (tmp_path / "empty.gc").write_bytes(b"")
    with pytest.raises(LoadError, match="truncated"):
        gc.load(tmp_path / "empty.gc")
