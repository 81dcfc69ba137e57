"""The benchmark scripts, run at a tiny size so they cannot rot: the synthetic photo folder,
the JPEG loader comparison, random vs block order from cold pages, two revisions side by
side."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

from order_bench import cached_share, drop_pages  # noqa: E402


def script(name: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{BENCH}"}
    cmd = [sys.executable, str(BENCH / name), *map(str, args)]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("photos")
    script("synthetic_photos.py", out / "a", "--images", 6, "--classes", 2, cwd=out)
    return out / "a"


def test_synthetic_photos_are_deterministic_jpegs_of_imagenet_shape(photos, tmp_path):
    from PIL import Image

    files = sorted((photos / "train").rglob("*.jpg"))
    assert len(files) == 6 and {f.parent.name for f in files} == {"class000", "class001"}
    for f in files:
        with Image.open(f) as im:
            assert im.format == "JPEG" and 280 <= min(im.size) and max(im.size) <= 500
    script("synthetic_photos.py", tmp_path / "b", "--images", 2, "--classes", 2, cwd=tmp_path)
    again = sorted((tmp_path / "b" / "train").rglob("*.jpg"))
    first = [photos / f.relative_to(tmp_path / "b") for f in again]  # same names, same bytes
    assert len(again) == 2 and [f.read_bytes() for f in again] == [f.read_bytes() for f in first]


@pytest.mark.slow
def test_jpeg_loaders_rows_and_bytes(photos, tmp_path):
    proc = script(
        "jpeg_loaders.py", photos / "train", "--size", "48x40", "--augment", "resized_crop=0.1",
        "--workers", "0", "--limit-batches", "1", "--repeats", "1", "-b", "3", cwd=tmp_path,
    )  # fmt: skip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    rates = result["images_per_s"]
    assert set(rates) == {"latecast-jpeg-t1", "latecast-uint8 (raw store)", "torchvision-w0"}
    assert all(v > 0 for v in rates.values())
    files = sum(f.stat().st_size for f in (photos / "train").rglob("*.jpg"))
    assert result["disk_bytes"]["jpeg"] == files
    assert result["bytes_per_epoch"]["jpeg"] == files + 6  # + one label byte each
    assert result["bytes_per_epoch"]["uint8"] == 6 * (48 * 40 * 3 + 1)
    assert "| latecast-jpeg-t1 |" in proc.stdout


def test_dropped_pages_leave_the_page_cache(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(4 << 20))
    path.read_bytes()
    if cached_share([path]) < 0.9:
        pytest.skip("this filesystem does not keep written files in the page cache")
    drop_pages([path])
    if cached_share([path]) > 0.5:  # tmpfs: its pages are the file, they cannot be dropped
        pytest.skip(f"{tmp_path} cannot drop cached pages (tmpfs?)")
    path.read_bytes()
    assert cached_share([path]) > 0.9


@pytest.mark.slow
def test_order_bench_times_both_orders_from_cold_pages_and_trains(tmp_path):
    store = tmp_path / "store"
    script(
        "synthetic_store.py", store, "--shape", "8x8x3", "--train", 600, "--test", 100,
        cwd=tmp_path,
    )  # fmt: skip
    proc = script(
        "order_bench.py", store, "--repeats", "1", "-b", "64", "--order", "block:8:4",
        "--train", "--model mlp --epochs 1 -b 64 --device cpu", "--output-dir", tmp_path / "runs",
        cwd=tmp_path,
    )  # fmt: skip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for order in ("random", "block"):
        assert result[order]["images_per_s"] > 0 and 0 <= result[order]["cached_before"] <= 1
        assert len(result[order]["per_epoch"]) == 1 and 0 <= result[order]["test_accuracy"] <= 1
    config = json.loads((tmp_path / "runs" / "block" / "config.json").read_text())
    assert config["order"] == "block:8:4"


def test_revisions_times_both_revisions_every_round(tmp_path):
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if head.returncode:
        pytest.skip(f"no git history here: {head.stderr.strip()}")
    rev = head.stdout.strip()
    proc = script(
        "revisions.py",
        rev,
        "HEAD",
        "--rounds",
        2,
        "--epochs",
        1,
        "--transfers",
        "resident,uint8",
        cwd=tmp_path,
    )
    rates = json.loads(proc.stdout.splitlines()[-1])["images_per_s"]
    assert list(rates) == ["resident", "uint8"]
    for by_rev in rates.values():
        assert list(by_rev) == [rev, "HEAD"] and all(len(r) == 2 for r in by_rev.values())
        assert all(r > 0 for runs in by_rev.values() for r in runs)
    assert "| resident |" in proc.stdout


def test_threads_prints_one_row_per_workload_threads_and_load(tmp_path):
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if head.returncode:
        pytest.skip(f"no git history here: {head.stderr.strip()}")
    args = (head.stdout.strip(), "HEAD", "--batches", 2, "--epochs", 1)
    lines = script("threads.py", *args, cwd=tmp_path).stdout.splitlines()
    rows = json.loads(lines[-1])["rows"]
    assert [(r["threads"], r["busy"]) for r in rows] == [
        (1, False),
        (2, False),
        (1, True),
        (2, True),
    ]
    assert all(len(runs) == 1 and runs[0][0] > 0 for r in rows for runs in r["runs"].values())
    assert sum(line.startswith("| mnist resident") for line in lines) == 4


def test_jpeg_cpu_times_the_floor_the_decode_step_and_the_loader(tmp_path, photos):
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode:
        pytest.skip("no git history here")
    proc = script(
        "jpeg_cpu.py", "HEAD", "HEAD", "--photos", photos / "train", "--rounds", 1,
        "--batches", 1, "--repeats", 1, cwd=tmp_path,
    )  # fmt: skip
    rows = json.loads(proc.stdout.splitlines()[-1])["rows"]
    assert list(rows) == [f"photos {step} | HEAD" for step in ("floor", "decode", "loader")]
    assert all(r["cpu_us"] > 0 and r["images_per_s"] > 0 for runs in rows.values() for r in runs)


@pytest.mark.slow
def test_stream_rss_walks_an_epoch_under_its_cap_locally_and_over_http(tmp_path):
    proc = script(
        "stream_rss.py", "--work", tmp_path, "--sizes", "0.001", "--photo", "32", "--http",
        "-b", "8", cwd=tmp_path,
    )  # fmt: skip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    local, http = result["rows"].values()
    assert list(result["rows"]) == ["0.001 GB local", "0.001 GB http"]
    assert local["images"] == http["images"] > 0 and local["shard_bytes"] >= 2**20
    assert all(0 < r["peak_rss_anon"] <= r["vm_hwm"] for r in (local, http))
    assert "| 0.001 GB http |" in proc.stdout


def test_video_decode_counts_what_each_way_sends_per_clip(tmp_path):
    """2 files of 32x48, clips of 2 frames: float32 crops of 12x12, uint8 RGB resized to
    16x24 (``clip``), YUV 4:2:0 planes at the files' size (``video``: 1.5 bytes a pixel), as
    wrap counts them."""
    args = "--videos 2 --frames 2 --length 4 --source 32x48 --resize 16x24 --crop 12 --rounds 1"
    proc = script("video_decode.py", *args.split(), cwd=tmp_path)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["bytes"] == {
        "float32, RGB on the host": 4 * 3 * 2 * 12 * 12,
        "latecast.clip, RGB on the host": 2 * 16 * 24 * 3,
        "latecast.video, YUV 4:2:0 on the host": 2 * 32 * 48 * 3 // 2,
    }
    assert all(host > 0 for host, _ in result["cpu_ms"].values())
    assert all(ms > 0 for ms in result["steps_ms"].values())
