"""16-bit images in a store (issue 38): converted exactly, verified, moved 2 bytes a pixel
and finished as the float32 pipeline, trained on; bad files one error naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import mover, one_line_error

from latecast.data import from_arrays
from latecast.errors import ConfigError, FormatError
from latecast.loader import Loader
from latecast.storage.convert import convert_folder
from latecast.storage.store import open_store, verify, write_store
from latecast.transforms import Augment

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("torchvision")  # convert reads JPEGs as training does


def png16(path: Path, values: np.ndarray) -> Path:
    """``values`` (H, W) uint16 written by Pillow as a 16-bit greyscale PNG (mode I;16)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(values).save(path)
    assert Image.open(path).mode == "I;16"
    return path


def depth_folder(src: Path, n: int = 8, seed: int = 0) -> dict[str, list[np.ndarray]]:
    """Two classes of 16-bit depth maps (millimetres, past 255 and up to 65535), 12x10."""
    rng = np.random.default_rng(seed)
    images = {
        c: [rng.integers(0, 65536, (12, 10), dtype=np.uint16) for _ in range(n)] for c in "ab"
    }
    images["a"][0][0, :3] = (0, 256, 65535)  # the extremes and the first value past 8 bits
    for c, values in images.items():
        for i, v in enumerate(values):
            png16(src / c / f"{i}.png", v)
    return images


def test_a_16_bit_folder_becomes_a_uint16_store_holding_the_exact_values(tmp_path, run_cli):
    written = depth_folder(tmp_path / "src")
    out, _ = convert_folder(tmp_path / "src", tmp_path / "s", workers=2)
    ds, test = open_store(out), open_store(out, "test")
    assert ds.images.dtype == test.images.dtype == np.uint16 and ds.image_shape == (12, 10, 1)
    for c, values in written.items():  # the store's order is its own: compared as sets
        held = [s.images[s.labels == s.classes.index(c)][..., 0] for s in (ds, test)]
        assert sorted(v.tobytes() for v in np.concatenate(held)) == sorted(
            v.tobytes() for v in values
        )
    train = ds.images.astype(np.float64)
    assert np.allclose(ds.mean, [train.mean()], rtol=1e-12)  # in stored units (millimetres)
    assert np.allclose(ds.std, [train.std()], rtol=1e-12)
    assert verify(ds, "s") is True
    rc, info = run_cli("info", out, "--verify", "--json")
    assert rc == 0 and info["verified"] == {"train": True, "test": True}
    assert info["train"]["image_bytes"] == len(ds) * 12 * 10 * 2  # 2 bytes a pixel
    assert info["train"]["epoch_bytes"]["uint8"]["per_epoch"] == len(ds) * (12 * 10 * 2 + 1)


def float32_pipeline(images: np.ndarray, mean, std) -> torch.Tensor:
    """The usual way: ``ToDtype(float32, scale=True)`` (x / 65535), then ``Normalize`` by
    the same statistics on that scale, (N, C, H, W) float32 on the host."""
    x = torch.from_numpy(images.astype(np.float32)).permute(0, 3, 1, 2) / 65535
    m, s = (torch.tensor(v, dtype=torch.float32)[:, None, None] / 65535 for v in (mean, std))
    return (x - m) / s


@pytest.mark.parametrize("transfer", ["uint8", "prefetch", "resident", "float32"])
def test_the_loader_moves_16_bit_batches_as_stored_equal_to_the_float32_pipeline(
    transfer, tmp_path
):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 65536, (10, 6, 8, 2), dtype=np.uint16)
    arrays = from_arrays(images, np.arange(10) % 3)  # mean/std in stored units
    every = images.reshape(-1, 2).astype(np.float64)
    assert np.allclose(arrays.mean, every.mean(0)) and np.allclose(arrays.std, every.std(0))
    ds = open_store(write_store(arrays, tmp_path / "w"))  # the store's checks pass it
    assert np.array_equal(ds.images, images) and (ds.mean, ds.std) == (arrays.mean, arrays.std)
    usual = float32_pipeline(images, ds.mean, ds.std)
    for static in (False, True):
        loader = Loader(ds, 4, device="cpu", transfer=mover(transfer), shuffle=False, static=static)
        got = torch.cat([x.clone() for x, _ in loader])
        assert got.dtype == torch.float32 and got.shape[1:] == (2, 6, 8)
        torch.testing.assert_close(got, usual[: len(got)], atol=1e-6, rtol=0)
    flipped = Loader(ds, 5, device="cpu", transfer=mover(transfer), augment=Augment(flip=1.0))
    for (x, _), idx in zip(flipped, flipped.index_batches()):  # one pass: epoch 0's order
        torch.testing.assert_close(x, usual[idx].flip(3), atol=1e-6, rtol=0)
    if transfer != "float32":  # the images cross as uint16: half of float32's bytes
        loader = Loader(ds, 4, device="cpu", transfer=mover(transfer), shuffle=False)
        list(loader)
        stats = loader.stats
        assert stats.image_bytes == 10 * 6 * 8 * 2 * 2  # N * H * W * C * 2 bytes
        assert stats.image_bytes * 2 == stats.usual_bytes - 10 * 8  # float32, int64 labels


def test_every_mover_draws_the_same_crop_and_flip_on_16_bit_batches():
    images = np.random.default_rng(2).integers(0, 65536, (12, 10, 10, 1), dtype=np.uint16)
    ds = from_arrays(images, np.arange(12) % 2)
    aug = Augment(crop=2, flip=0.5, resized_crop=0.5)
    passes = {
        t: torch.cat([x for x, _ in Loader(ds, 4, device="cpu", transfer=mover(t), augment=aug)])
        for t in ("float32", "uint8", "resident")
    }
    assert not torch.equal(passes["uint8"], float32_pipeline(images, ds.mean, ds.std))  # moved
    for t in ("float32", "resident"):
        torch.testing.assert_close(passes[t], passes["uint8"], atol=1e-6, rtol=0)
    with pytest.raises(ConfigError, match="16-bit image: augment=.*cutout"):
        next(iter(Loader(ds, 4, device="cpu", augment=Augment(cutout=4))))


def test_latecast_train_runs_on_a_16_bit_store(tmp_path, run_cli):
    depth_folder(tmp_path / "src", n=10)
    proc = run_cli("convert", tmp_path / "src", tmp_path / "s", "--json")
    assert proc.rc == 0, proc.err
    assert proc.json["image_bytes"] == proc.json["splits"]["train"] * 12 * 10 * 2
    argv = ["--model", "mlp", "--epochs", "1", "-b", "6", "--limit-train", "12", "--device", "cpu"]
    rc, result = run_cli("train", tmp_path / "s", *argv, "--output-dir", tmp_path / "run", "--json")
    assert rc == 0 and result["epochs"] == 1 and result["step"] == 2
    assert np.isfinite(result["test_accuracy"])


def test_bad_16_bit_input_is_one_error_naming_the_file(tmp_path, run_cli):
    src = tmp_path / "src"
    depth_folder(src, n=3)
    Image.fromarray(np.full((12, 10), 7, np.uint8)).save(src / "b" / "eight.png")
    with pytest.raises(FormatError, match=r"b/eight\.png: a L image, not 16-bit .*\.png \(I;16\)"):
        convert_folder(src, tmp_path / "s", test_fraction=0)
    one_line_error(run_cli("convert", src, tmp_path / "s"), "eight.png")  # one line, exit 1
    with pytest.raises(FormatError, match=r"b/eight\.png: a L image, not 16-bit .*--depth 16"):
        convert_folder(src, tmp_path / "s", test_fraction=0, depth="16")
    eight = open_store(convert_folder(src, tmp_path / "s", test_fraction=0, depth="8")[0])
    assert eight.images.dtype == np.uint8  # the old per-image rescale, when asked for
    (src / "b" / "eight.png").unlink()
    wide = np.arange(120, dtype=np.int32).reshape(12, 10) * 1000  # up to 119000: past 16 bits
    Image.fromarray(wide).save(src / "b" / "wide.tif")
    with pytest.raises(FormatError, match=r"b/wide\.tif: I values 0\.\.119000 do not fit 16"):
        convert_folder(src, tmp_path / "s", test_fraction=0, depth="16")
    (src / "b" / "wide.tif").unlink()
    data = (src / "a" / "1.png").read_bytes()
    (src / "a" / "1.png").write_bytes(data[: len(data) // 2])  # a truncated 16-bit PNG
    with pytest.raises(FormatError, match=r"a/1\.png: not a readable image"):
        convert_folder(src, tmp_path / "s", test_fraction=0)
    with pytest.raises(ConfigError, match="16-bit images are stored raw"):
        convert_folder(src, tmp_path / "s", test_fraction=0, encoding="jpeg", skip_bad=True)


def test_depth_16_as_an_int_is_taken_and_a_bad_depth_is_refused_naming_what_is_taken(tmp_path):
    src = tmp_path / "src"
    depth_folder(src, n=2)
    for depth in (16, np.int64(16), "16"):
        out, _ = convert_folder(src, tmp_path / "s", test_fraction=0, depth=depth, workers=1)
        assert open_store(out).images.dtype == np.uint16
    out, _ = convert_folder(src, tmp_path / "s", test_fraction=0, depth=8, workers=1)
    assert open_store(out).images.dtype == np.uint8
    for bad in (12, "12", 16.0, True, None):
        with pytest.raises(ConfigError, match=r"^depth must be one of auto, 8, 16, got "):
            convert_folder(src, tmp_path / "s", test_fraction=0, depth=bad, workers=1)


def pgm16(path: Path, values: np.ndarray, maxval: int = 65535, plain: bool = False) -> Path:
    """``values`` (H, W) written by hand as a PGM of ``maxval`` (binary P5, big-endian 2 bytes
    a pixel; or plain P2, decimal), which Pillow opens as mode ``I``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = values.shape
    head = f"{'P2' if plain else 'P5'}\n{w} {h}\n{maxval}\n".encode()
    body = " ".join(map(str, values.ravel())).encode() if plain else values.astype(">u2").tobytes()
    path.write_bytes(head + body)
    assert Image.open(path).mode == "I"
    return path


def test_16_bit_pgms_become_a_uint16_store_of_the_files_own_values(tmp_path):
    src, rng = tmp_path / "src", np.random.default_rng(3)
    written = [rng.integers(0, 65536, (12, 10), dtype=np.uint16) for _ in range(12)]
    for i, v in enumerate(written):
        (src / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        if i < 6:  # Pillow's own 16-bit PGMs, and ones written by hand
            Image.fromarray(v).save(src / "ab"[i % 2] / f"pillow{i}.pgm")
        else:
            pgm16(src / "ab"[i % 2] / f"hand{i}.pgm", v)
    twelve = rng.integers(0, 4096, (12, 10), dtype=np.uint16)  # a 12-bit PGM, maxval 4095
    twelve[0, :2] = (0, 4095)
    pgm16(src / "a" / "twelve.pgm", twelve, 4095)
    plain = rng.integers(0, 1000, (12, 10), dtype=np.uint16)
    pgm16(src / "b" / "plain.pgm", plain, 999, plain=True)
    written += [twelve, plain]
    ds = open_store(convert_folder(src, tmp_path / "s", test_fraction=0, workers=2)[0])
    assert ds.images.dtype == np.uint16 and ds.image_shape == (12, 10, 1) and len(ds) == 14
    stored = sorted(v.tobytes() for v in ds.images[..., 0])
    assert stored == sorted(v.tobytes() for v in written)  # as the files hold them, unscaled
    png16(src / "b" / "png.png", twelve)  # beside 16-bit PNGs too
    assert open_store(convert_folder(src, tmp_path / "s", test_fraction=0)[0]).images.dtype == (
        np.uint16
    )
    Image.fromarray(np.full((12, 10), 7, np.uint8)).save(src / "b" / "eight.pgm")  # 8-bit: L
    with pytest.raises(FormatError, match=r"b/eight\.pgm: a L image, not 16-bit"):
        convert_folder(src, tmp_path / "s", test_fraction=0)
