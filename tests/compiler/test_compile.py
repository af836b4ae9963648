"""torch.compile(backend="neuron") against eager mode on the same device."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

import torchneuron

DEV = "neuron"


@pytest.fixture(autouse=True)
def _fresh_dynamo(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    torchneuron.reset_compile_stats()
    yield
    torch._dynamo.reset()


class TinyLM(nn.Module):
    def __init__(self, vocab=17, d=32, heads=4, seq=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab)
        self.heads = heads

    def forward(self, idx):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, -1))
        x = x + self.mlp(self.ln2(x))
        return self.head(x)


class SmallCNN(nn.Module):
    # Convolutions feeding BatchNorm carry no bias: its gradient is pure rounding noise,
    # which Adam would amplify into different (equally valid) updates.

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5),
        )

    def forward(self, x):
        return self.body(x)


def _mlp():
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))


def _data(kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "lm":
        x = torch.randint(0, 17, (4, 16), generator=g)
        return x, torch.roll(x, -1, 1)
    if kind == "cnn":
        return torch.randn(6, 1, 12, 12, generator=g), torch.randint(0, 5, (6,), generator=g)
    return torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)


def _train(model, kind, compiled, steps=5):
    torch.manual_seed(0)
    model = model.to(DEV)
    # SGD: Adam would turn the rounding noise of exactly-zero gradients (e.g. attention key
    # biases) into full-size, equally valid but different updates.
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    forward = torch.compile(model, backend="neuron") if compiled else model
    x, y = (t.to(DEV) for t in _data(kind))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logits = forward(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("kind,factory", [("mlp", _mlp), ("cnn", SmallCNN), ("lm", TinyLM)])
def test_compiled_training_matches_eager(kind, factory):
    torch.manual_seed(0)
    model = factory()
    eager_losses, eager_model = _train(copy.deepcopy(model), kind, compiled=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no eager fallback of a graph
        compiled_losses, compiled_model = _train(copy.deepcopy(model), kind, compiled=True)
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-4, atol=0)
    for (name, a), b in zip(eager_model.state_dict().items(), compiled_model.state_dict().values()):
        torch.testing.assert_close(b.cpu(), a.cpu(), rtol=1e-4, atol=1e-5, msg=name)
    stats = torchneuron.compile_stats()
    assert stats["graphs_compiled"] >= 2 and stats["eager_fallbacks"] == 0


def test_compiled_optimizer_step_matches_eager():
    torch.manual_seed(0)
    params = [torch.randn(5, 3), torch.randn(7)]
    grads = [torch.randn(5, 3), torch.randn(7)]

    def run(compiled):
        ps = [p.clone().to(DEV).requires_grad_() for p in params]
        for p, g in zip(ps, grads):
            p.grad = g.clone().to(DEV)
        opt = torch.optim.Adam(ps, lr=0.1)
        step = torch.compile(opt.step, backend="neuron") if compiled else opt.step
        for _ in range(3):
            step()
        return [p.detach().cpu() for p in ps]

    for a, b in zip(run(False), run(True)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1),
    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
], ids=["adamw", "sgd"])
def test_compiled_optimizer_is_one_executable_with_its_state_updated(make_opt):
    # The _foreach_* ops and the in-place updates of parameters and optimizer state run
    # inside the executable: no eager fallback, and the state matches eager mode.
    torch.manual_seed(0)
    params = [torch.randn(5, 3), torch.randn(7), torch.randn(2, 2, 2)]

    def run(compiled):
        ps = [p.clone().to(DEV).requires_grad_() for p in params]
        opt = make_opt(ps)
        step = torch.compile(opt.step, backend="neuron") if compiled else opt.step
        for i in range(4):
            for j, p in enumerate(ps):
                p.grad = (torch.full(p.shape, 0.1 * (i + 1)) + params[j]).to(DEV)
            step()
        state = [v.detach().cpu() for p in ps for v in opt.state[p].values()
                 if isinstance(v, torch.Tensor)]
        return [p.detach().cpu() for p in ps] + state

    eager = run(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        compiled = run(True)
    assert len(compiled) == len(eager)
    # Compiled optimizers take PyTorch's foreach/tensor-step formulas, eager mode on this device
    # the per-tensor ones: float32 rounding differs in order, hence atol at float32 noise level.
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert torchneuron.compile_stats()["eager_fallbacks"] == 0


def test_input_mutations_inside_the_graph():
    # Views (a transpose, a slice), two views of one storage, and a CPU scalar, all mutated.
    def f(a, b, c, d, s):
        a.mul_(2)
        b.add_(1)
        c.sub_(a.sum())
        d.add_(3)
        s.add_(1)
        return a.sum() + b.sum()

    def inputs(device):
        base = torch.arange(24.0).reshape(4, 6)
        shared = torch.arange(10.0)
        a = base.clone().to(device)
        b = torch.arange(12.0).reshape(3, 4).to(device).t()
        c = shared.clone().to(device)
        return [a, b, c[:5], c[5:], torch.tensor(1.0)], c

    expected, expected_c = inputs("cpu")
    with torch.no_grad():
        out_cpu = f(*expected)
        got, got_c = inputs(DEV)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            out = torch.compile(f, backend="neuron")(*got)
    torch.testing.assert_close(out.cpu(), out_cpu)
    for a, b in zip(expected + [expected_c], got + [got_c]):
        torch.testing.assert_close(b.cpu(), a)


def test_assignment_into_a_view_compiles_into_the_graph():
    # `x[:, 1] = y` functionalizes to aten.copy (src in the view's shape) plus a scatter.
    def f(x, y, z):
        x = x.clone()
        x[:, 1] = y
        x[2].copy_(z)  # a float64 source: copy casts to the view's dtype
        return x * 2

    x, y, z = torch.randn(3, 4), torch.randn(3), torch.randn(4, dtype=torch.float64)
    with torch.no_grad():
        out = torch.compile(f, backend="neuron", fullgraph=True)(x.to(DEV), y.to(DEV), z.to(DEV))
    torch.testing.assert_close(out.cpu(), f(x, y, z))
    stats = torchneuron.compile_stats()
    assert stats["eager_fallbacks"] == 0 and stats["xla_compilations"] == 1


def test_seeded_dropout_is_reproducible_and_draws_fresh_masks():
    model = nn.Sequential(nn.Linear(16, 64), nn.Dropout(0.5), nn.Linear(64, 4)).to(DEV)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(8, 16).to(DEV)
    torch.manual_seed(123)
    first = compiled(x).detach().cpu()
    second = compiled(x).detach().cpu()
    torch.manual_seed(123)
    again = compiled(x).detach().cpu()
    torch.testing.assert_close(again, first)
    assert not torch.equal(first, second)


def test_dynamic_sequence_lengths_bounded_compiles():
    torch.manual_seed(0)
    reference = TinyLM(seq=32).eval()  # CPU eager: the expected values
    model = copy.deepcopy(reference).to(DEV)
    compiled = torch.compile(model, backend="neuron", dynamic=True)
    lengths = [3, 5, 7, 8, 9, 11, 13, 16, 20, 32]
    with torch.no_grad():
        for t in lengths:
            x = torch.randint(0, 17, (2, t))
            torch.testing.assert_close(compiled(x.to(DEV)).cpu(), reference(x), rtol=1e-4, atol=1e-5)
    stats = torchneuron.compile_stats()
    assert stats["graphs_compiled"] <= 2
    # one executable per distinct concrete shape, never more (documented bound)
    assert stats["xla_compilations"] + stats["disk_cache_hits"] <= len(lengths)


def test_second_process_reuses_disk_cache(shared_cache_dir):
    script = textwrap.dedent(
        """
        import torch, torchneuron
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU()).to("neuron")
        out = torch.compile(model, backend="neuron")(torch.ones(2, 6, device="neuron"))
        out.sum().item()
        s = torchneuron.compile_stats()
        print(s["xla_compilations"], s["disk_cache_hits"])
        """
    )
    env = {**os.environ, "TORCHNEURON_CACHE_DIR": str(shared_cache_dir)}
    runs = [
        subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=300)
        for _ in range(2)
    ]
    for r in runs:
        assert r.returncode == 0, r.stderr
    first = [int(v) for v in runs[0].stdout.split()[-2:]]
    second = [int(v) for v in runs[1].stdout.split()[-2:]]
    assert first[0] >= 1
    assert second == [0, first[0]]


def test_corrupted_cache_entry_is_ignored_and_rebuilt(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    model = nn.Linear(4, 4).to(DEV)
    x = torch.ones(3, 4, device=DEV)
    torch.compile(model, backend="neuron")(x)
    entries = list((cache / "executables").glob("*.bin"))
    assert entries
    for entry in entries:
        entry.write_bytes(entry.read_bytes()[: len(entry.read_bytes()) // 2])
    torch._dynamo.reset()
    torchneuron.reset_compile_stats()
    with pytest.warns(UserWarning, match="unreadable compile cache entry"):
        out = torch.compile(model, backend="neuron")(x)
    torch.testing.assert_close(out.detach().cpu(), model(x).detach().cpu())
    stats = torchneuron.compile_stats()
    assert stats["disk_cache_errors"] >= 1 and stats["xla_compilations"] >= 1


def test_unlowerable_op_falls_back_to_eager_with_warning():
    def f(x):
        return torch.ops.tn_test.cpu_only_scale.default(x, 2.0) + 1

    x = torch.randn(4, 3)
    with pytest.warns(UserWarning, match="cpu_only_scale"):
        out = torch.compile(f, backend="neuron")(x.to(DEV))
    torch.testing.assert_close(out.cpu(), f(x))
    assert torchneuron.compile_stats()["eager_fallbacks"] >= 1


def test_unknown_option_is_rejected():
    with pytest.raises(Exception, match="unknown option"):
        torch.compile(nn.Linear(2, 2).to(DEV), backend="neuron", options={"bogus": 1})(
            torch.ones(1, 2, device=DEV)
        )


def test_data_dependent_ops_give_eager_equal_results():
    def f(x):
        y = x * 2
        kept = y[y > 0]  # boolean masking: output shape depends on values
        return kept.sum() + x.nonzero().shape[0] + y.max().item()

    x = torch.tensor([[-1.0, 2.0], [3.0, -4.0]])
    compiled = torch.compile(f, backend="neuron")
    expected = f(x)
    got = compiled(x.to(DEV))
    torch.testing.assert_close(torch.as_tensor(got).cpu(), torch.as_tensor(expected))


@pytest.mark.slow  # three interpreters; `make test` keeps test_second_process_reuses_disk_cache
def test_concurrent_writers_share_the_disk_cache(shared_cache_dir):
    script = textwrap.dedent(
        """
        import torch, torchneuron
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh()).to("neuron")
        out = torch.compile(model, backend="neuron")(torch.ones(3, 5, device="neuron"))
        print(round(float(out.sum().item()), 5))
        s = torchneuron.compile_stats()
        print(s["xla_compilations"], s["disk_cache_hits"], s["disk_cache_errors"])
        """
    )
    env = {**os.environ, "TORCHNEURON_CACHE_DIR": str(shared_cache_dir)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
    values = {out.split()[0] for out, _ in outputs}
    assert len(values) == 1
    for out, _ in outputs:
        assert int(out.split()[-1]) == 0  # no corrupted entry seen
    # a third process finds every executable on disk, intact
    third = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=300)
    assert third.returncode == 0, third.stderr
    compilations, hits, errors = (int(v) for v in third.stdout.split()[-3:])
    assert compilations == 0 and hits >= 1 and errors == 0
    assert not list((shared_cache_dir / "executables").glob(".tmp-*"))
