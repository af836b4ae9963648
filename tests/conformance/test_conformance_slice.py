"""Fast slice of the conformance suite (the full sweep: `make conformance`).

A representative set of OpInfos and ModuleInfos runs exactly as in the sweep (same harness,
same sample caps). Each (op, variant, dtype) must either pass or be listed in
expected_failures.json with the same status; a listed entry that now passes fails the test
too (the manifest is stale: regenerate it with `make conformance`). A silent mismatch (a value
that differs from CPU without raising) always fails.
"""

from __future__ import annotations

import json
import sys
import warnings
from functools import cache
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import harness  # noqa: E402

MANIFEST = HERE / "expected_failures.json"

# float32 for each; the second dtype where given.
SLICE = {
    "add": torch.int64, "mul": torch.bool, "div.no_rounding_mode": None, "abs": torch.int64,
    "exp": None, "sigmoid": None, "clamp": None, "where": torch.int64, "sum": torch.int64,
    "mean": None, "argmax": None, "matmul": None, "bmm": None, "cat": torch.int64,
    "reshape": None, "index_select": None, "gather": None, "softmax": None,
    "nn.functional.relu": None, "nn.functional.gelu": None, "nn.functional.layer_norm": None,
    "nn.functional.linear": None, "nn.functional.conv2d": None, "nn.functional.embedding": None,
    "nn.functional.cross_entropy": None, "sort": None, "bernoulli": None,
}
MODULES = ["nn.Linear", "nn.LayerNorm", "nn.ReLU"]


@cache
def manifest() -> dict[tuple[str, str, str], dict]:
    entries = json.loads(MANIFEST.read_text())
    return {(e["op"], e["variant"], e["dtype"]): e for e in entries}


@cache
def ops_by_name() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db

    return {harness.op_id(op): op for op in op_db}


@cache
def modules_by_name() -> dict:
    from torch.testing._internal.common_modules import module_db

    return {m.name: m for m in module_db}


def check_against_manifest(records: list[dict]) -> None:
    problems = []
    expected = manifest()
    for r in records:
        key = (r["op"], r["variant"], r["dtype"])
        entry = expected.get(key)
        status = r["status"]
        where = f"{r['op']} {r['variant']} {r['dtype']}"
        if status in harness.SILENT:
            problems.append(f"SILENT MISMATCH {where}: {r['detail']}")
        elif status in harness.FAILING:
            if entry is None:
                problems.append(f"new failure {where} [{status}]: {r['detail']}")
            elif entry["status"] != status:
                problems.append(f"{where}: status {status}, manifest says {entry['status']}: "
                                f"{r['detail']}")
        elif entry is not None:
            problems.append(f"{where} now {status} but listed in expected_failures.json as "
                            f"{entry['status']}: regenerate the manifest (make conformance)")
    assert not problems, "\n".join(problems)


def test_manifest_is_well_formed() -> None:
    entries = json.loads(MANIFEST.read_text())
    keys = set()
    for e in entries:
        assert set(e) == {"op", "variant", "dtype", "status", "reason"}, e
        assert e["status"] in harness.FAILING, e
        assert e["status"] not in harness.SILENT, f"silent mismatch listed as expected: {e}"
        assert e["reason"], e
        key = (e["op"], e["variant"], e["dtype"])
        assert key not in keys, f"duplicate entry {key}"
        keys.add(key)
    known = set(ops_by_name()) | set(modules_by_name())
    unknown = sorted({e["op"] for e in entries} - known)
    assert not unknown, f"manifest names ops that op_db/module_db do not have: {unknown}"


@pytest.mark.parametrize("name", sorted(SLICE))
def test_opinfo(name: str) -> None:
    op = ops_by_name()[name]
    listed = harness.op_dtypes(op)
    dtypes = [d for d in (torch.float32, SLICE[name]) if d is not None and d in listed]
    assert dtypes, f"{name}: none of the slice's dtypes is listed for CPU"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = harness.check_op(op, dtypes)
    assert any(r["samples"] for r in records), f"{name}: no sample ran"
    check_against_manifest(records)


@pytest.mark.parametrize("name", MODULES)
def test_module(name: str) -> None:
    info = modules_by_name()[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = harness.check_module(info, torch.float32)
    rec["kind"] = "module"
    assert rec["samples"], f"{name}: no sample ran"
    check_against_manifest([rec])


def test_harness_catches_a_wrong_value() -> None:
    """The comparison is able to fail: a perturbed result is a silent mismatch."""
    a = torch.arange(6.0).reshape(2, 3)
    b = a.to("neuron") + 1e-3
    with pytest.raises(harness.Mismatch) as info:
        harness.compare(a, b, *harness.tolerances(ops_by_name()["add"], torch.float32))
    assert info.value.kind == "mismatch"
    with pytest.raises(harness.Mismatch):
        harness.compare(a, a.to(torch.float64).to("neuron"), 1e-5, 1e-5)  # dtype
    column_major = torch.empty_strided((2, 3), (1, 2), device="neuron").copy_(a)
    with pytest.raises(harness.Mismatch) as info:
        harness.compare(a, column_major, 0, 0)
    assert info.value.kind == "stride"
    harness.compare(a, a.to("neuron"), 0, 0)


def test_float64_reference_rule_only_accepts_results_at_least_as_close() -> None:
    ref = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    cpu = torch.tensor([1.01, 2.0, 3.0])
    assert harness.closer_to_reference(cpu, torch.tensor([1.0, 2.0, 3.005]).to("neuron"), ref)
    assert not harness.closer_to_reference(cpu, torch.tensor([1.0, 2.02, 3.0]).to("neuron"), ref)
    nan = torch.tensor([float("nan"), 2.0, 3.0])
    assert not harness.closer_to_reference(cpu, nan.to("neuron"), ref)  # non-finite differs


def test_samples_keep_layout_and_aliasing_on_the_device() -> None:
    base = torch.arange(24.0).reshape(4, 6)
    view, alias = base[:, ::2], base[1]
    moved_view, moved_alias = harness.to_device((view, alias))
    assert moved_view.stride() == view.stride() and moved_view.device.type == "neuron"
    assert moved_view.untyped_storage().data_ptr() == moved_alias.untyped_storage().data_ptr()
    torch.testing.assert_close(moved_alias.cpu(), alias)
    expanded = harness.to_device(torch.zeros(1).expand(3))
    assert expanded.stride() == (0,)
