"""Movers: how batches cross from host memory to the device, the middle of three stages.

    source (dataset + order) -> move (this module) -> prepare (augment, normalize)

A mover takes this rank's batches of dataset indices and yields the same fields on the
device: uint8 ``(n, H, W, C)`` images and int64 labels (widened there from their narrow
storage dtype). It only moves: it knows nothing of augmentation or normalization. It owns
what is true of it: the bytes an epoch costs (``epoch_bytes``), whether the data fits
(``Resident.fits``), its pinned ring and events, and the counters in ``stats``.

- ``float32``  the usual way, kept as the baseline: it takes batches the host has already
               gathered and prepared (that is what it stands for) and copies float32 + int64.
- ``uint8``    gather uint8 images and narrow labels into one reused pinned buffer, one
               ``non_blocking`` copy.
- ``prefetch`` as ``uint8``, but the next batch is gathered and copied on a side CUDA
               stream while the current one is used (copy-ahead, ``Ring`` and ``ahead``,
               also ``wrap``'s).
- ``resident`` the whole uint8 dataset is uploaded once; batches are gathered on the device.
- ``jpeg``     encoded stores: each batch's JPEG files gathered into one reused host buffer;
               the prepare stage decodes them where the pixels are used (``decode.py``).

Packing labels and images in the same pinned buffer makes one copy per batch
instead of two: for MNIST at batch 256 a copy is ~200 KB, small enough that the fixed
cost of each ``cudaMemcpyAsync`` matters.
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

from .data import Batch, Dataset, Encoded, EncodedDataset, StreamedDataset
from .errors import ConfigError, DeviceError
from .threads import count, pool


@dataclass
class TransferStats:
    """What crossed host->device, counted by the mover itself (exact on every device;
    on a CPU "device" the copies are no-ops but the accounting is the same)."""

    image_bytes: int = 0  # image bytes handed to the device
    label_bytes: int = 0  # label (wrap: integer field) bytes handed to the device
    index_bytes: int = 0  # resident: one int64 permutation per epoch
    other_bytes: int = 0  # wrap: fields that cross as they are (floats, bools)
    decoded_bytes: int = 0  # jpeg: the same images as uint8 at the training size (what uint8 moves)
    decoder: str = ""  # jpeg and wrap's JPEG fields: the decoder that runs (decode.decoder())
    copies: int = 0  # host->device copy calls
    batches: int = 0  # batches yielded (counted by the Loader)
    wait_seconds: float = 0.0  # host time the consumer spent waiting inside next() (Loader)
    usual_bytes: int = 0  # the usual way (Loader: float32 images, int64; wrap: as they arrive)

    @property
    def h2d_bytes(self) -> int:
        return self.image_bytes + self.label_bytes + self.index_bytes + self.other_bytes


def float32_bytes(dataset: Dataset, samples: int) -> int:
    """Bytes the usual path moves for ``samples`` images: float32 pixels, int64 labels."""
    return samples * (math.prod(dataset.image_shape) * 4 + 8)


def uint8_bytes(dataset: Dataset | EncodedDataset, samples: int) -> int:
    """Bytes the ``uint8`` path moves for ``samples`` images: uint8 pixels, narrow labels."""
    return samples * (math.prod(dataset.image_shape) + dataset.labels.itemsize)


def widen(raw: torch.Tensor, dtype: np.dtype) -> torch.Tensor:
    """Narrow integer bytes (uint8 on the device) -> int64, what ``cross_entropy`` wants.
    uint16 travels as two raw bytes and is widened through int16 (torch has few uint16 ops)."""
    if dtype == np.uint8:
        return raw.long()
    if dtype == np.uint16:
        return raw.view(torch.int16).long() & 0xFFFF
    return raw.view(getattr(torch, np.dtype(dtype).name)).long()


def host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    """A reusable uint8 staging buffer, pinned when a CUDA copy will read it (docs/RELIABILITY.md
    row 27: a failed pin falls back to pageable memory with one warning)."""
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
    """``slots`` reused host buffers (pinned for CUDA), each guarded by the event of the
    last copy that read it, so a buffer is rewritten only once that copy is done. A buffer
    grows when a larger batch comes and is reused after. With ``side`` (CUDA) the copies run
    on a side stream and ``ready`` makes the consumer's stream wait for one: with ``ahead``,
    the copy-ahead of ``Prefetch`` and ``wrap``."""

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
        """Copy slot ``i``'s ``host`` view to the device, on the side stream if there is one,
        else on the current one (not ``torch.cuda.stream(None)``: it starts CUDA, even for a
        CPU device)."""
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


def ahead(items: Iterable) -> Iterator[tuple[Any, bool]]:
    """Each item with whether it is the last, the next one taken before this one is handed
    out: where taking an item starts its copy on a ``Ring``'s side stream, the copy of batch
    ``k + 1`` runs while batch ``k`` is used. Where taking item ``k + 1`` raises, item ``k`` is
    still handed out, then the error raised (nothing taken is lost)."""
    it, end = iter(items), object()
    item = next(it, end)
    while item is not end:
        try:
            after = next(it, end)
        except Exception:  # the source fails at the next item: this one is handed out first
            yield item, False
            raise
        yield item, after is end
        item = after


END = object()  # the source has no more batches


class Behind:
    """A read-ahead's source (``ahead``: batch k + 1 taken before batch k is handed out),
    seen from outside as if it were not read ahead, so that what a loader signals as it
    yields stays true of the batch in use. accelerate's ``DataLoaderShard`` sets
    ``end_of_dataloader`` as it yields its last batch and leaves accelerate's
    ``GradientState`` once exhausted: read ahead, ``gather_for_metrics`` cut the wrong batch
    and kept the padding of the last (72 of 100 predictions counted).

    - The attributes the source sets while batch k + 1 is taken are put back while batch k
      is out (``show(0)``), and set again before it runs on.
    - Where ``len(source)`` is known, the source is not run past its last batch until the one
      after it is asked for (``rest``) or the wrapper's state is saved (``finish``): its
      end-of-pass code runs then, as without the read-ahead. Without a ``len()`` the end is
      found by reading past it, before the last batch is out.
    """

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
        self.show(1)  # the last batch goes out as the source left it

    def take(self) -> Any:
        """The source's next batch (or END); what it changed in taking it is recorded (its
        end-of-pass changes are not: nothing comes after them to hide them for)."""
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
        """The source's attributes as before (0) or after (1) its last batch was taken; after
        is for good (nothing left to hide)."""
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
        """``state()`` once the source has run to its end: the next pass's (torchdata's
        ``StatefulDataLoader`` resumed from before its end gives an empty pass); where it
        yields past its ``len()``, its state before that batch."""
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
    """``len(source)``; None where it has none, or for a DataLoader over an
    ``IterableDataset`` (a guess there, and asking arms torch's length warning)."""
    if isinstance(getattr(source, "dataset", None), torch.utils.data.IterableDataset):
        return None
    try:
        return len(source)
    except TypeError:
        return None


class Mover:
    """Shared set-up of the movers: dataset, device, batch size and the byte counters."""

    name = ""
    takes_prepared = False  # float32 only: it moves batches the host gathered and prepared
    encoded = False  # moves an EncodedDataset (jpeg) rather than a Dataset of uint8 pixels

    def __init__(self, dataset: Dataset, device: torch.device, batch_size: int) -> None:
        self.dataset, self.device, self.batch_size = dataset, device, batch_size
        self.stats = TransferStats()

    @staticmethod
    def epoch_bytes(dataset: Dataset) -> dict[str, int]:
        """Host->device bytes one epoch over ``dataset`` costs: ``per_epoch`` every epoch,
        ``once`` at start-up."""
        return {"per_epoch": uint8_bytes(dataset, len(dataset)), "once": 0}

    def batches(self, index_batches: Sequence[torch.Tensor]) -> Iterator[Batch]:
        """Yield ``(images, labels)`` on the device for ``index_batches`` (CPU int64; for
        ``takes_prepared``, the host's prepared batches instead)."""
        raise NotImplementedError


class Float32(Mover):
    """The usual way, kept as the baseline: the Loader gathers each batch and *prepares it
    on the host* (this path means exactly that), before the mover; this copies the float32
    images and int64 labels as they are."""

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


class Uint8(Mover):
    """uint8 images + narrow labels packed in one pinned buffer, one async copy."""

    name = "uint8"
    slots, side = 2, False

    def __init__(self, dataset: Dataset, device: torch.device, batch_size: int) -> None:
        super().__init__(dataset, device, batch_size)
        self.ring = Ring(self.slots, device, self.side)
        self.pixels = math.prod(dataset.image_shape)  # uint8 bytes of one image

    def _copy(self, idx: torch.Tensor) -> tuple[int, torch.Tensor, int]:
        """Gather the batch into the next slot and start its copy on the current stream;
        (slot, packed device buffer, batch size). Labels go first, so that uint16 labels
        sit at an even offset and can be viewed as int16 on the device."""
        ds, n, at = self.dataset, len(idx), idx.numpy()
        lab_end = n * ds.labels.itemsize
        i, host = self.ring.stage(lab_end + n * self.pixels)
        np.take(ds.labels, at, out=host[:lab_end].numpy().view(ds.labels.dtype))
        np.take(ds.images, at, axis=0, out=host[lab_end:].numpy().reshape(n, *ds.image_shape))
        self.stats.image_bytes += n * self.pixels
        self.stats.label_bytes += lab_end
        self.stats.copies += 1
        return i, self.ring.send(i, host), n

    def _unpack(self, dev: torch.Tensor, n: int) -> Batch:
        """A packed device buffer -> uint8 ``(n, H, W, C)`` images and int64 labels."""
        lab_end = n * self.dataset.labels.itemsize
        return (
            dev[lab_end:].view(n, *self.dataset.image_shape),
            widen(dev[:lab_end], self.dataset.labels.dtype),
        )

    def batches(self, index_batches):
        for idx in index_batches:
            _, dev, n = self._copy(idx)
            yield self._unpack(dev, n)


class Prefetch(Uint8):
    """``uint8`` with the next batch copied on a side CUDA stream while this one is used."""

    name = "prefetch"
    slots, side = 3, True  # one read by the copy in flight, one handed out, one being filled

    def batches(self, index_batches):
        for (i, dev, n), _ in ahead(self._copy(idx) for idx in index_batches):
            yield self._unpack(self.ring.ready(i, dev), n)


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
    """The whole uint8 dataset lives on the device; shuffle and gather happen there.

    One upload, in chunks straight from the (possibly memory-mapped) arrays, so the host
    never holds a second whole copy; then one int64 permutation per epoch, nothing per step.
    """

    name = "resident"
    CHUNK_BYTES = 64 << 20  # upload in 64 MiB pieces

    @staticmethod
    def epoch_bytes(dataset: Dataset) -> dict[str, int]:
        return {"per_epoch": len(dataset) * 8, "once": uint8_bytes(dataset, len(dataset))}

    @staticmethod
    def fits(dataset: Dataset, device: torch.device) -> tuple[bool, str]:
        """Whether the dataset takes at most ``RESIDENT_FRACTION`` of the free memory (the
        rest is for the model, activations and the allocator's slack), and the sizes."""
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
        self.images = self._upload(dataset.images)  # (N, H, W, C)
        self.labels = widen(self._upload(dataset.labels.view(np.uint8)), dataset.labels.dtype)
        self.stats.image_bytes += dataset.image_bytes
        self.stats.label_bytes += dataset.label_bytes

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        out = torch.empty(array.shape, dtype=torch.uint8, device=self.device)
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
    """Encoded (JPEG) stores. Per batch the files' own bytes are gathered into one reused
    host buffer (pinned for CUDA) after the narrow labels; the labels cross in one copy, and
    the prepare stage decodes the files where the pixels are used. The files stay in host
    memory: torchvision's decoder takes host bytes, since nvJPEG parses each file on the CPU
    before it copies the compressed stream to the device itself (progressive files are
    Huffman-decoded on the CPU and their coefficients cross instead). So the encoded bytes
    count as the image bytes that cross, and ``decoded_bytes`` says what the same images
    would have cost as uint8 at the training size."""

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
            idx_np = idx.numpy() if names is None else np.arange(len(idx))
            data = ds.data.view(np.ndarray)  # a memmap's slices: 3.8 us a file, a plain view's 1
            starts, ends = ds.offsets[idx_np].tolist(), ds.offsets[idx_np + 1].tolist()
            lab_end = len(idx_np) * ds.labels.itemsize
            offsets = np.cumsum([lab_end] + [b - a for a, b in zip(starts, ends)]).tolist()
            i, host = self.ring.stage(offsets[-1])
            buf = host.numpy()
            np.take(ds.labels, idx_np, out=buf[:lab_end].view(ds.labels.dtype))
            if starts:  # the files back to back in one call: 1.3 -> 1.0 us a file
                files = [data[a:b] for a, b in zip(starts, ends)]
                np.concatenate(files, out=buf[lab_end : offsets[-1]])
            if names is None and self.unread is not None and self.unread[idx_np].any():
                self._first_read(idx_np, buf, offsets)
            labels = widen(self.ring.send(i, host[:lab_end]), ds.labels.dtype)
            self.stats.image_bytes += offsets[-1] - lab_end
            self.stats.label_bytes += lab_end
            self.stats.decoded_bytes += len(idx_np) * math.prod(ds.image_shape)
            self.stats.copies += 1
            sizes = torch.from_numpy(ds.sizes[idx_np].astype(np.int64))
            where = f"{ds.name}/{ds.split}"
            yield (
                Encoded(host, offsets, sizes, idx, ds.channels, self.device, where,
                        names=names, plain=ds.plain),
                labels,
            )  # fmt: skip

    def _first_read(self, idx: np.ndarray, buf: np.ndarray, offsets: list[int]) -> None:
        """The files read for the first time, checked against the CRC-32 their store kept:
        damage libjpeg decodes without a word (bits flipped mid-scan) and files cut where a
        lying ``offsets.npy`` says are named, once each: 20 ms for 460 photos (34 MB, one
        thread, a loaded 2-vCPU machine) beside 1.8 s to decode them, in a run's first epoch."""

        def crcs(part: np.ndarray) -> list[int]:  # zlib lets go of the GIL past 5 KiB
            return [zlib.crc32(buf[offsets[k] : offsets[k + 1]]) for k in part]

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
    """``auto`` -> ``jpeg`` for an encoded store; else ``resident`` when the dataset fits
    comfortably in the device's free memory (host RAM for a CPU device), else ``prefetch``.
    Other names are checked, also against the kind of dataset."""
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
