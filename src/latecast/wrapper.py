"""``wrap``'s core: any iterable of batches planned field by field (``fields.py``), packed
and moved as the Loader's (``transfer.pack``), prepared on the device (``Prepare.fields``).
``latecast.wrap`` itself, and what it forwards to a source, is ``integrations/dataloader.py``."""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch

from .distributed import placement
from .errors import BatchError, ConfigError, check, numbers_of, refuse
from .fields import LAYOUTS, Field, Image, Integer, Mask, as_tensor, declaration, image_hint, split
from .loader import Epochs
from .prepare import Augmentation, Mixing, Prepare
from .threads import one_thread
from .transfer import Ring, Sent, TransferStats, ahead, pack, unpack
from .transforms import FLOATS, Augment, Erasing

ALTFLIP = "without altflip (it needs each sample's dataset index, which only a Loader has)"
MASKS = "a latecast.Augment where fields= declares a mask (its geometric draws move the mask)"


def holds_arrays(value: Any) -> bool:
    """A dict, list or tuple with a tensor or an array somewhere inside."""
    if isinstance(value, (dict, list, tuple)):
        return any(map(holds_arrays, value.values() if isinstance(value, dict) else value))
    return as_tensor(value) is not None


@dataclass
class Fields:
    """The options of ``wrap``, ``Mover`` and ``prepare_on_device`` (``wrap``'s Args), checked
    when given (ConfigError); by them a batch is planned field by field on the host (``plan``,
    ``narrow``), packed and sent (``send``) and finished on the device (``finish``)."""

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
    recognise = None  # an undeclared field's (declaration, value) or None: the edge's (JPEG)

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
        aug, erase, flag, spec = self.augment, self.erase, self.channels_last, self.fields
        refuse([(spec is None or isinstance(spec, dict), "fields", spec, "a dict or None")])
        self.plans = {name: declaration(name, kind) for name, kind in (spec or {}).items()}
        ours, value, n = isinstance(aug, Augment), getattr(erase, "value", None), len(mean or ())
        ok = not (isinstance(value, tuple) and n and len(value) not in (1, n))  # erase.value
        masks = any(p == Mask.plan for p in self.plans.values())
        refuse(
            [  # (accepted?, argument, its value, what is accepted)
                (aug is None or callable(aug), "augment", aug, "f(images, generator)"),
                (not (ours and aug.altflip), "augment", aug, ALTFLIP),
                (ours or aug is None or not masks, "augment", aug, MASKS),
                (isinstance(flag, (bool, np.bool_)), "channels_last", flag, "a bool"),
                (erase is None or callable(erase), "erase", erase, "a latecast.Erasing or None"),
                (self.mix is None or callable(self.mix), "mix", self.mix, "f(images, labels, g)"),
                (ok, "erase.value", value, f"one number or {n}, one per channel as mean/std"),
            ]
        )
        check(self.dtype, "dtype", FLOATS)
        check(self.layout, "layout", LAYOUTS)
        check(self.mask_fill, "mask_fill", float)
        self.normalizes = mean is not None  # else ToTensor() alone: x / 255
        self.looked, self.mixing = False, True  # mixing: timm's loader.mixup_enabled switch
        same = {k: getattr(self, k) for k in ("dtype", "channels_last", "erase", "mask_fill")}
        seed = check(self.seed, "seed", int, 0, below=2**63)
        self.prepare = Prepare(mean or (0.0,), std or (1.0,), augment=aug, seed=seed, **same)

    @classmethod
    def of(cls, options: dict[str, Any]) -> Fields:
        """``Fields(**options)``; an unknown option is one ConfigError naming the known ones."""
        known = [f.name for f in dataclasses.fields(cls)]
        for name in [name for name in options if name not in known]:
            raise ConfigError(f"unknown option {name!r}; the options: {', '.join(known)}")
        return cls(**options)

    def plan(self, leaves: list[tuple]) -> tuple[list[Any], list[Field | None]]:
        """Each field's value (a tensor where it is an array) and its kind's plan (None: it
        passes through), dispatched once; then what the fields are held to together."""
        if missing := set(self.plans) - {name for name, _ in leaves}:
            raise BatchError(
                f"fields= names {sorted(map(repr, missing))} but this batch has fields "
                + ", ".join(repr(name) for name, _ in leaves)
            )
        values, plans = [], []
        self.leaves = leaves  # the batch's fields, for a kind read beside another (lengths)
        for name, value in leaves:
            t, plan = as_tensor(value), self.plans.get(name)
            if plan is None and t is None and self.recognise is not None and not self.moved:
                plan, value = self.recognise(value, name) or (plan, value)  # read once: paths
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
            if hasattr(plan, "plan"):  # a declaration: takes what is no array too
                plans.append(plan.plan(name, values[-1], self))
            elif t is None or plan is not None:  # None: not an array, it passes through
                plans.append(None if t is None else plan(name, t, self))
            elif t.dtype == torch.uint8 and t.ndim == 4:
                plans.append(Image.plan(name, t, self, declared=False))
            else:
                plans.append(Integer.plan(name, t, self))
        self._look(values, plans)
        self._check(plans)
        return values, plans

    def _check(self, plans: list[Field | None]) -> None:
        """Images and masks share (N, H, W); of two undeclared uint8 4-d fields one is likely a
        mask; masks beside JPEG fields are each file's size, every image coming out at one
        size (BatchError). Under an augmentation that moves the images, an undeclared field
        shaped like their pixels is a mask left behind (ConfigError)."""
        pixels = [f for f in plans if isinstance(f, (Image, Mask))]
        images = [f for f in pixels if isinstance(f, Image)]
        if len(guessed := [f.name for f in images if f.name not in self.plans]) > 1:
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
        aug, shapes = self.augment, {f.nhw for f in images}
        if isinstance(aug, Augment) and (aug.crop or aug.flip or aug.resized_crop):
            shapes |= {(n, 1, h, w) for n, h, w in shapes}
            for f in plans:
                if f and not f.pixels and f.name not in self.plans and f.shape in shapes:
                    raise ConfigError(
                        f"field {f.name!r} {f.dtype} {f.shape} is shaped like the images' pixels, "
                        "and augment= crops and flips the images but not it: declare it, "
                        f"fields={{{f.name!r}: 'mask'}} (moved with the images), or give its "
                        f"dtype, fields={{{f.name!r}: {f.dtype}}}, to leave it as it is"
                    )
        masks = [f for f in pixels if isinstance(f, Mask)]
        files = [f for f in plans if f is not None and f.pixels and f.on_host]
        if not (masks and files):
            return
        m, (n, h, w) = masks[0], masks[0].nhw
        for f in files:
            other = [(k, a, b) for k, (a, b) in enumerate(f.sizes.tolist()) if (a, b) != (h, w)]
            bad = "its file at position {} is {}x{}".format(*other[0]) if other else ""
            if bad := f"it holds {len(f.files)} files" if len(f.files) != n else bad:
                raise BatchError(
                    f"field {m.name!r}: masks {(n, h, w)} are moved with the files of JPEG field "
                    f"{f.name!r} (by their decoding boxes), but {bad}"
                )
        if len(outs := {f.size for f in files} | {f.nhw[1:] for f in images}) > 1:
            raise BatchError(
                f"field {m.name!r}: masks come out at the size of their JPEG images, so every "
                f"image of the batch must come out at one size, got {sorted(outs)}"
            )

    def _look(self, values: list, plans: list[Field | None]) -> None:
        """At the first batch, and at each where mean/std are given but no field is an image:
        fields that look like images but are not, said (UserWarning) or refused (BatchError)."""
        images = any(f is not None and f.category == "image" for f in plans)
        if self.looked and (images or not self.normalizes):
            return
        self.looked, named = True, [(f, t) for f, t in zip(plans, values) if f is not None]
        tensors = [
            (f, t) for f, t in named if isinstance(t, torch.Tensor) and not isinstance(f, Image)
        ]
        hints = [h for f, t in tensors if (h := image_hint(f.name, t))]
        if self.normalizes and not images:
            got = ", ".join(f"{f.name!r}: {t.dtype} {tuple(t.shape)}" for f, t in named)
            fix = "yield uint8 with PILToTensor() or ToImage(), or declare fields={name: 'image'}"
            raise BatchError(
                f"mean/std were given but no field of this batch is a uint8 image ({got}); "
                + ("; ".join(hints) or fix)
            )
        for hint in hints:
            warnings.warn(f"latecast.wrap: {hint}", UserWarning, stacklevel=6)

    def send(self, ring: Ring, batch: Any, stats: TransferStats, *keep: Any) -> Sent:
        """``batch`` planned, each field in the dtype it crosses in (``narrow``), packed into
        ``ring`` and its copy started; ``Sent.extra``: ``(leaves, rebuild, *keep)``."""
        leaves, rebuild = split(batch)
        values, plans = self.plan(leaves)
        s = pack(ring, [f and f.narrow(v, self) for f, v in zip(plans, values)], values, stats)
        s.extra = (leaves, rebuild, *keep)
        return s

    def finish_batch(self, plans: list, views: list, extra: tuple, where: tuple, device) -> Any:
        """The batch in its own form (``extra``: as ``send`` keeps it) from its fields' ``views``
        on ``device``, finished (``finish``) and mixed (``mixed``)."""
        done = self.finish(plans, views, where, device)
        values = [value if d is None else d for (_, value), d in zip(extra[0], done)]
        return extra[1](self.mixed(plans, values))

    @one_thread()  # latecast's own CPU work: threads.py
    def finish(self, plans: list, values: list, where: tuple, device: torch.device) -> list:
        """The fields' values on the device made what the model takes, seeded by ``where``
        (epoch, rank, batch); a file that does not decode is a BatchError naming its field."""
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
    """An iterable of batches moved and prepared on the device, each batch's copy started
    before the one before it is handed out; see ``latecast.wrap``."""

    __slots__ = ("batches", "fields", "_device", "epoch", "position", "_stats", "_ring", "_where")
    slots = 3  # one read by the copy in flight, one handed out, one being filled
    mean = property(lambda self: self.fields.mean)  # for a second loader: wrap(dl, mean=w.mean)
    std = property(lambda self: self.fields.std)
    device = property(lambda self: self._where[0] if self._where else placement(self._device)[0])
    stats = property(lambda self: replace(self._stats))  # a copy: bytes by kind, copies, ...

    def __init__(self, batches: Iterable, fields: Fields, device: str | torch.device) -> None:
        self.batches, self.fields, self._device = batches, fields, device
        placement(device)  # a bad device fails here, not at the first pass
        self.epoch, self.position = 0, 0  # position: batches of `epoch` already yielded
        self._stats, self._ring, self._where = TransferStats(), None, None

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        self._start()
        yield from self._count(self._finished())

    def _start(self) -> None:
        if self._where is None:  # resolved at the first pass: a launcher may start after us
            self._where = placement(self._device)
            self._ring = Ring(self.slots, self._where[0], side=True)

    def _finished(self) -> Iterator[tuple[Any, bool]]:
        return self._ahead(self.batches)

    def _ahead(self, batches: Iterable, state: Callable = lambda: None) -> Iterator:
        """Each batch finished on the device and whether it is the last, the next one's copy
        started before (``ahead``); ``state()``, taken as each batch is read, kept beside it
        (``Sent.extra[2]``) for ``_handing``."""
        sent = (self.fields.send(self._ring, b, self._stats, state()) for b in batches)
        t0 = time.perf_counter()
        for s, last in ahead(sent):
            batch = self._finish(s)
            self._stats.wait_seconds += time.perf_counter() - t0
            self._handing(s, last)
            yield batch, last
            t0 = time.perf_counter()

    def _handing(self, s: Sent, last: bool) -> None:
        """Batch ``s`` is about to be handed out (what ``integrations`` tell its source)."""

    def _finish(self, s: Sent) -> Any:
        self._stats.batches += 1
        views, where = unpack(self._ring, s, keep=True), (self.epoch, self._where[1], self.position)
        return self.fields.finish_batch(s.plans, views, s.extra, where, self._ring.device)
