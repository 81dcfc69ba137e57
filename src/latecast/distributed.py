"""Where this process runs (``placement``: device, rank, world size), for the Loader, ``wrap``
and ``latecast train`` alike: from an initialized process group, else torchrun's ``RANK`` and
``WORLD_SIZE``, else ``LOCAL_RANK`` (Lightning's DDP launcher, in ``fit``), else one process."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .errors import ConfigError, numbers_of, refuse


def _launched() -> tuple[int, int] | None:
    """(rank, world size) from an initialized group or a launcher's environment, else None."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    env = os.environ
    rank = env.get("RANK", env.get("LOCAL_RANK"))  # LOCAL_RANK: Lightning sets no RANK on one node
    return None if rank is None or "WORLD_SIZE" not in env else (int(rank), int(env["WORLD_SIZE"]))


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> ``cuda:LOCAL_RANK`` under a launcher, else the current CUDA device,
    else the CPU; ``"cuda"`` without an index likewise. Others are checked and returned."""
    if str(device) in ("auto", "cuda") and torch.cuda.is_available():
        local = os.environ.get("LOCAL_RANK")
        return torch.device("cuda", torch.cuda.current_device() if local is None else int(local))
    try:
        dev = torch.device("cpu" if str(device) == "auto" else device)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(f"unknown device {device!r}: {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for but torch sees no CUDA device here")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {device!r}: latecast runs on cpu and cuda devices only")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ConfigError(f"device {device!r}: torch sees {torch.cuda.device_count()} CUDA devices")
    return dev


def placement(
    device: str | torch.device = "auto", rank: int | None = None, world_size: int | None = None
) -> tuple[torch.device, int, int]:
    """(device, rank, world size): what is given, else what the environment says now.
    Raises ``ConfigError`` for a rank outside ``0..world_size-1`` or an unusable device."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        refuse([(value is None or numbers_of([value], int), name, value, "an integer or None")])
    launched = _launched() or (0, 1)
    rank = launched[0] if rank is None else rank
    world_size = launched[1] if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} / world size {world_size}: need 0 <= rank < world size")
    return resolve_device(device), rank, world_size
