"""Pure batched transforms on the device.

Every function takes a whole batch and returns a new tensor; randomness is drawn per
sample on ``images.device`` from an optional ``torch.Generator``. Input images are uint8
``(N, H, W, C)`` as they come off the bus; ``normalize`` is the last step and produces
``(N, C, H, W)`` floats.

Augmentation (``random_crop``, ``random_flip``, ``cutout``, ``Augment``) runs on the uint8
batch *before* ``normalize``: one index or mask kernel per op for the whole batch, no
Python loop over images, and each image gets its own random parameters (torchvision v2
draws one set per batch; Kornia rejects uint8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import option, validate
from .errors import ConfigError

_affine_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


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
        if (
            len(m) != channels
            or len(s) != channels
            or not all(map(math.isfinite, m + s))
            or min(s) <= 0
        ):
            raise ConfigError(
                f"normalize: {channels} channels need {channels} finite mean and std values "
                f"(std > 0), got {mean}/{std}"
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
) -> torch.Tensor:
    """uint8 ``(N, H, W, C)`` -> normalized ``(N, C, H, W)`` in ``dtype``, in one fused op.

    Equals torchvision's ``ToTensor()`` + ``Normalize(mean, std)`` within 1e-6 in float32:
    the two divisions fold into one multiply-add (``addcmul``) with constants computed in
    float64, so the only rounding is float32's own.

    Args:
        images: uint8 ``(N, H, W, C)`` on any device.
        mean, std: per-channel statistics in [0, 1] units.
        dtype: float32, bfloat16 or float16 (computed in float32, rounded once at the end).
        channels_last: return ``torch.channels_last`` memory format (NHWC in memory).

    Example:
        >>> x = torch.randint(0, 256, (8, 28, 28, 1), dtype=torch.uint8)
        >>> normalize(x, (0.1307,), (0.3081,)).shape
        torch.Size([8, 1, 28, 28])
    """
    if images.dtype != torch.uint8 or images.ndim != 4:
        raise ConfigError(
            f"normalize expects uint8 (N, H, W, C), got {images.dtype} "
            f"with shape {tuple(images.shape)}"
        )
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ConfigError(f"normalize dtype must be float32, bfloat16 or float16, got {dtype}")
    scale, shift = _scale_shift(mean, std, images.shape[3], images.device)
    x = images.permute(0, 3, 1, 2)  # (N, H, W, C) -> (N, C, H, W) view, NHWC in memory
    out = torch.addcmul(shift, x.float(), scale)  # one elementwise kernel (plus the cast)
    # addcmul follows the input's NHWC strides; make the layout what was asked for.
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return out.to(dtype=dtype, memory_format=fmt)


# ---- augmentation: uint8 (N, H, W, C) in, same shape and dtype out ----------------------

_FILLS = ("zero", "reflect")


def _check_batch(images: torch.Tensor, fn: str, generator: torch.Generator | None) -> None:
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.ndim != 4:
        got = (
            f"{images.dtype} with shape {tuple(images.shape)}"
            if isinstance(images, torch.Tensor)
            else type(images).__name__
        )
        raise ConfigError(f"{fn} expects a uint8 tensor (N, H, W, C), got {got}")
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
    ``(y + dy, x + dx)``; outside the image it is 0 (``fill="zero"``) or mirrored like
    ``np.pad(mode="reflect")``. One gather with per-image row/column indices."""
    _check_batch(images, "translate", None)
    n, h, w, _ = images.shape
    if fill not in _FILLS:
        raise ConfigError(f"fill must be one of {_FILLS}, got {fill!r}")
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
    _check_batch(images, "flip", None)
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
    _check_batch(images, "erase", None)
    _, h, w, _ = images.shape
    top_left = centers - size // 2  # (N, 2)
    ys, xs = torch.arange(h, device=images.device), torch.arange(w, device=images.device)
    in_y = (ys >= top_left[:, :1]) & (ys < top_left[:, :1] + size)  # (N, H)
    in_x = (xs >= top_left[:, 1:]) & (xs < top_left[:, 1:] + size)  # (N, W)
    return images.masked_fill(in_y[:, :, None, None] & in_x[:, None, :, None], 0)


def _reflect(i: torch.Tensor, n: int) -> torch.Tensor:
    """Mirror ``-(n-1)..2(n-1)`` into ``0..n-1`` without repeating the edge, as ``np.pad``."""
    return (n - 1) - ((n - 1) - i.abs()).abs()


def _check_int(value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{what} must be an int >= 0, got {value!r}")


def random_crop(images: torch.Tensor, padding: int, *, fill="zero", generator=None):
    """Pad each side by ``padding``, then crop back to ``(H, W)`` at a random offset per image
    (``translate`` by ``crop_params``; the padded batch is never built). ``fill="reflect"``
    mirrors like ``np.pad`` and needs ``padding < min(H, W)``; 0 returns a copy.

    Example:
        >>> x = torch.randint(0, 256, (8, 32, 32, 3), dtype=torch.uint8)
        >>> random_crop(x, 4, fill="reflect").shape
        torch.Size([8, 32, 32, 3])
    """
    _check_batch(images, "random_crop", generator)
    _, h, w, _ = images.shape
    _check_int(padding, "random_crop padding")
    if fill == "reflect" and padding >= min(h, w):
        raise ConfigError(
            f"random_crop fill='reflect' needs padding < {min(h, w)} for {h}x{w} "
            f"images, got {padding}"
        )
    if padding == 0:
        return images.clone()
    return translate(images, crop_params(images, padding, generator), fill=fill)


def random_flip(images: torch.Tensor, p: float = 0.5, *, generator=None) -> torch.Tensor:
    """Flip each image left-right with probability ``p``, independently per image."""
    _check_batch(images, "random_flip", generator)
    if isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ConfigError(f"random_flip p must be a probability in [0, 1], got {p!r}")
    return flip(images, flip_params(images, p, generator))


def cutout(images: torch.Tensor, size: int, *, generator=None) -> torch.Tensor:
    """Zero a ``size x size`` square at a random center per image (DeVries & Taylor, 2017):
    ``erase`` at ``cutout_params``. ``size`` 0 returns a copy."""
    _check_batch(images, "cutout", generator)
    _check_int(size, "cutout size")
    if size == 0:
        return images.clone()
    return erase(images, cutout_params(images, generator), size)


@dataclass(frozen=True)
class Augment:
    """Per-sample augmentation of uint8 ``(N, H, W, C)`` batches: crop -> flip -> cutout.
    Settings are checked on construction; ``parse_augment(str(aug)) == aug``.

    Example:
        >>> aug = Augment(crop=4, flip=0.5, cutout=8)
        >>> aug(torch.zeros(16, 32, 32, 3, dtype=torch.uint8), torch.Generator()).shape
        torch.Size([16, 32, 32, 3])
    """

    crop: int = option(0, "pixels of padding on each side (0: off)", low=0)
    flip: float = option(0.0, "probability of a left-right flip per image", low=0, high=1)
    cutout: int = option(0, "side in pixels of the zeroed square (0: off)", low=0)
    fill: str = option("zero", "what the crop pads with", choices=_FILLS)

    def __post_init__(self) -> None:
        validate(self)

    def __call__(self, images: torch.Tensor, generator=None) -> torch.Tensor:
        _check_batch(images, "Augment", generator)
        if self.crop:
            images = random_crop(images, self.crop, fill=self.fill, generator=generator)
        if self.flip:
            images = random_flip(images, self.flip, generator=generator)
        if self.cutout:
            images = cutout(images, self.cutout, generator=generator)
        return images

    def __str__(self) -> str:
        on = [f"{k}={getattr(self, k)!r}" for k in ("crop", "flip", "cutout") if getattr(self, k)]
        return ",".join(on + ([f"fill={self.fill}"] if self.fill != "zero" else [])) or "crop=0"


# Used when a name is given without "=value" (CIFAR-style settings); also gives its type.
_AUGMENT_DEFAULTS = {"crop": 4, "flip": 0.5, "cutout": 8, "fill": "zero"}


def parse_augment(spec: str) -> Augment | None:
    """An ``Augment`` from the CLI string, ``None`` for ``""`` or ``"none"``.

    Comma-separated names, each optionally ``=value``: ``crop`` (padding, default 4),
    ``flip`` (probability, default 0.5), ``cutout`` (square side, default 8) and
    ``fill=zero|reflect`` (crop padding, default zero).

    Args:
        spec: e.g. ``"crop,flip,cutout"`` or ``"crop=2,flip,fill=reflect"``.

    Example:
        >>> parse_augment("crop=2,flip")
        Augment(crop=2, flip=0.5, cutout=0, fill='zero')
    """
    spec = spec.strip().lower()
    if spec in ("", "none"):
        return None
    fields: dict[str, object] = {}
    for item in spec.split(","):
        name, _, value = (part.strip() for part in item.partition("="))
        if name not in _AUGMENT_DEFAULTS:
            raise ConfigError(
                f"unknown augmentation {name!r} in {spec!r}; valid: "
                "crop[=PAD], flip[=P], cutout[=SIZE], fill=zero|reflect, or none"
            )
        if name in fields:
            raise ConfigError(f"augmentation {name!r} given twice in {spec!r}")
        kind = type(_AUGMENT_DEFAULTS[name])
        try:
            fields[name] = kind(value) if value else _AUGMENT_DEFAULTS[name]
        except ValueError:
            raise ConfigError(
                f"augmentation {name}={value!r} in {spec!r} is not a valid {kind.__name__}"
            ) from None
    return Augment(**fields)
