"""An ``EncodedDataset`` straight from a folder of JPEG files, in memory (for benchmarks
only): what an encoded store holds, each file kept byte for byte, without writing one.
Glue until ``latecast convert --encoding jpeg`` is merged; then open that store instead.

    from jpeg_folder import encoded_folder
    train = encoded_folder(Path("cifar10-jpg/train"), size=(32, 32))
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image

from latecast.data import channel_stats
from latecast.kinds.jpegfiles import EncodedDataset

SUFFIXES = {".jpg", ".jpeg"}


def encoded_folder(
    root: Path, size: tuple[int, int] | None = None, stats_images: int = 2000
) -> EncodedDataset:
    """Class subfolders of ``root`` (sorted, as ``ImageFolder``) -> ``EncodedDataset``.

    Args:
        root: ``root/<class>/*.jpg``.
        size: the training size (default: the most common stored size).
        stats_images: mean/std from this many images (evenly spaced), resized to ``size``.
    """
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files = [
        (f, label)
        for label, c in enumerate(classes)
        for f in sorted((root / c).iterdir())
        if f.suffix.lower() in SUFFIXES
    ]
    blobs = [f.read_bytes() for f, _ in files]
    sizes = []
    for f, _ in files:
        with Image.open(f) as im:  # the header only: nothing decoded
            sizes.append((im.height, im.width))
    size = size or Counter(sizes).most_common(1)[0][0]
    picked = np.linspace(0, len(files) - 1, min(stats_images, len(files))).astype(int)
    sample = np.stack(
        [np.asarray(Image.open(files[i][0]).convert("RGB").resize(size[::-1])) for i in picked]
    )
    mean, std = channel_stats(sample)
    return EncodedDataset(
        name=root.name,
        split="train",
        data=np.frombuffer(b"".join(blobs), dtype=np.uint8),
        offsets=np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64),
        sizes=np.array(sizes, dtype=np.int32),
        labels=np.array(
            [label for _, label in files], np.uint8 if len(classes) <= 256 else np.uint16
        ),
        classes=tuple(classes),
        mean=mean,
        std=std,
        channels=3,
        size=tuple(size),
    )
