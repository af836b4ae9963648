"""Version skew: names that older PyTorch test files import from `torch.testing._internal`.

The test files come from a PyTorch source snapshot older than the installed torch 2.13; a few
helpers they import were renamed or moved since. `install()` adds each missing name as an
alias of its torch 2.13 equivalent (never replacing a name that exists), so that the files
import and their tests run against the installed testing utilities. Every alias is listed in
`ALIASES` with what it stands for; a test that fails because an alias behaves differently is
version skew, not a backend failure (the CPU run shows it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def _skip_ops(*args: Any) -> Callable:
    # Older signature: skipOps(test_case_name, base_test_name, to_skip). torch 2.13's
    # skipOps(to_skip) reads the class and test names from the decorated function.
    from torch.testing._internal.common_device_type import skipOps

    return skipOps(args[-1])


def _bf32_on_and_off(bf32_precision: float = 1e-5) -> Callable:
    from torch.testing._internal.common_mkldnn import reduced_f32_on_and_off

    return reduced_f32_on_and_off(bf32_precision=bf32_precision)


def _cuda_tf32_is_not_fp32() -> bool:
    # The CUDA helper asked whether matmuls on the current CUDA device may use TF32; the
    # project's torch is a CPU build.
    import torch

    return bool(torch.cuda.is_available() and torch.backends.cuda.matmul.allow_tf32)


def _binary_ufuncs_and_refs() -> tuple:
    from torch.testing._internal.common_methods_invocations import op_db, python_ref_db
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo

    return tuple(op for op in op_db + python_ref_db if isinstance(op, BinaryUfuncInfo))


def _new_module_tests() -> list:
    from torch.testing._internal.common_nn import get_new_module_tests

    return get_new_module_tests()


def _attr(module: str, name: str) -> Callable[[], Any]:
    return lambda: getattr(importlib.import_module(module), name)


_TI = "torch.testing._internal."

# (module, missing name) -> (what it stands for in torch 2.13, factory of the value)
ALIASES: dict[tuple[str, str], tuple[str, Callable[[], Any]]] = {
    (_TI + "common_utils", "skipIfMps"): (
        "common_utils.skipIfMPS", _attr(_TI + "common_utils", "skipIfMPS")),
    (_TI + "common_methods_invocations", "skip"): (
        "common_device_type.skip", _attr(_TI + "common_device_type", "skip")),
    (_TI + "common_methods_invocations", "xfail"): (
        "common_device_type.xfail", _attr(_TI + "common_device_type", "xfail")),
    (_TI + "common_methods_invocations", "skipOps"): (
        "common_device_type.skipOps (three-argument form)", lambda: _skip_ops),
    (_TI + "common_methods_invocations", "binary_ufuncs_and_refs"): (
        "BinaryUfuncInfo entries of op_db + python_ref_db", _binary_ufuncs_and_refs),
    (_TI + "common_nn", "new_module_tests"): (
        "common_nn.get_new_module_tests()", _new_module_tests),
    (_TI + "common_cuda", "tf32_is_not_fp32"): (
        "False without CUDA", lambda: _cuda_tf32_is_not_fp32),
    (_TI + "common_mkldnn", "bf32_on_and_off"): (
        "common_mkldnn.reduced_f32_on_and_off", lambda: _bf32_on_and_off),
}


def _older_device_class_bases(instantiate: Callable) -> Callable:
    """instantiate_device_type_tests as in PyTorch <= 2.4: the device class does not inherit
    from the generic class. torch 2.13 makes it a base, so a test written as
    `super(self.__class__, self).setUp()` (test_linalg's TestLinalg) recursed without end.
    Every member of the generic class has been copied into the device class already."""

    def instantiate_device_type_tests(generic_test_class, scope, *args, **kwargs):
        before = set(scope)
        result = instantiate(generic_test_class, scope, *args, **kwargs)
        stand_in = type(generic_test_class.__name__, generic_test_class.__bases__, {})
        for name in set(scope) - before:
            cls = scope[name]
            if isinstance(cls, type) and generic_test_class in cls.__bases__:
                cls.__bases__ = tuple(stand_in if b is generic_test_class else b
                                      for b in cls.__bases__)
        return result

    instantiate_device_type_tests.__wrapped__ = instantiate
    return instantiate_device_type_tests


BEHAVIOURS = ("instantiate_device_type_tests: device classes do not inherit from the generic "
              "class (PyTorch <= 2.4)",)


def install() -> list[str]:
    """Adds the missing names and the older class layout; returns what it changed."""
    added = []
    for (module_name, name), (_, factory) in ALIASES.items():
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            setattr(module, name, factory())
            added.append(f"{module_name}.{name}")
    from torch.testing._internal import common_device_type

    if not hasattr(common_device_type.instantiate_device_type_tests, "__wrapped__"):
        common_device_type.instantiate_device_type_tests = _older_device_class_bases(
            common_device_type.instantiate_device_type_tests)
        added.append("common_device_type.instantiate_device_type_tests (older class bases)")
    return added
