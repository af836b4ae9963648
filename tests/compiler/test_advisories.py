"""Hugging Face's once-only logger advice (`Logger.warning_once`) inside a compiled function
must not split its graph, also after `torch._dynamo.reset()` (which drops Dynamo's callbacks)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo

import torchneuron.compiler.backend  # noqa: F401  (installs the advisories callback at import)
from torchneuron.compiler import advisories

transformers = pytest.importorskip("transformers")  # defines logging.Logger.warning_once

_log = transformers.logging.get_logger("torchneuron.tests.advisories")


def _advised(x):
    _log.warning_once("advice printed once per process")
    return x * 2 + 1


def test_warning_once_does_not_split_the_graph_after_a_reset():
    # As in a process whose backend was imported before its first compilation and whose
    # first call was a reset: the callback is gone and the ignore list has no advisories.
    # (config.patch, not pytest's monkeypatch: newer pytest undoes a module attribute that is
    # not in the module's __dict__ by deleting it, which hides a Dynamo config entry.)
    with torch._dynamo.config.patch(ignore_logging_functions=set()):
        _compile_after_reset()
    torch._dynamo.reset()


def _compile_after_reset() -> None:
    torch._dynamo.reset()
    assert advisories.ignore_advisories not in torch._dynamo.callback.callback_handler.start_callbacks
    torch._dynamo.utils.counters.clear()
    x = torch.arange(4.0, device="neuron")
    torch.compile(lambda t: t - 1, backend="neuron")(x)  # any compilation re-installs it
    out = torch.compile(_advised, backend="neuron")(x)
    torch.testing.assert_close(out.cpu(), torch.arange(4.0) * 2 + 1)
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    assert logging.Logger.warning_once in torch._dynamo.config.ignore_logging_functions


_BACKEND_FIRST = """
    import torch, torch._dynamo
    import torchneuron.compiler.backend  # the backend loaded before transformers
    torch._dynamo.reset()  # drops the start callback
    import transformers
    log = transformers.logging.get_logger("advised")
    def advised(x):
        log.warning_once("advice printed once per process")
        return x * 2 + 1
    x = torch.arange(4.0, device="neuron")
    out = torch.compile(advised, backend="neuron")(x)  # the first compilation after the reset
    assert torch.equal(out.cpu(), torch.arange(4.0) * 2 + 1)
    breaks = dict(torch._dynamo.utils.counters["graph_break"])
    print("graph breaks:", breaks)
    assert not breaks
"""


def test_warning_once_does_not_split_a_first_graph_when_transformers_comes_later():
    # Seen with pytest fixtures that reset Dynamo before each test: a test compiling an HF
    # model after an earlier test had loaded the backend got a graph at warning_once.
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_BACKEND_FIRST)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
