"""The process group of ``latecast train``: ``start`` joins it under torchrun (NCCL on CUDA,
gloo on CPU); the rest are collectives every rank calls in order."""

from __future__ import annotations

import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from ..distributed import resolve_device
from ..errors import ConfigError


def start(device: str, timeout: float) -> tuple[torch.device, bool, bool]:
    """(device, distributed, own_group); under torchrun the process group joined (``timeout`` s)."""
    dev = resolve_device(device)
    if dist.is_available() and dist.is_initialized():
        return dev, True, False  # the caller's group: theirs to destroy
    if "WORLD_SIZE" not in os.environ:
        return dev, False, False
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
    backend = dict(backend="nccl", device_id=dev) if cuda else dict(backend="gloo")
    try:
        dist.init_process_group(**backend, timeout=timedelta(seconds=timeout))
    except ValueError as err:  # env:// without MASTER_ADDR/PORT: not launched by torchrun
        raise ConfigError(
            f"WORLD_SIZE is set but the process group cannot start: {err}; launch with torchrun"
        ) from None
    return dev, True, True


def end() -> None:
    """Destroy the process group, then collect what still held it (a DDP model) while Python
    runs: freed at exit, gloo's threads may abort the process (pytorch/pytorch#179291). The
    caller drops its references first."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def gather(values: list[int], device: torch.device) -> list[list[int]]:
    """``values`` from every rank, in rank order."""
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [t.tolist() for t in every]


def sync_buffers(model: torch.nn.Module, distributed: bool) -> None:
    """Rank 0's BatchNorm running statistics copied to every rank (DDP does it per forward)."""
    if distributed:
        for buffer in model.buffers():
            dist.broadcast(buffer, 0)


def peer_failure(err: RuntimeError) -> bool:
    """A collective that failed because a peer died or timed out (``DistError``, or DDP's
    all-reduce re-raised by autograd as a plain ``RuntimeError``)."""
    text = str(err).lower()
    return isinstance(err, dist.DistError) or any(
        s in text for s in ("gloo", "nccl", "timed out", "connection closed", "connection reset")
    )
