"""The `torchneuron` command: doctor, run, verify, ops.

    torchneuron doctor                   versions, platform, registration, a short self-test
    torchneuron run SCRIPT [ARGS...]     run a CUDA script on neuron, unmodified
    torchneuron verify SCRIPT [ARGS...]  run a script on CPU and on neuron, compare the losses
    torchneuron ops [--json] [SCRIPT [ARGS...]]
                                         which ATen ops ran natively, decomposed, or on CPU

See docs/CLI.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .. import config

EXIT_USAGE = 2

DESCRIPTION = "Tools for the torchneuron `neuron` device for PyTorch."


def default_ops_file() -> Path:
    """Where `run` leaves the op counts of its last script for `ops`."""
    return config.cache_root() / "last-run-ops.json"


def _check_script(parser: argparse.ArgumentParser, script: str) -> None:
    if not os.path.isfile(script):
        parser.error(f"script not found: {script}")


# -- doctor ---------------------------------------------------------------------------------


def _entry_point(group: str, name: str) -> str | None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=group):
        if ep.name == name:
            return ep.value
    return None


def _self_test(budget_s: float) -> list[tuple[str, bool, str, float]]:
    """Small checks against CPU; each returns (name, ok, detail, seconds)."""
    import torch

    results = []

    def check(name, fn):
        start = time.perf_counter()
        print(f"  {name} ...", end=" ", flush=True)
        try:
            detail = fn() or ""
            ok = True
        except Exception as err:  # a failing check is reported, not raised
            ok, detail = False, f"{type(err).__name__}: {str(err)[:200]}"
        seconds = time.perf_counter() - start
        print(("ok" if ok else "FAILED") + f" ({seconds:.1f} s){' ' + detail if detail else ''}", flush=True)
        results.append((name, ok, detail, seconds))

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(32, 32, generator=gen)
    b = torch.randn(32, 32, generator=gen)

    def copy_round_trip():
        t = a.to("neuron")
        assert t.device.type == "neuron"
        assert torch.equal(t.cpu(), a)

    def elementwise():
        torch.testing.assert_close((a.to("neuron").sin() * 2 + 1).cpu(), a.sin() * 2 + 1)

    def matmul():
        torch.testing.assert_close((a.to("neuron") @ b.to("neuron")).cpu(), a @ b, rtol=1e-4, atol=1e-4)

    def training_step():
        def step(device):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
            model = model.to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x, y = a.to(device), b[:, :1].to(device)
            losses = []
            for _ in range(3):
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return losses

        neuron, cpu = step("neuron"), step("cpu")
        torch.testing.assert_close(neuron, cpu, rtol=1e-4, atol=1e-6)
        return f"losses {', '.join(f'{v:.4f}' for v in neuron)}"

    def autocast():
        with torch.autocast("neuron", dtype=torch.bfloat16):
            out = a.to("neuron") @ b.to("neuron")
        assert out.dtype == torch.bfloat16, out.dtype

    start = time.perf_counter()
    for name, fn in (
        ("copy to the device and back", copy_round_trip),
        ("elementwise ops vs CPU", elementwise),
        ("matmul vs CPU", matmul),
        ("3 SGD steps of an MLP vs CPU", training_step),
        ("autocast bfloat16", autocast),
    ):
        if time.perf_counter() - start > budget_s:
            results.append((name, False, "skipped: time budget spent", 0.0))
            print(f"  {name} ... skipped (time budget of {budget_s:.0f} s spent)")
            continue
        check(name, fn)
    return results


def cmd_doctor(args: argparse.Namespace) -> int:
    print("torchneuron doctor")
    t0 = time.perf_counter()
    print("importing torch ...", flush=True)
    import torch

    autoloaded = torch._C._get_privateuse1_backend_name() == "neuron"
    import jax

    import torchneuron
    from torchneuron.runtime import platform

    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "jax": jax.__version__,
        "jaxlib": getattr(__import__("jaxlib"), "__version__", "?"),
        "torchneuron": torchneuron.__version__,
        "torchneuron_path": os.path.dirname(torchneuron.__file__),
    }
    for key, value in report.items():
        print(f"{key:>18}: {value}")
    ok = True
    try:
        devices = platform.jax_devices()
        print(f"{'PJRT platform':>18}: {torchneuron.platform_name()}")
        for i, dev in enumerate(devices):
            print(f"{'':>18}  neuron:{i} -> {dev} ({getattr(dev, 'device_kind', dev.platform)})")
    except Exception as err:
        ok = False
        print(f"{'PJRT platform':>18}: UNAVAILABLE: {err}")
    backend_ep = _entry_point("torch.backends", "torchneuron")
    autoload_env = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
    print(
        f"{'autoload':>18}: entry point {'registered' if backend_ep else 'MISSING'}"
        f" ({backend_ep}); TORCH_DEVICE_BACKEND_AUTOLOAD={autoload_env}; "
        f"device {'loaded by import torch' if autoloaded else 'NOT loaded by import torch'}"
    )
    if not backend_ep or not autoloaded:
        ok = ok and autoload_env == "0"  # autoload turned off on purpose is not a failure
    compile_ep = _entry_point("torch_dynamo_backends", "neuron")
    print(f"{'compile backend':>18}: torch.compile(backend='neuron') entry point "
          f"{'registered' if compile_ep else 'MISSING'} ({compile_ep})")
    ok = ok and compile_ep is not None
    print(f"{'accelerator':>18}: {torch.accelerator.current_accelerator()}")
    print(f"{'amp dtypes':>18}: {torch.neuron.get_amp_supported_dtype()}")
    if args.no_self_test:
        print("self-test skipped (--no-self-test)")
    else:
        print(f"self-test (at most {args.budget:.0f} s; first calls include XLA compilation):")
        results = _self_test(args.budget)
        ok = ok and all(r[1] for r in results)
    print(f"\n{'all checks passed' if ok else 'SOME CHECKS FAILED'} ({time.perf_counter() - t0:.1f} s)")
    return 0 if ok else 1


# -- run / ops ------------------------------------------------------------------------------


def _summarise(counts: dict[str, dict[str, int]]) -> str:
    parts = []
    for path in ("native", "decomposed", "fallback"):
        ops = counts.get(path, {})
        parts.append(f"{len(ops)} {path} ({sum(ops.values())} calls)")
    return ", ".join(parts)


def _run_with_remap(script: str, script_args: list[str], remap: bool) -> tuple[int, dict]:
    import torchneuron
    from torchneuron.tools import launch

    torchneuron.reset_op_counts()
    if remap:
        launch.install("neuron")
    try:
        status = launch.run_script(script, script_args)
    finally:
        if remap:
            launch.uninstall()
    return status, torchneuron.op_counts()


def _save_counts(path: Path, script: str, script_args: list[str], status: int, counts: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"script": os.path.abspath(script), "args": script_args, "status": status,
            "time": time.time(), "op_counts": counts}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def cmd_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _check_script(parser, args.script)
    status, counts = _run_with_remap(args.script, args.args, remap=not args.no_cuda_remap)
    ops_file = Path(args.ops_file) if args.ops_file else default_ops_file()
    try:
        _save_counts(ops_file, args.script, args.args, status, counts)
        where = f"; `torchneuron ops` lists them ({ops_file})"
    except OSError as err:
        where = f"; could not save them to {ops_file}: {err}"
    print(f"torchneuron: ops on neuron: {_summarise(counts)}{where}", file=sys.stderr)
    return status


def format_ops(counts: dict[str, dict[str, int]]) -> str:
    lines = [f"{'path':<11} {'calls':>8}  op"]
    for path in ("native", "decomposed", "fallback"):
        for name, calls in sorted(counts.get(path, {}).items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"{path:<11} {calls:>8}  {name}")
    lines.append("")
    lines.append(f"total: {_summarise(counts)}")
    fallback = counts.get("fallback", {})
    if fallback:
        lines.append("ops that fell back to CPU: " + ", ".join(sorted(fallback)))
    return "\n".join(lines)


def cmd_ops(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    status = 0
    if args.script:
        _check_script(parser, args.script)
        # The script's own output must not mix with --json output on stdout.
        stdout = sys.stdout
        if args.json:
            sys.stdout = sys.stderr
        try:
            status, counts = _run_with_remap(args.script, args.args, remap=not args.no_cuda_remap)
        finally:
            sys.stdout = stdout
        source = f"{args.script} (exit status {status})"
    else:
        ops_file = Path(args.ops_file) if args.ops_file else default_ops_file()
        if not ops_file.exists():
            print(f"torchneuron ops: no recorded run in {ops_file}; run a script first with "
                  "`torchneuron run SCRIPT`, or give one: `torchneuron ops SCRIPT [ARGS...]`",
                  file=sys.stderr)
            return EXIT_USAGE
        data = json.loads(ops_file.read_text())
        counts = data["op_counts"]
        source = f"{data['script']} {' '.join(data['args'])} (recorded by torchneuron run)".replace("  ", " ")
    if args.json:
        print(json.dumps({"source": source, "op_counts": counts}, indent=1, sort_keys=True))
    else:
        print(f"ops of {source}")
        print(format_ops(counts))
    return status


# -- parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchneuron", description=DESCRIPTION,
        epilog="Run `torchneuron COMMAND --help` for the options of each command.",
    )
    from torchneuron import __version__

    parser.add_argument("--version", action="version", version=f"torchneuron {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    doctor = sub.add_parser(
        "doctor", help="versions, PJRT platform and devices, registration, and a short self-test",
        description="Print the versions of torch, jax and torchneuron, the PJRT platform and its "
        "devices, whether `import torch` loads the device and torch.compile knows the 'neuron' "
        "backend, then run a short self-test against CPU. Exit status 0 when all checks pass.",
    )
    doctor.add_argument("--no-self-test", action="store_true", help="only print the configuration")
    doctor.add_argument("--budget", type=float, default=10.0,
                        help="seconds the self-test may take (default: %(default)s)")

    script_help = "the Python script to run, followed by its own arguments"
    run = sub.add_parser(
        "run", help="run a script written for CUDA on the neuron device, unmodified",
        description="Run SCRIPT as __main__ with 'cuda' device strings, torch.device('cuda'), "
        ".cuda(), torch.cuda.* calls, torch.autocast('cuda') and torch.cuda.amp sent to the "
        "neuron device. docs/CLI.md lists exactly what is remapped. The exit status is the "
        "script's. Options of `run` go before SCRIPT; everything after SCRIPT is the script's.",
    )
    run.add_argument("--no-cuda-remap", action="store_true",
                     help="run the script as it is (it must use 'neuron' itself)")
    run.add_argument("--ops-file", help=f"where to save the op counts (default: {default_ops_file()})")
    run.add_argument("script", metavar="SCRIPT", help=script_help)
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")

    from torchneuron.tools import verify

    verify.add_parser(sub)

    ops = sub.add_parser(
        "ops", help="which ATen ops ran natively, through decompositions, or on CPU",
        description="Without SCRIPT: the op counts recorded by the last `torchneuron run`. With "
        "SCRIPT: run it on neuron (as `run` does) and print its op counts.",
    )
    ops.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ops.add_argument("--ops-file", help=f"recorded counts to read (default: {default_ops_file()})")
    ops.add_argument("--no-cuda-remap", action="store_true", help="with SCRIPT: as for `run`")
    ops.add_argument("script", metavar="SCRIPT", nargs="?", help=script_help)
    ops.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `torchneuron ops | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    subparser = parser._subparsers._group_actions[0].choices[args.command]
    if args.command == "doctor":
        return cmd_doctor(args)
    if args.command == "run":
        return cmd_run(args, subparser)
    if args.command == "ops":
        return cmd_ops(args, subparser)
    if args.command == "verify":
        from torchneuron.tools import verify

        return verify.cmd_verify(args, subparser)
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
