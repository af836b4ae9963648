"""A rank that dies or hangs makes the other one fail with a clear error, within the timeout."""

from __future__ import annotations

import time

import pytest
from launch import run_ranks


@pytest.mark.parametrize("how", ["die", "hang"])
def test_peer_failure_raises_in_time(tmp_path, how):
    start = time.monotonic()
    results = run_ranks(
        "faults:peer_fails", tmp_path, timeout=100, arg=how, expect_ok=False, wait_for=[0],
        env={"TORCHNEURON_TEST_PG_TIMEOUT": "15"},
    )
    elapsed = time.monotonic() - start
    error = (tmp_path / "rank0.error").read_text() if (tmp_path / "rank0.error").exists() else None
    assert error is not None, results[0].output[-3000:]
    seconds, message = error.split("\n", 1)
    assert results[0].returncode == 3, message
    assert float(seconds) < 60, f"rank 0 needed {seconds} s to notice"
    assert elapsed < 90
    assert "another rank has probably exited" in message
    if how == "hang":
        assert float(seconds) >= 10  # it waited for the process group timeout (15 s)
