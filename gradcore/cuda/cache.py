"""The CUDA kernel cache: PTX compiled by ``nvcc``, kept in memory and on disk.

Keyed by gradcore's own key, not by PyCUDA's: the op or kernel name, the
dtypes, a shapes class (e.g. ``"nd2:contig"``), the sha256 of the source, the
target architecture (``sm_80``) and the compiler options. A second process
with the same key reads the PTX from disk and does not run ``nvcc``.

Directory: ``directory=`` if given, else ``$GRADCORE_KERNEL_CACHE``, else
``~/.cache/gradcore/kernels``. Files are ``<key>.ptx``; writes go to a
temporary file in the same directory and are renamed over the final name
(``os.replace`` is atomic on POSIX), so concurrent processes never read a
half-written PTX: at worst two processes compile the same kernel and the
last rename wins with identical content.

A compile error raises ``KernelCompileError`` naming the kernel and quoting
the offending source line from nvcc's ``file(line): error: ...`` output.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

__all__ = ["KernelCache", "KernelCompileError", "default_directory", "cache_key", "DEFAULT_ARCH"]

DEFAULT_ARCH = "sm_80"
KEY_VERSION = 1     # bump when the key or the file format changes
_ERROR_LINE = re.compile(r"^(?P<file>.*?)\((?P<line>\d+)\): (?P<kind>(?:catastrophic )?error)[^:]*: (?P<msg>.*)$")
# g++ (the host emulator): file:line:column: error: message
_GCC_ERROR_LINE = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):\d+: (?P<kind>(?:fatal )?error): (?P<msg>.*)$")


class KernelCompileError(RuntimeError):
    """nvcc rejected a kernel. ``name``: the op/kernel; ``errors``: a list of
    ``(line number, source line, message)``; ``log``: nvcc's full output."""

    def __init__(self, name: str, errors: List[Tuple[Optional[int], str, str]], log: str, arch: str):
        self.name, self.errors, self.log, self.arch = name, errors, log, arch
        if errors:
            lines = []
            for lineno, text, msg in errors[:5]:
                where = f"line {lineno}" if lineno is not None else "source"
                lines.append(f"  {where}: {msg}\n    | {text.strip()}")
            detail = "\n".join(lines)
            if len(errors) > 5:
                detail += f"\n  ... and {len(errors) - 5} more errors"
        else:
            tail = log.strip().splitlines()[-10:]
            detail = "\n".join("  " + t for t in tail) or "  (nvcc gave no output)"
        super().__init__(f"CUDA kernel {name!r} failed to compile for {arch}:\n{detail}")


def default_directory() -> Path:
    env = os.environ.get("GRADCORE_KERNEL_CACHE")
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/gradcore/kernels").expanduser()


def _canon(x):
    if isinstance(x, (list, tuple)):
        return [_canon(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _canon(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return repr(x)


def _dtype_str(d):
    import numpy as np
    try:
        return np.dtype(d).str
    except TypeError:
        return str(d)


def cache_key(name: str, source: str, dtypes: Iterable = (), shapes_class="", arch: str = DEFAULT_ARCH,
              options: Sequence[str] = ()) -> str:
    """gradcore's kernel key: a sha256 over (op/kernel name, dtypes, shapes
    class, sha256 of the source, architecture, compiler options)."""
    record = {
        "v": KEY_VERSION,
        "name": str(name),
        "dtypes": [_dtype_str(d) for d in dtypes],
        "shapes": _canon(shapes_class),
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "arch": str(arch),
        "options": list(options),
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _safe(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.-]", "_", name)[:60]


class KernelCache:
    """PTX for CUDA C sources, compiled once per key.

    Example::

        cache = KernelCache()
        ptx = cache.get("gc_mul_float", source, dtypes=["float32"], shapes_class="contig")
        # PyCUDA (GPU side): pycuda.driver.module_from_buffer(ptx.encode())
    """

    def __init__(self, directory=None, arch: str = DEFAULT_ARCH, nvcc: Optional[str] = None,
                 options: Sequence[str] = (), timeout: float = 300.0):
        self.directory = Path(directory).expanduser() if directory is not None else default_directory()
        self.arch = arch
        self._nvcc = nvcc
        self.options = tuple(options)
        self.timeout = timeout
        self._memory = {}
        self._lock = threading.Lock()
        self.stats = {"memory_hits": 0, "disk_hits": 0, "compiles": 0}

    # ------------------------------------------------------------ lookup
    def key(self, name, source, dtypes=(), shapes_class="", arch=None) -> str:
        return cache_key(name, source, dtypes, shapes_class, arch or self.arch, self.options)

    def path_for(self, key: str, name: str = "") -> Path:
        return self.directory / (f"{_safe(name)}-{key}.ptx" if name else f"{key}.ptx")

    def get(self, name: str, source: str, dtypes=(), shapes_class="", arch: Optional[str] = None) -> str:
        """The PTX of ``source`` (the kernel/op ``name``), from memory, from
        disk, or compiled now and stored in both."""
        arch = arch or self.arch
        key = self.key(name, source, dtypes, shapes_class, arch)
        ptx = self._memory.get(key)
        if ptx is not None:
            self.stats["memory_hits"] += 1
            return ptx
        path = self.path_for(key, name)
        ptx = self._read(path)
        if ptx is not None and self._stale(ptx):
            ptx = None          # made by another nvcc than the one installed now
        if ptx is not None:
            self.stats["disk_hits"] += 1
            self._memory[key] = ptx
            return ptx
        ptx = self.compile(name, source, arch)
        self._write(path, ptx)
        self._memory[key] = ptx
        return ptx

    def nvcc_version(self) -> Optional[str]:
        """The installed nvcc's version line ("Cuda compilation tools,
        release 13.0, V13.0.88"), or None without nvcc."""
        if not hasattr(self, "_nvcc_version"):
            self._nvcc_version = None
            try:
                out = subprocess.run([self.nvcc(), "--version"], capture_output=True, text=True, timeout=60)
                self._nvcc_version = next((line.strip() for line in out.stdout.splitlines()
                                           if line.startswith("Cuda compilation tools")), None)
            except Exception:
                pass
        return self._nvcc_version

    def _stale(self, ptx: str) -> bool:
        """Whether cached PTX came from another nvcc than the installed one
        (its header names the compiler); without nvcc any cached PTX serves."""
        made_by = next((line[2:].strip() for line in ptx.splitlines()[:8]
                        if line.startswith("// Cuda compilation tools")), None)
        if made_by is None:
            return False
        current = self.nvcc_version()
        return current is not None and current != made_by

    def contains(self, name, source, dtypes=(), shapes_class="", arch=None) -> bool:
        key = self.key(name, source, dtypes, shapes_class, arch)
        return key in self._memory or self._read(self.path_for(key, name)) is not None

    def clear_memory(self):
        self._memory.clear()

    # ------------------------------------------------------------ disk
    @staticmethod
    def _read(path: Path) -> Optional[str]:
        try:
            text = path.read_text()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError:
            return None
        # a PTX file nvcc wrote names its version; anything else is not ours
        if ".version" not in text or ".target" not in text:
            return None
        return text

    def _write(self, path: Path, ptx: str):
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=path.name + ".", suffix=".tmp")
        except OSError:
            return      # a read-only cache directory only costs recompiles
        try:
            with os.fdopen(fd, "w") as f:
                f.write(ptx)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    # ------------------------------------------------------------ nvcc
    def nvcc(self) -> str:
        if self._nvcc is None:
            from .toolkit import nvcc_path
            self._nvcc = nvcc_path()
            if self._nvcc is None:
                raise RuntimeError("nvcc was not found (on PATH, $CUDA_HOME/bin or /usr/local/cuda/bin): "
                                   "it is needed to compile CUDA kernels")
        return self._nvcc

    def compile(self, name: str, source: str, arch: Optional[str] = None) -> str:
        """Run ``nvcc --ptx -arch=<arch>`` on ``source``; the PTX text."""
        arch = arch or self.arch
        nvcc = self.nvcc()
        self.stats["compiles"] += 1
        with tempfile.TemporaryDirectory(prefix="gradcore-nvcc-") as tmp:
            src = Path(tmp) / f"{_safe(name) or 'kernel'}.cu"
            out = Path(tmp) / "kernel.ptx"
            src.write_text(source)
            cmd = [nvcc, "--ptx", f"-arch={arch}", *self.options, "-o", str(out), str(src)]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout)
            except subprocess.TimeoutExpired as exc:
                raise KernelCompileError(name, [], f"nvcc timed out after {exc.timeout} s", arch) from None
            log = (res.stdout or "") + (res.stderr or "")
            if res.returncode != 0 or not out.exists():
                raise KernelCompileError(name, parse_errors(log, source, src.name), log, arch)
            return out.read_text()


def parse_errors(log: str, source: str, filename: Optional[str] = None) -> List[Tuple[Optional[int], str, str]]:
    """(line number, source line, message) for each ``file(line): error``
    nvcc (or ``file:line:col: error`` g++) reported in ``source`` (errors
    in headers keep their file name)."""
    lines = source.splitlines()
    errors = []
    for raw in log.splitlines():
        m = _ERROR_LINE.match(raw.strip()) or _GCC_ERROR_LINE.match(raw.strip())
        if not m:
            continue
        lineno = int(m.group("line"))
        ours = filename is None or os.path.basename(m.group("file")) == filename
        if ours and 1 <= lineno <= len(lines):
            errors.append((lineno, lines[lineno - 1], m.group("msg")))
        else:
            errors.append((lineno, f"{m.group('file')}:{lineno}", m.group("msg")))
    return errors
