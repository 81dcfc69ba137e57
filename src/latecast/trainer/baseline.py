"""The usual pipeline, kept as the baseline every measurement compares with: a Loader mover
(``Loader(ds, transfer=Float32)``; ``--transfer float32`` in ``latecast train``, ``bench`` and
``profile``) that finishes each batch on the host, with the same draws, and copies its float32
images and int64 labels. Outside the core: it is a measurement, not a way to move data."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import numpy as np
import torch
from torch.profiler import record_function

from ..data import Split
from ..fields import Field, Taken
from ..movers import MOVERS, Finish, Stored, movers_for
from ..transfer import float32_bytes

_HOST = torch.device("cpu")


class Float32(Stored):
    """The usual pipeline, kept as the baseline: each batch finished on the host (the same
    draws), then its float32 images and int64 labels copied, two copies."""

    name = "float32"

    @staticmethod
    def epoch_bytes(dataset: Split) -> dict[str, int]:
        return {"per_epoch": float32_bytes(dataset, len(dataset)), "once": 0}

    def batches(self, items: Iterable, finish: Finish) -> Iterator[list]:
        for item in items:
            plans, values = self.gather(item)  # each field gathered on the host, as it is
            views = [f.view(_gathered(f, v), _HOST) for f, v in zip(plans, values)]
            x, y = finish(plans, views, _HOST)  # (n, C, H, W) float, labels
            self.stats.image_bytes += x.nbytes
            self.stats.label_bytes += y.nbytes
            self.stats.copies += 2
            with record_function("h2d"):
                yield [x.to(self.device), y.to(self.device)]


def _gathered(f: Field, value: Any) -> torch.Tensor:
    """``value`` as field ``f`` packs it, in bytes of its own (rows of an array: gathered)."""
    if isinstance(value, Taken):
        return torch.from_numpy(
            np.take(value.array, value.index, axis=0).reshape(-1).view(np.uint8)
        )
    raw = torch.empty(f.nbytes, dtype=torch.uint8)
    f.pack(raw, value)
    return raw


def transfers(dataset: Split) -> dict[str, type[Stored]]:
    """Every mover of ``dataset`` by name, the baseline first where it moves it (a dataset of
    fixed-size fields: the core's ``MOVERS``)."""
    own = movers_for(dataset)
    return {Float32.name: Float32, **own} if own is MOVERS else own
