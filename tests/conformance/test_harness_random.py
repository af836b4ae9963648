"""The harness's moment check of random ops (harness._moments_over_seeds)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import harness  # noqa: E402


def _feature_alpha_dropout_sample():
    from torch.testing._internal.common_methods_invocations import op_db

    op = next(o for o in op_db if harness.op_id(o) == "nn.functional.feature_alpha_dropout.with_train")
    sample = next(s for s in op.sample_inputs("cpu", torch.float64) if s.kwargs.get("p") == 0.5)
    return op, sample, harness.to_device(sample)


def test_channelwise_randomness_judged_over_seeds():
    # 25 channel draws for 625 elements: one draw's std is far from CPU's for some seeds
    # (the OpInfo reseeds with 42), the spread over seeds is not.
    op, cpu, dev = _feature_alpha_dropout_sample()
    assert harness._moments_over_seeds(op, cpu, dev, 0) is None


def test_wrong_scale_still_caught():
    _, cpu, dev = _feature_alpha_dropout_sample()

    def scaled(x, p, training):
        out = F.feature_alpha_dropout(x, p, training)
        return out * 1.1 if x.device.type == "neuron" else out

    assert harness._moments_over_seeds(scaled, cpu, dev, 0) is not None
