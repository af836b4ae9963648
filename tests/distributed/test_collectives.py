"""Collectives of the `neuron` process group on 2 ranks, each against Gloo on CPU tensors."""

from __future__ import annotations

import collective_cases
import pytest
from launch import run_ranks


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_ranks("collective_cases:run_all", tmp_path_factory.mktemp("coll"), timeout=240)


def _names():
    return list(collective_cases.cases(0, 2, None).keys())


@pytest.mark.parametrize("name", _names())
def test_collective_matches_gloo(results, name):
    for r in results:
        assert name in r.value, f"rank {r.rank} did not run {name}"
        assert r.value[name] is None, f"rank {r.rank}: {name}\n{r.value[name]}"


def test_subgroups(results):
    r0, r1 = (r.value["subgroup"] for r in results)
    assert r0["backend"] == "neuron"
    assert r0["solo"].tolist() == [1.0, 1.0, 1.0]  # rank 0 is not in the 1-rank group
    assert r1["solo"].tolist() == [2.0, 2.0, 2.0]  # a group of one: the value itself
    assert r0["pair"].tolist() == r1["pair"].tolist() == [3.0, 3.0, 3.0]


def test_mismatched_collective_raises(tmp_path):
    results = run_ranks("collective_cases:mismatch", tmp_path, timeout=120)
    for r in results:
        for what, other in (("shape", "float32[5]"), ("dtype", "float64[4]")):
            error = r.value[what]
            assert error is not None, f"rank {r.rank}: all_reduce with mismatched {what} did not raise"
            assert "mismatched collective" in error and "float32[4]" in error and other in error
        assert r.value["after"] == [2.0, 2.0]
