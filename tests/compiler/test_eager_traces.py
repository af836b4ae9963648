"""Eager fused traces over a dynamic size run bucketed (compiler/eager_traces.py): one program
per bucket instead of one per shape, with the results of op-by-op execution, under the same
padding proof as compiled graphs."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from test_buckets import TinyLM, _tokens

import torchneuron
from torchneuron.compiler import eager_traces
from torchneuron.runtime import fusion

pytestmark = pytest.mark.skipif(fusion.Pending is None,
                                reason="fusion needs the C++ library, which this process could not build")

DEV = "neuron"


@pytest.fixture(autouse=True)
def _fused(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHNEURON_BUCKETS", raising=False)
    before = fusion.recording()
    fusion.set_enabled(True)
    fusion.flush()
    eager_traces.forget()
    torchneuron.reset_compile_stats()
    torchneuron.reset_fusion_stats()
    yield
    fusion.set_enabled(before)


def _stats() -> tuple[dict, dict]:
    return torchneuron.fusion_stats(), torchneuron.compile_stats()


def test_lm_inference_over_lengths_runs_bucketed_as_on_cpu():
    torch.manual_seed(0)
    reference = TinyLM(layers=1).eval()
    model = copy.deepcopy(reference).to(DEV)
    lengths = (17, 20, 23, 26, 29, 9, 12)  # the first two compile per shape
    with torch.no_grad():
        for t in lengths:
            x = _tokens(t)
            torch.testing.assert_close(model(x.to(DEV)).cpu(), reference(x), rtol=1e-4,
                                       atol=1e-5)
    fused, compiled = _stats()
    # Three programs (each embedding, and the trace from their sum to the logits), each
    # compiled for two buckets (32 and 16) and run for every length after the first two.
    assert fused["bucketed_programs"] == 3
    assert fused["bucketed_runs"] == 3 * (len(lengths) - 2)
    assert fused["bucketed_compilations"] == 3 * 2
    assert compiled["xla_compilations"] == 0  # torch.compile's counters stay its own


def test_lm_training_over_lengths_matches_cpu():
    torch.manual_seed(0)
    reference = TinyLM(layers=1)
    model = copy.deepcopy(reference).to(DEV)
    opt_cpu = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt_dev = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, t in enumerate((9, 12, 14, 11, 16, 10)):
        x = _tokens(t, seed=step)
        y = torch.roll(x, -1, 1)
        y[:, -1] = -100
        losses = []
        for net, opt, dev in ((reference, opt_cpu, "cpu"), (model, opt_dev, DEV)):
            opt.zero_grad()
            loss = F.cross_entropy(net(x.to(dev)).reshape(-1, 17), y.to(dev).reshape(-1),
                                   ignore_index=-100)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5), step
    for (name, p), q in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-4, atol=1e-5, msg=name)
    fused, _ = _stats()
    assert fused["bucketed_programs"] >= 2  # among them the backward through the blocks
    assert fused["bucketed_runs"] >= 2 * 4


def _run_lengths(fn, lengths):
    for n in lengths:
        x = torch.randn(2, n)
        torch.testing.assert_close(fn(x.to(DEV)).cpu(), fn(x), rtol=1e-5, atol=1e-6)


def test_a_trace_the_analysis_refuses_runs_as_before():
    def fn(x):  # sort along the varying length: no padding rule proves it
        return torch.sort(x * 2, dim=1).values + 1

    _run_lengths(fn, (5, 6, 7, 9, 11))
    fused, compiled = _stats()
    assert fused["bucketed_runs"] == 0
    assert fused["unbucketed"] == 1
    assert fused["bucketed_compilations"] == 0
    assert any("sort" in reason for reason in eager_traces.why_not_bucketed())


def test_a_safe_trace_shares_one_program_per_bucket():
    def fn(x):
        return torch.softmax(x * 2 + 1, dim=1).cumsum(1) - x.mean(1, keepdim=True)

    _run_lengths(fn, (5, 7, 9, 11, 13, 17))  # 5 and 7 per shape, then buckets 16 and 32
    fused, compiled = _stats()
    assert fused["bucketed_runs"] == 4
    assert fused["bucketed_compilations"] == 2


def _softmax_sum(x):
    return torch.softmax(x * 2 + 1, dim=1).sum(1)


def test_a_size_growing_by_one_is_bucketed_at_its_second_value():
    # a sequence generated token by token: its second length already runs bucketed, in
    # buckets of at least 64 (it will pass through every bucket on its way)
    _run_lengths(_softmax_sum, (5, 6, 7, 8, 9, 30, 31))
    fused, _ = _stats()
    assert fused["bucketed_runs"] == 6
    assert fused["compilations"] == 1
    assert fused["bucketed_compilations"] == 1  # bucket 64


def test_a_bucket_rule_set_by_the_user_holds_for_growing_sizes_too(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_BUCKETS", "pow2:8")
    _run_lengths(_softmax_sum, (11, 12, 13, 14, 17))
    fused, _ = _stats()
    assert fused["bucketed_runs"] == 4
    assert fused["bucketed_compilations"] == 2  # buckets 16 and 32


def test_a_trace_reading_a_storage_never_written_is_bucketed():
    # `empty` storages read as zeros made inside the trace (runtime/storage.py ZeroFill),
    # which the rebuild replays as `full` of the reader's shape.
    lengths = range(5, 29, 3)
    for n in lengths:
        x = torch.randn(n, 4)
        grad = torch.empty(n, 4, device=DEV).fill_(0.5)  # as autograd's ones_like
        y = (x.to(DEV) * 2 + grad + torch.empty(n, 4, device=DEV)).sum(0)
        torch.testing.assert_close(y.cpu(), (x * 2 + 0.5).sum(0))
    fused, _ = _stats()
    assert fused["bucketed_programs"] == 1, eager_traces.why_not_bucketed()
    assert fused["bucketed_runs"] == len(lengths) - 2


def test_a_factory_trace_over_sizes_from_one_is_bucketed():
    # issue 12's loop: no tensor input (the size is a factory's argument), and a first sample
    # of size 1, which fits nothing (sizes 0 and 1 are kept apart) until newer ones arrive.
    sizes = range(1, 41)
    for n in sizes:
        a = torch.ones(n, 3, device=DEV)
        assert (a * 2 + 1).sum(0).cpu().tolist() == [3.0 * n] * 3
    fused, _ = _stats()
    assert fused["bucketed_programs"] == 1, eager_traces.why_not_bucketed()
    assert fused["bucketed_runs"] == len(sizes) - 3  # sizes 1, 2 and 3 ran per shape
    assert fused["bucketed_compilations"] == 1  # it grows by one: bucket 64 for sizes 4-40


def test_bucketing_off_leaves_eager_traces_per_shape(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_BUCKETS", "off")

    def fn(x):
        return (x * 3).sum(1) + 2

    _run_lengths(fn, (5, 6, 7, 9))
    fused, _ = _stats()
    assert fused["bucketed_runs"] == 0
    # every op reads the new length: one program per length costs less than each op alone
    assert (fused["compilations"], fused["op_by_op"]) == (4, 0)


def test_an_index_out_of_range_in_a_bucketed_trace_raises_naming_the_call():
    emb_cpu = torch.nn.Embedding(10, 4)
    emb = copy.deepcopy(emb_cpu).to(DEV)

    def run(idx):
        return emb(idx.to(DEV) * 1).sum(-1)

    with torch.no_grad():
        for n in (5, 6, 7, 9):
            idx = torch.arange(n).reshape(1, n) % 10
            torch.testing.assert_close(run(idx).cpu(), emb_cpu(idx).sum(-1))
        # after the first length (the next grew by one): the trace ending at the embedding,
        # and the sum after it
        assert torchneuron.fusion_stats()["bucketed_runs"] == 2 * 3
        bad = torch.arange(11).reshape(1, 11)
        before = torchneuron.fusion_stats()
        with pytest.raises(IndexError, match=r"embedding.*called at .*test_eager_traces\.py"):
            run(bad).cpu()  # raised at the next sync point
        after = torchneuron.fusion_stats()  # raised by the bucketed program (bucket 16)
        assert (after["op_by_op"], after["compilations"]) == (before["op_by_op"],
                                                             before["compilations"])


def test_a_size_outside_what_the_graph_assumed_runs_as_before():
    # The rebuilt graph assumes a size of at least 2 (PyTorch's symbolic shapes treat 0 and 1
    # apart): length 1 runs as it did before, with its own (broadcasting) semantics.
    def fn(x):
        return (x * x[:, :1]).sum(1) + x[:, -1]

    _run_lengths(fn, (5, 7, 8))
    bucketed = torchneuron.fusion_stats()["bucketed_runs"]
    assert bucketed == 1
    _run_lengths(fn, (1,))
    assert torchneuron.fusion_stats()["bucketed_runs"] == bucketed
    _run_lengths(fn, (9,))
    assert torchneuron.fusion_stats()["bucketed_runs"] == bucketed + 1


def test_a_trace_with_two_independent_sizes_runs_as_before():
    def run(n, m):
        x, y = torch.randn(2, n), torch.randn(m, 3)
        got = (x.to(DEV) * 2).sum(1).sum() + (y.to(DEV) + 1).sum(0).sum()
        torch.testing.assert_close(got.cpu(), (x * 2).sum(1).sum() + (y + 1).sum(0).sum())

    for n, m in ((5, 5), (6, 8), (7, 9), (8, 13), (9, 11)):
        run(n, m)
    assert torchneuron.fusion_stats()["bucketed_runs"] == 0


def test_hf_generate_runs_its_growing_cache_bucketed_with_the_tokens_of_cpu():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=1,
                                  n_head=2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(1, 256, (1, 6))
    kwargs = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    expected = model.generate(ids, **kwargs)
    got = model.to(DEV).generate(ids.to(DEV), **kwargs).cpu()
    assert torch.equal(got, expected)
    fused, _ = _stats()
    # Every token is a new length of the same traces: after the first two, they run bucketed.
    assert fused["bucketed_programs"] >= 1
    assert fused["bucketed_runs"] >= 10
    assert fused["unbucketed"] == 0


def test_a_fake_kernel_that_refuses_symbolic_sizes_leaves_no_traceback(caplog):
    # linalg_solve_triangular's fake kernel needs concrete sizes: the trace runs as before,
    # the reason is kept, and FakeTensorMode's ERROR-level traceback is not shown.
    for n in (5, 6, 7):
        a = torch.randn(3, 3).triu() + 3 * torch.eye(3)
        b = torch.randn(3, n)
        got = torch.linalg.solve_triangular(a.to(DEV), b.to(DEV) * 2, upper=True).cpu()
        torch.testing.assert_close(got, torch.linalg.solve_triangular(a, b * 2, upper=True),
                                   rtol=1e-4, atol=1e-4)
    assert any("linalg_solve_triangular" in r for r in eager_traces.why_not_bucketed())
    assert not [r for r in caplog.records if r.name.startswith("torch._subclasses.fake_tensor")]
