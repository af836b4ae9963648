"""Fixtures of the runtime tests."""

from __future__ import annotations

import pytest

from torchneuron.runtime import fusion


@pytest.fixture
def fused():
    """Fusion on for the test (the default), restored afterwards."""
    before = fusion.recording()
    fusion.set_enabled(True)
    yield
    fusion.set_enabled(before)
