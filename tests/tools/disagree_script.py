"""Reports a loss that depends on the device: `torchneuron verify` must say the runs differ."""

import torch

device = "cuda"  # remapped to each run's device by torchneuron run/verify


def losses(device, steps=3):
    x = torch.ones(3, device=device)
    bump = 0.5 if x.device.type == "neuron" else 0.0
    return [float(x.sum()) / (step + 1) + bump for step in range(steps)]


if __name__ == "__main__":
    for step, value in enumerate(losses(device)):
        print(f"step {step} loss: {value:.6f}")
