"""``latecast.wrap``: any iterable of batches in, narrow bytes across the bus, prepared on the
device. The source is yours (a ``DataLoader``, a generator, a list); move and prepare are
latecast's, the same as the Loader's:

    your batch -> every field packed into one reused pinned buffer -> one copy, on a side
    CUDA stream one batch ahead -> on the device: augment + normalize images, widen integers

A batch is a tensor, a tuple/list (named tuples too) or a dict; its tensors and numpy arrays
are its fields, named by key or position (a lone tensor is ``0``); anything else in it (file
names, say) passes through. What each kind of field crosses as and becomes is the README's
table ("Your own data"); the rules behind it:

- **image**: uint8 with 4 dims, or declared ``"image"`` (then ``(N, H, W)`` too). The channel
  axis is whichever of dims 1 and 3 has size 1, 3 or 4 (``layout=`` decides when both or
  neither do). Two undeclared uint8 4-dim fields in one batch are an error: one is likely a
  mask, and a mask must never be normalized.
- **mask** (declared): the images' ``N, H, W``, moved by the same geometric draw as its
  images (nearest neighbour; crop padding 0 or mirrored), nothing else. Beside a JPEG field:
  each file's size, cropped and resized to its training size by the files' decoding boxes.
- **integer**: crosses in the narrowest of ``NARROW`` that holds this batch's values, or the
  declared dtype; a value that does not fit is an error naming the field, never a wrap-around.
- **JPEG files** (``encoded.py``): decoded, cropped, augmented and normalized on the device.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import threading
import time
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Union

import numpy as np
import torch
from torch.utils.data import DataLoader

from . import encoded
from .decode import decoder_on
from .distributed import placement
from .errors import BatchError, ConfigError, numbers_of, refuse
from .loader import Epochs
from .prepare import Augmentation, Mixing, Prepare, sizes_of
from .threads import one_thread
from .transfer import Behind, Ring, TransferStats, ahead, widen
from .transforms import FLOATS, Augment, Erasing, Moves

Name = Union[str, int]
IMAGE, MASK, INT, AS_IS = "image", "mask", "integer", "as is"
LAYOUTS = ("auto", "NHWC", "NCHW")
NARROW = tuple(getattr(torch, n) for n in ("uint8", "int8", "uint16", "int16", "int32", "int64"))
OUTS = NARROW + FLOATS + (torch.float64,)  # what a declared integer field may come out in


@dataclass(frozen=True)
class Field:
    """How one field of a batch crosses, and what it becomes."""

    name: Name
    kind: str  # IMAGE, MASK, INT or AS_IS
    dtype: torch.dtype  # and shape: as it crosses
    shape: tuple[int, ...]
    layout: str = ""  # an image's or mask's: NHWC, NCHW or NHW
    out: torch.dtype = torch.int64  # what an integer field comes out in
    arrived: torch.dtype | None = None  # None: as it crosses

    @property
    def nhw(self) -> tuple[int, ...]:
        """``(N, H, W)`` of an image or mask."""
        n, *rest = self.shape
        return (n, *{"NHWC": rest[:2], "NCHW": rest[1:], "NHW": rest}[self.layout])

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def usual_bytes(self) -> int:
        """What moving it as it arrived costs (``batch.to(device)``): a loader that already
        yields uint8 saves nothing on its images here, and the stats say so."""
        return math.prod(self.shape) * (self.arrived or self.dtype).itemsize

    @property
    def integer(self) -> bool:
        """An integer field or an integer mask: crosses narrow, comes out widened."""
        return self.kind in (INT, MASK) and integral(self.dtype)


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
    """A tensor sharing ``value``'s memory, or None for what is not an array (passes through).
    Arrays torch cannot share (negative strides, as ``np.fliplr`` gives; big-endian) are
    copied first."""
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


def holds_arrays(value: Any) -> bool:
    """A dict, list or tuple with a tensor or an array somewhere inside."""
    if isinstance(value, dict):
        return any(map(holds_arrays, value.values()))
    if isinstance(value, (list, tuple)):
        return any(map(holds_arrays, value))
    return as_tensor(value) is not None


def integral(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def value_range(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return (0, 0)
    if t.device.type != "cpu":  # a batch already on the device (Lightning): one sync
        low, high = t.detach().long().aminmax()
        return int(low), int(high)
    a = t.detach().numpy()  # numpy: every integer dtype, on any torch >= 2.4
    return int(a.min()), int(a.max())


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return np.dtype(str(dtype).removeprefix("torch."))


def limits(dtype: torch.dtype) -> tuple:
    """Its least and greatest value (numpy's ``iinfo``: torch 2.4 has few uint16 ops)."""
    info = torch.finfo(dtype) if dtype.is_floating_point else np.iinfo(numpy_dtype(dtype))
    return info.min, info.max


def fits(dtype: torch.dtype, low: int, high: int) -> bool:
    least, most = limits(dtype)
    return least <= low and high <= most


def image_hint(name: Name, t: torch.Tensor) -> str | None:
    """What to change, for a 4-dim field that is not uint8 but holds what images do (the
    channel axis at dim 1 or 3): floats in [0, 1] as ``ToTensor()`` makes them, or integers
    in 0..255 with 3 or 4 channels as Hugging Face ``datasets`` formats uint8 images (int64;
    one channel may be a mask). Else None. Read at the first batch only (one pass)."""
    channels = {t.shape[1], t.shape[3]} if t.ndim == 4 and t.numel() else set()
    if t.dtype.is_floating_point and channels & {1, 3, 4} and 0 <= t.min() and t.max() <= 1:
        return (
            f"field {name!r} is {t.dtype} {tuple(t.shape)} in [0, 1], images as ToTensor() "
            f"makes them: they cross as {t.dtype.itemsize} bytes a pixel; yield uint8 with "
            "PILToTensor() or ToImage() and give wrap the mean/std"
        )
    if integral(t.dtype) and t.dtype != torch.uint8 and channels & {3, 4}:
        low, high = value_range(t.cpu())  # the Lightning mixin's batches are on the device
        if 0 <= low and high <= 255:
            return (
                f"field {name!r} is {t.dtype} {tuple(t.shape)} with values 0..255, images as "
                f"Hugging Face datasets formats uint8 ones: declare fields={{{name!r}: 'image'}} "
                "(it crosses as uint8), or use ds.with_format('torch', dtype=torch.uint8)"
            )
    return None


def _channels(erase: Any, mean: tuple | None) -> bool:
    """An ``Erasing`` value of numbers per channel has one per ``mean`` value (or one)."""
    value = getattr(erase, "value", None)
    return not (isinstance(value, tuple) and mean and len(value) not in (1, len(mean)))


def check_fields(fields: dict | None) -> dict[Name, Any]:
    """``fields=`` as ``{name: "image" | "mask" | Jpeg | (dtype it crosses in, dtype out)}``."""
    if fields is not None and not isinstance(fields, dict):
        raise ConfigError(f"fields must be a dict {{name: kind}} or None, got {fields!r:.60}")
    out: dict[Name, Any] = {}
    for name, spec in (fields or {}).items():
        if (isinstance(spec, str) and spec in (IMAGE, MASK)) or isinstance(spec, encoded.Jpeg):
            out[name] = spec
            if isinstance(spec, encoded.Jpeg):
                encoded.decoder()  # a bad LATECAST_DECODER: its one error now, not at a batch
            continue
        cross, dtype = spec if isinstance(spec, tuple) and len(spec) == 2 else (spec, torch.int64)
        if not any(cross is d for d in NARROW) or not any(dtype is d for d in OUTS):
            raise ConfigError(
                f"fields[{name!r}] = {spec!r:.60}: give 'image', 'mask', latecast.jpeg(), an "
                f"integer dtype to cross in ({', '.join(str(d) for d in NARROW)}), or (that "
                "dtype, the output dtype: an integer or float one)"
            )
        out[name] = (cross, dtype)
    return out


@dataclass
class Fields:
    """What every field becomes: its kind and crossing dtype decided on the host (``plan``,
    ``narrow``), then made what the model takes on the device (``finish``). Its fields are
    the options of ``wrap`` and ``PrepareOnDevice.prepare_on_device`` (see ``wrap``'s Args);
    it never moves anything itself."""

    mean: tuple[float, ...] | None = None  # per channel, [0, 1] units; None: x / 255 alone
    std: tuple[float, ...] | None = None
    augment: Augmentation | None = None
    dtype: torch.dtype = torch.float32  # the images' output dtype
    channels_last: bool = False  # the images' output memory format
    layout: str = "auto"  # where uint8 images keep their channels: auto, NHWC or NCHW
    fields: dict | None = None  # {name: "image" | "mask" | jpeg() | dtype | (dtype, out dtype)}
    seed: int = 0  # mixed into the augmentation's seeds
    erase: Erasing | None = None  # random erasing after the normalize (timm's --reprob)
    mix: Mixing | None = None  # f(images, labels, generator) after the normalize, e.g. a Mix

    def __post_init__(self) -> None:
        """Every option checked where it is given, so that none fails later at a batch: one
        ConfigError naming the argument, its value and what is accepted."""
        mean, std, given = numbers_of(self.mean), numbers_of(self.std), (self.mean, self.std)
        if given != (None, None) and not (mean and std and len(mean) == len(std) and min(std) > 0):
            raise ConfigError(
                f"mean {self.mean!r:.60} and std {self.std!r:.60}: give both, as long sequences "
                "of finite numbers, std > 0 (or neither: images are only scaled to [0, 1])"
            )
        if mean and not all(0 <= v <= 1 for v in (*mean, *std)):
            raise ConfigError(  # timm's IMAGENET_DEFAULT_MEAN * 255, say: every output ~ -0.4
                f"mean {self.mean!r} and std {self.std!r} are in [0, 1] units, as Normalize() "
                "takes them after ToTensor(); in 0-255 units divide them by 255"
            )
        self.fields = check_fields(self.fields)
        aug, seed, erase, lay = self.augment, self.seed, self.erase, self.layout
        flag, ours = self.channels_last, isinstance(aug, Augment)
        integer = isinstance(seed, numbers.Integral) and not isinstance(seed, bool)
        floats, layouts = (", ".join(map(str, names)) for names in (FLOATS, LAYOUTS))
        per_channel = f"one number or {len(mean or ())}, one per channel as mean/std"
        altflip = "without altflip (it needs each sample's dataset index, which only a Loader has)"
        masks = (
            "a latecast.Augment where fields= declares a mask (its geometric draws move the mask)"
        )
        refuse(
            [  # (accepted?, argument, its value, what is accepted)
                (aug is None or callable(aug), "augment", aug, "f(images, generator)"),
                (not (ours and aug.altflip), "augment", aug, altflip),
                (ours or aug is None or MASK not in self.fields.values(), "augment", aug, masks),
                (any(self.dtype is d for d in FLOATS), "dtype", self.dtype, "one of " + floats),
                (isinstance(flag, (bool, np.bool_)), "channels_last", flag, "a bool"),
                (isinstance(lay, str) and lay in LAYOUTS, "layout", lay, "one of " + layouts),
                (integer and 0 <= seed < 2**63, "seed", seed, "an integer in 0..2**63-1"),
                (erase is None or callable(erase), "erase", erase, "a latecast.Erasing or None"),
                (self.mix is None or callable(self.mix), "mix", self.mix, "f(images, labels, g)"),
                (_channels(erase, mean), "erase.value", getattr(erase, "value", 0), per_channel),
            ]
        )
        self.normalizes = mean is not None
        self.looked = False  # at the first batch: fields that look like images but are not
        self.mixing = True  # `mix` on; timm's loader.mixup_enabled switches it (Wrapped)
        self.prepare = Prepare(
            (0.0,) if mean is None else mean,  # no mean/std: ToTensor() alone, x / 255
            (1.0,) if std is None else std,
            dtype=self.dtype,
            channels_last=self.channels_last,
            augment=self.augment,
            seed=int(self.seed),
        )

    @classmethod
    def of(cls, options: dict[str, Any]) -> Fields:
        """``Fields(**options)``; an unknown option is one ConfigError naming the known ones."""
        known = [f.name for f in dataclasses.fields(cls)]
        for name in options:
            if name not in known:
                raise ConfigError(f"unknown option {name!r}; the options: {', '.join(known)}")
        return cls(**options)

    def plan_batch(
        self, leaves: list[tuple[Name, Any]], host: bool
    ) -> tuple[list[torch.Tensor | None], list[Field | None]]:
        """Each field's tensor and plan (None: not an array, it passes through). ``host``:
        the fields are still in host memory and integers get their narrow dtype."""
        missing = set(self.fields) - {name for name, _ in leaves}
        if missing:
            raise BatchError(
                f"fields= names {sorted(map(repr, missing))} but this batch has fields "
                + ", ".join(repr(name) for name, _ in leaves)
            )
        tensors = [as_tensor(v) for _, v in leaves]
        plans: list[Field | encoded.JpegField | None] = []
        for (name, value), t in zip(leaves, tensors):
            spec = self.fields.get(name)
            jpeg = isinstance(spec, encoded.Jpeg)
            if jpeg and not host:
                raise BatchError(
                    f"field {name!r} is declared JPEG files: those are decoded by latecast.wrap "
                    "(from its pinned buffer), not after another framework moved the batch"
                )
            found = host and t is None and not jpeg and encoded.recognised(value, name)
            if host and (jpeg or found):
                plans.append(encoded.plan(name, found or value, spec, len(self.prepare.mean)))
                continue
            if t is not None and host and t.device.type != "cpu":
                raise BatchError(
                    f"field {name!r} is already on {t.device}: wrap moves batches from host "
                    "memory; give it the DataLoader before anything moves them"
                )
            if t is None and host and holds_arrays(value):  # it would stay on the host
                raise BatchError(
                    f"field {name!r} is a {type(value).__name__} holding tensors or arrays: wrap "
                    "moves the fields of a flat batch (a dict, tuple or list of tensors); "
                    "flatten it, e.g. {" + f"'{name}.x': tensor" + "}"
                )
            plans.append(None if t is None else self.narrow(self.plan(name, t), t, host))
        images = any(f and f.kind in (IMAGE, encoded.ENCODED) for f in plans)
        if not self.looked or (self.normalizes and not images):
            self.looked = True
            hints = [
                h
                for f, t in zip(plans, tensors)
                if t is not None and f and f.kind != IMAGE and (h := image_hint(f.name, t))
            ]
            if self.normalizes and not images:
                got = ", ".join(
                    f"{f.name!r}: {t.dtype} {tuple(t.shape)}" for f, t in zip(plans, tensors) if f
                )
                fix = (
                    "yield uint8 with PILToTensor() or ToImage(), or declare fields={name: 'image'}"
                )
                raise BatchError(
                    f"mean/std were given but no field of this batch is a uint8 image ({got}); "
                    + ("; ".join(hints) or fix)
                )
            for hint in hints:
                warnings.warn(f"latecast.wrap: {hint}", UserWarning, stacklevel=4)
        self._check_pixels([f for f in plans if f and f.kind in (IMAGE, MASK)])
        self._check_masks([f for f in plans if f and f.kind in (IMAGE, MASK, encoded.ENCODED)])
        return tensors, plans

    def _check_masks(self, pixels: list) -> None:
        """Masks beside JPEG fields: each file of the masks' size (its boxes move the mask),
        and every image of the batch coming out at one size (the masks' too)."""
        masks = [f for f in pixels if f.kind == MASK]
        files = [f for f in pixels if f.kind == encoded.ENCODED]
        if not (masks and files):
            return
        m, (n, h, w) = masks[0], masks[0].nhw
        for f in files:
            other = [(k, a, b) for k, (a, b) in enumerate(f.sizes.tolist()) if (a, b) != (h, w)]
            bad = "its file at position {} is {}x{}".format(*other[0]) if other else ""
            bad = f"it holds {len(f.files)} files" if len(f.files) != n else bad
            if bad:
                raise BatchError(
                    f"field {m.name!r}: masks {(n, h, w)} are moved with the files of JPEG field "
                    f"{f.name!r} (by their decoding boxes), but {bad}"
                )
        outs = {f.size for f in files} | {f.nhw[1:] for f in pixels if f.kind == IMAGE}
        if len(outs) > 1:
            raise BatchError(
                f"field {m.name!r}: masks come out at the size of their JPEG images, so every "
                f"image of the batch must come out at one size, got {sorted(outs)}"
            )

    def _check_pixels(self, pixels: list[Field]) -> None:
        """Images and masks of one batch are of one size; two uint8 4-d fields are declared
        (one of them is likely a mask, which must never be normalized as an image)."""
        guessed = [f.name for f in pixels if f.kind == IMAGE and f.name not in self.fields]
        if len(guessed) > 1:
            raise BatchError(
                f"fields {', '.join(map(repr, guessed))} are all uint8 with 4 dims: declare which "
                f"are masks and which images, e.g. fields={{{guessed[-1]!r}: 'mask'}} (a mask is "
                "moved with the images, never normalized), or 'image' for each image"
            )
        if len({f.nhw for f in pixels}) > 1:
            raise BatchError(
                "the images and masks of a batch must have one (N, H, W), got "
                + ", ".join(f"{f.name!r}: {f.nhw}" for f in pixels)
            )

    def plan(self, name: Name, t: torch.Tensor) -> Field:
        """The field's kind, crossing as it is (``narrow`` picks a narrower dtype)."""
        spec = self.fields.get(name)
        if spec == MASK:
            if t.ndim not in (3, 4) or t.dtype.is_complex:
                raise BatchError(
                    f"field {name!r} is declared a mask and must be (N, H, W) or (N, C, H, W), "
                    f"got {t.dtype} {tuple(t.shape)}"
                )
            out = torch.int64 if integral(t.dtype) else t.dtype
            layout = "NCHW" if t.ndim == 4 else "NHW"
            return Field(name, MASK, t.dtype, tuple(t.shape), layout, out, arrived=t.dtype)
        if spec == IMAGE or (spec is None and t.dtype == torch.uint8 and t.ndim == 4):
            return self._image(name, t, declared=spec == IMAGE)
        if spec is not None and not integral(t.dtype):
            raise BatchError(
                f"field {name!r} is {t.dtype}: fields= declares {spec[0]} for integer fields only"
            )
        out = torch.int64 if spec is None else spec[1]
        kind = INT if integral(t.dtype) else AS_IS
        return Field(name, kind, t.dtype, tuple(t.shape), out=out, arrived=t.dtype)

    def _image(self, name: Name, t: torch.Tensor, declared: bool) -> Field:
        shape = tuple(t.shape)
        if declared and integral(t.dtype) and t.dtype != torch.uint8 and t.ndim in (3, 4):
            low, high = value_range(t)  # int64 from Hugging Face datasets: crosses as uint8
            if not (0 <= low and high <= 255):
                raise BatchError(
                    f"field {name!r} is declared an image: its {t.dtype} values {low}..{high} "
                    "do not fit uint8 (0..255)"
                )
        elif t.dtype != torch.uint8 or t.ndim not in (3, 4):
            raise BatchError(
                f"field {name!r} is {'declared ' if declared else ''}an image and must be uint8 "
                f"(N, H, W, C) or (N, C, H, W), got {t.dtype} {shape}; a DataLoader yields "
                "those with PILToTensor() or ToImage(), not ToTensor()"
            )
        layout = "NHW" if t.ndim == 3 else self.layout
        if layout == "auto":
            ends = [axis for axis in (1, 3) if shape[axis] in (1, 3, 4)]
            if len(ends) != 1:
                raise BatchError(
                    f"field {name!r}: uint8 images {shape} are ambiguous, "
                    f"{'both' if ends else 'neither'} dim 1 and dim 3 look like channels "
                    "(1, 3 or 4); pass layout='NHWC' or layout='NCHW'"
                )
            layout = "NCHW" if ends == [1] else "NHWC"
        channels = {"NHW": 1, "NHWC": shape[-1], "NCHW": shape[1]}[layout]
        if len(self.prepare.mean) not in (1, channels):
            raise BatchError(
                f"field {name!r}: {channels} channels ({layout} {shape}) but "
                f"{len(self.prepare.mean)} mean/std values"
                + ("; a mask? declare it: fields={" + f"{name!r}: 'mask'" + "}")
                * (channels == 1 and not declared)
            )
        return Field(name, IMAGE, torch.uint8, shape, layout=layout, arrived=t.dtype)

    def narrow(self, f: Field, t: torch.Tensor, host: bool = True) -> Field:
        """An integer field or mask in the dtype it crosses in: the declared one, else (on the
        host) the narrowest that holds its values. Values that do not fit the declared
        dtypes, crossing or output, are a BatchError, never a wrap-around."""
        if f.kind not in (INT, MASK) or not integral(t.dtype):
            return f
        spec = self.fields.get(f.name)
        if isinstance(spec, tuple):
            seen = None
            for d in spec:
                if not fits(d, *limits(t.dtype)):  # some value of t's dtype may not fit
                    seen = seen or value_range(t)
                    if not fits(d, *seen):
                        raise BatchError(
                            f"field {f.name!r}: values {seen[0]}..{seen[1]} do not fit the "
                            f"declared {d} ({'..'.join(map(str, limits(d)))})"
                        )
            return replace(f, dtype=spec[0]) if host else f
        if not host or t.dtype.itemsize == 1:  # nothing is narrower than one byte
            return f
        low, high = value_range(t)
        dtype = next((d for d in NARROW if fits(d, low, high)), None)
        if dtype is None:
            raise BatchError(f"field {f.name!r}: values {low}..{high} do not fit torch.int64")
        return replace(f, dtype=dtype)

    @one_thread()  # latecast's own CPU work: threads.py
    def finish(
        self,
        plans: list[Field | None],
        raws: list[torch.Tensor | None],
        where: tuple[int, int, int],
        device: torch.device | None = None,
    ) -> list[torch.Tensor | None]:
        """Each field's bytes (1-d uint8 on the device; a JPEG field's files in host memory,
        decoded on ``device``; None: it passes through) -> what the model takes. ``where``:
        (epoch, rank, batch), the augmentation's seed. The images, JPEG files and masks of a
        batch share one geometric draw (``Prepare.moves``, from the JPEG files' sizes where
        there are some): a mask is moved with its images by nearest neighbour, to a JPEG
        field's training size, and nothing else; every image gets the same colour draws;
        images of other sizes (no mask beside them) get boxes of their own, same seeds."""
        jpeg = [i for i, f in enumerate(plans) if f is not None and f.kind == encoded.ENCODED]
        out = [
            None if f is None or i in jpeg else self._view(f, raw)
            for i, (f, raw) in enumerate(zip(plans, raws))
        ]
        pixels = [i for i, f in enumerate(plans) if f and f.kind in (IMAGE, MASK, encoded.ENCODED)]
        if not pixels:
            return out
        device = device or out[pixels[0]].device  # Lightning's batches: no JPEG field there
        images = {
            i: encoded.batch(plans[i], raws[i], device) if i in jpeg else out[i] for i in pixels
        }
        first, prepare = images[min(jpeg, default=pixels[0])], self.prepare
        size = plans[jpeg[0]].size if jpeg else None  # the masks': the images' as they come out
        prepare.seek(*where)
        prepare.next_batch(device)
        g, host = prepare.generator(device), prepare.generator(torch.device("cpu"))
        seeded = g.get_state(), host.get_state()

        def draw(x) -> tuple[Moves | None, torch.Tensor]:  # the draw, where colour starts
            g.set_state(seeded[0])
            host.set_state(seeded[1])
            return prepare.moves(x), g.get_state()

        (moves, colour), sizes = draw(first), sizes_of(first)
        with encoded.named():  # a file that does not decode: the field's BatchError
            for i in pixels:
                f, x = plans[i], images[i]
                if f.kind == MASK:
                    x = (moves or Moves(None, None, None, None)).mask(x, size)
                    out[i] = x[..., 0] if f.layout == "NHW" else x.permute(0, 3, 1, 2).contiguous()
                    continue
                same = x is first or torch.equal(sizes_of(x), sizes)
                m, state = (moves, colour) if same else draw(x)
                g.set_state(state)
                prepare.size = getattr(f, "size", None)  # a JPEG field's training size
                x = prepare.apply(x, None, moves=m)[0]  # no mixing: labels are fields
                out[i] = x if self.erase is None else self.erase(x, g)  # after the normalize
        return out

    def mixed(self, plans: list[Field | None], values: list) -> list:
        """``values`` (the batch's fields, finished) with its images and labels mixed by
        ``mix``: its one image field and its one integer field of one value per sample, the
        labels becoming class probabilities; drawn from the batch's host generator, so a
        resumed run mixes the same."""
        if self.mix is None or not self.mixing:
            return values
        kinds = (IMAGE, encoded.ENCODED)
        images = [i for i, f in enumerate(plans) if f is not None and f.kind in kinds]
        labels = [i for i, f in enumerate(plans) if f and f.kind == INT and len(f.shape) == 1]
        if len(images) != 1 or len(labels) != 1:
            named = ", ".join(f"{f.name!r}: {f.kind} {f.shape}" for f in plans if f is not None)
            raise BatchError(
                "mix= mixes one image field with one label field (integers, one per sample); "
                f"this batch has {named}"
            )
        (i,), (j,) = images, labels
        host = self.prepare.generator(torch.device("cpu"))
        values[i], values[j] = self.mix(values[i], values[j], host)
        return values

    def _view(self, f: Field, raw: torch.Tensor) -> torch.Tensor:
        """The field's bytes as its values; images and masks as ``(N, H, W, C)``."""
        x = (widen(raw, numpy_dtype(f.dtype)) if f.integer else raw.view(f.dtype)).view(f.shape)
        if f.kind in (INT, AS_IS):
            return x if f.out == torch.int64 else x.to(f.out)
        if f.layout == "NHWC":
            return x
        return x.permute(0, 2, 3, 1) if f.layout == "NCHW" else x[..., None]


def tally(s: TransferStats, plans: list[Field | None], copies: int, device=None) -> None:
    """Count a batch's fields as they crossed, in ``copies`` host->device copies (to
    ``device``: its JPEG fields' decoder)."""
    for f in filter(None, plans):
        if f.kind == encoded.ENCODED:  # the files count, beside what uint8 would move
            s.decoded_bytes += f.decoded_bytes
            s.decoder = decoder_on(device)
        integer = f.kind != encoded.ENCODED and f.integer
        s.image_bytes += f.nbytes if f.kind in (IMAGE, encoded.ENCODED) else 0
        s.label_bytes += f.nbytes if integer else 0
        s.other_bytes += f.nbytes if f.kind in (MASK, INT, AS_IS) and not integer else 0
        s.usual_bytes += f.usual_bytes
    s.copies += copies


@dataclass
class Sent:
    """One batch on its way: its copy in flight, and what it is rebuilt from."""

    dev: torch.Tensor  # the copy in flight
    host: torch.Tensor  # the slot's bytes: JPEG fields are decoded from here
    slot: int
    plans: list[Field | None]
    offsets: list[int]  # each field's, in the slot
    leaves: list[tuple[Name, Any]]  # what is not an array passes through from here
    rebuild: Callable[[list], Any]
    state: Any  # the source's, after this batch


class Wrapped(Epochs):
    """An iterable of batches moved and prepared on the device; see ``wrap``. Every attribute
    it does not own (``__slots__``, its methods and properties) is the source's: read there,
    written there (Lightning sets ``worker_init_fn``); timm's ``mixup_enabled`` reaches the
    mix wherever it lives."""

    __slots__ = ("batches", "fields", "_device", "epoch", "position", "_stats", "_ring")
    __slots__ += ("_where", "_state", "_behind")
    slots = 3  # one read by the copy in flight, one handed out, one being filled

    def __init__(self, batches: Iterable, fields: Fields, device: str | torch.device) -> None:
        self.batches, self.fields, self._device = batches, fields, device
        placement(device)  # a bad device fails here, not at the first pass
        self.epoch, self.position = 0, 0  # position: batches of `epoch` already yielded
        self._stats, self._ring, self._where = TransferStats(), None, None
        self._state: Any = None  # the source's state after the last batch handed out
        self._behind: Behind | None = None  # this pass's source, read ahead

    def __getattr__(self, name: str) -> Any:
        """The source's attribute; ``state_dict`` and ``load_state_dict`` are latecast's
        where the source has them (Lightning and accelerate ask ``hasattr``)."""
        if name in Wrapped.__slots__ or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)  # not set yet (copy, pickle): never the source's
        if name in ("state_dict", "load_state_dict") and hasattr(self.batches, name):
            return getattr(self, f"_{name}")
        return getattr(self.batches, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in Wrapped.__slots__ or isinstance(getattr(Wrapped, name, None), property):
            object.__setattr__(self, name, value)
        else:
            setattr(self.batches, name, value)

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def device(self) -> torch.device:
        return self._where[0] if self._where else placement(self._device)[0]

    @property
    def mean(self) -> tuple[float, ...] | None:
        """The mean it normalizes with (``fields`` holds every option): what a second loader
        made from ``w.dataset`` needs, ``latecast.wrap(that, mean=w.mean, std=w.std)``."""
        return self.fields.mean

    @property
    def std(self) -> tuple[float, ...] | None:
        return self.fields.std

    @property
    def mixup_enabled(self) -> bool:
        """timm's switch of its loader's mixing (its train.py turns it off at
        ``--mixup-off-epoch``), for the mix wherever it lives: wrap's own ``mix=``, else the
        source's own switch or its ``collate_fn``'s (timm's ``FastCollateMixup``). False
        where nothing mixes, as timm's loader says; switching that on is an error."""
        owner, name = self._mixer()
        return owner is not None and bool(getattr(owner, name))

    @mixup_enabled.setter
    def mixup_enabled(self, on: bool) -> None:
        owner, name = self._mixer()
        if owner is not None:
            setattr(owner, name, on)
        elif on:
            raise ConfigError(
                "mixup_enabled = True: nothing mixes here; give wrap mix=..., or a loader "
                "whose collate_fn mixes and has mixup_enabled (timm's FastCollateMixup)"
            )

    def _mixer(self) -> tuple[Any, str]:
        if self.fields.mix is not None:
            return self.fields, "mixing"
        for owner in (self.batches, getattr(self.batches, "collate_fn", None)):
            if owner is not None and hasattr(owner, "mixup_enabled"):
                return owner, "mixup_enabled"
        return None, ""

    @property
    def stats(self) -> TransferStats:
        """Bytes by kind (images, integers, others), copies, batches, data wait, and what the
        same batches would have cost moved as they arrived (``usual_bytes``)."""
        return replace(self._stats)

    def set_epoch(self, epoch: int) -> None:
        """Seed augmentation from ``epoch`` and pass it on: to the source's own ``set_epoch``
        where it has one (accelerate's loaders pass it on themselves), else to its sampler and
        its dataset (a shuffled iterable dataset, Hugging Face's, draws its order from it)."""
        super().set_epoch(epoch)
        source = self.batches
        if callable(getattr(source, "set_epoch", None)):
            source.set_epoch(epoch)
            return
        for obj in (getattr(source, "sampler", None), getattr(source, "dataset", None)):
            if callable(getattr(obj, "set_epoch", None)):
                obj.set_epoch(epoch)

    def _state_dict(self) -> dict:
        source = self._state
        if source is None:  # after the last batch (the source run to its end), or before any
            behind = self._behind
            source = behind.finish(self.batches.state_dict) if behind else self.batches.state_dict()
        return {"epoch": self.epoch, "position": self.position, "source": source}

    def _source_state(self) -> Any:
        """The source's state, or None where it keeps none (accelerate's DataLoaderShard has
        a ``state_dict`` that fails over a plain DataLoader)."""
        try:
            return self.batches.state_dict() if hasattr(self.batches, "state_dict") else None
        except AttributeError:
            return None

    def _load_state_dict(self, state: dict) -> None:
        epoch, position = self._saved(state, "source")
        self.batches.load_state_dict(state["source"])
        self.epoch, self.position, self._state = epoch, position, None
        self._behind = None

    def __iter__(self) -> Iterator[Any]:
        self._start()
        yield from self._count(self._finished())

    def _start(self) -> None:
        if self._where is None:  # resolved at the first pass: a launcher may start after us
            self._where = placement(self._device)
            self._ring = Ring(self.slots, self._where[0], side=True)

    def _finished(self) -> Iterator[tuple[Any, bool]]:
        """Each batch finished on the device and whether it is the last; the next one's copy
        is started before (``ahead``), so it overlaps the use of this one, from a source that
        looks as if it were not read ahead (``Behind``)."""
        source, stateful = Behind(self.batches), self._source_state() is not None
        self._behind = source
        yield from self._ahead(source, stateful)
        rest = source.rest()  # past the last by len(): nothing, unless len() fell short
        if rest is not None:  # then the epoch counted as ended at the last by len() goes on
            self.epoch, self.position = self.epoch - 1, source.taken - 1
            yield from self._ahead(rest, stateful)

    def _ahead(self, batches: Iterable, stateful: bool) -> Iterator[tuple[Any, bool]]:
        sent = (self._send(batch, stateful) for batch in batches)
        t0 = time.perf_counter()
        for s, last in ahead(sent):
            batch = self._finish(s)
            self._stats.wait_seconds += time.perf_counter() - t0
            self._state = None if last else s.state  # the last: the next epoch's, from the source
            self._behind.show(0)  # the next batch is taken: the source as before it
            yield batch, last
            t0 = time.perf_counter()

    def _finish(self, s: Sent) -> Any:
        """A sent batch prepared on the device, once its copy is done; a JPEG field's files
        stay in the pinned slot, where the decoder reads them."""
        dev = self._ring.ready(s.slot, s.dev)
        where = (self.epoch, self._where[1], self.position)
        self._stats.batches += 1
        raws = [
            f and (s.host if f.kind == encoded.ENCODED else dev)[o : o + f.nbytes]
            for f, o in zip(s.plans, s.offsets)
        ]
        done = self.fields.finish(s.plans, raws, where, self._where[0])
        values = [value if d is None else d for (_, value), d in zip(s.leaves, done)]
        return s.rebuild(self.fields.mixed(s.plans, values))

    def _send(self, batch: Any, stateful: bool) -> Sent:
        """A batch of the source packed into the ring, its copy started."""
        state = self._source_state() if stateful else None  # before we read further
        leaves, rebuild = split(batch)
        tensors, plans = self.fields.plan_batch(leaves, host=True)
        # Widest dtype first: every field then starts at a multiple of its own item size, so
        # it can be viewed as its dtype on the device with no padding between fields. JPEG
        # files last: they stay in the pinned buffer, the decoder copies them itself.
        order = sorted(
            (i for i, p in enumerate(plans) if p),
            key=lambda i: (plans[i].kind == encoded.ENCODED, -plans[i].dtype.itemsize),
        )
        offsets, end, sent = [0] * len(plans), 0, 0
        for i in order:
            offsets[i], end = end, end + plans[i].nbytes
            sent = end if plans[i].kind != encoded.ENCODED else sent
        slot, host = self._ring.stage(end)
        for i in order:
            self._pack(host[offsets[i] : offsets[i] + plans[i].nbytes], plans[i], tensors[i])
        dev = self._ring.send(slot, host[:sent])
        if dev.data_ptr() == host.data_ptr():  # a CPU "device": never hand out the ring's memory
            dev = dev.clone()
        tally(self._stats, plans, copies=1, device=self._where[0])
        return Sent(dev, host, slot, plans, offsets, leaves, rebuild, state)

    def _pack(self, dst: torch.Tensor, f: Field, t: torch.Tensor) -> None:
        """Write ``t`` into the pinned bytes ``dst`` in the dtype it crosses in."""
        if f.kind == encoded.ENCODED:
            f.pack(dst)
        elif f.dtype != t.dtype:  # narrowed: numpy casts every integer dtype; the values fit
            out = dst.numpy().view(numpy_dtype(f.dtype)).reshape(f.shape)
            np.copyto(out, t.detach().numpy(), casting="unsafe")
        else:
            dst.view(t.dtype).view(f.shape).copy_(t)


class Mover(Wrapped):
    """``mover(batch)``: one host batch moved and prepared as ``wrap`` moves each of its
    batches (one pinned buffer, one copy, narrow integers, images normalized on the device),
    for programs that build their batches per call (nanoGPT's ``get_batch``). No read-ahead:
    a batch function that draws from the global RNG draws exactly when it did without it.
    ``position`` counts the calls, and seeds the augmentation with ``epoch`` and the rank.
    Safe from several threads: their calls take turns (one lock around each whole call; its
    ring slot and seeds would otherwise be shared), and each thread gets its own batch.

    Example:
        >>> mover = latecast.Mover(device="cuda")            # wrap's options: fields=, mean=...
        >>> x, y = mover((x, y))   # int64 token ids cross as uint16, int64 on the device
    """

    def __init__(self, *, device: str | torch.device = "auto", **options: Any) -> None:
        super().__init__(None, Fields.of(options), device)
        object.__setattr__(self, "_lock", threading.Lock())  # not the source's: it has none

    def __call__(self, batch: Any) -> Any:
        with self._lock:
            self._start()
            batch = self._finish(self._send(batch, stateful=False))
            self.position += 1
        return batch


class WrappedLoader(Wrapped, DataLoader):
    """``wrap`` of a ``DataLoader``: an instance of the loader's own class that shares its
    attributes (one ``__dict__``) and moves its batches. So frameworks that look for a
    DataLoader find one: Lightning injects its ``DistributedSampler`` by re-making it as
    ``type(w)(**arguments read off it)``, which makes a loader of the source's class from those
    arguments and wraps it the same way. accelerate's ``prepare`` would re-make it as its own
    class: that is refused (wrap what ``prepare`` returns instead; README, "Your own data")."""

    source: type  # set on each wrap's own class, with `options`: what __init__ re-makes
    options: tuple  # (Fields, device)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._adopt(self.source(*args, **kwargs))

    @property
    def _is_accelerate_prepared(self) -> bool:
        """What accelerate's ``prepare`` asks a DataLoader first: True returns it as it is.
        A source accelerate has not sharded would be re-made as accelerate's own
        ``DataLoaderShard`` from its arguments, without the wrap (uint8 to the loop)."""
        if vars(self).get("_is_accelerate_prepared") or type(self.batches).__module__.startswith(
            "accelerate."
        ):
            return True
        raise ConfigError(
            "accelerator.prepare(latecast.wrap(dl)) would re-make the loader as accelerate's "
            "DataLoaderShard without latecast (uint8 batches); wrap what prepare returns: "
            "latecast.wrap(accelerator.prepare(dl, device_placement=[False]), mean=..., std=...)"
        )

    def _adopt(self, loader: DataLoader) -> WrappedLoader:
        object.__setattr__(self, "__dict__", loader.__dict__)
        Wrapped.__init__(self, loader, *self.options)
        return self


def loader_class(cls: type, fields: Fields, device: str | torch.device) -> type:
    """A ``WrappedLoader`` class for loaders of class ``cls``, wrapped with these options."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        WrappedLoader.__init__(self, *args, **kwargs)

    __init__.__signature__ = inspect.signature(cls.__init__)  # read by Lightning to re-make it
    body = {"__init__": __init__, "source": cls, "options": (fields, device)}
    if hasattr(cls, "state_dict"):  # else the source's own, one batch ahead, would answer
        body.update(state_dict=Wrapped._state_dict, load_state_dict=Wrapped._load_state_dict)
    return type(f"Wrapped{cls.__name__}", (WrappedLoader, cls), body)


def wrap(batches: Iterable, *, device: str | torch.device = "auto", **options: Any) -> Wrapped:
    """Batches of ``batches`` (any iterable: a ``DataLoader``, a generator, a list) on the
    device: uint8 images augmented and normalized there, integers widened there after
    crossing narrow, every field of a batch in one pinned buffer and one copy, the next
    batch's copy started on a side CUDA stream while this one is used. Every attribute but
    latecast's own (``stats``, ``device``, ``epoch``, ...) is read from and written to
    ``batches``; a ``DataLoader`` comes back as one of its class (``WrappedLoader``). Rank and
    device are resolved at the first pass. What a field is: see the module docstring.

    Args:
        batches: yields a tensor, a tuple/list or a dict of tensors or numpy arrays.
        device: ``"auto"`` (``cuda:LOCAL_RANK`` under a launcher), ``"cpu"``, ``"cuda:1"``, ...
        options: the fields of ``Fields``:
        mean, std: per-channel statistics in [0, 1] units (as ``Normalize``); without them
            images are only scaled to [0, 1] (as ``ToTensor``).
        augment: ``f(images, generator)`` on uint8 ``(N, H, W, C)``, e.g. ``latecast.Augment``
            (without ``altflip``: it needs dataset indices; an ``Augment`` where there are
            masks); seeded from (seed, epoch, rank, batch) like the Loader's.
        dtype, channels_last: the images' output dtype and memory format: the model's
            (timm's ``--model-dtype bfloat16``: ``dtype=torch.bfloat16``).
        layout: ``"auto"``, ``"NHWC"`` or ``"NCHW"``: where uint8 images keep their channels.
        fields: ``{name: "image" | "mask" | integer dtype | (integer dtype, output dtype)}``.
        seed: mixed into the augmentation's seeds.
        erase: ``latecast.Erasing(p=...)``, torchvision's ``RandomErasing`` per image on the
            normalized batch (drawn from the augmentation's generator).
        mix: ``f(images, labels, generator)`` on the normalized images and the batch's one
            integer field of one value per sample, e.g. ``latecast.transforms.Mix`` or
            torchvision's ``lambda x, y, g: MixUp(num_classes=10)(x, y)``; the labels come out
            as it makes them (class probabilities). ``mixup_enabled`` switches it.

    Example:
        >>> tf = torchvision.transforms.PILToTensor()   # uint8 (C, H, W), not ToTensor()
        >>> dl = DataLoader(ImageFolder("train", tf), batch_size=256, num_workers=8)
        >>> for images, labels in latecast.wrap(dl, mean=MEAN, std=STD, device="cuda"):
        ...     ...   # float32 (256, 3, H, W) normalized on the device; int64 labels
    """
    if not isinstance(batches, Iterable):
        raise ConfigError(f"batches must be an iterable of batches, got {batches!r:.60}")
    spec = Fields.of(options)
    if isinstance(batches, Wrapped):
        raise ConfigError(f"{type(batches).__name__} is wrapped already: wrap its source once")
    if isinstance(batches, DataLoader):
        return object.__new__(loader_class(type(batches), spec, device))._adopt(batches)
    return Wrapped(batches, spec, device)
