"""Training: one readable loop over a latecast ``Loader``, evaluation, checkpoints, DDP.

``train(TrainConfig(...))`` is ``latecast train``; ``train_step`` and ``evaluate`` serve
``bench`` and ``profile`` too. Static batches (one shape: ``--compile``, ``--graph``).
``clock_seconds``: first step to the end of the final evaluation, start-up beside it. Under
``torchrun`` each process trains a DDP copy on its share; rank 0 alone writes."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from .. import distributed
from ..data import Batch, Dataset
from ..errors import CheckpointError, ConfigError, TrainingError
from ..fields import Image, labels_field
from ..kinds.jpeg import JpegStore
from ..kinds.jpegfiles import EncodedDataset
from ..loader import IGNORE, Loader
from ..movers import MOVERS
from ..order import parse_order
from ..storage.datasets import load_dataset
from ..storage.options import DATASET_HELP, option, validate
from ..storage.shards import nothing_written
from ..storage.stream import StreamedDataset
from ..transfer import float32_bytes, uint8_bytes
from ..transforms import Augment, Mix
from . import checkpoint, graphed, group, rundir, stops
from .baseline import Float32, transfers
from .checkpoint import fingerprint
from .models import MODELS, build_model

_PRESET = " (default: the preset's)"
_PRESET_HELP = (
    "gray (28x28 digits: cnn), colour (32x32 RGB: ResNet-9) or photo (larger: ResNet-9, "
    "resized crops); default: by image"
)

# Defaults by kind of image: "gray" (28x28: the small cnn, 99% on MNIST in 3 epochs),
# "colour" (32x32 RGB: the DAWNBench CIFAR-10 ResNet-9 recipe), "photo" (larger: a starting
# point, untuned). channels_last everywhere (benchmarks/RESULTS.md: 2x on the CPU cnn).
_PRESET_KEYS = ("model", "epochs", "batch_size", "lr", "label_smoothing", "augment", "amp")
PRESETS: dict[str, dict] = {
    name: {**dict(zip(_PRESET_KEYS, values)), "channels_last": True}
    for name, values in {
        "gray": ("cnn", 3, 128, 0.1, 0.0, "", False),
        "colour": ("resnet9", 16, 512, 0.4, 0.2, "crop=4,flip,cutout=8,fill=reflect", True),
        "photo": ("resnet9", 16, 256, 0.2, 0.1, "resized_crop=0.35,flip", True),
    }.items()
}
_PRESET_SIZE = 32  # gray and colour are tuned on images up to 32x32; larger ones: photo

NAMES = [Float32.name, *MOVERS, JpegStore.name, "auto"]  # --transfer


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
    shuffle_buffer: int = option(
        1024, "shards: samples shuffled together (JPEG files a process holds)", low=1
    )
    amp: bool | None = option(None, f"bf16 autocast, CUDA only{_PRESET}")
    channels_last: bool | None = option(None, f"NHWC images and model{_PRESET}")
    momentum: float = option(0.9, "Nesterov momentum (0: plain SGD)", low=0)
    weight_decay: float = option(5e-4, "L2 on all parameters", low=0)
    transfer: str = option("auto", "|".join(NAMES), choices=NAMES)
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
        validate(self)  # one line naming the field and the value
        parse_order(self.order)  # a bad --order: one line, before any data is read
        if self.overwrite and self.resume is not None:
            raise ConfigError("overwrite starts a new run, resume continues one: give one")


def resolve_config(config: TrainConfig, train_set: Dataset, device: torch.device) -> TrainConfig:
    """The fields left at None filled from the preset (default: by ``train_set``'s images);
    bf16 autocast only on CUDA."""
    h, w, c = train_set.image_shape
    if config.preset is None and c not in (1, 3):
        raise ConfigError(
            f"{config.dataset}: no preset fits {h}x{w}x{c} images (they are made for 1 or 3 "
            f"channels); choose one with --preset {'|'.join(PRESETS)} and set what differs "
            f"(--model, --batch-size, --lr, ...)"
        )
    by_image = "photo" if max(h, w) > _PRESET_SIZE else "gray" if c == 1 else "colour"
    preset = config.preset or by_image
    values = {**PRESETS[preset], **({} if device.type == "cuda" else {"amp": False})}
    unset = {k: v for k, v in values.items() if getattr(config, k) is None}
    return replace(config, preset=preset, **unset)


def load_splits(config: TrainConfig) -> tuple[Dataset, Dataset]:
    """The train and test splits named by ``config.dataset``, cut to the ``limit_*`` fields."""
    stops.at("data")
    # --check writes nothing: shards without an index are indexed in memory only
    with nothing_written() if config.check else contextlib.nullcontext():
        train_set = load_dataset(config.dataset, "train", root=config.data_root)
        test_set = load_dataset(config.dataset, "test", root=config.data_root)
    if isinstance(train_set, StreamedDataset):
        train_set = replace(train_set, buffer=config.shuffle_buffer)
    return _first(train_set, config.limit_train), _first(test_set, config.limit_test)


def _first(ds: Dataset | EncodedDataset, n: int | None) -> Dataset | EncodedDataset:
    """The first ``n`` samples (every per-sample array cut); mean/std and the digest stay
    the whole split's."""
    if n is None or n >= len(ds):
        return ds
    if isinstance(ds, StreamedDataset):
        return ds.first(n)
    rows = {f.name: getattr(ds, f.name) for f in fields(ds)}
    cut = {k: v[:n] for k, v in rows.items() if isinstance(v, np.ndarray) and len(v) == len(ds)}
    if isinstance(ds, EncodedDataset):  # its files by their offsets (data's length is bytes)
        cut.update(data=ds.data[: ds.offsets[n]], offsets=ds.offsets[: n + 1])
    return replace(ds, **cut)


def model_and_optimizer(
    config: TrainConfig, train_set: Dataset, device: torch.device, steps_per_epoch: int
):
    """The model on ``device``; SGD (Nesterov) under a one-cycle schedule over the run."""
    h, w, c = train_set.image_shape
    model = build_model(config.model, (c, h, w), train_set.num_classes).to(device)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    nesterov = config.momentum > 0  # torch refuses Nesterov without momentum
    settings = dict(lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    opt = torch.optim.SGD(model.parameters(), nesterov=nesterov, **settings)
    return model, opt, one_cycle(opt, config.epochs * steps_per_epoch)


def recipe(config: TrainConfig, train_set: Dataset, device: torch.device, steps_per_epoch: int):
    """``latecast train``'s recipe for ``bench`` and ``profile``: ``(config, model, opt,
    sched)``, ``config`` resolved for ``train_set``, the model seeded by ``config.seed``."""
    config = resolve_config(config, train_set, device)
    torch.manual_seed(config.seed)
    return (config, *model_and_optimizer(config, train_set, device, steps_per_epoch))


def one_cycle(
    opt: torch.optim.Optimizer, total_steps: int, warmup: float = 0.25, start: float = 0.04
) -> torch.optim.lr_scheduler.LambdaLR:
    """Triangular one-cycle: linear from ``start`` x lr up to lr over the first ``warmup`` of
    the steps, then down to 0; defined for any length (``OneCycleLR`` is not)."""
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


def loss_of(model: nn.Module, images: Tensor, labels: Tensor, smooth: float, amp: bool) -> Tensor:
    """The batch's loss: forward (bf16 autocast when ``amp``), cross-entropy with label smoothing
    ``smooth`` (labels ``IGNORE`` count nowhere). ``--compile`` compiles it whole."""
    with _autocast(images.device, amp):
        return F.cross_entropy(model(images), labels, label_smoothing=smooth)


def train_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    images: torch.Tensor,
    labels: torch.Tensor,
    config: TrainConfig,
    loss_fn=loss_of,
) -> torch.Tensor:
    """One step of ``config``'s (resolved) recipe; the loss, detached, on the device."""
    loss = loss_fn(model, images, labels, config.label_smoothing, config.amp)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
    return loss.detach()


def evaluate(model: nn.Module, batches: Iterable[Batch], amp: bool = False) -> tuple[int, int]:
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
    return (0, 0) if counts is None else tuple(counts.tolist())  # .tolist() syncs


class LossTracker:
    """An epoch's training loss from ``loss_sum`` over ``seen`` steps on, summed on the device;
    a loss that is not finite stops the run naming its step. ``mean`` is collective
    under DDP: all ranks stop together."""

    def __init__(self, device, distributed: bool, loss_sum: Tensor, seen: int) -> None:
        self.sum, self.seen, self.distributed = loss_sum.to(device), seen, distributed
        self.first_bad = torch.full((), math.inf, dtype=torch.float64, device=device)

    def add(self, loss: torch.Tensor, step: int) -> None:
        bad = self.first_bad
        self.first_bad = torch.where(torch.isfinite(loss), bad, bad.clamp(max=step))
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
    """Everything a training run holds, set up once by ``_set_up``, and what it counts: this
    process's samples and the seconds kept off the record clock."""

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
    last_good: str = "no checkpoint saved yet"  # named when the loss goes NaN
    kept: Callable[[], None] = lambda: None  # rundir.claim's: after each checkpoint.pt save
    samples: int = 0  # trained, for the float32/uint8 byte comparison
    evaluated: int = 0
    eval_seconds: float = 0.0  # every evaluation, the final one too
    save_seconds: float = 0.0  # the epoch-end checkpoint writes
    final_eval: float = 0.0  # the last evaluation: on the clock

    @property
    def lead(self) -> bool:  # rank 0: logs, progress bar, metrics and checkpoints
        return self.loader.rank == 0

    @property
    def parts(self) -> dict:  # what a checkpoint holds the state of
        return dict(model=self.model, optimizer=self.opt, scheduler=self.sched, loader=self.loader)

    def save(self, name: str) -> None:
        """Checkpoint ``OUTPUT_DIR/name`` (collective: BatchNorm statistics first; rank 0
        writes); ``checkpoint.pt`` is then the last good one."""
        group.sync_buffers(self.model, self.distributed)
        path = Path(self.config.output_dir) / name
        if self.lead:
            checkpoint.save(
                path, self.parts, self.progress, asdict(self.config), self.data_fingerprint
            )
        if name == "checkpoint.pt":
            stops.at("checkpoint")
            self.last_good = f"last good checkpoint: {path} (step {self.progress.step})"
            self.kept()


def _set_up(config: TrainConfig, device: torch.device, distributed_: bool) -> Run:
    """Data (the same on every rank), resolved config, loaders, model, optimizer, resume."""
    _, rank, world = distributed.placement(device)
    torch.manual_seed(config.seed)
    train_set, test_set = load_splits(config)
    if distributed_:
        _check_same_data(train_set, test_set, device)
    asked_batch = config.batch_size
    c = config = resolve_config(config, train_set, device)
    share = math.ceil(len(train_set) / world)
    if asked_batch is None and c.batch_size > share:  # a small subset: one full batch an epoch
        c = config = replace(config, batch_size=share)
    _check_fits(config, train_set, test_set, share)
    dtype = torch.bfloat16 if c.amp else torch.float32
    streamed = isinstance(train_set, StreamedDataset)  # short last batches, no static ones
    transfer = transfers(train_set).get(c.transfer, c.transfer)  # float32: the baseline's
    shared = dict(
        device=device, transfer=transfer, dtype=dtype, channels_last=c.channels_last,
        static=not streamed,
    )  # fmt: skip
    mix = Mix.parse(c.mix, train_set.num_classes)
    own = dict(seed=c.seed, augment=Augment.parse(c.augment), order=c.order, mix=mix)
    loader = Loader(train_set, c.batch_size, **own, **shared)
    eval_batch = min(c.eval_batch_size, len(test_set))  # a larger one is the same single batch
    test_loader = Loader(test_set, eval_batch, shuffle=False, pad=False, **shared)
    if c.graph:
        _check_graph(c, loader, distributed_)
    _rehearse(loader)
    _, model, opt, sched = recipe(config, train_set, device, len(loader))
    out = Path(config.output_dir)
    resumed_from = checkpoint.resume_path(config.resume, out / "checkpoint.pt", say=rank == 0)
    data = fingerprint(train_set)
    run = Run(config, distributed_, loader, test_loader, model, opt, sched, resumed_from, data)
    if resumed_from:
        identity = {**asdict(config), "world_size": world, "data_fingerprint": data}
        identity["elastic"] = streamed  # a stream's plan re-splits what is left of an epoch
        run.progress = checkpoint.restore(resumed_from, identity, run.parts)
        run.last_good = f"last good checkpoint: {resumed_from} (step {run.progress.step})"
    if distributed_:
        _check_same_start(run.progress.step if resumed_from else -1, device)
    return run


def _check_fits(config: TrainConfig, train_set: Dataset, test_set: Dataset, share: int) -> None:
    """Refuse before the first step: splits of different shapes or classes, a batch larger
    than ``share`` (a process's training samples), a model deeper than the images allow."""
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
    batch = config.batch_size
    if batch > share:  # static batches: every step takes a full one
        raise ConfigError(
            f"batch_size {batch} is larger than the {share} training samples each "
            f"process has (every step takes a full batch); choose --batch-size {share} or less"
        )
    h, w, c = train_set.image_shape
    try:  # static batches: every one full
        with torch.device("meta"):  # shapes only: nothing allocated, no random draws
            MODELS[config.model]((c, h, w), num_classes)(torch.zeros(batch, c, h, w))
    except (RuntimeError, ValueError) as err:
        raise ConfigError(
            f"model {config.model} cannot train on {h}x{w}x{c} images in batches of "
            f"{batch} ({str(err).strip().splitlines()[0]}); choose another --model"
        ) from None


def _check_graph(config: TrainConfig, loader: Loader, distributed_: bool) -> None:
    """What ``--graph`` needs: one process on CUDA, the resident mover, device work only."""
    if loader.device.type != "cuda" or distributed_:
        raise ConfigError(
            f"--graph captures the training step in a CUDA graph: it needs one process on a "
            f"CUDA device, and this run is on {loader.device}"
            + (f" with {loader.world_size} processes" if distributed_ else "")
        )
    if loader.transfer != "resident":
        raise ConfigError(
            f"--graph needs the resident transfer (the whole step on the device), this run "
            f"would use {loader.transfer}"
        )
    aug = loader.augment
    if loader.prepare.mix is not None or (aug is not None and not aug.capturable):
        raise ConfigError(
            "--graph captures device work only: drop --mix and the augmentations drawn on the "
            f"host (resized_crop, altflip); got --augment {config.augment!r} --mix {config.mix!r}"
        )


def _rehearse(loader: Loader) -> None:
    """The first step's data path in miniature (the epoch's order, then two blank samples of
    the dataset's fields finished: a JPEG store's as decoded pixels), so what it cannot do
    fails in set-up and under ``--check``; no draw moves (each batch seeds its own)."""
    loader.index_batches()
    ds, dev = loader.dataset, loader.device
    n = min(2, len(ds))
    plans = ds.fields(n) if isinstance(ds, Dataset) else [
        Image(0, torch.uint8, (n, *ds.image_shape)), labels_field(ds.labels, n)
    ]  # fmt: skip
    values = [f.view(torch.zeros(f.nbytes, dtype=torch.uint8, device=dev), dev) for f in plans]
    loader.prepare(plans, values, (0, 0, 0), dev, torch.arange(n))


def _check_same_data(train_set: Dataset, test_set: Dataset, device: torch.device) -> None:
    """Every rank must hold the same data (sizes and label sums compared)."""
    sums = [int(s.labels.sum(dtype=np.int64)) for s in (train_set, test_set)]
    rows = group.gather([len(train_set), len(test_set), *sums], device)
    if any(r != rows[0] for r in rows):
        raise ConfigError(
            "ranks hold different data ([train size, test size, train label "
            "sum, test label sum]): " + "; ".join(f"rank {i} {r}" for i, r in enumerate(rows))
        )


def _check_same_start(step: int, device: torch.device) -> None:
    """Every rank must continue from the same step (-1: fresh start)."""
    steps = [r[0] for r in group.gather([step], device)]
    if len(set(steps)) > 1:
        raise CheckpointError(
            f"ranks would start from different steps {steps} (-1: no checkpoint found); with "
            f"several machines the checkpoint folder must be one every machine can read"
        )


# -- the loop ------------------------------------------------------------------------------


def train(config: TrainConfig) -> dict:
    """Train ``config.model`` on ``config.dataset``; the summary (also saved as JSON). Under
    ``torchrun`` this process trains its share; the process group is destroyed on the way out.

    Example:
        >>> summary = train(TrainConfig(model="mlp", epochs=1, output_dir="runs/mlp"))
        >>> summary["test_accuracy"]  # about 0.97
    """
    if config.epochs == 0:  # allowed in a TrainConfig: bench's recipe skips its runs with it
        raise ConfigError("epochs 0 trains nothing: give --epochs 1 or more")
    device, distributed_, own_group = group.start(config.device, config.dist_timeout)
    lead = distributed.placement(device)[1] == 0  # rank 0 alone writes the output folder
    out, asked = config.output_dir, (config.output_dir, config.resume, config.overwrite)
    try:
        replaced = rundir.check(*asked) if lead and config.check else []  # writes nothing
        # A run holds its folder before any data loads; --overwrite moves the
        # previous run aside until this one's first checkpoint.
        holds = lead and not config.check
        with rundir.claim(*asked) if holds else contextlib.nullcontext(lambda: None) as kept:
            t0 = time.perf_counter()
            run = _set_up(config, device, distributed_)
            run.startup["set_up"] = time.perf_counter() - t0  # data loaded, model built
            if config.check:
                return _checked(run, replaced)
            run.kept = kept
            return _train(run)
    except OSError as err:  # a full disk, a folder gone read-only: one line naming the file
        raise TrainingError(f"{err.filename or out}: {err.strerror or err}") from err
    except RuntimeError as err:
        if not (distributed_ and group.peer_failure(err)):
            raise
        first = str(err).strip().splitlines()[0][:300]
        raise TrainingError(
            f"rank {dist.get_rank()}: another rank failed or did not answer "
            f"within {config.dist_timeout:g} s ({first})"
        ) from err
    finally:
        if own_group:
            run = None  # its DDP model holds the group: freed with it, while Python runs
            group.end()


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
    """Start-up (off the clock), then per epoch train, evaluate, record, save; the summary."""
    step, batches = _start(run)
    if run.lead:
        _begin(run)
    for epoch in range(run.loader.epoch, run.config.epochs):
        loss, seconds = _epoch(run, step, batches, epoch)
        accuracy = _evaluate(run)
        _record(run, epoch, loss, accuracy, seconds)
        _save(run, accuracy)
    summary = _summary(run)
    if run.lead:
        rundir.write(run.config.output_dir, "summary.json", summary)
    return summary


def _start(run: Run) -> tuple[Callable, Callable[[], Iterable[Batch]]]:
    """Start-up, timed apart (upload, DDP, compile or capture, warm-up); the step and the
    epoch's batches (``--graph``: staged only, the graph fills them)."""
    config, loader, device = run.config, run.loader, run.loader.device
    lap, todo = stopwatch(device), loader.epoch < config.epochs  # finished: nothing to do
    for part in (loader, run.test_loader) if todo else ():
        part.start()  # resident: the dataset goes to the device here, before the clock
    run.startup["upload"] = lap()
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes: autotune once, in the warm-up
    # reduce-overhead: inductor's CUDA graphs, unless --graph captures the whole step
    mode = "reduce-overhead" if device.type == "cuda" and not config.graph else None
    loss_fn = torch.compile(loss_of, mode=mode) if config.compile else loss_of
    if config.graph and todo:
        step = graphed.GraphedStep(run.model, run.opt, run.sched, loader, loss_fn, config)
        run.startup["warm_up"] = lap()  # on construction
        step.capture()
        run.startup["capture"] = lap()
        return step, loader.staged
    net = run.model
    if run.distributed:
        ids = [device.index] if device.type == "cuda" else None
        net = DistributedDataParallel(net, device_ids=ids)
    if (device.type == "cuda" or config.compile) and todo:
        warm_up(net, loader, config, loss_fn)
    run.startup["warm_up"] = lap()  # compilation and cuDNN autotuning included
    step = partial(train_step, net, run.opt, run.sched, config=config, loss_fn=loss_fn)
    return step, lambda: loader


def _begin(run: Run) -> None:
    """Rank 0: the run's config and its history so far in its folder; where it resumes."""
    loader, out = run.loader, run.config.output_dir
    where = {"world_size": loader.world_size, "transfer": loader.transfer}
    rundir.write(out, "config.json", {**asdict(run.config), **where, "device": str(loader.device)})
    rundir.write(out, "metrics.jsonl", run.progress.history)
    stops.at("config")
    if run.resumed_from:
        at = f"epoch {loader.epoch + 1}, batch {loader.position} of {len(loader)}"
        print(f"resuming from {run.resumed_from}: {at}, step {run.progress.step}", flush=True)


def _epoch(run: Run, step: Callable, batches, epoch: int) -> tuple[float, float]:
    """One epoch's steps (from the saved position); its mean loss and seconds."""
    config, loader, progress = run.config, run.loader, run.progress
    loader.set_epoch(epoch)  # on resume the same epoch: the position is kept
    clock = stopwatch(loader.device)
    so_far = progress.epoch_loss_sum, progress.epoch_seen  # a mid-epoch checkpoint's
    losses = LossTracker(loader.device, run.distributed, *so_far)
    bar, show = batches(), run.lead and config.progress and sys.stdout.isatty()
    if show:  # (tqdm imported only then)
        from tqdm import tqdm

        bar = tqdm(bar, total=len(loader), desc=f"epoch {epoch + 1}/{config.epochs}", leave=False)
    for images, labels in bar:
        stops.at("step")
        loss = step(images, labels)
        progress.step, run.samples = progress.step + 1, run.samples + len(labels)
        losses.add(loss, progress.step)
        if progress.step % config.log_every == 0:
            epoch_loss = losses.mean(run.last_good)
            if show:
                bar.set_postfix(loss=f"{epoch_loss:.4f}")
        every = config.checkpoint_every  # (after the last batch, the epoch's end saves)
        if every and progress.step % every == 0 and loader.epoch == epoch:
            losses.mean(run.last_good)  # never save a NaN
            progress.epoch_loss_sum, progress.epoch_seen = losses.sum.cpu(), losses.seen
            run.save("checkpoint.pt")
    epoch_loss = losses.mean(run.last_good)
    seconds = clock()
    progress.train_seconds += seconds
    progress.epoch_loss_sum, progress.epoch_seen = torch.zeros(()), 0
    return epoch_loss, seconds


def _evaluate(run: Run) -> float:
    """Test accuracy over every rank's unpadded test share, timed."""
    stops.at("evaluate")
    t0 = time.perf_counter()
    group.sync_buffers(run.model, run.distributed)
    correct, total = evaluate(run.model, run.test_loader, run.config.amp)  # ends in a sync
    if run.distributed:
        both = torch.tensor([correct, total], dtype=torch.int64, device=run.loader.device)
        dist.all_reduce(both)
        correct, total = both.tolist()
    run.final_eval = time.perf_counter() - t0
    run.eval_seconds += run.final_eval
    run.evaluated += run.test_loader.num_samples
    return correct / total


def _record(run: Run, epoch: int, loss: float, accuracy: float, seconds: float) -> None:
    """The epoch's row in the history, ``metrics.jsonl`` and stdout (rank 0)."""
    config, loader = run.config, run.loader
    rate = len(loader) * loader.batch_size * loader.world_size / seconds  # images/s
    row = dict(epoch=epoch + 1, step=run.progress.step, train_loss=loss, test_accuracy=accuracy)
    run.progress.history.append({**row, "epoch_seconds": seconds, "images_per_s": rate})
    if run.lead:
        rundir.write(config.output_dir, "metrics.jsonl", run.progress.history)
        print(
            f"epoch {epoch + 1}/{config.epochs}  loss {loss:.4f}  "
            f"test acc {accuracy:.4f}  {seconds:.1f} s",
            flush=True,
        )


def _save(run: Run, accuracy: float) -> None:
    """The epoch's checkpoints, timed apart: best.pt first (a crash between redoes it)."""
    t0 = time.perf_counter()
    if accuracy > run.progress.best_accuracy:
        run.progress.best_accuracy = accuracy
        run.save("best.pt")
    run.save("checkpoint.pt")
    run.save_seconds += time.perf_counter() - t0


def _summary(run: Run) -> dict:
    """What the run did: accuracy, the record clock and what was kept off it, bytes moved."""
    config, loader, progress = run.config, run.loader, run.progress
    stats, test_stats = loader.stats, run.test_loader.stats
    samples = run.samples + run.evaluated
    return {
        "test_accuracy": progress.history[-1]["test_accuracy"] if progress.history else math.nan,
        "train_seconds": progress.train_seconds,
        "clock_seconds": progress.train_seconds + run.final_eval,
        "final_eval_seconds": run.final_eval,
        "eval_seconds": run.eval_seconds,
        "save_seconds": run.save_seconds,
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
        "h2d_bytes_float32": float32_bytes(loader.dataset, samples),
        "h2d_bytes_uint8": uint8_bytes(loader.dataset, samples),
        "data_wait_seconds": stats.wait_seconds,
        "step": progress.step,
        "best_accuracy": progress.best_accuracy,
        "rank": loader.rank,
        "world_size": loader.world_size,
        "output_dir": str(Path(config.output_dir)),
    }


def warm_up(model: torch.nn.Module, loader: Loader, config: TrainConfig, loss_fn=loss_of) -> None:
    """One ``loss_fn`` forward and backward on a zero batch of the training shape, weights
    and BatchNorm statistics put back exactly: CUDA's one-time costs and compilation are
    start-up, not training."""
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


def stopwatch(device: torch.device) -> Callable[[], float]:
    """``lap()``: seconds since the previous lap (or the start), each taken once ``device``'s
    queued work is done (the start too)."""
    times: list[float] = []

    def lap() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter())
        return times[-1] - times[-2] if len(times) > 1 else 0.0

    lap()
    return lap
