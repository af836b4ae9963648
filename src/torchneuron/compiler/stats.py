"""Counters of the compile backend, for users and tests (`torchneuron.compile_stats()`)."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass


@dataclass
class CompileStats:
    graphs_compiled: int = 0  # FX graphs handed to the backend (forward and backward count)
    xla_compilations: int = 0  # executables built by XLA in this process
    memory_cache_hits: int = 0  # calls served by an executable already in memory
    disk_cache_hits: int = 0  # executables loaded from the on-disk cache instead of compiled
    disk_cache_errors: int = 0  # unreadable/corrupted on-disk entries ignored and rebuilt
    eager_fallbacks: int = 0  # graphs that could not be lowered and run op by op instead
    compile_seconds: float = 0.0  # time spent lowering and compiling (or loading) executables


_lock = threading.Lock()
STATS = CompileStats()


def bump(field: str, amount: float = 1) -> None:
    with _lock:
        setattr(STATS, field, getattr(STATS, field) + amount)


def compile_stats() -> dict[str, float]:
    """A snapshot of the compile backend's counters."""
    with _lock:
        return asdict(STATS)


def reset_compile_stats() -> None:
    with _lock:
        for field, value in asdict(CompileStats()).items():
            setattr(STATS, field, value)
