"""The on-disk caches of compiled executables, shared by processes.

Two kinds of entries, each in its own directory under `$TORCHNEURON_CACHE_DIR` (root default
`~/.cache/torchneuron`): `executables/` holds compiled graphs (compiler/graph.py), `programs/`
the fused programs of eager mode (runtime/fusion.py). `TORCHNEURON_COMPILE_CACHE=0` turns both
off.

An entry is written to a temporary file in the cache directory and renamed into place, so a
reader never sees a partial file and concurrent writers of the same key cannot interleave; each
entry carries a SHA-256 of its payload, so a corrupted or truncated file is detected, ignored
and rebuilt. A read marks an entry used (its mtime); the least recently used entries are
removed to keep each directory within `TORCHNEURON_DISK_CACHE_BYTES`, checked at a process's
first write and after each sixteenth of that budget written since.

`known_results` keeps one small fact per eager executable (which of its results are always
None) in an append-only file, so that a warm process records ops without tracing them first.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import jax
import jax.monitoring
import torch
from jax.experimental import serialize_executable

from .. import config
from ..lowerings import host_kernels
from . import disk_budget

try:
    from jax._src.lax.linalg import initialize_lapack as _initialize_lapack
except ImportError:  # a JAX without this hook: nothing to bind before a load
    _initialize_lapack = None

_MAGIC = b"TNXC1\n"
GRAPHS = "executables"
PROGRAMS = "programs"


def cache_dir(kind: str = GRAPHS) -> Path | None:
    """`$TORCHNEURON_CACHE_DIR/<kind>`, or None when `TORCHNEURON_COMPILE_CACHE=0` turns the
    on-disk caches off."""
    if not config.flag("TORCHNEURON_COMPILE_CACHE"):
        return None
    return config.cache_root() / kind


def entry_path(key: str, kind: str = GRAPHS) -> Path | None:
    directory = cache_dir(kind)
    return None if directory is None else directory / f"{key}.bin"


def load(key: str, kind: str = GRAPHS):
    """The stored object for `key`, or None when absent; raises ValueError when corrupted."""
    path = entry_path(key, kind)
    if path is None:
        return None
    try:
        data = path.read_bytes()
    except FileNotFoundError:  # absent, or just removed by a size limit (this process's or another's)
        return None
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


def store(key: str, value, kind: str = GRAPHS) -> None:
    path = entry_path(key, kind)
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
    _prune_now_and_then(path.parent, len(payload))


# bytes written per directory since this process last pruned it
_unpruned: dict[Path, int] = {}


def _prune_now_and_then(directory: Path, written: int) -> None:
    # Pruning reads every entry's size and age: at the first write of a process, then each
    # time another sixteenth of the budget has been written, not at every write (a process
    # compiling thousands of small programs would scan the directory thousands of times).
    budget = int(config.raw("TORCHNEURON_DISK_CACHE_BYTES"))
    since = _unpruned.get(directory)
    total = written + (since or 0)
    if since is not None and total < budget // 16:
        _unpruned[directory] = total
        return
    _unpruned[directory] = 0
    disk_budget.prune(directory, budget, pattern="*.bin")


def discard(key: str, kind: str = GRAPHS) -> None:
    path = entry_path(key, kind)
    if path is not None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def load_executable(key: str, kind: str, client, on_error: Callable[[], None] | None = None):
    """The executable stored under `key`, loaded onto `client`; None when absent, or when the
    entry cannot be read or loaded (then it is removed, with a warning, and `on_error` runs)."""
    try:
        stored = load(key, kind)
        if stored is None:
            return None
        payload, in_tree, out_tree = stored
        _initialize_runtime_libraries()
        return serialize_executable.deserialize_and_load(payload, in_tree, out_tree,
                                                         backend=client)
    except Exception as err:  # corrupted, or written by another build: ignore and rebuild
        warnings.warn(f"torchneuron: ignoring an unreadable compile cache entry ({err})",
                      stacklevel=3)
        discard(key, kind)
        if on_error is not None:
            on_error()
        return None


def _initialize_runtime_libraries() -> None:
    # jaxlib binds its LAPACK kernels (CPU linalg: getrf, potrf, ...) only when it first lowers
    # a linalg op. An executable loaded in a process that never lowered one would call through
    # unset pointers and crash the process (SIGSEGV): bind them before any load.
    if _initialize_lapack is not None:
        _initialize_lapack()


def store_executable(key: str, kind: str, executable) -> None:
    try:
        store(key, serialize_executable.serialize(executable), kind)
    except Exception as err:  # a full disk must not break training
        warnings.warn(f"torchneuron: could not write the compile cache ({err})", stacklevel=3)


def build_digest() -> str:
    """What every entry's key starts from: the versions, the platform, XLA's flags, the
    package's own source (an edited lowering must not be served an old program) and the host
    kernels programs may call (lowerings/host_kernels.py)."""
    return _digest_with(host_kernels.identity())


@functools.cache
def _digest_with(kernels: str) -> str:
    if not kernels:
        return _source_digest()
    return hashlib.sha256(f"{_source_digest()}\0{kernels}".encode()).hexdigest()


@functools.cache
def _source_digest() -> str:
    h = hashlib.sha256()
    for part in (torch.__version__, jax.__version__, config.platform(),
                 os.environ.get("XLA_FLAGS", "")):
        h.update(part.encode() + b"\0")
    package = Path(__file__).resolve().parent.parent
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


# -- facts about eager executables -----------------------------------------------------------

_FACTS_FILE = "eager-results-v1"
_FACTS_LIMIT = 8 << 20  # bytes; a larger file starts over
_facts: dict[str, tuple[bool, ...]] | None = None
_facts_lock = threading.Lock()


def _fact_key(name: str) -> str:
    return hashlib.sha256(f"{build_digest()}\0{name}".encode()).hexdigest()[:32]


def _read_facts() -> dict[str, tuple[bool, ...]]:
    global _facts
    if _facts is None:
        _facts = {}
        directory = cache_dir(PROGRAMS)
        path = None if directory is None else directory / _FACTS_FILE
        try:
            if path is not None and path.stat().st_size > _FACTS_LIMIT:
                path.unlink()
            text = "" if path is None else path.read_text()
        except OSError:
            text = ""
        for line in text.splitlines():
            key, _, bits = line.partition(" ")
            if len(key) == 32 and bits and set(bits) <= {"0", "1"}:  # a torn line is skipped
                _facts[key] = tuple(b == "1" for b in bits)
    return _facts


def known_results(name: str) -> tuple[bool, ...] | None:
    """Which results of the eager executable named `name` are always None, if a process
    (this one or an earlier one) has found out."""
    with _facts_lock:
        return _read_facts().get(_fact_key(name))


def learn_results(name: str, none_results: tuple[bool, ...]) -> None:
    if not none_results:
        return
    with _facts_lock:
        facts = _read_facts()
        key = _fact_key(name)
        if key in facts:
            return
        facts[key] = none_results
        directory = cache_dir(PROGRAMS)
        if directory is None:
            return
        line = f"{key} {''.join('1' if n else '0' for n in none_results)}\n"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            # One short write with O_APPEND: concurrent writers append whole lines.
            fd = os.open(directory / _FACTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:
            pass


# -- JAX's own cache ---------------------------------------------------------------------------

# JAX's own on-disk cache (runtime/platform.py turns it on for eager executables with
# TORCHNEURON_EAGER_DISK_CACHE=1) would also take and serve `Lowered.compile()` of a graph or
# fused program. An executable it loaded cannot be serialized again whole (a later process that
# runs the copy fails with "Function ... not found"), and one cache per program is enough:
# these are compiled with JAX's cache writes off (a thread-local setting), and one JAX serves
# all the same (an entry written before) is not stored here. JAX reports a hit as a monitoring
# event, on the compiling thread.
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
