"""gradcore.save / gradcore.load: round trips, map_location, the restricted
unpickler, and clear errors on foreign or truncated files."""
import io
import json
import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

import gradcore as gc
import gradcore
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore.autodiff import GradManager
from gradcore.serialization import MAGIC, MAGIC_V1, LoadError
from oracle import optimizer_steps


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
    _roundtrip(t, map_location=lambda dev: dev.upper())
    # devices are normalised ("cuda:0" and "CPU" as gradcore spells them)
    assert seen == ["cpu", "cuda", "cuda", "cpu"]
    with pytest.raises(TypeError, match="map_location"):
        _roundtrip(t, map_location=3)
    with pytest.raises(LoadError, match="map_location gives the unknown device 'cpu!'"):
        _roundtrip(t, map_location=lambda dev: dev + "!")
    with pytest.raises(LoadError, match="map_location gives a device of type int"):
        _roundtrip(t, map_location={"cpu": 0})


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_malicious_pickle_is_refused_by_default(tmp_path):
    payload = MAGIC_V1 + pickle.dumps({"w": np.ones(2), "evil": _Boom()}, protocol=5)
    path = tmp_path / "evil.gc"
    path.write_bytes(payload)
    with pytest.raises(LoadError, match=r"refused to load the global (posix|os|nt)\.system"):
        gc.load(path)
    # a Module is code too: refused unless trusted
    gc.save(M.Linear(2, 2), str(tmp_path / "m.gc"))
    with pytest.raises(LoadError, match=r"pickled Python objects \(a gradcore.module.*Linear\).*weights_only=False"):
        gc.load(tmp_path / "m.gc")
    assert isinstance(gc.load(tmp_path / "m.gc", weights_only=False), M.Linear)


def test_foreign_and_truncated_files(tmp_path):
    foreign = tmp_path / "x.npy"
    np.save(foreign, np.ones(3))
    with pytest.raises(LoadError, match="not written by gradcore.save"):
        gc.load(foreign)
    # a file that is one pickle (megengine.save's format) loads with the checked loader
    (tmp_path / "plain.pkl").write_bytes(pickle.dumps({"a": 1}))
    assert gc.load(tmp_path / "plain.pkl") == {"a": 1}
    (tmp_path / "text.txt").write_bytes(b"hello, world: not a checkpoint")
    with pytest.raises(LoadError, match="not written by gradcore.save"):
        gc.load(tmp_path / "text.txt")
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


# ---------------------------------------------------------------- format 2: safe by construction
import hashlib  # noqa: E402

from gradcore import _core  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _v2_file(header, payload=b""):
    """A version-2 file with correct digests around ``header`` and
    ``payload``: what a crafted file can do (it can recompute checksums)."""
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    prefix = MAGIC + struct.pack("<QQ", len(hb), len(payload)) + hb
    return prefix + hashlib.sha256(prefix).digest() + payload + hashlib.sha256(payload).digest()


def _tree(root, arrays=(), tensors=()):
    return {"kind": "tree", "root": root, "arrays": list(arrays), "tensors": list(tensors)}


def _load_bytes(data, **kw):
    return gc.load(io.BytesIO(data), **kw)


class _Reduce:
    """Pickles as ``fn(*args)``: how a crafted version-1 file calls a global."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def _v1_file(obj):
    return MAGIC_V1 + pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def test_saved_file_holds_no_pickle_and_documents_its_layout():
    buf = io.BytesIO()
    gc.save({"w": gc.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3)), "n": 3}, buf)
    data = buf.getvalue()
    assert data.startswith(MAGIC)
    hlen, plen = struct.unpack("<QQ", data[16:32])
    header = json.loads(data[32:32 + hlen])
    assert header["kind"] == "tree" and header["arrays"] == [
        {"dtype": "<f4", "shape": [2, 3], "order": "C", "offset": 0}]
    assert len(data) == 32 + hlen + 32 + plen + 32 and plen == 24
    payload = data[32 + hlen + 32:32 + hlen + 32 + plen]
    assert payload == np.arange(6.0, dtype=np.float32).tobytes()
    assert data[-32:] == hashlib.sha256(payload).digest()
    assert b"\x80\x05" not in data[:32 + hlen]            # no pickle protocol marker in the header


@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                   "uint32", "uint64", "float16", "float32", "float64",
                                   "complex64", "complex128"])
def test_arrays_round_trip_bit_exact_for_every_dtype_and_layout(dtype, rng):
    raw = rng.integers(0, 256, size=4 * 6 * 16, dtype=np.uint8)
    base = raw[: 4 * 6 * np.dtype(dtype).itemsize].view(dtype).reshape(4, 6)   # any bit pattern (NaN payloads too)
    if dtype == "bool":
        base = base.view(np.uint8) % 2 == 1
    layouts = {"C": base, "F": np.asfortranarray(base), "strided": base[::2, ::3], "T": base.T,
               "0-d": np.array(base[1, 2]), "empty": base[:0], "big-endian": base.astype(base.dtype.newbyteorder(">"))}
    back = _roundtrip(layouts)
    for k, a in layouts.items():
        b = back[k]
        assert type(b) is np.ndarray and b.shape == a.shape and b.flags.writeable
        assert b.dtype == a.dtype.newbyteorder("=")
        assert b.tobytes() == a.astype(b.dtype).tobytes(), k
    assert back["F"].flags.f_contiguous and back["T"].flags.f_contiguous
    scalar = _roundtrip(base.reshape(-1)[0])
    assert type(scalar) is type(base.reshape(-1)[0]) and scalar.tobytes() == base.reshape(-1)[0].tobytes()
    if dtype[0] != "c":                                    # tensors do not hold complex
        t = gc.tensor(base)
        tb = _roundtrip(t)
        assert type(tb) is gc.Tensor and tb.dtype == t.dtype and tb.numpy().tobytes() == t.numpy().tobytes()
        tf = _roundtrip(gc.Parameter(np.asfortranarray(base)))
        assert type(tf) is gc.Parameter and tf.numpy().tobytes() == np.asfortranarray(base).tobytes()


def test_plain_values_round_trip_with_their_types_and_shared_tensors():
    from collections import OrderedDict
    t = gc.tensor([1.0, 2.0])
    obj = OrderedDict(b=[1, 2.5, float("inf"), -0.0, True, None, "s", b"\x00\xff", 3 - 1j, 2 ** 80],
                      a=(frozenset({1, 2}), {3}, {(1, 2): "tuple key", 4: "int key"}), t1=t, t2=t)
    back = _roundtrip(obj)
    assert type(back) is OrderedDict and list(back) == ["b", "a", "t1", "t2"]
    assert back["b"] == obj["b"] and [type(x) for x in back["b"]] == [type(x) for x in obj["b"]]
    assert str(back["b"][3]) == "-0.0"
    assert back["a"] == obj["a"] and type(back["a"]) is tuple
    assert back["t1"] is back["t2"]                        # one tensor saved twice stays one
    nan = _roundtrip(float("nan"))
    assert nan != nan


def test_load_reads_no_more_memory_than_the_arrays(tmp_path):
    import tracemalloc
    big = np.arange(4 << 20, dtype=np.float32)             # 16 MiB
    gc.save({"w": gc.tensor(big), "b": big}, str(tmp_path / "big.gc"))
    tracemalloc.start()
    try:
        back = gc.load(tmp_path / "big.gc")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * big.nbytes + (1 << 20), peak         # the two arrays, no copy of the file
    np.testing.assert_array_equal(back["b"], big)


# ------------------------------------------------- crafted files (issue 23's table)
def test_object_dtype_arrays_cannot_be_built():
    # the crash of version 1: an object array over bytes from the file
    for obj in (np.array([b"x", None], dtype=object),
                _Reduce(np._core.numeric._frombuffer, bytearray(16), np.dtype(object), (2,), "C"),
                {"d": np.dtype(object)}):
        with pytest.raises(LoadError):
            _load_bytes(_v1_file(obj))
    with pytest.raises(LoadError, match="array record 0 has the dtype '|O'"):
        _load_bytes(_v2_file(_tree({"ndarray": 0}, [{"dtype": "|O", "shape": [2], "order": "C", "offset": 0}]),
                             bytes(16)))
    for bad in ("<U4", "|V8", ">f4", "<M8[s]", "<f16", 7, None):
        with pytest.raises(LoadError, match="has the dtype"):
            _load_bytes(_v2_file(_tree({"ndarray": 0}, [{"dtype": bad, "shape": [1], "order": "C", "offset": 0}]),
                                 bytes(16)))


def test_no_constructor_allocates_by_a_size_the_file_claims():
    import time
    start = time.perf_counter()
    with pytest.raises(LoadError, match="bytearray"):
        _load_bytes(_v1_file(_Reduce(bytearray, 1 << 32)))
    with pytest.raises(LoadError, match="numpy.ndarray"):
        _load_bytes(_v1_file(_Reduce(np.ndarray, (1 << 34,))))
    # a BINBYTES8 / BYTEARRAY8 opcode claiming 1 TiB in a 40-byte file
    for opcode in (b"\x8e", b"\x96"):
        with pytest.raises(LoadError, match="truncated or corrupt|corrupt"):
            _load_bytes(MAGIC_V1 + b"\x80\x05" + opcode + struct.pack("<Q", 1 << 40) + b"abc.")
    # version 2: lengths and shapes are checked against the bytes present first
    with pytest.raises(LoadError, match="declares"):
        _load_bytes(MAGIC + struct.pack("<QQ", 1 << 40, 0) + b"{}")
    with pytest.raises(LoadError, match="does not fit the payload"):
        _load_bytes(_v2_file(_tree({"ndarray": 0}, [{"dtype": "<f8", "shape": [1 << 40], "order": "C",
                                                      "offset": 0}]), bytes(64)))
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("data", ["abc", None, 3, {"a": 1}, [1.0, 2.0], b"\x00" * 8, {1, 2},
                                  np.ones(2, np.complex64), np.array(["a"])])
def test_a_tensor_record_must_hold_an_array_of_a_tensor_dtype(data):
    with pytest.raises(LoadError, match="tensor record|dtype record names 'U1'"):
        _load_bytes(_v1_file(_Reduce(_core._rebuild_tensor, gc.Tensor, data, "cpu", None)))


def test_version_2_tensor_records_are_validated():
    arr = [{"dtype": "<f4", "shape": [2], "order": "C", "offset": 0}]
    good = {"cls": "Tensor", "array": 0, "device": "CPU", "name": None}
    t = _load_bytes(_v2_file(_tree({"tensor": 0}, arr, [good]), bytes(8)))
    assert type(t) is gc.Tensor and t.device == "cpu"       # "CPU" -> "cpu"
    for change, match in (({"array": "x"}, "outside the array table"), ({"array": 1}, "outside the array table"),
                          ({"array": None}, "outside the array table"), ({"cls": "Module"}, "only Tensor and Parameter"),
                          ({"cls": "os.system"}, "only Tensor and Parameter"),
                          ({"device": "tpu"}, "unknown device 'tpu'"), ({"device": 0}, "device of type int"),
                          ({"name": 5}, "name of type int"), ({"extra": 1}, "malformed")):
        with pytest.raises(LoadError, match=match):
            _load_bytes(_v2_file(_tree({"tensor": 0}, arr, [{**good, **change}]), bytes(8)))
    cplx = [{"dtype": "<c8", "shape": [1], "order": "C", "offset": 0}]
    with pytest.raises(LoadError, match="complex64"):
        _load_bytes(_v2_file(_tree({"tensor": 0}, cplx, [good]), bytes(8)))
    for root, match in (({"eval": "1"}, "unknown kind"), ({"tensor": 3}, "outside the tensor table"),
                        ({"dict": [[{"list": []}, 1]]}, "unhashable"), ({"npscalar": 0}, "scalar record has shape"),
                        ({"complex": ["a", 1]}, "unknown kind"), ({"bytes": "***"}, "corrupt")):
        with pytest.raises(LoadError, match=match):
            _load_bytes(_v2_file(_tree(root, arr, [good]), bytes(8)))


def test_array_tables_must_tile_the_payload():
    spec = {"dtype": "<f4", "shape": [2], "order": "C", "offset": 0}
    for specs, payload, match in (([{**spec, "offset": 8}], bytes(16), "does not fit"),
                                  ([spec, {**spec, "offset": 8}], bytes(72), "does not fit"),
                                  ([spec], bytes(16), "the arrays take 8 bytes, the payload is 16"),
                                  ([{**spec, "shape": [-1]}], bytes(8), "invalid shape"),
                                  ([{**spec, "shape": [True]}], bytes(8), "invalid shape"),
                                  ([{**spec, "order": "K"}], bytes(8), "invalid order"),
                                  ([spec, {**spec, "offset": 64}], bytes(64) + bytes(8), None)):
        if match is None:
            back = _load_bytes(_v2_file(_tree({"list": [{"ndarray": 0}, {"ndarray": 1}]}, specs), payload))
            assert len(back) == 2
            continue
        with pytest.raises(LoadError, match=match):
            _load_bytes(_v2_file(_tree({"ndarray": 0}, specs), payload))
    with pytest.raises(LoadError, match="padding between arrays is not zero"):
        _load_bytes(_v2_file(_tree({"ndarray": 1}, [spec, {**spec, "offset": 64}]), bytes(8) + b"\x01" + bytes(63)))


def test_deep_or_huge_headers_give_load_errors():
    deep = "[" * 100000 + "]" * 100000
    hb = deep.encode()
    prefix = MAGIC + struct.pack("<QQ", len(hb), 0) + hb
    with pytest.raises(LoadError, match="unreadable header"):
        _load_bytes(prefix + hashlib.sha256(prefix).digest() + hashlib.sha256(b"").digest())
    nested, expected = 0, 0
    for _ in range(150):
        nested, expected = {"list": [nested]}, [expected]
    data = _v2_file(_tree(nested))
    assert _load_bytes(data) == expected
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(120)          # the tree is decoded recursively: too deep is a LoadError
    try:
        with pytest.raises(LoadError, match="RecursionError"):
            _load_bytes(data)
    finally:
        sys.setrecursionlimit(limit)
    with pytest.raises(LoadError, match="unreadable header"):
        _load_bytes(_v2_file(b'{"kind": "tree", "arrays": [], "tensors": [], "root": ' + b"9" * 5000 + b"}"))


def test_uninitialised_tensors_cannot_be_loaded_or_used():
    # version 1 could make one (Tensor.__new__ through a reduce); now refused
    with pytest.raises(LoadError, match="refused to load the global"):
        _load_bytes(_v1_file(_Reduce(gc.Tensor.__new__, gc.Tensor)))
    with pytest.raises(LoadError):                          # the class is not callable from a file
        _load_bytes(MAGIC_V1 + b"\x80\x05\x8c\x0egradcore._core\x8c\x06Tensor\x93)R.")
    t = gc.Tensor.__new__(gc.Tensor)
    for use in (lambda: t + 1, lambda: t.shape, lambda: repr(t), lambda: t.numpy(), lambda: np.asarray(t),
                lambda: len(t), lambda: bool(t), lambda: gc.tensor([1.0]) * t, lambda: t.sum(),
                lambda: gc.save(t, io.BytesIO())):
        with pytest.raises(TypeError, match="uninitialised Tensor"):
            use()


def test_corruption_is_caught_by_the_checksums():
    buf = io.BytesIO()
    gc.save({"w": gc.tensor(np.arange(20.0))}, buf)
    data = bytearray(buf.getvalue())
    hlen = struct.unpack("<Q", data[16:24])[0]
    payload_at = 32 + hlen + 32
    for pos, match in ((payload_at + 5, "payload's checksum"), (40, "header's checksum"),
                       (len(data) - 1, "payload's checksum"), (32 + hlen + 3, "header's checksum")):
        bad = bytearray(data)
        bad[pos] ^= 0x10
        with pytest.raises(LoadError, match=match):
            _load_bytes(bytes(bad))


def test_bad_arguments_and_missing_files(tmp_path):
    for bad in (None, 12345, 1.5, b"GRADCORE", ["x"]):
        with pytest.raises(TypeError, match="expected a path or a binary file object"):
            gc.load(bad)
    with pytest.raises(TypeError, match="binary"):
        gc.load(io.StringIO("text"))
    with pytest.raises(LoadError, match="cannot open") as info:
        gc.load(tmp_path / "missing.gc")
    assert isinstance(info.value, OSError)
    with pytest.raises(TypeError, match="gradcore.save"):
        gc.save({"a": 1}, 5)


def test_version_1_files_still_load():
    from collections import OrderedDict
    t = gc.tensor([[1.0, 2.0], [3.0, 4.0]])
    t.name = "tee"
    obj = {"t": t, "p": gc.Parameter(np.arange(3.0)), "i": gc.tensor([1, 2], dtype="int32"),
           "sd": OrderedDict(w=np.eye(2), f=np.asfortranarray(np.ones((2, 3)))),
           "s": [np.float32(1.5), np.bool_(True), {1, 2}, frozenset({3}), 1 + 2j, b"by", bytearray(b"ba"),
                 slice(1, 2), range(3), np.dtype("float32")]}
    back = _load_bytes(_v1_file(obj))
    assert type(back["p"]) is gc.Parameter and back["t"].name == "tee"
    np.testing.assert_array_equal(back["t"].numpy(), t.numpy())
    assert back["i"].dtype == np.int32 and back["sd"]["f"].flags.f_contiguous
    assert back["s"][:9] == obj["s"][:9] and back["s"][9] == np.dtype("float32")
    assert type(back["s"][0]) is np.float32
    back["t"]._data[0, 0] = 9                              # a loaded tensor owns a writable buffer
    # a strided array (NumPy pickles its values as raw bytes, checked against its shape) loads too
    np.testing.assert_array_equal(_load_bytes(_v1_file({"x": np.eye(3)[:, ::2]}))["x"], np.eye(3)[:, ::2])
    assert _load_bytes(_v1_file({"x": np.eye(3)[:, ::2]}), weights_only=False)["x"].shape == (3, 2)


@pytest.mark.parametrize("version", [2, 1])
def test_fuzzed_files_give_only_load_errors_in_child_processes(tmp_path, version):
    # every truncation, 300 bit flips, 200 byte overwrites: each load in a
    # forked process of its own, so a crash is counted, not suffered
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    obj = {"w": gc.tensor(np.linspace(-1, 1, 12).reshape(3, 4)), "b": gc.Parameter(np.arange(3, dtype=np.int64)),
           "m": np.ones((2, 2), np.float16), "opt": {"lr": 0.1, "steps": [1, 2], "flag": np.bool_(True)}}
    path = tmp_path / "f.gc"
    if version == 2:
        gc.save(obj, str(path))
    else:
        path.write_bytes(_v1_file(obj))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "_load_fuzz_child.py"), str(path), "23"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["cases"] > len(path.read_bytes()) + 400
    assert counts["crash"] == 0 and counts["other_error"] == 0, (counts, proc.stderr[-3000:])
    if version == 2:
        # every byte is under a checksum: no damage loads
        assert counts["changed"] == 0 and counts["unchanged"] == 0, counts
        assert counts["load_error"] == counts["cases"]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_a_megengine_checkpoint_a_plain_pickle_of_arrays_loads_safely(tmp_path, protocol):
    """megengine.save is pickle.dump of a state_dict of NumPy arrays: it
    loads with the checked loader (nothing in it can run code, nothing is
    allocated beyond the arrays it holds)."""
    import collections
    import pickle
    state = collections.OrderedDict(weight=np.arange(6, dtype=np.float32).reshape(2, 3),
                                    bias=np.zeros(3, np.float32), steps=np.int64(7),
                                    fortran=np.asfortranarray(np.arange(6.0).reshape(2, 3)))
    path = tmp_path / "mge.pkl"
    with open(path, "wb") as f:
        pickle.dump({"state_dict": state, "epoch": 3}, f, protocol=protocol)
    out = gradcore.load(path)
    assert out["epoch"] == 3 and list(out["state_dict"]) == ["weight", "bias", "steps", "fortran"]
    for k, v in state.items():
        np.testing.assert_array_equal(out["state_dict"][k], v)
        assert out["state_dict"][k].dtype == v.dtype
    net = M.Linear(3, 2)
    net.load_state_dict({"weight": out["state_dict"]["weight"], "bias": np.zeros(2, np.float32)})
    assert net.weight.numpy().tolist() == state["weight"].tolist()


def test_a_plain_pickle_with_code_or_object_arrays_is_refused(tmp_path):
    import os
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo hacked",))
    for obj in (Evil(), np.array([object()], dtype=object)):
        path = tmp_path / "bad.pkl"
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=4)
        # (the object array: its dtype record is refused before its objects are reached)
        with pytest.raises(LoadError, match="refused|a dtype record names 'O8'"):
            gradcore.load(path)
    # a crafted array record: a shape its bytes do not fill is refused, not allocated
    crafted = (b"\x80\x04cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85C\x01b\x87R"
               b"(K\x01J\x00\xca\x9a;\x85cnumpy\ndtype\nX\x02\x00\x00\x00f8\x89\x88\x87R"
               b"(K\x03X\x01\x00\x00\x00<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89C\x08\x00\x00\x00\x00\x00\x00\x00\x00tb.")
    path = tmp_path / "crafted.pkl"
    path.write_bytes(crafted)
    with pytest.raises(LoadError, match=r"shape \(1000000000,\).*8 bytes"):
        gradcore.load(path)


def test_save_and_load_take_megengines_pickle_arguments(tmp_path):
    import pickle
    path = tmp_path / "m.gc"
    gradcore.save({"w": gradcore.tensor([1.0])}, path, pickle_module=pickle, pickle_protocol=4)
    assert gradcore.load(path, None, pickle)["w"].numpy().tolist() == [1.0]
    gradcore.save({"o": object.__new__(_Plain)}, path, pickle_module=pickle, pickle_protocol=2)
    assert isinstance(gradcore.load(path, weights_only=False)["o"], _Plain)


class _Plain:
    pass


def _megengine_pickle(objs_fn, protocol=4):
    """Bytes of a pickle as ``megengine.save`` writes one: a stand-in module
    ``megengine.tensor`` whose Tensor and Parameter pickle as MegEngine's do
    (written from its __getnewargs__ / __getstate__: NEWOBJ with (array,
    dtype, logical device name, two flags, name, format), an empty state;
    or, ``old=True``, MegEngine 1.1's: no arguments, a state holding data,
    device, the dtype as a NumPy scalar type and an empty qdict)."""
    import types
    mod = types.ModuleType("megengine.tensor")

    class Tensor:
        def __init__(self, data, device="cpu0:0", old=False, qparams=None):
            self.data, self.device, self.old, self.qparams = np.asarray(data), device, old, qparams

        def __getnewargs__(self):
            if self.old:
                return ()
            return (self.data, self.data.dtype, self.device, False, False, None, "default")

        def __getstate__(self):
            if self.old:
                return {"data": self.data, "device": self.device, "dtype": self.data.dtype.type,
                        "qdict": {"mode": None, "scale": None, "zero_point": None}}
            return {} if self.qparams is None else {"qparams": self.qparams}

    class Parameter(Tensor):
        pass
    for cls in (Tensor, Parameter):
        cls.__module__, cls.__qualname__ = "megengine.tensor", cls.__name__
        setattr(mod, cls.__name__, cls)
    saved = {k: sys.modules.get(k) for k in ("megengine", "megengine.tensor")}
    sys.modules["megengine"], sys.modules["megengine.tensor"] = types.ModuleType("megengine"), mod
    try:
        return pickle.dumps(objs_fn(Tensor, Parameter), protocol=protocol)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k)
            else:
                sys.modules[k] = v


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_megengine_pickled_tensors_load_checked_as_gradcore_tensors(protocol):
    """A MegEngine checkpoint with an optimizer's state_dict pickles
    megengine.Tensor objects: they load with weights_only=True, as
    Tensor / Parameter of the saved dtype, device names mapped, a tensor
    referenced twice still one tensor."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)

    def objs(T, P):
        p = P(w)
        return {"param": p, "again": p, "step": T(np.array(3, np.int32)), "old": T([1, 2, 3], old=True),
                "on_gpu": T(np.ones(2, np.float16), device="gpu0:0"), "state": {"exp_avg": T(w * 2, "xpux:0")}}
    out = gc.load(io.BytesIO(_megengine_pickle(objs, protocol)), map_location="cpu")
    assert type(out["param"]) is gc.Parameter and out["again"] is out["param"]
    np.testing.assert_array_equal(out["param"].numpy(), w)
    assert type(out["step"]) is gc.Tensor and out["step"].dtype == np.int32 and out["step"].item() == 3
    old = out["old"]
    assert old.dtype == np.asarray([1, 2, 3]).dtype and old.numpy().tolist() == [1, 2, 3]
    assert out["on_gpu"].dtype == np.float16 and out["on_gpu"].device == "cpu"
    np.testing.assert_array_equal(out["state"]["exp_avg"].numpy(), w * 2)


def test_megengine_tensor_records_are_checked():
    # a quantized tensor's parameters: gradcore has no quantized dtypes
    data = _megengine_pickle(lambda T, P: T(np.ones(2, np.int8), qparams={"scale": 0.5}))
    with pytest.raises(LoadError, match="quantized MegEngine tensor"):
        gc.load(io.BytesIO(data))
    # a state with a key MegEngine never writes (here in place of its data)
    data = _megengine_pickle(lambda T, P: T(np.ones(2), old=True))
    crafted = data.replace(b"data", b"datb")
    with pytest.raises(LoadError, match="a state that MegEngine never writes"):
        gc.load(io.BytesIO(crafted))
    # NEWOBJ reaches only the checking stand-ins: a numpy dtype record made by NEWOBJ is checked
    crafted = b"\x80\x04cnumpy\ndtype\nX\x03\x00\x00\x00abc\x85\x81."
    with pytest.raises(LoadError, match="a dtype record names 'abc'"):
        gc.load(io.BytesIO(crafted))
    crafted = b"\x80\x04cbuiltins\nslice\n)\x81."       # (a stand-in that is no class)
    with pytest.raises(LoadError, match="corrupt"):
        gc.load(io.BytesIO(crafted))


@pytest.mark.parametrize("kind, kwargs", [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
                                          ("Adam", dict(lr=0.05, weight_decay=0.01)),
                                          ("Adagrad", dict(lr=0.1)), ("LAMB", dict(lr=0.05, weight_decay=0.01))])
def test_optimizer_resumes_from_a_megengine_checkpoint(kind, kwargs):
    """MegEngine's Optimizer.state_dict keeps "step" as a float32 scalar
    array (a Tensor with keep_var=True) and SGD's nesterov outside the
    groups; such a checkpoint read by gradcore.load resumes the run exactly
    (load_state_dict refused the scalar step and the group without nesterov)."""
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    grads = [rng.standard_normal((3, 2)).astype(np.float32) for _ in range(6)]

    whole = gradcore.Parameter(w0.copy())
    optimizer_steps(getattr(optim, kind)([whole], **kwargs), whole, grads)
    w = gradcore.Parameter(w0.copy())
    first = getattr(optim, kind)([w], **kwargs)
    optimizer_steps(first, w, grads[:3])
    ours = first.state_dict()
    group = {k: v for k, v in ours["param_groups"][0].items() if k != "nesterov"}

    def objs(T, P):     # MegEngine's form: state arrays as Tensors, the step a float32 scalar
        state = {i: {k: T(np.array(v, np.float32)) for k, v in st.items()} for i, st in ours["state"].items()}
        return {"param": P(w.numpy()), "opt": {"param_groups": [group], "state": state}}
    ckpt = gc.load(io.BytesIO(_megengine_pickle(objs)))
    if kind == "Adam":
        assert ckpt["opt"]["state"][0]["step"].dtype == np.float32
    resumed_w = gradcore.Parameter(ckpt["param"].numpy())
    resumed = getattr(optim, kind)([resumed_w], **dict(kwargs, lr=9.0))
    resumed.load_state_dict(ckpt["opt"])
    assert resumed.param_groups[0]["lr"] == kwargs["lr"]
    optimizer_steps(resumed, resumed_w, grads[3:])
    np.testing.assert_array_equal(resumed_w.numpy(), whole.numpy())
    # a step that is not a whole number is refused, naming the optimizer
    bad = {"param_groups": [group], "state": {0: dict(ckpt["opt"]["state"][0], step=np.array([1.5, 2.0]))}}
    if "step" in ckpt["opt"]["state"][0]:
        with pytest.raises(ValueError, match=f"{kind}.load_state_dict: state 'step'"):
            getattr(optim, kind)([resumed_w], **kwargs).load_state_dict(bad)
