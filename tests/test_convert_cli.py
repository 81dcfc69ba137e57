"""`latecast convert` then `latecast train` on a generated image folder
(docs/RELIABILITY.md row 11)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

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
    proc = run_cli(
        "train",
        tmp_path / "store",
        "--model",
        "mlp",
        "--epochs",
        "2",
        "-b",
        "8",
        "--lr",
        "0.05",
        "--device",
        "cpu",
        "--output-dir",
        tmp_path / "run",
        "--json",
        process=True,
    )
    assert proc.rc == 0, proc.err
    result = proc.json
    assert result["epochs"] == 2 and 0 <= result["test_accuracy"] <= 1


def test_corrupt_image_is_named_or_skipped_and_listed(tmp_path, run_cli):
    src = make_folder(tmp_path / "images")
    bad = src / "train" / "dark" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # a PNG signature, then garbage
    proc = run_cli("convert", src, tmp_path / "store", process=True)
    assert proc.rc == 1 and "Traceback" not in proc.err
    assert len(proc.err.strip().splitlines()) == 1 and "broken.png" in proc.err
    assert not (tmp_path / "store").exists()  # nothing half-written
    proc = run_cli("convert", src, tmp_path / "store", "--skip-bad", "--json")
    assert proc.rc == 0, proc.err
    info = proc.json
    assert info["samples"] == 24 and any("broken.png" in s for s in info["skipped"])
    listed = list((tmp_path / "store").rglob("skipped.txt"))
    assert listed and "broken.png" in listed[0].read_text()


def test_bad_size_is_one_line(tmp_path, run_cli):
    proc = run_cli("convert", tmp_path, tmp_path / "o", "--size", "0x5")
    assert (
        proc.rc == 1
        and proc.err == "latecast: error: size must be HxW (or N) in 1..10000 pixels, got '0x5'\n"
    )
    assert run_cli("convert", tmp_path).rc == 2  # OUT is required
