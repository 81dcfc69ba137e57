"""Known datasets as compact uint8 arrays: ``load_dataset`` finds the original files
(bundled MNIST, under ``root``, or downloaded against a pinned SHA-256), decodes them once,
strictly (binary formats only: CIFAR's pickles could run code), and keeps each split as a
store in the cache (``$LATECAST_CACHE``), memory-mapped by later loads (MNIST: ~4 ms, not ~1 s).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from ..data import Dataset, check_labels, from_arrays
from ..errors import ConfigError, FormatError, LatecastError, refuse
from ..kinds.jpegfiles import EncodedDataset
from .download import download, extract_tar
from .fileio import cache_dir
from .idxfile import check_role, read_idx
from .shards import is_shards
from .store import IMAGES, LABELS, META, open_store, read_meta, write_store
from .stream import open_shards


@dataclass(frozen=True)
class Spec:
    """Where a known dataset's files live and how to decode them."""

    reader: str  # key of _READERS: "idx" or "cifar"
    files: dict[str, tuple[str, ...]]  # split -> file names (idx: images, labels; cifar: batches)
    subdirs: tuple[str, ...]  # torchvision's folder under root, searched after root
    classes: tuple[str, ...]  # built-in class names
    suffixes: tuple[str, ...] = ("", ".gz")  # a file may be stored plain or gzipped
    bundled: bool = False  # shipped in latecast/bundled (used when no root is given)
    mirrors: tuple[str, ...] = ()  # https:// base URLs, tried in order
    archive: str = ""  # CIFAR: the .tar.gz download that holds ``files``
    record: int = 3073  # CIFAR: bytes per record, label byte(s) + 3072 pixels
    class_file: str = ""  # CIFAR: class names shipped next to the batches
    pickle_names: tuple[str, ...] = ()  # CIFAR's pickle "python version", refused by name
    sha256: dict[str, str] = field(default_factory=dict)  # downloaded file -> pinned SHA-256


_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_CIFAR100_CLASSES = tuple(
    """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle
    bowl boy bridge bus butterfly camel can castle caterpillar cattle chair chimpanzee clock
    cloud cockroach couch crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl
    hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree
    motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck
    pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal
    shark shrew skunk skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper
    table tank telephone television tiger tractor train trout tulip turtle wardrobe whale
    willow_tree wolf woman worm""".split()
)

# SHA-256 pins, as `sha256sum` prints them, each as at least two public sources give it:
# torchvision's prototype datasets (Fashion-MNIST, KMNIST), torchvision-ruby and MLDatasets.jl
# (the CIFAR binary archives). MNIST is bundled (bundled/SHA256SUMS), never downloaded.
_PINS = """
3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84  fashion-mnist/train-images-idx3-ubyte.gz
a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845  fashion-mnist/train-labels-idx1-ubyte.gz
346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073  fashion-mnist/t10k-images-idx3-ubyte.gz
67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5  fashion-mnist/t10k-labels-idx1-ubyte.gz
51467d22d8cc72929e2a028a0428f2086b092bb31cfb79c69cc0a90ce135fde4  kmnist/train-images-idx3-ubyte.gz
e38f9ebcd0f3ebcdec7fc8eabdcdaef93bb0df8ea12bee65224341c8183d8e17  kmnist/train-labels-idx1-ubyte.gz
edd7a857845ad6bb1d0ba43fe7e794d164fe2dce499a1694695a792adfac43c5  kmnist/t10k-images-idx3-ubyte.gz
20bb9a0ef54c7db3efc55a92eef5582c109615df22683c380526788f98e42a1c  kmnist/t10k-labels-idx1-ubyte.gz
c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd  cifar10/cifar-10-binary.tar.gz
58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec  cifar100/cifar-100-binary.tar.gz
"""  # noqa: E501


def _sums(text: str) -> dict[str, str]:
    """``{path: SHA-256}`` from ``sha256sum``'s lines."""
    words = text.split()  # hash, path, hash, path, ...
    return dict(zip(words[1::2], words[::2]))


def _pins(dataset: str) -> dict[str, str]:
    """``{file name: SHA-256}`` of ``dataset``'s downloads, from ``_PINS``."""
    return {p.split("/")[1]: h for p, h in _sums(_PINS).items() if p.split("/")[0] == dataset}


_TORONTO = ("https://www.cs.toronto.edu/~kriz/",)
# Fashion-MNIST's own S3 mirror is plain http, so it is not listed.
_SPECS = {
    "mnist": Spec("idx", _IDX_FILES, ("MNIST/raw",), tuple("0123456789"), bundled=True),
    "fashion-mnist": Spec(
        "idx",
        _IDX_FILES,
        ("FashionMNIST/raw",),
        (*"T-shirt/top Trouser Pullover Dress Coat Sandal Shirt Sneaker Bag".split(), "Ankle boot"),
        mirrors=(
            "https://storage.googleapis.com/tensorflow/tf-keras-datasets/",
            "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
        ),
    ),
    "kmnist": Spec(
        "idx",
        _IDX_FILES,
        ("KMNIST/raw",),
        tuple("o ki su tsu na ha ma ya re wo".split()),
        mirrors=("https://codh.rois.ac.jp/kmnist/dataset/kmnist/",),
    ),
    "cifar10": Spec(
        "cifar",
        {"train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)), "test": ("test_batch.bin",)},
        ("cifar-10-batches-bin",),
        tuple("airplane automobile bird cat deer dog frog horse ship truck".split()),
        suffixes=("",),
        mirrors=_TORONTO,
        archive="cifar-10-binary.tar.gz",
        class_file="batches.meta.txt",
        pickle_names=("cifar-10-batches-py", "cifar-10-python.tar.gz"),
    ),
    "cifar100": Spec(
        "cifar",
        {"train": ("train.bin",), "test": ("test.bin",)},
        ("cifar-100-binary",),
        _CIFAR100_CLASSES,
        suffixes=("",),
        mirrors=_TORONTO,
        archive="cifar-100-binary.tar.gz",
        record=3074,
        class_file="fine_label_names.txt",
        pickle_names=("cifar-100-python", "cifar-100-python.tar.gz"),
    ),
}
DATASETS: dict[str, Spec] = {name: replace(s, sha256=_pins(name)) for name, s in _SPECS.items()}
BUNDLED = Path(__file__).parent.parent / "bundled"  # latecast/bundled: package data


def load_dataset(
    name: str,
    split: str = "train",
    root: str | os.PathLike | None = None,
    *,
    mirrors: Sequence[str] | None = None,
) -> Dataset | EncodedDataset:
    """Load a known dataset as uint8 arrays, memory-mapped from the decoded cache (or a store:
    an ``EncodedDataset`` when it holds JPEG bytes).

    Args:
        name: ``"mnist"``, ``"fashion-mnist"``, ``"kmnist"``, ``"cifar10"``, ``"cifar100"``,
            or the folder of a store written by ``latecast convert`` / ``store.write_store``.
        split: ``"train"`` or ``"test"``; mean/std always come from the train split.
        root: folder with the original files (plain or ``.gz``), directly or in torchvision's
            layout (``MNIST/raw``, ``cifar-10-batches-bin``, ...). Default: ``$LATECAST_DATA``
            (MNIST ignores it and uses its bundled copy); with neither, missing files are
            downloaded into the cache folder.
        mirrors: base URLs to download from instead of the built-in https mirrors (default:
            ``$LATECAST_MIRRORS``, comma-separated).

    Example:
        >>> train = load_dataset("mnist")   # bundled: works offline
        >>> test = load_dataset("cifar10", "test", root="~/data")
    """
    path = (str, os.PathLike)
    refuse(
        [
            (isinstance(name, path), "name", name, "a dataset name or a store folder"),
            (isinstance(split, str), "split", split, "a split's name, train or test"),
            (root is None or isinstance(root, path), "root", root, "a folder or None"),
        ]
    )
    name = os.fspath(name)
    spec = DATASETS.get(name)
    if spec is None and is_shards(name):  # WebDataset tar shards, streamed
        return open_shards(name, split)
    if spec is None and Path(name).expanduser().is_dir():  # a store from `latecast convert`
        return open_store(Path(name).expanduser(), split)
    if spec is None:
        raise ConfigError(
            f"unknown dataset {name!r}; known: {', '.join(DATASETS)}, "
            "or a store folder made by `latecast convert`"
        )
    if split not in spec.files:
        raise ConfigError(f"unknown split {split!r} for {name}; valid: {', '.join(spec.files)}")
    ds = _cached(name, spec, split, _sources(name, spec, split, root, mirrors))
    if split != "train":  # test data is normalized with the train statistics
        train = load_dataset(name, "train", root, mirrors=mirrors)
        ds = replace(ds, mean=train.mean, std=train.std)
    return ds


def _sources(name: str, spec: Spec, split: str, root, mirrors) -> list[Path]:
    """The split's original files: under root, bundled, or downloaded into the cache."""
    if root is None and not spec.bundled:
        root = os.environ.get("LATECAST_DATA") or None
    if root is not None:
        return _find(name, spec, split, Path(root).expanduser())
    if spec.bundled:
        return [BUNDLED / f"{f}.gz" for f in spec.files[split]]
    home = cache_dir() / "downloads" / name
    try:
        return _find(name, spec, split, home)
    except FormatError:
        _fetch(spec, split, home, mirrors)
        return _find(name, spec, split, home)


def _find(name: str, spec: Spec, split: str, root: Path) -> list[Path]:
    """Each file of the split in root or root/<torchvision folder>, plain or gzipped."""
    found, missing, folders = [], [], (root, *(root / s for s in spec.subdirs))
    for fname in spec.files[split]:
        tried = [d / (fname + sfx) for d in folders for sfx in spec.suffixes]
        hit = next((p for p in tried if p.is_file()), None)
        found.append(hit)
        missing += tried if hit is None else []
    if not missing:
        return found
    for pickled in spec.pickle_names:
        if root.name == pickled or (root / pickled).exists():
            raise FormatError(
                f"{root / pickled if root.name != pickled else root}: CIFAR's pickle "
                "'python version' is not supported because unpickling can run "
                f"arbitrary code; use the binary version ({spec.archive}) instead"
            )
    raise FormatError(
        f"{name} {split}: file(s) not found under {root}; looked for {', '.join(map(str, missing))}"
    )


def _cached(name: str, spec: Spec, split: str, sources: list[Path]) -> Dataset:
    """The split memory-mapped from its cache store, else decoded and kept there (rewritten
    where damaged or of other files)."""
    identity = "; ".join(
        f"{p.resolve()} ({st.st_size} bytes, mtime_ns {st.st_mtime_ns})"
        for p, st in ((p, p.stat()) for p in sources)
    )
    key = hashlib.sha256(json.dumps([str(p.resolve()) for p in sources]).encode()).hexdigest()[:12]
    folder = cache_dir() / "decoded" / f"{name}-{split}-{key}"
    with contextlib.suppress(FormatError):
        if read_meta(folder).get("source") == identity:
            return open_store(folder)
    for p in sources:
        if p.parent == BUNDLED:
            _check_bundled(p)
    classes = _classes(spec, sources[0].parent)
    images, labels = _READERS[spec.reader](sources, spec, len(classes))
    ds = from_arrays(images, labels, name=name, split=split, classes=classes)
    try:
        for file in (META, IMAGES, LABELS):  # our own cache entry: replaced, even when damaged
            (folder / file).unlink(missing_ok=True)
        return open_store(write_store(ds, folder, source=identity))
    except (OSError, LatecastError) as e:  # a read-only home still gets its data, slower
        warnings.warn(
            f"cannot write the dataset cache {folder}: {e}; it will be decoded again", stacklevel=3
        )
        return ds


def _check_bundled(path: Path) -> None:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()  # at most 10 MB, read once per decode
    sums_file = BUNDLED / "SHA256SUMS"
    sums = _sums(sums_file.read_text())
    if sums.get(path.name) != digest:
        raise FormatError(
            f"{path}: SHA-256 {digest} does not match {sums.get(path.name)} listed in "
            f"{sums_file}; the installed package is damaged, reinstall latecast"
        )


def _classes(spec: Spec, folder: Path) -> tuple[str, ...]:
    path = folder / spec.class_file
    if not spec.class_file or not path.is_file():
        return spec.classes
    names = tuple(filter(None, map(str.strip, path.read_text(errors="replace").splitlines())))
    if len(names) != len(spec.classes):
        raise FormatError(f"{path}: expected {len(spec.classes)} class names, found {len(names)}")
    return names


def _read_idx(paths: list[Path], spec: Spec, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    image_path, label_path = paths
    images = check_role(read_idx(image_path), "images", str(image_path))
    labels = check_role(read_idx(label_path), "labels", str(label_path))
    if len(images) != len(labels):
        raise FormatError(
            f"{image_path} holds {len(images)} images but {label_path} holds {len(labels)} labels"
        )
    check_labels(labels, n_classes, label_path)
    return images[..., None], labels  # (N, H, W) -> (N, H, W, 1)


def parse_cifar(data: bytes, name: str, record: int = 3073) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR binary records (``data``: the whole file, ``name`` in messages) as uint8 images
    ``(N, 32, 32, 3)`` and labels ``(N,)``: a record is its label byte(s), then the R, G, B
    32x32 planes; CIFAR-100's (``record=3074``) coarse then fine label: the fine one."""
    if not data:
        raise FormatError(f"{name}: empty file, expected {record}-byte CIFAR records")
    n, rest = divmod(len(data), record)
    if rest or n == 0:
        raise FormatError(
            f"{name}: {len(data):,} bytes is not a whole number of {record}-byte "
            f"CIFAR records ({n} records and {rest} bytes left over)"
        )
    rows = np.frombuffer(data, np.uint8).reshape(n, record)
    labels = rows[:, record - 3073].copy()  # the last label byte: CIFAR-100's fine label
    planes = rows[:, record - 3072 :].reshape(n, 3, 32, 32)  # (N, C, H, W)
    return np.ascontiguousarray(planes.transpose(0, 2, 3, 1)), labels  # (N, H, W, C)


def _read_cifar(paths: list[Path], spec: Spec, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    parts = []
    for path in paths:
        parts.append(parse_cifar(path.read_bytes(), str(path), spec.record))
        check_labels(parts[-1][1], n_classes, path)
    return tuple(np.concatenate(p) for p in zip(*parts))


_READERS = {"idx": _read_idx, "cifar": _read_cifar}


def _fetch(spec: Spec, split: str, home: Path, mirrors: Sequence[str] | None) -> None:
    """Download what the split needs into ``home`` (CIFAR: the archive, then unpack it)."""
    env = [b for b in os.environ.get("LATECAST_MIRRORS", "").split(",") if b.strip()]
    bases = [b.strip().rstrip("/") for b in (mirrors or env or spec.mirrors)]
    names = [spec.archive] if spec.archive else [f + ".gz" for f in spec.files[split]]
    for fname in names:
        download([f"{b}/{fname}" for b in bases], home / fname, spec.sha256[fname])
    if spec.archive:
        folder = spec.subdirs[0]
        wanted = {f"{folder}/{f}" for files in spec.files.values() for f in files}
        try:
            extract_tar(home / spec.archive, home, wanted | {f"{folder}/{spec.class_file}"})
        finally:
            (home / spec.archive).unlink(missing_ok=True)
