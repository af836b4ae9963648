"""Steady-state training step (forward + backward + AdamW step): eager and compiled, CPU and neuron.

For each model (an MLP, a small CNN, a character-level GPT) every configuration gets its own
copy of the same initial weights, its own AdamW and the same fixed batch:

- `cpu eager`, `cpu inductor` (`torch.compile(model)`), `cpu inductor+opt` (the optimizer step
  compiled too),
- `neuron eager`, `neuron compiled` (`torch.compile(model, backend="neuron")`), `neuron
  compiled+opt` (the optimizer step compiled with the neuron backend too).

How it measures: the first step of each configuration is timed on its own (for the compiled
ones it includes Dynamo tracing, AOTAutograd and the XLA or C++ compilation; both compile caches
point at fresh temporary directories unless `--warm-cache`); then `--warmup` more steps. Then
`--rounds` rounds go round-robin over the configurations of one model: each round runs
`--steps` steps of each configuration back to back and divides the elapsed time by the number
of steps. The device is synchronized (`torch.neuron.synchronize()`) before the clock stops. The
table shows the median over rounds (wall clock, ms per step) and, in brackets, the median process
CPU time per step (all threads), which shared-machine load inflates less than wall time.

    python benchmarks/compile_bench.py [--models mlp,cnn,gpt] [--configs ...] [--rounds 7] [--write]

`--write` also writes the "Compiled training step" section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "BENCHMARKS.md"
SECTION = "# Compiled training step"

CONFIGS = (
    "cpu eager", "cpu inductor", "cpu inductor+opt",
    "neuron eager", "neuron compiled", "neuron compiled+opt",
)


def _fresh_caches() -> None:
    # Set before torch is imported so both compilers see them.
    root = tempfile.mkdtemp(prefix="compile_bench_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    os.environ["TORCHNEURON_CACHE_DIR"] = os.path.join(root, "neuron")


if __name__ == "__main__" and "--warm-cache" not in sys.argv:
    _fresh_caches()

import jax  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import torchneuron  # noqa: E402

sys.path.insert(0, str(REPO / "examples"))
from char_gpt import CharGPT, Config, load_text  # noqa: E402

# -- models: (description, model factory, batch factory, loss) ---------------------------------


def mlp_case():
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(128, 256, generator=g), torch.randint(0, 10, (128,), generator=g)
    return model, (x, y), lambda m, x, y: F.cross_entropy(m(x), y)


def cnn_case():
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)
    return model, (x, y), lambda m, x, y: F.cross_entropy(m(x), y)


def gpt_case():
    _, chars = load_text()
    cfg = Config(vocab_size=len(chars), block_size=128, n_layer=4, n_head=4, d_model=256,
                 batch_size=8)
    model = CharGPT(cfg)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size), generator=g)
    y = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size), generator=g)
    return model, (x, y), lambda m, x, y: m(x, y)[1]


MODELS = {
    "mlp": ("MLP 256-512-512-10, batch 128", mlp_case),
    "cnn": ("CNN 2 conv+BN (3-16-32 ch), 32x32, batch 32", cnn_case),
    "gpt": ("GPT 4 layers, d 256, 4 heads, seq 128, batch 8, vocab 66", gpt_case),
}


def synchronize(device: str) -> None:
    if device == "neuron":
        torch.neuron.synchronize()


def build_step(config: str, model: nn.Module, batch, loss_fn) -> Callable[[], object]:
    device = config.split()[0]
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    x, y = (t.to(device) for t in batch)
    run = model
    opt_step = opt.step
    if "inductor" in config:
        run = torch.compile(model)
    elif "compiled" in config:
        run = torch.compile(model, backend="neuron")
    if config.endswith("+opt"):
        backend = "neuron" if device == "neuron" else "inductor"
        opt_step = torch.compile(opt.step, backend=backend)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(run, x, y)
        loss.backward()
        opt_step()
        return loss

    return step


def measure_model(name: str, configs: list[str], args) -> dict[str, dict]:
    _, make = MODELS[name]
    torch.manual_seed(0)
    model, batch, loss_fn = make()
    results: dict[str, dict] = {}
    steps: dict[str, Callable[[], object]] = {}
    for config in configs:
        device = config.split()[0]
        try:
            step = build_step(config, model, batch, loss_fn)
            start = time.perf_counter()
            loss = step()
            synchronize(device)
            first = time.perf_counter() - start
            for _ in range(args.warmup):
                step()
            synchronize(device)
            results[config] = {"first_s": first, "loss": float(loss.detach().cpu()), "wall": [],
                               "cpu": []}
            steps[config] = step
        except Exception as err:  # one configuration failing must not hide the others
            results[config] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"}
        print(f"  {name} / {config}: first step "
              + (f"{results[config]['first_s']:.2f} s" if "error" not in results[config]
                 else results[config]["error"]), flush=True)
    n = args.steps if name == "gpt" else args.steps * 4
    for _ in range(args.rounds):
        for config, step in steps.items():
            device = config.split()[0]
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(n):
                step()
            synchronize(device)
            results[config]["wall"].append((time.perf_counter() - wall) / n * 1e3)
            results[config]["cpu"].append((time.process_time() - cpu) / n * 1e3)
    torch._dynamo.reset()
    return results


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def table(all_results: dict[str, dict[str, dict]], configs: list[str]) -> list[str]:
    rows = ["| model | " + " | ".join(configs) + " | inductor / neuron compiled |",
            "|---|" + "---:|" * (len(configs) + 1)]
    compile_rows = []
    for name, results in all_results.items():
        cells = []
        for config in configs:
            r = results[config]
            if "error" in r:
                cells.append("fails")
            else:
                cells.append(f"{statistics.median(r['wall']):.1f} ({statistics.median(r['cpu']):.0f})")
        # Issue 13's ratio: inductor's step time over neuron's (above 1: neuron is faster),
        # the +opt variants against each other when both ran, else the faster of each.
        ratio = "-"
        pair = ("cpu inductor+opt", "neuron compiled+opt")
        if all(c in configs and "error" not in results[c] for c in pair):
            inductor, neuron = (statistics.median(results[c]["wall"]) for c in pair)
            ratio = f"{inductor / neuron:.2f}"
        else:
            best_neuron = [statistics.median(results[c]["wall"]) for c in configs
                           if c.startswith("neuron compiled") and "error" not in results[c]]
            best_inductor = [statistics.median(results[c]["wall"]) for c in configs
                             if c.startswith("cpu inductor") and "error" not in results[c]]
            if best_neuron and best_inductor:
                ratio = f"{min(best_inductor) / min(best_neuron):.2f}"
        rows.append(f"| {MODELS[name][0]} | " + " | ".join(cells) + f" | {ratio} |")
        firsts = [f"{results[c]['first_s']:.1f}" if "error" not in results[c] else "fails"
                  for c in configs]
        compile_rows.append(f"| {MODELS[name][0]} | " + " | ".join(firsts) + " |")
    out = ["Steady-state step, ms per step: median wall clock over rounds (median process CPU ms "
           "per step, all threads, in brackets). Last column: inductor's step time over neuron's, "
           "wall clock (issue 13's ratio, above 1 when neuron is faster): `cpu inductor+opt` over "
           "`neuron compiled+opt` when both ran, else the faster variant of each.", "", *rows, "",
           "First step (s), which includes compilation for the compiled variants:", "",
           "| model | " + " | ".join(configs) + " |", "|---|" + "---:|" * len(configs),
           *compile_rows]
    return out


def header(command: str, load_start, load_end, args) -> list[str]:
    return [
        f"- machine: {os.cpu_count()} cores, {cpu_model()}, {platform.system()} {platform.machine()}; "
        f"torch intra-op threads {torch.get_num_threads()}",
        f"- load average (1 min) at start {load_start:.2f}, at end {load_end:.2f}: other "
        "processes shared these cores whenever it was above 0; absolute times are inflated by "
        "about that factor over the core count, compare within a row",
        f"- python {platform.python_version()}, torch {torch.__version__}, jax {jax.__version__}, "
        f"torchneuron {torchneuron.__version__}, PJRT platform `{torchneuron.platform_name()}`",
        f"- method: {args.rounds} rounds round-robin over the configurations of a model, "
        f"{args.steps} steps per round for the GPT ({args.steps * 4} for the others), after "
        f"{args.warmup} warm-up steps; AdamW (lr 1e-3, weight decay 0.01), fixed batch, "
        "`opt.zero_grad(set_to_none=True)` every step; compile caches "
        + ("warm (`--warm-cache`)" if args.warm_cache else "fresh temporary directories"),
        f"- command: `{command}`",
        f"- date: {datetime.date.today().isoformat()}",
    ]


def write_doc(lines: list[str]) -> None:
    text = DOC.read_text() if DOC.exists() else ""
    section = "\n".join([SECTION, "", *lines]) + "\n"
    if SECTION in text:
        before, rest = text.split(SECTION, 1)
        # The generated part runs to the next heading: the notes kept under their own
        # subheadings (levers tried, other benchmarks) stay.
        nxt = rest.find("\n#")
        after = rest[nxt + 1:] if nxt >= 0 else ""
        text = before + section + ("\n" + after if after else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    DOC.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn,gpt")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help="comma-separated subset of: " + ", ".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="GPT steps per round (x4 for others)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--warm-cache", action="store_true",
                        help="keep the usual compile cache directories")
    parser.add_argument("--write", action="store_true", help=f"also write {DOC.relative_to(REPO)}")
    args = parser.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}")
    command = "python " + " ".join(
        shlex.quote(a) for a in [f"benchmarks/{Path(__file__).name}", *sys.argv[1:]]
    )
    warnings.filterwarnings("ignore", category=UserWarning)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    all_results = {}
    for name in args.models.split(","):
        all_results[name] = measure_model(name, configs, args)
    load_end = os.getloadavg()[0]
    lines = header(command, load_start, load_end, args) + [""] + table(all_results, configs)
    notes = []
    for name, results in all_results.items():
        for config, r in results.items():
            if "error" in r:
                notes.append(f"- {name} / {config} fails: `{r['error']}`")
    notes.append("- first steps run in configuration order within one process: a `+opt` variant "
                 "compiles the same model graphs as the variant before it, so their compile "
                 "caches (fresh for the run) are already warm for the model part")
    notes.append("- multi-threaded torch CPU kernels (OpenMP) slow down far more than XLA's thread "
                 "pool when the cores are oversubscribed (load average above the core count); "
                 "on such a machine the CPU columns are inflated well beyond the load factor")
    stats = torchneuron.compile_stats()
    notes.append(f"- neuron compile backend counters at the end: eager fallbacks "
                 f"{stats['eager_fallbacks']}, XLA compilations {stats['xla_compilations']}")
    fallbacks = torchneuron.fallback_ops()
    notes.append("- ops that fell back to CPU on the neuron device: "
                 + (", ".join(f"`{k}` ({v})" for k, v in sorted(fallbacks.items())) or "none"))
    lines += [""] + notes
    print("\n".join(lines))
    if args.write:
        write_doc(lines)
        print(f"wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
