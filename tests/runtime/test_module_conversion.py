"""Moving modules onto the device keeps PyTorch's parameter identity rules."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

DEV = "neuron"


@pytest.fixture
def swap_on_conversion():
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    yield
    torch.__future__.set_swap_module_params_on_conversion(previous)


def test_swap_is_off_by_default_so_rnn_state_dicts_load():
    assert not torch.__future__.get_swap_module_params_on_conversion()
    lstm = nn.LSTM(3, 4).to(DEV)
    lstm.load_state_dict(nn.LSTM(3, 4).state_dict())


def test_tied_weights_stay_tied_and_train_like_cpu(swap_on_conversion):
    torch.manual_seed(0)
    emb = nn.Embedding(10, 6)
    head = nn.Linear(6, 10, bias=False)
    head.weight = emb.weight
    cpu = nn.Sequential(emb, head)
    dev = nn.Sequential(nn.Embedding(10, 6), nn.Linear(6, 10, bias=False))
    dev[1].weight = dev[0].weight
    dev.load_state_dict(cpu.state_dict())
    param_before = dev[0].weight
    dev.to(DEV)
    assert dev[0].weight is dev[1].weight is param_before
    idx = torch.tensor([1, 2, 3])
    cpu(idx).square().sum().backward()
    dev(idx.to(DEV)).square().sum().backward()
    torch.testing.assert_close(dev[0].weight.grad.cpu(), cpu[0].weight.grad)


def test_parameters_keep_identity_for_optimizers_built_before_the_move():
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.to(DEV)
    model(torch.ones(1, 3, device=DEV)).sum().backward()
    opt.step()
    assert model.weight.device.type == "neuron"
    torch.testing.assert_close(model.bias.grad.cpu(), torch.ones(2))
