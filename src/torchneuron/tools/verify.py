"""`torchneuron verify SCRIPT [ARGS...]`: the same script on CPU and on neuron, losses compared.

Each run is a child process that executes `launch.py` by path: 'cuda' and 'neuron' device
specs in the script go to that run's device (see launch.py). The CPU run has the neuron
backend unloaded (TORCH_DEVICE_BACKEND_AUTOLOAD=0), so `torch.accelerator` code picks the CPU
there. Loss values come from the script's output (one per line that matches `--loss-regex`)
or from the value of a `--call` expression.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# 'loss: 1.23', 'loss 1.23', 'loss=1.23', "'loss': 1.23", 'train_loss = 1.2e-3', 'Loss: nan';
# not 'val_loss'/'eval_loss' (only the first match on a line counts).
DEFAULT_LOSS_REGEX = (
    r"(?<![A-Za-z])(?<!val_)(?i:loss)['\"]?\s*[:=]?\s*"
    r"(?P<loss>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
)

EXIT_AGREE, EXIT_DISAGREE, EXIT_USAGE, EXIT_RUN_FAILED = 0, 1, 2, 3

LAUNCH = Path(__file__).with_name("launch.py")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "verify", help="run a script on CPU and on neuron and compare the losses it reports",
        description="Run SCRIPT twice, on CPU and on neuron, capture the loss it prints at each "
        "step (or the value of --call), and write a report: both loss curves side by side, the "
        "largest relative difference, the ops that fell back to CPU, time per step, and a PNG "
        "plot. 'cuda' and 'neuron' device strings in the script go to each run's device. Exit "
        "status: 0 the runs agree within the tolerance, 1 they differ, 2 misuse, 3 a run failed "
        "or reported no loss. Options go before SCRIPT.",
    )
    p.add_argument("--loss-regex", default=DEFAULT_LOSS_REGEX,
                   help="regular expression for one loss value in a line of output: the group "
                   "named 'loss', else group 1, else the whole match (default: recognises "
                   "'loss: X', 'loss X', 'loss=X', \"'loss': X\", 'train_loss = X')")
    p.add_argument("--call", metavar="EXPR",
                   help="instead of parsing output: import SCRIPT (not as __main__) and evaluate "
                   "EXPR in its namespace, with `device` bound to 'cpu' or 'neuron'; it returns "
                   "the losses (list, tensor, or dict with 'loss'/'losses'). "
                   "Example: --call 'train(device, 10)'")
    p.add_argument("--rtol", type=float, default=1e-3,
                   help="relative tolerance per step (default: %(default)s)")
    p.add_argument("--atol", type=float, default=1e-6,
                   help="absolute tolerance per step (default: %(default)s)")
    p.add_argument("--out", default="torchneuron-verify",
                   help="report directory: report.md, report.json, losses.png (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds each run may take (default: no limit)")
    p.add_argument("--quiet", action="store_true",
                   help="do not echo the script's output (a progress line per loss is still shown)")
    p.add_argument("script", metavar="SCRIPT", help="the Python script, followed by its arguments")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")
    return p


def parse_losses(lines: list[tuple[float, str]], pattern: re.Pattern) -> list[tuple[float, float]]:
    """(time, line) pairs -> (time, loss) for each line with a match."""
    found = []
    for t, line in lines:
        m = pattern.search(line)
        if m is None:
            continue
        if "loss" in pattern.groupindex:
            text = m.group("loss")
        elif pattern.groups:
            text = m.group(1)
        else:
            text = m.group(0)
        try:
            found.append((t, float(text)))
        except (TypeError, ValueError):
            continue
    return found


def _run_child(device: str, args: argparse.Namespace, record_path: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if device == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    cmd = [sys.executable, str(LAUNCH), device, record_path, args.call or "", args.script, *args.args]
    start = time.perf_counter()
    lines: list[tuple[float, str]] = []
    pattern = re.compile(args.loss_regex)
    n_losses = 0
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, bufsize=1)
    timed_out = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.perf_counter() - start
            line = line.rstrip("\n")
            lines.append((now, line))
            if not args.quiet:
                print(f"[{device}] {line}", flush=True)
            elif not args.call and parse_losses([(now, line)], pattern):
                n_losses += 1
                print(f"[{device}] {n_losses} loss value(s), {now:.1f} s", flush=True)
            if args.timeout and now > args.timeout:
                timed_out = True
                proc.kill()
                break
        proc.wait(timeout=None if not timed_out else 10)
    except KeyboardInterrupt:
        proc.kill()
        raise
    wall = time.perf_counter() - start
    record: dict[str, Any] = {}
    if os.path.exists(record_path):
        with open(record_path) as f:
            record = json.load(f)
    record["exit_code"] = proc.returncode
    record["timed_out"] = timed_out
    record["process_wall_s"] = wall
    if args.call:
        values = record.get("returned") or []
        record["losses"] = values
        record["loss_times"] = None
    else:
        parsed = parse_losses(lines, pattern)
        record["losses"] = [v for _, v in parsed]
        record["loss_times"] = [t for t, _ in parsed]
    record["output_tail"] = [line for _, line in lines[-30:]]
    return record


def _step_times(record: dict[str, Any]) -> list[float] | None:
    times = record.get("loss_times")
    if not times:
        return None
    return [b - a for a, b in zip(times, times[1:])]


def _rel(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.inf
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), 1e-12)


def compare(cpu: list[float], neuron: list[float], rtol: float, atol: float) -> dict[str, Any]:
    n = min(len(cpu), len(neuron))
    rows = []
    worst, worst_step, ok = 0.0, None, len(cpu) == len(neuron) and n > 0
    for i in range(n):
        a, b = cpu[i], neuron[i]
        rel = _rel(a, b)
        within = not (math.isnan(a) or math.isnan(b)) and abs(a - b) <= atol + rtol * abs(a)
        ok = ok and within
        if rel > worst or worst_step is None:
            worst, worst_step = rel, i
        rows.append({"step": i, "cpu": a, "neuron": b, "abs_diff": abs(a - b), "rel_diff": rel,
                     "within": within})
    return {"rows": rows, "max_rel_diff": worst if n else None, "max_rel_step": worst_step,
            "agree": ok, "steps_cpu": len(cpu), "steps_neuron": len(neuron)}


def _fmt_time(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


def _plot(path: Path, cpu: list[float], neuron: list[float], title: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'matplotlib>=3.8,<4'): no plot"
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    top.plot(range(len(cpu)), cpu, "o-", label="cpu", markersize=3)
    top.plot(range(len(neuron)), neuron, "x--", label="neuron", markersize=4)
    top.set_ylabel("loss")
    top.set_title(title, fontsize=10)
    top.legend()
    top.grid(alpha=0.3)
    n = min(len(cpu), len(neuron))
    rel = [max(_rel(cpu[i], neuron[i]), 1e-12) for i in range(n)]
    rel = [r if math.isfinite(r) else 1.0 for r in rel]
    bottom.semilogy(range(n), rel, ".-", color="tab:red")
    bottom.set_ylabel("relative diff\n(floor 1e-12)")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def write_report(out: Path, args: argparse.Namespace, cpu: dict, neuron: dict, result: dict) -> list[str]:
    """report.md, report.json, losses.png in `out`; returns notes to print."""
    out.mkdir(parents=True, exist_ok=True)
    notes = []
    command = " ".join([args.script, *args.args])
    cpu_steps, neuron_steps = _step_times(cpu), _step_times(neuron)
    counts = neuron.get("op_counts") or {}
    fallback = counts.get("fallback", {})
    summary = {
        "script": command,
        "call": args.call,
        "rtol": args.rtol,
        "atol": args.atol,
        "agree": result["agree"],
        "max_rel_diff": result["max_rel_diff"],
        "max_rel_step": result["max_rel_step"],
        "steps": {"cpu": result["steps_cpu"], "neuron": result["steps_neuron"]},
        "rows": result["rows"],
        "wall_s": {"cpu": cpu.get("process_wall_s"), "neuron": neuron.get("process_wall_s")},
        "step_time_s": {
            "cpu": {"median": statistics.median(cpu_steps) if cpu_steps else None, "per_step": cpu_steps},
            "neuron": {"median": statistics.median(neuron_steps) if neuron_steps else None,
                       "per_step": neuron_steps},
        },
        "fallback_ops": fallback,
        "op_counts": counts,
        "exit_codes": {"cpu": cpu.get("exit_code"), "neuron": neuron.get("exit_code")},
    }
    png_note = _plot(out / "losses.png", [r["cpu"] for r in result["rows"]] or cpu["losses"],
                     [r["neuron"] for r in result["rows"]] or neuron["losses"],
                     f"torchneuron verify: {command}")
    if png_note:
        notes.append(png_note)
    summary["plot"] = None if png_note else "losses.png"
    (out / "report.json").write_text(json.dumps(summary, indent=1))

    md = [f"# torchneuron verify: `{command}`", ""]
    verdict = "AGREE" if result["agree"] else "DIFFER"
    md.append(f"**{verdict}** within rtol={args.rtol:g}, atol={args.atol:g} "
              f"({result['steps_cpu']} CPU steps, {result['steps_neuron']} neuron steps).")
    if result["max_rel_diff"] is not None:
        md.append(f"Largest relative difference: {result['max_rel_diff']:.3e} at step "
                  f"{result['max_rel_step']}.")
    md.append("")
    if not png_note:
        md += ["![loss curves](losses.png)", ""]
    md += ["| step | cpu loss | neuron loss | rel diff | cpu step time | neuron step time |",
           "|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        i = r["step"]
        ct = cpu_steps[i - 1] if cpu_steps and 0 < i <= len(cpu_steps) else None
        nt = neuron_steps[i - 1] if neuron_steps and 0 < i <= len(neuron_steps) else None
        mark = "" if r["within"] else " **x**"
        md.append(f"| {i} | {r['cpu']:.6g} | {r['neuron']:.6g} | {r['rel_diff']:.2e}{mark} | "
                  f"{_fmt_time(ct)} | {_fmt_time(nt)} |")
    md += ["", "## Time", ""]
    for name, rec, steps in (("cpu", cpu, cpu_steps), ("neuron", neuron, neuron_steps)):
        med = statistics.median(steps) if steps else None
        md.append(f"- {name}: process {rec.get('process_wall_s', 0):.1f} s, median step "
                  f"{_fmt_time(med)} (steps after the first; the first includes start-up and "
                  "compilation)")
    md += ["", "## Ops that fell back to CPU", ""]
    if fallback:
        md += [f"- `{op}`: {n} call(s)" for op, n in sorted(fallback.items(), key=lambda kv: -kv[1])]
    elif counts:
        md.append("none")
    else:
        md.append("unknown (the neuron run recorded no op counts)")
    if counts:
        md += ["", f"Ops on neuron: {len(counts.get('native', {}))} native, "
               f"{len(counts.get('decomposed', {}))} decomposed, {len(fallback)} fell back."]
    (out / "report.md").write_text("\n".join(md) + "\n")
    return notes


def cmd_verify(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not os.path.isfile(args.script):
        parser.error(f"script not found: {args.script}")
    try:
        re.compile(args.loss_regex)
    except re.error as err:
        parser.error(f"--loss-regex is not a valid regular expression: {err}")
    if args.rtol < 0 or args.atol < 0:
        parser.error("--rtol and --atol must be >= 0")
    records = {}
    with tempfile.TemporaryDirectory(prefix="torchneuron-verify-") as tmp:
        for n, device in enumerate(("cpu", "neuron"), 1):
            print(f"== run {n}/2: {device} ==", flush=True)
            records[device] = _run_child(device, args, os.path.join(tmp, f"{device}.json"))
            rec = records[device]
            print(f"== {device}: exit status {rec['exit_code']}, {len(rec['losses'])} loss value(s), "
                  f"{rec['process_wall_s']:.1f} s ==", flush=True)
    failed = [d for d, r in records.items() if r["exit_code"] != 0 or r["timed_out"]]
    empty = [d for d, r in records.items() if not r["losses"]]
    cpu, neuron = records["cpu"], records["neuron"]
    result = compare(cpu["losses"], neuron["losses"], args.rtol, args.atol)
    out = Path(args.out)
    notes = write_report(out, args, cpu, neuron, result)
    for note in notes:
        print(f"torchneuron verify: {note}", file=sys.stderr)
    print()
    print(f"report: {out / 'report.md'} (also report.json, losses.png)")
    if failed:
        for d in failed:
            why = "timed out" if records[d]["timed_out"] else f"exited with status {records[d]['exit_code']}"
            print(f"torchneuron verify: the {d} run {why}; last output:", file=sys.stderr)
            for line in records[d]["output_tail"][-10:]:
                print(f"  [{d}] {line}", file=sys.stderr)
        return EXIT_RUN_FAILED
    if empty:
        how = "--call returned nothing" if args.call else (
            "no output line matched --loss-regex; print 'loss: X' per step, or pass --loss-regex "
            "or --call")
        print(f"torchneuron verify: no loss values from the {' and '.join(empty)} run: {how}",
              file=sys.stderr)
        return EXIT_RUN_FAILED
    fb = neuron.get("op_counts", {}) or {}
    fallback = fb.get("fallback", {})
    print(f"steps: cpu {result['steps_cpu']}, neuron {result['steps_neuron']}; largest relative "
          f"difference {result['max_rel_diff']:.3e} at step {result['max_rel_step']}")
    if fallback:
        print("ops that fell back to CPU: " + ", ".join(f"{k} ({v})" for k, v in sorted(fallback.items())))
    if result["agree"]:
        print(f"AGREE within rtol={args.rtol:g}, atol={args.atol:g}")
        return EXIT_AGREE
    if result["steps_cpu"] != result["steps_neuron"]:
        print(f"DIFFER: {result['steps_cpu']} CPU steps but {result['steps_neuron']} neuron steps")
    else:
        bad = [r["step"] for r in result["rows"] if not r["within"]]
        print(f"DIFFER beyond rtol={args.rtol:g}, atol={args.atol:g} at {len(bad)} step(s): "
              f"{bad[:10]}{' ...' if len(bad) > 10 else ''}")
    return EXIT_DISAGREE
