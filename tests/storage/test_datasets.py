"""load_dataset: bundled MNIST, root layouts, CIFAR binary, the decoded cache."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from _helpers import cifar_records

from latecast.data import Dataset
from latecast.errors import ConfigError, FormatError, LatecastError
from latecast.storage import datasets
from latecast.storage.datasets import DATASETS, load_dataset, parse_cifar
from latecast.storage.idxfile import read_idx, write_idx
from latecast.storage.store import open_store

# from the bundled files' README
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
IMAGES, LABELS = "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"  # a root's train files


def make_idx_root(root: Path, n: int = 12, compress: bool = True, seed: int = 0) -> dict:
    """A tiny MNIST-style dataset (8x8 images) in the original file names."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, prefix, count in (("train", "train", n), ("test", "t10k", n // 2)):
        images = rng.integers(0, 256, (count, 8, 8), dtype=np.uint8)
        labels = (np.arange(count) % 10).astype(np.uint8)
        sfx = ".gz" if compress else ""
        write_idx(root / f"{prefix}-images-idx3-ubyte{sfx}", images, compress=compress)
        write_idx(root / f"{prefix}-labels-idx1-ubyte{sfx}", labels, compress=compress)
        arrays[split] = (images, labels)
    return arrays


def make_cifar10_root(folder: Path, per_batch: int = 3, meta: bool = False, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = {"train": [], "test": []}
    for fname in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        images = rng.integers(0, 256, (per_batch, 32, 32, 3), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch, dtype=np.uint8)
        (folder / fname).write_bytes(cifar_records(images, labels))
        out["test" if fname.startswith("test") else "train"].append((images, labels))
    if meta:
        (folder / "batches.meta.txt").write_text("\n".join(f"thing{i}" for i in range(10)) + "\n\n")
    return {k: tuple(map(np.concatenate, zip(*v))) for k, v in out.items()}


# --- bundled MNIST ----------------------------------------------------------------------


def test_mnist_bundled_train_and_test():
    train, test = load_dataset("mnist"), load_dataset("mnist", "test")
    assert isinstance(train, Dataset) and train.name == "mnist" and test.split == "test"
    assert train.images.shape == (60000, 28, 28, 1) and train.images.dtype == np.uint8
    assert test.images.shape == (10000, 28, 28, 1) and test.labels.dtype == np.uint8
    assert np.bincount(train.labels).tolist() == MNIST_TRAIN_COUNTS
    assert np.bincount(test.labels).tolist() == MNIST_TEST_COUNTS
    assert train.classes == tuple("0123456789")
    assert train.mean == pytest.approx((0.1307,), abs=1e-4)
    assert train.std == pytest.approx((0.3081,), abs=1e-4)
    assert test.mean == train.mean and test.std == train.std  # test uses the train statistics


def test_mnist_cache_equals_the_original_files():
    train = load_dataset("mnist")
    for got, kind in ((train.images[..., 0], "images-idx3"), (train.labels, "labels-idx1")):
        np.testing.assert_array_equal(got, read_idx(datasets.BUNDLED / f"train-{kind}-ubyte.gz"))


def test_second_load_maps_what_the_first_decoded(fresh_cache):
    first = load_dataset("mnist")
    [cached] = fresh_cache.glob("decoded/mnist-train-*/images.npy")
    written = cached.stat().st_mtime_ns
    second = load_dataset("mnist")
    assert isinstance(second.images, np.memmap) and not second.images.flags.writeable
    assert Path(second.images.filename) == cached and cached.stat().st_mtime_ns == written
    assert second.mean == first.mean


def test_bundled_file_with_wrong_sha256_is_refused(tmp_path, monkeypatch):
    (bundled := tmp_path / "bundled").mkdir()
    for f in ("SHA256SUMS", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(datasets.BUNDLED / f, bundled / f)
    labels = bundled / "t10k-labels-idx1-ubyte.gz"  # same content, other compression: other hash
    labels.write_bytes(gzip.compress(gzip.decompress(labels.read_bytes()), compresslevel=1))
    monkeypatch.setattr(datasets, "BUNDLED", bundled)
    with pytest.raises(FormatError, match=f"{labels}: SHA-256 .* does not match"):
        load_dataset("mnist", "test")


def test_mnist_ignores_latecast_data_but_uses_an_explicit_root(tmp_path, monkeypatch):
    monkeypatch.setenv("LATECAST_DATA", str(tmp_path / "empty"))
    assert len(load_dataset("mnist", "test")) == 10000
    arrays = make_idx_root(tmp_path / "mine")
    mine = load_dataset("mnist", root=tmp_path / "mine")
    np.testing.assert_array_equal(mine.images[..., 0], arrays["train"][0])


# --- roots in the original and torchvision layouts --------------------------------------


@pytest.mark.parametrize(
    "name,sub",
    [("fashion-mnist", "FashionMNIST/raw"), ("kmnist", "KMNIST/raw"), ("mnist", "MNIST/raw"),
     ("kmnist", "")],
)  # fmt: skip
@pytest.mark.parametrize("compress", [True, False])
def test_idx_root_layouts(tmp_path, name, sub, compress):
    arrays = make_idx_root(tmp_path / sub, compress=compress)
    for split in ("train", "test"):
        ds = load_dataset(name, split, root=tmp_path)
        images, labels = arrays[split]
        assert ds.images.shape == images.shape + (1,)
        np.testing.assert_array_equal(ds.images[..., 0], images)
        np.testing.assert_array_equal(ds.labels, labels)
        assert ds.classes == DATASETS[name].classes
        assert ds.mean == pytest.approx((arrays["train"][0].mean() / 255,))


def test_latecast_data_is_the_default_root(tmp_path, monkeypatch):
    arrays = make_idx_root(tmp_path)
    monkeypatch.setenv("LATECAST_DATA", str(tmp_path))
    np.testing.assert_array_equal(load_dataset("fashion-mnist").labels, arrays["train"][1])


def test_missing_file_names_every_path_looked_for(tmp_path):
    make_idx_root(tmp_path)
    (tmp_path / LABELS).unlink()
    with pytest.raises(FormatError) as err:
        load_dataset("fashion-mnist", root=tmp_path)
    message, raw = str(err.value), tmp_path / "FashionMNIST" / "raw"
    assert "\n" not in message
    for looked in (tmp_path / LABELS, raw / "train-labels-idx1-ubyte"):
        assert str(looked) in message


def bad_labels(root: Path, labels: np.ndarray) -> str:
    """``labels`` as the train labels of a ``make_idx_root`` root; what loading it says."""
    make_idx_root(root)
    write_idx(root / LABELS, labels, compress=True)
    with pytest.raises(FormatError) as err:
        load_dataset("kmnist", root=root)
    return str(err.value)


def test_image_and_label_counts_must_agree(tmp_path):
    images, labels = tmp_path / IMAGES, tmp_path / LABELS
    said = bad_labels(tmp_path, np.zeros(11, np.uint8))
    assert said == f"{images} holds 12 images but {labels} holds 11 labels"


def test_label_out_of_range_names_the_first_bad_index(tmp_path):
    bad = (np.arange(12) % 10).astype(np.uint8)
    bad[[4, 9]] = [10, 200]
    assert "label 10 at index 4 is outside 0..9" in bad_labels(tmp_path, bad)


def test_files_swapped_between_roles(tmp_path):
    make_idx_root(tmp_path)
    images, labels = tmp_path / IMAGES, tmp_path / LABELS
    images.rename(tmp_path / "x")
    labels.rename(images)
    (tmp_path / "x").rename(labels)
    with pytest.raises(FormatError, match=f"expected images .* but {images} holds uint8 labels"):
        load_dataset("kmnist", root=tmp_path)
    write_idx(images, np.zeros((12, 8, 8), np.float32))
    with pytest.raises(FormatError, match="holds float32 images"):
        load_dataset("kmnist", root=tmp_path)


@pytest.mark.parametrize("name,split", [("imagenet", "train"), ("mnist", "val")])
def test_unknown_name_or_split_lists_valid_values(name, split):
    with pytest.raises(ConfigError, match="cifar100" if name == "imagenet" else "train, test"):
        load_dataset(name, split)


# --- CIFAR binary -----------------------------------------------------------------------


@pytest.mark.parametrize("meta", [False, True])
def test_cifar10_binary(tmp_path, meta):
    arrays = make_cifar10_root(tmp_path / "cifar-10-batches-bin", meta=meta)
    for split in ("train", "test"):
        ds = load_dataset("cifar10", split, root=tmp_path)
        images, labels = arrays[split]
        assert ds.images.shape == images.shape and len(ds) == (15 if split == "train" else 3)
        np.testing.assert_array_equal(ds.images, images)
        np.testing.assert_array_equal(ds.labels, labels)
        things = tuple(f"thing{i}" for i in range(10))
        assert len(ds.mean) == 3 and ds.classes == (things if meta else DATASETS["cifar10"].classes)


def test_cifar_planes_become_channels():
    record = bytes([7]) + bytes([10]) * 1024 + bytes([20]) * 1024 + bytes([30]) * 1024
    images, labels = parse_cifar(record * 2, "two.bin")
    assert images.shape == (2, 32, 32, 3) and labels.tolist() == [7, 7]
    assert images[1, 31, 0].tolist() == [10, 20, 30] and images.flags.c_contiguous


def test_cifar100_uses_the_fine_label(tmp_path):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    fine, coarse = np.array([99, 0, 42, 7], np.uint8), np.array([19, 3, 1, 0], np.uint8)
    (folder := tmp_path / "cifar-100-binary").mkdir()
    for fname in ("train.bin", "test.bin"):
        (folder / fname).write_bytes(cifar_records(images, fine, coarse))
    ds = load_dataset("cifar100", "test", root=tmp_path)
    assert ds.labels.tolist() == [99, 0, 42, 7] and ds.num_classes == 100
    np.testing.assert_array_equal(ds.images, images)
    assert ds.classes[:2] == ("apple", "aquarium_fish")


def cifar_refused(root: Path, change) -> str:
    """What loading a CIFAR-10 root's test split says once ``change`` rewrote its file."""
    make_cifar10_root(root / "cifar-10-batches-bin")
    rewrite(root / "cifar-10-batches-bin" / "test_batch.bin", change)
    with pytest.raises(FormatError) as err:
        load_dataset("cifar10", "test", root=root)
    return str(err.value)


def test_cifar_size_not_whole_records(tmp_path):
    message = cifar_refused(tmp_path, lambda _: b"\1" * (3073 * 2 + 100))
    assert str(tmp_path / "cifar-10-batches-bin" / "test_batch.bin") in message
    assert "6,246 bytes" in message and "2 records and 100 bytes left over" in message


def test_cifar_label_out_of_range(tmp_path):
    message = cifar_refused(tmp_path, lambda b: b[: 3073 * 2] + b"\n" + b[3073 * 2 + 1 :])
    assert "test_batch.bin: label 10 at index 2 is outside 0..9" in message  # the third's


@pytest.mark.parametrize("where", ["inside", "itself"])
def test_cifar_pickle_version_is_refused(tmp_path, where):
    (pickled := tmp_path / "cifar-10-batches-py").mkdir()
    (pickled / "data_batch_1").write_bytes(b"\x80\x04 pretend pickle")
    root = tmp_path if where == "inside" else pickled
    with pytest.raises(FormatError, match="pickle .* not supported because unpickling can run"):
        load_dataset("cifar10", root=root)


def test_cifar_parser_fuzz():
    rng = random.Random(7)
    good = cifar_records(np.zeros((2, 32, 32, 3), np.uint8), np.array([1, 2], np.uint8))
    corpus = [good, good[:-1], good + b"\0", b"", b"\0" * 3072, b"\0" * 3074]
    corpus += [bytes(rng.randrange(256) for _ in range(rng.randrange(7000))) for _ in range(40)]
    for data in corpus:
        for record in (3073, 3074):
            try:
                images, labels = parse_cifar(data, "fuzz.bin", record)
            except LatecastError as e:
                assert "fuzz.bin" in str(e)
                continue
            assert images.shape == (len(data) // record, 32, 32, 3)
            assert labels.shape == images.shape[:1]


# --- the decoded cache: one store per split ----------------------------------------------


def rewrite(path: Path, change) -> None:
    path.write_bytes(change(path.read_bytes()))


def corrupt_meta_shape(folder: Path):
    meta = json.loads((folder / "meta.json").read_text())
    meta["images"]["shape"][0] = 11
    (folder / "meta.json").write_text(json.dumps(meta))


def corrupt_labels_out_of_range(folder: Path):
    labels = np.load(folder / "labels.npy")
    labels[3] = 250
    np.save(folder / "labels.npy", labels)


OLD_META = json.dumps({"version": 1, "classes": list("0123456789")})  # the .npy cache before stores
CORRUPTIONS = {
    "truncate": lambda f: rewrite(f / "images.npy", lambda b: b[:-50]),
    "meta_garbage": lambda f: (f / "meta.json").write_text("{not json"),
    "meta_shape": corrupt_meta_shape,
    "pickled_labels": lambda f: np.save(
        f / "labels.npy", np.array([{"x": 1}] * 12, dtype=object), allow_pickle=True
    ),
    "empty": lambda f: (f / "images.npy").write_bytes(b""),
    "labels_out_of_range": corrupt_labels_out_of_range,
    "appended": lambda f: rewrite(f / "images.npy", lambda b: b + b"\0" * 64),
    "meta_removed": lambda f: (f / "meta.json").unlink(),
    "old_format": lambda f: (f / "meta.json").write_text(OLD_META),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS)
def test_damaged_cache_store_is_decoded_again_and_rewritten(tmp_path, fresh_cache, corrupt):
    arrays = make_idx_root(tmp_path / "data")
    load_dataset("kmnist", root=tmp_path / "data")
    (folder,) = fresh_cache.glob("decoded/kmnist-train-*")
    corrupt(folder)
    with pytest.raises(FormatError):
        open_store(folder)
    ds = load_dataset("kmnist", root=tmp_path / "data")
    np.testing.assert_array_equal(ds.images[..., 0], arrays["train"][0])
    np.testing.assert_array_equal(ds.labels, arrays["train"][1])
    assert isinstance(ds.images, np.memmap)  # rewritten, then mapped again
    cached = open_store(folder)  # a valid store again, holding the same data
    np.testing.assert_array_equal(cached.images, ds.images)
    assert (cached.name, cached.split, cached.mean) == ("kmnist", "train", ds.mean)


def test_changed_source_file_invalidates_the_cache(tmp_path):
    make_idx_root(tmp_path)
    assert load_dataset("kmnist", root=tmp_path).labels[0] == 0
    labels = tmp_path / LABELS
    stat = labels.stat()
    write_idx(labels, np.full(12, 5, np.uint8), compress=True)
    os.utime(labels, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert load_dataset("kmnist", root=tmp_path).labels.tolist() == [5] * 12


def test_unwritable_cache_still_loads(tmp_path, monkeypatch):
    make_idx_root(tmp_path / "data")
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("LATECAST_CACHE", str(blocker))
    with pytest.warns(UserWarning, match="cannot write the dataset cache"):
        ds = load_dataset("kmnist", root=tmp_path / "data")
    assert len(ds) == 12


def test_test_split_uses_the_train_statistics_when_cached_too(tmp_path):
    arrays = make_idx_root(tmp_path)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", arrays["test"][0] // 4, compress=True)  # dark
    train_mean = arrays["train"][0].mean() / 255
    for _ in range(2):  # decoded and written, then read back from the cache
        assert load_dataset("kmnist", "test", root=tmp_path).mean == pytest.approx((train_mean,))
