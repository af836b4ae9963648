"""The on-disk executable cache keeps to its size limit, dropping least recently used entries."""

from __future__ import annotations

import os

from torchneuron.compiler import disk_cache


def test_a_write_past_the_limit_drops_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHNEURON_COMPILE_CACHE", "1")
    blob = b"x" * 10_000
    monkeypatch.setenv("TORCHNEURON_DISK_CACHE_BYTES", str(10**9))
    for n, key in enumerate(["a", "b", "c"]):
        disk_cache.store(key, blob)
        os.utime(disk_cache.entry_path(key), (1000 + n, 1000 + n))  # a, then b, then c
    assert disk_cache.load("a") == blob  # a is now the most recently used
    size = disk_cache.entry_path("a").stat().st_size
    monkeypatch.setenv("TORCHNEURON_DISK_CACHE_BYTES", str(3 * size))
    disk_cache.store("d", blob)
    present = {key for key in "abcd" if disk_cache.entry_path(key).exists()}
    assert present == {"a", "c", "d"}  # b was the least recently used
