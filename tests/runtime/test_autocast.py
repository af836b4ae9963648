"""torch.autocast("neuron") and torch.amp.GradScaler("neuron"), compared with CPU autocast."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

LOW = [torch.bfloat16, torch.float16]


def _inputs(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g)
    w = torch.randn(8, 8, generator=g)
    img = torch.randn(1, 3, 8, 8, generator=g)
    k = torch.randn(4, 3, 3, 3, generator=g)
    target = torch.tensor([0, 1, 2, 3])
    return [t.to(device) for t in (x, w, img, k, target)]


# name -> fn(x, w, img, k, target); most start from a matmul so that low-precision inputs
# reach the op, as in a real network.
OPS = {
    "mm": lambda x, w, img, k, t: x @ w,
    "linear": lambda x, w, img, k, t: F.linear(x, w, w[0]),
    "addmm": lambda x, w, img, k, t: torch.addmm(x, x, w),
    "bmm": lambda x, w, img, k, t: torch.bmm(x[None], w[None]),
    "baddbmm": lambda x, w, img, k, t: torch.baddbmm(x[None], x[None], w[None]),
    "conv2d": lambda x, w, img, k, t: F.conv2d(img, k),
    "mse_loss": lambda x, w, img, k, t: F.mse_loss(x @ w, x),
    "l1_loss": lambda x, w, img, k, t: F.l1_loss(x @ w, x),
    "smooth_l1_loss": lambda x, w, img, k, t: F.smooth_l1_loss(x @ w, x),
    "cross_entropy": lambda x, w, img, k, t: F.cross_entropy(x @ w, t),
    "nll_loss": lambda x, w, img, k, t: F.nll_loss(x @ w, t),
    "bce_with_logits": lambda x, w, img, k, t: F.binary_cross_entropy_with_logits(x @ w, x.sigmoid()),
    "kl_div": lambda x, w, img, k, t: F.kl_div(x @ w, x.softmax(-1), reduction="batchmean"),
    "cdist": lambda x, w, img, k, t: torch.cdist(x @ w, x),
    "prod": lambda x, w, img, k, t: (x @ w).prod(),
    "relu": lambda x, w, img, k, t: F.relu(x @ w),
    "gelu": lambda x, w, img, k, t: F.gelu(x @ w),
    "add_fp32": lambda x, w, img, k, t: (x @ w) + x,
    "mean": lambda x, w, img, k, t: (x @ w).mean(),
    "max": lambda x, w, img, k, t: (x @ w).max(),
    "cat": lambda x, w, img, k, t: torch.cat([x @ w, x]),
    "stack": lambda x, w, img, k, t: torch.stack([x @ w, x]),
    "float64_mm": lambda x, w, img, k, t: x.double() @ w.double(),
    # float32 under the accelerator policy, low precision under CPU autocast (see DIFFERENT)
    "softmax": lambda x, w, img, k, t: torch.softmax(x @ w, -1),
    "log_softmax": lambda x, w, img, k, t: F.log_softmax(x @ w, -1),
    "sum": lambda x, w, img, k, t: (x @ w).sum(),
    "cumsum": lambda x, w, img, k, t: (x @ w).cumsum(0),
    "layer_norm": lambda x, w, img, k, t: F.layer_norm(x @ w, (8,)),
    "group_norm": lambda x, w, img, k, t: F.group_norm(F.conv2d(img, k), 2),
    "exp": lambda x, w, img, k, t: torch.exp(x @ w),
    "log": lambda x, w, img, k, t: torch.log((x @ w).abs() + 1),
    "pow": lambda x, w, img, k, t: (x @ w) ** 2,
    "logsumexp": lambda x, w, img, k, t: torch.logsumexp(x @ w, -1),
    "norm": lambda x, w, img, k, t: torch.linalg.vector_norm(x @ w),
}

# Ops that the accelerator (CUDA) policy runs in float32 and CPU autocast does not list.
DIFFERENT = {
    "softmax", "log_softmax", "sum", "cumsum", "layer_norm", "group_norm", "exp", "log", "pow",
    "logsumexp", "norm",
}


def _run(device: str, dtype: torch.dtype, name: str) -> torch.Tensor:
    with torch.autocast(device, dtype=dtype):
        return OPS[name](*_inputs(device))


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", sorted(OPS))
def test_output_dtype_matches_cpu_autocast(name: str, dtype: torch.dtype) -> None:
    cpu = _run("cpu", dtype, name)
    neuron = _run("neuron", dtype, name)
    if name in DIFFERENT:
        assert cpu.dtype == dtype, "CPU autocast changed: update DIFFERENT and docs"
        assert neuron.dtype == torch.float32
        expected = cpu.float() if cpu.dtype != torch.float32 else cpu
        # The neuron result is computed in float32 from the same low-precision input.
        torch.testing.assert_close(neuron.cpu(), expected, rtol=2e-2, atol=2e-2)
    else:
        assert neuron.dtype == cpu.dtype, f"{name}: neuron {neuron.dtype}, cpu {cpu.dtype}"
        tol = 1e-5 if cpu.dtype in (torch.float32, torch.float64) else 2e-2
        if name in ("prod", "cdist"):
            tol = 5e-2
        torch.testing.assert_close(neuron.cpu(), cpu, rtol=tol, atol=tol)


def test_autocast_is_available_and_dtypes_are_truthful() -> None:
    assert torch._C._is_autocast_available("neuron")
    supported = torch.neuron.get_amp_supported_dtype()
    assert set(supported) == {torch.bfloat16, torch.float16}
    assert torch.neuron.is_bf16_supported()
    # Each advertised dtype really computes on the device, forward and backward.
    for dtype in supported:
        a = torch.randn(8, 8)
        b = torch.randn(8, 8)
        an = a.to(dtype).to("neuron").requires_grad_()
        out = an @ b.to(dtype).to("neuron")
        out.sum().backward()
        assert out.dtype == dtype and an.grad.dtype == dtype
        torch.testing.assert_close(out.cpu(), a.to(dtype) @ b.to(dtype), rtol=2e-2, atol=5e-2)


def test_no_cast_outside_autocast_or_when_disabled() -> None:
    x = torch.randn(4, 4, device="neuron")
    assert (x @ x).dtype == torch.float32
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert (x @ x).dtype == torch.bfloat16
        with torch.autocast("neuron", enabled=False):
            assert (x @ x).dtype == torch.float32
        # CPU autocast does not touch neuron tensors, and neuron autocast not CPU tensors
        assert (x.cpu() @ x.cpu()).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (x @ x).dtype == torch.float32


def test_softmax_explicit_dtype_is_kept() -> None:
    x = torch.randn(4, 4, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        y = torch.softmax(x @ x, -1, dtype=torch.float64)
    assert y.dtype == torch.float64


def test_autocast_backward_grads_in_param_dtype() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    model = model.to("neuron")
    x = torch.randn(5, 8).to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = model(x)
        loss = F.cross_entropy(out, torch.tensor([0, 1, 2, 3, 0]).to("neuron"))
    assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    for p in model.parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32


def _train_scaled(device: str, dtype: torch.dtype, steps: int = 8) -> tuple[list[float], float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    x = torch.randn(64, 16)
    y = x[:, :1] * 2 - x[:, 1:2]
    model, x, y = model.to(device), x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return losses, scaler.get_scale()


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_grad_scaler_trains(dtype: torch.dtype) -> None:
    neuron, scale = _train_scaled("neuron", dtype)
    cpu, cpu_scale = _train_scaled("cpu", dtype)
    assert neuron[-1] < 0.8 * neuron[0], neuron
    assert scale == cpu_scale
    torch.testing.assert_close(torch.tensor(neuron), torch.tensor(cpu), rtol=3e-2, atol=1e-3)


def test_grad_scaler_skips_step_on_inf() -> None:
    p = torch.nn.Parameter(torch.ones(3, device="neuron"))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = torch.amp.GradScaler("neuron", init_scale=4.0)
    loss = (p * torch.tensor([1.0, float("inf"), 1.0], device="neuron")).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    torch.testing.assert_close(p.detach().cpu(), torch.ones(3))  # step skipped
    assert scaler.get_scale() == 2.0  # backed off
