"""The compact on-disk store: files opened as read-only memmaps, checked against meta.json.

A store is a folder with ``labels.npy`` (uint8, or uint16 past 256 classes), ``meta.json``
(schema version, encoding, name, split, count, shapes, dtypes, file sizes and fingerprints,
classes, mean/std, source, ``images_sha256``: the SHA-256 of every image byte, hashed as they
were written) and the images in one of two encodings:

- ``raw``: ``images.npy``, uint8 ``(N, H, W, C)`` pixels (a ``Dataset``); or uint16 (16-bit
  images, ``convert``'s ``depth``), mean/std then in stored units.
- ``jpeg``: ``data.bin``, the JPEG files back to back; ``offsets.npy`` (int64 ``(N + 1,)``,
  image ``i`` is ``data[offsets[i]:offsets[i + 1]]``) and ``sizes.npy`` (int32 ``(N, 2)``,
  each image's height and width); meta.json adds the training ``size``, ``channels`` and
  ``plain`` (every file upright, EXIF orientation 1, with 1 or 3 channels: the CPU decoder
  then reads no file's header) (an ``EncodedDataset``, decoded per batch on the device).

A converted image folder with ``train/`` and ``test/`` (or ``val/``) holds one such store per
split: ``out/train``, ``out/test``. Opening never reads the images: a store larger than
memory is paged in as the loader touches it; only a jpeg store's sample of files is
read (``STRUCTURE_SAMPLE``). ``verify`` reads everything (``latecast info --verify``).

Writes go through ``fileio.atomic_folder``: a crash (even ``kill -9``) leaves the previous
store or none, never half of one. Only a store is ever replaced, never a user's other data.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np

from ..data import Dataset, check_labels, pixels_of
from ..errors import ConfigError, FormatError, refuse
from ..kinds.jpegfiles import EncodedDataset
from ..kinds.jpegheader import JPEG_SIDE, MAX_PIXELS, jpeg_header, too_big
from .fileio import atomic_folder

SCHEMA = 1
IMAGES, LABELS, META, SKIPPED = "images.npy", "labels.npy", "meta.json", "skipped.txt"
DATA, OFFSETS, SIZES, CRC32 = "data.bin", "offsets.npy", "sizes.npy", "crc32.npy"
FILES = {  # encoding -> {meta.json key: file}; the first holds the images, the others are small
    "raw": {"images": IMAGES, "labels": LABELS},
    "jpeg": {"data": DATA, "offsets": OFFSETS, "sizes": SIZES, "labels": LABELS, "crc32": CRC32},
}
MAX_SIDE = 10_000  # pixels: the largest training height or width
CHUNK_BYTES = 64 << 20  # copy images in 64 MiB pieces, so a memmap source is never read whole
SPLIT_NAMES = ("train", "test", "val")
# Files whose structure opening a jpeg store checks, spread evenly (the first and last among
# them): ~1 ms even for ImageNet, sure to see another store's sizes.npy or offsets.npy; every
# file is checked by the decoder (decode.py) or ``verify``.
STRUCTURE_SAMPLE = 256


def _store_problem(folder: Path) -> str:
    """Why ``folder`` is not, verifiably, one split's store ("" when it is): its meta.json
    must parse with this schema and nothing but the store's own files may be in it."""
    try:
        ours = {META, *FILES[read_meta(folder)["encoding"]].values()}
    except FormatError as e:
        return str(e)
    others = sorted(p.name for p in folder.iterdir() if p.name not in ours)
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


def _chunks(big: np.ndarray) -> Iterator[bytes]:
    """The bytes of ``big`` (C order) in pieces of about ``CHUNK_BYTES``, whole rows each."""
    step = max(1, CHUNK_BYTES // max(1, big[:1].nbytes))
    for start in range(0, len(big), step):
        yield np.ascontiguousarray(big[start : start + step]).tobytes()


def crc32s(data: np.ndarray, offsets) -> np.ndarray:
    """``(N,)`` uint32: the CRC-32 of each file ``data[offsets[i]:offsets[i + 1]]``."""
    a = np.asarray(offsets).tolist()
    return np.array([zlib.crc32(data[i:j]) for i, j in zip(a, a[1:])], np.uint32)


def npy_header(dtype: np.dtype, shape: tuple[int, ...], length: int = 0) -> bytes:
    """The ``.npy`` (version 1.0) header of a C-order array, padded with spaces to ``length``
    bytes when that is longer: written before the pixels stream in, and again over the first
    once the count of images kept is known (never more than planned, so it still fits)."""
    text = repr({"descr": np.dtype(dtype).str, "fortran_order": False, "shape": tuple(shape)})
    size = max(length, -(-(11 + len(text)) // 64) * 64)  # magic 6 + version 2 + length 2 + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", size - 10) + f"{text:<{size - 11}}\n".encode()


def finish_split(
    folder: Path, ds: Dataset | EncodedDataset, source: str, digest: str, **extra
) -> None:
    """Write the small arrays and meta.json (``digest``: the images' SHA-256, hashed as they
    were written; plus ``extra`` fields) next to the images file (``images.npy`` or
    ``data.bin``) already written in ``folder``; every JPEG file checked (``check_jpegs``)."""
    if len(ds) == 0:
        raise FormatError(f"{folder.name}: refusing to write a store with no images")
    check_labels(ds.labels, ds.num_classes, f"{ds.name}/{ds.split}")
    encoding, plain = getattr(ds, "encoding", "raw"), {}
    arrays = {key: getattr(ds, key) for key in FILES[encoding] if key != "crc32"}  # reckoned below
    if encoding != "raw":  # every file read: its structure, and its CRC-32 kept (kinds/jpeg.py)
        plain = {"plain": check_jpegs(ds, f"{ds.name}/{ds.split}", range(len(ds)))}
        arrays["crc32"] = crc32s(ds.data, ds.offsets)
    for key, name in list(FILES[encoding].items())[1:]:
        np.save(folder / name, np.ascontiguousarray(arrays[key]), allow_pickle=False)
    files = {
        key: {
            "file": name,
            "shape": list(arrays[key].shape),
            "dtype": arrays[key].dtype.name,
            "bytes": (folder / name).stat().st_size,
            "sha256_head_tail": _fingerprint(folder / name),
        }
        for key, name in FILES[encoding].items()
    }
    meta = {
        "schema": SCHEMA,
        "encoding": encoding,
        "name": ds.name,
        "split": ds.split,
        "count": len(ds),
        **files,
        **({} if encoding == "raw" else {"size": list(ds.size), "channels": ds.channels}),
        **plain,
        "classes": list(ds.classes),
        "mean": list(ds.mean),
        "std": list(ds.std),
        "source": source,
        "images_sha256": digest,
        **extra,
    }
    (folder / META).write_text(json.dumps(meta, indent=1) + "\n")


def write_store(
    dataset: Dataset | EncodedDataset, out: str | os.PathLike, *, source: str = ""
) -> Path:
    """Write ``dataset`` as a store folder at ``out``, atomically replacing a store there.

    The images are copied in 64 MiB chunks through a file (a full disk is an error naming
    ``out``, see ``fileio.atomic_folder``), so a memmap larger than memory works.

    Args:
        dataset: uint8 images (a ``raw`` store) or JPEG bytes (a ``jpeg`` store) and labels
            (which must lie in ``0..num_classes-1``).
        out: the store folder; its parent is created. An existing store is replaced,
            anything else there is refused.
        source: where the data came from (a SHA-256, a URL, a description), kept in meta.json.

    Example:
        >>> ds = latecast.from_arrays(np.zeros((10, 28, 28), np.uint8), np.arange(10))
        >>> open_store(write_store(ds, Path("stores/zeros"))).image_shape
        (28, 28, 1)
    """
    encoding = getattr(dataset, "encoding", "raw")
    key, name = next(iter(FILES[encoding].items()))
    big = getattr(dataset, key)
    digest = hashlib.sha256()
    with atomic_folder(Path(out), check_replaceable) as tmp:
        with open(tmp / name, "wb") as f:
            if encoding == "raw":
                f.write(npy_header(big.dtype, big.shape))
            for chunk in _chunks(big):
                digest.update(chunk)
                f.write(chunk)
        finish_split(tmp, dataset, source, digest.hexdigest())
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
    encoding = meta.get("encoding")
    if not isinstance(encoding, str) or encoding not in FILES:
        raise FormatError(f"{path}: encoding {encoding!r}, this latecast reads {', '.join(FILES)}")
    types = {"name": str, "split": str, "count": int}
    types |= {key: dict for key in FILES[encoding]}
    types |= {} if encoding == "raw" else {"size": list, "channels": int}
    types |= {"classes": list, "mean": list, "std": list, "images_sha256": str}
    for key, t in types.items():
        if not isinstance(meta.get(key), t):
            raise FormatError(
                f"{path}: field {key!r} should be a {t.__name__}, got {meta.get(key)!r:.60}"
            )
    if not re.fullmatch("[0-9a-f]{64}", digest := meta["images_sha256"]):
        raise FormatError(
            f"{path}: field 'images_sha256' should be 64 hex digits, got {digest!r:.70}"
        )
    return meta


def _open_array(folder: Path, name: str, entry: dict, rows: int | None, count: int) -> np.ndarray:
    """Memory-map one file (``.npy``, or ``data.bin`` as plain bytes) and check it against its
    meta.json entry; ``rows``: the length it must have (``None``: any)."""
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
        if name == DATA:
            arr = np.memmap(path, np.uint8, mode="r")
        else:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise FormatError(f"{path}: not a readable {path.suffix} file ({e})") from None
    rows_ok = rows is None or arr.shape[:1] == (rows,)
    if (list(arr.shape), arr.dtype.name) != (entry.get("shape"), entry.get("dtype")) or not rows_ok:
        raise FormatError(
            f"{path}: holds {arr.dtype.name} {list(arr.shape)}, {META} says "
            f"{entry.get('dtype')} {entry.get('shape')} with count {count}"
        )
    return arr


def _store_folder(path: Path, split: str | None) -> Path:
    stores = path.is_dir() and not (path / META).is_file()
    splits = sorted(p.name for p in path.iterdir() if (p / META).is_file()) if stores else []
    if not splits:  # one store, or none: read_meta says which
        return path
    if (split or "train") not in splits:
        raise ConfigError(f"{path}: no split {split or 'train'!r}; this store has {splits}")
    return path / (split or "train")


def open_store(path: str | os.PathLike, split: str | None = None) -> Dataset | EncodedDataset:
    """Open a store: a ``Dataset`` whose images are a read-only memmap (``raw``), or an
    ``EncodedDataset`` whose JPEG bytes are (``jpeg``).

    Everything is checked against meta.json first (schema version, file sizes and
    fingerprints, shapes, dtypes, count, label range; for jpeg also offsets, sizes, each
    file's pixels under ``MAX_PIXELS``, the training size and channels); any mismatch raises
    ``FormatError`` naming the file. Arrays are loaded with ``allow_pickle=False``.

    Args:
        path: a store folder, or a converted folder holding one store per split.
        split: for a multi-split folder, which one (default ``"train"``); for a single
            store it must be ``None`` or match the stored split.

    Example:
        >>> test = open_store("stores/cifar10", split="test")
        >>> test.images.shape
        (10000, 32, 32, 3)
    """
    refuse(
        [
            (isinstance(path, (str, os.PathLike)), "path", path, "a store folder"),
            (split is None or isinstance(split, str), "split", split, "a split's name or None"),
        ]
    )
    folder = _store_folder(Path(path), split)
    meta = read_meta(folder)
    if split is not None and meta["split"] != split:
        raise ConfigError(f"{folder}: holds split {meta['split']!r}, asked for {split!r}")
    count, encoding = meta["count"], meta["encoding"]
    rows = {"data": None, "offsets": count + 1}
    arrays = {
        key: _open_array(folder, name, meta[key], rows.get(key, count), count)
        for key, name in FILES[encoding].items()
    }
    labels = np.array(arrays.pop("labels"))  # small: read it whole
    if encoding == "raw":
        channels = arrays["images"].shape[-1]
    else:
        arrays.update(_check_encoded(folder, meta, arrays, labels))
        channels = meta["channels"]
    mean, std = meta["mean"], meta["std"]
    top = 65535 if encoding == "raw" and arrays["images"].dtype == np.uint16 else 1  # units
    if not (
        len(mean) == len(std) == channels
        and all(isinstance(v, (int, float)) for v in mean + std)
        and all(0 <= m <= top for m in mean)
        and all(0 < v <= top for v in std)
    ):
        raise FormatError(
            f"{folder / META}: mean/std need {channels} channel values in [0, {top}] "
            f"(std > 0), got {mean}/{std}"
        )
    common = {
        "name": meta["name"],
        "split": meta["split"],
        "labels": labels,
        "classes": tuple(map(str, meta["classes"])),
        "mean": tuple(map(float, mean)),
        "std": tuple(map(float, std)),
        "digest": meta["images_sha256"],
    }
    if encoding == "raw":  # (pixels_of's class checks the dtypes and ndim)
        ds = pixels_of(arrays["images"])(images=arrays["images"], **common)
    else:
        crc = np.array(arrays.pop("crc32"))  # small: read it whole
        ds = EncodedDataset(
            **arrays, **common, channels=channels, size=tuple(meta["size"]), crc32=crc,
            plain=meta["plain"],
        )  # fmt: skip
        picks = np.unique(np.linspace(0, count - 1, min(count, STRUCTURE_SAMPLE)).astype(int))
        check_jpegs(ds, str(folder), picks)
    check_labels(labels, ds.num_classes, str(folder / LABELS))
    return ds


def verify(ds: Dataset | EncodedDataset, where: str) -> bool:
    """Read every image byte of an opened store: each JPEG file's structure (``check_jpegs``)
    and the SHA-256 of them all against meta.json's (a flipped byte anywhere is caught), else
    a ``FormatError`` naming ``where``. False: no SHA-256 to compare (a dataset cache that
    could not be written)."""
    if isinstance(ds, EncodedDataset):
        check_jpegs(ds, where, range(len(ds)))
    if not ds.digest:
        return False
    digest = hashlib.sha256()
    for chunk in _chunks(ds.data if isinstance(ds, EncodedDataset) else ds.images):
        digest.update(chunk)
    if digest.hexdigest() != ds.digest:
        crc = getattr(ds, "crc32", None)  # which file: the first whose CRC-32 differs
        bad = [] if crc is None else np.flatnonzero(crc32s(ds.data, ds.offsets) != crc)[:1]
        raise FormatError(
            f"{where}: " + "".join(f"sample {k}: " for k in bad) + f"the images differ from "
            f"the SHA-256 in {META} (a file edited or damaged since it was written); make the "
            "store again"
        )
    return True


def check_jpegs(ds: EncodedDataset, where: str, picks) -> bool:
    """``FormatError`` naming ``where`` and the first sample whose ``(H, W)`` in sizes.npy is
    over ``MAX_PIXELS`` (every sample: decoding it would allocate a decompression bomb's
    gigabytes), or the first in ``picks`` whose file is not a whole JPEG of that size
    (``jpeg_problem``) or not plain (upright, 1 or 3 channels) when ``ds.plain`` says every
    file is. Returns whether all in ``picks`` are plain."""
    over = np.flatnonzero(ds.sizes[:, 0].astype(np.int64) * ds.sizes[:, 1] > MAX_PIXELS)
    if len(over):
        raise FormatError(f"{where}: sample {over[0]}: {too_big(tuple(ds.sizes[over[0]]))}")
    offsets, sizes, plain = ds.offsets.tolist(), ds.sizes.tolist(), True
    for i in picks:
        file = ds.data[offsets[i] : offsets[i + 1]]
        why = jpeg_problem(file, sizes[i])
        if not why:
            _, _, channels, orientation = jpeg_header(file)
            plain = plain and orientation == 1 and channels != 4
            if ds.plain and not plain:
                why = (
                    f"{META} says every file is plain (upright, 1 or 3 channels), this one "
                    f"has EXIF orientation {orientation} and {channels} channels"
                )
        if why:
            raise FormatError(f"{where}: sample {i}: {why} (a damaged or edited store?)")
    return plain


def jpeg_problem(file: np.ndarray | bytes, hw: list[int] | None = None) -> str:
    """Why ``file`` is not one whole JPEG ("" when it is): SOI first, EOI last, and a frame
    header (SOF) giving ``hw`` (H, W; None: any) once its EXIF orientation is applied."""
    if len(file) < 4 or bytes(file[:2]) != b"\xff\xd8" or bytes(file[-2:]) != b"\xff\xd9":
        return "not a whole JPEG file (it must start with FF D8 and end with FF D9)"
    head = jpeg_header(file)
    if head is None:
        return "no readable JPEG frame header (SOF) before the image data"
    if hw is not None and list(head[:2]) != list(hw):
        return f"the file is {head[0]}x{head[1]}, {SIZES} says {hw[0]}x{hw[1]}"
    return ""


def _check_encoded(folder: Path, meta: dict, arrays: dict, labels: np.ndarray) -> dict:
    """The checks a jpeg store adds (offsets, sizes, training size, channels), each naming
    its file; returns the offsets and sizes, read whole (they are small)."""
    n, offsets, sizes = len(arrays["data"]), np.array(arrays["offsets"]), np.array(arrays["sizes"])
    size, channels = meta["size"], meta["channels"]
    rising = offsets.dtype == np.int64 and offsets[0] == 0 and offsets[-1] == n
    sides = sizes.dtype == np.int32 and sizes.shape == (len(labels), 2)
    sides = sides and bool(np.all((sizes >= 1) & (sizes <= JPEG_SIDE)))
    trained = channels in (1, 3) and len(size) == 2
    trained = trained and all(type(v) is int and 1 <= v <= MAX_SIDE for v in size)
    checks = [
        (rising and bool(np.all(np.diff(offsets) > 0)), OFFSETS,
         f"offsets must be int64, rising from 0 to the {n} bytes of {DATA}"),
        (sides, SIZES,
         f"sizes must be int32 (height, width) pairs in 1..{JPEG_SIDE}, one per image"),
        (labels.dtype in (np.uint8, np.uint16), LABELS, "labels must be uint8 or uint16"),
        (arrays.get("crc32", np.uint32(0)).dtype == np.uint32, CRC32, "CRC-32s must be uint32"),
        (type(meta.get("plain")) is bool, META, "plain must be true or false"),
        (trained, META, f"channels must be 1 or 3 and size (height, width) in 1..{MAX_SIDE}, "
         f"got {channels!r:.20} and {size!r:.40}"),
    ]  # fmt: skip
    for ok, name, what in checks:
        if not ok:
            raise FormatError(f"{folder / name}: {what}")
    return {"offsets": offsets, "sizes": sizes}
