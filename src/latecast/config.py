"""Settings declared once. Each option of a command is a field of a frozen dataclass with
its default, help text and allowed range (``option``); ``cli.py`` builds the command line
from the fields and ``validate`` checks every value in ``__post_init__``. The values of
``--augment`` and ``--mix`` are small languages of their own, parsed here too.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import field, fields
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .transforms import Augment, Mix

DATASET_HELP = (
    "dataset name (mnist, fashion-mnist, kmnist, cifar10, cifar100), a store folder, or "
    "WebDataset tar shards, streamed once indexed by latecast index (http://.../shard-{000..009}"
    ".tar, s3://..., path/shard-*.tar; the last is the test split)"
)
_TYPES = {  # kind -> (accepted type, its name, the type it is stored as)
    "int": (numbers.Integral, "an integer", int),
    "float": (numbers.Real, "a number", float),
    "str": (str, "a string", None),
    "bool": (bool, "true or false", None),
}
_BOUNDS = {
    "low": (">=", operator.ge),
    "above": (">", operator.gt),
    "high": ("<=", operator.le),
    "below": ("<", operator.lt),
}


def option(
    default: Any,
    help: str,
    *,
    short: str | None = None,
    positional: bool = False,
    metavar: str | None = None,
    **allowed: Any,
) -> Any:
    """A dataclass field that is also a command-line option ``--name-with-dashes``.
    ``allowed``: bounds ``low`` (>=), ``above`` (>), ``high`` (<=), ``below`` (<), or
    ``choices``."""
    meta = {"help": help, "short": short, "positional": positional, "metavar": metavar}
    return field(default=default, metadata={**meta, **allowed})


def kind(f) -> str:
    """``"int"``, ``"float"``, ``"str"`` or ``"bool"`` from a field's annotation."""
    return str(f.type).split("|")[0].strip()


def validate(config: Any) -> None:
    """Check every field of ``config`` against its annotation (``None`` only where that is
    the default; numpy integers count as ints, ``True`` does not; numbers are finite) and
    its range; ``ConfigError`` names the field, what is allowed and the value."""
    for f in fields(config):
        value, (want, what, cast) = getattr(config, f.name), _TYPES[kind(f)]
        if value is None and f.default is None:
            continue
        bounds = [
            (sym, test, f.metadata[k])
            for k, (sym, test) in _BOUNDS.items()
            if f.metadata.get(k) is not None
        ]
        choices = f.metadata.get("choices")
        ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
        if ok and cast:
            ok = math.isfinite(value) and all(test(value, b) for _, test, b in bounds)
        if choices is not None and value not in choices:
            raise ConfigError(f"{f.name} must be one of {', '.join(choices)}, got {value!r}")
        if want is str and ok and "\0" in value:  # no file or name can hold one
            raise ConfigError(f"{f.name} must not contain a NUL character, got {value!r}")
        if not ok:
            rule = " and".join(f" {sym} {b}" for sym, _, b in bounds)
            raise ConfigError(f"{f.name} must be {what}{rule}, got {value!r}")
        if cast:  # numpy scalars -> int, float
            object.__setattr__(config, f.name, cast(value))


# ---- the --augment and --mix mini-languages: "name[=value],..." --------------------------

# Used when a name is given without "=value" (CIFAR-style settings); also gives its type.
_AUGMENT_DEFAULTS = {
    "resized_crop": 0.35,
    "crop": 4,
    "flip": 0.5,
    "altflip": True,
    "jitter": 0.4,
    "cutout": 8,
    "fill": "zero",
}
_AUGMENT_HELP = (
    "crop[=PAD], flip[=P], cutout[=SIZE], fill=zero|reflect, resized_crop[=MIN_AREA], "
    "jitter[=STRENGTH], altflip, or none"
)


def _parse(spec: str, defaults: dict, what: str, valid: str) -> dict | None:
    """``name[=value],...`` -> ``{name: value}`` typed as ``defaults``; None for ""/none."""
    spec = spec.strip().lower()
    if spec in ("", "none"):
        return None
    given: dict[str, object] = {}
    for item in spec.split(","):
        name, _, value = (part.strip() for part in item.partition("="))
        if name not in defaults:
            raise ConfigError(f"unknown {what} {name!r} in {spec!r}; valid: {valid}")
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


def parse_augment(spec: str) -> Augment | None:
    """An ``Augment`` from the CLI string, ``None`` for ``""`` or ``"none"``: comma-separated
    names of ``_AUGMENT_HELP``, each optionally ``=value`` (else its ``_AUGMENT_DEFAULTS``
    value), e.g. ``"crop,flip,cutout"`` or ``"resized_crop=0.25,flip,jitter"``.

    Example:
        >>> parse_augment("crop=2,flip") == Augment(crop=2, flip=0.5)
        True
    """
    from .transforms import Augment  # torch: loaded when parsed, not when the CLI starts

    given = _parse(spec, _AUGMENT_DEFAULTS, "augmentation", _AUGMENT_HELP)
    return None if given is None else Augment(**given)


_MIX_DEFAULTS = {"mixup": 1.0, "cutmix": 1.0}  # torchvision's default alphas


def parse_mix(spec: str, classes: int) -> Mix | None:
    """A ``Mix`` from the CLI string (``"mixup=0.2"``, ``"cutmix"``, ``"mixup,cutmix"``), None
    for ``""`` or ``"none"``."""
    from .transforms import Mix

    given = _parse(spec, _MIX_DEFAULTS, "mix", "mixup[=ALPHA], cutmix[=ALPHA], or none")
    return None if given is None else Mix(classes, **given)
