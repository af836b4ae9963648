"""torchvision and timm beside the CPU build of torch 2.13, for the model zoo.

The only torchvision release for torch 2.13 on PyPI (0.28.0) is a CUDA build: its C++ extension
`_C` links libtorch_cuda.so and does not load beside the CPU wheel. torchvision then runs without
its custom ops (nms, roi_align and friends: detection only), which it handles for every op but
two: importing it registers fake kernels for `torchvision::nms` and `torchvision::qnms`
without checking that the extension defined them, and fails with "operator torchvision::nms
does not exist". `import_torchvision` defines those two schemas (with no kernel: a call would
raise) when that happens and imports again. The classification models the zoo builds call
neither op. timm imports torchvision, so it goes through here too.

Both live in build/vision-libs (`make zoo` installs tests/models/vision-requirements.txt there),
not in the virtualenv: other code imports torchvision when it is installed and catches only
ImportError (PyTorch's own test utilities, `common_quantization`, which test_linalg.py
imports), so an installed torchvision that raises RuntimeError on import would break them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import torch

VISION_LIBS = Path(__file__).resolve().parents[2] / "build" / "vision-libs"

# torchvision's own schemas for the two ops (csrc/ops/nms.cpp, quantized/cpu/qnms_kernel.cpp)
_UNGUARDED_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_schemas: torch.library.Library | None = None


def import_torchvision() -> ModuleType:
    global _schemas
    if VISION_LIBS.is_dir() and str(VISION_LIBS) not in sys.path:
        sys.path.insert(0, str(VISION_LIBS))
    try:
        import torchvision
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            f"{e}: `make zoo` installs torchvision and timm into {VISION_LIBS}") from e
    except RuntimeError as e:
        if "torchvision::nms does not exist" not in str(e) or _schemas is not None:
            raise
        _schemas = torch.library.Library("torchvision", "FRAGMENT")
        for schema in _UNGUARDED_SCHEMAS:
            _schemas.define(schema)
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        import torchvision
    return torchvision


def import_timm() -> ModuleType:
    import_torchvision()
    import timm

    return timm
