"""The prepare stage, the last of three: source -> move -> **prepare**.

What a mover delivers on the device (uint8 ``(N, H, W, C)``) becomes what a model takes:
per-sample augmentation on uint8 first (cheap: a quarter of the bytes of float32), then
the fused normalize into ``(N, C, H, W)`` float. Batch ``k`` of an epoch draws its
augmentation from a generator seeded from ``(seed, epoch, rank, k)``, so the draws do not
depend on where a run started: a resumed run repeats them exactly. The batch number is
counted here, in one place: ``seek`` says where an epoch starts, each call is the next batch.

A call is two halves: ``next_batch`` (host only: seed the generator, count the batch; no
sync) and ``apply`` (device only: augment, normalize, optionally into a static buffer).
A CUDA graph captures ``apply`` once; each replay is preceded by ``next_batch``, and the
graph reads the generator's seed at replay, so replayed draws equal eager ones.
"""

from __future__ import annotations

from typing import Callable

import torch

from .transforms import normalize

Augmentation = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


class Prepare:
    """Augment (optional) then normalize, on whatever device the batch is on.

    Args:
        mean, std: per-channel statistics in [0, 1] units.
        dtype: float32, bfloat16 or float16 output.
        channels_last: output in ``torch.channels_last`` memory format.
        augment: ``f(images, generator)`` on uint8 ``(N, H, W, C)``, e.g. ``Augment``.
        seed: the run's seed, mixed into every batch's augmentation seed.
    """

    def __init__(
        self,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        *,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        augment: Augmentation | None = None,
        seed: int = 0,
    ) -> None:
        self.mean, self.std, self.dtype = tuple(mean), tuple(std), dtype
        self.channels_last, self.augment, self.seed = channels_last, augment, seed
        self.epoch = self.rank = self.batch = 0
        self._generators: dict[str, torch.Generator] = {}

    def seek(self, epoch: int, rank: int, batch: int) -> None:
        """The next call prepares batch ``batch`` of ``epoch`` on ``rank``."""
        self.epoch, self.rank, self.batch = epoch, rank, batch

    def __call__(self, images: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        self.next_batch(images.device)
        return self.apply(images, out)

    def next_batch(self, device: torch.device) -> None:
        """Seed ``device``'s generator from (seed, epoch, rank, batch), count the batch."""
        if self.augment is not None:
            mixed = 0
            for part in (self.seed, self.epoch, self.rank, self.batch):
                mixed = (mixed * 1_000_003 + part) % (2**63 - 1)
            self.generator(device).manual_seed(mixed)  # host-side: sets seed and offset
        self.batch += 1

    def apply(self, images: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Augment with the generator as ``next_batch`` seeded it, then normalize (into
        ``out`` when given). Device work only."""
        if self.augment is not None:
            images = self.augment(images, self.generator(images.device))
        return normalize(
            images, self.mean, self.std, dtype=self.dtype, channels_last=self.channels_last, out=out
        )

    def generator(self, device: torch.device) -> torch.Generator:
        """The augmentation generator on ``device`` (one per device, reseeded per batch)."""
        g = self._generators.get(str(device))
        if g is None:
            g = self._generators[str(device)] = torch.Generator(device=device)
        return g
