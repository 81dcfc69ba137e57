"""The move, between source and finish: ``pack`` writes a batch's fields into one reused
pinned buffer of a ``Ring`` and starts one copy, ``unpack`` views them on the device, and the
bytes are counted there (``TransferStats``); the Loader's movers (``movers.py``), ``wrap``,
``Mover`` and Lightning's hook all take it."""

from __future__ import annotations

import math
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.profiler import record_function

from .data import Dataset, Split
from .fields import Field


@dataclass
class TransferStats:
    """What crossed host->device, counted where it is packed (on a CPU device too)."""

    image_bytes: int = 0  # image bytes handed to the device (JPEG files: their own bytes)
    label_bytes: int = 0  # integer bytes (labels, integer fields and masks)
    index_bytes: int = 0  # resident: one int64 permutation per epoch
    other_bytes: int = 0  # fields that cross as they are (floats, bools)
    decoded_bytes: int = 0  # JPEG files: the same images as uint8 at the training size
    decoder: str = ""  # the JPEG decoder that runs (kinds/decode.py)
    copies: int = 0  # host->device copy calls
    batches: int = 0  # batches yielded
    wait_seconds: float = 0.0  # host time the consumer spent waiting inside next()
    usual_bytes: int = 0  # the usual way (Loader: float32 images, int64; wrap: as they arrive)

    @property
    def h2d_bytes(self) -> int:
        return self.image_bytes + self.label_bytes + self.index_bytes + self.other_bytes

    def count(self, plans: list[Field | None], copies: int, device=None) -> None:
        """A batch's fields as they crossed, in ``copies`` copies (to ``device``)."""
        for f in filter(None, plans):
            counter = f"{f.category}_bytes"  # Field.category: image, label or other
            setattr(self, counter, getattr(self, counter) + f.nbytes)
            self.usual_bytes += f.usual_bytes
            if f.on_host:  # JPEG files: decoded on `device`
                self.decoded_bytes += f.decoded_bytes
                self.decoder = f.decoder(device)
        self.copies += copies


def float32_bytes(dataset: Dataset, samples: int) -> int:
    """Bytes the usual path moves for ``samples`` images: float32 pixels, int64 labels."""
    return samples * (math.prod(dataset.image_shape) * 4 + 8)


def uint8_bytes(dataset: Split, samples: int) -> int:
    """Bytes the ``uint8`` path moves for ``samples`` images: uint8 pixels, narrow labels."""
    pixel = dataset.images.itemsize if isinstance(dataset, Dataset) else 1  # uint16: 2; files
    return samples * (math.prod(dataset.image_shape) * pixel + dataset.labels.itemsize)


def host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    """A uint8 staging buffer, pinned when ``pin`` (where pinning fails: pageable, a warning)."""
    if pin:
        try:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        except RuntimeError as err:  # pinned memory is a scarce OS resource
            why = f"pinned host buffer of {nbytes} bytes failed ({err}); using pageable memory"
            warnings.warn(f"{why}, copies will be synchronous", stacklevel=3)
    return torch.empty(nbytes, dtype=torch.uint8)


class Ring:
    """``slots`` reused host buffers (pinned for CUDA), each rewritten only once the last copy
    out of it is done, grown for a larger batch. With ``side`` (CUDA) the copies run on a side
    stream, which ``ready`` makes the consumer's stream wait for."""

    def __init__(self, slots: int, device: torch.device, side: bool = False) -> None:
        self.device, self.cuda, self.turn = device, device.type == "cuda", 0
        self.buffers: list[torch.Tensor | None] = [None] * slots
        self.events = [torch.cuda.Event() if self.cuda else None for _ in range(slots)]
        self.used = [False] * slots  # an event waited on before it was recorded never returns
        self.side = torch.cuda.Stream(device) if side and self.cuda else None

    def stage(self, nbytes: int) -> tuple[int, torch.Tensor]:
        """The next slot and a host uint8 view of ``nbytes`` in it, free to write."""
        i, self.turn = self.turn % len(self.buffers), self.turn + 1
        if self.used[i] and self.events[i] is not None:
            self.events[i].synchronize()  # the previous copy out of this buffer has finished
        if self.buffers[i] is None or self.buffers[i].numel() < nbytes:
            self.buffers[i] = host_buffer(nbytes, pin=self.cuda)
        return i, self.buffers[i][:nbytes]

    def send(self, i: int, host: torch.Tensor) -> torch.Tensor:
        """Copy slot ``i``'s ``host`` view to the device, on the side stream if there is one
        (not ``torch.cuda.stream(None)``: it starts CUDA, even for a CPU device)."""
        side = torch.cuda.stream(self.side) if self.side is not None else nullcontext()
        with side, record_function("h2d"):
            dev = host.to(self.device, non_blocking=True)
            if self.events[i] is not None:
                self.events[i].record()
        self.used[i] = True
        return dev

    def ready(self, i: int, dev: torch.Tensor) -> torch.Tensor:
        """``dev``, slot ``i``'s copy, safe to use on the current stream."""
        if self.side is not None:
            main = torch.cuda.current_stream(self.device)
            main.wait_event(self.events[i])
            dev.record_stream(main)  # allocated on the side stream, used on `main`
        return dev


@dataclass
class Sent:
    """One packed batch, its copy in flight, and what its caller keeps beside it."""

    dev: torch.Tensor  # the copy (what crosses)
    host: torch.Tensor  # the slot's bytes: fields that stay on the host are read from here
    slot: int
    plans: list[Field | None]
    offsets: list[int]  # each field's, in the slot
    item: Any = None  # the Loader's: the index batch it was gathered for
    leaves: list | None = None  # wrap's: the batch's (name, value) fields as they came
    rebuild: Callable[[list], Any] | None = None  # wrap's: a batch of their form from values
    state: Any = None  # wrap's: the source's state as it was read
    where: tuple | None = None  # wrap's: the (epoch, rank, batch) it was planned for


def pack(ring: Ring, plans: list[Field | None], values: list, stats: TransferStats) -> Sent:
    """The packer of every path: each planned field written into one slot of ``ring`` in the
    dtype it crosses in, one copy started, counted in ``stats``. Widest dtype first, so each
    field is aligned for its view; fields that stay on the host (JPEG files) last, not copied."""
    order = [i for i, f in enumerate(plans) if f is not None]
    order.sort(key=lambda i: (plans[i].on_host, -plans[i].dtype.itemsize))
    offsets, end, sent = [0] * len(plans), 0, 0
    for i in order:
        offsets[i], end = end, end + plans[i].nbytes
        sent = sent if plans[i].on_host else end
    slot, host = ring.stage(end)
    for i in order:
        plans[i].pack(host[offsets[i] : offsets[i] + plans[i].nbytes], values[i])
    stats.count(plans, copies=1, device=ring.device)
    return Sent(ring.send(slot, host[:sent]), host, slot, plans, offsets)


def unpack(ring: Ring, s: Sent, keep: bool = False) -> list[Any]:
    """Each field of a sent batch viewed as its values on the device (None: not planned);
    ``keep``: on a CPU device, not views of the ring's memory (what a caller may hold)."""
    dev = ring.ready(s.slot, s.dev)
    if keep and dev.data_ptr() == s.host.data_ptr():  # a CPU "device": the copy was a no-op
        dev = dev.clone()
    return [
        f and f.view((s.host if f.on_host else dev)[o : o + f.nbytes], ring.device)
        for f, o in zip(s.plans, s.offsets)
    ]


END = object()  # no more items


def ahead(items: Iterable) -> Iterator[tuple[Any, bool]]:
    """Each item with whether it is the last, the next one taken before this one is handed
    out (so its copy runs while this one is used); where taking it raises, after this one."""
    it = iter(items)
    item = next(it, END)
    while item is not END:
        try:
            after = next(it, END)
        except Exception:
            yield item, False
            raise
        yield item, after is END
        item = after
