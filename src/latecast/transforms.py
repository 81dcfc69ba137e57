"""Pure batched transforms on the device: uint8 ``(N, H, W, C)`` in, a new tensor out;
``normalize`` makes ``(N, C, H, W)`` floats, which ``Erasing`` and ``Mix`` take. A random op
has two halves, as in torchvision v2: ``*_params`` draws per image on ``images.device`` from an
optional generator, a pure function applies. A batch is checked (ConfigError) where it comes
in: ``normalize``, ``Augment``, ``Erasing``, ``Mix``; the applying halves take it checked."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .errors import ConfigError, check, numbers_of, refuse

FLOATS = (torch.float32, torch.bfloat16, torch.float16)  # what images come out in
_affine_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_CPU_CHUNK = 2**19  # bytes of uint8 images per addcmul on the CPU: its float copy stays in cache


def _scale_shift(mean, std, channels: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Cached ``(1, C, 1, 1)`` float32 ``scale, shift`` (computed in float64) with ``(x/255 -
    mean)/std == x*scale + shift``; ConfigError unless C (or 1) finite values each, std > 0."""
    try:
        key = (str(device), channels, tuple(map(float, mean)), tuple(map(float, std)))
    except (TypeError, ValueError):
        key = None
    if key not in _affine_cache:
        m, s = key[2:] if key else ((), ())
        if len(m) == len(s) == 1:  # one value for every channel, as torchvision's Normalize
            m, s = m * channels, s * channels
        if not (len(m) == len(s) == channels and all(map(math.isfinite, m + s)) and min(s) > 0):
            raise ConfigError(
                f"normalize: mean and std must be sequences of numbers, {channels} channels need "
                f"{channels} (or 1) finite values each (std > 0), got {mean!r:.60}/{std!r:.60}"
            )
        m, s = torch.tensor(m, dtype=torch.float64), torch.tensor(s, dtype=torch.float64)
        scale = (1.0 / (255.0 * s)).to(device, torch.float32).view(1, -1, 1, 1)  # (1, C, 1, 1)
        _affine_cache[key] = scale, (-m / s).to(device, torch.float32).view(1, -1, 1, 1)
    return _affine_cache[key]


def normalize(
    images: torch.Tensor,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    *,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """uint8 ``(N, H, W, C)`` -> ``(x/255 - mean)/std`` as ``(N, C, H, W)`` ``dtype``, one
    ``addcmul``: torchvision's ``ToTensor()`` + ``Normalize`` within 1e-6 in float32 (resumed
    runs rely on its values). ConfigError on a bad argument.

    Args:
        images: uint8 ``(N, H, W, C)`` on any device.
        mean, std: per channel (or one for all), in [0, 1] units; std > 0.
        dtype: float32, bfloat16 or float16 (computed in float32, rounded once at the end).
        channels_last: return ``torch.channels_last`` memory format (NHWC in memory).
        out: write here instead (``(N, C, H, W)``; its own dtype and layout win).

    Example:
        >>> normalize(torch.zeros(8, 28, 28, 1, dtype=torch.uint8), (0.13,), (0.31,)).shape
        torch.Size([8, 1, 28, 28])
    """
    if not (isinstance(images, torch.Tensor) and images.dtype == torch.uint8 and images.ndim == 4):
        _check_batch(images, "normalize", None)  # (the Loader and wrap checked theirs)
    flag, tensor = isinstance(channels_last, (bool, np.bool_)), isinstance(out, torch.Tensor)
    refuse([(flag, "channels_last", channels_last, "a bool")])
    refuse([(out is None or tensor, "normalize out", out, "a tensor or None")])
    n, h, w, c = images.shape
    dtype = check(out.dtype if tensor else dtype, "normalize dtype", FLOATS)
    if out is None:
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        out = torch.empty((n, c, h, w), dtype=dtype, device=images.device, memory_format=fmt)
    elif out.shape != (n, c, h, w):
        raise ConfigError(f"normalize out must be {(n, c, h, w)}, got {tuple(out.shape)}")
    scale, shift = _scale_shift(mean, std, c, images.device)
    x = images.permute(0, 3, 1, 2)  # (N, H, W, C) -> (N, C, H, W) view, NHWC in memory
    if images.device.type != "cpu":
        return torch.addcmul(shift, x, scale, out=out)
    step = max(1, _CPU_CHUNK // (h * w * c))
    for a in range(0, n, step):
        torch.addcmul(shift, x[a : a + step], scale, out=out[a : a + step])
    return out


# ---- augmentation: uint8 (N, H, W, C) in, same shape and dtype out ----------------------

_FILLS = ("zero", "reflect")


def _check_batch(images: torch.Tensor, fn: str, generator, floats: bool = False) -> None:
    """ConfigError naming ``fn`` unless ``images`` is uint8 ``(N, H, W, C)`` (``floats``: float
    ``(N, C, H, W)``) and ``generator`` None or a Generator on their device."""
    tensor = isinstance(images, torch.Tensor)
    kind = tensor and (images.is_floating_point() if floats else images.dtype == torch.uint8)
    if not (kind and images.ndim == 4):
        got = f"{images.dtype} {tuple(images.shape)}" if tensor else type(images).__name__
        want = "a float tensor (N, C, H, W)" if floats else "a uint8 tensor (N, H, W, C)"
        raise ConfigError(f"{fn} expects {want}, got {got}")
    gen = generator is None or isinstance(generator, torch.Generator)
    refuse([(gen, f"{fn}: generator", generator, "a torch.Generator or None")])
    if generator is not None and generator.device.type != images.device.type:
        where = f"on {generator.device} but the images are on {images.device}"
        raise ConfigError(f"{fn}: the generator is {where}: torch.Generator(device=images.device)")


def crop_params(images: torch.Tensor, padding: int, generator=None) -> torch.Tensor:
    """``(N, 2)`` int64 ``(dy, dx)`` in ``-padding..padding``: each image's translation."""
    n, dev = len(images), images.device
    return torch.randint(0, 2 * padding + 1, (n, 2), generator=generator, device=dev) - padding


def translate(images: torch.Tensor, shifts: torch.Tensor, *, fill: str = "zero") -> torch.Tensor:
    """Image ``i``'s pixel ``(y, x)`` <- its ``(y + dy, x + dx)``, ``shifts[i] = (dy, dx)``;
    outside it 0 (``fill="zero"``) or mirrored as ``np.pad``'s ``"reflect"``."""
    (n, h, w, _), dev = images.shape, images.device
    check(fill, "fill", _FILLS)
    rows = torch.arange(h, device=dev) + shifts[:, :1]  # (N, H) source row of each output row
    cols = torch.arange(w, device=dev) + shifts[:, 1:]  # (N, W)
    batch = torch.arange(n, device=dev)[:, None, None]  # (N, 1, 1)
    if fill == "reflect":
        return images[batch, _reflect(rows, h)[:, :, None], _reflect(cols, w)[:, None, :]]
    inside_y, inside_x = (rows >= 0) & (rows < h), (cols >= 0) & (cols < w)
    out = images[batch, rows.clamp(0, h - 1)[:, :, None], cols.clamp(0, w - 1)[:, None, :]]
    return out.masked_fill_(~(inside_y[:, :, None, None] & inside_x[:, None, :, None]), 0)


def flip_params(images: torch.Tensor, p: float, generator=None) -> torch.Tensor:
    """``(N,)`` bool, True where an image is flipped (probability ``p`` each)."""
    return torch.rand(len(images), generator=generator, device=images.device) < p


def flip(images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Flip left-right the images where ``mask`` is True."""
    return torch.where(mask[:, None, None, None], images.flip(2), images)  # W is dim 2 in NHWC


def cutout_params(images: torch.Tensor, generator=None) -> torch.Tensor:
    """``(N, 2)`` int64 ``(cy, cx)``: each square's centre, anywhere in the image."""
    n, h, w, _ = images.shape
    cy = torch.randint(0, h, (n,), generator=generator, device=images.device)
    cx = torch.randint(0, w, (n,), generator=generator, device=images.device)
    return torch.stack([cy, cx], 1)


def erase(images: torch.Tensor, centers: torch.Tensor, size: int) -> torch.Tensor:
    """Zero rows and columns ``c - size//2 ..< c - size//2 + size`` around each image's
    ``centers[i] = (cy, cx)``, clipped at the borders."""
    _, h, w, _ = images.shape
    top, left = (centers - size // 2).T[..., None]  # each (N, 1): in_y (N, H), in_x (N, W)
    ys, xs = torch.arange(h, device=images.device), torch.arange(w, device=images.device)
    in_y, in_x = (ys >= top) & (ys < top + size), (xs >= left) & (xs < left + size)
    return images.masked_fill(in_y[:, :, None, None] & in_x[:, None, :, None], 0)


def _windows(x: torch.Tensor, shifts, flips, fill: str) -> torch.Tensor:
    """``translate`` then ``flip`` (None: off) by copies of whole rows (a CPU gather copies
    value by value): pad once, add the flipped images flipped (one moved by ``dx`` is its flip
    moved by ``-dx``), then one ``index_select`` of overlapping windows."""
    n, h, w, c = x.shape
    shifts = x.new_zeros(n, 2, dtype=torch.long) if shifts is None else shifts
    flipped = torch.arange(0) if flips is None else flips.nonzero()[:, 0]
    p, k = int(shifts.abs().max()) if n else 0, len(flipped)
    hp, wp = h + 2 * p, w + 2 * p
    pad = x.new_zeros(n + k, hp, wp, c)
    rows = pad[:, p : p + h]  # (N + K, H, Wp, C): the images' own rows
    rows[:n, :, p : p + w] = x
    if fill == "zero":
        rows[n:, :, p : p + w] = x.index_select(0, flipped).flip(2)
    else:  # np.pad's mirror: an image's mirrored columns are slices of its flip
        other = torch.cat([x.flip(2), x.index_select(0, flipped)])  # (N + K, H, W, C)
        rows[n:, :, p : p + w] = other.index_select(0, flipped)
        rows[:, :, :p], rows[:, :, p + w :] = other[:, :, w - 1 - p : w - 1], other[:, :, 1 : p + 1]
        pad = pad.index_select(1, _reflect(torch.arange(-p, h + p), h) + p)  # then the rows
    image, dx = torch.arange(n), shifts[:, 1].clone()
    image[flipped], dx[flipped] = torch.arange(n, n + k), -dx[flipped]
    start = ((image * hp + shifts[:, 0] + p) * wp + dx + p) * c  # (N,) each window's first value
    last = max(pad.numel() - (h - 1) * wp * c - w * c + 1, 0)  # windows that fit
    windows = pad.view(-1).as_strided((last, h, w * c), (1, wp * c, 1))  # (L, H, W*C) view
    return windows.index_select(0, start).view(n, h, w, c)


def _zero_squares(images: torch.Tensor, centers: torch.Tensor, size: int) -> torch.Tensor:
    """``erase``, writing only the squares' pixels (the CPU's way)."""
    n, h, w, c = images.shape
    lo = (centers - size // 2).clamp(min=0)[:, :, None]  # (N, 2, 1) first row and column
    hi = (centers - size // 2 + size).minimum(torch.tensor([h, w]))[:, :, None] - 1  # last
    ys, xs = (lo + torch.arange(min(size, max(h, w)))).minimum(hi).unbind(1)  # each (N, S)
    at = (torch.arange(n)[:, None, None] * h + ys[:, :, None]) * w + xs[:, None, :]  # pixels
    return images.clone().view(-1, c).index_fill_(0, at.view(-1), 0).view(images.shape)


def erasing_params(images: torch.Tensor, p: float, scale, ratio, generator=None) -> torch.Tensor:
    """``(N, 4)`` int64 ``(top, left, height, width)``, torchvision ``RandomErasing``'s draw for
    ``(N, C, H, W)``: with probability ``p`` the first of 10 tries (area fraction in ``scale``,
    log-uniform aspect in ``ratio``) that fits; height and width 0 where none."""
    n, _, h, w = images.shape
    u = torch.rand(n, 23, generator=generator, device=images.device)  # 10 tries, 3 more
    area = h * w * (scale[0] + (scale[1] - scale[0]) * u[:, :10])
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(lo + (hi - lo) * u[:, 10:20])
    hs, ws = (area * aspect).sqrt().round().long(), (area / aspect).sqrt().round().long()
    fits = (hs < h) & (ws < w)  # (N, 10)
    first = fits.long().argmax(1, keepdim=True)  # the first try that fits
    on = (fits.any(1) & (u[:, 20] < p)).long()
    hs, ws = hs.gather(1, first)[:, 0] * on, ws.gather(1, first)[:, 0] * on
    top = (u[:, 21] * (h - hs + 1)).long().clamp(max=h - hs)  # uniform in 0..h - hs
    left = (u[:, 22] * (w - ws + 1)).long().clamp(max=w - ws)
    return torch.stack([top, left, hs, ws], 1)


def erase_boxes(images: torch.Tensor, boxes: torch.Tensor, fill) -> torch.Tensor:
    """Each image's box ``(top, left, height, width)`` set to ``fill`` (a number, ``(C, 1, 1)`` or
    ``(N, C, H, W)``): torchvision's ``F.erase``, for the whole batch at once."""
    _, _, h, w = images.shape
    top, left, hs, ws = boxes.to(images.device).T[..., None]  # each (N, 1)
    ys, xs = torch.arange(h, device=images.device), torch.arange(w, device=images.device)
    in_y, in_x = (ys >= top) & (ys < top + hs), (xs >= left) & (xs < left + ws)  # (N, H), (N, W)
    fill = torch.as_tensor(fill, dtype=images.dtype, device=images.device)
    return torch.where(in_y[:, None, :, None] & in_x[:, None, None, :], fill, images)


def _reflect(i: torch.Tensor, n: int) -> torch.Tensor:
    """Mirror ``-(n-1)..2(n-1)`` into ``0..n-1`` without repeating the edge, as ``np.pad``."""
    return (n - 1) - ((n - 1) - i.abs()).abs()


# ---- photo augmentations: resized crop, colour jitter, alternating flip ------------------

RATIO = (3 / 4, 4 / 3)  # RandomResizedCrop's aspect ratios
_AA = torch.ops.aten  # INTERPOLATIONS: torch's uint8 kernels on the CPU, as torchvision v2's
INTERPOLATIONS = {"bilinear": _AA._upsample_bilinear2d_aa, "bicubic": _AA._upsample_bicubic2d_aa}
SHARP = {"bilinear": _AA.upsample_bilinear2d, "bicubic": _AA.upsample_bicubic2d}  # antialias=False


def resized_crop_params(
    sizes: torch.Tensor, scale: tuple[float, float], ratio=RATIO, generator=None
) -> torch.Tensor:
    """``(N, 4)`` int64 ``(top, left, height, width)``, torchvision's RandomResizedCrop box for
    each of ``sizes`` (``(N, 2)`` (H, W)): of 10 tries (area fraction in ``scale``, log-uniform
    aspect in ``ratio``) the first that fits, placed uniformly; else the centre crop."""
    dev, n = sizes.device, len(sizes)
    hi, wi = sizes[:, :1].double(), sizes[:, 1:].double()  # (N, 1)
    u = torch.rand(n, 10, generator=generator, device=dev, dtype=torch.float64)
    area = hi * wi * (scale[0] + (scale[1] - scale[0]) * u)  # (N, 10) tries
    lo, up = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(lo + (up - lo) * torch.rand(n, 10, generator=generator, device=dev))
    w, h = (area * aspect).sqrt().round(), (area / aspect).sqrt().round()
    fits = (w > 0) & (w <= wi) & (h > 0) & (h <= hi)
    first = fits.long().argmax(1, keepdim=True)  # the first try that fits (0 if none does)
    h, w, any_fit = h.gather(1, first), w.gather(1, first), fits.any(1, keepdim=True)
    wide, tall = wi / hi > ratio[1], wi / hi < ratio[0]  # fallback: centre crop
    h = torch.where(any_fit, h, torch.where(tall, (wi / ratio[0]).round(), hi))
    w = torch.where(any_fit, w, torch.where(wide, (hi * ratio[1]).round(), wi))
    r = torch.rand(n, 2, generator=generator, device=dev, dtype=torch.float64)
    top = torch.where(any_fit, (r[:, :1] * (hi - h + 1)).floor(), ((hi - h) / 2).floor())
    left = torch.where(any_fit, (r[:, 1:] * (wi - w + 1)).floor(), ((wi - w) / 2).floor())
    return torch.cat([top, left, h, w], 1).long()


def centre_boxes(sizes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``(N, 4)`` boxes: the largest centred box of each of ``sizes`` with ``size``'s aspect
    (``resized_crop`` by them scales to cover ``size``, then crops the centre)."""
    hw = sizes.double()  # (N, 2)
    target = torch.tensor(size, dtype=torch.float64, device=sizes.device)
    scale = (target / hw).max(1, keepdim=True).values  # (N, 1) cover factor
    box = (target / scale).round().clamp(min=1).minimum(hw)
    return torch.cat([((hw - box) / 2).floor(), box], 1).long()


def resized_crop(
    images: torch.Tensor | Sequence[torch.Tensor],
    boxes: torch.Tensor,
    size: tuple[int, int],
    interpolation: str = "bilinear",
) -> torch.Tensor:
    """uint8 ``(N, *size, C)``: image ``i`` of ``(N, H, W, C)`` or ``[(H_i, W_i, C)]`` uint8
    cropped to ``boxes[i]`` (``(N, 4)`` int64 on the CPU) and resized with antialias, bilinear
    or bicubic: torchvision v2's within 1 grey level. ConfigError on other input."""
    n, size = len(images), tuple(size)
    if n == 0 or images[0].dtype != torch.uint8 or images[0].ndim != 3:
        raise ConfigError("resized_crop expects uint8 (H, W, C) images")
    check(interpolation, "interpolation", tuple(INTERPOLATIONS))
    out = torch.empty((n, *size, images[0].shape[2]), dtype=torch.uint8, device=images[0].device)
    for i, box in enumerate(boxes.tolist()):
        crop_into(images[i], box, out[i], interpolation)
    return out


def crop_into(
    image: torch.Tensor, box, dst: torch.Tensor, interpolation="bilinear", antialias=True
) -> None:
    """``resized_crop`` of one ``(H, W, C)`` image, or of a clip's ``(T, H, W, C)`` frames
    alike, into ``dst`` (a batch's slot), no copy; ``antialias=False`` as torchvision's."""
    top, left, h, w = box
    crop = image[..., top : top + h, left : left + w, :]
    if crop.shape == dst.shape:
        dst.copy_(crop)
        return
    x, y = (t.movedim(-1, -3) for t in (crop, dst))  # (C, h, w) or (T, C, h, w) views
    x, y = (x, y) if x.ndim == 4 else (x[None], y[None])
    if dst.device.type == "cpu":  # torchvision's uint8 kernel, into the slot (no HWC copy)
        kernels = INTERPOLATIONS if antialias else SHARP
        kernels[interpolation].out(x, list(dst.shape[-3:-1]), False, out=y)
    else:  # no uint8 kernel there: float, then round (bicubic overshoots: clamped first)
        z = F.interpolate(x.float(), y.shape[-2:], mode=interpolation, antialias=antialias)
        y.copy_(z.clamp_(0, 255).round_())


def nearest_crop(x: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``x[i]`` (``(N, H, W, C)``, any dtype) cropped to ``boxes[i]``, resized to ``size`` as
    ``F.interpolate(mode="nearest")`` (one gather: values kept, for masks)."""
    dev = x.device
    boxes = boxes.to(dev, non_blocking=True)  # from pageable memory: staged, no device sync
    top, left, h, w = boxes[:, :, None].unbind(1)  # each (N, 1)
    rows = top + torch.arange(size[0], device=dev) * h // size[0]  # (N, H') source rows
    cols = left + torch.arange(size[1], device=dev) * w // size[1]  # (N, W')
    return x[torch.arange(len(x), device=dev)[:, None, None], rows[:, :, None], cols[:, None, :]]


def color_jitter_params(
    images: torch.Tensor, brightness: float, contrast: float, saturation: float, generator=None
) -> torch.Tensor:
    """``(N, 3)`` float32 factors per image, each uniform in ``[max(0, 1 - s), 1 + s]``."""
    s = torch.tensor([brightness, contrast, saturation], device=images.device)
    u = torch.rand(len(images), 3, generator=generator, device=images.device)
    low = (1 - s).clamp(min=0)
    return low + u * (1 + s - low)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """torchvision's uint8 grayscale of float ``(N, H, W, C)``, floored: ``(N, H, W, 1)``."""
    if x.shape[3] == 1:
        return x
    return (x[..., :1] * 0.2989 + x[..., 1:2] * 0.587 + x[..., 2:] * 0.114).floor_()


def color_jitter(images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Brightness, contrast, then saturation by ``factors[i]``, as torchvision v2's ``adjust_*``
    on uint8 within 1 grey level (in a fixed order). ConfigError unless 1 or 3 channels."""
    if images.shape[3] not in (1, 3):  # torchvision's adjust_* refuse them too (RGBA, say)
        raise ConfigError(f"color jitter takes 1 or 3 channels, got {tuple(images.shape)}")
    b, c, s = factors.float().T[..., None, None, None]  # each (N, 1, 1, 1)
    x = (images.float() * b).clamp_(0, 255).trunc_()
    mean = _gray(x).mean((1, 2, 3), keepdim=True)
    x = (x * c + mean * (1 - c)).clamp_(0, 255).trunc_()
    if x.shape[3] == 3:
        x = (x * s + _gray(x) * (1 - s)).clamp_(0, 255).trunc_()
    return x.to(torch.uint8)


def alternating_flip_params(indices: torch.Tensor, epoch: int, seed: int = 0) -> torch.Tensor:
    """``(N,)`` bool, airbench's alternating flip: sample ``i`` flipped in epoch 0 when a hash
    of ``(seed, i)`` says so (half of them), then in every other epoch."""
    x = indices.long() + seed * 0x9E3779B97F4A7C15 % 2**61  # int64 arithmetic wraps
    for mult, shift in ((0xBF58476D1CE4E5B9 - 2**64, 30), (0x94D049BB133111EB - 2**64, 27)):
        x = (x ^ (x >> shift)) * mult
    return ((x >> 31) & 1).bool() ^ bool(epoch % 2)


@dataclass(frozen=True)
class Draw:
    """A batch's random draws, made once (``Augment.draw``) and applied to every field that
    takes them, as torchvision v2's ``make_params``; None: that draw is off (``Draw()``: none)."""

    augment: Augment | None = None
    boxes: torch.Tensor | None = None  # (N, 4) (top, left, height, width) crops, on the CPU
    shifts: torch.Tensor | None = None  # (N, 2) crop translations (dy, dx), on the device
    flips: torch.Tensor | None = None  # (N,) bool, True: flipped left-right
    jitter: torch.Tensor | None = None  # (N, 3) brightness, contrast, saturation factors
    cutout: torch.Tensor | None = None  # (N, 2) centres of the zeroed squares
    erase: torch.Tensor | None = None  # (N, 4) Erasing's boxes, on the normalized output

    def per_clip(self, frames: int) -> Draw:
        """The draws of ``(N, ...)`` clips for their ``(N*T, ...)`` frames, each clip's alike."""
        if frames == 1:
            return self
        each = [k for k in ("shifts", "flips", "jitter", "cutout") if getattr(self, k) is not None]
        return replace(self, **{k: getattr(self, k).repeat_interleave(frames, 0) for k in each})

    def shift_and_flip(self, x: torch.Tensor) -> torch.Tensor:
        """The crop, then the flips, on ``(N, H, W, C)`` of any dtype (on the CPU ``_windows``,
        equal); ConfigError for reflect padding past the image."""
        (h, w), aug = x.shape[1:3], self.augment
        if self.shifts is not None and aug.fill == "reflect" and aug.crop >= min(h, w):
            msg = f"needs padding < {min(h, w)} for {h}x{w} images, got {aug.crop}"
            raise ConfigError(f"crop fill='reflect' {msg}")
        if x.device.type == "cpu" and (self.shifts is not None or self.flips is not None):
            return _windows(x, self.shifts, self.flips, aug.fill)
        if self.shifts is not None:
            x = translate(x, self.shifts, fill=aug.fill)
        return x if self.flips is None else flip(x, self.flips)

    def colour(self, x: torch.Tensor) -> torch.Tensor:
        """The colour jitter, then the cutout, on uint8 ``(N, H, W, C)``."""
        if self.jitter is not None:
            x = color_jitter(x, self.jitter)
        if self.cutout is not None:
            zero = _zero_squares if x.device.type == "cpu" else erase
            x = zero(x, self.cutout, self.augment.cutout)
        return x

    def mask(self, x: torch.Tensor, size: tuple[int, int] | None = None) -> torch.Tensor:
        """The geometry on a per-pixel field ``(N, H, W, C)``, to ``size`` (default: its own) by
        nearest neighbour (values kept): the crop boxes, else the centre box to resize."""
        size, boxes = tuple(size or x.shape[1:3]), self.boxes
        if boxes is None and size != tuple(x.shape[1:3]):
            boxes = centre_boxes(torch.tensor([x.shape[1:3]]).expand(len(x), 2), size)
        if boxes is not None:
            x = nearest_crop(x, boxes, size)
        return self.shift_and_flip(x)


def _like(n: int, size: tuple[int, int], device: torch.device) -> torch.Tensor:
    """An empty ``(N, H, W, 0)`` stand-in for a batch the ``*_params`` draw for (no memory)."""
    return torch.empty((n, *size, 0), dtype=torch.uint8, device=device)


_AUGMENT_RULES = dict(crop=(int, 0), flip=(float, 0, 1), cutout=(int, 0), fill=(_FILLS,))
_AUGMENT_RULES |= dict(resized_crop=(float, 0, 1), jitter=(float, 0), altflip=(bool,))


@dataclass(frozen=True)
class Augment:
    """Per-sample augmentation of uint8 ``(N, H, W, C)``: resized crop, crop, flip or altflip,
    colour jitter, cutout (ConfigError on a bad setting; ``parse(str(aug)) == aug``). ``draw``
    makes a batch's draws once (images, masks and clips alike), a ``Draw`` applies them.

    Example:
        >>> aug = Augment(crop=4, flip=0.5, cutout=8)
        >>> aug(torch.zeros(16, 32, 32, 3, dtype=torch.uint8), torch.Generator()).shape
        torch.Size([16, 32, 32, 3])
    """

    crop: int = 0  # pixels of padding on each side (0: off)
    flip: float = 0.0  # probability of a left-right flip per image
    cutout: int = 0  # side in pixels of the zeroed square (0: off)
    fill: str = "zero"  # what the crop pads with: zero or reflect
    resized_crop: float = 0.0  # smallest crop area, as RandomResizedCrop's scale=(s, 1) (0: off)
    jitter: float = 0.0  # brightness, contrast and saturation strength (0: off)
    altflip: bool = False  # alternating flip (airbench); instead of flip

    def __post_init__(self) -> None:
        for name, rule in _AUGMENT_RULES.items():  # (kind, low, high) or (values allowed,)
            object.__setattr__(self, name, check(getattr(self, name), name, *rule))
        if self.altflip and self.flip:
            raise ConfigError("choose flip or altflip, not both")

    @classmethod
    def parse(cls, spec: str) -> Augment | None:
        """``--augment``'s ``name[=value],...`` (``_AUGMENT_DEFAULTS``), None for ""/none."""
        return _parse(spec, _AUGMENT_DEFAULTS, "augmentation", cls)

    @property
    def capturable(self) -> bool:
        """Only device work, no host draws: a CUDA graph can capture it (``--graph``)."""
        return not (self.resized_crop or self.altflip)

    def draw(
        self, sizes, size, device, generator=None, host=None, *, epoch=0, indices=None, seed=0,
        crop=None,
    ) -> Draw:  # fmt: skip
        """A batch's draws for images of ``sizes`` (``(N, 2)``, CPU) that come out ``size``
        (H, W) on ``device``, in the order the generators are read: resized-crop boxes on
        ``host`` (a CPU generator), shifts and flips on ``generator`` (altflip's from the
        dataset ``indices``, ConfigError without, ``epoch`` and ``seed``), a random crop of
        ``crop`` (H, W) on ``host`` where there is no resized crop (RandomCrop's corners), then
        jitter factors and cutout centres on ``generator``."""
        n, scale = len(sizes), (self.resized_crop, 1.0)
        like = _like(n, size, device)
        boxes = resized_crop_params(sizes, scale, RATIO, host) if self.resized_crop else None
        shifts = crop_params(like, self.crop, generator) if self.crop else None
        flips = flip_params(like, self.flip, generator) if self.flip else None
        if self.altflip:
            if indices is None:
                raise ConfigError("altflip needs the samples' dataset indices (Loader passes them)")
            flips = alternating_flip_params(indices.cpu(), epoch, seed).to(device)
        spare = None if boxes is not None or crop is None else sizes - torch.tensor(crop)
        if spare is not None and bool(spare.any()):  # RandomCrop: each corner uniform
            at = (torch.rand(n, 2, generator=host, dtype=torch.float64) * (spare + 1)).long()
            boxes = torch.cat([at, torch.tensor([crop]).expand(n, 2)], 1)
        j = self.jitter
        jitter = color_jitter_params(like, j, j, j, generator) if j else None
        cutout = cutout_params(like, generator) if self.cutout else None
        return Draw(self, boxes, shifts, flips, jitter, cutout)

    def __call__(
        self, images: torch.Tensor, generator=None, *, epoch: int = 0, indices=None, seed: int = 0
    ) -> torch.Tensor:
        """``draw``, then its resized crop, crop, flips, jitter and cutout: the boxes drawn on
        ``generator`` if it is a CPU one (else torch's default), the rest on ``generator``."""
        _check_batch(images, "Augment", generator)
        n, h, w, _ = images.shape
        host = generator if generator is not None and generator.device.type == "cpu" else None
        sizes = torch.tensor([[h, w]]).expand(n, 2)
        d = self.draw(sizes, (h, w), images.device, generator, host, epoch=epoch,
                      indices=indices, seed=seed)  # fmt: skip
        images = images if d.boxes is None else resized_crop(images, d.boxes, (h, w))
        return d.colour(d.shift_and_flip(images))

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in vars(self).items() if v and v != "zero") or "crop=0"


# --augment and --mix: "name[=value],...", a bare name the CIFAR-style value (and the type) here
_AUGMENT_DEFAULTS = dict(crop=4, flip=0.5, cutout=8, fill="zero", resized_crop=0.35, jitter=0.4)
_AUGMENT_DEFAULTS["altflip"] = True
_MIX_DEFAULTS = {"mixup": 1.0, "cutmix": 1.0}  # torchvision's default alphas


def _parse(spec: str, defaults: dict, what: str, make: Callable):
    """``make(name=value, ...)`` from ``name[=value],...`` typed as ``defaults`` (else
    ConfigError); None for ""/none."""
    spec = spec.strip().lower()
    if spec in ("", "none"):
        return None
    given: dict[str, object] = {}
    for item in spec.split(","):
        name, _, value = (part.strip() for part in item.partition("="))
        if name not in defaults:
            valid = ", ".join(f"{k}[={v}]" for k, v in defaults.items())
            raise ConfigError(f"unknown {what} {name!r} in {spec!r}; valid: {valid} or none")
        if name in given:
            raise ConfigError(f"{what} {name!r} given twice in {spec!r}")
        kind = type(defaults[name])
        try:
            if kind is bool and value not in ("", "true"):  # a switch: on when named
                raise ValueError(value)
            given[name] = kind(value) if value else defaults[name]
        except ValueError:
            msg = f"{what} {name}={value!r} in {spec!r} is not a valid {kind.__name__}"
            raise ConfigError(msg) from None
    return make(**given)


# ---- after the normalize: random erasing, batch mixing -------------------------------------

_VALUES = "a number (0: the mean), a sequence of them (one per channel) or 'random'"


@dataclass(frozen=True)
class Erasing:
    """torchvision's ``RandomErasing`` per image of a float ``(N, C, H, W)`` batch, where timm
    erases: ``value`` 0 (the mean), one per channel, or ``"random"`` (normal per pixel).

    Example:
        >>> wrapped = latecast.wrap(dl, mean=MEAN, std=STD, erase=Erasing(p=0.25))
    """

    p: float = 0.5  # probability per image
    scale: tuple[float, float] = (0.02, 0.33)  # the box's area, a fraction of the image's
    ratio: tuple[float, float] = (0.3, 3.3)  # its aspect ratio (height / width), log-uniform
    value: float | tuple[float, ...] | str = 0.0

    def __post_init__(self) -> None:
        scale, ratio, v = numbers_of(self.scale), numbers_of(self.ratio), self.value
        one, many = numbers_of([v]), numbers_of(v)
        value = "random" if isinstance(v, str) and v == "random" else one[0] if one else many
        area, aspect = (x is not None and len(x) == 2 and 0 < x[0] <= x[1] for x in (scale, ratio))
        area = area and scale[1] <= 1  # a fraction of the image
        refuse([(area, "Erasing scale", self.scale, "(a, b) with 0 < a <= b <= 1")])
        refuse([(aspect, "Erasing ratio", self.ratio, "(a, b) with 0 < a <= b")])
        refuse([(value is not None, "Erasing value", v, _VALUES)])
        p = check(self.p, "Erasing p", float, 0, 1)
        for name, x in dict(p=p, scale=scale, ratio=ratio, value=value).items():
            object.__setattr__(self, name, x)

    def __call__(self, images: torch.Tensor, generator=None) -> torch.Tensor:
        _check_batch(images, "Erasing", generator, floats=True)
        n, _, h, w = images.shape
        return self.apply(images, self.params(n, (h, w), images.device, generator), generator)

    def params(self, n: int, size: tuple[int, int], device, generator=None) -> torch.Tensor:
        """``(N, 4)`` boxes for ``n`` images of ``size`` (``erasing_params``)."""
        like = _like(n, size, device).permute(0, 3, 1, 2)  # (N, 0, H, W)
        return erasing_params(like, self.p, self.scale, self.ratio, generator)

    def apply(self, images: torch.Tensor, boxes: torch.Tensor, generator=None) -> torch.Tensor:
        """``boxes`` erased on ``(N, C, H, W)``: ``"random"`` draws its values on ``generator``."""
        fill, c = self.value, images.shape[1]
        if fill == "random":
            fill = torch.randn(images.shape, generator=generator, device=images.device)
        elif isinstance(fill, tuple):
            if len(fill) not in (1, c):
                raise ConfigError(f"Erasing value {fill}: {len(fill)} values for {c} channels")
            fill = torch.tensor(fill)[:, None, None]  # (C, 1, 1)
        return erase_boxes(images, boxes, fill)


@dataclass(frozen=True)
class Mix:
    """MixUp and CutMix on a float ``(N, C, H, W)`` batch, torchvision v2's way: a weight per
    batch from Beta(alpha, alpha) (with both, one of the two), each image mixed with the one
    before it, labels made class probabilities. Host draws seeded from the batch's generator.

    Example:
        >>> mix = Mix(classes=10, mixup=0.2)
        >>> x, y = mix(torch.zeros(8, 3, 32, 32), torch.arange(8), torch.Generator())
        >>> y.shape
        torch.Size([8, 10])
    """

    classes: int = 2  # number of classes
    mixup: float = 0.0  # MixUp's Beta alpha (0: off)
    cutmix: float = 0.0  # CutMix's Beta alpha (0: off)

    def __post_init__(self) -> None:
        for name, rule in dict(classes=(int, 1), mixup=(float, 0), cutmix=(float, 0)).items():
            object.__setattr__(self, name, check(getattr(self, name), name, *rule))

    @classmethod
    def parse(cls, spec: str, classes: int) -> Mix | None:
        """``--mix``'s ``mixup[=alpha],cutmix[=alpha]`` (1.0), None for ""/none."""
        return _parse(spec, _MIX_DEFAULTS, "mix", lambda **given: cls(classes, **given))

    def __str__(self) -> str:
        on = (f"{k}={v}" for k, v in vars(self).items() if v and k != "classes")
        return ",".join(on) or "mixup=0"

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, generator=None):
        """``(images, (N, classes) soft labels)`` from ``(N,)`` labels in ``0..classes-1``."""
        _check_batch(images, "Mix", None, floats=True)
        dtype = labels.dtype if torch.is_tensor(labels) else None
        if dtype in (None, torch.bool) or dtype.is_floating_point or dtype.is_complex:
            raise ConfigError(f"Mix expects integer labels, got {labels!r:.60}")
        if labels.shape != images.shape[:1]:
            raise ConfigError(f"Mix: {tuple(labels.shape)} labels for {len(images)} images")
        if labels.device.type == "cpu" and len(labels):  # on CUDA it would sync
            low, high = int(labels.min()), int(labels.max())
            if low < 0 or high >= self.classes:
                raise ConfigError(f"Mix: labels {low}..{high} outside 0..{self.classes - 1}")
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))  # a CPU draw: no sync
        rng = np.random.default_rng(seed)
        cut = self.cutmix > 0 and (self.mixup == 0 or rng.random() < 0.5)
        alpha = self.cutmix if cut else self.mixup
        lam = float(rng.beta(alpha, alpha)) if alpha else 1.0  # both 0 (off): labels only
        other = images.roll(1, 0)
        if cut:  # torchvision's CutMix box: centre anywhere, sides sqrt(1 - lam) of the image
            h, w = images.shape[-2:]
            cy, cx, r = int(rng.integers(h)), int(rng.integers(w)), 0.5 * math.sqrt(1 - lam)
            y0, y1 = max(cy - int(r * h), 0), min(cy + int(r * h), h)
            x0, x1 = max(cx - int(r * w), 0), min(cx + int(r * w), w)
            images = images.clone()
            images[..., y0:y1, x0:x1] = other[..., y0:y1, x0:x1]
            lam = 1.0 - (y1 - y0) * (x1 - x0) / (h * w)
        elif self.mixup:
            images = images * lam + other * (1 - lam)
        soft = F.one_hot(labels.long(), self.classes).float()  # (N, classes); int64 only
        return images, soft * lam + soft.roll(1, 0) * (1 - lam)
