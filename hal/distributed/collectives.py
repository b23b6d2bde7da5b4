"""Every collective of the layer goes through here, so a failure or a timeout surfaces as one
error that names the step ("handshake", "dispatch", "combine") and the rank, instead of a hang or
a bare backend message."""

from __future__ import annotations

import torch

from hal.distributed.group import Comm

# Transport dtypes: gloo has no FP8 (or int16) all-to-all, so FP8 rows travel as their bytes.
_BYTE_VIEWS = {torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2}


class CollectiveError(RuntimeError):
    """A collective of the expert-parallel layer failed or timed out. The process group may be
    unusable afterwards (NCCL in particular): recreate it before the next layer."""

    def __init__(self, step: str, comm: Comm, exc: BaseException):
        self.step = step
        timeout = "the group's timeout" if comm.timeout is None else f"timeout {comm.timeout}"
        what = "timed out" if "timed out" in str(exc).lower() or "timeout" in str(exc).lower() \
            else "failed"
        super().__init__(f"expert-parallel {step} {what} on rank {comm.rank} of {comm.world_size} "
                         f"({comm.backend}, {timeout}): {type(exc).__name__}: {exc}")


def wait(works, step: str, comm: Comm) -> None:
    for work in works:
        try:
            if comm.timeout is None:
                work.wait()
            else:
                work.wait(timeout=comm.timeout)
        except Exception as exc:
            raise CollectiveError(step, comm, exc) from exc


def _transport(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype in _BYTE_VIEWS else t


def all_gather_rows(vector: torch.Tensor, step: str, comm: Comm) -> torch.Tensor:
    """[world_size, n]: every rank's 1-D `vector`, row r from rank r."""
    import torch.distributed as dist

    gathered = [torch.empty_like(vector) for _ in range(comm.world_size)]
    try:
        work = dist.all_gather(gathered, vector, group=comm.group, async_op=True)
    except Exception as exc:
        raise CollectiveError(step, comm, exc) from exc
    wait([work], step, comm)
    return torch.stack(gathered)


def start_all_to_all(send: torch.Tensor, send_counts: list, recv_counts: list, step: str, comm: Comm):
    """Launch one all_to_all_single of rows: send_counts[r] rows of `send` go to rank r,
    recv_counts[r] rows arrive from rank r. Returns (received tensor, work) to wait on."""
    import torch.distributed as dist

    recv = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype, device=send.device)
    try:
        work = dist.all_to_all_single(_transport(recv), _transport(send.contiguous()), recv_counts,
                                      send_counts, group=comm.group, async_op=True)
    except Exception as exc:
        raise CollectiveError(step, comm, exc) from exc
    return recv, work
