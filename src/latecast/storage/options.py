"""Settings declared once: each command option is a field of a frozen dataclass (``option``:
default, help, allowed range); ``tools/cli.py`` builds the command line from the fields and
``validate`` checks every value. In ``storage/`` because ``ConvertConfig`` is declared so too.
"""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any

from ..errors import check

DATASET_HELP = (
    "dataset name (mnist, fashion-mnist, kmnist, cifar10, cifar100), a store folder, or "
    "WebDataset tar shards, streamed once indexed by latecast index (http://.../shard-{000..009}"
    ".tar, s3://..., path/shard-*.tar; the last is the test split)"
)
TYPES = {"int": int, "float": float, "str": str, "bool": bool}  # a field's kind -> its type


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
    """Check every field of ``config`` with ``errors.check`` against its annotation, its
    bounds and choices (``None`` only where that is the default); numpy scalars are stored
    as ``int``, ``float``. ``ConfigError`` names the field, what is allowed and the value."""
    for f in fields(config):
        value, choices = getattr(config, f.name), f.metadata.get("choices")
        if value is None and f.default is None:
            continue
        want = TYPES[kind(f)] if choices is None else tuple(choices)
        bounds = {k: f.metadata.get(k) for k in ("low", "high", "above", "below")}
        object.__setattr__(config, f.name, check(value, f.name, want, **bounds))
