"""Adaptive eager: op calls are recorded, and a run of them executes as one XLA program.

With the C++ library loaded and fusion on (the default), an eager op whose executable is known
is not run at once: the C++ kernel (or `eager.run_lowered`) records the executable and its
inputs into a trace, and the op's results are `Pending` values that the storages hold as their
payload's `buf`. The first read of a pending value (`.item()`, `.cpu()`, printing, a CPU
fallback, a data-dependent op, a collective, `torch.neuron.synchronize()`, saving, a compiled
graph's inputs...) calls `flush()`, which runs the whole trace as one `jax.jit` program and
puts the values that are still referenced into their storages. A value that died inside the
trace is never materialised (XLA removes its computation); the trace also runs when it reaches
its cap of recorded ops (`TORCHNEURON_FUSION_CAP`), and when an optimizer step ends, so
that every step of a training loop that reads nothing is the same program.

The program is the composition of the ops' own executables, so it computes what op-by-op
execution computes (XLA may fuse the floating-point steps differently, within the tolerance
accepted between eager and compiled mode). Programs are cached by the trace's structure (which
executables, how their inputs connect, which results are kept); scalars and buffers are inputs,
so a training loop reaches a steady state without new compilations. The C++ library builds
that key as it hands over the trace and interns it, so a repeated trace finds its program by
identity. On disk (runtime/disk_cache.py), a program is keyed by what its executables compute
(their stable names: op, lowering, signature, default dtype) and the types of its inputs, so
the next process loads it instead of tracing, lowering and compiling it.

Adaptive: a trace whose ops keep coming back with new shapes (Hugging Face `generate()` meets a
new sequence length at every token) would compile a whole new program each time. When the same
ops in the same arrangement (the trace's skeleton: its structure without shapes) have been
compiled `_SHAPE_CHURN` times already, a new shape of it runs op by op instead, on the ops' own
executables, which the ops whose shapes did not change share across those traces; where most of
its ops have new shapes, compiling each alone would cost more than one program, and it compiles
as a program again. A trace that reads a growing buffer only through small views (`ids[:, -1:]`,
the last token) keeps its shapes instead: on the CPU platform such buffers are passed as copies
of the range the views reach (runtime/windows.py), so its program compiles once, not at every
length.

An op that checks values (gather, embedding, index_select, nll_loss's targets...) ends the
trace: the trace's program is launched right after the op is recorded. An index out of range
is read at the next sync point (runtime/value_checks.py) and raises there, naming the op and
the user's source line, as CUDA reports a device-side assert; the host does not wait for the
program at the call. (Recording on past such ops made a GPT training step slower, 155-161
against 180-189 ms, and changes the traces that eager bucketing finds.) A check that raises at
the call (`lowerings.registry.at_call`: a singular matrix) is read at once.
`TORCHNEURON_LAUNCH_BLOCKING=1` runs every op at its call; `TORCHNEURON_FUSION=0` turns
recording off.

This module and runtime/storage.py are the only ones that touch payloads.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
import torch
import torch.autograd.profiler as _profiler
from torch.optim.optimizer import register_optimizer_step_post_hook

from .. import config
from . import _native, disk_cache, platform, value_checks, windows
from .packing import ScalarPacking

_NATIVE = _native.fastpath()
Pending = _NATIVE.Pending if _NATIVE is not None else None

# The most recently produced buffer: PJRT runs a device's work in order, so waiting for it
# waits for everything queued before it (`torch.neuron.synchronize`).
LATEST: list = [None]

_lock = threading.RLock()


class FusionStats:
    """Counters of the fused eager path (`torchneuron.fusion_stats()`)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.flushes = 0  # traces run
        self.ops = 0  # op calls those traces held
        self.compilations = 0  # fused programs compiled
        self.disk_loads = 0  # fused programs loaded from the on-disk cache instead
        self.op_compilations = 0  # single ops compiled for traces run op by op (`_alone`)
        self.op_disk_loads = 0  # such ops loaded from the on-disk cache instead
        self.cache_hits = 0  # traces served by a program already built
        self.evictions = 0  # programs dropped from the cache (its budget)
        self.op_by_op = 0  # traces run op by op (a skeleton seen with too many shapes)
        self.values_kept = 0  # results the programs returned (the rest died inside the trace)
        self.salvaged = 0  # traces whose program failed, run again op by op
        self.bucketed_runs = 0  # traces run padded to a bucket (compiler/eager_traces.py)
        self.bucketed_programs = 0  # traces over a dynamic size made into bucketed graphs
        self.unbucketed = 0  # such traces the padding analysis refused (run as before)
        self.bucketed_compilations = 0  # XLA executables of those graphs (one per bucket)
        self.bucket_adapter_compilations = 0  # small programs padding inputs, cutting outputs
        self.compile_seconds = 0.0


STATS = FusionStats()

# trace structure -> its program; past the budget the least recently used goes
_PROGRAMS: dict[tuple, Any] = {}
# id(structure) -> (structure, program): equal traces come with the same structure tuple (the
# C++ library interns it), so a repeated trace finds its program without hashing a nested
# tuple of hundreds of elements (~6 us). Rebuilt from _PROGRAMS after each eviction.
_BY_IDENTITY: dict[int, tuple] = {}
_USES = itertools.count()  # recency of programs (last use)


class OpCall(NamedTuple):
    """What an eager executable computes: its op's plan, the argument signature (key), the
    static argument values, the Executable, and whether it draws random numbers."""

    plan: Any
    key: tuple
    statics: tuple
    executable: Any
    random: bool


# id(executable) -> its op (eager.py names each executable it keeps), for trace skeletons
_OP_OF: dict[int, Any] = {}
# id(executable) -> its OpCall, for traces rebuilt as graphs
_CALL_OF: dict[int, OpCall] = {}

# Bucketed traces (compiler/eager_traces.py, installed by the package): called for a trace
# without a program as (nodes, externals, live value indices) and returns the kept values, or
# None to run the trace as before.
_TRACE_BUCKETER: list[Callable | None] = [None]


def set_trace_bucketer(bucketer: Callable | None) -> None:
    _TRACE_BUCKETER[0] = bucketer


# trace skeleton -> (programs compiled for it, its last compiled trace's executables and input
# shapes), bounded, least recently used first
_SKELETONS: collections.OrderedDict[tuple, tuple[int, tuple]] = collections.OrderedDict()
_SHAPE_CHURN = 2  # programs compiled for one skeleton before its new shapes may run op by op
_SKELETONS_KEPT = 4096
# A trace of a churning skeleton runs op by op only where at most this share of its ops read
# new shapes: each of those compiles alone (~15-25 ms), while a fused program costs ~4-6 ms
# per op (a 15-op trace: 60 ms, against 290 ms for 13 of its ops alone).
_NEW_OPS_ALONE = 0.25


def name_executable(fn, op, call: OpCall | None = None) -> None:
    """Tell the trace skeletons which op `fn` (an eager executable) computes."""
    _OP_OF[id(fn)] = op
    if call is not None:
        _CALL_OF[id(fn)] = call


def call_of(fn) -> OpCall | None:
    return _CALL_OF.get(id(fn))


def forget_executable(fn) -> None:
    _OP_OF.pop(id(fn), None)
    _CALL_OF.pop(id(fn), None)


def _shapes_churn(nodes, externals: tuple) -> bool:
    """Whether this new structure should run op by op: its skeleton was compiled for
    `_SHAPE_CHURN` shapes already, and few of its ops differ from the last compiled one's
    (the rest share their executables with it). Otherwise it counts one more compilation for
    the skeleton."""
    skeleton = tuple((_OP_OF.get(id(fn)), refs, n) for fn, refs, n, _ in nodes)
    if None in (op for op, _refs, _n in skeleton):
        return False  # an executable not made by eager.py (compiled graphs, overrides)
    seen = (tuple(id(fn) for fn, _refs, _n, _site in nodes), windows.buffer_shapes(externals))
    compiled, known = _SKELETONS.get(skeleton, (0, None))
    if compiled >= _SHAPE_CHURN:
        _SKELETONS.move_to_end(skeleton)
        if _new_ops(nodes, seen, known) <= _NEW_OPS_ALONE * len(nodes):
            return True
    _SKELETONS[skeleton] = (compiled + 1, seen)
    _SKELETONS.move_to_end(skeleton)
    while len(_SKELETONS) > _SKELETONS_KEPT:
        _SKELETONS.popitem(last=False)
    return False


def _new_ops(nodes, seen: tuple, known: tuple) -> int:
    """How many nodes of a trace differ from those of another of the same skeleton (`seen`
    and `known`: executables and input shapes): another executable (other static arguments,
    other view layouts), an input of another shape, or a result of such a node as input."""
    fns, shapes = seen
    known_fns, known_shapes = known
    if len(shapes) != len(known_shapes):
        return len(nodes)
    changed_values: set[int] = set()
    count = 0
    first = 0
    for i, (_fn, refs, n, _site) in enumerate(nodes):
        if fns[i] != known_fns[i] or any(
                shapes[r] != known_shapes[r] if r >= 0 else -r - 1 in changed_values
                for r in refs):
            count += 1
            changed_values.update(range(first, first + n))
        first += n
    return count


def stats() -> dict[str, float]:
    """A snapshot of the fused eager path's counters."""
    return dict(vars(STATS))


def reset_stats() -> None:
    STATS.reset()


def recording() -> bool:
    """Whether eager calls are recorded (fusion on and the C++ library loaded)."""
    return _ENABLED[0]


_ENABLED = [False]


def configure() -> None:
    """Apply TORCHNEURON_FUSION / TORCHNEURON_LAUNCH_BLOCKING / TORCHNEURON_FUSION_CAP."""
    value_checks.configure()
    on = _NATIVE is not None and config.flag("TORCHNEURON_FUSION") and not config.flag(
        "TORCHNEURON_LAUNCH_BLOCKING")
    set_enabled(on)


def set_enabled(on: bool) -> None:
    """Turn recording on or off (off runs what is recorded first)."""
    if _NATIVE is None:
        _ENABLED[0] = False
        return
    cap = int(config.raw("TORCHNEURON_FUSION_CAP"))
    _NATIVE.set_fusion(bool(on), cap)
    _ENABLED[0] = bool(on)


def make_room() -> None:
    """Run the trace if it has reached its cap (before the Python path records a call)."""
    if _NATIVE is not None and _NATIVE.trace_full():
        flush()


def record(fn, inputs: tuple, n_results: int, site) -> tuple:
    """Record one executable call; its results as pending values."""
    return _NATIVE.record(fn, inputs, n_results, site)


def track(payload, buf) -> None:
    """`payload.buf = buf`, telling the trace when `buf` is one of its pending values."""
    if Pending is not None and type(buf) is Pending:
        _NATIVE.assign(payload, buf)
    else:
        payload.buf = buf


def is_pending(value) -> bool:
    return Pending is not None and type(value) is Pending


def user_site() -> str:
    """Where the user's code made the current call: the innermost frame outside torch and
    torchneuron, as "file:line"."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/torch/" not in name and "/torchneuron/" not in name:
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def any_pending(values) -> bool:
    """Whether any of `values` is a pending value (then `flush()` and read the tensors again)."""
    return Pending is not None and any(type(v) is Pending for v in values)


def flush() -> None:
    """Run the recorded trace as one program and store the values still referenced."""
    if _NATIVE is None:
        return
    with _lock:
        trace = _NATIVE.take_trace()
        if trace is None:
            return
        # live: the values still referenced (kept by the program); checks: (value, site) of
        # the index checks; structure: the program cache's key, the same tuple object for
        # equal traces (the C++ library interns it).
        nodes, externals, live, checks, structure = trace
        program = _program_of(structure)
        if program is not None and program.windows is not None:
            externals = _narrowed(program, nodes, externals)
        STATS.flushes += 1
        STATS.ops += len(nodes)
        try:
            values, flags = _execute(nodes, externals, structure, program)
        except Exception as error:  # noqa: BLE001 - re-raised by _salvage where an op fails
            values, flags = _salvage(nodes, externals, structure, live, error)
        STATS.values_kept += len(live)
        for (_value, payload, _pending), array in zip(live, values):
            payload.buf = array
        if values:
            LATEST[0] = values[-1]
        for flag, (_value, site) in zip(flags, checks):
            value_checks.check(flag, site)


_UNDECIDED = object()


def _narrowed(program: _Program, nodes, externals: tuple) -> tuple:
    """The externals as `program` takes them: where its buffers read only through views
    change length from run to run, windows of them (runtime/windows.py)."""
    try:
        if program.windows is _UNDECIDED:  # its second run: decided once
            program.windows = None
            if windows.applies() and program.first_shapes is not None:
                program.windows = windows.decide(nodes, externals, program.first_shapes,
                                                 call_of)
            if program.windows is None:
                return externals
        narrowed = program.windows.narrow(externals)
    except Exception as err:  # noqa: BLE001 - a saving must not break eager mode
        program.windows = None
        warnings.warn(f"torchneuron: a trace's buffers could not be passed as windows "
                      f"({type(err).__name__}: {err}); it runs as before", stacklevel=3)
        return externals
    if not program.windows.steady:  # the windows change length too: nothing to gain
        program.windows = None
    return narrowed


def _execute(nodes, externals: tuple, structure: tuple, program):
    """The trace's kept values and index-check flags: from its program (built now if there is
    none), a bucketed program, or op by op when its shapes churn."""
    values = None
    if program is None and _TRACE_BUCKETER[0] is not None:
        # A trace over a dynamic size may run padded to a bucket, on one program for
        # many sizes (its first shape only teaches the bucketer what it looks like).
        values = _TRACE_BUCKETER[0](nodes, externals, structure[1])
        flags = []  # a bucketed program raises its index errors itself
    if values is not None:
        STATS.bucketed_runs += 1
    elif program is None and _shapes_churn(nodes, externals):  # counts a compilation otherwise
        STATS.op_by_op += 1
        values, flags = _run(_body(nodes, structure, _alone), externals, len(nodes))
    elif program is None:
        start = time.perf_counter()
        program = _build(nodes, structure)
        values, flags = _run(program, externals, len(nodes))
        STATS.compile_seconds += time.perf_counter() - start
    else:
        program.last_used = next(_USES)
        STATS.cache_hits += 1
        values, flags = _run(program, externals, len(nodes))
    return values, flags


# id(pending value) -> (the value, the error of the op that was to compute it), for the values
# of a trace that failed: reading one raises that error instead of computing something else.
_FAILED: collections.OrderedDict[int, tuple] = collections.OrderedDict()
_FAILED_KEPT = 1024


def _salvage(nodes, externals: tuple, structure: tuple, live: list, error: Exception):
    """A trace whose program failed runs again op by op, so that one failing op does not take
    the values of the others with it: the values computed before the failing op are kept, the
    ones from it on are marked failed (`failure`), and that op's error is raised. When every
    op runs by itself (the failure was the fused program's), the trace's results are returned."""
    STATS.salvaged += 1
    values: list = []
    try:
        _run_steps([(_alone(fn), refs, n) for fn, refs, n, _ in nodes], externals, values)
    except Exception as op_error:  # noqa: BLE001 - stored, then raised below
        failed = op_error
    else:
        warnings.warn(f"torchneuron: a fused program of {len(nodes)} ops failed ({error!r}); "
                      "its ops ran one by one instead", RuntimeWarning, stacklevel=3)
        return [values[v] for v in structure[1]], [values[v] for v in structure[2]]
    for (value, payload, pending) in live:
        if value < len(values):
            payload.buf = values[value]
        else:
            _FAILED[id(pending)] = (pending, failed)
            while len(_FAILED) > _FAILED_KEPT:
                _FAILED.popitem(last=False)
    raise failed


def failure(value) -> Exception | None:
    """The error of the op that was to compute a pending value whose trace failed, or None."""
    entry = _FAILED.get(id(value))
    return entry[1] if entry is not None and entry[0] is value else None


def _end_of_optimizer_step(_optimizer, _args, _kwargs) -> None:
    # A training loop that never reads a value would otherwise be cut only by the cap, at a
    # point that drifts from step to step: a new program per cut until the phases repeat
    # (41 for an 82-op step). Run each step's trace when its optimizer step ends instead.
    if not torch.compiler.is_compiling():  # a compiled optimizer step runs its own graph
        flush()


register_optimizer_step_post_hook(_end_of_optimizer_step)


def _run(program, externals: tuple, num_ops: int):
    if _profiler._is_profiler_enabled:  # the fused program, inside the ops' own records
        with _profiler.record_function(f"neuron::fused::{num_ops} ops"):
            return program(*externals)
    return program(*externals)


def _body(nodes, structure: tuple, step=lambda fn: fn):
    """The trace as a function of its external inputs: the ops' executables in order (each
    as `step` gives it), returning the values kept and the index-check flags (run as is, it
    is op-by-op execution)."""
    steps = [(step(fn), refs, n) for fn, refs, n, _ in nodes]
    live_values, check_values = structure[1], structure[2]

    def program(*externals):
        values: list = []
        _run_steps(steps, externals, values)
        return [values[v] for v in live_values], [values[v] for v in check_values]

    return program


def _run_steps(steps, externals: tuple, values: list) -> None:
    """Run (executable, input refs, result count) steps in order, appending their results to
    `values` (a ref >= 0 is an external input, -k - 1 the k-th value)."""
    for fn, refs, _n in steps:
        args = [externals[r] if r >= 0 else values[-r - 1] for r in refs]
        values.extend(fn(*args))


def _build(nodes, structure: tuple):
    body = _body(nodes, structure)
    packing = ScalarPacking(structure[3])
    program = _Program(_stored(nodes, structure, None, body),
                       lambda: _stored(nodes, structure, packing, body), packing)
    _PROGRAMS[structure] = program
    budget = int(config.raw("TORCHNEURON_FUSION_PROGRAMS"))
    while len(_PROGRAMS) > budget:
        del _PROGRAMS[min(_PROGRAMS, key=lambda known: _PROGRAMS[known].last_used)]
        _BY_IDENTITY.clear()
        STATS.evictions += 1
    _BY_IDENTITY[id(structure)] = (structure, program)
    return program


def forget_programs() -> None:
    """Drop every program kept in memory (the next run of each trace loads or compiles it)."""
    _PROGRAMS.clear()
    _BY_IDENTITY.clear()


def _program_of(structure: tuple):
    """The program cached for a trace structure, or None."""
    known = _BY_IDENTITY.get(id(structure))
    if known is not None and known[0] is structure:
        return known[1]
    program = _PROGRAMS.get(structure)
    if program is not None:
        if len(_BY_IDENTITY) > 4 * len(_PROGRAMS):  # tuples of the same structures, re-interned
            _BY_IDENTITY.clear()
        _BY_IDENTITY[id(structure)] = (structure, program)
    return program


def _stored(nodes, structure: tuple, packing: ScalarPacking | None, body):
    """The trace's jitted program (taking its scalars packed when `packing` is given), kept
    on disk when its executables have stable names."""
    jitted = jax.jit(body if packing is None else
                     (lambda *arguments: body(*packing.unpack(arguments))))
    digest = _trace_digest(nodes, structure, packing)
    if digest is None:
        STATS.compilations += 1  # at its first call
        return jitted
    return _StoredProgram(digest, jitted)


# Calls of a trace's program before it is compiled again to take its scalars packed
# (runtime/packing.py): packing saves ~1 us per scalar per call (10-layer MLP SGD step 0.87 ->
# 0.79 ms) but slows XLA's compilation (a tiny Llama's AdamW update: 0.23 -> 0.7 s), which a
# program run only a few times would never earn back. Nor would one with few scalars: a
# program is packed only where that saves at least `_PACK_MIN_SAVED` conversions per call
# (generate()'s traces of one or two offsets were compiled again, 30-50 ms each, to save 0-2 us
# per call).
_PACK_AFTER = 16
_PACK_MIN_SAVED = 8


class _Program:
    """A trace's program: scalars passed one by one for its first `_PACK_AFTER` calls, then
    packed (compiled, or loaded from disk, at that call)."""

    __slots__ = ("plain", "make_packed", "packing", "packed", "calls", "first_shapes",
                 "windows", "last_used")

    def __init__(self, plain, make_packed: Callable, packing: ScalarPacking) -> None:
        self.plain, self.make_packed, self.packing = plain, make_packed, packing
        self.packed = None
        self.calls = 0
        self.first_shapes = None  # of its externals at its first call (runtime/windows.py)
        self.windows = _UNDECIDED  # how it narrows its externals; None: it does not
        self.last_used = next(_USES)

    def __call__(self, *externals):
        packed = self.packed
        if packed is not None:
            return packed(*self.packing.pack(externals))
        if self.first_shapes is None:
            self.first_shapes = windows.buffer_shapes(externals)
        self.calls += 1
        if self.calls > _PACK_AFTER and self.packing.saved >= _PACK_MIN_SAVED:
            self.packed = self.make_packed()
            return self(*externals)
        return self.plain(*externals)


class _StoredProgram:
    """A trace's program, kept on disk: one executable per set of input types (a buffer of
    another length read through the same view is another), each loaded from the on-disk
    cache, or compiled and stored there."""

    __slots__ = ("digest", "jitted", "current", "by_types", "unkeyed", "counters")
    _TYPES_KEPT = 8  # input types kept per trace (least recently added dropped first)

    def __init__(self, digest: str, jitted, counters=("compilations", "disk_loads")) -> None:
        self.digest, self.jitted = digest, jitted
        self.counters = counters  # STATS' names for its compilations and loads
        self.current = None
        self.by_types: dict[str, Any] = {}
        self.unkeyed = False

    def __call__(self, *externals):
        if self.current is not None:
            try:
                return self.current(*externals)
            except TypeError:  # "Argument types differ from the types ... compiled"
                pass
        key = _inputs_key(self.digest, externals)
        if key is None:  # inputs whose types have no stable text: jax.jit's own cache
            if not self.unkeyed:
                self.unkeyed = True
                self._count(0)
            return self.jitted(*externals)
        compiled = self.by_types.get(key)
        if compiled is None:
            if len(self.by_types) >= self._TYPES_KEPT:
                self.by_types.pop(next(iter(self.by_types)))
            compiled = self.by_types[key] = self._load_or_compile(key, externals)
        self.current = compiled
        return compiled(*externals)

    def _load_or_compile(self, key: str, externals: tuple):
        client = platform.jax_device(0).client
        compiled = disk_cache.load_executable(key, disk_cache.PROGRAMS, client)
        if compiled is not None:
            self._count(1)
            return compiled
        lowered = self.jitted.trace(*externals).lower()
        compiled, from_jax_cache = disk_cache.compile_lowered(lowered)
        self._count(0)
        if not from_jax_cache:
            disk_cache.store_executable(key, disk_cache.PROGRAMS, compiled)
        return compiled

    def _count(self, which: int) -> None:
        name = self.counters[which]
        setattr(STATS, name, getattr(STATS, name) + 1)


def _alone(fn):
    """An eager executable run by itself (a trace whose shapes churn runs op by op): from its
    program kept on disk, like a trace's, when it has a stable name."""
    program = getattr(fn, "alone", None)
    if program is not None:
        return program
    name = getattr(fn, "stable_name", None)
    if name is None or not hasattr(fn, "trace") or disk_cache.cache_dir(disk_cache.PROGRAMS) is None:
        return fn
    digest = hashlib.sha256(f"{disk_cache.build_digest()}\0alone\0{name}".encode()).hexdigest()
    fn.alone = _StoredProgram(digest, fn, ("op_compilations", "op_disk_loads"))
    return fn.alone


def _trace_digest(nodes, structure: tuple, packing: ScalarPacking | None) -> str | None:
    """What the trace computes, the same in every process: what every node computes (its
    executable's stable name), how they connect and what the trace keeps; None when a node
    has no stable name (then the program is kept in memory only) or the cache is off."""
    if disk_cache.cache_dir(disk_cache.PROGRAMS) is None:
        return None
    h = hashlib.sha256(disk_cache.build_digest().encode())
    for fn, refs, n, _site in nodes:
        name = getattr(fn, "stable_name", None)
        if name is None:
            return None
        h.update(f"{name}\0{refs}\0{n}\0".encode())
    h.update(f"{structure[1:3]!r}\0{packing!r}".encode())
    return h.hexdigest()


def _inputs_key(digest: str, externals: tuple) -> str | None:
    """The on-disk key of a trace's program for these inputs' types (None: an input of a
    kind whose type has no stable text)."""
    h = hashlib.sha256(digest.encode())
    for x in externals:
        if isinstance(x, jax.Array):
            h.update(f"\0{x.shape}{x.dtype}{x.weak_type}{x.sharding}".encode())
        elif type(x) in (bool, int, float, complex):
            h.update(f"\0{type(x).__name__}".encode())
        elif isinstance(x, np.generic):  # a random op's draw: its key's uint32 words
            h.update(f"\0np.{x.dtype}".encode())
        elif isinstance(x, np.ndarray):  # packed scalars
            h.update(f"\0nd{x.shape}{x.dtype}".encode())
        else:
            return None
    return h.hexdigest()


def wait() -> None:
    """Run what is recorded and wait until the device has finished it (raising a deferred
    check's error)."""
    flush()
    value_checks.raise_failed()
    latest = LATEST[0]
    if latest is not None:
        latest.block_until_ready()
