"""Field kinds: what one field of a batch (named by key or position) crosses as and becomes on
the device. ``Image``: uint8, normalized there; ``Mask``: moved by the images' geometric draw;
``Integer``: the narrowest dtype that holds it, widened there; ``AsIs``: as it is; others in
``kinds/``. A kind of one's own is a ``Field`` subclass named in ``fields=``."""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple, Union

import numpy as np
import torch

from .errors import BatchError, ConfigError
from .transforms import FLOATS, Draw, normalize, resized_crop

Name = Union[str, int]
NARROW = tuple(getattr(torch, n) for n in ("uint8", "int8", "uint16", "int16", "int32", "int64"))
OUTS = NARROW + FLOATS + (torch.float64,)  # what a declared integer field may come out in
LAYOUTS = ("auto", "NHWC", "NCHW")  # where images keep their channels (auto: recognised)


class Taken(NamedTuple):
    """Rows ``index`` of ``array``, gathered straight into the pinned bytes (the Loader's)."""

    array: np.ndarray
    index: np.ndarray


def integral(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


@functools.lru_cache(maxsize=None)  # per batch, per field: str() of a dtype is slow
def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return np.dtype(str(dtype).removeprefix("torch."))


def limits(dtype: torch.dtype) -> tuple:
    """Its least and greatest value (numpy's ``iinfo``: torch 2.4 has few uint16 ops)."""
    info = torch.finfo(dtype) if dtype.is_floating_point else np.iinfo(numpy_dtype(dtype))
    return info.min, info.max


def fits(dtype: torch.dtype, low: int, high: int) -> bool:
    least, most = limits(dtype)
    return least <= low and high <= most


def value_range(t: torch.Tensor) -> tuple[int, int]:
    """The least and greatest of integers ``t`` ((0, 0) where empty)."""
    if t.numel() == 0:
        return (0, 0)
    a = t.detach().numpy()  # numpy: every integer dtype, on any torch >= 2.4
    return int(a.min()), int(a.max())


def check_fits(name: Name, t: torch.Tensor, *dtypes: torch.dtype, what: str = "values") -> None:
    """BatchError naming field ``name`` unless integers ``t`` fit each of ``dtypes`` (its
    values read once, only where ``t``'s dtype may not fit)."""
    seen = None
    for d in dtypes:
        if not fits(d, *limits(t.dtype)) and not fits(d, *(seen := seen or value_range(t))):
            raise BatchError(
                f"field {name!r}: {what} {seen[0]}..{seen[1]} do not fit the declared {d} "
                f"({'..'.join(map(str, limits(d)))})"
            )


def check_bytes(name: Name, t: torch.Tensor, what: str, hint: str = "") -> None:
    """BatchError unless integers ``t``, a field declared ``what`` that crosses as uint8, hold
    0..255 (read: call it only where ``t`` is not uint8); ``hint``: what to declare instead."""
    low, high = value_range(t)
    if not (0 <= low and high <= 255):
        raise BatchError(
            f"field {name!r} is declared {what}: its {t.dtype} values {low}..{high} do not fit "
            f"uint8 (0..255){hint}"
        )


def widen(raw: torch.Tensor, dtype: np.dtype) -> torch.Tensor:
    """Integer bytes (uint8 on the device) holding ``dtype`` values, as int64."""
    if dtype == np.uint16:  # through int16: torch 2.4 has few uint16 ops
        return raw.view(torch.int16).long() & 0xFFFF
    return (raw if dtype == np.uint8 else raw.view(getattr(torch, np.dtype(dtype).name))).long()


class Context(NamedTuple):
    """What a kind is given to finish its field of a batch (``Field.finish``): the batch's one
    draw and what the images come out as; nothing else of the options. Immutable (a named
    tuple: one is made per batch)."""

    draw: Draw  # the batch's random draws (``Draw()``: none), made once for every field
    mean: tuple[float, ...]  # per channel, [0, 1] units (8-bit images)
    std: tuple[float, ...]
    dtype: torch.dtype  # the images' output dtype
    channels_last: bool  # the images' output memory format
    size: tuple[int, int] | None  # (H, W) the batch's pixel fields come out at (None: no pixels)
    generator: torch.Generator  # on the device, past the draw: a kind's own draws
    host: torch.Generator  # on the CPU (on a CPU device: ``generator``)
    augment: Callable | None = None  # an augmentation of one's own, f(images, generator)
    erase: Callable | None = None  # erasing after the normalize (its boxes: ``draw.erase``)
    mask_fill: float = 0  # masks' value where a crop leaves no pixel
    out: torch.Tensor | None = None  # where the field's output goes (the Loader's buffers)


class Planning(NamedTuple):
    """What a declaration that draws or decodes on the host as its field is planned is given
    (its ``plan(..., at=)``, where it says ``draws = True``): ``wrap``'s ``send``."""

    generator: torch.Generator  # on the CPU, seeded from the batch's (seed, epoch, rank, batch)
    device: torch.device  # where the batch is finished


def normalized(x: torch.Tensor, ctx: Context) -> torch.Tensor:
    """uint8 ``(N, H, W, C)`` at the batch's size: the draw's crop, flips and colour (or one's
    own augmentation), the fused normalize into ``ctx.out``, the erasing."""
    d = ctx.draw
    if ctx.augment is not None:
        x = ctx.augment(x, ctx.generator)
    elif d.augment is not None:  # else nothing moves or colours
        x = d.colour(d.shift_and_flip(x))
    y = normalize(x, ctx.mean, ctx.std, dtype=ctx.dtype, channels_last=ctx.channels_last,
                  out=ctx.out)  # fmt: skip
    return erased(y, ctx)


def erased(y: torch.Tensor, ctx: Context) -> torch.Tensor:
    """``ctx.erase`` on the normalized ``(N, C, H, W)``, by the boxes the draw made (else its
    own draw)."""
    if ctx.erase is None:
        return y
    if ctx.draw.erase is not None:
        return ctx.erase.apply(y, ctx.draw.erase, ctx.generator)
    return ctx.erase(y, ctx.generator)


@dataclass(frozen=True)
class Field:
    """One field of one batch: planned on the host, packed into the pinned bytes, viewed and
    finished on the device. ``dtype`` and ``shape`` are what crosses; ``plan`` and ``narrow``
    raise a BatchError naming the field for a value its kind cannot take.

    Example:
        >>> class Doubled(Field):  # a kind of your own: crosses as it came, comes out doubled
        ...     def finish(self, x, ctx): return x * 2
        >>> latecast.wrap(dl, fields={"x": Doubled})
    """

    name: Name
    dtype: torch.dtype
    shape: tuple[int, ...]
    arrived: torch.dtype | None = None  # as the source gave it (None: as it crosses)

    category = "other"  # which TransferStats counter its bytes go to: image, label, other
    what = "as is"  # the kind, in messages
    pixels = False  # moved by the batch's draw (then ``sizes_of`` and ``size`` say for what)
    crops = False  # a pixel kind cropped at random to ``size`` where there is no resized crop
    on_host = False  # its bytes stay in the pinned slot, where its decoder reads them
    decoded_bytes = 0  # on_host: its pixels as uint8 once decoded (what decoding them makes)

    def decoder(self, device: torch.device) -> str:
        """``on_host``: the decoder that reads it on ``device`` (TransferStats.decoder)."""
        return ""

    @classmethod
    def plan(cls, name: Name, value: torch.Tensor, options: Any, batch: dict) -> Field:
        """The field as it arrives, on the host (``options``: ``plan.Options``; ``batch``: the
        batch's fields by name, for a kind read beside another)."""
        return cls(name, value.dtype, tuple(value.shape), value.dtype)

    def narrow(self, value: torch.Tensor) -> Field:
        """The field in the dtype it crosses in: this one."""
        return self

    @functools.cached_property  # asked by pack, unpack and the count
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def usual_bytes(self) -> int:
        """What moving it as it arrived costs (``batch.to(device)``)."""
        return math.prod(self.shape) * (self.arrived or self.dtype).itemsize

    def pack(self, dst: torch.Tensor, value: Any) -> None:
        """``value`` into the pinned bytes ``dst`` (1-d uint8), in the dtype it crosses in."""
        if isinstance(value, Taken):
            out = dst.numpy().view(value.array.dtype).reshape(self.shape)
            np.take(value.array, value.index, axis=0, out=out)
        elif value.dtype != self.dtype:  # narrowed: numpy casts every integer dtype
            out = dst.numpy().view(numpy_dtype(self.dtype)).reshape(self.shape)
            np.copyto(out, value.detach().numpy(), casting="unsafe")
        else:
            dst.view(value.dtype).view(self.shape).copy_(value)

    def view(self, raw: torch.Tensor, device: torch.device) -> Any:
        """The field's bytes on the device (1-d uint8) as its values."""
        return raw.view(self.dtype).view(self.shape)

    def sizes_of(self, x: Any) -> torch.Tensor:
        """A pixel kind's ``(N, 2)`` (H, W) as ``view`` gave them, on the CPU: what the draw
        is made for."""
        return torch.tensor([x.shape[1:3]]).expand(len(x), 2)

    def finish(self, x: Any, ctx: Context) -> Any:
        """What the model takes, from ``x`` as ``view`` gave it."""
        return x

    def together(self, plans: list[Field | None]) -> None:
        """A BatchError where the batch's other fields (``plans``) cannot go with this one."""


@dataclass(frozen=True)
class Image(Field):
    """uint8 images; ``layout`` says where their channels are (NHWC, NCHW, or NHW)."""

    layout: str = "NHWC"
    category = what = "image"
    pixels = True

    @property
    def nhw(self) -> tuple[int, ...]:
        n, *rest = self.shape
        return (n, *{"NHWC": rest[:2], "NCHW": rest[1:], "NHW": rest}[self.layout])

    @property
    def size(self) -> tuple[int, int]:  # (H, W) out: its own
        return self.nhw[1:]

    @classmethod
    def plan(cls, name: Name, t: torch.Tensor, options: Any, batch=None, declared=True) -> Image:
        shape = tuple(t.shape)
        if declared and integral(t.dtype) and t.dtype != torch.uint8 and t.ndim in (3, 4):
            deep = t.dtype in (torch.uint16, torch.int16)  # CT slices, bands, depth maps
            hint = f"; 16-bit images? declare fields={{{name!r}: latecast.image16(...)}}" * deep
            check_bytes(name, t, "an image", hint)  # int64 from Hugging Face: crosses as uint8
        elif t.dtype != torch.uint8 or t.ndim not in (3, 4):
            raise BatchError(
                f"field {name!r} is {'declared ' if declared else ''}an image and must be uint8 "
                f"(N, H, W, C) or (N, C, H, W), got {t.dtype} {shape}; a DataLoader yields "
                "those with PILToTensor() or ToImage(), not ToTensor()"
            )
        layout = "NHW" if t.ndim == 3 else options.layout
        if layout == "auto":
            fix = "pass layout='NHWC' or layout='NCHW'"
            layout = layout_of(name, "uint8 images", shape, (1, 3, 4), fix)
        channels = {"NHW": 1, "NHWC": shape[-1], "NCHW": shape[1]}[layout]
        mask = f"; a mask? declare it: fields={{{name!r}: 'mask'}}" * (
            channels == 1 and not declared
        )
        check_channels(name, channels, len(options.mean or (0,)), f" ({layout} {shape})", mask)
        return cls(name, torch.uint8, shape, t.dtype, layout)

    def view(self, raw: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``(N, H, W, C)``, whatever the layout it crossed in."""
        return nhwc(super().view(raw, device), self.layout)

    def finish(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Normalized ``(N, C, H, W)``: the draw's resized crop (to its own size), then
        ``normalized``."""
        boxes = ctx.draw.boxes
        return normalized(x if boxes is None else resized_crop(x, boxes, x.shape[1:3]), ctx)


def labels_field(labels: np.ndarray, n: int) -> Integer:
    """``n`` of a dataset's narrow labels (uint8 or uint16) as a field (``1``: after images)."""
    dtype = {"uint8": torch.uint8, "uint16": torch.uint16}[labels.dtype.name]
    return Integer(1, dtype, (n,), dtype)


def layout_of(name: Name, what: str, shape: tuple, counts: tuple, fix: str) -> str:
    """NCHW or NHWC: the one of dim 1 or 3 whose size is among ``counts``, else one BatchError
    naming field ``name`` (``what``: its kind) and ``fix``."""
    ends = [axis for axis in (1, 3) if shape[axis] in counts]
    if len(ends) != 1:
        raise BatchError(
            f"field {name!r}: {what} {shape} are ambiguous, {'both' if ends else 'neither'} "
            f"dim 1 and dim 3 look like channels {counts}; {fix}"
        )
    return "NCHW" if ends == [1] else "NHWC"


def one_size(name: Name, sizes: list, what: str, kind: str) -> tuple[int, int]:
    """The one ``(H, W)`` of a batch's ``sizes``, else one BatchError naming field ``name``
    (``what`` it holds) and the declaration of ``kind`` that gives the size out."""
    if len(set(sizes)) == 1:
        return sizes[0]
    some = ", ".join(f"{h}x{w}" for h, w in sorted(set(sizes))[:3])
    raise BatchError(
        f"field {name!r}: {what} of {len(set(sizes))} sizes ({some}, ...): declare the size "
        f"out, fields={{{name!r}: latecast.{kind}(size=(H, W))}}"
    )


def check_channels(name: Name, channels: int, means: int, where: str = "", hint: str = ""):
    """A BatchError naming field ``name`` (``where``: its layout and shape) when its
    ``channels`` do not take ``means`` mean/std values: one, or one a channel."""
    if means not in (1, channels):
        raise BatchError(
            f"field {name!r}: {channels} channels{where} but {means} mean/std values{hint}"
        )


@dataclass(frozen=True)
class Integer(Field):
    """Integers: cross narrow, come out as ``out``."""

    out: torch.dtype = torch.int64
    declared: tuple | None = None  # (crossing, output) dtypes given in fields=
    category, what = "label", "integer"

    @classmethod
    def plan(cls, name: Name, t, options=None, batch=None, cross=None, out=torch.int64) -> Field:
        """Integers (else ``AsIs``); declared to cross as ``cross`` and come out as ``out``, of
        integers only, whose values fit both (read only where ``t``'s dtype may not fit)."""
        if not integral(t.dtype) and cross is None:
            return AsIs.plan(name, t, options, batch)
        if not integral(t.dtype):
            raise BatchError(
                f"field {name!r} is {t.dtype}: fields= declares {cross} for integer fields only"
            )
        check_fits(name, t, *((cross, out) if cross else ()))
        return cls(name, t.dtype, tuple(t.shape), t.dtype, out, cross and (cross, out))

    def narrow(self, value: torch.Tensor) -> Field:
        """The declared dtype, else the narrowest that holds the batch's values."""
        return replace(self, dtype=self.declared[0]) if self.declared else narrowest(self, value)

    def view(self, raw: torch.Tensor, device: torch.device) -> torch.Tensor:
        x = widen(raw, numpy_dtype(self.dtype)).view(self.shape)
        return x if self.out == torch.int64 else x.to(self.out)


@dataclass(frozen=True)
class AsIs(Field):
    """Floats, bools: cross as they are."""


@dataclass(frozen=True)
class Mask(Field):
    """A per-pixel field: the images' ``N, H, W``, moved by their geometric draw (nearest
    neighbour; crop padding ``fill`` or mirrored), nothing else; integers cross narrow."""

    layout: str = "NHW"
    pixels, what = True, "mask"
    nhw, size = Image.nhw, Image.size

    @property
    def category(self) -> str:
        return "label" if integral(self.dtype) else "other"

    @classmethod
    def plan(cls, name: Name, t: torch.Tensor, options: Any, batch: dict) -> Mask:
        if t.ndim not in (3, 4) or t.dtype.is_complex:
            raise BatchError(
                f"field {name!r} is declared a mask and must be (N, H, W) or (N, C, H, W), "
                f"got {t.dtype} {tuple(t.shape)}"
            )
        return cls(name, t.dtype, tuple(t.shape), t.dtype, "NCHW" if t.ndim == 4 else "NHW")

    def narrow(self, value: torch.Tensor) -> Field:
        return narrowest(self, value) if integral(self.dtype) else self

    def view(self, raw: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``(N, H, W, C)``, integers widened."""
        x = widen(raw, numpy_dtype(self.dtype)) if integral(self.dtype) else raw.view(self.dtype)
        return nhwc(x.view(self.shape), self.layout)

    def finish(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        """The draw's geometry by nearest neighbour, to the batch's size, padded with
        ``ctx.mask_fill`` where a zero-filled crop leaves no pixel; back in its own layout."""
        d = ctx.draw
        y = d.mask(x, ctx.size)
        if ctx.mask_fill and d.shifts is not None and d.augment.fill == "zero":
            inside = d.mask(torch.ones_like(x[..., :1], dtype=torch.uint8), ctx.size)
            y = y.masked_fill(inside == 0, ctx.mask_fill)
        return y[..., 0] if self.layout == "NHW" else y.permute(0, 3, 1, 2).contiguous()


def nhwc(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x`` in ``layout`` (NHWC, NCHW or NHW) viewed as ``(N, H, W, C)``."""
    if layout == "NHWC":
        return x
    return x.permute(0, 2, 3, 1) if layout == "NCHW" else x[..., None]


def narrowest(f: Field, value: torch.Tensor) -> Field:
    """``f`` crossing in the narrowest dtype that holds ``value``; one byte is narrow already."""
    if value.dtype.itemsize == 1:
        return f
    low, high = value_range(value)
    dtype = next((d for d in NARROW if fits(d, low, high)), None)
    if dtype is None:
        raise BatchError(f"field {f.name!r}: values {low}..{high} do not fit torch.int64")
    return replace(f, dtype=dtype)


KINDS: dict[str, Callable] = {"image": Image.plan, "mask": Mask.plan}  # fields= by name


def declaration(name: Name, spec: Any) -> Any:
    """One entry of ``fields=`` as what plans it: ``plan(name, tensor, options, batch) ->
    Field``, or a declaration (``latecast.jpeg()``) whose ``plan`` takes what is no array too;
    anything else is a ConfigError."""
    if isinstance(spec, str) and spec in KINDS:
        return KINDS[spec]
    if isinstance(spec, type) and issubclass(spec, Field):  # a kind of the user's own
        return spec.plan
    if callable(getattr(spec, "plan", None)) and not isinstance(spec, type):
        return spec
    cross, out = spec if isinstance(spec, tuple) and len(spec) == 2 else (spec, torch.int64)
    if not any(cross is d for d in NARROW) or not any(out is d for d in OUTS):
        raise ConfigError(
            f"fields[{name!r}] = {spec!r:.60}: give 'image', 'mask', latecast.jpeg(), an "
            f"integer dtype to cross in ({', '.join(str(d) for d in NARROW)}), or (that "
            "dtype, the output dtype: an integer or float one), or a Field kind"
        )
    return functools.partial(Integer.plan, cross=cross, out=out)


def image_hint(name: Name, t: torch.Tensor) -> str | None:
    """What to change, for a 4-dim field that is not uint8 but holds images: floats in [0, 1]
    (``ToTensor()``'s), integers in 0..255 with 3 or 4 channels (Hugging Face's), or 16-bit
    integers (``image16``'s); else None."""
    channels = {t.shape[1], t.shape[3]} if t.ndim == 4 and t.numel() else set()
    if t.dtype.is_floating_point and channels & {1, 3, 4} and 0 <= t.min() and t.max() <= 1:
        return (
            f"field {name!r} is {t.dtype} {tuple(t.shape)} in [0, 1], images as ToTensor() "
            f"makes them: they cross as {t.dtype.itemsize} bytes a pixel; yield uint8 with "
            "PILToTensor() or ToImage() and give wrap the mean/std"
        )
    if integral(t.dtype) and t.dtype != torch.uint8 and channels & {3, 4}:
        low, high = value_range(t)
        if 0 <= low and high <= 255:
            return (
                f"field {name!r} is {t.dtype} {tuple(t.shape)} with values 0..255, images as "
                f"Hugging Face datasets formats uint8 ones: declare fields={{{name!r}: 'image'}} "
                "(it crosses as uint8), or use ds.with_format('torch', dtype=torch.uint8)"
            )
    if t.dtype in (torch.int16, torch.uint16) and channels:  # CT slices, bands, depth maps
        return (
            f"field {name!r} is {t.dtype} {tuple(t.shape)}: 16-bit images? declare fields="
            f"{{{name!r}: latecast.image16(...)}} (they cross as stored and come out float); "
            "as integers they come out int64"
        )
    return None


def split(batch: Any) -> tuple[list[tuple[Name, Any]], Callable[[list], Any]]:
    """A batch's ``(name, value)`` pairs and how to rebuild a batch of the same form."""
    if isinstance(batch, dict):
        return list(batch.items()), lambda values: dict(zip(batch, values))
    if isinstance(batch, (tuple, list)):
        if hasattr(batch, "_fields"):  # a named tuple, as default_collate keeps them
            return list(zip(batch._fields, batch)), lambda values: type(batch)(*values)
        return list(enumerate(batch)), lambda values: type(batch)(values)
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return [(0, batch)], lambda values: values[0]
    raise BatchError(
        f"a batch must be a tensor, an array, a tuple/list or a dict, got {type(batch).__name__}"
    )


def as_tensor(value: Any) -> torch.Tensor | None:
    """A tensor sharing ``value``'s memory (copied where torch cannot share it: negative
    strides, big-endian), or None for what is not an array (it passes through)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if not value.dtype.isnative or min(value.strides, default=0) < 0:
            value = np.ascontiguousarray(value, value.dtype.newbyteorder("="))
        with warnings.catch_warnings():  # a read-only memmap: we only read it
            warnings.simplefilter("ignore", UserWarning)
            try:
                return torch.from_numpy(value)
            except TypeError:  # strings, objects
                return None
    return None
