"""Settings declared once. Each option of a command is a field of a frozen dataclass with
its default, help text and allowed range (``option``); ``cli.py`` builds the command line
from the fields and ``validate`` checks every value in ``__post_init__``.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import field, fields
from typing import Any

from .errors import ConfigError

DATASET_HELP = "dataset name (mnist, fashion-mnist, kmnist, cifar10, cifar100) or a store folder"
_TYPES = {
    "int": (numbers.Integral, "an integer"),
    "float": (numbers.Real, "a number"),
    "str": (str, "a string"),
    "bool": (bool, "true or false"),
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
        value, (want, what) = getattr(config, f.name), _TYPES[kind(f)]
        if value is None and f.default is None:
            continue
        bounds = [
            (sym, test, f.metadata[k])
            for k, (sym, test) in _BOUNDS.items()
            if f.metadata.get(k) is not None
        ]
        choices = f.metadata.get("choices")
        ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
        if ok and want is not str and want is not bool:
            ok = math.isfinite(value) and all(test(value, b) for _, test, b in bounds)
        if choices is not None and value not in choices:
            raise ConfigError(f"{f.name} must be one of {', '.join(choices)}, got {value!r}")
        if want is str and ok and "\0" in value:  # no file or name can hold one
            raise ConfigError(f"{f.name} must not contain a NUL character, got {value!r}")
        if not ok:
            rule = " and".join(f" {sym} {b}" for sym, _, b in bounds)
            raise ConfigError(f"{f.name} must be {what}{rule}, got {value!r}")
        if want is numbers.Integral or want is numbers.Real:  # numpy scalars -> int, float
            object.__setattr__(
                config, f.name, int(value) if want is numbers.Integral else float(value)
            )
