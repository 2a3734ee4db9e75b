"""``gradcore.save`` / ``gradcore.load``: tensors, state dicts, optimizer
states and nested containers to a file and back.

The format (version 2, see docs/serialization.md) holds no pickle for what a
training saves: a JSON header describes the object tree and the arrays, the
array bytes follow raw (little-endian, each at a 64-byte boundary), and two
SHA-256 digests cover the header and the payload::

    offset 0    16 bytes  MAGIC  b"GRADCORE-SAVE\\x00v2"
    offset 16   8 bytes   H, the header's length (unsigned little-endian)
    offset 24   8 bytes   P, the payload's length
    offset 32   H bytes   the header (UTF-8 JSON)
    then        32 bytes  SHA-256 of everything before it
    then        P bytes   the payload: the arrays' bytes
    then        32 bytes  SHA-256 of the payload

``load`` checks the lengths against the bytes really present and the header
digest before it parses anything, allocates exactly the arrays the header
declares (numeric and bool dtypes only, their sizes summing to P), reads the
file into them and checks the payload digest before it returns. Any failure
is a ``LoadError`` naming the file and what failed.

Objects outside that tree (a Module, your own classes, a Tensor subclass)
are saved as a pickle inside the same envelope; such a file loads only with
``weights_only=False``, for files you trust. Files of version 1 (a pickle
after ``MAGIC_V1``) still load through a restricted unpickler that resolves
only tensors, arrays read from bytes present in the file, NumPy scalars and
plain containers.

Example::

    >>> import gradcore as gc, io
    >>> buf = io.BytesIO()
    >>> gc.save({"w": gc.tensor([1.0, 2.0]), "step": 3}, buf)
    >>> _ = buf.seek(0)
    >>> gc.load(buf)["w"].numpy()
    array([1., 2.], dtype=float32)
"""
from __future__ import annotations

import base64
import collections
import hashlib
import io
import json
import math
import os
import pickle
import pickletools
import re
import struct
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Union

import numpy as np

from ._core import Tensor, _rebuild_tensor
from .op import SavedOpMismatchError
from .tensor import Parameter

MAGIC = b"GRADCORE-SAVE\x00v2"
MAGIC_V1 = b"GRADCORE-SAVE\x00v1"
_ALIGN = 64
_DIGEST = 32

PathOrFile = Union[str, "os.PathLike[str]", BinaryIO]
MapLocation = Union[None, str, Dict[str, str], Callable[[str], str]]

# the dtypes an array in a file may have (as NumPy spells them little-endian)
_ARRAY_DTYPES = {np.dtype(t).str: np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128)}
# tensors compute in bool, integers and float16/32/64 (no complex)
_TENSOR_KINDS = "biuf"
_TENSOR_CLASSES = {"Tensor": Tensor, "Parameter": Parameter}

class LoadError(pickle.UnpicklingError):
    """A file that ``gradcore.load`` cannot read: not written by
    ``gradcore.save``, truncated, corrupt (a digest does not match), or
    holding something the safe loader refuses."""


class LoadFileError(LoadError, OSError):
    """The file given to ``gradcore.load`` could not be opened or read (also
    an ``OSError``)."""


class _Unsupported(Exception):
    """``obj`` has a part the pickle-free tree cannot hold (save pickles it)."""


# ---------------------------------------------------------------- save
def save(obj: Any, f: PathOrFile, pickle_module: Any = None, pickle_protocol: Optional[int] = None) -> None:
    """Write ``obj`` (Tensors, NumPy arrays and scalars, numbers, strings,
    bytes, None and nested dicts/lists/tuples/sets of them, e.g. a Module's
    or an optimizer's ``state_dict()``) to a path or a binary file object.
    Other objects are pickled (with ``pickle_module`` and
    ``pickle_protocol``, MegEngine's arguments; the standard ``pickle`` at
    its highest protocol by default); such a file loads only with
    ``weights_only=False``.

    Example::

        >>> import io
        >>> buf = io.BytesIO()
        >>> gc.save({"w": gc.tensor([1.0, 2.0]), "step": 3}, buf)
        >>> gc.load(io.BytesIO(buf.getvalue()))
        {'w': Tensor([1., 2.], dtype=float32, device=cpu), 'step': 3}
    """
    pickler = (pickle_module or pickle, pickle.HIGHEST_PROTOCOL if pickle_protocol is None else pickle_protocol)
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            _write(obj, fh, pickler)
    elif hasattr(f, "write"):
        _write(obj, f, pickler)
    else:
        raise TypeError(f"gradcore.save: expected a path or a binary file object, got {type(f).__name__}")


class _Encoder:
    """The object tree as JSON-able nodes; arrays go to a table whose bytes
    make the payload. A tensor or array seen twice is stored once (loading
    gives one object, as pickle did)."""

    def __init__(self):
        self.arrays: List[np.ndarray] = []
        self.array_specs: List[dict] = []
        self.tensors: List[dict] = []
        self._array_ids: Dict[int, int] = {}
        self._tensor_ids: Dict[int, int] = {}
        self._keep: List[Any] = []          # keeps ids valid while encoding
        self._active: set = set()           # containers being encoded: a cycle is unsupported
        self._offset = 0

    def add_array(self, arr: np.ndarray) -> int:
        dtype = arr.dtype
        if dtype.byteorder == ">":
            dtype = dtype.newbyteorder("<")
            arr = arr.astype(dtype)
        if dtype.str not in _ARRAY_DTYPES:
            raise _Unsupported(f"a NumPy array of dtype {arr.dtype}")
        order = "F" if arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"
        arr = np.asarray(arr, order=order)
        start = -(-self._offset // _ALIGN) * _ALIGN
        self.arrays.append(arr)
        self.array_specs.append({"dtype": dtype.str, "shape": list(arr.shape), "order": order, "offset": start})
        self._offset = start + arr.nbytes
        return len(self.arrays) - 1

    def node(self, o):
        if o is None or isinstance(o, (bool, str)):
            return o
        if isinstance(o, np.generic):
            if o.dtype.str not in _ARRAY_DTYPES and o.dtype.newbyteorder("<").str not in _ARRAY_DTYPES:
                raise _Unsupported(f"a NumPy scalar of dtype {o.dtype}")
            return {"npscalar": self.add_array(np.asarray(o))}
        if isinstance(o, (int, float)):         # (subclasses, such as an IntEnum, as the plain type)
            return int(o) if isinstance(o, int) else float(o)
        if isinstance(o, complex):
            return {"complex": [o.real, o.imag]}
        if isinstance(o, bytes):
            return {"bytes": base64.b64encode(o).decode("ascii")}
        if type(o) in _TENSOR_CLASSES.values():
            return {"tensor": self.add_tensor(o)}
        if type(o) is np.ndarray:
            i = self._array_ids.get(id(o))
            if i is None:
                i = self._array_ids[id(o)] = self.add_array(o)
                self._keep.append(o)
            return {"ndarray": i}
        kind = {list: "list", tuple: "tuple", dict: "dict", collections.OrderedDict: "odict",
                set: "set", frozenset: "frozenset"}.get(type(o))
        if kind is None:
            raise _Unsupported(f"a {type(o).__module__}.{type(o).__qualname__}")
        if id(o) in self._active:
            raise _Unsupported("a container that contains itself")
        self._active.add(id(o))
        try:
            if kind in ("dict", "odict"):
                return {kind: [[self.node(k), self.node(v)] for k, v in o.items()]}
            return {kind: [self.node(v) for v in o]}
        finally:
            self._active.discard(id(o))

    def add_tensor(self, t: Tensor) -> int:
        i = self._tensor_ids.get(id(t))
        if i is None:
            data = np.array(t.numpy())          # a host copy for a device tensor
            if data.dtype.kind not in _TENSOR_KINDS:
                raise _Unsupported(f"a Tensor of dtype {data.dtype}")
            self.tensors.append({"cls": type(t).__name__, "array": self.add_array(data),
                                 "device": str(t.device), "name": t.name or None})
            i = self._tensor_ids[id(t)] = len(self.tensors) - 1
            self._keep.append(t)
        return i


def _bytes_of(a: np.ndarray) -> np.ndarray:
    """The bytes of a C- or F-ordered array, in its memory order (a view)."""
    return (a if a.flags.c_contiguous else a.T).reshape(-1).view(np.uint8)


def _write(obj, fh, pickler=(pickle, pickle.HIGHEST_PROTOCOL)) -> None:
    enc = _Encoder()
    try:
        root = enc.node(obj)
        header = {"kind": "tree", "root": root, "arrays": enc.array_specs, "tensors": enc.tensors}
        header_bytes = json.dumps(header, separators=(",", ":"), allow_nan=True).encode("utf-8")
        chunks = [_bytes_of(a) for a in enc.arrays]
        offsets = [s["offset"] for s in enc.array_specs]
        payload_len = enc._offset
    except (_Unsupported, ValueError, RecursionError) as exc:
        # not a tree of plain data (or an int too long for JSON): a pickle,
        # which only weights_only=False loads
        module, protocol = pickler
        data = module.dumps(obj, protocol=protocol)
        header = {"kind": "pickle", "holds": str(exc) if isinstance(exc, _Unsupported) else type(exc).__name__}
        header_bytes = json.dumps(header).encode("utf-8")
        chunks, offsets, payload_len = [np.frombuffer(data, np.uint8)], [0], len(data)
    prefix = MAGIC + struct.pack("<QQ", len(header_bytes), payload_len) + header_bytes
    fh.write(prefix)
    fh.write(hashlib.sha256(prefix).digest())
    digest = hashlib.sha256()
    pos = 0
    for chunk, off in zip(chunks, offsets):
        if off > pos:
            pad = bytes(off - pos)
            fh.write(pad)
            digest.update(pad)
        fh.write(chunk)
        digest.update(chunk)
        pos = off + chunk.nbytes
    fh.write(digest.digest())


# ---------------------------------------------------------------- load
def load(f: PathOrFile, map_location: MapLocation = None, pickle_module: Any = None,
         weights_only: bool = True) -> Any:
    """Read what ``gradcore.save`` wrote, or a file that is one pickle, as
    ``megengine.save`` writes (a MegEngine checkpoint: its state_dict's NumPy
    arrays load as arrays, the tensors MegEngine pickles (an optimizer's
    state) as gradcore Tensors and Parameters, their devices mapped). ``pickle_module`` is MegEngine's argument,
    accepted for its signature: gradcore's own (checked) readers unpickle.

    ``map_location`` puts the tensors on another device: a device name
    (``"cpu"``), a dict from saved to wanted device (``{"cuda": "cpu"}``) or
    a callable ``saved_device -> device``; None keeps each tensor's saved
    device. With ``weights_only=True`` (the default) only tensors, NumPy
    arrays and scalars, numbers, strings and containers load, and nothing
    in the file can run code or make ``load`` allocate more than the arrays
    it really holds; pass False only for a file you trust that holds other
    objects (a pickled Module).

    Every failure to read the file is a ``LoadError`` naming the file;
    a ``TypeError`` means ``f`` or ``map_location`` is not of a usable kind.

    Example::

        >>> import io
        >>> net = M.Linear(2, 1); buf = io.BytesIO()
        >>> gc.save(net.state_dict(), buf)
        >>> state = gc.load(io.BytesIO(buf.getvalue()), map_location="cpu")
        >>> sorted(state), state["weight"].shape
        (['bias', 'weight'], (1, 2))
    """
    mapper = _device_mapper(map_location)
    if isinstance(f, (str, os.PathLike)):
        name = os.fspath(f)
        try:
            fh = open(f, "rb")
        except OSError as exc:
            raise LoadFileError(exc.errno, f"gradcore.load: cannot open {name!r}: {exc.strerror}") from exc
        with fh:
            return _read(fh, repr(name), mapper, weights_only)
    if isinstance(f, (bytes, bytearray, memoryview)):
        raise TypeError(f"gradcore.load: expected a path or a binary file object, got {type(f).__name__} "
                        f"(wrap bytes in io.BytesIO)")
    if not callable(getattr(f, "read", None)):
        raise TypeError(f"gradcore.load: expected a path or a binary file object, got {type(f).__name__}")
    if isinstance(f, io.TextIOBase):
        raise TypeError("gradcore.load: the file object is opened in text mode; open it in binary mode ('rb')")
    return _read(f, repr(getattr(f, "name", "<file object>")), mapper, weights_only)


def _read(fh, name, mapper, weights_only):
    try:
        head = _read_some(fh, len(MAGIC))
        if head == MAGIC:
            return _read_v2(fh, name, mapper, weights_only)
        if head == MAGIC_V1:
            return _read_pickle(b"", fh, name, mapper, weights_only)
        if len(head) < len(MAGIC) and (MAGIC.startswith(head) or MAGIC_V1.startswith(head)):
            raise LoadError(f"gradcore.load: {name} is truncated (it ends inside the header)")
        if len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5:        # a pickle's PROTO opcode
            return _read_pickle(head, fh, name, mapper, weights_only)
        raise LoadError(f"gradcore.load: {name} was not written by gradcore.save "
                        f"(it starts with {head[:8]!r}, expected {MAGIC[:8]!r})")
    except LoadError as exc:
        if name in str(exc):
            raise
        # a stand-in of the restricted unpickler: say which file
        raise LoadError(f"gradcore.load: {name}: {exc}") from exc.__cause__
    except OSError as exc:
        raise LoadFileError(exc.errno, f"gradcore.load: reading {name} failed: {exc}") from exc
    except SavedOpMismatchError as exc:
        # the file is sound: an op in it is another version's
        raise LoadError(f"gradcore.load: {name}: {exc}") from exc
    except Exception as exc:
        # whatever a crafted file makes the internals raise, the caller
        # gets one exception type, naming the file
        raise LoadError(f"gradcore.load: {name} is corrupt ({type(exc).__name__}: {exc})") from exc


def _read_some(fh, n: int) -> bytes:
    data = fh.read(n)
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"gradcore.load: the file object's read() returned {type(data).__name__}, "
                        f"not bytes; open the file in binary mode ('rb')")
    return bytes(data)


def _remaining(fh):
    """(file, bytes left after the current position). A stream that cannot
    seek is read whole first: its length is then known before anything is
    allocated from what the file claims."""
    try:
        if fh.seekable():
            pos = fh.tell()
            end = fh.seek(0, 2)
            fh.seek(pos)
            return fh, end - pos
    except (AttributeError, OSError, ValueError):
        pass
    rest = _read_some(fh, -1)
    return io.BytesIO(rest), len(rest)


def _read_exact(fh, n: int, name: str, what: str) -> bytes:
    data = _read_some(fh, n)
    if len(data) != n:
        raise LoadError(f"gradcore.load: {name} is truncated (it ends inside {what})")
    return data


def _read_v2(fh, name, mapper, weights_only):
    fh, left = _remaining(fh)
    if left < 16:
        raise LoadError(f"gradcore.load: {name} is truncated (it ends inside the header)")
    lengths = _read_exact(fh, 16, name, "the header")
    hlen, plen = struct.unpack("<QQ", lengths)
    if 16 + hlen + _DIGEST + plen + _DIGEST > left:
        raise LoadError(f"gradcore.load: {name} is truncated or corrupt: its header declares "
                        f"{hlen + plen + 2 * _DIGEST} bytes after the lengths, the file has {left - 16}")
    header_bytes = _read_exact(fh, hlen, name, "the header")
    if hashlib.sha256(MAGIC + lengths + header_bytes).digest() != _read_exact(fh, _DIGEST, name, "a digest"):
        raise LoadError(f"gradcore.load: {name} is corrupt: the header's checksum (SHA-256) does not match")
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise LoadError(f"gradcore.load: {name} has an unreadable header ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict) or header.get("kind") not in ("tree", "pickle"):
        raise LoadError(f"gradcore.load: {name} has a header of an unknown kind")
    if header["kind"] == "pickle":
        if weights_only:
            raise LoadError(f"gradcore.load refused {name}: it holds pickled Python objects "
                            f"({header.get('holds', '?')}), and with weights_only=True only tensors, "
                            f"NumPy arrays and plain containers load. If you trust this file, pass "
                            f"weights_only=False")
        data = bytearray(plen)      # plen was checked against the bytes present
        _read_payload(fh, [(memoryview(data), 0)], plen, name)
        return _Unpickler(io.BytesIO(bytes(data)), mapper).load()
    arrays = _alloc_arrays(header.get("arrays"), plen, name)
    _read_payload(fh, [(_bytes_of(a), off) for a, off in arrays], plen, name)
    return _Decoder([a for a, _ in arrays], header.get("tensors"), mapper, name).node(header.get("root"))


def _is_int(x) -> bool:
    return type(x) is int


def _valid_shape(shape, kind: type) -> bool:
    return isinstance(shape, kind) and len(shape) <= 64 and all(_is_int(d) and d >= 0 for d in shape)


def _alloc_arrays(specs, plen: int, name: str):
    """The arrays the header declares, allocated empty, with their payload
    offsets. Their sizes are checked to tile the payload exactly (in order,
    each at the next 64-byte boundary), so the total is at most ``plen``,
    which the caller checked against the file's length."""
    if not isinstance(specs, list):
        raise LoadError(f"gradcore.load: {name} has a malformed header (no array table)")
    out, end = [], 0
    for i, s in enumerate(specs):
        bad = f"gradcore.load: {name}: array record {i} "
        if not (isinstance(s, dict) and set(s) == {"dtype", "shape", "order", "offset"}):
            raise LoadError(bad + "is malformed")
        dtype = _ARRAY_DTYPES.get(s["dtype"]) if isinstance(s["dtype"], str) else None
        if dtype is None:
            raise LoadError(bad + f"has the dtype {s['dtype']!r}; arrays in a file are bool, integer, "
                            f"float or complex")
        shape = s["shape"]
        if not _valid_shape(shape, list):
            raise LoadError(bad + f"has an invalid shape {shape!r}")
        if s["order"] not in ("C", "F"):
            raise LoadError(bad + f"has an invalid order {s['order']!r}")
        nbytes = math.prod(shape) * dtype.itemsize
        start = -(-end // _ALIGN) * _ALIGN
        if s["offset"] != start or start + nbytes > plen:
            raise LoadError(bad + f"(shape {tuple(shape)}, {dtype}) does not fit the payload "
                            f"({plen} bytes) at offset {s['offset']!r}")
        end = start + nbytes
        out.append((np.empty(tuple(shape), dtype, order=s["order"]), start))
    if end != plen:
        raise LoadError(f"gradcore.load: {name}: the arrays take {end} bytes, the payload is {plen}")
    return out


def _read_payload(fh, views, plen: int, name: str) -> None:
    digest = hashlib.sha256()
    pos = 0
    for view, off in views:
        if off > pos:
            pad = _read_exact(fh, off - pos, name, "the payload")
            if pad.count(0) != len(pad):
                raise LoadError(f"gradcore.load: {name} is corrupt: padding between arrays is not zero")
            digest.update(pad)
        n = len(view)
        got = fh.readinto(view) if hasattr(fh, "readinto") else None
        if got is None:
            chunk = _read_exact(fh, n, name, "the payload")
            view[:] = chunk
            got = n
        while got < n:
            more = fh.readinto(view[got:])
            if not more:
                raise LoadError(f"gradcore.load: {name} is truncated (it ends inside the payload)")
            got += more
        digest.update(view)
        pos = off + n
    if pos != plen:
        raise LoadError(f"gradcore.load: {name} is corrupt: the payload has {plen} bytes, {pos} used")
    if digest.digest() != _read_exact(fh, _DIGEST, name, "the payload's digest"):
        raise LoadError(f"gradcore.load: {name} is corrupt: the payload's checksum (SHA-256) does not match")


class _Decoder:
    """Nodes back to objects, every record checked: a file cannot make
    anything but plain data, arrays it holds and tensors over them."""

    def __init__(self, arrays, tensors, mapper, name):
        self.arrays, self.mapper, self.name = arrays, mapper, name
        if not isinstance(tensors, list):
            raise LoadError(f"gradcore.load: {name} has a malformed header (no tensor table)")
        self.tensor_specs = tensors
        self.tensors: Dict[int, Tensor] = {}

    def fail(self, what):
        raise LoadError(f"gradcore.load: {self.name}: {what}")

    def array(self, i) -> np.ndarray:
        if not (_is_int(i) and 0 <= i < len(self.arrays)):
            self.fail(f"an array reference {i!r} is outside the array table")
        return self.arrays[i]

    def node(self, n):
        if n is None or isinstance(n, (bool, int, float, str)):
            return n
        if isinstance(n, dict) and len(n) == 1:
            (kind, v), = n.items()
            if kind in ("list", "tuple", "set", "frozenset") and isinstance(v, list):
                items = [self.node(x) for x in v]
                return items if kind == "list" else {"tuple": tuple, "set": set, "frozenset": frozenset}[kind](items)
            if kind in ("dict", "odict") and isinstance(v, list):
                out = {} if kind == "dict" else collections.OrderedDict()
                for kv in v:
                    if not (isinstance(kv, list) and len(kv) == 2):
                        self.fail("a dict item is malformed")
                    out[self.node(kv[0])] = self.node(kv[1])
                return out
            if kind == "tensor":
                return self.tensor(v)
            if kind == "ndarray":
                return self.array(v)
            if kind == "npscalar":
                a = self.array(v)
                if a.ndim != 0:
                    self.fail(f"a NumPy scalar record has shape {a.shape}")
                return a[()]
            if kind == "complex" and isinstance(v, list) and len(v) == 2 and all(
                    type(x) in (int, float) for x in v):
                return complex(*v)
            if kind == "bytes" and isinstance(v, str):
                return base64.b64decode(v.encode("ascii"), validate=True)
        self.fail(f"a record of unknown kind {str(n)[:60]!r}")

    def tensor(self, i):
        if not (_is_int(i) and 0 <= i < len(self.tensor_specs)):
            self.fail(f"a tensor reference {i!r} is outside the tensor table")
        if i in self.tensors:
            return self.tensors[i]
        s = self.tensor_specs[i]
        if not (isinstance(s, dict) and set(s) == {"cls", "array", "device", "name"}):
            self.fail(f"tensor record {i} is malformed")
        cls = _TENSOR_CLASSES.get(s["cls"]) if isinstance(s["cls"], str) else None
        if cls is None:
            self.fail(f"tensor record {i} names the class {s['cls']!r}; only Tensor and Parameter load")
        if not (s["name"] is None or isinstance(s["name"], str)):
            self.fail(f"tensor record {i} has a name of type {type(s['name']).__name__}")
        data = self.array(s["array"])
        t = self.tensors[i] = _make_tensor(cls, data, s["device"], s["name"], self.mapper, self.name)
        return t


def _make_tensor(cls, data, device, tname, mapper, name):
    """A tensor over ``data`` (checked: an ndarray of a dtype tensors have)
    on the mapped device (checked: a known one)."""
    if type(data) is not np.ndarray:
        raise LoadError(f"gradcore.load: {name}: a tensor record's data is a {type(data).__name__}, "
                        f"not an array")
    if data.dtype.kind not in _TENSOR_KINDS or data.dtype.itemsize > 8 or data.dtype.byteorder == ">":
        raise LoadError(f"gradcore.load: {name}: a tensor record's data has the dtype {data.dtype} "
                        f"(shape {data.shape}); tensors hold bool, integers and float16/32/64")
    saved = _norm_device(device, name, "the file")
    wanted = _norm_device(mapper(saved), name, "map_location")
    try:
        return _rebuild_tensor(cls, data, wanted, tname)
    except (RuntimeError, ValueError) as exc:     # e.g. cuda unavailable here
        raise LoadError(f"gradcore.load: {name}: cannot put a tensor of shape {data.shape} on "
                        f"{wanted!r}: {exc}; pass map_location='cpu' to load it on the cpu") from exc


_DEVICE_SPELLINGS = {"cpu": "cpu", "cpu0": "cpu", "cpux": "cpu",
                     "cuda": "cuda", "cuda0": "cuda", "cuda:0": "cuda", "gpu": "cuda", "gpu0": "cuda"}
_MEGENGINE_DEVICE = re.compile(r"(cpu|gpu|xpu)(?:\d+|x)?(?::\d+)?")


def _norm_device(device, name, source):
    if not isinstance(device, str):
        raise LoadError(f"gradcore.load: {name}: {source} gives a device of type {type(device).__name__}, "
                        f"not a device name")
    d = _DEVICE_SPELLINGS.get(device.lower())
    megengine = _MEGENGINE_DEVICE.fullmatch(device.lower())
    if d is None and megengine is not None:     # MegEngine's logical names: "cpu0:0", "gpu1", "xpux:0"
        device = megengine.group(1)
        d = _DEVICE_SPELLINGS.get(device)
    if d is None and device.lower() in ("xpu", "xpu0", "xpux"):
        from .devices import is_cuda_available
        d = "cuda" if is_cuda_available() else "cpu"
    if d is None:
        raise LoadError(f"gradcore.load: {name}: {source} gives the unknown device {device!r}; gradcore "
                        f"knows 'cpu' and 'cuda'")
    return d


def _device_mapper(map_location: MapLocation) -> Callable[[str], str]:
    if map_location is None:
        return lambda device: device
    if isinstance(map_location, str):
        return lambda device: map_location
    if isinstance(map_location, dict):
        return lambda device: map_location.get(device, device)
    if callable(map_location):
        return map_location
    raise TypeError(f"gradcore.load: map_location must be None, a device name, a dict or a callable, "
                    f"got {type(map_location).__name__}")


# ---------------------------------------------------------------- version 1
_CONVERT = ("if you trust this file, convert it once to the current format: "
            "gradcore.save(gradcore.load(path, weights_only=False), path)")
# opcodes a version-1 file never needed; refused rather than reasoned about
# (NEWOBJ is MegEngine's tensors': it reaches only the classes below that
# define a checking __new__, _DTypeRef and _MegEngineTensorRef)
_REFUSED_OPCODES = {"PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4", "INST", "OBJ", "NEWOBJ_EX"}


def _read_pickle(head: bytes, fh, name, mapper, weights_only):
    """The pickle of a version-1 file (after its MAGIC_V1; ``head`` empty),
    or a file that is a pickle as a whole (``head``: its first bytes):
    MegEngine's ``megengine.save`` (a state_dict is a dict of NumPy arrays),
    PyTorch's legacy format... (with ``weights_only`` the same checked
    loader: arrays, numbers, strings and containers only)."""
    fh, left = _remaining(fh)
    return _load_pickle(head + _read_exact(fh, left, name, "the pickle"), name, mapper, weights_only)


def _load_pickle(data: bytes, name, mapper, weights_only):
    if not weights_only:
        return _Unpickler(io.BytesIO(data), mapper).load()
    # every length the stream declares is checked against the bytes present
    # before the unpickler (which allocates what a length claims) runs
    for op, _arg, _pos in pickletools.genops(io.BytesIO(data)):
        if op.name in _REFUSED_OPCODES:
            raise LoadError(f"gradcore.load refused {name}: its pickle uses the opcode {op.name}, which a "
                            f"file of gradcore.save never holds; {_CONVERT}")
    result = _LegacyUnpickler(io.BytesIO(data), mapper, name).load()
    return _resolve_refs(result, name, {}, mapper)


class _ClassRef:
    """Tensor or Parameter named in a version-1 file: only a tensor record
    may use it (it cannot be called)."""
    __slots__ = ("cls",)

    def __init__(self, cls):
        self.cls = cls


class _DTypeRef:
    """``numpy.dtype(name, align, copy)`` of a version-1 file, and the byte
    order its BUILD sets; never a real dtype until checked."""
    __slots__ = ("base", "order")

    # (checked in __new__: a NEWOBJ record makes one without calling __init__)
    def __new__(cls, name, align=False, copy=True):
        if not isinstance(name, str):
            raise LoadError(f"a dtype record names {type(name).__name__}")
        base = np.dtype(name) if name in ("b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8",
                                          "f2", "f4", "f8", "c8", "c16", "?") else None
        if base is None:
            raise LoadError(f"a dtype record names {name!r}; arrays in a file are bool, integer, "
                            f"float or complex")
        self = object.__new__(cls)
        self.base, self.order = base, "|" if base.itemsize == 1 else "<"
        return self

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 8 and state[0] == 3 and state[1] in "<>|="
                and state[2:5] == (None, None, None) and state[5:7] == (-1, -1)):
            raise LoadError("a dtype record has a state that a numeric dtype never has")
        self.order = state[1]

    def dtype(self) -> np.dtype:
        return self.base.newbyteorder(self.order) if self.order in "<>" else self.base


class _NDArrayClass:
    """``numpy.ndarray`` named in a pickle: only ``_reconstruct`` may use it."""
    __slots__ = ()

    def __call__(self, *args, **kwargs):
        raise LoadError("a record calls numpy.ndarray, whose constructor allocates by a size the file "
                        "claims; NumPy's own pickles never do")


class _ArrayRef:
    """``numpy.core.multiarray._reconstruct(ndarray, (0,), b"b")`` of a
    pickle before protocol 5: nothing is allocated until its BUILD state
    (version, shape, dtype, Fortran order, the raw bytes) is checked; the
    array then views bytes present in the file."""
    __slots__ = ("array",)

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1 and isinstance(state[3], bool)):
            raise LoadError("an array record has a state that a NumPy array never has")
        _, shape, dtype, fortran, raw = state
        self.array = _frombuffer(raw, dtype, shape, "F" if fortran else "C")


def _reconstruct(cls, shape, typecode):
    if not (isinstance(cls, _NDArrayClass) and shape == (0,) and typecode == b"b"):
        raise LoadError("an array record is built otherwise than NumPy pickles arrays")
    return _ArrayRef()


def _as_dtype(d) -> np.dtype:
    if isinstance(d, _DTypeRef):
        return d.dtype()
    raise LoadError(f"an array record's dtype is a {type(d).__name__}")


def _frombuffer(buf, dtype, shape, order):
    dtype = _as_dtype(dtype)
    if isinstance(buf, pickle.PickleBuffer):
        buf = buf.raw()
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise LoadError(f"an array record's data is a {type(buf).__name__}, not bytes")
    if not _valid_shape(shape, tuple):
        raise LoadError(f"an array record has an invalid shape {shape!r}")
    if order not in ("C", "F"):
        raise LoadError(f"an array record has an invalid order {order!r}")
    if math.prod(shape) * dtype.itemsize != len(buf):
        raise LoadError(f"an array record of shape {shape} and dtype {dtype} has {len(buf)} bytes")
    arr = np.frombuffer(buf, dtype).reshape(shape, order=order)
    return arr if arr.flags.writeable else arr.copy()


def _scalar(dtype, data):
    dtype = _as_dtype(dtype)
    if not (isinstance(data, bytes) and len(data) == dtype.itemsize):
        raise LoadError(f"a NumPy scalar record of dtype {dtype} has malformed data")
    return np.frombuffer(data, dtype)[0]


def _complex(real=0.0, imag=0.0):
    if type(real) not in (int, float) or type(imag) not in (int, float):
        raise LoadError("a complex record holds something else than two numbers")
    return complex(real, imag)


def _bytearray(source=b"", encoding=None):
    # never bytearray(n): a size the file claims
    if isinstance(source, bytes) and encoding is None:
        return bytearray(source)
    if isinstance(source, str) and encoding == "latin-1":
        return bytearray(source, encoding)
    raise LoadError("a bytearray record is not made from bytes present in the file")


def _set_of(make):
    def build(items=()):
        if not isinstance(items, (list, tuple)):
            raise LoadError(f"a {make.__name__} record is made from a {type(items).__name__}")
        return make(items)
    return build


def _latin1_bytes(text, encoding="utf-8"):
    # bytes in a protocol-2 pickle: _codecs.encode(str, "latin1"), no larger than the text present
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise LoadError("a bytes record is not latin-1 text present in the file")
    return text.encode("latin-1")


def _ranged(make):
    def build(*args):
        if not all(x is None or _is_int(x) for x in args) or len(args) > 3:
            raise LoadError(f"a {make.__name__} record has arguments other than integers")
        return make(*args)
    return build


class _MegEngineTensorRef:
    """A tensor ``megengine.save`` pickled (an optimizer's state_dict holds
    them): NEWOBJ with MegEngine's ``__getnewargs__`` (array, dtype, device
    name, two flags, name, format) and an empty BUILD state, or, in files of
    MegEngine 1.1 and 1.2, no arguments and a state holding data, dtype and
    device. Nothing is made until ``tensor`` checks it; quantized tensors'
    parameters are refused (gradcore has none)."""
    __slots__ = ("args", "state")
    cls = Tensor

    def __new__(cls, *args):
        if len(args) > 7:
            raise LoadError(f"a MegEngine tensor record has {len(args)} arguments; MegEngine writes 7")
        self = object.__new__(cls)
        self.args, self.state = args, {}
        return self

    def __init__(self, *args):     # (a REDUCE record calls the class: __new__ checked it)
        pass

    def __setstate__(self, state):
        if not isinstance(state, dict) or set(state) - {"data", "dtype", "device", "qparams", "qdict"}:
            raise LoadError("a MegEngine tensor record has a state that MegEngine never writes")
        self.state = state

    def tensor(self, name, mapper) -> Tensor:
        q = self.state.get("qparams", self.state.get("qdict"))
        if q is not None and not (isinstance(q, dict) and all(v is None for v in q.values())):
            raise LoadError(f"{name} holds a quantized MegEngine tensor; gradcore has no quantized dtypes")
        if self.args:
            if len(self.args) < 3:
                raise LoadError(f"a MegEngine tensor record has {len(self.args)} arguments, fewer than 3")
            data, dtype, device = self.args[:3]
        elif {"data", "dtype", "device"} <= set(self.state):
            data, dtype, device = self.state["data"], self.state["dtype"], self.state["device"]
        else:
            raise LoadError("a MegEngine tensor record holds no data")
        data = _resolve_refs(data, name, {})
        if not isinstance(dtype, _DTypeRef) or type(data) is not np.ndarray or data.dtype != dtype.dtype():
            raise LoadError(f"a MegEngine tensor record's data ({type(data).__name__}) does not have its "
                            f"dtype ({dtype!r})")
        return _make_tensor(self.cls, data, device, None, mapper, name)


class _MegEngineParameterRef(_MegEngineTensorRef):
    __slots__ = ()
    cls = Parameter


def _numpy_scalar_type(name):
    """``numpy.int8`` and the like as a dtype (MegEngine 1.1 pickled a
    tensor's dtype so): a fresh stand-in, as ``numpy.dtype`` records are."""
    return _DTypeRef(np.dtype(name).str[1:])


_NUMPY_SCALAR_TYPES = ("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                       "float16", "float32", "float64")

# the globals a restricted load of a version-1 file may resolve, each to a
# checked stand-in; nothing else
_V1_GLOBALS = {
    ("gradcore._core", "Tensor"): _ClassRef(Tensor), ("gradcore.tensor", "Parameter"): _ClassRef(Parameter),
    ("numpy", "dtype"): _DTypeRef,
    ("numpy._core.multiarray", "scalar"): _scalar, ("numpy.core.multiarray", "scalar"): _scalar,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer, ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy", "ndarray"): _NDArrayClass(),
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct, ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("collections", "OrderedDict"): _set_of(collections.OrderedDict),
    ("builtins", "set"): _set_of(set), ("builtins", "frozenset"): _set_of(frozenset),
    ("builtins", "complex"): _complex, ("builtins", "bytearray"): _bytearray, ("_codecs", "encode"): _latin1_bytes,
    ("builtins", "slice"): _ranged(slice), ("builtins", "range"): _ranged(range),
    ("megengine.tensor", "Tensor"): _MegEngineTensorRef, ("megengine.tensor", "Parameter"): _MegEngineParameterRef,
}


class _LegacyUnpickler(pickle.Unpickler):
    def __init__(self, fh, mapper, name):
        super().__init__(fh)
        self._mapper, self._name = mapper, name

    def find_class(self, module, name):
        key = (module, name)
        if key == ("gradcore._core", "_rebuild_tensor"):
            return self._rebuild_tensor
        if key in _V1_GLOBALS:
            return _V1_GLOBALS[key]
        if module == "numpy" and name in _NUMPY_SCALAR_TYPES:
            return _numpy_scalar_type(name)
        raise LoadError(f"gradcore.load refused to load the global {module}.{name}: with "
                        f"weights_only=True only tensors, NumPy arrays and plain containers load. "
                        f"If you trust this file, pass weights_only=False")

    def _rebuild_tensor(self, cls, data, device, tname):
        if not isinstance(cls, _ClassRef):
            raise LoadError(f"gradcore.load: a tensor record names {cls!r}, which is not a Tensor class")
        if not (tname is None or isinstance(tname, str)):
            raise LoadError(f"gradcore.load: a tensor record has a name of type {type(tname).__name__}")
        if isinstance(data, _ArrayRef):
            data = _resolve_refs(data, self._name, {})
        return _make_tensor(cls.cls, data, device, tname, self._mapper, self._name)


def _resolve_refs(o, name, seen, mapper=None):
    """The loaded tree with no stand-in left: a dtype or a class outside a
    record becomes the real one, a MegEngine tensor record a tensor (once
    per record: shared ones stay shared; containers are rebuilt only if
    they hold one)."""
    if isinstance(o, _MegEngineTensorRef):
        if mapper is None:
            raise LoadError("a MegEngine tensor record is nested in another record")
        if id(o) not in seen:
            seen[id(o)] = (o, o.tensor(name, mapper))     # (o kept alive: its id stays unique)
        return seen[id(o)][1]
    if isinstance(o, _DTypeRef):
        return o.dtype()
    if isinstance(o, _ClassRef):
        return o.cls
    if isinstance(o, _ArrayRef):
        if not hasattr(o, "array"):
            raise LoadError(f"gradcore.load: {name} holds an array record without its data")
        return o.array
    if isinstance(o, _NDArrayClass):
        return np.ndarray
    if isinstance(o, (list, dict, tuple, set, frozenset)) and id(o) not in seen:
        seen[id(o)] = o
        if isinstance(o, list):
            o[:] = [_resolve_refs(x, name, seen, mapper) for x in o]
        elif isinstance(o, dict):
            for k in list(o):
                o[k] = _resolve_refs(o[k], name, seen, mapper)
        else:
            items = [_resolve_refs(x, name, seen, mapper) for x in o]
            if any(a is not b for a, b in zip(items, o)):
                return type(o)(items)
    return o


class _Unpickler(pickle.Unpickler):
    """The unrestricted unpickler (``weights_only=False``, trusted files)."""

    def __init__(self, fh, map_device):
        super().__init__(fh)
        self._map_device = map_device

    def find_class(self, module, name):
        if (module, name) == ("gradcore._core", "_rebuild_tensor"):
            return self._rebuild_tensor
        return super().find_class(module, name)

    def _rebuild_tensor(self, cls, data, device, name):
        if not (isinstance(cls, type) and issubclass(cls, Tensor)):
            raise LoadError(f"gradcore.load: a tensor record names {cls!r}, which is not a Tensor class")
        return _rebuild_tensor(cls, data, self._map_device(device), name)
