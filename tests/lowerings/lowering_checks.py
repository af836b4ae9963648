"""Checks shared by the lowering tests."""

from __future__ import annotations

import torchneuron


def assert_native(*names: str) -> None:
    """Each named op ran natively, and nothing fell back to CPU."""
    counts = torchneuron.op_counts()
    for name in names:
        assert counts["native"].get(name, 0) > 0, (name, counts)
    assert not counts["fallback"], counts["fallback"]
