"""Real models train under `torch.compile(backend="neuron")` as on CPU (issue 13, point 2).

Tiny random-init configs of Hugging Face models (no download) and a ResNet-style CNN train 3
AdamW steps compiled on the device; the losses must equal CPU eager training (1e-4 relative),
every graph must compile (no graph runs eagerly) and Dynamo must not split the models' graphs
at their logging calls. `make test` runs Llama and the CNN; `make test-compile-models` runs
them all (the others are marked `slow`).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

import torchneuron

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install -e '.[hf]')"
)

STEPS = 3
VOCAB, SEQ, BATCH = 64, 16, 2
DEV = "neuron"


def _decoder_kwargs() -> dict:
    return dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, max_position_embeddings=32)


_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _llama():
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**_decoder_kwargs(), num_key_value_heads=2))


def _qwen2():
    return transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**_decoder_kwargs(), num_key_value_heads=2))


def _mistral():
    return transformers.MistralForCausalLM(
        transformers.MistralConfig(**_decoder_kwargs(), num_key_value_heads=2))


def _gpt_neox():
    return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        **_decoder_kwargs(), hidden_dropout=0.0, attention_dropout=0.0))


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=64, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _bert():
    return transformers.BertForMaskedLM(transformers.BertConfig(**_decoder_kwargs(), **_NO_DROPOUT))


def _t5():
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0))


def _vit():
    return transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=8, num_labels=5, **_NO_DROPOUT))


class _Block(nn.Module):
    def __init__(self, channels_in: int, channels: int, stride: int) -> None:
        super().__init__()
        # No convolution bias before BatchNorm: its gradient is exactly zero up to rounding,
        # which AdamW would turn into full-size (equally valid) different updates.
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.skip = nn.Sequential()
        if stride != 1 or channels_in != channels:
            self.skip = nn.Sequential(nn.Conv2d(channels_in, channels, 1, stride, bias=False),
                                      nn.BatchNorm2d(channels))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.skip(x))


class ResNetTiny(nn.Module):
    """A ResNet-18-shaped CNN, scaled down (torchvision/timm are not dependencies)."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU(), nn.MaxPool2d(2))
        self.layers = nn.Sequential(_Block(8, 8, 1), _Block(8, 16, 2))
        self.head = nn.Linear(16, classes)

    def forward(self, pixel_values, labels):
        x = self.layers(self.stem(pixel_values))
        logits = self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return F.cross_entropy(logits, labels)


def _batch(kind: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if kind in ("vit", "cnn"):
        return {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g),
                "labels": torch.randint(0, 5, (BATCH,), generator=g)}
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    if kind == "t5":
        return {"input_ids": ids, "labels": torch.randint(1, VOCAB, (BATCH, 8), generator=g)}
    return {"input_ids": ids, "labels": ids}


FAST = {"llama": _llama, "cnn": ResNetTiny}
SLOW = {"qwen2": _qwen2, "mistral": _mistral, "gpt_neox": _gpt_neox, "gpt2": _gpt2,
        "bert": _bert, "t5": _t5, "vit": _vit}
CASES = [pytest.param(k, id=k) for k in FAST] + [
    pytest.param(k, id=k, marks=pytest.mark.slow) for k in SLOW]


@pytest.fixture(autouse=True)
def _setup(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path / "cache"))
    # docs/HUGGINGFACE.md: keeps tied embeddings tied through `model.to("neuron")`.
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torchneuron.reset_compile_stats()
    yield
    torch._dynamo.reset()
    torch.__future__.set_swap_module_params_on_conversion(previous)


def _loss(model, kind, batch):
    out = model(**batch)
    return out if kind == "cnn" else out.loss


def _train(model: nn.Module, kind: str, device: str, compiled: bool) -> list[float]:
    model = model.to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run = torch.compile(model, backend="neuron") if compiled else model
    batch = {k: v.to(device) for k, v in _batch(kind).items()}
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = _loss(run, kind, batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind", CASES)
def test_model_trains_compiled_as_on_cpu(kind):
    torch.manual_seed(0)
    model = {**FAST, **SLOW}[kind]()
    expected = _train(copy.deepcopy(model), kind, "cpu", compiled=False)
    with warnings.catch_warnings():
        # A graph that runs eagerly warns (UserWarning): make it fail the test.
        warnings.filterwarnings("error", message="torchneuron.compile")
        got = _train(copy.deepcopy(model), kind, DEV, compiled=True)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=0)
    stats = torchneuron.compile_stats()
    assert stats["eager_fallbacks"] == 0, stats
    assert stats["graphs_compiled"] >= 2 and stats["xla_compilations"] >= 2, stats
    assert not torch._dynamo.utils.counters["graph_break"], dict(
        torch._dynamo.utils.counters["graph_break"])
