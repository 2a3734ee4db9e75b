"""MegEngine's logging helpers: ``get_logger``, ``set_log_level``,
``set_log_file`` and ``enable_debug_log`` (on Python's ``logging``).

Loggers made by :func:`get_logger` are remembered so that
:func:`set_log_level` and :func:`set_log_file` reach them all, as in MegEngine.

Example::

    >>> import logging
    >>> old = gc.set_log_level(logging.WARNING)
    >>> gc.get_logger("gradcore.example").getEffectiveLevel() == logging.WARNING
    True
    >>> _ = gc.set_log_level(old)
"""
from __future__ import annotations

import logging
from typing import IO, List, Optional, Type, Union

__all__ = ["get_logger", "set_log_level", "set_log_file", "enable_debug_log"]

_loggers: List[logging.Logger] = []
_state = {"level": logging.NOTSET, "file_handler": None, "opened": None}


def _handled() -> set:
    """The loggers set_log_file writes for: those get_logger made, and gradcore's."""
    return set(_loggers) | {logging.getLogger("gradcore")}


def _has_ancestor_in(logger: logging.Logger, loggers) -> bool:
    """Whether records of ``logger`` propagate to one of ``loggers``."""
    while logger.propagate and logger.parent is not None:
        logger = logger.parent
        if logger in loggers:
            return True
    return False


def get_logger(name: Optional[str] = None,
               formatter: Optional[Type[logging.Formatter]] = None) -> logging.Logger:
    """The ``logging`` logger ``name`` (gradcore's own, ``"gradcore"``, when
    None), at the level :func:`set_log_level` set and writing to the file
    :func:`set_log_file` set; ``formatter``, a ``logging.Formatter`` class,
    gives it a stderr handler formatting with it.

    Example::

        >>> log = gc.get_logger()
        >>> log.name
        'gradcore'
        >>> log.info("starting")
    """
    logger = logging.getLogger("gradcore" if name is None else name)
    if logger not in _loggers:
        _loggers.append(logger)
        if _state["level"] != logging.NOTSET:
            logger.setLevel(_state["level"])
        if _state["file_handler"] is not None and not _has_ancestor_in(logger, _handled()):
            logger.addHandler(_state["file_handler"])
    if formatter is not None and not getattr(logger, "_gradcore_formatter", None):
        handler = logging.StreamHandler()
        handler.setFormatter(formatter())
        logger.addHandler(handler)
        logger._gradcore_formatter = formatter
    return logger


def set_log_level(level: Union[int, str], update_existing: bool = True) -> Union[int, str]:
    """Make ``level`` (a ``logging`` level) the level of the loggers
    :func:`get_logger` makes from now on, and with ``update_existing`` of
    those it made already; returns the previous default.

    Example::

        >>> import logging
        >>> old = gc.set_log_level(logging.ERROR)
        >>> gc.get_logger().level == logging.ERROR
        True
        >>> _ = gc.set_log_level(old)
    """
    previous = _state["level"]
    _state["level"] = level
    if update_existing:
        for logger in _loggers:
            logger.setLevel(level)
    return previous


def set_log_file(fout: Union[str, IO[str]], mode: str = "a") -> None:
    """Also write the records of gradcore's loggers to ``fout``, a file name
    (opened with ``mode``) or a writable text file; a later call replaces it.

    Example::

        >>> import io
        >>> buf = io.StringIO(); gc.set_log_file(buf)
        >>> gc.get_logger("gradcore.example").warning("disk almost full")
        >>> "disk almost full" in buf.getvalue()
        True
        >>> gc.set_log_file(io.StringIO())
    """
    stream = open(fout, mode) if isinstance(fout, str) else fout
    if not hasattr(stream, "write"):
        raise TypeError(f"set_log_file: fout must be a file name or a writable file, got {type(fout).__name__}")
    old = _state["file_handler"]
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    _state["file_handler"] = handler
    targets = _handled()
    for logger in targets:
        if old is not None:
            logger.removeHandler(old)
        if not _has_ancestor_in(logger, targets):      # its records reach the ancestor's copy
            logger.addHandler(handler)
    if _state["opened"] is not None and _state["opened"] is not stream:
        _state["opened"].close()     # a file this function opened for an earlier call
    _state["opened"] = stream if isinstance(fout, str) else None


def enable_debug_log() -> None:
    """Log everything down to ``logging.DEBUG`` (``set_log_level(logging.DEBUG)``).

    Example::

        >>> import logging
        >>> old = gc.set_log_level(logging.INFO)
        >>> gc.enable_debug_log(); gc.get_logger().level == logging.DEBUG
        True
        >>> _ = gc.set_log_level(old)
    """
    set_log_level(logging.DEBUG)
