"""Dynamic sequence lengths under torch.compile: bucketed executables against one executable per
shape and against eager mode (issue 14, docs/DYNAMIC_SHAPES.md).

A causal transformer LM (examples/char_gpt.py: 4 layers, d 256, 4 heads) runs over 10 sequence
lengths between 17 and 128, once for inference (`torch.no_grad`, eval mode: logits) and once
for training (loss, backward, SGD step), in four configurations that each start from the
same weights and see the same batches:

- `eager-per-shape`: the neuron device in eager mode (adaptive fusion) with eager traces
  compiled per shape (`TORCHNEURON_BUCKETS=off` while it runs; past two shapes of a trace,
  its new shapes run op by op): the reference of the other rows;
- `eager`: eager mode as it comes, where a fused trace over a varying size runs bucketed
  (compiler/eager_traces.py);
- `per-shape`: `torch.compile(model, backend="neuron", dynamic=True, options={"buckets": "off"})`;
- `bucketed`: the same with the default rule (`pow2`: buckets 32, 64, 128).

Each configuration runs in a fresh process (eager mode's caches are process-wide) and makes two
passes over the lengths: the first includes every compilation (Dynamo, AOTAutograd, XLA), the
second is the steady state. The on-disk compile cache is off, so
every executable is compiled in this process. Reported: the backend's counters
(`torchneuron.compile_stats()`), both pass times (wall clock, after `torch.neuron.synchronize()`),
and the largest difference from eager-per-shape (logits for inference, per-step loss for training).
"XLA executables" counts the graphs' executables and, in eager mode, those of the bucketed
traces (`fusion_stats()["bucketed_compilations"]`); "fused per-shape programs" the eager traces
compiled for one shape (`fusion_stats()["compilations"]`).

`--model hf-gpt2` runs a tiny Hugging Face GPT-2 instead (transformers, random init: 2 layers,
n_embd 64, 4 heads, vocab 256), on padded batches: the last sequence of each batch is 5 tokens
shorter, with its attention mask and its labels (-100) marking the padding; the difference
from eager is then taken over the unmasked positions.

    python benchmarks/bucket_bench.py [--model char-gpt|hf-gpt2] [--modes inference,training]
        [--batch 4] [--lengths ...]
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TORCHNEURON_COMPILE_CACHE", "0")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

import torchneuron  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))
from char_gpt import CharGPT, Config  # noqa: E402

LENGTHS = (17, 29, 40, 52, 64, 77, 90, 101, 115, 128)
CONFIGS = ("eager-per-shape", "eager", "per-shape", "bucketed")
VOCAB = 66
VOCAB_HF = 256


def make_batches(lengths, batch: int, padded: bool, vocab: int):
    """Per length: the model's keyword arguments for training and the mask of true positions."""
    g = torch.Generator().manual_seed(1)
    out = []
    for t in lengths:
        x = torch.randint(0, vocab, (batch, t), generator=g)
        mask = torch.ones(batch, t, dtype=torch.long)
        if padded:
            mask[-1, t - 5:] = 0
            out.append(({"input_ids": x, "attention_mask": mask,
                         "labels": x.masked_fill(mask == 0, -100)}, mask.bool()))
        else:
            out.append(({"idx": x, "targets": torch.roll(x, -1, 1)}, mask.bool()))
    return out


def _forward(run, kwargs: dict, training: bool):
    """(logits, loss) of either model."""
    if "input_ids" in kwargs:
        if not training:
            kwargs = {k: v for k, v in kwargs.items() if k != "labels"}
        out = run(**kwargs)
        return out.logits, out.loss
    if not training:
        return run(kwargs["idx"])
    return run(kwargs["idx"], kwargs["targets"])


def run_config(config: str, mode: str, model0: torch.nn.Module, batches) -> dict:
    saved = os.environ.get("TORCHNEURON_BUCKETS")
    if config == "eager-per-shape":
        os.environ["TORCHNEURON_BUCKETS"] = "off"
    try:
        return _run_config(config, mode, model0, batches)
    finally:
        if saved is None:
            os.environ.pop("TORCHNEURON_BUCKETS", None)
        else:
            os.environ["TORCHNEURON_BUCKETS"] = saved


def _run_config(config: str, mode: str, model0: torch.nn.Module, batches) -> dict:
    torch._dynamo.reset()
    torchneuron.reset_compile_stats()
    torchneuron.reset_fusion_stats()
    model = copy.deepcopy(model0).to("neuron")
    if mode == "inference":
        model.eval()
    run = model
    if not config.startswith("eager"):
        options = {"buckets": "off"} if config == "per-shape" else {}
        run = torch.compile(model, backend="neuron", dynamic=True, options=options)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    device_batches = [{k: v.to("neuron") for k, v in kwargs.items()} for kwargs, _ in batches]

    def one_pass():
        results = []
        for kwargs in device_batches:
            if mode == "inference":
                with torch.no_grad():
                    logits, _ = _forward(run, kwargs, False)
                results.append(logits)
            else:
                opt.zero_grad(set_to_none=True)
                _, loss = _forward(run, kwargs, True)
                loss.backward()
                opt.step()
                results.append(loss.detach())
        torch.neuron.synchronize()
        return [r.cpu() for r in results]

    times = []
    outputs = None
    for _ in range(2):
        start = time.perf_counter()
        results = one_pass()
        times.append(time.perf_counter() - start)
        outputs = results if outputs is None else outputs
    stats = torchneuron.compile_stats()
    return {"first_s": times[0], "second_s": times[1], "outputs": outputs, "stats": stats,
            "fusion": torchneuron.fusion_stats()}


def make_model(name: str, lengths, batch: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "hf-gpt2":
        import transformers

        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB_HF, n_positions=max(lengths),
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    cfg = Config(vocab_size=VOCAB, block_size=max(lengths), n_layer=4, n_head=4, d_model=256,
                 batch_size=batch)
    return CharGPT(cfg)


def _worst(outputs, reference, batches, mode: str) -> float:
    worst = 0.0
    for a, b, (_, true) in zip(outputs, reference, batches):
        d = (a - b).abs()
        if mode == "inference":
            d = d[true]  # the unmasked positions (all of them for char-gpt)
        worst = max(worst, float(d.max()))
    return worst


def _child(args, mode: str, config: str, out: str) -> None:
    """One configuration in this process; its results into the file `out`."""
    lengths = [int(v) for v in args.lengths.split(",")]
    hf = args.model == "hf-gpt2"
    model0 = make_model(args.model, lengths, args.batch)
    batches = make_batches(lengths, args.batch, padded=hf, vocab=VOCAB_HF if hf else VOCAB)
    torch.save(run_config(config, mode, model0, batches), out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--model", default="char-gpt", choices=("char-gpt", "hf-gpt2"))
    parser.add_argument("--child", nargs=3, metavar=("MODE", "CONFIG", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    if args.child:
        _child(args, *args.child)
        return
    lengths = [int(v) for v in args.lengths.split(",")]
    hf = args.model == "hf-gpt2"
    batches = make_batches(lengths, args.batch, padded=hf, vocab=VOCAB_HF if hf else VOCAB)
    load_start = os.getloadavg()[0]
    print(f"# model {args.model}, lengths {lengths}, batch {args.batch}; "
          f"load average at start {load_start:.2f}")
    print("| mode | config | graphs | XLA executables | pad/cut programs | bucketed calls "
          "| fused per-shape programs | bucketed eager runs "
          "| first pass s | second pass s | max diff vs eager |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    passed = [a for a in sys.argv[1:]]
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            reference = None
            for config in args.configs.split(","):
                out = os.path.join(tmp, f"{mode}-{config}.pt")
                subprocess.run([sys.executable, __file__, *passed, "--child", mode, config, out],
                               check=True)
                r = torch.load(out, weights_only=False)
                if reference is None:
                    reference = r["outputs"]
                diff = ""
                if reference is not r["outputs"]:
                    diff = f"{_worst(r['outputs'], reference, batches, mode):.2e}"
                s = r["stats"]
                unbucketed = "; ".join(s["unbucketed_reasons"])
                executables = s["xla_compilations"] + r["fusion"]["bucketed_compilations"]
                print(f"| {mode} | {config} | {s['graphs_compiled']} | {executables} "
                      f"| {s['bucket_adapter_compilations']} | {s['bucketed_calls']} "
                      f"| {r['fusion']['compilations']} | {r['fusion']['bucketed_runs']} "
                      f"| {r['first_s']:.1f} | {r['second_s']:.1f} | {diff} |"
                      + (f" unbucketed: {unbucketed}" if unbucketed else ""), flush=True)
    print(f"# load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
