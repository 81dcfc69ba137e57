"""16-bit images: uint16 or int16 (CT slices in Hounsfield units, satellite bands, depth
maps, microscopy), any number of channels, cross as they are stored (2 bytes a pixel, half of
float32's) and are made float ``(N, C, H, W)`` on the device: ``(clamp(x, window) - mean) /
std`` per channel, in the stored units, then the batch's one geometric draw (resized crop,
crop, flip) on those floats, masks moving with them. ``wrap`` takes them declared
``latecast.image16(...)`` (``kinds/image16.py``); a 16-bit store's batch (``data.Dataset16``)
is the same field.

Normalize first, then move: as MONAI (``ScaleIntensityRanged`` before its crops) and TorchGeo
(``Normalize`` first in its device-side augmentations) do, so a crop pads with 0 in the output
units and a resized crop blends values already windowed (a clamp does not commute with it).
Colour jitter and cutout are 8-bit ops: refused (``erase=`` runs on the output floats).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .errors import ConfigError
from .fields import Context, Image, Name, Taken, erased, nhwc
from .transforms import Augment

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
class Images16(Image):
    """The 16-bit kind: crosses as stored; ``finish`` scales it into float and moves it."""

    mean: tuple = (0.0,)  # per channel, stored units
    std: tuple = (1.0,)
    window: tuple | None = None

    what = "16-bit image"

    def pack(self, dst: torch.Tensor, value: torch.Tensor) -> None:
        """The stored bits, as int16 (torch 2.4 copies few uint16 tensors); a Loader's
        ``Taken`` rows gathered by numpy."""
        if isinstance(value, Taken):
            return super().pack(dst, value)
        dst.view(torch.int16).view(self.shape).copy_(value.view(torch.int16))

    def view(self, raw: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``(N, H, W, C)`` int16 bits, whatever the layout it crossed in."""
        return nhwc(raw.view(torch.int16).view(self.shape), self.layout)

    def finish(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Float ``(N, C, H, W)`` in the context's dtype and memory format (written into
        ``ctx.out`` when given): scaled, then the draw's resized crop (bilinear, antialiased:
        torchvision's on float tensors), crop and flips, then the erasing."""
        check_augment(self.name, ctx.augment or ctx.draw.augment)
        y, d = self.scaled(x), ctx.draw  # float32 (N, H, W, C)
        if d.boxes is not None:
            y = resized_crop_float(y, d.boxes, tuple(y.shape[1:3]))
        y = d.shift_and_flip(y)
        out = ctx.out
        if out is None:
            n, h, w, c = y.shape
            fmt = torch.channels_last if ctx.channels_last else torch.contiguous_format
            out = torch.empty((n, c, h, w), dtype=ctx.dtype, device=y.device, memory_format=fmt)
        out.copy_(y.permute(0, 3, 1, 2))  # one copy: the layout and the rounding to dtype
        return erased(out, ctx)

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
