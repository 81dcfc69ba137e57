"""Which samples, in what order, on which rank: ``epoch_order`` (``DistributedSampler``'s
order, or ``block_order`` for stores bigger than RAM) and ``Order``, the source of an in-memory
dataset a ``Loader`` asks for its index batches (a stream brings its own)."""

from __future__ import annotations

import math
import re
from typing import Iterable

import torch

from .errors import refuse

_ORDER = re.compile(r"random|block(?::([0-9]+):([0-9]+))?")  # "block" is block:32:256


def parse_order(order: str) -> tuple[int, int] | None:
    """``(block, window)`` of ``"block:BLOCK:WINDOW"`` (``"block"``: 32, 256), None for
    ``"random"``; anything else is a ConfigError naming it and what is accepted."""
    found = _ORDER.fullmatch(order) if isinstance(order, str) else None
    if found and order == "random":
        return None
    sizes = (int(found[1] or 32), int(found[2] or 256)) if found else (0, 0)
    accepted = "random, block (block:32:256) or block:BLOCK:WINDOW with sizes in 1..2**63-1"
    refuse([(all(0 < size < 2**63 for size in sizes), "order", order, accepted)])
    return sizes


def block_order(n: int, *, seed: int, epoch: int, block: int, window: int) -> torch.Tensor:
    """A permutation of ``range(n)`` that reads mostly in sequence: the samples cut into
    blocks of ``block`` consecutive indices, the blocks shuffled, then the samples shuffled
    within each run of ``window`` blocks of that order. A pass reads each block whole, and at
    most ``window`` blocks are in use at a time (what the page cache must hold)."""
    g = torch.Generator().manual_seed(seed + epoch)
    blocks = torch.arange(n).split(block)
    picked = torch.randperm(len(blocks), generator=g).split(window)  # runs of blocks
    runs = (torch.cat([blocks[b] for b in run.tolist()]) for run in picked)
    return torch.cat([run[torch.randperm(len(run), generator=g)] for run in runs])


def epoch_order(
    n: int, *, seed: int, epoch: int, shuffle=True, rank=0, world_size=1, pad=True, order="random"
) -> torch.Tensor:
    """The indices of ``range(n)`` rank ``rank`` visits in ``epoch``, as ``DistributedSampler``
    gives them (``order``: ``parse_order``'s). ``pad=True`` wraps around so every rank gets
    ``ceil(n / world_size)``; ``pad=False`` (evaluation) gives each index to one rank only."""
    sizes = parse_order(order)
    if shuffle and sizes:
        indices = block_order(n, seed=seed, epoch=epoch, block=sizes[0], window=sizes[1])
    elif shuffle:
        indices = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    else:
        indices = torch.arange(n)
    if pad and n % world_size:
        total = math.ceil(n / world_size) * world_size
        indices = indices.repeat(math.ceil(total / n))[:total]  # wrapped around
    return indices[rank::world_size]


class Order:
    """The source of a ``Dataset`` or ``EncodedDataset`` of ``n`` samples: ``epoch_order`` cut
    into batches, this rank's last partial one dropped with ``drop_last`` (or ``static`` and
    ``pad``). Every source gives the Loader what this one does: ``order`` (its name, saved),
    ``elastic`` (a resume may change the world size) and the methods below."""

    elastic = False

    def __init__(self, n, batch_size, *, shuffle, seed, pad, order, drop_last, static) -> None:
        sizes = parse_order(order)
        self.order = "random" if sizes is None else "block:{}:{}".format(*sizes)
        self.n, self.batch_size, self.pad = n, batch_size, pad
        self.args = dict(seed=seed, shuffle=shuffle, pad=pad, order=self.order)  # epoch_order's
        self.drop_last = drop_last or (static and pad)

    def count(self, epoch: int, rank: int, world: int) -> tuple[int, int]:
        """``(samples, batches)`` of ``rank`` in ``epoch`` (samples dropped too)."""
        m = math.ceil(self.n / world) if self.pad else len(range(rank, self.n, world))
        return m, m // self.batch_size if self.drop_last else math.ceil(m / self.batch_size)

    def batches(self, epoch: int, rank: int, world: int, position: int) -> list[torch.Tensor]:
        """``rank``'s index batches (CPU int64) of ``epoch``, from batch ``position`` on."""
        order = epoch_order(self.n, epoch=epoch, rank=rank, world_size=world, **self.args)
        batches = list(torch.split(order, self.batch_size))
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches[position:]

    def feed(self, batches: list, *where: int) -> Iterable:  # what the mover takes for them
        return batches

    def state_dict(self, epoch: int) -> dict:  # the source's own part of the Loader's state
        return {}

    def load_state_dict(self, state: dict, epoch: int, position: int, world: int) -> int:
        """Continue from ``state`` (checked) on ``world`` ranks: the batch to start at."""
        return position
