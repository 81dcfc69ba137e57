"""The prepare stage, the last of three: source -> move -> **prepare**.

What a mover delivers (uint8 ``(N, H, W, C)`` on the device, or a batch of JPEG files)
becomes what a model takes: JPEG files decoded and cropped to the training size
(``decode.py``); per-sample augmentation on uint8 (cheap: a quarter of the bytes of
float32); the fused normalize into ``(N, C, H, W)`` float; optional batch mixing of
images and labels (``transforms.Mix``, torchvision's MixUp/CutMix). Batch ``k`` of an
epoch draws from generators seeded from ``(seed, epoch, rank, k)``: one on the device for
per-pixel parameters, one on the host for crop boxes and mixing weights (used as host
numbers). The draws do not depend on where a run started: a resumed run repeats them
exactly. The batch number is counted here, in one place: ``seek`` says where an epoch
starts, each call is the next batch.

A call is two halves: ``next_batch`` (host only: seed the generators, count the batch; no
sync) and ``apply`` (the work, optionally into a static buffer). A CUDA graph captures
``apply`` once for a pure device augmentation (``Augment.capturable``); each replay is
preceded by ``next_batch``, and the graph reads the generator's seed at replay, so replayed
draws equal eager ones.
"""

from __future__ import annotations

from typing import Callable

import torch

from .data import Batch, Encoded
from .decode import decode
from .transforms import Augment, Moves, normalize, resized_crop

Augmentation = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
Mixing = Callable[[torch.Tensor, torch.Tensor, torch.Generator], Batch]
_HOST = torch.device("cpu")


def sizes_of(images: torch.Tensor | Encoded) -> torch.Tensor:
    """``(N, 2)`` (H, W) of each image as it comes, on the CPU: a JPEG batch's files' own."""
    if isinstance(images, Encoded):
        return images.sizes
    return torch.tensor([images.shape[1:3]]).expand(len(images), 2)


class Prepare:
    """Decode (JPEG batches), augment (optional), normalize, mix (optional), on whatever
    device the batch is on. Called as ``prepare(images, labels, indices)`` with the
    batch's dataset indices on the CPU (``Augment(altflip=True)`` needs them).

    Args:
        mean, std: per-channel statistics in [0, 1] units.
        dtype: float32, bfloat16 or float16 output.
        channels_last: output in ``torch.channels_last`` memory format.
        augment: ``f(images, generator)`` on uint8 ``(N, H, W, C)``, or an ``Augment`` (its
            resized crop is drawn on the host and, for JPEG batches, done while decoding).
        seed: the run's seed, mixed into every batch's augmentation seed.
        size: ``(H, W)`` JPEG batches are decoded to (the dataset's ``image_shape[:2]``).
        mix: ``f(images, labels, generator)`` after the normalize, e.g. ``Mix``, or
            torchvision's as ``lambda x, y, g: MixUp(num_classes=10)(x, y)`` (that one draws
            from torch's global RNG: a resumed run does not repeat it).
        erase: ``f(images, generator)`` on the normalized images, e.g. ``Erasing``.
        mask_fill: what masks are padded with where a crop leaves no pixel (``fields``).
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
        """Seed the generators (``device``'s, and the host's for crop boxes and mixing) from
        (seed, epoch, rank, batch); count the batch. Host work only, no sync."""
        mixed = 0
        for part in (self.seed, self.epoch, self.rank, self.batch):
            mixed = (mixed * 1_000_003 + part) % (2**63 - 1)
        for where in {device, _HOST}:
            self.generator(where).manual_seed(mixed)  # host-side: sets seed and offset
        self.batch += 1

    def apply(
        self, images, labels, indices=None, out: torch.Tensor | None = None, moves=None, size=None
    ) -> Batch:
        """Decode (to ``size``, else the Loader's), augment with the generators as
        ``next_batch`` seeded them (the geometric part by ``moves``, drawn here unless given),
        normalize (into ``out`` when given), erase, mix."""
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

    def moves(self, images: torch.Tensor | Encoded, indices=None) -> Moves | None:
        """This batch's geometric draws (``Augment.moves``: the resized crop's boxes on the
        host, crop shifts and flips on the images' device), made once: ``apply`` moves the
        images by them, ``wrap`` their masks too. None without an ``Augment``."""
        if not isinstance(self.augment, Augment):
            return None
        g, host = self.generator(images.device), self.generator(_HOST)
        return self.augment.moves(
            images, sizes_of(images), g, host, epoch=self.epoch, indices=indices, seed=self.seed
        )

    def _to_size(self, images: torch.Tensor | Encoded, moves: Moves | None, size) -> torch.Tensor:
        """JPEG files decoded to the training ``size``; ``Augment``'s resized crop by the boxes
        of ``moves`` (for JPEG files: cropped while decoding)."""
        boxes = None if moves is None else moves.boxes
        if isinstance(images, Encoded):
            return decode(images, size, boxes)
        return images if boxes is None else resized_crop(images, boxes, tuple(images.shape[1:3]))

    def fields(self, plans: list, values: list, where: tuple, device: torch.device) -> list:
        """A batch's fields (``Field`` plans and their values on the device, JPEG fields as
        ``Encoded``) made what the model takes, seeded by ``where`` (epoch, rank, batch). The
        images, JPEG files and masks share one geometric draw (from the JPEG files' sizes where
        there are some): a mask is moved with its images by nearest neighbour, to a JPEG
        field's training size, and nothing else; every image gets the same colour draws;
        images of another size (no mask beside them) get draws of their own, same seeds."""
        out = [None if f is None or f.pixels else f.finish(v) for f, v in zip(plans, values)]
        pixels = [i for i, f in enumerate(plans) if f is not None and f.pixels]
        if not pixels:
            return out
        files = [i for i in pixels if isinstance(values[i], Encoded)]
        first = values[(files or pixels)[0]]
        size = plans[files[0]].size if files else None  # the masks': the images' as they come
        self.seek(*where)
        self.next_batch(device)
        g, host = self.generator(device), self.generator(_HOST)
        seeded = g.get_state(), host.get_state()

        def draw(x) -> tuple[Moves | None, torch.Tensor]:  # the draw, and where colour starts
            g.set_state(seeded[0])
            host.set_state(seeded[1])
            return self.moves(x), g.get_state()

        (moves, colour), sizes = draw(first), sizes_of(first)
        for i in pixels:
            f, x = plans[i], values[i]
            if f.category != "image":  # a mask
                out[i] = f.finish(self._mask(moves or Moves(None, None, None, None), x, size))
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
