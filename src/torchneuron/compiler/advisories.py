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

import logging

import torch._dynamo
from torch._dynamo.callback import callback_handler

ADVISORY_METHODS = ("warning_once", "warning_advice")


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
    """Apply `ignore_advisories` now and at the start of every later Dynamo compilation.

    Idempotent. Called at import and again for every graph the backend compiles, because
    `torch._dynamo.reset()` drops every registered callback: without the second call, a
    reset before the process's first compilation (test fixtures, notebooks) would leave the
    advisories splitting graphs for the rest of the process."""
    ignore_advisories()
    if ignore_advisories not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(ignore_advisories)
