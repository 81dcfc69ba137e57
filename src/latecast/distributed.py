"""Where this process runs: its device, rank and world size, and the process group.

``placement`` is the one place that decides, for the Loader, ``wrap`` and ``latecast
train`` alike, in this order: an initialized process group; torchrun's ``RANK`` and
``WORLD_SIZE``; ``LOCAL_RANK`` (what Lightning's DDP launcher sets, inside ``fit`` only);
else one process. ``device="auto"`` is ``cuda:LOCAL_RANK`` under a launcher, the current
CUDA device without one, else the CPU.
"""

from __future__ import annotations

import numbers
import os

import torch
import torch.distributed as dist

from .errors import ConfigError


def _launched() -> tuple[int, int] | None:
    """(rank, world size) from an initialized group or a launcher's environment, else None."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    env = os.environ
    for rank_var in ("RANK", "LOCAL_RANK"):  # LOCAL_RANK: Lightning sets no RANK on one node
        if rank_var in env and "WORLD_SIZE" in env:
            return int(env[rank_var]), int(env["WORLD_SIZE"])
    return None


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> ``cuda:LOCAL_RANK`` under a launcher, else the current CUDA device,
    else the CPU; ``"cuda"`` without an index likewise. Others are checked and returned."""
    local = os.environ.get("LOCAL_RANK")
    if str(device) in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device(
            "cuda", int(local) if local is not None else torch.cuda.current_device()
        )
    if str(device) == "auto":
        return torch.device("cpu")
    try:
        dev = torch.device(device)
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
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral)
        ):
            raise ConfigError(f"{name} must be an integer or None, got {value!r:.60}")
    launched = _launched() or (0, 1)
    rank = launched[0] if rank is None else rank
    world_size = launched[1] if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} / world size {world_size}: need 0 <= rank < world size")
    return resolve_device(device), rank, world_size
