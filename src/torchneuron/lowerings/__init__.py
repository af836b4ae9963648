"""Op lowerings: one module per op family, all registered into `registry.LOWERINGS`."""

from . import (  # noqa: F401  (importing a family registers its lowerings)
    attention,
    convolution,
    distance,
    elementwise,
    embedding,
    factory,
    fft,
    indexing,
    linalg,
    losses,
    normalization,
    optim,
    pooling,
    random,
    recurrent,
    reduction,
    resampling,
    shape,
    solvers,
    special,
    views,
)
from .registry import LOWERINGS, Lowering, lowers

__all__ = ["LOWERINGS", "Lowering", "lowers"]
