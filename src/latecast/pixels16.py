"""16-bit images: uint16 or int16 (CT slices in Hounsfield units, satellite bands, depth
maps, microscopy), any number of channels, cross as they are stored (2 bytes a pixel, half of
float32's) and are made float ``(N, C, H, W)`` on the device: ``(clamp(x, window) - mean) /
std`` per channel, in the stored units, then the batch's one geometric draw (resized crop,
crop, flip) on those floats, masks moving with them. ``wrap`` takes them declared
``latecast.image16(...)``; a 16-bit store's batch (``data.Dataset16``) is the same field.

Normalize first, then move: as MONAI (``ScaleIntensityRanged`` before its crops) and TorchGeo
(``Normalize`` first in its device-side augmentations) do, so a crop pads with 0 in the output
units and a resized crop blends values already windowed (a clamp does not commute with it).
Colour jitter and cutout are 8-bit ops: refused (``erase=`` runs on the output floats).
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .errors import BatchError, ConfigError, numbers_of, refuse
from .fields import (
    LAYOUTS,
    Context,
    Image,
    Name,
    Taken,
    check_channels,
    erased,
    limits,
    nhwc,
    value_range,
)  # fmt: skip
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
class Image16Field(Image):
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


@dataclass(frozen=True)
class Image16:
    """A 16-bit image field's declaration (``image16``): the values, the scale, the layout."""

    range: tuple[float, float] | None = None  # the values the data holds; outside: BatchError
    window: tuple[float, float] | None = None  # values clamped to it first (CT window/level)
    mean: tuple[float, ...] | None = None  # per channel, stored units; None: from window/range
    std: tuple[float, ...] | None = None
    channels: int | None = None  # None: from the layout (or the length of mean/std)
    layout: str = "auto"  # where the channels are: auto (wrap's layout=), NHWC or NCHW

    def plan(self, name: Name, t: torch.Tensor, options: Any, batch: dict) -> Image16Field:
        """The field as it crosses (its own dtype and shape); a BatchError naming it for a
        dtype, rank, channel count or value it cannot take, a ConfigError for an ``augment``
        that does not apply to 16-bit values."""
        shape = tuple(t.shape)
        if t.dtype not in DEEP or t.ndim not in (3, 4):
            raise BatchError(
                f"field {name!r} is declared a 16-bit image and must be uint16 or int16 "
                f"(N, H, W), (N, H, W, C) or (N, C, H, W), got {t.dtype} {shape}"
            )
        check_augment(name, options.augment)
        layout = "NHW" if t.ndim == 3 else self._layout(name, shape, options.layout)
        channels = {"NHW": 1, "NHWC": shape[-1], "NCHW": shape[1]}[layout]
        if self.channels not in (None, channels):
            raise BatchError(f"field {name!r}: {channels} channels ({layout} {shape}), declared "
                             f"{self.channels}")  # fmt: skip
        mean, std = self._scale(t.dtype)
        check_channels(name, channels, len(mean), f" ({layout} {shape})")
        if self.range and not _covers(t.dtype, self.range):  # some value may lie outside
            low, high = value_range(t)
            if low < self.range[0] or high > self.range[1]:
                raise BatchError(
                    f"field {name!r}: values {low}..{high} outside the declared range "
                    f"{self.range[0]:g}..{self.range[1]:g}; declare the range the data holds, "
                    "or window=(low, high) to clamp to it"
                )
        return Image16Field(name, t.dtype, shape, t.dtype, layout, mean, std, self.window)

    def _layout(self, name: Name, shape: tuple, wrapped: str) -> str:
        """The declared layout (here, else wrap's), else the one axis, 1 or 3, of the
        declared channels (else of len(mean), else of 1, 3 or 4)."""
        layout = self.layout if self.layout != "auto" else wrapped
        if layout != "auto":
            return layout
        count = self.channels or (len(self.mean) if self.mean and len(self.mean) > 1 else None)
        ends = [axis for axis in (1, 3) if shape[axis] in ((count,) if count else (1, 3, 4))]
        if len(ends) != 1:
            raise BatchError(
                f"field {name!r}: 16-bit images {shape} are ambiguous, "
                f"{'both dim 1 and' if ends else 'neither dim 1 nor'} dim 3 look like channels; "
                "declare latecast.image16(layout='NCHW') (or 'NHWC'), or channels=C"
            )
        return "NCHW" if ends == [1] else "NHWC"

    def _scale(self, dtype: torch.dtype) -> tuple[tuple, tuple]:
        """mean/std as given, else the window's (else the range's) low and width, else
        ``(0, the dtype's greatest value)``: torchvision's ``ToDtype(float32, scale=True)``."""
        if self.mean is not None:
            return self.mean, self.std
        low, high = self.window or self.range or (0, limits(dtype)[1])
        return (low,), (high - low,)


def image16(
    range: tuple[float, float] | None = None,  # noqa: A002  (the word users know)
    window: tuple[float, float] | None = None,
    mean: float | tuple[float, ...] | None = None,
    std: float | tuple[float, ...] | None = None,
    channels: int | None = None,
    layout: str = "auto",
) -> Image16:
    """Declare a field of 16-bit images for ``wrap(fields={name: latecast.image16(...)})``:
    it crosses as stored and comes out float ``(N, C, H, W)`` (wrap's ``dtype=``,
    ``channels_last=``), ``(clamp(x, window) - mean) / std`` per channel.

    Args:
        range: ``(low, high)``, the values the data holds, in stored units: one outside is a
            BatchError naming the field. Without mean/std it maps to [0, 1].
        window: ``(low, high)``: values clamped to it, then mapped to [0, 1] (without
            mean/std): MONAI's ``ScaleIntensityRange(a_min, a_max, 0, 1, clip=True)``.
        mean, std: per channel (or one for all), in stored units, as torchvision's
            ``Normalize`` on the float32 of the stored values (TorchGeo's per-band
            statistics). Neither, no window or range: ``x / 65535`` (uint16) or
            ``x / 32767`` (int16), as ``ToDtype(torch.float32, scale=True)``.
        channels: how many; finds their axis (dim 1 or 3) when ``layout`` is ``"auto"``.
        layout: ``"NHWC"``, ``"NCHW"`` or ``"auto"`` (wrap's ``layout=``, else recognised);
            3-dim batches are ``(N, H, W)``, one channel.

    Example:
        >>> ct = latecast.wrap(dl, fields={"image": latecast.image16(window=(-1000, 400)),
        ...                                "label": "mask"}, augment=latecast.Augment(flip=0.5))
    """
    rng, win = numbers_of(range), numbers_of(window)
    m = numbers_of([mean] if isinstance(mean, numbers.Real) else mean)
    s = numbers_of([std] if isinstance(std, numbers.Real) else std)
    whole = isinstance(channels, numbers.Integral) and not isinstance(channels, bool)
    count = channels is None or whole and channels > 0
    pair, arg = "(low, high) of finite numbers, low < high", "latecast.image16({}=...)"
    stats = "both or neither, of one length, finite numbers, std > 0"
    refuse(
        [
            (range is None or _rising(rng), arg.format("range"), range, pair),
            (window is None or _rising(win), arg.format("window"), window, pair),
            (mean is None and std is None or _stats(m, s), arg.format("mean/std"), mean, stats),
            (count, arg.format("channels"), channels, "an integer > 0"),
            (layout in LAYOUTS, arg.format("layout"), layout, " or ".join(LAYOUTS)),
        ]
    )
    return Image16(rng, win, m, s, None if channels is None else int(channels), layout)


def _rising(pair: tuple | None) -> bool:
    return pair is not None and len(pair) == 2 and pair[0] < pair[1]


def _stats(mean: tuple | None, std: tuple | None) -> bool:
    return bool(mean and std and len(mean) == len(std) and min(std) > 0)


def _covers(dtype: torch.dtype, declared: tuple) -> bool:
    """Every value of ``dtype`` lies in ``declared``: no batch need be read to check it."""
    least, most = limits(dtype)
    return declared[0] <= least and most <= declared[1]
