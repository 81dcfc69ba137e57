"""Image folder -> store (``convert_folder``, ``latecast convert``; docs/RELIABILITY.md row 11)."""

from __future__ import annotations

import os
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np

from .data import Dataset, channel_stats
from .errors import ConfigError, FormatError
from .fileio import atomic_folder
from .store import SKIPPED, SPLIT_NAMES, check_replaceable, empty_images, finish_split

MAX_PIXELS = 10_000 * 10_000  # larger images are rejected from the header, before decoding
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


def _find_splits(folder: Path) -> dict[str, Path]:
    """``{"train": .., "test": ..}`` when the top level holds only ``train`` plus ``test``
    and/or ``val``; else ``{"": folder}``: the folder is one split of class subfolders."""
    subdirs = {p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")}
    if "train" in subdirs and len(subdirs) > 1 and subdirs <= set(SPLIT_NAMES):
        return {name: folder / name for name in SPLIT_NAMES if name in subdirs}
    return {"": folder}


def _list_images(
    root: Path, classes: tuple[str, ...] | None
) -> tuple[tuple[str, ...], list[tuple[Path, int]]]:
    """Class names (sorted subfolders, as torchvision's ImageFolder) and ``(file, label)``s.
    Other splits reuse the train split's classes, so a label means the same class in each."""
    found = tuple(
        sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    )
    classes = classes or found
    if set(found) - set(classes) or not classes:
        raise FormatError(
            f"{root}: class folders {sorted(set(found) - set(classes)) or 'missing'}; "
            f"expected subfolders of {list(classes) or 'one folder per class'}"
        )
    if len(classes) > 1 << 16:
        raise FormatError(f"{root}: {len(classes)} classes, at most 65536 fit uint16 labels")
    files = [
        (p, label)
        for label, name in enumerate(classes)
        if (root / name).is_dir()
        for p in sorted((root / name).rglob("*"))
        if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".") and p.is_file()
    ]
    return classes, files


def _decode(path: Path, fn: Callable):
    """``fn(image)`` of the fully decoded ``path``; an unreadable or huge file is a FormatError."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # MAX_PIXELS is the cap
            with Image.open(path) as im:
                if im.width * im.height > MAX_PIXELS:
                    raise FormatError(
                        f"{path}: {im.width}x{im.height} image is larger than "
                        f"the {MAX_PIXELS:,} pixels allowed"
                    )
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


def convert_folder(
    folder: str | os.PathLike,
    out: str | os.PathLike,
    *,
    size: tuple[int, int] | None = None,
    skip_bad: bool = False,
) -> tuple[Path, list[str]]:
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
        raise ConfigError(
            f"{out}: the store cannot be the image folder {folder}, hold it, or "
            f"lie inside it; choose a folder outside it"
        )
    if size is not None and (
        len(size) != 2 or not all(type(v) is int and 0 < v <= 10_000 for v in size)
    ):
        raise ConfigError(f"size must be (height, width) in 1..10000 pixels, got {size!r}")
    classes, splits, skipped = _check_all(folder, skip_bad)
    infos = [info for items in splits.values() for _, _, info in items]
    mode = "L" if all(gray for gray, _ in infos) else "RGB"
    size = tuple(size or Counter(hw for _, hw in infos).most_common(1)[0][0])
    shape = (*size, 1 if mode == "L" else 3)  # (H, W, C)
    with atomic_folder(out, check_replaceable) as tmp:
        stats = None
        for name, items in splits.items():  # train first: its mean/std serve every split
            (tmp / name).mkdir(exist_ok=True)
            images = empty_images(tmp / name, (len(items), *shape))
            for i, (path, _, _) in enumerate(items):  # pass 2
                pixels = _decode(path, lambda im: np.asarray(_fit(im.convert(mode), size)))
                images[i] = pixels.reshape(shape)  # (H, W) for "L" -> (H, W, 1)
            images.flush()
            stats = stats or channel_stats(images)
            labels = np.array(
                [lb for _, lb, _ in items], np.uint8 if len(classes) <= 256 else np.uint16
            )
            ds = Dataset(folder.resolve().name, name or "train", images, labels, classes, *stats)
            finish_split(tmp / name, ds, f"image folder {folder.resolve()}")
            del images, ds  # close the memmap before the folder is renamed
        if skip_bad:
            (tmp / SKIPPED).write_text("".join(f"{p}\t{why}\n" for p, why in skipped))
    return out, [p for p, _ in skipped]
