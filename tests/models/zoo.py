"""A zoo of tiny random-init models (no download) and the CPU-vs-neuron training comparison that
tests/models/test_zoo.py runs on each.

Each entry builds a model from a small config (2 layers or stages, hidden 32, vocabulary
128, no dropout) and a batch that its forward turns into a loss. `compare` builds the model once on
CPU, deep-copies it to neuron, trains both copies for `STEPS` AdamW steps on the same batch
and reports the per-step losses, the largest parameter difference, the ops that fell back to
CPU and the wall time of the first step (mostly XLA compilation on neuron) and of the last.

`python tests/models/zoo.py [NAME ...]` prints that report per model.
"""

from __future__ import annotations

import copy
import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import transformers as tf
from torch import nn
from vision_libs import import_timm, import_torchvision

STEPS = 3
LR = 1e-3
VOCAB = 128
BATCH, SEQ = 2, 16


@dataclass(frozen=True)
class Entry:
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], dict[str, torch.Tensor]]
    family: str
    tied: bool = False  # some Parameters are shared between modules (tied embeddings)
    fast: bool = False  # part of `make test` (the rest runs under `make zoo`)
    # ops allowed to run on CPU, each with the reason it has no lowering
    fallbacks: dict[str, str] = field(default_factory=dict)
    xfail: str | None = None  # the cause, when a known bug makes the comparison fail


# ------------------------------------------------------------------------------- batches
def _causal_lm(g: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids}


def _masked_lm(g: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, VOCAB, (BATCH, SEQ), generator=g)
    labels = torch.full_like(ids, -100)
    masked = torch.arange(SEQ) % 3 == 1
    labels[:, masked] = ids[:, masked]
    ids = ids.clone()
    ids[:, masked] = 4  # this toy vocabulary's [MASK]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _seq2seq(g: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    labels = torch.randint(3, VOCAB, (BATCH, SEQ // 2), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _images(g: torch.Generator, size: int = 32, count: int = BATCH * 2) -> dict[str, torch.Tensor]:
    return {
        "pixel_values": torch.randn(count, 3, size, size, generator=g),
        "labels": torch.randint(0, 10, (count,), generator=g),
    }


# torchvision/timm CNNs downsample 32x: at 64x64 their last batch norms see 2x2 maps of 8
# images (32 values a channel), enough for float32 training to agree with float64
_images64 = functools.partial(_images, size=64, count=BATCH * 4)


def _speech(g: torch.Generator) -> dict[str, torch.Tensor]:
    # Whisper's encoder takes 2 * max_source_positions frames of log-mel features.
    return {
        "input_features": torch.randn(BATCH, 16, 32, generator=g),
        "labels": torch.randint(3, VOCAB, (BATCH, SEQ // 2), generator=g),
    }


# ------------------------------------------------------------------------------- models
_DECODER = {
    "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
}


def _gpt2() -> nn.Module:
    return tf.GPT2LMHeadModel(tf.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    ))


def _llama() -> nn.Module:
    return tf.LlamaForCausalLM(tf.LlamaConfig(**_DECODER, tie_word_embeddings=False))


def _qwen2() -> nn.Module:
    return tf.Qwen2ForCausalLM(tf.Qwen2Config(**_DECODER, tie_word_embeddings=False))


def _mistral() -> nn.Module:
    return tf.MistralForCausalLM(tf.MistralConfig(**_DECODER, sliding_window=8))


def _gemma() -> nn.Module:
    return tf.GemmaForCausalLM(tf.GemmaConfig(**_DECODER, head_dim=8, tie_word_embeddings=True))


def _gemma2() -> nn.Module:
    return tf.Gemma2ForCausalLM(tf.Gemma2Config(
        **_DECODER, head_dim=8, sliding_window=8, tie_word_embeddings=True,
    ))


def _gpt_neox() -> nn.Module:
    return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, rotary_pct=0.5,
        attention_dropout=0.0, hidden_dropout=0.0,
    ))


def _mixtral() -> nn.Module:
    return tf.MixtralForCausalLM(tf.MixtralConfig(
        **_DECODER, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.01,
        output_router_logits=True,
    ))


def _opt() -> nn.Module:
    return tf.OPTForCausalLM(tf.OPTConfig(
        vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=32,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    ))


def _phi() -> nn.Module:
    return tf.PhiForCausalLM(tf.PhiConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, partial_rotary_factor=0.5,
        resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
    ))


def _falcon() -> nn.Module:
    return tf.FalconForCausalLM(tf.FalconConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        hidden_dropout=0.0, attention_dropout=0.0, new_decoder_architecture=True,
        num_kv_heads=2,
    ))


def _mamba() -> nn.Module:
    return tf.MambaForCausalLM(tf.MambaConfig(
        vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
        conv_kernel=4, use_mambapy=False,
    ))


_ENCODER = {
    "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 64, "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}


def _bert() -> nn.Module:
    return tf.BertForMaskedLM(tf.BertConfig(**_ENCODER))


def _roberta() -> nn.Module:
    return tf.RobertaForMaskedLM(tf.RobertaConfig(**_ENCODER, pad_token_id=1))


def _t5() -> nn.Module:
    return tf.T5ForConditionalGeneration(tf.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, tie_word_embeddings=True,
    ))


def _bart() -> nn.Module:
    return tf.BartForConditionalGeneration(tf.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, forced_eos_token_id=None,
    ))


def _whisper() -> nn.Module:
    return tf.WhisperForConditionalGeneration(tf.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=16, encoder_layers=2, decoder_layers=2, d_model=32,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1, suppress_tokens=None,
        begin_suppress_tokens=None,
    ))


_VIT = {
    "image_size": 32, "patch_size": 8, "num_channels": 3, "hidden_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
    "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "num_labels": 10,
}


def _vit() -> nn.Module:
    return tf.ViTForImageClassification(tf.ViTConfig(**_VIT))


def _deit() -> nn.Module:
    return tf.DeiTForImageClassification(tf.DeiTConfig(**_VIT))


def _resnet() -> nn.Module:
    return tf.ResNetForImageClassification(tf.ResNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
        layer_type="basic", num_labels=10,
    ))


def _convnext() -> nn.Module:
    return tf.ConvNextForImageClassification(tf.ConvNextConfig(
        num_channels=3, patch_size=4, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10,
        drop_path_rate=0.0,
    ))


def _efficientnet() -> nn.Module:
    return tf.EfficientNetForImageClassification(tf.EfficientNetConfig(
        num_channels=3, image_size=32, width_coefficient=0.25, depth_coefficient=0.25,
        hidden_dim=320, num_labels=10, dropout_rate=0.0, drop_connect_rate=0.0,
    ))


class _Classifier(nn.Module):
    """A torchvision/timm classifier with a loss, called the way transformers models are."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(loss=nn.functional.cross_entropy(self.net(pixel_values), labels))


def _tv_resnet() -> nn.Module:
    resnet = import_torchvision().models.resnet
    return _Classifier(resnet.ResNet(resnet.BasicBlock, [1, 1, 1, 1], num_classes=10))


def _tv_densenet() -> nn.Module:
    models = import_torchvision().models
    return _Classifier(models.DenseNet(
        growth_rate=8, block_config=(2, 2), num_init_features=16, num_classes=10,
    ))


def _tv_vit() -> nn.Module:
    models = import_torchvision().models
    return _Classifier(models.VisionTransformer(
        image_size=64, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
        num_classes=10,
    ))


def _timm_resnet() -> nn.Module:
    return _Classifier(import_timm().create_model("resnet10t", pretrained=False, num_classes=10))


def _timm_convnext() -> nn.Module:
    return _Classifier(import_timm().create_model(
        "convnext_atto", pretrained=False, depths=(1, 1, 1, 1), num_classes=10,
    ))


ZOO: dict[str, Entry] = {
    # decoder LMs
    "gpt2": Entry(_gpt2, _causal_lm, "decoder, tied", tied=True, fast=True),
    "llama": Entry(_llama, _causal_lm, "decoder"),
    "qwen2": Entry(_qwen2, _causal_lm, "decoder"),
    "mistral": Entry(_mistral, _causal_lm, "decoder"),
    "gemma": Entry(_gemma, _causal_lm, "decoder, tied", tied=True),
    "gemma2": Entry(_gemma2, _causal_lm, "decoder, tied", tied=True),
    "gpt_neox": Entry(_gpt_neox, _causal_lm, "decoder"),
    "mixtral": Entry(_mixtral, _causal_lm, "decoder, MoE"),
    "opt": Entry(_opt, _causal_lm, "decoder, tied", tied=True),
    "phi": Entry(_phi, _causal_lm, "decoder"),
    "falcon": Entry(_falcon, _causal_lm, "decoder, tied", tied=True),
    "mamba": Entry(_mamba, _causal_lm, "state space, tied", tied=True),
    # encoder MLMs
    "bert": Entry(_bert, _masked_lm, "encoder MLM, tied decoder", tied=True),
    "roberta": Entry(_roberta, _masked_lm, "encoder MLM, tied decoder", tied=True),
    # seq2seq
    "t5": Entry(_t5, _seq2seq, "seq2seq, tied", tied=True),
    "bart": Entry(_bart, _seq2seq, "seq2seq, tied", tied=True),
    "whisper": Entry(_whisper, _speech, "speech seq2seq, tied", tied=True),
    # vision
    "vit": Entry(_vit, _images, "vision transformer"),
    "deit": Entry(_deit, _images, "vision transformer"),
    "resnet": Entry(_resnet, _images, "CNN, batch norm", fast=True),
    "convnext": Entry(_convnext, _images, "CNN, layer norm"),
    "efficientnet": Entry(_efficientnet, _images, "CNN, depthwise, squeeze-excite"),
    # torchvision and timm (tests/models/vision_libs.py: how they import beside CPU torch)
    "tv_resnet": Entry(_tv_resnet, _images64, "torchvision CNN, batch norm"),
    "tv_densenet": Entry(_tv_densenet, _images64, "torchvision CNN, concatenation"),
    "tv_vit": Entry(_tv_vit, _images64, "torchvision vision transformer"),
    "timm_resnet": Entry(_timm_resnet, _images64, "timm CNN, deep stem"),
    "timm_convnext": Entry(_timm_convnext, _images64, "timm CNN, layer norm"),
}


# --------------------------------------------------------------------------- comparison
@dataclass
class Run:
    losses: list[float]
    first_step_s: float
    steady_step_s: float  # the last step


@dataclass
class Result:
    cpu: Run
    neuron: Run
    max_param_diff: float  # largest |neuron - cpu| over parameters and float buffers
    worst_param: str
    fallbacks: dict[str, int]
    tied_groups: list[set[str]]  # parameters that are one object, before the move
    tied_kept: bool  # the same groups after the move to neuron


def _train(model: nn.Module, batch: dict[str, torch.Tensor], device: str) -> Run:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    batch = {k: v.to(device) for k, v in batch.items()}
    losses, times = [], []
    for _ in range(STEPS):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())  # waits for the step
        times.append(time.perf_counter() - start)
    # The second step still compiles (AdamW's state exists from then on); the last is steady.
    return Run(losses, times[0], times[-1])


def _shared_groups(model: nn.Module) -> list[set[str]]:
    """Names of parameters that are one object (tied), per object."""
    groups: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), set()).add(name)
    return [names for names in groups.values() if len(names) > 1]


def compare(name: str) -> Result:
    import torchneuron

    entry = ZOO[name]
    torch.manual_seed(0)
    cpu_model = entry.build()
    neuron_model = copy.deepcopy(cpu_model)
    batch = entry.batch(torch.Generator().manual_seed(1))
    tied_before = _shared_groups(neuron_model)
    neuron_model.to("neuron")
    tied_kept = _shared_groups(neuron_model) == tied_before
    cpu = _train(cpu_model, batch, "cpu")
    torchneuron.reset_op_counts()
    neuron = _train(neuron_model, batch, "neuron")
    fallbacks = torchneuron.fallback_ops()
    worst, worst_name = 0.0, ""
    cpu_state = dict(cpu_model.named_parameters()) | dict(cpu_model.named_buffers())
    neuron_state = dict(neuron_model.named_parameters()) | dict(neuron_model.named_buffers())
    for pname, t in neuron_state.items():
        if not t.is_floating_point():
            continue
        diff = (t.detach().cpu() - cpu_state[pname].detach()).abs().max().item()
        if diff > worst or worst_name == "":
            worst, worst_name = diff, pname
    return Result(cpu, neuron, worst, worst_name, fallbacks, tied_before, tied_kept)


def main(names: list[str]) -> None:
    for name in names or list(ZOO):
        r = compare(name)
        rel = max(abs(a - b) / abs(b) for a, b in zip(r.neuron.losses, r.cpu.losses))
        print(
            f"{name:13s} loss rel {rel:.1e}  param {r.max_param_diff:.1e} ({r.worst_param})  "
            f"tied {len(r.tied_groups)} kept {r.tied_kept}  cpu {r.cpu.first_step_s:.2f}/{r.cpu.steady_step_s:.3f}s  "
            f"neuron {r.neuron.first_step_s:.2f}/{r.neuron.steady_step_s:.3f}s  "
            f"losses {[round(v, 5) for v in r.cpu.losses]}  fallbacks {r.fallbacks}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
