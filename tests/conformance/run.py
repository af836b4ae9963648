"""Conformance sweep over PyTorch's op_db and module_db on the neuron device.

    .venv/bin/python tests/conformance/run.py sweep [--jobs 2] [--budget SECONDS] [--ops a,b]
    .venv/bin/python tests/conformance/run.py report [--write-manifest]

`sweep` runs every OpInfo (float32 first, then every other dtype the OpInfo lists for CPU)
and every ModuleInfo in worker processes (one unit of work at a time each; a worker that
crashes or hangs is replaced and the unit recorded as crash/timeout), appends the records to
build/conformance/results.jsonl, then runs `report`: prints `N passed, N failed, N skipped`,
writes docs/COVERAGE.md and (with --write-manifest) tests/conformance/expected_failures.json.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import random
import selectors
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RESULTS = REPO / "build" / "conformance" / "results.jsonl"
MANIFEST = HERE / "expected_failures.json"
COVERAGE = REPO / "docs" / "COVERAGE.md"

UNIT_TIMEOUT = 420.0  # seconds for one unit before its worker is killed
CHECK_TIMEOUT = 150.0  # seconds for one (op, variant, dtype) check inside a worker
WORKER_RSS_LIMIT = 5 * 1024**3  # a worker above this is replaced after its unit


# ----------------------------------------------------------------------------------------
# Worker


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def worker() -> None:
    # The protocol owns the real stdout; anything else printed goes to stderr (the log).
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.path.insert(0, str(HERE))
    import warnings

    warnings.simplefilter("ignore")
    import harness
    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_modules import module_db

    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        unit = json.loads(line)
        t0 = time.perf_counter()
        if unit["kind"] == "op":
            op = op_db[unit["index"]]
            dtypes = harness.op_dtypes(op)
            if unit["group"] == "f32":
                chosen = [d for d in dtypes if d == torch.float32]
            else:
                chosen = [d for d in dtypes if d != torch.float32]
            records = harness.check_op(op, chosen, time_limit=CHECK_TIMEOUT,
                                       error_inputs=unit["group"] == "f32")
        else:
            info = module_db[unit["index"]]
            records = []
            for dtype in (torch.float32, torch.float64):
                if dtype not in info.dtypes:
                    continue
                rec = harness.check_module(info, dtype)
                rec["kind"] = "module"
                records.append(rec)
        recycle = _rss() > WORKER_RSS_LIMIT
        proto.write(json.dumps({"unit": unit, "records": records, "recycle": recycle,
                                "seconds": round(time.perf_counter() - t0, 3)}) + "\n")
        if recycle:
            break


# ----------------------------------------------------------------------------------------
# Parent


class Worker:
    def __init__(self, log) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=str(REPO))
        self.unit = None
        self.started = 0.0
        self.ready = False

    def send(self, unit) -> None:
        self.unit = unit
        self.started = time.monotonic()
        self.proc.stdin.write(json.dumps(unit) + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _unit_name(unit, op_names, module_names) -> str:
    if unit["kind"] == "op":
        return op_names[unit["index"]]
    return module_names[unit["index"]]


def plan_units(selected_ops=None, modules=True, groups=("f32", "modules", "rest")):
    sys.path.insert(0, str(HERE))
    import harness
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_modules import module_db

    op_names = [harness.op_id(op) for op in op_db]
    module_names = [m.name for m in module_db]
    idx = [i for i, n in enumerate(op_names) if selected_ops is None or n in selected_ops]
    units = [{"kind": "op", "index": i, "group": "f32"} for i in idx] if "f32" in groups else []
    if modules and "modules" in groups:
        units += [{"kind": "module", "index": i} for i, n in enumerate(module_names)
                  if selected_ops is None or n in selected_ops]
    rest = [i for i in idx if any(str(d) != "torch.float32" for d in harness.op_dtypes(op_db[i]))]
    # A fixed shuffle: a sweep cut short by --budget still covers the other dtypes of a
    # sample of OpInfos that is not biased by op_db's order.
    random.Random(0).shuffle(rest)
    if "rest" in groups:
        units += [{"kind": "op", "index": i, "group": "rest"} for i in rest]
    return units, op_names, module_names


def sweep(args) -> int:
    selected = set(args.ops.split(",")) if args.ops else None
    units, op_names, module_names = plan_units(selected, modules=not args.no_modules,
                                               groups=tuple(args.groups.split(",")))
    results_path = Path(args.results)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results = open(results_path, "w")
    log = open(results_path.with_suffix(".log"), "w")
    t_start = time.monotonic()
    deadline = t_start + args.budget if args.budget else None
    pending = collections.deque(units)
    workers = [Worker(log) for _ in range(args.jobs)]
    sel = selectors.DefaultSelector()
    for w in workers:
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
    done_units = 0
    not_run = 0

    def record_failure(w: Worker, status: str, detail: str) -> None:
        unit = w.unit
        name = _unit_name(unit, op_names, module_names)
        rec = {"op": name, "variant": "forward" if unit["kind"] == "op" else "module",
               "dtype": "float32" if unit.get("group", "f32") == "f32" else "other",
               "status": status, "samples": 0, "passed": 0, "fallback_ops": [],
               "decomposed_ops": [], "detail": detail, "kind": unit["kind"],
               "seconds": round(time.monotonic() - w.started, 3)}
        results.write(json.dumps(rec) + "\n")
        results.flush()

    def replace(w: Worker) -> Worker:
        sel.unregister(w.proc.stdout)
        w.kill()
        nw = Worker(log)
        sel.register(nw.proc.stdout, selectors.EVENT_READ, nw)
        workers[workers.index(w)] = nw
        return nw

    def feed(w: Worker) -> None:
        nonlocal not_run
        if deadline is not None and time.monotonic() > deadline:
            not_run += len(pending)
            pending.clear()
        if pending:
            w.send(pending.popleft())
        else:
            w.unit = None

    while True:
        busy = [w for w in workers if w.unit is not None or not w.ready]
        if not busy and not pending:
            break
        events = sel.select(timeout=5.0)
        for key, _ in events:
            w = key.data
            line = w.proc.stdout.readline()
            if not line:  # worker died
                if w.unit is not None:
                    code = w.proc.poll()
                    record_failure(w, "crash", f"worker died (exit status {code})")
                    done_units += 1
                nw = replace(w)
                nw.ready = False
                continue
            msg = json.loads(line)
            if msg.get("ready"):
                w.ready = True
                feed(w)
                continue
            for rec in msg["records"]:
                results.write(json.dumps(rec) + "\n")
            results.flush()
            done_units += 1
            if done_units % 25 == 0:
                elapsed = time.monotonic() - t_start
                print(f"[{elapsed:7.0f}s] {done_units}/{len(units)} units", flush=True)
            if msg.get("recycle"):
                w.unit = None
                replace(w)
                continue
            feed(w)
        now = time.monotonic()
        for w in list(workers):
            if w.unit is not None and now - w.started > UNIT_TIMEOUT:
                record_failure(w, "timeout", f"unit exceeded {UNIT_TIMEOUT:.0f}s")
                done_units += 1
                replace(w)
    for w in workers:
        w.proc.stdin.close()
        w.kill()
    wall = time.monotonic() - t_start
    meta = {"kind": "meta", "wall_seconds": round(wall, 1), "jobs": args.jobs,
            "units": len(units), "units_done": done_units, "units_not_run": not_run,
            "date": datetime.date.today().isoformat()}
    results.write(json.dumps(meta) + "\n")
    results.close()
    print(f"sweep: {done_units} units in {wall:.0f}s with {args.jobs} workers"
          + (f"; {not_run} units not run (budget)" if not_run else ""), flush=True)
    if args.no_report:
        return 0
    return report(argparse.Namespace(results=str(results_path),
                                     write_manifest=args.write_manifest, coverage=True))


# ----------------------------------------------------------------------------------------
# Report


def family(op_name: str, cls: str) -> str:
    prefixes = [("nn.functional.", "nn.functional"), ("linalg.", "linalg"), ("fft.", "fft"),
                ("special.", "special"), ("_refs", "refs"), ("sparse", "sparse"),
                ("masked.", "masked"), ("_masked.", "masked"), ("signal.", "signal")]
    for p, fam in prefixes:
        if op_name.startswith(p):
            return fam
    return {"UnaryUfuncInfo": "elementwise unary", "BinaryUfuncInfo": "elementwise binary",
            "ReductionOpInfo": "reduction", "SpectralFuncInfo": "fft",
            "ShapeFuncInfo": "shape/view"}.get(cls, "other")


def load(paths: str):
    """Records of one or more result files (comma-separated); a later file's record for the
    same (op, variant, dtype) replaces an earlier one. The first file's meta describes the run."""
    by_key, meta = {}, {}
    for n, path in enumerate(paths.split(",")):
        fresh: dict = {}
        for line in open(path):
            r = json.loads(line)
            if r.get("kind") == "meta":
                if n == 0:
                    meta = r
                else:
                    meta.setdefault("extra", []).append(r)
            else:
                fresh[(r["op"], r["variant"], r["dtype"])] = r
        # a rerun of (op, dtype) replaces every earlier record of it, whatever the variant
        rerun = {(op, dtype) for op, _, dtype in fresh} | {(op, "any") for op, _, _ in fresh}
        by_key = {k: v for k, v in by_key.items() if (k[0], k[2]) not in rerun}
        by_key.update(fresh)
    return list(by_key.values()), meta


def manifest_entries(records) -> list[dict]:
    import harness

    out = []
    for r in records:
        if r["status"] in harness.FAILING and r["status"] not in harness.SILENT:
            reason = r["detail"] or r["status"]
            out.append({"op": r["op"], "variant": r["variant"], "dtype": r["dtype"],
                        "status": r["status"], "reason": reason[:200]})
    out.sort(key=lambda e: (e["op"], e["variant"], e["dtype"]))
    return out


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "n/a"


def report(args) -> int:
    sys.path.insert(0, str(HERE))
    import harness

    records, meta = load(args.results)
    op_records = [r for r in records if r.get("kind") != "module"]
    mod_records = [r for r in records if r.get("kind") == "module"]
    passed = sum(r["status"] in ("pass", "fallback") for r in records)
    failed = sum(r["status"] in harness.FAILING for r in records)
    skipped = sum(r["status"] == "skip" for r in records)
    via_fallback = sum(r["status"] == "fallback" for r in records)

    from torch.testing._internal.common_methods_invocations import op_db

    cls_of = {harness.op_id(op): type(op).__name__ for op in op_db}
    listed = {harness.op_id(op): {harness.dtype_name(d) for d in harness.op_dtypes(op)}
              for op in op_db}
    by_op: dict[str, list] = collections.defaultdict(list)
    for r in op_records:
        by_op[r["op"]].append(r)
    value_variants = ("forward", "out", "inplace", "random")

    def ok(rs, native: bool) -> bool:
        good = ("pass", "skip") if native else ("pass", "fallback", "skip")
        return bool(rs) and all(r["status"] in good for r in rs)

    f32_ops = f32_native = all_ops = all_pass = all_native = 0
    grad_ops = grad_pass = grad_native = 0
    err_cases = err_raised = err_same = 0
    fam = collections.defaultdict(collections.Counter)
    for name, rs in by_op.items():
        f32 = [r for r in rs if r["dtype"] == "float32" and r["variant"] in value_variants]
        if f32:
            f32_ops += 1
            f32_native += ok(f32, True) and any(r["samples"] for r in f32)
        vals = [r for r in rs if r["variant"] in value_variants]
        # only OpInfos whose every listed dtype was run (a sweep cut short by --budget)
        if listed.get(name, set()) <= {r["dtype"] for r in vals}:
            all_ops += 1
            all_pass += ok(vals, False)
            all_native += ok(vals, True)
        g = [r for r in rs if r["variant"] == "grad" and r["dtype"] == "float32"]
        if g and any(r["samples"] or r["status"] not in ("skip",) for r in g):
            grad_ops += 1
            grad_pass += ok(g, False)
            grad_native += ok(g, True)
        for r in rs:
            if r["variant"] == "error_inputs":
                err_cases += r.get("cases", 0)
                err_raised += r.get("raised", 0)
                err_same += r.get("passed", 0)
        if any(r["status"] in harness.FAILING for r in rs):
            kind = "fail"
        elif any(r["status"] == "fallback" for r in rs):
            kind = "CPU fallback"
        elif any(r["decomposed_ops"] for r in rs):
            kind = "decomposed"
        else:
            kind = "native"
        fam[family(name, cls_of.get(name, ""))][kind] += 1
        fam["total"][kind] += 1

    silent = [r for r in records if r["status"] in harness.SILENT]
    closer = [r for r in records if r.get("closer_to_float64")]
    # Gaps: what keeps the most OpInfos from passing.
    gap_ops: dict[str, set] = collections.defaultdict(set)
    for r in records:
        for f in r["fallback_ops"]:
            gap_ops[f"CPU fallback: {f}"].add(r["op"])
        if r["status"] in harness.FAILING:
            detail = r["detail"].split("): ", 1)[-1] if r["detail"] else r["status"]
            key = f"{r['status']} ({r['variant']}): {detail[:90]}"
            gap_ops[key].add(r["op"])
    gaps = sorted(gap_ops.items(), key=lambda kv: -len(kv[1]))[:10]

    mods = collections.Counter(r["status"] for r in mod_records)
    lines = [
        "# Conformance coverage",
        "",
        "Generated by `make conformance` (`tests/conformance/run.py`): PyTorch's own OpInfo",
        "(`op_db`) and ModuleInfo (`module_db`) samples on the `neuron` device, compared with",
        "CPU. Do not edit by hand.",
        "",
        f"- sweep: {meta.get('date', '?')}, {meta.get('wall_seconds', '?')} s wall with "
        f"{meta.get('jobs', '?')} workers; units of work: {meta.get('units_done', '?')} of "
        f"{meta.get('units', '?')} run" + (f" (**{meta['units_not_run']} not run: time budget**)"
                                          if meta.get("units_not_run") else ""),
        *[f"- follow-up run merged in (later records replace earlier ones): "
          f"{m.get('units_done')} units in {m.get('wall_seconds')} s" for m in meta.get("extra", [])],
        "- samples per (op, variant, dtype) are capped: " +
        ", ".join(f"{k} {v}" for k, v in harness.CAPS.items()),
        f"- records (op, variant, dtype): **{passed} passed, {failed} failed, {skipped} "
        f"skipped** ({via_fallback} of the passed needed the CPU fallback)",
        "",
        "## The bar (issue 3)",
        "",
        "| measure | result |",
        "|---|---|",
        f"| OpInfos passing every float32 sample natively (no CPU fallback) | {f32_native} / "
        f"{f32_ops} = {_pct(f32_native, f32_ops)} |",
        f"| OpInfos passing every dtype they list (forward/out/in-place/random), fallback "
        f"allowed; of the {all_ops} OpInfos (of {len(by_op)} run) whose every dtype ran | "
        f"{all_pass} / {all_ops} = {_pct(all_pass, all_ops)} |",
        f"| same, natively | {all_native} / {all_ops} = {_pct(all_native, all_ops)} |",
        f"| silent mismatches (op, variant, dtype) | {len(silent)} |",
        f"| records passing by the float64 reference rule (neuron at least as close to a "
        f"float64 computation as CPU; harness.PRECISE) | {len(closer)} "
        f"({sum(r['closer_to_float64'] for r in closer)} samples) |",
        f"| error_inputs: neuron raises where CPU raises | {err_raised} / {err_cases} = "
        f"{_pct(err_raised, err_cases)} (same exception type: {_pct(err_same, err_cases)}) |",
        f"| float32 gradients match CPU (OpInfos with autograd) | {grad_pass} / {grad_ops} = "
        f"{_pct(grad_pass, grad_ops)} (natively: {_pct(grad_native, grad_ops)}) |",
        f"| nn modules (ModuleInfo forward+backward, records) | "
        f"{mods['pass'] + mods['fallback']} / {sum(mods.values()) - mods['skip']} pass "
        f"({mods['fallback']} via CPU fallback) |",
        "",
        "## Per op family",
        "",
        "An OpInfo is *native* when every checked sample of every variant and dtype matched CPU",
        "with all ATen ops lowered; *decomposed* when some ran through a PyTorch decomposition;",
        "*CPU fallback* when some ATen op ran on CPU; *fail* when any (variant, dtype) failed.",
        "",
        "| family | OpInfos | native | decomposed | CPU fallback | fail |",
        "|---|---|---|---|---|---|",
    ]
    for name in sorted(k for k in fam if k != "total") + ["total"]:
        c = fam[name]
        label = f"**{name}**" if name == "total" else name
        lines.append(f"| {label} | {sum(c.values())} | {c['native']} | {c['decomposed']} | "
                     f"{c['CPU fallback']} | {c['fail']} |")
    lines += ["", "## Ten largest gaps (by OpInfos affected)", ""]
    for i, (k, ops) in enumerate(gaps, 1):
        shown = ", ".join(sorted(ops)[:8]) + (" ..." if len(ops) > 8 else "")
        lines.append(f"{i}. {k} — {len(ops)} OpInfos ({shown})")
    lines += ["", "## Silent mismatches", "",
              "Results that differ from CPU without raising. They are never expected failures.",
              ""]
    if not silent:
        lines.append("None.")
    for r in sorted(silent, key=lambda r: (r["op"], r["variant"], r["dtype"])):
        lines.append(f"- `{r['op']}` {r['variant']} {r['dtype']}: {r['detail'][:260]}")
    lines += ["", "## Passing by the float64 reference rule", "",
              "Low-precision results not within tolerance of CPU's, but at least as close as",
              "CPU's to the same computation in float64 (PyTorch's reference tests use this rule).",
              ""]
    if not closer:
        lines.append("None.")
    for r in sorted(closer, key=lambda r: (r["op"], r["variant"], r["dtype"])):
        lines.append(f"- `{r['op']}` {r['variant']} {r['dtype']}: {r['closer_to_float64']} sample(s)")
    lines.append("")
    if args.coverage:
        # The upstream-tests section at the end belongs to tests/upstream/run.py: keep it.
        old = COVERAGE.read_text() if COVERAGE.exists() else ""
        upstream = old.find("<!-- upstream-tests:begin")
        COVERAGE.write_text("\n".join(lines) + ("\n" + old[upstream:] if upstream >= 0 else ""))
        print(f"wrote {COVERAGE.relative_to(REPO)}")
    if args.write_manifest:
        entries = manifest_entries(records)
        MANIFEST.write_text(json.dumps(entries, indent=1) + "\n")
        print(f"wrote {MANIFEST.relative_to(REPO)} ({len(entries)} expected failures)")
    print("\n".join(lines[lines.index("## The bar (issue 3)"):lines.index("## Per op family")]))
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep")
    s.add_argument("--jobs", type=int, default=2)
    s.add_argument("--budget", type=float, default=0, help="seconds; 0: no limit")
    s.add_argument("--ops", default="", help="comma-separated OpInfo/ModuleInfo names (default: all)")
    s.add_argument("--no-modules", action="store_true")
    s.add_argument("--groups", default="f32,modules,rest",
                   help="units to run: f32 (float32 OpInfo checks, grads, error_inputs), "
                        "modules (ModuleInfo), rest (every other dtype)")
    s.add_argument("--write-manifest", action="store_true")
    s.add_argument("--results", default=str(RESULTS))
    s.add_argument("--no-report", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("--results", default=str(RESULTS), help="file[,file...]: later ones win")
    r.add_argument("--write-manifest", action="store_true")
    r.add_argument("--no-coverage", dest="coverage", action="store_false")
    sub.add_parser("worker")
    a = p.parse_args()
    if a.cmd == "worker":
        worker()
        return 0
    if a.cmd == "sweep":
        return sweep(a)
    return report(a)


if __name__ == "__main__":
    sys.exit(main())
