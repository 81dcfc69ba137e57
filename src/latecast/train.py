"""Training: one readable loop over a latecast ``Loader``, evaluation, metrics on disk.

``train(TrainConfig(...))`` is what ``latecast train`` runs. The defaults train the small
``cnn`` on the bundled MNIST to >= 99% test accuracy in 3 epochs (about 30 s an epoch on a
2-core CPU; seconds on a GPU). SGD with Nesterov momentum under a one-cycle schedule.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .datasets import Dataset, load_dataset
from .errors import ConfigError, TrainingError
from .loader import Loader, resolve_device
from .models import build_model
from .transforms import parse_augment
from .transfer import float32_bytes


@dataclass(frozen=True)
class TrainConfig:
    dataset: str = "mnist"         # a known dataset name, or a store folder (latecast convert)
    # Fields left at None take the preset for the dataset's kind of image (PRESETS below).
    model: str | None = None       # a name in models.MODELS
    epochs: int | None = None      # full passes over the training split
    batch_size: int | None = None  # samples per step, per process
    lr: float | None = None        # peak learning rate of the one-cycle schedule
    label_smoothing: float | None = None  # cross-entropy label smoothing, 0..1
    augment: str | None = None     # on-device augmentation spec, e.g. "crop,flip,cutout"
    amp: bool | None = None        # bf16 autocast (CUDA only)
    channels_last: bool | None = None  # NHWC memory format for images and model (CUDA only)
    momentum: float = 0.9          # Nesterov momentum
    weight_decay: float = 5e-4     # L2 on all parameters
    transfer: str = "auto"         # float32 | uint8 | prefetch | resident | auto
    device: str = "auto"           # auto | cpu | cuda | cuda:N
    seed: int = 0                  # weights, order and augmentation all follow it
    data_root: str | None = None   # folder with the dataset's original files
    output_dir: str = "runs/latest"  # metrics.jsonl, config.json, summary.json go here
    eval_batch_size: int = 1000    # test-time batch
    log_every: int = 50            # steps between host syncs for the loss/NaN check
    progress: bool = True          # tqdm bar (only when stdout is a terminal)

    def validate(self) -> None:
        """Reject impossible values with the field, the value and what is allowed (row 29)."""
        checks = [("epochs", lambda v: v >= 0, "an integer >= 0"),
                  ("batch_size", lambda v: v >= 1, "an integer >= 1"),
                  ("eval_batch_size", lambda v: v >= 1, "an integer >= 1"),
                  ("lr", lambda v: v > 0 and math.isfinite(v), "a positive number"),
                  ("label_smoothing", lambda v: 0 <= v < 1, "in [0, 1)"),
                  ("log_every", lambda v: v >= 1, "an integer >= 1")]
        for field, ok, want in checks:
            value = getattr(self, field)
            if value is not None and not ok(value):
                raise ConfigError(f"{field} must be {want}, got {getattr(self, field)!r}")


# Defaults by kind of image. "gray": 28x28 digits and clothes, the small cnn reaches 99% on
# MNIST in 3 epochs. "colour": 32x32 RGB, the ResNet-9 recipe of the DAWNBench CIFAR-10
# entries (batch 512, peak lr 0.4, label smoothing 0.2, crop+flip+cutout, bf16).
PRESETS: dict[str, dict] = {
    "gray": dict(model="cnn", epochs=3, batch_size=128, lr=0.1, label_smoothing=0.0,
                 augment="", amp=False, channels_last=False),
    "colour": dict(model="resnet9", epochs=16, batch_size=512, lr=0.4, label_smoothing=0.2,
                   augment="crop=4,flip,cutout=8,fill=reflect", amp=True, channels_last=True),
}


def resolve_config(config: TrainConfig, train_set: Dataset, device: torch.device) -> TrainConfig:
    """Fill the fields left at None from the preset for ``train_set``'s kind of image."""
    preset = dict(PRESETS["gray" if train_set.image_shape[2] == 1 else "colour"])
    if device.type != "cuda":  # bf16 autocast and NHWC pay off on tensor cores, not here
        preset.update(amp=False, channels_last=False)
    return replace(config, **{k: v for k, v in preset.items() if getattr(config, k) is None})


def load_splits(config: TrainConfig) -> tuple[Dataset, Dataset]:
    """The train and test splits named by ``config.dataset``."""
    return (load_dataset(config.dataset, "train", root=config.data_root),
            load_dataset(config.dataset, "test", root=config.data_root))


def evaluate(model: torch.nn.Module, loader: Loader) -> tuple[int, int]:
    """(correct, total) over one pass of ``loader``; one host sync at the end."""
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=loader.device)
    total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(1) == labels).sum()
            total += len(labels)
    model.train()
    return int(correct.item()), total  # .item() syncs the device


def _check_finite(loss_sum: torch.Tensor, first_bad: torch.Tensor, step: int) -> float:
    """Read the interval's loss (one sync); stop naming the first step whose loss was not finite."""
    bad = int(first_bad.item())
    if bad >= 0:
        raise TrainingError(f"loss became NaN/inf at step {bad}; stopping "
                            f"(lower --lr, or check the data)")
    return float(loss_sum.item())


def train(config: TrainConfig) -> dict:
    """Train ``config.model`` on ``config.dataset``; return the summary (also saved as JSON)."""
    config.validate()
    torch.manual_seed(config.seed)
    train_set, test_set = load_splits(config)
    device = resolve_device(config.device)
    config = resolve_config(config, train_set, device)
    augment = parse_augment(config.augment)
    dtype = torch.bfloat16 if config.amp else torch.float32
    loader = Loader(train_set, config.batch_size, device=device, transfer=config.transfer,
                    seed=config.seed, dtype=dtype, channels_last=config.channels_last,
                    augment=augment)
    test_loader = Loader(test_set, config.eval_batch_size, device=device,
                         transfer=config.transfer, shuffle=False, pad=False, dtype=dtype,
                         channels_last=config.channels_last)
    h, w, c = train_set.image_shape
    model = build_model(config.model, (c, h, w), train_set.num_classes).to(device)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                          nesterov=True, weight_decay=config.weight_decay)
    steps = max(config.epochs * len(loader), 1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=steps,
                                                pct_start=0.25)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.amp)
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(
        {**asdict(config), "transfer": loader.transfer, "device": str(loader.device)}, indent=2))
    metrics = (out / "metrics.jsonl").open("w")

    train_seconds, step, accuracy = 0.0, 0, float("nan")
    show = config.progress and sys.stdout.isatty()
    for epoch in range(config.epochs):
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=loader.device)
        first_bad = torch.full((), -1, dtype=torch.int64, device=loader.device)
        seen, interval_loss = 0, 0.0
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{config.epochs}", disable=not show,
                   leave=False)
        for images, labels in bar:
            with autocast:
                loss = F.cross_entropy(model(images), labels,
                                       label_smoothing=config.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss = loss.detach()
            # Device-side bookkeeping: no host sync until the log interval.
            first_bad = torch.where((first_bad < 0) & ~torch.isfinite(loss),
                                    torch.full_like(first_bad, step), first_bad)
            loss_sum += loss
            step, seen = step + 1, seen + 1
            if step % config.log_every == 0:
                interval_loss = _check_finite(loss_sum, first_bad, step) / seen
                bar.set_postfix(loss=f"{interval_loss:.4f}")
        if seen:
            interval_loss = _check_finite(loss_sum, first_bad, step) / seen
        if loader.device.type == "cuda":
            torch.cuda.synchronize(loader.device)
        epoch_seconds = time.perf_counter() - t0
        train_seconds += epoch_seconds
        with autocast:
            correct, total = evaluate(model, test_loader)
        accuracy = correct / total
        record = {"epoch": epoch + 1, "step": step, "train_loss": interval_loss,
                  "test_accuracy": accuracy, "epoch_seconds": epoch_seconds,
                  "images_per_s": loader.num_samples / epoch_seconds}
        metrics.write(json.dumps(record) + "\n")
        metrics.flush()
        print(f"epoch {epoch + 1}/{config.epochs}  loss {interval_loss:.4f}  "
              f"test acc {accuracy:.4f}  {epoch_seconds:.1f} s", flush=True)
    metrics.close()

    samples = loader.num_samples * config.epochs + test_loader.num_samples * config.epochs
    summary = {"test_accuracy": accuracy, "train_seconds": train_seconds,
               "epochs": config.epochs, "transfer": loader.transfer,
               "device": str(loader.device), "dataset": train_set.name, "model": config.model,
               "h2d_bytes": loader.stats.h2d_bytes + test_loader.stats.h2d_bytes,
               "h2d_bytes_float32": float32_bytes(train_set, samples),
               "data_wait_seconds": loader.stats.wait_seconds,
               "output_dir": str(out)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
