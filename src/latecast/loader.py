"""The loader: which samples, in what order, in which batches, on which rank (the source),
then moved (``transfer.py``) and prepared on the device (``prepare.py``).

Order follows ``torch.utils.data.DistributedSampler`` exactly: a permutation from
``seed + epoch`` (``torch.randperm`` on a CPU generator), padded by wrapping around to a
multiple of the world size, and rank ``r`` takes ``indices[r::world]``. Every rank thus
sees the same permutation and the same number of batches.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import replace
from typing import Iterator

import torch

from .data import Dataset
from .distributed import placement
from .errors import ConfigError
from .prepare import Augmentation, Prepare
from .transfer import MOVERS, Batch, Mover, TransferStats, resolve


def epoch_order(
    n: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    rank: int = 0,
    world_size: int = 1,
    pad: bool = True,
) -> torch.Tensor:
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
        indices = torch.cat([indices, indices.repeat(reps)[: total - n]])
    return indices[rank::world_size]


class Loader:
    """Batches of ``(images, labels)`` ready on the device: images normalized float
    ``(N, C, H, W)``, labels int64. ``len()`` and ``set_epoch()`` work as with a
    ``DataLoader`` over a ``DistributedSampler``; the epoch also advances by itself after
    each complete pass, so calling ``set_epoch`` is optional.

    The three stages, one way: this rank's order of the dataset (the source) goes to a
    mover (``transfer.MOVERS``) that yields uint8 batches on the device, which ``Prepare``
    augments and normalizes there. Rank, world size and device are resolved at the first
    pass (``distributed.placement``), not at construction, so a Loader built before a
    launcher's processes exist still gets its own share and device.

    Args:
        dataset: a ``Dataset`` (uint8 images, narrow labels).
        batch_size: samples per batch, per rank.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        transfer: ``"float32"``, ``"uint8"``, ``"prefetch"``, ``"resident"`` or ``"auto"``.
        shuffle, seed: a new permutation per epoch from ``seed + epoch``.
        drop_last: drop this rank's last partial batch.
        dtype: float32, bfloat16 or float16 output.
        channels_last: output in ``torch.channels_last`` memory format.
        rank, world_size: this process's share; default from the process group or launcher.
        augment: optional uint8 -> uint8 batch function ``f(images, generator)`` applied on
            the device before the normalize (see ``transforms.Augment``).
        pad: pad the order to a multiple of the world size (training); ``False`` for
            evaluation, so no sample is counted twice.

    Example:
        >>> train = latecast.load_dataset("mnist")
        >>> loader = latecast.Loader(train, batch_size=256, device="cuda")
        >>> images, labels = next(iter(loader))  # (256, 1, 28, 28) float32, (256,) int64
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        device: str | torch.device = "auto",
        transfer: str = "auto",
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        augment: Augmentation | None = None,
        pad: bool = True,
    ) -> None:
        for name, value, low in (("batch_size", batch_size, 1), ("seed", seed, 0)):
            if (
                not isinstance(value, numbers.Integral)
                or isinstance(value, bool)
                or not low <= value < 2**63
            ):
                raise ConfigError(f"{name} must be an integer in {low}..2**63-1, got {value!r}")
        batch_size, seed = int(batch_size), int(seed)  # numpy ints too (torch's seed wants int)
        if len(dataset) == 0:
            raise ConfigError(f"{dataset.name}/{dataset.split} is empty")
        if transfer != "auto" and transfer not in MOVERS:
            resolve(transfer, dataset, torch.device("cpu"))  # raises, listing valid names
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.shuffle, self.seed, self.pad, self.augment = shuffle, seed, pad, augment
        self.dtype, self.channels_last = dtype, channels_last
        self._asked = (device, transfer, rank, world_size)
        placement(device, rank, world_size)  # bad values fail here, not at the first pass
        self.prepare = Prepare(
            dataset.mean,
            dataset.std,
            dtype=dtype,
            channels_last=channels_last,
            augment=augment,
            seed=seed,
        )
        self.epoch, self.position = 0, 0  # position: batches of `epoch` already yielded
        self._mover: Mover | None = None
        self._batches, self._wait = 0, 0.0

    # -- where: resolved at the first pass; before it, what the environment says now -----

    def _placement(self) -> tuple[torch.device, int, int]:
        if self._mover is not None:
            return self._mover.device, self._rank, self._world
        device, transfer, rank, world = self._asked
        return placement(device, rank, world)

    @property
    def device(self) -> torch.device:
        return self._placement()[0]

    @property
    def rank(self) -> int:
        return self._placement()[1]

    @property
    def world_size(self) -> int:
        return self._placement()[2]

    @property
    def transfer(self) -> str:
        """The mover's name (``auto`` resolved)."""
        if self._mover is not None:
            return self._mover.name
        return resolve(self._asked[1], self.dataset, self.device)

    @property
    def stats(self) -> TransferStats:
        """Bytes and copies (the mover's count), batches and data wait (this Loader's)."""
        moved = self._mover.stats if self._mover is not None else TransferStats()
        return replace(moved, batches=self._batches, wait_seconds=self._wait)

    def _start(self) -> Mover:
        if self._mover is None:
            device, self._rank, self._world = self._placement()
            cls = MOVERS[resolve(self._asked[1], self.dataset, device)]
            args = (self.dataset, device, self.batch_size)
            self._mover = cls(*args, self.prepare) if cls.prepares else cls(*args)
        return self._mover

    # -- which samples, in what order -----------------------------------------------------

    @property
    def num_samples(self) -> int:
        """Samples this rank visits per epoch."""
        n, rank, w = len(self.dataset), self.rank, self.world_size
        return math.ceil(n / w) if self.pad else len(range(rank, n, w))

    def __len__(self) -> int:
        m, b = self.num_samples, self.batch_size
        return m // b if self.drop_last else math.ceil(m / b)

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next pass on (like ``DistributedSampler``)."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict:
        """Where the loader is: epoch and batches already yielded in it (plain ints)."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "num_samples": len(self.dataset),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: the next pass starts at its epoch and position."""
        mine = self.state_dict()
        differ = [
            k
            for k in ("seed", "batch_size", "world_size", "num_samples")
            if state.get(k) != mine[k]
        ]
        if differ:
            raise ConfigError(
                "loader state does not match this loader: "
                + ", ".join(f"{k} {state.get(k)!r} != {mine[k]!r}" for k in differ)
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def index_batches(self) -> list[torch.Tensor]:
        """This epoch's index batches for this rank (CPU int64), from ``position`` on."""
        order = epoch_order(
            len(self.dataset),
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            rank=self.rank,
            world_size=self.world_size,
            pad=self.pad,
        )
        batches = list(torch.split(order, self.batch_size))
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches[self.position :]

    def __iter__(self) -> Iterator[Batch]:
        mover = self._start()
        self.prepare.seek(self.epoch, self._rank, self.position)
        it = mover.batches(self.index_batches())
        while True:
            t0 = time.perf_counter()
            try:
                images, labels = next(it)
            except StopIteration:
                break
            if not mover.prepares:
                images = self.prepare(images)
            self._wait += time.perf_counter() - t0
            self._batches += 1
            self.position += 1
            yield images, labels
        self.epoch, self.position = self.epoch + 1, 0  # a full pass: advance by itself
