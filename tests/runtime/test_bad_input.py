"""Bad input the neuron device must refuse as CPU refuses it (issue 10, point 4): each case
runs on CPU and on the device, and both must raise the same exception type, with CPU's
message where the device's own check raises it."""

from __future__ import annotations

import pytest
import torch

import torchneuron  # noqa: F401  (registers the neuron device)


def _raises_like_cpu(fn, match: str | None = None) -> None:
    """fn(device) raises on the device exactly when, and with the type that, it raises on CPU."""
    errors = []
    for device in ("cpu", "neuron"):
        try:
            fn(device)
            errors.append(None)
        except Exception as err:  # noqa: BLE001 - the type is what is compared
            errors.append(err)
    cpu, neuron = errors
    assert cpu is not None, "the case must be one CPU refuses"
    assert type(neuron) is type(cpu), f"CPU raised {cpu!r}, neuron {neuron!r}"
    if match is not None:
        assert match in str(neuron), str(neuron)


_OVERLAP = "refer to a single memory location"


@pytest.mark.parametrize(
    "fn",
    [
        lambda d: (lambda x: torch.cat([x, torch.ones(4, 6, device=d)], 0, out=x))(
            torch.ones(4, 6, device=d)),
        lambda d: (lambda x: torch.cat([torch.ones(2, 6, device=d), x], 0, out=x[:2]))(
            torch.ones(4, 6, device=d)),
        lambda d: (lambda x: torch.cat([x, torch.ones(3, device=d)], out=x))(
            torch.empty(0, device=d)),
        lambda d: (lambda x: torch.stack([x, x], out=x))(torch.ones(3, device=d)),
    ],
    ids=["cat_out_is_input", "cat_out_overlaps_input", "cat_out_is_empty_input", "stack"],
)
def test_out_overlapping_a_listed_input(fn) -> None:
    _raises_like_cpu(fn, _OVERLAP)


def test_out_identical_to_empty_input_allowed_for_elementwise() -> None:
    x = torch.empty(0, device="neuron")
    assert torch.add(x, 1, out=x).shape == (0,)
