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
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from .data import Dataset, channel_stats, check_labels
from .errors import ConfigError, FormatError
from .fileio import atomic_folder

SCHEMA = 1
IMAGES, LABELS, META, SKIPPED = "images.npy", "labels.npy", "meta.json", "skipped.txt"
CHUNK_BYTES = 64 << 20  # copy images in 64 MiB pieces, so a memmap source is never read whole
MAX_PIXELS = 10_000 * 10_000  # larger images are rejected from the header, before decoding
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
SPLIT_NAMES = ("train", "test", "val")


# ---- what may be replaced -------------------------------------------------------------

def _store_problem(folder: Path) -> str:
    """Why ``folder`` is not, verifiably, one split's store ("" when it is): its meta.json
    must parse with this schema and nothing but the store's own files may be in it."""
    try:
        _read_meta(folder)
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


def _check_replaceable(out: Path) -> None:
    """Only a store (or an empty folder) may be replaced: never delete a user's other data."""
    if out.exists() and (why := _replace_problem(out)):
        raise ConfigError(f"{out} exists and is not a latecast store ({why}); refusing to "
                          f"replace it: choose a new folder")


# ---- writing ---------------------------------------------------------------------------

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


def _finish_split(folder: Path, ds: Dataset, source: str) -> None:
    """Write labels.npy and meta.json next to an images.npy already written in ``folder``."""
    check_labels(ds.labels, ds.num_classes, f"{ds.name}/{ds.split}")
    np.save(folder / LABELS, np.ascontiguousarray(ds.labels), allow_pickle=False)
    files = {key: {"file": name, "shape": list(arr.shape), "dtype": arr.dtype.name,
                   "bytes": (folder / name).stat().st_size,
                   "sha256_head_tail": _fingerprint(folder / name)}
             for key, name, arr in (("images", IMAGES, ds.images), ("labels", LABELS, ds.labels))}
    meta = {"schema": SCHEMA, "name": ds.name, "split": ds.split, "count": len(ds), **files,
            "classes": list(ds.classes), "mean": list(ds.mean), "std": list(ds.std), "source": source}
    (folder / META).write_text(json.dumps(meta, indent=1) + "\n")


def _empty_images(folder: Path, shape: tuple[int, ...]) -> np.memmap:
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
    out = Path(out)
    with atomic_folder(out, _check_replaceable) as tmp:
        images = _empty_images(tmp, dataset.images.shape)
        step = max(1, CHUNK_BYTES // max(1, images[0].nbytes))
        for start in range(0, len(images), step):
            images[start:start + step] = dataset.images[start:start + step]
        images.flush()
        _finish_split(tmp, replace(dataset, images=images), source)
        del images  # close the memmap before the folder is renamed
    return out


# ---- reading ---------------------------------------------------------------------------

def _read_meta(folder: Path) -> dict:
    path = folder / META
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(f"{folder}: not a latecast store ({META} is missing)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        found = meta.get("schema") if isinstance(meta, dict) else type(meta).__name__
        raise FormatError(f"{path}: schema version {found!r}, this latecast reads {SCHEMA}")
    types = {"name": str, "split": str, "count": int, "images": dict, "labels": dict,
             "classes": list, "mean": list, "std": list}
    for key, t in types.items():
        if not isinstance(meta.get(key), t):
            raise FormatError(f"{path}: field {key!r} should be a {t.__name__}, "
                              f"got {meta.get(key)!r:.60}")
    return meta


def _open_array(folder: Path, name: str, entry: dict, count: int) -> np.ndarray:
    """Memory-map one .npy and check it against its meta.json entry."""
    path = folder / name  # fixed names: meta.json cannot point outside the store
    if not path.is_file():
        raise FormatError(f"{path}: missing (listed in {folder / META})")
    size = path.stat().st_size
    if size != entry.get("bytes"):
        raise FormatError(f"{path}: {size} bytes, {META} says {entry.get('bytes')} "
                          "(truncated or replaced?)")
    if _fingerprint(path) != entry.get("sha256_head_tail"):
        raise FormatError(f"{path}: contents differ from when {META} was written (stale or edited file)")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise FormatError(f"{path}: not a readable .npy file ({e})") from None
    expected = (list(arr.shape), arr.dtype.name)
    if expected != (entry.get("shape"), entry.get("dtype")) or arr.shape[:1] != (count,):
        raise FormatError(f"{path}: holds {arr.dtype.name} {list(arr.shape)}, {META} says "
                          f"{entry.get('dtype')} {entry.get('shape')} with count {count}")
    return arr


def _store_folder(path: Path, split: str | None) -> Path:
    if (path / META).is_file():
        return path
    splits = sorted(p.name for p in path.iterdir() if (p / META).is_file()) if path.is_dir() else []
    if not splits:
        raise FormatError(f"{path}: not a latecast store ({META} is missing)")
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
    meta = _read_meta(folder)
    if split is not None and meta["split"] != split:
        raise ConfigError(f"{folder}: holds split {meta['split']!r}, asked for {split!r}")
    count = meta["count"]
    images = _open_array(folder, IMAGES, meta["images"], count)
    labels = np.array(_open_array(folder, LABELS, meta["labels"], count))  # small: read it whole
    if images.ndim != 4 or images.dtype != np.uint8 or labels.dtype not in (np.uint8, np.uint16):
        raise FormatError(f"{folder}: need uint8 (N, H, W, C) images and uint8/uint16 labels, "
                          f"got {images.dtype} {images.shape} and {labels.dtype}")
    mean, std, c = meta["mean"], meta["std"], images.shape[3]
    numbers = all(isinstance(v, (int, float)) for v in mean + std)
    if not (len(mean) == len(std) == c and numbers and all(0 <= m <= 1 for m in mean)
            and all(0 < v <= 1 for v in std)):
        raise FormatError(f"{folder / META}: mean/std need {c} channel values in [0, 1] "
                          f"(std > 0), got {mean}/{std}")
    check_labels(labels, len(meta["classes"]), str(folder / LABELS))
    return Dataset(meta["name"], meta["split"], images, labels, tuple(map(str, meta["classes"])),
                   tuple(map(float, mean)), tuple(map(float, std)))


# ---- image folders ---------------------------------------------------------------------

def _find_splits(folder: Path) -> dict[str, Path]:
    """``{"train": .., "test": ..}`` when the top level holds only ``train`` plus ``test``
    and/or ``val``; else ``{"": folder}``: the folder is one split of class subfolders."""
    subdirs = {p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")}
    if "train" in subdirs and len(subdirs) > 1 and subdirs <= set(SPLIT_NAMES):
        return {name: folder / name for name in SPLIT_NAMES if name in subdirs}
    return {"": folder}


def _list_images(root: Path, classes: tuple[str, ...] | None
                 ) -> tuple[tuple[str, ...], list[tuple[Path, int]]]:
    """Class names (sorted subfolders, as torchvision's ImageFolder) and ``(file, label)``s.
    Other splits reuse the train split's classes, so a label means the same class in each."""
    found = tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")))
    classes = classes or found
    if set(found) - set(classes) or not classes:
        raise FormatError(f"{root}: class folders {sorted(set(found) - set(classes)) or 'missing'}; "
                          f"expected subfolders of {list(classes) or 'one folder per class'}")
    if len(classes) > 1 << 16:
        raise FormatError(f"{root}: {len(classes)} classes, at most 65536 fit uint16 labels")
    files = [(p, label) for label, name in enumerate(classes) if (root / name).is_dir()
             for p in sorted((root / name).rglob("*"))
             if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".") and p.is_file()]
    return classes, files


def _decode(path: Path, fn: Callable):
    """``fn(image)`` of the fully decoded ``path``; an unreadable or huge file is a FormatError."""
    from PIL import Image
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # MAX_PIXELS is the cap
            with Image.open(path) as im:
                if im.width * im.height > MAX_PIXELS:
                    raise FormatError(f"{path}: {im.width}x{im.height} image is larger than "
                                      f"the {MAX_PIXELS:,} pixels allowed")
                im.load()  # decode every byte now: a truncated file fails here, not in training
                return fn(im)
    except FormatError:
        raise
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, struct.error, ...
        raise FormatError(f"{path}: not a readable image ({type(e).__name__}: {e})") from None


def _fit(im, size: tuple[int, int]):
    """Scale to cover ``size`` (H, W) keeping the aspect ratio, then center-crop to it."""
    from PIL import Image
    h, w = size
    if (im.height, im.width) == (h, w):
        return im
    s = max(h / im.height, w / im.width)
    rw, rh = max(w, round(im.width * s)), max(h, round(im.height * s))
    left, top = (rw - w) // 2, (rh - h) // 2
    return im.resize((rw, rh), Image.Resampling.BILINEAR).crop((left, top, left + w, top + h))


def _check_all(folder: Path, skip_bad: bool) -> tuple[tuple[str, ...], dict[str, list], list]:
    """Pass 1: decode every file once. Classes, ``{split: [(path, label, (gray?, (H, W)))]}``
    and the skipped ``(path relative to folder, reason)``s."""
    classes, splits, skipped = None, {}, []
    for name, root in _find_splits(folder).items():
        classes, files = _list_images(root, classes)
        splits[name] = []
        for path, label in files:
            try:
                info = _decode(path, lambda im: (im.mode in ("1", "L"), im.size[::-1]))
                splits[name].append((path, label, info))
            except FormatError as e:
                if not skip_bad:
                    raise
                skipped.append((str(path.relative_to(folder)), str(e)))
        if not splits[name]:
            raise FormatError(f"{root}: no readable images (suffixes {sorted(IMAGE_SUFFIXES)})")
    return classes, splits, skipped


def convert_folder(folder: str | os.PathLike, out: str | os.PathLike, *,
                   size: tuple[int, int] | None = None,
                   skip_bad: bool = False) -> tuple[Path, list[str]]:
    """Convert a class-per-subfolder image folder (torchvision ``ImageFolder`` layout) to a store.

    Rules:
      - classes: sorted subfolder names; files with an image suffix are read (nested too),
        others and hidden files ignored. A top level of only ``train/`` plus ``test/``
        and/or ``val/`` gives one store per split (``out/train``, ...; see ``open_store``),
        all with the train split's classes, mean and std; else ``out`` is one store.
      - every file is fully decoded with Pillow; a corrupt, truncated, empty or huge
        (over ``MAX_PIXELS``) file raises ``FormatError`` naming it, or with ``skip_bad``
        is left out and listed in ``out/skipped.txt`` (``path<TAB>reason`` lines).
      - channels: 1 if every image is grayscale (mode "L" or "1"), else RGB (alpha dropped).
      - size: images are scaled to cover ``size`` = (H, W), keeping their aspect ratio, then
        center-cropped (torchvision ``Resize`` + ``CenterCrop``). Without ``size``, the
        most common image size is used and only images of another size are resized.

    Files are decoded twice (to check them and learn modes and sizes, then to write) and
    written straight into a memmap, so memory stays at about one image.

    Args:
        folder: the image folder.
        out: the store folder to create; an existing store there is replaced atomically.
        size: ``(height, width)`` of every stored image, or ``None``.
        skip_bad: skip unreadable images instead of raising.

    Returns:
        ``(out, skipped)``, skipped files as paths relative to ``folder``.

    Example:
        >>> out, skipped = convert_folder("pets/", "stores/pets", size=(64, 64), skip_bad=True)
        >>> open_store(out, split="test").image_shape
        (64, 64, 3)
    """
    try:
        import PIL.Image  # noqa: F401  (optional: the "bench" extra)
    except ImportError:
        raise ConfigError("latecast convert needs Pillow: pip install 'latecast[bench]'") from None
    folder, out = Path(folder), Path(out)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: not a folder of class subfolders")
    src, dst = folder.resolve(), out.resolve()
    if dst == src or dst in src.parents or src in dst.parents:
        raise ConfigError(f"{out}: the store cannot be the image folder {folder}, hold it, or "
                          f"lie inside it; choose a folder outside it")
    if size is not None and (len(size) != 2
                             or not all(type(v) is int and 0 < v <= 10_000 for v in size)):
        raise ConfigError(f"size must be (height, width) in 1..10000 pixels, got {size!r}")
    classes, splits, skipped = _check_all(folder, skip_bad)
    infos = [info for items in splits.values() for _, _, info in items]
    mode = "L" if all(gray for gray, _ in infos) else "RGB"
    size = tuple(size or Counter(hw for _, hw in infos).most_common(1)[0][0])
    shape = (*size, 1 if mode == "L" else 3)  # (H, W, C)
    with atomic_folder(out, _check_replaceable) as tmp:
        stats = None
        for name, items in splits.items():  # train first: its mean/std serve every split
            (tmp / name).mkdir(exist_ok=True)
            images = _empty_images(tmp / name, (len(items), *shape))
            for i, (path, _, _) in enumerate(items):  # pass 2
                pixels = _decode(path, lambda im: np.asarray(_fit(im.convert(mode), size)))
                images[i] = pixels.reshape(shape)  # (H, W) for "L" -> (H, W, 1)
            images.flush()
            stats = stats or channel_stats(images)
            labels = np.array([lb for _, lb, _ in items], np.uint8 if len(classes) <= 256 else np.uint16)
            ds = Dataset(folder.resolve().name, name or "train", images, labels, classes, *stats)
            _finish_split(tmp / name, ds, f"image folder {folder.resolve()}")
            del images, ds  # close the memmap before the folder is renamed
        if skip_bad:
            (tmp / SKIPPED).write_text("".join(f"{p}\t{why}\n" for p, why in skipped))
    return out, [p for p, _ in skipped]
