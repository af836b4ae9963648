"""The on-disk executable cache keeps to its size limit, dropping least recently used entries."""

from __future__ import annotations

import os

from torchneuron.runtime import disk_cache


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


def test_a_graph_whose_entry_was_dropped_is_stored_again_whole(tmp_path, monkeypatch):
    # JAX keeps its own on-disk cache of programs (eager executables): with only our entry
    # of a graph dropped (size limit), its next compilation is served from JAX's cache, and
    # that executable cannot be serialized again whole ("Function ... not found" when a
    # later process ran the stored copy).
    import torch
    import torch._dynamo

    import torchneuron

    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path))
    x = torch.arange(12.0).reshape(3, 4)
    on_device = x.to("neuron")

    def compiled_once():
        torch._dynamo.reset()
        return torch.compile(lambda t: t * 3 + 1, backend="neuron")(on_device).cpu()

    compiled_once()
    for entry in (tmp_path / "executables").glob("*.bin"):
        entry.unlink()
    compiled_once()
    torchneuron.reset_compile_stats()
    torch.testing.assert_close(compiled_once(), x * 3 + 1)
    stats = torchneuron.compile_stats()
    assert stats["xla_compilations"] == 0 and stats["disk_cache_hits"] == 1
    torch._dynamo.reset()
