"""The on-disk store: round trip, every corruption (raw and jpeg stores), kill -9 during a
write, and image-folder conversion with bad files."""

import io
import json
import os
import signal
import struct
import subprocess
import sys
import time
import warnings
import zlib
from dataclasses import replace
from functools import partial
from pathlib import Path

import _helpers
import numpy as np
import pytest
from _helpers import damage_mid_store, damage_scan, jpeg_bytes, noise_jpeg, silent_damage, tree
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from latecast.data import Dataset, from_arrays
from latecast.errors import ConfigError, FormatError, LatecastError
from latecast.kinds.jpegfiles import EncodedDataset
from latecast.loader import Loader
from latecast.storage import store
from latecast.storage.convert import convert_folder
from latecast.storage.store import open_store, write_store

small = partial(_helpers.small, n=10, shape=(6, 5, 3), classes=4)


def same(a: Dataset, b: Dataset) -> bool:
    arrays = np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    described = [(x.labels.dtype, x.name, x.split, x.classes) for x in (a, b)]
    stats = np.allclose(a.mean, b.mean) and np.allclose(a.std, b.std)
    return arrays and described[0] == described[1] and stats


# ---- round trip and layout -------------------------------------------------------------


def test_round_trip_is_equal_and_a_read_only_memmap(tmp_path):
    ds = small()
    out = write_store(ds, tmp_path / "s", source="sha256:abc")
    assert sorted(p.name for p in out.iterdir()) == ["images.npy", "labels.npy", "meta.json"]
    back = open_store(out)
    assert same(ds, back)
    assert isinstance(back.images, np.memmap) and not back.images.flags.writeable
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["schema"], meta["count"], meta["source"]) == (1, 10, "sha256:abc")
    assert meta["images"]["shape"] == [10, 6, 5, 3] and meta["labels"]["dtype"] == "uint8"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_uint16_labels_and_memmap_source_written_in_chunks(tmp_path, monkeypatch):
    src = np.lib.format.open_memmap(tmp_path / "src.npy", "w+", np.uint8, (300, 8, 8, 1))
    src[:] = np.arange(300, dtype=np.uint8)[:, None, None, None]
    ds = from_arrays(src, np.arange(300), classes=[str(i) for i in range(300)])
    monkeypatch.setattr(store, "CHUNK_BYTES", 1000)  # 15 images per chunk: many chunks
    back = open_store(write_store(ds, tmp_path / "s"))
    assert back.labels.dtype == np.uint16 and same(ds, back)


def test_replaces_a_store_but_never_other_data(tmp_path):
    out = write_store(small(seed=1), tmp_path / "s")
    write_store(small(seed=2), out)
    assert same(open_store(out), small(seed=2))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match=r"not a latecast store \(.+\); refusing"):
        write_store(small(), tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_write_rejects_labels_outside_classes(tmp_path):
    ds, labels = small(), np.array([0, 1, 2, 3, 9, 0, 1, 2, 3, 0], np.uint8)
    bad = Dataset("x", "train", labels, ds.classes, ds.mean, ds.std, ds.images)
    with pytest.raises(FormatError, match="label 9 at index 4 is outside 0..3"):
        write_store(bad, tmp_path / "s")
    assert not list(tmp_path.iterdir())


# ---- a damaged store is refused, naming the file ---------------------------------


def edit_meta(out: Path, fn) -> None:
    meta = json.loads((out / "meta.json").read_text())
    fn(meta)
    (out / "meta.json").write_text(json.dumps(meta))


def resign(out: Path, key: str, name: str) -> None:
    """Make meta.json agree with a replaced file's size and fingerprint (a careful forger)."""

    def fix(meta):
        meta[key]["bytes"] = (out / name).stat().st_size
        meta[key]["sha256_head_tail"] = store._fingerprint(out / name)

    edit_meta(out, fix)


def truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:-7])


def stale(p: Path) -> None:  # another conversion's file: same shape and size, other pixels
    np.save(p, small(seed=99).images)


CORRUPTIONS = {
    "truncated images": (lambda o: truncate(o / "images.npy"),
                         r"images\.npy: \d+ bytes, meta\.json says"),
    "truncated labels": (lambda o: truncate(o / "labels.npy"), r"labels\.npy: \d+ bytes"),
    "empty images": (lambda o: (o / "images.npy").write_bytes(b""), r"images\.npy: 0 bytes"),
    "stale images": (lambda o: stale(o / "images.npy"), r"images\.npy: contents differ"),
    "missing labels": (lambda o: (o / "labels.npy").unlink(), r"labels\.npy: missing"),
    "missing meta": (lambda o: (o / "meta.json").unlink(), r"meta\.json is missing"),
    "meta not json": (lambda o: (o / "meta.json").write_text('{"schema": 1,'),
                      r"meta\.json: not valid JSON"),
    "meta schema": (lambda o: edit_meta(o, lambda m: m.update(schema=2)),
                    r"schema version 2, this latecast reads 1"),
    "meta count": (lambda o: edit_meta(o, lambda m: m.update(count=11)),
                   r"images\.npy: holds uint8 .* count 11"),
    "meta shape": (lambda o: edit_meta(o, lambda m: m["images"].update(shape=[10, 5, 6, 3])),
                   r"images\.npy: holds uint8 \[10, 6, 5, 3\], "
                   r"meta\.json says uint8 \[10, 5, 6, 3\]"),
    "meta dtype": (lambda o: edit_meta(o, lambda m: m["labels"].update(dtype="uint16")),
                   r"labels\.npy: holds uint8"),
    "meta field": (lambda o: edit_meta(o, lambda m: m.pop("classes")),
                   r"field 'classes' should be a list"),
    "meta mean": (lambda o: edit_meta(o, lambda m: m.update(mean=[0.5])),
                  r"mean/std need 3 channel values"),
    "meta std": (lambda o: edit_meta(o, lambda m: m.update(std=[0.2, 0.0, 0.2])),
                 r"meta\.json: mean/std need"),
    "meta classes": (lambda o: edit_meta(o, lambda m: m.update(classes=["a", "b"])),
                     r"labels\.npy: label 2 at index 2 is outside 0\.\.1"),
    "reshaped images": (lambda o: (np.save(o / "images.npy", small().images.reshape(10, 5, 6, 3)),
                                   resign(o, "images", "images.npy")),
                        r"holds uint8 \[10, 5, 6, 3\]"),
    "pickled labels": (lambda o: (np.save(o / "labels.npy", np.array([None] * 10, object),
                                          allow_pickle=True), resign(o, "labels", "labels.npy")),
                       r"labels\.npy: not a readable \.npy"),
    "bad label": (lambda o: (np.save(o / "labels.npy", np.array([0, 1, 2, 3, 0, 1, 7, 3, 0, 1],
                                                                np.uint8)),
                             resign(o, "labels", "labels.npy")),
                  r"label 7 at index 6 is outside 0\.\.3"),
}  # fmt: skip


def test_splits(tmp_path):
    root = tmp_path / "both"
    write_store(small(), root / "train")
    ds = small()
    test = Dataset("small", "test", ds.labels[:4], ds.classes, ds.mean, ds.std, ds.images[:4])
    write_store(test, root / "test")
    assert open_store(root).split == "train" and len(open_store(root, split="test")) == 4
    with pytest.raises(ConfigError, match=r"no split 'val'; this store has \['test', 'train'\]"):
        open_store(root, split="val")
    with pytest.raises(ConfigError, match="holds split 'train', asked for 'test'"):
        open_store(root / "train", split="test")


# ---- the jpeg store -------------------------------------------------------------------

ENCODED_ARRAYS = ("data", "offsets", "sizes", "labels")


def encoded(n: int = 6, seed: int = 0) -> EncodedDataset:
    """n JPEG files of several sizes, back to back, as ``latecast convert`` stores them."""
    rng = np.random.default_rng(seed)
    shapes = [(8 + 2 * (i % 3), 10 + i % 2) for i in range(n)]
    files = [jpeg_bytes(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in shapes]
    labels, data = (np.arange(n) % 3).astype(np.uint8), np.frombuffer(b"".join(files), np.uint8)
    offsets = np.cumsum([0, *map(len, files)]).astype(np.int64)
    stats = ("a", "b", "c"), (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    return EncodedDataset(
        "enc", "train", labels, *stats, data, offsets, np.array(shapes, np.int32), 3, (8, 10)
    )


def test_raw_and_encoded_datasets_share_their_checks_and_members():
    for ds in (small(), encoded()):
        said = r"/train: labels must be uint8/uint16 \(N,\), got int64"
        with pytest.raises(FormatError, match=said):
            replace(ds, labels=ds.labels.astype(np.int64))
        c = ds.image_shape[2]
        with pytest.raises(FormatError, match=f"mean/std need {c} finite channel values"):
            replace(ds, std=(0.0,) * c)
        assert len(ds) == len(ds.labels) and ds.num_classes == len(ds.classes)
        assert ds.label_bytes == ds.labels.nbytes > 0 and ds.image_bytes > 0


def same_encoded(a: EncodedDataset, b: EncodedDataset) -> bool:
    meta = ("name", "split", "classes", "mean", "std", "channels", "size")
    arrays = all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ENCODED_ARRAYS)
    return arrays and all(getattr(a, k) == getattr(b, k) for k in meta)


def test_jpeg_store_round_trip_keeps_every_file_byte_for_byte(tmp_path):
    ds = encoded()
    out = write_store(ds, tmp_path / "s", source="test")
    names = ["crc32.npy", "data.bin", "labels.npy", "meta.json", "offsets.npy", "sizes.npy"]
    assert sorted(p.name for p in out.iterdir()) == names
    back = open_store(out)
    assert isinstance(back, EncodedDataset) and same_encoded(ds, back)
    assert isinstance(back.data, np.memmap) and not back.data.flags.writeable
    assert (out / "data.bin").read_bytes() == ds.data.tobytes()  # the files, nothing else
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["encoding"], meta["size"], meta["channels"]) == ("jpeg", [8, 10], 3)
    write_store(encoded(seed=1), out)  # a jpeg store is a store: replaced
    assert same_encoded(open_store(out), encoded(seed=1))


def rewrite(out: Path, name: str, fn) -> None:
    """Replace one array of a store by ``fn(array)`` and re-sign it (a careful forger)."""
    np.save(out / name, fn(np.load(out / name)))
    resign(out, name.split(".")[0], name)


ENCODED_CORRUPTIONS = {
    "truncated data": (lambda o: truncate(o / "data.bin"),
                       r"data\.bin: \d+ bytes, meta\.json says"),
    "stale data": (lambda o: (o / "data.bin").write_bytes((o / "data.bin").read_bytes()[::-1]),
                   r"data\.bin: contents differ"),
    "empty data": (lambda o: ((o / "data.bin").write_bytes(b""), resign(o, "data", "data.bin")),
                   r"data\.bin: not a readable \.bin file"),
    "offsets not rising": (
        lambda o: rewrite(o, "offsets.npy", lambda a: a[[0, 2, 1, 3, 4, 5, 6]]),
        r"offsets\.npy: offsets must be int64, rising from 0 to the \d+ bytes of data\.bin"),
    "offsets short of the data": (
        lambda o: rewrite(o, "offsets.npy", lambda a: a - np.eye(1, 7, 6, np.int64)[0]),
        r"offsets\.npy: offsets must be int64, rising"),
    "offsets count": (lambda o: rewrite(o, "offsets.npy", lambda a: a[:-1]),
                      r"offsets\.npy: holds int64 \[6\]"),
    "missing offsets": (lambda o: (o / "offsets.npy").unlink(), r"offsets\.npy: missing"),
    "zero size": (lambda o: rewrite(o, "sizes.npy", lambda a: a * (np.arange(6) != 4)[:, None]),
                  r"sizes\.npy: sizes must be int32 \(height, width\) pairs"),
    "sizes per image": (lambda o: (rewrite(o, "sizes.npy", lambda a: np.ones((6, 3), np.int32)),
                                   edit_meta(o, lambda m: m["sizes"].update(shape=[6, 3]))),
                        r"sizes\.npy: sizes must be int32 \(height, width\) pairs"),
    "bad label": (lambda o: rewrite(o, "labels.npy",
                                    lambda a: a + np.uint8(5) * (np.arange(6) == 2)),
                  r"labels\.npy: label 7 at index 2 is outside 0\.\.2"),
    "meta encoding": (lambda o: edit_meta(o, lambda m: m.update(encoding="png")),
                      r"meta\.json: encoding 'png', this latecast reads raw, jpeg"),
    "meta channels": (lambda o: edit_meta(o, lambda m: m.update(channels=2)),
                      r"meta\.json: channels must be 1 or 3 and size"),
    "meta size": (lambda o: edit_meta(o, lambda m: m.update(size=[0, 10])),
                  r"meta\.json: channels must be 1 or 3 and size \(height, width\) in 1\.\.10000"),
    "meta field": (lambda o: edit_meta(o, lambda m: m.pop("sizes")),
                   r"field 'sizes' should be a dict"),
    "meta mean": (lambda o: edit_meta(o, lambda m: m.update(mean=[0.5])),
                  r"meta\.json: mean/std need 3 channel values"),
}  # fmt: skip


def test_a_jpeg_store_says_whether_its_files_are_plain_and_a_false_claim_is_named(tmp_path):
    """``plain`` (every file upright, 1 or 3 channels: no header read) is false with one
    turned file; a false claim is refused naming the sample, a bad or missing value names
    meta.json."""
    ds = encoded()
    out = write_store(ds, tmp_path / "plain")
    assert json.loads((out / "meta.json").read_text())["plain"] is True
    assert open_store(out).plain is True
    buf, exif = io.BytesIO(), Image.Exif()
    exif[0x0112] = 6  # stored 10x8, shown upright 8x10 as sizes.npy says
    turned = np.random.default_rng(1).integers(0, 256, (10, 8, 3), dtype=np.uint8)
    Image.fromarray(turned).save(buf, "JPEG", exif=exif.tobytes())
    files = [ds.data[a:b].tobytes() for a, b in zip(ds.offsets, ds.offsets[1:])]
    files[3] = buf.getvalue()
    data = np.frombuffer(b"".join(files), np.uint8)
    offsets = np.cumsum([0, *map(len, files)]).astype(np.int64)
    sizes = ds.sizes.copy()
    sizes[3] = (8, 10)
    out = write_store(replace(ds, data=data, offsets=offsets, sizes=sizes), tmp_path / "turned")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["plain"] is False and open_store(out).plain is False
    false_claim = (r"turned: sample 3: meta.json says every file is plain \(upright, 1 or 3 "
                   r"channels\), this one has EXIF orientation 6")  # fmt: skip
    for claim, why in [(True, false_claim), ("yes", r"meta.json: plain must be true or false")]:
        (out / "meta.json").write_text(json.dumps({**meta, "plain": claim}))
        with pytest.raises(FormatError, match=why):
            open_store(out)
    (out / "meta.json").write_text(json.dumps({**meta, "plain": True}))
    with pytest.raises(FormatError, match=r"sample 3: meta.json says every file is plain"):
        claimed = dict(data=data, offsets=offsets, sizes=sizes, plain=True)
        store.verify(replace(open_store(tmp_path / "plain"), **claimed), "s")
    del meta["plain"]
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match=r"meta.json: plain must be true or false"):
        open_store(out)


# a raw store and a jpeg store: how each is made, its files and the arrays it holds
KINDS = {
    "raw": (small, CORRUPTIONS, ("meta.json", "images.npy", "labels.npy"), ("images", "labels")),
    "jpeg": (encoded, ENCODED_CORRUPTIONS, ("meta.json", "data.bin", "offsets.npy", "sizes.npy",
             "labels.npy"), ENCODED_ARRAYS),
}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "damage"), [(k, d) for k, (_, damages, *_) in KINDS.items() for d in damages]
)
def test_damaged_store_is_refused_naming_the_file(tmp_path, kind, damage):
    make, damages, *_ = KINDS[kind]
    out = write_store(make(), tmp_path / "s")
    fn, message = damages[damage]
    fn(out)
    with pytest.raises(FormatError, match=message):
        open_store(out)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_byte_flip_or_cut_gives_equal_data_or_a_latecast_error(tmp_path_factory, kind, data):
    # meta.json's descriptive fields (name, source, class names, mean/std values) may be
    # edited by hand; whatever describes the files must agree with them.
    make, _, files, arrays = KINDS[kind]
    which = data.draw(st.sampled_from(files))
    out = write_store(make(), tmp_path_factory.mktemp("fuzz") / "s")
    raw = bytearray((out / which).read_bytes())
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    (out / which).write_bytes(bytes(raw))
    try:
        back = open_store(out)
    except LatecastError:
        return
    ref = make()
    assert all(np.array_equal(getattr(back, k), getattr(ref, k)) for k in arrays), which
    assert len(back.classes) == len(ref.classes) and back.labels.dtype == ref.labels.dtype
    for key in ("channels", "size"):  # a jpeg store's
        assert getattr(back, key, None) == getattr(ref, key, None)


@pytest.mark.parametrize("damage", [damage_scan, silent_damage], ids=["libjpeg-warns", "silent"])
def test_damaged_scan_data_mid_store_is_caught_by_verify_and_named_when_decoded(
    tmp_path, capfd, damage
):
    """Scan data damaged mid-store, libjpeg warning or silent (a bit flip, trained on unseen
    before the CRC-32s): ``verify`` and the first read name the sample; a store without
    CRC-32s gets libjpeg's warning only."""
    rng, k = np.random.default_rng(0), 48
    files = [noise_jpeg(rng) for _ in range(96)]
    ds = EncodedDataset(
        name="enc", split="train", data=np.frombuffer(b"".join(files), np.uint8),
        offsets=np.cumsum([0, *map(len, files)]).astype(np.int64),
        sizes=np.full((96, 2), 200, np.int32), labels=np.zeros(96, np.uint8), classes=("a",),
        mean=(0.5,) * 3, std=(0.25,) * 3, channels=3, size=(32, 32),
    )  # fmt: skip
    out = write_store(ds, tmp_path / "s")
    damage_mid_store(out / "data.bin", ds.offsets, k, damage)
    back = open_store(out)  # opening reads a sample of headers, not every scan
    with pytest.raises(FormatError, match=rf"s: sample {k}: the images differ from the SHA-256"):
        store.verify(back, "s")
    crc = (
        f"enc/train: sample {k}: its bytes differ from the CRC-32 its store kept when written "
        f"(damaged or edited since); `latecast info --verify` checks a store"
    )
    libjpeg = (
        f"enc/train: sample {k}: damaged JPEG data (libjpeg decodes it with a warning, part of "
        f"the image is wrong); `latecast info --verify` checks a store"
    )
    for kept in (True, False):
        capfd.readouterr()
        loader = Loader(back if kept else replace(back, crc32=None), 16, shuffle=False)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            batches = list(loader) + list(loader)  # a file is checked the first time it is read
        damaged = [str(w.message) for w in said if f"sample {k}" in str(w.message)]
        want = [crc] * kept + [libjpeg] * (damage is damage_scan) * 2  # libjpeg: each decode
        assert len(batches) == 12 and damaged == want, (kept, damaged)
        assert "Corrupt JPEG" not in capfd.readouterr().err  # libjpeg's own text never shows


@pytest.mark.parametrize("change", [lambda v: v * 2, lambda v: v // 2], ids=["larger", "smaller"])
def test_sizes_that_disagree_with_the_files_headers_are_a_format_error_naming_the_sample(
    tmp_path, change
):
    out = write_store(encoded(n=300), tmp_path / "s")
    sampled = set(np.linspace(0, 299, store.STRUCTURE_SAMPLE).astype(int).tolist())
    unsampled = next(i for i in range(300) if i not in sampled)

    def edit(i: int) -> str:
        sizes = np.load(out / "sizes.npy")
        h, w = sizes[i].tolist()
        rewrite(out, "sizes.npy", lambda a: np.where(np.arange(300)[:, None] == i, change(a), a))
        return f"sample {i}: the file is {h}x{w}, sizes.npy says {change(h)}x{change(w)}"

    seen = edit(299)  # the last file is always among those opening checks
    with pytest.raises(FormatError, match=f"{out}: {seen}"):
        open_store(out)
    write_store(encoded(n=300), out)
    unseen = edit(unsampled)
    ds = open_store(out)  # one entry of 300 outside the sample: seen when decoded
    with pytest.raises(FormatError, match=f"enc/train: {unseen}"):
        list(Loader(ds, 50, shuffle=False, device="cpu"))
    with pytest.raises(FormatError, match=f"s: {unseen}"):
        store.verify(ds, "s")


# ---- kill -9 mid-write leaves the previous store, and the next run starts clean ---

WRITER = """
import numpy as np, sys
from latecast.data import Dataset
from latecast.storage.store import write_store
images = np.broadcast_to(np.uint8(7), (4096, 256, 256, 1))  # 256 MiB, no memory used
labels = np.zeros(4096, np.uint8)
write_store(Dataset("big", "train", labels, ("a",), (0.5,), (0.5,), images), sys.argv[1])
"""


def test_kill_9_during_write_keeps_previous_store(tmp_path):
    out = write_store(small(), tmp_path / "s")
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(out)])
    partial = tmp_path / f".s.tmp-{child.pid}" / "images.npy"
    deadline = time.monotonic() + 60
    while not partial.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL, "the writer finished before it was killed"
    assert partial.exists()  # killed mid-write: its half store is still lying around
    assert same(open_store(out), small())  # ... but out is the previous good store
    busy = tmp_path / f".s.tmp-{os.getppid()}"  # a live writer's: our parent is alive
    busy.mkdir()
    write_store(small(seed=3), out)  # the next run removes the dead writer's leftovers only
    assert same(open_store(out), small(seed=3))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["s", busy.name])


def test_crash_between_renames_restores_the_old_store(tmp_path):
    # A writer died after renaming the old store away and before renaming its new one in.
    old = write_store(small(seed=4), tmp_path / "elsewhere")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    os.replace(old, tmp_path / f".s.old-{dead.pid}")
    (tmp_path / f".s.tmp-{dead.pid}").mkdir()
    ds = small()
    bad = Dataset("x", "train", np.full(10, 9, np.uint8), ("a",), ds.mean, ds.std, ds.images)
    with pytest.raises(FormatError):  # this write fails, so nothing replaces the restored store
        write_store(bad, tmp_path / "s")
    assert same(open_store(tmp_path / "s"), small(seed=4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


# ---- image-folder conversion ------------------------------------------------------


def image(path: Path, mode: str, size_wh: tuple[int, int], value: int, fmt="PNG") -> np.ndarray:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(value)
    shape = size_wh[::-1] if mode == "L" else (*size_wh[::-1], 3)
    arr = rng.integers(0, 256, shape, dtype=np.uint8)
    Image.fromarray(arr, mode).save(path, fmt)
    return np.asarray(Image.open(path).convert(mode))  # what a decoder returns (JPEG is lossy)


def png_header(w: int, h: int) -> bytes:
    """A PNG that claims w x h pixels (the header is all Pillow reads before decoding)."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 9)) + chunk(b"IEND", b"")
    return _helpers.PNG + body


def test_convert_grayscale_folder_exactly(tmp_path):
    src = tmp_path / "digits"
    expected = {}
    for i, cls in enumerate(["zero", "one", "two"]):
        for j in range(3):
            expected[(cls, j)] = image(src / cls / f"{j}.png", "L", (7, 5), 10 * i + j)
    image(src / "one" / "sub" / "deep.png", "L", (7, 5), 99)  # nested files count, like ImageFolder
    (src / "two" / "README.txt").write_text("not an image")
    (src / "two" / ".hidden.png").write_bytes(b"junk")
    out, skipped = convert_folder(src, tmp_path / "store", test_fraction=0)
    ds = open_store(out)
    assert skipped == [] and ds.classes == ("one", "two", "zero") and ds.image_shape == (5, 7, 1)
    assert sorted(ds.labels) == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    stored = {ds.images[i, :, :, 0].tobytes(): ds.labels[i] for i in range(len(ds))}
    for (cls, _), pixels in expected.items():  # lossless PNG kept exactly, with its class
        assert ds.classes[stored[pixels.tobytes()]] == cls
    assert ds.mean == pytest.approx([ds.images[:].mean() / 255])


def test_convert_mixed_png_jpeg_gray_rgb_and_sizes(tmp_path):
    src = tmp_path / "mix"
    gray = image(src / "a" / "0.png", "L", (8, 6), 1)
    rgb = image(src / "a" / "1.jpg", "RGB", (8, 6), 2, "JPEG")
    image(src / "b" / "2.jpeg", "L", (8, 6), 3, "JPEG")
    image(src / "b" / "3.png", "RGB", (16, 6), 4)  # wider: the one to be resized
    ds = open_store(convert_folder(src, tmp_path / "store", test_fraction=0, encoding="raw")[0])
    # RGB because not every image is grayscale; the most common size (H=6, W=8) wins.
    assert ds.image_shape == (6, 8, 3) and len(ds) == 4
    wide = Image.open(src / "b" / "3.png").resize((16, 6), Image.Resampling.BILINEAR)
    wide = wide.crop((4, 0, 12, 6))
    stored = {ds.images[i].tobytes() for i in range(len(ds))}
    assert np.repeat(gray[..., None], 3, 2).tobytes() in stored and rgb.tobytes() in stored
    assert np.asarray(wide).tobytes() in stored  # covered, then center-cropped


def test_convert_to_a_given_size_keeps_aspect_then_center_crops(tmp_path):
    src = tmp_path / "sz"
    (src / "c").mkdir(parents=True)
    arr = np.zeros((20, 40, 3), np.uint8)
    arr[:, 8:32] = 255  # white middle: covered (20x10) then center-cropped, only white remains
    Image.fromarray(arr).save(src / "c" / "wide.png")
    image(src / "c" / "small.png", "RGB", (3, 3), 5)
    out, _ = convert_folder(src, tmp_path / "store", size="10x10", test_fraction=0, encoding="raw")
    ds = open_store(out)
    assert ds.image_shape == (10, 10, 3)
    assert sum((image == 255).all() for image in ds.images) == 1  # the wide one
    said = r"size must be HxW \(or N\) in 1..10000 pixels, got '0x10'"
    with pytest.raises(ConfigError, match=said):
        convert_folder(src, tmp_path / "store", size="0x10")


def truncated_png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 40), np.uint8)).save(buf, "PNG")
    return buf.getvalue()[: len(buf.getvalue()) // 2]


BAD_FILES = {
    "random.png": lambda: np.random.default_rng(0).bytes(500),
    "truncated.png": truncated_png,
    "empty.jpg": lambda: b"",
    "huge.png": lambda: png_header(10_001, 10_000),
    "bomb.png": lambda: png_header(30_000, 30_000),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_bad_image_names_the_file_or_is_skipped(tmp_path, name):
    src = tmp_path / "bad"
    image(src / "a" / "good.png", "L", (4, 4), 1)
    image(src / "b" / "good.png", "L", (4, 4), 2)
    (src / "b" / name).write_bytes(BAD_FILES[name]())
    with pytest.raises(FormatError, match=rf"b/{name}: "):
        convert_folder(src, tmp_path / "store", test_fraction=0)
    assert not (tmp_path / "store").exists()
    out, skipped = convert_folder(src, tmp_path / "store", skip_bad=True, test_fraction=0)
    assert skipped == [f"b/{name}"] and len(open_store(out)) == 2
    listed = json.loads((out / "skipped.txt").read_text())
    assert listed["file"] == f"b/{name}" and listed["reason"] and str(src) not in listed["reason"]


def test_convert_train_test_split(tmp_path):
    src = tmp_path / "split"
    for split, n in (("train", 3), ("val", 2)):
        for cls in ("cat", "dog"):
            for j, seed in ((j, _helpers.seed_of(split, cls, j)) for j in range(n)):
                image(src / split / cls / f"{j}.png", "RGB", (4, 4), seed)
    out, _ = convert_folder(src, tmp_path / "store")
    train, val = open_store(out), open_store(out, split="val")
    assert (len(train), len(val)) == (6, 2 * 2) and train.classes == val.classes == ("cat", "dog")
    assert val.mean == train.mean  # normalized with the train statistics
    assert sorted(p.name for p in out.iterdir()) == ["train", "val"]
    (src / "val" / "bird").mkdir()
    image(src / "val" / "bird" / "0.png", "RGB", (4, 4), 1)
    with pytest.raises(FormatError, match=r"class folders \['bird'\]"):
        convert_folder(src, tmp_path / "store2")


def test_convert_without_pillow_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL now raises ImportError
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ConfigError, match=r"pip install 'latecast\[bench\]'"):
        convert_folder(tmp_path, tmp_path / "store")


# ---- never delete what latecast did not write ----------------------------------------------


def files(out: Path, stores: dict[str, int], files: dict[str, str]) -> None:
    """Stores of ``small(seed=...)`` and files of text, at their paths under ``out``."""
    for where, seed in stores.items():
        write_store(small(seed=seed), out / where)
    for where, text in files.items():
        (out / where).parent.mkdir(parents=True, exist_ok=True)
        (out / where).write_text(text)


NOT_STORES = {
    "meta.json of a project": lambda o: files(
        o, {}, {"meta.json": '{"my": "project settings"}', "train.py": "print('mine')"}
    ),
    "stores plus notes": lambda o: files(o, {"a": 1, "b": 2}, {"notes.md": "which store is which"}),
    "store plus a user file": lambda o: files(
        o, {".": 1}, {"README.txt": "my notes on this store"}
    ),
    "split store plus a user folder": lambda o: files(
        o, {"train": 1}, {"photos/cat.jpg": "not latecast's"}
    ),
    "a file": lambda o: o.write_text("a plain file"),
}


@pytest.mark.parametrize("case", NOT_STORES)
def test_write_and_convert_refuse_what_is_not_verifiably_a_store(tmp_path, case):
    out = tmp_path / "out"
    NOT_STORES[case](out)
    said = rf"{out} exists and is not a latecast store \(.+\); refusing"
    with pytest.raises(ConfigError, match=said):
        write_store(small(), out)
    src = tmp_path / "src"
    image(src / "a" / "0.png", "L", (4, 4), 1)
    image(src / "b" / "0.png", "L", (4, 4), 2)
    before = tree(tmp_path)
    with pytest.raises(ConfigError, match="is not a latecast store"):
        convert_folder(src, out)
    assert tree(tmp_path) == before  # nothing deleted, nothing half-written left behind


def test_a_converted_split_store_is_replaced(tmp_path):
    src = tmp_path / "src"
    for split in ("train", "test"):
        for cls in ("a", "b"):
            image(src / split / cls / "0.png", "L", (4, 4), _helpers.seed_of(split, cls))
    (src / "train" / "b" / "bad.png").write_bytes(b"junk")
    out, skipped = convert_folder(src, tmp_path / "store", skip_bad=True)
    assert skipped and (out / "skipped.txt").exists()
    (src / "train" / "b" / "bad.png").unlink()
    out, skipped = convert_folder(src, out)  # its own store: replaced, stale list gone
    assert not skipped and sorted(p.name for p in out.iterdir()) == ["test", "train"]


@pytest.mark.parametrize("where", ["cwd", "source", "parent of source", "inside source"])
def test_convert_refuses_its_own_source_and_the_current_folder(tmp_path, monkeypatch, where):
    src = tmp_path / "project" / "images"
    image(src / "a" / "0.png", "L", (4, 4), 1)
    image(src / "b" / "0.png", "L", (4, 4), 2)
    monkeypatch.chdir(tmp_path / "project")
    out = {"cwd": Path("."), "source": src, "parent of source": tmp_path / "project",
           "inside source": src / "store"}[where]  # fmt: skip
    before = tree(tmp_path)
    with pytest.raises(ConfigError, match="refusing|cannot be the image folder"):
        convert_folder(src, out)
    assert tree(tmp_path) == before


def test_write_refuses_the_current_folder_even_when_empty(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="current folder"):
        write_store(small(), ".")
    assert list(tmp_path.iterdir()) == []
