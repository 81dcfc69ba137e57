"""Settings declared once. Each option of a command is a field of a frozen dataclass with
its default and help text (``option``); ``cli.py`` builds the command line from the
fields, ``validate`` checks every value in ``__post_init__``, and the resolved dataclass
is what gets saved next to the results.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import field, fields
from typing import Any, Callable

from .errors import ConfigError

DATASET_HELP = "dataset name (mnist, fashion-mnist, kmnist, cifar10, cifar100) or a store folder"
_TYPES = {"int": (numbers.Integral, "an integer"), "float": (numbers.Real, "a finite number"),
          "str": (str, "a string"), "bool": (bool, "true or false")}


def option(default: Any, help: str, *, short: str | None = None, positional: bool = False,
           metavar: str | None = None) -> Any:
    """A dataclass field that is also a command-line option (``--name-with-dashes``)."""
    return field(default=default, metadata={"help": help, "short": short,
                                            "positional": positional, "metavar": metavar})


def kind(f) -> str:
    """``"int"``, ``"float"``, ``"str"`` or ``"bool"`` from a field's annotation."""
    return str(f.type).split("|")[0].strip()


def validate(config: Any, rules: dict[str, tuple[Callable[[Any], bool], str]]) -> None:
    """Check each field's type against its annotation (``None`` allowed where the default
    is ``None``; numpy integers count as ints, ``True`` does not), then ``rules``:
    ``{field: (ok, "what is allowed")}``. ``ConfigError`` names the field and the value."""
    for f in fields(config):
        value, (want, described) = getattr(config, f.name), _TYPES.get(kind(f), (object, ""))
        if value is None and f.default is None:
            continue
        wrong = not isinstance(value, want) or (want is not bool and isinstance(value, bool))
        if wrong or (want is numbers.Real and not math.isfinite(value)):
            raise ConfigError(f"{f.name} must be {described}, got {value!r}")
    for name, (ok, want) in rules.items():
        value = getattr(config, name)
        if value is not None and not ok(value):
            raise ConfigError(f"{name} must be {want}, got {value!r}")
