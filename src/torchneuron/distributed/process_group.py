"""`ProcessGroupNeuron`: the c10d process group behind `init_process_group("neuron")`.

Each collective stages its neuron tensors to host memory, runs the same collective on the
transport (Gloo over TCP on the CPU platform, see transport.py) and writes the results back
into the neuron tensors, through views and in place, as PyTorch's semantics require. CPU tensors
take the same path without the copies, so one process group serves both devices (object
collectives, DCP's planning, DDP's parameter checks all send CPU tensors).

Calls complete before they return: the `Work` they return is already finished (`wait()`,
`is_completed()`, `get_future()` behave as PyTorch documents, there is just no overlap of
communication with computation).

Before each collective the ranks compare what they are about to do (operation, dtypes, shapes)
with a small all-gather; a mismatch raises `RuntimeError` on every rank instead of exchanging
garbage. `TORCHNEURON_DIST_CHECK=0` turns that check off.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from .. import config
from .transport import Transport, create_transport

RedOpType = dist.ReduceOp.RedOpType
NEURON = "neuron"
_SIG_BYTES = 256
_P2P_TAG_OFFSET = 1 << 20  # header messages of send/recv use their own tag space


def _check_enabled() -> bool:
    return config.flag("TORCHNEURON_DIST_CHECK")


def _done(result) -> dist.Work:
    fut: Future = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _describe(t: torch.Tensor | None) -> str:
    if t is None:
        return "-"
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with t's value; t itself when t already is one."""
    if t.device.type == "cpu":
        return t if t.is_contiguous() else t.contiguous()
    return t.detach().to("cpu")


def _write_back(dst: torch.Tensor, host: torch.Tensor) -> None:
    if dst is host:
        return
    with torch.no_grad():
        dst.copy_(host.view(dst.shape) if host.shape != dst.shape else host)


def _op_of(reduce_op) -> tuple[RedOpType, object]:
    op = reduce_op.op if isinstance(reduce_op, dist.ReduceOp) else reduce_op
    factor = getattr(reduce_op, "factor", None) if op == RedOpType.PREMUL_SUM else None
    return op, factor


class ProcessGroupNeuron(dist.ProcessGroup):
    """A c10d ProcessGroup for `neuron` (and CPU) tensors; see the module docstring."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._rank, self._size, self._timeout = rank, size, timeout
        self._group_name = ""
        self._group_desc = ""
        self.transport: Transport = create_transport(store, rank, size, timeout)

    # -- identity ------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return NEURON

    def _get_backend_name(self) -> str:
        return NEURON

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout
        self.transport.timeout = timeout

    def abort(self) -> None:
        self.transport.shutdown()

    def shutdown(self) -> None:
        self.transport.shutdown()

    def __repr__(self) -> str:
        return f"ProcessGroupNeuron(rank={self._rank}, size={self._size}, transport={self.transport.name})"

    # -- cross-rank checks ---------------------------------------------------------------
    def _check(self, what: str) -> None:
        """Raise on every rank unless every rank is about to run the same collective."""
        if self._size == 1 or not _check_enabled():
            return
        digest = hashlib.sha1(what.encode()).digest()[:8]
        text = what.encode()[: _SIG_BYTES - 8]
        mine = torch.zeros(_SIG_BYTES, dtype=torch.uint8)
        mine[:8] = torch.frombuffer(bytearray(digest), dtype=torch.uint8)
        mine[8 : 8 + len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        gathered = [torch.empty_like(mine) for _ in range(self._size)]
        self.transport.allgather([gathered], [mine])
        if all(torch.equal(g[:8], mine[:8]) for g in gathered):
            return
        calls = []
        for r, g in enumerate(gathered):
            raw = bytes(g[8:].tolist()).rstrip(b"\0").decode(errors="replace")
            calls.append(f"rank {r}: {raw}")
        raise RuntimeError(
            "torchneuron: mismatched collective across ranks of process group "
            f"{self._group_name!r}: " + "; ".join(calls)
        )

    # -- reductions ----------------------------------------------------------------------
    def _reduce_dtype(self, dtype: torch.dtype, op: RedOpType) -> torch.dtype:
        if dtype in self.transport.reduce_dtypes:
            return dtype
        if dtype.is_complex:
            if op not in (RedOpType.SUM, RedOpType.AVG, RedOpType.PREMUL_SUM):
                raise RuntimeError(f"torchneuron: reduce op {op.name} is not defined for complex tensors")
            return dtype
        if dtype.is_floating_point:
            return torch.float64 if dtype.itemsize > 4 else torch.float32
        if dtype in (torch.int16,):
            return torch.int32
        return torch.int64

    def _reduce_inputs(self, tensors: list[torch.Tensor], reduce_op) -> tuple[list, RedOpType, object]:
        """Host copies of `tensors` ready for the transport, and the op the transport runs."""
        op, factor = _op_of(reduce_op)
        hosts = []
        for t in tensors:
            h = _to_host(t)
            if factor is not None:
                f = factor.item() if isinstance(factor, torch.Tensor) else factor
                h = h * f
            wire = self._reduce_dtype(h.dtype, op)
            if h.is_complex() and h.dtype not in self.transport.reduce_dtypes:
                h = torch.view_as_real(h.clone() if h is t else h)
            elif wire != h.dtype:
                h = h.to(wire)
            elif h is t and op == RedOpType.AVG:
                pass  # in place on a CPU tensor: the average is finished below
            hosts.append(h)
        wire_op = RedOpType.SUM if op in (RedOpType.AVG, RedOpType.PREMUL_SUM) else op
        return hosts, wire_op, op

    def _finish_reduce(self, t: torch.Tensor, h: torch.Tensor, op: RedOpType) -> None:
        if t.is_complex() and not h.is_complex():
            h = torch.view_as_complex(h)
        if op == RedOpType.AVG:
            if h.is_floating_point() or h.is_complex():
                h.div_(self._size)
            else:
                h.copy_(torch.div(h, self._size, rounding_mode="trunc"))
        if h.dtype != t.dtype:
            h = h.to(t.dtype)
        _write_back(t, h)

    def allreduce(self, tensors, opts) -> dist.Work:
        op, _ = _op_of(opts.reduceOp)
        self._check(f"all_reduce {op.name} " + ",".join(_describe(t) for t in tensors))
        hosts, wire_op, op = self._reduce_inputs(tensors, opts.reduceOp)
        self.transport.allreduce(hosts, wire_op)
        for t, h in zip(tensors, hosts):
            self._finish_reduce(t, h, op)
        return _done(list(tensors))

    def allreduce_coalesced(self, tensors, opts) -> dist.Work:
        for t in tensors:
            o = _c10d.AllreduceOptions()
            o.reduceOp = opts.reduceOp
            self.allreduce([t], o)
        return _done(list(tensors))

    def reduce(self, tensors, opts) -> dist.Work:
        op, _ = _op_of(opts.reduceOp)
        self._check(f"reduce {op.name} root={opts.rootRank} " + ",".join(_describe(t) for t in tensors))
        hosts, wire_op, op = self._reduce_inputs(tensors, opts.reduceOp)
        self.transport.reduce(hosts, opts.rootRank, wire_op)
        if self._rank == opts.rootRank:
            for t, h in zip(tensors, hosts):
                self._finish_reduce(t, h, op)
        return _done(list(tensors))

    def reduce_scatter(self, output_tensors, input_tensors, opts) -> dist.Work:
        op, _ = _op_of(opts.reduceOp)
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != self._size:
                raise ValueError(f"reduce_scatter needs {self._size} input tensors, got {len(ins)}")
            for i in ins:
                if i.numel() != out.numel() or i.dtype != out.dtype:
                    raise ValueError("reduce_scatter: every input must match the output's size and dtype")
            self._check(f"reduce_scatter {op.name} {_describe(out)} x{len(ins)}")
            hosts, wire_op, op = self._reduce_inputs(list(ins), opts.reduceOp)
            out_host = torch.empty_like(hosts[0])
            self.transport.reduce_scatter(out_host, hosts, wire_op)
            self._finish_reduce(out, out_host, op)
        return _done(list(output_tensors))

    def reduce_scatter_single(self, output, input, opts) -> dist.Work:
        if input.numel() != output.numel() * self._size:
            raise ValueError(
                f"reduce_scatter_tensor: input has {input.numel()} elements, expected "
                f"output numel {output.numel()} x world size {self._size}"
            )
        if input.dtype != output.dtype:
            raise ValueError("reduce_scatter_tensor: input and output dtypes differ")
        chunks = list(input.reshape(-1).chunk(self._size)) if output.numel() else [input.reshape(-1)] * self._size
        self.reduce_scatter([output.view(-1)], [chunks], opts)
        return _done([output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts) -> dist.Work:
        for out, inp in zip(outputs, inputs):
            self.reduce_scatter_single(out, inp, opts)
        return _done(list(outputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # -- data movement -------------------------------------------------------------------
    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        """t on the host in a dtype the transport can move (its bytes, if need be)."""
        h = _to_host(t)
        if h.dtype in self.transport.move_dtypes:
            return h
        if h.dim() == 0:
            h = h.reshape(1)
        return h.view(torch.uint8)

    def _empty_wire(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu" and t.is_contiguous() and t.dtype in self.transport.move_dtypes:
            return t
        h = torch.empty(t.shape, dtype=t.dtype)
        if h.dtype in self.transport.move_dtypes:
            return h
        if h.dim() == 0:
            h = h.reshape(1)
        return h.view(torch.uint8)

    @staticmethod
    def _unwire(t: torch.Tensor, h: torch.Tensor) -> None:
        if h.dtype != t.dtype:
            h = h.view(t.dtype).reshape(t.shape)
        _write_back(t, h)

    def broadcast(self, tensors, opts) -> dist.Work:
        self._check(f"broadcast root={opts.rootRank} " + ",".join(_describe(t) for t in tensors))
        hosts = [self._wire(t) for t in tensors]
        self.transport.broadcast(hosts, opts.rootRank)
        if self._rank != opts.rootRank:
            for t, h in zip(tensors, hosts):
                self._unwire(t, h)
        return _done(list(tensors))

    def allgather(self, output_tensors, input_tensors, opts) -> dist.Work:
        for outs, inp in zip(output_tensors, input_tensors):
            if len(outs) != self._size:
                raise ValueError(f"all_gather needs {self._size} output tensors, got {len(outs)}")
            for o in outs:
                if o.numel() != inp.numel() or o.dtype != inp.dtype:
                    raise ValueError(
                        f"all_gather: output {_describe(o)} does not match input {_describe(inp)}"
                    )
            self._check(f"all_gather {_describe(inp)}")
            h_in = self._wire(inp)
            h_outs = [self._empty_wire(o).view(h_in.shape) if o.shape != inp.shape else self._empty_wire(o) for o in outs]
            self.transport.allgather([h_outs], [h_in])
            for o, h in zip(outs, h_outs):
                self._unwire(o, h.view(o.shape) if h.dtype == o.dtype else h)
        return _done(list(output_tensors))

    def all_gather_single(self, output, input, opts) -> dist.Work:
        if output.numel() != input.numel() * self._size:
            raise ValueError(
                f"all_gather_into_tensor: output has {output.numel()} elements, expected input "
                f"numel {input.numel()} x world size {self._size}"
            )
        if input.dtype != output.dtype:
            raise ValueError("all_gather_into_tensor: input and output dtypes differ")
        flat_out = output.view(-1) if output.is_contiguous() else None
        if flat_out is None:
            tmp = torch.empty(output.shape, dtype=output.dtype, device=output.device)
            self.all_gather_single(tmp, input, opts)
            output.copy_(tmp)
            return _done([output])
        n = input.numel()
        outs = [flat_out[r * n : (r + 1) * n].view(input.shape) for r in range(self._size)]
        self.allgather([outs], [input], opts)
        return _done([output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts) -> dist.Work:
        for out, inp in zip(outputs, inputs):
            self.all_gather_single(out, inp, opts)
        return _done(list(outputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allgather_coalesced(self, output_lists, input_list, opts) -> dist.Work:
        for outs, inp in zip(output_lists, input_list):
            self.allgather([outs], [inp], opts)
        return _done(output_lists)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts) -> dist.Work:
        self._check(f"all_to_all_single {str(input.dtype)} rows{list(input.shape[1:])}")
        if output.dtype != input.dtype:
            raise ValueError("all_to_all_single: input and output dtypes differ")
        h_in = self._wire(input)
        h_out = self._empty_wire(output)
        self.transport.alltoall_base(h_out, h_in, list(output_split_sizes), list(input_split_sizes))
        self._unwire(output, h_out)
        return _done([output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts) -> dist.Work:
        dtypes = {t.dtype for t in list(output_tensors) + list(input_tensors)}
        self._check(f"all_to_all {sorted(str(d) for d in dtypes)} x{len(input_tensors)}")
        if len(dtypes) > 1:
            raise ValueError("all_to_all: all tensors must have the same dtype")
        # Exchange sizes first so uneven pieces need no agreement beforehand.
        send_sizes = torch.tensor([t.numel() for t in input_tensors], dtype=torch.int64)
        recv_sizes = torch.empty(self._size, dtype=torch.int64)
        self.transport.alltoall_base(recv_sizes, send_sizes, [1] * self._size, [1] * self._size)
        for o, n in zip(output_tensors, recv_sizes.tolist()):
            if o.numel() != n:
                raise RuntimeError(
                    f"torchneuron: all_to_all output {_describe(o)} cannot hold the {n} elements sent to it"
                )
        flat_in = torch.cat([self._wire(t).reshape(-1) for t in input_tensors]) if input_tensors else torch.empty(0)
        out_hosts = [self._empty_wire(o).reshape(-1) for o in output_tensors]
        flat_out = torch.empty(sum(h.numel() for h in out_hosts), dtype=flat_in.dtype)
        self.transport.alltoall_base(
            flat_out, flat_in, [h.numel() for h in out_hosts],
            [self._wire(t).numel() for t in input_tensors],
        )
        offset = 0
        for o, h in zip(output_tensors, out_hosts):
            piece = flat_out[offset : offset + h.numel()]
            offset += h.numel()
            if piece.dtype != o.dtype:
                piece = piece.view(o.dtype)
            _write_back(o, piece.view(o.shape))
        return _done(list(output_tensors))

    def gather(self, output_tensors, input_tensors, opts) -> dist.Work:
        root = opts.rootRank
        inp = input_tensors[0]
        self._check(f"gather root={root} {_describe(inp)}")
        h_in = self._wire(inp)
        outs = output_tensors[0] if self._rank == root else []
        if self._rank == root and len(outs) != self._size:
            raise ValueError(f"gather needs {self._size} output tensors on the root, got {len(outs)}")
        h_outs = [torch.empty_like(h_in) for _ in outs]
        self.transport.gather(h_outs, h_in, root)
        for o, h in zip(outs, h_outs):
            self._unwire(o, h)
        return _done(list(output_tensors))

    def scatter(self, output_tensors, input_tensors, opts) -> dist.Work:
        root = opts.rootRank
        out = output_tensors[0]
        self._check(f"scatter root={root} {_describe(out)}")
        h_out = self._empty_wire(out)
        ins = input_tensors[0] if self._rank == root else []
        if self._rank == root and len(ins) != self._size:
            raise ValueError(f"scatter needs {self._size} input tensors on the root, got {len(ins)}")
        h_ins = [self._wire(t) for t in ins]
        self.transport.scatter(h_out, h_ins, root)
        self._unwire(out, h_out)
        return _done(list(output_tensors))

    def barrier(self, opts=None) -> dist.Work:
        self.transport.barrier()
        return _done([])

    # -- point to point ------------------------------------------------------------------
    # Each message is preceded by a fixed-size header naming its dtype and shape, so a
    # receiver whose buffer does not match raises instead of reading garbage.
    def _header(self, t: torch.Tensor) -> torch.Tensor:
        text = _describe(t).encode()[:_SIG_BYTES]
        h = torch.zeros(_SIG_BYTES, dtype=torch.uint8)
        h[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        return h

    def send(self, tensors, dst_rank, tag) -> dist.Work:
        for t in tensors:
            if _check_enabled():
                self.transport.send(self._header(t), dst_rank, tag + _P2P_TAG_OFFSET)
            self.transport.send(self._wire(t), dst_rank, tag)
        return _done(list(tensors))

    def _recv(self, tensors, src_rank, tag) -> int:
        for t in tensors:
            if _check_enabled():
                header = torch.empty(_SIG_BYTES, dtype=torch.uint8)
                src_rank = self.transport.recv(header, src_rank, tag + _P2P_TAG_OFFSET)
                sent = bytes(header.tolist()).rstrip(b"\0").decode(errors="replace")
                if sent != _describe(t):
                    raise RuntimeError(
                        f"torchneuron: recv into {_describe(t)} but rank {src_rank} sent {sent}"
                    )
            h = self._empty_wire(t)
            src_rank = self.transport.recv(h, src_rank, tag)
            self._unwire(t, h)
        return src_rank

    def recv(self, tensors, src_rank, tag) -> dist.Work:
        self._recv(tensors, src_rank, tag)
        return _done(list(tensors))

    def recv_anysource(self, tensors, tag) -> dist.Work:
        source = self._recv(tensors, -1, tag)
        return _SourceWork(list(tensors), source)


class _SourceWork(dist.Work):
    """A finished receive that knows where its message came from."""

    def __init__(self, result, source: int) -> None:
        super().__init__()
        self._result = result
        self._source = source
        self._fut: Future = Future()
        self._fut.set_result(result)

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> Future:
        return self._fut

    def _source_rank(self) -> int:
        return self._source

    def source_rank(self) -> int:
        return self._source


def create_process_group(store: dist.Store, rank: int, size: int, timeout: timedelta) -> ProcessGroupNeuron:
    """The creator function registered with `torch.distributed.Backend.register_backend`."""
    from . import fsdp_compat

    fsdp_compat.install()
    return ProcessGroupNeuron(store, rank, size, timeout)
