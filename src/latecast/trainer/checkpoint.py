"""Checkpoints: plain dicts holding all an exact resume needs (model unwrapped from DDP,
optimizer, scheduler, step, the loader's position, RNG states, config, history), written
atomically and read with ``weights_only=True``: plain data only."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from ..data import Dataset
from ..errors import CheckpointError, LatecastError
from ..kinds.jpegfiles import EncodedDataset
from ..storage.fileio import atomic_write
from . import stops

FORMAT = "latecast-checkpoint"
VERSION = 1
_REQUIRED = tuple(
    "model optimizer scheduler step loader rng config world_size data_fingerprint".split()
)

# TrainConfig fields (plus world_size) that must match to continue a run: they decide
# which samples are seen in which order and what each step computes. The rest (device,
# transfer, output_dir, logging, timeouts) may change between the two halves of a run.
# data_fingerprint: fingerprint() of the training split: other data, another run (the
# dataset's name is not compared: a store as st/, ./st or its absolute path is one store).
RUN_FIELDS = tuple(
    "limit_train model epochs batch_size lr momentum weight_decay label_smoothing "
    "augment mix amp channels_last seed shuffle_buffer world_size data_fingerprint".split()
)


def fingerprint(ds: Dataset | EncodedDataset, samples: int = 64) -> str:
    """What identifies a split's content, as 16 hex digits, equal on every process and
    machine: its shapes, mean/std, every label (a JPEG store: every file's offset) and its
    images' SHA-256 recorded when written (``ds.digest``), else (in-memory data) ``samples``
    images spread evenly over it."""
    n = len(ds)
    picks = sorted({i * (n - 1) // max(samples - 1, 1) for i in range(min(samples, n))})
    h = hashlib.sha256(repr([len(ds), ds.image_shape, *map(float, (*ds.mean, *ds.std))]).encode())
    h.update(ds.labels.astype(ds.labels.dtype.newbyteorder("<")).tobytes())
    if isinstance(ds, EncodedDataset):
        h.update(ds.offsets.astype("<i8").tobytes())
    if ds.digest:
        h.update(ds.digest.encode())
    elif isinstance(ds, EncodedDataset):
        for i in picks:
            h.update(ds.data[ds.offsets[i] : ds.offsets[i + 1]].tobytes())
    else:
        h.update(np.ascontiguousarray(ds.images[picks]).tobytes())
    return h.hexdigest()[:16]


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """``state`` (plain dict) to ``path`` atomically, tagged with the format version; a failed
    write is a ``CheckpointError`` naming ``path``, the previous file kept."""
    try:
        with atomic_write(path) as f:
            f = stops.watched(f, "checkpoint-write")  # (a test's point inside the write)
            torch.save({"format": FORMAT, "version": VERSION, **state}, f)
    except (OSError, RuntimeError) as err:
        cause = err if isinstance(err, OSError) else err.__context__  # torch wraps ENOSPC, Ctrl-C
        if isinstance(cause, KeyboardInterrupt):
            raise cause from None
        if not isinstance(cause, OSError):
            raise
        raise CheckpointError(
            f"{path}: not saved ({cause.strerror or cause}); the previous one is kept"
        ) from err


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Read a checkpoint written by ``save_checkpoint``; ``CheckpointError`` naming the file
    if it is missing, truncated, corrupt, not plain data, or not a latecast checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # zip, pickle and unpickler-allowlist errors all land here
        raise CheckpointError(f"{path}: not a readable checkpoint ({_why(err)})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a latecast checkpoint (no '{FORMAT}' format tag)")
    if state.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {state.get('version')!r}, "
            f"this latecast reads version {VERSION}"
        )
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {', '.join(missing)}")
    return state


def _why(err: Exception) -> str:
    """torch's reason in one line, without its advice to load with ``weights_only=False``:
    that would run code from a file nobody vouched for."""
    text = str(err).strip()
    if re.search("weights.only", text, re.IGNORECASE):
        found = re.search(r"GLOBAL (\S+)", text)
        what = f" such as {found.group(1)}" if found else ""
        return f"it holds Python objects{what}, which could run code: only plain data is loaded"
    return text.splitlines()[0] if text else type(err).__name__


def is_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a latecast checkpoint (tensors are mapped, not read)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # anything unreadable is not one
        return False
    return isinstance(state, dict) and state.get("format") == FORMAT


def resume_path(resume: str | None, latest: Path, say: bool = True) -> Path | None:
    """``resume``, or for ``"auto"`` ``latest`` when it exists (else None, said when ``say``)."""
    if resume is None:
        return None
    if resume != "auto":
        return Path(resume)
    if latest.is_file():
        return latest
    if say:
        print(f"--resume auto: no {latest} yet; starting fresh", flush=True)
    return None


@dataclass
class Progress:
    """Where a run stands, beyond its model and optimizer: saved in every checkpoint."""

    step: int = 0
    history: list[dict] = field(default_factory=list)  # one row per finished epoch
    best_accuracy: float = -1.0
    train_seconds: float = 0.0
    epoch_loss_sum: torch.Tensor = field(default_factory=lambda: torch.zeros(()))  # mid-epoch
    epoch_seen: int = 0  # steps summed into epoch_loss_sum


def save(path: str | os.PathLike, parts: dict, progress: Progress, config: dict, data: str):
    """Checkpoint a run: the mirror of ``restore``, the one place the schema is written.
    ``parts``: ``model``, ``optimizer``, ``scheduler`` and ``loader``, by their state dicts (the
    loader's epoch and world size saved too); ``data``: the training split's ``fingerprint``."""
    loader, state = parts["loader"], {name: part.state_dict() for name, part in parts.items()}
    state.update({f.name: getattr(progress, f.name) for f in fields(Progress)})
    state.update(epoch=loader.epoch, rng=rng_state(), config=config, world_size=loader.world_size)
    save_checkpoint(path, {**state, "data_fingerprint": data})


def restore(path: Path, run: dict, parts: dict) -> Progress:
    """The checkpoint at ``path`` loaded into ``parts`` once it is of the same run (``run``: the
    config, ``world_size``, ``data_fingerprint``: each of ``RUN_FIELDS`` that differs is named);
    its progress."""
    state = load_checkpoint(path)
    saved = {**state["config"], **{k: state[k] for k in ("world_size", "data_fingerprint")}}
    if run.get("elastic"):  # a stream: what is left of the epoch is split again
        saved["world_size"] = run["world_size"]
    differ = [k for k in RUN_FIELDS if saved.get(k) != run.get(k)]
    if differ:
        said = "; ".join(
            f"{k} {saved.get(k)!r} (checkpoint) != {run.get(k)!r} (now)" for k in differ
        )
        raise CheckpointError(f"{path}: cannot resume, the run differs: {said}")
    try:  # a checkpoint edited by hand
        for name, part in parts.items():
            part.load_state_dict(state[name])
        set_rng_state(state["rng"])
        return Progress(**{f.name: state[f.name] for f in fields(Progress)})
    except (RuntimeError, ValueError, KeyError, TypeError, LatecastError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path}: does not fit this run ({first})") from None


def rng_state() -> dict:
    """CPU and (when in use) every CUDA device's generator state, as tensors."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what ``rng_state`` saved; CUDA's only where there are as many devices."""
    torch.set_rng_state(state["cpu"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
