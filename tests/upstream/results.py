"""Upstream test results: pure functions over the records that plugin.py writes.

A record is one JSON line: {"event": "test", "id": node id, "key": device-free key,
"outcome": ..., "seconds": ..., "exc": type, "msg": message, ...}. The functions here pair
each `neuron` test with its CPU twin (same key), keep the neuron failures whose CPU twin
passes, group them by cause, match them against the manifest of expected failures and render
the section of docs/COVERAGE.md. Nothing here imports torch: the unit test runs in seconds.
"""

from __future__ import annotations

import collections
import fnmatch
import json
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

DEVICES = ("cpu", "neuron")
# Class-name suffixes that instantiate_device_type_tests gives a device's class. The
# PrivateUse1 class is named PRIVATEUSE1 or NEURON depending on whether an earlier class of
# the same file already ran PrivateUse1TestBase.setUpClass (which renames the device type).
_CLASS_SUFFIXES = {"cpu": ("CPU",), "neuron": ("PRIVATEUSE1", "NEURON")}

COVERAGE_BEGIN = "<!-- upstream-tests:begin (written by tests/upstream/run.py) -->"
COVERAGE_END = "<!-- upstream-tests:end -->"

# A CPU test counts as passing only when it passed: an expected failure (xfailed) is a known
# CPU bug that PyTorch declares, nothing to compare with. On neuron an xfail that PyTorch
# declares for every device and that fails there too is PyTorch's own verdict: a pass.
CPU_PASSED = ("passed",)
NEURON_PASSED = ("passed", "xfailed")
FAILED = ("failed", "error", "xpassed", "timeout", "crash")


# ------------------------------------------------------------------------------------------
# Keys and outcomes


def test_key(nodeid: str, device: str) -> str:
    """`file::Class<DEV>::test_x_<dev>_float32` -> `file::Class::test_x_<dev>_float32`.

    The device name appears in the test name after the test's own name and parameters and
    before the dtype suffix (common_device_type's naming), so its last occurrence is the one
    to replace: `test_copy_to_cpu_neuron` and `test_copy_to_cpu_cpu` share one key.
    """
    parts = nodeid.split("::")
    if len(parts) < 3:
        return nodeid
    file, cls, name = parts[0], parts[1], "::".join(parts[2:])
    for suffix in _CLASS_SUFFIXES[device]:
        if cls.endswith(suffix):
            cls = cls[: -len(suffix)]
            break
    matches = list(re.finditer(rf"_{device}(?=_|$|\[)", name))
    if matches:
        m = matches[-1]
        name = name[: m.start()] + "_<dev>" + name[m.end():]
    return f"{file}::{cls}::{name}"


def shard_of(key: str, n: int) -> int:
    """Which of n shards a test belongs to: a hash of its device-free key, the same in every
    process and on every device (Python's hash() of a str is salted per process)."""
    return zlib.crc32(key.encode()) % n


def combine_outcomes(reports: Iterable[tuple[str, str, bool]]) -> str:
    """One outcome from a test's (phase, outcome, was-xfail) reports (subtests included)."""
    reports = list(reports)
    if not reports:
        return "error"
    for when, result, wasxfail in reports:
        if result == "failed":
            if wasxfail:  # a strict expected failure that passed
                return "xpassed"
            return "failed" if when == "call" else "error"
    if any(wasxfail for _, _, wasxfail in reports):
        passed = any(wasxfail and result == "passed" for _, result, wasxfail in reports)
        return "xpassed" if passed else "xfailed"
    if any(result == "skipped" for _, result, _ in reports):
        return "skipped"
    return "passed"


# ------------------------------------------------------------------------------------------
# Causes


def normalize_message(msg: str) -> str:
    """The part of a message that names a cause: first meaningful line, numbers, shapes,
    addresses and quoted values replaced, so that one cause with many shapes is one group."""
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    # assertEqual's mismatch text puts the summary on the first line; the rest is numbers.
    text = re.sub(r"0x[0-9a-fA-F]+", "0x_", text)
    text = re.sub(r"torch\.Size\(\[[^\]]*\]\)", "torch.Size([_])", text)
    text = re.sub(r"\[[\d,\s\-]*\]|\([\d,\s\-]*\)", "[_]", text)
    text = re.sub(r"(?<![A-Za-z_])-?\d+(\.\d+)?(e[-+]?\d+)?", "N", text)
    text = re.sub(r"'[^']{40,}'", "'…'", text)
    text = re.sub(r"\s+", " ", text).strip()
    return text[:180]


def category(rec: dict) -> str:
    """A first, mechanical classification; triage refines it by hand."""
    exc = rec.get("exc", "")
    msg = rec.get("msg", "")
    outcome = rec.get("outcome")
    if outcome == "timeout" or exc == "TestTimeout":
        return "timeout"
    if outcome == "crash":
        return "crash"
    if outcome == "xpassed":
        return "unexpected success"
    if "Expected all tensors to be on the same device" in msg:
        return "device check"
    if exc == "NotImplementedError" or "not supported on the neuron device" in msg \
            or "Unknown device type" in msg or "not implemented for" in msg:
        return "unsupported"
    if exc == "AssertionError":
        if re.search(r"not raised|did not raise|Regex didn't match|does not match|"
                     r"Expected .* to be raised", msg):
            return "missing or other error"
        if re.search(r"values for attribute '(dtype|device|layout|stride)'", msg):
            return "metadata mismatch"
        if re.search(r"not close|not equal|[Mm]ismatch|are not the same|!=|False is not true"
                     r"|True is not false", msg):
            return "value mismatch"
        return "assertion"
    return "error"


def cause(rec: dict) -> str:
    exc = rec.get("exc") or rec.get("outcome", "?")
    return f"{exc}: {normalize_message(rec.get('msg', ''))}"


# ------------------------------------------------------------------------------------------
# Loading


@dataclass
class FileRun:
    """One test file on one device: its records (latest per key) and run metadata."""

    file: str
    device: str
    tests: dict[str, dict] = field(default_factory=dict)
    wall_s: float = 0.0
    collected: int = 0
    restarts: int = 0
    collect_errors: list[str] = field(default_factory=list)
    compat_aliases: set[str] = field(default_factory=set)
    shards: set[tuple[int, int]] = field(default_factory=set)

    @property
    def sampled(self) -> str:
        """'' when every shard ran, else e.g. '1/20' (the fraction of the file that ran)."""
        if not self.shards:
            return ""
        n = max(n for _, n in self.shards)
        ran = len({k for k, m in self.shards if m == n})
        return "" if ran == n else f"{ran}/{n}"


def _session_wall(start: float | None, end: float | None, partial: bool) -> float:
    if start is None or end is None or partial:
        return 0.0
    return max(0.0, end - start)


def load(paths: Iterable[Path]) -> dict[tuple[str, str], FileRun]:
    """Records files (one per file, device and shard) -> FileRun per (file, device).

    A `start` without its `test` record means the process died or hung in that test; the
    runner writes a `crash`/`timeout` record for it, so a start alone is ignored here.
    Later records of a key replace earlier ones (a rerun with -k updates its tests).
    Wall time is summed over the sessions (test processes) of full runs: from a session's
    start to the end of its last test, so that interrupted and restarted runs count too.
    """
    runs: dict[tuple[str, str], FileRun] = {}
    for path in sorted(paths):
        device = None
        file = None
        wall = 0.0
        session_t = last_t = start_t = None
        partial = False

        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            event = rec.get("event")
            if event == "session":
                wall += _session_wall(session_t, last_t, partial)
                device = rec["device"]
                session_t = last_t = rec.get("t")
                partial = bool(rec.get("partial"))
                continue
            if event == "run":
                file = rec["file"]
                run = runs.setdefault((file, rec["device"]), FileRun(file, rec["device"]))
                if not rec.get("partial"):
                    run.collected += rec.get("collected", 0)
                run.restarts += rec.get("restarts", 0)
                run.shards.add(tuple(rec.get("shard") or [0, 1]))
                continue
            if device is None:
                continue
            if event == "start":
                start_t = rec.get("t")
                last_t = start_t if start_t is not None else last_t
            elif event == "collect_error":
                file = rec["id"].split("::")[0]
                runs.setdefault((file, device), FileRun(file, device)).collect_errors.append(
                    rec["msg"])
            elif event == "test":
                file = rec["id"].split("::")[0]
                run = runs.setdefault((file, device), FileRun(file, device))
                run.tests[rec["key"]] = rec
                if start_t is not None:
                    last_t = start_t + rec.get("seconds", 0.0)
        wall += _session_wall(session_t, last_t, partial)
        if file is not None and device is not None:
            runs.setdefault((file, device), FileRun(file, device)).wall_s += wall
    return runs


# ------------------------------------------------------------------------------------------
# Manifest


@dataclass
class Manifest:
    """Expected neuron failures: [{"file", "test" (key or glob), "kind", "reason"}, ...]."""

    entries: list[dict]

    KINDS = (
        "unsupported",      # a feature the device lacks: sparse, quantized, complex32, dlpack
        "cpu operand",      # a CPU (index, 0-d) tensor that CUDA accepts is rejected
        "missing error",    # CPU raises, neuron computes (no value to be wrong)
        "error message",    # both raise; the type or the message differs
        "missing warning",  # a warning CPU gives is not given
        "version skew",     # the test was written for another torch
        "harness",          # the test's own assumption does not hold on this device
        "slow",             # past the per-test timeout
        "memory",           # past the per-process memory limit
        "crash",
    )
    # A failed comparison of values (category "value mismatch") may be listed only when what
    # the test compared is not a computed result: a count of warnings, a harness artefact.
    # Anything else that compares unequal is a possible wrong value and is never expected.
    VALUE_EXPLAINED = ("missing warning", "harness", "version skew")

    @classmethod
    def read(cls, path: Path) -> Manifest:
        if not path.exists():
            return cls([])
        entries = json.loads(path.read_text())
        for e in entries:
            if not e.get("reason"):
                raise ValueError(f"manifest entry without a reason: {e}")
            if e.get("kind") not in cls.KINDS:
                raise ValueError(f"manifest entry kind must be one of {cls.KINDS}: {e}")
        return cls(entries)

    def match(self, file: str, key: str) -> dict | None:
        test = key.split("::", 1)[1] if "::" in key else key
        for e in self.entries:
            if e["file"] == file and (e["test"] == test or fnmatch.fnmatchcase(test, e["test"])):
                return e
        return None

    def expects(self, file: str, rec: dict) -> bool:
        entry = self.match(file, rec["key"])
        if entry is None:
            return False
        return category(rec) != "value mismatch" or entry["kind"] in self.VALUE_EXPLAINED


def possible_wrong_value(file: str, rec: dict, manifest: Manifest) -> bool:
    return category(rec) == "value mismatch" and not manifest.expects(file, rec)


# ------------------------------------------------------------------------------------------
# Comparison


@dataclass
class FileSummary:
    file: str
    cpu_run: int = 0
    neuron_run: int = 0
    both_run: int = 0
    cpu_passed: int = 0
    neuron_passed: int = 0
    neuron_failed_cpu_passed: list[dict] = field(default_factory=list)
    neuron_skipped_cpu_passed: int = 0
    neuron_not_run_cpu_passed: int = 0
    cpu_seconds: float = 0.0
    neuron_seconds: float = 0.0
    cpu_wall_s: float = 0.0
    neuron_wall_s: float = 0.0
    collect_errors: list[str] = field(default_factory=list)
    sampled: str = ""

    @property
    def comparable(self) -> int:
        """CPU passes whose neuron twin ran to an outcome other than skipped."""
        return self.cpu_passed - self.neuron_skipped_cpu_passed - self.neuron_not_run_cpu_passed


def compare(runs: dict[tuple[str, str], FileRun]) -> list[FileSummary]:
    files = sorted({f for f, _ in runs})
    out = []
    for file in files:
        cpu = runs.get((file, "cpu"), FileRun(file, "cpu"))
        neu = runs.get((file, "neuron"), FileRun(file, "neuron"))
        s = FileSummary(file, cpu_run=len(cpu.tests), neuron_run=len(neu.tests),
                        cpu_wall_s=cpu.wall_s, neuron_wall_s=neu.wall_s,
                        collect_errors=cpu.collect_errors + neu.collect_errors,
                        sampled=neu.sampled or cpu.sampled)
        s.both_run = len(cpu.tests.keys() & neu.tests.keys())
        s.cpu_seconds = sum(r.get("seconds", 0.0) for r in cpu.tests.values())
        s.neuron_seconds = sum(r.get("seconds", 0.0) for r in neu.tests.values())
        s.neuron_passed = sum(r["outcome"] in NEURON_PASSED for r in neu.tests.values())
        for key, c in cpu.tests.items():
            if c["outcome"] not in CPU_PASSED:
                continue
            s.cpu_passed += 1
            n = neu.tests.get(key)
            if n is None:
                s.neuron_not_run_cpu_passed += 1
            elif n["outcome"] == "skipped":
                s.neuron_skipped_cpu_passed += 1
            elif n["outcome"] in FAILED:
                s.neuron_failed_cpu_passed.append(n)
        out.append(s)
    return out


@dataclass
class Group:
    category: str
    cause: str
    failures: list[dict] = field(default_factory=list)
    expected: int = 0


def group_failures(summaries: list[FileSummary], manifest: Manifest) -> list[Group]:
    """Neuron failures where CPU passes, grouped by (category, cause), largest first."""
    groups: dict[tuple[str, str], Group] = {}
    for s in summaries:
        for rec in s.neuron_failed_cpu_passed:
            cat, cz = category(rec), cause(rec)
            g = groups.setdefault((cat, cz), Group(cat, cz))
            g.failures.append(rec)
            if manifest.expects(s.file, rec):
                g.expected += 1
    return sorted(groups.values(), key=lambda g: (-len(g.failures), g.category, g.cause))


def new_failures(summaries: list[FileSummary], manifest: Manifest) -> list[tuple[str, dict]]:
    """(file, record) of each neuron failure (CPU passing) that the manifest does not expect
    (a value mismatch is expected only where the manifest says what was compared)."""
    return [(s.file, rec) for s in summaries for rec in s.neuron_failed_cpu_passed
            if not manifest.expects(s.file, rec)]


def stale_entries(summaries: list[FileSummary], runs, manifest: Manifest) -> list[dict]:
    """Manifest entries that match tests that ran on neuron, but no failure among them (an
    entry none of whose tests ran, in a run with -k or a sample, is not judged)."""
    failing = {(s.file, r["key"].split("::", 1)[1]) for s in summaries
               for r in s.neuron_failed_cpu_passed}
    ran = {(f, key.split("::", 1)[1]) for (f, d), run in runs.items() if d == "neuron"
           for key in run.tests}

    def matches(e: dict, tests: set) -> bool:
        return any(f == e["file"] and (t == e["test"] or fnmatch.fnmatchcase(t, e["test"]))
                   for f, t in tests)

    return [e for e in manifest.entries if matches(e, ran) and not matches(e, failing)]


# ------------------------------------------------------------------------------------------
# Report


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.2f}%" if b else "n/a"


def render(summaries: list[FileSummary], groups: list[Group], manifest: Manifest,
           source: dict, examples_per_group: int = 3) -> str:
    tot_cpu = sum(s.comparable for s in summaries)
    tot_fail = sum(len(s.neuron_failed_cpu_passed) for s in summaries)
    mismatches = [(s.file, r) for s in summaries for r in s.neuron_failed_cpu_passed
                  if category(r) == "value mismatch"]
    wrong = [(f, r) for f, r in mismatches if possible_wrong_value(f, r, manifest)]
    unexpected = len(new_failures(summaries, manifest))
    lines = [
        COVERAGE_BEGIN,
        "## PyTorch's own test files (upstream tests)",
        "",
        "Generated by `make upstream-tests PYTORCH_TESTS=DIR` (`tests/upstream/run.py`): the",
        "device-generic test classes of PyTorch's test files, instantiated for `cpu` and for",
        "`neuron` (one pytest process per file and device, a per-test timeout, a crash or hang",
        "recorded as a failure). A `neuron` failure counts only where the same test passes on",
        "CPU. Do not edit by hand.",
        "",
        f"- test files: {source.get('repo', '?')} at commit `{source.get('commit', '?')}`"
        f" ({source.get('date', '?')}; version.txt {source.get('version', '?')}), run against"
        f" torch {source.get('torch', '?')}; version-skew aliases:"
        f" {', '.join(source.get('aliases', [])) or 'none'}",
        f"- run: {source.get('when', '?')} on torchneuron `{source.get('torchneuron', '?')}`;"
        f" per-test timeout {source.get('timeout', '?')} s;"
        f" filters: {source.get('filters', 'none')}",
        f"- **neuron failures where CPU passes: {tot_fail} of {tot_cpu} CPU passes"
        f" ({_pct(tot_fail, tot_cpu)}); not expected by the manifest: {unexpected};"
        f" possible wrong values: {len(wrong)}**",
        "",
        "| file | tests run (cpu / neuron) | CPU passes | neuron passes | neuron fails, CPU passes"
        " | neuron skips, CPU passes | not run on neuron | wall s (cpu / neuron) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    # source["file_notes"]: {file: note}, e.g. which records come from an earlier run
    notes = source.get("file_notes", {})
    for s in summaries:
        nf = len(s.neuron_failed_cpu_passed)
        name = s.file + (f" (sample {s.sampled})" if s.sampled else "")
        if notes.get(s.file):
            name += f" [{notes[s.file]}]"
        lines.append(
            f"| {name} | {s.cpu_run} / {s.neuron_run} | {s.cpu_passed} | {s.neuron_passed}"
            f" | {nf} ({_pct(nf, s.comparable)}) | {s.neuron_skipped_cpu_passed}"
            f" | {s.neuron_not_run_cpu_passed} | {s.cpu_wall_s:.0f} / {s.neuron_wall_s:.0f} |")
        for err in s.collect_errors:
            lines.append(f"|  | collection error: {normalize_message(err)[:120]} | | | | | | |")
    lines += ["", "### neuron failures where CPU passes, by cause", ""]
    if not groups:
        lines.append("None.")
    for i, g in enumerate(groups, 1):
        files = collections.Counter(r["id"].split("::")[0] for r in g.failures)
        where = ", ".join(f"{f} {n}" for f, n in files.most_common())
        exp = f"; {g.expected} expected" if g.expected else ""
        lines.append(f"{i}. **{g.category}** — `{g.cause}` — {len(g.failures)} tests"
                     f" ({where}{exp})")
        for r in g.failures[:examples_per_group]:
            frame = r.get("backend_frame") or r.get("raise_frame") or ""
            lines.append(f"   - `{r['key']}`" + (f" ({frame})" if frame else ""))
    lines += ["", "### Value mismatches", "",
              "Failed comparisons of values. Unless the manifest says that what was compared is",
              "not a computed result (a count of warnings, a harness artefact), each is a possible",
              "wrong value and never an expected failure.", ""]
    if not mismatches:
        lines.append("None.")
    for file, r in mismatches:
        entry = manifest.match(file, r["key"]) if not possible_wrong_value(file, r, manifest) \
            else None
        why = f" — not a wrong value ({entry['kind']}): {entry['reason']}" if entry \
            else " — **possible wrong value**"
        lines.append(f"- `{r['key']}`: {normalize_message(r.get('msg', ''))}{why}")
    lines += ["", COVERAGE_END, ""]
    return "\n".join(lines)


def write_section(coverage: Path, section: str) -> None:
    """Replaces the upstream section of docs/COVERAGE.md (or appends it), leaving the rest."""
    text = coverage.read_text() if coverage.exists() else ""
    begin, end = text.find(COVERAGE_BEGIN), text.find(COVERAGE_END)
    if begin >= 0 and end > begin:
        text = text[:begin] + section.rstrip("\n") + "\n" + text[end + len(COVERAGE_END):].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    coverage.write_text(text)
