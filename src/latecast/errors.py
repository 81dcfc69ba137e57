"""latecast's exceptions, one type per family under ``LatecastError``, each message one line
naming the file or value, what was expected and what was found (the CLI prints it, exit code
1); ``check``, ``refuse`` and ``numbers_of``: how the entry points check their arguments."""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any


class LatecastError(Exception):
    """Base class of every error latecast raises on bad input or a fault it detected."""


class FormatError(LatecastError):
    """A data file (IDX, CIFAR binary, image, store) is malformed or of the wrong kind."""


class DownloadError(LatecastError):
    """Every mirror of a file failed, or a download did not match its pinned SHA-256."""


class ConfigError(LatecastError):
    """A bad argument: unknown name, out-of-range number, impossible combination."""


class WriteError(LatecastError):
    """A file or folder could not be written: no space left, read-only, a name too long."""


class DeviceError(LatecastError):
    """The device cannot do what was asked (no CUDA, dataset does not fit in memory)."""


class CheckpointError(LatecastError):
    """A checkpoint is corrupt, foreign, or does not match the run resuming from it."""


class TrainingError(LatecastError):
    """Training diverged (NaN/inf loss), a distributed peer failed, or its output failed."""


class BatchError(LatecastError):
    """A batch from ``latecast.wrap``'s iterable that cannot cross as it was declared (float
    images where uint8 was, a value out of range, an ambiguous layout), naming the field."""


def numbers_of(value: Any, kind: type = float) -> tuple | None:
    """A non-empty sequence of finite numbers as ``kind`` (``int``: integers only, numpy's
    too); None for anything else (a bool is no number)."""
    try:
        items = () if isinstance(value, (str, bytes)) else tuple(value)
    except TypeError:
        return None
    want = numbers.Integral if kind is int else numbers.Real
    real = (isinstance(v, want) and not isinstance(v, bool) for v in items)
    if not items or not all(real) or not all(map(math.isfinite, items)):
        return None
    return tuple(map(kind, items))


_BOUNDS = {"low": (">=", operator.ge), "above": (">", operator.gt)}
_BOUNDS |= {"high": ("<=", operator.le), "below": ("<", operator.lt)}
_KINDS = {int: (numbers.Integral, "an integer"), float: (numbers.Real, "a number")}
_KINDS |= {bool: (bool, "true or false"), str: (str, "a string")}


def check(value: Any, name: str, kind: Any = int, low=None, high=None, *, above=None, below=None):
    """``value`` if it is a ``kind``, else one ConfigError naming ``name`` and the value:
    ``int`` (numpy's too, never a bool) or finite ``float``, returned as that type, within
    ``low <= value <= high`` and ``above < value < below`` (None: no bound); ``bool``; ``str``
    (no NUL: no file or name holds one); or a tuple of the values allowed (equal, of its type)."""
    if isinstance(kind, tuple):
        for v in kind:
            if isinstance(value, type(v)) and value == v:  # never numpy's array of answers
                return v
        raise ConfigError(f"{name} must be one of {', '.join(map(str, kind))}, got {value!r:.60}")
    want, what = _KINDS[kind]
    ok = isinstance(value, want) and (kind is bool or not isinstance(value, bool))
    if ok and kind is str and "\0" in value:
        raise ConfigError(f"{name} must not contain a NUL character, got {value!r:.60}")
    given = dict(low=low, above=above, high=high, below=below)  # in the message's order
    bounds = [(*_BOUNDS[k], b) for k, b in given.items() if b is not None]
    if ok and kind in (int, float):
        ok = math.isfinite(value) and all(test(value, b) for _, test, b in bounds)
    if not ok:
        rule = " and".join(f" {sym} {b}" for sym, _, b in bounds)
        raise ConfigError(f"{name} must be {what}{rule}, got {value!r:.60}")
    return kind(value) if kind in (int, float) else value


def refuse(checks: list[tuple[bool, str, Any, str]]) -> None:
    """One ConfigError for the first ``(accepted?, argument, value, what is accepted)`` refused."""
    for ok, name, value, accepted in checks:
        if not ok:
            raise ConfigError(f"{name} must be {accepted}, got {value!r:.60}")
