"""What every dataset is, a ``Split``, checked once, which describes a batch of its samples as
fields (``batch``); the ``Dataset`` of uint8 pixels and ``Dataset16`` of 16-bit ones (a JPEG
store's: ``kinds/jpegfiles.py``); the batch type the stages pass on. No torch here (convert's
workers): the fields' kinds are imported when a batch is asked for."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import FormatError, numbers_of

if TYPE_CHECKING:  # storage imports this module and runs without torch (convert's workers)
    import torch


@dataclass(frozen=True, eq=False)
class Split:
    """What every kind of dataset has; a subclass gives ``image_shape`` and ``image_bytes``.
    A FormatError naming the split where a field is bad."""

    name: str  # "mnist", "cifar10", a store folder, a stream's spec
    split: str  # "train" or "test"
    labels: np.ndarray  # (N,) uint8 class indices (uint16 past 256 classes)
    classes: tuple[str, ...]  # class names
    mean: tuple[float, ...]  # per channel, [0, 1] units, of the *train* split: the
    std: tuple[float, ...]  # device-side normalize is torchvision's Normalize(mean, std)

    def __post_init__(self) -> None:
        lb, c, values = self.labels, self.image_shape[2], (*self.mean, *self.std)
        finite = all(isinstance(v, numbers.Real) and math.isfinite(v) for v in values)
        rgba = "; RGBA? drop the alpha, images[..., :3]" * (c == 4 and len(self.mean) == 3)
        self._check(
            (
                lb.ndim == 1 and lb.dtype in (np.uint8, np.uint16),
                f"labels must be uint8/uint16 (N,), got {lb.dtype} with shape {tuple(lb.shape)}",
            ),
            (
                len(self.mean) == c == len(self.std) and finite and min(self.std) > 0,
                f"mean/std need {c} finite channel values (std > 0), got {self.mean}/{self.std}"
                + rgba,
            ),
        )

    def _check(self, *checks: tuple) -> None:
        """One FormatError naming the split for the first ``(ok, what must be)`` not ok."""
        for ok, what in checks:
            if not ok:
                raise FormatError(f"{self.name}/{self.split}: {what}")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def label_bytes(self) -> int:
        return int(self.labels.nbytes)

    def batch(self, at: np.ndarray) -> tuple[list, list]:
        """Samples ``at`` (an index array) as a batch: its fields' plans (``fields.Field``) and
        their values on the host, as ``transfer.pack`` takes them."""
        raise NotImplementedError(f"{type(self).__name__} describes no batch")


@dataclass(frozen=True, eq=False)
class Dataset(Split):
    """uint8 images and labels kept in their storage dtype, ready for a ``Loader``."""

    images: np.ndarray  # (N, H, W, C) uint8, maybe a memmap
    digest: str = ""  # SHA-256 of every image byte as written (images_sha256), "": unknown
    depth = np.uint8  # what its pixels are

    def __post_init__(self) -> None:
        im, n, want = self.images, len(self.labels), np.dtype(self.depth).name
        got = f"images must be {want} (N, H, W, C), got {im.dtype} {tuple(im.shape)}"
        got += "; uint16 ones are a Dataset16's" * (want == "uint8" and im.dtype == np.uint16)
        self._check((im.dtype == self.depth and im.ndim == 4, got))
        super().__post_init__()
        self._check((len(im) == n, f"{len(im)} images but {n} labels"))

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.images.shape[1:])

    @property
    def image_bytes(self) -> int:
        return int(self.images.nbytes)

    def batch(self, at: np.ndarray) -> tuple[list, list]:
        """The images and labels ``at``, rows gathered as they are packed (``Taken``)."""
        from .fields import Taken

        plans = self.__dict__.setdefault("_plans", {})  # by length: every batch but the last's
        if len(at) not in plans:
            plans[len(at)] = self.fields(len(at))
        return plans[len(at)], [Taken(self.images, at), Taken(self.labels, at)]

    def fields(self, n: int) -> list[Any]:
        """A batch of ``n``: uint8 ``(n, H, W, C)`` images, its narrow labels."""
        import torch

        from .fields import Image, labels_field

        return [Image(0, torch.uint8, (n, *self.image_shape)), labels_field(self.labels, n)]


@dataclass(frozen=True, eq=False)
class Dataset16(Dataset):
    """A ``Dataset`` of uint16 images (a 16-bit store): ``mean`` and ``std`` in stored units;
    its images cross as stored and are made float on the device (``pixels16.py``)."""

    depth = np.uint16

    def fields(self, n: int) -> list[Any]:
        import torch

        from .fields import labels_field
        from .pixels16 import Images16

        shape, deep = (n, *self.image_shape), torch.uint16
        images = Images16("images", deep, shape, deep, "NHWC", self.mean, self.std)
        return [images, labels_field(self.labels, n)]


def channel_stats(images: np.ndarray, chunk: int = 8192) -> tuple[tuple, tuple]:
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
    images, labels, *, name="arrays", split="train", classes=None, mean=None, std=None
) -> Dataset:
    """A ``Dataset`` from uint8 (or uint16) ``(N, H, W)`` or ``(N, H, W, C)`` images (numpy or
    torch, e.g. ``torchvision.datasets.MNIST(...).data``) and integer labels in 0..65535.
    Missing ``mean``/``std`` are measured on the images; missing ``classes`` are ``"0"`` ..
    ``str(max label)``. A FormatError naming ``name`` for anything else.

    Example:
        >>> mnist = torchvision.datasets.MNIST("data", download=False)
        >>> train = latecast.from_arrays(mnist.data, mnist.targets, name="mnist")
    """
    images, labels = _array(images, "images", name), _array(labels, "labels", name)
    if images.ndim == 3:
        images = images[..., None]  # (N, H, W) -> (N, H, W, 1)
    bad = None
    if images.ndim == 4 and images.shape[3] > 4:  # channels last, 1 to 4 of them
        bad = (
            f"images of shape {images.shape} look like (N, C, H, W); latecast takes "
            f"(N, H, W, C): pass images.permute(0, 2, 3, 1) (numpy: .transpose(0, 2, 3, 1))"
            if images.shape[1] <= 4
            else f"images (N, H, W, C) have 1 to 4 channels, got shape {images.shape}"
        )
    elif images.ndim != 4 or images.dtype not in (np.uint8, np.uint16):
        bad = f"images must be uint8 or uint16 (N, H, W) or (N, H, W, C), got {images.dtype} "
        bad += str(images.shape)
    elif labels.ndim != 1 or labels.dtype.kind not in "iu":
        bad = f"labels must be integers (N,), got {labels.dtype} {labels.shape}"
    elif labels.size and (labels.min() < 0 or labels.max() > np.iinfo(np.uint16).max):
        bad = f"labels must lie in 0..65535, got {labels.min()}..{labels.max()}"
    if bad:
        raise FormatError(f"{name}: {bad}")
    given = (numbers_of(mean), numbers_of(std)) if (mean, std) != (None, None) else None
    try:
        if isinstance(classes, str) or not (isinstance(name, str) and isinstance(split, str)):
            raise TypeError
        classes = None if classes is None else tuple(str(c) for c in classes)
        if None in (given or ()):
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
    return pixels_of(images)(name, split, labels, classes, mean, std, images)


def pixels_of(images: np.ndarray) -> type[Dataset]:
    """The ``Dataset`` class of these images: ``Dataset16`` for uint16 ones."""
    return Dataset16 if images.dtype == np.uint16 else Dataset


def _array(value, what: str, name: str) -> np.ndarray:
    """A numpy array of ``value`` (numpy, a torch tensor on any device, nested lists)."""
    try:
        return value.numpy(force=True) if hasattr(value, "numpy") else np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise FormatError(f"{name}: {what} must be an array or tensor ({e})") from None


def check_labels(labels: np.ndarray, n_classes: int, where: object) -> None:
    """Raise ``FormatError`` naming ``where`` and the first label outside ``0..n_classes-1``."""
    bad = np.flatnonzero(labels >= n_classes)
    if bad.size:
        raise FormatError(
            f"{where}: label {labels[bad[0]]} at index {bad[0]} is outside 0..{n_classes - 1}"
        )


Batch = tuple["torch.Tensor", "torch.Tensor"]  # (images, labels)
