"""Op lowerings: one module per op family, all registered into `registry.LOWERINGS`."""

from . import (  # noqa: F401  (importing a family registers its lowerings)
    elementwise,
    factory,
    fft,
    indexing,
    linalg,
    nn,
    nn_extra,
    optim,
    random,
    reduction,
    shape,
    solvers,
    special,
    views,
)
from .registry import LOWERINGS, Lowering, lowers

__all__ = ["LOWERINGS", "Lowering", "lowers"]
