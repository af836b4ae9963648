"""Eager mode on the neuron device against CPU eager: training steps, first steps, new shapes.

Parts (each measured as described, and printed with the command and the load average at start
and end):

- `steps`: steady-state training step, ms per step, for the GPT of examples/char_gpt.py
  (4 layers, d 256, 4 heads, seq 128, batch 8, AdamW) and an MLP (10 x Linear 64 + ReLU,
  batch 64, forward + backward + SGD). Configurations, interleaved round-robin in one process
  (`--rounds` rounds of `--steps` steps each, median reported): `cpu` (torch's default
  threads), `cpu 1 thread`, `neuron` (adaptive eager, the default) and `neuron op-by-op`
  (TORCHNEURON_FUSION off). Each configuration gets its own copy of the same initial weights.
- `steps-isolated`: the same steps, each configuration of each round in a fresh process. In one
  process, the 2-thread CPU step slows down after neuron runs (XLA's worker threads and
  OpenMP's compete for the 2 cores: the MLP step 0.77 ms alone, 3.2 ms interleaved), which
  flatters neuron; this part's ratios are the ones to quote.
- `first-step`: the first training step of a tiny Hugging Face Llama (2 layers, hidden 64,
  AdamW) in a fresh process: with an empty cache directory (cold), then again with the cache
  the first run left (warm).
- `shapes`: a loop over `--sizes` sizes of a four-op chain (`(ones(n, 3) * 2 + 1).sum(0)`), in a
  fresh process: resident memory growth and wall time.
- `generate`: Hugging Face `generate()` on a tiny GPT-2 (2 layers, n_embd 64), 32 new tokens,
  cold cache, first and second call, against CPU.

    python benchmarks/eager_bench.py [--parts steps,steps-isolated,first-step,shapes,generate] [--write]

`--write` also writes the "Eager mode" section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "BENCHMARKS.md"
SECTION = "# Eager mode"


def _fresh_cache_env() -> dict:
    """An empty cache directory (no compiled executables, no JAX cache) holding only the C++
    library this install already built: a cold start, not a first install."""
    import shutil

    from torchneuron.runtime import _native

    root = Path(tempfile.mkdtemp(prefix="eager_bench_"))
    library = _native.library_path()
    if library.exists():
        (root / "ext").mkdir()
        shutil.copy2(library, root / "ext" / library.name)
    return {**os.environ, "TORCHNEURON_CACHE_DIR": str(root)}


def _run_child(code: str, env: dict, timeout: int = 1800) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- steady-state steps -------------------------------------------------------------------------


def _models():
    import torch
    import torch.nn.functional as F
    from torch import nn

    sys.path.insert(0, str(REPO / "examples"))
    from char_gpt import CharGPT, Config, load_text

    def gpt():
        _, chars = load_text()
        cfg = Config(vocab_size=len(chars), block_size=128, n_layer=4, n_head=4, d_model=256,
                     batch_size=8)
        torch.manual_seed(0)
        model = CharGPT(cfg)
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, cfg.vocab_size, (8, 128), generator=g)
        y = torch.randint(0, cfg.vocab_size, (8, 128), generator=g)
        return model, (x, y), lambda m, x, y: m(x, y)[1], lambda p: torch.optim.AdamW(p, lr=1e-3)

    def mlp():
        torch.manual_seed(0)
        layers = []
        for _ in range(10):
            layers += [nn.Linear(64, 64), nn.ReLU()]
        model = nn.Sequential(*layers)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
        return model, (x, y), lambda m, x, y: F.mse_loss(m(x), y), lambda p: torch.optim.SGD(p, lr=0.01)

    return {"GPT 4 layers, d 256, seq 128, batch 8, AdamW": gpt,
            "MLP 10 x Linear 64 + ReLU, batch 64, SGD": mlp}


_STEP_CONFIGS = ["cpu", "cpu 1 thread", "neuron", "neuron op-by-op"]


def _steps_header() -> list[str]:
    return ["| model | " + " | ".join(f"{c} (ms)" for c in _STEP_CONFIGS)
            + " | neuron / cpu | neuron / cpu 1 thread |",
            "|---|" + "---:|" * (len(_STEP_CONFIGS) + 2)]


def _steps_row(name: str, times: dict[str, list[float]]) -> str:
    """A table row: the median ms per step of each configuration, then neuron's ratios."""
    med = {c: statistics.median(t) for c, t in times.items()}
    cells = " | ".join(f"{med[c]:.2f}" for c in _STEP_CONFIGS)
    return (f"| {name} | {cells} | {med['neuron'] / med['cpu']:.2f} | "
            f"{med['neuron'] / med['cpu 1 thread']:.2f} |")


_STEP_CHILD = """
    import json, sys
    sys.path.insert(0, {bench_dir!r})
    import eager_bench
    print(json.dumps(eager_bench.time_one_config({name!r}, {config!r}, {steps})))
"""


def time_one_config(name: str, config: str, steps: int) -> float:
    """ms per step of one model and configuration in this process, after warm-up steps (3 for
    the GPT, 30 for the MLP: past the step where its fused program starts packing scalars)."""
    import torch

    from torchneuron.runtime import fusion

    model, batch, loss_fn, make_opt = _models()[name]()
    device = config.split()[0]
    if config == "cpu 1 thread":
        torch.set_num_threads(1)
    fusion.set_enabled(config == "neuron")
    model = model.to(device)
    opt = make_opt(list(model.parameters()))
    x, y = (t.to(device) for t in batch)
    n = steps if name.startswith("GPT") else steps * 10

    def run(count):
        for _ in range(count):
            opt.zero_grad(set_to_none=True)
            loss_fn(model, x, y).backward()
            opt.step()
        if device == "neuron":
            torch.neuron.synchronize()

    run(3 if name.startswith("GPT") else 30)  # warm-up: compiles, and packs scalars
    start = time.perf_counter()
    run(n)
    return (time.perf_counter() - start) / n * 1e3


def measure_steps_isolated(args) -> list[str]:
    """As `steps`, but every (round, model, configuration) in a fresh process, so that one
    configuration's threads (XLA's pool, OpenMP's) cannot slow the next one down."""
    configs = _STEP_CONFIGS
    rows = _steps_header()
    for name in _models():
        times = {c: [] for c in configs}
        for _ in range(args.rounds):
            for config in configs:
                code = _STEP_CHILD.format(bench_dir=str(Path(__file__).resolve().parent),
                                          name=name, config=config, steps=args.steps)
                times[config].append(_run_child(code, dict(os.environ)))
        rows.append(_steps_row(name, times))
        print(rows[-1], flush=True)
    notes = [f"- median of {args.rounds} rounds; each round runs every configuration in its own "
             f"fresh process, one after another: {args.steps} GPT steps ({args.steps * 10} MLP "
             "steps) after 3 (30) warm-up steps"]
    return rows + [""] + notes


def measure_steps(args) -> list[str]:
    import torch

    from torchneuron.runtime import fusion

    configs = _STEP_CONFIGS
    default_threads = torch.get_num_threads()
    rows = _steps_header()

    def context(config):
        torch.set_num_threads(1 if config == "cpu 1 thread" else default_threads)
        fusion.set_enabled(config == "neuron")

    for name, make in _models().items():
        model, batch, loss_fn, make_opt = make()
        steps = {}
        for config in configs:
            device = config.split()[0]
            m = copy.deepcopy(model).to(device)
            opt = make_opt(list(m.parameters()))
            x, y = (t.to(device) for t in batch)

            def step(m=m, opt=opt, x=x, y=y, loss_fn=loss_fn):
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(m, x, y)
                loss.backward()
                opt.step()
                return loss

            context(config)
            for _ in range(3):  # warm-up (compiles)
                step()
            if device == "neuron":
                torch.neuron.synchronize()
            steps[config] = step
        times = {c: [] for c in configs}
        n = args.steps if name.startswith("GPT") else args.steps * 10
        for _ in range(args.rounds):
            for config, step in steps.items():
                context(config)
                start = time.perf_counter()
                for _ in range(n):
                    step()
                if config.startswith("neuron"):
                    torch.neuron.synchronize()
                times[config].append((time.perf_counter() - start) / n * 1e3)
        rows.append(_steps_row(name, times))
        print(rows[-1], flush=True)
    torch.set_num_threads(default_threads)
    fusion.configure()
    notes = [f"- median of {args.rounds} rounds, interleaved; {args.steps} GPT steps "
             f"({args.steps * 10} MLP steps) per round after 3 warm-up steps; torch threads "
             f"{default_threads} (`cpu`) or 1"]
    return rows + [""] + notes


# -- first step -------------------------------------------------------------------------------

_FIRST_STEP = """
    import json, time
    t0 = time.perf_counter()
    import torch, torchneuron
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (4, 32)).to("neuron")
    t1 = time.perf_counter()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    loss = out.loss.item()
    t2 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "first_step_s": t2 - t1, "loss": loss,
                      "fusion": torchneuron.fusion_stats()}))
"""


def measure_first_step(args) -> list[str]:
    env = _fresh_cache_env()  # the warm run loads the programs the cold one stored
    cold = _run_child(_FIRST_STEP, env)
    warm = _run_child(_FIRST_STEP, env)
    rows = ["| tiny Llama (2 layers, hidden 64), batch 4 x 32, AdamW | first step (s) | fused programs compiled | loaded from disk |",
            "|---|---:|---:|---:|"]
    for label, r in (("cold cache (new cache directory)", cold),
                     ("warm on-disk cache (second process)", warm)):
        rows.append(f"| {label} | {r['first_step_s']:.2f} | {r['fusion']['compilations']} | "
                    f"{r['fusion']['disk_loads']} |")
    for r in rows:
        print(r, flush=True)
    return rows + ["", "- each in a fresh process; the first step excludes `import torch` and model "
                       "construction; programs counted by `torchneuron.fusion_stats()` "
                       "(`compilations`, `disk_loads`)"]


# -- new shapes -----------------------------------------------------------------------------

_SHAPES = """
    import json, resource, time, sys
    import torch, torchneuron
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    sizes = int(sys.argv[1])
    torch.ones(1, 3, device="neuron").sum().item()
    before = rss(); t = time.perf_counter()
    for n in range(1, sizes + 1):
        a = torch.ones(n, 3, device="neuron")
        (a * 2 + 1).sum(0).cpu()
    print(json.dumps({"seconds": time.perf_counter() - t, "rss_growth_mb": (rss() - before) / 1e6,
                      "fusion": torchneuron.fusion_stats()}))
"""


def measure_shapes(args) -> list[str]:
    env = _fresh_cache_env()
    code = _SHAPES.replace("int(sys.argv[1])", str(args.sizes))
    result = _run_child(code, env)
    row = (f"| {args.sizes} sizes of `(ones(n, 3) * 2 + 1).sum(0)` | {result['seconds']:.1f} | "
           f"{result['seconds'] / args.sizes * 1e3:.0f} | {result['rss_growth_mb']:.0f} |")
    rows = ["| loop | wall (s) | per new size (ms) | resident memory growth (MB) |",
            "|---|---:|---:|---:|", row]
    print(row, flush=True)
    return rows + ["", "- fresh process, empty cache directory; growth from after the first "
                       "call to the end (TORCHNEURON_EAGER_SIGNATURES and "
                       "TORCHNEURON_FUSION_PROGRAMS at their defaults)"]


# -- generate ---------------------------------------------------------------------------------

_GENERATE = """
    import json, time, sys
    import torch, torchneuron, transformers
    device = sys.argv[1]
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=4)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval().to(device)
    ids = torch.randint(0, 256, (1, 8)).to(device)
    times = []
    for _ in range(2):
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=0)
        out.cpu()
        times.append(time.perf_counter() - t)
    print(json.dumps({"first_s": times[0], "second_s": times[1], "tokens": out[0].tolist()}))
"""


def measure_generate(args) -> list[str]:
    results = {}
    for device in ("cpu", "neuron"):
        code = _GENERATE.replace("sys.argv[1]", repr(device))
        results[device] = _run_child(code, _fresh_cache_env())
    same = results["cpu"]["tokens"] == results["neuron"]["tokens"]
    rows = ["| GPT-2 (2 layers, n_embd 64), 32 new tokens, greedy | first call (s) | second call (s) |",
            "|---|---:|---:|"]
    for device in ("cpu", "neuron"):
        r = results[device]
        rows.append(f"| {device} | {r['first_s']:.2f} | {r['second_s']:.2f} |")
    for r in rows[2:]:
        print(r, flush=True)
    return rows + ["", f"- fresh process and empty cache directory per device; neuron generates "
                       f"the same tokens as CPU: {same}"]


PARTS = {"steps": measure_steps, "steps-isolated": measure_steps_isolated,
         "first-step": measure_first_step, "shapes": measure_shapes, "generate": measure_generate}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sizes", type=int, default=800)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in ["benchmarks/eager_bench.py", *sys.argv[1:]])
    start_load = os.getloadavg()[0]
    import jax
    import torch

    import torchneuron

    sections = []
    for part in args.parts.split(","):
        print(f"## {part}", flush=True)
        sections += [f"### {part}", "", *PARTS[part](args), ""]
    end_load = os.getloadavg()[0]
    header = [
        f"- machine: {os.cpu_count()} cores, {platform.machine()}; load average (1 min) at start "
        f"{start_load:.2f}, at end {end_load:.2f}",
        f"- python {platform.python_version()}, torch {torch.__version__}, jax {jax.__version__}, "
        f"torchneuron {torchneuron.__version__}",
        f"- command: `{command}`",
        f"- date: {datetime.date.today().isoformat()}",
    ]
    text = "\n".join(header + [""] + sections)
    print(text)
    if args.write:
        old = DOC.read_text() if DOC.exists() else ""
        before, found, rest = old.partition(SECTION)
        tail = ""
        if found:
            lines = rest.splitlines(keepends=True)
            for i, line in enumerate(lines[1:], start=1):
                if line.startswith("# "):
                    tail = "".join(lines[i:])
                    break
        DOC.write_text(before.rstrip("\n") + ("\n\n" if before.strip() else "") + SECTION
                       + "\n\nProduced by `benchmarks/eager_bench.py --write`.\n\n" + text + "\n"
                       + ("\n" + tail if tail else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
