"""torch.distributed for the training stages: torchrun launch, process group setup, rank helpers, reductions."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainlab.core import auto
from trainlab.core.config import DistributedParams


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def context() -> DistContext:
    """This process's place in the process group (rank 0 of 1 when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        return DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    return DistContext()


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_command(p: DistributedParams, module: str, argv: list[str]) -> list[str]:
    """The torchrun command that re-runs `python -m module argv` on nproc_per_node processes (x nnodes)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={p.nproc_per_node}"]
    if p.nnodes == 1:
        cmd += ["--standalone"]
    else:
        cmd += [f"--nnodes={p.nnodes}", f"--node_rank={p.node_rank}", "--rdzv_backend=static",
                f"--rdzv_endpoint={p.rdzv_endpoint}"]
    return cmd + ["-m", module, *argv]


def setup(p: DistributedParams, device_type: str) -> DistContext:
    """Join the process group torchrun prepared (no-op outside torchrun)."""
    if not under_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return DistContext()
    backend = auto.backend(p.backend, device_type)
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return context()


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if context().enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    if context().enabled:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def barrier() -> None:
    if context().enabled:
        dist.barrier()
