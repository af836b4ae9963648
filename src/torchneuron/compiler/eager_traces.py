"""Eager fused traces over a dynamic size, bucketed as compiled graphs are (issue 14).

A fused eager trace (runtime/fusion.py) is a run of op executables, each built for concrete
shapes. When the same trace keeps coming back with one size changing (a sequence length
over batches, a growing KV cache), every new size would otherwise compile a new program, or,
past the churn limit, run op by op. Here such a trace becomes one FX graph with a symbolic
size, and compiler/buckets.py and compiler/padding/ bucket it under the same proof as a
`torch.compile` graph:

1. *Describe* the trace: each node's op, static arguments, argument views and results, with
   every integer that could be a size pulled out into a list (`_describe`). Two traces with
   the same description but different integers are the same program up to sizes.
2. *Fit* the sizes: the second shape of a description names the size symbol `s` (the
   smallest change, at a position that changes by exactly it) and fits every integer as
   `a * s + b` (`_Fit`); a trace is bucketed only where the fit reproduces all of its
   integers.
3. *Rebuild* the trace as a graph: the ops replayed on fake tensors whose sizes are the fitted
   expressions (`make_fx`), reading each argument as its executable did (a view of its
   storage's flat buffer) and returning each kept value as a flat buffer.
4. *Prove and run*: the padding analysis must accept the graph (else the trace runs as before,
   counted in `fusion_stats()["unbucketed"]`); the graph is compiled by `CompiledGraph`, which
   pads the inputs to the bucket, runs the bucket's executable and cuts the outputs.

Only what the rebuilt graph can say exactly is bucketed: traces with random ops, lazy
conj/neg views, CPU scalars in tensor slots, or writes through partial views run as before,
and so does a size outside what the rebuilt graph assumed (below 2, or against a guard its
fake kernels recorded).
"""

from __future__ import annotations

import collections
import contextlib
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch.autograd.profiler as _profiler

from .. import config
from ..runtime import fusion
from . import stats, trace_shapes
from .trace_shapes import NotBucketable

if TYPE_CHECKING:
    from .eager_rebuild import Program


_KEPT = 256
# description -> its first integer lists (samples), until a later one names the size
_SAMPLES: collections.OrderedDict[tuple, list[list[int]]] = collections.OrderedDict()
# description -> its Program, or the reason it has none
_PROGRAMS: collections.OrderedDict[tuple, Program | str] = collections.OrderedDict()


def _keep(table: collections.OrderedDict, key, value) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > _KEPT:
        table.popitem(last=False)


@contextlib.contextmanager
def _counted() -> Iterator[None]:
    """Compilations for eager traces count in `fusion_stats()`, not `compile_stats()`."""
    counts = stats.CompileStats()
    try:
        with stats.counting_into(counts):
            yield
    finally:
        fusion.STATS.bucketed_compilations += counts.xla_compilations
        fusion.STATS.bucket_adapter_compilations += counts.bucket_adapter_compilations
        fusion.STATS.compile_seconds += counts.compile_seconds


def run_trace(nodes, externals: tuple, live: tuple) -> list | None:
    """The kept values of a trace run bucketed, or None to run it as before."""
    if config.raw("TORCHNEURON_BUCKETS").lower() in config.BUCKETS_OFF:
        return None
    try:
        description, ints = trace_shapes.describe(nodes, externals)
    except NotBucketable:
        return None
    key = (description, live)
    program = _PROGRAMS.get(key)
    if isinstance(program, str):
        return None
    if program is None:
        # The first shape is a sample; the next, fitted through it (and checked on a second
        # sample where there is one), is the first the program serves.
        samples = _SAMPLES.get(key, [])
        if ints in samples:
            return None
        fit = (trace_shapes.fit(samples[0], ints, trace_shapes.shape_positions(description))
               if samples else None)
        # A trace is bucketed at its third size: two sizes are often all there is (the
        # gradient buffers of two parameter shapes), and the first bucketed trace of a
        # process imports the compiler (~0.7 s), more than compiling a second program. A
        # size that grew by one (a sequence generated token by token) goes on growing: that
        # trace is bucketed at its second size.
        grew_by_one = fit is not None and fit.size_of(ints) == fit.size_of(samples[-1]) + 1
        if len(samples) < 2 and not grew_by_one:
            _keep(_SAMPLES, key, [*samples, ints])
            return None
        if fit is None or not all(fit.matches(sample) for sample in samples):
            # Fit the newest samples next time (a first sample of size 1 fits nothing).
            _keep(_SAMPLES, key, [*samples, ints][-2:])
            return None
        # The rebuild imports Dynamo: only for a trace that did change size.
        from .eager_rebuild import Program

        try:
            with _counted():
                program = Program(description, fit, ints, externals, live, grew_by_one)
        except NotBucketable as err:
            _keep(_PROGRAMS, key, str(err))
            fusion.STATS.unbucketed += 1
            return None
        except Exception as err:  # a bug of the rebuild must not break eager mode
            _keep(_PROGRAMS, key, f"internal error ({type(err).__name__}: {err})")
            fusion.STATS.unbucketed += 1
            warnings.warn(f"torchneuron: an eager trace over a dynamic size could not be "
                          f"bucketed ({type(err).__name__}: {err}); it runs as before",
                          stacklevel=2)
            return None
        _keep(_PROGRAMS, key, program)
        fusion.STATS.bucketed_programs += 1
    if not program.admits(ints):
        return None
    _PROGRAMS.move_to_end(key)
    sites = [site for _fn, _refs, _n, site in nodes if site is not None]
    with _counted(), contextlib.ExitStack() as stack:
        if _profiler._is_profiler_enabled:  # as fused programs show, marked bucketed
            stack.enter_context(_profiler.record_function(
                f"neuron::fused::{len(nodes)} ops, bucketed"))
        return program.run(ints, externals, sites)


def forget() -> None:
    """Drop every sample and program (tests start from a clean state)."""
    _SAMPLES.clear()
    _PROGRAMS.clear()


def why_not_bucketed() -> list[str]:
    """The reasons recorded for the traces that stay per shape (most recent last)."""
    return [p for p in _PROGRAMS.values() if isinstance(p, str)]
