"""16-bit images: uint16 or int16 (CT slices in Hounsfield units, satellite bands, depth
maps, microscopy), any number of channels, cross as they are stored (2 bytes a pixel, half of
float32's) and are made float ``(N, C, H, W)`` on the device: ``(clamp(x, window) - mean) /
std`` per channel, in the stored units, then the batch's one geometric draw (resized crop,
crop, flip) on those floats, masks moving with them. ``wrap`` takes them declared
``latecast.image16(...)`` (``kinds/image16.py``).

Normalize first, then move: as MONAI (``ScaleIntensityRanged`` before its crops) and TorchGeo
(``Normalize`` first in its device-side augmentations) do, so a crop pads with 0 in the output
units and a resized crop blends values already windowed (a clamp does not commute with it).
Colour jitter and cutout are 8-bit ops: refused (``erase=`` runs on the output floats).

A uint16 ``Dataset`` (a 16-bit store, ``latecast convert``) crosses the same way in the
Loader: ``stored`` is its field, ``Prepare16`` its prepare stage.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .errors import ConfigError
from .fields import Image, Name, Taken, nhwc
from .prepare import Prepare
from .transforms import Augment, Moves

DEEP = (torch.uint16, torch.int16)


def check_augment(name: Name, augment: Any) -> None:
    """Only a ``latecast.Augment``'s geometric draw applies to 16-bit values (ConfigError)."""
    if augment is None:
        return
    if not isinstance(augment, Augment) or augment.jitter or augment.cutout:
        raise ConfigError(
            f"field {name!r} is a 16-bit image: augment={augment!s:.60} does not apply to it; "
            "it takes a latecast.Augment's resized_crop, crop and flip (colour jitter and "
            "cutout are 8-bit ops; erase= runs on the normalized output)"
        )


@dataclass(frozen=True)
class Image16Field(Image):
    """The 16-bit kind: crosses as stored; ``prepared`` scales it into float and moves it."""

    mean: tuple = (0.0,)  # per channel, stored units
    std: tuple = (1.0,)
    window: tuple | None = None

    what = "16-bit image"
    draws = True

    def pack(self, dst: torch.Tensor, value: torch.Tensor) -> None:
        """The stored bits, as int16 (torch 2.4 copies few uint16 tensors); a Loader's
        ``Taken`` rows gathered by numpy."""
        if isinstance(value, Taken):
            return super().pack(dst, value)
        dst.view(torch.int16).view(self.shape).copy_(value.view(torch.int16))

    def view(self, raw: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``(N, H, W, C)`` int16 bits, whatever the layout it crossed in."""
        return nhwc(raw.view(torch.int16).view(self.shape), self.layout)

    def prepared(
        self, x: torch.Tensor, prepare: Any, moves: Moves | None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Float ``(N, C, H, W)`` in ``prepare``'s dtype and memory format (written into
        ``out`` when given): scaled, then the resized crop (bilinear, antialiased:
        torchvision's on float tensors), crop and flips of ``moves``, then ``prepare``'s
        erasing."""
        y = self.scaled(x)  # float32 (N, H, W, C)
        if moves is not None:
            if moves.boxes is not None:
                y = resized_crop_float(y, moves.boxes, tuple(y.shape[1:3]))
            y = moves.shift_and_flip(y)
        if out is None:
            n, h, w, c = y.shape
            fmt = torch.channels_last if prepare.channels_last else torch.contiguous_format
            out = torch.empty((n, c, h, w), dtype=prepare.dtype, device=y.device, memory_format=fmt)
        out.copy_(y.permute(0, 3, 1, 2))  # one copy: the layout and the rounding to dtype
        if prepare.erase is not None:
            out = prepare.erase(out, prepare.generator(out.device))
        return out

    def scaled(self, x: torch.Tensor) -> torch.Tensor:
        """``(clamp(x, window) - mean) / std`` of int16 bits ``x`` as float32, as torchvision's
        ``Normalize`` computes it on float32 (the same ops: equal bit for bit)."""
        unsigned = self.dtype == torch.uint16  # its bits as int16, top bit flipped: u - 32768
        bits = x ^ -32768 if unsigned else x
        y = torch.empty(x.shape, dtype=torch.float32, device=x.device).copy_(bits)  # NHWC in
        if unsigned:  # memory, whatever x's strides: the CPU's crop and flip copy whole rows
            y = y.add_(32768)  # exact: float32 holds every integer below 2**24
        if self.window is not None:
            y = y.clamp_(*self.window)
        mean, std = _constants(x.device, self.mean, self.std)
        return y.sub_(mean).div_(std)


@functools.lru_cache(maxsize=64)  # per batch: a small host->device copy spared
def _constants(device: torch.device, mean: tuple, std: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``mean`` and ``std`` on ``device``, ``(C,)``: broadcast over ``(N, H, W, C)``."""
    return tuple(torch.tensor(v, dtype=torch.float32, device=device) for v in (mean, std))


def resized_crop_float(x: torch.Tensor, boxes: torch.Tensor, size: tuple) -> torch.Tensor:
    """Crop float ``x[i]`` (``(N, H, W, C)``) to ``boxes[i] = (top, left, height, width)``
    and resize it to ``size`` bilinear with antialias, torchvision v2's ``resized_crop`` on
    float tensors; each crop on its own (their sizes differ), into its slot."""
    out = x.new_empty((len(x), *size, x.shape[3]))
    for i, (top, left, h, w) in enumerate(boxes.tolist()):
        crop = x[i, top : top + h, left : left + w]
        if (h, w) == tuple(size):
            out[i] = crop
            continue
        y = F.interpolate(crop.permute(2, 0, 1)[None], size, mode="bilinear", antialias=True)
        out[i] = y[0].permute(1, 2, 0)
    return out


def stored(mean: tuple, std: tuple, shape: tuple = ()) -> Image16Field:
    """The field of ``shape`` ``(N, H, W, C)`` uint16 pixels of a ``Dataset`` (a 16-bit
    store), normalized by its ``mean``/``std`` in stored units."""
    return Image16Field("images", torch.uint16, shape, torch.uint16, "NHWC", mean, std)


def bits(images: np.ndarray) -> np.ndarray:
    """A Dataset's uint16 pixels as their int16 bits (what the device holds: torch 2.4 has
    few uint16 ops); uint8 ones as they are."""
    return images.view(np.int16) if images.dtype == np.uint16 else images


class Prepare16(Prepare):
    """The prepare stage of a uint16 ``Dataset`` (a 16-bit store), which the Loader takes for
    one: ``apply`` of a ``(N, H, W, C)`` batch (or its int16 bits) is the Augment's geometric
    draw, then ``Image16Field.prepared`` (into ``out`` when given), then the mix. A ConfigError
    for an augment that does not apply to 16-bit values."""

    def apply(self, images, labels, indices=None, out=None, moves=None, size=None):
        check_augment("images", self.augment)
        x = images.view(torch.int16)
        moves = self.moves(x, indices) if moves is None else moves
        y = stored(self.mean, self.std).prepared(x, self, moves, out)  # no second copy
        if self.mix is not None:
            y, labels = self.mix(y, labels, self.generator(torch.device("cpu")))
        return (y if out is None or y is out else out.copy_(y)), labels
