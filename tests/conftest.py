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


# An op that only CPU implements, defined here so the fallback tests never depend on which
# ATen ops happen to be lowered yet: it must run on CPU, visibly (warned once, counted).
_test_lib = torch.library.Library("tn_test", "DEF")
_test_lib.define("cpu_only_scale(Tensor x, float s) -> Tensor")
_test_lib.impl("cpu_only_scale", lambda x, s: x * s, "CPU")
_test_lib.impl("cpu_only_scale", lambda x, s: torch.empty_like(x), "Meta")
_test_lib.define("cpu_only_scale_(Tensor(a!) x, float s) -> Tensor(a!)")
_test_lib.impl("cpu_only_scale_", lambda x, s: x.mul_(s), "CPU")
_test_lib.impl("cpu_only_scale_", lambda x, s: x, "Meta")


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
