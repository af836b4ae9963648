"""Size limits of the on-disk executable caches (TORCHNEURON_DISK_CACHE_BYTES).

One pass over a cache directory removes its least recently used entries until it holds at
most the budget. An entry may be several files (JAX's cache keeps `<key>-cache` and
`<key>-atime`); its recency is its newest file's modification time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def prune(directory: Path, max_bytes: int, entry_of: Callable[[str], str] = lambda name: name,
          pattern: str = "*") -> None:
    """Remove the least recently used entries of `directory` until it holds `max_bytes`."""
    entries: dict[str, list] = {}
    try:
        paths = list(directory.glob(pattern))
    except OSError:
        return
    for path in paths:
        try:
            info = path.stat()
        except OSError:  # another process removed it
            continue
        entry = entries.setdefault(entry_of(path.name), [0.0, 0, []])
        entry[0] = max(entry[0], info.st_mtime)
        entry[1] += info.st_size
        entry[2].append(path)
    total = sum(size for _mtime, size, _paths in entries.values())
    for _mtime, size, files in sorted(entries.values(), key=lambda e: e[0]):
        if total <= max_bytes:
            break
        for path in files:
            try:
                path.unlink()
            except OSError:
                pass
        total -= size


def jax_entry(name: str) -> str:
    """The entry a file of JAX's compilation cache belongs to (`<key>-cache`, `<key>-atime`)."""
    return name.rsplit("-", 1)[0]
