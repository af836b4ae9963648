"""PyTorch's own test files on the neuron device, compared with CPU (issue 10).

    .venv/bin/python tests/upstream/run.py run --pytorch-tests DIR [--files a,b] [--jobs 2]
    .venv/bin/python tests/upstream/run.py report [--write]

DIR is the `test/` folder of a PyTorch source checkout (the test files are not in the torch
wheel and are never copied into this repository). `run` starts, for each file and device
(and shard), one pytest process with plugin.py: the file's device-generic classes for that
device only, a per-test timeout, one JSON line per test in build/upstream/records/. A process
that crashes or hangs is killed, the test it was in is recorded as `crash`/`timeout`, and the
process is restarted after that test. `report` pairs every neuron test with its CPU twin,
groups the neuron failures where CPU passes by cause, checks them against
tests/upstream/expected_failures.json and (with --write) rewrites the upstream section of
docs/COVERAGE.md. It exits 1 when a failure is not expected by the manifest (a value mismatch is
expected only where the manifest says that what was compared is not a computed result).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import results  # noqa: E402

OUT = REPO / "build" / "upstream"
MANIFEST = HERE / "expected_failures.json"
COVERAGE = REPO / "docs" / "COVERAGE.md"

# The files issue 10 names, small ones first. Per-file pytest selections: test_ops runs its
# TestCommon class only; the device-generic classes of every file are chosen by plugin.py.
FILES = (
    "test_shape_ops", "test_indexing", "test_view_ops", "test_type_promotion",
    "test_tensor_creation_ops", "test_foreach", "test_binary_ufuncs", "test_reductions",
    "test_linalg", "test_nn", "test_unary_ufuncs", "test_ops",
)
SELECTIONS = {"test_ops": "TestCommon"}
DEFAULT_TIMEOUT = 120.0
KILL_GRACE = 60.0  # beyond the per-test timeout: the test is stuck outside Python; kill
MAX_RESTARTS = 200
MAX_RSS_MB = 4096.0  # two neuron processes and the rest of a 2-core, 23 GB machine
MAX_VM_FACTOR = 2.0  # address space per MB of resident memory allowed (XLA reserves ~2 GB)


@dataclass
class Task:
    file: str
    device: str
    shard: tuple[int, int]
    records: Path
    log: Path
    keyword: str | None
    timeout: float
    partial: bool
    kill_grace: float = KILL_GRACE
    max_rss_mb: float = 0.0
    recycle: bool = False
    recycles: int = 0
    proc: subprocess.Popen | None = None
    restarts: int = 0
    started: float = 0.0
    wall: float = 0.0
    offset: int = 0  # bytes of the records file already read
    inflight: str | None = None
    inflight_since: float = 0.0
    collected: int = 0
    done: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        k, n = self.shard
        return f"{self.file}.{self.device}" + (f".{k}of{n}" if n > 1 else "")


def _pytest_cmd(task: Task, tests_dir: Path, done_file: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", f"{task.file}.py", "-p", "plugin", "--noconftest",
           "-p", "no:cacheprovider", "-q", "--tb=short", "-o", "addopts=",
           f"--rootdir={tests_dir}", f"--upstream-device={task.device}",
           f"--upstream-records={task.records}", f"--upstream-timeout={task.timeout:g}",
           f"--upstream-done={done_file}"]
    if task.max_rss_mb:
        cmd.append(f"--upstream-max-rss-mb={task.max_rss_mb:g}")
        # A test that allocates tens of GB (test_index_put_accumulate_large_tensor: 2**31
        # int8 elements, copied by out-of-place updates) fails in its own process instead of
        # the kernel's OOM killer choosing a process, possibly someone else's.
        cmd.append(f"--upstream-max-vm-mb={task.max_rss_mb * MAX_VM_FACTOR:g}")
    if task.shard[1] > 1:
        cmd.append(f"--upstream-shard={task.shard[0]}/{task.shard[1]}")
    if task.partial:
        cmd.append("--upstream-partial")
    if task.keyword:
        cmd += ["-k", task.keyword]
    return cmd


def _start(task: Task, tests_dir: Path) -> None:
    done_file = task.records.with_suffix(".done")
    done_file.write_text("\n".join(sorted(task.done)) + "\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # Each test compiles its ops for shapes of its own; most of a neuron test's time is XLA
    # compilation. JAX's persistent cache lets a rerun (or another shard) reuse executables.
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(task.records.parent.parent / "jax-cache"))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    log = open(task.log, "a")
    task.proc = subprocess.Popen(_pytest_cmd(task, tests_dir, done_file), cwd=tests_dir,
                                 env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    log.close()
    task.started = time.monotonic()
    task.inflight = None


def _read_new(task: Task) -> None:
    if not task.records.exists():
        return
    with open(task.records, "rb") as f:
        f.seek(task.offset)
        chunk = f.read()
    end = chunk.rfind(b"\n")
    if end < 0:
        return
    task.offset += end + 1
    for line in chunk[: end + 1].decode(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        event = rec.get("event")
        if event == "start":
            task.inflight, task.inflight_since = rec["id"], time.monotonic()
        elif event == "test":
            task.done.add(rec["id"])
            task.inflight = None
        elif event == "recycle":
            task.recycle = True
        elif event == "collected" and not (task.restarts or task.recycles):
            task.collected = rec["count"]


def _append(task: Task, rec: dict) -> None:
    with open(task.records, "a") as f:
        f.write(json.dumps(rec) + "\n")
    task.offset = task.records.stat().st_size


def _charge_inflight(task: Task, outcome: str, msg: str) -> None:
    nodeid = task.inflight
    _append(task, {"event": "test", "id": nodeid, "key": results.test_key(nodeid, task.device),
                   "outcome": outcome, "exc": outcome.capitalize(), "msg": msg,
                   "seconds": round(time.monotonic() - task.inflight_since, 3)})
    task.done.add(nodeid)
    task.inflight = None


def _kill(task: Task) -> None:
    try:
        os.killpg(task.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    task.proc.wait()


def _poll(task: Task, tests_dir: Path) -> bool:
    """Advances one task; True when it is finished."""
    _read_new(task)
    code = task.proc.poll()
    if code is None:
        limit = task.timeout + task.kill_grace
        if task.inflight and time.monotonic() - task.inflight_since > limit:
            _kill(task)
            task.wall += time.monotonic() - task.started
            _read_new(task)
            if task.inflight:
                _charge_inflight(task, "timeout", f"no return after {limit:.0f} s (stuck"
                                 " outside Python); process killed")
            return _restart(task, tests_dir)
        return False
    task.wall += time.monotonic() - task.started
    if task.inflight:
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        _charge_inflight(task, "crash", f"the test process died ({how})")
        return _restart(task, tests_dir)
    if task.recycle:  # stopped on purpose (memory): go on with a fresh process
        task.recycle = False
        task.recycles += 1
        _start(task, tests_dir)
        return False
    _finish(task)
    return True


def _restart(task: Task, tests_dir: Path) -> bool:
    task.restarts += 1
    if task.restarts > MAX_RESTARTS:
        _finish(task)
        return True
    print(f"  {task.name}: restart {task.restarts} after {len(task.done)} tests", flush=True)
    _start(task, tests_dir)
    return False


def _finish(task: Task) -> None:
    _append(task, {"event": "run", "file": f"{task.file}.py", "device": task.device,
                   "shard": list(task.shard), "wall_s": round(task.wall, 1),
                   "restarts": task.restarts, "recycles": task.recycles,
                   "collected": task.collected,
                   "partial": task.partial})
    print(f"  {task.name}: {len(task.done)} tests in {task.wall:.0f} s"
          f" ({task.restarts} restarts, {task.recycles} fresh processes for memory)", flush=True)


def source_info(tests_dir: Path, repo_label: str | None) -> dict:
    def git(*args: str, where: Path = tests_dir) -> str:
        try:
            return subprocess.run(["git", "-C", str(where), *args], capture_output=True,
                                  text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    import torch

    version = tests_dir.parent / "version.txt"
    return {
        "torchneuron": git("describe", "--always", "--dirty", where=REPO) or "unknown",
        "repo": repo_label or git("remote", "get-url", "origin") or str(tests_dir),
        "commit": git("rev-parse", "HEAD") or "unknown",
        "date": git("log", "-1", "--format=%cs") or "unknown",
        "version": version.read_text().strip() if version.exists() else "unknown",
        "torch": torch.__version__,
    }


def cmd_run(args) -> int:
    tests_dir = Path(args.pytorch_tests).resolve()
    if not any(tests_dir.glob("test_*.py")):
        print(f"{tests_dir} is not the test/ folder of a PyTorch checkout", file=sys.stderr)
        return 2
    missing = [f for f in (args.files.split(",") if args.files else FILES)
               if not (tests_dir / f"{f.removesuffix('.py')}.py").exists()]
    if missing:
        print(f"not in {tests_dir}: {', '.join(missing)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    (out / "records").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    files = args.files.split(",") if args.files else list(FILES)
    files = [f.removesuffix(".py") for f in files]
    devices = args.devices.split(",")
    shards = dict(kv.split("=") for kv in args.shards.split(",")) if args.shards else {}
    samples = dict(kv.split("=") for kv in args.sample.split(",")) if args.sample else {}
    partial = bool(args.k or args.update)
    tasks = []
    for file in files:
        n = int(samples.get(file, shards.get(file, 1)))
        shard_ids = [0] if file in samples else range(n)
        keyword = " and ".join(f"({k})" for k in (SELECTIONS.get(file), args.k) if k) or None
        for device in devices:
            for k in shard_ids:
                t = Task(file, device, (k, n), Path(), Path(), keyword, args.timeout, partial,
                         args.kill_grace, args.max_rss_mb)
                t.records = out / "records" / f"{t.name}.jsonl"
                t.log = out / "logs" / f"{t.name}.log"
                if args.resume and t.records.exists():
                    t.done = {json.loads(ln)["id"] for ln in t.records.read_text().splitlines()
                              if '"event": "test"' in ln}
                    t.offset = t.records.stat().st_size
                elif args.update and t.records.exists():
                    t.offset = t.records.stat().st_size  # earlier records stay, unread
                else:
                    t.records.unlink(missing_ok=True)
                    t.log.unlink(missing_ok=True)
                tasks.append(t)
    info = source_info(tests_dir, args.source)
    info.update(when=datetime.date.today().isoformat(), timeout=args.timeout,
                filters=args.k or "none")
    src_path = out / "source.json"
    if not (args.update and src_path.exists()):
        src_path.write_text(json.dumps(info, indent=1) + "\n")
    print(f"upstream tests from {info['repo']} {info['commit'][:12]} ({info['version']}):"
          f" {len(tasks)} processes, {args.jobs} at a time", flush=True)
    pending, running = list(tasks), []
    try:
        while pending or running:
            while pending and len(running) < args.jobs:
                t = pending.pop(0)
                print(f"  {t.name}: start", flush=True)
                _start(t, tests_dir)
                running.append(t)
            time.sleep(1.0)
            running = [t for t in running if not _poll(t, tests_dir)]
    except KeyboardInterrupt:
        for t in running:
            _kill(t)
        raise
    if args.no_report:
        return 0
    return cmd_report(argparse.Namespace(out=args.out, write=args.write))


def cmd_report(args) -> int:
    out = Path(args.out)
    runs = results.load(sorted((out / "records").glob("*.jsonl")))
    src_path = out / "source.json"
    source = json.loads(src_path.read_text()) if src_path.exists() else {}
    import compat

    source["aliases"] = sorted(f"{m.rsplit('.', 1)[-1]}.{n}" for m, n in compat.ALIASES)
    manifest = results.Manifest.read(MANIFEST)
    summaries = results.compare(runs)
    groups = results.group_failures(summaries, manifest)
    section = results.render(summaries, groups, manifest, source)
    (out / "failures.json").write_text(json.dumps(
        [{"category": g.category, "cause": g.cause, "tests": [
            {k: r.get(k) for k in ("key", "outcome", "exc", "msg", "backend_frame",
                                   "test_frame", "raise_frame", "fallback_ops", "seconds")}
            for r in g.failures]} for g in groups], indent=1) + "\n")
    new = results.new_failures(summaries, manifest)
    stale = results.stale_entries(summaries, runs, manifest)
    for s in summaries:
        nf = len(s.neuron_failed_cpu_passed)
        print(f"{s.file}: cpu {s.cpu_passed}/{s.cpu_run} passed, neuron {s.neuron_passed}/"
              f"{s.neuron_run} passed, {nf} neuron failures where CPU passes"
              f" ({s.cpu_wall_s:.0f} s / {s.neuron_wall_s:.0f} s)")
    for _file, rec in new:
        kind = "POSSIBLE WRONG VALUE" if results.category(rec) == "value mismatch" \
            else "new failure"
        print(f"{kind}: {rec['key']}: {results.cause(rec)}")
    for e in stale:
        print(f"expected failure no longer fails: {e['file']}::{e['test']}")
    uncollected = sorted({(s.file, err.strip().splitlines()[-1].removeprefix("E").strip())
                          for s in summaries for err in s.collect_errors if err.strip()})
    for file, last_line in uncollected:  # a file that did not import ran no test at all
        print(f"COLLECTION ERROR: {file}: {last_line}")
    if args.write:
        results.write_section(COVERAGE, section)
        print(f"wrote {COVERAGE.relative_to(REPO)}; failure details in {out / 'failures.json'}")
    return 1 if new or uncollected else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run the test files on cpu and neuron, then report")
    run.add_argument("--pytorch-tests", required=True, help="test/ folder of a PyTorch checkout")
    run.add_argument("--source", default=None, help="label of the checkout (owner/repo)")
    run.add_argument("--files", default="", help=f"comma-separated (default: {','.join(FILES)})")
    run.add_argument("--devices", default="cpu,neuron")
    run.add_argument("--jobs", type=int, default=1, help="pytest processes at a time")
    run.add_argument("--shards", default="", help="file=N,...: split a file into N processes")
    run.add_argument("--sample", default="",
                     help="file=N,...: run every N-th test of a file only (shard 0 of N)")
    run.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per test")
    run.add_argument("--kill-grace", type=float, default=KILL_GRACE,
                     help="seconds past the timeout before a stuck process is killed")
    run.add_argument("--max-rss-mb", type=float, default=MAX_RSS_MB,
                     help="a test process above this size is replaced after its test")
    run.add_argument("-k", default="", help="pytest -k expression, added to each file's own")
    run.add_argument("--resume", action="store_true", help="skip the tests already recorded")
    run.add_argument("--update", action="store_true",
                     help="keep earlier records; the tests run now replace theirs")
    run.add_argument("--no-report", action="store_true")
    run.add_argument("--write", action="store_true", help="write docs/COVERAGE.md")
    run.add_argument("--out", default=str(OUT))
    rep = sub.add_parser("report", help="summarise build/upstream/records")
    rep.add_argument("--write", action="store_true", help="write docs/COVERAGE.md")
    rep.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    return cmd_run(args) if args.cmd == "run" else cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
