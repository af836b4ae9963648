"""Adaptive eager (runtime/fusion.py): recorded op runs give the results op-by-op execution
gives, run at every point a value is needed, and keep their caches bounded."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import numpy as np
import pytest
import torch

import torchneuron
from torchneuron.runtime import _native, fusion, plan, storage

pytestmark = pytest.mark.skipif(not fusion.recording() and fusion.Pending is None,
                                reason="fusion needs the C++ library, which this process could not build")

DEV = "neuron"


def _unfused(fn):
    before = fusion.recording()
    fusion.set_enabled(False)
    try:
        return fn()
    finally:
        fusion.set_enabled(before)


def _flushes() -> int:
    return torchneuron.fusion_stats()["flushes"]


def test_ops_are_recorded_and_run_when_a_value_is_read(fused):
    x = torch.arange(12.0).reshape(3, 4).to(DEV)
    fusion.flush()
    before = _flushes()
    y = (x * 2 + 1).relu().sum(0)
    assert fusion.is_pending(y.untyped_storage()._neuron_payload.buf)
    assert _flushes() == before  # nothing ran yet
    assert y.cpu().tolist() == ((torch.arange(12.0).reshape(3, 4) * 2 + 1).relu().sum(0)).tolist()
    assert _flushes() == before + 1


@pytest.mark.parametrize("sync", [
    lambda y: y.sum().item(),
    lambda y: y.cpu(),
    lambda y: str(y),
    lambda y: bool(y.sum() > 0),
    lambda y: y.tolist(),
    lambda y: torch.nonzero(y),  # a data-dependent output shape
    lambda y: torch.neuron.synchronize(),
    lambda y: torch.save(y, io.BytesIO()),
    lambda y: torch.ops.tn_test.cpu_only_scale(y, 2.0),  # a CPU fallback (tests/conftest.py)
])
def test_every_sync_point_runs_the_trace(fused, sync):
    x = torch.randn(5, 3).to(DEV)
    fusion.flush()
    before = _flushes()
    y = x.exp() - 1
    assert _flushes() == before
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sync(y)
    # str() goes on computing on the now-real y (formatting), which may flush again
    assert _flushes() >= before + 1
    assert not fusion.is_pending(y.untyped_storage()._neuron_payload.buf)
    torch.testing.assert_close(y.cpu(), x.cpu().exp() - 1)


def _program(device):
    """Views, in-place writes through views, aliasing and out=, as a user program mixes them."""
    torch.manual_seed(0)
    a = torch.randn(6, 8).to(device)
    b = torch.randn(8, 6).to(device)
    c = a @ b
    v = c[1:4, ::2]  # a strided view
    v.mul_(3).add_(1)  # written through the view: c changes
    t = a.t()
    t[2:5].clamp_(min=-0.5, max=0.5)  # a write through a transposed view of a
    d = torch.empty(6, 6, device=device)
    torch.add(c, a @ b, alpha=0.5, out=d)
    e = d.view(36)[::5].clone()
    e.sub_(e.mean())
    f = torch.where(c > 0, c, -c).cumsum(1)
    return [a, b, c, d, e, f, a.sum(1, keepdim=True).expand(6, 3).contiguous()]


def test_fused_results_equal_op_by_op_and_cpu(fused):
    cpu = _program("cpu")
    fused_results = [r.cpu() for r in _program(DEV)]
    unfused = _unfused(lambda: [r.cpu() for r in _program(DEV)])
    for c, f, u in zip(cpu, fused_results, unfused):
        torch.testing.assert_close(f, u, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(f, c, rtol=1e-5, atol=1e-5)


def test_views_data_ptr_and_base_behave_as_op_by_op(fused):
    x = torch.zeros(4, 4, device=DEV)
    row = x[1]
    row.add_(5)
    assert row._base is x and row.data_ptr() == x.data_ptr() + 4 * 4
    assert row.storage_offset() == 4
    assert x.sum().item() == 20.0


def _random_sequence(seed: int, device: str) -> list[torch.Tensor]:
    """A seeded random run of out-of-place ops, views and in-place writes through views on int64
    tensors, so fused, op-by-op and CPU must agree exactly."""
    import random

    rnd = random.Random(seed)
    base = torch.arange(48, dtype=torch.int64).reshape(6, 8).to(device)
    live = [base, base.clone() * 3]
    for _ in range(25):
        a = live[rnd.randrange(len(live))]
        b = live[rnd.randrange(len(live))]
        choice = rnd.randrange(8)
        if choice == 0 and a.shape == b.shape:
            live.append(a + b)
        elif choice == 1:
            live.append(a * rnd.randint(-3, 3))
        elif choice == 2 and a.dim() == 2:
            live.append(a.t())  # a view
        elif choice == 3 and a.dim() == 2 and a.shape[0] > 1:
            live.append(a[1:])  # a view with an offset
        elif choice == 4:
            a.add_(rnd.randint(1, 5))  # writes through to every alias of a's storage
        elif choice == 5 and a.dim() == 2:
            a[:, :1].mul_(2)  # in place through a strided view
        elif choice == 6:
            live.append(a.sum(0, keepdim=a.dim() > 1))
        else:
            live.append(torch.where(a > 20, a, -a))
    return live


@pytest.mark.parametrize("seed", range(4))
def test_random_op_sequences_with_views_equal_op_by_op(fused, seed):
    cpu = _random_sequence(seed, "cpu")
    fused_results = [t.cpu() for t in _random_sequence(seed, DEV)]
    unfused = _unfused(lambda: [t.cpu() for t in _random_sequence(seed, DEV)])
    assert len(cpu) == len(fused_results) == len(unfused)
    for c, f, u in zip(cpu, fused_results, unfused):
        assert torch.equal(f, u) and torch.equal(f, c)


def test_random_streams_equal_op_by_op(fused):
    def draws():
        torch.manual_seed(123)
        x = torch.randn(64, device=DEV)
        y = torch.nn.functional.dropout(torch.ones(64, device=DEV), 0.5)
        z = torch.rand(8, device=DEV)
        return [x.cpu(), y.cpu(), z.cpu()]

    for f, u in zip(draws(), _unfused(draws)):
        assert torch.equal(f, u)


def test_dead_intermediates_are_not_kept(fused):
    x = torch.randn(32, 32, device=DEV)
    fusion.flush()
    before = torchneuron.fusion_stats()
    for i in range(20):
        y = x * (i + 1)  # each y dies when the next one is made
    last = y.sum()
    assert last.item() == pytest.approx((x.cpu() * 20).sum().item(), rel=1e-5)
    after = torchneuron.fusion_stats()
    assert after["ops"] - before["ops"] == 21
    # only the live ones leave the program: the twentieth y and `last`, not the 19 dead ys
    assert after["values_kept"] - before["values_kept"] == 2
    allocated = torch.neuron.memory_allocated()
    del y, last
    assert torch.neuron.memory_allocated() < allocated  # accounting follows the live tensors


def test_training_loop_reaches_a_steady_state(fused):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 8).to(DEV), torch.randn(32, 1).to(DEV)

    def step(lr):
        for group in opt.param_groups:
            group["lr"] = lr  # a changing scalar must not recompile
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    for i in range(3):
        step(0.1 / (i + 1))
    compiled = torchneuron.fusion_stats()["compilations"]
    hits = torchneuron.fusion_stats()["cache_hits"]
    losses = [step(0.01 * (i + 1)) for i in range(5)]
    assert torchneuron.fusion_stats()["compilations"] == compiled
    assert torchneuron.fusion_stats()["cache_hits"] >= hits + 5
    assert losses[-1] < losses[0]


def test_equal_traces_share_one_structure_key_and_keep_only_live_values(fused, monkeypatch):
    # The program cache's key comes from the C++ library, interned: a repeated trace finds
    # its program by identity. Dead intermediates are not kept; index checks are listed.
    taken = []
    original = fusion._NATIVE.take_trace

    def spy():
        trace = original()
        if trace is not None:
            taken.append(trace)
        return trace

    monkeypatch.setattr(fusion._NATIVE, "take_trace", spy)
    table = torch.randn(6, 3).to(DEV)
    x = torch.arange(12.0).reshape(3, 4).to(DEV)

    def run(index):
        kept = (x * 2 + 1).relu()  # `x * 2` and `+ 1` die inside the trace
        rows = torch.nn.functional.embedding(index, table)  # an index check
        fusion.flush()
        return kept, rows

    fusion.flush()
    results = [run(torch.tensor([0, 5]).to(DEV)) for _ in range(3)]
    other = (x - 1).cpu()
    *repeats, last = [t for t in taken if len(t[0]) >= 3]
    nodes, externals, live, checks, structure = last
    assert all(t[4] is structure for t in repeats[-2:])
    assert len(live) == 2 and len(checks) == 1  # relu's and embedding's results only
    assert structure[1] == tuple(value for value, _, _ in live)
    assert structure[2] == tuple(value for value, _ in checks)
    assert structure[3] == tuple(map(type, externals))
    assert taken[-1][4] != structure  # another trace, another key
    kept, rows = results[-1]
    torch.testing.assert_close(kept.cpu(), (torch.arange(12.0).reshape(3, 4) * 2 + 1).relu())
    torch.testing.assert_close(rows.cpu(), table.cpu()[[0, 5]])
    torch.testing.assert_close(other, torch.arange(12.0).reshape(3, 4) - 1)


def test_more_distinct_traces_than_interned_keys(fused):
    # The C++ library keeps the keys of a bounded number of trace structures and drops them
    # all past it: keys stay equal for equal traces, identical while kept, and eager mode
    # keeps working. (The traces are taken, not run: their values are never read.)
    x = torch.arange(4.0).to(DEV)
    fusion.flush()

    def structure_of(pattern: int):
        y = x + 1.0
        for bit in range(9):  # 512 ways to connect the same ten adds
            y = (y if pattern >> bit & 1 else x) + 1.0
        with fusion._lock:
            return fusion._NATIVE.take_trace()[4]

    first = structure_of(5)
    assert structure_of(5) is first
    keys = [structure_of(pattern) for pattern in range(300)]
    assert len(set(keys)) == 300
    again = structure_of(299)
    assert again is keys[-1] and again == keys[299]
    assert structure_of(5) == first
    assert (x * 2 + 1).cpu().tolist() == [1.0, 3.0, 5.0, 7.0]


def test_a_loop_that_never_reads_reaches_a_steady_state(fused):
    # Only the cap would cut this loop's trace, at a point drifting from step to step (a new
    # program per cut); the end of each optimizer step runs the trace instead.
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(16, 16), torch.nn.ReLU()]
    cpu_model = torch.nn.Sequential(*layers)
    x, y = torch.randn(8, 16), torch.randn(8, 16)

    def trainer(model, device):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        xd, yd = x.to(device), y.to(device)

        def step():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(xd), yd).backward()
            opt.step()
        return step

    model = copy.deepcopy(cpu_model).to(DEV)
    cpu_step, step = trainer(cpu_model, "cpu"), trainer(model, DEV)
    warm_up = fusion._PACK_AFTER + 1  # the step's program is compiled again, scalars packed
    for _ in range(warm_up):
        step()
    compiled = torchneuron.fusion_stats()["compilations"]
    for _ in range(40):  # 40 steps of ~35 ops: cut by the cap alone at many phases
        step()
    assert torchneuron.fusion_stats()["compilations"] == compiled
    for _ in range(warm_up + 40):
        cpu_step()
    for p_cpu, p_dev in zip(cpu_model.parameters(), model.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-4, atol=1e-5)


def test_a_storage_never_written_is_filled_inside_the_trace(fused):
    # A storage never written (`empty`, `empty_like` in autograd's `ones_like`) reads as zeros:
    # made inside the trace (and dropped by XLA where the op overwrites them), not on the host.
    def payload(t):
        return t.untyped_storage()._neuron_payload

    fusion.flush()
    empty = torch.empty(2, 3, device=DEV)
    grown = empty + 1
    assert fusion.is_pending(payload(empty).buf)
    partial = torch.empty(6, device=DEV)
    partial[2:4].fill_(7)  # a write into part of it
    assert fusion.is_pending(payload(partial).buf)
    filled = torch.empty(4, dtype=torch.int32, device=DEV).fill_(3)
    assert grown.cpu().tolist() == [[1.0] * 3] * 2
    assert empty.cpu().tolist() == [[0.0] * 3] * 2
    assert partial.cpu().tolist() == [0.0, 0.0, 7.0, 7.0, 0.0, 0.0]
    assert filled.cpu().tolist() == [3] * 4


def test_an_argument_read_in_another_dtype_after_a_recorded_one(fused):
    # `b - x.view(torch.int32)`: reading x's float32 storage as int32 runs the trace while
    # b's recorded value is already among the call's inputs. The second call of the op (its
    # executable cached) raised "a value of an earlier trace was never computed" before.
    ones = torch.ones(4, device=DEV)
    for i in range(3):
        b = torch.ones(4, dtype=torch.int32, device=DEV) + i
        x = ones * (2 + i)
        expected = (torch.ones(4, dtype=torch.int32) + i) - (torch.ones(4) * (2 + i)).view(
            torch.int32)
        assert torch.equal((b - x.view(torch.int32)).cpu(), expected)


def test_floating_addmm_takes_the_native_path_and_integer_scalars_are_checked():
    native = _native.fastpath()
    b, x, w = (torch.randn(4, 4).to(DEV) for _ in range(3))
    torch.addmm(b, x, w, beta=0.5)  # the first call of a signature runs in Python
    native.reset_fast_counts()
    for beta in (0.25, 2.0, -1.5):  # scalars are inputs, not part of the signature
        torch.addmm(b, x, w, beta=beta)
    assert native.fast_counts().get("aten.addmm.default") == 3
    # In integer types CPU checks beta/alpha against the type's range at every call: an
    # executable of the same signature must not serve a call whose scalars overflow.
    a = torch.ones(2, 2, dtype=torch.int8)
    d = a.to(DEV)
    for _ in range(3):
        torch.addmm(d, d, d)
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.addmm(a, a, a, beta=1000)
    with pytest.raises(RuntimeError, match="without overflow"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the call runs CPU's kernel, which raises
        torch.addmm(d, d, d, beta=1000)


def _parity(name: str) -> None:
    from test_training_parity import RECIPES, train  # tests/test_training_parity.py

    fused_losses, fused_state = train(RECIPES[name], DEV)
    unfused_losses, unfused_state = _unfused(lambda: train(RECIPES[name], DEV))
    # the tolerance the project accepts between eager and compiled (tests/test_training_parity.py):
    # a fused program may round a reduction differently, and Adam amplifies that over the steps
    torch.testing.assert_close(torch.tensor(fused_losses), torch.tensor(unfused_losses),
                               rtol=1e-4, atol=0)
    for key, value in fused_state.items():
        torch.testing.assert_close(value, unfused_state[key], rtol=0, atol=1e-3)


def test_parity_model_fused_and_op_by_op_agree(fused):
    _parity("mlp-sgd-nesterov-for-loop")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp-sgd-nesterov-foreach", "cnn-adam-foreach",
                                  "transformer-adamw-for-loop-clip", "lstm-adamw-foreach-clip"])
def test_every_parity_model_fused_and_op_by_op_agree(fused, name):
    _parity(name)


def test_fused_program_cache_has_a_budget(fused, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_FUSION_PROGRAMS", "3")
    before = torchneuron.fusion_stats()["evictions"]
    x = torch.ones(4, 3, device=DEV)
    for n in range(2, 10):  # eight different traces: chains of n multiplications
        y = x
        for _ in range(n):
            y = y * 2
        y.cpu()
    assert len(fusion._PROGRAMS) <= 3
    assert torchneuron.fusion_stats()["evictions"] - before >= 5


def test_the_program_used_last_outlives_older_ones(fused, monkeypatch):
    # Least recently used, not first compiled, goes first past the budget.
    monkeypatch.setenv("TORCHNEURON_FUSION_PROGRAMS", "3")
    x = torch.ones(4, 3, device=DEV)

    def chain(n):
        y = x
        for _ in range(n):
            y = y * 2
        return y.cpu()

    fusion.flush()  # `x` alone
    chain(2)
    chain(2)  # its program, compiled (or loaded) first
    for n in range(3, 8):
        chain(n)
        hits = torchneuron.fusion_stats()["cache_hits"]
        chain(2)  # used again after every new program: never the least recently used
        assert torchneuron.fusion_stats()["cache_hits"] == hits + 1
    assert len(fusion._PROGRAMS) <= 3


def _churning_trace(n: int, fixed: int) -> None:
    """One trace: `fixed` ops on a (4,) tensor, then a sum over a new size n added to them."""
    y = torch.arange(4.0, device=DEV)
    expected = torch.arange(4.0)
    for k in range(fixed):
        y, expected = y * 1.5 + k, expected * 1.5 + k
    a = torch.arange(n * 3.0, device=DEV).reshape(n, 3)
    result = (a * 2 + 1).sum() + y
    expected = (torch.arange(n * 3.0).reshape(n, 3) * 2 + 1).sum() + expected
    torch.testing.assert_close(result.cpu(), expected)


def _four_new_sizes(fixed: int) -> tuple[dict, dict]:
    """Fusion stats before and after four new sizes of `_churning_trace`, once its skeleton
    has been compiled for its first shapes."""
    torch.ones(1, device=DEV).cpu()
    for n in range(30, 30 + fusion._SHAPE_CHURN):
        _churning_trace(n, fixed)
    before = torchneuron.fusion_stats()
    for n in range(40, 44):
        _churning_trace(n, fixed)
    return before, torchneuron.fusion_stats()


def test_a_trace_with_ever_new_shapes_runs_op_by_op(fused):
    # as generate() does at every token: the same ops, one new size each time, most of them
    # on shapes that stay (they share their executables across the sizes)
    before, after = _four_new_sizes(fixed=16)
    assert after["compilations"] == before["compilations"]
    assert after["op_by_op"] - before["op_by_op"] == 4
    for _ in range(2):  # a shape that was compiled is still served by its program
        _churning_trace(30, fixed=16)
    assert torchneuron.fusion_stats()["cache_hits"] - after["cache_hits"] >= 2


def test_a_trace_whose_ops_mostly_change_shape_compiles_instead(fused):
    # Where most ops read the new size, compiling each alone would cost more than one program.
    before, after = _four_new_sizes(fixed=2)
    assert after["op_by_op"] == before["op_by_op"]
    built = sum(after[k] - before[k] for k in ("compilations", "disk_loads"))
    assert built == 4  # a program per size (compiled, or loaded from an earlier run's cache)


def test_a_program_with_few_scalars_is_not_compiled_again_packed(fused, monkeypatch):
    # Packing two offsets into one array would save one conversion per call: never worth a
    # second compilation.
    calls = []
    real_call = fusion._Program.__call__

    def spy(self, *externals):
        calls.append(self)
        return real_call(self, *externals)

    monkeypatch.setattr(fusion, "_PACK_AFTER", 2)
    monkeypatch.setattr(fusion._Program, "__call__", spy)
    x = torch.arange(24.0, device=DEV)
    fusion.flush()
    before = torchneuron.fusion_stats()
    for _ in range(5):
        assert (x[1:5] + x[3:7]).cpu().tolist() == [4.0, 6.0, 8.0, 10.0]
    program = calls[-1]
    assert program.calls == 5 and program.packed is None
    assert 0 < program.packing.saved < fusion._PACK_MIN_SAVED
    after = torchneuron.fusion_stats()
    built = [after[k] - before[k] for k in ("compilations", "disk_loads")]
    assert sum(built) <= 1, built  # its one program (or none: built by an earlier test)


def test_eager_signatures_per_op_have_a_budget(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_EAGER_SIGNATURES", "4")
    add = plan.plan_for(torch.ops.aten.add.Tensor)
    for n in range(1, 12):
        (torch.ones(n, 2, device=DEV) + torch.ones(n, 2, device=DEV)).cpu()
    assert len(add.cache) <= 4


_LAUNCH_BLOCKING = """
    import torch, torchneuron, jax
    from torchneuron.runtime import fusion
    x = torch.ones(3, device="neuron")
    y = x + 1
    print("RECORDING", fusion.recording(), fusion.is_pending(y.untyped_storage()._neuron_payload.buf))
    print("ASYNC", jax.config.read("jax_cpu_enable_async_dispatch"))
"""


@pytest.mark.parametrize("env,expected", [
    ({"TORCHNEURON_LAUNCH_BLOCKING": "1"}, ["RECORDING False False", "ASYNC False"]),
    ({"TORCHNEURON_FUSION": "0"}, ["RECORDING False False", "ASYNC True"]),
    ({"TORCHNEURON_ASYNC_DISPATCH": "0"}, ["RECORDING True True", "ASYNC False"]),
    ({}, ["RECORDING True True", "ASYNC True"]),
])
def test_launch_blocking_and_fusion_switches(env, expected):
    # The child starts from the defaults, whatever switches this run itself was given.
    inherited = {k: v for k, v in os.environ.items()
                 if k not in ("TORCHNEURON_FUSION", "TORCHNEURON_LAUNCH_BLOCKING",
                              "TORCHNEURON_ASYNC_DISPATCH")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_LAUNCH_BLOCKING)],
                          env={**inherited, **env}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for line in expected:
        assert line in proc.stdout


def test_arange_over_starts_is_one_program(fused, xla_compilations):
    # generate() asks for torch.arange(n, n + 1) at every token (arange.start, which fills
    # out= through arange.start_out): the start is traced, so no start compiles anything new
    # (a static start compiled per value, fused or op by op). The three-argument form
    # dispatches arange.start_step itself, whose bounds stay static.
    def run(n):
        assert torch.arange(n, n + 1, device=DEV).cpu().tolist() == [n]
        assert torch.equal(torch.arange(n * 0.5, n * 0.5 + 2, device=DEV).cpu(),
                           torch.arange(n * 0.5, n * 0.5 + 2))

    warm_up = fusion._PACK_AFTER + 1  # each program is compiled again, scalars packed
    for n in range(3, 3 + warm_up):
        run(n)
    xla_compilations.clear()
    for n in range(3 + warm_up, 23 + warm_up):
        run(n)
    assert xla_compilations == []


_CASTS = [
    lambda t: t.to(torch.float64), lambda t: t.t().to(torch.float16),
    lambda t: t[:, ::2].double(), lambda t: t.to(torch.int32), lambda t: t.to(torch.complex64),
    lambda t: t.to(memory_format=torch.contiguous_format, copy=True),
    lambda t: t.t().contiguous().t().to(torch.bfloat16), lambda t: t.expand(2, 4, 5).double(),
    lambda t: t[0, 0].to(torch.int64),
    lambda t: t.reshape(1, 4, 5, 1).to(memory_format=torch.channels_last),
]


def test_a_cast_on_the_device_is_recorded_and_keeps_cpu_layouts(fused):
    # `.to(dtype)`/`.double()` of a neuron tensor runs the _to_copy lowering, recorded like any
    # other op: no sync, and the layout CPU gives (a transposed or channels_last input keeps
    # its strides, a non-dense one becomes contiguous).
    x = torch.randn(4, 5)
    device = x.to(DEV)
    torch.neuron.synchronize()
    before = torchneuron.fusion_stats()["flushes"]
    results = [cast(device) * 2 for cast in _CASTS]
    assert torchneuron.fusion_stats()["flushes"] == before
    for cast, got in zip(_CASTS, results):
        expected = cast(x) * 2
        assert (got.dtype, got.shape, got.stride()) == (expected.dtype, expected.shape,
                                                        expected.stride())
        assert torch.equal(got.cpu(), expected)


def _record_into(tensor: torch.Tensor, fn, *inputs: torch.Tensor) -> None:
    """Record `fn` (a stand-in for an op's executable) reading `inputs`, its result stored
    as `tensor`'s value."""
    bufs = tuple(storage.storage_buffer(t.untyped_storage(), t.dtype, t) for t in inputs)
    (result,) = fusion.record(fn, bufs, 1, None)
    storage.set_storage_buffer(tensor.untyped_storage(), result, tensor.dtype)


def test_a_failing_op_keeps_the_values_before_it_and_names_its_error(fused):
    # One op that fails when its trace runs must not take the other ops' values with it, and
    # a value it was to compute raises that op's error when read (not "lost" or zeros).
    def broken(a):
        raise ValueError("broken lowering")

    fusion.flush()
    y = torch.arange(4.0, device=DEV) + 1
    z = torch.empty(4, device=DEV)
    _record_into(z, broken, y)
    with pytest.raises(ValueError, match="broken lowering"):
        fusion.flush()
    assert y.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(RuntimeError, match="never computed.*ValueError: broken lowering"):
        z.cpu()


def test_a_fused_program_that_fails_runs_its_ops_one_by_one(fused):
    # An executable that runs by itself but not inside a traced program (here: it reads its
    # input on the host) gives its value through the op-by-op retry, with a warning.
    def host_only(a):
        return (jax.numpy.asarray(np.asarray(a) * 2),)

    fusion.flush()
    y = torch.arange(4.0, device=DEV) + 1
    z = torch.empty(4, device=DEV)
    _record_into(z, host_only, y)
    w = z + 1
    before = torchneuron.fusion_stats()["salvaged"]
    with pytest.warns(RuntimeWarning, match="ran one by one"):
        fusion.flush()
    assert torchneuron.fusion_stats()["salvaged"] == before + 1
    assert z.cpu().tolist() == [2.0, 4.0, 6.0, 8.0]
    assert w.cpu().tolist() == [3.0, 5.0, 7.0, 9.0]


def test_a_trace_passes_its_scalars_packed_and_computes_as_op_by_op(fused, monkeypatch):
    def ops():
        torch.manual_seed(5)
        x = torch.arange(24.0).reshape(4, 6).to(DEV)
        i = torch.arange(24, dtype=torch.int8).reshape(4, 6).to(DEV)
        out = [x.add(x[1:, :].sum(0), alpha=0.25), i.mul(3).add(i, alpha=2), x * 1.5 - 2,
               x.masked_fill(x > 7, True), (x * (1 + 2j)).real,
               torch.nn.functional.dropout(x, 0.3), x[2:].clamp(min=3)]
        return [t.cpu() for t in out]

    calls = []
    real_call = fusion._Program.__call__

    def spy(self, *externals):
        calls.append((self, externals))
        return real_call(self, *externals)

    monkeypatch.setattr(fusion, "_PACK_AFTER", 2)
    monkeypatch.setattr(fusion._Program, "__call__", spy)
    fusion.flush()
    results = [ops() for _ in range(4)]
    program, externals = calls[-1]
    assert all(p is program for p, _ in calls[-4:]), "the trace did not reuse its program"
    # Scalars one by one for the first two calls, then packed: one array per scalar type.
    assert program.packed is not None and program.calls == 3
    scalar_types = {type(v) for v in externals if not isinstance(v, jax.Array)}
    assert {int, float, np.uint32} <= scalar_types
    arguments = program.packing.pack(externals)
    assert len(arguments) == sum(isinstance(v, jax.Array) for v in externals) + len(scalar_types)
    unfused = _unfused(ops)
    for fused_values in results:  # plain and packed programs alike
        for f, u in zip(fused_values, unfused):
            assert f.dtype == u.dtype and torch.equal(f, u)
