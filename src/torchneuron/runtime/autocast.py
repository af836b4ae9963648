"""Autocast for the neuron device: `torch.autocast("neuron", dtype=torch.bfloat16)`.

PyTorch reserves the `AutocastPrivateUse1` dispatch key for a custom backend's autocast but
registers no kernels on it: without them every op under `torch.autocast("neuron")` fails with
"Could not run ... with arguments from the 'Autocastneuron' backend". This module registers

- a fallthrough for every op (ops outside the policy run unchanged), and
- for each op in the policy below, a kernel that casts its floating tensor arguments and calls
  the op again with autocast excluded, exactly like PyTorch's C++ autocast wrappers.

The policy is PyTorch's accelerator (CUDA) policy, the one `torch.autocast("cuda")` applies:
matmuls, convolutions and linear layers run in the autocast dtype; pointwise ops that lose
accuracy in 16 bits, reductions, softmax, norms and losses run in float32; a few multi-input
ops promote to the widest input type. To it are added the ops that only CPU autocast lists
as float32 (linear algebra, FFTs, some pooling and padding ops), which have no low-precision
kernels anywhere. float64 tensors are never cast, and ops not listed keep their input dtypes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

# -- the policy -------------------------------------------------------------------------------
# Entries are "name" (every functional overload) or "name.overload".

LOWER_PRECISION = [
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu",
    "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_addmm_activation",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
    "_native_multi_head_attention",
]

FLOAT32 = [
    # pointwise ops that lose accuracy in 16 bits
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus",
    # norms
    "layer_norm", "native_layer_norm", "group_norm", "rms_norm", "frobenius_norm.dim",
    "nuclear_norm", "cosine_similarity", "dist", "pdist", "cdist", "renorm", "logsumexp",
    # losses
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits",
    "binary_cross_entropy", "cross_entropy_loss", "ctc_loss",
    # resampling
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa", "grid_sampler",
    # CPU autocast's float32 list: no low-precision kernels anywhere
    "avg_pool3d", "max_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d",
    "max_unpool2d", "max_unpool3d", "fractional_max_pool2d", "fractional_max_pool3d",
    "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d",
    "replication_pad3d", "polar", "quantile", "nanquantile", "stft", "trace",
    "view_as_complex", "cholesky", "cholesky_inverse", "cholesky_solve", "inverse",
    "lu_solve", "orgqr", "ormqr", "pinverse", "geqrf", "_lu_with_info", "qr", "svd",
    "triangular_solve", "linalg_cholesky", "linalg_cholesky_ex", "linalg_cond",
    "linalg_eig", "linalg_eigh", "linalg_eigvals", "linalg_eigvalsh",
    "linalg_householder_product", "linalg_inv", "linalg_inv_ex", "linalg_lstsq",
    "linalg_matrix_rank", "linalg_qr", "linalg_solve", "linalg_svd", "linalg_svdvals",
    "linalg_tensorinv", "linalg_tensorsolve", "fft_fft", "fft_ifft", "fft_fft2", "fft_ifft2",
    "fft_fftn", "fft_ifftn", "fft_rfft", "fft_irfft", "fft_rfft2", "fft_irfft2", "fft_rfftn",
    "fft_irfftn", "fft_hfft", "fft_ihfft",
]

# Reductions with an optional `dtype` argument: called with dtype=float32 unless one is given.
FLOAT32_SET_DTYPE = [
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
]

# Overloads without a dtype argument that have a twin with one.
FLOAT32_APPEND_DTYPE = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}

PROMOTE = [
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "scatter_add", "tensordot", "cat", "stack", "index_copy",
]

NEURON = "neuron"
_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _overloads(entry: str) -> list[torch._ops.OpOverload]:
    """The functional overloads an entry names (out= and in-place overloads are not autocast)."""
    name, _, overload = entry.partition(".")
    packet = getattr(aten, name, None)
    if packet is None:
        return []
    names = [overload] if overload else packet.overloads()
    ops = []
    for n in names:
        op = getattr(packet, n, None)
        if op is None:
            continue
        if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
            continue
        ops.append(op)
    return ops


def _eligible(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == NEURON
        and value.is_floating_point()
        and value.dtype != torch.float64
    )


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if _eligible(value) and value.dtype != dtype else value
    if isinstance(value, list | tuple) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _tensors(values) -> list[torch.Tensor]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, list | tuple):
            out.extend(x for x in v if isinstance(x, torch.Tensor))
    return out


def _promoted(lower: torch.dtype, values) -> torch.dtype:
    dtype = lower
    for t in _tensors(values):
        if _eligible(t) and t.dtype == torch.float32:
            dtype = torch.float32
    return dtype


def _first_arg_eligible(args: tuple) -> bool:
    return bool(args) and _eligible(args[0])


def _with_float32_dtype(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple:
    """Set the op's `dtype` argument to float32 unless the caller gave one."""
    names = [a.name for a in op._schema.arguments]
    i = names.index("dtype")
    if i < len(args):
        if args[i] is None:
            args = (*args[:i], torch.float32, *args[i + 1 :])
    elif kwargs.get("dtype") is None:
        kwargs = {**kwargs, "dtype": torch.float32}
    return args, kwargs


def _wrap(op: torch._ops.OpOverload, policy: str) -> Callable:
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
            if policy == "lower":
                dtype = torch.get_autocast_dtype(NEURON)
            elif policy == "fp32":
                dtype = torch.float32
            elif policy == "promote":
                dtype = _promoted(torch.get_autocast_dtype(NEURON), (*args, *kwargs.values()))
            else:  # "set_dtype": only when the first argument is eligible
                if _first_arg_eligible(args):
                    args, kwargs = _with_float32_dtype(op, args, kwargs)
                return op(*args, **kwargs)
            args = tuple(_cast(a, dtype) for a in args)
            kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
            return op(*args, **kwargs)

    return kernel


def _append_dtype(target: torch._ops.OpOverload, op: torch._ops.OpOverload) -> Callable:
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
            if _first_arg_eligible(args):
                return target(*args, **kwargs, dtype=torch.float32)
            return op(*args, **kwargs)

    return kernel


def policy() -> dict[torch._ops.OpOverload, str]:
    """Each autocast op -> 'lower', 'fp32', 'set_dtype', 'append_dtype' or 'promote'."""
    table: dict[torch._ops.OpOverload, str] = {}
    for entries, kind in (
        (LOWER_PRECISION, "lower"),
        (FLOAT32, "fp32"),
        (FLOAT32_SET_DTYPE, "set_dtype"),
        (PROMOTE, "promote"),
    ):
        for entry in entries:
            for op in _overloads(entry):
                table.setdefault(op, kind)
    for entry in FLOAT32_APPEND_DTYPE:
        for op in _overloads(entry):
            table[op] = "append_dtype"
    return table


_library: torch.library.Library | None = None
_fallthrough: torch.library.Library | None = None


def install() -> None:
    """Register the AutocastPrivateUse1 kernels; safe to call more than once."""
    global _library, _fallthrough
    if _library is not None:
        return
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    for op, kind in policy().items():
        name = op._schema.name.split("::")[1]
        if op._overloadname != "default":
            name += "." + op._overloadname
        if kind == "append_dtype":
            target_name = FLOAT32_APPEND_DTYPE[str(op).removeprefix("aten.")]
            packet_name, _, overload = target_name.partition(".")
            kernel = _append_dtype(getattr(getattr(aten, packet_name), overload), op)
        else:
            kernel = _wrap(op, kind)
        lib.impl(name, kernel, "AutocastPrivateUse1")
    _fallthrough, _library = fallthrough, lib
