"""The move, between source and prepare: ``pack`` writes a batch's fields into one reused
pinned buffer of a ``Ring`` and starts one copy, ``unpack`` views them on the device; every
path (the Loader's movers, ``wrap``, ``Mover``, Lightning) takes it, and counts bytes there.
The Loader's movers (``MOVERS``): ``float32`` (the baseline), ``uint8``, ``prefetch`` (read
ahead on a side stream), ``resident`` (the dataset on the device), ``jpeg`` (a store's files).
"""

from __future__ import annotations

import math
import os
import warnings
import zlib
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.profiler import record_function

from .data import Batch, Dataset, EncodedDataset, StreamedDataset
from .decode import decoder_on
from .encoded import JpegFile
from .errors import ConfigError, DeviceError
from .fields import Field, Image, Integer, Taken, widen
from .threads import count, pool
from .wide import bits, stored


@dataclass
class TransferStats:
    """What crossed host->device, counted where it is packed (on a CPU device too)."""

    image_bytes: int = 0  # image bytes handed to the device (JPEG files: their own bytes)
    label_bytes: int = 0  # integer bytes (labels, integer fields and masks)
    index_bytes: int = 0  # resident: one int64 permutation per epoch
    other_bytes: int = 0  # fields that cross as they are (floats, bools)
    decoded_bytes: int = 0  # JPEG files: the same images as uint8 at the training size
    decoder: str = ""  # the JPEG decoder that runs (decode.decoder_on)
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
            counter = _COUNTERS[f.category]
            setattr(self, counter, getattr(self, counter) + f.nbytes)
            self.usual_bytes += f.usual_bytes
            if f.on_host:  # JPEG files: decoded on `device`
                self.decoded_bytes += f.decoded_bytes
                self.decoder = decoder_on(device)
        self.copies += copies


_COUNTERS = {c: f"{c}_bytes" for c in ("image", "label", "other")}  # by Field.category


def float32_bytes(dataset: Dataset, samples: int) -> int:
    """Bytes the usual path moves for ``samples`` images: float32 pixels, int64 labels."""
    return samples * (math.prod(dataset.image_shape) * 4 + 8)


def uint8_bytes(dataset: Dataset | EncodedDataset, samples: int) -> int:
    """Bytes the ``uint8`` path moves for ``samples`` images: uint8 pixels, narrow labels."""
    pixel = dataset.images.itemsize if isinstance(dataset, Dataset) else 1  # uint16: 2
    return samples * (math.prod(dataset.image_shape) * pixel + dataset.labels.itemsize)


def host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    """A reusable uint8 staging buffer, pinned when ``pin`` (else, or where pinning fails,
    pageable: a warning)."""
    if pin:
        try:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        except RuntimeError as err:  # pinned memory is a scarce OS resource
            warnings.warn(
                f"pinned host buffer of {nbytes} bytes failed ({err}); "
                "using pageable memory, copies will be synchronous",
                stacklevel=3,
            )
    return torch.empty(nbytes, dtype=torch.uint8)


class Ring:
    """``slots`` reused host buffers (pinned for CUDA), each rewritten only once the last copy
    out of it is done, grown for a larger batch. With ``side`` (CUDA) the copies run on a side
    stream, which ``ready`` makes the consumer's stream wait for."""

    def __init__(self, slots: int, device: torch.device, side: bool = False) -> None:
        self.device, self.cuda = device, device.type == "cuda"
        self.buffers: list[torch.Tensor | None] = [None] * slots
        self.events = [torch.cuda.Event() if self.cuda else None for _ in range(slots)]
        self.used = [False] * slots  # an event waited on before it was recorded never returns
        self.turn = 0
        self.side = torch.cuda.Stream(device) if side and self.cuda else None

    def stage(self, nbytes: int) -> tuple[int, torch.Tensor]:
        """The next slot and a host uint8 view of ``nbytes`` in it, free to write."""
        i = self.turn % len(self.buffers)
        self.turn += 1
        if self.used[i] and self.events[i] is not None:
            self.events[i].synchronize()  # the previous copy out of this buffer has finished
        buf = self.buffers[i]
        if buf is None or buf.numel() < nbytes:
            buf = self.buffers[i] = host_buffer(nbytes, pin=self.cuda)
        return i, buf[:nbytes]

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
    """One packed batch, its copy in flight."""

    dev: torch.Tensor  # the copy (what crosses)
    host: torch.Tensor  # the slot's bytes: fields that stay on the host are read from here
    slot: int
    plans: list[Field | None]
    offsets: list[int]  # each field's, in the slot
    extra: Any = None  # what the caller keeps beside the batch (wrap: the source's state)


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
    out (so its copy runs while this one is used). Where taking the next raises, this one is
    handed out first."""
    it = iter(items)
    item = next(it, END)
    while item is not END:
        try:
            after = next(it, END)
        except Exception:  # the source fails at the next item: this one is handed out first
            yield item, False
            raise
        yield item, after is END
        item = after


class Behind:
    """A read-ahead's source seen as if it were not read ahead, so what it signals as it
    yields (accelerate's ``end_of_dataloader``) stays true of the batch in use: attributes
    it sets while batch k + 1 is taken are put back while batch k is out (``show(0)``); where
    its ``len()`` is known, it is run past its last batch (its end-of-pass code) only when the
    next is asked for (``rest``) or the state saved (``finish``)."""

    def __init__(self, source: Iterable) -> None:
        self.it, self.attrs = iter(source), getattr(source, "__dict__", None)
        self.length, self.taken = known_length(source), 0
        self.changed: dict[str, tuple[Any, Any]] = {}  # by the last take: (before, after)
        self.held: list = []  # taken before it was asked for (END: the source has ended)

    def __iter__(self) -> Iterator[Any]:
        while self.taken != self.length:
            batch = self.take()
            if batch is END:
                return
            yield batch
            ended = self.changed.get("end_of_dataloader", (None, None))[1]  # set in taking it
            if self.length is None and ended is True:
                self.length = self.taken  # the source said it was its last (accelerate's)
        self.show(1)  # the last batch goes out as the source left it

    def take(self) -> Any:
        """The source's next batch (or END), recording the attributes taking it changed."""
        self.show(1)
        if self.held:
            return self.held.pop()
        before = dict(self.attrs or {})
        batch = next(self.it, END)
        after = before if batch is END else self.attrs or {}
        self.taken += batch is not END
        self.changed = {
            k: (before.get(k, END), v) for k, v in after.items() if before.get(k, END) is not v
        }
        self.changed.update((k, (v, END)) for k, v in before.items() if k not in after)
        return batch

    def show(self, which: int) -> None:
        """The source's attributes as before (0) or after (1, for good) its last take."""
        for k, values in self.changed.items():
            if values[which] is END:
                self.attrs.pop(k, None)
            else:
                self.attrs[k] = values[which]
        self.changed = self.changed if which == 0 else {}

    def ended(self) -> bool:
        """Whether the source has no batch past its ``len()``; finding out runs its end."""
        if self.taken == self.length and not self.held:
            self.held.append(self.take())
        return not self.held or self.held[0] is END

    def finish(self, state: Callable[[], Any]) -> Any:
        """``state()`` once the source has run to its end (the next pass's); where it yields
        past its ``len()``, its state before that batch."""
        before = state()
        if self.ended():
            return state()
        self.show(0)  # the batch taken is not out yet
        return before

    def rest(self) -> Iterator[Any] | None:
        """What the source yields past its ``len()``; None where it ended there."""
        if self.ended():
            return None
        self.length = None
        return iter(self)


def known_length(source: Iterable) -> int | None:
    """``len(source)``; None where it has none or guesses (a DataLoader of an IterableDataset)."""
    if isinstance(getattr(source, "dataset", None), torch.utils.data.IterableDataset):
        return None
    try:
        return len(source)
    except TypeError:
        return None


class Mover:
    """A Loader's mover: dataset, device, batch size and the byte counters."""

    name = ""
    takes_prepared = False  # float32 only: it moves batches the host gathered and prepared
    encoded = False  # moves an EncodedDataset (jpeg) rather than a Dataset of uint8 pixels

    def __init__(self, dataset: Dataset, device: torch.device, batch_size: int) -> None:
        self.dataset, self.device, self.batch_size = dataset, device, batch_size
        self.stats = TransferStats()

    @staticmethod
    def epoch_bytes(dataset: Dataset) -> dict[str, int]:
        """Host->device bytes of one epoch: ``per_epoch`` every epoch, ``once`` at start-up."""
        return {"per_epoch": uint8_bytes(dataset, len(dataset)), "once": 0}

    def batches(self, index_batches: Sequence[torch.Tensor]) -> Iterator[Batch]:
        """``(images, labels)`` on the device for ``index_batches`` (CPU int64)."""
        raise NotImplementedError


class Float32(Mover):
    """The baseline: batches the Loader gathered and prepared on the host, copied as they are."""

    name = "float32"
    takes_prepared = True

    @staticmethod
    def epoch_bytes(dataset: Dataset) -> dict[str, int]:
        return {"per_epoch": float32_bytes(dataset, len(dataset)), "once": 0}

    def batches(self, prepared: Iterable[Batch]):
        for x, y in prepared:  # (n, C, H, W) float, (n,) int64 on the CPU
            self.stats.image_bytes += x.nbytes
            self.stats.label_bytes += y.nbytes
            self.stats.copies += 2
            with record_function("h2d"):
                x, y = x.to(self.device), y.to(self.device)
            yield x, y


def label_field(ds: Dataset | EncodedDataset, n: int) -> Integer:
    """``n`` of a dataset's narrow labels as a field of the packer (``1``: after the images)."""
    dtype = _TORCH[ds.labels.dtype.name]
    return Integer(1, dtype, (n,), dtype)


_TORCH = {"uint8": torch.uint8, "uint16": torch.uint16}  # a Dataset's label dtypes


class Uint8(Mover):
    """uint8 images + narrow labels, packed (``pack``) and moved in one copy."""

    name = "uint8"
    slots, side = 2, False

    def __init__(self, dataset: Dataset, device: torch.device, batch_size: int) -> None:
        super().__init__(dataset, device, batch_size)
        self.ring = Ring(self.slots, device, self.side)
        self.plans: dict[int, list[Field]] = {}  # by batch length: every batch but the last

    def _send(self, idx: torch.Tensor) -> Sent:
        ds, at = self.dataset, idx.numpy()
        plans = self.plans.get(len(at))
        if plans is None:
            shape = (len(at), *ds.image_shape)
            deep = ds.images.dtype == np.uint16  # 16-bit: crosses as stored (wide.py)
            image = stored(ds.mean, ds.std, shape) if deep else Image(0, torch.uint8, shape)
            plans = self.plans[len(at)] = [image, label_field(ds, len(at))]
        return pack(self.ring, plans, [Taken(ds.images, at), Taken(ds.labels, at)], self.stats)

    def batches(self, index_batches):
        for idx in index_batches:
            yield tuple(unpack(self.ring, self._send(idx)))


class Prefetch(Uint8):
    """``uint8`` with the next batch copied on a side CUDA stream while this one is used."""

    name = "prefetch"
    slots, side = 3, True  # one read by the copy in flight, one handed out, one being filled

    def batches(self, index_batches):
        for s, _ in ahead(self._send(idx) for idx in index_batches):
            yield tuple(unpack(self.ring, s))


def _free_bytes(device: torch.device) -> int:
    """Free memory on ``device``: CUDA's own count, or the host's available RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
        return int(meminfo["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class Resident(Mover):
    """The whole uint8 dataset uploaded once, in chunks (no second host copy); then one int64
    permutation per epoch, batches gathered on the device. A DeviceError where it does not fit."""

    name = "resident"
    CHUNK_BYTES = 64 << 20  # upload in 64 MiB pieces

    @staticmethod
    def epoch_bytes(dataset: Dataset) -> dict[str, int]:
        return {"per_epoch": len(dataset) * 8, "once": uint8_bytes(dataset, len(dataset))}

    @staticmethod
    def fits(dataset: Dataset, device: torch.device) -> tuple[bool, str]:
        """Whether the dataset takes at most ``RESIDENT_FRACTION`` of the free memory, and the
        sizes in words."""
        need, free = uint8_bytes(dataset, len(dataset)), _free_bytes(device)
        return need <= free * RESIDENT_FRACTION, (
            f"{dataset.name}/{dataset.split} needs {need / 2**20:.0f} MiB on {device}, "
            f"{free / 2**20:.0f} MiB free"
        )

    def __init__(self, dataset: Dataset, device: torch.device, batch_size: int) -> None:
        super().__init__(dataset, device, batch_size)
        ok, sizes = self.fits(dataset, device)
        if not ok:
            raise DeviceError(f"resident: {sizes}; use --transfer prefetch")
        self.images = self._upload(bits(dataset.images))  # (N, H, W, C)
        self.labels = widen(self._upload(dataset.labels.view(np.uint8)), dataset.labels.dtype)
        self.stats.image_bytes += dataset.image_bytes
        self.stats.label_bytes += dataset.label_bytes

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        out = torch.empty(array.shape, dtype=getattr(torch, array.dtype.name), device=self.device)
        step = max(1, self.CHUNK_BYTES // max(1, array[:1].nbytes))
        for start in range(0, len(array), step):
            part = torch.from_numpy(np.array(array[start : start + step]))  # 64 MiB at most
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

    def batches(self, index_batches):
        if not len(index_batches):
            return
        order = self.order(index_batches)
        for sel in torch.split(order, [len(i) for i in index_batches]):
            yield self.images.index_select(0, sel), self.labels.index_select(0, sel)


class Jpeg(Mover):
    """JPEG stores: a batch's files packed beside its narrow labels; the labels cross, the
    files stay in the pinned slot for the decoder (nvJPEG parses them on the host)."""

    name = "jpeg"
    encoded = True
    slots = 2  # decoding finishes before the next batch is gathered (it syncs its own stream)

    def __init__(self, dataset: EncodedDataset, device: torch.device, batch_size: int) -> None:
        super().__init__(dataset, device, batch_size)
        self.ring = Ring(self.slots, device)
        crc = getattr(dataset, "crc32", None)  # a stream has none: its index checks its files
        self.unread = None if crc is None else np.ones(len(dataset), bool)

    @staticmethod
    def epoch_bytes(dataset: EncodedDataset) -> dict[str, int]:
        return {"per_epoch": dataset.image_bytes + dataset.label_bytes, "once": 0}

    def batches(self, index_batches):
        """Index batches of a store; for a stream, the ``(EncodedDataset, ids, names)`` of
        each batch its source read (``StreamedDataset``)."""
        for item in index_batches:
            ds, idx, names = (self.dataset, item, None) if torch.is_tensor(item) else item
            at = idx.numpy() if names is None else np.arange(len(idx))
            data = ds.data.view(np.ndarray)  # a plain view slices faster than a memmap
            starts, ends = ds.offsets[at].tolist(), ds.offsets[at + 1].tolist()
            files = [data[a:b] for a, b in zip(starts, ends)]
            if names is None and self.unread is not None and self.unread[at].any():
                self._first_read(at, files)
            jpeg = JpegFile.of_store(ds, files, at, idx, names)
            label = label_field(ds, len(at))
            s = pack(self.ring, [jpeg, label], [files, Taken(ds.labels, at)], self.stats)
            yield tuple(unpack(self.ring, s))

    def _first_read(self, idx: np.ndarray, files: list[np.ndarray]) -> None:
        """Files read for the first time checked against their store's CRC-32 (damage libjpeg
        decodes silently, a lying ``offsets.npy``): a warning naming each once."""

        def crcs(part: np.ndarray) -> list[int]:  # zlib lets go of the GIL past 5 KiB
            return [zlib.crc32(files[k]) for k in part]

        new, threads = np.flatnonzero(self.unread[idx]), count()
        parts = np.array_split(new, min(threads, len(new)))
        crc = np.concatenate([np.array(c, np.uint32) for c in pool(threads).map(crcs, parts)])
        for k in new[crc != self.dataset.crc32[idx[new]]]:
            warnings.warn(
                f"{self.dataset.name}/{self.dataset.split}: sample {idx[k]}: its bytes differ from "
                f"the CRC-32 its store kept when written (damaged or edited since); `latecast "
                f"info --verify` checks a store",
                stacklevel=4,
            )
        self.unread[idx] = False


# A dataset is "resident" only if it takes at most this share of free device memory.
RESIDENT_FRACTION = 0.5

MOVERS: dict[str, type[Mover]] = {m.name: m for m in (Float32, Uint8, Prefetch, Resident, Jpeg)}


def movers_for(dataset: Dataset | EncodedDataset) -> list[str]:
    """The movers that move this kind of dataset (``jpeg`` alone for an encoded store)."""
    encoded = isinstance(dataset, (EncodedDataset, StreamedDataset))
    return [name for name, m in MOVERS.items() if m.encoded == encoded]


def resolve(name: str, dataset: Dataset | EncodedDataset, device: torch.device) -> str:
    """``auto``: ``jpeg`` for an encoded store, else ``resident`` where the dataset fits, else
    ``prefetch``. Another name is checked against ``MOVERS`` and the dataset (ConfigError)."""
    if name == "auto":
        if isinstance(dataset, (EncodedDataset, StreamedDataset)):
            return "jpeg"
        return "resident" if Resident.fits(dataset, device)[0] else "prefetch"
    if name not in MOVERS:
        raise ConfigError(
            f"unknown transfer strategy {name!r}; valid: {', '.join(['auto', *MOVERS])}"
        )
    fit = movers_for(dataset)
    if name not in fit:
        jpeg = fit == ["jpeg"]
        raise ConfigError(
            f"transfer {name!r} does not move {dataset.name}/{dataset.split} "
            f"({'a JPEG store' if jpeg else 'decoded uint8 pixels'}); valid: auto, "
            + ", ".join(fit)
            + (" (convert the folder with --encoding raw for the others)" if jpeg else "")
        )
    return name
