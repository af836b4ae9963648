"""The upstream runner end to end, on a small device-generic test file written here (not one
of PyTorch's): a neuron failure, a crash, a soft timeout and a test stuck where the timeout
signal is ignored are each recorded and charged to their test, and the tests after them run.

Run by `make upstream-selftest` (pytest tests/upstream/check_runner.py): it starts four
test processes, a minute or so on a busy 2-core machine, so it is not part of `make test`;
`make test` runs test_upstream_results.py, the runner's logic on hand-written records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import results  # noqa: E402

FAKE_TESTS = '''
import os, signal, time
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase


def on_neuron(device):
    return torch.device(device).type != "cpu"


class TestFake(TestCase):
    def test_a_pass(self, device):
        self.assertEqual(torch.ones(2, device=device).sum().item(), 2.0)

    def test_b_fail(self, device):
        if on_neuron(device):
            raise ValueError("axis 3 is out of bounds")

    def test_c_crash(self, device):
        if on_neuron(device):
            os._exit(3)

    def test_d_hang(self, device):
        if on_neuron(device):
            time.sleep(60)

    def test_e_stuck(self, device):
        if on_neuron(device):
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            time.sleep(60)

    def test_f_after(self, device):
        pass


class TestNotDeviceGeneric(TestCase):
    def test_ignored(self):
        pass


instantiate_device_type_tests(TestFake, globals())
'''


def test_runner_records_failures_crashes_and_hangs(tmp_path: Path):
    tests_dir = tmp_path / "test"
    tests_dir.mkdir()
    (tests_dir / "test_fake.py").write_text(FAKE_TESTS)
    out = tmp_path / "out"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(HERE.parent.parent / "src"),
                                                    env.get("PYTHONPATH", "")] if p)
    proc = subprocess.run(
        [sys.executable, str(HERE / "run.py"), "run", "--pytorch-tests", str(tests_dir),
         "--files", "test_fake", "--jobs", "2", "--timeout", "1", "--kill-grace", "1",
         "--out", str(out), "--no-report"],
        capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = results.load((out / "records").glob("*.jsonl"))
    cpu = runs[("test_fake.py", "cpu")].tests
    neu = runs[("test_fake.py", "neuron")].tests
    key = "test_fake.py::TestFake::test_{}_<dev>".format
    assert {k: r["outcome"] for k, r in cpu.items()} == {
        key(n): "passed" for n in ("a_pass", "b_fail", "c_crash", "d_hang", "e_stuck", "f_after")}
    outcome = {k: r["outcome"] for k, r in neu.items()}
    assert outcome == {key("a_pass"): "passed", key("b_fail"): "failed",
                       key("c_crash"): "crash", key("d_hang"): "failed",
                       key("e_stuck"): "timeout", key("f_after"): "passed"}
    assert neu[key("b_fail")]["exc"] == "ValueError"
    assert neu[key("d_hang")]["exc"] == "TestTimeout"
    assert runs[("test_fake.py", "neuron")].restarts == 2  # after the crash and the kill
    [summary] = results.compare(runs)
    assert len(summary.neuron_failed_cpu_passed) == 4
    assert {results.category(r) for r in summary.neuron_failed_cpu_passed} == {
        "error", "crash", "timeout"}
    source = json.loads((out / "source.json").read_text())
    assert source["torch"].startswith("2.13")
