"""Moving modules to and from the device keeps shared parameters and buffers shared, with no
setting (runtime/module_conversion.py): identity, requires_grad, hooks and .grad survive every
conversion, and load_state_dict (nn.LSTM/nn.GRU included) works as on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from torchneuron.tools import launch

DEV = "neuron"


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight, two modules sharing one buffer,
    and a frozen parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight
        self.norm = nn.LayerNorm(6)
        self.norm.weight.requires_grad_(False)
        scale = torch.linspace(0.5, 1.5, 6)
        self.emb.register_buffer("scale", scale)
        self.norm.register_buffer("scale", scale)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.emb(idx) * self.emb.scale) * self.norm.scale)


def _to_neuron(m):
    return m.to("neuron")


def _to_device(m):
    return m.to(torch.device("neuron", 0))


def _neuron_method(m):
    return m.neuron()


def _cuda_under_run(m):
    launch.install("neuron")
    try:
        return m.cuda()
    finally:
        launch.uninstall()


def _to_float64(m):
    return m.to(DEV).to(dtype=torch.float64)


def _and_back(m):
    return m.to(DEV).to("cpu")


def _half_and_back(m):
    return m.to(DEV).half().to("cpu", torch.float32)


CONVERSIONS = {
    "to_str": _to_neuron, "to_device": _to_device, "neuron": _neuron_method,
    "cuda_under_run": _cuda_under_run, "to_dtype": _to_float64, "to_cpu": _and_back,
    "half_and_back": _half_and_back,
}


@pytest.mark.parametrize("name", sorted(CONVERSIONS))
def test_shared_parameters_and_buffers_stay_one_object(name: str) -> None:
    torch.manual_seed(0)
    model = Tied()
    weight, frozen, bias = model.emb.weight, model.norm.weight, model.norm.bias
    expected = model.emb.weight.detach().clone()
    out = CONVERSIONS[name](model)
    assert out is model
    assert model.emb.weight is model.head.weight is weight
    assert model.norm.weight is frozen and model.norm.bias is bias
    assert model.emb.scale is model.norm.scale
    assert weight.requires_grad and bias.requires_grad and not frozen.requires_grad
    assert isinstance(weight, nn.Parameter) and weight.is_leaf
    assert not torch.__future__.get_swap_module_params_on_conversion()
    if name == "half_and_back":  # went through float16: one rounding to 11 significant bits
        expected = expected.half().float()
    torch.testing.assert_close(weight.detach().cpu().to(expected.dtype), expected)


def test_hooks_and_grad_survive_each_conversion() -> None:
    torch.manual_seed(0)
    model = Tied()
    weight = model.emb.weight
    calls: list[str] = []
    weight.register_hook(lambda g: calls.append("hook"))
    removed = weight.register_hook(lambda g: calls.append("removed"))
    weight.register_post_accumulate_grad_hook(lambda p: calls.append("post"))
    weight.grad = torch.full_like(weight, 2.0)
    for convert in (
        lambda m: m.to(DEV), lambda m: m.double(), lambda m: m.cpu(), lambda m: m.neuron(),
    ):
        convert(model)
        assert weight.grad.device == weight.device and weight.grad.dtype == weight.dtype
        assert torch.all(weight.grad.cpu() == 2.0)
        removed.remove()
        calls.clear()
        model(torch.tensor([1, 2], device=weight.device)).sum().backward()
        assert calls == ["hook", "post"]  # once each: not lost, not installed twice
        weight.grad = torch.full_like(weight, 2.0)


def test_tied_gradient_and_training_match_cpu() -> None:
    torch.manual_seed(0)
    cpu = Tied()
    dev = Tied()
    dev.load_state_dict(cpu.state_dict())
    dev.to(DEV)
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=0.05)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=0.05)
    idx = torch.tensor([[1, 2, 3], [4, 5, 6]])
    target = torch.tensor([[2, 3, 4], [5, 6, 7]])
    for _ in range(4):
        for model, opt, dev_ in ((cpu, opt_cpu, "cpu"), (dev, opt_dev, DEV)):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(idx.to(dev_)).flatten(0, 1), target.flatten().to(dev_))
            loss.backward()
            opt.step()
        torch.testing.assert_close(dev.emb.weight.grad.cpu(), cpu.emb.weight.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dev.head.weight.detach().cpu(), cpu.head.weight.detach(), rtol=1e-5, atol=1e-6)


def test_optimizer_built_before_the_move_updates_the_moved_parameters() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = model.weight.detach().clone()
    model.to(DEV)
    model(torch.ones(1, 3, device=DEV)).sum().backward()
    opt.step()
    assert model.weight.device.type == "neuron"
    torch.testing.assert_close(model.weight.detach().cpu(), before - 0.5)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_rnn_state_dicts_load_after_conversions(cls) -> None:
    torch.manual_seed(0)
    rnn = cls(3, 4, num_layers=2).to(DEV)
    source = cls(3, 4, num_layers=2)
    rnn.load_state_dict(source.state_dict())
    x = torch.randn(5, 2, 3)
    torch.testing.assert_close(rnn(x.to(DEV))[0].cpu(), source(x)[0], rtol=1e-5, atol=1e-6)
    rnn.to("cpu")
    rnn.load_state_dict(cls(3, 4, num_layers=2).state_dict())
    rnn.load_state_dict(source.state_dict())
    torch.testing.assert_close(rnn(x)[0], source(x)[0])


def test_swap_mode_only_while_a_neuron_conversion_runs() -> None:
    """CPU-only conversions take PyTorch's own path; a neuron conversion converts each tensor
    exactly once (the target is found without converting anything twice)."""
    model = Tied()
    seen: list[tuple[tuple[int, ...], bool]] = []

    def recording(device):
        def fn(t):
            seen.append((tuple(t.shape), torch.__future__.get_swap_module_params_on_conversion()))
            return t.to(device)

        return fn

    model._apply(recording("cpu"))
    assert seen and not any(swap for _, swap in seen)
    cpu_calls = [shape for shape, _ in seen]
    seen.clear()
    model._apply(recording(DEV))
    # The same calls as on CPU (the tied weight once per module, as _apply does), less the
    # second conversion of the shared buffer; swap mode is on for all calls but the first
    # (that one is converted before _apply starts, to find the target device).
    assert cpu_calls == [(10, 6), (6,), (10, 6), (6,), (6,), (6,)]  # emb, head, norm
    assert [shape for shape, _ in seen] == cpu_calls[:-1]
    assert all(swap for _, swap in seen[1:])
    assert not torch.__future__.get_swap_module_params_on_conversion()
    assert model.emb.weight is model.head.weight and model.emb.weight.device.type == "neuron"


def test_a_parameter_shared_by_two_submodules_moves_there_and_back() -> None:
    shared = nn.Parameter(torch.randn(4, 4))
    model = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Sequential(nn.ReLU(), nn.Linear(4, 4))})
    model["a"].weight = shared
    model["b"][1].weight = shared
    model.to(DEV)
    assert model["a"].weight is model["b"][1].weight is shared and shared.device.type == "neuron"
    assert len(list(model.parameters())) == 3
    model.to("cpu")
    assert model["a"].weight is model["b"][1].weight is shared and shared.device.type == "cpu"


def test_user_swap_setting_is_left_as_it_was() -> None:
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model = Tied().to(DEV)
        assert model.emb.weight is model.head.weight
        assert torch.__future__.get_swap_module_params_on_conversion()
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)


def test_conversion_within_the_device_while_a_graph_uses_the_parameters() -> None:
    # test_nn test_conv_empty_input: conv.to(memory_format=channels_last) after a forward
    # (its graph still holds the weight) raised "_apply(): Couldn't swap Conv2d.weight"; CPU
    # assigns param.data, and so can two neuron tensors.
    model = Tied().to(DEV)
    weight, calls = model.emb.weight, []
    weight.register_hook(lambda g: calls.append(g.shape))
    loss = model(torch.tensor([[1, 2, 3]], device=DEV)).sum()  # a graph that uses weight
    model.to(torch.float64)
    assert model.emb.weight is model.head.weight is weight and weight.dtype == torch.float64
    assert not torch.__future__.get_swap_module_params_on_conversion()
    model(torch.tensor([[1, 2, 3]], device=DEV)).sum().backward()
    assert calls and weight.grad.dtype == torch.float64
    del loss
    conv = nn.Conv2d(4, 4, 3).to(DEV)
    conv(torch.randn(0, 4, 8, 8, device=DEV))
    conv_weight = conv.weight
    conv.to(memory_format=torch.channels_last)
    assert conv.weight is conv_weight and conv.weight.is_contiguous(memory_format=torch.channels_last)
