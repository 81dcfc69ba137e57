"""The 16-bit image field's declaration, ``latecast.image16(range=, window=, mean=, std=,
channels=, layout=)``: which values a batch may hold, how they are scaled, where the channels
are; the field it plans (``pixels16.Images16``) is the core's, as a 16-bit store's."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import BatchError, ConfigError, numbers_of, refuse
from ..fields import LAYOUTS, Name, check_channels, layout_of, limits, value_range
from ..pixels16 import DEEP, Images16, check_augment


@dataclass(frozen=True)
class Image16Spec:
    """A 16-bit image field's declaration (``image16``): the values, the scale, the layout."""

    range: tuple[float, float] | None = None  # the values the data holds; outside: BatchError
    window: tuple[float, float] | None = None  # values clamped to it first (CT window/level)
    mean: tuple[float, ...] | None = None  # per channel, stored units; None: from window/range
    std: tuple[float, ...] | None = None
    channels: int | None = None  # None: from the layout (or the length of mean/std)
    layout: str = "auto"  # where the channels are: auto (wrap's layout=), NHWC or NCHW

    def plan(self, name: Name, t: torch.Tensor, options: Any, batch: dict) -> Images16:
        """The field as it crosses (its own dtype and shape); a BatchError naming it for a
        dtype, rank, channel count or value it cannot take, a ConfigError for an ``augment``
        that does not apply to 16-bit values."""
        if not isinstance(t, torch.Tensor) or t.dtype not in DEEP or t.ndim not in (3, 4):
            tensor = isinstance(t, torch.Tensor)
            got = f"{t.dtype} {tuple(t.shape)}" if tensor else f"a {type(t).__name__} ({t!r:.40})"
            raise BatchError(
                f"field {name!r} is declared a 16-bit image and must be uint16 or int16 "
                f"(N, H, W), (N, H, W, C) or (N, C, H, W), got {got}"
            )
        shape = tuple(t.shape)
        check_augment(name, options.augment)
        layout = "NHW" if t.ndim == 3 else self._layout(name, shape, options.layout)
        channels = {"NHW": 1, "NHWC": shape[-1], "NCHW": shape[1]}[layout]
        if self.channels not in (None, channels):
            raise BatchError(f"field {name!r}: {channels} channels ({layout} {shape}), declared "
                             f"{self.channels}")  # fmt: skip
        mean, std = self._scale(t.dtype)
        check_channels(name, channels, len(mean), f" ({layout} {shape})")
        least, most = limits(t.dtype)  # a range that covers the dtype's needs no read
        if self.range and not self.range[0] <= least <= most <= self.range[1]:
            low, high = value_range(t)
            if low < self.range[0] or high > self.range[1]:
                raise BatchError(
                    f"field {name!r}: values {low}..{high} outside the declared range "
                    f"{self.range[0]:g}..{self.range[1]:g}; declare the range the data holds, "
                    "or window=(low, high) to clamp to it"
                )
        return Images16(name, t.dtype, shape, t.dtype, layout, mean, std, self.window)

    def _layout(self, name: Name, shape: tuple, wrapped: str) -> str:
        """The declared layout (here, else wrap's), else the one axis, 1 or 3, of the
        declared channels (else of len(mean), else of 1, 3 or 4)."""
        layout = self.layout if self.layout != "auto" else wrapped
        if layout != "auto":
            return layout
        count = self.channels or (len(self.mean) if self.mean and len(self.mean) > 1 else None)
        fix = "declare latecast.image16(layout='NCHW') (or 'NHWC'), or channels=C"
        return layout_of(name, "16-bit images", shape, (count,) if count else (1, 3, 4), fix)

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
) -> Image16Spec:
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
    if rng and win and (win[1] <= rng[0] or win[0] >= rng[1]):  # every value clamped to one end
        raise ConfigError(
            f"latecast.image16(window={window!r:.40}) lies wholly outside range={range!r:.40}: "
            "every pixel would come out the same; give a window that overlaps the range"
        )
    return Image16Spec(rng, win, m, s, None if channels is None else int(channels), layout)


def _rising(pair: tuple | None) -> bool:
    return pair is not None and len(pair) == 2 and pair[0] < pair[1]


def _stats(mean: tuple | None, std: tuple | None) -> bool:
    return bool(mean and std and len(mean) == len(std) and min(std) > 0)
