"""Bucketed compilation of graphs with dynamic sizes (compiler/buckets.py, compiler/padding/):
one executable per bucket, results equal to eager, and a visible fallback to one executable per
shape where the padding analysis cannot prove a graph exact."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

import torchneuron
from torchneuron.compiler import buckets

DEV = "neuron"


@pytest.fixture(autouse=True)
def _fresh_dynamo(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHNEURON_BUCKETS", raising=False)
    torch._dynamo.reset()
    torchneuron.reset_compile_stats()
    yield
    torch._dynamo.reset()


# -- the rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spec,n,bucket", [
    ("pow2", 17, 32), ("pow2", 32, 32), ("pow2", 2, 2), ("pow2:16", 3, 16), ("pow2:16", 17, 32),
    ("multiple:8", 17, 24), ("multiple:8", 16, 16), ("sizes:16,64", 17, 64),
    ("sizes:64,16", 3, 16), ("sizes:16,64", 65, 65), ("off", 17, 17),
    # an empty size stays empty under every rule (GPT-2 with a graph break in its forward
    # had a cache length of 0 padded to 1, and its logits came out one position long)
    ("pow2", 0, 0), ("pow2:16", 0, 0), ("multiple:8", 0, 0), ("sizes:16,64", 0, 0),
])
def test_bucket_rule(spec, n, bucket):
    assert buckets.parse_rule(spec).bucket(n) == bucket


@pytest.mark.parametrize("spec", ["pow3", "pow2:0", "multiple:", "multiple:-2", "sizes:", "x"])
def test_a_bad_rule_is_an_error(spec, monkeypatch):
    with pytest.raises(ValueError, match="torch.compile option 'buckets'"):
        buckets.rule_for({"buckets": spec})
    monkeypatch.setenv("TORCHNEURON_BUCKETS", spec)
    with pytest.raises(ValueError, match="TORCHNEURON_BUCKETS"):
        buckets.rule_for({})


def test_a_bad_rule_fails_the_compile():
    with pytest.raises(Exception, match="expected 'pow2'"):
        torch.compile(lambda x: x + 1, backend="neuron", options={"buckets": "pow3"})(
            torch.ones(3, device=DEV))


# -- the analysis, per op family: results against eager, compile counts ----------------------

LENGTHS = (5, 7)  # one pow2 bucket (8): one executable instead of two


def _inputs(t, seed=0):
    g = torch.Generator().manual_seed(seed + t)
    x = torch.randn(3, t, 6, generator=g)
    x[0, 0, 0] = 0.0
    return x.to(DEV)


def _run_marked(fn, lengths=LENGTHS, make=_inputs, options=None, dims=(1,)):
    """`fn` compiled with dim 1 of its input marked dynamic, against eager, per length."""
    compiled = torch.compile(fn, backend="neuron", options=options or {})
    for t in lengths:
        inputs = make(t)
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        for x in inputs:
            for d in dims:
                torch._dynamo.mark_dynamic(x, d)
        expected = fn(*inputs)
        got = compiled(*inputs)
        _same(got, expected)


def _same(got, expected):
    if isinstance(expected, tuple | list):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            _same(g, e)
        return
    assert got.shape == expected.shape
    assert got.dtype == expected.dtype
    if expected.dtype.is_floating_point:
        # reductions over a padded dim add the same terms in another order
        torch.testing.assert_close(got.cpu(), expected.cpu(), rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(got.cpu(), expected.cpu())


_W = torch.randn(6, 4, generator=torch.Generator().manual_seed(1)).to(DEV)
_EMB = torch.randn(10, 4, generator=torch.Generator().manual_seed(2)).to(DEV)


def _attention(x):
    q = x.view(3, x.shape[1], 2, 3).transpose(1, 2)
    return F.scaled_dot_product_attention(q, q * 0.5, q + 1, is_causal=True)


def _with_targets(t):
    x = _inputs(t)
    target = torch.randint(0, 6, (3, t), generator=torch.Generator().manual_seed(t))
    target[0, 1] = -100  # an ignored target in the true region too
    return x, target.to(DEV)


def _cross_entropy(x, target):
    return F.cross_entropy(x.reshape(-1, 6), target.reshape(-1))


SAFE = {
    "pointwise": lambda x: torch.tanh(x) * 2 + x.exp(),
    "matmul_other_dim": lambda x: x @ _W,
    "matmul_over_padded": lambda x: x.transpose(1, 2) @ x,
    "baddbmm": lambda x: torch.baddbmm(x[..., :1], x, x.transpose(1, 2)),
    "sum": lambda x: x.sum(1),
    "amax_amin": lambda x: (x.amax(1), x.amin(dim=1, keepdim=True)),
    "prod": lambda x: (x * 0.1 + 1).prod(1),
    "logsumexp": lambda x: torch.logsumexp(x, 1),
    "mean_var": lambda x: (x.mean(1), x.var(1), x.std(dim=1, correction=0)),
    "mean_all": lambda x: x.mean(),
    "softmax": lambda x: (x.softmax(1), x.log_softmax(1)),
    "attention": _attention,
    "cumsum": lambda x: x.cumsum(1),
    "argmax_int": lambda x: (x.argmax(1), (x > 0).sum(1), (x > 0).any(1)),
    "layer_norm_other_dims": lambda x: F.layer_norm(x, (6,)),
    "rms_norm": lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
    "cross_entropy": (_cross_entropy, _with_targets),
    "select_last": lambda x: x[:, -1] + x[:, 0],
    "slice_static": lambda x: x[:, :3] * 2,
    "embedding": (lambda x, idx: F.embedding(idx.clamp(0, 9), _EMB) + x[..., :4],
                  _with_targets),
    "empty_permuted": lambda x: torch.empty_permuted(x.shape, (0, 2, 1), device=x.device)
    .fill_(2.0) * x,
    "arange_size": lambda x: x[..., 0] + torch.arange(x.shape[1], device=x.device),
    "size_as_count": lambda x: x.sum(1) / x.shape[1],
    # several index tensors, broadcast (HF's attention masks: mask[batch_idx, kv_idx])
    "index_several": lambda x: (x[..., 0] > 0).long()[
        torch.arange(3, device=x.device)[:, None, None],
        torch.arange(x.shape[1], device=x.device)[None, None, :]],
    # into the padded dim, with a negative index: -1 is the last true position
    "index_padded_dim": lambda x: x[:, torch.tensor([-1, 0, 2], device=x.device)],
    # the backward of a slice (the shifted logits and labels of a causal LM's loss)
    "slice_scatter_short_of_the_end": lambda x: torch.slice_scatter(
        x, x[:, 1:] * 2, dim=1, start=0, end=x.shape[1] - 1),
    "slice_scatter_from_the_end": lambda x: torch.slice_scatter(
        x, x[:, -2:] + 1, dim=1, start=x.shape[1] - 2),
    "index_not_adjacent": lambda x: x[torch.tensor([2, 0], device=x.device), :,
                                      torch.tensor([1, 5], device=x.device)],
    # a KV cache: new entries after the cached ones, and static parts on both sides
    "cat_after_padded": lambda x: torch.cat([x, x[:, :1] * 2], dim=1).cumsum(1),
    "cat_around_padded": lambda x: torch.cat([x[:, :2], x, x[:, -1:] + 1, x[:, :1]], dim=1),
}


@pytest.mark.parametrize("name", sorted(SAFE))
def test_pad_safe_graph_runs_bucketed(name):
    case = SAFE[name]
    fn, make = case if isinstance(case, tuple) else (case, _inputs)
    _run_marked(fn, make=make)
    stats = torchneuron.compile_stats()
    assert stats["unbucketed_reasons"] == []
    assert stats["bucketed_graphs"] == 1
    assert stats["bucketed_calls"] == len(LENGTHS)
    assert stats["xla_compilations"] == 1


UNSAFE = {
    "flip": (lambda x: x.flip(1), "aten.flip.default", "reverses or rotates a padded dimension"),
    "sort": (lambda x: x.sort(1).values, "aten.sort", "no padding rule"),
    "layer_norm_over_padded": (lambda x: F.layer_norm(x.transpose(1, 2), x.shape[1:2]),
                               "aten.native_layer_norm", "normalizes over a padded dimension"),
    "gather_padded": (lambda x: x.gather(1, torch.zeros(3, 2, 6, dtype=torch.long, device=x.device)),
                      "aten.gather.default", "gathers along a padded dimension"),
    "roll": (lambda x: x.roll(1, 1), "aten.roll.default", "reverses or rotates a padded dimension"),
    "cat_two_padded": (lambda x: torch.cat([x, x * 2], dim=1), "aten.cat.default",
                       "only one padded part"),
    "index_merged_padded_dim": (lambda x: x.reshape(-1, 6)[torch.tensor([0, 4], device=x.device)],
                                "aten.index.Tensor", "laid out in several factors"),
}


@pytest.mark.parametrize("name", sorted(UNSAFE))
def test_unsafe_graph_compiles_per_shape_and_says_why(name):
    fn, op, reason = UNSAFE[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run_marked(fn)
    stats = torchneuron.compile_stats()
    assert stats["bucketed_graphs"] == 0
    assert stats["unbucketed_graphs"] == 1
    [message] = stats["unbucketed_reasons"]
    assert message.startswith(op) and reason in message
    assert any("compiles once per shape" in str(w.message) and op in str(w.message)
               for w in caught)
    assert stats["bucketed_calls"] == 0
    assert stats["xla_compilations"] == len(LENGTHS)


def test_an_index_past_the_true_size_raises_inside_the_bucket():
    # Position 5 exists in the padded length 8 but not in the true length 5: an unpadded
    # graph raises, so the bucketed one must too (negative indices count from the true end).
    def fn(x, i):
        return x[:, i]

    compiled = torch.compile(fn, backend="neuron")
    x = _inputs(5)
    torch._dynamo.mark_dynamic(x, 1)
    ok = torch.tensor([-5, 4], device=DEV)
    _same(compiled(x, ok), fn(x, ok))
    for bad in (5, -6):
        with pytest.raises(IndexError):  # raised at the next sync point
            fn(x, torch.tensor([bad, 0], device=DEV)).cpu()
        with pytest.raises(IndexError):
            compiled(x, torch.tensor([bad, 0], device=DEV)).cpu()
    assert torchneuron.compile_stats()["bucketed_graphs"] == 1


def test_a_size_that_cannot_be_padded_stays_exact_while_the_others_are_bucketed():
    # Both the length and the feature size are dynamic; layer_norm over the features refuses
    # a padded feature dim, so that size compiles per value and the length is bucketed.
    fn = lambda x: F.layer_norm(x, x.shape[2:]).sum(1)  # noqa: E731
    _run_marked(fn, dims=(1, 2))
    stats = torchneuron.compile_stats()
    assert stats["unbucketed_reasons"] == [] and stats["bucketed_graphs"] == 1
    assert stats["xla_compilations"] == 1


def test_an_unsafe_backward_runs_per_shape_on_the_cut_saved_values(monkeypatch):
    # cumsum's forward is pad-safe; its backward flips along the padded dim, which is not.
    # The forward stays bucketed; the values it saved padded (x and its cumsum) are cut to
    # their true size before the backward runs per shape.
    def fn(x):
        return (x.cumsum(1) * x.tanh()).sum(1)

    cuts = []
    crop = buckets._crop_into
    monkeypatch.setattr(buckets, "_crop_into", lambda *a: (cuts.append(a[2]), crop(*a))[1])
    compiled = torch.compile(fn, backend="neuron")
    for t in (5, 7, 6):
        base = _inputs(t).cpu()
        x = base.to(DEV).requires_grad_(True)
        torch._dynamo.mark_dynamic(x, 1)
        out = compiled(x)
        out.sum().backward()
        reference = base.clone().requires_grad_(True)
        fn(reference).sum().backward()
        _same(out.detach(), fn(base))
        _same(x.grad, reference.grad)
    stats = torchneuron.compile_stats()
    assert stats["bucketed_graphs"] == 1 and stats["unbucketed_graphs"] == 1
    assert stats["unbucketed_reasons"] == ["aten.flip.default: reverses or rotates a padded dimension"]
    assert stats["xla_compilations"] == 1 + 3  # one bucket forward, one backward per length
    # each backward call cut the forward's padded saved values (which ones is AOTAutograd's
    # partitioner's choice: x, tanh(x), cumsum(x) with torch 2.13)
    assert len(cuts) == 3 and all(len(jobs) >= 1 for jobs in cuts)


def test_buckets_off_compiles_per_shape():
    _run_marked(SAFE["sum"], options={"buckets": "off"})
    stats = torchneuron.compile_stats()
    assert stats["bucketed_graphs"] == stats["unbucketed_graphs"] == 0
    assert stats["xla_compilations"] == len(LENGTHS)


def test_environment_variable_sets_the_rule(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_BUCKETS", "multiple:4")  # 5 -> 8, 7 -> 8, 11 -> 12
    _run_marked(SAFE["softmax"], lengths=(5, 7, 11))
    assert torchneuron.compile_stats()["xla_compilations"] == 2
    torch._dynamo.reset()
    torchneuron.reset_compile_stats()
    _run_marked(SAFE["softmax"], lengths=(5, 7, 11), options={"buckets": "sizes:16"})
    assert torchneuron.compile_stats()["xla_compilations"] == 1


def test_padding_holds_nan_and_inf_without_leaking():
    # The padding is never assumed zero: a value that is inf/NaN at padded positions after the
    # graph's own ops must not reach the true region of a sum, softmax or contraction.
    def fn(x):
        y = torch.log(x[..., 0] - 2.0)  # NaN everywhere (x < 2): also in the padding
        z = torch.nan_to_num(y, nan=1.0)
        return z.sum(1), (x / (x - x)).isnan().sum(1), z.softmax(1)

    _run_marked(fn, make=lambda t: _inputs(t).abs() % 1.0)
    assert torchneuron.compile_stats()["bucketed_graphs"] == 1


def test_dynamic_true_marks_every_dim():
    # Dynamo's dynamic=True: the batch and feature sizes are symbols too.
    fn = SAFE["mean_var"]
    compiled = torch.compile(fn, backend="neuron", dynamic=True)
    for b, t in ((3, 5), (4, 7), (3, 11)):
        x = torch.randn(b, t, 6).to(DEV)
        _same(compiled(x), fn(x))
    stats = torchneuron.compile_stats()
    assert stats["bucketed_graphs"] == 1
    assert stats["xla_compilations"] == 2  # (4, 8, 8) and (4, 16, 8)


# -- a small LM: inference and training over varying lengths ----------------------------------


class TinyLM(nn.Module):
    def __init__(self, vocab=17, d=32, heads=4, seq=32, layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln1": nn.LayerNorm(d), "qkv": nn.Linear(d, 3 * d), "proj": nn.Linear(d, d),
            "ln2": nn.LayerNorm(d), "fc": nn.Linear(d, 4 * d), "out": nn.Linear(4 * d, d),
        }) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.heads = heads

    def forward(self, idx):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).split(x.shape[-1], dim=-1)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["proj"](y.transpose(1, 2).reshape(b, t, -1))
            x = x + blk["out"](F.gelu(blk["fc"](blk["ln2"](x))))
        return self.head(self.ln(x))


LM_LENGTHS = (17, 20, 23, 26, 29, 31, 9, 12, 14, 16)  # buckets 32 and 16


def _tokens(t, seed=0):
    g = torch.Generator().manual_seed(1000 + t + seed)
    return torch.randint(0, 17, (2, t), generator=g)


@pytest.mark.parametrize("layers,lengths,executables", [
    (1, (17, 20, 9, 12), 2),
    pytest.param(2, LM_LENGTHS, 2, marks=pytest.mark.slow),
])
def test_lm_inference_over_lengths(layers, lengths, executables):
    # The reference is eager mode on CPU: eager on the device compiles every op per shape,
    # which would make this test slow without checking more.
    torch.manual_seed(0)
    reference = TinyLM(layers=layers).eval()
    compiled = torch.compile(copy.deepcopy(reference).to(DEV), backend="neuron", dynamic=True)
    with torch.no_grad():
        for t in lengths:
            x = _tokens(t)
            torch.testing.assert_close(compiled(x.to(DEV)).cpu(), reference(x), rtol=1e-4,
                                       atol=1e-5)
    stats = torchneuron.compile_stats()
    assert stats["unbucketed_reasons"] == []
    assert stats["bucketed_graphs"] == 1
    assert stats["bucketed_calls"] == len(lengths)
    assert stats["xla_compilations"] == executables  # buckets 32 and 16


@pytest.mark.parametrize("lengths,marked", [
    ((9, 12, 14), True),
    # automatic dynamic: the first length compiles a static graph, the second a dynamic one
    pytest.param((9, 12, 14, 16, 6, 11), False, marks=pytest.mark.slow),
])
def test_training_over_varying_lengths_matches_eager(lengths, marked):
    torch.manual_seed(0)
    eager = TinyLM(layers=1)  # on CPU, as above
    model = copy.deepcopy(eager).to(DEV)
    compiled = torch.compile(model, backend="neuron")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, t in enumerate(lengths):
        x = _tokens(t, seed=step)
        y = torch.roll(x, -1, 1)
        y[:, -1] = -100  # ignored targets, as a padded batch would have them
        x_dev = x.to(DEV)
        if marked:
            torch._dynamo.mark_dynamic(x_dev, 1)
        losses = []
        for net, opt, dev, inp in ((eager, opt_e, "cpu", x), (compiled, opt_c, DEV, x_dev)):
            opt.zero_grad()
            logits = net(inp)
            loss = F.cross_entropy(logits.reshape(-1, 17), y.to(dev).reshape(-1),
                                   ignore_index=-100)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5), step
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.cpu(), p.cpu(), rtol=1e-4, atol=1e-5, msg=name)
    stats = torchneuron.compile_stats()
    assert stats["unbucketed_reasons"] == []
    assert stats["bucketed_graphs"] == 2  # the dynamic forward and its backward
    if marked:  # one bucket (16): a forward and a backward
        assert stats["xla_compilations"] == 2
    else:  # 9 static (forward, backward); then buckets 16 and 8 for the dynamic pair
        assert stats["xla_compilations"] == 2 + 2 * 2


class LMWithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.lm = TinyLM(layers=1)

    def forward(self, x, y):
        return F.cross_entropy(self.lm(x).view(-1, 17), y.view(-1))


def test_dynamic_training_with_the_loss_in_the_graph_compiles_once():
    # The forward saves views of its inputs (the flattened targets): reading their symbolic
    # sizes with int() used to specialize the graph to the first shape, so that Dynamo
    # recompiled for every length.
    torch.manual_seed(0)
    eager = LMWithLoss()
    model = copy.deepcopy(eager).to(DEV)
    compiled = torch.compile(model, backend="neuron", dynamic=True)
    for t in (9, 12):
        x = _tokens(t)
        y = torch.roll(x, -1, 1)
        expected = eager(x, y)
        expected.backward()
        loss = compiled(x.to(DEV), y.to(DEV))
        loss.backward()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=name)
    stats = torchneuron.compile_stats()
    assert stats["graphs_compiled"] == 2  # one forward, one backward
    assert stats["bucketed_graphs"] == 2
    assert stats["xla_compilations"] == 2  # bucket 16


# -- Hugging Face GPT-2 with padded, variable-length batches ------------------------------------

HF_LENGTHS = (17, 29, 23, 40)  # buckets 32, 32, 32, 64


def _hf_batch(t):
    g = torch.Generator().manual_seed(t)
    ids = torch.randint(0, 64, (2, t), generator=g)
    mask = torch.ones(2, t, dtype=torch.long)
    mask[1, t - 5:] = 0  # the second sequence is 5 tokens shorter
    return ids, mask, ids.masked_fill(mask == 0, -100)


def _hf_model(name: str):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=64, n_positions=64, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64))


@pytest.mark.slow  # about 25 s each; make test keeps the index_several, slice_scatter and
# empty_permuted cases
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hf_lm_trains_bucketed_over_padded_batches_as_on_cpu(name):
    # HF builds its attention mask with several index tensors (mask[batch_idx, kv_idx]) and
    # its shifted loss backpropagates through slice_scatter (Llama's backward also allocates
    # with empty_permuted): all bucketed, forward and backward together.
    reference = _hf_model(name)
    model = copy.deepcopy(reference).to(DEV)
    compiled = torch.compile(model, backend="neuron", dynamic=True)
    opt_r = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(model.parameters(), lr=0.1)
    for t in HF_LENGTHS:
        ids, mask, labels = _hf_batch(t)
        losses = []
        for net, opt, dev in ((reference, opt_r, "cpu"), (compiled, opt_c, DEV)):
            out = net(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                      labels=labels.to(dev))
            out.loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(out.loss.item())
        assert abs(losses[1] - losses[0]) <= 1e-4 * abs(losses[0]), (t, losses)
    for p_c, p_r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p_c.detach().cpu(), p_r.detach(), rtol=1e-4, atol=1e-5)
    stats = torchneuron.compile_stats()
    assert stats["unbucketed_reasons"] == [] and stats["eager_fallbacks"] == 0
    # Every graph is bucketed: the model's forward and backward, and under pytest also the
    # loss's (pytest's warning capture makes Dynamo break the graph at `logits.float()`;
    # its logits have the vocabulary marked dynamic too, which stays a per-shape size).
    assert stats["bucketed_graphs"] == stats["graphs_compiled"] >= 2
    assert stats["xla_compilations"] + stats["disk_cache_hits"] == 2 * stats["graphs_compiled"]


@pytest.mark.parametrize("resize,sizes", [("_padded", ((2, 5, 3), (2, 8, 3))),
                                          ("_cropped", ((2, 8, 3), (2, 5, 3)))])
def test_host_pads_and_cuts_equal_the_jitted_programs(resize, sizes):
    # The CPU platform pads and cuts in host memory; other platforms run the jitted program.
    import jax.numpy as jnp
    import numpy as np

    fn = getattr(buckets, resize)
    source, target = sizes
    x = np.arange(np.prod(source), dtype=np.float32).reshape(source)
    on_host = fn(np, x, source, target)
    jitted = buckets._program(fn, ((source, target, target),))([jnp.asarray(x)])[0]
    assert on_host.shape == (np.prod(target),)
    assert np.array_equal(on_host, np.asarray(jitted))

