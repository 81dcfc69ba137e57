"""Write a folder of images in the two formats of the side-by-side with airbench.

    python benchmarks/peer_data.py JPEG_FOLDER OUT

JPEG_FOLDER holds ``train/<class>/*.jpg`` and ``test/<class>/*.jpg`` (the CIFAR-10 JPEG
copy, untarred: ``tar -xzf cifar10-jpg.tar.gz -C JPEG_FOLDER``). OUT gets:

    OUT/store/            a latecast store, written by ``latecast convert JPEG_FOLDER OUT/store``
    OUT/cifar10/train.pt  airbench's format, read back from that store, so both tools train
    OUT/cifar10/test.pt   on the same decoded pixels and labels: a dict of uint8 ``images``
                          (N, 32, 32, 3), int64 ``labels`` (N,) and the ``classes`` list

airbench's ``CifarLoader`` reads ``cifar10/*.pt`` relative to its working directory: run it
from OUT. The last stdout line is one JSON object (sizes, classes, seconds).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from latecast.storage.fileio import atomic_write
from latecast.storage.store import open_store
from latecast.tools.cli import main as latecast

AIRBENCH_SHAPE = (32, 32, 3)  # airbench's networks and test-time crops assume CIFAR's size


def airbench_split(store: Path, split: str, out: Path) -> int:
    """Write ``out/<split>.pt`` from the store's split; the number of images."""
    ds = open_store(store, split)
    if ds.image_shape != AIRBENCH_SHAPE:
        raise SystemExit(f"{store}/{split}: images are {ds.image_shape}, airbench needs 32x32x3")
    data = {
        "images": torch.from_numpy(np.array(ds.images)),  # (N, 32, 32, 3) uint8, a copy
        "labels": torch.from_numpy(ds.labels.astype(np.int64)),
        "classes": list(ds.classes),
    }
    with atomic_write(out / f"{split}.pt") as f:
        torch.save(data, f)
    return len(ds)


def prepare(folder: Path, out: Path) -> dict:
    """``latecast convert folder out/store``, then ``out/cifar10/{train,test}.pt`` from it."""
    t0 = time.perf_counter()
    store = out / "store"
    if latecast(["convert", str(folder), str(store)]):
        raise SystemExit(1)  # latecast printed why
    sizes = {split: airbench_split(store, split, out / "cifar10") for split in ("train", "test")}
    return {
        "store": str(store),
        "airbench": str(out / "cifar10"),
        "samples": sizes,
        "classes": list(open_store(store, "train").classes),
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="train/<class>/ and test/<class>/ images")
    p.add_argument("out", type=Path, help="store/ and cifar10/ are written here")
    args = p.parse_args()
    print(json.dumps(prepare(args.folder, args.out)))


if __name__ == "__main__":
    main()
