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
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .datasets import Dataset, load_dataset
from .errors import ConfigError, TrainingError
from .loader import Loader
from .models import build_model
from .transfer import float32_bytes


@dataclass(frozen=True)
class TrainConfig:
    dataset: str = "mnist"         # a known dataset name, or a store folder (latecast convert)
    model: str = "cnn"             # a name in models.MODELS
    epochs: int = 3                # full passes over the training split
    batch_size: int = 128          # samples per step, per process
    lr: float = 0.1                # peak learning rate of the one-cycle schedule
    momentum: float = 0.9          # Nesterov momentum
    weight_decay: float = 5e-4     # L2 on all parameters
    label_smoothing: float = 0.0   # cross-entropy label smoothing, 0..1
    transfer: str = "auto"         # float32 | uint8 | prefetch | resident | auto
    device: str = "auto"           # auto | cpu | cuda | cuda:N
    seed: int = 0                  # weights, order and augmentation all follow it
    data_root: str | None = None   # folder with the dataset's original files
    output_dir: str = "runs/latest"  # metrics.jsonl and config.json go here
    eval_batch_size: int = 1000    # test-time batch
    log_every: int = 50            # steps between host syncs for the loss/NaN check
    progress: bool = True          # tqdm bar (only when stdout is a terminal)

    def validate(self) -> None:
        """Reject impossible values with the field, the value and what is allowed (row 29)."""
        checks = [("epochs", self.epochs >= 0, "an integer >= 0"),
                  ("batch_size", self.batch_size >= 1, "an integer >= 1"),
                  ("eval_batch_size", self.eval_batch_size >= 1, "an integer >= 1"),
                  ("lr", self.lr > 0 and math.isfinite(self.lr), "a positive number"),
                  ("label_smoothing", 0 <= self.label_smoothing < 1, "in [0, 1)"),
                  ("log_every", self.log_every >= 1, "an integer >= 1")]
        for field, ok, want in checks:
            if not ok:
                raise ConfigError(f"{field} must be {want}, got {getattr(self, field)!r}")


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
    loader = Loader(train_set, config.batch_size, device=config.device,
                    transfer=config.transfer, seed=config.seed)
    test_loader = Loader(test_set, config.eval_batch_size, device=loader.device,
                         transfer=config.transfer, shuffle=False, pad=False)
    h, w, c = train_set.image_shape
    model = build_model(config.model, (c, h, w), train_set.num_classes).to(loader.device)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                          nesterov=True, weight_decay=config.weight_decay)
    steps = max(config.epochs * len(loader), 1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=steps,
                                                pct_start=0.25)
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
