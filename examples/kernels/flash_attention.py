"""A flash-attention style kernel in Pallas, as the PyTorch operator `kernels::flash_attention`.

The forward is a blocked Pallas kernel: each program takes one block of queries of one
(batch, head), walks the key/value blocks with an online softmax (running max and sum), and
writes the output block and the log-sum-exp of each row. The backward is written in JAX from
that log-sum-exp (reverse-mode autodiff cannot go through `pallas_call`), and registered with
`register_autograd`.

Pallas compiles kernels for GPU and TPU clients and interprets them elsewhere;
`torchneuron.library.pallas_interpret()` says which applies to the trace in progress (the CPU
client interprets: correct, but slow; keep sizes small there).

`sdpa_override()` makes `F.scaled_dot_product_attention` use the kernel on neuron tensors for
the calls it supports (no mask, no dropout, equal query/key lengths, lengths divisible by the
block), and leaves the other calls on the built-in path.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch.nn.functional as F
from jax.experimental import pallas as pl
from torch import Tensor

import torchneuron.library as tnlib

BLOCK = 16  # query and key block length


def _accumulation_dtype(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def _forward_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale: float, causal: bool,
                    block_k: int):
    block_q, _ = q_ref.shape
    seq_len = k_ref.shape[0]
    acc_dtype = _accumulation_dtype(q_ref.dtype)
    q = q_ref[...].astype(acc_dtype) * scale
    first_row = pl.program_id(1) * block_q
    rows = first_row + jnp.arange(block_q)[:, None]

    def step(j, carry):
        row_max, row_sum, acc = carry
        k = k_ref[pl.ds(j * block_k, block_k), :].astype(acc_dtype)
        v = v_ref[pl.ds(j * block_k, block_k), :].astype(acc_dtype)
        s = q @ k.T
        if causal:
            cols = j * block_k + jnp.arange(block_k)[None, :]
            s = jnp.where(cols <= rows, s, -jnp.inf)
        new_max = jnp.maximum(row_max, s.max(axis=-1))
        p = jnp.exp(s - new_max[:, None])
        correction = jnp.exp(row_max - new_max)
        return new_max, row_sum * correction + p.sum(axis=-1), acc * correction[:, None] + p @ v

    num_blocks = seq_len // block_k
    if causal:  # key blocks past this query block's last row contribute nothing
        num_blocks = jnp.minimum(num_blocks, (first_row + block_q + block_k - 1) // block_k)
    init = (jnp.full((block_q,), -jnp.inf, acc_dtype), jnp.zeros((block_q,), acc_dtype),
            jnp.zeros(q.shape, acc_dtype))
    row_max, row_sum, acc = jax.lax.fori_loop(0, num_blocks, step, init)
    o_ref[...] = (acc / row_sum[:, None]).astype(o_ref.dtype)
    lse_ref[...] = row_max + jnp.log(row_sum)


def _flash_forward(q, k, v, causal: bool, scale: float):
    *batch, seq_q, dim = q.shape
    seq_k = k.shape[-2]
    groups = math.prod(batch)
    block_q, block_k = min(BLOCK, seq_q), min(BLOCK, seq_k)
    if seq_q % block_q or seq_k % block_k:
        raise ValueError(f"flash_attention: sequence lengths ({seq_q}, {seq_k}) must be "
                         f"multiples of the block ({BLOCK})")
    qf, kf, vf = (x.reshape(groups, x.shape[-2], dim) for x in (q, k, v))
    kernel = functools.partial(_forward_kernel, scale=scale, causal=causal, block_k=block_k)
    out, lse = pl.pallas_call(
        kernel,
        grid=(groups, seq_q // block_q),
        in_specs=[
            pl.BlockSpec((None, block_q, dim), lambda g, i: (g, i, 0)),
            pl.BlockSpec((None, seq_k, dim), lambda g, i: (g, 0, 0)),
            pl.BlockSpec((None, seq_k, dim), lambda g, i: (g, 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, block_q, dim), lambda g, i: (g, i, 0)),
            pl.BlockSpec((None, block_q), lambda g, i: (g, i)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct(qf.shape, q.dtype),
            jax.ShapeDtypeStruct((groups, seq_q), _accumulation_dtype(q.dtype)),
        ],
        interpret=tnlib.pallas_interpret(),
    )(qf, kf, vf)
    return out.reshape(q.shape), lse.reshape(*batch, seq_q)


@tnlib.custom_op("kernels::flash_attention")
def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                    scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """Attention of (..., T, D) queries, keys and values: (output, row log-sum-exp)."""
    return _flash_forward(q, k, v, causal, scale)


@flash_attention.register_autograd
def _flash_attention_backward(q, k, v, causal, scale, *, output, grad):
    out, lse = output
    grad_out, _ = grad  # the log-sum-exp is an auxiliary output: its gradient is not used
    acc = _accumulation_dtype(q.dtype)
    q, k, v, out, grad_out = (x.astype(acc) for x in (q, k, v, out, grad_out))
    s = jnp.einsum("...qd,...kd->...qk", q, k) * scale
    if causal:
        s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -jnp.inf)
    p = jnp.exp(s - lse[..., None])  # the probabilities, rebuilt from the saved log-sum-exp
    grad_v = jnp.einsum("...qk,...qd->...kd", p, grad_out)
    grad_p = jnp.einsum("...qd,...kd->...qk", grad_out, v)
    grad_s = p * (grad_p - jnp.sum(grad_out * out, axis=-1, keepdims=True))
    grad_q = jnp.einsum("...qk,...kd->...qd", grad_s, k) * scale
    grad_k = jnp.einsum("...qk,...qd->...kd", grad_s, q) * scale
    return grad_q, grad_k, grad_v, None, None


def _flash_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False):
    """`F.scaled_dot_product_attention` through the kernel, or NotImplemented for the calls
    it does not cover (they keep the built-in path)."""
    seq_q, seq_k = query.shape[-2], key.shape[-2]
    if (attn_mask is not None or dropout_p or enable_gqa or query.shape[:-2] != key.shape[:-2]
            or seq_q != seq_k or seq_q % min(BLOCK, seq_q)):
        return NotImplemented
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    out, _ = flash_attention(query, key, value, bool(is_causal), float(scale))
    return out


def sdpa_override() -> tnlib.override:
    """A scope (context manager or decorator) where SDPA on neuron uses the Pallas kernel."""
    return tnlib.override(F.scaled_dot_product_attention, _flash_sdpa)


__all__ = ["flash_attention", "sdpa_override"]
