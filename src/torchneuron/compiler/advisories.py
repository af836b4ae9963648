"""Once-only advisory log calls inside models must not split compiled graphs.

Hugging Face transformers adds `logging.Logger.warning_once` and `warning_advice` (advice
printed at most once per process) and calls them inside `forward` (GPT-2's loss selection,
attention fallbacks). Dynamo cannot trace a logger call and splits the graph there, for every
backend. Its own remedy is `torch._dynamo.config.ignore_logging_functions`: once the neuron
backend is loaded, each Dynamo compilation adds those two methods to it (when transformers
has defined them), so compiled code skips the advice; eager code still prints it. Other log
and `warnings.warn` calls are left as they are.
"""

from __future__ import annotations

import logging

import torch._dynamo
from torch._dynamo.callback import callback_handler

ADVISORY_METHODS = ("warning_once", "warning_advice")


def ignore_advisories(_args=None) -> None:
    """Add the advisory logger methods that exist now to Dynamo's ignored logging functions."""
    config = torch._dynamo.config
    found = {getattr(logging.Logger, name) for name in ADVISORY_METHODS
             if hasattr(logging.Logger, name)}
    if not found <= config.ignore_logging_functions:
        config.ignore_logging_functions = config.ignore_logging_functions | found


_registered = False


def install() -> None:
    """Run `ignore_advisories` at the start of every Dynamo compilation (idempotent)."""
    global _registered
    if not _registered:
        callback_handler.register_start_callback(ignore_advisories)
        _registered = True
