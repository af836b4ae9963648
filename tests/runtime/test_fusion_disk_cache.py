"""Fused eager programs on disk (runtime/fusion.py, runtime/disk_cache.py): a second process
loads them instead of compiling, and records ops without tracing them; a bad entry is rebuilt;
a program is never served for inputs of other types."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchneuron
from torchneuron.runtime import fusion

pytestmark = pytest.mark.skipif(fusion.Pending is None,
                                reason="fusion needs the C++ library, which this process could not build")

DEV = "neuron"

_TRAIN = """
    import json
    import jax
    import torch, torchneuron

    traced = []  # abstract traces of single executables (runtime/executable.py)
    eval_shape = jax.eval_shape
    jax.eval_shape = lambda *a, **k: traced.append(1) or eval_shape(*a, **k)

    torch.manual_seed(0)
    # (dropout: a trace with a random op takes its draw as numpy words)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                                torch.nn.Linear(16, 4)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8).to("neuron"), torch.randn(32, 4).to("neuron")
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    stats = torchneuron.fusion_stats()
    print(json.dumps({"losses": losses, "compilations": stats["compilations"],
                      "disk_loads": stats["disk_loads"], "traced": len(traced),
                      "weight": model[0].weight.sum().item()}))
"""


def test_a_second_process_loads_the_programs_and_learns_the_same(shared_cache_dir):
    env = {**os.environ, "TORCHNEURON_CACHE_DIR": str(shared_cache_dir)}
    env.pop("TORCHNEURON_FUSION", None)
    env.pop("TORCHNEURON_LAUNCH_BLOCKING", None)
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_TRAIN)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["compilations"] >= 2 and first["disk_loads"] == 0 and first["traced"] > 0
    # Every program comes from disk, and no executable is traced to learn its results.
    assert second["compilations"] == 0
    assert second["disk_loads"] == first["compilations"]
    assert second["traced"] == 0
    assert second["losses"] == first["losses"] and second["weight"] == first["weight"]


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """An empty on-disk cache for this test, and no program of this process in memory."""
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path))
    fusion.flush()
    fusion.forget_programs()
    yield tmp_path / "programs"
    fusion.forget_programs()


def _unique_trace(n: int) -> torch.Tensor:
    x = torch.arange(float(n), device=DEV).reshape(n // 4, 4)
    return ((x * 3 - 1).relu() / 7).sum(0).cpu()


def test_a_corrupted_program_is_ignored_and_rebuilt(own_cache):
    expected = _unique_trace(52)
    entries = list(own_cache.glob("*.bin"))
    assert entries
    for entry in entries:
        data = entry.read_bytes()
        entry.write_bytes(data[: len(data) // 2])
    fusion.forget_programs()
    before = torchneuron.fusion_stats()
    with pytest.warns(UserWarning, match="unreadable compile cache entry"):
        got = _unique_trace(52)
    after = torchneuron.fusion_stats()
    assert torch.equal(got, expected)
    assert after["compilations"] > before["compilations"]
    assert after["disk_loads"] == before["disk_loads"]


def test_a_program_is_not_served_for_inputs_of_other_types(own_cache):
    # The same view of storages of two lengths: the same trace, buffers of other lengths.
    def run(length: int) -> torch.Tensor:
        big = torch.arange(float(length)).to(DEV)
        return (big[1:9] * 2 + 1).cpu()

    for length in (20, 40, 20, 40):
        assert torch.equal(run(length), torch.arange(1.0, 9.0) * 2 + 1)
    fusion.forget_programs()
    before = torchneuron.fusion_stats()
    for length in (40, 20):  # loaded for each length from its own entry
        assert torch.equal(run(length), torch.arange(1.0, 9.0) * 2 + 1)
    after = torchneuron.fusion_stats()
    assert after["compilations"] - before["compilations"] <= 1
    assert after["disk_loads"] - before["disk_loads"] >= 1


_WARNS = """
    import warnings
    import torch, torchneuron
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.empty(16, device="neuron").random_(0, 2**30)  # CPU warns: float's 2**24 limit
    print(sum("out of bounds" in str(w.message) for w in caught))
"""


def test_a_lowering_that_warns_warns_in_every_process(shared_cache_dir):
    # Its warning comes while it is traced: a process that knew its results from the disk
    # and skipped tracing it recorded the op silently.
    env = {**os.environ, "TORCHNEURON_CACHE_DIR": str(shared_cache_dir)}
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_WARNS)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip().splitlines()[-1] == "1"


def _two_processes(script: str, cache_dir) -> list[dict]:
    """`script`'s last line (JSON) from two processes in turn sharing `cache_dir`."""
    env = {**os.environ, "TORCHNEURON_CACHE_DIR": str(cache_dir)}
    env.pop("TORCHNEURON_FUSION", None)
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return runs


_LINALG = """
    import json
    import torch, torchneuron

    torch.manual_seed(0)
    a = torch.randn(6, 6, dtype=torch.float64)
    spd = a @ a.T + 6 * torch.eye(6, dtype=torch.float64)
    x = spd.to("neuron")
    out = torch.linalg.inv(x) @ torch.linalg.cholesky(x)
    print(json.dumps({"out": out.cpu().flatten().tolist(),
                      "disk_loads": torchneuron.fusion_stats()["disk_loads"]}))
"""


def test_a_loaded_program_that_calls_lapack_runs(shared_cache_dir):
    # jaxlib binds its LAPACK kernels only when it lowers a linalg op; a process that loads
    # such a program from disk lowers nothing, and ran it through unset pointers (SIGSEGV).
    first, second = _two_processes(_LINALG, shared_cache_dir)
    assert first["disk_loads"] == 0 and second["disk_loads"] >= 1
    assert second["out"] == first["out"]


_CHURN = """
    import json
    import torch, torchneuron

    results = []
    for n in range(30, 38):  # one skeleton, a new size each time: past two, op by op
        y = torch.arange(4.0, device="neuron")
        for k in range(16):  # ops whose shapes stay: few of the trace's ops see the size
            y = y * 1.5 + k
        a = torch.arange(n * 3.0, device="neuron").reshape(n, 3)
        results.append(((a * 2 + 1).sum() + y).cpu().tolist())
    stats = torchneuron.fusion_stats()
    print(json.dumps({"results": results, "op_by_op": stats["op_by_op"],
                      "op_compilations": stats["op_compilations"],
                      "op_disk_loads": stats["op_disk_loads"]}))
"""


def test_ops_run_one_by_one_are_loaded_from_disk_too(shared_cache_dir):
    # A trace whose shapes churn runs op by op (generate() at every token, PyTorch's
    # test_view_ops over its many shapes); its ops' executables are kept on disk as well.
    first, second = _two_processes(_CHURN, shared_cache_dir)
    assert first["op_by_op"] >= 4 and first["op_compilations"] >= 4
    assert first["op_disk_loads"] == 0
    assert second["op_compilations"] == 0
    assert second["op_disk_loads"] == first["op_compilations"]
    assert second["results"] == first["results"]
    y = torch.arange(4.0)
    for k in range(16):
        y = y * 1.5 + k
    expected = [(torch.arange(n * 3.0).reshape(n, 3) * 2 + 1).sum() + y for n in range(30, 38)]
    torch.testing.assert_close(torch.tensor(first["results"]), torch.stack(expected))
