"""The CUDA kernel cache: kernels compiled by NVRTC (or ``nvcc``), kept in
memory and on disk, standard kernels compiled per family.

The compiler: NVRTC in-process (``gradcore.cuda.nvrtc``: the
``nvidia-cuda-nvrtc`` wheel or the system toolkit's libnvrtc) when it loads,
else one ``nvcc`` process per program; ``compiler="nvcc"`` or
``$GRADCORE_CUDA_COMPILER=nvcc`` forces nvcc. The output: PTX for
``compute_<arch>`` (``output="ptx"``, what the driver JIT-compiles; the
default without a device), or a CUBIN for the device's own ``sm_<arch>``
(``output="cubin"``: no JIT at load, and no dependence on the driver
knowing a newer PTX version).

Families: a standard kernel (one the op library's catalog lists, see
``gradcore.cuda.families``) is not compiled alone. The first time any
kernel of a family is needed for an element type, the whole family is
compiled, in one part per core (parts of at least ``PART_MIN_UNITS``
sources), the parts in parallel on a thread pool (ctypes releases the GIL
while NVRTC works): one compile per family, few modules. Kernels outside the catalog (plugins, fused
backwards) compile alone.

Keys: gradcore's own, a sha256 over the source (for a family part: the
combined source), the target architecture, the compiler options, the
output kind and the compiler's identity (NVRTC's version; for nvcc the PTX
header is checked against ``nvcc --version`` on a disk hit). The op/kernel
name, dtypes and shapes class of ``get`` are part of a single kernel's key.

Directory: ``directory=`` if given, else ``$GRADCORE_KERNEL_CACHE``, else
``~/.cache/gradcore/kernels``. A program is ``<name>-<key>.ptx`` (or
``.cubin``); each member of a family part has a small ``<kernel>-<key>.ref``
naming its part's file, so a warm process goes from a kernel's source to
its module with two file reads and no catalog. Writes go to a temporary
file in the same directory renamed over the final name (``os.replace`` is
atomic on POSIX): concurrent processes never read a half-written file; at
worst two compile the same program and the last rename wins.

A compile error raises ``KernelCompileError`` naming the kernel, quoting
the offending source line and the compiler's log.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple, Union

__all__ = ["KernelCache", "KernelCompileError", "Program", "default_directory", "cache_key", "DEFAULT_ARCH"]

DEFAULT_ARCH = "sm_80"
KEY_VERSION = 2     # bump when the key or the file format changes
PART_MIN_UNITS = 4  # a family is split in at most one part per core, of at least this many sources
_ERROR_LINE = re.compile(r"^(?P<file>.*?)\((?P<line>\d+)\): (?P<kind>(?:catastrophic )?error)[^:]*: (?P<msg>.*)$")
# g++ (the host emulator): file:line:column: error: message
_GCC_ERROR_LINE = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):\d+: (?P<kind>(?:fatal )?error): (?P<msg>.*)$")

Image = Union[str, bytes]       # PTX text, or a CUBIN


class KernelCompileError(RuntimeError):
    """The compiler rejected a kernel. ``name``: the op/kernel; ``errors``: a
    list of ``(line number, source line, message)``; ``log``: the compiler's
    full output (NVRTC's program log, or nvcc's)."""

    def __init__(self, name: str, errors: List[Tuple[Optional[int], str, str]], log: str, arch: str):
        self.name, self.errors, self.log, self.arch = name, errors, log, arch
        if errors:
            detail = "\n".join(f"  {'source' if lineno is None else f'line {lineno}'}: {msg}\n    | {text.strip()}"
                               for lineno, text, msg in errors[:5])
            if len(errors) > 5:
                detail += f"\n  ... and {len(errors) - 5} more errors"
            tail = log.strip().splitlines()[:30]
            detail += "\n  compiler log:\n" + "\n".join("    " + t for t in tail)
        else:
            tail = log.strip().splitlines()[-10:]
            detail = "\n".join("  " + t for t in tail) or "  (the compiler gave no output)"
        super().__init__(f"CUDA kernel {name!r} failed to compile for {arch}:\n{detail}")


@dataclass(frozen=True)
class Program:
    """A compiled program: ``key``, ``image`` (PTX text or CUBIN bytes),
    ``kind`` ("ptx"/"cubin"), ``label`` (a kernel's name, or a family
    part's "elemwise-float.0"), ``units`` (the sources it was made of: one,
    or a family part's members)."""
    key: str
    image: Image
    kind: str
    label: str
    units: Tuple[str, ...]


def default_directory() -> Path:
    return Path(os.environ.get("GRADCORE_KERNEL_CACHE") or "~/.cache/gradcore/kernels").expanduser()


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
              options: Sequence[str] = (), compiler: str = "") -> str:
    """gradcore's kernel key: a sha256 over (op/kernel name, dtypes, shapes
    class, sha256 of the source, architecture, compiler options, compiler
    identity such as "nvrtc 13.5 ptx")."""
    import hashlib          # (here: ~5 ms to import, OpenSSL's, and a CPU-only process never keys a kernel)
    record = {
        "v": KEY_VERSION,
        "name": str(name),
        "dtypes": [_dtype_str(d) for d in dtypes],
        "shapes": _canon(shapes_class),
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "arch": str(arch),
        "options": list(options),
        "compiler": compiler,
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _safe(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.-]", "_", name)[:60]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not on Linux
        return os.cpu_count() or 1


def _arch_number(arch: str) -> int:
    digits = re.sub(r"\D", "", arch)
    return int(digits) if digits else 80


class KernelCache:
    """Compiled CUDA C sources, once per key, standard kernels per family.

    Example::

        cache = KernelCache()
        ptx = cache.get("gc_mul_float", source, dtypes=["float32"], shapes_class="contig")
        # PyCUDA (GPU side): pycuda.driver.module_from_buffer(ptx.encode())
        cache.stats["compiles"]     # programs compiled by this instance (a family counts once)
    """

    def __init__(self, directory=None, arch: str = DEFAULT_ARCH, nvcc: Optional[str] = None,
                 options: Sequence[str] = (), timeout: float = 300.0, output: str = "ptx",
                 compiler: Optional[str] = None, families: bool = True, workers: Optional[int] = None):
        if output not in ("ptx", "cubin"):
            raise ValueError(f"KernelCache: output must be 'ptx' or 'cubin', got {output!r}")
        self.directory = Path(directory).expanduser() if directory is not None else default_directory()
        self.arch = arch
        self.output = output
        self._nvcc = nvcc
        self._compiler = compiler or os.environ.get("GRADCORE_CUDA_COMPILER", "").strip().lower() or None
        if self._compiler not in (None, "nvrtc", "nvcc"):
            raise ValueError(f"KernelCache: compiler must be 'nvrtc' or 'nvcc', got {self._compiler!r}")
        self._identity = None
        self.options = tuple(options)
        self.timeout = timeout
        self.families = families
        self.workers = workers or _cores()
        self._memory = {}               # key -> Program (a kernel's key and its part's key)
        self._broken = set()            # family labels that failed to compile: members compile alone
        self._lock = threading.Lock()
        self._family_lock = threading.Lock()
        # compiles: a kernel compiled alone, or a whole family (all its parts)
        self.stats = {"memory_hits": 0, "disk_hits": 0, "compiles": 0}
        self.compiled = []              # (label, kernels, seconds) per compile: tests and benchmarks read it
        self.compiler_runs = 0          # NVRTC programs or nvcc processes (a family's parts each count)

    # ------------------------------------------------------------ the compiler
    def compiler(self) -> str:
        """"nvrtc" or "nvcc": the one this cache compiles with."""
        if self._compiler is None:
            self._nvrtc_version = self._find_nvrtc_version()
            self._compiler = "nvrtc" if self._nvrtc_version else "nvcc"
        return self._compiler

    def identity(self) -> str:
        """The compiler's part of the key: "nvrtc 13.5 ptx", "nvcc ptx"."""
        if self._identity is None:
            if self.compiler() == "nvrtc":
                version = getattr(self, "_nvrtc_version", None) or self._find_nvrtc_version()
                self._identity = f"nvrtc {version} {self.output}"
            else:
                self._identity = f"nvcc {self.output}"
        return self._identity

    def _find_nvrtc_version(self) -> Optional[str]:
        """NVRTC's "major.minor", or None without a loadable NVRTC. A warm
        start must not pay for loading the library (tens of ms) just to key
        its lookups: the version is remembered in the cache directory
        against the library file's path, size and modification time."""
        from . import nvrtc
        path = nvrtc.locate()
        if path is None:
            return None
        record = self.directory / "nvrtc-version.txt"
        try:
            st = os.stat(path)
            stamp = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}"
        except OSError:
            stamp = None
        if stamp is not None:
            try:
                seen, version = record.read_text().rsplit(" ", 1)
                if seen == stamp:
                    return version.strip()
            except (OSError, ValueError):
                pass
        if not nvrtc.available():
            return None
        version = "%d.%d" % nvrtc.version()
        if stamp is not None:
            self._write(record, f"{stamp} {version}\n")
        return version

    def _target(self, arch: str) -> Tuple[str, str]:
        """(NVRTC's --gpu-architecture, output kind) for ``arch``: a CUBIN
        for a GPU this NVRTC knows, else PTX for the newest architecture it
        knows that is not newer (the driver JIT-compiles it forward)."""
        from . import nvrtc
        number = _arch_number(arch)
        supported = nvrtc.supported_archs()
        if self.output == "cubin" and number in supported:
            return f"sm_{number}", "cubin"
        older = [a for a in supported if a <= number]
        return f"compute_{max(older) if older else min(supported)}", "ptx"

    # ------------------------------------------------------------ lookup
    def key(self, name, source, dtypes=(), shapes_class="", arch=None) -> str:
        return cache_key(name, source, dtypes, shapes_class, arch or self.arch, self.options, self.identity())

    def path_for(self, key: str, name: str = "", kind: Optional[str] = None) -> Path:
        ext = kind or self.output
        return self.directory / (f"{_safe(name)}-{key}.{ext}" if name else f"{key}.{ext}")

    def get(self, name: str, source: str, dtypes=(), shapes_class="", arch: Optional[str] = None) -> Image:
        """The compiled ``source`` (the kernel/op ``name``): PTX text, or
        CUBIN bytes with ``output="cubin"``; from memory, from disk, or
        compiled now (with its family, if it has one) and stored in both."""
        return self.program(name, source, dtypes, shapes_class, arch).image

    def program(self, name: str, source: str, dtypes=(), shapes_class="", arch: Optional[str] = None) -> Program:
        """The ``Program`` holding ``source``'s kernels (see ``get``): a
        family part holds many, so modules can be loaded once per part."""
        arch = arch or self.arch
        key = self.key(name, source, dtypes, shapes_class, arch)
        prog = self._memory.get(key)
        if prog is not None:
            self.stats["memory_hits"] += 1
            return prog
        prog = self._from_disk(key, name, source)
        if prog is not None:
            self.stats["disk_hits"] += 1
            self._memory[key] = prog
            return prog
        prog = self._family_program(key, name, source, arch)
        if prog is None:
            image = self.compile(name, source, arch)
            prog = Program(key, image, self.output, name, (source,))
            self._write(self.path_for(key, name), image)
        self._memory[key] = prog
        return prog

    def _from_disk(self, key: str, name: str, source: str) -> Optional[Program]:
        image = self._read(self.path_for(key, name))
        if image is not None and not self._stale(image):
            return Program(key, image, self.output, name, (source,))
        # a family member: its .ref names the part's file
        ref = self._read_ref(self.path_for(key, name, "ref"))
        if ref is None:
            return None
        part_key, part_file = ref
        prog = self._memory.get(part_key)
        if prog is None:
            image = self._read(self.directory / part_file)
            if image is None:
                return None
            prog = Program(part_key, image, self.output, part_file, (source,))
            self._memory[part_key] = prog
        return prog

    def nvcc_version(self) -> Optional[str]:
        """The installed nvcc's version line ("Cuda compilation tools,
        release 13.0, V13.0.88"), or None without nvcc."""
        if not hasattr(self, "_nvcc_version"):
            self._nvcc_version = None
            import subprocess       # (here: a warm start never runs nvcc, and the import costs ~4 ms)
            try:
                out = subprocess.run([self.nvcc(), "--version"], capture_output=True, text=True, timeout=60)
                self._nvcc_version = next((line.strip() for line in out.stdout.splitlines()
                                           if line.startswith("Cuda compilation tools")), None)
            except Exception:
                pass
        return self._nvcc_version

    def _stale(self, image: Image) -> bool:
        """Whether PTX cached by nvcc came from another nvcc than the
        installed one (its header names it; NVRTC's version is in the key);
        without nvcc any cached PTX serves."""
        if not isinstance(image, str) or self.compiler() != "nvcc":
            return False
        made_by = next((line[2:].strip() for line in image.splitlines()[:8]
                        if line.startswith("// Cuda compilation tools")), None)
        if made_by is None:
            return False
        current = self.nvcc_version()
        return current is not None and current != made_by

    def contains(self, name, source, dtypes=(), shapes_class="", arch=None) -> bool:
        key = self.key(name, source, dtypes, shapes_class, arch)
        return (key in self._memory or self._read(self.path_for(key, name)) is not None
                or self._read_ref(self.path_for(key, name, "ref")) is not None)

    # ------------------------------------------------------------ families
    def _family_program(self, key: str, name: str, source: str, arch: str) -> Optional[Program]:
        """Compile the family holding ``source`` (all its parts) and give
        the part that holds it; None when it has no family (or its family
        failed to compile: it then compiles alone)."""
        if not self.families:
            return None
        from . import families
        fam = families.family_of(source)
        if fam is None or fam.label in self._broken:
            return None
        with self._family_lock:
            # another thread may have compiled it meanwhile
            hit = self._memory.get(key)
            if hit is not None:
                return hit
            parts = self.compile_family(fam, arch)
        if parts is None:
            return None
        return next(p for p in parts if source in p.units)

    def compile_family(self, fam, arch: Optional[str] = None) -> Optional[List[Program]]:
        """Compile every part of family program ``fam``
        (``families.program(family, ctype)``) in parallel, store the parts
        and their members' refs, and give the parts; None (and a warning) if
        a part fails to compile, after which its members compile alone."""
        from concurrent.futures import ThreadPoolExecutor      # (only a cold compile: ~5 ms to import)
        from . import families
        arch = arch or self.arch
        n_parts = max(1, min(self.workers, len(fam.units) // PART_MIN_UNITS))
        chunks = [fam.units[i::n_parts] for i in range(n_parts)]      # dealt round, so parts weigh alike
        sources = [families.combine(chunk, f"{fam.label}.{i}")[0] for i, chunk in enumerate(chunks)]
        labels = [f"{fam.label}.{i}" for i in range(len(chunks))]
        keys = [self.key(label, text, (), "", arch) for label, text in zip(labels, sources)]
        images = [self._read(self.path_for(k, label)) for k, label in zip(keys, labels)]
        todo = [i for i, image in enumerate(images) if image is None]
        errors = []

        def build(i):
            try:
                images[i] = self._compile_unit(labels[i], sources[i], arch)
            except KernelCompileError as exc:
                errors.append(exc)

        if todo:
            start = time.perf_counter()
            if len(todo) > 1 and self.workers > 1:
                with ThreadPoolExecutor(max_workers=min(self.workers, len(todo))) as pool:
                    list(pool.map(build, todo))
            else:
                for i in todo:
                    build(i)
            self.stats["compiles"] += 1
            self.compiled.append((fam.label, len(fam.kernels), time.perf_counter() - start))
        if errors:
            self._broken.add(fam.label)
            warnings.warn(f"the CUDA kernel family {fam.label} failed to compile as one program; its kernels "
                          f"compile one by one. {errors[0]}", RuntimeWarning, stacklevel=4)
            return None
        parts = []
        for i in range(len(chunks)):
            prog = Program(keys[i], images[i], self.output, labels[i], tuple(chunks[i]))
            path = self.path_for(keys[i], labels[i])
            if i in todo:
                self._write(path, images[i])
            self._memory[keys[i]] = prog
            # every kernel of every member finds the part: in memory, and
            # through a ref on disk (the backend asks by kernel name)
            for unit in chunks[i]:
                for kernel in families.kernel_names(unit):
                    member = self.key(kernel, unit, (), "", arch)
                    self._memory[member] = prog
                    ref = self.path_for(member, kernel, "ref")
                    if i in todo or self._read_ref(ref) is None:
                        self._write(ref, f"{keys[i]} {path.name}\n")
            parts.append(prog)
        return parts

    def precompile(self, family_names: Optional[Sequence[str]] = None, ctypes: Sequence[str] = ("float",),
                   arch: Optional[str] = None) -> int:
        """Compile the standard kernel families (all, or ``family_names``)
        for the C element types ``ctypes`` now, in parallel; the number of
        families compiled (0 when the disk cache had them all). Example:
        ``gradcore.cuda.backend().driver.cache.precompile()`` on a new machine."""
        from concurrent.futures import ThreadPoolExecutor
        from . import families
        fams = [families.program(f, c) for f in (family_names or families.family_names()) for c in ctypes]
        fams = [fam for fam in fams if fam.units]       # softmax has no integer kernels
        before = self.stats["compiles"]
        with ThreadPoolExecutor(max_workers=max(1, min(len(fams), self.workers))) as pool:
            list(pool.map(lambda fam: self.compile_family(fam, arch), fams))
        return self.stats["compiles"] - before

    # ------------------------------------------------------------ disk
    @staticmethod
    def _read(path: Path) -> Optional[Image]:
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if data[:4] == b"\x7fELF":
            return data                 # a CUBIN
        # PTX names its version and target; anything else is not ours
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return None
        if ".version" not in text or ".target" not in text:
            return None
        return text

    def _read_ref(self, path: Path) -> Optional[Tuple[str, str]]:
        try:
            part_key, part_file = path.read_text().split()
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        return part_key, part_file

    def _write(self, path: Path, image: Image):
        import tempfile         # (only after a compile: ~4 ms to import)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=path.name + ".", suffix=".tmp")
        except OSError:
            return      # a read-only cache directory only costs recompiles
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(image.encode() if isinstance(image, str) else image)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    # ------------------------------------------------------------ compilers
    def nvcc(self) -> str:
        if self._nvcc is None:
            from .toolkit import nvcc_path
            self._nvcc = nvcc_path()
            if self._nvcc is None:
                raise RuntimeError("nvcc was not found (on PATH, $CUDA_HOME/bin or /usr/local/cuda/bin) and "
                                   "NVRTC did not load: one of them is needed to compile CUDA kernels "
                                   "(pip install nvidia-cuda-nvrtc)")
        return self._nvcc

    def compile(self, name: str, source: str, arch: Optional[str] = None) -> Image:
        """Compile ``source`` (one translation unit) for ``arch`` with NVRTC
        or nvcc: PTX text, or CUBIN bytes (``output="cubin"``). Counted in
        ``stats["compiles"]`` and ``compiled``."""
        from .families import kernel_names
        arch = arch or self.arch
        self.stats["compiles"] += 1
        start = time.perf_counter()
        image = self._compile_unit(name, source, arch)
        self.compiled.append((name, len(kernel_names(source)), time.perf_counter() - start))
        return image

    def _compile_unit(self, name: str, source: str, arch: str) -> Image:
        with self._lock:
            self.compiler_runs += 1
        if self.compiler() == "nvrtc":
            return self._compile_nvrtc(name, source, arch)
        return self._compile_nvcc(name, source, arch)

    def _compile_nvrtc(self, name: str, source: str, arch: str) -> Image:
        from . import nvrtc
        target, kind = self._target(arch)
        filename = f"{_safe(name) or 'kernel'}"
        result = nvrtc.compile_program(source, filename, target, self.options)
        if not result.ok:
            raise KernelCompileError(name, parse_errors(result.log, source, filename + ".cu"), result.log, target)
        return result.image.decode() if kind == "ptx" else result.image

    def _compile_nvcc(self, name: str, source: str, arch: str) -> Image:
        import subprocess
        import tempfile
        nvcc = self.nvcc()
        kind = self.output
        with tempfile.TemporaryDirectory(prefix="gradcore-nvcc-") as tmp:
            src = Path(tmp) / f"{_safe(name) or 'kernel'}.cu"
            out = Path(tmp) / f"kernel.{kind}"
            src.write_text(source)
            cmd = [nvcc, f"--{kind}", f"-arch={arch}", *self.options, "-o", str(out), str(src)]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout)
            except subprocess.TimeoutExpired as exc:
                raise KernelCompileError(name, [], f"nvcc timed out after {exc.timeout} s", arch) from None
            log = (res.stdout or "") + (res.stderr or "")
            if res.returncode != 0 or not out.exists():
                raise KernelCompileError(name, parse_errors(log, source, src.name), log, arch)
            return out.read_text() if kind == "ptx" else out.read_bytes()


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
