"""Softmax and log-softmax, and the fused attention paths of nn.MultiheadAttention and
nn.TransformerEncoderLayer (their inference fast paths)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .dtypes import to_jax_dtype
from .normalization import native_layer_norm
from .registry import lowers, upcast_half

aten = torch.ops.aten

HIGHEST = lax.Precision.HIGHEST


# ---- softmax ---------------------------------------------------------------------------


def _softmax_impl(x, dim, log):
    x = upcast_half(x)
    if x.ndim == 0:
        return jnp.zeros_like(x) if log else jnp.ones_like(x)
    return jax.nn.log_softmax(x, axis=dim) if log else jax.nn.softmax(x, axis=dim)


@lowers(aten._softmax.default)
def softmax(self, dim, half_to_float):
    return _softmax_impl(self, dim, log=False)


@lowers(aten._log_softmax.default)
def log_softmax(self, dim, half_to_float):
    return _softmax_impl(self, dim, log=True)


@lowers(aten._safe_softmax.default)
def safe_softmax(self, dim, dtype=None):
    # Like softmax, but a slice that is entirely -inf gives zeros instead of NaN.
    x = upcast_half(self if dtype is None else self.astype(to_jax_dtype(dtype)))
    if x.ndim == 0:
        return jnp.where(jnp.isneginf(x), 0.0, 1.0).astype(x.dtype)
    out = jax.nn.softmax(x, axis=dim)
    masked = jnp.all(jnp.isneginf(x), axis=dim, keepdims=True)
    return jnp.where(masked, jnp.zeros((), out.dtype), out)


@lowers(aten._softmax_backward_data.default)
def softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = upcast_half(grad_output), upcast_half(output)
    if y.ndim == 0:
        return jnp.zeros_like(g)
    return y * (g - jnp.sum(g * y, axis=dim, keepdims=True))


@lowers(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = upcast_half(grad_output), upcast_half(output)
    if y.ndim == 0:
        return jnp.zeros_like(g)
    return g - jnp.exp(y) * jnp.sum(g, axis=dim, keepdims=True)

# ---- inference fast paths of nn.MultiheadAttention / nn.TransformerEncoderLayer ----------
# (taken under torch.no_grad() in eval mode; training goes through the composite ops)


def _linear(x, weight, bias):
    out = jnp.matmul(x, weight.T, precision=HIGHEST)
    return out if bias is None else out + bias


def _mha(query, key, value, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
         mask_type, need_weights, average_attn_weights):
    q_w, k_w, v_w = jnp.split(qkv_weight, 3, axis=0)
    q_b, k_b, v_b = jnp.split(qkv_bias, 3, axis=0)
    q, k, v = _linear(query, q_w, q_b), _linear(key, k_w, k_b), _linear(value, v_w, v_b)
    b, t, d = q.shape
    s = k.shape[1]
    dh = d // num_head

    def heads(x, n):
        return jnp.swapaxes(x.reshape(b, n, num_head, dh), 1, 2)

    q, k, v = heads(q, t) / math.sqrt(dh), heads(k, s), heads(v, s)
    scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), precision=HIGHEST)  # (b, h, t, s)
    masked_rows = None
    if mask is not None:
        if mask_type == 1:  # key padding mask (b, s)
            mask = mask[:, None, None, :]
        if mask.dtype == jnp.bool_:
            scores = jnp.where(mask, -jnp.inf, scores)
            masked_rows = jnp.all(jnp.broadcast_to(mask, scores.shape), axis=-1, keepdims=True)
        else:
            scores = scores + mask
    attn = jax.nn.softmax(scores, axis=-1)
    if masked_rows is not None:  # PyTorch's masked softmax: a fully masked row gives zeros
        attn = jnp.where(masked_rows, jnp.zeros((), attn.dtype), attn)
    out = jnp.matmul(attn, v, precision=HIGHEST)
    out = _linear(jnp.swapaxes(out, 1, 2).reshape(b, t, d), proj_weight, proj_bias)
    weights = None
    if need_weights:
        weights = jnp.mean(attn, axis=1) if average_attn_weights else attn
    return out, weights


@lowers(aten._native_multi_head_attention.default)
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                                proj_weight, proj_bias, mask=None, need_weights=True,
                                average_attn_weights=True, mask_type=None):
    dtype = query.dtype
    args = [upcast_half(a) for a in (query, key, value, qkv_weight, qkv_bias, proj_weight,
                                 proj_bias)]
    out, weights = _mha(*args[:3], num_head, *args[3:], upcast_half(mask), mask_type,
                        need_weights, average_attn_weights)
    out = out.astype(dtype)
    return out, (None if weights is None else weights.astype(dtype))


@lowers(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias,
                                  proj_weight, proj_bias, use_gelu, norm_first, eps,
                                  norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                                  ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2,
                                  mask=None, mask_type=None):
    x0 = upcast_half(src)

    def norm(x, w, b):
        return native_layer_norm(x, [embed_dim], w, b, eps)[0]

    def attend(x):
        return _mha(x, x, x, num_heads, upcast_half(qkv_weight), upcast_half(qkv_bias),
                    upcast_half(proj_weight), upcast_half(proj_bias), upcast_half(mask), mask_type,
                    False, True)[0]

    def ffn(x):
        h = _linear(x, upcast_half(ffn_weight_1), upcast_half(ffn_bias_1))
        h = jax.nn.gelu(h, approximate=False) if use_gelu else jnp.maximum(h, 0)
        return _linear(h, upcast_half(ffn_weight_2), upcast_half(ffn_bias_2))

    if norm_first:
        x = x0 + attend(norm(x0, norm_weight_1, norm_bias_1))
        return x + ffn(norm(x, norm_weight_2, norm_bias_2))
    x = norm(x0 + attend(x0), norm_weight_1, norm_bias_1)
    return norm(x + ffn(x), norm_weight_2, norm_bias_2)
