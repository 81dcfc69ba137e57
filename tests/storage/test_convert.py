"""`latecast convert` (issues 10, 12): JPEGs kept byte for byte, any worker count, kill -9,
image modes, odd folders and names, the held-out split and stored order, full disks."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _helpers import damage_scan, one_line_error, seed_of, smooth, tmpfs
from _helpers import jpeg_bytes as jpeg_of
from _helpers import tree as files
from hypothesis import given, settings
from hypothesis import strategies as st

from latecast.data import from_arrays
from latecast.errors import ConfigError, FormatError, WriteError
from latecast.kinds.jpegfiles import EncodedDataset
from latecast.storage.convert import _shown, _spread, convert_folder
from latecast.storage.store import open_store, write_store

Image = pytest.importorskip("PIL.Image")


def save(path: Path, pixels: np.ndarray, fmt: str | None = None, **options) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, fmt, **options)
    return path


def pngs(src: Path, classes: str = "ab") -> None:
    """Two 4x4 PNGs in each class folder of ``classes``."""
    for cls in classes:
        for i in range(2):
            save(src / cls / f"{i}.png", smooth(4, 4, seed_of(cls, i)))


# ---- the jpeg store, and any worker count writes the same store ----------------------


def photo_folder(root: Path, per_class: int) -> dict[bytes, tuple[str, str, tuple[int, int]]]:
    """train/ and test/ of two classes: RGB and greyscale JPEGs of two sizes, PNGs, and one
    corrupt JPEG. Returns ``{JPEG file bytes: (split, class, (H, W))}``."""
    jpegs = {}
    for split in ("train", "test"):
        for c, cls in enumerate(("cat", "dog")):
            for i in range(per_class):
                h, w = (20, 18) if i % 3 == 0 else (12, 16)  # (12, 16) is the most common
                pixels = smooth(h, w, seed=seed_of(split, c, i))
                path = root / split / cls / f"{i}.{'png' if i % 4 == 3 else 'jpg'}"
                save(path, pixels[..., 0] if i % 4 == 2 else pixels)  # some greyscale JPEGs
                if path.suffix == ".jpg":
                    jpegs[path.read_bytes()] = (split, cls, (h, w))
    (root / "train" / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(50))
    return jpegs


def test_jpeg_store_keeps_each_jpeg_byte_for_byte(tmp_path):
    src = tmp_path / "photos"
    jpegs = photo_folder(src, per_class=20)
    out, skipped = convert_folder(src, tmp_path / "jpeg", skip_bad=True, workers=2)
    raw_out, _ = convert_folder(src, tmp_path / "raw", skip_bad=True, encoding="raw", workers=1)
    assert skipped == ["train/cat/broken.jpg"]
    for split in ("train", "test"):
        ds, raw = open_store(out, split), open_store(raw_out, split)
        assert isinstance(ds, EncodedDataset) and (ds.size, ds.channels) == ((12, 16), 3)
        assert (ds.mean, ds.std) == (raw.mean, raw.std)  # exact: the same pixels, summed
        kept = 0
        for i in range(len(ds)):
            stored = bytes(ds.data[ds.offsets[i] : ds.offsets[i + 1]])
            decoded = np.asarray(Image.open(io.BytesIO(stored)).convert("RGB"))
            if stored in jpegs:  # the file itself, in its split, with its class and size
                kept += 1
                assert jpegs[stored] == (split, ds.classes[ds.labels[i]], tuple(ds.sizes[i]))
            assert decoded.shape[:2] == tuple(ds.sizes[i])
            if decoded.shape[:2] == ds.size:  # the raw store holds what decoding gives
                error = np.abs(decoded.astype(int) - raw.images[i])
                assert error.max() == 0 if stored in jpegs else error.mean() < 1  # PNG: quality 95
        meta = json.loads((out / split / "meta.json").read_text())
        assert kept == sum(s == split for s, _, _ in jpegs.values())
        assert (meta["quality"], meta["reencoded"]) == (95, len(ds) - kept)
    again, _ = convert_folder(src, tmp_path / "one", skip_bad=True, workers=1)
    assert files(again) == files(out)  # 1 worker or 2: the same store, byte for byte


def test_convert_then_info_on_a_jpeg_store(tmp_path, run_cli):
    photo_folder(tmp_path / "photos", per_class=4)
    proc = run_cli("convert", tmp_path / "photos", tmp_path / "s", "--skip-bad", "--json")
    assert proc.rc == 0, proc.err
    assert proc.json["encoding"] == "jpeg" and proc.json["splits"] == {"train": 8, "test": 8}
    assert "images/s" in proc.out and proc.json["images_per_second"] > 0
    proc = run_cli("info", tmp_path / "s", "--json")
    assert proc.rc == 0, proc.err
    assert proc.json["train"]["encoding"] == "jpeg" and " jpeg (" in proc.out
    assert proc.json["decoder"].split()[0] in ("torchcodec", "torchvision")  # chosen once
    assert f"decoded by {proc.json['decoder']}" in proc.out


@pytest.mark.parametrize("encoding", ["jpeg", "raw"])
def test_damaged_jpeg_scan_data_is_refused_or_skipped_and_bytes_after_the_end_reencoded(
    tmp_path, capfd, encoding
):
    from latecast.storage.store import verify

    src = tmp_path / "photos"
    for c, cls in enumerate(("cat", "dog")):
        for i in range(3):
            save(src / cls / f"{i}.jpg", smooth(24, 32, seed=seed_of(c, i)))
    noise = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    Image.open(io.BytesIO(damage_scan(jpeg_of(noise)))).load()  # Pillow: no error, no warning
    (src / "cat" / "scan.jpg").write_bytes(damage_scan(jpeg_of(noise)))
    (src / "dog" / "tail.jpg").write_bytes(jpeg_of(noise) + b"a phone's trailer")
    options = {"encoding": encoding, "test_fraction": 0, "workers": 2}
    with pytest.raises(FormatError, match=r"cat/scan\.jpg: damaged JPEG data \(libjpeg decodes"):
        convert_folder(src, tmp_path / "s", **options)
    assert not (tmp_path / "s").exists()
    out, skipped = convert_folder(src, tmp_path / "s", skip_bad=True, **options)
    assert skipped == ["cat/scan.jpg"] and "damaged JPEG" in (out / "skipped.txt").read_text()
    ds = open_store(out)
    assert len(ds) == 7 and verify(ds, "s")
    if encoding == "jpeg":  # the file with a trailer is re-encoded, the others kept
        assert json.loads((out / "meta.json").read_text())["reencoded"] == 1
    assert "Corrupt JPEG" not in capfd.readouterr().err


# ---- kill -9 during a real `latecast convert` ------------------------------------------


@pytest.fixture(scope="module")
def many_jpegs(tmp_path_factory) -> tuple[Path, bytes]:
    """4500 JPEG files (the same bytes: cheap to write, real to decode) in three classes."""
    src = tmp_path_factory.mktemp("many") / "photos"
    one = jpeg_of(smooth(48, 48, seed=1))
    for c in range(3):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(1500):
            (src / f"c{c}" / f"{i}.jpg").write_bytes(one)
    return src, one


def interrupt_mid_write(src: Path, out: Path, sig: signal.Signals) -> subprocess.Popen:
    """A real parallel `latecast convert`, sent ``sig`` once it writes: SIGINT to its group
    (Ctrl-C), SIGKILL to it alone (its orphaned workers must go by themselves)."""
    argv = [sys.executable, "-m", "latecast", "convert", src, out, "--encoding", "jpeg"]
    child = subprocess.Popen(
        [*argv, "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    partial = out.parent / f".{out.name}.tmp-{child.pid}" / "train" / "data.bin"
    deadline = time.monotonic() + 120
    while child.poll() is None and time.monotonic() < deadline:
        if partial.exists() and partial.stat().st_size > 0:
            break
        time.sleep(0.001)
    (os.killpg if sig == signal.SIGINT else os.kill)(child.pid, sig)
    child.wait(timeout=300)  # a hang guard: it exits in seconds
    assert child.poll() is not None and child.returncode != 0, "it finished before the signal"
    return child


@pytest.mark.slow
def test_kill_9_during_convert_leaves_the_old_store_or_the_new(tmp_path, many_jpegs):
    src, one = many_jpegs
    old = write_store(from_arrays(np.zeros((4, 5, 5), np.uint8), np.arange(4)), tmp_path / "s")
    before = files(old)
    child = interrupt_mid_write(src, old, signal.SIGKILL)
    assert child.returncode == -signal.SIGKILL
    assert (tmp_path / f".s.tmp-{child.pid}").exists()  # killed while writing ...
    assert files(old) == before  # ... and the old store is whole
    out, _ = convert_folder(src, old, encoding="jpeg")  # the rerun cleans up after it
    train, test = open_store(out), open_store(out, "test")
    assert (len(train), len(test)) == (4050, 450) and bytes(train.data[: len(one)]) == one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


@pytest.mark.slow
def test_ctrl_c_during_convert_is_one_line_and_leaves_nothing(tmp_path, many_jpegs):
    child = interrupt_mid_write(many_jpegs[0], tmp_path / "s", signal.SIGINT)
    assert child.returncode == 130 and child.stderr.read() == "latecast: interrupted\n"
    assert list(tmp_path.iterdir()) == []


# ---- image modes -----------------------------------------------------------------------


def deep(path: Path, values: np.ndarray, mode: str) -> np.ndarray:
    """A greyscale image of more than 8 bits; returns what the store must hold."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "I;16B":
        im = Image.frombytes(mode, values.shape[::-1], values.astype(">u2").tobytes())
    else:
        im = Image.fromarray(values)
    im.save(path)
    assert Image.open(path).mode == mode
    a = values.astype(np.float64)
    return np.rint((a - a.min()) * 255 / (a.max() - a.min())).astype(np.uint8)


def test_deep_greyscale_is_scaled_by_its_range_and_stays_one_channel(tmp_path):
    ramp = np.arange(6 * 8).reshape(6, 8)
    src = tmp_path / "deep"
    expected = {
        "a16": deep(src / "a16" / "x.png", (ramp * 1000 + 500).astype(np.uint16), "I;16"),
        "b16b": deep(src / "b16b" / "x.tif", (ramp * 900 + 7).astype(np.uint16), "I;16B"),
        "c32": deep(src / "c32" / "x.tif", (ramp * -70_000 + 3).astype(np.int32), "I"),
        "dfloat": deep(src / "dfloat" / "x.tif", (ramp / 7 - 2).astype(np.float32), "F"),
        "epgm": deep(src / "epgm" / "x.pgm", (ramp * 1300).astype(np.uint16), "I"),
    }
    save(src / "f8" / "x.png", np.full((6, 8), 7, np.uint8))  # 8 bits: kept as is
    Image.fromarray(np.full((6, 8), 4000, np.uint16)).save(src / "f8" / "flat.png")  # constant
    ds = open_store(convert_folder(src, tmp_path / "s", test_fraction=0, depth="8")[0])
    assert ds.image_shape == (6, 8, 1)  # every image greyscale: one channel
    for name, pixels in expected.items():  # Pillow's convert("L") makes the first all 255
        assert np.array_equal(ds.images[ds.labels == ds.classes.index(name)][0, ..., 0], pixels)
    eight = sorted(ds.images[ds.labels == ds.classes.index("f8")].max(axis=(1, 2, 3)))
    assert eight == [0, 7]  # the constant 16-bit image is 0, the 8-bit one untouched
    save(src / "g" / "nan.tif", np.full((6, 8), np.nan, np.float32))
    with pytest.raises(FormatError, match=r"g/nan\.tif: .*F image holds NaN or infinite values"):
        convert_folder(src, tmp_path / "s2", test_fraction=0, depth="8")


def colour_folder(src: Path) -> dict[str, Path]:
    """One image per class in each mode that becomes RGB; ``{class: file}``."""
    rgba = np.dstack([smooth(6, 8, 1), np.arange(48, dtype=np.uint8).reshape(6, 8) * 5])
    palette = Image.fromarray(smooth(6, 8, 2)).quantize(16)
    palette.info["transparency"] = 3
    made = {
        "cmyk": src / "cmyk" / "x.jpg",
        "grey": src / "grey" / "x.jpg",
        "la": src / "la" / "x.png",
        "palette": src / "palette" / "x.png",
        "rgba": src / "rgba" / "x.png",
    }
    for path in made.values():
        path.parent.mkdir(parents=True)
    Image.fromarray(smooth(6, 8, 3, channels=4), "CMYK").save(made["cmyk"], quality=95)
    save(made["grey"], smooth(6, 8, 4, channels=1))
    Image.fromarray(np.dstack([smooth(6, 8, 5, 1), smooth(6, 8, 6, 1)]), "LA").save(made["la"])
    palette.save(made["palette"])
    save(made["rgba"], rgba)
    assert [Image.open(p).mode for p in made.values()] == ["CMYK", "L", "LA", "P", "RGBA"]
    return made


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_palette_cmyk_and_alpha_become_rgb_as_pillow_converts_them(tmp_path, encoding):
    made = colour_folder(tmp_path / "colour")
    out, _ = convert_folder(tmp_path / "colour", tmp_path / "s", test_fraction=0, encoding=encoding)
    ds = open_store(out)
    assert ds.image_shape == (6, 8, 3)  # not every image is greyscale: RGB
    for cls, path in made.items():
        i = int(np.flatnonzero(ds.labels == ds.classes.index(cls))[0])
        want = np.asarray(Image.open(path).convert("RGB"))
        if encoding == "raw":
            assert np.array_equal(ds.images[i], want)
            continue
        stored = bytes(ds.data[ds.offsets[i] : ds.offsets[i + 1]])
        assert (stored == path.read_bytes()) == (cls == "grey")  # only an L/RGB JPEG is kept
        got = np.asarray(Image.open(io.BytesIO(stored)).convert("RGB")).astype(int)
        assert np.abs(got - want).mean() < 3  # re-encoded at quality 95


# ---- a class folder without images is not a class --------------------------------------


def test_a_class_folder_without_readable_images_is_not_a_class(tmp_path):
    src = tmp_path / "src"
    pngs(src, "ad")
    (src / "b").mkdir()
    (src / "c").mkdir()
    (src / "c" / "README.txt").write_text("no images here")
    (src / "e").mkdir()
    (src / "e" / "bad.png").write_bytes(b"not a png")
    with pytest.warns(UserWarning, match=r"\['b', 'c', 'e'\] hold no readable images; not classes"):
        out, skipped = convert_folder(src, tmp_path / "s", test_fraction=0, skip_bad=True)
    ds = open_store(out)
    assert ds.classes == ("a", "d") and sorted(ds.labels) == [0, 0, 1, 1]
    assert skipped == ["e/bad.png"]
    split = tmp_path / "split"  # test images of a class whose train images are all unreadable
    for part in ("train", "test"):
        save(split / part / "a" / "0.png", smooth(4, 4, 1))
        save(split / part / "b" / "0.png", smooth(4, 4, 2))
    (split / "test" / "empty").mkdir()  # ignored: no images, no class
    (split / "train" / "b" / "0.png").write_bytes(b"truncated")
    with (
        pytest.warns(UserWarning),
        pytest.raises(
            FormatError,
            match=r"\(test split\): holds images of 'b', a class with no readable train",
        ),
    ):
        convert_folder(split, tmp_path / "s2", skip_bad=True)


# ---- file names that need quoting --------------------------------------------------------

ODD_NAMES = ["tab\there.png", "new\nline.png", 'quote"back\\slash.png', "caf\u00e9 \u2603.png"]
ODD_NAMES += ["'tab\\there'.png"]  # printable, but shown as it is it would read as quoted


def test_skipped_files_with_tabs_and_newlines_read_back(tmp_path, run_cli):
    src = tmp_path / "src"
    pngs(src)
    for name in ODD_NAMES:
        (src / "b" / name).write_bytes(b"broken")
    proc = run_cli("convert", src, tmp_path / "s", "--test-fraction", "0", process=True)
    one_line_error(proc)
    proc = run_cli("convert", src, tmp_path / "s", "--test-fraction", "0", "--skip-bad", "--json")
    assert proc.rc == 0, proc.err
    want = sorted(f"b/{name}" for name in ODD_NAMES)
    assert sorted(proc.json["skipped"]) == want
    lines = (tmp_path / "s" / "skipped.txt").read_text().splitlines()
    assert sorted(json.loads(line)["file"] for line in lines) == want
    assert all((src / json.loads(line)["file"]).is_file() for line in lines)
    reasons = {json.loads(line)["reason"] for line in lines}  # "file" names it, exactly
    assert reasons == {"not a readable image (not a format Pillow reads)"}
    shown = [_shown(Path(name)) for name in ODD_NAMES]  # in one-line messages
    assert all(s.isprintable() for s in shown) and shown[-1] == ascii(ODD_NAMES[-1])


def test_fifos_and_devices_among_the_images_are_refused_or_skipped_never_read(tmp_path):
    """A FIFO named like an image was passed over without a word (reading it would wait for
    a writer forever); a device (here a link to /dev/zero) never ends."""
    src = tmp_path / "src"
    pngs(src)
    os.mkfifo(src / "a" / "pipe.png")
    (src / "b" / "zeros.jpg").symlink_to("/dev/zero")
    with pytest.raises(FormatError, match=r"pipe.png: not a regular file \(a FIFO"):
        convert_folder(src, tmp_path / "s", test_fraction=0, workers=1)
    out, skipped = convert_folder(src, tmp_path / "s", test_fraction=0, workers=1, skip_bad=True)
    assert sorted(skipped) == ["a/pipe.png", "b/zeros.jpg"] and len(open_store(out)) == 4


# ---- a plain class folder gets a held-out split; every split a spread order -----


def class_folder(root: Path, counts: dict[str, int]) -> Path:
    for c, (cls, n) in enumerate(counts.items()):
        for i in range(n):
            save(root / cls / f"{i}.png", smooth(8, 8, seed=1000 * c + i))
    return root


def contents(ds) -> set[bytes]:
    return {image.tobytes() for image in ds.images}


def test_a_plain_folder_gets_a_stratified_held_out_split(tmp_path):
    src = class_folder(tmp_path / "src", {"a": 20, "b": 10, "c": 30})
    out, _ = convert_folder(src, tmp_path / "s")
    train, test = open_store(out), open_store(out, "test")
    assert np.bincount(test.labels).tolist() == [2, 1, 3]  # 10% of each class
    assert np.bincount(train.labels).tolist() == [18, 9, 27]
    assert not contents(train) & contents(test) and len(contents(train) | contents(test)) == 60
    assert (train.mean, train.std) == (test.mean, test.std)
    meta = json.loads((out / "test" / "meta.json").read_text())
    assert (meta["test_fraction"], meta["seed"]) == (0.1, 0)
    again, _ = convert_folder(src, tmp_path / "again")
    assert files(again) == files(out)  # deterministic
    other = open_store(convert_folder(src, tmp_path / "other", seed=1)[0], "test")
    assert contents(other) != contents(test) and np.bincount(other.labels).tolist() == [2, 1, 3]
    single = open_store(convert_folder(src, tmp_path / "one", test_fraction=0)[0])
    assert single.split == "train" and len(single) == 60
    alone = tmp_path / "alone"  # a lone train/ is a plain class folder too
    (alone / "train").mkdir(parents=True)
    os.rename(src, alone / "train" / "classes")
    class_folder(alone / "train", {"x": 10, "y": 10})
    out, _ = convert_folder(alone, tmp_path / "alone-s", test_fraction=0.2)
    assert open_store(out, "test").classes == ("classes", "x", "y")
    with pytest.raises(ConfigError, match=r"has its own train and test folders; --test-fraction"):
        convert_folder(tmp_path / "s", tmp_path / "x", test_fraction=0.1)
    with pytest.raises(FormatError, match=r"too few images per class to hold out a test split"):
        convert_folder(class_folder(tmp_path / "ones", {"a": 1, "b": 1}), tmp_path / "y")


def test_the_first_samples_of_a_converted_store_hold_every_class(tmp_path):
    # Sorted by class, --limit-train 4096 of the CIFAR-10 JPEG copy was airplanes only.
    src = class_folder(tmp_path / "src", {c: 24 for c in "abcde"})
    train = open_store(convert_folder(src, tmp_path / "s", test_fraction=0)[0])
    for k in range(1, len(train) + 1):
        assert np.abs(np.bincount(train.labels[:k], minlength=5) - k / 5).max() <= 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=300), st.integers(0, 2**32 - 1))
def test_spread_order_holds_each_class_in_proportion_in_every_prefix(labels, seed):
    order = _spread(labels, np.random.default_rng(seed))
    assert sorted(order) == list(range(len(labels)))  # a permutation
    ordered, counts = np.asarray(labels)[order], np.bincount(labels)
    n, classes = len(labels), np.count_nonzero(counts)
    for k in range(1, n + 1):  # each class within 1 + classes * share of its share of k
        seen = np.bincount(ordered[:k], minlength=len(counts))
        assert np.all(np.abs(seen - k * counts / n) <= 1 + classes * counts / n + 1e-9)


def test_convert_then_train_and_info_on_a_plain_folder(tmp_path, run_cli):
    class_folder(tmp_path / "src", {"a": 10, "b": 10, "c": 10})
    proc = run_cli("convert", tmp_path / "src", tmp_path / "s", "--json")
    assert proc.rc == 0, proc.err
    assert proc.json["splits"] == {"train": 27, "test": 3} and proc.json["encoding"] == "raw"
    rc, info = run_cli("info", tmp_path / "s", "--json")
    assert rc == 0 and (info["train"]["samples"], info["test"]["samples"]) == (27, 3)
    argv = ["--model", "mlp", "--epochs", "1", "-b", "6", "--limit-train", "6", "--device", "cpu"]
    rc, result = run_cli("train", tmp_path / "s", *argv, "--output-dir", tmp_path / "run", "--json")
    assert rc == 0 and result["epochs"] == 1


# ---- a full disk ------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A real 512 KiB tmpfs, unmounted afterwards."""
    with tmpfs(tmp_path / "disk", "512k") as disk:
        yield disk


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_a_full_disk_is_one_line_and_keeps_the_old_store(tmp_path, small_disk, run_cli, encoding):
    old = write_store(from_arrays(np.zeros((4, 5, 5), np.uint8), np.arange(4)), small_disk / "s")
    before = files(old)
    src = tmp_path / "src"
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8)  # 6-12 KB a file
    for cls in ("a", "b"):
        (src / cls).mkdir(parents=True)
        for i in range(80):
            save(src / cls / f"{i}.png", noise)
    proc = run_cli(
        *("convert", src, old, "--encoding", encoding, "--workers", "1"), process=True, timeout=120
    )
    said = f"latecast: error: {old}: cannot write the store there: No space left on device"
    assert one_line_error(proc) == said and proc.err == said + "\n"
    assert sorted(os.listdir(small_disk)) == ["s"] and files(old) == before  # no debris, old kept
    big = from_arrays(np.zeros((100, 64, 64, 3), np.uint8), np.arange(100) % 2)  # 1.2 MB
    with pytest.raises(WriteError, match=r"disk/big: cannot write the store there: No space left"):
        write_store(big, small_disk / "big")
    assert sorted(os.listdir(small_disk)) == ["s"]


@pytest.mark.parametrize("where", ["under a file", "name too long"])
def test_an_unwritable_out_is_one_line_naming_it(tmp_path, run_cli, where):
    class_folder(tmp_path / "src", {"a": 10, "b": 10})
    (tmp_path / "file").write_text("mine")
    out = tmp_path / "file" / "s" if where == "under a file" else tmp_path / ("n" * 300)
    proc = run_cli("convert", tmp_path / "src", out)
    assert one_line_error(proc).startswith(f"latecast: error: {out}: cannot write the store")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "src"]
    assert (tmp_path / "file").read_text() == "mine"


# ---- benchmarks/convert_speed.py at a tiny size --------------------------------------------

CIFAR_JPG = Path(__file__).resolve().parents[3] / "shared/datasets/cifar10-jpg/cifar10-jpg.tar.gz"


@pytest.mark.slow
@pytest.mark.skipif(not CIFAR_JPG.is_file(), reason=f"needs the CIFAR-10 JPEG copy, {CIFAR_JPG}")
def test_convert_speed_benchmark_runs_at_a_tiny_size(tmp_path):
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "convert_speed.py"
    proc = subprocess.run(
        [sys.executable, script, "--per-class", "4", "--workers", "2", "--work", tmp_path],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["images"] == 80  # 4 of each of 10 classes, train and test
    rows = {(r["what"].split()[-1], r["workers"]): r for r in result["rows"]}
    assert set(rows) == {("jpeg", 2), ("raw", 2), ("decode", 2)}
    assert all(r["images_per_second"] > 0 for r in rows.values())
    assert rows["jpeg", 2]["store_bytes"] < rows["raw", 2]["store_bytes"]  # JPEG, not pixels
    assert list(tmp_path.iterdir()) == []  # its temporary folder is gone
