"""`latecast convert` against decoding the same files with torchvision's `ImageFolder`.

    python benchmarks/convert_speed.py --workers 1 16
    python benchmarks/convert_speed.py --per-class 50 --workers 1 2   # a quick check

Untars the CIFAR-10 JPEG copy (`../shared/datasets/cifar10-jpg/`, or `--tar`; with
`--per-class N` only the first N images of each class of each split) into a temporary
folder (or `--work`), then times, for each worker count W:

- `latecast convert SRC OUT --encoding jpeg|raw --workers W`, as a real process: its own
  seconds and images/s (from its `--json` line; they include the header scan, the decode
  and the write, not Python's start-up) and the wall time of the whole command;
- torchvision `ImageFolder(..., transform=PILToTensor())` over the same files through a
  `DataLoader` (batch 256, `num_workers` 0 for W = 1, else W): every image decoded to a
  uint8 tensor, which is what a conversion has to do at the least;

and the size on disk of each store beside the source files. Prints a table, then one JSON
line. Nothing here is a latecast test of correctness: tests/storage/test_convert.py is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

TAR = Path(__file__).resolve().parents[2] / "shared/datasets/cifar10-jpg/cifar10-jpg.tar.gz"


def extract(tar: Path, dest: Path, per_class: int | None) -> int:
    """The tar's files (the first ``per_class`` of each split/class) under ``dest``."""
    taken: Counter = Counter()
    with tarfile.open(tar) as t:
        members = []
        for m in t:
            key = tuple(m.name.split("/")[:2])  # (split, class)
            if m.isfile() and (per_class is None or taken[key] < per_class):
                taken[key] += 1
                members.append(m)
        t.extractall(dest, members=members, filter="data")
    return len(members)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def convert(src: Path, out: Path, encoding: str, workers: int) -> dict:
    command = [sys.executable, "-m", "latecast", "convert", str(src), str(out)]
    command += ["--encoding", encoding, "--workers", str(workers), "--no-progress", "--json"]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "what": f"latecast convert --encoding {encoding}",
        "workers": workers,
        "seconds": result["seconds"],
        "wall_seconds": wall,
        "images_per_second": result["images_per_second"],
        "store_bytes": folder_bytes(out),
    }


def image_folder(src: Path, workers: int) -> dict:
    import torch
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import PILToTensor

    splits = [ImageFolder(str(src / s), transform=PILToTensor()) for s in ("train", "test")]
    start, n = time.perf_counter(), 0
    for ds in splits:
        loader = torch.utils.data.DataLoader(
            ds, batch_size=256, num_workers=0 if workers == 1 else workers
        )
        for images, _ in loader:
            n += len(images)
    seconds = time.perf_counter() - start
    return {
        "what": "torchvision ImageFolder + DataLoader decode",
        "workers": workers,
        "seconds": seconds,
        "wall_seconds": seconds,
        "images_per_second": n / seconds,
        "store_bytes": None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tar", type=Path, default=TAR, help="the CIFAR-10 JPEG copy")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts")
    parser.add_argument("--per-class", type=int, default=None, help="images per class and split")
    parser.add_argument("--work", type=Path, default=None, help="folder for the files (temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        src = Path(tmp) / "cifar10-jpg"
        images = extract(args.tar, src, args.per_class)
        rows = []
        for w in args.workers:
            for encoding in ("jpeg", "raw"):
                rows.append(convert(src, Path(tmp) / f"{encoding}-{w}", encoding, w))
            rows.append(image_folder(src, w))
        source_bytes = folder_bytes(src)
    print(f"{images} images, {source_bytes:,} bytes of JPEG files")
    print(f"| what | workers | seconds | wall s | images/s | store bytes |\n|{'---|' * 6}")
    for r in rows:
        size = "" if r["store_bytes"] is None else f"{r['store_bytes']:,}"
        print(
            f"| {r['what']} | {r['workers']} | {r['seconds']:.2f} | {r['wall_seconds']:.2f} "
            f"| {r['images_per_second']:,.0f} | {size} |"
        )
    print(json.dumps({"images": images, "source_bytes": source_bytes, "rows": rows}))


if __name__ == "__main__":
    main()
