"""Training: one readable loop over a latecast ``Loader``, evaluation, checkpoints, DDP.

``train(TrainConfig(...))`` is what ``latecast train`` runs. The defaults train the small
``cnn`` on the bundled MNIST to >= 99% test accuracy in 3 epochs (about 30 s an epoch on a
2-core CPU; seconds on a GPU). SGD with Nesterov momentum under a triangular one-cycle schedule.

Under ``torchrun`` every process joins the process group (NCCL on CUDA, one device per
process: ``cuda:LOCAL_RANK``; gloo on CPU) and trains a ``DistributedDataParallel`` copy of
the model on its own share of every epoch. BatchNorm is plain DDP: batch statistics per
rank, running statistics copied from rank 0 (at each forward, and before every evaluation
and save). Rank 0 alone logs, writes metrics and checkpoints; test accuracy is summed over
ranks from unpadded shards, so it equals single-process accuracy on the same weights.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from .checkpoint import resume_path, restore, rng_state, save_checkpoint
from .data import Dataset
from .datasets import load_dataset
from .errors import CheckpointError, ConfigError, TrainingError
from .loader import Loader, dist_env, resolve_device
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
    channels_last: bool | None = None  # NHWC memory format for images and model
    momentum: float = 0.9          # Nesterov momentum
    weight_decay: float = 5e-4     # L2 on all parameters
    transfer: str = "auto"         # float32 | uint8 | prefetch | resident | auto
    device: str = "auto"           # auto | cpu | cuda | cuda:N (under torchrun: cuda:LOCAL_RANK)
    seed: int = 0                  # weights, order and augmentation all follow it
    data_root: str | None = None   # folder with the dataset's original files
    output_dir: str = "runs/latest"  # metrics.jsonl, config.json, summary.json, *.pt go here
    eval_batch_size: int = 1000    # test-time batch, per process
    log_every: int = 50            # steps between host syncs for the loss/NaN check
    progress: bool = True          # tqdm bar (only when stdout is a terminal, rank 0)
    limit_train: int | None = None  # train on the first N training samples only (smoke runs)
    limit_test: int | None = None  # evaluate on the first N test samples only (smoke runs)
    resume: str | None = None      # checkpoint path, or "auto": output_dir/checkpoint.pt if any
    checkpoint_every: int | None = None  # also save checkpoint.pt every N steps (always per epoch)
    dist_timeout: float = 300.0    # seconds a rank waits for the others (init, collectives)

    def validate(self) -> None:
        """Reject impossible values with the field, the value and what is allowed (row 29)."""
        checks = [("epochs", lambda v: v >= 0, "an integer >= 0"),
                  ("batch_size", lambda v: v >= 1, "an integer >= 1"),
                  ("eval_batch_size", lambda v: v >= 1, "an integer >= 1"),
                  ("lr", lambda v: v > 0 and math.isfinite(v), "a positive number"),
                  ("label_smoothing", lambda v: 0 <= v < 1, "in [0, 1)"),
                  ("log_every", lambda v: v >= 1, "an integer >= 1"),
                  ("limit_train", lambda v: v >= 1, "an integer >= 1"),
                  ("limit_test", lambda v: v >= 1, "an integer >= 1"),
                  ("checkpoint_every", lambda v: v >= 1, "an integer >= 1"),
                  ("dist_timeout", lambda v: v > 0, "a positive number of seconds")]
        for field, ok, want in checks:
            value = getattr(self, field)
            if value is not None and not ok(value):
                raise ConfigError(f"{field} must be {want}, got {getattr(self, field)!r}")


# Defaults by kind of image. "gray": 28x28 digits and clothes, the small cnn reaches 99% on
# MNIST in 3 epochs. "colour": 32x32 RGB, the ResNet-9 recipe of the DAWNBench CIFAR-10
# entries (batch 512, peak lr 0.4, label smoothing 0.2, crop+flip+cutout, bf16).
# channels_last everywhere: NHWC convolutions ran the MNIST cnn 2x faster on a 2-core CPU
# (18 vs 39 s an epoch) and suit tensor cores on CUDA.
PRESETS: dict[str, dict] = {
    "gray": dict(model="cnn", epochs=3, batch_size=128, lr=0.1, label_smoothing=0.0,
                 augment="", amp=False, channels_last=True),
    "colour": dict(model="resnet9", epochs=16, batch_size=512, lr=0.4, label_smoothing=0.2,
                   augment="crop=4,flip,cutout=8,fill=reflect", amp=True, channels_last=True),
}


def resolve_config(config: TrainConfig, train_set: Dataset, device: torch.device) -> TrainConfig:
    """Fill the fields left at None from the preset for ``train_set``'s kind of image."""
    preset = dict(PRESETS["gray" if train_set.image_shape[2] == 1 else "colour"])
    if device.type != "cuda":  # bf16 autocast pays off on tensor cores, not on a CPU
        preset.update(amp=False)
    return replace(config, **{k: v for k, v in preset.items() if getattr(config, k) is None})


def load_splits(config: TrainConfig) -> tuple[Dataset, Dataset]:
    """The train and test splits named by ``config.dataset``, cut to the ``limit_*`` fields."""
    train_set = load_dataset(config.dataset, "train", root=config.data_root)
    test_set = load_dataset(config.dataset, "test", root=config.data_root)
    return _first(train_set, config.limit_train), _first(test_set, config.limit_test)


def _first(ds: Dataset, n: int | None) -> Dataset:
    """The first ``n`` samples; mean/std stay those of the full train split."""
    return ds if n is None or n >= len(ds) else replace(ds, images=ds.images[:n],
                                                        labels=ds.labels[:n])


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


# -- distributed helpers: collectives, so every rank calls them, in the same order ---------

def _start(config: TrainConfig) -> tuple[torch.device, bool, bool]:
    """(device, distributed, own_group). Under torchrun (``WORLD_SIZE`` set) join the
    process group: NCCL on CUDA, gloo on CPU, waiting at most ``dist_timeout`` seconds."""
    local = os.environ.get("LOCAL_RANK")
    if config.device in ("auto", "cuda") and local is not None and torch.cuda.is_available():
        device = torch.device("cuda", int(local))  # one device per process
    else:
        device = resolve_device(config.device)
    if dist.is_available() and dist.is_initialized():
        return device, True, False  # the caller's group: theirs to destroy
    if "WORLD_SIZE" not in os.environ:
        return device, False, False
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    try:
        dist.init_process_group("nccl" if cuda else "gloo",
                                timeout=timedelta(seconds=config.dist_timeout),
                                **({"device_id": device} if cuda else {}))
    except ValueError as err:  # env:// without MASTER_ADDR/PORT: not launched by torchrun
        raise ConfigError(f"WORLD_SIZE is set but the process group cannot start: {err}; "
                          f"launch with torchrun") from None
    return device, True, True


def _gather(values: list[int], device: torch.device) -> list[list[int]]:
    """``values`` from every rank, in rank order."""
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [t.tolist() for t in every]


def _check_same_data(train_set: Dataset, test_set: Dataset, device: torch.device) -> None:
    """Row 23: every rank must hold the same data (sizes and label sums compared)."""
    rows = _gather([len(train_set), len(test_set), int(train_set.labels.sum(dtype=np.int64)),
                    int(test_set.labels.sum(dtype=np.int64))], device)
    if any(r != rows[0] for r in rows):
        raise ConfigError("ranks hold different data ([train size, test size, train label "
                          "sum, test label sum]): " + "; ".join(
                              f"rank {i} {r}" for i, r in enumerate(rows)))


def _sync_buffers(model: torch.nn.Module, distributed: bool) -> None:
    """Copy rank 0's BatchNorm running statistics to every rank (DDP does this at each
    forward; after the last step they differ again) so all ranks hold the same weights."""
    if distributed:
        for buffer in model.buffers():
            dist.broadcast(buffer, 0)


def _accuracy(model: torch.nn.Module, loader: Loader, distributed: bool) -> tuple[int, int]:
    """(correct, total) over every rank's unpadded share of the test set (row 24)."""
    _sync_buffers(model, distributed)
    correct, total = evaluate(model, loader)
    if distributed:
        both = torch.tensor([correct, total], dtype=torch.int64, device=loader.device)
        dist.all_reduce(both)
        correct, total = both.tolist()
    return correct, total


def _check_finite(loss_sum: torch.Tensor, first_bad: torch.Tensor, distributed: bool,
                  last_good: str) -> float:
    """Read the loss so far (one sync), summed over ranks; stop naming the first step whose
    loss was not finite on any rank (row 30). Collective: all ranks stop together."""
    total, bad = loss_sum.detach().clone().float(), first_bad.clone()
    if distributed:
        dist.all_reduce(total)
        dist.all_reduce(bad, op=dist.ReduceOp.MIN)
    bad_step = int(bad.item())  # .item() syncs the device
    if bad_step < _NO_BAD:
        raise TrainingError(f"loss became NaN/inf at step {bad_step}; stopping "
                            f"(lower --lr, or check the data); {last_good}")
    return float(total.item()) / (dist.get_world_size() if distributed else 1)


_NO_BAD = 2**62  # first_bad's value while every loss has been finite


def _peer_failure(err: RuntimeError) -> bool:
    """A collective that failed because a peer died or timed out. Collectives called here
    raise ``DistError``; DDP's gradient all-reduce fails inside autograd, which re-raises
    the backend's message as a plain ``RuntimeError``."""
    text = str(err).lower()
    return isinstance(err, dist.DistError) or any(
        s in text for s in ("gloo", "nccl", "timed out", "connection closed", "connection reset"))


# -- the loop ------------------------------------------------------------------------------

def train(config: TrainConfig) -> dict:
    """Train ``config.model`` on ``config.dataset``; return the summary (also saved as JSON).

    Under ``torchrun`` this process trains its share with DDP; the process group is
    destroyed on the way out, also on error.

    Example:
        >>> summary = train(TrainConfig(model="mlp", epochs=1, output_dir="runs/mlp"))
        >>> summary["test_accuracy"]  # about 0.97
    """
    config.validate()
    device, distributed, own_group = _start(config)
    try:
        return _train(config, device, distributed)
    except RuntimeError as err:
        if not (distributed and _peer_failure(err)):
            raise
        first = str(err).strip().splitlines()[0][:300]
        raise TrainingError(f"rank {dist.get_rank()}: another rank failed or did not answer "
                            f"within {config.dist_timeout:g} s ({first})") from err
    finally:
        if own_group:
            dist.destroy_process_group()


def _train(config: TrainConfig, device: torch.device, distributed: bool) -> dict:
    rank, world = dist_env(None, None)
    lead = rank == 0  # logs, progress bar, metrics and checkpoints
    torch.manual_seed(config.seed)
    train_set, test_set = load_splits(config)
    if distributed:
        _check_same_data(train_set, test_set, device)
    config = resolve_config(config, train_set, device)
    dtype = torch.bfloat16 if config.amp else torch.float32
    loader = Loader(train_set, config.batch_size, device=device, transfer=config.transfer,
                    seed=config.seed, dtype=dtype, channels_last=config.channels_last,
                    augment=parse_augment(config.augment))
    test_loader = Loader(test_set, config.eval_batch_size, device=device,
                         transfer=config.transfer, shuffle=False, pad=False, dtype=dtype,
                         channels_last=config.channels_last)
    model, opt, sched = model_and_optimizer(config, train_set, device, len(loader))
    out = Path(config.output_dir)
    latest, best_path = out / "checkpoint.pt", out / "best.pt"
    run = {**asdict(config), "world_size": world}

    # Resume: every rank reads the same file (rank 0 wrote it) and continues at its step.
    resume_from = resume_path(config.resume, latest, say=lead)
    state = restore(resume_from, run, model, opt, sched, loader) if resume_from else {}
    if distributed:
        _check_same_start(state.get("step", -1), device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.amp)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes: autotune once, in the warm-up
        _warm_up(model, loader, autocast)
    net = (DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                   else None) if distributed else model)
    step, history = state.get("step", 0), list(state.get("history", []))
    best, train_seconds = state.get("best_accuracy", -1.0), state.get("train_seconds", 0.0)
    # A mid-epoch checkpoint carries the loss summed so far in its epoch.
    carried_sum = state.get("epoch_loss_sum", torch.zeros(()))
    carried_seen = state.get("epoch_seen", 0)
    last_good = (f"last good checkpoint: {resume_from} (step {step})" if resume_from
                 else "no checkpoint saved yet")
    if lead:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(
            {**run, "transfer": loader.transfer, "device": str(loader.device)}, indent=2))
        # Rebuilt from the checkpoint's history on resume: no duplicate or missing epochs.
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
        if resume_from:
            print(f"resuming from {resume_from}: epoch {loader.epoch + 1}, "
                  f"batch {loader.position} of {len(loader)}, step {step}", flush=True)

    def save(path: Path, loss_sum: torch.Tensor, seen: int) -> str:
        _sync_buffers(model, distributed)  # collective, then rank 0 writes
        if lead:
            save_checkpoint(path, {
                "model": model.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "epoch": loader.epoch, "step": step,
                "loader": loader.state_dict(), "rng": rng_state(), "config": asdict(config),
                "world_size": world, "history": history, "best_accuracy": best,
                "train_seconds": train_seconds, "epoch_loss_sum": loss_sum.detach().cpu(),
                "epoch_seen": seen})
        return f"last good checkpoint: {path} (step {step})"

    show = lead and config.progress and sys.stdout.isatty()
    samples, evaluated = 0, 0  # for the float32 byte comparison
    accuracy = history[-1]["test_accuracy"] if history else float("nan")
    for epoch in range(loader.epoch, config.epochs):
        loader.set_epoch(epoch)  # on resume the same epoch: the position is kept
        t0 = time.perf_counter()
        loss_sum, seen = carried_sum.to(device, copy=True), carried_seen
        carried_sum, carried_seen = torch.zeros(()), 0
        first_bad = torch.full((), _NO_BAD, dtype=torch.int64, device=device)
        bar = _progress(loader, f"epoch {epoch + 1}/{config.epochs}", show)
        for images, labels in bar:
            with autocast:
                loss = F.cross_entropy(net(images), labels,
                                       label_smoothing=config.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss = loss.detach()
            step, seen, samples = step + 1, seen + 1, samples + len(labels)
            # Device-side bookkeeping: no host sync until the log interval.
            first_bad = torch.where(torch.isfinite(loss), first_bad, first_bad.clamp(max=step))
            loss_sum += loss
            if step % config.log_every == 0:
                epoch_loss = _check_finite(loss_sum, first_bad, distributed, last_good) / seen
                if show:
                    bar.set_postfix(loss=f"{epoch_loss:.4f}")
            if (config.checkpoint_every and step % config.checkpoint_every == 0
                    and loader.position < len(loader)):  # the epoch's end saves anyway
                _check_finite(loss_sum, first_bad, distributed, last_good)  # never save NaN
                last_good = save(latest, loss_sum, seen)
        epoch_loss = _check_finite(loss_sum, first_bad, distributed, last_good) / max(seen, 1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        epoch_seconds = time.perf_counter() - t0
        train_seconds += epoch_seconds
        with autocast:
            correct, total = _accuracy(model, test_loader, distributed)
        accuracy, evaluated = correct / total, evaluated + test_loader.num_samples
        history.append({"epoch": epoch + 1, "step": step, "train_loss": epoch_loss,
                        "test_accuracy": accuracy, "epoch_seconds": epoch_seconds,
                        "images_per_s": loader.num_samples * world / epoch_seconds})
        if lead:
            with (out / "metrics.jsonl").open("a") as metrics:
                metrics.write(json.dumps(history[-1]) + "\n")
            print(f"epoch {epoch + 1}/{config.epochs}  loss {epoch_loss:.4f}  "
                  f"test acc {accuracy:.4f}  {epoch_seconds:.1f} s", flush=True)
        if accuracy > best:  # best.pt first: a crash between the two redoes this epoch
            best = accuracy
            save(best_path, torch.zeros(()), 0)
        last_good = save(latest, torch.zeros(()), 0)

    summary = {"test_accuracy": accuracy, "train_seconds": train_seconds,
               "epochs": config.epochs, "transfer": loader.transfer,
               "device": str(loader.device), "dataset": train_set.name, "model": config.model,
               # bytes are this process's; float32 is what the same samples would have cost
               "h2d_bytes": loader.stats.h2d_bytes + test_loader.stats.h2d_bytes,
               "h2d_bytes_float32": float32_bytes(train_set, samples + evaluated),
               "data_wait_seconds": loader.stats.wait_seconds, "step": step,
               "best_accuracy": best, "rank": rank, "world_size": world,
               "output_dir": str(out)}
    if lead:
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _warm_up(model: torch.nn.Module, loader: Loader, autocast) -> None:
    """One forward and backward on a zero batch before the clock starts, then weights and
    BatchNorm statistics put back exactly: CUDA's one-time costs (cuBLAS/cuDNN handles,
    kernel loading: about a second on the H200) are start-up, not training."""
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    h, w, c = loader.dataset.image_shape
    fmt = torch.channels_last if loader.channels_last else torch.contiguous_format
    x = torch.zeros(loader.batch_size, c, h, w, dtype=loader.dtype, device=loader.device)
    with autocast:
        model(x.contiguous(memory_format=fmt)).float().sum().backward()
    model.zero_grad(set_to_none=True)
    model.load_state_dict(saved)
    if loader.device.type == "cuda":
        torch.cuda.synchronize(loader.device)


def _progress(loader: Loader, desc: str, show: bool):
    """A tqdm bar over ``loader`` on a terminal; else the loader itself (tqdm is imported
    only here, so batch jobs and minimal environments run without it)."""
    if not show:
        return loader
    from tqdm import tqdm
    return tqdm(loader, desc=desc, leave=False)


def model_and_optimizer(config: TrainConfig, train_set: Dataset, device: torch.device,
                        steps_per_epoch: int):
    """The model on ``device``; SGD (Nesterov) under a one-cycle schedule over the run."""
    h, w, c = train_set.image_shape
    model = build_model(config.model, (c, h, w), train_set.num_classes).to(device)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                          nesterov=True, weight_decay=config.weight_decay)
    return model, opt, one_cycle(opt, config.epochs * steps_per_epoch)


def one_cycle(opt: torch.optim.Optimizer, total_steps: int, warmup: float = 0.25,
              start: float = 0.04) -> torch.optim.lr_scheduler.LambdaLR:
    """Triangular one-cycle: linear from ``start`` x lr up to lr over the first ``warmup`` of
    the steps, then linearly down to 0. (``OneCycleLR`` divides by zero on runs of 2 or 4
    steps; this shape is defined for any length.)"""
    total = max(total_steps, 1)
    peak = max(1, round(warmup * total))

    def factor(step: int) -> float:
        if step < peak:
            return start + (1 - start) * step / peak
        return max(0.0, (total - step) / max(total - peak, 1))
    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _check_same_start(step: int, device: torch.device) -> None:
    """Every rank must continue from the same step (-1: fresh start)."""
    steps = [r[0] for r in _gather([step], device)]
    if len(set(steps)) > 1:
        raise CheckpointError(f"ranks would start from different steps {steps} (-1: no "
                              f"checkpoint found); with several machines the checkpoint "
                              f"folder must be one every machine can read")
