"""Video clips: bytes crossed host->device and host CPU seconds per epoch, the usual float32
pipeline against ``latecast.wrap``, on the same synthetic uint8 clips.

    python benchmarks/video.py --clips 128 --frames 16 --size 128x171 --crop 112 --workers 2

The clips are ``(T, C, H, W)`` uint8 in memory, as Kinetics-400 gives them to torchvision's
video classification reference (``output_format="TCHW"``) at its resize size (128x171), so
no decoding and no Resize is timed on either side. Pipelines, each a ``DataLoader`` with
``--workers`` worker processes, batch ``--batch-size``:

- ``float32, crop on the host``: the reference's train preset in the workers,
  ConvertImageDtype, RandomHorizontalFlip, Normalize, RandomCrop(``--crop``), then ``(C, T,
  H, W)``; the batch moved as it is (float32 at the crop size; int64 labels).
- ``float32, same size``: the same without the crop (what crosses at the clips' own size).
- ``latecast.wrap``: the workers hand uint8 clips over; ``latecast.clip(size=crop)`` with
  ``Augment(flip=0.5)`` crops, flips and normalizes on the device (one draw per clip).

The device is the CPU (``--device``): there latecast's device work runs on the host too and
is counted, so its CPU time is an upper bound of what a GPU leaves on the host. CPU time is
the process's user + system seconds with its DataLoader workers' (``peers.cpu_seconds``),
per epoch, the median of ``--repeats`` epochs after one warm-up epoch. Prints a table, then
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torchvision.transforms as T
from peers import cpu_seconds
from torch.utils.data import DataLoader, Dataset

import latecast

MEAN, STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)  # the reference's


class Clips(Dataset):
    """``n`` seeded uint8 ``(T, C, H, W)`` clips and labels; ``transform`` runs per clip."""

    def __init__(self, n: int, frames: int, size: tuple[int, int], transform=None) -> None:
        g = torch.Generator().manual_seed(0)
        self.clips = torch.randint(0, 256, (n, frames, 3, *size), dtype=torch.uint8, generator=g)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int):
        x = self.clips[i]
        return (x if self.transform is None else self.transform(x)), i % 400


def reference(crop: int | None) -> T.Compose:
    """The reference's train ops on a ``(T, C, H, W)`` clip, ``crop`` None: without the crop."""
    ops = [T.ConvertImageDtype(torch.float32), T.RandomHorizontalFlip(0.5), T.Normalize(MEAN, STD)]
    ops += [T.RandomCrop(crop)] if crop else []
    return T.Compose([*ops, lambda x: x.permute(1, 0, 2, 3)])  # (C, T, H, W)


def float32_epoch(loader: DataLoader, device: torch.device) -> dict:
    clips = labels = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)  # what the reference's loop moves
        clips, labels = clips + x.nbytes, labels + y.nbytes
    return {"bytes_crossed": clips, "label_bytes": labels}


def wrap_epoch(wrapped) -> dict:
    before = wrapped.stats  # counted over every epoch: this one's is the difference
    for _ in wrapped:
        pass
    s = wrapped.stats
    return {"bytes_crossed": s.image_bytes - before.image_bytes,
            "label_bytes": s.label_bytes - before.label_bytes}  # fmt: skip


def timed(epoch, repeats: int) -> dict:
    """One warm-up epoch, then the median CPU and wall seconds of ``repeats`` epochs."""
    epoch()
    cpu, wall = [], []
    for _ in range(repeats):
        c, w = cpu_seconds(), time.perf_counter()
        got = epoch()
        cpu.append(cpu_seconds() - c)
        wall.append(time.perf_counter() - w)
    return {**got, "cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clips", type=int, default=128)
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--size", default="128x171", help="the clips' HxW")
    p.add_argument("--crop", type=int, default=112)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    size, device = tuple(map(int, args.size.split("x"))), torch.device(args.device)

    def loader(transform) -> DataLoader:
        ds = Clips(args.clips, args.frames, size, transform)
        return DataLoader(ds, args.batch_size, shuffle=True, num_workers=args.workers)

    spec = latecast.clip(args.frames, "NTCHW", size=args.crop)
    wrapped = latecast.wrap(loader(None), device=device, mean=MEAN, std=STD, fields={0: spec},
                            augment=latecast.Augment(flip=0.5))  # fmt: skip
    runs = {
        "float32, crop on the host": lambda: float32_epoch(loader(reference(args.crop)), device),
        "float32, same size": lambda: float32_epoch(loader(reference(None)), device),
        "latecast.wrap": lambda: wrap_epoch(wrapped),
    }
    rows = [{"pipeline": name, **timed(epoch, args.repeats)} for name, epoch in runs.items()]
    print(f"| pipeline | clip bytes/epoch | label bytes | CPU-s/epoch | wall-s | {vars(args)}")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['pipeline']} | {r['bytes_crossed']:,} | {r['label_bytes']:,} | "
              f"{r['cpu_s']:.2f} | {r['wall_s']:.2f} |")  # fmt: skip
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
    print(json.dumps({"config": vars(args), "git": rev, "torch": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
