"""Image folder -> store (``convert``, ``latecast convert``).

Two passes over a pool of processes, the files in the order they will be stored:

1. headers: Pillow reads only the first KBs of each file, for its size and mode; from them
   the training size (``--size``, or the most common), the channels (1 when every image is
   greyscale) and the encoding (``raw`` when every image has one size, else ``jpeg``).
2. decode: a worker reads each file once and decodes it fully (a truncated file fails here,
   not in training; a JPEG also by libjpeg: see ``convert``) into what the store keeps
   (uint8 pixels at the training size, uint16 for 16-bit images, or JPEG bytes) and integer
   sums of the pixels for the mean/std. The parent appends those to the store's files in
   order, so any worker count writes the same store, byte for byte.

Workers are forked; where another Python thread runs they come from a fork server, and a
script calling ``convert`` then needs multiprocessing's ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import multiprocessing
import numbers
import os
import signal
import stat
import sys
import threading
import warnings
from collections import Counter
from dataclasses import MISSING, dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from ..data import mean_std, pixels_of
from ..errors import ConfigError, FormatError
from ..kinds.jpegfiles import EncodedDataset
from ..kinds.jpegheader import too_big
from .fileio import atomic_folder, cannot_write
from .options import option, validate
from .store import (
    DATA,
    FILES,
    IMAGES,
    MAX_SIDE,
    SKIPPED,
    SPLIT_NAMES,
    check_replaceable,
    finish_split,
    jpeg_problem,
    npy_header,
)

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
GREY_MODES = {"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"}
DEEP_MODES = {"I", "I;16", "I;16L", "I;16B", "I;16N", "F"}  # more than 8 bits per pixel
SIXTEEN = {"I;16", "I;16L", "I;16B", "I;16N"}  # 16-bit greyscale (PNG, TIFF; PGM: _header)
TEST_FRACTION = 0.1  # held out of a plain class folder when --test-fraction is not given
CHUNK = 32  # files per pool task: a task's overhead (~0.1 ms) is small beside 32 decodes


@dataclass(frozen=True)
class ConvertConfig:
    """Every option of ``latecast convert`` (the command line is generated from these)."""

    folder: str = option(
        MISSING, "class-per-subfolder images (optionally under train/ and test/)", positional=True
    )
    out: str = option(
        MISSING, "store folder to write (replaced atomically if it is a store)", positional=True
    )
    size: str | None = option(
        None,
        "training size HxW (or N): raw images are resized to cover it, then center-cropped; "
        "default: the most common image size",
        metavar="HxW",
    )
    encoding: str | None = option(
        None,
        "raw: uint8 pixels at the training size; jpeg: each JPEG's own bytes (other formats "
        "re-encoded at --quality), decoded on the device. Default: raw when every image has "
        "the same size, else jpeg",
        choices=tuple(FILES),
    )
    quality: int = option(
        95, "JPEG quality of images re-encoded into a jpeg store", low=1, high=100
    )
    test_fraction: float | None = option(
        None,
        f"share of each class held out as the test split of a plain class folder "
        f"(default {TEST_FRACTION}; 0: a train-only store)",
        low=0,
        below=1,
    )
    seed: int = option(0, "seed of the held-out split and of the stored order", low=0)
    workers: int | None = option(None, "decoding processes (default: the usable cores)", low=1)
    depth: str = option(
        "auto",
        "bits a pixel in the store: 16 keeps 16-bit greyscale (I;16 PNG/TIFF, PGM of maxval "
        "256..65535, or 32-bit I with values in 0..65535) as uint16, raw; 8 scales deeper "
        "greyscale from each image's own min..max to 0..255. auto: 16 when every image is 16-bit, "
        "8 when none is",
        choices=("auto", "8", "16"),
    )
    skip_bad: bool = option(False, "skip unreadable images, list them in OUT/skipped.txt")
    progress: bool = option(True, "tqdm bar (only on a terminal)")

    def __post_init__(self) -> None:
        depth = self.depth  # 16 as an int (numpy's too) is "16", as the command line gives it
        if isinstance(depth, numbers.Integral) and not isinstance(depth, bool) and depth in (8, 16):
            object.__setattr__(self, "depth", str(int(depth)))
        validate(self)
        self.hw  # noqa: B018  (parsed now: a bad size is one line before any work)

    @property
    def hw(self) -> tuple[int, int] | None:
        """``size`` as ``(height, width)``."""
        if self.size is None:
            return None
        h, _, w = self.size.lower().partition("x")
        try:
            hw = (int(h), int(w or h))
        except ValueError:
            hw = (0, 0)
        if not all(1 <= v <= MAX_SIDE for v in hw):
            raise ConfigError(f"size must be HxW (or N) in 1..{MAX_SIDE} pixels, got {self.size!r}")
        return hw


@dataclass(frozen=True)
class _Job:
    """What a worker makes of each decoded image."""

    encoding: str
    size: tuple[int, int]  # (H, W) of the training size
    mode: str  # "L" or "RGB": what the pixels (and so the mean/std) are
    quality: int
    depth: int = 8  # bits a pixel stored: 16 (uint16, raw) or 8


def convert_folder(
    folder: str | os.PathLike, out: str | os.PathLike, **options
) -> tuple[Path, list[str]]:
    """``convert`` with the folders as paths and the other ``ConvertConfig`` fields as keywords
    (``depth`` also as the int 8 or 16).

    Example:
        >>> out, skipped = convert_folder("pets/", "stores/pets", size="64x64", skip_bad=True)
        >>> open_store(out, split="test").image_shape
        (64, 64, 3)
    """
    return convert(ConvertConfig(str(folder), str(out), **options))


def convert(config: ConvertConfig) -> tuple[Path, list[str]]:
    """Convert a class-per-subfolder image folder (torchvision ``ImageFolder`` layout) to a
    store; ``(out, skipped)``, skipped files as paths relative to ``config.folder``.

    Rules:
      - classes: the sorted subfolders holding an image (one with none: skipped, warned); files
        with an image suffix are read, nested too, hidden and other files ignored. Only
        ``train/`` plus ``test/`` and/or ``val/`` at the top: one store per split
        (``out/train``, ...; see ``open_store``), all with the train split's classes, mean and
        std. Else (or a lone ``train/``) ``test_fraction`` of each class (at least one of two or
        more, drawn by ``seed``) goes to ``out/test``; 0: one train store at ``out``.
      - order: seeded, every class spread evenly: the first N samples (``--limit-train N``)
        hold each class in proportion.
      - each file decoded whole by Pillow, a JPEG also by libjpeg as training decodes it: a
        corrupt, truncated, empty or huge (over ``MAX_PIXELS``) file, a FIFO or device, or a
        JPEG libjpeg warns about (Pillow decodes it silently, partly wrong) is a
        ``FormatError`` naming it; with ``skip_bad`` it is left out and listed in
        ``out/skipped.txt``, a JSON object a line (``{"file": path relative to folder,
        "reason": ...}``: any file name reads back).
      - depth ``"16"``: 16-bit greyscale (``I;16``, ``I;16B``, ...; a PGM of maxval over 255,
        at the values the file holds; ``I`` within 0..65535) is kept as uint16 in a raw store
        (resized in float32 and rounded), mean/std in stored units; another mode is a
        ``FormatError``. ``"auto"``: 16 when every image is ``I;16``, 8 when none is, else a
        ``FormatError`` naming a file (a stray 8-bit image never turns the rest to 8 bits).
      - depth ``"8"``: deeper greyscale is scaled from each image's own min..max to 0..255 (a
        constant image: 0), never clipped; palette, CMYK and alpha images become RGB as Pillow
        converts them (alpha dropped, as ``ImageFolder``); EXIF orientation is applied (as the
        device's decoder does to the JPEG files kept). 1 channel if every image is greyscale.
      - ``raw``: each image scaled to cover the training size, then center-cropped
        (torchvision ``Resize`` + ``CenterCrop``, bilinear). ``jpeg``: a whole JPEG file (8-bit
        greyscale or RGB, SOI to EOI, decoded cleanly by libjpeg) is kept byte for byte, any
        other image re-encoded at ``quality`` (meta.json records it and the count); each keeps
        its own size, the training size recorded for the device to crop or resize to.
      - mean/std: exact (integer sums) over the train images as the raw store holds them (at
        the training size, resized and center-cropped): what evaluation sees.
    """
    try:
        import PIL.Image  # noqa: F401  (optional: the "bench" extra)
        import torchvision.io  # noqa: F401  (libjpeg, to check each JPEG as training reads it)

        from ..kinds.decode import decoder
    except ImportError:
        raise ConfigError(
            "latecast convert needs Pillow and torchvision: pip install 'latecast[bench]'"
        ) from None
    decoder()  # a bad LATECAST_DECODER is that one error, not every JPEG "unreadable"
    folder, out = Path(config.folder), Path(config.out)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: not a folder of class subfolders")
    src, dst = folder.resolve(), out.resolve()
    if dst == src or dst in src.parents or src in dst.parents:
        raise ConfigError(
            f"{out}: the store cannot be the image folder {folder}, hold it, or "
            f"lie inside it; choose a folder outside it"
        )
    try:  # before any work (atomic_folder checks again before writing)
        check_replaceable(out)
    except OSError as e:
        raise cannot_write(dst, e) from None
    classes, splits, fraction = _plan(folder, config)
    total = sum(map(len, splits.values()))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = min(config.workers or cores or 1, -(-total // CHUNK))  # no process without a task
    show = config.progress and sys.stderr.isatty()
    skipped: list[tuple[str, str]] = []
    with _mapper(workers) as run:

        def read(fn: Callable, items: list) -> Iterator:  # (item, fn(its file)) of good files
            results = run(fn, [p for p, _ in items])
            if show:  # a tqdm bar on a terminal
                from tqdm import tqdm

                results = tqdm(results, total=len(items), unit="img", leave=False)
            return _good(items, results, skipped, folder, config.skip_bad)

        job = _scan(config, splits, partial(read, partial(_read, _header, False)))
        extra = {"seed": config.seed, "test_fraction": fraction}
        with atomic_folder(out, check_replaceable) as tmp:
            present = stats = None  # of the train split, written first
            for name, items in splits.items():
                where = f"{folder} ({name or 'train'} split)"
                (tmp / name).mkdir(exist_ok=True)
                samples = read(partial(_read, partial(_encode, job), True), items)
                arrays, labels, sums, reencoded, digest = _write_split(
                    tmp / name, job, len(items), samples, where
                )
                if present is None:
                    present = np.bincount(labels, minlength=len(classes)) > 0
                    pixels = len(labels) * job.size[0] * job.size[1]
                    stats = mean_std(sums, pixels, 255 if job.depth == 8 else 1)
                    if not present.all():
                        empty = [c for c, p in zip(classes, present) if not p]
                        warnings.warn(
                            f"{folder}: {empty} hold no readable images; not classes", stacklevel=2
                        )
                common = {
                    "name": src.name,
                    "split": name or "train",
                    "labels": _relabel(labels, present, classes, where),
                    "classes": tuple(c for c, p in zip(classes, present) if p),
                    "mean": stats[0],
                    "std": stats[1],
                }
                if job.encoding == "raw":
                    ds, more = pixels_of(arrays["images"])(**arrays, **common), {}
                else:
                    channels = 1 if job.mode == "L" else 3
                    ds = EncodedDataset(**arrays, **common, channels=channels, size=job.size)
                    more = {"quality": job.quality, "reencoded": reencoded}
                finish_split(tmp / name, ds, f"image folder {src}", digest, **extra, **more)
                del ds, arrays  # close the memmaps before the folder is renamed
            if config.skip_bad:
                (tmp / SKIPPED).write_text(
                    "".join(json.dumps({"file": p, "reason": why}) + "\n" for p, why in skipped)
                )
    return out, [p for p, _ in skipped]


# -- which files, in which split, in which order ---------------------------------------------
def _plan(folder: Path, config: ConvertConfig) -> tuple[tuple[str, ...], dict[str, list], float]:
    """Class names; each split's ``(file, label)``s in the order they will be stored (``""``:
    one store at ``out``); the fraction held out (None when the folder has its own splits)."""
    roots = _find_splits(folder)
    rng = np.random.default_rng(config.seed)
    if "" in roots:
        classes, files = _list_images(roots[""], None)
        fraction = TEST_FRACTION if config.test_fraction is None else config.test_fraction
        splits = _hold_out(files, fraction, rng, folder) if fraction else {"": files}
    else:
        if config.test_fraction is not None:
            raise ConfigError(
                f"{folder} has its own {' and '.join(roots)} folders; "
                f"--test-fraction splits a plain class folder"
            )
        classes, splits, fraction = None, {}, None
        for name, root in roots.items():
            classes, splits[name] = _list_images(root, classes)
    for name, items in splits.items():
        splits[name] = [items[i] for i in _spread([label for _, label in items], rng)]
    return classes, splits, fraction


def _scan(config: ConvertConfig, splits: dict, headers: Callable) -> _Job:
    """Keep the files whose header reads (``headers(items)`` -> ``(item, ((H, W), mode))``)
    in ``splits``, and decide from them how every image is stored."""
    heads = []
    for name, items in splits.items():
        split = list(headers(items))
        splits[name], heads = [item for item, _ in split], heads + split
        if not splits[name]:
            raise FormatError(
                f"{config.folder} ({name or 'train'} split): no readable images "
                f"(suffixes {sorted(IMAGE_SUFFIXES)})"
            )
    modes = [(path, mode) for (path, _), (_, mode) in heads]
    shapes, depth = Counter(hw for _, (hw, _) in heads), _depth(config.depth, modes)
    encoding = config.encoding or ("raw" if len(shapes) == 1 or depth == 16 else "jpeg")
    if depth == 16 and encoding != "raw":
        raise ConfigError("16-bit images are stored raw (a JPEG holds 8 bits): --encoding raw")
    grey = all(mode in GREY_MODES for _, mode in modes)
    size = config.hw or shapes.most_common(1)[0][0]
    return _Job(encoding, size, "L" if grey else "RGB", config.quality, depth)


def _depth(asked: str, modes: list[tuple[Path, str]]) -> int:
    """Bits a pixel in the store (``ConvertConfig.depth``) from each file's ``(path, mode)``;
    a FormatError naming the first file that does not fit 16 bits where 16 are asked for,
    or where ``"auto"`` finds 16-bit images among others."""
    first = next((path for path, mode in modes if mode in SIXTEEN), None)
    if asked == "8" or asked == "auto" and first is None:
        return 8
    takes = SIXTEEN | ({"I"} if asked == "16" else set())  # I: its values checked decoded
    odd = next(((path, mode) for path, mode in modes if mode not in takes), None)
    if odd is None:
        return 16
    why = "--depth 16" if asked == "16" else f"{_shown(first)} (I;16)"
    raise FormatError(
        f"{_shown(odd[0])}: a {odd[1]} image, not 16-bit greyscale as {why}; "
        "--depth 8 stores every image in 8 bits (deeper ones scaled from their own min..max)"
    )


def _find_splits(folder: Path) -> dict[str, Path]:
    """``{"train": .., "test": ..}`` when the top level holds only ``train`` plus ``test``
    and/or ``val``; else ``{"": root}`` (the folder, or its lone ``train``), for ``_hold_out``."""
    subdirs = {p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")}
    if subdirs == {"train"}:
        return {"": folder / "train"}
    if "train" in subdirs and len(subdirs) > 1 and subdirs <= set(SPLIT_NAMES):
        return {name: folder / name for name in SPLIT_NAMES if name in subdirs}
    return {"": folder}


def _list_images(
    root: Path, classes: tuple[str, ...] | None
) -> tuple[tuple[str, ...], list[tuple[Path, int]]]:
    """Class names (sorted subfolders, as torchvision's ImageFolder) and ``(file, label)``s.
    Other splits reuse the train split's classes, so a label means the same class in each;
    their folders without images are ignored (train's drop out once decoded: ``convert``)."""
    folders = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    files = {
        name: sorted(
            p
            for p in (root / name).rglob("*")
            if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".") and not p.is_dir()
        )
        for name in folders
    }
    classes = classes or tuple(folders)
    others = sorted(name for name in folders if files[name] and name not in classes)
    if others or not classes:
        raise FormatError(
            f"{root}: class folders {others or 'missing'}; "
            f"expected subfolders of {list(classes) or 'one folder per class'}"
        )
    if len(classes) > 1 << 16:
        raise FormatError(f"{root}: {len(classes)} classes, at most 65536 fit uint16 labels")
    return classes, [(p, label) for label, name in enumerate(classes) for p in files.get(name, [])]


def _hold_out(files: list, fraction: float, rng: np.random.Generator, folder: Path) -> dict:
    """``{"train": .., "test": ..}``: of each class of n >= 2 files, ``round(fraction * n)``
    (at least 1, at most n - 1) drawn by ``rng`` are held out for testing."""
    labels = np.array([label for _, label in files])
    test = np.zeros(len(files), bool)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        test[rng.choice(idx, min(len(idx) - 1, max(1, round(fraction * len(idx)))), False)] = True
    if files and not test.any():  # (no files at all: no readable images, said later)
        raise FormatError(
            f"{folder}: too few images per class to hold out a test split; "
            f"--test-fraction 0 makes a train-only store"
        )
    return {
        "train": [f for f, t in zip(files, test) if not t],
        "test": [f for f, t in zip(files, test) if t],
    }


def _spread(labels: list[int], rng: np.random.Generator) -> np.ndarray:
    """A seeded order that spreads every class evenly: a class's n samples, shuffled, get keys
    (i + u) / n (u uniform in [0, 1)), sorted. Any first k samples of a balanced split hold
    each class within 2 of k / classes (a permutation would leave some out of short prefixes)."""
    labels = np.asarray(labels)
    key = np.empty(len(labels))
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        key[idx] = (rng.permutation(len(idx)) + rng.random(len(idx))) / len(idx)
    return np.argsort(key, kind="stable")


def _relabel(labels: np.ndarray, present: np.ndarray, classes: tuple, where: str) -> np.ndarray:
    """Labels renumbered past the classes dropped for having no train images, narrowed."""
    missing = ~present[labels]
    if missing.any():
        raise FormatError(
            f"{where}: holds images of {classes[labels[missing][0]]!r}, "
            f"a class with no readable train images"
        )
    return (np.cumsum(present) - 1)[labels].astype(np.uint8 if present.sum() <= 256 else np.uint16)


# -- the pool --------------------------------------------------------------------------------
@contextlib.contextmanager
def _mapper(workers: int) -> Iterator[Callable]:
    """``run(fn, items)``: lazy, in order; in this process for one worker, else over a pool
    of processes, ``CHUNK`` files a task. The workers ignore Ctrl-C: the parent stops them
    and exits 130."""
    if workers <= 1:
        yield map
        return
    # fork starts workers in milliseconds, and is safe while no other Python thread may hold
    # a lock (the import lock, logging's) at the fork: the CLI's case. Else a fork server,
    # started once per process by importing latecast (seconds), copies no other thread.
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        ctx = multiprocessing.get_context("fork")
    else:
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        if ctx.get_start_method() == "forkserver":
            ctx.set_forkserver_preload([__name__])
    ignore_sigint = (signal.SIGINT, signal.SIG_IGN)
    with ctx.Pool(workers, initializer=signal.signal, initargs=ignore_sigint) as pool:
        yield partial(pool.imap, chunksize=CHUNK)  # leaving the block terminates the workers


def _good(items: list, results: Iterable, skipped: list, folder: Path, skip_bad: bool) -> Iterator:
    """``(item, result)`` of each file that read well; a ``FormatError`` result is raised, or
    with ``skip_bad`` listed in ``skipped`` as (path relative to ``folder``, reason)."""
    for item, result in zip(items, results):
        if not isinstance(result, FormatError):
            yield item, result
        elif skip_bad:  # the reason without its path: "file" holds that, exactly
            why = str(result).removeprefix(f"{_shown(item[0])}: ")
            skipped.append((str(item[0].relative_to(folder)), why))
        else:
            raise result


# -- in the workers ----------------------------------------------------------------------------
def _shown(path: Path) -> str:
    """The path for a one-line message: quoted when it holds a tab, newline or the like, or
    starts with a quote (which would read as quoted)."""
    name = str(path)
    return name if name.isprintable() and name[:1] not in "'\"" else ascii(name)


def _read(fn: Callable, whole: bool, path: Path):
    """``fn(image, the file's bytes or None)`` of ``path`` opened with Pillow (from its bytes,
    read once, when ``whole``). A failure is *returned* as a ``FormatError`` naming the file,
    so that a pool worker hands it back like any result."""
    from PIL import Image

    try:
        if not stat.S_ISREG(path.stat().st_mode):  # reading a FIFO waits, a device never ends
            return FormatError(f"{_shown(path)}: not a regular file (a FIFO, device or socket)")
        data = path.read_bytes() if whole else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's, e.g. odd EXIF; MAX_PIXELS is the cap
            with Image.open(io.BytesIO(data) if whole else path) as im:
                if why := too_big((im.height, im.width)):
                    return FormatError(f"{_shown(path)}: {why}")
                return fn(im, data)
    except FormatError as e:  # readable, but refused (damaged JPEG data)
        return FormatError(f"{_shown(path)}: {e}")
    except ConfigError:  # a setting (LATECAST_DECODER), never the file's fault
        raise
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, struct.error, ...
        unknown = isinstance(e, Image.UnidentifiedImageError)  # its text names the BytesIO
        why = "not a format Pillow reads" if unknown else f"{type(e).__name__}: {e}"
        return FormatError(f"{_shown(path)}: not a readable image ({why})")


def _header(im, _) -> tuple[tuple[int, int], str]:
    """``((H, W), mode)`` from an image's header (Pillow reads a file's first KBs only), H and
    W as the image shows upright (EXIF orientation 5 to 8 turns it a quarter)."""
    turned = im.getexif().get(0x0112, 1) in (5, 6, 7, 8)
    mode = "I;16B" if _pgm_maxval(im) else im.mode  # a 16-bit PGM, as a 16-bit PNG's I;16
    return ((im.width, im.height) if turned else (im.height, im.width)), mode


def _pgm_maxval(im) -> int | None:
    """The maxval of a greyscale PGM Pillow opens as ``I`` (maxval 256..65535), read before
    it loads; else None. Pillow scales such values to 0..65535 where maxval is not 65535."""
    if im.format != "PPM" or im.mode != "I" or not im.tile:
        return None
    args = im.tile[0][3]  # (rawmode, maxval), or the rawmode "I;16B" alone for 65535
    return args[-1] if isinstance(args, tuple) else 65535


def _encode(job: _Job, im, data: bytes) -> tuple[bytes, tuple[int, int], np.ndarray, bool]:
    """What one image adds to its split: the bytes stored (pixels at the training size; jpeg:
    an 8-bit JPEG's own file, else a re-encoding), its (H, W) as stored, (2, C) Python-int sums
    of its pixels and their squares at the training size, and whether the bytes are its own."""
    from PIL import ImageOps

    maxval = _pgm_maxval(im)  # (its tile is gone once loaded)
    im.load()  # decode every byte now: a truncated file fails here, not in training
    said = _libjpeg(data) if im.format == "JPEG" else None
    if said:
        raise FormatError(
            "damaged JPEG data (libjpeg decodes it only with a warning: part of the image "
            "would be wrong)"
        )
    # its own bytes go in a jpeg store when libjpeg decodes it cleanly, SOI to EOI
    kept = said == "" and im.mode in ("L", "RGB") and not jpeg_problem(data)
    im = ImageOps.exif_transpose(im)  # upright, as the decoders show the kept files
    if job.depth == 16:
        pixels = _sixteen(im, job.size, maxval)
    else:
        eight = _eight_bit(im)
        pixels = np.asarray(_fit(eight.convert(job.mode), job.size)).reshape(*job.size, -1)
    flat = pixels.reshape(-1, pixels.shape[-1]).astype(np.int64)  # (H * W, C)
    # Python ints: a split's 16-bit squares overflow int64 past ~2e9 pixels
    sums = np.stack([flat.sum(0), (flat * flat).sum(0)]).astype(object)
    if job.encoding == "raw":
        return pixels.tobytes(), job.size, sums, True
    if kept:
        return data, (im.height, im.width), sums, True
    buf = io.BytesIO()
    eight.convert("L" if im.mode in GREY_MODES else "RGB").save(buf, "JPEG", quality=job.quality)
    return buf.getvalue(), (im.height, im.width), sums, False


def _libjpeg(data: bytes) -> str | None:
    """What libjpeg says decoding ``data`` as training does ("" when clean); None when it
    cannot decode it at all (e.g. 12-bit: such a file is re-encoded into a jpeg store)."""
    import torch  # in the workers only: the command line starts without it

    from ..kinds.decode import libjpeg_says

    try:
        return libjpeg_says([torch.frombuffer(bytearray(data), dtype=torch.uint8)], 3)[0]
    except RuntimeError:
        return None


def _eight_bit(im):
    """``im`` with 8 bits per channel. Deeper greyscale is scaled linearly from the image's
    own min..max to 0..255 (a constant image to 0): Pillow's ``convert("L")`` clips instead,
    turning a 16-bit image all white. NaN or infinite values are refused."""
    from PIL import Image

    if im.mode not in DEEP_MODES:
        return im
    a = np.asarray(im).astype(np.float64)
    if not np.isfinite(a).all():
        raise ValueError(f"{im.mode} image holds NaN or infinite values")
    lo, hi = a.min(), a.max()
    scaled = (a - lo) * (255 / (hi - lo)) if hi > lo else np.zeros_like(a)
    return Image.fromarray(np.rint(scaled).astype(np.uint8))


def _sixteen(im, size: tuple[int, int], maxval: int | None = None) -> np.ndarray:
    """uint16 ``(H, W, 1)`` of a 16-bit greyscale image (or an ``I`` one in 0..65535, else a
    FormatError) at the training size (where it differs ``_fit`` in float32, rounded). A PGM's
    ``maxval``: Pillow's scaling by 65535 / maxval undone (exactly: the step is over 1)."""
    from PIL import Image

    a = np.asarray(im)
    if maxval and maxval != 65535:
        a = np.rint(a * (maxval / 65535)).astype(np.int64)
    if a.min() < 0 or a.max() > 65535:
        raise FormatError(f"{im.mode} values {a.min()}..{a.max()} do not fit 16 bits (0..65535)")
    if a.shape != size:
        a = np.rint(np.asarray(_fit(Image.fromarray(a.astype(np.float32)), size)))
    return a.clip(0, 65535).astype(np.uint16).reshape(*size, 1)


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


# -- in the parent: the store's files ----------------------------------------------------------
def _write_split(
    folder: Path, job: _Job, count: int, samples: Iterable, where: str
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, int, str]:
    """Each sample's bytes appended to the split's images file by a file object (a full disk is
    an ``OSError``, never a memmap's SIGBUS), then mapped: the arrays (``images``; or ``data``,
    ``offsets``, ``sizes``), labels, summed pixel sums, re-encoded count and SHA-256."""
    raw = job.encoding == "raw"
    path = folder / (IMAGES if raw else DATA)
    shape = (*job.size, 1 if job.mode == "L" else 3)  # (H, W, C)
    dtype = np.uint16 if job.depth == 16 else np.uint8
    header = npy_header(dtype, (count, *shape)) if raw else b""
    labels, offsets, sizes, sums, reencoded, digest = [], [0], [], 0, 0, hashlib.sha256()
    with open(path, "wb") as f:
        f.write(header)  # rewritten at the end for the count kept (at most ``count``)
        for (_, label), (payload, hw, image_sums, own) in samples:
            f.write(payload)
            digest.update(payload)
            labels.append(label)
            offsets.append(offsets[-1] + len(payload))
            sizes.append(hw)
            sums, reencoded = sums + image_sums, reencoded + (not own)
        if not labels:
            raise FormatError(f"{where}: no readable images")
        f.seek(0)
        f.write(npy_header(dtype, (len(labels), *shape), len(header)) if raw else b"")
    if raw:
        images = np.load(path, mmap_mode="r")
        return {"images": images}, np.array(labels), sums, 0, digest.hexdigest()
    arrays = {
        "data": np.memmap(path, np.uint8, mode="r"),
        "offsets": np.array(offsets, np.int64),
        "sizes": np.array(sizes, np.int32),
    }
    return arrays, np.array(labels), sums, reencoded, digest.hexdigest()
