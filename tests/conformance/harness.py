"""Conformance harness: PyTorch's own OpInfo / ModuleInfo test data, run on CPU and on `neuron`.

Each check returns *records*, one per (op, variant, dtype):

    {"op": "add", "variant": "forward", "dtype": "float32", "status": "pass", ...}

variants: forward, out, inplace, grad, error_inputs, random (random-number ops), module
(ModuleInfo forward+backward). Statuses, from worst to best:

    mismatch   a value, dtype or shape differs from CPU and nothing raised (a *silent mismatch*;
               never allowed in the manifest of expected failures)
    crash / timeout   (set by the runner when a worker dies or hangs on the op)
    raise      neuron raised where CPU did not
    wrong-exc  both raised, with different exception types
    noraise    CPU raised, neuron returned a result
    stride     values right, strides differ from CPU's
    fallback   right, but at least one ATen op ran on CPU (torchneuron's CPU fallback)
    pass       right, and every ATen op ran natively or through a decomposition
    skip       nothing to compare (no samples, or CPU itself rejects every sample)

Only tensors travel: every sample is made on CPU, under a fixed seed, and copied to neuron.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.testing._comparison import default_tolerances

import torchneuron

DEV = "neuron"

STATUS_ORDER = [
    "mismatch", "crash", "timeout", "raise", "wrong-exc", "noraise", "stride", "fallback", "pass",
    "skip",
]
SILENT = {"mismatch"}
FAILING = {"mismatch", "crash", "timeout", "raise", "wrong-exc", "noraise", "stride"}

# Sample caps per (op, variant, dtype): the full op_db has ~6100 (op, dtype) pairs and every
# new shape compiles an XLA executable on neuron.
CAPS = {
    "forward": 2, "forward_f32": 8, "out": 1, "inplace": 1, "grad": 3, "error_inputs": 12,
    "random": 2, "module": 3,
}

RANDOM_OPS = {
    "bernoulli", "normal", "multinomial", "uniform", "cauchy", "exponential", "geometric",
    "log_normal", "rand_like", "randn_like", "randint_like", "randint", "randn", "rand",
    "randperm", "nn.functional.rrelu", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d", "pca_lowrank", "svd_lowrank",
}
# Ops whose values are unspecified (uninitialized memory): only dtype/shape/device compared.
UNSPECIFIED_VALUES = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
                      "empty_permuted"}
# OpInfos the harness cannot check honestly, with the reason (recorded as skip).
HARNESS_SKIPS = {
    "as_strided.partial_views": "reads storage outside the sample view; a copy to another "
                                "device keeps only the view's elements",
}


# Ops whose index outputs are only defined for distinct values (ties may pick any index).
TIE_OPS = {
    "sort", "argsort", "msort", "topk", "kthvalue", "mode", "median", "nanmedian", "max",
    "min", "argmax", "argmin", "cummax", "cummin", "unique", "unique_consecutive",
}


class OpTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise OpTimeout("op exceeded its time limit")


def op_id(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def is_random(op) -> bool:
    return op.name in RANDOM_OPS or "dropout" in op.name


# ----------------------------------------------------------------------------------------
# Tolerances


def tolerances(op, dtype: torch.dtype) -> tuple[float, float]:
    """PyTorch's default (rtol, atol) for `dtype`, widened by the OpInfo's own overrides."""
    rtol, atol = default_tolerances(dtype)
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride

    for info in getattr(op, "decorators", ()) or ():
        for dec in getattr(info, "decorators", ()) or ():
            if isinstance(dec, toleranceOverride) and dtype in dec.d:
                atol = max(atol, dec.d[dtype].atol)
                rtol = max(rtol, dec.d[dtype].rtol)
            elif isinstance(dec, precisionOverride) and dtype in dec.d:
                atol = max(atol, dec.d[dtype])
    return rtol, atol


# ----------------------------------------------------------------------------------------
# Moving samples and comparing results


class _Sample:
    """A SampleInput's (input, args, kwargs) on another device."""

    def __init__(self, input, args, kwargs):
        self.input, self.args, self.kwargs = input, args, kwargs


def copy_layout(x: torch.Tensor, device, shared: dict | None = None) -> torch.Tensor:
    """A copy of `x` on `device` with x's exact sizes, strides and storage offset.

    `Tensor.to`/`clone` make non-dense inputs contiguous and break aliasing, so OpInfos'
    noncontiguous samples and `out=` error inputs that overlap an input would reach the
    device as plain separate tensors. Tensors that share a CPU storage (recorded in `shared`)
    get views of one copied storage, as they alias on CPU."""
    x = x.detach()
    if x.layout != torch.strided or x.is_conj() or x.is_neg() or x.numel() == 0:
        return x.to(device) if x.device != torch.device(device) else x.clone()
    storage = x.untyped_storage()
    key = (storage.data_ptr(), x.dtype)
    flat = None if shared is None else shared.get(key)
    if flat is None:
        n = storage.nbytes() // x.element_size()
        flat = torch.empty(0, dtype=x.dtype).set_(storage, 0, (n,)).to(device, copy=True)
        if shared is not None:
            shared[key] = flat
    return flat.as_strided(x.shape, x.stride(), x.storage_offset())


def to_device(tree: Any, grad: bool = False) -> Any:
    if hasattr(tree, "sample_input") or type(tree).__name__ == "SampleInput":
        moved = to_device((tree.input, tuple(tree.args), dict(tree.kwargs)), grad)
        kwargs = moved[2]
        if kwargs.get("device") in ("cpu", torch.device("cpu")):  # factory ops
            kwargs["device"] = DEV
        args = tuple(DEV if a == "cpu" and isinstance(a, str) else a for a in moved[1])
        return _Sample(moved[0], args, kwargs)

    shared: dict = {}

    def move(x):
        if isinstance(x, torch.Tensor):
            y = copy_layout(x, DEV, shared)
            if grad and x.requires_grad:
                y.requires_grad_(True)
            return y
        if isinstance(x, torch.device) and x.type == "cpu":
            return torch.device(DEV)
        return x

    return pytree.tree_map(move, tree)


def clone_cpu(tree: Any, grad: bool = False) -> Any:
    shared: dict = {}

    def c(x):
        if isinstance(x, torch.Tensor):
            y = copy_layout(x, "cpu", shared)
            if grad and x.requires_grad:
                y.requires_grad_(True)
            return y
        return x

    return pytree.tree_map(c, tree)


class Mismatch(Exception):
    def __init__(self, kind: str, msg: str):
        super().__init__(msg)
        self.kind = kind  # "mismatch" (values/dtype/shape) or "stride"


def _leaves(tree: Any) -> list:
    if hasattr(tree, "_fields") and isinstance(tree, tuple):  # namedtuple (torch.return_types)
        tree = tuple(tree)
    leaves, _ = pytree.tree_flatten(tree)
    return leaves


def _relevant_strides(t: torch.Tensor) -> tuple:
    return tuple(s for n, s in zip(t.shape, t.stride()) if n > 1)


def compare(cpu_out: Any, dev_out: Any, rtol: float, atol: float, strides: bool = True,
            ties: bool = False, values: bool = True) -> None:
    """Raise Mismatch when `dev_out` (neuron) differs from `cpu_out`.

    ties: the input has repeated values and the op returns indices of them; index (int64)
    outputs are then only checked for dtype and shape.
    """
    a, b = _leaves(cpu_out), _leaves(dev_out)
    if len(a) != len(b):
        raise Mismatch("mismatch", f"output structure: {len(a)} leaves on CPU, {len(b)} on neuron")
    stride_msg = None
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, torch.Tensor):
            if not isinstance(y, torch.Tensor):
                raise Mismatch("mismatch", f"output {i}: CPU tensor, neuron {type(y).__name__}")
            if y.device.type != DEV:
                raise Mismatch("mismatch", f"output {i}: on device {y.device}")
            if x.dtype != y.dtype:
                raise Mismatch("mismatch", f"output {i}: dtype {y.dtype}, CPU {x.dtype}")
            if x.shape != y.shape:
                raise Mismatch("mismatch", f"output {i}: shape {tuple(y.shape)}, CPU {tuple(x.shape)}")
            yc = y.detach().cpu()
            xc = x.detach()
            if xc.is_quantized or xc.layout != torch.strided:
                continue
            if (ties and x.dtype == torch.int64 and len(a) > 1) or not values:
                continue
            # at least the defaults of the output's dtype (int inputs, float outputs)
            r_out, a_out = default_tolerances(x.dtype)
            try:
                torch.testing.assert_close(yc, xc, rtol=max(rtol, r_out), atol=max(atol, a_out),
                                           equal_nan=True,
                                           check_stride=False, check_device=False)
            except AssertionError as err:
                msg = str(err).strip().replace("\n", " ")
                raise Mismatch("mismatch", f"output {i} ({dtype_name(x.dtype)}, shape "
                               f"{tuple(x.shape)}): {msg[:300]}") from None
            if (strides and stride_msg is None and x.numel() > 1
                    and _relevant_strides(x) != _relevant_strides(y)):
                stride_msg = f"output {i}: strides {y.stride()}, CPU {x.stride()}"
        elif isinstance(x, float) and isinstance(y, float | int):
            if not (math.isclose(x, y, rel_tol=max(rtol, 1e-6), abs_tol=atol)
                    or (math.isnan(x) and math.isnan(y))):
                raise Mismatch("mismatch", f"output {i}: {y!r}, CPU {x!r}")
        elif isinstance(x, torch.dtype | torch.Size | int | bool | str | type(None)):
            if x != y:
                raise Mismatch("mismatch", f"output {i}: {y!r}, CPU {x!r}")
    if stride_msg:
        raise Mismatch("stride", stride_msg)


def _describe(sample) -> str:
    def d(x):
        if isinstance(x, torch.Tensor):
            extra = "" if x.is_contiguous() else " noncontig"
            return f"T{tuple(x.shape)}{extra}"
        if isinstance(x, list | tuple) and len(x) > 6:
            return f"{type(x).__name__}[{len(x)}]"
        return repr(x)[:40]

    parts = [d(sample.input)] if not isinstance(sample.input, list | tuple) else [
        "[" + ", ".join(d(x) for x in sample.input) + "]"]
    parts += [d(a) for a in sample.args]
    parts += [f"{k}={d(v)}" for k, v in sample.kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def _fallbacks() -> list[str]:
    return sorted(torchneuron.op_counts()["fallback"])


def _decomposed() -> list[str]:
    return sorted(torchneuron.op_counts()["decomposed"])


# ----------------------------------------------------------------------------------------
# Per-variant checks


class _Acc:
    """Accumulates sample outcomes for one (op, variant, dtype) into one record."""

    def __init__(self, op: str, variant: str, dtype: str):
        self.rec: dict[str, Any] = {"op": op, "variant": variant, "dtype": dtype,
                                    "status": "skip", "samples": 0, "passed": 0,
                                    "fallback_ops": [], "decomposed_ops": [], "detail": ""}
        self.fallback: set[str] = set()
        self.decomposed: set[str] = set()

    def add(self, status: str, detail: str = "") -> None:
        r = self.rec
        if status != "skip":
            r["samples"] += 1
        if status in ("pass", "fallback"):
            r["passed"] += 1
        if STATUS_ORDER.index(status) < STATUS_ORDER.index(r["status"]):
            r["status"] = status
            if detail:
                r["detail"] = detail[:500]

    def paths(self) -> None:
        self.fallback.update(_fallbacks())
        self.decomposed.update(_decomposed())

    def done(self) -> dict:
        self.rec["fallback_ops"] = sorted(self.fallback)
        self.rec["decomposed_ops"] = sorted(self.decomposed)
        if self.rec["status"] == "pass" and self.fallback:
            self.rec["status"] = "fallback"
        return self.rec


def _exc_name(err: BaseException) -> str:
    return type(err).__name__


def _has_ties(sample) -> bool:
    x = sample.input
    if not isinstance(x, torch.Tensor) or x.numel() < 2:
        return False
    try:
        return torch.unique(x.detach()).numel() < x.numel()
    except Exception:  # noqa: BLE001  (dtypes unique does not take: assume ties)
        return True


# The float64 reference rule (as PyTorch's own reference tests do it): when a low-precision
# result is not close to CPU's, both are compared with the same computation in float64; a
# neuron result that is at least as close to it as CPU's is not wrong, only rounded
# differently. Counted separately in the report ("closer_to_float64").
PRECISE = {torch.float32: torch.float64, torch.float16: torch.float64,
           torch.bfloat16: torch.float64, torch.complex64: torch.complex128}


def to_precise(tree: Any) -> Any:
    """`tree` with its low-precision floating tensors upcast (CPU), grad leaves kept."""

    def up(x):
        if isinstance(x, torch.Tensor) and x.dtype in PRECISE:
            y = x.detach().to(PRECISE[x.dtype])
            if x.requires_grad:
                y.requires_grad_(True)
            return y
        return x

    return pytree.tree_map(up, tree)


def closer_to_reference(cpu_out: Any, dev_out: Any, ref_out: Any) -> bool:
    """True when every floating output of dev_out is at least as close (summed absolute error
    over the finite elements) to ref_out as cpu_out is, with the same non-finite values."""
    a, b, r = _leaves(cpu_out), _leaves(dev_out), _leaves(ref_out)
    if not (len(a) == len(b) == len(r)):
        return False
    for x, y, z in zip(a, b, r):
        if not isinstance(x, torch.Tensor):
            if x != y and not (isinstance(x, float) and math.isnan(x) and math.isnan(y)):
                return False
            continue
        if not isinstance(z, torch.Tensor) or x.shape != y.shape or x.shape != z.shape:
            return False
        xc, yc = x.detach(), y.detach().cpu()
        if not (xc.is_floating_point() or xc.is_complex()):
            if not torch.equal(xc, yc):
                return False
            continue
        wide = z.dtype if z.dtype.is_complex or not xc.is_complex() else torch.complex128
        xc, yc, zc = xc.to(wide), yc.to(wide), z.detach().to(wide)
        fx, fy = torch.isfinite(xc), torch.isfinite(yc)
        if not torch.equal(fx, fy):
            return False
        if not torch.equal(torch.nan_to_num(xc[~fx], nan=0.5), torch.nan_to_num(yc[~fy], nan=0.5)):
            return False
        m = fx & torch.isfinite(zc)
        err_dev = (yc - zc).abs()[m].sum().item()
        err_cpu = (xc - zc).abs()[m].sum().item()
        if err_dev > err_cpu:
            return False
    return True


def _run_pair(acc: _Acc, cpu_fn, dev_fn, desc: str, rtol, atol, strides=True,
              ties=False, values=True, ref_fn=None) -> None:
    """cpu_fn() and dev_fn() each return a result to compare; classify the sample.

    ref_fn: the CPU computation in float64, for the float64 reference rule (PRECISE)."""
    cpu_err = dev_err = None
    cpu_out = dev_out = None
    try:
        cpu_out = cpu_fn()
    except OpTimeout:
        raise
    except Exception as err:  # noqa: BLE001
        cpu_err = err
    torchneuron.reset_op_counts()
    try:
        dev_out = dev_fn()
        if cpu_err is None:
            compare(cpu_out, dev_out, rtol, atol, strides, ties, values)
    except OpTimeout:
        raise
    except Mismatch as m:
        acc.paths()
        if m.kind == "mismatch" and ref_fn is not None and "are not close" in str(m):
            try:
                closer = closer_to_reference(cpu_out, dev_out, ref_fn())
            except OpTimeout:
                raise
            except Exception:  # noqa: BLE001  (no float64 version of the sample)
                closer = False
            if closer:
                acc.rec["closer_to_float64"] = acc.rec.get("closer_to_float64", 0) + 1
                acc.add("pass")
                return
        acc.add(m.kind, f"{desc}: {m}")
        return
    except Exception as err:  # noqa: BLE001
        dev_err = err
    acc.paths()
    if cpu_err is not None and dev_err is None:
        acc.add("noraise", f"{desc}: CPU raised {_exc_name(cpu_err)}: {str(cpu_err)[:150]}")
    elif cpu_err is None and dev_err is not None:
        acc.add("raise", f"{desc}: {_exc_name(dev_err)}: {str(dev_err)[:300]}")
    elif cpu_err is not None and dev_err is not None:
        if isinstance(dev_err, type(cpu_err)) or isinstance(cpu_err, type(dev_err)):
            acc.add("skip")  # both reject the sample in the same way: nothing to compare
        else:
            acc.add("wrong-exc", f"{desc}: CPU {_exc_name(cpu_err)}, neuron {_exc_name(dev_err)}: "
                    f"{str(dev_err)[:200]}")
    else:
        acc.add("pass")


def _same_algorithm(s, dtype) -> None:
    """Resolve device-dependent "auto" choices of a Python composite to the ones the neuron
    device gets, for the CPU reference too: `F.linear_cross_entropy`'s options pick another
    accumulation policy and chunking on CPU than on any other device (float32 accumulation
    for half inputs on CPU only), so "auto" would compare two different algorithms."""
    options = s.kwargs.get("options")
    if type(options).__name__ != "LinearCrossEntropyOptions":
        return
    from torch.nn.modules import linear_cross_entropy_options as lce

    chosen = lce._AUTO_DEFAULTS.get((DEV, dtype), lce._AUTO_FALLBACK)
    changes = {}
    if options.acc_policy == "auto":
        changes["acc_policy"] = chosen.acc_policy
    if options.chunking_method == "auto" and options.batch_chunk_size is None:
        changes["chunking_method"] = chosen.chunking_method
    if changes:
        s.kwargs["options"] = dataclasses.replace(options, **changes)


def _samples(op, dtype, requires_grad=False, cap=6) -> Iterable:
    torch.manual_seed(0)
    it = op.sample_inputs("cpu", dtype, requires_grad=requires_grad)
    for i, s in enumerate(it):
        if i >= cap:
            break
        _same_algorithm(s, dtype)
        yield s


def _random_sample(op, s) -> bool:
    """Samples of deterministic OpInfos that draw random numbers (dropout inside)."""
    if s.kwargs.get("dropout_p", 0) > 0:
        return True
    return op.name == "nn.functional.multi_head_attention_forward" and bool(
        s.kwargs.get("training"))


def _precise_call(op, s, dtype):
    """The sample computed on CPU in float64, or None when dtype has no wider twin."""
    if dtype not in PRECISE:
        return None

    def call():
        x, a, k = to_precise(clone_cpu((s.input, tuple(s.args), dict(s.kwargs))))
        return op(x, *a, **k)

    return call


def _argsorted(op, s) -> torch.Tensor:
    """The input reordered by argsort's indices; Mismatch when they are not a permutation."""
    idx = op(s.input, *s.args, **s.kwargs)
    dim = s.args[0] if s.args else s.kwargs.get("dim", -1)
    if s.input.dim() == 0:
        return idx
    positions = torch.arange(s.input.shape[dim]).to(idx.device)
    shape = [1] * s.input.dim()
    shape[dim] = -1
    if not torch.equal(idx.sort(dim=dim).values, positions.reshape(shape).expand_as(idx)):
        raise Mismatch("mismatch", "argsort: indices are not a permutation along dim")
    return torch.take_along_dim(s.input, idx, dim)


def check_forward(op, dtype) -> dict:
    acc = _Acc(op_id(op), "forward", dtype_name(dtype))
    rtol, atol = tolerances(op, dtype)
    cap = CAPS["forward_f32"] if dtype == torch.float32 else CAPS["forward"]
    for s in _samples(op, dtype, cap=cap):
        if _random_sample(op, s):
            continue  # random: the dropout masks of CPU and neuron differ by design
        d = to_device(s)
        if op.name == "argsort" and _has_ties(s) and not s.kwargs.get("stable", False):
            # Unstable argsort orders ties arbitrarily (CPU's std::sort): compare what the
            # indices select, after checking they are a permutation along `dim`.
            _run_pair(acc, lambda s=s: _argsorted(op, s), lambda d=d: _argsorted(op, d),
                      _describe(s), rtol, atol)
            continue
        _run_pair(acc, lambda s=s: op(s.input, *s.args, **s.kwargs),
                  lambda d=d: op(d.input, *d.args, **d.kwargs), _describe(s), rtol, atol,
                  ties=op.name in TIE_OPS and _has_ties(s),
                  values=op.name not in UNSPECIFIED_VALUES, ref_fn=_precise_call(op, s, dtype))
    return acc.done()


def _zeros_like_tree(tree):
    if hasattr(tree, "_fields") and isinstance(tree, tuple):
        tree = tuple(tree)
    return pytree.tree_map(lambda t: torch.zeros_like(t) if isinstance(t, torch.Tensor) else t, tree)


def check_out(op, dtype) -> dict:
    acc = _Acc(op_id(op), "out", dtype_name(dtype))
    rtol, atol = tolerances(op, dtype)
    for s in _samples(op, dtype, cap=CAPS["out"]):
        try:
            expected = op(s.input, *s.args, **s.kwargs)
        except Exception:  # noqa: BLE001
            continue
        if not all(isinstance(t, torch.Tensor) for t in _leaves(expected)):
            continue
        d = to_device(s)

        def cpu_fn(s=s, expected=expected):
            out = _zeros_like_tree(expected)
            ret = op(s.input, *s.args, **s.kwargs, out=out)
            return ret, out

        def dev_fn(d=d, expected=expected):
            out = to_device(_zeros_like_tree(expected))
            ret = op(d.input, *d.args, **d.kwargs, out=out)
            for r, o in zip(_leaves(ret), _leaves(out)):
                if r is not o and isinstance(r, torch.Tensor) and r.data_ptr() != o.data_ptr():
                    raise Mismatch("mismatch", "out=: the returned tensor is not `out`")
            return ret, out

        ref = _precise_call(op, s, dtype)
        _run_pair(acc, cpu_fn, dev_fn, _describe(s), rtol, atol,
                  ties=op.name in TIE_OPS and _has_ties(s),
                  ref_fn=ref and (lambda ref=ref: (r := ref(), r)))
    return acc.done()


def check_inplace(op, dtype) -> dict:
    acc = _Acc(op_id(op), "inplace", dtype_name(dtype))
    rtol, atol = tolerances(op, dtype)
    fn = op.inplace_variant
    for s in _samples(op, dtype, cap=CAPS["inplace"]):
        if not isinstance(s.input, torch.Tensor):
            continue
        d = to_device(s)

        def cpu_fn(s=s):
            x = s.input.clone()
            fn(x, *s.args, **s.kwargs)
            return x

        def dev_fn(d=d):
            x = d.input.clone()
            ret = fn(x, *d.args, **d.kwargs)
            if ret is not x:
                raise Mismatch("mismatch", "in-place variant did not return its input")
            return x

        _run_pair(acc, cpu_fn, dev_fn, _describe(s), rtol, atol)
    return acc.done()


def _grad_leaves(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor) and t.requires_grad]


def _grads(fn, inputs, cotangent_seed=1, cot_dtype=None) -> tuple:
    """Outputs of fn(inputs) and the gradients of <outputs, fixed random cotangents>.

    cot_dtype: draw the cotangents in this (real/complex-matched) dtype, then cast, so a
    float64 reference run sees the float32 run's cotangents."""
    leaves = _grad_leaves(inputs)
    outs = fn(inputs)
    flat = [o for o in _leaves(outs) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not flat:
        return outs, None
    gen = torch.Generator().manual_seed(cotangent_seed)
    cots = []
    for o in flat:
        draw = o.dtype
        if cot_dtype is not None and o.dtype == torch.float64:
            draw = cot_dtype if not cot_dtype.is_complex else torch.float32
        elif cot_dtype is not None and o.dtype == torch.complex128:
            draw = torch.complex64
        c = torch.randn(o.shape, generator=gen, dtype=draw).to(o.dtype)
        cots.append(c.to(o.device))
    grads = torch.autograd.grad(flat, leaves, cots, allow_unused=True)
    return outs, grads


def check_grad(op, dtype) -> dict:
    acc = _Acc(op_id(op), "grad", dtype_name(dtype))
    rtol, atol = tolerances(op, dtype)
    for s in _samples(op, dtype, requires_grad=True, cap=CAPS["grad"]):
        if _random_sample(op, s):
            continue
        cpu_in = clone_cpu((s.input, s.args, s.kwargs), grad=True)
        dev_in = to_device((s.input, s.args, s.kwargs), grad=True)

        def call(inp, s=s):
            x, a, k = inp
            return s.output_process_fn_grad(op(x, *a, **k))

        ref_fn = None
        if dtype in PRECISE:
            ref_in = to_precise(cpu_in)
            ref_fn = lambda r=ref_in: _grads(call, r, cot_dtype=dtype)[1]  # noqa: E731
        _run_pair(acc, lambda c=cpu_in: _grads(call, c)[1], lambda d=dev_in: _grads(call, d)[1],
                  _describe(s), rtol, atol, strides=False, ref_fn=ref_fn)
    return acc.done()


def check_error_inputs(op) -> dict:
    acc = _Acc(op_id(op), "error_inputs", "any")
    try:
        torch.manual_seed(0)
        errors = list(op.error_inputs("cpu"))[: CAPS["error_inputs"]]
    except Exception as err:  # noqa: BLE001
        acc.rec["detail"] = f"error_inputs could not be built: {err}"[:300]
        return acc.done()
    raised = 0
    for e in errors:
        s = e.sample_input
        try:
            op(s.input, *s.args, **s.kwargs)
        except OpTimeout:
            raise
        except Exception as err:  # noqa: BLE001
            cpu_err = err
        else:
            continue  # CPU does not raise here (the error is device-specific): not a case
        try:
            d = to_device(s)
        except Exception:  # noqa: BLE001
            continue
        torchneuron.reset_op_counts()
        try:
            op(d.input, *d.args, **d.kwargs)
            # An index out of range raises at the next sync point, as on CUDA.
            torch.neuron.synchronize()
        except OpTimeout:
            raise
        except Exception as err:  # noqa: BLE001
            raised += 1
            if isinstance(err, type(cpu_err)) or isinstance(cpu_err, type(err)):
                acc.add("pass")
            else:
                acc.add("wrong-exc", f"{_describe(s)}: CPU {_exc_name(cpu_err)}, neuron "
                        f"{_exc_name(err)}: {str(err)[:150]}")
            continue
        acc.paths()
        acc.add("noraise", f"{_describe(s)}: CPU raised {_exc_name(cpu_err)}: {str(cpu_err)[:150]}")
    acc.rec["cases"] = acc.rec["samples"]
    acc.rec["raised"] = raised
    rec = acc.done()
    if rec["status"] == "fallback":
        rec["status"] = "pass"  # an error raised by the CPU fallback is still raised
    return rec


def _moments_ok(x: torch.Tensor, y: torch.Tensor) -> str | None:
    xf, yf = x.detach().double().flatten(), y.detach().cpu().double().flatten()
    n = xf.numel()
    if n < 256 or not torch.isfinite(xf).all():
        return None
    sx, sy = xf.std().item(), yf.std().item()
    tol = 6 * max(sx, 1e-3) * math.sqrt(2 / n) + 1e-3
    if abs(xf.mean().item() - yf.mean().item()) > tol:
        return f"mean {yf.mean().item():.4g}, CPU {xf.mean().item():.4g} (n={n})"
    if abs(sx - sy) > 0.25 * sx + 1e-3:
        return f"std {sy:.4g}, CPU {sx:.4g} (n={n})"
    return None


def _moment_stats(t: torch.Tensor) -> tuple[float, float]:
    f = t.detach().cpu().double().flatten()
    return f.mean().item(), f.std().item()


@contextlib.contextmanager
def _unfixed_seed():
    """OpInfo ops wrapped in torch.testing's wrapper_set_seed (the dropouts) reseed with 42 on
    every call: let them draw from the seed set by the caller instead."""
    from torch.testing import _utils

    fixed = _utils.wrapper_set_seed
    holders = [m for name, m in list(sys.modules.items())
               if name.startswith("torch.testing._internal")
               and getattr(m, "wrapper_set_seed", None) is fixed]
    for m in holders:
        m.wrapper_set_seed = lambda op, *args, **kwargs: op(*args, **kwargs)
    try:
        yield
    finally:
        for m in holders:
            m.wrapper_set_seed = fixed


def _moments_over_seeds(op, cpu_sample, dev_sample, leaf: int, seeds: int = 32) -> str | None:
    """Two-sample test of the output's mean and std over `seeds` seeds on each device.

    The one-draw check of _moments_ok assumes numel independent draws. Ops with fewer (feature
    dropout draws one mask value per channel: 25 draws for 625 elements) have a far wider
    spread of the output's moments from seed to seed; measuring that spread on CPU and neuron
    counts the independent draws as they are, and the averages over many seeds make this a
    stricter test of the distribution than one draw, not a looser one."""
    stats: dict[str, list[tuple[float, float]]] = {"cpu": [], "dev": []}
    with _unfixed_seed():
        for seed in range(1000, 1000 + seeds):
            for key, sample in (("cpu", cpu_sample), ("dev", dev_sample)):
                torch.manual_seed(seed)
                out = _leaves(op(sample.input, *sample.args, **sample.kwargs))[leaf]
                stats[key].append(_moment_stats(out))
    for k, name in enumerate(("mean", "std")):
        c = torch.tensor([v[k] for v in stats["cpu"]], dtype=torch.float64)
        d = torch.tensor([v[k] for v in stats["dev"]], dtype=torch.float64)
        if not (torch.isfinite(c).all() and torch.isfinite(d).all()):
            return f"{name} not finite over seeds"
        spread = math.sqrt((c.var().item() + d.var().item()) / seeds)
        diff = abs(c.mean().item() - d.mean().item())
        if diff > 5 * spread + 1e-9 * (1 + abs(c.mean().item())):
            return (f"{name} over {seeds} seeds {d.mean().item():.4g}, CPU {c.mean().item():.4g} "
                    f"(5 standard errors: {5 * spread:.3g})")
    return None


def check_random(op, dtype) -> dict:
    """Random ops: shape, dtype, device, reproducibility under a seed, moments (n >= 256)."""
    acc = _Acc(op_id(op), "random", dtype_name(dtype))
    for s in _samples(op, dtype, cap=CAPS["random"]):
        desc = _describe(s)
        try:
            torch.manual_seed(7)
            cpu_out = op(s.input, *s.args, **s.kwargs)
        except Exception:  # noqa: BLE001
            continue
        d = to_device(s)
        torchneuron.reset_op_counts()
        try:
            torch.manual_seed(7)
            a = op(d.input, *d.args, **d.kwargs)
            torch.manual_seed(7)
            b = op(d.input, *d.args, **d.kwargs)
        except OpTimeout:
            raise
        except Exception as err:  # noqa: BLE001
            acc.paths()
            acc.add("raise", f"{desc}: {_exc_name(err)}: {str(err)[:300]}")
            continue
        acc.paths()
        bad = None
        for leaf, (x, y, z) in enumerate(zip(_leaves(cpu_out), _leaves(a), _leaves(b))):
            if not isinstance(x, torch.Tensor):
                continue
            if not isinstance(y, torch.Tensor) or y.device.type != DEV:
                bad = "output is not a neuron tensor"
            elif x.dtype != y.dtype or x.shape != y.shape:
                bad = f"dtype/shape {y.dtype}{tuple(y.shape)}, CPU {x.dtype}{tuple(x.shape)}"
            elif not torch.equal(y.cpu(), z.cpu()) and not (
                    y.is_floating_point() and torch.equal(y.cpu().isnan(), z.cpu().isnan())
                    and torch.equal(y.cpu().nan_to_num(), z.cpu().nan_to_num())):
                bad = "not reproducible under torch.manual_seed"
            elif x.dtype != torch.bool:
                bad = _moments_ok(x, y)
                if bad:
                    # one draw can be far off when there are few independent draws
                    # (channel-wise randomness): decide on the spread over many seeds.
                    bad = _moments_over_seeds(op, s, d, leaf)
            if bad:
                break
        acc.add("mismatch" if bad else "pass", f"{desc}: {bad}" if bad else "")
    return acc.done()


# ----------------------------------------------------------------------------------------
# One OpInfo, all variants and dtypes


def op_dtypes(op) -> list[torch.dtype]:
    return sorted(op.supported_dtypes("cpu"), key=str)


def check_op(op, dtypes: Iterable[torch.dtype] | None = None, variants=None,
             time_limit: float | None = None, error_inputs: bool = True) -> list[dict]:
    """Every record for one OpInfo. `time_limit` bounds each (variant, dtype) check (SIGALRM)."""
    records = []
    dtypes = op_dtypes(op) if dtypes is None else list(dtypes)
    rand = is_random(op)
    backward = set(op.supported_backward_dtypes("cpu")) if op.supports_autograd else set()
    jobs = []
    for dtype in dtypes:
        if rand:
            jobs.append(("random", dtype, check_random))
            continue
        jobs.append(("forward", dtype, check_forward))
        if op.supports_out:
            jobs.append(("out", dtype, check_out))
        if op.inplace_variant is not None:
            jobs.append(("inplace", dtype, check_inplace))
        if dtype in (torch.float32, torch.float64) and dtype in backward:
            jobs.append(("grad", dtype, check_grad))
    if error_inputs and not rand and op.error_inputs_func is not None:
        jobs.append(("error_inputs", None, lambda o, _d: check_error_inputs(o)))
    for variant, dtype, fn in jobs:
        if variants is not None and variant not in variants:
            continue
        if op_id(op) in HARNESS_SKIPS:
            records.append({"op": op_id(op), "variant": variant,
                            "dtype": dtype_name(dtype) if dtype else "any", "status": "skip",
                            "samples": 0, "passed": 0, "fallback_ops": [], "decomposed_ops": [],
                            "detail": "harness: " + HARNESS_SKIPS[op_id(op)], "seconds": 0,
                            "kind": "op"})
            continue
        t0 = time.perf_counter()
        if time_limit:
            signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, time_limit)
        try:
            rec = fn(op, dtype)
        except OpTimeout:
            rec = {"op": op_id(op), "variant": variant,
                   "dtype": dtype_name(dtype) if dtype else "any", "status": "timeout",
                   "samples": 0, "passed": 0, "fallback_ops": [], "decomposed_ops": [],
                   "detail": f"exceeded {time_limit}s"}
        except Exception as err:  # noqa: BLE001  (sample generation itself failed)
            rec = {"op": op_id(op), "variant": variant,
                   "dtype": dtype_name(dtype) if dtype else "any", "status": "skip",
                   "samples": 0, "passed": 0, "fallback_ops": [], "decomposed_ops": [],
                   "detail": f"harness: {_exc_name(err)}: {str(err)[:200]}"}
        finally:
            if time_limit:
                signal.setitimer(signal.ITIMER_REAL, 0)
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        rec["kind"] = "op"
        records.append(rec)
    return records


# ----------------------------------------------------------------------------------------
# ModuleInfo


def check_module(module_info, dtype=torch.float32) -> dict:
    name = module_info.name
    acc = _Acc(name, "module", dtype_name(dtype))
    rtol, atol = default_tolerances(dtype)
    rtol, atol = max(rtol, 1e-4), max(atol, 1e-4)  # deeper graphs: accumulated rounding
    torch.manual_seed(0)
    try:
        inputs = module_info.module_inputs_func(module_info, device="cpu", dtype=dtype,
                                                requires_grad=True, training=True)
    except Exception as err:  # noqa: BLE001
        acc.rec["detail"] = f"harness: {err}"[:300]
        return acc.done()
    for mi in inputs[: CAPS["module"]]:
        if mi.forward_input is None:
            continue
        cargs, ckw = mi.constructor_input.args, mi.constructor_input.kwargs
        fargs, fkw = mi.forward_input.args, mi.forward_input.kwargs
        desc = f"{name}(*{len(cargs)} args, {sorted(ckw)})"
        try:
            torch.manual_seed(0)
            m_cpu = module_info.module_cls(*cargs, **ckw).to(dtype)
            m_cpu.train(True)
            m_dev = copy.deepcopy(m_cpu).to(DEV)
        except Exception as err:  # noqa: BLE001
            acc.rec["detail"] = f"construction: {err}"[:300]
            continue

        def both(m, inp):
            a, k = inp
            torch.manual_seed(3)
            outs = m(*a, **k)
            params = [p for p in m.parameters() if p.requires_grad]
            leaves = _grad_leaves((a, k)) + params
            flat = [o for o in _leaves(outs) if isinstance(o, torch.Tensor) and o.requires_grad]
            if not flat:
                return outs, None
            gen = torch.Generator().manual_seed(1)
            cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in flat]
            grads = torch.autograd.grad(flat, leaves, cots, allow_unused=True)
            return outs, grads

        cpu_in = clone_cpu((fargs, fkw), grad=True)
        dev_in = to_device((fargs, fkw), grad=True)
        _run_pair(acc, lambda m=m_cpu, i=cpu_in: both(m, i), lambda m=m_dev, i=dev_in: both(m, i),
                  desc, rtol, atol,
                  strides=False)
    return acc.done()


def module_is_random(module_info) -> bool:
    return "Dropout" in module_info.name or "RReLU" in module_info.name
