"""Loss functions and their backward ops (negative log-likelihood, MSE, binary cross entropy)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .registry import Promotion, lowers, upcast_half

aten = torch.ops.aten

HIGHEST = lax.Precision.HIGHEST


# reduction enum: 0 none, 1 mean, 2 sum
NONE, MEAN, SUM = 0, 1, 2
TARGET_ERROR = "Target is out of bounds."


def _nll_parts(self, target, weight, ignore_index):
    """Per-element picked log-probabilities, weights, and the out-of-range flag."""
    class_axis = 0 if self.ndim == 1 else 1
    n_classes = self.shape[class_axis]
    ignored = target == ignore_index
    bad = jnp.any(~ignored & ((target < 0) | (target >= n_classes)))
    safe = jnp.where(ignored, 0, target).astype(jnp.int64)
    x = upcast_half(self)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe, class_axis), axis=class_axis)
    picked = jnp.squeeze(picked, class_axis)
    if weight is None:
        w = jnp.ones(target.shape, x.dtype)
    else:
        w = jnp.take(upcast_half(weight), safe, mode="clip").astype(x.dtype)
    w = jnp.where(ignored, jnp.zeros((), x.dtype), w)
    return picked, w, safe, class_axis, bad


def _nll_forward(self, target, weight, reduction, ignore_index):
    picked, w, _, _, bad = _nll_parts(self, target, weight, ignore_index)
    losses = -picked * w
    total_weight = jnp.sum(w)
    if reduction == NONE:
        return (losses, jnp.zeros((), w.dtype)), bad
    if reduction == SUM:
        return (jnp.sum(losses), total_weight), bad
    return (jnp.sum(losses) / total_weight, total_weight), bad


def _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    _, w, safe, class_axis, bad = _nll_parts(self, target, weight, ignore_index)
    g = upcast_half(grad_output)
    if reduction == MEAN:
        g = g / upcast_half(total_weight)
    contrib = -w * g  # broadcasts a scalar grad; elementwise for reduction='none'
    onehot = jax.nn.one_hot(safe, self.shape[class_axis], dtype=contrib.dtype,
                            axis=class_axis)
    return onehot * jnp.expand_dims(contrib, class_axis), bad


@lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default,
        index_error=TARGET_ERROR)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    return _nll_forward(self, target, weight, reduction, ignore_index)


@lowers(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default,
        index_error=TARGET_ERROR)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index,
                      total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index,
                         total_weight)


def _reduce(loss, reduction):
    if reduction == MEAN:
        return jnp.mean(loss)
    if reduction == SUM:
        return jnp.sum(loss)
    return loss


@lowers(aten.mse_loss.default, promote=Promotion.DEFAULT)
def mse_loss(self, target, reduction=MEAN):
    return _reduce(jnp.square(upcast_half(self) - upcast_half(target)), reduction)


@lowers(aten.mse_loss_backward.default, promote=Promotion.DEFAULT)
def mse_loss_backward(grad_output, self, target, reduction):
    diff = upcast_half(self) - upcast_half(target)
    g = upcast_half(grad_output)
    if reduction == MEAN:
        g = g / diff.size
    return 2 * diff * g


@lowers(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=MEAN):
    x, t = upcast_half(self), upcast_half(target)
    log_x = jnp.maximum(jnp.log(x), -100.0)
    log_1mx = jnp.maximum(jnp.log1p(-x), -100.0)
    loss = -(t * log_x + (1 - t) * log_1mx)
    if weight is not None:
        loss = loss * upcast_half(weight)
    return _reduce(loss, reduction)


@lowers(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=MEAN):
    x, t, g = upcast_half(self), upcast_half(target), upcast_half(grad_output)
    eps = 1e-12
    grad = g * (x - t) / jnp.maximum((1 - x) * x, eps)
    if weight is not None:
        grad = grad * upcast_half(weight)
    if reduction == MEAN:
        grad = grad / x.size
    return grad


@lowers(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None,
                                     reduction=MEAN):
    x, t = upcast_half(self), upcast_half(target)
    log_sig = jax.nn.log_sigmoid(x)
    log_sig_neg = jax.nn.log_sigmoid(-x)
    if pos_weight is not None:
        loss = -(upcast_half(pos_weight) * t * log_sig + (1 - t) * log_sig_neg)
    else:
        loss = -(t * log_sig + (1 - t) * log_sig_neg)
    if weight is not None:
        loss = loss * upcast_half(weight)
    return _reduce(loss, reduction)
