"""``latecast bench``: latecast against the plain torchvision ``DataLoader`` loop, in one run.

(a) Loader images/s, normalized batches on the device: each mover, torchvision's
    ``DataLoader`` at 0, 2 and all-core workers, an upper bound and a numpy gather.
(b) End to end: ``train``'s recipe through the usual loop and through latecast.
(c) Host->device bytes per epoch per mover.
(d) ``wrap`` over an ``ImageFolder`` DataLoader against the usual float32 one, and
(f) photos from WebDataset shards (``photo_rows.py``): images/s, host CPU s, bytes.
(e) ``--kernels``: the normalize kernel alone, two passes, fused, compiled.
Each timing: a warm-up pass, then ``repeats`` passes between device syncs; median and range."""

from __future__ import annotations

import functools
import itertools
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from .. import transforms
from ..data import Batch, Dataset
from ..distributed import resolve_device
from ..errors import ConfigError
from ..integrations.dataloader import wrap
from ..loader import Loader
from ..order import epoch_order
from ..storage.datasets import load_dataset
from ..storage.options import option
from ..trainer.baseline import transfers
from ..trainer.loop import TrainConfig, evaluate, recipe, resolve_config, stopwatch, train_step
from ..transfer import float32_bytes
from . import measure
from .photo_rows import photo_rows


@dataclass(frozen=True)
class BenchConfig(measure.MeasureConfig):
    repeats: int = option(3, "timed passes per measurement, after a warm-up pass", low=1)
    limit_batches: int | None = option(None, "batches per pass (default: whole epochs)", low=1)
    e2e_epochs: int = option(3, "epochs of each end-to-end run; 0 skips them", low=0)
    e2e_batch_size: int | None = option(None, "end-to-end batch (default: the preset's)", low=1)
    e2e_workers: int | None = option(None, "usual loop's workers (default: the fastest)", low=0)
    preset: str | None = option(None, "end-to-end recipe (default: as latecast train)")
    lr: float | None = option(None, "end-to-end peak lr (default: the preset's)", above=0)
    augment: str = option("", 'augmentation in every run, e.g. "crop,flip,cutout" (default: off)')
    kernels: bool = option(False, "also time the normalize kernel: two passes, fused, compiled")
    folder_images: int = option(10_000, "PNGs for the ImageFolder rows; 0 skips them", low=0)
    folder_workers: int = option(2, "DataLoader workers of both ImageFolder rows", low=0)
    webdataset_photos: int = option(
        512, "generated 500x375 JPEGs in WebDataset shards for the photo rows; 0 skips", low=0
    )
    output_dir: str = option("runs/bench", "bench.json, bench.md and bench.png go here")


def _upper_bound(
    ds: Dataset, cfg: BenchConfig, device: torch.device, aug: transforms.Augment | None
) -> Iterator[Batch]:
    """A uint8 batch already on the device: the only work left is ``aug`` + normalize."""
    x = torch.randint(0, 256, (cfg.batch_size, *ds.image_shape), dtype=torch.uint8, device=device)
    y = torch.zeros(cfg.batch_size, dtype=torch.int64, device=device)
    g = torch.Generator(device=device).manual_seed(cfg.seed)
    while True:
        yield transforms.normalize(x if aug is None else aug(x, g), ds.mean, ds.std), y


def _gather(ds: Dataset, cfg: BenchConfig, epoch: int) -> Iterator[Batch]:
    """Bandwidth reference: the same shuffled uint8 bytes gathered by numpy into one buffer."""
    buf = np.empty((cfg.batch_size, *ds.image_shape), dtype=np.uint8)
    lab = np.empty(cfg.batch_size, dtype=ds.labels.dtype)
    for idx in torch.split(epoch_order(len(ds), seed=cfg.seed, epoch=epoch), cfg.batch_size):
        n, idx_np = len(idx), idx.numpy()
        np.take(ds.images, idx_np, axis=0, out=buf[:n])
        np.take(ds.labels, idx_np, axis=0, out=lab[:n])
        yield buf[:n], lab[:n]


def loader_throughput(
    ds: Dataset, cfg: BenchConfig, device: torch.device
) -> dict[str, list[float]]:
    """(a) images/s of every loader, ``repeats`` timed passes each."""
    n = cfg.limit_batches or -(-len(ds) // cfg.batch_size)
    rates = functools.partial(measure.rates, n_batches=n, repeats=cfg.repeats, device=device)
    aug = transforms.Augment.parse(cfg.augment)
    out: dict[str, list[float]] = {}
    for name, mover in transfers(ds).items():
        loader = Loader(
            ds, cfg.batch_size, device=device, transfer=mover, seed=cfg.seed, augment=aug
        )
        out[name] = rates(measure.epochs(loader))
    cores = os.cpu_count() or 1
    for label, workers in (("torchvision-w0", 0), ("torchvision-w2", 2), ("torchvision-wN", cores)):
        # Persistent workers: start-up is not timed, which flatters torchvision.
        dl = measure.torchvision_loader(
            ds, cfg.batch_size, workers, device, cfg.seed, persistent=True, augment=aug
        )
        out[label] = rates(lambda dl=dl: measure.to_device(iter(dl), device))
        del dl  # stop its workers before the next setting starts its own
    out["upper-bound"] = rates(lambda: _upper_bound(ds, cfg, device, aug))
    count = itertools.count()
    out["gather"] = rates(lambda: _gather(ds, cfg, next(count)))
    return out


def write_image_folder(ds: Dataset, n: int, root: Path) -> Path:
    """The first ``n`` images of ``ds`` as lossless PNGs, ``root/<label>/<i>.png``."""
    from PIL import Image

    for i in range(min(n, len(ds))):
        folder = root / str(int(ds.labels[i]))
        folder.mkdir(parents=True, exist_ok=True)
        image = np.asarray(ds.images[i])  # (H, W, C)
        Image.fromarray(image[..., 0] if image.shape[2] == 1 else image).save(folder / f"{i}.png")
    return root


def image_folder_rows(ds: Dataset, cfg: BenchConfig, device: torch.device) -> dict:
    """(d) ``wrap`` over an ``ImageFolder`` DataLoader yielding uint8 (``PILToTensor``) against the
    usual ``ToTensor() + Normalize`` one, the same PNGs, workers, batch size and order."""
    import tempfile

    from torchvision import datasets
    from torchvision import transforms as T

    n = min(cfg.folder_images, len(ds))
    gray = [T.Grayscale()] if ds.image_shape[2] == 1 else []  # ImageFolder opens RGB
    batches = cfg.limit_batches or -(-n // cfg.batch_size)
    with tempfile.TemporaryDirectory(prefix="latecast-bench-") as tmp:
        root = write_image_folder(ds, n, Path(tmp))

        def loader(tf: list, pin: bool) -> torch.utils.data.DataLoader:
            images = datasets.ImageFolder(root, T.Compose([*gray, *tf]))
            return measure.dataloader(
                images, cfg.batch_size, cfg.folder_workers, cfg.seed, True, pin
            )

        usual = loader([T.ToTensor(), T.Normalize(ds.mean, ds.std)], device.type == "cuda")
        uint8 = loader([T.PILToTensor()], False)  # wrap pins its own buffer
        # layout: PILToTensor's (C, H, W), whatever the image size
        wrapped = wrap(uint8, mean=ds.mean, std=ds.std, device=device, layout="NCHW")
        runs = {
            "folder-float32": measure.passes(
                lambda dl=usual: measure.to_device(iter(dl), device), batches, cfg.repeats, device
            ),
            "folder-wrap": measure.passes(lambda w=wrapped: iter(w), batches, cfg.repeats, device),
        }
        moved = wrapped.stats  # of every batch it read: the same share of each is its bytes
        del usual, wrapped  # stop their workers before the folder goes
    read = moved.image_bytes // math.prod(ds.image_shape)  # images wrap read, every pass
    h2d = {"folder-float32": float32_bytes(ds, n), "folder-wrap": n * moved.h2d_bytes // read}
    return {"images": n, "workers": cfg.folder_workers, **measure.host_rows(runs, n, h2d)}


def fit(
    batches: Callable[[], Iterable[Batch]],
    steps_per_epoch: int,
    ds: Dataset,
    test: Dataset,
    config: TrainConfig,
    device: torch.device,
    limit: int | None,
) -> dict:
    """A fresh model trained on ``batches()`` per epoch with ``train``'s recipe, timed."""
    config, model, opt, sched = recipe(config, ds, device, steps_per_epoch)
    test_loader = Loader(test, 1000, device=device, shuffle=False, pad=False)
    seconds, accuracy = [], []
    for _ in range(config.epochs):
        lap = stopwatch(device)
        for x, y in itertools.islice(batches(), steps_per_epoch):
            train_step(model, opt, sched, x, y, config)
        seconds.append(lap())
        correct, total = evaluate(model, itertools.islice(test_loader, limit), config.amp)
        accuracy.append(correct / total)
    hit = next((i for i, a in enumerate(accuracy) if a >= 0.99), None)
    to_99 = None if hit is None else sum(seconds[: hit + 1])
    return {"epoch_seconds": seconds, "test_accuracy": accuracy, "seconds_to_99": to_99}


def end_to_end(
    ds: Dataset,
    test: Dataset,
    cfg: BenchConfig,
    config: TrainConfig,
    device: torch.device,
    workers: int,
) -> dict[str, dict]:
    """(b) The usual loop (torchvision DataLoader at ``workers``) and latecast (``auto``)."""
    aug = transforms.Augment.parse(config.augment)
    # Persistent workers: their start-up is not paid every epoch (flatters the usual loop).
    dl = measure.torchvision_loader(
        ds, config.batch_size, workers, device, cfg.seed, persistent=True, augment=aug
    )
    next(iter(dl))  # start the workers before the clock (spawning 16 took 60 s on the H200)
    steps = min(len(dl), cfg.limit_batches or len(dl))
    usual = fit(
        lambda: measure.to_device(dl, device), steps, ds, test, config, device, cfg.limit_batches
    )
    dtype = torch.bfloat16 if config.amp else torch.float32
    out = dict(device=device, dtype=dtype, channels_last=config.channels_last)
    loader = Loader(ds, config.batch_size, seed=cfg.seed, augment=aug, **out)
    ours = fit(measure.epochs(loader), steps, ds, test, config, device, cfg.limit_batches)
    return {
        "usual-loop": {**usual, "workers": workers},
        "latecast": {**ours, "transfer": loader.transfer},
    }


def bytes_per_epoch(ds: Dataset, device: torch.device, batch_size: int) -> dict[str, dict]:
    """(c) Each mover's ``epoch_bytes`` (torchvision's: ``float32``'s) and what a Loader counts
    over its second epoch (the first holds start-up uploads), images and labels apart."""
    out = {"torchvision": {"per_epoch": float32_bytes(ds, len(ds)), "once": 0}}
    for name, mover in transfers(ds).items():
        loader = Loader(ds, batch_size, device=device, transfer=mover)
        for _ in loader:
            pass
        s0 = loader.stats
        for _ in loader:
            pass
        s = loader.stats
        out[name] = {**mover.epoch_bytes(ds), "measured": s.h2d_bytes - s0.h2d_bytes}
        parts = ("image_bytes", "label_bytes", "index_bytes")
        out[name].update({k: getattr(s, k) - getattr(s0, k) for k in parts})
    return out


def _two_pass(images, mean, std, *, dtype, channels_last, out) -> torch.Tensor:
    """Normalize in two passes: addcmul on a float copy, then the dtype and layout change."""
    scale, shift = transforms._scale_shift(mean, std, images.shape[3], images.device)
    x = torch.addcmul(shift, images.permute(0, 3, 1, 2).float(), scale)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return x.to(dtype=dtype, memory_format=fmt)


def prepare_kernels(ds: Dataset, cfg: BenchConfig, device: torch.device) -> dict[str, dict]:
    """(e) Microseconds per batch (median of ``repeats`` x 20 calls, after 3) of each way to
    normalize, for float32 NCHW and the train preset's output, with its largest difference
    from the fused result."""
    x = torch.randint(0, 256, (cfg.batch_size, *ds.image_shape), dtype=torch.uint8, device=device)
    h, w, c = ds.image_shape
    kernels = {"two-pass": _two_pass, "fused": transforms.normalize}
    kernels["compiled"] = torch.compile(transforms.normalize, dynamic=False)
    result = {}
    preset = torch.bfloat16 if device.type == "cuda" else torch.float32
    for dtype, cl in ((torch.float32, False), (preset, True)):
        fmt = torch.channels_last if cl else torch.contiguous_format
        buf = torch.empty(cfg.batch_size, c, h, w, dtype=dtype, device=device, memory_format=fmt)
        args, kw = (x, ds.mean, ds.std), dict(dtype=dtype, channels_last=cl, out=buf)
        want = transforms.normalize(*args, **kw).clone()
        ways = {}
        for name, fn in kernels.items():
            got = fn(*args, **kw)
            for _ in range(3):
                fn(*args, **kw)
            times = []
            for _ in range(cfg.repeats):
                lap = stopwatch(device)
                for _ in range(20):
                    fn(*args, **kw)
                times.append(lap() / 20 * 1e6)
            diff = (got.float() - want.float()).abs().max().item()
            ways[name] = {"us": float(np.median(times)), "max_diff": diff}
        result[f"{str(dtype).removeprefix('torch.')} {'channels_last' if cl else 'NCHW'}"] = ways
    return result


def bench(cfg: BenchConfig) -> dict:
    """Run (a) to (e); write bench.json, bench.md, bench.png to ``cfg.output_dir``."""
    device = resolve_device(cfg.device)
    ds = load_dataset(cfg.dataset, "train", root=cfg.data_root)
    if not isinstance(ds, Dataset):  # its torchvision rows read decoded pixels
        raise ConfigError(
            f"latecast bench compares stores of decoded pixels; for the JPEG store "
            f"{cfg.dataset} use benchmarks/jpeg_loaders.py"
        )
    if ds.images.dtype != np.uint8:  # its gather, upper-bound, folder and kernel rows: uint8
        raise ConfigError(
            f"latecast bench compares 8-bit loaders; {cfg.dataset} is a 16-bit store "
            f"(uint16 images): latecast profile times each mover on it"
        )
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    # latecast train's config with the bench's settings on top (the preset fills the rest)
    same = {k: getattr(cfg, k) for k in ("dataset", "preset", "lr", "augment", "seed")}
    run = dict(epochs=cfg.e2e_epochs, batch_size=cfg.e2e_batch_size, device=str(device))
    config = resolve_config(TrainConfig(**same, **run), ds, device)
    runs = loader_throughput(ds, cfg, device)
    medians = {k: float(np.median(v)) for k, v in runs.items()}
    tv = {k: v for k, v in medians.items() if k.startswith("torchvision")}
    best_tv = max(tv, key=tv.get)
    e2e: dict[str, dict] = {}
    if cfg.e2e_epochs:
        # The usual loop gets the worker count that delivered the most images/s in (a).
        fastest = {"torchvision-w0": 0, "torchvision-w2": 2}.get(best_tv, os.cpu_count() or 1)
        workers = fastest if cfg.e2e_workers is None else cfg.e2e_workers
        test = load_dataset(cfg.dataset, "test", root=cfg.data_root)
        e2e = end_to_end(ds, test, cfg, config, device, workers)
    folder = image_folder_rows(ds, cfg, device) if cfg.folder_images else {}
    n = min(cfg.webdataset_photos, (cfg.limit_batches or 10**9) * cfg.batch_size)
    photo_args = (cfg.batch_size, cfg.folder_workers, cfg.repeats, cfg.seed, device)
    photos = photo_rows(n, *photo_args) if n else {}
    nbytes = bytes_per_epoch(ds, device, cfg.batch_size)
    kernels = prepare_kernels(ds, cfg, device) if cfg.kernels else {}
    f32, u8 = nbytes["float32"], nbytes["uint8"]
    result = {
        "config": asdict(cfg),
        "recipe": asdict(config),
        **measure.run_info(device),
        "dataset": ds.name,
        "best_torchvision": best_tv,
        "loader_images_per_s": medians,
        "loader_images_per_s_range": {k: [min(v), max(v)] for k, v in runs.items()},
        "epoch_seconds": {k: float(np.median(v["epoch_seconds"])) for k, v in e2e.items()},
        "seconds_to_99": {k: v["seconds_to_99"] for k, v in e2e.items()},
        "end_to_end": e2e,
        "image_folder": folder,
        "webdataset_photos": photos,
        "h2d_bytes_per_epoch": {k: int(v["per_epoch"]) for k, v in nbytes.items()},
        "h2d_detail": nbytes,
        "prepare_kernel_us": kernels,
        "bytes_fewer_than_float32": {
            "image": f32["image_bytes"] / u8["image_bytes"],
            "label": f32["label_bytes"] / u8["label_bytes"],
        },
    }
    files = [out / "bench.json", out / "bench.md", out / "bench.png"]
    measure.write_report(result, "bench", report_markdown(result), panels(result), files)
    return result


def _host_table(section: dict, prefix: str, fewer: str) -> str:
    """The table of the loaders named ``prefix...`` of a host-CPU section (ImageFolder,
    WebDataset photos): bytes "fewer" against the section's ``float32`` loader."""
    usual = section[f"{prefix}float32"]["h2d_bytes_per_epoch"]
    head = "loader|images/s|min .. max|host CPU s/epoch|bytes/epoch|fewer".split("|")
    rows = [
        [
            k,
            f"{np.median(v['images_per_s']):,.0f}",
            measure.span(v["images_per_s"]),
            f"{np.median(v['cpu_seconds_per_epoch']):.2f}",
            f"{v['h2d_bytes_per_epoch']:,}",
            f"{usual / v['h2d_bytes_per_epoch']:{fewer}}x",
        ]
        for k, v in section.items()
        if k.startswith(prefix)
    ]
    return measure.markdown_table(head, rows)


def report_markdown(r: dict) -> list[str]:
    """The tables of ``bench``'s result, each under its title."""
    c, speed, best = r["config"], r["loader_images_per_s"], r["best_torchvision"]
    ranges = r["loader_images_per_s_range"]
    rows = [
        [k, f"{v:,.0f}", measure.span(ranges[k]), f"{v / speed[best]:.1f}x"]
        for k, v in speed.items()
    ]
    parts = [
        f"median of {c['repeats']} after a warm-up.",
        f"Loader throughput on {r['dataset']}, batch {c['batch_size']}, "
        f"shuffled, augment: {c['augment'] or 'off'}, normalized on the device",
        measure.markdown_table(["loader", "images/s", "min .. max", f"vs {best}"], rows),
    ]
    if r["end_to_end"]:
        rows = [
            [
                k,
                f"{np.median(v['epoch_seconds']):.2f}",
                measure.span(v["epoch_seconds"], ".2f"),
                " ".join(f"{a:.4f}" for a in v["test_accuracy"]),
                "not reached" if v["seconds_to_99"] is None else f"{v['seconds_to_99']:.1f}",
            ]
            for k, v in r["end_to_end"].items()
        ]
        recipe, head = r["recipe"], "loop|s/epoch|min .. max|test acc per epoch|s to 99%"
        parts += [
            f"End to end: {recipe['model']}, SGD + one-cycle, batch "
            f"{recipe['batch_size']} (preset {recipe['preset']})",
            measure.markdown_table(head.split("|"), rows),
        ]
    if r["image_folder"]:
        folder = r["image_folder"]
        parts += [
            f"Your own data: an ImageFolder of {folder['images']:,} PNGs, DataLoader with "
            f"{folder['workers']} workers, batch {c['batch_size']}; host CPU: main "
            "process and workers together, per epoch (median)",
            _host_table(folder, "folder-", ".2f"),
        ]
    if r.get("webdataset_photos"):
        photos = r["webdataset_photos"]
        h, w = photos["photo"]
        parts += [
            f"Photos streamed: {photos['images']:,} JPEGs of {w}x{h} in WebDataset shards "
            f"({photos['reader']}), {photos['workers']} workers, batch {c['batch_size']}, "
            f"RandomResizedCrop({photos['crop']}) + flip + normalize; wrap's decoder "
            f"{photos['decoder']}; host CPU: main process and workers, per epoch (median)",
            _host_table(photos, "photos-", ".1f"),
        ]
    if r["prepare_kernel_us"]:
        rows = [
            [out, way, f"{v['us']:,.1f}", f"{v['max_diff']:.1e}"]
            for out, ways in r["prepare_kernel_us"].items()
            for way, v in ways.items()
        ]
        parts += [
            f"Prepare kernel: one uint8 batch of {c['batch_size']} on the device -> "
            "normalized (microseconds per batch, median; difference from the fused result)",
            measure.markdown_table(["output", "kernel", "us/batch", "max diff"], rows),
        ]
    f32 = r["h2d_bytes_per_epoch"]["float32"]
    rows = [
        [
            k,
            f"{v['per_epoch']:,}",
            f"{v['once']:,}",
            f"{v['measured']:,}" if "measured" in v else "-",
            f"{f32 / v['per_epoch']:.2f}x" if v["per_epoch"] else "-",
        ]
        for k, v in r["h2d_detail"].items()
    ]
    head = "path|per epoch|once|counted over 1 epoch|fewer than float32".split("|")
    return [*parts, "Host->device bytes per epoch", measure.markdown_table(head, rows)]


def panels(r: dict) -> list[measure.Panel]:
    """Loader images/s (log), seconds per epoch, MB host->device per epoch."""
    mb = {k: v / 1e6 for k, v in r["h2d_bytes_per_epoch"].items()}
    return [
        ("loader images/s (median, log scale)", {"images/s": r["loader_images_per_s"]}, True),
        ("seconds per epoch, end to end (median)", {"s": r["epoch_seconds"]}, False),
        ("MB host->device per epoch", {"MB": mb}, False),
    ]
