"""``latecast.jpeg_folder``: torchvision's ``ImageFolder`` with the files left encoded, for
the fast way through your own ``DataLoader``: its workers only read files, ``wrap`` moves
them as one JPEG field and decodes them where the pixels are used (``encoded.py``).

    ImageFolder(root, transform)  ->  latecast.jpeg_folder(root)   # (bytes, label) samples

A sample is ``(file bytes, class index)``, the classes and files found as ``latecast
convert`` finds them (sorted class subfolders, image suffixes, hidden files skipped), and
``classes``, ``class_to_idx``, ``samples`` and ``targets`` are ImageFolder's. A file is
read with one ``os.read`` (open, size, read, close: 4 us a CIFAR-10 file against 11 through
``open().read()``, loaded 2-core machine); a file that is no JPEG is decoded on the host
by ``wrap``, said once.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import FormatError
from .convert import _list_images


class JpegFolder(torch.utils.data.Dataset):
    """An image folder whose samples are ``(file bytes, class index)``; see ``jpeg_folder``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FormatError(f"{self.root}: no such folder (give one folder per class)")
        classes, found = _list_images(self.root, None)
        self.classes = list(classes)
        self.class_to_idx = {name: i for i, name in enumerate(classes)}
        self.samples = [(str(path), label) for path, label in found]
        self.targets = [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        path, label = self.samples[index]
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, os.fstat(fd).st_size), label
        finally:
            os.close(fd)


def jpeg_folder(root: str | Path) -> JpegFolder:
    """torchvision's ``ImageFolder`` with the files kept as their bytes: the one line from
    an image folder to ``wrap``'s JPEG field, where the files cross as they are and are
    decoded, cropped, augmented and normalized on the device (as a JPEG store's batch).
    The DataLoader's default collate makes each batch ``[list of bytes, int64 labels]``.

    Args:
        root: ``root/<class>/**/<image>``, as ImageFolder reads it.

    Example:
        >>> dl = DataLoader(latecast.jpeg_folder("train"), 256, shuffle=True, num_workers=8,
        ...                 persistent_workers=True)  # forked once: the epochs start at once
        >>> train = latecast.wrap(dl, mean=MEAN, std=STD, fields={0: latecast.jpeg(224)},
        ...                       augment=latecast.Augment(resized_crop=0.08, flip=0.5))
    """
    return JpegFolder(root)
