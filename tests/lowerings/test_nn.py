"""nn lowerings (lowerings/nn.py) against CPU PyTorch: forward values and gradients.

Every test runs with TORCHNEURON_STRICT=1, so any CPU fallback raises; `_native` checks that
the named ops ran through their lowering (not a decomposition).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from lowering_checks import assert_native

DEV = "neuron"


pytestmark = pytest.mark.usefixtures("strict")  # tests/lowerings/conftest.py


def _tol(dtype):
    return {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-10, "rtol": 1e-9}


def _compare(fn, *inputs, grad=(), dtype=torch.float32, tol=None):
    """Run `fn` on CPU and on neuron with identical inputs; compare outputs and the grads of
    the inputs whose positions are in `grad` (backward with a random output gradient)."""
    tol = tol or _tol(dtype)
    cpu_in, dev_in = [], []
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor):
            t = t.to(dtype) if t.is_floating_point() else t
            c = t.detach().clone().requires_grad_(i in grad)
            d = t.detach().clone().to(DEV).requires_grad_(i in grad)
        else:
            c = d = t
        cpu_in.append(c)
        dev_in.append(d)
    out_c, out_d = fn(*cpu_in), fn(*dev_in)
    if not isinstance(out_c, tuple):
        out_c, out_d = (out_c,), (out_d,)
    for a, b in zip(out_c, out_d, strict=True):
        assert b.device.type == DEV
        torch.testing.assert_close(b.cpu(), a, **tol)
    if grad:
        pairs = [(a, b) for a, b in zip(out_c, out_d, strict=True) if a.requires_grad]
        gens = [torch.randn(a.shape, dtype=a.dtype) for a, _ in pairs]
        torch.autograd.backward([a for a, _ in pairs], gens)
        torch.autograd.backward([b for _, b in pairs], [g.to(DEV) for g in gens])
        for i in grad:
            torch.testing.assert_close(dev_in[i].grad.cpu(), cpu_in[i].grad, **tol)
    return out_c, out_d


# ---- convolution -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, dtype", [
        ({}, torch.float32),
        ({"stride": 2, "padding": 1}, torch.float64),
        ({"stride": (2, 1), "padding": (0, 2), "dilation": (1, 2)}, torch.float32),
        ({"padding": 2, "dilation": 2, "groups": 2}, torch.float64),
        ({"padding": "same", "groups": 4}, torch.float32),
    ],
)
def test_conv2d(kw, dtype):
    groups = kw.get("groups", 1)
    x = torch.randn(2, 4, 7, 8)
    w = torch.randn(6 if groups != 4 else 8, 4 // groups, 3, 3)
    b = torch.randn(w.shape[0])
    _compare(lambda x, w, b: F.conv2d(x, w, b, **kw), x, w, b, grad=(0, 1, 2), dtype=dtype)
    assert_native("aten.convolution.default", "aten.convolution_backward.default")


def test_conv1d_and_conv3d():
    _compare(lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1),
             torch.randn(2, 3, 9), torch.randn(5, 3, 3), torch.randn(5), grad=(0, 1, 2))
    _compare(lambda x, w: F.conv3d(x, w, padding=1, stride=(1, 2, 2)),
             torch.randn(1, 2, 4, 5, 5), torch.randn(3, 2, 3, 3, 3), grad=(0, 1))
    assert_native("aten.convolution.default", "aten.convolution_backward.default")


@pytest.mark.parametrize(
    "kw", [
        {"stride": 2, "padding": 1, "output_padding": 1},
        {"stride": 2, "padding": 0, "groups": 2, "dilation": 2},
    ],
)
def test_conv_transpose2d(kw):
    x, w, b = torch.randn(2, 4, 5, 4), torch.randn(4, 3, 3, 2), torch.randn(3 * kw.get("groups", 1))
    _compare(lambda x, w, b: F.conv_transpose2d(x, w, b, **kw), x, w, b, grad=(0, 1, 2))
    assert_native("aten.convolution.default", "aten.convolution_backward.default")


def test_conv_transpose1d():
    _compare(lambda x, w: F.conv_transpose1d(x, w, stride=3, padding=2, dilation=2),
             torch.randn(2, 4, 5), torch.randn(4, 3, 3), grad=(0, 1))


def test_conv_weight_grad_only():
    # The first layer of a network: the input needs no gradient (output_mask [F, T, T]).
    conv = nn.Conv2d(3, 4, 3, padding=1)
    dev = nn.Conv2d(3, 4, 3, padding=1).to(DEV)
    dev.load_state_dict(conv.state_dict())
    x = torch.randn(2, 3, 6, 6)
    g = torch.randn(2, 4, 6, 6)
    conv(x).backward(g)
    dev(x.to(DEV)).backward(g.to(DEV))
    torch.testing.assert_close(dev.weight.grad.cpu(), conv.weight.grad, **_tol(torch.float32))
    torch.testing.assert_close(dev.bias.grad.cpu(), conv.bias.grad, **_tol(torch.float32))
    assert_native("aten.convolution_backward.default")


def test_conv_wrong_channels_raises():
    x = torch.randn(1, 5, 6, 6).to(DEV)
    w = torch.randn(4, 3, 3, 3).to(DEV)
    with pytest.raises(RuntimeError, match="channel"):
        F.conv2d(x, w)


# ---- normalization ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batch_norm_module_train_and_eval(dtype):
    cpu = nn.BatchNorm2d(3, momentum=0.2).to(dtype)
    with torch.no_grad():
        cpu.weight.uniform_(0.5, 1.5)
        cpu.bias.uniform_(-1, 1)
    dev = nn.BatchNorm2d(3, momentum=0.2).to(dtype).to(DEV)
    dev.load_state_dict(cpu.state_dict())
    def run(x):
        return (dev if x.device.type == DEV else cpu)(x)

    for _ in range(2):
        _compare(run, torch.randn(4, 3, 5, 5) * 2 + 1, grad=(0,), dtype=dtype)
    # running statistics: unbiased variance, updated in place on the device
    torch.testing.assert_close(dev.running_mean.cpu(), cpu.running_mean, **_tol(dtype))
    torch.testing.assert_close(dev.running_var.cpu(), cpu.running_var, **_tol(dtype))
    assert int(dev.num_batches_tracked) == 2
    cpu.eval()
    dev.eval()
    x = torch.randn(2, 3, 4, 4, dtype=dtype)
    torch.testing.assert_close(dev(x.to(DEV)).cpu(), cpu(x), **_tol(dtype))


def test_batch_norm_grads_of_affine_params():
    cpu = nn.BatchNorm1d(4)
    dev = nn.BatchNorm1d(4).to(DEV)
    x = torch.randn(6, 4, 3)
    g = torch.randn(6, 4, 3)
    xc, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    cpu(xc).backward(g)
    dev(xd).backward(g.to(DEV))
    tol = _tol(torch.float32)
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, **tol)
    torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad, **tol)
    torch.testing.assert_close(dev.bias.grad.cpu(), cpu.bias.grad, **tol)
    assert_native("aten.native_batch_norm_backward.default")


def test_native_batch_norm_legit_updates_running_stats():
    aten = torch.ops.aten
    x = torch.randn(5, 3, 4)
    w, b = torch.rand(3) + 0.5, torch.randn(3)
    rm_c, rv_c = torch.randn(3), torch.rand(3) + 0.5
    rm_d, rv_d = rm_c.clone().to(DEV), rv_c.clone().to(DEV)
    out_c = aten._native_batch_norm_legit(x, w, b, rm_c, rv_c, True, 0.1, 1e-5)
    out_d = aten._native_batch_norm_legit(x.to(DEV), w.to(DEV), b.to(DEV), rm_d, rv_d, True,
                                          0.1, 1e-5)
    tol = _tol(torch.float32)
    for a, d in zip(out_c, out_d, strict=True):
        torch.testing.assert_close(d.cpu(), a, **tol)
    torch.testing.assert_close(rm_d.cpu(), rm_c, **tol)
    torch.testing.assert_close(rv_d.cpu(), rv_c, **tol)
    eval_c = aten._native_batch_norm_legit_no_training(x, w, b, rm_c, rv_c, 0.1, 1e-5)
    eval_d = aten._native_batch_norm_legit_no_training(x.to(DEV), w.to(DEV), b.to(DEV), rm_d,
                                                       rv_d, 0.1, 1e-5)
    torch.testing.assert_close(eval_d[0].cpu(), eval_c[0], **tol)
    stats_c = aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)
    stats_d = aten._native_batch_norm_legit.no_stats(x.to(DEV), w.to(DEV), b.to(DEV), True,
                                                     0.1, 1e-5)
    for a, d in zip(stats_c, stats_d, strict=True):
        torch.testing.assert_close(d.cpu(), a, **tol)
    assert_native("aten._native_batch_norm_legit.default",
            "aten._native_batch_norm_legit_no_training.default",
            "aten._native_batch_norm_legit.no_stats")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5,), (4, 5)])
def test_layer_norm(shape, dtype):
    x = torch.randn(3, 4, 5) * 3 + 1
    w, b = torch.randn(shape), torch.randn(shape)
    _compare(lambda x, w, b: F.layer_norm(x, shape, w, b, eps=1e-4), x, w, b, grad=(0, 1, 2),
             dtype=dtype)
    assert_native("aten.native_layer_norm.default", "aten.native_layer_norm_backward.default")


def test_layer_norm_without_affine():
    _compare(lambda x: F.layer_norm(x, (5,)), torch.randn(3, 4, 5), grad=(0,))
    assert_native("aten.native_layer_norm_backward.default")


def test_group_norm():
    x = torch.randn(3, 6, 4, 2)
    w, b = torch.randn(6), torch.randn(6)
    _compare(lambda x, w, b: F.group_norm(x, 3, w, b), x, w, b, grad=(0, 1, 2))
    assert_native("aten.native_group_norm.default", "aten.native_group_norm_backward.default")


# ---- softmax ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dim", [0, -1])
def test_softmax_and_log_softmax(dim, dtype):
    x = torch.randn(3, 4, 5) * 4
    _compare(lambda x: F.softmax(x, dim), x, grad=(0,), dtype=dtype)
    _compare(lambda x: F.log_softmax(x, dim), x, grad=(0,), dtype=dtype)
    assert_native("aten._softmax.default", "aten._log_softmax.default",
            "aten._softmax_backward_data.default", "aten._log_softmax_backward_data.default")


def test_softmax_half_to_float():
    x = torch.randn(4, 6).half()
    for op in (torch.ops.aten._softmax, torch.ops.aten._log_softmax):
        want = op(x.float(), 1, False)  # CPU has no half_to_float kernel
        got = op(x.to(DEV), 1, True)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.cpu(), want, atol=1e-3, rtol=1e-3)


def test_softmax_all_neg_inf_row_is_nan_like_cpu():
    x = torch.tensor([[float("-inf")] * 3, [0.0, 1.0, 2.0]])
    torch.testing.assert_close(F.softmax(x.to(DEV), -1).cpu(), F.softmax(x, -1), equal_nan=True)


# ---- scaled dot product attention ------------------------------------------------------


@pytest.mark.parametrize("mask", ["causal", "bool", "float", None])
def test_scaled_dot_product_attention(mask):
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    if mask == "causal":
        k, v = k[:, :, :5], v[:, :, :5]
    attn = {
        "bool": torch.rand(5, 6) > 0.3, "float": torch.randn(2, 1, 5, 6), "causal": None,
        None: None,
    }[mask]
    if mask == "bool":
        attn[:, 0] = True  # no fully masked rows

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=mask == "causal")

    _compare(fn, q, k, v, attn, grad=(0, 1, 2), tol={"atol": 2e-5, "rtol": 1e-4})


# ---- pooling ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw", [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 0), "dilation": (1, 2)},
        {"kernel_size": 2, "stride": 2, "padding": 1, "dilation": 2, "ceil_mode": True},
        {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    ],
)
def test_max_pool2d_values_indices_grad(kw):
    x = torch.randn(2, 3, 9, 8)
    out_c, out_d = _compare(lambda x: F.max_pool2d(x, return_indices=True, **kw), x, grad=(0,))
    assert out_d[1].dtype == torch.int64
    assert torch.equal(out_d[1].cpu(), out_c[1])
    assert_native("aten.max_pool2d_with_indices.default",
            "aten.max_pool2d_with_indices_backward.default")


def test_max_pool_ties_and_3d_input():
    # Ties: PyTorch keeps the first maximum of each window; an unbatched (C, H, W) input.
    x = torch.tensor([[[1.0, 1.0, 0.0, 2.0], [1.0, 0.0, 2.0, 2.0]]])
    out_c, out_d = _compare(lambda x: F.max_pool2d(x, 2, return_indices=True), x, grad=(0,))
    assert torch.equal(out_d[1].cpu(), out_c[1])


def test_max_pool1d_and_3d():
    _compare(lambda x: F.max_pool1d(x, 3, 2, 1), torch.randn(2, 3, 10), grad=(0,))
    out_c, out_d = _compare(lambda x: F.max_pool3d(x, 2, return_indices=True),
                            torch.randn(1, 2, 4, 4, 5), grad=(0,))
    assert torch.equal(out_d[1].cpu(), out_c[1])


@pytest.mark.parametrize(
    "kw", [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True,
         "count_include_pad": False},
        {"kernel_size": (2, 3), "stride": 1, "padding": (1, 1), "divisor_override": 4},
    ],
)
def test_avg_pool2d(kw):
    _compare(lambda x: F.avg_pool2d(x, **kw), torch.randn(2, 3, 8, 9), grad=(0,))
    assert_native("aten.avg_pool2d.default", "aten.avg_pool2d_backward.default")


def test_avg_pool1d_and_3d():
    _compare(lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True), torch.randn(2, 3, 8), grad=(0,))
    _compare(lambda x: F.avg_pool3d(x, 2, padding=1), torch.randn(1, 2, 4, 3, 5), grad=(0,))


@pytest.mark.parametrize("size", [(3, 4), (8, 7), (5, 1)])
def test_adaptive_avg_pool2d(size):
    _compare(lambda x: F.adaptive_avg_pool2d(x, size), torch.randn(2, 3, 8, 7), grad=(0,))
    assert_native("aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d_backward.default")


def test_adaptive_avg_pool1d_and_3d():
    _compare(lambda x: F.adaptive_avg_pool1d(x, 3), torch.randn(2, 3, 10), grad=(0,))
    _compare(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)), torch.randn(1, 2, 5, 7, 4), grad=(0,))


@pytest.mark.parametrize("size", [(3, 4), (2, 7)])
def test_adaptive_max_pool2d(size):
    x = torch.randint(0, 4, (2, 3, 5, 7)).float()  # ties: the first maximum wins
    out_c, out_d = _compare(lambda x: F.adaptive_max_pool2d(x, size, return_indices=True), x,
                            grad=(0,))
    assert torch.equal(out_d[1].cpu(), out_c[1])
    assert_native("aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool2d_backward.default")


def test_adaptive_max_pool1d_and_3d():
    _compare(lambda x: F.adaptive_max_pool1d(x, 4), torch.randn(2, 3, 9), grad=(0,))
    _compare(lambda x: F.adaptive_max_pool3d(x, (2, 3, 2)), torch.randn(1, 2, 5, 4, 3), grad=(0,))


# ---- upsampling ------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [{"scale_factor": 2}, {"size": (7, 3)}, {"scale_factor": 1.7}])
def test_upsample_nearest2d(kw):
    _compare(lambda x: F.interpolate(x, **kw), torch.randn(2, 3, 4, 5), grad=(0,))
    assert_native("aten.upsample_nearest2d.default", "aten.upsample_nearest2d_backward.default")


def test_upsample_nearest1d_and_3d():
    _compare(lambda x: F.interpolate(x, size=7), torch.randn(2, 3, 5), grad=(0,))
    _compare(lambda x: F.interpolate(x, size=(3, 5, 7)), torch.randn(1, 2, 2, 3, 4), grad=(0,))


@pytest.mark.parametrize(
    "kw, dtype", [
        ({"scale_factor": 2}, torch.float32),
        ({"size": (7, 3), "align_corners": True}, torch.float32),
        ({"scale_factor": 1.7}, torch.float64),
        ({"size": (3, 2)}, torch.float32),
    ],
)
def test_upsample_bilinear2d(kw, dtype):
    _compare(lambda x: F.interpolate(x, mode="bilinear", **kw), torch.randn(2, 3, 5, 6),
             grad=(0,), dtype=dtype)
    assert_native("aten.upsample_bilinear2d.default", "aten.upsample_bilinear2d_backward.default")


# ---- embedding -------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [{}, {"padding_idx": 1}, {"scale_grad_by_freq": True},
                                {"padding_idx": -2, "scale_grad_by_freq": True}])
def test_embedding(kw):
    idx = torch.tensor([[1, 2, 4], [3, 1, 1]])
    _compare(lambda w, i: F.embedding(i, w, **kw), torch.randn(6, 4), idx, grad=(0,))
    assert_native("aten.embedding.default", "aten.embedding_dense_backward.default")


@pytest.mark.parametrize("bad", [6, -1])
def test_embedding_index_out_of_range(bad):
    w = torch.randn(6, 4).to(DEV)
    with pytest.raises(IndexError, match="index out of range in self"):
        F.embedding(torch.tensor([0, bad], device=DEV), w).cpu()  # raised at the next sync point


# ---- losses ----------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(reduction, weighted):
    x = torch.randn(5, 4).log_softmax(1)
    t = torch.tensor([0, 3, 1, 2, 1])
    w = torch.rand(4) + 0.1 if weighted else None
    _compare(lambda x, t, w: F.nll_loss(x, t, weight=w, reduction=reduction, ignore_index=2),
             x, t, w, grad=(0,))
    assert_native("aten.nll_loss_forward.default", "aten.nll_loss_backward.default")


def test_nll_loss2d():
    x = torch.randn(2, 3, 4, 5)
    t = torch.randint(0, 3, (2, 4, 5))
    t[0, 0, 0] = -100
    _compare(lambda x, t: F.nll_loss(x, t), x, t, grad=(0,))
    assert_native("aten.nll_loss2d_forward.default", "aten.nll_loss2d_backward.default")


def test_nll_loss_target_out_of_range():
    x = torch.randn(3, 4).to(DEV)
    with pytest.raises(IndexError, match="out of bounds"):
        F.nll_loss(x, torch.tensor([0, 4, 1], device=DEV)).item()  # raised at the next sync point


@pytest.mark.parametrize("kw", [{}, {"label_smoothing": 0.1},
                                {"label_smoothing": 0.2, "ignore_index": 1},
                                {"label_smoothing": 0.1, "weight": "w"}])
def test_cross_entropy(kw):
    x = torch.randn(6, 5)
    t = torch.tensor([0, 1, 4, 3, 1, 2])
    w = torch.rand(5) + 0.5

    def fn(x, t, w):
        args = dict(kw)
        if args.get("weight") == "w":
            args["weight"] = w
        return F.cross_entropy(x, t, **args)

    _compare(fn, x, t, w, grad=(0,))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(reduction):
    _compare(lambda x, y: F.mse_loss(x, y, reduction=reduction), torch.randn(4, 5),
             torch.randn(4, 5), grad=(0, 1))
    assert_native("aten.mse_loss.default", "aten.mse_loss_backward.default")


def test_binary_cross_entropy():
    x = torch.rand(4, 5) * 0.9 + 0.05
    t = torch.rand(4, 5)
    w = torch.rand(4, 5)
    _compare(lambda x, t, w: F.binary_cross_entropy(x, t, w), x, t, w, grad=(0,))
    assert_native("aten.binary_cross_entropy.default", "aten.binary_cross_entropy_backward.default")


@pytest.mark.parametrize("pos_weight", [False, True])
def test_binary_cross_entropy_with_logits(pos_weight):
    x, t = torch.randn(4, 5) * 3, torch.rand(4, 5)
    pw = torch.rand(5) + 0.5 if pos_weight else None
    _compare(lambda x, t, pw: F.binary_cross_entropy_with_logits(x, t, pos_weight=pw),
             x, t, pw, grad=(0,))


# ---- recurrent modules -----------------------------------------------------------------


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_rnn_modules(kind):
    torch.manual_seed(0)
    cpu = kind(4, 5, num_layers=2, batch_first=True)
    dev = kind(4, 5, num_layers=2, batch_first=True).to(DEV)
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(3, 6, 4)
    xc, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    out_c, out_d = cpu(xc)[0], dev(xd)[0]
    tol = {"atol": 1e-5, "rtol": 1e-4}
    torch.testing.assert_close(out_d.cpu(), out_c, **tol)
    g = torch.randn_like(out_c)
    out_c.backward(g)
    out_d.backward(g.to(DEV))
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, **tol)
    for (name, pc), pd in zip(cpu.named_parameters(), dev.parameters(), strict=True):
        torch.testing.assert_close(pd.grad.cpu(), pc.grad, **tol, msg=name)
    fused = "aten._thnn_fused_lstm_cell" if kind is nn.LSTM else "aten._thnn_fused_gru_cell"
    assert_native(fused + ".default")


# ---- a small training step -------------------------------------------------------------


def test_cnn_training_step_matches_cpu():
    torch.manual_seed(1)

    def make():
        return nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 4, 3, groups=2), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
            nn.Linear(16, 3), nn.LogSoftmax(1),
        )

    cpu = make()
    dev = make().to(DEV)
    dev.load_state_dict(cpu.state_dict())
    x, t = torch.randn(4, 1, 8, 8), torch.tensor([0, 2, 1, 2])
    for model, xx, tt in ((cpu, x, t), (dev, x.to(DEV), t.to(DEV))):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            F.nll_loss(model(xx), tt).backward()
            opt.step()
    for (name, pc), pd in zip(cpu.state_dict().items(), dev.state_dict().values(), strict=True):
        torch.testing.assert_close(pd.cpu(), pc, atol=1e-5, rtol=1e-4, msg=name)


# ---- inference fast paths (eval + no_grad) ---------------------------------------------


def _eval_pair(make):
    torch.manual_seed(0)
    cpu = make().eval()
    dev = make().to(DEV).eval()
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev


@pytest.mark.parametrize("norm_first, act, mask", [
    (False, "relu", None), (True, "gelu", "causal"), (False, "gelu", "padding"),
])
def test_transformer_encoder_layer_fast_path(norm_first, act, mask):
    cpu, dev = _eval_pair(lambda: nn.TransformerEncoderLayer(
        8, 2, 16, batch_first=True, norm_first=norm_first, activation=act))
    x = torch.randn(2, 5, 8)
    kw = {
        None: {},
        "causal": {"src_mask": nn.Transformer.generate_square_subsequent_mask(5)},
        "padding": {"src_key_padding_mask": torch.tensor([[False] * 5, [False] * 3 + [True] * 2])},
    }[mask]
    with torch.no_grad():
        want = cpu(x, **kw)
        got = dev(x.to(DEV), **{k: v.to(DEV) for k, v in kw.items()})
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-4)
    assert_native("aten._transformer_encoder_layer_fwd.default")


@pytest.mark.parametrize("kw", [{}, {"need_weights": False}, {"average_attn_weights": False},
                                {"key_padding_mask": "kpm"}])
def test_multihead_attention_fast_path(kw):
    cpu, dev = _eval_pair(lambda: nn.MultiheadAttention(8, 2, batch_first=True))
    x = torch.randn(2, 5, 8)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    kw_c = {k: (kpm if v == "kpm" else v) for k, v in kw.items()}
    kw_d = {k: (kpm.to(DEV) if v == "kpm" else v) for k, v in kw.items()}
    xd = x.to(DEV)
    with torch.no_grad():
        out_c, w_c = cpu(x, x, x, **kw_c)
        out_d, w_d = dev(xd, xd, xd, **kw_d)
    torch.testing.assert_close(out_d.cpu(), out_c, atol=1e-5, rtol=1e-4)
    if w_c is None:
        assert w_d is None
    else:
        torch.testing.assert_close(w_d.cpu(), w_c, atol=1e-5, rtol=1e-4)
    assert_native("aten._native_multi_head_attention.default")


# ---- cdist / pdist -------------------------------------------------------------------------

P_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")]


@pytest.mark.parametrize("p", P_VALUES)
@pytest.mark.parametrize("mode", ["use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
                                  "donot_use_mm_for_euclid_dist"])
def test_cdist(p, mode):
    gen = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(2, 1, 5, 4, generator=gen), torch.randn(3, 6, 4, generator=gen)
    if p != 2.0 or mode == "donot_use_mm_for_euclid_dist":
        # A zero distance: CPU's gradient is 0 there. (In the matmul form of p=2 a zero
        # distance is sqrt of a cancelled residue |x|^2 + |y|^2 - 2 x.y, rounding noise on
        # CPU and here alike, so it is not compared.)
        x2[0, 0] = x1[0, 0, 0]
    _compare(lambda a, b: torch.cdist(a, b, p, mode), x1, x2, grad=(0, 1))
    _compare(lambda a, b: torch.cdist(a, b, p, mode), x1, x2, grad=(0, 1), dtype=torch.float64)


def test_cdist_large_uses_matmul_form():
    # More than 25 rows: CPU uses the matmul form for p=2 (its rounding is reproduced).
    _compare(lambda a, b: torch.cdist(a, b), torch.randn(30, 8), torch.randn(27, 8),
             dtype=torch.float64)
    _compare(lambda a, b: torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist"),
             torch.randn(30, 8), torch.randn(27, 8), grad=(0, 1))
    assert_native("aten._cdist_forward.default", "aten._cdist_backward.default")


@pytest.mark.parametrize("p", P_VALUES)
def test_pdist(p):
    x = torch.randn(5, 3)
    x[3] = x[1]  # a zero distance
    _compare(lambda a: F.pdist(a, p), x, grad=(0,))
    _compare(lambda a: F.pdist(a, p), x, grad=(0,), dtype=torch.float64)
    _compare(lambda a: F.pdist(a, p), torch.randn(1, 3))
    assert_native("aten._pdist_forward.default", "aten._pdist_backward.default")


# ---- embedding max_norm (embedding_renorm_) -------------------------------------------------


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf"), 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_embedding_max_norm(norm_type, dtype):
    weight = (torch.randn(6, 4) * 3).to(dtype)
    idx = torch.tensor([[0, 2, 2], [5, 4, 1]])
    w_dev = weight.to(DEV)
    with torch.no_grad():
        want = F.embedding(idx, weight, max_norm=1.5, norm_type=norm_type)
        got = F.embedding(idx.to(DEV), w_dev, max_norm=1.5, norm_type=norm_type)
    torch.testing.assert_close(got.cpu(), want, **_tol(dtype))
    torch.testing.assert_close(w_dev.cpu(), weight, **_tol(dtype))  # renormalised in place
    assert_native("aten.embedding_renorm_.default")


def test_embedding_renorm_negative_and_bad_index():
    weight = torch.randn(5, 3) * 3
    w_dev = weight.to(DEV)
    torch.embedding_renorm_(weight, torch.tensor([-1, 0]), 1.0, 2.0)
    torch.embedding_renorm_(w_dev, torch.tensor([-1, 0], device=DEV), 1.0, 2.0)
    torch.testing.assert_close(w_dev.cpu(), weight)
    with pytest.raises(IndexError):
        torch.embedding_renorm_(w_dev, torch.tensor([7], device=DEV), 1.0, 2.0)
        torch.neuron.synchronize()  # raised at the next sync point


# ---- replicate padding (negative widths crop) -----------------------------------------------


@pytest.mark.parametrize("shape, pad", [
    ((5, 3, 4, 4), (-4, 5, 0, 0)),
    ((2, 3, 5), (2, -1)),
    ((1, 2, 3, 4, 5), (1, 2, -1, 3, 2, -2)),
    ((2, 3, 4, 4), (1, 1, 2, 2)),
])
def test_replicate_pad(shape, pad):
    _compare(lambda x: F.pad(x, pad, "replicate"), torch.randn(shape), grad=(0,))
    assert_native()


# ---- random ops: multinomial, rrelu (shape, dtype, reproducibility, support) ------------------


@pytest.mark.parametrize("replacement", [False, True])
def test_multinomial(replacement):
    p = torch.tensor([[0.1, 0.0, 0.5, 0.4], [1.0, 1.0, 1.0, 1.0]], device=DEV)
    torch.manual_seed(3)
    a = torch.multinomial(p, 3, replacement)
    torch.manual_seed(3)
    b = torch.multinomial(p, 3, replacement)
    assert a.device.type == DEV and a.dtype == torch.int64 and a.shape == (2, 3)
    assert torch.equal(a.cpu(), b.cpu())
    assert not (a.cpu()[0] == 1).any()  # a zero-probability category is never drawn
    if not replacement:
        assert all(len(set(row.tolist())) == 3 for row in a.cpu())
    assert_native("aten.multinomial.default")


def test_multinomial_errors():
    for bad in ([0.0, 0.0], [-1.0, 1.0], [float("nan"), 1.0], [float("inf"), 1.0]):
        with pytest.raises(RuntimeError):
            torch.multinomial(torch.tensor(bad, device=DEV), 1)
    with pytest.raises(RuntimeError):
        torch.multinomial(torch.ones(2, device=DEV), 3)


def test_rrelu():
    x = torch.randn(3, 4)
    x_dev = x.to(DEV).requires_grad_()
    y = F.rrelu(x_dev, training=True)
    slopes = (y.detach().cpu() / x)
    negative = x < 0
    assert torch.all(slopes[~negative] == 1)
    assert torch.all((slopes[negative] >= 1 / 8) & (slopes[negative] <= 1 / 3))
    y.sum().backward()
    torch.testing.assert_close(x_dev.grad.cpu(), slopes)
    torch.testing.assert_close(F.rrelu(x.to(DEV)).cpu(), F.rrelu(x))  # eval: the mean slope
    assert_native("aten.rrelu_with_noise.default")


@pytest.mark.parametrize("op", [torch.ops.aten.softshrink_backward, torch.ops.aten.hardshrink_backward])
def test_shrink_backward_like_cpu(op):
    x = torch.tensor([-1.0, -0.5, 0.0, 0.3, 0.5, 2.0, float("nan")])
    g = torch.randn(7)
    assert torch.equal(op(g.to("neuron"), x.to("neuron"), 0.5).cpu(), op(g, x, 0.5))
