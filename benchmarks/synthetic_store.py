"""Write a store of random uint8 images of a real dataset's shape (for benchmarks only).

    python benchmarks/synthetic_store.py OUT --shape 32x32x3 --train 50000 --test 10000

Makes OUT/train and OUT/test (as `latecast convert` does), generated in chunks so a store
larger than memory can be made: 1,000,000 MNIST-sized images are 784 MB on disk. The
pixels are noise: use it to measure bytes and speed, never accuracy.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from latecast.data import from_arrays
from latecast.storage.store import write_store


def synthetic_split(
    folder: Path, n: int, shape: tuple[int, int, int], classes: int, split: str, seed: int
) -> Path:
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        images = np.lib.format.open_memmap(
            Path(tmp) / "x.npy", mode="w+", dtype=np.uint8, shape=(n, *shape)
        )
        chunk = max(1, (64 << 20) // int(np.prod(shape)))
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            images[start:stop] = rng.integers(0, 256, (stop - start, *shape), dtype=np.uint8)
        labels = rng.integers(0, classes, n)
        # mean/std of uniform noise in [0, 1] units: known, so nothing reads the images twice
        ds = from_arrays(
            images,
            labels,
            name=folder.name,
            split=split,
            classes=[str(i) for i in range(classes)],
            mean=(0.5,) * shape[2],
            std=(0.2887,) * shape[2],
        )
        write_store(ds, folder / split, source=f"synthetic noise, seed {seed}")
    return folder / split


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--shape", default="32x32x3", help="HxWxC")
    p.add_argument("--train", type=int, default=50000)
    p.add_argument("--test", type=int, default=10000)
    p.add_argument("--classes", type=int, default=10)
    args = p.parse_args()
    shape = tuple(int(v) for v in args.shape.lower().split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", args.train, 0), ("test", args.test, 1)):
        if n:
            print(synthetic_split(args.out, n, shape, args.classes, split, seed))


if __name__ == "__main__":
    main()
