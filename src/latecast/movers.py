"""The Loader's movers: each batch a dataset describes (``Split.batch``) packed and sent
(``transfer.pack``), unpacked and finished on the device by the Loader's ``finish``.
``uint8`` moves it as stored, ``prefetch`` reads one batch ahead on a side stream,
``resident`` uploads the dataset once and gathers on the device; a dataset may bring its own
(``movers``: a JPEG store's ``jpeg``), and a Loader may be given one (the usual pipeline, kept
as a baseline outside the core: ``trainer/baseline.py``)."""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.profiler import record_function

from .data import Split
from .errors import ConfigError, DeviceError
from .fields import Field
from .transfer import Ring, TransferStats, ahead, pack, uint8_bytes, unpack


class Stored:
    """A Loader's mover, ``uint8``: each batch moved as it is stored and finished on the device;
    its byte counters. A batch is what the dataset describes for an index batch
    (``Split.batch``: its fields' plans and values), packed and sent, unpacked, finished by
    ``finish``."""

    name = "uint8"
    slots, side = 2, False  # its ring's (side: the next batch's copy started first)

    def __init__(self, dataset: Split, device: torch.device, batch_size: int) -> None:
        self.dataset, self.device, self.batch_size = dataset, device, batch_size
        self.stats = TransferStats()
        if device.type == "cpu":  # the batches' work and outputs in host memory
            keep_heap()

    @functools.cached_property
    def ring(self) -> Ring:
        return Ring(self.slots, self.device, self.side)

    @staticmethod
    def epoch_bytes(dataset: Split) -> dict[str, int]:
        """Host->device bytes of one epoch: ``per_epoch`` every epoch, ``once`` at start-up."""
        return {"per_epoch": uint8_bytes(dataset, len(dataset)), "once": 0}

    def gather(self, item: Any) -> tuple[list[Field], list]:
        """A batch's fields planned and their values on the host, as ``pack`` takes them, for
        an index batch (CPU int64; a stream's mover takes what its source read)."""
        return self.dataset.batch(item.numpy())

    def batches(self, items: Iterable, finish: Finish) -> Iterator[list]:
        """Each item's batch gathered, packed and sent (``side``: the next one's copy started
        first), then finished on the device."""
        sent = (pack(self.ring, *self.gather(item), self.stats) for item in items)
        for s in (s for s, _ in ahead(sent)) if self.side else sent:
            yield finish(s.plans, unpack(self.ring, s), self.device)


Finish = Callable[[list, list, torch.device], list]  # (plans, values, device) -> values


@functools.cache
def keep_heap() -> None:
    """Once a process: glibc's malloc serves blocks up to the largest block it has unmapped
    (at most 32 MiB) from its heap, and gives the heap's free top back past twice that; both
    follow the first large block freed, a batch's output, where nothing else set them: an
    epoch on the CPU then gave pages back and faulted them in anew every batch in some
    processes (MNIST: 43,000 faults, 2.5x the CPU; issue 48). A 15 MiB block freed sets them
    to 15 and 30 MiB, above CIFAR-10's batches. (At the 32 MiB cap, ImageNet-sized batches'
    19 MB intermediates came from the heap too, and went past its 64 MiB in some processes.)"""
    bytearray(15 << 20)  # calloc'd by mmap and freed at once, untouched: no page faulted in


class Prefetch(Stored):
    """``uint8`` with the next batch copied on a side CUDA stream while this one is used."""

    name = "prefetch"
    slots, side = 3, True  # one read by the copy in flight, one handed out, one being filled


def _free_bytes(device: torch.device) -> int:
    """Free memory on ``device``: CUDA's own count, or the host's available RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as lines:
            meminfo = dict(line.split(":", 1) for line in lines)
        return int(meminfo["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class Resident(Stored):
    """The whole dataset uploaded once, each of its fields' arrays as bytes in chunks (no
    second host copy) and viewed as its values (``values``); then one int64 permutation per
    epoch, each batch's rows gathered on the device. A DeviceError where it does not fit."""

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
        self.plans, arrays = dataset.batch(every)  # the fields of all N: Taken rows of arrays
        self.stats.count(self.plans, copies=0)
        self.values = [
            f.view(self._upload(a.array), self.device) for f, a in zip(self.plans, arrays)
        ]

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        """``array``'s bytes on the device (1-d uint8)."""
        rows = array.reshape(len(array), -1).view(np.uint8)  # each sample's bytes
        out = torch.empty(rows.shape, dtype=torch.uint8, device=self.device)
        step = max(1, self.CHUNK_BYTES // max(1, rows[:1].nbytes))
        for start in range(0, len(rows), step):
            part = torch.from_numpy(np.array(rows[start : start + step]))  # 64 MiB at most
            out[start : start + step].copy_(part)  # (the source may be a read-only memmap)
            self.stats.copies += 1
        return out.view(-1)

    def order(self, index_batches: Sequence[torch.Tensor]) -> torch.Tensor:
        """This epoch's order on the device (int64): one upload per epoch."""
        order = torch.cat(list(index_batches))
        with record_function("h2d"):
            order_dev = order.to(self.device, non_blocking=True)  # no copy on a CPU device
        self.stats.index_bytes += order.nbytes
        self.stats.copies += 1
        return order_dev

    def gathered(self, index: torch.Tensor) -> list:
        """Samples ``index`` (on the device) of each field's values."""
        return [v.index_select(0, index) for v in self.values]

    def batches(self, index_batches: Sequence[torch.Tensor], finish: Finish) -> Iterator[list]:
        if len(index_batches):  # finished by the plans of all N: a field's kind, its layout
            sizes = [len(i) for i in index_batches]
            for sel in torch.split(self.order(index_batches), sizes):
                yield finish(self.plans, self.gathered(sel), self.device)


RESIDENT_FRACTION = 0.5  # "resident" only where the dataset takes at most this of free memory
MOVERS: dict[str, type[Stored]] = {m.name: m for m in (Stored, Prefetch, Resident)}


def movers_for(dataset: Split) -> dict[str, type[Stored]]:
    """The movers that move this dataset: those it brings (``movers``: a JPEG store's ``jpeg``,
    ``kinds/jpeg.py``), else ``MOVERS`` (fields of a fixed size a sample)."""
    return getattr(dataset, "movers", None) or MOVERS


def resolve(transfer: str | type, dataset: Split, device: torch.device) -> type[Stored]:
    """The mover ``transfer`` names for this dataset: a mover class itself (the usual
    pipeline's, ``trainer.baseline.Float32``, say), else ``auto``: the first mover a dataset
    brings, else ``resident`` where the dataset fits, else ``prefetch``; another name must be
    one of the movers that move this dataset (ConfigError, naming what the dataset holds:
    ``what``)."""
    if isinstance(transfer, type):
        return transfer
    fit, data = movers_for(dataset), f"{dataset.name}/{dataset.split}"
    if transfer == "auto":
        if fit is not MOVERS:
            return next(iter(fit.values()))
        return Resident if Resident.fits(dataset, device)[0] else Prefetch
    if transfer not in fit:
        what = getattr(dataset, "what", "decoded uint8 pixels")
        valid = ", ".join(["auto", *fit])
        raise ConfigError(f"transfer {transfer!r} does not move {data} ({what}); valid: {valid}")
    return fit[transfer]
