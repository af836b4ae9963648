"""Counters of the compile backend, for users and tests (`torchneuron.compile_stats()`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CompileStats:
    graphs_compiled: int = 0  # FX graphs handed to the backend (forward and backward count)
    xla_compilations: int = 0  # executables built by XLA in this process
    memory_cache_hits: int = 0  # calls served by an executable already in memory
    disk_cache_hits: int = 0  # executables loaded from the on-disk cache instead of compiled
    disk_cache_errors: int = 0  # unreadable/corrupted on-disk entries ignored and rebuilt
    eager_fallbacks: int = 0  # graphs that could not be lowered and run op by op instead
    compile_seconds: float = 0.0  # time spent lowering and compiling (or loading) executables
    # Bucketed compilation (compiler/buckets.py): graphs with dynamic sizes run on inputs
    # padded to a bucket, one executable per bucket.
    bucketed_graphs: int = 0  # graphs with dynamic sizes proven exact on padded inputs
    unbucketed_graphs: int = 0  # graphs with dynamic sizes kept at one executable per shape
    unbucketed_reasons: list = field(default_factory=list)  # "op: why" for each of those
    bucketed_calls: int = 0  # calls that ran a bucket's executable
    bucket_adapter_compilations: int = 0  # small programs that pad inputs and cut outputs


_lock = threading.Lock()
STATS = CompileStats()
# Where this thread's counts go: STATS, or the counters of eager traces compiled as graphs
# (compiler/eager_traces.py), which are not torch.compile's.
_target = threading.local()


def target_stats() -> CompileStats:
    return getattr(_target, "stats", None) or STATS


@contextlib.contextmanager
def counting_into(stats: CompileStats) -> Iterator[None]:
    """Count this thread's compilations into `stats` instead of `compile_stats()`."""
    before = getattr(_target, "stats", None)
    _target.stats = stats
    try:
        yield
    finally:
        _target.stats = before


def bump(field_name: str, amount: float = 1) -> None:
    with _lock:
        target = target_stats()
        setattr(target, field_name, getattr(target, field_name) + amount)


def note_unbucketed(reason: str) -> None:
    """A graph with dynamic sizes that compiles once per shape, and why."""
    with _lock:
        target = target_stats()
        target.unbucketed_graphs += 1
        target.unbucketed_reasons.append(reason)


def compile_stats() -> dict[str, Any]:
    """A snapshot of the compile backend's counters."""
    with _lock:
        return asdict(STATS)


def reset_compile_stats() -> None:
    with _lock:
        for name, value in asdict(CompileStats()).items():
            setattr(STATS, name, value)
