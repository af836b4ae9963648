"""Value checks (runtime/value_checks.py): an index out of range raises at the next sync point,
naming the op and the line that called it, as a CUDA device-side assert does; the check does
not make the host wait at the call."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from torchneuron.runtime import fusion, value_checks

pytestmark = pytest.mark.skipif(fusion.Pending is None,
                                reason="fusion needs the C++ library, which this process could not build")

DEV = "neuron"


@pytest.fixture(autouse=True)
def fused():
    """Fusion on for the test (the default), restored afterwards; no check left over."""
    before = fusion.recording()
    fusion.set_enabled(True)
    torch.neuron.synchronize()
    yield
    try:
        torch.neuron.synchronize()
    finally:
        fusion.set_enabled(before)


def _line() -> int:
    return inspect.currentframe().f_back.f_lineno


SYNC_POINTS = {
    "synchronize": lambda t, other: torch.neuron.synchronize(),
    "cpu of the result": lambda t, other: t.cpu(),
    "item of another tensor": lambda t, other: other.sum().item(),
    "repr of another tensor": lambda t, other: repr(other),
    "bool": lambda t, other: bool(other.sum() > 0),
    "data-dependent op": lambda t, other: torch.nonzero(other),
}


@pytest.mark.parametrize("sync", list(SYNC_POINTS))
def test_an_index_out_of_range_raises_at_the_next_sync_point_naming_the_call(sync):
    x = torch.randn(4, 3, device=DEV)
    other = torch.ones(3, device=DEV)
    other.cpu()  # materialised: reading it again runs nothing of its own
    bad = torch.tensor([0, 7], device=DEV)
    y = torch.index_select(x, 0, bad); line = _line()  # noqa: E702 - the call's own line
    assert value_checks.pending()  # not read yet
    with pytest.raises(IndexError, match=rf"index out of range.*index_select.*"
                                         rf"test_value_checks\.py:{line}\b"):
        SYNC_POINTS[sync](y, other)
    # Reported once: the next sync point is clean, and later calls are fine.
    torch.neuron.synchronize()
    ok = torch.index_select(x, 0, torch.tensor([3, 1], device=DEV))
    torch.testing.assert_close(ok.cpu(), x.cpu()[[3, 1]])


def test_the_first_failed_check_is_the_one_reported():
    w = torch.randn(5, 2, device=DEV)
    first = F.embedding(torch.tensor([9], device=DEV), w); line = _line()  # noqa: E702
    second = torch.index_select(w, 0, torch.tensor([-1], device=DEV))
    with pytest.raises(IndexError, match=rf"embedding.*test_value_checks\.py:{line}\b"):
        (first.sum() + second.sum()).item()
    assert value_checks.pending() == 0


def test_checks_do_not_make_a_training_loop_wait():
    # An embedding, a loss with targets and their backwards each check indices: their flags
    # are read at the next sync point, not at each call (which waited for the device).
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 8).to(DEV)
    head = torch.nn.Linear(8, 10).to(DEV)
    opt = torch.optim.SGD([*emb.parameters(), *head.parameters()], lr=0.1)
    idx = torch.randint(0, 10, (4, 6), device=DEV)
    target = torch.randint(0, 10, (24,), device=DEV)

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(head(emb(idx)).reshape(-1, 10), target)
        loss.backward()
        opt.step()
        return loss

    step()
    torch.neuron.synchronize()
    assert value_checks.pending() == 0
    for _ in range(3):
        loss = step()
    assert value_checks.pending() >= 3 * 4  # not read yet
    assert torch.isfinite(loss).item()
    assert value_checks.pending() == 0


def test_a_loop_that_never_syncs_keeps_few_checks_and_still_reports_a_failure():
    w = torch.randn(5, 2, device=DEV)
    y = F.embedding(torch.tensor([7], device=DEV), w); line = _line()  # noqa: E702
    fusion.flush()
    good = torch.tensor([1], device=DEV)
    for _ in range(200):
        y = F.embedding(good, w)
        fusion.flush()  # each check in a trace of its own
    assert value_checks.pending() <= 64  # the ones computed and fine are dropped
    with pytest.raises(IndexError, match=rf"embedding.*test_value_checks\.py:{line}\b"):
        y.cpu()


def test_compiled_graphs_defer_their_checks_naming_the_model_line():
    torch._dynamo.reset()

    def lookup(w, i):
        return F.embedding(i, w) * 2

    fn = torch.compile(lookup, backend="neuron")
    w = torch.randn(5, 2, device=DEV)
    fn(w, torch.tensor([1], device=DEV)).cpu()
    out = fn(w, torch.tensor([8], device=DEV))
    with pytest.raises(IndexError, match=r"embedding.*test_value_checks\.py:\d+"):
        out.cpu()
    torch.testing.assert_close(fn(w, torch.tensor([4], device=DEV)).cpu(), w.cpu()[[4]] * 2)
    torch._dynamo.reset()


def test_linalg_errors_still_raise_at_the_call():
    # Code catches them to retry (a jitter added to a kernel matrix): CUDA raises them at the
    # call too.
    a = -torch.eye(3, device=DEV)
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(a)
    assert value_checks.pending() == 0


_AT_THE_CALL = """
    import os, torch, torchneuron
    x = torch.randn(4, 3, device="neuron")
    try:
        torch.index_select(x, 0, torch.tensor([0, 7], device="neuron"))
    except IndexError as err:
        print("AT THE CALL:", err)
    if os.environ.get("TORCHNEURON_LAUNCH_BLOCKING") == "1":  # compiled graphs too
        lookup = torch.compile(lambda w, i: torch.nn.functional.embedding(i, w), backend="neuron")
        lookup(x, torch.tensor([1], device="neuron"))
        try:
            lookup(x, torch.tensor([9], device="neuron"))
        except IndexError as err:
            print("GRAPH AT THE CALL:", err)
"""


@pytest.mark.parametrize("env", [{"TORCHNEURON_LAUNCH_BLOCKING": "1"}, {"TORCHNEURON_FUSION": "0"}])
def test_launch_blocking_and_op_by_op_raise_at_the_call_as_cpu_words_it(env):
    inherited = {k: v for k, v in os.environ.items()
                 if k not in ("TORCHNEURON_FUSION", "TORCHNEURON_LAUNCH_BLOCKING")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_AT_THE_CALL)],
                          env={**inherited, **env}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "AT THE CALL: index out of range in self" in proc.stdout
    if "TORCHNEURON_LAUNCH_BLOCKING" in env:
        assert "GRAPH AT THE CALL: index out of range in self (in aten.embedding" in proc.stdout
