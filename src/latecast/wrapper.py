"""``wrap``'s core: any iterable of batches planned field by field (``fields.py``), packed
and moved as the Loader's (``transfer.pack``), prepared on the device (``Prepare.fields``).
``latecast.wrap`` itself is ``integrations/dataloader.py``."""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from . import encoded
from .distributed import placement
from .errors import BatchError, ConfigError, check, numbers_of, refuse
from .fields import (
    KINDS,
    NARROW,
    OUTS,
    AsIs,
    Declared,
    Field,
    Image,
    Integer,
    Mask,
    Name,
    as_tensor,
    holds_arrays,
    image_hint,
    split,
)
from .loader import Epochs
from .prepare import Augmentation, Mixing, Prepare
from .threads import one_thread
from .transfer import Behind, Ring, Sent, TransferStats, ahead, pack, unpack
from .transforms import FLOATS, Augment, Erasing

LAYOUTS = ("auto", "NHWC", "NCHW")


def declaration(name: Name, spec: Any) -> Any:
    """One entry of ``fields=`` as what plans it, ``plan(name, value, options) -> Field``;
    anything else is a ConfigError."""
    if isinstance(spec, str) and spec in KINDS:
        return KINDS[spec]
    if isinstance(spec, type) and issubclass(spec, Field):  # a kind of the user's own
        return spec.plan
    if callable(getattr(spec, "plan", None)) and not isinstance(spec, type):
        if isinstance(spec, encoded.Jpeg):
            encoded.decoder()  # a bad LATECAST_DECODER: its one error now, not at a batch
        return spec  # a kind's declaration: jpeg(), image16(), waveform(), clip()
    cross, out = spec if isinstance(spec, tuple) and len(spec) == 2 else (spec, torch.int64)
    if not any(cross is d for d in NARROW) or not any(out is d for d in OUTS):
        raise ConfigError(
            f"fields[{name!r}] = {spec!r:.60}: give 'image', 'mask', latecast.jpeg(), an "
            f"integer dtype to cross in ({', '.join(str(d) for d in NARROW)}), or (that "
            "dtype, the output dtype: an integer or float one), or a Field kind"
        )
    return Declared(cross, out).plan


def _channels(erase: Any, mean: tuple | None) -> bool:
    """An ``Erasing`` value of numbers per channel has one per ``mean`` value (or one)."""
    value = getattr(erase, "value", None)
    return not (isinstance(value, tuple) and mean and len(value) not in (1, len(mean)))


def _check_pixels(pixels: list[Field], declared: dict) -> None:
    """Images and masks of one batch share (N, H, W); of two undeclared uint8 4-d fields one
    is likely a mask: refused (BatchError)."""
    pixels = [f for f in pixels if isinstance(f, (Image, Mask))]
    guessed = [f.name for f in pixels if isinstance(f, Image) and f.name not in declared]
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


def _check_masks(pixels: list[Field]) -> None:
    """Masks beside JPEG fields: each file of the masks' size, every image of the batch coming
    out at one size (BatchError)."""
    masks = [f for f in pixels if isinstance(f, Mask)]
    files = [f for f in pixels if f.on_host]
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
    outs = {f.size for f in files} | {f.nhw[1:] for f in pixels if isinstance(f, Image)}
    if len(outs) > 1:
        raise BatchError(
            f"field {m.name!r}: masks come out at the size of their JPEG images, so every "
            f"image of the batch must come out at one size, got {sorted(outs)}"
        )


@dataclass
class Fields:
    """The options of ``wrap``, ``Mover`` and ``prepare_on_device`` (``wrap``'s Args), each
    checked when given (ConfigError); a batch's fields planned (``plan``, ``narrow``) and
    finished on the device (``finish``, ``mixed``) by them."""

    mean: tuple[float, ...] | None = None  # per channel, [0, 1] units; None: x / 255 alone
    std: tuple[float, ...] | None = None
    augment: Augmentation | None = None
    dtype: torch.dtype = torch.float32  # the images' output dtype
    channels_last: bool = False  # the images' output memory format
    layout: str = "auto"  # where uint8 images keep their channels: auto, NHWC or NCHW
    fields: dict | None = None  # {name: "image" | "mask" | jpeg() | dtype | (dtype, out) | kind}
    seed: int = 0  # mixed into the augmentation's seeds
    erase: Erasing | None = None  # random erasing after the normalize (timm's --reprob)
    mix: Mixing | None = None  # f(images, labels, generator) after the normalize, e.g. a Mix
    mask_fill: float = 0  # what a mask is padded with where a crop leaves no pixel

    moved = False  # the batches arrive on the device, moved by another framework (Lightning)

    def __post_init__(self) -> None:
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
        if self.fields is not None and not isinstance(self.fields, dict):
            raise ConfigError(
                f"fields must be a dict {{name: kind}} or None, got {self.fields!r:.60}"
            )
        self.plans = {name: declaration(name, spec) for name, spec in (self.fields or {}).items()}
        aug, erase, flag = self.augment, self.erase, self.channels_last
        ours = isinstance(aug, Augment)
        check(self.dtype, "dtype", FLOATS)
        check(self.layout, "layout", LAYOUTS)
        seed = check(self.seed, "seed", int, 0, below=2**63)
        check(self.mask_fill, "mask_fill", float)
        per_channel = f"one number or {len(mean or ())}, one per channel as mean/std"
        altflip = "without altflip (it needs each sample's dataset index, which only a Loader has)"
        masks = (
            "a latecast.Augment where fields= declares a mask (its geometric draws move the mask)"
        )
        has_mask = any(p == Mask.plan for p in self.plans.values())
        refuse(
            [  # (accepted?, argument, its value, what is accepted)
                (aug is None or callable(aug), "augment", aug, "f(images, generator)"),
                (not (ours and aug.altflip), "augment", aug, altflip),
                (ours or aug is None or not has_mask, "augment", aug, masks),
                (isinstance(flag, (bool, np.bool_)), "channels_last", flag, "a bool"),
                (erase is None or callable(erase), "erase", erase, "a latecast.Erasing or None"),
                (self.mix is None or callable(self.mix), "mix", self.mix, "f(images, labels, g)"),
                (_channels(erase, mean), "erase.value", getattr(erase, "value", 0), per_channel),
            ]
        )
        self.normalizes = mean is not None
        self.looked = False  # at the first batch: fields that look like images but are not
        self.mixing = True  # `mix` on; timm's loader.mixup_enabled switches it
        self.prepare = Prepare(
            (0.0,) if mean is None else mean,  # no mean/std: ToTensor() alone, x / 255
            (1.0,) if std is None else std,
            dtype=self.dtype,
            channels_last=self.channels_last,
            augment=self.augment,
            seed=seed,
            erase=self.erase,
            mask_fill=self.mask_fill,
        )

    @classmethod
    def of(cls, options: dict[str, Any]) -> Fields:
        """``Fields(**options)``; an unknown option is one ConfigError naming the known ones."""
        known = [f.name for f in dataclasses.fields(cls)]
        for name in options:
            if name not in known:
                raise ConfigError(f"unknown option {name!r}; the options: {', '.join(known)}")
        return cls(**options)

    def plan(self, leaves: list[tuple[Name, Any]]) -> tuple[list[Any], list[Field | None]]:
        """Each field's value (a tensor where it is an array) and its kind's plan (None: it
        passes through), dispatched once; then the checks a batch's fields are held to."""
        self.leaves = leaves  # a declaration may read a field beside its own (audio's lengths)
        missing = set(self.plans) - {name for name, _ in leaves}
        if missing:
            raise BatchError(
                f"fields= names {sorted(map(repr, missing))} but this batch has fields "
                + ", ".join(repr(name) for name, _ in leaves)
            )
        values, plans = [], []
        for name, value in leaves:
            t, plan = as_tensor(value), self.plans.get(name)
            if plan is None and t is None and not self.moved:
                plan = encoded.Jpeg() if encoded.recognised(value, name) is not None else None
            if t is not None and t.device.type != "cpu" and not self.moved:
                raise BatchError(
                    f"field {name!r} is already on {t.device}: wrap moves batches from host "
                    "memory; give it the DataLoader before anything moves them"
                )
            if t is None and not hasattr(plan, "plan") and holds_arrays(value):
                raise BatchError(
                    f"field {name!r} is a {type(value).__name__} holding tensors or arrays: wrap "
                    "moves the fields of a flat batch (a dict, tuple or list of tensors); "
                    "flatten it, e.g. {" + f"'{name}.x': tensor" + "}"
                )
            values.append(value if t is None else t)
            plans.append(self._plan(name, values[-1], t, plan))
        self._look(values, plans)
        pixels = [f for f in plans if f is not None and f.pixels]
        _check_pixels(pixels, self.plans)
        self._check_per_pixel(plans, pixels)
        _check_masks(pixels)
        return values, plans

    def _plan(self, name: Name, value: Any, t: torch.Tensor | None, plan) -> Field | None:
        if hasattr(plan, "plan"):  # a declaration (jpeg(), waveform()): takes what is not an array
            return plan.plan(name, value, self)
        if t is None:
            return None  # not an array: it passes through
        if plan is not None:
            return plan(name, t, self)
        if t.dtype == torch.uint8 and t.ndim == 4:
            return Image.plan(name, t, self, declared=False)
        return Integer.plan(name, t, self)

    def _check_per_pixel(self, plans: list[Field | None], pixels: list[Field]) -> None:
        """An undeclared field shaped like the images' pixels, (N, H, W) or (N, 1, H, W), under
        an augmentation that moves the images: a mask left behind, refused (ConfigError)."""
        aug = self.augment
        if not (isinstance(aug, Augment) and (aug.crop or aug.flip or aug.resized_crop)):
            return
        shapes = {f.nhw for f in pixels if isinstance(f, Image)}
        shapes |= {(n, 1, h, w) for n, h, w in shapes}
        for f in plans:
            if isinstance(f, (Integer, AsIs)) and f.name not in self.plans and f.shape in shapes:
                raise ConfigError(
                    f"field {f.name!r} {f.dtype} {f.shape} is shaped like the images' pixels, and "
                    "augment= crops and flips the images but not it: declare it, "
                    f"fields={{{f.name!r}: 'mask'}} (moved with the images), or give its dtype, "
                    f"fields={{{f.name!r}: {f.dtype}}}, to leave it as it is"
                )

    def _look(self, values: list, plans: list[Field | None]) -> None:
        """At the first batch, and at every batch where mean/std are given but no field is an
        image: fields that look like images but are not, said or refused."""
        images = any(f is not None and f.category == "image" for f in plans)
        if self.looked and (images or not self.normalizes):
            return
        self.looked = True
        hints = [
            h
            for f, t in zip(plans, values)
            if f is not None and not isinstance(f, Image) and isinstance(t, torch.Tensor)
            if (h := image_hint(f.name, t))
        ]
        if self.normalizes and not images:
            got = ", ".join(
                f"{f.name!r}: {t.dtype} {tuple(t.shape)}"
                for f, t in zip(plans, values)
                if f is not None
            )
            fix = "yield uint8 with PILToTensor() or ToImage(), or declare fields={name: 'image'}"
            raise BatchError(
                f"mean/std were given but no field of this batch is a uint8 image ({got}); "
                + ("; ".join(hints) or fix)
            )
        for hint in hints:
            warnings.warn(f"latecast.wrap: {hint}", UserWarning, stacklevel=6)

    def narrow(self, plans: list[Field | None], values: list) -> list[Field | None]:
        """Each field in the dtype it crosses in (integers: the narrowest that holds them)."""
        return [f if f is None else f.narrow(v, self) for f, v in zip(plans, values)]

    def send(self, ring: Ring, batch: Any, stats: TransferStats, *keep: Any) -> Sent:
        """``batch`` planned, packed into ``ring`` and its copy started; ``Sent.extra`` is
        ``(leaves, rebuild, *keep)``, what ``finish_batch`` rebuilds the batch from."""
        leaves, rebuild = split(batch)
        values, plans = self.plan(leaves)
        s = pack(ring, self.narrow(plans, values), values, stats)
        s.extra = (leaves, rebuild, *keep)
        return s

    def finish_batch(self, plans: list, views: list, extra: tuple, where: tuple, device) -> Any:
        """The batch rebuilt in its own form from its fields' ``views`` on the device,
        finished (``finish``) and mixed (``mixed``)."""
        leaves, rebuild = extra[:2]
        done = self.finish(plans, views, where, device)
        values = [value if d is None else d for (_, value), d in zip(leaves, done)]
        return rebuild(self.mixed(plans, values))

    @one_thread()  # latecast's own CPU work: threads.py
    def finish(self, plans: list, values: list, where: tuple, device: torch.device) -> list:
        """The fields' values on the device made what the model takes, seeded by ``where``
        (epoch, rank, batch); a file that does not decode is a BatchError naming its field."""
        with encoded.named():
            return self.prepare.fields(plans, values, where, device)

    def mixed(self, plans: list[Field | None], values: list) -> list:
        """``values`` with its one image field and its one integer field of one value per
        sample mixed by ``mix``, drawn from the batch's host generator (else a BatchError)."""
        if self.mix is None or not self.mixing:
            return values
        images = [i for i, f in enumerate(plans) if f is not None and f.category == "image"]
        labels = [i for i, f in enumerate(plans) if isinstance(f, Integer) and len(f.shape) == 1]
        if len(images) != 1 or len(labels) != 1:
            named = ", ".join(f"{f.name!r}: {f.what} {f.shape}" for f in plans if f is not None)
            raise BatchError(
                "mix= mixes one image field with one label field (integers, one per sample); "
                f"this batch has {named}"
            )
        (i,), (j,) = images, labels
        host = self.prepare.generator(torch.device("cpu"))
        values[i], values[j] = self.mix(values[i], values[j], host)
        return values


class Wrapped(Epochs):
    """An iterable of batches moved and prepared on the device; see ``wrap``. Every attribute
    it does not own (``__slots__``, its methods and properties) is read from and written to
    the source."""

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
        if name in Wrapped.__slots__ or getattr(getattr(type(self), name, None), "fset", None):
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
        """The mean it normalizes with, for a second loader: ``wrap(dl, mean=w.mean, ...)``."""
        return self.fields.mean

    @property
    def std(self) -> tuple[float, ...] | None:
        return self.fields.std

    @property
    def mixup_enabled(self) -> bool:
        """timm's switch of its loader's mixing, for the mix wherever it lives: ``mix=``, else
        the source's or its ``collate_fn``'s switch. False where nothing mixes; switching
        that on is a ConfigError."""
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
        """Bytes by kind, copies, batches, data wait, and ``usual_bytes`` (moved as they came)."""
        return replace(self._stats)

    def set_epoch(self, epoch: int) -> None:
        """Seed augmentation from ``epoch``; passed on to the source's ``set_epoch``, else to
        its sampler's and its dataset's."""
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
        """The source's state, or None where it keeps none."""
        try:
            return self.batches.state_dict() if hasattr(self.batches, "state_dict") else None
        except AttributeError:  # accelerate's DataLoaderShard over a plain DataLoader
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
        """Each batch finished on the device and whether it is the last, the next one's copy
        started before (``ahead``), from a source that looks not read ahead (``Behind``)."""
        source, stateful = Behind(self.batches), self._source_state() is not None
        self._behind = source
        yield from self._ahead(source, stateful)
        rest = source.rest()  # past the last by len(): nothing, unless len() fell short
        if rest is not None:  # then the epoch counted as ended at the last by len() goes on
            self.epoch, self.position = self.epoch - 1, source.taken - 1
            yield from self._ahead(rest, stateful)

    def _ahead(self, batches: Iterable, stateful: bool) -> Iterator[tuple[Any, bool]]:
        state = self._source_state if stateful else lambda: None  # taken before reading on
        sent = (self.fields.send(self._ring, b, self._stats, state()) for b in batches)
        t0 = time.perf_counter()
        for s, last in ahead(sent):
            batch = self._finish(s)
            self._stats.wait_seconds += time.perf_counter() - t0
            self._state = None if last else s.extra[2]  # the last: the next epoch's, the source's
            self._behind.show(0)  # the next batch is taken: the source as before it
            yield batch, last
            t0 = time.perf_counter()

    def _finish(self, s: Sent) -> Any:
        self._stats.batches += 1
        views, where = unpack(self._ring, s, keep=True), (self.epoch, self._where[1], self.position)
        return self.fields.finish_batch(s.plans, views, s.extra, where, self._ring.device)


class Mover(Wrapped):
    """``mover(batch)``: one host batch moved and prepared as ``wrap`` moves each of its
    batches, for programs that build batches per call; no read-ahead. ``position`` counts the
    calls and seeds the augmentation with ``epoch`` and the rank. Calls from several threads
    take turns.

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
            batch = self._finish(self.fields.send(self._ring, batch, self._stats))
            self.position += 1
        return batch
