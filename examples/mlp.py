"""A small MLP regressing a fixed nonlinear function of synthetic inputs.

python examples/mlp.py --device neuron --steps 50
"""

from __future__ import annotations

import torch
from torch import nn

try:
    from example_utils import log_step, main
except ImportError:  # imported as examples.mlp
    from .example_utils import log_step, main


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(16, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.Tanh(),
        nn.Linear(64, 1),
    )


def make_data(n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 16)
    w = torch.randn(16, 1)
    y = torch.sin(x @ w) + 0.1 * x[:, :1] ** 2
    return x, y


def train(device: str | torch.device, steps: int, seed: int = 0, log: bool = False) -> list[float]:
    """Train from a seeded CPU initialisation on `device`; return the loss of every step."""
    torch.manual_seed(seed)
    model = build_model()
    x, y = make_data()
    model, x, y = model.to(device), x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if log:
            log_step(step, losses[-1])
    return losses


if __name__ == "__main__":
    main(train, __doc__.splitlines()[0], default_steps=50)
