"""Many processes through ``torchrun`` (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``): which rank
this is, its device, barriers; joined by ``torch.distributed`` (NCCL on GPUs, gloo on the CPU).
A plain ``camkit explain`` is rank 0 of 1, without a group."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist


def span(items: list, parts: int, index: int) -> list:
    """The ``index``-th of ``parts`` contiguous spans of ``items`` (near-equal, in order)."""
    return items[index * len(items) // parts : (index + 1) * len(items) // parts]


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ``world`` processes of a run."""

    rank: int = 0
    local_rank: int = 0
    world: int = 1

    @classmethod
    def from_env(cls) -> Ranks:
        """The ranks torchrun set, or a single process."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        return cls(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), world)

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def label(self, stage: str) -> str:
        """A progress bar's label: ``stage``, and the rank when there are several."""
        return f"{stage} [rank {self.rank}]" if self.distributed else stage

    def shard(self, items: list) -> list:
        """This rank's items: every ``world``-th from ``rank`` (disjoint, nothing repeated)."""
        return items[self.rank :: self.world]

    def span(self, items: list) -> list:
        """This rank's contiguous :func:`span` of ``items``."""
        return span(items, self.world, self.rank)

    def gather(self, value: object) -> list:
        """Every rank's ``value`` by rank (every rank must call it); ``[value]`` for one process."""
        if not self.distributed:
            return [value]
        found: list = [None] * self.world
        dist.all_gather_object(found, value)
        return found

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    @contextmanager
    def group(self, device: torch.device) -> Iterator[None]:
        """The process group of the run, for the code inside (nothing for one process)."""
        if not self.distributed:
            yield
            return
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        try:
            yield
        finally:
            dist.destroy_process_group()
