"""`latecast convert` then `latecast train` on a generated image folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _helpers import damage_mid_store, damage_scan, noise_jpeg, one_line_error, silent_damage

Image = pytest.importorskip("PIL.Image")


def make_folder(root: Path, per_class: int = 12) -> Path:
    """train/ and test/ with two classes that differ in brightness, PNG and JPEG mixed."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for label, name in enumerate(["dark", "light"]):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 100, (20, 20, 3)) + 150 * label
                suffix = ".png" if i % 2 else ".jpg"
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i}{suffix}")
    return root


def test_convert_then_train(tmp_path, run_cli):
    src = make_folder(tmp_path / "images")
    proc = run_cli("convert", src, tmp_path / "store", "--size", "16x16", "--json")
    assert proc.rc == 0, proc.err
    info = proc.json
    assert info["samples"] == 24 and info["image_shape"] == [16, 16, 3]
    assert info["classes"] == ["dark", "light"]
    argv = "--model mlp --epochs 2 -b 8 --lr 0.05 --device cpu --json".split()
    proc = run_cli(
        "train", tmp_path / "store", *argv, "--output-dir", tmp_path / "run", process=True
    )
    assert proc.rc == 0, proc.err
    result = proc.json
    assert result["epochs"] == 2 and 0 <= result["test_accuracy"] <= 1


def test_corrupt_image_is_named_or_skipped_and_listed(tmp_path, run_cli):
    src = make_folder(tmp_path / "images")
    bad = src / "train" / "dark" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # a PNG signature, then garbage
    proc = run_cli("convert", src, tmp_path / "store", process=True)
    one_line_error(proc, "broken.png")
    assert not (tmp_path / "store").exists()  # nothing half-written
    proc = run_cli("convert", src, tmp_path / "store", "--skip-bad", "--json")
    assert proc.rc == 0, proc.err
    info = proc.json
    assert info["samples"] == 24 and any("broken.png" in s for s in info["skipped"])
    listed = list((tmp_path / "store").rglob("skipped.txt"))
    assert listed and "broken.png" in listed[0].read_text()


def test_bad_size_is_one_line(tmp_path, run_cli):
    proc = run_cli("convert", tmp_path, tmp_path / "o", "--size", "0x5")
    assert proc.rc == 1
    assert proc.err == "latecast: error: size must be HxW (or N) in 1..10000 pixels, got '0x5'\n"
    assert run_cli("convert", tmp_path).rc == 2  # OUT is required


def noise_folder(src: Path, seed: int, per_class: int) -> None:
    """train/ (``per_class`` noise JPEGs of ~50 KB in each of a/ and b/: data.bin past 2 MiB)
    and test/ (4 in each)."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", per_class), ("test", 4)):
        for name in ("a", "b"):
            (src / split / name).mkdir(parents=True)
            for i in range(n):
                (src / split / name / f"{i}.jpg").write_bytes(noise_jpeg(rng, quality=95))


def test_damaged_jpeg_data_is_one_line_naming_it_never_libjpegs_text(tmp_path, run_cli):
    src, store = tmp_path / "photos", tmp_path / "store"
    noise_folder(src, seed=1, per_class=32)
    bad = src / "train" / "a" / "0.jpg"
    bad.write_bytes(damage_scan(bad.read_bytes()))
    jpeg = ["--size", "32", "--encoding", "jpeg"]
    proc = run_cli("convert", src, store, *jpeg, process=True)
    assert proc.rc == 1 and "Corrupt JPEG" not in proc.err and not store.exists()
    assert proc.err.strip().splitlines() == [
        f"latecast: error: {bad}: damaged JPEG data (libjpeg decodes it only with a warning: "
        f"part of the image would be wrong)"
    ]
    proc = run_cli("convert", src, store, *jpeg, "--skip-bad", "--json")
    assert proc.rc == 0 and proc.json["skipped"] == ["train/a/0.jpg"], proc.err
    offsets = np.load(store / "train" / "offsets.npy")
    k = len(offsets) // 2  # a file in the middle, outside the first and last MiB
    damage_mid_store(store / "train" / "data.bin", offsets, k)
    assert run_cli("info", store).rc == 0  # opening reads a sample of headers only
    proc = run_cli("info", store, "--verify")
    assert proc.rc == 1 and proc.err == (
        f"latecast: error: {store} (train split): sample {k}: the images differ from the "
        f"SHA-256 in meta.json (a file edited or damaged since it was written); make the store "
        f"again\n"
    )
    proc = run_cli(
        "train", store, "--model", "mlp", "--epochs", "1", "-b", "16", "--device", "cpu",
        "--output-dir", tmp_path / "run", process=True,
    )  # fmt: skip
    assert proc.rc == 0 and "Corrupt JPEG" not in proc.err, proc.err
    named = [line for line in proc.err.splitlines() if f"photos/train: sample {k}: " in line]
    assert len(named) == 2 and "its bytes differ from the CRC-32" in named[0]
    assert "damaged JPEG data" in named[1]  # libjpeg's warning, said as latecast says it


def test_a_cut_jpeg_store_trains_and_each_file_is_still_checked(tmp_path, run_cli):
    """The limits cut the CRC-32s with the files (once "crc32 must be (N,)"): a file damaged
    inside the cut, silently for libjpeg, is still named."""
    src, store = tmp_path / "photos", tmp_path / "store"
    noise_folder(src, seed=2, per_class=40)  # 80 train files
    assert run_cli("convert", src, store, "--size", "32", "--encoding", "jpeg").rc == 0
    k = 40  # mid-store, inside the first 64
    damage_mid_store(store / "train" / "data.bin", np.load(store / "train" / "offsets.npy"), k,
                     silent_damage)  # fmt: skip
    proc = run_cli(
        "train", store, "--model", "mlp", "--epochs", "1", "-b", "16", "--device", "cpu",
        "--limit-train", "64", "--limit-test", "3", "--no-progress", "--json",
        "--output-dir", tmp_path / "run", process=True,
    )  # fmt: skip
    assert proc.rc == 0 and proc.json["step"] == 4, proc.err
    named = [line for line in proc.err.splitlines() if f"photos/train: sample {k}: " in line]
    assert len(named) == 1 and "its bytes differ from the CRC-32" in named[0], proc.err
