"""pytest plugin that the upstream runner (run.py) loads into each pytest process.

    python -m pytest -p plugin --upstream-device neuron --upstream-records R.jsonl test_x.py

It keeps only the device-generic test classes of one device (those that PyTorch's
`instantiate_device_type_tests` made from `CPUTestBase` or `PrivateUse1TestBase`), optionally
one shard of them and minus the tests already recorded (after a crash the runner restarts the
process), stops a test that runs past `--upstream-timeout` seconds, and appends one JSON line
per test to the records file: a `start` line before the test (so that a crash or hang can be
charged to it) and a record after it. Records are read by results.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compat  # noqa: E402
import results  # noqa: E402

MESSAGE_CHARS = 600


class TestTimeout(BaseException):
    """Raised in a test that ran past its time; a BaseException so that the test's own
    `except Exception` (or assertRaises(Exception)) cannot swallow it."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("upstream", "torchneuron upstream runner")
    group.addoption("--upstream-device", choices=("cpu", "neuron"), default=None)
    group.addoption("--upstream-records", default=None, help="JSON-lines file to append to")
    group.addoption("--upstream-done", default=None,
                    help="file of node ids (one a line) that are not run again")
    group.addoption("--upstream-timeout", type=float, default=0.0,
                    help="seconds per test (setup + call + teardown); 0: none")
    group.addoption("--upstream-partial", action="store_true",
                    help="a rerun of some tests: its time is not the file's wall time")
    group.addoption("--upstream-shard", default="", help="K/N: the tests whose key hashes to K of N")
    group.addoption("--upstream-max-vm-mb", type=float, default=0.0,
                    help="address-space limit (RLIMIT_AS) of the process: a test that needs"
                    " more fails with an allocation error instead of waking the OOM killer")
    group.addoption("--upstream-max-rss-mb", type=float, default=0.0,
                    help="stop after the test that leaves the process above this size; the"
                    " runner starts a new process for the rest")


def pytest_configure(config: pytest.Config) -> None:
    device = config.getoption("upstream_device")
    if device is None:
        return
    # Read by instantiate_device_type_tests when each test module is imported (collection).
    os.environ["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = "cpu" if device == "cpu" else "privateuse1"
    max_vm = config.getoption("upstream_max_vm_mb")
    if max_vm:
        import resource

        limit = int(max_vm * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    aliases = compat.install()
    config.pluginmanager.register(_Recorder(config, device, aliases), "upstream-recorder")


def _device_base(device: str) -> type:
    from torch.testing._internal import common_device_type as cdt

    return cdt.CPUTestBase if device == "cpu" else cdt.PrivateUse1TestBase


def _innermost(tb, predicate) -> str | None:
    where = None
    for frame in traceback.extract_tb(tb):
        if predicate(frame.filename):
            where = f"{_short_path(frame.filename)}:{frame.lineno}"
    return where


def _short_path(filename: str) -> str:
    for anchor in ("/torchneuron/", "/torch/", "/jax/", "/test/"):
        i = filename.rfind(anchor)
        if i >= 0:
            return filename[i + 1:]
    return os.path.basename(filename)


def describe_exception(excinfo: pytest.ExceptionInfo) -> dict:
    """Type, message and where it came from: what results.py groups failures by."""
    value = excinfo.value
    tb = excinfo.tb
    return {
        "exc": type(value).__name__,
        "msg": str(value)[:MESSAGE_CHARS],
        # The innermost torchneuron frame says which part of the backend raised; the
        # innermost frame of the test file says which check failed.
        "backend_frame": _innermost(tb, lambda f: "/torchneuron/" in f),
        "test_frame": _innermost(tb, lambda f: "/test/" in f and "/torch/" not in f),
        "raise_frame": _innermost(tb, lambda f: True),
    }


class _Recorder:
    def __init__(self, config: pytest.Config, device: str, aliases: list[str]) -> None:
        self.config = config
        self.device = device
        path = config.getoption("upstream_records")
        self.out = open(path, "a", buffering=1) if path else None
        self.timeout = config.getoption("upstream_timeout")
        self.max_rss = config.getoption("upstream_max_rss_mb") * 2**20
        self.reports: dict[str, list] = {}
        self.exc: dict[str, dict] = {}
        self.started: dict[str, float] = {}
        self.fallback_before: dict[str, int] = {}
        self._write({"event": "session", "device": device, "pid": os.getpid(),
                     "compat_aliases": aliases, "t": time.time(),
                     "partial": config.getoption("upstream_partial")})

    def _write(self, rec: dict) -> None:
        if self.out is not None:
            self.out.write(json.dumps(rec) + "\n")

    # -- collection --------------------------------------------------------------------

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            text = str(report.longrepr)
            self._write({"event": "collect_error", "id": report.nodeid,
                         "msg": text[-2000:]})

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items) -> None:
        base = _device_base(self.device)
        keep, drop = [], []
        for item in items:
            cls = getattr(item, "cls", None)
            (keep if cls is not None and issubclass(cls, base) else drop).append(item)
        shard = config.getoption("upstream_shard")
        if shard:
            # By the device-free key, so that the CPU and neuron runs pick the same tests.
            k, n = (int(x) for x in shard.split("/"))
            mine = {it.nodeid: results.shard_of(results.test_key(it.nodeid, self.device), n) == k
                    for it in keep}
            drop += [it for it in keep if not mine[it.nodeid]]
            keep = [it for it in keep if mine[it.nodeid]]
        collected = len(keep)
        done_path = config.getoption("upstream_done")
        if done_path and os.path.exists(done_path):
            done = set(Path(done_path).read_text().split())
            drop += [it for it in keep if it.nodeid in done]
            keep = [it for it in keep if it.nodeid not in done]
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
        self._write({"event": "collected", "count": collected, "to_run": len(keep),
                     "shard": shard})

    # -- running -----------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        nodeid = item.nodeid
        self._write({"event": "start", "id": nodeid, "t": time.time()})
        self.reports[nodeid] = []
        self.started[nodeid] = time.perf_counter()
        self.fallback_before = _fallback_counts()
        if self.timeout > 0:
            def on_alarm(signum, frame):
                raise TestTimeout(f"test ran past {self.timeout:g} s")

            signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self.timeout)
        try:
            return (yield)
        finally:
            if self.timeout > 0:
                signal.setitimer(signal.ITIMER_REAL, 0)
            self._finish(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if call.excinfo is not None and item.nodeid not in self.exc:
            if not call.excinfo.errisinstance((pytest.skip.Exception,)):
                info = describe_exception(call.excinfo)
                info["when"] = call.when
                self.exc[item.nodeid] = info
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.setdefault(report.nodeid, []).append(report)

    def _finish(self, item) -> None:
        nodeid = item.nodeid
        reports = self.reports.pop(nodeid, [])
        outcome = results.combine_outcomes(
            [(r.when, r.outcome, hasattr(r, "wasxfail")) for r in reports])
        rec = {"event": "test", "id": nodeid, "key": results.test_key(nodeid, self.device),
               "outcome": outcome,
               "seconds": round(time.perf_counter() - self.started.pop(nodeid), 4)}
        exc = self.exc.pop(nodeid, None)
        if outcome in ("failed", "error"):
            if exc is None:  # a subtest's failure: only its report is left
                crash = next((r.longrepr for r in reports if r.failed), None)
                reprcrash = getattr(crash, "reprcrash", None)
                exc = {"exc": "", "msg": str(getattr(reprcrash, "message", crash))[:MESSAGE_CHARS]}
            rec.update(exc)
        elif outcome == "skipped":
            skip = next((r.longrepr for r in reports if r.skipped), None)
            if isinstance(skip, tuple) and len(skip) == 3:
                rec["msg"] = str(skip[2])[:200]
        fallback = _fallback_delta(self.fallback_before)
        if fallback:
            rec["fallback_ops"] = fallback
        self._write(rec)
        if self.max_rss and _rss() > self.max_rss:
            # Compiled executables accumulate over thousands of tests: start afresh.
            self._write({"event": "recycle", "rss_mb": round(_rss() / 2**20)})
            item.session.shouldstop = "upstream: process above --upstream-max-rss-mb"

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        self._write({"event": "finished", "exitstatus": int(exitstatus), "t": time.time()})
        if self.out is not None:
            self.out.close()
            self.out = None


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _fallback_counts() -> dict[str, int]:
    tn = sys.modules.get("torchneuron")
    return dict(tn.fallback_ops()) if tn is not None else {}


def _fallback_delta(before: dict[str, int]) -> list[str]:
    after = _fallback_counts()
    return sorted(op for op, n in after.items() if n > before.get(op, 0))
