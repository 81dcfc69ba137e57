"""The compact on-disk store: uint8 ``.npy`` files opened as read-only memmaps.

A store is a folder with ``images.npy`` (uint8 ``(N, H, W, C)``), ``labels.npy`` (uint8,
or uint16 past 256 classes) and ``meta.json`` (schema version, name, split, count, shapes,
dtypes, file sizes and fingerprints, classes, mean/std, source). A converted image folder
with ``train/`` and ``test/`` (or ``val/``) holds one such store per split: ``out/train``,
``out/test``. Opening never reads the images: a store larger than memory is paged in as
the loader touches it.

Writes go through ``fileio.atomic_folder``: a crash (even ``kill -9``) leaves the previous
store or none, never half of one. Only a store is ever replaced, never a user's other data.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from .data import Dataset, check_labels
from .errors import ConfigError, FormatError
from .fileio import atomic_folder

SCHEMA = 1
IMAGES, LABELS, META, SKIPPED = "images.npy", "labels.npy", "meta.json", "skipped.txt"
CHUNK_BYTES = 64 << 20  # copy images in 64 MiB pieces, so a memmap source is never read whole
SPLIT_NAMES = ("train", "test", "val")


def _store_problem(folder: Path) -> str:
    """Why ``folder`` is not, verifiably, one split's store ("" when it is): its meta.json
    must parse with this schema and nothing but the store's own files may be in it."""
    try:
        read_meta(folder)
    except FormatError as e:
        return str(e)
    others = sorted(p.name for p in folder.iterdir() if p.name not in (IMAGES, LABELS, META))
    return f"{folder} also holds {others[:3]}, which latecast did not write" if others else ""


def _replace_problem(out: Path) -> str:
    """Why ``out`` may not be replaced ("" when it may): it must be an empty folder, a
    store, or a folder of split stores (plus the skipped-files list) and nothing else."""
    if not out.is_dir():
        return "it is not a folder"
    entries = [p for p in out.iterdir() if p.name != SKIPPED]
    if not entries and not (out / SKIPPED).exists():
        return ""
    if (out / META).exists() or not entries:
        return _store_problem(out)
    for p in entries:
        if p.name not in SPLIT_NAMES or not p.is_dir():
            return f"it holds {p.name!r}, which is not a split store latecast wrote"
        if why := _store_problem(p):
            return why
    return ""


def check_replaceable(out: Path) -> None:
    """Only a store (or an empty folder) may be replaced: never delete a user's other data."""
    if out.exists() and (why := _replace_problem(out)):
        raise ConfigError(
            f"{out} exists and is not a latecast store ({why}); refusing to "
            f"replace it: choose a new folder"
        )


def _fingerprint(path: Path) -> str:
    """SHA-256 of the size and the first and last MiB: catches a stale or swapped file
    without reading a store larger than memory (not a full checksum)."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(size - (1 << 20), 0))
        h.update(f.read())
    return h.hexdigest()


def finish_split(folder: Path, ds: Dataset, source: str) -> None:
    """Write labels.npy and meta.json next to an images.npy already written in ``folder``."""
    check_labels(ds.labels, ds.num_classes, f"{ds.name}/{ds.split}")
    np.save(folder / LABELS, np.ascontiguousarray(ds.labels), allow_pickle=False)
    files = {
        key: {
            "file": name,
            "shape": list(arr.shape),
            "dtype": arr.dtype.name,
            "bytes": (folder / name).stat().st_size,
            "sha256_head_tail": _fingerprint(folder / name),
        }
        for key, name, arr in (("images", IMAGES, ds.images), ("labels", LABELS, ds.labels))
    }
    meta = {
        "schema": SCHEMA,
        "name": ds.name,
        "split": ds.split,
        "count": len(ds),
        **files,
        "classes": list(ds.classes),
        "mean": list(ds.mean),
        "std": list(ds.std),
        "source": source,
    }
    (folder / META).write_text(json.dumps(meta, indent=1) + "\n")


def empty_images(folder: Path, shape: tuple[int, ...]) -> np.memmap:
    """A new uint8 ``images.npy`` of ``shape`` in ``folder``, mapped for writing."""
    if shape[0] == 0:
        raise FormatError(f"{folder.name}: refusing to write a store with no images")
    return np.lib.format.open_memmap(folder / IMAGES, mode="w+", dtype=np.uint8, shape=shape)


def write_store(dataset: Dataset, out: str | os.PathLike, *, source: str = "") -> Path:
    """Write ``dataset`` as a store folder at ``out``, atomically replacing a store there.

    Images are copied in 64 MiB chunks, so a memmap larger than memory works.

    Args:
        dataset: uint8 images and labels (labels must lie in ``0..num_classes-1``).
        out: the store folder; its parent is created. An existing store is replaced,
            anything else there is refused.
        source: where the data came from (a SHA-256, a URL, a description), kept in meta.json.

    Example:
        >>> ds = latecast.from_arrays(np.zeros((10, 28, 28), np.uint8), np.arange(10))
        >>> open_store(write_store(ds, Path("stores/zeros"))).image_shape
        (28, 28, 1)
    """
    with atomic_folder(Path(out), check_replaceable) as tmp:
        images = empty_images(tmp, dataset.images.shape)
        step = max(1, CHUNK_BYTES // max(1, images[0].nbytes))
        for start in range(0, len(images), step):
            images[start : start + step] = dataset.images[start : start + step]
        images.flush()
        finish_split(tmp, replace(dataset, images=images), source)
        del images  # close the memmap before the folder is renamed
    return Path(out)


def read_meta(folder: Path) -> dict:
    """The checked meta.json of one store folder; ``FormatError`` when it is not a store's."""
    path = folder / META
    try:
        meta = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        raise FormatError(f"{folder}: not a latecast store ({META} is missing)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        found = meta.get("schema") if isinstance(meta, dict) else type(meta).__name__
        raise FormatError(f"{path}: schema version {found!r}, this latecast reads {SCHEMA}")
    types = {
        "name": str,
        "split": str,
        "count": int,
        "images": dict,
        "labels": dict,
        "classes": list,
        "mean": list,
        "std": list,
    }
    for key, t in types.items():
        if not isinstance(meta.get(key), t):
            raise FormatError(
                f"{path}: field {key!r} should be a {t.__name__}, got {meta.get(key)!r:.60}"
            )
    return meta


def _open_array(folder: Path, name: str, entry: dict, count: int) -> np.ndarray:
    """Memory-map one .npy and check it against its meta.json entry."""
    path = folder / name  # fixed names: meta.json cannot point outside the store
    if not path.is_file():
        raise FormatError(f"{path}: missing (listed in {folder / META})")
    size = path.stat().st_size
    if size != entry.get("bytes"):
        raise FormatError(
            f"{path}: {size} bytes, {META} says {entry.get('bytes')} (truncated or replaced?)"
        )
    if _fingerprint(path) != entry.get("sha256_head_tail"):
        raise FormatError(
            f"{path}: contents differ from when {META} was written (stale or edited file)"
        )
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise FormatError(f"{path}: not a readable .npy file ({e})") from None
    expected = (list(arr.shape), arr.dtype.name)
    if expected != (entry.get("shape"), entry.get("dtype")) or arr.shape[:1] != (count,):
        raise FormatError(
            f"{path}: holds {arr.dtype.name} {list(arr.shape)}, {META} says "
            f"{entry.get('dtype')} {entry.get('shape')} with count {count}"
        )
    return arr


def _store_folder(path: Path, split: str | None) -> Path:
    splits = (
        sorted(p.name for p in path.iterdir() if (p / META).is_file())
        if path.is_dir() and not (path / META).is_file()
        else []
    )
    if not splits:  # one store, or none: read_meta says which
        return path
    if (split or "train") not in splits:
        raise ConfigError(f"{path}: no split {split or 'train'!r}; this store has {splits}")
    return path / (split or "train")


def open_store(path: str | os.PathLike, split: str | None = None) -> Dataset:
    """Open a store as a ``Dataset`` whose images are a read-only memmap.

    Everything is checked against meta.json first (schema version, file sizes and
    fingerprints, shapes, dtypes, count, label range); any mismatch raises ``FormatError``
    naming the file. Arrays are loaded with ``allow_pickle=False``.

    Args:
        path: a store folder, or a converted folder holding one store per split.
        split: for a multi-split folder, which one (default ``"train"``); for a single
            store it must be ``None`` or match the stored split.

    Example:
        >>> test = open_store("stores/cifar10", split="test")
        >>> test.images.shape
        (10000, 32, 32, 3)
    """
    folder = _store_folder(Path(path), split)
    meta = read_meta(folder)
    if split is not None and meta["split"] != split:
        raise ConfigError(f"{folder}: holds split {meta['split']!r}, asked for {split!r}")
    count = meta["count"]
    images = _open_array(folder, IMAGES, meta["images"], count)
    labels = np.array(_open_array(folder, LABELS, meta["labels"], count))  # small: read it whole
    mean, std, c = meta["mean"], meta["std"], images.shape[-1]
    if not (
        len(mean) == len(std) == c
        and all(isinstance(v, (int, float)) for v in mean + std)
        and all(0 <= m <= 1 for m in mean)
        and all(0 < v <= 1 for v in std)
    ):
        raise FormatError(
            f"{folder / META}: mean/std need {c} channel values in [0, 1] "
            f"(std > 0), got {mean}/{std}"
        )
    ds = Dataset(
        meta["name"],
        meta["split"],
        images,
        labels,
        tuple(map(str, meta["classes"])),
        tuple(map(float, mean)),
        tuple(map(float, std)),
    )  # checks the dtypes and ndim
    check_labels(labels, ds.num_classes, str(folder / LABELS))
    return ds
