"""Each example trains on the neuron device: losses are finite, go down, and match the CPU."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

STEPS = 5


# mlp runs in `make test`; cnn and char_gpt (a minute each) in `make test-slow`. char_gpt
# also trains on the device in tests/distributed/test_training.py.
@pytest.mark.parametrize("name", ["mlp", pytest.param("cnn", marks=pytest.mark.slow),
                                  pytest.param("char_gpt", marks=pytest.mark.slow)])
def test_example_trains_on_neuron(name: str) -> None:
    example = importlib.import_module(name)
    neuron = example.train("neuron", STEPS, seed=1)
    cpu = example.train("cpu", STEPS, seed=1)

    assert len(neuron) == STEPS
    assert all(math.isfinite(loss) for loss in neuron), neuron
    assert neuron[-1] < neuron[0], f"loss did not go down on neuron: {neuron}"
    torch.testing.assert_close(
        torch.tensor(neuron, dtype=torch.float64),
        torch.tensor(cpu, dtype=torch.float64),
        rtol=1e-4,
        atol=0,
    )


def test_example_default_device_is_neuron() -> None:
    """Code that asks `torch.accelerator` for the device lands on neuron without changes."""
    from example_utils import default_device

    assert default_device() == "neuron"
