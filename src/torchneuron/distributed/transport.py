"""How bytes move between processes: the transport behind the `neuron` process group.

The process group (process_group.py) stages neuron tensors to host memory and back; the
transport only ever sees contiguous CPU tensors in dtypes it declares it can carry. Every call
blocks until the operation has finished on this rank (or raises). A device-native collective
library would implement the same small interface on device buffers instead.

`GlooTransport` is the one used with the CPU PJRT platform: PyTorch's own Gloo process group,
which runs over TCP, on one machine or across machines.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

RedOpType = dist.ReduceOp.RedOpType


class Transport:
    """Blocking collectives on contiguous host tensors. `op` is a `ReduceOp.RedOpType`."""

    name = "abstract"
    #: dtypes that reductions can use directly (others are widened by the caller)
    reduce_dtypes: frozenset[torch.dtype] = frozenset()
    #: dtypes that data movement can use directly (others travel as bytes)
    move_dtypes: frozenset[torch.dtype] = frozenset()

    def allreduce(self, tensors: list[torch.Tensor], op) -> None:
        raise NotImplementedError

    def broadcast(self, tensors: list[torch.Tensor], root: int) -> None:
        raise NotImplementedError

    def reduce(self, tensors: list[torch.Tensor], root: int, op) -> None:
        raise NotImplementedError

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> None:
        raise NotImplementedError

    def reduce_scatter(self, output: torch.Tensor, inputs: list[torch.Tensor], op) -> None:
        raise NotImplementedError

    def alltoall_base(self, output, input, output_splits: list[int], input_splits: list[int]) -> None:
        raise NotImplementedError

    def gather(self, outputs: list[torch.Tensor], input: torch.Tensor, root: int) -> None:
        raise NotImplementedError

    def scatter(self, output: torch.Tensor, inputs: list[torch.Tensor], root: int) -> None:
        raise NotImplementedError

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        raise NotImplementedError

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> int:
        """Receive into `tensor`; `src=-1` means from any rank. Returns the source rank."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        pass


_GLOO_MOVE = frozenset(
    {
        torch.float32, torch.float64, torch.float16, torch.bfloat16,
        torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool,
    }
)


class GlooTransport(Transport):
    """PyTorch's ProcessGroupGloo on the same store (under its own key prefix)."""

    name = "gloo"
    reduce_dtypes = _GLOO_MOVE
    move_dtypes = _GLOO_MOVE

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        self.rank, self.size, self.timeout = rank, size, timeout
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)

    def _wait(self, work) -> None:
        try:
            work.wait(self.timeout)
        except RuntimeError as err:
            raise RuntimeError(
                f"torchneuron: collective failed on rank {self.rank} of {self.size} "
                f"(process group timeout {self.timeout}); another rank has probably exited, "
                f"crashed or stopped calling collectives. Gloo said: {err}"
            ) from err

    def allreduce(self, tensors, op) -> None:
        opts = _c10d.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(op)
        opts.timeout = self.timeout
        self._wait(self.pg.allreduce(tensors, opts))

    def broadcast(self, tensors, root) -> None:
        opts = _c10d.BroadcastOptions()
        opts.rootRank, opts.rootTensor, opts.timeout = root, 0, self.timeout
        self._wait(self.pg.broadcast(tensors, opts))

    def reduce(self, tensors, root, op) -> None:
        opts = _c10d.ReduceOptions()
        opts.reduceOp, opts.rootRank, opts.rootTensor = dist.ReduceOp(op), root, 0
        opts.timeout = self.timeout
        self._wait(self.pg.reduce(tensors, opts))

    def allgather(self, outputs, inputs) -> None:
        opts = _c10d.AllgatherOptions()
        opts.timeout = self.timeout
        self._wait(self.pg.allgather(outputs, inputs, opts))

    def reduce_scatter(self, output, inputs, op) -> None:
        # Gloo's reduce_scatter is a reduce of the whole list then a local pick; so is this.
        flat = torch.cat([t.reshape(-1) for t in inputs])
        self.allreduce([flat], op)
        n = output.numel()
        output.copy_(flat[self.rank * n : (self.rank + 1) * n].view(output.shape))

    def alltoall_base(self, output, input, output_splits, input_splits) -> None:
        opts = _c10d.AllToAllOptions()
        opts.timeout = self.timeout
        self._wait(self.pg.alltoall_base(output, input, output_splits, input_splits, opts))

    def gather(self, outputs, input, root) -> None:
        opts = _c10d.GatherOptions()
        opts.rootRank, opts.timeout = root, self.timeout
        self._wait(self.pg.gather([outputs] if self.rank == root else [], [input], opts))

    def scatter(self, output, inputs, root) -> None:
        opts = _c10d.ScatterOptions()
        opts.rootRank, opts.timeout = root, self.timeout
        self._wait(self.pg.scatter([output], [inputs] if self.rank == root else [], opts))

    def send(self, tensor, dst, tag) -> None:
        self._wait(self.pg.send([tensor], dst, tag))

    def recv(self, tensor, src, tag) -> int:
        if src < 0:
            work = self.pg.recv_anysource([tensor], tag)
            self._wait(work)
            return work._source_rank()
        self._wait(self.pg.recv([tensor], src, tag))
        return src

    def barrier(self) -> None:
        opts = _c10d.BarrierOptions()
        opts.timeout = self.timeout
        self._wait(self.pg.barrier(opts))

    def shutdown(self) -> None:
        try:
            self.pg.shutdown()
        except Exception:  # already torn down, or a peer is gone
            pass


def create_transport(store: dist.Store, rank: int, size: int, timeout: timedelta) -> Transport:
    """The transport for the current PJRT platform (Gloo for all of them, for now)."""
    return GlooTransport(store, rank, size, timeout)
