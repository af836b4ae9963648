"""Shared test setup: the examples are importable, and the session ends with a list of the ops
that fell back to CPU (so a green run still shows what is not lowered yet), gathered from every
worker process when the suite runs under pytest-xdist."""

from __future__ import annotations

import shutil
import sys
from collections import Counter
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
_test_lib.define("cpu_only_mix(Tensor x, Tensor y) -> Tensor")
_test_lib.impl("cpu_only_mix", lambda x, y: x * 2 + y, "CPU")
_test_lib.impl("cpu_only_mix", lambda x, y: torch.empty_like(x), "Meta")


@pytest.fixture(autouse=True)
def no_unread_value_check():
    """A test that provokes an index out of range reads it (it raises at the next sync point,
    runtime/value_checks.py); one left unread would raise in a later test instead."""
    yield
    from torchneuron.runtime import value_checks
    try:
        value_checks.raise_failed()
    except Exception as err:  # noqa: BLE001 - reported as this test's error
        pytest.fail(f"a failed value check was never read by this test: {err}")


@pytest.fixture
def fresh_compile_state(tmp_path, monkeypatch):
    """A compile test's clean slate: its own on-disk cache directory, Dynamo reset before and
    after, compile counters at zero."""
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    torchneuron.reset_compile_stats()
    yield
    torch._dynamo.reset()


@pytest.fixture
def xla_compilations():
    """A list that gets an entry for every XLA compilation while the test runs (JAX reports
    each as a monitoring event); clear it to count from a later point."""
    import jax.monitoring

    compiles: list[str] = []

    def count(event: str, _seconds: float, **_kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(count)
    yield compiles
    jax.monitoring.unregister_event_duration_listener(count)


@pytest.fixture
def shared_cache_dir(tmp_path) -> Path:
    """An empty cache directory for child processes, holding only this process's C++ library
    (when it was built): a child then loads it instead of spending half a minute compiling it.
    Tests of the library's own build use a bare directory instead."""
    from torchneuron.runtime import _native

    root = tmp_path / "shared"
    (root / "ext").mkdir(parents=True)
    built = _native.loaded_path()
    if built is not None:
        shutil.copy2(built, root / "ext" / built.name)
    return root


@pytest.fixture
def neuron() -> torch.device:
    return torch.device("neuron")


class _WorkerFallbacks:
    """Under pytest-xdist (`make test` runs two workers) the tests run in worker processes:
    each hands its fallback counts to the controller, which prints the summary."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        self.calls.update(getattr(node, "workeroutput", {}).get("torchneuron_fallbacks", {}))


_worker_fallbacks = _WorkerFallbacks()


def pytest_configure(config) -> None:
    config.pluginmanager.register(_worker_fallbacks, "torchneuron-worker-fallbacks")


def pytest_sessionfinish(session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)  # set in xdist workers only
    if workeroutput is not None:
        workeroutput["torchneuron_fallbacks"] = dict(torchneuron.fallback_ops())


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    fallbacks = Counter(torchneuron.fallback_ops()) + _worker_fallbacks.calls
    if not fallbacks:
        return
    terminalreporter.section("torchneuron: ops that ran on CPU (no lowering)")
    for name, calls in fallbacks.most_common():
        terminalreporter.write_line(f"{name}: {calls} call(s)")
