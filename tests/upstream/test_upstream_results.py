"""The upstream runner's bookkeeping (tests/upstream/results.py): keys, outcomes, causes,
the CPU/neuron comparison, the manifest and the COVERAGE.md section. No PyTorch test files
are needed; records are written by hand in the plugin's format."""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import results  # noqa: E402


def test_key_pairs_the_cpu_and_neuron_twins():
    cpu = results.test_key("test_x.py::TestFooCPU::test_bar_cpu_float32", "cpu")
    neu = results.test_key("test_x.py::TestFooPRIVATEUSE1::test_bar_neuron_float32", "neuron")
    renamed = results.test_key("test_x.py::TestFooNEURON::test_bar_neuron_float32", "neuron")
    assert cpu == neu == renamed == "test_x.py::TestFoo::test_bar_<dev>_float32"


def test_key_replaces_only_the_device_segment():
    # The device name comes after the test's own name; "cpu" inside the name stays.
    cpu = results.test_key("t.py::TCPU::test_copy_to_cpu_cpu", "cpu")
    neu = results.test_key("t.py::TPRIVATEUSE1::test_copy_to_cpu_neuron", "neuron")
    assert cpu == neu == "t.py::T::test_copy_to_cpu_<dev>"
    # No device segment (e.g. an op named like the device is not a segment boundary).
    assert results.test_key("t.py::TCPU::test_cpus", "cpu") == "t.py::T::test_cpus"


def test_shards_split_by_key_alike_on_both_devices():
    cpu = [results.test_key(f"t.py::TCPU::test_{i}_cpu", "cpu") for i in range(200)]
    neu = [results.test_key(f"t.py::TNEURON::test_{i}_neuron", "neuron") for i in range(200)]
    assert [results.shard_of(k, 7) for k in cpu] == [results.shard_of(k, 7) for k in neu]
    sizes = collections.Counter(results.shard_of(k, 4) for k in cpu)
    assert set(sizes) == {0, 1, 2, 3} and min(sizes.values()) > 30


@pytest.mark.parametrize("reports, outcome", [
    ([("setup", "passed", False), ("call", "passed", False), ("teardown", "passed", False)],
     "passed"),
    ([("setup", "passed", False), ("call", "failed", False)], "failed"),
    ([("setup", "failed", False)], "error"),
    ([("setup", "passed", False), ("call", "passed", False), ("teardown", "failed", False)],
     "error"),
    ([("setup", "skipped", False)], "skipped"),
    ([("setup", "passed", False), ("call", "skipped", True)], "xfailed"),
    ([("setup", "passed", False), ("call", "passed", True)], "xpassed"),
    ([("setup", "passed", False), ("call", "failed", True)], "xpassed"),
    # a failing subtest among passing ones fails the test
    ([("call", "passed", False), ("call", "failed", False), ("call", "passed", False)],
     "failed"),
    ([], "error"),
])
def test_combine_outcomes(reports, outcome):
    assert results.combine_outcomes(reports) == outcome


def test_normalized_messages_group_one_cause():
    a = results.normalize_message("axis 1 is out of bounds for array of dimension 0\nmore")
    b = results.normalize_message("axis 3 is out of bounds for array of dimension 2")
    assert a == b == "axis N is out of bounds for array of dimension N"
    s1 = results.normalize_message("shape torch.Size([2, 3]) vs (4, 5) at 0x7f00aa")
    s2 = results.normalize_message("shape torch.Size([7]) vs (1,) at 0x12")
    assert s1 == s2
    assert results.normalize_message("float16 vs float32") != results.normalize_message(
        "float64 vs float32")  # dtype names keep their digits


@pytest.mark.parametrize("rec, cat", [
    ({"exc": "AssertionError", "msg": "RuntimeError not raised by <lambda>"},
     "missing or other error"),
    ({"exc": "AssertionError", "msg": "Tensor-likes are not close!\n\nMismatched elements"},
     "value mismatch"),
    ({"exc": "AssertionError", "msg": "The values for attribute 'dtype' do not match"},
     "metadata mismatch"),
    ({"exc": "RuntimeError", "msg": "Expected all tensors to be on the same device, but ..."},
     "device check"),
    ({"exc": "TypeError",
      "msg": "torchneuron: dtype torch.complex32 is not supported on the neuron device"},
     "unsupported"),
    ({"exc": "ValueError", "msg": "axis 1 is out of bounds"}, "error"),
    ({"outcome": "timeout", "exc": "Timeout", "msg": "killed"}, "timeout"),
    ({"outcome": "crash", "exc": "Crash", "msg": "signal 11"}, "crash"),
])
def test_category(rec, cat):
    assert results.category(rec) == cat


def _write_records(path: Path, device: str, tests: list[tuple[str, str, dict]],
                   wall: float = 10.0) -> None:
    lines = [{"event": "session", "device": device, "t": 1000.0}]
    step = (wall - 0.5) / len(tests)  # the last test ends at 1000 + wall
    for n, (nodeid, outcome, extra) in enumerate(tests):
        lines.append({"event": "start", "id": nodeid, "t": 1000.0 + (n + 1) * step})
        lines.append({"event": "test", "id": nodeid, "key": results.test_key(nodeid, device),
                      "outcome": outcome, "seconds": 0.5, **extra})
    lines.append({"event": "run", "file": "test_a.py", "device": device, "shard": [0, 1],
                  "wall_s": wall, "restarts": 0, "collected": len(tests), "partial": False})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n{\"event\": \"te")  # cut line


@pytest.fixture
def records(tmp_path: Path) -> list[Path]:
    ids = ["ok", "bad_value", "no_error", "unsupported", "skipped_here", "cpu_fails", "xf"]
    cpu = [(f"test_a.py::TCPU::test_{n}_cpu", "failed" if n == "cpu_fails" else
            ("xfailed" if n == "xf" else "passed"), {}) for n in ids]
    neu = [
        ("test_a.py::TPRIVATEUSE1::test_ok_neuron", "passed", {}),
        ("test_a.py::TPRIVATEUSE1::test_bad_value_neuron", "failed",
         {"exc": "AssertionError", "msg": "Tensor-likes are not close!"}),
        ("test_a.py::TPRIVATEUSE1::test_no_error_neuron", "failed",
         {"exc": "AssertionError", "msg": "RuntimeError not raised by <lambda>"}),
        ("test_a.py::TPRIVATEUSE1::test_unsupported_neuron", "crash",
         {"exc": "Crash", "msg": "the test process died (signal 11)"}),
        ("test_a.py::TPRIVATEUSE1::test_skipped_here_neuron", "skipped", {}),
        ("test_a.py::TPRIVATEUSE1::test_cpu_fails_neuron", "failed",
         {"exc": "RuntimeError", "msg": "x"}),
        ("test_a.py::TPRIVATEUSE1::test_xf_neuron", "failed", {"exc": "RuntimeError"}),
    ]
    paths = [tmp_path / "a.cpu.jsonl", tmp_path / "a.neuron.jsonl"]
    _write_records(paths[0], "cpu", cpu, wall=3.0)
    _write_records(paths[1], "neuron", neu, wall=30.0)
    return paths


def test_compare_counts_neuron_failures_where_cpu_passes(records):
    runs = results.load(records)
    [s] = results.compare(runs)
    assert (s.cpu_run, s.neuron_run, s.both_run) == (7, 7, 7)
    assert s.cpu_passed == 5  # cpu_fails failed; an xfail is not a CPU pass
    assert s.neuron_passed == 1
    assert s.neuron_skipped_cpu_passed == 1
    assert sorted(r["key"] for r in s.neuron_failed_cpu_passed) == [
        "test_a.py::T::test_bad_value_<dev>", "test_a.py::T::test_no_error_<dev>",
        "test_a.py::T::test_unsupported_<dev>"]
    assert s.comparable == 4
    assert (s.cpu_wall_s, s.neuron_wall_s) == (3.0, 30.0)


def test_a_later_record_replaces_an_earlier_one(records, tmp_path):
    rerun = tmp_path / "a.neuron.rerun.jsonl"
    rerun.write_text("\n".join(json.dumps(x) for x in [
        {"event": "session", "device": "neuron", "t": 5000.0, "partial": True},
        {"event": "start", "id": "test_a.py::TNEURON::test_no_error_neuron", "t": 5050.0},
        {"event": "test", "id": "test_a.py::TNEURON::test_no_error_neuron",
         "key": "test_a.py::T::test_no_error_<dev>", "outcome": "passed"},
        {"event": "run", "file": "test_a.py", "device": "neuron", "wall_s": 99.0,
         "partial": True}]) + "\n")
    [s] = results.compare(results.load(records + [rerun]))
    assert len(s.neuron_failed_cpu_passed) == 2
    assert s.neuron_wall_s == 30.0  # a partial rerun adds no wall time


def test_manifest_expected_new_and_stale(records, tmp_path):
    runs = results.load(records)
    summaries = results.compare(runs)
    path = tmp_path / "m.json"
    path.write_text(json.dumps([
        {"file": "test_a.py", "test": "T::test_unsupported_*", "kind": "crash",
         "reason": "segfaults in the C++ allocator"},
        # A value mismatch is expected only where what was compared is no computed result.
        {"file": "test_a.py", "test": "T::test_bad_value_<dev>", "kind": "unsupported",
         "reason": "listed, but a wrong value is never expected"},
        {"file": "test_a.py", "test": "T::test_ok_<dev>", "kind": "unsupported",
         "reason": "passes now"},
        {"file": "test_b.py", "test": "T::test_other_<dev>", "kind": "unsupported",
         "reason": "file not run: not stale"},
        {"file": "test_a.py", "test": "T::test_not_selected_<dev>", "kind": "unsupported",
         "reason": "file run, this test not (a -k run): not stale"},
    ]))
    manifest = results.Manifest.read(path)
    new = sorted(r["key"] for _, r in results.new_failures(summaries, manifest))
    assert new == ["test_a.py::T::test_bad_value_<dev>", "test_a.py::T::test_no_error_<dev>"]
    stale = results.stale_entries(summaries, runs, manifest)
    assert [e["test"] for e in stale] == ["T::test_ok_<dev>"]
    groups = results.group_failures(summaries, manifest)
    assert sum(len(g.failures) for g in groups) == 3
    assert {g.category for g in groups} == {"value mismatch", "missing or other error", "crash"}


@pytest.mark.parametrize("entry", [
    {"file": "t.py", "test": "T::x", "kind": "unsupported"},
    {"file": "t.py", "test": "T::x", "kind": "wrong value", "reason": "no such kind"},
])
def test_manifest_entries_need_a_reason_and_a_known_kind(tmp_path, entry):
    path = tmp_path / "m.json"
    path.write_text(json.dumps([entry]))
    with pytest.raises(ValueError):
        results.Manifest.read(path)


def test_coverage_section_is_replaced_in_place(records, tmp_path):
    runs = results.load(records)
    summaries = results.compare(runs)
    manifest = results.Manifest([])
    groups = results.group_failures(summaries, manifest)
    section = results.render(summaries, groups, manifest, {"repo": "o/r", "commit": "abc"})
    assert "3 of 4 CPU passes (75.00%)" in section
    assert "possible wrong values: 1" in section
    assert "**possible wrong value**" in section
    explained = results.Manifest([{"file": "test_a.py", "test": "T::test_bad_value_<dev>",
                                   "kind": "missing warning", "reason": "len(w) == 1"}])
    other = results.render(summaries, groups, explained,
                           {"file_notes": {"test_a.py": "records of an earlier run"}})
    assert "| test_a.py [records of an earlier run] |" in other
    assert "possible wrong values: 0" in other and "not a wrong value (missing warning)" in other
    cov = tmp_path / "COVERAGE.md"
    cov.write_text("# Conformance\n\nbody\n")
    results.write_section(cov, section)
    results.write_section(cov, section.replace("o/r", "o/s"))
    text = cov.read_text()
    assert text.startswith("# Conformance\n\nbody\n")
    assert text.count(results.COVERAGE_BEGIN) == 1 and "o/s" in text and "o/r" not in text
