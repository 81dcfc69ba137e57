"""Training: one readable loop over a latecast ``Loader``, evaluation, checkpoints, DDP.

``train(TrainConfig(...))`` is what ``latecast train`` runs. The defaults train the small
``cnn`` on the bundled MNIST to >= 99% test accuracy in 3 epochs (about 20 s an epoch on a
2-core CPU; seconds on a GPU). SGD with Nesterov momentum under a triangular one-cycle
schedule. ``train_step`` and ``evaluate`` are the one step and the one evaluation that
``bench`` and ``profile`` use too, so all three train the same way for the same config.

Batches are static (``Loader(static=True)``): the same shape every step, the partial last
training batch dropped, the last test batch padded and masked, so ``--compile`` never
meets a new shape and ``--graph`` can capture the whole step (``graphed.py``). Time is
stated the way records state it: ``clock_seconds`` runs from the first step to the end of
the final evaluation (the per-epoch evaluations and checkpoint writes in between are timed
apart, like a record's logging); start-up (data, upload, warm-up with compilation and cuDNN
autotuning, graph capture) is reported beside it, never inside it.

Under ``torchrun`` every process joins the process group (NCCL on CUDA, one device per
process: ``cuda:LOCAL_RANK``; gloo on CPU) and trains a ``DistributedDataParallel`` copy of
the model on its own share of every epoch. BatchNorm is plain DDP: batch statistics per
rank, running statistics copied from rank 0 (at each forward, and before every evaluation
and save). Rank 0 alone logs, writes metrics and checkpoints; test accuracy is summed over
ranks from unpadded shards, so it equals single-process accuracy on the same weights.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from .. import distributed
from ..config import DATASET_HELP, option, parse_augment, parse_mix, validate
from ..data import Dataset, EncodedDataset, fingerprint
from ..errors import CheckpointError, ConfigError, TrainingError
from ..loader import IGNORE, Loader, parse_order
from ..storage.datasets import load_dataset
from ..transfer import MOVERS, Batch, float32_bytes, uint8_bytes
from . import checkpoint, graphed, rundir
from .models import MODELS, build_model

_PRESET = " (default: the preset's)"
_PRESET_HELP = (
    "gray (28x28 digits: cnn), colour (32x32 RGB: ResNet-9) or photo (larger: ResNet-9, "
    "resized crops); default: by image"
)

# Defaults by kind of image. "gray": 28x28 digits and clothes, the small cnn reaches 99% on
# MNIST in 3 epochs. "colour": 32x32 RGB, the ResNet-9 recipe of the DAWNBench CIFAR-10
# entries (batch 512, peak lr 0.4, label smoothing 0.2, crop+flip+cutout, bf16).
# "photo": larger images (a JPEG store of photos), ResNet-9 (with a stride-4 stem above 64
# px), RandomResizedCrop + flip, the usual ImageNet-style label smoothing 0.1; a starting
# point, not tuned: no accuracy has been measured with it.
# channels_last everywhere: NHWC convolutions ran the MNIST cnn 2x faster on a 2-core CPU
# (18 vs 39 s an epoch) and suit tensor cores on CUDA.
PRESETS: dict[str, dict] = {
    "gray": dict(
        model="cnn",
        epochs=3,
        batch_size=128,
        lr=0.1,
        label_smoothing=0.0,
        augment="",
        amp=False,
        channels_last=True,
    ),
    "colour": dict(
        model="resnet9",
        epochs=16,
        batch_size=512,
        lr=0.4,
        label_smoothing=0.2,
        augment="crop=4,flip,cutout=8,fill=reflect",
        amp=True,
        channels_last=True,
    ),
    "photo": dict(
        model="resnet9",
        epochs=16,
        batch_size=256,
        lr=0.2,
        label_smoothing=0.1,
        augment="resized_crop=0.35,flip",
        amp=True,
        channels_last=True,
    ),
}
_PRESET_SIZE = 32  # gray and colour are tuned on images up to 32x32; larger ones: photo


@dataclass(frozen=True)
class TrainConfig:
    dataset: str = option("mnist", DATASET_HELP, positional=True)
    preset: str | None = option(None, _PRESET_HELP, choices=PRESETS)
    model: str | None = option(None, f"one of {', '.join(MODELS)}{_PRESET}", choices=MODELS)
    epochs: int | None = option(None, f"passes over the training split{_PRESET}", low=0)
    batch_size: int | None = option(None, f"per step, per process{_PRESET}", short="-b", low=1)
    lr: float | None = option(None, f"peak learning rate (one-cycle){_PRESET}", above=0)
    label_smoothing: float | None = option(None, f"in [0, 1){_PRESET}", low=0, below=1)
    augment: str | None = option(None, f'e.g. "crop=4,flip,cutout=8" or "none"{_PRESET}')
    mix: str = option("", 'after the normalize: "mixup=0.2", "cutmix", "mixup,cutmix" or none')
    order: str = option(
        "random", "random, or block[:BLOCK:WINDOW] (sizes 32:256 if not given): reads in sequence"
    )
    amp: bool | None = option(None, f"bf16 autocast, CUDA only{_PRESET}")
    channels_last: bool | None = option(None, f"NHWC images and model{_PRESET}")
    momentum: float = option(0.9, "Nesterov momentum (0: plain SGD)", low=0)
    weight_decay: float = option(5e-4, "L2 on all parameters", low=0)
    transfer: str = option("auto", "|".join([*MOVERS, "auto"]), choices=[*MOVERS, "auto"])
    compile: bool = option(False, "torch.compile the model and loss (compiled in the warm-up)")
    graph: bool = option(False, "CUDA, resident: capture the whole step in a CUDA graph, replay it")
    device: str = option("auto", "auto|cpu|cuda|cuda:N (under torchrun: cuda:LOCAL_RANK)")
    seed: int = option(0, "weights, order and augmentation all follow it", low=0, high=2**63 - 1)
    data_root: str | None = option(None, "folder with the dataset's original files")
    output_dir: str = option("runs/latest", "config, metrics, summary and checkpoints go here")
    eval_batch_size: int = option(1000, "test-time batch, per process", low=1)
    log_every: int = option(50, "steps between host syncs for the loss/NaN check", low=1)
    progress: bool = option(True, "tqdm bar (only on a terminal, rank 0)")
    limit_train: int | None = option(None, "train on the first N samples", metavar="N", low=1)
    limit_test: int | None = option(None, "evaluate on the first N samples", metavar="N", low=1)
    resume: str | None = option(None, "checkpoint to continue from; auto: OUTPUT_DIR's if any")
    overwrite: bool = option(False, "replace a previous run's files in OUTPUT_DIR (only those)")
    check: bool = option(False, "check data, config, output folder and resume, then exit")
    checkpoint_every: int | None = option(None, "also save every N steps", metavar="N", low=1)
    dist_timeout: float = option(300.0, "seconds a rank waits for the others", above=0, high=1e7)

    def __post_init__(self) -> None:
        validate(self)  # one line naming the field and the value (docs/RELIABILITY.md row 29)
        parse_order(self.order)  # a bad --order: one line, before any data is read
        if self.overwrite and self.resume is not None:
            raise ConfigError("overwrite starts a new run, resume continues one: give one")


def resolve_config(config: TrainConfig, train_set: Dataset, device: torch.device) -> TrainConfig:
    """Fill the fields left at None from the preset (by default the one for ``train_set``'s
    kind of image); bf16 autocast only on CUDA, where it pays off on tensor cores."""
    h, w, c = train_set.image_shape
    if config.preset is None and c not in (1, 3):
        raise ConfigError(
            f"{config.dataset}: no preset fits {h}x{w}x{c} images (they are made for 1 or 3 "
            f"channels); choose one with --preset {'|'.join(PRESETS)} and set what differs "
            f"(--model, --batch-size, --lr, ...)"
        )
    preset = config.preset or (
        "photo" if max(h, w) > _PRESET_SIZE else "gray" if c == 1 else "colour"
    )
    values = {**PRESETS[preset], **({} if device.type == "cuda" else {"amp": False})}
    return replace(
        config, preset=preset, **{k: v for k, v in values.items() if getattr(config, k) is None}
    )


def load_splits(config: TrainConfig) -> tuple[Dataset, Dataset]:
    """The train and test splits named by ``config.dataset``, cut to the ``limit_*`` fields."""
    train_set = load_dataset(config.dataset, "train", root=config.data_root)
    test_set = load_dataset(config.dataset, "test", root=config.data_root)
    return _first(train_set, config.limit_train), _first(test_set, config.limit_test)


def _first(ds: Dataset | EncodedDataset, n: int | None) -> Dataset | EncodedDataset:
    """The first ``n`` samples; mean/std stay those of the full train split."""
    if n is None or n >= len(ds):
        return ds
    if isinstance(ds, EncodedDataset):
        data, offsets = ds.data[: ds.offsets[n]], ds.offsets[: n + 1]
        return replace(ds, data=data, offsets=offsets, sizes=ds.sizes[:n], labels=ds.labels[:n])
    return replace(ds, images=ds.images[:n], labels=ds.labels[:n])


def model_and_optimizer(
    config: TrainConfig, train_set: Dataset, device: torch.device, steps_per_epoch: int
):
    """The model on ``device``; SGD (Nesterov) under a one-cycle schedule over the run."""
    h, w, c = train_set.image_shape
    model = build_model(config.model, (c, h, w), train_set.num_classes).to(device)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(
        model.parameters(),
        lr=config.lr,
        momentum=config.momentum,
        nesterov=config.momentum > 0,  # torch refuses Nesterov without momentum
        weight_decay=config.weight_decay,
    )
    return model, opt, one_cycle(opt, config.epochs * steps_per_epoch)


def recipe(config: TrainConfig, train_set: Dataset, device: torch.device, steps_per_epoch: int):
    """``latecast train``'s recipe, for ``bench`` and ``profile`` to train the same way:
    ``config`` resolved for ``train_set`` (the preset fills what is unset), then a fresh
    model, optimizer and schedule from ``config.seed`` (the same initial weights for every
    data path compared). Returns ``(config, model, opt, sched)``."""
    config = resolve_config(config, train_set, device)
    torch.manual_seed(config.seed)
    return (config, *model_and_optimizer(config, train_set, device, steps_per_epoch))


def one_cycle(
    opt: torch.optim.Optimizer, total_steps: int, warmup: float = 0.25, start: float = 0.04
) -> torch.optim.lr_scheduler.LambdaLR:
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


def _autocast(device: torch.device, amp: bool):
    # No cache of bf16 weight copies: it is unsafe under CUDA graph capture, and each weight
    # is cast once per forward anyway.
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(amp), cache_enabled=False)


def loss_of(
    model: torch.nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float,
    amp: bool,
) -> torch.Tensor:
    """The batch's loss: forward under bf16 autocast when ``amp``, then cross-entropy (labels
    ``IGNORE`` count nowhere). What ``--compile`` compiles: model and loss together."""
    with _autocast(images.device, amp):
        return F.cross_entropy(model(images), labels, label_smoothing=label_smoothing)


def compiled(fn, device: torch.device, graph: bool):
    """``torch.compile`` for small steps: on CUDA, mode ``reduce-overhead`` (inductor wraps
    forward and backward in its own CUDA graphs, so the launches of ~100 small kernels leave
    the host); under ``--graph`` our capture does that for the whole step, and the CPU has
    no graphs: the default mode there."""
    small_steps = device.type == "cuda" and not graph
    return torch.compile(fn, mode="reduce-overhead" if small_steps else None)


def train_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    images: torch.Tensor,
    labels: torch.Tensor,
    config: TrainConfig,
    loss_fn=loss_of,
) -> torch.Tensor:
    """One step of ``config``'s recipe (resolved): ``loss_fn`` (``loss_of`` or its compiled
    form), backward, optimizer and schedule step. Returns the loss, detached and still on
    the device (no host sync)."""
    loss = loss_fn(model, images, labels, config.label_smoothing, config.amp)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
    return loss.detach()


def evaluate(
    model: torch.nn.Module, batches: Iterable[Batch], amp: bool = False
) -> tuple[int, int]:
    """(correct, total) over ``batches`` in eval mode, padding (label ``IGNORE``) left out
    of both; one host sync at the end."""
    model.eval()
    counts = None
    with torch.no_grad():
        for images, labels in batches:
            with _autocast(images.device, amp):
                hits = (model(images).argmax(1) == labels).sum()
            both = torch.stack([hits, (labels != IGNORE).sum()])
            counts = both if counts is None else counts + both
    model.train()
    correct, total = (0, 0) if counts is None else counts.tolist()  # .tolist() syncs
    return correct, total


class LossTracker:
    """An epoch's training loss, summed on the device (no host sync per step) and read
    every ``log_every`` steps; a loss that is not finite stops the run naming its step
    (docs/RELIABILITY.md row 30). ``mean`` is collective under DDP: all ranks stop together."""

    def __init__(
        self,
        device: torch.device,
        distributed: bool,
        loss_sum: torch.Tensor | None = None,
        seen: int = 0,
    ) -> None:
        self.sum = torch.zeros((), device=device) if loss_sum is None else loss_sum.to(device)
        self.seen, self.distributed = seen, distributed
        self.first_bad = torch.full((), math.inf, dtype=torch.float64, device=device)

    def add(self, loss: torch.Tensor, step: int) -> None:
        self.first_bad = torch.where(
            torch.isfinite(loss), self.first_bad, self.first_bad.clamp(max=step)
        )
        self.sum = self.sum + loss
        self.seen += 1

    def mean(self, last_good: str) -> float:
        """The mean loss so far (one sync), over every rank."""
        total, bad = self.sum.clone().float(), self.first_bad.clone()
        if self.distributed:
            dist.all_reduce(total)
            dist.all_reduce(bad, op=dist.ReduceOp.MIN)
        if math.isfinite(bad.item()):  # .item() syncs the device
            raise TrainingError(
                f"loss became NaN/inf at step {int(bad.item())}; stopping "
                f"(lower --lr, or check the data); {last_good}"
            )
        world = dist.get_world_size() if self.distributed else 1
        return float(total.item()) / world / max(self.seen, 1)


# -- run set-up -----------------------------------------------------------------------------


@dataclass
class Run:
    """Everything a training run holds, set up once by ``_set_up``."""

    config: TrainConfig  # resolved: no field left at None
    distributed: bool
    loader: Loader  # its dataset, device, rank and world size are the run's
    test_loader: Loader
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    resumed_from: Path | None
    data_fingerprint: str  # of the training split: part of the resume identity
    progress: checkpoint.Progress = field(default_factory=checkpoint.Progress)
    startup: dict[str, float] = field(default_factory=dict)  # seconds before the first step

    @property
    def lead(self) -> bool:  # rank 0: logs, progress bar, metrics and checkpoints
        return self.loader.rank == 0

    @property
    def parts(self) -> dict:
        """What a checkpoint holds the state of."""
        return {
            "model": self.model,
            "optimizer": self.opt,
            "scheduler": self.sched,
            "loader": self.loader,
        }

    def save(self, path: Path) -> str:
        """Checkpoint (collective: BatchNorm statistics first; rank 0 writes); returns the
        line that names the last good checkpoint."""
        distributed.sync_buffers(self.model, self.distributed)
        if self.lead:
            checkpoint.save(
                path,
                self.parts,
                self.progress,
                asdict(self.config),
                self.loader.world_size,
                self.data_fingerprint,
            )
        return f"last good checkpoint: {path} (step {self.progress.step})"


def _set_up(config: TrainConfig, device: torch.device, distributed_: bool) -> Run:
    """Data (the same on every rank), the resolved config, loaders, model and optimizer,
    and the state to continue from when resuming."""
    _, rank, world = distributed.placement(device)
    if config.graph and (device.type != "cuda" or distributed_):
        raise ConfigError(
            f"--graph captures the training step in a CUDA graph: it needs one process on a "
            f"CUDA device, and this run is on {device}"
            + (f" with {world} processes" if distributed_ else "")
        )
    torch.manual_seed(config.seed)
    train_set, test_set = load_splits(config)
    if distributed_:
        _check_same_data(train_set, test_set, device)
    asked_batch = config.batch_size
    c = config = resolve_config(config, train_set, device)
    share = math.ceil(len(train_set) / world)
    if asked_batch is None and c.batch_size > share:  # a small subset: one full batch an epoch
        c = config = replace(config, batch_size=share)
    _check_fits(config, train_set, test_set, world)
    dtype = torch.bfloat16 if c.amp else torch.float32
    shared = dict(
        device=device, transfer=c.transfer, dtype=dtype, channels_last=c.channels_last, static=True
    )
    aug = parse_augment(c.augment)
    loader = Loader(
        train_set,
        c.batch_size,
        seed=c.seed,
        augment=aug,
        order=c.order,
        mix=parse_mix(c.mix, train_set.num_classes),
        **shared,
    )
    eval_batch = min(c.eval_batch_size, len(test_set))  # a larger one is the same single batch
    test_loader = Loader(test_set, eval_batch, shuffle=False, pad=False, **shared)
    if c.graph and loader.transfer != "resident":
        raise ConfigError(
            f"--graph needs the resident transfer (the whole step on the device), this run "
            f"would use {loader.transfer}"
        )
    if c.graph and (c.mix not in ("", "none") or (aug is not None and not aug.capturable)):
        raise ConfigError(
            "--graph captures device work only: drop --mix and the augmentations drawn on the "
            f"host (resized_crop, altflip); got --augment {c.augment!r} --mix {c.mix!r}"
        )
    _, model, opt, sched = recipe(config, train_set, device, len(loader))
    out = Path(config.output_dir)
    resumed_from = checkpoint.resume_path(config.resume, out / "checkpoint.pt", say=rank == 0)
    data = fingerprint(train_set)
    run = Run(config, distributed_, loader, test_loader, model, opt, sched, resumed_from, data)
    if resumed_from:
        identity = {**asdict(config), "world_size": world, "data_fingerprint": data}
        run.progress = checkpoint.restore(resumed_from, identity, run.parts)
    if distributed_:
        _check_same_start(run.progress.step if resumed_from else -1, device)
    return run


def _check_fits(config: TrainConfig, train_set: Dataset, test_set: Dataset, world: int) -> None:
    """Refuse before the first step what would fail or mislead later: splits of different
    shapes or classes, a batch larger than a process's share, a model deeper than the
    images allow (docs/RELIABILITY.md row 75)."""
    where, num_classes = config.dataset, train_set.num_classes
    if test_set.image_shape != train_set.image_shape:
        shapes = " vs ".join("x".join(map(str, s.image_shape)) for s in (train_set, test_set))
        raise ConfigError(f"{where}: train and test images differ in shape ({shapes}, HxWxC)")
    outside = np.flatnonzero(test_set.labels >= num_classes)
    if outside.size:
        raise ConfigError(
            f"{where}: test label {test_set.labels[outside[0]]} at index {outside[0]} is "
            f"outside the training classes 0..{num_classes - 1}"
        )
    share, batch = math.ceil(len(train_set) / world), config.batch_size
    if batch > share:  # static batches: every step takes a full one
        raise ConfigError(
            f"batch_size {batch} is larger than the {share} training samples each "
            f"process has (every step takes a full batch); choose --batch-size {share} or less"
        )
    h, w, c = train_set.image_shape
    smallest = batch  # static batches: the partial last one is dropped
    try:
        with torch.device("meta"):  # shapes only: nothing allocated, no random draws
            MODELS[config.model]((c, h, w), num_classes)(torch.zeros(smallest, c, h, w))
    except (RuntimeError, ValueError) as err:
        raise ConfigError(
            f"model {config.model} cannot train on {h}x{w}x{c} images in batches of "
            f"{smallest} ({str(err).strip().splitlines()[0]}); choose another --model"
        ) from None


def _check_same_data(train_set: Dataset, test_set: Dataset, device: torch.device) -> None:
    """Every rank must hold the same data (sizes and label sums compared; row 23)."""
    rows = distributed.gather(
        [
            len(train_set),
            len(test_set),
            int(train_set.labels.sum(dtype=np.int64)),
            int(test_set.labels.sum(dtype=np.int64)),
        ],
        device,
    )
    if any(r != rows[0] for r in rows):
        raise ConfigError(
            "ranks hold different data ([train size, test size, train label "
            "sum, test label sum]): " + "; ".join(f"rank {i} {r}" for i, r in enumerate(rows))
        )


def _check_same_start(step: int, device: torch.device) -> None:
    """Every rank must continue from the same step (-1: fresh start)."""
    steps = [r[0] for r in distributed.gather([step], device)]
    if len(set(steps)) > 1:
        raise CheckpointError(
            f"ranks would start from different steps {steps} (-1: no checkpoint found); with "
            f"several machines the checkpoint folder must be one every machine can read"
        )


# -- the loop ------------------------------------------------------------------------------


def train(config: TrainConfig) -> dict:
    """Train ``config.model`` on ``config.dataset``; return the summary (also saved as JSON).

    Under ``torchrun`` this process trains its share with DDP; the process group is
    destroyed on the way out, also on error.

    Example:
        >>> summary = train(TrainConfig(model="mlp", epochs=1, output_dir="runs/mlp"))
        >>> summary["test_accuracy"]  # about 0.97
    """
    if config.epochs == 0:  # allowed in a TrainConfig: bench's recipe skips its runs with it
        raise ConfigError("epochs 0 trains nothing: give --epochs 1 or more")
    device, distributed_, own_group = distributed.start(config.device, config.dist_timeout)
    lead = distributed.placement(device)[1] == 0  # rank 0 alone writes the output folder
    out, asked = config.output_dir, (config.output_dir, config.resume, config.overwrite)
    try:
        replaced = rundir.check(*asked) if lead else []  # before any work; writes nothing
        t0 = time.perf_counter()
        run = _set_up(config, device, distributed_)
        run.startup["set_up"] = time.perf_counter() - t0  # data loaded, model built
        if config.check:
            return _checked(run, replaced)
        with rundir.claim(*asked) if lead else contextlib.nullcontext([]) as replaced:
            rundir.clear(out, replaced)  # judged again under the lock
            return _train(run)
    except OSError as err:  # a full disk, a folder gone read-only: one line naming the file
        raise TrainingError(f"{err.filename or out}: {err.strerror or err}") from err
    except RuntimeError as err:
        if not (distributed_ and distributed.peer_failure(err)):
            raise
        first = str(err).strip().splitlines()[0][:300]
        raise TrainingError(
            f"rank {dist.get_rank()}: another rank failed or did not answer "
            f"within {config.dist_timeout:g} s ({first})"
        ) from err
    finally:
        if own_group:
            dist.destroy_process_group()


def _checked(run: Run, replaced: list[str]) -> dict:
    """What ``--check`` found: the run that would start; nothing trained or written."""
    loader, ds = run.loader, run.loader.dataset
    return {
        "checked": True,
        "config": asdict(run.config),
        "device": str(loader.device),
        "transfer": loader.transfer,
        "train_samples": len(ds),
        "test_samples": len(run.test_loader.dataset),
        "image_shape": list(ds.image_shape),
        "classes": ds.num_classes,
        "steps_per_epoch": len(loader),
        "resume_from": str(run.resumed_from) if run.resumed_from else None,
        "start_step": run.progress.step,
        "replaces": replaced,
        "rank": loader.rank,
        "world_size": loader.world_size,
    }


def _train(run: Run) -> dict:
    config, loader, progress = run.config, run.loader, run.progress
    device, world, out = loader.device, loader.world_size, Path(config.output_dir)
    lap = _stopwatch(device)
    todo = loader.epoch < config.epochs  # a resumed run that had finished trains nothing
    for part in (loader, run.test_loader) if todo else ():
        part.start()  # resident: the dataset goes to the device here, before the clock
    run.startup["upload"] = lap()
    net = (
        DistributedDataParallel(
            run.model, device_ids=[device.index] if device.type == "cuda" else None
        )
        if run.distributed
        else run.model
    )
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes: autotune once, in the warm-up
    loss_fn = compiled(loss_of, device, config.graph) if config.compile else loss_of
    step = partial(train_step, net, run.opt, run.sched, config=config, loss_fn=loss_fn)
    if config.graph and todo:  # warms up on construction, captures below
        step = graphed.GraphedStep(run.model, run.opt, run.sched, loader, loss_fn, config)
    elif (device.type == "cuda" or config.compile) and todo:
        warm_up(net, loader, config, loss_fn)
    run.startup["warm_up"] = lap()  # compilation and cuDNN autotuning included
    if config.graph and todo:
        step.capture()
        run.startup["capture"] = lap()
    last_good = (
        f"last good checkpoint: {run.resumed_from} (step {progress.step})"
        if run.resumed_from
        else "no checkpoint saved yet"
    )
    if run.lead:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(
            json.dumps(
                {
                    **asdict(config),
                    "world_size": world,
                    "transfer": loader.transfer,
                    "device": str(loader.device),
                },
                indent=2,
            )
        )
        # Rebuilt from the checkpoint's history on resume: no duplicate or missing epochs.
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in progress.history))
        if run.resumed_from:
            print(
                f"resuming from {run.resumed_from}: epoch {loader.epoch + 1}, "
                f"batch {loader.position} of {len(loader)}, step {progress.step}",
                flush=True,
            )

    show = run.lead and config.progress and sys.stdout.isatty()
    samples, evaluated = 0, 0  # for the float32 byte comparison
    outside, final_eval = {"eval": 0.0, "save": 0.0}, 0.0  # seconds off the clock
    accuracy = progress.history[-1]["test_accuracy"] if progress.history else float("nan")
    for epoch in range(loader.epoch, config.epochs):
        loader.set_epoch(epoch)  # on resume the same epoch: the position is kept
        t0 = time.perf_counter()
        # A mid-epoch checkpoint carries the loss summed so far in its epoch.
        losses = LossTracker(device, run.distributed, progress.epoch_loss_sum, progress.epoch_seen)
        batches = loader.staged() if config.graph else loader  # staged: the graph fills
        bar = _progress(batches, len(loader), f"epoch {epoch + 1}/{config.epochs}", show)
        for images, labels in bar:
            loss = step(images, labels)
            progress.step, samples = progress.step + 1, samples + len(labels)
            losses.add(loss, progress.step)
            if progress.step % config.log_every == 0:
                epoch_loss = losses.mean(last_good)
                if show:
                    bar.set_postfix(loss=f"{epoch_loss:.4f}")
            if (
                config.checkpoint_every
                and progress.step % config.checkpoint_every == 0
                and loader.epoch == epoch  # the last batch moved it on: the epoch's end saves
            ):
                losses.mean(last_good)  # never save a NaN
                progress.epoch_loss_sum, progress.epoch_seen = losses.sum.cpu(), losses.seen
                last_good = run.save(out / "checkpoint.pt")
        epoch_loss = losses.mean(last_good)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        epoch_seconds = time.perf_counter() - t0
        progress.train_seconds += epoch_seconds
        progress.epoch_loss_sum, progress.epoch_seen = torch.zeros(()), 0
        t0 = time.perf_counter()
        accuracy = _accuracy(run)  # ends in a host sync
        final_eval = time.perf_counter() - t0  # the last one is the final evaluation
        outside["eval"] += final_eval
        evaluated += run.test_loader.num_samples
        progress.history.append(
            {
                "epoch": epoch + 1,
                "step": progress.step,
                "train_loss": epoch_loss,
                "test_accuracy": accuracy,
                "epoch_seconds": epoch_seconds,
                "images_per_s": len(loader) * loader.batch_size * world / epoch_seconds,
            }
        )
        if run.lead:
            with (out / "metrics.jsonl").open("a") as metrics:
                metrics.write(json.dumps(progress.history[-1]) + "\n")
            print(
                f"epoch {epoch + 1}/{config.epochs}  loss {epoch_loss:.4f}  "
                f"test acc {accuracy:.4f}  {epoch_seconds:.1f} s",
                flush=True,
            )
        t0 = time.perf_counter()
        # best.pt first: a crash between the two saves redoes this epoch
        if accuracy > progress.best_accuracy:
            progress.best_accuracy = accuracy
            run.save(out / "best.pt")
        last_good = run.save(out / "checkpoint.pt")
        outside["save"] += time.perf_counter() - t0

    stats, test_stats = loader.stats, run.test_loader.stats
    summary = {
        "test_accuracy": accuracy,
        "train_seconds": progress.train_seconds,
        # the record clock: the steps (mid-epoch checkpoints included) + the final evaluation
        "clock_seconds": progress.train_seconds + final_eval,
        "final_eval_seconds": final_eval,
        # this process's, off the clock: every evaluation (the final one too) and the
        # epoch-end checkpoint writes
        "eval_seconds": outside["eval"],
        "save_seconds": outside["save"],
        "startup_seconds": sum(run.startup.values()),
        "startup": run.startup,
        "compile": config.compile,
        "graph": config.graph,
        "epochs": config.epochs,
        "transfer": loader.transfer,
        "decoder": stats.decoder,  # "" unless JPEG files were decoded
        "device": str(loader.device),
        "dataset": loader.dataset.name,
        "model": config.model,
        # bytes are this process's; float32 is what the same samples would have cost
        "h2d_bytes": stats.h2d_bytes + test_stats.h2d_bytes,
        "h2d_bytes_float32": float32_bytes(loader.dataset, samples + evaluated),
        "h2d_bytes_uint8": uint8_bytes(loader.dataset, samples + evaluated),
        "data_wait_seconds": stats.wait_seconds,
        "step": progress.step,
        "best_accuracy": progress.best_accuracy,
        "rank": loader.rank,
        "world_size": world,
        "output_dir": str(out),
    }
    if run.lead:
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _accuracy(run: Run) -> float:
    """Test accuracy over every rank's unpadded test share (docs/RELIABILITY.md row 24)."""
    distributed.sync_buffers(run.model, run.distributed)
    correct, total = evaluate(run.model, run.test_loader, run.config.amp)
    if run.distributed:
        both = torch.tensor([correct, total], dtype=torch.int64, device=run.loader.device)
        dist.all_reduce(both)
        correct, total = both.tolist()
    return correct / total


def warm_up(model: torch.nn.Module, loader: Loader, config: TrainConfig, loss_fn=loss_of) -> None:
    """One ``loss_fn`` forward and backward on a zero batch of the training shape before the
    clock starts, then weights and BatchNorm statistics put back exactly: CUDA's one-time
    costs (cuBLAS/cuDNN handles, kernel loading, cuDNN autotuning: about a second on the
    H200) and ``torch.compile``'s compilation are start-up, not training."""
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    h, w, c = loader.dataset.image_shape
    fmt = torch.channels_last if loader.channels_last else torch.contiguous_format
    x = torch.zeros(loader.batch_size, c, h, w, dtype=loader.dtype, device=loader.device)
    y = torch.zeros(loader.batch_size, dtype=torch.int64, device=loader.device)
    if loader.prepare.mix is not None:  # mixed labels: class probabilities, as in training
        y = torch.zeros(loader.batch_size, loader.dataset.num_classes, device=loader.device)
    x = x.contiguous(memory_format=fmt)  # as the static batch: same shape, dtype and strides
    loss_fn(model, x, y, config.label_smoothing, config.amp).backward()
    model.zero_grad(set_to_none=True)
    model.load_state_dict(saved)
    if loader.device.type == "cuda":
        torch.cuda.synchronize(loader.device)


def _stopwatch(device: torch.device):
    """``lap()``: seconds since the previous lap (or the start), queued device work included."""
    last = [time.perf_counter()]

    def lap() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        now = time.perf_counter()
        seconds, last[0] = now - last[0], now
        return seconds

    return lap


def _progress(batches: Iterable[Batch], total: int, desc: str, show: bool):
    """A tqdm bar over ``batches`` on a terminal; else the batches themselves (tqdm is
    imported only here, so batch jobs and minimal environments run without it)."""
    if not show:
        return batches
    from tqdm import tqdm

    return tqdm(batches, total=total, desc=desc, leave=False)
