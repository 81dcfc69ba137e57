"""One plan for every way in that takes anyone's batches (``wrap``, ``Mover``, the Lightning
hook): ``Options``, frozen and checked once, and ``plan``, which dispatches a batch's fields to
their kinds (a declaration in ``fields=``, else a recognised kind: JPEG files, else what the
value is) and holds them to what they must be together. The Loader plans nothing: its
datasets describe their batches (``Split.batch``)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import BatchError, ConfigError, check, numbers_of, refuse
from ..fields import (
    LAYOUTS,
    Field,
    Image,
    Integer,
    Mask,
    Planning,
    as_tensor,
    declaration,
    image_hint,
)
from ..kinds.jpeg import recognised
from ..pixels16 import Images16
from ..prepare import Augmentation, Mixing, Prepare
from ..transforms import FLOATS, Augment, Erasing

ALTFLIP = "without altflip (it needs each sample's dataset index, which only a Loader has)"
MASKS = "a latecast.Augment where fields= declares a mask (its geometric draws move the mask)"


@dataclass(frozen=True, eq=False)
class Options:
    """The options of ``wrap``, ``Mover`` and ``PrepareOnDevice`` (``wrap``'s Args), checked
    when made (ConfigError)."""

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
        kinds = {name: declaration(name, kind) for name, kind in (spec or {}).items()}
        ours, value, n = isinstance(aug, Augment), getattr(erase, "value", None), len(mean or ())
        ok = not (isinstance(value, tuple) and n and len(value) not in (1, n))  # erase.value
        masks = any(p == Mask.plan for p in kinds.values())
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
        object.__setattr__(self, "seed", check(self.seed, "seed", int, 0, below=2**63))
        object.__setattr__(self, "mean", mean)  # as numbers, or None
        object.__setattr__(self, "std", std)
        object.__setattr__(self, "kinds", kinds)  # name -> what plans it (``declaration``)

    @classmethod
    def of(cls, options: dict[str, Any]) -> Options:
        """``Options(**options)``; an unknown option is one ConfigError naming the known ones."""
        known = [f.name for f in dataclasses.fields(cls)]
        for name in [name for name in options if name not in known]:
            raise ConfigError(f"unknown option {name!r}; the options: {', '.join(known)}")
        return cls(**options)

    def prepare(self) -> Prepare:
        """The finish these options ask for (``prepare.py``)."""
        same = {k: getattr(self, k) for k in ("dtype", "channels_last", "erase", "mix", "seed")}
        mean, std = self.mean or (0.0,), self.std or (1.0,)
        return Prepare(mean, std, augment=self.augment, mask_fill=self.mask_fill, **same)


def holds_arrays(value: Any) -> bool:
    """A dict, list or tuple with a tensor or an array somewhere inside."""
    if isinstance(value, (dict, list, tuple)):
        return any(map(holds_arrays, value.values() if isinstance(value, dict) else value))
    return as_tensor(value) is not None


def plan(options: Options, leaves: list[tuple], first: bool = True, at: Planning | None = None):
    """A batch's ``(name, value)`` leaves as each field's value (a tensor where it is an
    array) and its kind's plan (None: it passes through), dispatched once: a declaration in
    ``fields=``, else JPEG files recognised by their signature, else what the value is; then
    what the fields are held to together (``first``: the source's first batch, where
    look-alikes are said; ``at``: what a declaration that ``draws`` is given)."""
    if missing := set(options.kinds) - {name for name, _ in leaves}:
        raise BatchError(
            f"fields= names {sorted(map(repr, missing))} but this batch has fields "
            + ", ".join(repr(name) for name, _ in leaves)
        )
    values, plans, batch = [], [], dict(leaves)
    for name, value in leaves:
        t, kind = as_tensor(value), options.kinds.get(name)
        if kind is None and t is None:
            kind, value = recognised(value, name) or (kind, value)  # read once: paths
        if t is None and not hasattr(kind, "plan") and holds_arrays(value):
            raise BatchError(
                f"field {name!r} is a {type(value).__name__} holding tensors or arrays: wrap "
                "moves the fields of a flat batch (a dict, tuple or list of tensors); "
                "flatten it, e.g. {" + f"'{name}.x': tensor" + "}"
            )
        values.append(value if t is None else t)
        if hasattr(kind, "plan"):  # a declaration: takes what is no array too
            more = {"at": at} if getattr(kind, "draws", False) else {}
            plans.append(kind.plan(name, values[-1], options, batch, **more))
        elif t is None or kind is not None:  # None: not an array, it passes through
            plans.append(None if t is None else kind(name, t, options, batch))
        elif t.dtype == torch.uint8 and t.ndim == 4:
            plans.append(Image.plan(name, t, options, batch, declared=False))
        else:
            plans.append(Integer.plan(name, t, options, batch))
    _look(options, values, plans, first)
    _check(options, plans)
    for f in filter(None, plans):
        f.together(plans)  # a kind's own rules across the batch's fields
    return values, plans


def _check(options: Options, plans: list[Field | None]) -> None:
    """Images and masks share (N, H, W); of two undeclared uint8 4-d fields one is likely a
    mask (BatchError). Under an augmentation that moves the images, an undeclared field
    shaped like their pixels is a mask left behind (ConfigError)."""
    pixels = [f for f in plans if isinstance(f, (Image, Mask))]
    images = [f for f in pixels if isinstance(f, Image)]
    deep = [f.name for f in plans if isinstance(f, Images16)]
    eight = [f for f in plans if f and f.category == "image" and not isinstance(f, Images16)]
    if options.mean is not None and deep and not eight:  # no field would take them
        raise ConfigError(
            f"mean={options.mean} and std={options.std} are for 8-bit images, and field "
            f"{deep[0]!r} is a 16-bit image: 16-bit fields take their own mean/std, "
            f"fields={{{deep[0]!r}: latecast.image16(mean=, std=)}}; leave wrap's out"
        )
    if len(guessed := [f.name for f in images if f.name not in options.kinds]) > 1:
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
    aug, shapes = options.augment, {f.nhw for f in images}
    if isinstance(aug, Augment) and (aug.crop or aug.flip or aug.resized_crop):
        shapes |= {(n, 1, h, w) for n, h, w in shapes}
        for f in plans:
            if f and not f.pixels and f.name not in options.kinds and f.shape in shapes:
                raise ConfigError(
                    f"field {f.name!r} {f.dtype} {f.shape} is shaped like the images' pixels, "
                    "and augment= crops and flips the images but not it: declare it, "
                    f"fields={{{f.name!r}: 'mask'}} (moved with the images), or give its "
                    f"dtype, fields={{{f.name!r}: {f.dtype}}}, to leave it as it is"
                )


def _look(options: Options, values: list, plans: list[Field | None], first: bool) -> None:
    """At the first batch, and at each where mean/std are given but no field is an image:
    fields that look like images but are not, said (UserWarning) or refused (BatchError)."""
    images, normalizes = any(f is not None and f.category == "image" for f in plans), options.mean
    if not first and (images or normalizes is None):
        return
    named = [(f, t) for f, t in zip(plans, values) if f is not None]
    tensors = [(f, t) for f, t in named if isinstance(t, torch.Tensor) and not isinstance(f, Image)]
    hints = [h for f, t in tensors if (h := image_hint(f.name, t))]
    if normalizes is not None and not images:
        got = ", ".join(f"{f.name!r}: {t.dtype} {tuple(t.shape)}" for f, t in named)
        fix = "yield uint8 with PILToTensor() or ToImage(), or declare fields={name: 'image'}"
        raise BatchError(
            f"mean/std were given but no field of this batch is a uint8 image ({got}); "
            + ("; ".join(hints) or fix)
        )
    for hint in hints:
        warnings.warn(f"latecast.wrap: {hint}", UserWarning, stacklevel=6)
