"""Device random numbers: seeding, state round trips, explicit torch.Generator(device="neuron"),
the C++ generator library's build cache, and the pure-Python fallback without it.

Values are compared with themselves (replays), never with CPU's: the device draws with JAX.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torchneuron.runtime import _native, rng

N = torch.device("neuron")


def _ops(generator=None):
    """Every random op the brief names, as callables producing a CPU result."""
    kw = {} if generator is None else {"generator": generator}
    return {
        "rand": lambda: torch.rand(6, device=N, **kw),
        "randn": lambda: torch.randn(2, 3, device=N, **kw),
        "randint": lambda: torch.randint(0, 1000, (6,), device=N, **kw),
        "randperm": lambda: torch.randperm(12, device=N, **kw),
        "bernoulli": lambda: torch.bernoulli(torch.full((16,), 0.5, device=N), **kw),
        "normal_": lambda: torch.empty(6, device=N).normal_(2.0, 3.0, **kw),
        "uniform_": lambda: torch.empty(6, device=N).uniform_(-1.0, 1.0, **kw),
        "dropout": (
            (lambda: F.dropout(torch.ones(32, device=N), 0.5, training=True))
            if generator is None
            else None
        ),
    }


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.cpu()


OP_NAMES = list(_ops())


# ----------------------------------------------------------------------------------------
# The default generator


@pytest.mark.parametrize("name", OP_NAMES)
@pytest.mark.parametrize("seeder", ["torch.manual_seed", "torch.neuron.manual_seed"])
def test_seed_makes_ops_reproducible_and_consecutive_calls_differ(name, seeder):
    seed_fn = torch.manual_seed if seeder == "torch.manual_seed" else torch.neuron.manual_seed
    op = _ops()[name]
    seed_fn(1234)
    first, second = _cpu(op()), _cpu(op())
    seed_fn(1234)
    again, again2 = _cpu(op()), _cpu(op())
    assert first.device.type == "cpu"
    assert torch.equal(first, again) and torch.equal(second, again2)
    assert not torch.equal(first, second), f"{name}: consecutive calls gave identical values"
    seed_fn(4321)
    assert not torch.equal(first, _cpu(op())), f"{name}: a different seed gave the same values"


def test_random_values_have_the_right_shape_dtype_and_range():
    torch.manual_seed(0)
    u = torch.empty(1000, device=N).uniform_(-2.0, 3.0).cpu()
    assert u.min() >= -2.0 and u.max() < 3.0
    r = torch.randint(5, 9, (1000,), device=N)
    assert r.dtype == torch.int64 and r.device.type == "neuron"
    assert set(r.cpu().tolist()) == {5, 6, 7, 8}
    p = torch.randperm(50, device=N).cpu()
    assert sorted(p.tolist()) == list(range(50))
    b = torch.bernoulli(torch.full((2000,), 0.25, device=N)).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0} and 0.15 < b.mean().item() < 0.35
    d = F.dropout(torch.ones(4000, device=N), 0.25, training=True).cpu()
    assert set(d.unique().tolist()) <= {0.0, torch.tensor(1 / 0.75).item()}
    assert 0.2 < (d == 0).float().mean().item() < 0.3
    n = torch.randn(4000, device=N, dtype=torch.float64).cpu()
    assert n.dtype == torch.float64 and abs(n.mean().item()) < 0.1 and 0.9 < n.std().item() < 1.1


@pytest.mark.parametrize("dtype, top", [
    (torch.bfloat16, 2 ** 8), (torch.float16, 2 ** 11), (torch.float32, 2 ** 24),
    (torch.float64, 2 ** 53), (torch.uint8, 255), (torch.int8, 127), (torch.int16, 2 ** 15 - 1),
])
def test_random_without_bounds_covers_cpus_range(dtype, top):
    # CPU: [0, 2**digits] for floats (digits counting the implicit bit), [0, max] for ints.
    torch.manual_seed(0)
    r = torch.empty(20000, dtype=dtype, device=N).random_().cpu().double()
    assert r.min() >= 0 and r.max() <= top
    assert r.max() > 0.99 * top if top < 2 ** 16 else r.max() > 0.9 * top


@pytest.mark.parametrize("dtype, bounds", [
    (torch.bool, (0, 3)), (torch.bool, (-1, 1)), (torch.int8, (0, 200)), (torch.uint8, (0, 257)),
    (torch.float16, (0, 70000)), (torch.float32, (5, 3)), (torch.float32, (3, 3)),
    (torch.int8, (200,)), (torch.float16, (3000, None)),
])
def test_random_bounds_cpu_refuses_are_refused(dtype, bounds):
    with pytest.raises(RuntimeError) as cpu:
        torch.empty(4, dtype=dtype).random_(*bounds)
    with pytest.raises(RuntimeError, match=str(cpu.value).split(" for ")[0].split(",")[0]):
        torch.empty(4, dtype=dtype, device=N).random_(*bounds)


def test_random_beyond_a_floats_integers_warns_at_every_call():
    # CPU warns at every call; the warning came while the lowering was traced, so a call that
    # reused the executable was silent (test_tensor_creation_ops test_random_from_to).
    t = torch.empty(8, device=N)
    for _ in range(3):
        with pytest.warns(UserWarning, match=r"from is out of bounds \[-\(2\^24\), 2\^24\]"):
            t.random_(-2**30, 42)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.random_(0, 42)  # within range: no warning
        t.random_(0, 42)


@pytest.mark.parametrize("draw", [(rng._DEFAULT_SEED, 0), (0, 0), (2**64 - 1, 2**64 - 1),
                                  (0x1234_5678_9ABC_DEF0, 3), (7, 2**40 + 5)])
def test_draw_keys_derived_on_the_host_are_jaxs(draw):
    # split_draw derives each draw's threefry key in Python, not inside the op's program;
    # the key (hence every stream) must stay the one JAX's own fold_in chain gives
    import jax
    import numpy as np

    seed, offset = draw
    mask = 0xFFFF_FFFF
    key = jax.random.key(np.uint32(seed & mask))
    for word in ((seed >> 32) & mask, offset & mask, offset >> 32):
        key = jax.random.fold_in(key, np.uint32(word))
    assert [int(w) for w in rng.split_draw(draw)] == np.asarray(jax.random.key_data(key)).tolist()


def test_torch_manual_seed_reaches_the_device_and_initial_seed_reports_it():
    torch.manual_seed(987654321)
    assert torch.neuron.initial_seed() == 987654321
    torch.neuron.manual_seed(17)
    assert torch.neuron.initial_seed() == 17
    torch.manual_seed(-1)  # PyTorch accepts negative seeds and remaps them
    assert torch.neuron.initial_seed() == rng.generator(0).initial_seed()
    assert 0 <= torch.neuron.initial_seed() < 2**64


def test_seed_picks_a_fresh_seed():
    torch.manual_seed(5)
    torch.neuron.seed()
    first = torch.neuron.initial_seed()
    a = torch.rand(8, device=N).cpu()
    torch.seed()  # all devices, through torch.neuron.manual_seed_all
    assert torch.neuron.initial_seed() != first
    assert not torch.equal(a, torch.rand(8, device=N).cpu())
    torch.neuron.seed_all()
    assert torch.neuron.initial_seed() not in (first, 5)


def test_get_set_rng_state_round_trip_replays():
    torch.manual_seed(42)
    torch.rand(3, device=N)  # advance, so the state is not just the seed
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.numel() == 16
    a = torch.randn(5, device=N).cpu()
    b = torch.randint(0, 100, (5,), device=N).cpu()
    torch.neuron.set_rng_state(state)
    assert torch.equal(a, torch.randn(5, device=N).cpu())
    assert torch.equal(b, torch.randint(0, 100, (5,), device=N).cpu())
    # The state is a copy, not a view of the live generator.
    assert torch.equal(state, torch.neuron.get_rng_state()) is False
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    c = torch.rand(4, device=N).cpu()
    torch.neuron.set_rng_state_all(states)
    assert torch.equal(c, torch.rand(4, device=N).cpu())
    assert torch.equal(torch.neuron.get_rng_state(N), torch.neuron.get_rng_state(0))


def test_set_rng_state_rejects_bad_states():
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.neuron.set_rng_state(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.neuron.set_rng_state(torch.zeros(16, dtype=torch.float32))
    with pytest.raises(TypeError):
        torch.neuron.set_rng_state([0] * 16)


def test_fork_rng_restores_the_device_state():
    torch.manual_seed(7)
    expected = torch.rand(4, device=N).cpu()
    torch.manual_seed(7)
    with torch.random.fork_rng(device_type="neuron"):
        torch.rand(100, device=N)
        torch.neuron.manual_seed(99)
    assert torch.equal(expected, torch.rand(4, device=N).cpu())


# ----------------------------------------------------------------------------------------
# Explicit generators (need the C++ library, which builds on any machine with a compiler)


def test_generator_library_is_in_use():
    assert rng.native(), f"C++ generator library unavailable: {rng.unavailable_reason()}"


def test_explicit_generator_basics():
    g = torch.Generator(device="neuron")
    assert isinstance(g, torch.Generator)
    assert g.device == torch.device("neuron", 0)
    assert g.initial_seed() == 67280421310721  # PyTorch's default seed, as on CPU and CUDA
    assert g.manual_seed(123) is g
    assert g.initial_seed() == 123 and g.get_offset() == 0
    g.manual_seed(-5)  # accepted and remapped as torch.Generator does for every device
    assert g.initial_seed() == 2**64 - 5
    fresh = g.seed()
    assert g.initial_seed() == fresh
    assert torch.Generator(torch.device("neuron", 0)).device.type == "neuron"


@pytest.mark.parametrize("name", [n for n in OP_NAMES if n != "dropout"])
def test_explicit_generator_drives_ops_and_advances(name):
    g = torch.Generator(device="neuron").manual_seed(2024)
    op = _ops(g)[name]
    torch.manual_seed(0)
    default_state = torch.neuron.get_rng_state()
    first = _cpu(op())
    assert g.get_offset() == 1, "one random op must advance the generator by one draw"
    second = _cpu(op())
    assert g.get_offset() == 2
    assert not torch.equal(first, second)
    g.manual_seed(2024)
    assert torch.equal(first, _cpu(op())) and torch.equal(second, _cpu(op()))
    # Drawing from an explicit generator leaves the default generator alone.
    assert torch.equal(default_state, torch.neuron.get_rng_state())


def test_explicit_generator_state_round_trip_and_clone():
    g = torch.Generator(device="neuron").manual_seed(11)
    torch.randn(3, device=N, generator=g)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    a = torch.randn(3, device=N, generator=g).cpu()
    b = torch.rand(3, device=N, generator=g).cpu()
    g.set_state(state)
    assert torch.equal(a, torch.randn(3, device=N, generator=g).cpu())
    h = torch.Generator(device="neuron")
    h.set_state(state)
    assert h.initial_seed() == 11 and h.get_offset() == 1
    assert torch.equal(a, torch.randn(3, device=N, generator=h).cpu())
    assert torch.equal(b, torch.rand(3, device=N, generator=h).cpu())
    c = g.clone_state()
    assert c is not g and c.get_state().tolist() == g.get_state().tolist()
    torch.rand(2, device=N, generator=c)
    assert c.get_offset() == g.get_offset() + 1
    with pytest.raises(RuntimeError, match="16 bytes"):
        g.set_state(torch.zeros(8, dtype=torch.uint8))


def test_explicit_and_default_generators_share_one_state_format():
    torch.neuron.manual_seed(77)
    torch.rand(1, device=N)
    g = torch.Generator(device="neuron")
    g.set_state(torch.neuron.get_rng_state())
    assert torch.equal(torch.randn(4, device=N).cpu(), torch.randn(4, device=N, generator=g).cpu())
    torch.neuron.set_rng_state(g.get_state())
    assert torch.equal(torch.rand(4, device=N, generator=g).cpu(), torch.rand(4, device=N).cpu())


def test_default_generators_are_the_seeded_torch_generators():
    gens = torch.neuron.default_generators
    assert len(gens) == torch.neuron.device_count()
    assert all(isinstance(g, torch.Generator) for g in gens)
    assert torch.neuron.default_generators[0] is gens[0]
    torch.manual_seed(31337)
    assert gens[0].initial_seed() == 31337
    # Passing the default generator explicitly is the same as passing none.
    a = torch.rand(5, device=N, generator=gens[0]).cpu()
    torch.manual_seed(31337)
    assert torch.equal(a, torch.rand(5, device=N).cpu())


def test_generator_of_another_device_is_refused():
    with pytest.raises(RuntimeError, match="Expected a 'neuron' device type for generator but found 'cpu'"):
        torch.randn(3, device=N, generator=torch.Generator())


def test_next_draw_advances_exactly_once_per_call():
    g = torch.Generator(device="neuron").manual_seed(3)
    assert rng.next_draw(g) == (3, 0)
    assert rng.next_draw(g) == (3, 1)
    g.set_offset(2**64 - 1)
    assert rng.next_draw(g) == (3, 2**64 - 1)
    assert g.get_offset() == 0  # wraps like the uint64 it is
    torch.neuron.manual_seed(8)
    assert rng.next_draw() == (8, 0)
    assert rng.next_draw(None) == (8, 1)


def test_cpp_hooks_keep_what_the_python_hooks_provided():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "neuron"
    x = torch.ones(3, device=N, requires_grad=True)
    (x * 4).sum().backward()  # needs registered hooks
    assert x.grad.cpu().tolist() == [4.0, 4.0, 4.0]
    with torch.accelerator.device_index(0):
        assert torch.accelerator.current_device_index() == 0
    with torch.neuron.device(0):
        assert torch.randn(2, device=N).device == torch.device("neuron", 0)


# ----------------------------------------------------------------------------------------
# Other processes: the build cache, the fallback without the library


def _python(code: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=full_env, timeout=timeout,
    )


_FALLBACK_CHECK = """
    import warnings
    warnings.simplefilter("always")
    import torch
    from torchneuron.runtime import rng
    assert not rng.native()
    torch.manual_seed(5); a = torch.randn(4, device="neuron").cpu()
    torch.manual_seed(5); b = torch.randn(4, device="neuron").cpu()
    assert torch.equal(a, b) and not torch.equal(a, torch.randn(4, device="neuron").cpu())
    s = torch.neuron.get_rng_state(); c = torch.rand(3, device="neuron").cpu()
    torch.neuron.set_rng_state(s); assert torch.equal(c, torch.rand(3, device="neuron").cpu())
    try:
        torch.Generator(device="neuron")
    except RuntimeError as err:
        print("GENERATOR-REFUSED", type(err).__name__)
    else:
        raise AssertionError("torch.Generator(device='neuron') should raise without the library")
    print("REASON", rng.unavailable_reason())
"""


def test_without_the_library_seeded_rng_still_works():
    proc = _python(_FALLBACK_CHECK, {"TORCHNEURON_NATIVE_LIBRARY": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GENERATOR-REFUSED" in proc.stdout
    assert "TORCHNEURON_NATIVE_LIBRARY=0" in proc.stdout


def test_failed_build_falls_back_with_a_warning(tmp_path):
    env = {"TORCHNEURON_CACHE_DIR": str(tmp_path), "CXX": "/bin/false"}
    proc = _python(_FALLBACK_CHECK, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GENERATOR-REFUSED" in proc.stdout
    assert "C++ library is unavailable" in proc.stderr
    markers = list((tmp_path / "ext").glob("*.failed"))
    assert len(markers) == 1 and markers[0].read_text().startswith("/bin/false")
    # The failure is remembered: the next import does not try the same compiler again.
    proc = _python(_FALLBACK_CHECK, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "earlier build failed" in proc.stdout


@pytest.mark.slow  # a C++ build in a fresh cache (`make test` keeps the failed-build test)
def test_concurrent_first_imports_build_once_and_all_load(tmp_path):
    code = """
        import torch
        from torchneuron.runtime import rng
        g = torch.Generator(device="neuron").manual_seed(1)
        print("NATIVE", rng.native(), torch.rand(2, device="neuron", generator=g).cpu().tolist())
    """
    env = dict(os.environ, TORCHNEURON_CACHE_DIR=str(tmp_path))
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
        assert "NATIVE True" in out, err[-3000:]
    assert len({out.split("NATIVE True")[1] for out, _ in outputs}) == 1  # same numbers
    built = list((tmp_path / "ext").glob("*.so"))
    assert [p.name for p in built] == [_native.library_path().name]
    assert not list((tmp_path / "ext").glob("*.tmp"))
    # A later import reuses the cached library instead of compiling again.
    mtime = built[0].stat().st_mtime_ns
    proc = _python(code, {"TORCHNEURON_CACHE_DIR": str(tmp_path), "CXX": "/bin/false"})
    assert proc.returncode == 0 and "NATIVE True" in proc.stdout, proc.stderr[-3000:]
    assert built[0].stat().st_mtime_ns == mtime


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path / "x"))
    assert _native.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("TORCHNEURON_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _native.cache_dir() == tmp_path / "xdg" / "torchneuron"
    assert _native.library_path().parent == tmp_path / "xdg" / "torchneuron" / "ext"
    assert all(Path(source).exists() for source in _native.SOURCES)
