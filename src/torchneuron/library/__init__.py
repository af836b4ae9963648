"""JAX functions and Pallas kernels as PyTorch operators, and scoped overrides of built-in ops.

`custom_op` turns a function on `jax.Array`s into a real PyTorch custom operator
(`torch.ops.<ns>.<name>`), built on `torch.library.custom_op`:

- on `neuron` tensors the function is the op's entry in the lowering table, so eager calls
  take the same path as built-in ops (one cached executable per signature, view gathers,
  writes through views for mutated arguments) and compiled graphs trace it into their one
  XLA program;
- on CPU tensors the same function runs under `jax.jit` on JAX's CPU client;
- its fake/meta kernel comes from `jax.eval_shape` (symbolic shapes when JAX can follow them);
- it is differentiable through `jax.vjp` of the function, or through a backward written in
  JAX and given to `register_autograd`; the backward is a second custom op
  (`<name>_backward`), so it runs natively and compiles too.

`override` replaces, within a scope, the lowering of an ATen op (a JAX function) or a PyTorch
function such as `F.scaled_dot_product_attention` (a torch-level function that may return
`NotImplemented` to keep the built-in path) on neuron tensors. docs/KERNELS.md has the details.
"""

from .kernels import pallas_interpret
from .ops import CustomOp, custom_op
from .override import override

__all__ = ["CustomOp", "custom_op", "override", "pallas_interpret"]
