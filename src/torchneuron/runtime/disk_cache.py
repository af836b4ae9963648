"""The on-disk cache of compiled executables, shared by processes.

An entry is written to a temporary file in the cache directory and renamed into place, so a
reader never sees a partial file and concurrent writers of the same key cannot interleave; each
entry carries a SHA-256 of its payload, so a corrupted or truncated file is detected, ignored
and rebuilt. A read marks an entry used (its mtime); a write that takes the directory past
`TORCHNEURON_DISK_CACHE_BYTES` removes the least recently used entries. Directory:
`$TORCHNEURON_CACHE_DIR/executables` (root default `~/.cache/torchneuron`);
`TORCHNEURON_COMPILE_CACHE=0` disables it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import threading
from pathlib import Path

import jax.monitoring

from .. import config
from ..runtime import disk_budget

_MAGIC = b"TNXC1\n"


def cache_dir() -> Path | None:
    """`$TORCHNEURON_CACHE_DIR/executables` (default root `~/.cache/torchneuron`), or None when
    `TORCHNEURON_COMPILE_CACHE=0` turns the on-disk cache off."""
    if not config.flag("TORCHNEURON_COMPILE_CACHE"):
        return None
    return config.cache_root() / "executables"


def entry_path(key: str) -> Path | None:
    directory = cache_dir()
    return None if directory is None else directory / f"{key}.bin"


def load(key: str):
    """The stored object for `key`, or None when absent; raises ValueError when corrupted."""
    path = entry_path(key)
    if path is None or not path.exists():
        return None
    data = path.read_bytes()
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 32:
        raise ValueError(f"bad header in {path}")
    digest = data[len(_MAGIC) : len(_MAGIC) + 32]
    payload = data[len(_MAGIC) + 32 :]
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError(f"checksum mismatch in {path}")
    try:
        os.utime(path)  # used now: the size limit removes least recently used entries first
    except OSError:
        pass
    return pickle.loads(payload)


def store(key: str, value) -> None:
    path = entry_path(key)
    if path is None:
        return
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".bin")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(_MAGIC)
            handle.write(hashlib.sha256(payload).digest())
            handle.write(payload)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    disk_budget.prune(path.parent, int(config.raw("TORCHNEURON_DISK_CACHE_BYTES")),
                      pattern="*.bin")



def discard(key: str) -> None:
    path = entry_path(key)
    if path is not None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


# JAX's own on-disk cache (runtime/platform.py turns it on for eager programs) would also
# take and serve `Lowered.compile()` of a graph. An executable it loaded cannot be serialized
# again whole (a later process that runs the copy fails with "Function ... not found"), and
# one cache per program is enough: graphs are compiled with JAX's cache writes off (a
# thread-local setting), and one JAX serves all the same (an entry written before) is not
# stored here. JAX reports a hit as a monitoring event, on the compiling thread.
_JAX_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_hits = threading.local()
try:
    from jax._src.config import persistent_cache_min_compile_time_secs as _min_compile_time
except ImportError:  # another JAX: its cache may hold graphs too, the hit check still holds
    _min_compile_time = None


def _count_jax_cache_hits(event: str, **_kwargs) -> None:
    if event == _JAX_CACHE_HIT:
        _hits.count = getattr(_hits, "count", 0) + 1


jax.monitoring.register_event_listener(_count_jax_cache_hits)


def compile_lowered(lowered) -> tuple[object, bool]:
    """(executable, whether JAX's on-disk cache served it: then it must not be stored)."""
    before = getattr(_hits, "count", 0)
    if _min_compile_time is None:
        executable = lowered.compile()
    else:
        with _min_compile_time(float("inf")):  # JAX writes no entry for it
            executable = lowered.compile()
    return executable, getattr(_hits, "count", 0) != before

