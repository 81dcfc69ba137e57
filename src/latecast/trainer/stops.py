"""Named moments of a run, where a test stops it exactly (tests/trainer/test_safety.py,
test_resume.py).

``LATECAST_STOP_AT=NAME[@N][:SIGNAL]``: the process sends itself ``SIGNAL`` (``INT`` by default,
``KILL``, ``STOP``) the ``N``-th time (1) it reaches ``at(NAME)``. The names: ``data`` (the
splits about to load), ``step`` (before each), ``config`` (``config.json`` written), ``aside``
(``--overwrite`` moved the previous run aside), ``checkpoint-write`` (inside ``torch.save``),
``checkpoint`` (``checkpoint.pt`` saved whole), ``evaluate``. Unset: one environment read."""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import BinaryIO

_seen: Counter = Counter()


def _asked() -> tuple[str, int, str]:
    """``(NAME, N, SIGNAL)`` from ``LATECAST_STOP_AT``; NAME is "" when it is unset."""
    spec, _, how = os.environ.get("LATECAST_STOP_AT", "").partition(":")
    name, _, count = spec.partition("@")
    return name, int(count or 1), how or "INT"


def at(name: str) -> None:
    """Point ``name``: the signal ``LATECAST_STOP_AT`` asks for, when it names this visit."""
    point, count, how = _asked()
    if point == name:
        _seen[name] += 1
        if _seen[name] == count:
            os.kill(os.getpid(), getattr(signal, f"SIG{how}"))


def watched(f: BinaryIO, name: str) -> BinaryIO:
    """``f``, or where ``LATECAST_STOP_AT`` names ``name``, ``f`` whose second write (torch's
    zip writer past its first header: inside the file) is point ``name``."""
    return _Watched(f, name) if _asked()[0] == name else f


class _Watched:
    def __init__(self, f: BinaryIO, name: str) -> None:
        self.f, self.name, self.writes = f, name, 0

    def write(self, data) -> int:
        self.writes += 1
        if self.writes == 2:
            at(self.name)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()
