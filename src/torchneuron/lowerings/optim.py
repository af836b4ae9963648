"""Fused optimizer steps and the mixed-precision (GradScaler) helpers.

Each is one executable over the whole parameter list instead of several ops per parameter.
Per the lowering convention, an op that mutates its arguments returns their new values, in
schema order (`None` leaves an argument as it is).
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from .registry import lowers, upcast_half

aten = torch.ops.aten


def _unscale(grads, grad_scale):
    if grad_scale is None:
        return [upcast_half(g) for g in grads], [None] * len(grads)
    scale = grad_scale.reshape(()).astype(jnp.float32)
    unscaled = [upcast_half(g) / scale for g in grads]
    return unscaled, [u.astype(g.dtype) for u, g in zip(unscaled, grads)]


def _skip_if_inf(found_inf, new, old):
    """Keep `old` where found_inf is set (the step is skipped), as the fused kernels do."""
    if found_inf is None or new is None:
        return new
    return jnp.where(found_inf.reshape(()) == 1, old, new.astype(old.dtype))


def _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, decoupled):
    grads_f, grads_written = _unscale(grads, grad_scale)
    new_params, new_avgs, new_sqs, new_maxes = [], [], [], []
    lr = jnp.asarray(lr, jnp.float64).reshape(())
    for i, (p, g) in enumerate(zip(params, grads_f)):
        pf = upcast_half(p)
        if maximize:
            g = -g
        if weight_decay != 0:
            if decoupled:
                pf = pf * (1 - lr * weight_decay).astype(pf.dtype)
            else:
                g = g + pf * weight_decay
        step = state_steps[i].reshape(()).astype(jnp.float64)
        avg = upcast_half(exp_avgs[i])
        sq = upcast_half(exp_avg_sqs[i])
        avg = avg + (g - avg) * (1 - beta1)
        sq = sq * beta2 + (g * g) * (1 - beta2)
        bias1 = 1 - jnp.power(jnp.asarray(beta1, jnp.float64), step)
        bias2_sqrt = jnp.sqrt(1 - jnp.power(jnp.asarray(beta2, jnp.float64), step))
        step_size = (lr / bias1).astype(pf.dtype)
        if amsgrad:
            running_max = jnp.maximum(upcast_half(max_exp_avg_sqs[i]), sq)
            denom = jnp.sqrt(running_max) / bias2_sqrt.astype(pf.dtype) + eps
            new_maxes.append(_skip_if_inf(found_inf, running_max, max_exp_avg_sqs[i]))
        else:
            denom = jnp.sqrt(sq) / bias2_sqrt.astype(pf.dtype) + eps
        pf = pf - step_size * avg / denom
        new_params.append(_skip_if_inf(found_inf, pf, p))
        new_avgs.append(_skip_if_inf(found_inf, avg, exp_avgs[i]))
        new_sqs.append(_skip_if_inf(found_inf, sq, exp_avg_sqs[i]))
    if not amsgrad:
        new_maxes = [None] * len(max_exp_avg_sqs)
    return (*new_params, *grads_written, *new_avgs, *new_sqs, *new_maxes)


_ADAM_STATIC = ("weight_decay", "amsgrad", "maximize")


@lowers(aten._fused_adam_.default, aten._fused_adam_.tensor_lr, static=_ADAM_STATIC)
def fused_adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
               beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    return _adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1,
                 beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, False)


@lowers(aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr, static=_ADAM_STATIC)
def fused_adamw(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
                beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    return _adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1,
                 beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, True)


@lowers(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr,
        static=("weight_decay", "momentum", "dampening", "nesterov", "maximize", "is_first_step"))
def fused_sgd(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening,
              nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
    grads_f, grads_written = _unscale(grads, grad_scale)
    lr = jnp.asarray(lr).reshape(())
    new_params, new_bufs = [], []
    for i, (p, g) in enumerate(zip(self, grads_f)):
        pf = upcast_half(p)
        if maximize:
            g = -g
        if weight_decay != 0:
            g = g + pf * weight_decay
        if momentum != 0:
            buf = g if is_first_step else (
                upcast_half(momentum_buffer_list[i]) * momentum + g * (1 - dampening))
            new_bufs.append(_skip_if_inf(found_inf, buf, momentum_buffer_list[i]))
            g = g + buf * momentum if nesterov else buf
        pf = pf - lr.astype(pf.dtype) * g
        new_params.append(_skip_if_inf(found_inf, pf, p))
    if momentum == 0:
        new_bufs = [None] * len(momentum_buffer_list)
    return (*new_params, *grads_written, *new_bufs)


@lowers(aten._amp_foreach_non_finite_check_and_unscale_.default)
def amp_non_finite_check_and_unscale(self, found_inf, inv_scale):
    inv = inv_scale.reshape(()).astype(jnp.float32)
    bad = jnp.zeros((), bool)
    scaled = []
    for t in self:
        bad = bad | ~jnp.all(jnp.isfinite(t))
        scaled.append((upcast_half(t) * inv).astype(t.dtype))
    new_found = jnp.where(bad, jnp.ones_like(found_inf), found_inf)
    return (*scaled, new_found)


@lowers(aten._amp_update_scale_.default)
def amp_update_scale(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                     growth_interval):
    inf = found_inf.reshape(()) != 0
    successful = growth_tracker + 1
    grown = self * scale_growth_factor
    grow = (successful == growth_interval) & jnp.all(jnp.isfinite(grown))
    new_scale = jnp.where(inf, self * scale_backoff_factor, jnp.where(grow, grown, self))
    new_tracker = jnp.where(inf | (successful == growth_interval), 0, successful)
    return new_scale.astype(self.dtype), new_tracker.astype(growth_tracker.dtype)
