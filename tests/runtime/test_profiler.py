"""torch.profiler around neuron work records each op with the path it took and its time."""

from __future__ import annotations

import warnings

import torch

import torchneuron
from torchneuron.runtime.profiler import neuron_records, path_of

aten = torch.ops.aten


def test_profiler_records_neuron_ops_with_path_and_time() -> None:
    x = torch.randn(8, 8).to("neuron")
    (x @ x).relu().sum()  # compile outside the profile
    fb = torch.ops.tn_test.cpu_only_scale.default  # CPU-only op (tests/conftest.py)
    with torch.profiler.profile() as prof:
        y = torch.mm(x, x)
        z = y.relu().var()
        v = x.view(64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fb(x, 2.0)
    assert z.device.type == "neuron" and v.shape == (64,)
    records = neuron_records(prof)
    names = set(records)
    assert "neuron::native::aten.mm.default" in names, names
    assert "neuron::native::aten.relu.default" in names, names
    assert "neuron::view::aten.view.default" in names, names
    assert f"neuron::fallback::{fb}" in names, names
    decomposed = [r for r in records.values() if r["path"] == "decomposed"]
    if path_of(aten.var.correction) == "decomposed":
        assert any(r["op"] == "aten.var.correction" for r in decomposed), names
    mm = records["neuron::native::aten.mm.default"]
    assert mm["count"] == 1 and mm["cpu_time_total_us"] > 0
    # PyTorch's own op records are still there, around ours.
    keys = {e.key for e in prof.key_averages()}
    assert "aten::mm" in keys


def test_no_records_and_no_hook_outside_profiler() -> None:
    import torch.autograd.profiler as p

    assert not p._is_profiler_enabled
    x = torch.randn(4).to("neuron")
    before = torchneuron.op_counts()["native"]
    (x + x).cpu()
    assert sum(torchneuron.op_counts()["native"].values()) > sum(before.values())


def test_path_of_matches_counters() -> None:
    x = torch.randn(4, 4).to("neuron")
    for op, call in (
        (aten.mm.default, lambda: torch.mm(x, x)),
        (aten.var.correction, lambda: x.var()),
    ):
        torchneuron.reset_op_counts()
        call()
        path = path_of(op)
        assert torchneuron.op_counts()[path][str(op)] >= 1, (op, path)
