"""Pure batched transforms on the device.

Every function takes a whole batch and returns a new tensor; randomness is drawn per
sample on ``images.device`` from an optional ``torch.Generator``. Images are uint8
``(N, H, W, C)`` as they come off the bus; ``normalize`` is the last step and produces
``(N, C, H, W)`` floats. A random op has two halves, as in torchvision v2: ``*_params``
draws each image's parameters, and a pure function applies them (``translate``, ``flip``,
``erase``, ``color_jitter``, ``resized_crop``). ``Augment`` chains them on the uint8 batch
(on a CPU device by copies of whole rows, ``_windows`` and ``_zero_squares``: the same
pixels); ``Erasing`` and ``Mix`` (MixUp, CutMix) run after ``normalize``, on floats.

A batch is checked once, where it comes in: by ``Augment``, ``Erasing``, ``Mix``, the Loader
and ``wrap``; the applying halves and ``Augment.pixels`` take it checked.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .errors import ConfigError, check, numbers_of, refuse

FLOATS = (torch.float32, torch.bfloat16, torch.float16)  # what images come out in
_affine_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_CPU_CHUNK = 2**19  # bytes of uint8 images per addcmul on the CPU: its float copy stays in cache


def _scale_shift(
    mean: tuple[float, ...], std: tuple[float, ...], channels: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x/255 - mean)/std == x*scale + shift``; built (and checked) once per (device,
    channels, mean, std)."""
    try:
        key = (str(device), channels, tuple(map(float, mean)), tuple(map(float, std)))
    except (TypeError, ValueError):
        raise ConfigError(
            f"normalize: mean and std must be sequences of numbers, got {mean!r:.60}/{std!r:.60}"
        ) from None
    if key not in _affine_cache:
        m, s = key[2], key[3]
        if len(m) == len(s) == 1:  # one value for every channel, as torchvision's Normalize
            m, s = m * channels, s * channels
        if not (len(m) == len(s) == channels and all(map(math.isfinite, m + s)) and min(s) > 0):
            raise ConfigError(
                f"normalize: {channels} channels need {channels} (or 1) finite mean and std "
                f"values (std > 0), got {mean}/{std}"
            )
        m, s = torch.tensor(m, dtype=torch.float64), torch.tensor(s, dtype=torch.float64)
        scale = (1.0 / (255.0 * s)).to(device, torch.float32).view(1, -1, 1, 1)  # (1, C, 1, 1)
        shift = (-m / s).to(device, torch.float32).view(1, -1, 1, 1)
        _affine_cache[key] = (scale, shift)
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
    """uint8 ``(N, H, W, C)`` -> normalized ``(N, C, H, W)`` in ``dtype``, in one fused op.

    Equals torchvision's ``ToTensor()`` + ``Normalize(mean, std)`` within 1e-6 in float32:
    ``x * scale + shift`` with constants computed in float64, written straight into the
    output by one ``addcmul`` (on the CPU ``_CPU_CHUNK`` bytes of images at a time). The
    values are part of the resume contract (``tests/test_resume_compat.py``): keep the op.

    Args:
        images: uint8 ``(N, H, W, C)`` on any device.
        mean, std: per-channel statistics in [0, 1] units.
        dtype: float32, bfloat16 or float16 (computed in float32, rounded once at the end).
        channels_last: return ``torch.channels_last`` memory format (NHWC in memory).
        out: write here instead (``(N, C, H, W)``, its own dtype and layout win): a static
            buffer reused every batch.

    Example:
        >>> x = torch.randint(0, 256, (8, 28, 28, 1), dtype=torch.uint8)
        >>> normalize(x, (0.1307,), (0.3081,)).shape
        torch.Size([8, 1, 28, 28])
    """
    if not (isinstance(images, torch.Tensor) and images.dtype == torch.uint8 and images.ndim == 4):
        _check_batch(images, "normalize", None)  # (the Loader and wrap checked theirs)
    flag = isinstance(channels_last, (bool, np.bool_))
    refuse([(flag, "channels_last", channels_last, "a bool")])
    n, h, w, c = images.shape
    if out is None:
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        dtype = check(dtype, "normalize dtype", FLOATS)
        out = torch.empty((n, c, h, w), dtype=dtype, device=images.device, memory_format=fmt)
    refuse([(isinstance(out, torch.Tensor), "normalize out", out, "a tensor or None")])
    check(out.dtype, "normalize dtype", FLOATS)
    if out.shape != (n, c, h, w):
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
    """uint8 ``(N, H, W, C)`` images (``floats``: normalized ``(N, C, H, W)``, what ``Mix``
    and ``Erasing`` take) and a generator on their device, or one ConfigError."""
    tensor = isinstance(images, torch.Tensor)
    kind = tensor and (images.is_floating_point() if floats else images.dtype == torch.uint8)
    if not (kind and images.ndim == 4):
        got = f"{images.dtype} {tuple(images.shape)}" if tensor else type(images).__name__
        want = "a float tensor (N, C, H, W)" if floats else "a uint8 tensor (N, H, W, C)"
        raise ConfigError(f"{fn} expects {want}, got {got}")
    gen = generator is None or isinstance(generator, torch.Generator)
    refuse([(gen, f"{fn}: generator", generator, "a torch.Generator or None")])
    if generator is not None and generator.device.type != images.device.type:
        raise ConfigError(
            f"{fn}: the generator is on {generator.device} but the images are on "
            f"{images.device}; create it with torch.Generator(device=images.device)"
        )


def crop_params(images: torch.Tensor, padding: int, generator=None) -> torch.Tensor:
    """``(N, 2)`` int64 ``(dy, dx)`` in ``-padding..padding``: each image's translation."""
    n, dev = len(images), images.device
    return torch.randint(0, 2 * padding + 1, (n, 2), generator=generator, device=dev) - padding


def translate(images: torch.Tensor, shifts: torch.Tensor, *, fill: str = "zero") -> torch.Tensor:
    """Move image ``i`` by ``shifts[i] = (dy, dx)``: output pixel ``(y, x)`` is input pixel
    ``(y + dy, x + dx)``; outside the image 0 (``fill="zero"``) or mirrored as ``np.pad``'s
    ``"reflect"``. A crop of the padded image at a random offset is ``crop_params``'s shift."""
    n, h, w, _ = images.shape
    check(fill, "fill", _FILLS)
    dev = images.device
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
    """``(N, 2)`` int64 ``(cy, cx)``: each square's center, anywhere in the image."""
    n, h, w, _ = images.shape
    cy = torch.randint(0, h, (n,), generator=generator, device=images.device)
    cx = torch.randint(0, w, (n,), generator=generator, device=images.device)
    return torch.stack([cy, cx], 1)


def erase(images: torch.Tensor, centers: torch.Tensor, size: int) -> torch.Tensor:
    """Zero a ``size x size`` square per image: rows ``cy - size//2 .. cy - size//2 + size - 1``
    (columns alike) around ``centers[i] = (cy, cx)``, clipped at the borders."""
    _, h, w, _ = images.shape
    top_left = centers - size // 2  # (N, 2)
    ys, xs = torch.arange(h, device=images.device), torch.arange(w, device=images.device)
    in_y = (ys >= top_left[:, :1]) & (ys < top_left[:, :1] + size)  # (N, H)
    in_x = (xs >= top_left[:, 1:]) & (xs < top_left[:, 1:] + size)  # (N, W)
    return images.masked_fill(in_y[:, :, None, None] & in_x[:, None, :, None], 0)


def _windows(x: torch.Tensor, shifts, flips, fill: str) -> torch.Tensor:
    """``translate``, then ``flip`` (either None: off), equal to them, by copies of whole rows
    (a gather copies one value at a time on the CPU): pad once, add the flipped images
    flipped (one moved by ``dx`` is its flip moved by ``-dx``), then one ``index_select`` of
    overlapping windows of that buffer."""
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
    """``erase``, equal to it, the CPU's way: only the squares' pixels are written, by index
    (``masked_fill`` reads a mask of every pixel)."""
    n, h, w, c = images.shape
    lo = (centers - size // 2).clamp(min=0)[:, :, None]  # (N, 2, 1) first row and column
    hi = (centers - size // 2 + size).minimum(torch.tensor([h, w]))[:, :, None] - 1  # last
    ys, xs = (lo + torch.arange(min(size, max(h, w)))).minimum(hi).unbind(1)  # each (N, S)
    at = (torch.arange(n)[:, None, None] * h + ys[:, :, None]) * w + xs[:, None, :]  # pixels
    return images.clone().view(-1, c).index_fill_(0, at.view(-1), 0).view(images.shape)


def erasing_params(images: torch.Tensor, p: float, scale, ratio, generator=None) -> torch.Tensor:
    """``(N, 4)`` int64 ``(top, left, height, width)``: torchvision ``RandomErasing``'s draw
    for normalized ``(N, C, H, W)`` images, batched: with probability ``p``, the first of 10
    tries of an area in ``scale`` (of H * W) and a log-uniform aspect ratio in ``ratio`` that
    fits; height and width 0 where an image is not erased."""
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
    """Each image's box ``(top, left, height, width)`` set to ``fill`` (a number, a
    per-channel ``(C, 1, 1)`` or per-pixel ``(N, C, H, W)`` tensor): torchvision's
    ``F.erase(image, top, left, height, width, v)``, for the whole batch at once."""
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
INTERPOLATIONS = {  # name -> torch's uint8 kernel on the CPU (torchvision v2 uses the same)
    "bilinear": torch.ops.aten._upsample_bilinear2d_aa,
    "bicubic": torch.ops.aten._upsample_bicubic2d_aa,
}


def resized_crop_params(
    sizes: torch.Tensor, scale: tuple[float, float], ratio=RATIO, generator=None
) -> torch.Tensor:
    """``(N, 4)`` int64 ``(top, left, height, width)``: torchvision's RandomResizedCrop box
    for each image of ``sizes`` (``(N, 2)`` ``(H, W)``), on ``sizes.device``: the first of 10
    tries (area fraction in ``scale``, log-uniform aspect in ``ratio``) that fits, placed
    uniformly; if none fits, the centre crop with the aspect ratio clamped to ``ratio``."""
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
    """``(N, 4)`` boxes that ``resized_crop`` turns into "scale to cover ``size``, then crop
    the centre" (what ``latecast convert`` does for raw stores): the largest centred box
    with the aspect ratio of ``size``."""
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
    """Crop image ``i`` to ``boxes[i] = (top, left, height, width)`` and resize it to ``size``
    (H, W) with antialias, ``interpolation`` bilinear or bicubic: torchvision v2's
    ``resized_crop`` within 1 grey level. ``images``: uint8 ``(N, H, W, C)`` or a sequence of
    ``(H_i, W_i, C)``; ``boxes``: ``(N, 4)`` int64 on the CPU. Each crop is resized on its
    own, into its slot (``crop_into``)."""
    n, size = len(images), tuple(size)
    if n == 0 or images[0].dtype != torch.uint8 or images[0].ndim != 3:
        raise ConfigError("resized_crop expects uint8 (H, W, C) images")
    check(interpolation, "interpolation", tuple(INTERPOLATIONS))
    out = torch.empty((n, *size, images[0].shape[2]), dtype=torch.uint8, device=images[0].device)
    for i, box in enumerate(boxes.tolist()):
        crop_into(images[i], box, out[i], interpolation)
    return out


def crop_into(image: torch.Tensor, box, dst: torch.Tensor, interpolation="bilinear") -> None:
    """``resized_crop`` of one ``(H, W, C)`` image, or of a clip's ``(T, H, W, C)`` frames
    alike, into ``dst`` (``(H', W', C)`` or ``(T, H', W', C)``, e.g. a slot of a batch), no
    other copy."""
    top, left, h, w = box
    crop = image[..., top : top + h, left : left + w, :]
    if crop.shape == dst.shape:
        dst.copy_(crop)
        return
    x, y = (t.movedim(-1, -3) for t in (crop, dst))  # (C, h, w) or (T, C, h, w) views
    x, y = (x, y) if x.ndim == 4 else (x[None], y[None])
    if dst.device.type == "cpu":  # torchvision's uint8 kernel, into the slot: its
        # channels-last strides spare a planar result's HWC copy
        INTERPOLATIONS[interpolation].out(x, list(dst.shape[-3:-1]), False, out=y)
    else:  # no uint8 kernel there: float, then round (bicubic overshoots: clamped first)
        z = F.interpolate(
            x.float(), y.shape[-2:], mode=interpolation, antialias=True, align_corners=False
        )
        y.copy_(z.clamp_(0, 255).round_())


def nearest_crop(x: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Crop ``x[i]`` (``(N, H, W, C)``, any dtype) to ``boxes[i] = (top, left, height, width)``
    and resize it to ``size`` by nearest neighbour, as ``F.interpolate(mode="nearest")``
    (output pixel ``d`` reads ``floor(d * in / out)``): one gather, values kept (masks)."""
    dev = x.device
    boxes = boxes.to(dev, non_blocking=True)  # from pageable memory: staged, no device sync
    top, left, h, w = boxes[:, :, None].unbind(1)  # each (N, 1)
    rows = top + torch.arange(size[0], device=dev) * h // size[0]  # (N, H') source rows
    cols = left + torch.arange(size[1], device=dev) * w // size[1]  # (N, W')
    return x[torch.arange(len(x), device=dev)[:, None, None], rows[:, :, None], cols[:, None, :]]


def color_jitter_params(
    images: torch.Tensor, brightness: float, contrast: float, saturation: float, generator=None
) -> torch.Tensor:
    """``(N, 3)`` float32 factors per image, each uniform in ``[max(0, 1 - s), 1 + s]``
    (torchvision's ``ColorJitter`` ranges) for brightness, contrast and saturation."""
    s = torch.tensor([brightness, contrast, saturation], device=images.device)
    u = torch.rand(len(images), 3, generator=generator, device=images.device)
    low = (1 - s).clamp(min=0)
    return low + u * (1 + s - low)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """torchvision's uint8 grayscale of float ``(N, H, W, C)`` values, floored: ``(N, H, W, 1)``."""
    if x.shape[3] == 1:
        return x
    return (x[..., :1] * 0.2989 + x[..., 1:2] * 0.587 + x[..., 2:] * 0.114).floor_()


def color_jitter(images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Brightness, then contrast, then saturation (a fixed order; torchvision's ``ColorJitter``
    shuffles it) by ``factors[i]`` (``(N, 3)``) per image, each torchvision v2's ``adjust_*``
    on uint8 within 1 grey level. Saturation leaves 1-channel images as they are."""
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
    """``(N,)`` bool on ``indices.device``: airbench's alternating flip. Dataset sample ``i``
    is flipped in epoch 0 when a hash of ``(seed, i)`` says so (half of them), and in every
    later epoch exactly when it was not in the one before."""
    x = indices.long() + seed * 0x9E3779B97F4A7C15 % 2**61  # int64 arithmetic wraps
    for mult, shift in ((0xBF58476D1CE4E5B9 - 2**64, 30), (0x94D049BB133111EB - 2**64, 27)):
        x = (x ^ (x >> shift)) * mult
    return ((x >> 31) & 1).bool() ^ bool(epoch % 2)


@dataclass(frozen=True)
class Moves:
    """One batch's geometric draws of an ``Augment`` (None where off), drawn once and applied
    alike to its images and to their per-pixel fields (``wrap``'s masks)."""

    augment: Augment | None  # None: no draw (a mask only resized to its JPEG images' size)
    boxes: torch.Tensor | None  # (N, 4) resized-crop (top, left, height, width), on the CPU
    shifts: torch.Tensor | None  # (N, 2) crop translations (dy, dx), on the batch's device
    flips: torch.Tensor | None  # (N,) bool, True: flipped left-right

    def shift_and_flip(self, x: torch.Tensor) -> torch.Tensor:
        """The crop, then the flips, on ``(N, H, W, C)`` of any dtype: gathers, or on the CPU
        copies of rows (``_windows``); exact either way."""
        (h, w), aug = x.shape[1:3], self.augment  # reflect: the one setting the size limits
        if self.shifts is not None and aug.fill == "reflect" and aug.crop >= min(h, w):
            msg = f"needs padding < {min(h, w)} for {h}x{w} images, got {aug.crop}"
            raise ConfigError(f"crop fill='reflect' {msg}")
        if x.device.type == "cpu" and (self.shifts is not None or self.flips is not None):
            return _windows(x, self.shifts, self.flips, self.augment.fill)
        if self.shifts is not None:
            x = translate(x, self.shifts, fill=self.augment.fill)
        return x if self.flips is None else flip(x, self.flips)

    def mask(self, x: torch.Tensor, size: tuple[int, int] | None = None) -> torch.Tensor:
        """All of them on a per-pixel field ``(N, H, W, C)`` of any dtype, to ``size`` (default:
        its own), the resized crop (else the centre boxes, for another size) by nearest
        neighbour: every value is one of the field's, never a blend."""
        size, boxes = tuple(size or x.shape[1:3]), self.boxes
        if boxes is None and size != tuple(x.shape[1:3]):
            boxes = centre_boxes(torch.tensor([x.shape[1:3]]).expand(len(x), 2), size)
        if boxes is not None:
            x = nearest_crop(x, boxes, size)
        return self.shift_and_flip(x)


_AUGMENT_NUMBERS = dict(crop=(int, None), flip=(float, 1), cutout=(int, None))
_AUGMENT_NUMBERS |= dict(resized_crop=(float, 1), jitter=(float, None))  # kind, upper bound


@dataclass(frozen=True)
class Augment:
    """Per-sample augmentation of uint8 ``(N, H, W, C)`` batches: resized crop -> crop ->
    flip or alternating flip -> colour jitter -> cutout. Settings are checked on
    construction; ``Augment.parse(str(aug)) == aug``.

    ``moves`` draws the geometric part once per batch, so masks can follow the images
    (``Moves.mask``); the resized crop is applied first (JPEG batches: while decoding), then
    ``pixels`` does the rest, on the images' device.

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
        for name, (kind, high) in _AUGMENT_NUMBERS.items():  # each >= 0
            object.__setattr__(self, name, check(getattr(self, name), name, kind, 0, high))
        object.__setattr__(self, "fill", check(self.fill, "fill", _FILLS))
        check(self.altflip, "altflip", bool)
        if self.altflip and self.flip:
            raise ConfigError("choose flip or altflip, not both")

    @classmethod
    def parse(cls, spec: str) -> Augment | None:
        """An ``Augment`` from the command line's ``--augment``, None for ``""`` or ``"none"``:
        comma-separated names, each optionally ``=value`` (else ``_AUGMENT_DEFAULTS``'s).

        Example:
            >>> Augment.parse("crop=2,flip") == Augment(crop=2, flip=0.5)
            True
        """
        given = _parse(spec, _AUGMENT_DEFAULTS, "augmentation")
        return None if given is None else cls(**given)

    @property
    def capturable(self) -> bool:
        """Only device work, no host draws: a CUDA graph can capture it (``--graph``)."""
        return not (self.resized_crop or self.altflip)

    def crop_boxes(self, sizes: torch.Tensor, generator=None) -> torch.Tensor | None:
        """RandomResizedCrop boxes for images of ``sizes`` (``(N, 2)``, CPU), drawn on the CPU
        ``generator``; None when off."""
        if not self.resized_crop:
            return None
        return resized_crop_params(sizes, (self.resized_crop, 1.0), RATIO, generator)

    def moves(
        self, images, sizes, generator=None, host=None, *, epoch=0, indices=None, seed=0
    ) -> Moves:
        """The geometric draws for ``images`` of ``sizes`` (``(N, 2)`` (H, W) as they come,
        CPU): resized-crop boxes on ``host`` (a CPU generator), then crop shifts and flips on
        ``generator`` (altflip: from the dataset ``indices``, ``epoch`` and ``seed``)."""
        boxes = self.crop_boxes(sizes, host)
        shifts = crop_params(images, self.crop, generator) if self.crop else None
        flips = flip_params(images, self.flip, generator) if self.flip else None
        if self.altflip:
            if indices is None:
                raise ConfigError("altflip needs the samples' dataset indices (Loader passes them)")
            flips = alternating_flip_params(indices.cpu(), epoch, seed)  # one byte per image:
            flips = flips.to(images.device)  # no pinning per batch for that
        return Moves(self, boxes, shifts, flips)

    def __call__(
        self, images: torch.Tensor, generator=None, *, epoch: int = 0, indices=None, seed: int = 0
    ) -> torch.Tensor:
        """All of it: the boxes drawn on ``generator`` if it is a CPU one, else on torch's
        default CPU generator; the rest on ``generator``."""
        _check_batch(images, "Augment", generator)
        n, h, w, _ = images.shape
        cpu = generator is not None and generator.device.type == "cpu"
        sizes, host = torch.tensor([[h, w]]).expand(n, 2), generator if cpu else None
        moves = self.moves(images, sizes, generator, host, epoch=epoch, indices=indices, seed=seed)
        if moves.boxes is not None:
            images = resized_crop(images, moves.boxes, (h, w))
        return self.pixels(images, moves, generator)

    def pixels(self, images: torch.Tensor, moves: Moves, generator=None) -> torch.Tensor:
        """Everything after the resized crop, on a checked batch: the crop and flips of
        ``moves``, then colour jitter and cutout drawn on ``generator``."""
        images = moves.shift_and_flip(images)
        if self.jitter:
            j = self.jitter
            images = color_jitter(images, color_jitter_params(images, j, j, j, generator))
        if self.cutout:
            zero = _zero_squares if images.device.type == "cpu" else erase
            images = zero(images, cutout_params(images, generator), self.cutout)
        return images

    def __str__(self) -> str:
        on = [f"{k}={v}" for k, v in vars(self).items() if v and v != "zero"]
        return ",".join(on) or "crop=0"


# ---- the --augment and --mix mini-languages: "name[=value],..." --------------------------

# The value of a name given without "=value" (CIFAR-style settings); also gives its type.
_AUGMENT_DEFAULTS = dict(crop=4, flip=0.5, cutout=8, fill="zero", resized_crop=0.35, jitter=0.4)
_AUGMENT_DEFAULTS["altflip"] = True
_MIX_DEFAULTS = {"mixup": 1.0, "cutmix": 1.0}  # torchvision's default alphas


def _parse(spec: str, defaults: dict, what: str) -> dict | None:
    """``name[=value],...`` -> ``{name: value}`` typed as ``defaults``; None for ""/none."""
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
            raise ConfigError(
                f"{what} {name}={value!r} in {spec!r} is not a valid {kind.__name__}"
            ) from None
    return given


# ---- after the normalize: random erasing, batch mixing -------------------------------------


_VALUES = "a number (0: the mean), a sequence of them (one per channel) or 'random'"


def _rising(pair: tuple | None) -> bool:
    """Two numbers ``0 < a <= b`` (``numbers_of``: finite)."""
    return pair is not None and len(pair) == 2 and 0 < pair[0] <= pair[1]


@dataclass(frozen=True)
class Erasing:
    """torchvision's ``RandomErasing`` per image, on the normalized ``(N, C, H, W)`` batch
    (where timm's prefetch loader erases, ``--reprob``): ``value`` 0 (the mean), a value per
    channel, or ``"random"``: normal per pixel (timm's ``--remode pixel``).

    Example:
        >>> wrapped = latecast.wrap(dl, mean=MEAN, std=STD, erase=Erasing(p=0.25))
    """

    p: float = 0.5  # probability per image
    scale: tuple[float, float] = (0.02, 0.33)  # the box's area, a fraction of the image's
    ratio: tuple[float, float] = (0.3, 3.3)  # its aspect ratio (height / width), log-uniform
    value: float | tuple[float, ...] | str = 0.0

    def __post_init__(self) -> None:
        scale, ratio, value = numbers_of(self.scale), numbers_of(self.ratio), self.value
        word = isinstance(value, str)
        one = None if word else numbers_of([value] if isinstance(value, numbers.Real) else ())
        many = None if word else numbers_of(value)
        area = _rising(scale) and scale[1] <= 1
        refuse(
            [
                (area, "Erasing scale", self.scale, "(a, b) with 0 < a <= b <= 1"),
                (_rising(ratio), "Erasing ratio", self.ratio, "(a, b) with 0 < a <= b"),
                (value == "random" if word else one or many, "Erasing value", value, _VALUES),
            ]
        )
        fields = dict(p=check(self.p, "Erasing p", float, 0, 1), scale=scale, ratio=ratio)
        for name, v in {**fields, "value": value if word else one[0] if one else many}.items():
            object.__setattr__(self, name, v)

    def __call__(self, images: torch.Tensor, generator=None) -> torch.Tensor:
        _check_batch(images, "Erasing", generator, floats=True)
        boxes = erasing_params(images, self.p, self.scale, self.ratio, generator)
        fill = self.value
        if fill == "random":
            fill = torch.randn(images.shape, generator=generator, device=images.device)
        elif isinstance(fill, tuple):
            if len(fill) not in (1, images.shape[1]):
                raise ConfigError(
                    f"Erasing value {fill}: {len(fill)} values for {images.shape[1]} channels"
                )
            fill = torch.tensor(fill)[:, None, None]  # (C, 1, 1)
        return erase_boxes(images, boxes, fill)


@dataclass(frozen=True)
class Mix:
    """MixUp and CutMix on a normalized batch, torchvision v2's way: one weight per batch
    from Beta(alpha, alpha), each image mixed with the one before it in the batch, labels
    turned into class probabilities (``cross_entropy`` takes them). With both on, each batch
    gets one of the two. The draws are host numbers seeded from the batch's generator: no
    device sync, and a resumed run draws the same.

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
        object.__setattr__(self, "classes", check(self.classes, "classes", int, 1))
        for name in ("mixup", "cutmix"):
            object.__setattr__(self, name, check(getattr(self, name), name, float, 0))

    @classmethod
    def parse(cls, spec: str, classes: int) -> Mix | None:
        """A ``Mix`` of ``classes`` from the command line's ``--mix`` (``"mixup=0.2"``,
        ``"cutmix"``, ``"mixup,cutmix"``: alpha 1.0 where none is given), None for ``""`` or
        ``"none"``."""
        given = _parse(spec, _MIX_DEFAULTS, "mix")
        return None if given is None else cls(classes, **given)

    def __str__(self) -> str:
        on = [f"{k}={v}" for k, v in vars(self).items() if v and k != "classes"]
        return ",".join(on) or "mixup=0"

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, generator=None):
        self._check(images, labels)
        labels = labels.long()  # one_hot takes int64 only
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
        soft = F.one_hot(labels, self.classes).float()  # (N, classes)
        return images, soft * lam + soft.roll(1, 0) * (1 - lam)

    def _check(self, images, labels) -> None:
        """Float ``(N, C, H, W)`` images, ``(N,)`` integer labels in ``0..classes-1``, the range
        checked on the CPU only (on CUDA it would sync; ``one_hot`` asserts there)."""
        _check_batch(images, "Mix", None, floats=True)
        dtype = labels.dtype if torch.is_tensor(labels) else None
        if dtype in (None, torch.bool) or dtype.is_floating_point or dtype.is_complex:
            raise ConfigError(f"Mix expects integer labels, got {labels!r:.60}")
        if labels.shape != images.shape[:1]:
            raise ConfigError(f"Mix: {tuple(labels.shape)} labels for {len(images)} images")
        if labels.device.type == "cpu" and len(labels):
            low, high = int(labels.min()), int(labels.max())
            if low < 0 or high >= self.classes:
                raise ConfigError(
                    f"Mix: labels {low}..{high} outside 0..{self.classes - 1} (its classes)"
                )
