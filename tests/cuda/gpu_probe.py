"""Whether this machine has a GPU PyCUDA can use, asked once per process:
the ``cuda`` fixture (conftest.py) and the tests that need to know outside it
import it by name (``conftest`` itself is not importable by name: tests/ops
has one too)."""
from __future__ import annotations

from typing import Optional

_reason: Optional[str] = None


def gpu_unavailable_reason() -> Optional[str]:
    """None where PyCUDA finds a GPU, else why not."""
    global _reason
    if _reason is None:
        from gradcore.cuda.driver import CudaUnavailable, PyCudaDriver
        try:
            PyCudaDriver()
            _reason = ""
        except CudaUnavailable as exc:
            _reason = str(exc)
    return _reason or None
