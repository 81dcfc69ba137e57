"""``latecast.jpeg_folder``: torchvision's ``ImageFolder`` with the files left encoded, so
that your ``DataLoader``'s workers only read files (``wrap`` decodes them on the device).

    ImageFolder(root, transform)  ->  latecast.jpeg_folder(root)   # (bytes, label) samples

``classes``, ``class_to_idx``, ``samples`` and ``targets`` are ``ImageFolder(root)``'s on any
tree, in its order (a saved list of indices picks the same files): every subfolder a class
(hidden ones and symlinks too), each class's files as ``os.walk(followlinks=True)`` finds
them, folders and names sorted as strings, torchvision's image suffixes in any case, hidden
files included (``latecast convert`` finds files its own way: hidden ones skipped, GIF
taken). A file is read whole or refused as ``read_file`` says; one that is no JPEG is
decoded on the host by ``wrap``, said once.

A DataLoader asks for a batch's samples together (``__getitems__``, torch >= 2.1): its
default collate makes them one ``Files`` buffer (with each file's path, for messages) and the
labels, which cross the worker pipe by value and which ``wrap`` packs in one copy.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils.collate import default_collate_fn_map

from ..errors import FormatError
from ..kinds.jpeg import Files
from ..kinds.jpegheader import jpeg_headers, too_big
from .convert import _shown

# torchvision's IMG_EXTENSIONS, matched against each name in lower case
SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class JpegFolder(torch.utils.data.Dataset):
    """An image folder whose samples are ``(file bytes, class index)``; see ``jpeg_folder``."""

    def __init__(self, root: str | Path) -> None:
        root = os.path.expanduser(os.fspath(root))  # as ImageFolder spells its paths
        self.root = Path(root)
        if not self.root.is_dir():
            raise FormatError(f"{self.root}: no such folder (give one folder per class)")
        self.classes, self.samples = _image_folder(root)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.targets = [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        path, label = self.samples[index]
        return read_file(path), label

    def __getitems__(self, indices: list[int]) -> Samples:
        """The samples at ``indices``, as a DataLoader asks for a batch (torch >= 2.1): its
        default collate makes them ``[Files, int64 labels]``, the files as one buffer."""
        paths = [self.samples[i][0] for i in indices]
        return Samples(read_files(paths), [self.samples[i][1] for i in indices], paths)


class Sample(tuple):
    """``(bytes, label)``, one of ``Samples``: the type the default collate is told of."""


class Samples(Sequence):
    """A batch's ``(bytes, label)`` samples, read together; the DataLoader's default collate
    makes them ``[Files, labels]`` (``collate``), any other ``collate_fn`` is given them as
    they are."""

    def __init__(self, files: list[bytes], labels: list[int], paths: list[str]) -> None:
        self.files, self.labels, self.paths = files, labels, paths

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(len(self))[i]]
        return Sample((self.files[i], self.labels[i]))


class ByValue(list):
    """``[Files, int64 labels]`` as a worker sends it: across the pipe by value (arrays and
    the paths), a plain list on the other side. A tensor would cross as shared memory passed
    by a file descriptor, one more round trip to the worker a batch, which costs more CPU
    than the copies it saves (``benchmarks/jpeg_folder_read.py``)."""

    def __reduce__(self):
        files, labels = self
        return _received, (files.data.numpy(), files.offsets, labels.numpy(), files.names)


def _received(data: np.ndarray, offsets: list[int], labels: np.ndarray, names: list) -> list:
    return [Files(torch.from_numpy(data), offsets, names), torch.from_numpy(labels)]


def collate(samples: Sequence, *, collate_fn_map: dict | None = None) -> list:
    """``default_collate`` of ``Samples``: ``[Files, int64 labels]``, the files joined; of any
    other list of ``Sample``, the collate of tuples (``[files, labels]``, as before)."""
    if not isinstance(samples, Samples):
        return default_collate([tuple(s) for s in samples])
    data = np.frombuffer(bytearray().join(samples.files), np.uint8)
    offsets = list(itertools.accumulate(map(len, samples.files), initial=0))
    names = list(map(_shown, samples.paths))  # a file that does not decode: named by its path
    batch = [Files(torch.from_numpy(data), offsets, names), torch.tensor(samples.labels)]
    return ByValue(batch) if get_worker_info() else batch  # in the main process: no pipe


default_collate_fn_map[Sample] = collate  # as torch's collate docs extend default_collate


def _image_folder(root: str) -> tuple[list[str], list[tuple[str, int]]]:
    """``ImageFolder(root)``'s classes and samples, as torchvision's ``find_classes`` and
    ``make_dataset`` find them; a ``FormatError`` where ImageFolder raises (no class
    folder, a class without images)."""
    try:
        classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    except OSError as err:
        raise FormatError(f"{_shown(root)}: cannot list it ({err.strerror or err})") from None
    samples = []
    for label, name in enumerate(classes):
        for folder, _, names in sorted(_walk(os.path.join(root, name))):
            samples += [
                (os.path.join(folder, f), label)
                for f in sorted(names)
                if f.lower().endswith(SUFFIXES)
            ]
    empty = sorted(set(classes) - {classes[label] for _, label in samples})
    if not classes or empty:
        what = f"class folders without images {empty}" if empty else "class folders missing"
        raise FormatError(f"{_shown(root)}: {what} (suffixes {list(SUFFIXES)})")
    return classes, samples


def _walk(top: str):
    """``os.walk(top, followlinks=True)``, but a link back to a folder it is inside (which
    ImageFolder walks until memory or the recursion limit runs out) is one ``FormatError``."""
    for folder, subfolders, names in os.walk(top, followlinks=True):
        real, up = os.path.realpath(folder), os.path.dirname(folder)
        while len(up) >= len(top):
            if os.path.realpath(up) == real:
                raise FormatError(
                    f"{_shown(folder)}: a link back to {_shown(up)}, a folder it is in"
                )
            up = os.path.dirname(up)
        yield folder, subfolders, names


def read_file(path: str) -> bytes:
    """The bytes of the file at ``path``; one ``FormatError`` naming it when it is no regular
    file (a FIFO is opened without waiting for a writer, never read), is empty, does not
    read, or is a JPEG over ``MAX_PIXELS`` by its header (wrap would refuse it by its position
    in the batch)."""
    return read_files([path])[0]


def read_files(paths: Sequence[str]) -> list[bytes]:
    """``read_file`` of each path, the headers read together (``jpeg_headers``)."""
    files = [_read(path) for path in paths]
    for path, head in zip(paths, jpeg_headers(files)):  # the markers, no pixels
        if why := too_big(head):  # decoding would allocate it all
            raise FormatError(f"{_shown(path)}: {why}")
    return files


def _read(path: str) -> bytes:
    """A file's bytes by one open, fstat, read and close (no stat by path first)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without a writer
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise FormatError(f"{_shown(path)}: not a regular file (a FIFO, device or socket)")
            data = os.read(fd, info.st_size)
        finally:
            os.close(fd)
    except OSError as err:
        if err.errno == errno.ENXIO:  # a socket does not open
            raise FormatError(f"{_shown(path)}: not a regular file (a socket)") from None
        raise FormatError(f"{_shown(path)}: cannot read it ({err.strerror or err})") from None
    if not data:
        raise FormatError(f"{_shown(path)}: empty file")
    return data


def jpeg_folder(root: str | Path) -> JpegFolder:
    """torchvision's ``ImageFolder`` with the files kept as their bytes: the one line from
    an image folder to ``wrap``'s JPEG field, where the files cross as they are and are
    decoded, cropped, augmented and normalized on the device (as a JPEG store's batch).
    The DataLoader's default collate makes each batch ``[Files, int64 labels]``: the files
    read together into one buffer (to other code a sequence of ``bytes``); a ``collate_fn``
    of your own is given the ``(bytes, label)`` samples, as before.

    Args:
        root: ``root/<class>/**/<image>``, as ImageFolder reads it.

    Example:
        >>> dl = DataLoader(latecast.jpeg_folder("train"), 256, shuffle=True, num_workers=8,
        ...                 persistent_workers=True)  # forked once: the epochs start at once
        >>> train = latecast.wrap(dl, mean=MEAN, std=STD, fields={0: latecast.jpeg(224)},
        ...                       augment=latecast.Augment(resized_crop=0.08, flip=0.5))
    """
    return JpegFolder(root)
