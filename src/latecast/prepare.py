"""The finish, after the move: every way in (the Loader, ``wrap``, ``Mover``, the Lightning
hook) makes what the model takes from a batch's fields on the device through ``Prepare``. A
batch's random draws are made once (``Augment.draw``: boxes, shifts, flips, jitter, cutout,
erasing), from generators seeded from ``(seed, epoch, rank, batch)`` so a resumed run draws
the same; each field's kind finishes it (``Field.finish``) with that draw in a small
``Context``; then the one mix step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from .data import Batch
from .errors import BatchError
from .fields import Context, Field, Integer
from .transforms import Augment, Draw, Erasing

Augmentation = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
Mixing = Callable[[torch.Tensor, torch.Tensor, torch.Generator], Batch]
_HOST = torch.device("cpu")
NO_DRAW = Draw()  # a batch that draws nothing


class Prepare:
    """A batch's fields finished on their device. ``mean``, ``std``: per channel, [0, 1]
    units; ``augment``: a ``latecast.Augment`` (drawn once per batch) or ``f(images,
    generator)``; ``erase``: after the normalize; ``mix``: ``f(images, labels, generator)``;
    ``mask_fill``: masks' value where a crop leaves no pixel."""

    def __init__(
        self,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        *,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        augment: Augmentation | None = None,
        seed: int = 0,
        mix: Mixing | None = None,
        erase: Augmentation | None = None,
        mask_fill: float = 0,
    ) -> None:
        self.mean, self.std, self.dtype = tuple(mean), tuple(std), dtype
        self.channels_last, self.augment, self.seed = channels_last, augment, seed
        self.mix, self.erase, self.mask_fill = mix, erase, mask_fill
        erases = isinstance(erase, Erasing) and augment is None  # drawn with an Augment's too
        self.draws = isinstance(augment, Augment) or erases  # whether a batch makes a draw
        self.own = None if isinstance(augment, Augment) else augment  # f(images, generator)
        self._generators: dict[str, torch.Generator] = {}

    def __call__(self, plans: list, values: list, where: tuple, device: torch.device,
                 indices=None, out: list | None = None, mixing: bool = True) -> list:  # fmt: skip
        """``plans``' values on ``device`` finished, seeded by ``where`` (epoch, rank, batch);
        ``indices``: the samples' dataset indices (CPU, for altflip); ``out``: where each
        field's output goes (None: new tensors); ``mixing``: whether ``mix`` runs."""
        self.seed_batch(where, device)
        return self.finish(plans, values, device, indices, where[0], out, mixing)

    def seed_batch(self, where: tuple, device: torch.device) -> None:
        """Seed ``device``'s and the host's generators for batch ``where``. No sync: a host op
        (a CUDA graph replays what follows)."""
        seed = self.batch_seed(where)
        for g in {self.generator(device), self.generator(_HOST)}:
            g.manual_seed(seed)

    def planning(self, where: tuple) -> torch.Generator:
        """A CPU generator for batch ``where``'s draws on the host as it is planned (a video's
        start frames), seeded apart from the finish's."""
        return torch.Generator().manual_seed(self.batch_seed((*where, 1)))

    def batch_seed(self, where: tuple) -> int:
        mixed = 0
        for part in (self.seed, *where):
            mixed = (mixed * 1_000_003 + part) % (2**63 - 1)
        return mixed

    def finish(self, plans: list, values: list, device: torch.device, indices=None, epoch=0,
               out: list | None = None, mixing: bool = True) -> list:  # fmt: skip
        """As ``__call__``, from the generators as seeded. Pixel fields share the draw of the
        first of them (files first: their sizes); images of other sizes draw their own from the
        batch's seed. A field not planned (None) comes out None."""
        g, host = self.generator(device), self.generator(_HOST)
        pixels = [i for i, f in enumerate(plans) if f is not None and f.pixels]
        lead = next((i for i in pixels if plans[i].on_host), pixels[0] if pixels else None)
        draw = size = None
        if lead is not None and (self.draws or plans[lead].on_host):  # else masks keep theirs
            f = plans[lead]
            size = tuple(f.size)
            if self.draws:
                sizes = f.sizes_of(values[lead])
                draw = self.draw(f, sizes, device, g, host, indices, epoch)
        ctx = Context(draw or NO_DRAW, self.mean, self.std, self.dtype, self.channels_last, size,
                      g, host, self.own, self.erase, self.mask_fill)  # fmt: skip
        done = []
        for i, (f, x) in enumerate(zip(plans, values)):
            c = ctx if out is None or out[i] is None else ctx._replace(out=out[i])
            if draw and f is not None and i != lead and f.category == "image" and f.pixels:
                if not torch.equal(s := f.sizes_of(x), sizes):  # its own draw, from the seed
                    c = c._replace(draw=self.redraw(f, s, device, indices, epoch, g.initial_seed()))
            done.append(None if f is None else f.finish(x, c))
        return self.mixed(plans, done, host) if mixing else done

    def draw(self, f: Field, sizes, device, g, host, indices, epoch: int) -> Draw:
        """The batch's draws for pixel field ``f`` (its ``sizes``, ``(N, 2)``), in the order
        the generators are read: the augmentation's, then the erasing boxes."""
        draw, size = Draw(), tuple(f.size)
        if isinstance(self.augment, Augment):
            crop = size if f.crops else None
            draw = self.augment.draw(sizes, size, device, g, host, epoch=epoch, indices=indices,
                                     seed=self.seed, crop=crop)  # fmt: skip
        if isinstance(self.erase, Erasing) and self.own is None:  # else its own augment draws first
            draw = replace(draw, erase=self.erase.params(len(sizes), size, device, g))
        return draw

    def redraw(self, f: Field, sizes, device, indices, epoch: int, seed: int) -> Draw:
        """``draw`` for a field of other sizes, from new generators seeded with the batch's
        ``seed``."""
        g = torch.Generator(device).manual_seed(seed)
        host = g if device.type == "cpu" else torch.Generator().manual_seed(seed)
        return self.draw(f, sizes, device, g, host, indices, epoch)

    def mixed(self, plans: list[Field | None], values: list, host: torch.Generator) -> list:
        """``values`` with its one image field and its one integer field of one value per
        sample mixed by ``mix``, drawn from the batch's host generator (else a BatchError)."""
        if self.mix is None:
            return values
        images = [i for i, f in enumerate(plans) if f is not None and f.category == "image"]
        labels = [i for i, f in enumerate(plans) if isinstance(f, Integer) and len(f.shape) == 1]
        if len(images) != 1 or len(labels) != 1:
            named = ", ".join(f"{f.name!r}: {f.what} {f.shape}" for f in plans if f is not None)
            raise BatchError(
                "mix= mixes one image field with one label field (integers, one per sample); "
                f"this batch has {named}"
            )
        (i,), (j,) = images, labels
        values[i], values[j] = self.mix(values[i], values[j], host)
        return values

    def generator(self, device: torch.device) -> torch.Generator:
        """The generator on ``device`` (one per device, reseeded per batch)."""
        g = self._generators.get(str(device))
        if g is None:
            g = self._generators[str(device)] = torch.Generator(device=device)
        return g
