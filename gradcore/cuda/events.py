"""Events of the device layer, for the layers above it to subscribe to.

The device layer imports nothing from the engine (graphs, functional,
tensor methods, ops); what the engine keeps per backend (compiled backward
graphs, cached scalar constants) is dropped by the engine itself when told::

    from gradcore.cuda import events
    events.subscribe("backend_changed", my_cache.clear)    # at import
    events.publish("backend_changed")                      # gradcore.cuda.use(...) does this

Events: ``backend_changed`` (no arguments): ``gradcore.cuda.use`` selected
another backend (or forgot the current one).
"""
from __future__ import annotations

from typing import Callable, Dict, List

EVENTS = ("backend_changed",)
_subscribers: Dict[str, List[Callable[[], None]]] = {name: [] for name in EVENTS}


def subscribe(event: str, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback()`` whenever ``event`` is published; returns it (a
    decorator works too). Subscribing twice is once."""
    if event not in _subscribers:
        raise ValueError(f"unknown device event {event!r}; the events are {EVENTS}")
    if callback not in _subscribers[event]:
        _subscribers[event].append(callback)
    return callback


def publish(event: str) -> None:
    """Call every subscriber of ``event``, in the order they subscribed."""
    for callback in list(_subscribers[event]):
        callback()
