"""torchneuron.library.custom_op: JAX functions as PyTorch operators, eager (neuron and CPU),
fake/meta, opcheck, autograd, mutation through views, and compiled graphs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch
import torch._dynamo
from torch import Tensor

import torchneuron
import torchneuron.library as tnlib
from torchneuron.runtime.plan import plan_for

NEURON = "neuron"


@tnlib.custom_op("tn_lib_test::rms_norm")
def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rms_norm_reference(x, weight, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight


@tnlib.custom_op("tn_lib_test::scale_add_", mutates_args={"x"})
def scale_add_(x: Tensor, y: Tensor, alpha: float) -> Tensor:
    """x += alpha * y; returns sum(y)."""
    return jnp.sum(y), x + alpha * y


@tnlib.custom_op("tn_lib_test::split_stats")
def split_stats(x: Tensor, *, power: int = 2, center: bool = True) -> tuple[Tensor, Tensor]:
    """(mean, mean of |x - mean|**power) along the last dim; kwarg-only Python scalars."""
    mean = jnp.mean(x, axis=-1)
    dev = x - mean[..., None] if center else x
    return mean, jnp.mean(jnp.abs(dev) ** power, axis=-1)


@tnlib.custom_op("tn_lib_test::round_ste")
def round_ste(x: Tensor) -> Tensor:
    return jnp.round(x)


@round_ste.register_autograd
def _round_ste_backward(x, *, output, grad):
    return (grad,)  # straight-through: jax.vjp of round would give zeros


@tnlib.custom_op("tn_lib_test::weighted_sum")
def weighted_sum(xs: list[Tensor], w: Tensor | None) -> Tensor:
    total = sum(xs)
    return total if w is None else total * w


@pytest.fixture(autouse=True)
def _fresh(fresh_compile_state):
    """A new cache directory, Dynamo state and compile counters per test (tests/conftest.py)."""


@pytest.fixture
def graphs(monkeypatch):
    """The FX graphs handed to the compiler's interpreter."""
    from torchneuron.compiler import graph

    seen = []
    original = graph.CompiledGraph.__init__

    def spy(self, gm, options):
        seen.append(gm)
        original(self, gm, options)

    monkeypatch.setattr(graph.CompiledGraph, "__init__", spy)
    return seen


def _targets(gm) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def test_the_op_is_a_pytorch_operator_with_an_inferred_schema():
    op = torch.ops.tn_lib_test.rms_norm.default
    assert rms_norm.opoverload is op
    assert str(op._schema) == ("tn_lib_test::rms_norm(Tensor x, Tensor weight, "
                               "float eps=9.9999999999999995e-07) -> Tensor")
    assert "Tensor(a0!) x" in str(torch.ops.tn_lib_test.scale_add_.default._schema)


@pytest.mark.parametrize("device", ["cpu", NEURON])
def test_eager_matches_the_reference(device):
    torch.manual_seed(0)
    x, w = torch.randn(4, 8, device=device), torch.randn(8, device=device)
    torch.testing.assert_close(rms_norm(x, w).cpu(), rms_norm_reference(x, w).cpu())
    torch.testing.assert_close(rms_norm(x, w, 0.5).cpu(), rms_norm_reference(x, w, 0.5).cpu())
    assert rms_norm(x, w).device.type == device


def test_neuron_calls_run_natively_with_one_executable_per_signature():
    torchneuron.reset_op_counts()
    plan = plan_for(rms_norm.opoverload)
    plan.cache.clear()
    x, w = torch.randn(3, 5, device=NEURON), torch.randn(5, device=NEURON)
    for _ in range(3):
        rms_norm(x, w)
    assert len(plan.cache) == 1
    rms_norm(torch.randn(2, 5, device=NEURON), w)
    assert len(plan.cache) == 2
    counts = torchneuron.op_counts()
    assert counts["native"]["tn_lib_test.rms_norm.default"] == 4
    assert "tn_lib_test.rms_norm.default" not in counts["fallback"]


def test_non_contiguous_and_view_inputs():
    base = torch.randn(8, 6)
    x_cpu = base.t()[1:5]  # a strided view
    x = base.to(NEURON).t()[1:5]
    w = torch.randn(8)
    torch.testing.assert_close(rms_norm(x, w.to(NEURON)).cpu(), rms_norm_reference(x_cpu, w))
    torch.testing.assert_close(rms_norm(x_cpu, w), rms_norm_reference(x_cpu, w))


def test_fake_tensor_shapes_come_from_eval_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        mean, spread = split_stats(torch.empty(2, 3, 7, dtype=torch.float64))
    assert mean.shape == spread.shape == (2, 3)
    assert mean.dtype == torch.float64
    meta = rms_norm(torch.empty(4, 8, device="meta"), torch.empty(8, device="meta"))
    assert meta.shape == (4, 8) and meta.device.type == "meta"


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_on_cpu(requires_grad):
    x = torch.randn(3, 5, requires_grad=requires_grad)
    w = torch.randn(5, requires_grad=requires_grad)
    torch.library.opcheck(rms_norm.opoverload, (x, w))
    torch.library.opcheck(split_stats.opoverload, (torch.randn(4, 6, requires_grad=requires_grad),),
                          {"power": 3})
    torch.library.opcheck(scale_add_.opoverload, (torch.zeros(3, 4)[:, 1], torch.ones(3), 2.0))


# PyTorch's test_autograd_registration refuses devices other than CPU/CUDA/XPU (it raises
# NotImplementedError); the Autograd kernel it would look for is the same one the CPU run checks.
_NEURON_UTILS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_on_neuron(requires_grad):
    x = torch.randn(3, 5, device=NEURON, requires_grad=requires_grad)
    w = torch.randn(5, device=NEURON, requires_grad=requires_grad)
    torch.library.opcheck(rms_norm.opoverload, (x, w), test_utils=_NEURON_UTILS)
    torch.library.opcheck(split_stats.opoverload, (torch.randn(4, 6, device=NEURON),),
                          {"power": 3}, test_utils=_NEURON_UTILS)
    target = torch.zeros(3, 4, device=NEURON)[:, 1]
    torch.library.opcheck(scale_add_.opoverload, (target, torch.ones(3, device=NEURON), 2.0),
                          test_utils=_NEURON_UTILS)


@pytest.mark.parametrize("device", ["cpu", NEURON])
def test_gradcheck_through_jax_vjp(device):
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(rms_norm, (x, w))
    assert torch.autograd.gradcheck(lambda t: split_stats(t, power=3), (x,))


@tnlib.custom_op("tn_lib_test::conj_mix")
def conj_mix(x: Tensor, y: Tensor) -> Tensor:
    return x * jnp.conj(y) + jnp.sin(x)


@pytest.mark.parametrize("device", ["cpu", NEURON])
def test_complex_gradients_follow_pytorch_convention(device):
    # PyTorch's complex gradient is the conjugate of JAX's cotangent; a non-holomorphic
    # function (conj) tells the conventions apart. (Inputs drawn on CPU, then moved.)
    x, y = (torch.randn(3, dtype=torch.complex128).to(device).requires_grad_() for _ in range(2))
    assert torch.autograd.gradcheck(conj_mix, (x, y))


def test_gradients_match_the_built_in_ops_on_neuron():
    torch.manual_seed(0)
    x = torch.randn(4, 8, device=NEURON, requires_grad=True)
    w = torch.randn(8, device=NEURON, requires_grad=True)
    g = torch.randn(4, 8, device=NEURON)
    ours = torch.autograd.grad(rms_norm(x, w), (x, w), g)
    builtin = torch.autograd.grad(rms_norm_reference(x, w), (x, w), g)
    for a, b in zip(ours, builtin):
        torch.testing.assert_close(a.cpu(), b.cpu())
    assert "tn_lib_test.rms_norm_backward.default" in torchneuron.op_counts()["native"]


@pytest.mark.parametrize("device", ["cpu", NEURON])
def test_a_registered_backward_replaces_jax_vjp(device):
    x = torch.tensor([0.2, 1.7, -2.4], device=device, requires_grad=True)
    g = torch.tensor([1.0, 2.0, 3.0], device=device)
    (grad,) = torch.autograd.grad(round_ste(x), x, g)
    torch.testing.assert_close(grad.cpu(), g.cpu())  # jax.vjp of round would be zeros


def test_register_autograd_after_the_first_backward_is_refused():
    x = torch.randn(3, device=NEURON, requires_grad=True)
    rms_norm(x, torch.ones(3, device=NEURON)).sum().backward()
    with pytest.raises(RuntimeError, match="before the op is first differentiated"):
        rms_norm.register_autograd(lambda x, weight, eps, *, output, grad: (grad, None, None))


def test_tensor_lists_optional_tensors_and_their_gradients():
    xs = [torch.randn(3, dtype=torch.float64, device=NEURON, requires_grad=True) for _ in range(2)]
    w = torch.randn(3, dtype=torch.float64, device=NEURON, requires_grad=True)
    torch.testing.assert_close(weighted_sum(xs, None).cpu(), (xs[0] + xs[1]).cpu())
    assert torch.autograd.gradcheck(lambda a, b, c: weighted_sum([a, b], c), (*xs, w))


@pytest.mark.parametrize("device", ["cpu", NEURON])
def test_multiple_outputs_and_kwarg_only_scalars(device):
    x = torch.randn(2, 6, dtype=torch.float64, device=device)
    mean, spread = split_stats(x, power=3, center=False)
    torch.testing.assert_close(mean.cpu(), x.mean(-1).cpu())
    torch.testing.assert_close(spread.cpu(), (x.abs() ** 3).mean(-1).cpu())
    _, centered = split_stats(x)
    torch.testing.assert_close(centered.cpu(), ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1).cpu())


@pytest.mark.parametrize("device", ["cpu", NEURON])
def test_mutation_writes_through_a_view(device):
    x = torch.zeros(3, 4, device=device)
    y = torch.arange(3.0, device=device)
    version = x._version
    total = scale_add_(x[:, 1], y, 2.0)
    expected = torch.zeros(3, 4)
    expected[:, 1] = 2 * torch.arange(3.0)
    torch.testing.assert_close(x.cpu(), expected)
    torch.testing.assert_close(total.cpu(), torch.tensor(3.0))
    assert x._version > version  # autograd sees the write


def test_mutation_on_neuron_is_one_native_call():
    x, y = torch.zeros(3, 4, device=NEURON), torch.ones(3, device=NEURON)
    torchneuron.reset_op_counts()
    scale_add_(x[:, 2], y, 1.0)
    counts = torchneuron.op_counts()
    assert counts["native"] == {"tn_lib_test.scale_add_.default": 1}
    assert not counts["fallback"] and not counts["decomposed"]


def test_a_wrong_number_of_results_is_a_clear_error():
    @tnlib.custom_op("tn_lib_test::forgets_mutation", mutates_args={"x"})
    def forgets_mutation(x: Tensor) -> Tensor:
        return x * 2  # the new value of x is missing

    message = r"returned 1 value\(s\), expected 2.*mutates_args \['x'\]"
    with pytest.raises(RuntimeError, match=message):
        forgets_mutation(torch.ones(2))
    with pytest.raises(RuntimeError, match="expected 2"):
        forgets_mutation(torch.ones(2, device=NEURON))


def test_definition_errors():
    with pytest.raises(ValueError, match="unknown"):
        tnlib.custom_op("tn_lib_test::bad1", lambda x: x, mutates_args="unknown")

    def no_tensor(n: int) -> Tensor:
        return jnp.zeros(n)

    with pytest.raises(ValueError, match="needs a Tensor argument"):
        tnlib.custom_op("tn_lib_test::bad2", no_tensor)


# -- compiled graphs ------------------------------------------------------------------------


def test_compiled_inference_is_one_executable_containing_the_op(graphs):
    def f(x, w):
        return rms_norm(x.sin(), w) * 2

    x, w = torch.randn(4, 8, device=NEURON), torch.randn(8, device=NEURON)
    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, w).cpu(), f(x, w).cpu())
        compiled(x, w)
    stats = torchneuron.compile_stats()
    assert stats["eager_fallbacks"] == 0
    assert stats["graphs_compiled"] == 1 and stats["xla_compilations"] == 1
    assert stats["memory_cache_hits"] == 1
    assert "tn_lib_test.rms_norm.default" in _targets(graphs[0])


def test_compiled_training_runs_forward_and_backward_ops_in_the_graphs(graphs):
    torch.manual_seed(0)
    x = torch.randn(4, 8, device=NEURON, requires_grad=True)
    w = torch.randn(8, device=NEURON, requires_grad=True)

    def f(x, w):
        mean, spread = split_stats(rms_norm(x, w))
        return (mean * spread).sum()

    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    grads = torch.autograd.grad(compiled(x, w), (x, w))
    expected = torch.autograd.grad(f(x, w), (x, w))
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a.cpu(), b.cpu())
    stats = torchneuron.compile_stats()
    assert stats["eager_fallbacks"] == 0 and stats["xla_compilations"] == 2
    forward, backward = (_targets(g) for g in graphs)
    assert {"tn_lib_test.rms_norm.default", "tn_lib_test.split_stats.default"} <= forward
    assert {"tn_lib_test.rms_norm_backward.default",
            "tn_lib_test.split_stats_backward.default"} <= backward


def test_compiled_mutation_through_a_view(graphs):
    def f(x, y):
        total = scale_add_(x[:, 1], y, 3.0)
        return total * 2

    x = torch.zeros(3, 4, device=NEURON)
    y = torch.arange(3.0, device=NEURON)
    out = torch.compile(f, backend="neuron", fullgraph=True)(x, y)
    torch.testing.assert_close(out.cpu(), torch.tensor(6.0))
    expected = torch.zeros(3, 4)
    expected[:, 1] = 3 * torch.arange(3.0)
    torch.testing.assert_close(x.cpu(), expected)
    stats = torchneuron.compile_stats()
    assert stats["eager_fallbacks"] == 0 and stats["xla_compilations"] == 1
    # Functionalization replaced the mutating op by its functional twin.
    assert "tn_lib_test.scale_add__functional.default" in _targets(graphs[0])


@tnlib.custom_op("tn_lib_test::stack_halves")
def stack_halves(x: Tensor) -> Tensor:
    """Rows of x followed by their pairwise means: 2n - 1 rows (a computed output shape)."""
    return jnp.concatenate([x, (x[1:] + x[:-1]) / 2])


def test_dynamic_shapes_trace_once_and_compile_per_shape():
    def f(x, w):
        return stack_halves(rms_norm(x, w)).sum(-1)

    compiled = torch.compile(f, backend="neuron", dynamic=True, fullgraph=True)
    w = torch.randn(8, device=NEURON)
    with torch.no_grad():
        for batch in (3, 5, 7):
            x = torch.randn(batch, 8, device=NEURON)
            torch.testing.assert_close(compiled(x, w).cpu(), f(x, w).cpu())
    stats = torchneuron.compile_stats()
    assert stats["graphs_compiled"] == 1  # symbolic shapes through jax.eval_shape: no re-trace
    assert stats["xla_compilations"] == 3 and stats["eager_fallbacks"] == 0
