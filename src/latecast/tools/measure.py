"""What ``bench``, ``profile`` and ``benchmarks/`` measure with: shared options, timed passes
between device syncs, host CPU seconds, the run's machine and revision, the torchvision
``DataLoader`` baseline, one report writer (JSON, markdown, a bar plot)."""

from __future__ import annotations

import itertools
import json
import os
import platform
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from ..data import Batch, Dataset
from ..loader import Loader
from ..storage.options import DATASET_HELP, option, validate
from ..trainer.loop import stopwatch
from ..transforms import Augment
from .text import markdown_table  # noqa: F401 (the reports' tables, benchmarks/ import it here)

# x label, {part: {row: value}} (a row's parts stacked, in this order), log scale
Panel = tuple[str, dict[str, dict[str, float]], bool]


@dataclass(frozen=True)
class MeasureConfig:
    """The options ``bench`` and ``profile`` share (each adds its own, and its output folder)."""

    dataset: str = option("mnist", DATASET_HELP, positional=True)
    device: str = option("auto", "auto|cpu|cuda|cuda:N")
    batch_size: int = option(256, "images per batch (profile: per step)", short="-b", low=1)
    seed: int = option(0, "weights and order", low=0)
    data_root: str | None = option(None, "folder with the dataset's files")

    def __post_init__(self) -> None:
        validate(self)


def passes(
    make_iter: Callable[[], Iterator], n_batches: int, repeats: int, device: torch.device
) -> list[tuple[int, float, float]]:
    """(images, seconds, host CPU seconds) of each timed pass over ``n_batches`` batches, after
    a warm-up pass of at most 20; CPU counted from before ``make_iter`` (workers start there)."""
    out = []
    for r in range(repeats + 1):
        cpu0 = cpu_seconds()
        it = make_iter()  # outside the timer: e.g. DataLoader worker reset
        lap, images = stopwatch(device), 0
        for batch in itertools.islice(it, n_batches if r else min(n_batches, 20)):
            images += len(batch[0])
        if r:
            out.append((images, lap(), cpu_seconds() - cpu0))
    return out


def rates(
    make_iter: Callable[[], Iterator[Batch]], n_batches: int, repeats: int, device: torch.device
) -> list[float]:
    """images/s of each timed pass (``passes``)."""
    return [n / seconds for n, seconds, _ in passes(make_iter, n_batches, repeats, device)]


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all its threads) and its live children
    (DataLoader workers, read from /proc on Linux): what the data path costs the host."""
    total, tick = time.process_time(), os.sysconf("SC_CLK_TCK")
    for task in Path("/proc/self/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:  # a thread that ended since the listing
            continue
        for pid in children:
            try:  # fields 14 and 15: utime, stime in clock ticks (after the ")" of the name)
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(stat[11]) + int(stat[12])) / tick
            except (OSError, IndexError, ValueError):  # a child that exited meanwhile
                continue
    return total


def host_rows(runs: dict[str, list], n: int, h2d: dict[str, int]) -> dict[str, dict]:
    """Per row of ``runs`` (``passes``' results over ``n`` images an epoch): images/s, host
    CPU seconds per epoch (a pass may be cut short) and ``h2d``'s bytes per epoch."""
    return {
        name: {
            "images_per_s": [k / t for k, t, _ in timed],
            "cpu_seconds_per_epoch": [c * n / k for k, _, c in timed],
            "h2d_bytes_per_epoch": h2d[name],
        }
        for name, timed in runs.items()
    }


def epochs(loader: Loader) -> Callable[[], Iterator[Batch]]:
    """Each call starts the loader's next epoch from its first batch (not mid-epoch)."""
    count = itertools.count(loader.epoch + 1)

    def start() -> Iterator[Batch]:
        loader.set_epoch(next(count))
        return iter(loader)

    return start


def run_info(device: torch.device) -> dict:
    """Machine, versions and git revision, saved next to every number."""
    rev = ["git", "rev-parse", "--short", "HEAD"]
    try:  # outside a checkout, or without git: "unknown"
        git = subprocess.run(rev, capture_output=True, text=True, cwd=Path(__file__).parent).stdout
    except OSError:
        git = ""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    found = re.search(r"^model name[^:]*:(.*)$", cpuinfo, re.M)
    cpu = found[1].strip() if found else platform.machine()
    return {
        "device": str(device),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "git": git.strip() or "unknown",
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


class PILImages(torch.utils.data.Dataset):
    """What torchvision's ``MNIST``/``CIFAR10.__getitem__`` do: one PIL image per sample
    through ``transform``, label as a Python int. The usual code, fed the same arrays. uint16
    images (a 16-bit store; no PIL mode ``ToTensor`` reads right) go as float32 ``(C, H, W)``
    tensors scaled by 1/65535, as torchvision v2's ``ToDtype(float32, scale=True)``."""

    def __init__(self, ds: Dataset, transform: Callable) -> None:
        self.images, self.labels, self.transform = ds.images, ds.labels, transform
        self.gray = ds.image_shape[2] == 1
        self.deep = ds.images.dtype == np.uint16

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        from PIL import Image

        img = np.asarray(self.images[i])  # (H, W, C)
        if self.deep:
            x = torch.from_numpy(img.astype(np.float32) / 65535).permute(2, 0, 1)
            return self.transform(x), int(self.labels[i])
        image = Image.fromarray(img[..., 0] if self.gray else img)
        return self.transform(image), int(self.labels[i])


def torchvision_loader(
    ds: Dataset,
    batch_size: int,
    workers: int,
    device: torch.device,
    seed: int,
    persistent: bool = False,
    pin: bool | None = None,
    augment: Augment | None = None,
) -> torch.utils.data.DataLoader:
    """``DataLoader(ToTensor() + Normalize(mean, std))``, shuffled, pinned by default on CUDA;
    with ``augment``, torchvision's per-image equivalents first (cutout: ``RandomErasing``).
    uint16 images: ``PILImages``' float32 tensors, normalized by mean/std (stored units) /
    65535: the float32 pipeline a 16-bit store's Loader equals."""
    from torchvision import transforms as T  # the `bench` extra

    (h, w, _), aug, pil, tensor = ds.image_shape, augment or Augment(), [], []
    if aug.crop:
        fill = "reflect" if aug.fill == "reflect" else "constant"
        pil.append(T.RandomCrop((h, w), padding=aug.crop, padding_mode=fill))
    if aug.flip:
        pil.append(T.RandomHorizontalFlip(aug.flip))
    if aug.cutout:
        area = aug.cutout**2 / (h * w)
        tensor.append(T.RandomErasing(p=1.0, scale=(area, area), ratio=(1.0, 1.0)))
    if ds.images.dtype == np.uint16:  # tensors already, in 0..1
        mean, std = [m / 65535 for m in ds.mean], [s / 65535 for s in ds.std]
        tf = T.Compose([*pil, *tensor, T.Normalize(mean, std)])
    else:
        tf = T.Compose([*pil, T.ToTensor(), *tensor, T.Normalize(ds.mean, ds.std)])
    pin = device.type == "cuda" if pin is None else pin
    return dataloader(PILImages(ds, tf), batch_size, workers, seed, persistent, pin)


def dataloader(
    samples: torch.utils.data.Dataset,
    batch_size: int | None,
    workers: int,
    seed: int | None,
    persistent: bool,
    pin: bool = False,
    **kwargs,
) -> torch.utils.data.DataLoader:
    """A ``DataLoader`` as the usual loop builds one, shuffled by ``seed`` (None: in order)."""
    # Forked workers inherit this process's CUDA state; one that frees a CUDA tensor (a
    # pinned buffer of an earlier row, collected as garbage) aborts with "CUDA error:
    # initialization error" (seen on the H200). Spawned workers start clean.
    context = "spawn" if workers > 0 and torch.cuda.is_initialized() else None
    if seed is not None:
        kwargs.update(shuffle=True, generator=torch.Generator().manual_seed(seed))
    kwargs.update(num_workers=workers, pin_memory=pin, multiprocessing_context=context)
    kwargs["persistent_workers"] = persistent and workers > 0
    return torch.utils.data.DataLoader(samples, batch_size, **kwargs)


def to_device(batches: Iterable[Batch], device: torch.device) -> Iterator[Batch]:
    """The usual loop's ``images.to(device), labels.to(device)``."""
    for x, y in batches:
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def span(values: Iterable[float], fmt: str = ",.0f") -> str:
    """``"min .. max"`` of ``values``."""
    values = list(values)
    return f"{min(values):{fmt}} .. {max(values):{fmt}}"


def write_report(
    r: dict, command: str, sections: list[str], panels: list[Panel], files: list[Path]
) -> None:
    """``r`` of ``latecast command`` to ``files``: JSON, markdown (machine and revision, then
    ``sections``; also printed) and ``panels`` as a PNG."""
    md = (
        f"`latecast {command}` on {r['device']} ({r['gpu'] or r['cpu']}), torch {r['torch']}, "
        f"git {r['git']}, {r['date']}: " + "\n\n".join(sections)
    )
    json_path, md_path, png_path = files
    json_path.write_text(json.dumps(r, indent=2))
    md_path.write_text(md + "\n")
    plot(panels, f"latecast {command}: {r['dataset']} on {r['gpu'] or r['device']}", png_path)
    print(md)


def plot(panels: list[Panel], title: str, path: Path) -> None:
    """One horizontal bar chart per panel, rows top to bottom as in the tables."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    for ax, (label, parts, log) in zip(axes[0], panels):
        rows = list(dict.fromkeys(row for values in parts.values() for row in values))
        left = np.zeros(len(rows))
        for part, values in parts.items():
            width = np.array([values.get(row, 0.0) for row in rows])
            ax.barh(rows, width, left=left, label=part)
            left += width
        ax.set_xlabel(label)
        ax.set_xscale("log" if log else "linear")
        ax.invert_yaxis()  # first row on top, as in the tables
        if len(parts) > 1:
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
