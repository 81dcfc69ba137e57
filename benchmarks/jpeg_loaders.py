"""Loader images/s on a folder of JPEG files: latecast's ``jpeg`` mover (files decoded and
cropped by the prepare stage), latecast's ``uint8`` mover on a raw store of the same
images, and torchvision's ``ImageFolder`` + ``DataLoader`` at 0, 2 and N workers; then the
bytes one epoch moves each way and the size on disk.

    # CIFAR-10 JPEG copy (32x32): decode only
    python benchmarks/jpeg_loaders.py /tmp/cifar10-jpg/train --size 32x32
    # ImageNet-shaped photos: decode + RandomResizedCrop(224)
    python benchmarks/synthetic_photos.py /tmp/photos --images 4000
    python benchmarks/jpeg_loaders.py /tmp/photos/train --size 224x224 --augment resized_crop=0.08

Same work on every row: decode, crop to the training size (``--augment resized_crop=S``:
RandomResizedCrop with scale (S, 1), torchvision ``RandomResizedCrop`` for its rows; else
scale to cover and crop the centre, ``Resize`` + ``CenterCrop``), normalize, on the device.
latecast on the CPU decodes on ``torch.get_num_threads()`` threads: its row ``-tK`` runs K
threads beside torchvision's ``-wK`` (K worker processes; ``-w0`` is the main process, so
beside ``-t1``). The raw store is made with ``latecast convert --size`` (crops once at
conversion; its resized crop then works on the stored 224x224, not the full photo).
Timing as ``latecast bench``: a warm-up pass, then ``--repeats`` passes of
``--limit-batches`` batches, median images/s. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from jpeg_folder import encoded_folder

from latecast.distributed import resolve_device
from latecast.kinds.jpeg import JpegStore
from latecast.loader import Loader
from latecast.storage.convert import convert_folder
from latecast.storage.store import open_store
from latecast.tools.measure import epochs, markdown_table, rates, run_info, to_device
from latecast.transfer import float32_bytes, uint8_bytes
from latecast.transforms import Augment


def torchvision_rows(folder: Path, ds, args, device, workers: list[int]) -> dict:
    """``ImageFolder`` (Pillow decoding) + the same crop + ToTensor + Normalize."""
    from torchvision import datasets
    from torchvision import transforms as T

    aug, size = Augment.parse(args.augment), ds.size
    crop = (
        [T.RandomResizedCrop(size, scale=(aug.resized_crop, 1.0))]
        if aug is not None and aug.resized_crop
        else [T.Resize(min(size)), T.CenterCrop(size)]
    )
    flip = [T.RandomHorizontalFlip(aug.flip)] if aug is not None and aug.flip else []
    tf = T.Compose([*crop, *flip, T.ToTensor(), T.Normalize(ds.mean, ds.std)])
    out = {}
    for w in workers:
        dl = torch.utils.data.DataLoader(
            datasets.ImageFolder(str(folder), tf),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=w,
            pin_memory=device.type == "cuda",
            persistent_workers=w > 0,  # start-up not timed: flatters torchvision
            generator=torch.Generator().manual_seed(0),
        )
        out[f"torchvision-w{w}"] = rates(
            lambda dl=dl: to_device(iter(dl), device), args.limit_batches, args.repeats, device
        )
        del dl  # stop its workers before the next row starts its own
    return out


def latecast_rows(ds, raw, args, device, workers: list[int]) -> dict:
    aug, out = Augment.parse(args.augment), {}
    threads_before = torch.get_num_threads()
    for t in sorted({max(w, 1) for w in workers}) if device.type == "cpu" else [0]:
        if t:
            torch.set_num_threads(t)
        loader = Loader(ds, args.batch_size, device=device, transfer="jpeg", augment=aug)
        out[f"latecast-jpeg{f'-t{t}' if t else ''}"] = rates(
            epochs(loader), args.limit_batches, args.repeats, device
        )
    torch.set_num_threads(threads_before)
    loader = Loader(raw, args.batch_size, device=device, transfer="uint8", augment=aug)
    out["latecast-uint8 (raw store)"] = rates(
        epochs(loader), args.limit_batches, args.repeats, device
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="class subfolders of JPEG files")
    p.add_argument("--size", default="32x32", help="training size HxW")
    p.add_argument("--augment", default="", help='e.g. "resized_crop=0.08,flip"')
    p.add_argument("--device", default="cpu")
    p.add_argument("-b", "--batch-size", type=int, default=256)
    p.add_argument("--workers", default="0,2,N", help="comma list; N: os.cpu_count()")
    p.add_argument("--limit-batches", type=int, default=40, help="batches per timed pass")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--raw-store", type=Path, help="latecast convert output (default: made now)")
    args = p.parse_args()
    h, _, w = args.size.partition("x")
    size, device = (int(h), int(w or h)), resolve_device(args.device)
    cores = os.cpu_count() or 1
    workers = [cores if x.strip() == "N" else int(x) for x in args.workers.split(",")]
    ds = encoded_folder(args.folder, size)
    with tempfile.TemporaryDirectory() as tmp:
        store = (
            args.raw_store
            or convert_folder(
                args.folder, Path(tmp) / "raw", size=args.size, encoding="raw", test_fraction=0
            )[0]
        )
        raw = open_store(store)
        runs = {
            **latecast_rows(ds, raw, args, device, workers),
            **torchvision_rows(args.folder, ds, args, device, workers),
        }
        disk = {"jpeg": int(ds.offsets[-1]), "raw": int(raw.images.nbytes)}
    medians = {k: float(np.median(v)) for k, v in runs.items()}
    n = len(ds)
    nbytes = {
        "jpeg": JpegStore.epoch_bytes(ds)["per_epoch"],
        "uint8": uint8_bytes(ds, n),
        "float32 (torchvision)": float32_bytes(ds, n),
    }
    info = run_info(device)
    print(
        f"{args.folder}: {n} images -> {size[0]}x{size[1]}, augment {args.augment or 'off'}, "
        f"batch {args.batch_size}, {info['device']} ({info['gpu'] or info['cpu']}), "
        f"torch {info['torch']}, git {info['git']}, {info['date']}\n"
    )
    best = max(medians, key=medians.get)
    rows = [[k, f"{v:,.0f}", f"{v / medians[best]:.2f}"] for k, v in medians.items()]
    print(markdown_table(["loader", "images/s (median)", f"vs {best}"], rows) + "\n")
    rows = [[k, f"{v:,}", f"{nbytes['float32 (torchvision)'] / v:.1f}x"] for k, v in nbytes.items()]
    print(markdown_table(["path", "host->device bytes per epoch", "fewer than float32"], rows))
    print(f"\non disk: jpeg {disk['jpeg']:,} bytes, raw uint8 {disk['raw']:,} bytes\n")
    print(
        json.dumps(
            {
                **info,
                "config": vars(args) | {"folder": str(args.folder), "raw_store": str(store)},
                "images": n,
                "images_per_s": medians,
                "images_per_s_runs": runs,
                "bytes_per_epoch": nbytes,
                "disk_bytes": disk,
            }
        )
    )


if __name__ == "__main__":
    main()
