"""The loader: which samples, in what order, in which batches, on which rank.

Order follows ``torch.utils.data.DistributedSampler`` exactly: a permutation from
``seed + epoch`` (``torch.randperm`` on a CPU generator), padded by wrapping around to a
multiple of the world size, and rank ``r`` takes ``indices[r::world]``. Every rank thus
sees the same permutation and the same number of batches. The batches then go to a
transfer strategy (``transfer.py``) that moves them and normalizes them on the device.
"""
from __future__ import annotations

import math
import os
import time
from typing import Callable, Iterator

import torch

from . import transforms
from .data import Dataset
from .errors import ConfigError
from .transfer import STRATEGIES, Batch, TransferStats, resolve


def epoch_order(n: int, *, seed: int, epoch: int, shuffle: bool = True, rank: int = 0,
                world_size: int = 1, pad: bool = True) -> torch.Tensor:
    """Indices rank ``rank`` visits in ``epoch``, as ``DistributedSampler`` would give them.

    ``pad=True`` wraps around so every rank gets ``ceil(n / world_size)`` indices;
    ``pad=False`` (evaluation) gives each index to exactly one rank, shares may differ by one.
    """
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(n, generator=g)
    else:
        indices = torch.arange(n)
    if pad and n % world_size:
        total = math.ceil(n / world_size) * world_size
        reps = math.ceil((total - n) / n)
        indices = torch.cat([indices, indices.repeat(reps)[:total - n]])
    return indices[rank::world_size]


def dist_env(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: given, else from an initialized process group, else torchrun's
    ``RANK``/``WORLD_SIZE``, else a single process."""
    if rank is not None and world_size is not None:
        pass
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} / world size {world_size}: need 0 <= rank < world size")
    return rank, world_size


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> the current CUDA device when there is one, else the CPU."""
    if str(device) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ConfigError(f"unknown device {device!r}: {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for but torch sees no CUDA device here")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class Loader:
    """Batches of ``(images, labels)`` ready on the device: images normalized float
    ``(N, C, H, W)``, labels int64. ``len()`` and ``set_epoch()`` work as with a
    ``DataLoader`` over a ``DistributedSampler``; the epoch also advances by itself after
    each complete pass, so calling ``set_epoch`` is optional.

    Args:
        dataset: a ``Dataset`` (uint8 images, narrow labels).
        batch_size: samples per batch, per rank.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        transfer: ``"float32"``, ``"uint8"``, ``"prefetch"``, ``"resident"`` or ``"auto"``.
        shuffle, seed: a new permutation per epoch from ``seed + epoch``.
        drop_last: drop this rank's last partial batch.
        dtype: float32, bfloat16 or float16 output.
        channels_last: output in ``torch.channels_last`` memory format.
        rank, world_size: this process's share; default from torchrun's environment.
        augment: optional uint8 -> uint8 batch function ``f(images, generator)`` applied on
            the device before the normalize (see ``transforms.Augment``).
        pad: pad the order to a multiple of the world size (training); ``False`` for
            evaluation, so no sample is counted twice.

    Example:
        >>> train = latecast.load_dataset("mnist")
        >>> loader = latecast.Loader(train, batch_size=256, device="cuda")
        >>> images, labels = next(iter(loader))  # (256, 1, 28, 28) float32, (256,) int64
    """

    def __init__(self, dataset: Dataset, batch_size: int, device: str | torch.device = "auto",
                 transfer: str = "auto", shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, dtype: torch.dtype = torch.float32,
                 channels_last: bool = False, rank: int | None = None,
                 world_size: int | None = None,
                 augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
                 pad: bool = True) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        if len(dataset) == 0:
            raise ConfigError(f"{dataset.name}/{dataset.split} is empty")
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.shuffle, self.seed, self.pad = shuffle, seed, pad
        self.dtype, self.channels_last, self.augment = dtype, channels_last, augment
        self.rank, self.world_size = dist_env(rank, world_size)
        self.device = resolve_device(device)
        self.transfer = resolve(transfer, dataset, self.device)
        self.stats = TransferStats()
        self.epoch, self.position = 0, 0  # position: batches of `epoch` already yielded
        self._strategy = STRATEGIES[self.transfer](dataset, self.device, batch_size,
                                                   self._prepare, self.stats)
        self._generators: dict[str, torch.Generator] = {}

    def _prepare(self, images: torch.Tensor, batch: int) -> torch.Tensor:
        """Augment (uint8) then normalize, on whatever device ``images`` is on."""
        if self.augment is not None:
            images = self.augment(images, self._generator(images.device, batch))
        return transforms.normalize(images, self.dataset.mean, self.dataset.std,
                                    dtype=self.dtype, channels_last=self.channels_last)

    def _generator(self, device: torch.device, batch: int) -> torch.Generator:
        """A generator on ``device`` seeded from (seed, epoch, rank, batch): augmentation is
        reproducible and independent of where a resumed run starts."""
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device)
        g = self._generators[key]
        mixed = 0
        for part in (self.seed, self.epoch, self.rank, batch):
            mixed = (mixed * 1_000_003 + part) % (2**63 - 1)
        g.manual_seed(mixed)
        return g

    @property
    def num_samples(self) -> int:
        """Samples this rank visits per epoch."""
        n, w = len(self.dataset), self.world_size
        return math.ceil(n / w) if self.pad else len(range(self.rank, n, w))

    def __len__(self) -> int:
        m, b = self.num_samples, self.batch_size
        return m // b if self.drop_last else math.ceil(m / b)

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next pass on (like ``DistributedSampler``)."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict:
        """Where the loader is: epoch and batches already yielded in it (plain ints)."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "batch_size": self.batch_size, "world_size": self.world_size,
                "num_samples": len(self.dataset)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: the next pass starts at its epoch and position."""
        mine = self.state_dict()
        differ = [k for k in ("seed", "batch_size", "world_size", "num_samples")
                  if state.get(k) != mine[k]]
        if differ:
            raise ConfigError("loader state does not match this loader: " + ", ".join(
                f"{k} {state.get(k)!r} != {mine[k]!r}" for k in differ))
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def index_batches(self) -> list[torch.Tensor]:
        """This epoch's index batches for this rank (CPU int64), from ``position`` on."""
        order = epoch_order(len(self.dataset), seed=self.seed, epoch=self.epoch,
                            shuffle=self.shuffle, rank=self.rank,
                            world_size=self.world_size, pad=self.pad)
        batches = list(torch.split(order, self.batch_size))
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches[self.position:]

    def __iter__(self) -> Iterator[Batch]:
        it = self._strategy.batches(self.index_batches(), first=self.position)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            self.stats.wait_seconds += time.perf_counter() - t0
            self.stats.batches += 1
            self.position += 1
            yield batch
        self.epoch, self.position = self.epoch + 1, 0  # a full pass: advance by itself
