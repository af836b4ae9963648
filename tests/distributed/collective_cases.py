"""Each collective on neuron tensors (the `neuron` group) next to the same call on CPU tensors
(a Gloo group over the same ranks). Runs inside the ranks started by launch.run_ranks."""

from __future__ import annotations

import traceback

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

RO = dist.ReduceOp


def _data(shape, dtype, rank, salt=0):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 4).to(dtype)
    return torch.randint(-50 if dtype.is_signed else 0, 50, shape, generator=g).to(dtype)


def _on(device, values):
    if isinstance(values, torch.Tensor):
        return values.to(device)
    return [_on(device, v) for v in values]


def _cpu(values):
    if isinstance(values, torch.Tensor):
        return values.cpu()
    if isinstance(values, list | tuple):
        return [_cpu(v) for v in values]
    return values


def compare(case, gloo_group, reference=None, exact=True):
    """Run case(device, group) on neuron/default group and on cpu/gloo group; compare.

    Collectives only move and combine values, so they must agree exactly; cases that also
    compute on the device (DDP) are compared to float32 rounding."""
    got = _cpu(case("neuron", None))
    want = _cpu(case("cpu", gloo_group)) if reference is None else reference()
    tol = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(got, want, equal_nan=True, **tol)


def cases(rank, world, gloo):
    out = {}

    def reduce_dtypes():
        return [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                torch.int32, torch.int16, torch.int8, torch.uint8]

    for op in ("SUM", "MAX", "MIN", "PRODUCT"):
        for dt in reduce_dtypes():
            def c(dev, grp, op=op, dt=dt):
                t = _on(dev, _data((3, 5), dt, rank))
                view = t[:, 1:4]  # a non-contiguous view: the result lands in place
                if dev == "cpu":  # Gloo needs contiguous tensors
                    part = view.contiguous()
                    dist.all_reduce(part, getattr(RO, op), group=grp)
                    view.copy_(part)
                else:
                    dist.all_reduce(view, getattr(RO, op), group=grp)
                return t
            if dt in (torch.int16,):
                # Gloo has no int16: compare with int32 on CPU cast back
                def ref(op=op, dt=dt):
                    ts = [_data((3, 5), dt, r).to(torch.int32) for r in range(world)]
                    base = _data((3, 5), dt, rank).clone()
                    red = {"SUM": sum, "MAX": lambda x: torch.stack(x).amax(0),
                           "MIN": lambda x: torch.stack(x).amin(0),
                           "PRODUCT": lambda x: torch.stack(x).prod(0)}[op]([x[:, 1:4] for x in ts])
                    base[:, 1:4] = red.to(dt)
                    return base
                out[f"all_reduce_{op}_{dt}"] = (c, ref)
            else:
                out[f"all_reduce_{op}_{dt}"] = (c, None)

    for dt in (torch.float32, torch.bfloat16, torch.int64):
        def avg(dev, grp, dt=dt):
            t = _on(dev, _data((4, 3), dt, rank))
            if dev == "cpu":  # Gloo has no AVG: SUM then divide, as PyTorch defines it
                dist.all_reduce(t, RO.SUM, group=grp)
                return t / world if dt.is_floating_point else torch.div(t, world, rounding_mode="trunc")
            dist.all_reduce(t, RO.AVG, group=grp)
            return t
        out[f"all_reduce_AVG_{dt}"] = (avg, None)

    for op in ("BAND", "BOR", "BXOR"):
        def bitwise(dev, grp, op=op):
            t = _on(dev, _data((6,), torch.int64, rank))
            dist.all_reduce(t, getattr(RO, op), group=grp)
            return t
        out[f"all_reduce_{op}_int64"] = (bitwise, None)

    def ar_uint32(dev, grp):
        t = _on(dev, _data((5,), torch.int64, rank).abs().to(torch.uint32))
        dist.all_reduce(t, group=grp)
        return t.to(torch.int64)
    out["all_reduce_SUM_uint32"] = (
        ar_uint32, lambda: sum(_data((5,), torch.int64, r).abs() for r in range(world)))

    def ddp_features(dev, grp):
        # gradient accumulation under no_sync, with a parameter the forward never uses
        # (find_unused_parameters=True).
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel as DDP

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.used = nn.Linear(4, 3)
                self.unused = nn.Linear(4, 2)

            def forward(self, x):
                return self.used(x)

        torch.manual_seed(0)
        net = Net().to(dev)
        ddp = DDP(net, process_group=grp, find_unused_parameters=True)
        xs = [_on(dev, _data((2, 4), torch.float32, rank, s)) for s in range(2)]
        with ddp.no_sync():
            ddp(xs[0]).square().sum().backward()
        ddp(xs[1]).square().sum().backward()
        return [p.grad for p in net.used.parameters()]

    def ddp_ref():
        from torch import nn

        torch.manual_seed(0)
        net = nn.Linear(4, 3)
        for r in range(world):
            for s in range(2):
                (net(_data((2, 4), torch.float32, r, s)).square().sum() / world).backward()
        return [p.grad for p in net.parameters()]

    out["ddp_no_sync"] = (ddp_features, None)  # against DDP on CPU/Gloo
    out["ddp_no_sync_matches_serial"] = (ddp_features, ddp_ref)  # against one process

    def ar_complex(dev, grp):
        t = _on(dev, _data((4,), torch.complex64, rank))
        dist.all_reduce(t, group=grp)
        return t
    out["all_reduce_SUM_complex64"] = (ar_complex, None)

    def ar_bool(dev, grp):
        t = _on(dev, _data((6,), torch.bool, rank))
        dist.all_reduce(t, RO.MAX, group=grp)
        return t
    out["all_reduce_MAX_bool"] = (ar_bool, None)

    def ar_async(dev, grp):
        t = _on(dev, _data((8,), torch.float32, rank))
        work = dist.all_reduce(t, group=grp, async_op=True)
        work.wait()
        assert work.is_completed()
        fut_value = work.get_future().wait()
        return [t, fut_value[0]]
    out["all_reduce_async"] = (ar_async, None)

    def coalesced(dev, grp):
        ts = [_on(dev, _data((3,), torch.float32, rank, s)) for s in range(3)]
        dist.all_reduce_coalesced(ts, group=grp)
        return ts
    out["all_reduce_coalesced"] = (coalesced, None)

    for dt in (torch.float32, torch.bfloat16, torch.int16, torch.complex64, torch.bool, torch.float8_e4m3fn):
        def bc(dev, grp, dt=dt):
            t = _on(dev, _data((2, 3), dt if dt != torch.float8_e4m3fn else torch.float32, rank).to(dt))
            dist.broadcast(t, src=1, group=grp)
            return t.view(torch.uint8) if dt == torch.float8_e4m3fn else t
        if dt in (torch.int16, torch.float8_e4m3fn):
            def ref(dt=dt):
                t = _data((2, 3), dt if dt != torch.float8_e4m3fn else torch.float32, 1).to(dt)
                return t.view(torch.uint8) if dt == torch.float8_e4m3fn else t
            out[f"broadcast_{dt}"] = (bc, ref)
        else:
            out[f"broadcast_{dt}"] = (bc, None)

    for op in ("SUM", "MAX"):
        def red(dev, grp, op=op):
            t = _on(dev, _data((5,), torch.float32, rank))
            dist.reduce(t, dst=0, op=getattr(RO, op), group=grp)
            return t if rank == 0 else torch.zeros(5)  # only the root's value is defined
        out[f"reduce_{op}"] = (red, None)

    for dt in (torch.float32, torch.int64, torch.bfloat16):
        def ag(dev, grp, dt=dt):
            t = _on(dev, _data((2, 3), dt, rank))
            outs = [torch.empty(2, 3, dtype=dt, device=dev) for _ in range(world)]
            dist.all_gather(outs, t, group=grp)
            return outs
        out[f"all_gather_{dt}"] = (ag, None)

    def ag_complex(dev, grp):
        t = _on(dev, _data((3,), torch.complex64, rank))
        outs = [torch.empty(3, dtype=torch.complex64, device=dev) for _ in range(world)]
        dist.all_gather(outs, t, group=grp)
        return outs
    out["all_gather_complex64"] = (ag_complex, lambda: [_data((3,), torch.complex64, r) for r in range(world)])

    def agt(dev, grp):
        t = _on(dev, _data((2, 3), torch.float32, rank))
        o = torch.empty(2 * world, 3, device=dev)
        dist.all_gather_into_tensor(o, t, group=grp)
        return o
    out["all_gather_into_tensor"] = (agt, None)

    def rs(dev, grp):
        ins = [_on(dev, _data((4,), torch.float32, rank, s)) for s in range(world)]
        o = torch.empty(4, device=dev)
        dist.reduce_scatter(o, ins, group=grp)
        return o
    # Gloo cannot reduce_scatter a list: the reference sums on CPU
    out["reduce_scatter"] = (rs, lambda: sum(_data((4,), torch.float32, r, rank) for r in range(world)))

    for op in ("SUM", "AVG", "MAX"):
        def rst(dev, grp, op=op):
            t = _on(dev, _data((world * 2, 3), torch.float32, rank))
            o = torch.empty(2, 3, device=dev)
            dist.reduce_scatter_tensor(o, t, op=getattr(RO, op), group=grp)
            return o

        def ref(op=op):
            full = torch.stack([_data((world * 2, 3), torch.float32, r) for r in range(world)])
            red = {"SUM": full.sum(0), "AVG": full.sum(0) / world, "MAX": full.amax(0)}[op]
            return red[rank * 2 : rank * 2 + 2]
        out[f"reduce_scatter_tensor_{op}"] = (rst, ref)

    def a2a_single(dev, grp):
        # uneven: rank r sends r+1+d rows to rank d
        in_splits = [rank + 1 + d for d in range(world)]
        out_splits = [s + 1 + rank for s in range(world)]
        t = _on(dev, _data((sum(in_splits), 3), torch.float32, rank))
        o = torch.empty(sum(out_splits), 3, device=dev)
        dist.all_to_all_single(o, t, out_splits, in_splits, group=grp)
        return o
    out["all_to_all_single_uneven"] = (a2a_single, None)

    def a2a_even(dev, grp):
        t = _on(dev, _data((world * 2,), torch.int64, rank))
        o = torch.empty(world * 2, dtype=torch.int64, device=dev)
        dist.all_to_all_single(o, t, group=grp)
        return o
    out["all_to_all_single_even"] = (a2a_even, None)

    def a2a(dev, grp):
        ins = [_on(dev, _data((rank + 1 + d,), torch.float32, rank, d)) for d in range(world)]
        outs = [torch.empty(s + 1 + rank, device=dev) for s in range(world)]
        dist.all_to_all(outs, ins, group=grp)
        return outs

    def a2a_ref():
        return [_data((s + 1 + rank,), torch.float32, s, rank) for s in range(world)]
    out["all_to_all_uneven"] = (a2a, a2a_ref)

    def sendrecv(dev, grp):
        t = _on(dev, _data((3, 2), torch.float32, rank))
        peer = 1 - rank
        if rank == 0:
            dist.send(t, dst=peer, group=grp)
            dist.recv(t, src=peer, group=grp)
        else:
            r = torch.empty(3, 2, device=dev)
            dist.recv(r, src=peer, group=grp)
            dist.send(r * 2, dst=peer, group=grp)
            t = r
        return t
    out["send_recv"] = (sendrecv, None)

    def isend_irecv(dev, grp):
        t = _on(dev, _data((4,), torch.int32, rank))
        r = torch.empty(4, dtype=torch.int32, device=dev)
        peer = 1 - rank
        ops = [dist.P2POp(dist.isend, t, peer, grp), dist.P2POp(dist.irecv, r, peer, grp)]
        if rank == 1:
            ops.reverse()
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return r
    out["batch_isend_irecv"] = (isend_irecv, lambda: _data((4,), torch.int32, 1 - rank))

    def gather(dev, grp):
        t = _on(dev, _data((3,), torch.float32, rank))
        outs = [torch.empty(3, device=dev) for _ in range(world)] if rank == 1 else None
        dist.gather(t, outs, dst=1, group=grp)
        return outs if rank == 1 else t
    out["gather"] = (gather, None)

    def scatter(dev, grp):
        o = torch.empty(2, 2, device=dev)
        ins = [_on(dev, _data((2, 2), torch.float32, 0, s)) for s in range(world)] if rank == 0 else None
        dist.scatter(o, ins, src=0, group=grp)
        return o
    out["scatter"] = (scatter, None)

    def barrier(dev, grp):
        dist.barrier(group=grp)
        return torch.ones(1)
    out["barrier"] = (barrier, None)

    def objects(dev, grp):
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": rank}, group=grp)
        lst = [rank * 10]
        dist.broadcast_object_list(lst, src=1, group=grp)
        return torch.tensor([o["rank"] for o in objs] + lst)
    out["object_collectives"] = (objects, None)

    def fc_ops(dev, grp):
        grp = grp or dist.group.WORLD
        t = _on(dev, _data((2, 4), torch.float32, rank))
        a = funcol.all_reduce(t, "sum", grp)
        b = funcol.all_gather_tensor(t, 0, grp)
        c = funcol.reduce_scatter_tensor(t, "sum", 0, grp)
        d = funcol.all_to_all_single(t, None, None, grp)
        e = funcol.broadcast(t, 1, grp)
        f = funcol.all_reduce(t, "max", grp)
        return [x.wait() if hasattr(x, "wait") else x for x in (a, b, c, d, e, f)]
    out["functional_collectives"] = (fc_ops, None)

    return out


def run_all(outdir, arg):
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    results = {}
    for name, (case, ref) in cases(rank, world, gloo).items():
        try:
            compare(case, gloo, ref, exact=not name.startswith("ddp"))
            results[name] = None
        except Exception:
            results[name] = traceback.format_exc()
    results["subgroup"] = subgroup(outdir, arg)
    return results


def subgroup(outdir, arg):
    """new_group over a subset: a 1-rank group, and a 2-rank group created after it."""
    rank = dist.get_rank()
    solo = dist.new_group([1])
    pair = dist.new_group([0, 1])
    t = torch.full((3,), float(rank + 1), device="neuron")
    if rank == 1:
        dist.all_reduce(t, group=solo)
    solo_value = t.clone().cpu()
    dist.all_reduce(t, group=pair)
    assert dist.get_backend(pair) == "neuron", dist.get_backend(pair)
    return {"solo": solo_value, "pair": t.cpu(), "backend": dist.get_backend()}


def mismatch(outdir, arg):
    """Collectives whose shapes or dtypes differ across ranks must raise on both ranks; the
    group stays usable afterwards (the check runs before any data moves)."""
    rank = dist.get_rank()
    errors = {}
    tensors = {
        "shape": torch.ones(4 + rank, device="neuron"),
        "dtype": torch.ones(4, device="neuron", dtype=torch.float32 if rank == 0 else torch.float64),
    }
    for what, t in tensors.items():
        try:
            dist.all_reduce(t)
            errors[what] = None
        except RuntimeError as err:
            errors[what] = str(err)
    after = torch.ones(2, device="neuron")
    dist.all_reduce(after)
    errors["after"] = after.cpu().tolist()
    return errors
