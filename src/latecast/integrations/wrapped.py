"""Anyone's batches planned field by field (``plan.py``), packed and moved as the Loader's
(``transfer.pack``), finished on the device as the Loader's (``Prepare``): ``send`` and
``finish`` are the two halves ``wrap``, ``Mover`` and the Lightning hook share; ``Wrapped``
reads its source one batch ahead. ``latecast.wrap`` itself, and what it forwards to a source,
is ``dataloader.py``."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator

import torch

from ..distributed import placement
from ..errors import BatchError
from ..fields import Planning, split
from ..loader import Epochs
from ..threads import one_thread
from ..transfer import Ring, Sent, TransferStats, ahead, pack, unpack
from .plan import Options, plan


class Wrapped(Epochs):
    """An iterable of batches moved and finished on the device, each batch's copy started
    before the one before it is handed out; see ``latecast.wrap``. ``mixing``: whether ``mix``
    runs (timm's ``mixup_enabled``)."""

    __slots__ = ("batches", "options", "prepare", "mixing", "_looked", "_device", "epoch",
                 "position", "_stats", "_ring", "_where")  # fmt: skip
    slots = 3  # one read by the copy in flight, one handed out, one being filled
    mean = property(lambda self: self.options.mean)  # for a second loader: wrap(dl, mean=w.mean)
    std = property(lambda self: self.options.std)
    device = property(lambda self: self._where[0] if self._where else placement(self._device)[0])
    stats = property(lambda self: replace(self._stats))  # a copy: bytes by kind, copies, ...

    def __init__(self, batches: Iterable, options: Options, device: str | torch.device,
                 stats: TransferStats | None = None) -> None:  # fmt: skip
        self.batches, self.options, self._device = batches, options, device
        self.prepare, self.mixing, self._looked = options.prepare(), True, False
        placement(device)  # a bad device fails here, not at the first pass
        self.epoch, self.position = 0, 0  # position: batches of `epoch` already yielded
        self._stats, self._ring, self._where = stats or TransferStats(), None, None

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        self._start()
        yield from self._count(self._finished())

    def _start(self) -> None:
        if self._where is None:  # resolved at the first pass: a launcher may start after us
            self._where = placement(self._device)
            self._ring = Ring(self.slots, self._where[0], side=True)

    def send(self, batch: Any, state: Any = None, where: tuple | None = None) -> Sent:
        """The host half: ``batch`` planned, each field in the dtype it crosses in
        (``narrow``), packed into the ring and its copy started (``state``: kept beside it);
        ``where``: the (epoch, rank, batch) it is finished with (default this pass's next),
        which seeds a kind's draws on the host too (``Planning``)."""
        leaves, rebuild = split(batch)
        where = where or (self.epoch, self._where[1], self.position)
        draws = any(getattr(kind, "draws", False) for kind in self.options.kinds.values())
        at = Planning(self.prepare.planning(where), self._ring.device) if draws else None
        values, plans = plan(self.options, leaves, not self._looked, at)  # look-alikes: once
        self._looked = True
        for f, v in zip(plans, values):
            if f is not None and torch.is_tensor(v) and v.device.type != "cpu":
                raise BatchError(
                    f"field {f.name!r} is already on {v.device}: wrap moves batches from host "
                    "memory; give it the DataLoader before anything moves them"
                )
        s = pack(
            self._ring, [f and f.narrow(v) for f, v in zip(plans, values)], values, self._stats
        )
        s.leaves, s.rebuild, s.state, s.where = leaves, rebuild, state, where
        return s

    @one_thread()  # latecast's own CPU work: threads.py
    def finish(self, s: Sent, where: tuple | None = None) -> Any:
        """The device half: the sent batch in its own form, its fields finished and mixed,
        seeded by ``where`` (epoch, rank, batch; default the one it was sent for); a file that
        does not decode is a BatchError naming its field."""
        self._stats.batches += 1
        where = where or s.where
        views = unpack(self._ring, s, keep=True)
        done = self.prepare(s.plans, views, where, self._ring.device, mixing=self.mixing)
        return s.rebuild([value if d is None else d for (_, value), d in zip(s.leaves, done)])

    def _finished(self) -> Iterator[tuple[Any, bool]]:
        return self._ahead(self.batches)

    def _ahead(self, batches: Iterable, state: Callable = lambda: None) -> Iterator:
        """Each batch finished on the device and whether it is the last, the next one's copy
        started before (``ahead``); ``state()``, taken as each batch is read, kept beside it
        (``Sent.state``) for ``_handing``."""
        epoch, rank, first = self.epoch, self._where[1], self.position  # of this pass's batches
        sent = (self.send(b, state(), (epoch, rank, first + k)) for k, b in enumerate(batches))
        t0 = time.perf_counter()
        for s, last in ahead(sent):
            batch = self.finish(s)
            self._stats.wait_seconds += time.perf_counter() - t0
            self._handing(s, last)
            yield batch, last
            t0 = time.perf_counter()

    def _handing(self, s: Sent, last: bool) -> None:
        """Batch ``s`` is about to be handed out (what ``integrations`` tell its source)."""
