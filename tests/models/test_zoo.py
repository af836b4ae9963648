"""The model zoo (tests/models/zoo.py): each tiny model trains for 3 AdamW steps on CPU and on
neuron from identical weights and batches. Per-step losses must agree to 1e-4 (relative),
parameters and float buffers to 1e-3 (absolute) after the last step, tied parameters must stay
one object through the move, and no op may fall back to CPU unless the entry lists it with a
reason.

`make test` runs the entries marked `fast` (a tied decoder and a CNN, about 25 s on two idle
cores); `make zoo` runs them all (marker `zoo`). Timings: docs/MODEL_ZOO.md.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")

from zoo import ZOO, compare  # noqa: E402


def _param(name: str):
    entry = ZOO[name]
    marks = [] if entry.fast else [pytest.mark.zoo]
    if entry.xfail:
        marks.append(pytest.mark.xfail(strict=True, reason=entry.xfail))
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_param(n) for n in ZOO])
def test_trains_like_cpu(name: str) -> None:
    entry = ZOO[name]
    result = compare(name)
    assert bool(result.tied_groups) == entry.tied, result.tied_groups
    assert result.tied_kept, "the move to neuron untied shared parameters"
    assert result.cpu.losses[-1] < result.cpu.losses[0], result.cpu.losses
    torch.testing.assert_close(
        torch.tensor(result.neuron.losses, dtype=torch.float64),
        torch.tensor(result.cpu.losses, dtype=torch.float64), rtol=1e-4, atol=0,
    )
    # AdamW moves a parameter by about LR per step, so after STEPS * LR = 3e-3 a wrong
    # gradient sign shows as a difference of up to 6e-3.
    assert result.max_param_diff <= 1e-3, (result.worst_param, result.max_param_diff)
    unexpected = set(result.fallbacks) - set(entry.fallbacks)
    assert not unexpected, {op: result.fallbacks[op] for op in unexpected}
