"""Host-independent references for float16/bfloat16 results.

CPU PyTorch's half-precision kernels are not one fixed function of their inputs. The same op
rounds differently depending on the kernel its CPU capability dispatches to (DEFAULT, AVX2 or
AVX512: a Python scalar rounded to the half type or kept in float32, a multiply-add fused or
not) and on processors with native float16 arithmetic. A test that demands bit equality with
"CPU" therefore holds on some hosts only. These helpers compute what a kernel is defined to
compute in float64 and round it as the definition says, which is the same on every host.

Two kinds of definition:
- "rounded once": the result is the exact value rounded to the half type (an opmath kernel that
  computes in float32 and rounds at the end). Float32 arithmetic is not exact, so where the
  exact value lies within float32 noise of a rounding boundary either neighbour is accepted.
- "rounded at every step": the kernel computes in the half type, so every intermediate is
  rounded. One multiplication, addition or division of two half values done in float64 and
  rounded to the half type is the correctly rounded result (float64 has more than twice the
  bits plus two, so the double rounding float64 -> float32 -> half is innocuous), hence such a
  step has no noise at all.
"""

from __future__ import annotations

import torch

# Float32 rounding: one ulp is 2**-23 relative, one rounding at most half of that.
FLOAT32_ROUNDING = 2.0**-24


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` (float64) rounded to nearest-even in `dtype`, returned as float64."""
    return x.to(dtype).to(torch.float64)


def ambiguous(exact: torch.Tensor, noise: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """Where a perturbation of `exact` by up to `noise` (absolute) can change its rounding to
    `dtype`: there a correct float32 computation may land on either neighbour. Non-finite
    values are never ambiguous."""
    noise = torch.as_tensor(noise, dtype=torch.float64).expand_as(exact)
    noise = torch.where(exact.isfinite(), noise, 0.0)
    below, above = (exact - noise).to(dtype), (exact + noise).to(dtype)
    return (below != above) & ~(below.isnan() & above.isnan())


def assert_matches_reference(got: torch.Tensor, expected: torch.Tensor, unsure: torch.Tensor,
                             max_unsure: float = 0.05) -> None:
    """`got` equals `expected` (both in the half type) bit for bit wherever `unsure` is False;
    where it is True, `got` may differ from `expected` by one ulp. At most `max_unsure` of the
    elements may be unsure, so that the exact comparison covers nearly all of them."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    got, expected = got.cpu(), expected.cpu()
    assert unsure.float().mean().item() <= max_unsure, f"{unsure.sum()} of {unsure.numel()} unsure"
    same = (got == expected) | (got.isnan() & expected.isnan())
    wrong = ~same & ~unsure
    if wrong.any():
        where = wrong.nonzero()[:5].tolist()
        samples = [(tuple(i), got[tuple(i)].item(), expected[tuple(i)].item()) for i in where]
        raise AssertionError(f"{int(wrong.sum())} of {got.numel()} elements differ from the "
                             f"reference (index, got, expected): {samples}")
    if unsure.any():
        info = torch.finfo(got.dtype)
        a, b = got[unsure].double(), expected[unsure].double()
        one_ulp = b.abs().clamp_min(info.tiny) * info.eps
        assert ((a - b).abs() <= one_ulp).all(), "an unsure element is off by more than one ulp"


def assert_rounded_once(got: torch.Tensor, exact: torch.Tensor, noise: torch.Tensor | float,
                        max_unsure: float = 0.05) -> None:
    """`got` is `exact` (float64) rounded once to got's dtype, except within `noise` of a
    rounding boundary (float32 arithmetic of the kernel)."""
    dtype = got.dtype
    assert_matches_reference(got, exact.to(dtype), ambiguous(exact, noise, dtype), max_unsure)
