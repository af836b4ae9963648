"""runtime/disk_budget.py: on-disk caches keep to their size, least recently used entries first."""

from __future__ import annotations

import os

from torchneuron.runtime import disk_budget


def test_entries_of_several_files_go_together_oldest_first(tmp_path):
    for n, key in enumerate(["old", "mid", "new"]):
        for suffix, size in (("cache", 1000), ("atime", 10)):
            path = tmp_path / f"jit_f-{key}-{suffix}"
            path.write_bytes(b"x" * size)
            os.utime(path, (100 + n, 100 + n))
    os.utime(tmp_path / "jit_f-old-atime", (500, 500))  # "old" was read last: most recent
    disk_budget.prune(tmp_path, 2020, disk_budget.jax_entry)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "jit_f-new-atime", "jit_f-new-cache", "jit_f-old-atime", "jit_f-old-cache"]


def test_under_the_budget_nothing_is_removed(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * 10)
    disk_budget.prune(tmp_path, 10, pattern="*.bin")
    assert (tmp_path / "a.bin").exists()


def test_only_matching_files_count_and_the_oldest_go_first(tmp_path):
    for n, name in enumerate(["a.bin", "b.bin", "c.bin"]):
        (tmp_path / name).write_bytes(b"x" * 100)
        os.utime(tmp_path / name, (100 + n, 100 + n))
    (tmp_path / "other.txt").write_bytes(b"x" * 1000)  # not the pattern's: neither counted nor removed
    os.utime(tmp_path / "other.txt", (1, 1))
    disk_budget.prune(tmp_path, 250, pattern="*.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "c.bin", "other.txt"]
