"""The prepare stage, after the move: uint8 ``(N, H, W, C)`` on the device (or JPEG files,
decoded to the training size) augmented, normalized into ``(N, C, H, W)`` float, erased and
mixed. Batch ``k`` draws from generators seeded from ``(seed, epoch, rank, k)`` (on the
device; on the host for crop boxes and mixing), so a resumed run draws the same:
``next_batch`` seeds them (host only), ``apply`` does the work (a CUDA graph may capture it).
"""

from __future__ import annotations

from typing import Callable

import torch

from .data import Batch
from .fields import Mask
from .transforms import Augment, Moves, normalize, resized_crop

Augmentation = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
Mixing = Callable[[torch.Tensor, torch.Tensor, torch.Generator], Batch]
_HOST = torch.device("cpu")


def sizes_of(images) -> torch.Tensor:
    """``(N, 2)`` (H, W) of each image as it comes, on the CPU: files' own (``Encoded``)."""
    if not torch.is_tensor(images):
        return images.sizes
    return torch.tensor([images.shape[1:3]]).expand(len(images), 2)


class Prepare:
    """``prepare(images, labels, indices)``: a batch decoded, augmented, normalized, erased and
    mixed on its device (``indices``: the dataset's, CPU, for altflip). ``mean``, ``std``: per
    channel, [0, 1] units; ``augment``, ``erase``: ``f(images, generator)`` before and after the
    normalize; ``mix``: ``f(images, labels, generator)``; ``size``: the (H, W) JPEG batches are
    decoded to; ``mask_fill``: masks' value where a crop leaves no pixel."""

    def __init__(
        self,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        *,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        augment: Augmentation | None = None,
        seed: int = 0,
        size: tuple[int, int] | None = None,
        mix: Mixing | None = None,
        erase: Augmentation | None = None,
        mask_fill: float = 0,
    ) -> None:
        self.mean, self.std, self.dtype = tuple(mean), tuple(std), dtype
        self.channels_last, self.augment, self.seed = channels_last, augment, seed
        self.size, self.mix, self.erase, self.mask_fill = size, mix, erase, mask_fill
        self.epoch = self.rank = self.batch = 0
        self._generators: dict[str, torch.Generator] = {}

    def seek(self, epoch: int, rank: int, batch: int) -> None:
        """The next call prepares batch ``batch`` of ``epoch`` on ``rank``."""
        self.epoch, self.rank, self.batch = epoch, rank, batch

    def __call__(self, images, labels, indices=None, out: torch.Tensor | None = None) -> Batch:
        self.next_batch(images.device)
        return self.apply(images, labels, indices, out)

    def next_batch(self, device: torch.device) -> None:
        """Seed ``device``'s and the host's generators from (seed, epoch, rank, batch); count
        the batch. No sync."""
        mixed = 0
        for part in (self.seed, self.epoch, self.rank, self.batch):
            mixed = (mixed * 1_000_003 + part) % (2**63 - 1)
        for where in {device, _HOST}:
            self.generator(where).manual_seed(mixed)  # host-side: sets seed and offset
        self.batch += 1

    def apply(
        self, images, labels, indices=None, out: torch.Tensor | None = None, moves=None, size=None
    ) -> Batch:
        """Decode (to ``size``, else ``self.size``), augment with the generators as
        ``next_batch`` seeded them (by ``moves``, drawn here unless given), normalize (into
        ``out``), erase, mix."""
        g, host = self.generator(images.device), self.generator(_HOST)
        moves = self.moves(images, indices) if moves is None else moves
        images = self._to_size(images, moves, size or self.size)
        if moves is not None:
            images = self.augment.pixels(images, moves, g)
        elif self.augment is not None:
            images = self.augment(images, g)
        images = normalize(
            images, self.mean, self.std, dtype=self.dtype, channels_last=self.channels_last, out=out
        )
        if self.erase is not None:
            images = self.erase(images, g)
        if self.mix is None:
            return images, labels
        images, labels = self.mix(images, labels, host)
        return (images if out is None else out.copy_(images)), labels

    def moves(self, images, indices=None) -> Moves | None:
        """This batch's geometric draws (``Augment.moves``); None without an ``Augment``."""
        if not isinstance(self.augment, Augment):
            return None
        g, host = self.generator(images.device), self.generator(_HOST)
        return self.augment.moves(
            images, sizes_of(images), g, host, epoch=self.epoch, indices=indices, seed=self.seed
        )

    def _to_size(self, images, moves: Moves | None, size) -> torch.Tensor:
        """Pixels kept on the host as files (a kind's ``Encoded``: ``sizes``, ``device`` and
        ``decode(size, boxes)``) decoded to ``size``; the resized crop of ``moves``."""
        boxes = None if moves is None else moves.boxes
        if not torch.is_tensor(images):
            return images.decode(size, boxes)
        return images if boxes is None else resized_crop(images, boxes, tuple(images.shape[1:3]))

    def fields(self, plans: list, values: list, where: tuple, device: torch.device) -> list:
        """A batch's fields (plans, values on the device) made what the model takes, seeded by
        ``where`` (epoch, rank, batch). Pixel fields share one geometric draw (masks by nearest
        neighbour) and images one colour draw; images of another size draw their own. A kind
        that ``draws`` finishes itself (``Field.prepared``) with the draw and the generators."""
        mine = [f is not None and (f.pixels or f.draws) for f in plans]
        out = [None if m or f is None else f.finish(v) for f, v, m in zip(plans, values, mine)]
        pixels = [i for i, f in enumerate(plans) if f is not None and f.pixels]
        if not any(mine):
            return out
        files = [i for i in pixels if not torch.is_tensor(values[i])]
        lead = (files or pixels or [None])[0]
        first = None if lead is None else plans[lead].frames(values[lead])
        size = plans[files[0]].size if files else None  # the masks': the images' as they come
        self.seek(*where)
        self.next_batch(device)
        g, host = self.generator(device), self.generator(_HOST)
        seeded = g.get_state(), host.get_state()

        def draw(x) -> tuple[Moves | None, torch.Tensor]:  # the draw, and where colour starts
            g.set_state(seeded[0])
            host.set_state(seeded[1])
            return self.moves(x), g.get_state()

        (moves, colour), sizes = (draw(first), sizes_of(first)) if pixels else ((None, None), None)
        for i in (i for i, m in enumerate(mine) if m):
            f, x = plans[i], values[i]
            if isinstance(f, Mask):
                out[i] = f.finish(self._mask(moves or Moves(None, None, None, None), x, size))
                continue
            if f.draws:
                host.set_state(seeded[1])  # then g: on a CPU device they are one generator
                g.set_state(seeded[0] if colour is None else colour)
                out[i] = f.prepared(x, self, moves if f.pixels else None)
                continue
            same = x is first or torch.equal(sizes_of(x), sizes)
            m, state = (moves, colour) if same else draw(x)
            g.set_state(state)
            out[i] = self.apply(x, None, moves=m, size=getattr(f, "size", None))[0]
        return out

    def _mask(self, moves: Moves, x: torch.Tensor, size) -> torch.Tensor:
        """``moves`` on a mask ``(N, H, W, C)``, the pixels a crop leaves empty ``mask_fill``."""
        out = moves.mask(x, size)
        if self.mask_fill and moves.shifts is not None and moves.augment.fill == "zero":
            inside = moves.mask(torch.ones_like(x[..., :1], dtype=torch.uint8), size)
            out = out.masked_fill(inside == 0, self.mask_fill)
        return out

    def generator(self, device: torch.device) -> torch.Generator:
        """The generator on ``device`` (one per device, reseeded per batch)."""
        g = self._generators.get(str(device))
        if g is None:
            g = self._generators[str(device)] = torch.Generator(device=device)
        return g
