"""`latecast bench` on CPU with tiny settings: every loader, finite numbers, all files written."""

import itertools
import json
import math
import time

import numpy as np
import pytest
import torch
from _helpers import assert_report, mover, one_line_error

from latecast.data import from_arrays
from latecast.loader import Loader
from latecast.movers import MOVERS
from latecast.storage.store import write_store
from latecast.tools.bench import bytes_per_epoch
from latecast.tools.measure import epochs

PIXEL_MOVERS = ["float32", *MOVERS]  # the baseline and the core's movers

LOADERS = [
    *("float32", "uint8", "prefetch", "resident"),
    *("torchvision-w0", "torchvision-w2", "torchvision-wN", "upper-bound", "gather"),
]
# what both bench runs here share: the CPU, one repeat of one batch of 64
QUICK = "--device cpu --repeats 1 --limit-batches 1 -b 64".split()


@pytest.fixture(scope="module")
def run(tmp_path_factory, run_cli):
    out = tmp_path_factory.mktemp("bench")
    sizes = "--e2e-epochs 1 --e2e-batch-size 32 --folder-images 96 --webdataset-photos 32"
    rc, result = run_cli("bench", *QUICK, *sizes.split(), "--output-dir", out, "--json")
    assert rc == 0
    return out, result


def test_every_loader_and_loop_is_measured(run):
    out, r = run
    assert r == json.loads((out / "bench.json").read_text())
    assert r["device"] == "cpu"
    assert list(r["loader_images_per_s"]) == LOADERS
    for name, rate in r["loader_images_per_s"].items():
        lo, hi = r["loader_images_per_s_range"][name]
        assert math.isfinite(rate) and 0 < lo <= rate <= hi, name
    assert set(r["epoch_seconds"]) == {"usual-loop", "latecast"}
    assert all(math.isfinite(s) and s > 0 for s in r["epoch_seconds"].values())
    assert r["best_torchvision"].startswith("torchvision-")


def test_bytes_per_epoch(run):
    b = run[1]["h2d_bytes_per_epoch"]
    n, pixels = 60000, 28 * 28
    assert b["float32"] == b["torchvision"] == n * (pixels * 4 + 8)
    assert b["uint8"] == b["prefetch"] == n * (pixels + 1)
    assert b["resident"] == n * 8  # one int64 permutation per epoch
    assert all(isinstance(v, int) for v in b.values())


def test_webdataset_photos_decoded_in_the_workers_against_wrap_on_the_device(run):
    """Issue 16: the same shards of 500x375 JPEGs, the usual way (PIL + torchvision in the
    workers, float32 across) and through wrap (the files across, decoded on the device)."""
    out, r = run
    photos = r["webdataset_photos"]
    assert photos["images"] == 32 and photos["photo"] == [375, 500] and photos["crop"] == 224
    assert photos["decoder"].split()[0] in ("simplejpeg", "torchcodec", "torchvision")
    usual, wrapped = photos["photos-float32"], photos["photos-wrap"]
    assert usual["h2d_bytes_per_epoch"] == 32 * (3 * 224 * 224 * 4 + 8)
    assert 0 < wrapped["h2d_bytes_per_epoch"] <= photos["shard_bytes"]  # the files, labels
    for row in (usual, wrapped):
        assert all(v > 0 for v in row["images_per_s"] + row["cpu_seconds_per_epoch"])
    md = (out / "bench.md").read_text()
    assert "| photos-float32 |" in md and "| photos-wrap |" in md and "Photos streamed" in md


def test_wrap_over_an_image_folder_against_the_usual_dataloader(run):
    """The ImageFolder rows: the same 96 PNGs as float32 and as uint8 + wrap; exact bytes,
    CPU seconds of the main process and its workers."""
    out, r = run
    folder = r["image_folder"]
    assert (folder["images"], folder["workers"]) == (96, 2)
    usual, wrapped = folder["folder-float32"], folder["folder-wrap"]
    assert usual["h2d_bytes_per_epoch"] == 96 * (784 * 4 + 8)
    assert wrapped["h2d_bytes_per_epoch"] == 96 * (784 + 1)  # uint8 pixels, uint8 labels
    for row in (usual, wrapped):
        assert all(math.isfinite(v) and v > 0 for v in row["images_per_s"])
        assert all(math.isfinite(v) and v > 0 for v in row["cpu_seconds_per_epoch"])
    md = (out / "bench.md").read_text()
    assert "| folder-float32 |" in md and "| folder-wrap |" in md and f"{3144 / 785:.2f}x" in md


def test_cpu_seconds_count_the_dataloader_workers():
    """Work done in DataLoader worker processes shows in ``cpu_seconds``, not in the main
    process's own CPU time (the workers are alive, persistent, when it reads them)."""
    from torch.utils.data import DataLoader

    from latecast.tools.measure import cpu_seconds

    dl = DataLoader(Busy(), batch_size=2, num_workers=2, persistent_workers=True)
    next(iter(dl))  # workers started
    main0, all0 = time.process_time(), cpu_seconds()
    assert len(list(dl)) == 4
    main, everything = time.process_time() - main0, cpu_seconds() - all0
    assert everything - main >= 0.3  # 8 samples x 0.05 s of CPU each, in the workers
    del dl


class Busy(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        t0 = time.process_time()
        while time.process_time() - t0 < 0.05:  # 50 ms of this worker's CPU
            pass
        return i


def test_report_and_plot(run):
    out, _ = run
    rows = dict.fromkeys(LOADERS + ["usual-loop", "latecast"], True)
    assert_report(out / "bench.md", out / "bench.png", rows)


def tiny(n: int = 300):
    rng = np.random.default_rng(0)
    return from_arrays(rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8), rng.integers(0, 10, n))


def test_counted_bytes_match_epoch_bytes(run):
    """Over one real epoch the loaders count exactly what ``epoch_bytes`` promises."""
    got = bytes_per_epoch(tiny(), torch.device("cpu"), 64)
    for name in PIXEL_MOVERS:
        assert got[name]["measured"] == got[name]["per_epoch"], name
    assert got["float32"]["image_bytes"] == 4 * got["uint8"]["image_bytes"]
    assert got["float32"]["label_bytes"] == 8 * got["uint8"]["label_bytes"]
    assert got["resident"]["image_bytes"] == got["resident"]["label_bytes"] == 0
    assert got["resident"]["once"] == 300 * (8 * 8 * 3 + 1)
    assert run[1]["bytes_fewer_than_float32"] == {"image": 4.0, "label": 8.0}  # MNIST, counted


@pytest.mark.parametrize("transfer", PIXEL_MOVERS)
def test_every_pass_is_a_whole_epoch(transfer):
    """A pass stopped right after its last batch leaves a Loader at the end of its epoch; the
    benchmark must still time full epochs (regression: the 3rd pass used to deliver 0 images)."""
    loader = Loader(tiny(), 64, device="cpu", transfer=mover(transfer))
    start = epochs(loader)
    for _ in range(4):
        assert sum(len(x) for x, _ in itertools.islice(start(), len(loader))) == 300


def test_bad_settings_are_a_one_line_error(run_cli):
    r = run_cli("bench", "--repeats", "0", "--device", "cpu")
    assert r.rc == 1 and r.err == "latecast: error: repeats must be an integer >= 1, got 0\n"


def test_colour_store_with_augmentation(tmp_path, run_cli):
    """A CIFAR-shaped store, augmentation on: every loader row still runs, bytes are 4x/8x."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 300), ("test", 50)):
        images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        ds = from_arrays(images, rng.integers(0, 10, n), split=split, name="c10")
        write_store(ds, tmp_path / "c10" / split)
    argv = [*QUICK, *"--e2e-epochs 0 --augment crop,flip,cutout --json".split()]
    rc, r = run_cli("bench", tmp_path / "c10", *argv, "--output-dir", tmp_path / "out")
    assert rc == 0 and r["config"]["augment"] == "crop,flip,cutout"
    assert list(r["loader_images_per_s"]) == LOADERS
    assert all(v > 0 for v in r["loader_images_per_s"].values())
    assert r["bytes_fewer_than_float32"] == {"image": 4.0, "label": 8.0}
    assert r["h2d_bytes_per_epoch"]["uint8"] == 300 * (32 * 32 * 3 + 1)
    assert "augment: crop,flip,cutout" in (tmp_path / "out" / "bench.md").read_text()


def test_a_16_bit_store_is_refused_in_one_line_naming_it(tmp_path, run_cli):
    images = np.random.default_rng(0).integers(0, 65536, (20, 12, 10, 1), dtype=np.uint16)
    for split in ("train", "test"):
        write_store(from_arrays(images, np.arange(20) % 2, split=split), tmp_path / "d16" / split)
    r = run_cli("bench", tmp_path / "d16", "--device", "cpu", "--output-dir", tmp_path / "out")
    one_line_error(r, f"{tmp_path / 'd16'} is a 16-bit store", "latecast profile")
    assert not (tmp_path / "out").exists()
