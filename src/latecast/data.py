"""``Dataset``, what every source (``load_dataset``, ``open_store``, ``from_arrays``) gives the
loader: uint8 images, narrow labels, class names, the train split's mean/std; checked once.
``EncodedDataset`` holds JPEG files instead of pixels; both share ``_Split``'s fields."""

from __future__ import annotations

import hashlib
import math
import numbers
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .errors import FormatError, numbers_of

if TYPE_CHECKING:  # storage imports this module and runs without torch (convert's workers)
    import torch


@dataclass(frozen=True, eq=False)
class _Split:
    """What raw and encoded datasets share (their fields are ``Dataset``'s), checked here
    for both once each has checked its images."""

    name: str
    split: str
    labels: np.ndarray
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        lb, c, values = self.labels, self.image_shape[2], (*self.mean, *self.std)
        if lb.ndim != 1 or lb.dtype not in (np.uint8, np.uint16):
            raise FormatError(
                f"{self.name}/{self.split}: labels must be uint8/uint16 (N,), "
                f"got {lb.dtype} with shape {tuple(lb.shape)}"
            )
        finite = all(isinstance(v, numbers.Real) and math.isfinite(v) for v in values)
        if len(self.mean) != c or len(self.std) != c or not finite or min(self.std) <= 0:
            raise FormatError(
                f"{self.name}/{self.split}: mean/std need {c} finite channel values "
                f"(std > 0), got {self.mean}/{self.std}"
                + "; RGBA? drop the alpha, images[..., :3]"
                * (c == 4 and len(self.mean) == 3)
            )

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def label_bytes(self) -> int:
        return int(self.labels.nbytes)


@dataclass(frozen=True, eq=False)
class Dataset(_Split):
    """Images and labels kept in their storage dtype, ready for a ``Loader``.

    Args:
        name: dataset name (``"mnist"``, ``"cifar10"``, a store folder name, ...).
        split: ``"train"`` or ``"test"``.
        labels: ``(N,)`` uint8 class indices (uint16 where there are more than 256 classes).
        classes: class names, ``len(classes)`` is the number of classes.
        mean, std: per-channel statistics in [0, 1] units (of the *train* split), used by
            the device-side normalize exactly like torchvision's ``Normalize(mean, std)``;
            of uint16 images, in stored units (``latecast.image16``'s).
        images: ``(N, H, W, C)`` uint8 (or uint16: ``wide.py``), possibly a read-only memmap.
        digest: SHA-256 of every image byte as the store was written (meta.json's
            ``images_sha256``), "" when unknown; ``fingerprint`` uses it.
    """

    images: np.ndarray
    digest: str = ""

    def __post_init__(self) -> None:
        im = self.images
        if im.dtype not in (np.uint8, np.uint16) or im.ndim != 4:
            raise FormatError(
                f"{self.name}/{self.split}: images must be uint8 or uint16 (N, H, W, C), "
                f"got {im.dtype} with shape {tuple(im.shape)}"
            )
        super().__post_init__()
        if len(im) != len(self.labels):
            raise FormatError(
                f"{self.name}/{self.split}: {len(im)} images but {len(self.labels)} labels"
            )

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(H, W, C)`` of one image."""
        return tuple(self.images.shape[1:])

    @property
    def image_bytes(self) -> int:
        return int(self.images.nbytes)


@dataclass(frozen=True, eq=False)
class EncodedDataset(_Split):
    """Images kept as their encoded files (JPEG), for decoding on the device: ``data`` holds
    the files back to back, image ``i`` is ``data[offsets[i]:offsets[i + 1]]``.

    Args:
        name, split, labels, classes, mean, std: as for ``Dataset``.
        data: ``(total,)`` uint8, possibly a read-only memmap.
        offsets: ``(N + 1,)`` int64, ``offsets[0] == 0`` and ``offsets[-1] == len(data)``.
        sizes: ``(N, 2)`` int32 ``(H, W)`` of each image as stored.
        channels: 1 (decoded as grayscale) or 3 (RGB).
        size: ``(H, W)`` every image is cropped or resized to on the device.
        encoding: what ``data`` holds; ``"jpeg"``.
        digest: as for ``Dataset`` (of ``data``).
        crc32: ``(N,)`` uint32, each file's CRC-32 as it was written (a store's), or None.
        plain: every file is upright (EXIF orientation 1) with 1 or 3 channels, as its
            header says (a store's meta.json): the CPU decoder reads no header.
    """

    data: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    channels: int
    size: tuple[int, int]
    encoding: str = "jpeg"
    digest: str = ""
    crc32: np.ndarray | None = None
    plain: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        n, where = len(self.labels), f"{self.name}/{self.split}"
        checks = [
            (self.data.dtype == np.uint8 and self.data.ndim == 1, "data must be uint8 (total,)"),
            (self.offsets.shape == (n + 1,), f"offsets must be int64 ({n + 1},)"),
            (
                len(self.offsets)
                and self.offsets[0] == 0
                and self.offsets[-1] == len(self.data)
                and bool(np.all(np.diff(self.offsets) > 0)),
                "offsets must rise from 0 to len(data)",
            ),
            (self.sizes.shape == (n, 2), f"sizes must be ({n}, 2)"),
            (self.crc32 is None or self.crc32.shape == (n,), f"crc32 must be ({n},)"),
            (self.channels in (1, 3), "channels must be 1 or 3"),
            (self.encoding == "jpeg", "encoding must be 'jpeg'"),
        ]
        for ok, what in checks:
            if not ok:
                raise FormatError(f"{where}: {what}")

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(H, W, C)`` of one image once decoded and cropped to ``size``."""
        return (*self.size, self.channels)

    @property
    def image_bytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(frozen=True, eq=False)
class StreamedDataset(_Split):
    """JPEG files read from their source as the batches are taken, never all held at once
    (WebDataset shards: ``storage/stream.py``), moved and prepared as a JPEG store's.
    ``plan`` gives a rank's share of an epoch, a pure function of the seed, the epoch and
    what remains of it (not of the number of ranks: a resume may change that): its batch
    ``sizes``, ``ids``, ``read(start)`` -> ``(EncodedDataset, ids, names)`` per batch from
    batch ``start`` on, and ``left(batches)``, what remains once every rank took that many.

    Args:
        name, split, labels, classes, mean, std: as for ``Dataset`` (every sample's labels).
        size, channels: as for ``EncodedDataset``.
        file_bytes: the JPEG files' bytes, all together.
        digest: what identifies the content (its source's hashes).
    """

    size: tuple[int, int]
    channels: int
    file_bytes: int
    digest: str = ""
    encoding = "jpeg"
    order = "stream"  # the Loader's order: the source's own, saved in its state

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (*self.size, self.channels)

    @property
    def image_bytes(self) -> int:
        return self.file_bytes

    def plan(self, epoch, rank, world, batch_size, *, shuffle, seed, remaining=None):
        raise NotImplementedError


def channel_stats(
    images: np.ndarray, chunk: int = 8192
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) std of uint8 ``(N, H, W, C)`` images in [0, 1]
    units (uint16: in stored units), summed in float64 over ``chunk`` images at a time (a
    memmap is read once)."""
    c = images.shape[3]
    sums, count = np.zeros((2, c)), 0
    for start in range(0, len(images), chunk):
        part = np.asarray(images[start : start + chunk], dtype=np.float64).reshape(-1, c)
        sums += part.sum(0), (part * part).sum(0)
        count += len(part)
    return mean_std(sums, count, 255 if images.dtype == np.uint8 else 1)


def mean_std(
    sums: np.ndarray, count: int, unit: int = 255
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) std in units of ``unit`` (255: [0, 1] of uint8; 1:
    the stored units) from ``sums`` (2, C): the sums of pixel values and of their squares,
    over ``count`` pixels per channel."""
    if count == 0:
        raise FormatError("cannot compute mean/std of an empty dataset")
    mean = np.asarray(sums[0], np.float64) / count / unit
    std = np.sqrt(np.maximum(np.asarray(sums[1], np.float64) / count / unit**2 - mean * mean, 0))
    return tuple(float(m) for m in mean), tuple(float(max(s, 1e-8)) for s in std)


def from_arrays(
    images,
    labels,
    *,
    name: str = "arrays",
    split: str = "train",
    classes: tuple[str, ...] | None = None,
    mean=None,
    std=None,
) -> Dataset:
    """A ``Dataset`` from uint8 arrays or tensors people already have.

    Accepts ``(N, H, W)`` or ``(N, H, W, C)`` uint8 (or uint16) images (numpy or torch, e.g.
    ``torchvision.datasets.MNIST(...).data``) and integer labels. Missing ``mean``/``std``
    are computed from the images; missing ``classes`` are ``"0"`` .. ``str(max label)``.

    Example:
        >>> mnist = torchvision.datasets.MNIST("data", download=False)
        >>> train = latecast.from_arrays(mnist.data, mnist.targets, name="mnist")
    """
    images, labels = _array(images, "images", name), _array(labels, "labels", name)
    if images.ndim == 3:
        images = images[..., None]  # (N, H, W) -> (N, H, W, 1)
    if images.ndim == 4 and images.shape[3] > 4:  # channels last, 1 to 4 of them
        raise FormatError(
            f"{name}: images of shape {images.shape} look like (N, C, H, W); latecast takes "
            f"(N, H, W, C): pass images.permute(0, 2, 3, 1) (numpy: .transpose(0, 2, 3, 1))"
            if images.shape[1] <= 4
            else f"{name}: images (N, H, W, C) have 1 to 4 channels, got shape {images.shape}"
        )
    if images.ndim != 4 or images.dtype not in (np.uint8, np.uint16):
        raise FormatError(
            f"{name}: images must be uint8 or uint16 (N, H, W) or (N, H, W, C), "
            f"got {images.dtype} {images.shape}"
        )
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise FormatError(
            f"{name}: labels must be integers (N,), got {labels.dtype} {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() > np.iinfo(np.uint16).max):
        raise FormatError(
            f"{name}: labels must lie in 0..65535, got {labels.min()}..{labels.max()}"
        )
    given = (numbers_of(mean), numbers_of(std)) if (mean, std) != (None, None) else None
    try:
        if isinstance(classes, str) or not (isinstance(name, str) and isinstance(split, str)):
            raise TypeError
        classes = None if classes is None else tuple(str(c) for c in classes)
        if given is not None and None in given:
            raise TypeError
    except TypeError:
        raise FormatError(
            f"{name!s:.60}: name and split must be strings, classes a sequence of names, mean "
            f"and std sequences of numbers, finite (both or neither), got {split!r:.60}, "
            f"{classes!r:.60}, {mean!r:.60}, {std!r:.60}"
        ) from None
    mean, std = given or channel_stats(images)
    n_classes = len(classes) if classes is not None else int(labels.max()) + 1 if labels.size else 0
    check_labels(labels, n_classes, name)
    labels = labels.astype(np.uint8 if n_classes <= 256 else np.uint16)
    classes = classes or tuple(str(i) for i in range(n_classes))
    return Dataset(name, split, labels, classes, mean, std, images)


def _array(value, what: str, name: str) -> np.ndarray:
    """A numpy array of ``value`` (numpy, a torch tensor on any device, nested lists)."""
    try:
        return value.numpy(force=True) if hasattr(value, "numpy") else np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise FormatError(f"{name}: {what} must be an array or tensor ({e})") from None


def fingerprint(ds: Dataset | EncodedDataset, samples: int = 64, sampled: bool = False) -> str:
    """What identifies a split's content, as 16 hex digits, equal on every process and
    machine: its shapes, mean/std, every label (a JPEG store: every file's offset) and its
    images' SHA-256 recorded when written (``ds.digest``), else (or with ``sampled``, the
    older runs' form) ``samples`` images spread evenly over it."""
    n = len(ds)
    picks = sorted({i * (n - 1) // max(samples - 1, 1) for i in range(min(samples, n))})
    h = hashlib.sha256(repr([len(ds), ds.image_shape, *map(float, (*ds.mean, *ds.std))]).encode())
    h.update(ds.labels.astype(ds.labels.dtype.newbyteorder("<")).tobytes())
    if isinstance(ds, EncodedDataset):
        h.update(ds.offsets.astype("<i8").tobytes())
    if ds.digest and not sampled:
        h.update(ds.digest.encode())
    elif isinstance(ds, EncodedDataset):
        for i in picks:
            h.update(ds.data[ds.offsets[i] : ds.offsets[i + 1]].tobytes())
    else:
        h.update(np.ascontiguousarray(ds.images[picks]).tobytes())
    return h.hexdigest()[:16]


def check_labels(labels: np.ndarray, n_classes: int, where: str | os.PathLike) -> None:
    """Raise ``FormatError`` naming ``where`` and the first label outside ``0..n_classes-1``."""
    bad = np.flatnonzero(labels >= n_classes)
    if bad.size:
        raise FormatError(
            f"{where}: label {labels[bad[0]]} at index {bad[0]} is outside 0..{n_classes - 1}"
        )


# ---- batches, as the stages hand them on ----------------------------------------------

Batch = tuple["torch.Tensor", "torch.Tensor"]  # (images, labels)


@dataclass
class Encoded:
    """A batch of JPEG files back to back, as the ``jpeg`` mover hands it on: file ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``, in a slot of the mover's ring (decode it before
    asking for the batch after next)."""

    data: torch.Tensor  # (bytes,) uint8 on the CPU, pinned for a CUDA device
    offsets: list[int]  # (n + 1,)
    sizes: torch.Tensor  # (n, 2) int64 (H, W) as stored, on the CPU
    indices: torch.Tensor  # (n,) int64 dataset indices, on the CPU (for error messages)
    channels: int  # to decode to: 1 (gray) or 3 (RGB)
    device: torch.device  # where the pixels are wanted
    source: str = ""  # the dataset, "name/split", for messages
    decoded: dict = field(default_factory=dict)  # wrap: position -> CHW of a non-JPEG file
    names: list | None = None  # a stream's: each file's shard and key, for messages
    heads: list | None = None  # wrap: each file's jpeg_header, read as it was planned
    plain: bool = False  # every file upright, 1 or 3 channels (``EncodedDataset.plain``)
    interpolation: str = "bilinear"  # or "bicubic": how a crop is resized to the training size

    def __len__(self) -> int:
        return len(self.sizes)

    def sample(self, i: int) -> str:
        """File ``i`` in a message: its shard and key, else its sample index in ``source``."""
        return self.names[i] if self.names else f"{self.source}: sample {int(self.indices[i])}"

    def files(self) -> list[torch.Tensor]:
        """One 1-D uint8 view per file (what the decoders take), cut in one call."""
        at = self.offsets
        return list(self.data[at[0] : at[-1]].split([b - a for a, b in zip(at, at[1:])]))
