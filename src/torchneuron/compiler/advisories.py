"""Once-only advisory log calls inside models must not split compiled graphs.

Hugging Face transformers adds `logging.Logger.warning_once` and `warning_advice` (advice
printed at most once per process) and calls them inside `forward` (GPT-2's loss selection,
attention fallbacks). Dynamo cannot trace a logger call and splits the graph there, for every
backend. Its own remedy is `torch._dynamo.config.ignore_logging_functions`: once the neuron
backend is loaded, each Dynamo compilation adds those two methods to it (when transformers
has defined them), so compiled code skips the advice; eager code still prints it. The
setting outlives `torch._dynamo.reset()`; the callback that applies it does not, so the
backend re-registers it whenever it compiles a graph. Other log
and `warnings.warn` calls are left as they are.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys

import torch._dynamo
from torch._dynamo.callback import callback_handler

ADVISORY_METHODS = ("warning_once", "warning_advice")
DEFINING_MODULE = "transformers.utils.logging"  # where transformers adds them to Logger


# Run with Dynamo's frame hook off: the callback runs when a compilation starts, which can be
# inside a compiled function's frame (a lazily compiled backward, run on the calling thread);
# there Dynamo would try to compile the callback itself and wait for its own callback lock.
@torch._dynamo.disable
def ignore_advisories(_args=None) -> None:
    """Add the advisory logger methods that exist now to Dynamo's ignored logging functions."""
    config = torch._dynamo.config
    found = {getattr(logging.Logger, name) for name in ADVISORY_METHODS
             if hasattr(logging.Logger, name)}
    if not found <= config.ignore_logging_functions:
        config.ignore_logging_functions = config.ignore_logging_functions | found


def install() -> None:
    """Apply `ignore_advisories` now, when transformers defines the methods, and at the start
    of every later Dynamo compilation.

    Idempotent. Called at import and again for every graph the backend compiles, because
    `torch._dynamo.reset()` drops every registered callback: without the second call, a
    reset before the process's first compilation (test fixtures, notebooks) would leave the
    advisories splitting graphs for the rest of the process. The import hook covers the
    order that the callback cannot: the backend loaded before transformers, then a reset,
    then a first compilation of a model (its frames are traced before the backend runs)."""
    ignore_advisories()
    if ignore_advisories not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(ignore_advisories)
    if DEFINING_MODULE not in sys.modules and not any(
            isinstance(finder, _AfterTransformersLogging) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterTransformersLogging())


class _AfterTransformersLogging(importlib.abc.MetaPathFinder):
    """Finds `transformers.utils.logging` as the path finder does, and applies
    `ignore_advisories` once the module has run (the setting outlives resets)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != DEFINING_MODULE:
            return None
        sys.meta_path.remove(self)  # once: the module is being imported now
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenIgnoreAdvisories(spec.loader)
        return spec


class _ThenIgnoreAdvisories(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        ignore_advisories()
