"""The video kind: a field of uint8 clips crosses as uint8 (a quarter of float32's bytes at
the same size; the crop is made on the device, so against a float32 pipeline that crops on
the host first it is 4 * crop area / frame area: 2.29x for torchvision's video reference,
128x171 frames cropped to 112x112) and is cropped, flipped and normalized on the device, one
geometric draw per clip for all its frames (as torchvision v2 transforms a video: parameters
drawn once, applied to every frame).
Declared ``fields={"video": latecast.clip(frames=16, size=112)}``; out ``(N, C, T, H, W)``
float, what torchvision's video models take, or ``(N, T, C, H, W)``, what Hugging Face's
(VideoMAE, TimeSformer) take. Encoded clips (mp4, mkv, webm files) are ``latecast.video``
(``encoded.py``), finished here too (``finished``).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import BatchError, ConfigError, check, numbers_of, refuse
from ..fields import Context, Field, Name, check_bytes, check_channels, integral
from ..transforms import Augment, crop_into, normalize

# a layout's dims -> (N, T, H, W, C): what a clip is made on the device
LAYOUTS = {"NTHWC": (0, 1, 2, 3, 4), "NTCHW": (0, 1, 3, 4, 2), "NCTHW": (0, 2, 3, 4, 1)}
OUTS = ("NCTHW", "NTCHW")
CHANNEL_AXIS = {"NTCHW": 2, "NTHWC": 4, "NCTHW": 1}  # where layout="auto" looks, in this order
AUTO_HINT = (
    "; the layout was recognised from the shape (no dim held the channels of mean/std): "
    "declare it, latecast.clip(layout='NTCHW') (or 'NTHWC', 'NCTHW')"
)


@dataclass(frozen=True)
class ClipSpec:
    """A clip field's declaration (``clip``); ``plan`` checks each batch of clips against it
    (a BatchError naming the field) and the options it is finished with (a ConfigError)."""

    frames: int | None = None  # T of every clip; None: as they come
    layout: str = "auto"  # how a batch of clips arrives; auto: recognised by its shape
    size: tuple[int, int] | None = None  # the (H, W) out; None: the frames' own
    out: str = "NCTHW"  # how it comes out

    def plan(self, name: Name, t: torch.Tensor, options: Any, batch: dict) -> Clips:
        tensor = isinstance(t, torch.Tensor)
        if not tensor or t.ndim != 5 or not integral(t.dtype):
            got = f"{t.dtype} {tuple(t.shape)}" if tensor else f"a {type(t).__name__} ({t!r:.40})"
            declared = "" if self.layout == "auto" else f" {self.layout}"
            raise BatchError(
                f"field {name!r} is declared clips{declared} and must be uint8 with 5 dims, "
                f"got {got}; a DataLoader yields uint8 frames as decoders give them "
                "(TorchCodec, torchvision.io), not ConvertImageDtype()'s floats"
            )
        if t.dtype != torch.uint8:  # int64 from a collate: crosses as uint8 if it fits
            check_bytes(name, t, "clips")
        shape = tuple(t.shape)
        layout = self._layout(name, shape, options)
        n, frames, h, w, c = (shape[i] for i in LAYOUTS[layout])
        if 0 in (n, frames, h, w, c):
            none = "no clips (an empty batch)" if n == 0 else "clips of 0 frames" * (frames == 0)
            raise BatchError(
                f"field {name!r}: {none or 'frames of no pixels'} ({layout} {shape}); "
                "every batch of clips must hold at least one clip of at least one frame"
            )
        if self.frames is not None and frames != self.frames:
            than = "shorter" if frames < self.frames else "longer"
            raise BatchError(
                f"field {name!r}: clips of {frames} frames ({layout} {shape}), {than} than "
                f"the {self.frames} declared"
            )
        size = self.size or (h, w)
        if size[0] > h or size[1] > w:
            raise BatchError(
                f"field {name!r}: frames of {h}x{w} ({layout} {shape}) are smaller than "
                f"the declared size {size[0]}x{size[1]}"
            )
        hint = AUTO_HINT if self.layout == "auto" else ""
        check_channels(name, c, len(options.mean or (0,)), f" ({layout} {shape})", hint)
        check_options(name, options)
        if getattr(options.augment, "jitter", 0) and c not in (1, 3):  # torchvision's refuse too
            raise ConfigError(
                f"field {name!r}: colour jitter takes clips of 1 or 3 channels, got {c} "
                f"({layout} {shape}); leave jitter out of augment= for these clips"
            )
        return Clips(name, torch.uint8, shape, t.dtype, layout, size, self.out)

    def _layout(self, name: Name, shape: tuple, options: Any) -> str:
        """The declared layout, else the one of NTCHW, NTHWC, NCTHW whose channel axis (dim 2,
        4 or 1) holds len(mean) channels (else 1 or 3, else 4), narrowed where more than one
        does by the declared frames and size; NTHWC where none does (the channel count is then
        the error); else one BatchError asking for ``layout=``."""
        if self.layout != "auto":
            return self.layout
        count = len(options.mean) if options.mean and len(options.mean) > 1 else None
        found: list[str] = []
        for counts in ((count,),) if count else ((1, 3), (4,)):
            found = [k for k, axis in CHANNEL_AXIS.items() if shape[axis] in counts]
            if found:
                break
        if len(found) > 1:  # the frames and size declared may tell them apart
            fits = [k for k in found if self._fits(shape, k)]
            found = fits or found
        if len(found) > 1:
            dims = " and ".join(f"dim {CHANNEL_AXIS[k]} ({k})" for k in found)
            raise BatchError(
                f"field {name!r}: clips {shape} are ambiguous, {dims} each look like channels; "
                "declare where they are: latecast.clip(layout='NTCHW') (or 'NTHWC', 'NCTHW')"
            )
        return found[0] if found else "NTHWC"

    def _fits(self, shape: tuple, layout: str) -> bool:
        """Clips read as ``layout`` have the declared frames and frames at least ``size``."""
        _, frames, h, w, _ = (shape[i] for i in LAYOUTS[layout])
        size = self.size or (0, 0)
        return self.frames in (None, frames) and h >= size[0] and w >= size[1]


def check_options(name: Name, options: Any) -> None:
    """What finishes clips: a ``latecast.Augment`` (its draws made per clip), no ``erase`` or
    ``mix`` (they take ``(N, C, H, W)`` images); else one ConfigError."""
    for given, what in ((options.erase, "erase"), (options.mix, "mix")):
        if given is not None:
            raise ConfigError(f"field {name!r} is clips: {what}= takes (N, C, H, W) images, "
                              "not clips; leave it out")  # fmt: skip
    if not (options.augment is None or isinstance(options.augment, Augment)):
        raise ConfigError(
            f"field {name!r} is clips: augment= must be a latecast.Augment (drawn once per "
            f"clip), got {options.augment!r:.60}"
        )


def clip(
    frames: int | None = None,
    layout: str = "auto",
    size: int | tuple[int, int] | None = None,
    out: str = "NCTHW",
) -> ClipSpec:
    """Declare a field of uint8 video clips for ``wrap(fields={name: latecast.clip(...)})``.

    Args:
        frames: the frames of every clip; a batch of clips with fewer (or more) is a
            BatchError naming the field. None: as they come.
        layout: how a batch arrives: ``"NTHWC"`` (torchvision.io, decord, PyAV),
            ``"NTCHW"`` (TorchCodec, torchvision's ``output_format="TCHW"`` and its video
            classification reference), ``"NCTHW"``, or ``"auto"``: recognised from each
            batch's shape, the one of dim 2, 4 or 1 that holds the channels (as many as
            mean/std has values, else 1 or 3, else 4; where more than one does, the one whose
            frames and size fit the declared ``frames`` and ``size``); still ambiguous, a
            BatchError naming the field and its shape asks for the layout.
        size: the ``(H, W)`` out, or one int: under an ``Augment`` with ``resized_crop``
            RandomResizedCrop to it, under another ``Augment`` a random crop of it
            (RandomCrop), without one the centre crop (CenterCrop); the same box for all
            frames of a clip. None: the frames' own size.
        out: ``"NCTHW"`` (torchvision's video models: r3d_18, r2plus1d_18, s3d, mvit,
            swin3d) or ``"NTCHW"`` (Hugging Face's VideoMAE, TimeSformer), normalized floats
            in wrap's ``dtype``.

    Example:
        >>> dl = DataLoader(kinetics, batch_size=24, num_workers=10)  # uint8 (T, C, H, W)
        >>> train = latecast.wrap(dl, mean=MEAN, std=STD, augment=latecast.Augment(flip=0.5),
        ...                       fields={0: latecast.clip(16, "NTCHW", size=112)})
    """
    hw = numbers_of((size, size) if isinstance(size, numbers.Integral) else size, int)
    count = frames is None or isinstance(frames, numbers.Integral) and frames >= 1
    refuse(
        [
            (count and not isinstance(frames, bool), "latecast.clip(frames=...)", frames,
             "an integer >= 1 or None"),
            (size is None or (hw and len(hw) == 2 and min(hw) >= 1), "latecast.clip(size=...)",
             size, "an integer N or (H, W) of integers >= 1 (None: the frames' own)"),
        ]
    )  # fmt: skip
    layout = check(layout, "latecast.clip(layout=...)", (*LAYOUTS, "auto"))
    out = check(out, "latecast.clip(out=...)", OUTS)
    return ClipSpec(None if frames is None else int(frames), layout, hw, out)


@dataclass(frozen=True)
class Clips(Field):
    """A batch of uint8 clips: crosses as it arrived, made on the device as ``(N, T, H, W, C)``
    (``view``), the batch's geometric draw made on each clip's first frame (``frames``)."""

    layout: str = "NTHWC"
    size: tuple[int, int] = (0, 0)  # the (H, W) out
    out: str = "NCTHW"

    category, what = "image", "clip"
    pixels = crops = True

    def view(self, raw: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``(N, T, H, W, C)``, whatever the layout it crossed in (a view)."""
        return super().view(raw, device).permute(LAYOUTS[self.layout])

    def sizes_of(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tensor([x.shape[2:4]]).expand(len(x), 2)  # its frames'

    def finish(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Cropped to ``size`` by the draw's box (a resized crop's, or a random crop's), else
        its centre (torchvision's ``CenterCrop`` rounding); moved and coloured by the draw, one
        per clip for all its frames; normalized into ``out``."""
        n, t = x.shape[:2]
        boxes = ctx.draw.boxes
        if boxes is None and tuple(x.shape[2:4]) == self.size:
            x = x.contiguous()  # a copy only for clips that crossed in another layout
        else:
            out = x.new_empty((n, t, *self.size, x.shape[4]))
            for i in range(n):  # a crop's size differs by clip
                crop_clip(x[i], None if boxes is None else boxes[i].tolist(), out[i])
            x = out
        return finished(x, ctx, self.out)


def crop_clip(x: torch.Tensor, box: list | None, dst: torch.Tensor, antialias=True) -> None:
    """Clip ``x`` (``(T, H, W, C)``) cropped into ``dst`` (``(T, h, w, C)``, a batch's slot) by
    the draw's ``box`` (a resized crop's, or a random crop's), else at its centre
    (torchvision's ``CenterCrop`` rounding): one box for all its frames."""
    if box is None:
        (h, w), (sh, sw) = x.shape[1:3], dst.shape[1:3]
        box = (round((h - sh) / 2), round((w - sw) / 2), sh, sw)
    crop_into(x, box, dst, antialias=antialias)


def finished(x: torch.Tensor, ctx: Context, out: str) -> torch.Tensor:
    """uint8 clips ``(N, T, H, W, C)`` at their size out, moved and coloured by the draw (one
    per clip for all its frames), then normalized into ``out`` (NCTHW or NTCHW) by one
    ``normalize``: for NCTHW the frames are taken as ``(N, T*H, W, C)`` images, whose ``(N, C,
    T*H, W)`` result is ``(N, C, T, H, W)``."""
    n, t, h, w, c = x.shape
    d = ctx.draw.per_clip(t)
    frames = d.colour(d.shift_and_flip(x.view(n * t, h, w, c)))  # (N*T, H, W, C)
    ncthw = out == "NCTHW"
    images = frames.view(n, t * h, w, c) if ncthw else frames
    y = normalize(images, ctx.mean, ctx.std, dtype=ctx.dtype, channels_last=ctx.channels_last)
    return y.view(n, c, t, h, w) if ncthw else y.view(n, t, c, h, w)
