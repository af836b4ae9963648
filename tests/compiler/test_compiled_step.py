"""A compiled training step runs few executables and writes its state in place; a compiled
graph's call costs little host time beyond its executable (issue 13, point 4)."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

import torchneuron
from torchneuron.compiler import graph as graph_module
from torchneuron.runtime import storage

DEV = "neuron"


@pytest.fixture(autouse=True)
def _fresh(fresh_compile_state):
    """A new cache directory, Dynamo state and compile counters per test (tests/conftest.py)."""


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 4))


def _make_step(model, opt, x, y):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def test_compiled_step_runs_three_executables_and_updates_state_in_place():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    model = _mlp()

    def train(compiled: bool):
        m = copy.deepcopy(model).to(DEV)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
        step = _make_step(m, opt, x.to(DEV), y.to(DEV))
        if compiled:
            step = torch.compile(step, backend="neuron")
        losses = [step().item() for _ in range(2 if compiled else 3)]
        return m, opt, step, losses

    eager_model, _, _, eager_losses = train(False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="torchneuron.compile")
        model_c, opt, step, losses = train(True)
    before = [storage.ready_buffer(p) for p in model_c.parameters()]
    before += [storage.ready_buffer(v) for s in opt.state.values() for v in s.values()
               if v.device.type == DEV]
    calls = torchneuron.compile_stats()["memory_cache_hits"]
    losses.append(step().item())
    # Forward, backward and the optimizer update: one executable each (the graph breaks
    # at loss.backward() and at .item() allow no fewer), all already compiled.
    assert torchneuron.compile_stats()["memory_cache_hits"] - calls == 3
    # Parameters and optimizer state were overwritten in place (their buffers donated).
    assert before and all(buf.is_deleted() for buf in before)
    torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=0)
    for a, b in zip(eager_model.parameters(), model_c.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach().cpu(), rtol=1e-5, atol=1e-6)
    assert torchneuron.compile_stats()["eager_fallbacks"] == 0


def test_donation_can_be_turned_off():
    p = torch.randn(6, device=DEV)
    compiled = torch.compile(lambda t: t.mul_(2), backend="neuron", options={"donate": False})
    compiled(p)
    kept = storage.ready_buffer(p)
    compiled(p)
    assert not kept.is_deleted()
    torch.testing.assert_close(p.cpu(), torch.as_tensor(kept) * 2)


def test_a_buffer_read_through_another_input_is_not_donated():
    # `b` is a view of `a`'s storage: writing `a` must not destroy what `b` reads.
    base = torch.arange(8.0, device=DEV)

    def f(a, b):
        a.add_(1)
        return b * 2

    compiled = torch.compile(f, backend="neuron")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="torchneuron.compile")  # compiled, not eager
        out = compiled(base, base[:4])
    torch.testing.assert_close(out.cpu(), torch.arange(4.0) * 2 + 2)
    torch.testing.assert_close(base.cpu(), torch.arange(8.0) + 1)


def _process_us_per_call(fn, calls: int = 300, rounds: int = 7) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - start) / calls)
    return best * 1e6


# A timing bar (issue 13: at most 30 us of host time beyond the executable): it holds alone and
# fails under CPU contention (42 us at load 7), so it runs in `make test-slow`, not in CI's run.
@pytest.mark.slow
def test_host_time_of_a_compiled_call_beyond_its_executable():
    seen = []
    original = graph_module.CompiledGraph.__call__

    def spy(self, *args):
        seen.append(self)
        return original(self, *args)

    x = torch.ones(64, 64, device=DEV)
    compiled = torch.compile(lambda t: t + 1, backend="neuron")
    graph_module.CompiledGraph.__call__ = spy
    try:
        compiled(x)
    finally:
        graph_module.CompiledGraph.__call__ = original
    (graph,) = set(seen)
    key, inputs = graph._signature([x])
    ((executable, _, _),) = graph.executables.values()
    for _ in range(50):
        compiled(x)
    # CPU time of this process (all threads), which other load on a shared machine inflates
    # far less than wall time; best of several rounds.
    bare = _process_us_per_call(lambda: executable([], inputs, [], []))
    total = _process_us_per_call(lambda: compiled(x))
    assert total - bare <= 30, f"compiled call {total:.1f} us, executable alone {bare:.1f} us"


def test_step_counters_are_computed_on_the_host_without_waiting_for_the_executable(monkeypatch):
    # AdamW keeps its step counters in 0-dim CPU tensors; reading them back from the
    # executable would make every optimizer call wait for it to finish.
    torch.manual_seed(0)
    params = [torch.randn(5, 3, device=DEV, requires_grad=True),
              torch.randn(3, device=DEV, requires_grad=True)]
    reference = [p.detach().cpu().clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(params, lr=1e-2)
    opt_ref = torch.optim.AdamW(reference, lr=1e-2)
    step = torch.compile(opt.step, backend="neuron")
    for p, r in zip(params, reference):
        p.grad = torch.ones_like(p)
        r.grad = torch.ones_like(r)
    step()  # compiles
    (graph,) = set(_graphs_called(step))
    assert graph.host_updates is not None and len(graph.host_updates.targets) == len(params)
    assert graph.host_updates.increment == 1  # written by one `_foreach_add_`
    reads = []
    original_get = graph_module.jax.device_get
    monkeypatch.setattr(graph_module.jax, "device_get", lambda x: reads.append(x) or original_get(x))
    step()
    assert reads == []  # nothing read back to the host
    for _ in range(3):
        opt_ref.step()
    for p, r in zip(params, reference):
        assert opt.state[p]["step"].device.type == "cpu"
        assert opt.state[p]["step"].item() == opt_ref.state[r]["step"].item() == 3
        torch.testing.assert_close(p.detach().cpu(), r.detach(), rtol=1e-5, atol=1e-6)


def _graphs_called(fn) -> list:
    """The CompiledGraphs one more call of `fn` runs."""
    seen = []
    original = graph_module.CompiledGraph.__call__

    def spy(self, *args):
        seen.append(self)
        return original(self, *args)

    graph_module.CompiledGraph.__call__ = spy
    try:
        fn()
    finally:
        graph_module.CompiledGraph.__call__ = original
    return seen


_STEP_WITH_BACKWARD = """
    import torch, torchneuron
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @torch.compile(backend="neuron")
    def step(x):
        loss = model(x).pow(2).sum()
        loss.backward()  # a graph break: the backward compiles lazily, on this thread
        opt.step()
        opt.zero_grad()
        return loss

    x = torch.randn(3, 4).to("neuron")
    losses = [step(x).item() for _ in range(3)]
    print("DONE", losses[-1] < losses[0])
"""


def test_a_compiled_step_compiles_its_backward_on_the_calling_thread():
    # The backward runs on the calling thread (runtime/device.py), inside the step's compiled
    # frame: the backend's compile-start callback must not be compiled by Dynamo there, which
    # waited forever on Dynamo's own callback lock.
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_STEP_WITH_BACKWARD)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "DONE True" in proc.stdout
