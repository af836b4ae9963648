"""Shared test setup: the examples are importable, and the session ends with a list of the ops
that fell back to CPU (so a green run still shows what is not lowered yet)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import torchneuron

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))


@pytest.fixture
def neuron() -> torch.device:
    return torch.device("neuron")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    fallbacks = torchneuron.fallback_ops()
    if not fallbacks:
        return
    terminalreporter.section("torchneuron: ops that ran on CPU (no lowering)")
    for name, calls in sorted(fallbacks.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{name}: {calls} call(s)")
