"""The move, between source and prepare: ``pack`` writes a batch's fields into one reused
pinned buffer of a ``Ring`` and starts one copy, ``unpack`` views them on the device, and the
bytes are counted there; the Loader's movers (``MOVERS``), ``wrap``, ``Mover`` and Lightning's
hook all take it. ``resident`` (the dataset on the device) gathers there instead."""

from __future__ import annotations

import functools
import math
import os
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.profiler import record_function

from .data import Dataset, Split
from .errors import ConfigError, DeviceError
from .fields import Field

_HOST = torch.device("cpu")


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


class Stored:
    """A Loader's mover, ``uint8``: each batch moved as it is stored and finished on the device;
    its byte counters. A batch is
    what the dataset (or a stream's source) describes for an index batch (``Split.batch``:
    its fields' plans and values), packed and sent, unpacked, finished by ``finish``."""

    name = "uint8"
    slots, side = 2, False  # its ring's (side: the next batch's copy started first)

    def __init__(self, dataset: Split, device: torch.device, batch_size: int) -> None:
        self.dataset, self.device, self.batch_size = dataset, device, batch_size
        self.stats = TransferStats()

    @functools.cached_property
    def ring(self) -> Ring:
        return Ring(self.slots, self.device, self.side)

    @staticmethod
    def epoch_bytes(dataset: Split) -> dict[str, int]:
        """Host->device bytes of one epoch: ``per_epoch`` every epoch, ``once`` at start-up."""
        return {"per_epoch": uint8_bytes(dataset, len(dataset)), "once": 0}

    def gather(self, item: Any) -> tuple[list[Field], list]:
        """A batch's fields planned and their values on the host, as ``pack`` takes them:
        ``item`` an index batch (CPU int64), or what a stream's source read."""
        return self.dataset.batch(item.numpy()) if torch.is_tensor(item) else item.batch()

    def batches(self, items: Iterable, finish: Finish) -> Iterator[list]:
        """Each item's batch gathered, packed and sent (``side``: the next one's copy started
        first), then finished on the device."""
        sent = (pack(self.ring, *self.gather(item), self.stats) for item in items)
        for s in (s for s, _ in ahead(sent)) if self.side else sent:
            yield finish(s.plans, unpack(self.ring, s), self.device)


Finish = Callable[[list, list, torch.device], list]  # (plans, values, device) -> values


class Prefetch(Stored):
    """``uint8`` with the next batch copied on a side CUDA stream while this one is used."""

    name = "prefetch"
    slots, side = 3, True  # one read by the copy in flight, one handed out, one being filled


class Float32(Stored):
    """The usual pipeline, kept as the baseline: each batch finished on the host (the same
    draws), then its float32 images and int64 labels copied, two copies."""

    name = "float32"

    @staticmethod
    def epoch_bytes(dataset: Split) -> dict[str, int]:
        return {"per_epoch": float32_bytes(dataset, len(dataset)), "once": 0}

    def batches(self, items: Iterable, finish: Finish) -> Iterator[list]:
        ring, host = Ring(2, _HOST), TransferStats()  # the host's own pack, not a crossing
        for item in items:
            s = pack(ring, *self.gather(item), host)
            x, y = finish(s.plans, unpack(ring, s), _HOST)  # (n, C, H, W) float, labels
            self.stats.image_bytes += x.nbytes
            self.stats.label_bytes += y.nbytes
            self.stats.copies += 2
            with record_function("h2d"):
                yield [x.to(self.device), y.to(self.device)]


def _free_bytes(device: torch.device) -> int:
    """Free memory on ``device``: CUDA's own count, or the host's available RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
        return int(meminfo["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class Resident(Stored):
    """The whole dataset uploaded once, each of its fields' arrays as bytes in chunks (no
    second host copy); then one int64 permutation per epoch, each batch's rows gathered on the
    device and viewed as its fields. A DeviceError where it does not fit."""

    name = "resident"
    CHUNK_BYTES = 64 << 20  # upload in 64 MiB pieces

    @staticmethod
    def epoch_bytes(dataset: Split) -> dict[str, int]:
        return {"per_epoch": len(dataset) * 8, "once": uint8_bytes(dataset, len(dataset))}

    @staticmethod
    def fits(dataset: Split, device: torch.device) -> tuple[bool, str]:
        """Whether the dataset takes at most ``RESIDENT_FRACTION`` of the free memory, and the
        sizes in words."""
        need, free = uint8_bytes(dataset, len(dataset)), _free_bytes(device)
        return need <= free * RESIDENT_FRACTION, (
            f"{dataset.name}/{dataset.split} needs {need / 2**20:.0f} MiB on {device}, "
            f"{free / 2**20:.0f} MiB free"
        )

    def __init__(self, dataset: Split, device: torch.device, batch_size: int) -> None:
        super().__init__(dataset, device, batch_size)
        ok, sizes = self.fits(dataset, device)
        if not ok:
            raise DeviceError(f"resident: {sizes}; use --transfer prefetch")
        every = np.arange(len(dataset))
        plans, values = dataset.batch(every)  # the fields' whole arrays: Taken rows
        self.rows = [self._upload(v.array) for v in values]  # each (N, bytes a row) uint8
        self.stats.count(plans, copies=0)

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        rows = array.reshape(len(array), -1).view(np.uint8)  # each sample's bytes
        out = torch.empty(rows.shape, dtype=torch.uint8, device=self.device)
        step = max(1, self.CHUNK_BYTES // max(1, rows[:1].nbytes))
        for start in range(0, len(rows), step):
            part = torch.from_numpy(np.array(rows[start : start + step]))  # 64 MiB at most
            out[start : start + step].copy_(part)  # (the source may be a read-only memmap)
            self.stats.copies += 1
        return out

    def order(self, index_batches: Sequence[torch.Tensor]) -> torch.Tensor:
        """This epoch's order on the device (int64): one upload per epoch."""
        order = torch.cat(list(index_batches))
        with record_function("h2d"):
            order_dev = order.to(self.device, non_blocking=True)  # no copy on a CPU device
        self.stats.index_bytes += order.nbytes
        self.stats.copies += 1
        return order_dev

    def gathered(self, plans: list[Field], index: torch.Tensor) -> list:
        """Rows ``index`` (on the device) of each field, viewed as its values."""
        return [f.view(rows.index_select(0, index).view(-1), self.device)
                for f, rows in zip(plans, self.rows)]  # fmt: skip

    def batches(self, index_batches: Sequence[torch.Tensor], finish: Finish) -> Iterator[list]:
        if len(index_batches):
            sizes = [len(i) for i in index_batches]
            for idx, sel in zip(index_batches, torch.split(self.order(index_batches), sizes)):
                plans = self.dataset.batch(idx.numpy())[0]
                yield finish(plans, self.gathered(plans, sel), self.device)


RESIDENT_FRACTION = 0.5  # "resident" only where the dataset takes at most this of free memory
MOVERS: dict[str, type[Stored]] = {m.name: m for m in (Float32, Stored, Prefetch, Resident)}


def movers_for(dataset: Split) -> dict[str, type[Stored]]:
    """The movers that move this dataset: those it brings (``movers``: a JPEG store's ``jpeg``,
    ``kinds/jpeg.py``), else ``MOVERS`` (fields of a fixed size a sample)."""
    return getattr(dataset, "movers", None) or MOVERS


def resolve(name: str, dataset: Split, device: torch.device) -> str:
    """``auto``: the first mover a dataset brings, else ``resident`` where the dataset fits,
    else ``prefetch``; another name must be one of the movers that move this dataset
    (ConfigError, naming what the dataset holds: ``what``)."""
    fit, data = movers_for(dataset), f"{dataset.name}/{dataset.split}"
    if name == "auto":
        if fit is not MOVERS:
            return next(iter(fit))
        return "resident" if Resident.fits(dataset, device)[0] else "prefetch"
    if name not in fit:
        what = getattr(dataset, "what", "decoded uint8 pixels")
        valid = ", ".join(["auto", *fit])
        raise ConfigError(f"transfer {name!r} does not move {data} ({what}); valid: {valid}")
    return name
