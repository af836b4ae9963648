"""Stream and Event objects for `torch.neuron`, as FSDP2 and DTensor expect of a device module.

The neuron device runs its work in program order on one queue (PJRT executes a device's
computations in the order they were enqueued), and collectives here complete before they
return. So one stream is all there is: `wait_stream`/`wait_event` are already satisfied, and
`synchronize` waits for the queue. These are installed on `torch.neuron` only where the device
module does not provide them itself.
"""

from __future__ import annotations

import contextlib
import time

import torch


def _sync() -> None:
    torch.neuron.synchronize()


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        if self.enable_timing:
            _sync()
            self._time = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _sync()

    def elapsed_time(self, end: Event) -> float:
        if self._time is None or end._time is None:
            raise RuntimeError("elapsed_time needs two events recorded with enable_timing=True")
        return (end._time - self._time) * 1000.0


class Stream:
    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.device = torch.device("neuron", 0) if device is None else torch.device(device)
        self.priority = priority

    def wait_stream(self, stream: Stream) -> None:
        pass

    def wait_event(self, event: Event) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _sync()

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return 0


_DEFAULT = Stream()


def current_stream(device=None) -> Stream:
    return _DEFAULT


def default_stream(device=None) -> Stream:
    return _DEFAULT


@contextlib.contextmanager
def stream(s: Stream | None):
    yield s


def install(module) -> None:
    """Add what is missing to the device module `torch.neuron`."""
    for name, value in (
        ("Stream", Stream), ("Event", Event), ("current_stream", current_stream),
        ("default_stream", default_stream), ("stream", stream),
    ):
        if not hasattr(module, name):
            setattr(module, name, value)
