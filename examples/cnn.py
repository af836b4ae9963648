"""A small CNN classifying synthetic 1x16x16 images (which quadrant holds a bright blob).

python examples/cnn.py --device neuron --steps 30
"""

from __future__ import annotations

import torch
from torch import nn

try:
    from example_utils import log_step, main
except ImportError:  # imported as examples.cnn
    from .example_utils import log_step, main


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 4),
    )


def make_data(n: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise images with a 4x4 bright patch in one of the four quadrants; the label is it."""
    labels = torch.randint(0, 4, (n,))
    images = 0.3 * torch.randn(n, 1, 16, 16)
    offsets = torch.randint(0, 4, (n, 2))
    for i in range(n):
        row = 8 * (labels[i] // 2) + offsets[i, 0]
        col = 8 * (labels[i] % 2) + offsets[i, 1]
        images[i, 0, row : row + 4, col : col + 4] += 1.0
    return images, labels


def train(device: str | torch.device, steps: int, seed: int = 0, log: bool = False) -> list[float]:
    """Train from a seeded CPU initialisation on `device`; return the loss of every step."""
    torch.manual_seed(seed)
    model = build_model()
    images, labels = make_data()
    model, images, labels = model.to(device), images.to(device), labels.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    for step in range(steps):
        batch = slice((step * 32) % 128, (step * 32) % 128 + 32)
        loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if log:
            log_step(step, losses[-1])
    return losses


if __name__ == "__main__":
    main(train, __doc__.splitlines()[0], default_steps=30)
