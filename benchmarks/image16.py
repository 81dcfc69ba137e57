"""16-bit images, the usual float32 pipeline against ``latecast.image16``: bytes that cross
to the device and host CPU seconds per epoch (this process and its DataLoader workers,
``getrusage``), on synthetic Sentinel-2 tiles of EuroSAT-MS's shape, 13 uint16 bands of
64x64, each with a uint8 segmentation mask.

    python benchmarks/image16.py --tiles 2048 --batch 64 --workers 2 --epochs 3

- usual: TorchGeo's and torchvision's shape, the workers make float32 (``ToDtype``),
  normalize per band and flip image and mask (torchvision v2 on one sample), the batch is
  moved with ``.to(device)``: 4 bytes a pixel cross.
- latecast: the workers hand over the stored uint16 (and the mask), ``wrap`` moves them
  (2 bytes a pixel) and normalizes and flips on the device.

On a CPU device (``--device cpu``) the device's work runs on the host too and is counted:
an upper bound of latecast's host CPU; on CUDA it leaves the host. The third row, latecast
over the same batches already in memory (no DataLoader), is that device work plus the
packing: the part a GPU takes off the host, but for the packing's copy. The fourth, the
host half alone over the DataLoader (plan and pack, ``Wrapped.send``, nothing finished):
latecast's host CPU where the device is a GPU. The fifth, the uint16 DataLoader alone.
The float32 row's ``.to`` moves nothing on a CPU device (on a GPU its copy from pageable
memory costs host CPU too, not counted here). The third row, latecast
over the same batches already in memory (no DataLoader), is that device work plus the
packing: the part a GPU takes off the host, but for the packing's copy. The fourth, the
host half alone over the DataLoader (plan and pack, ``Wrapped.send``, nothing finished):
latecast's host CPU where the device is a GPU. The fifth, the uint16 DataLoader alone.
The float32 row's ``.to`` moves nothing on a CPU device (on a GPU its copy from pageable
memory costs host CPU too, not counted here). One thread in this
process (as ``latecast train`` runs), each epoch's workers started and joined (their CPU
counted when joined). A table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import time

import numpy as np
import torch
import torchvision.transforms.v2 as T
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors

import latecast
from latecast.integrations.plan import Options
from latecast.integrations.wrapped import Wrapped

BANDS, SIDE = 13, 64
MEAN = tuple(float(v) for v in np.linspace(1000, 2600, BANDS))  # stored units
STD = tuple(float(v) for v in np.linspace(400, 1200, BANDS))


class Tiles(Dataset):
    """``(image, mask)``: uint16 ``(13, 64, 64)`` and uint8 ``(64, 64)``, or with
    ``transform`` what it makes of them (the usual way's float32)."""

    def __init__(self, images: np.ndarray, masks: np.ndarray, transform=None) -> None:
        self.images, self.masks, self.transform = images, masks, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        image, mask = torch.from_numpy(self.images[i]), torch.from_numpy(self.masks[i])
        if self.transform is None:
            return image, mask
        return self.transform(tv_tensors.Image(image), tv_tensors.Mask(mask))


def cpu_seconds() -> float:
    """CPU seconds, user + system, of this process and its joined children."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def epoch(batches, device: torch.device, usual: bool) -> tuple[float, float, int]:
    """One pass: (host CPU-s, wall s, bytes moved by ``.to``: the usual way's)."""
    t0, c0, moved = time.perf_counter(), cpu_seconds(), 0
    for image, mask in batches:
        if usual:
            moved += image.nbytes + mask.nbytes
            image, mask = image.to(device, non_blocking=True), mask.to(device, non_blocking=True)
        if device.type == "cuda":
            image.sum().item()  # the step's sync
    return cpu_seconds() - c0, time.perf_counter() - t0, moved


def host_half(batches, options: dict, device: torch.device):
    """``batches`` planned and packed as ``wrap`` packs them (``Wrapped.send``), not finished:
    the host's part of ``wrap`` where the device is a GPU."""
    wrapped = Wrapped(None, Options.of(options), device)
    wrapped._start()  # its ring, on the device
    for batch in batches:
        wrapped.send(batch)
        yield batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiles", type=int, default=2048)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 10000, (args.tiles, BANDS, SIDE, SIDE)).astype(np.uint16)
    masks = rng.integers(0, 10, (args.tiles, SIDE, SIDE)).astype(np.uint8)
    torchvision = T.Compose(
        [T.ToDtype(torch.float32, scale=False), T.Normalize(MEAN, STD), T.RandomHorizontalFlip()]
    )
    loader = dict(batch_size=args.batch, shuffle=True, num_workers=args.workers)
    usual = DataLoader(Tiles(images, masks, torchvision), **loader)
    kinds = {0: latecast.image16(mean=MEAN, std=STD, channels=BANDS), 1: "mask"}
    flip = latecast.Augment(flip=0.5)
    ours = latecast.wrap(DataLoader(Tiles(images, masks), **loader), device=device, augment=flip,
                         fields=kinds)  # fmt: skip
    cut = [slice(a, a + args.batch) for a in range(0, args.tiles, args.batch)]
    held = [(torch.from_numpy(images[k]), torch.from_numpy(masks[k])) for k in cut]
    resident = latecast.wrap(held, device=device, augment=flip, fields=kinds)
    plain = DataLoader(Tiles(images, masks), **loader)  # latecast's host floor: no move
    options = dict(augment=flip, fields=kinds)
    rows = {
        "float32": [],
        "latecast": [],
        "latecast, batches in memory": [],
        "latecast, host half": [],
        "uint16 DataLoader": [],
    }
    for e in range(args.epochs):
        rows["float32"].append(epoch(usual, device, usual=True))
        ours.set_epoch(e)
        rows["latecast"].append(epoch(ours, device, usual=False))
        rows["latecast, batches in memory"].append(epoch(resident, device, usual=False))
        rows["latecast, host half"].append(epoch(host_half(plain, options, device), device, False))
        rows["uint16 DataLoader"].append(epoch(plain, device, usual=False))
    s = ours.stats
    moved = dict.fromkeys(rows, (s.image_bytes + s.label_bytes) // args.epochs)
    moved["float32"], moved["uint16 DataLoader"] = rows["float32"][0][2], 0
    print(f"{args.tiles} tiles of {BANDS}x{SIDE}x{SIDE} uint16 + uint8 mask, batch {args.batch}, "
          f"{args.workers} workers, device {device}, {args.epochs} epochs (median)")  # fmt: skip
    print("| pipeline | host CPU-s/epoch | wall s/epoch | bytes to device/epoch |")
    print("|---|---|---|---|")
    result = {}
    for name, runs in rows.items():
        cpu, wall = float(np.median([r[0] for r in runs])), float(np.median([r[1] for r in runs]))
        result[name] = dict(cpu_s=round(cpu, 3), wall_s=round(wall, 3), bytes=moved[name])
        print(f"| {name} | {cpu:.2f} | {wall:.2f} | {moved[name]:,} |")
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()  # fmt: skip
    ratio = moved["float32"] / moved["latecast"]
    image_bytes = s.image_bytes // args.epochs
    print(f"bytes: {ratio:.2f}x fewer; image bytes {image_bytes:,} against float32's "
          f"{images.size * 4:,} ({images.size * 4 / image_bytes:.2f}x)")  # fmt: skip
    print(json.dumps(dict(vars(args), revision=revision, machine=platform.processor() or
                          platform.machine(), torch=torch.__version__, **result)))  # fmt: skip


if __name__ == "__main__":
    main()
