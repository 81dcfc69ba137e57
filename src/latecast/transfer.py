"""How a batch crosses from host memory to the device: the transfer strategies.

A strategy turns batches of dataset indices into ready ``(images, labels)`` on the device.
They share one interface and are chosen by name from ``STRATEGIES``:

- ``float32``  gather, cast and normalize on the CPU, copy float32 + int64 (the usual way).
- ``uint8``    gather uint8 images and labels into one reused pinned buffer, one
               ``non_blocking`` copy, then cast + normalize on the device.
- ``prefetch`` as ``uint8``, but the next batch is gathered and copied on a side CUDA
               stream while the current one is used; one event per buffer guards reuse.
- ``resident`` the whole uint8 dataset is copied once; batches are gathered on the device.

Packing labels behind the images in the same pinned buffer makes one copy per batch
instead of two: for MNIST at batch 256 a copy is ~200 KB, small enough that the fixed
cost of each ``cudaMemcpyAsync`` matters.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
from torch.profiler import record_function

from .data import Dataset
from .errors import ConfigError, DeviceError

Prepare = Callable[[torch.Tensor, int], torch.Tensor]  # (uint8 NHWC, batch number) -> NCHW float
Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class TransferStats:
    """What crossed host->device, counted by the strategy itself (exact on every device;
    on a CPU "device" the copies are no-ops but the accounting is the same)."""

    image_bytes: int = 0     # image bytes handed to the device
    label_bytes: int = 0     # label bytes handed to the device
    index_bytes: int = 0     # resident: one int64 permutation per epoch
    copies: int = 0          # host->device copy calls
    batches: int = 0         # batches yielded
    wait_seconds: float = 0.0  # host time the consumer spent waiting inside next()

    @property
    def h2d_bytes(self) -> int:
        return self.image_bytes + self.label_bytes + self.index_bytes


def float32_bytes(dataset: Dataset, samples: int) -> int:
    """Bytes the ``float32`` strategy moves for ``samples`` images: float32 pixels, int64 labels."""
    h, w, c = dataset.image_shape
    return samples * (h * w * c * 4 + 8)


def epoch_bytes(dataset: Dataset, name: str) -> dict[str, int]:
    """Host->device bytes one epoch over ``dataset`` costs with strategy ``name``:
    ``per_epoch`` every epoch, ``once`` at start-up (``resident``'s upload)."""
    n, (h, w, c) = len(dataset), dataset.image_shape
    narrow = n * (h * w * c + dataset.labels.itemsize)
    table = {"float32": {"per_epoch": float32_bytes(dataset, n), "once": 0},
             "uint8": {"per_epoch": narrow, "once": 0},
             "prefetch": {"per_epoch": narrow, "once": 0},
             "resident": {"per_epoch": n * 8, "once": narrow}}  # int64 permutation per epoch
    return table[name]


def _host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    """A reusable uint8 staging buffer, pinned when a CUDA copy will read it (row 27)."""
    if pin:
        try:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        except RuntimeError as err:  # pinned memory is a scarce OS resource
            warnings.warn(f"pinned host buffer of {nbytes} bytes failed ({err}); "
                          "using pageable memory, copies will be synchronous", stacklevel=3)
    return torch.empty(nbytes, dtype=torch.uint8)


class Strategy:
    """Shared set-up: dataset, device, the ``prepare`` step and the byte counters."""

    name = ""

    def __init__(self, dataset: Dataset, device: torch.device, batch_size: int,
                 prepare: Prepare, stats: TransferStats) -> None:
        self.dataset, self.device, self.batch_size = dataset, device, batch_size
        self.prepare, self.stats = prepare, stats
        self.cuda = device.type == "cuda"

    def batches(self, index_batches: list[torch.Tensor], first: int = 0) -> Iterator[Batch]:
        """Yield ready batches for ``index_batches`` (CPU int64 tensors); ``first`` is the
        number of the first batch (per-batch augmentation seeds depend on it)."""
        raise NotImplementedError


class Float32(Strategy):
    """The baseline: normalize on the CPU, copy float32 images and int64 labels."""

    name = "float32"

    def batches(self, index_batches, first=0):
        ds = self.dataset
        for k, idx in enumerate(index_batches, first):
            idx_np = idx.numpy()
            x = self.prepare(torch.from_numpy(ds.images[idx_np]), k)  # (n, C, H, W) float on CPU
            y = torch.from_numpy(ds.labels[idx_np].astype(np.int64))
            self.stats.image_bytes += x.nbytes
            self.stats.label_bytes += y.nbytes
            self.stats.copies += 2
            with record_function("h2d"):
                x, y = x.to(self.device), y.to(self.device)
            yield x, y


class _Slot:
    """One staging buffer: images then labels packed back to back, plus the event of
    the last copy that read it (the buffer is rewritten only after that copy is done)."""

    def __init__(self, nbytes: int, cuda: bool) -> None:
        self.host = _host_buffer(nbytes, pin=cuda)
        self.host_np = self.host.numpy()
        self.done = torch.cuda.Event() if cuda else None  # re-recorded by every copy

    def fill(self, ds: Dataset, idx: np.ndarray) -> int:
        """Gather the batch into this buffer; return the number of bytes used."""
        if self.done is not None:
            self.done.synchronize()  # the previous copy out of this buffer has finished
        n, (h, w, c) = len(idx), ds.image_shape
        img_end = n * h * w * c
        lab_end = img_end + n * ds.labels.itemsize
        np.take(ds.images, idx, axis=0, out=self.host_np[:img_end].reshape(n, h, w, c))
        np.take(ds.labels, idx, axis=0, out=self.host_np[img_end:lab_end].view(ds.labels.dtype))
        return lab_end


def _unpack(dev: torch.Tensor, ds: Dataset, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a packed device buffer into uint8 (n, H, W, C) images and int64 labels."""
    h, w, c = ds.image_shape
    img_end = n * h * w * c
    images = dev[:img_end].view(n, h, w, c)
    return images, _widen(dev[img_end:img_end + n * ds.labels.itemsize], ds.labels.itemsize)


def _widen(raw: torch.Tensor, itemsize: int) -> torch.Tensor:
    """Narrow label bytes on the device -> int64 (what ``cross_entropy`` wants)."""
    if itemsize == 1:
        return raw.long()
    return raw.view(torch.int16).long() & 0xFFFF  # uint16 travels as 2 raw bytes


class Uint8(Strategy):
    """uint8 images + narrow labels in one pinned buffer, one async copy, normalize on device."""

    name = "uint8"
    slots = 2

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        ds = self.dataset
        self.pixels = int(np.prod(ds.image_shape))  # uint8 bytes of one image
        nbytes = self.batch_size * (self.pixels + ds.labels.itemsize)
        self.ring = [_Slot(nbytes, self.cuda) for _ in range(self.slots)]

    def _copy(self, slot: _Slot, idx: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Gather into ``slot`` and start its copy on the current stream."""
        n = len(idx)
        used = slot.fill(self.dataset, idx.numpy())
        with record_function("h2d"):
            dev = slot.host[:used].to(self.device, non_blocking=True)
        if self.cuda:
            slot.done.record()
        self.stats.image_bytes += n * self.pixels
        self.stats.label_bytes += n * self.dataset.labels.itemsize
        self.stats.copies += 1
        return dev, n

    def batches(self, index_batches, first=0):
        for k, idx in enumerate(index_batches, first):
            dev, n = self._copy(self.ring[k % self.slots], idx)
            images, labels = _unpack(dev, self.dataset, n)
            yield self.prepare(images, k), labels


class Prefetch(Uint8):
    """``uint8`` with the next batch copied on a side CUDA stream while this one is used.

    Three slots: one being read by the copy in flight, one just handed to the consumer,
    one being filled. On a CPU device there is nothing to overlap: it runs as ``uint8``.
    """

    name = "prefetch"
    slots = 3

    def batches(self, index_batches, first=0):
        if not self.cuda:
            yield from super().batches(index_batches, first)
            return
        side = torch.cuda.Stream(self.device)
        main = torch.cuda.current_stream(self.device)

        def start(k: int):
            with torch.cuda.stream(side):
                dev, n = self._copy(self.ring[k % self.slots], index_batches[k - first])
            return dev, n, self.ring[k % self.slots].done

        pending = start(first) if index_batches else None
        for k in range(first, first + len(index_batches)):
            dev, n, copied = pending
            if k + 1 < first + len(index_batches):
                pending = start(k + 1)  # overlaps with the consumer's work on batch k
            main.wait_event(copied)
            dev.record_stream(main)  # allocated on `side`, used on `main`
            images, labels = _unpack(dev, self.dataset, n)
            yield self.prepare(images, k), labels


class Resident(Strategy):
    """The whole uint8 dataset lives on the device; shuffle and gather happen there.

    One upload of the dataset, then one int64 permutation per epoch: nothing per step.
    """

    name = "resident"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        ds = self.dataset
        need = ds.image_bytes + ds.label_bytes
        if self.cuda:
            free, total = torch.cuda.mem_get_info(self.device)
            if need > free * RESIDENT_FRACTION:
                raise DeviceError(
                    f"resident: {ds.name}/{ds.split} needs {need / 2**20:.0f} MiB on {self.device}, "
                    f"{free / 2**20:.0f} MiB of {total / 2**20:.0f} MiB free; "
                    f"use --transfer prefetch")
        self.images = torch.from_numpy(np.array(ds.images)).to(self.device)  # (N, H, W, C)
        raw = torch.from_numpy(np.array(ds.labels).view(np.uint8)).to(self.device)  # copy: may be a read-only memmap
        self.labels = _widen(raw, ds.labels.itemsize)  # narrow upload, widened on the device
        self.stats.image_bytes += ds.image_bytes
        self.stats.label_bytes += ds.label_bytes
        self.stats.copies += 2

    def batches(self, index_batches, first=0):
        if not index_batches:
            return
        order = torch.cat(index_batches)  # this epoch's order, one upload
        with record_function("h2d"):
            order_dev = order.to(self.device, non_blocking=self.cuda)
        self.stats.index_bytes += order.nbytes
        self.stats.copies += 1
        start = 0
        for k, idx in enumerate(index_batches, first):
            sel = order_dev[start:start + len(idx)]
            start += len(idx)
            images = self.images.index_select(0, sel)  # (n, H, W, C) gathered on device
            yield self.prepare(images, k), self.labels.index_select(0, sel)


# A dataset is "resident" only if it takes at most this share of free device memory: the
# rest is for the model, activations and the allocator's slack.
RESIDENT_FRACTION = 0.5

STRATEGIES: dict[str, type[Strategy]] = {
    s.name: s for s in (Float32, Uint8, Prefetch, Resident)
}


def resolve(name: str, dataset: Dataset, device: torch.device) -> str:
    """``auto`` -> ``resident`` when the dataset fits comfortably on the device (always on
    CPU), else ``prefetch``; any other name is checked and returned."""
    if name == "auto":
        if device.type != "cuda":
            return "resident"
        free, _ = torch.cuda.mem_get_info(device)
        fits = dataset.image_bytes + dataset.label_bytes <= free * RESIDENT_FRACTION
        return "resident" if fits else "prefetch"
    if name not in STRATEGIES:
        raise ConfigError(f"unknown transfer strategy {name!r}; valid: "
                          f"{', '.join(['auto', *STRATEGIES])}")
    return name
