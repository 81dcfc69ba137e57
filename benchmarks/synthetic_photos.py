"""Write an ImageNet-shaped JPEG folder (for benchmarks only): class folders of photos of
about 500x375 with real JPEG content (smooth colour fields, shapes, grain), the same
files for the same arguments.

    python benchmarks/synthetic_photos.py OUT --images 4000 --classes 10

Writes OUT/train/<class>/NNNNN.jpg (and OUT/test/... with --test N). Sizes vary as in
ImageNet: mostly landscape, the long side 400..500, a quarter portrait. Files come out at
about 75 KB on average at the default quality 90 (ImageNet's average is about 110 KB).
The pixels carry no class signal: use it to measure decoding and cropping, never accuracy.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def photo(seed: int) -> Image.Image:
    """One deterministic photo-like RGB image."""
    rng = np.random.default_rng(seed)
    long, short = int(rng.integers(400, 501)), int(rng.integers(280, 376))
    h, w = (long, short) if rng.random() < 0.25 else (short, long)
    ys, xs = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.zeros((h, w, 3))
    for _ in range(4):  # low-frequency colour waves
        fy, fx, phase = rng.uniform(0.5, 6, 2).tolist() + [rng.uniform(0, 6.3)]
        img += rng.uniform(20, 50, 3) * np.sin(2 * np.pi * (fy * ys + fx * xs) + phase)[..., None]
    img += rng.uniform(60, 190, 3)
    im = Image.fromarray(img.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(3, 9))):  # shapes: hard edges, as objects give
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        box = [x0, y0, x0 + int(rng.integers(20, w // 2)), y0 + int(rng.integers(20, h // 2))]
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    grain = rng.normal(0, 18, (h, w, 3))  # sensor-like grain: files of ImageNet's size
    return Image.fromarray((np.asarray(im) + grain).clip(0, 255).astype(np.uint8))


def _save(job: tuple[Path, int, int]) -> int:
    path, seed, quality = job
    photo(seed).save(path, "JPEG", quality=quality)
    return path.stat().st_size


def write(
    out: Path, split: str, n: int, classes: int, quality: int, seed: int, workers: int
) -> int:
    """``n`` photos under ``out/split/<class>/``; returns the bytes written."""
    jobs = []
    for i in range(n):
        folder = out / split / f"class{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append(
            (folder / f"{i:05d}.jpg", seed * 1_000_003 + i + (split != "train") * 10**9, quality)
        )
    with multiprocessing.Pool(workers) as pool:  # each file depends on its seed only
        return sum(pool.map(_save, jobs, chunksize=16))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--images", type=int, default=4000, help="training images")
    p.add_argument("--test", type=int, default=0, help="test images (default: none)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="processes")
    a = p.parse_args()
    nbytes = write(a.out, "train", a.images, a.classes, a.quality, a.seed, a.workers)
    if a.test:
        write(a.out, "test", a.test, a.classes, a.quality, a.seed, a.workers)
    print(f"{a.out}: {a.images} training photos, {nbytes / a.images / 1000:.0f} KB each on average")


if __name__ == "__main__":
    main()
