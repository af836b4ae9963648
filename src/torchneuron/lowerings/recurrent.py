"""The fused LSTM and GRU cells nn.LSTM / nn.GRU reach on a non-CPU device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .registry import lowers, upcast_half

aten = torch.ops.aten

HIGHEST = lax.Precision.HIGHEST


def _sigmoid(x):
    return jax.nn.sigmoid(x)


@lowers(aten._thnn_fused_lstm_cell.default)
def thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = upcast_half(input_gates) + upcast_half(hidden_gates)
    if input_bias is not None:
        gates = gates + upcast_half(input_bias)
    if hidden_bias is not None:
        gates = gates + upcast_half(hidden_bias)
    i, f, g, o = jnp.split(gates, 4, axis=1)
    i, f, g, o = _sigmoid(i), _sigmoid(f), jnp.tanh(g), _sigmoid(o)
    cy = f * upcast_half(cx) + i * g
    hy = o * jnp.tanh(cy)
    # The workspace keeps the activated gates, in PyTorch's (i, f, g, o) order.
    return hy, cy, jnp.concatenate([i, f, g, o], axis=1)


@lowers(aten._thnn_fused_lstm_cell_backward_impl.default)
def thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    ws = upcast_half(workspace)
    i, f, g, o = jnp.split(ws, 4, axis=1)
    cx, cy = upcast_half(cx), upcast_half(cy)
    tanh_cy = jnp.tanh(cy)
    gh = jnp.zeros_like(cy) if grad_hy is None else upcast_half(grad_hy)
    gc = jnp.zeros_like(cy) if grad_cy is None else upcast_half(grad_cy)
    gc_total = gh * o * (1 - tanh_cy * tanh_cy) + gc
    d_o = gh * tanh_cy * o * (1 - o)
    d_i = gc_total * g * i * (1 - i)
    d_f = gc_total * cx * f * (1 - f)
    d_g = gc_total * i * (1 - g * g)
    grad_gates = jnp.concatenate([d_i, d_f, d_g, d_o], axis=1)
    grad_cx = gc_total * f
    grad_bias = jnp.sum(grad_gates, axis=0) if has_bias else None
    return grad_gates, grad_cx, grad_bias


@lowers(aten._thnn_fused_gru_cell.default)
def thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ig, hg, h = upcast_half(input_gates), upcast_half(hidden_gates), upcast_half(hx)
    if input_bias is not None:
        ig = ig + upcast_half(input_bias)
    if hidden_bias is not None:
        hg = hg + upcast_half(hidden_bias)
    ir, iz, in_ = jnp.split(ig, 3, axis=1)
    hr, hz, hn = jnp.split(hg, 3, axis=1)
    r = _sigmoid(ir + hr)
    z = _sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    hy = n + z * (h - n)
    # Workspace: reset gate, update gate, new gate, hidden n-part, hx (5 * hidden wide).
    return hy, jnp.concatenate([r, z, n, hn, h], axis=1)


@lowers(aten._thnn_fused_gru_cell_backward.default)
def thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    ws = upcast_half(workspace)
    r, z, n, hn, h = jnp.split(ws, 5, axis=1)
    g = upcast_half(grad_hy)
    grad_hx = g * z
    d_z = g * (h - n) * z * (1 - z)
    d_n = g * (1 - z) * (1 - n * n)
    d_r = d_n * hn * r * (1 - r)
    grad_input_gates = jnp.concatenate([d_r, d_z, d_n], axis=1)
    grad_hidden_gates = jnp.concatenate([d_r, d_z, d_n * r], axis=1)
    if has_bias:
        return (grad_input_gates, grad_hidden_gates, grad_hx,
                jnp.sum(grad_input_gates, axis=0), jnp.sum(grad_hidden_gates, axis=0))
    return grad_input_gates, grad_hidden_gates, grad_hx, None, None
