"""Shared set-up of the lowering tests: strict mode (no silent CPU fallback)."""

from __future__ import annotations

import pytest

import torchneuron


@pytest.fixture
def strict(monkeypatch):
    """Run the test with TORCHNEURON_STRICT=1 and fresh op counters."""
    monkeypatch.setenv("TORCHNEURON_STRICT", "1")
    torchneuron.reset_op_counts()
