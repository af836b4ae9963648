"""Fused optimizer steps and GradScaler helpers against CPU PyTorch, natively (strict mode)."""

from __future__ import annotations

import pytest
import torch

import torchneuron

DEV = "neuron"


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, generator=g), torch.randn(5, generator=g)]


def _run(device, make_opt, steps=3):
    params = [p.clone().to(device).requires_grad_() for p in _params()]
    opt = make_opt(params)
    for s in range(steps):
        for i, p in enumerate(params):
            p.grad = (_params(10 + s)[i] * (i + 1)).to(device)
        opt.step()
    return [p.detach().cpu() for p in params], opt


OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.1, fused=True),
    "adam-amsgrad-wd": lambda ps: torch.optim.Adam(ps, lr=0.05, weight_decay=0.1, amsgrad=True,
                                                   fused=True),
    "adamw-maximize": lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.2, maximize=True,
                                                   fused=True),
    "sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True,
                                               weight_decay=0.01, fused=True),
    "sgd-plain": lambda ps: torch.optim.SGD(ps, lr=0.1, fused=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_optimizers_match_cpu(name, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_STRICT", "1")
    torchneuron.reset_op_counts()
    cpu, cpu_opt = _run("cpu", OPTIMIZERS[name])
    dev, dev_opt = _run(DEV, OPTIMIZERS[name])
    for a, b in zip(cpu, dev):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    native = torchneuron.op_counts()["native"]
    assert any(k.startswith("aten._fused_") for k in native), native
    for state_cpu, state_dev in zip(cpu_opt.state.values(), dev_opt.state.values()):
        for key, value in state_cpu.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(state_dev[key].cpu(), value, rtol=1e-5, atol=1e-6)


def test_grad_scaler_helpers_match_cpu(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_STRICT", "1")
    grads = [torch.tensor([1.0, 2.0, 4.0]), torch.tensor([[8.0, -2.0]])]
    for poison in (None, float("inf"), float("nan")):
        results = []
        for device in ("cpu", DEV):
            gs = [g.clone().to(device) for g in grads]
            if poison is not None:
                gs[1][0, 1] = poison
            found = torch.zeros(1, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(gs, found, torch.full((1,), 0.5, device=device))
            scale = torch.full((1,), 1024.0, device=device)
            tracker = torch.full((1,), 1, dtype=torch.int32, device=device)
            torch._amp_update_scale_(scale, tracker, found, 2.0, 0.5, 2)
            results.append([t.cpu() for t in (*gs, found, scale, tracker)])
        for a, b in zip(*results):
            torch.testing.assert_close(b, a, equal_nan=True)


def test_grad_scaler_training_loop_runs_natively(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_STRICT", "1")
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 2).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    scaler = torch.amp.GradScaler(DEV)
    x = torch.randn(8, 6).to(DEV)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = model(x).square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
