"""The side-by-sides with peers, run on the CPU at a small size so they cannot rot:
benchmarks/peer_data.py writes one JPEG folder as a latecast store and as airbench's
cifar10/*.pt, and airbench's own loader reads what it wrote; benchmarks/peers.py runs its
latecast and torchvision rows (FFCV and DALI, installed in their own venvs, are left out
here). Only the parts that need the files under ../shared (the airbench package, the real
CIFAR-10 JPEG copy) skip without it."""

from __future__ import annotations

import gzip
import json
import struct
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

import latecast

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
AIRBENCH = SHARED / "peers" / "airbench-0.1.8.tar.gz"
CIFAR_JPG = SHARED / "datasets" / "cifar10-jpg" / "cifar10-jpg.tar.gz"
CLASSES = ("airplane", "cat", "dog")
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts, imported: no Python start-ups

import airbench_run  # noqa: E402
import peer_data  # noqa: E402
import peers  # noqa: E402


def jpeg_folder(root: Path, per_class: dict[str, int]) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in per_class.items():
        for name in CLASSES:
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i:04d}.jpg", quality=75)
    return root


def test_both_formats_hold_the_same_pixels_and_labels(tmp_path):
    folder = jpeg_folder(tmp_path / "jpg", {"train": 4, "test": 2})
    result = peer_data.prepare(folder, tmp_path / "out")
    assert result["samples"] == {"train": 12, "test": 6}
    assert result["classes"] == list(CLASSES)
    for split in ("train", "test"):
        store = latecast.load_dataset(str(tmp_path / "out" / "store"), split)
        data = torch.load(tmp_path / "out" / "cifar10" / f"{split}.pt", weights_only=True)
        assert set(data) == {"images", "labels", "classes"}
        assert data["images"].dtype == torch.uint8 and data["images"].shape[1:] == (32, 32, 3)
        assert data["labels"].dtype == torch.int64 and data["classes"] == list(CLASSES)
        assert np.array_equal(data["images"].numpy(), store.images)
        assert np.array_equal(data["labels"].numpy(), store.labels)
    assert sorted(set(data["labels"].tolist())) == [0, 1, 2]


def test_airbench_runner_says_it_needs_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: gpu_check runs airbench for real")
    assert airbench_run.main([str(tmp_path), "--package", str(AIRBENCH)]) == 77


@pytest.mark.skipif(not AIRBENCH.is_file(), reason=f"needs {AIRBENCH}")
def test_airbench_reads_what_we_wrote(tmp_path, monkeypatch):
    """airbench's own CifarLoader (on the CPU here) reads the prepared files: every image,
    the labels, normalized batches of the right shape."""
    monkeypatch.syspath_prepend(str(tmp_path))  # import_airbench extends sys.path
    airbench = airbench_run.import_airbench(AIRBENCH, tmp_path / "pkg")
    peer_data.prepare(jpeg_folder(tmp_path / "jpg", {"train": 4, "test": 2}), tmp_path / "out")
    monkeypatch.chdir(tmp_path / "out")
    loader = airbench.CifarLoader("cifar10", train=True, batch_size=4, gpu="cpu")
    assert loader.images.shape == (12, 3, 32, 32) and loader.labels.tolist().count(0) == 4
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 32, 32) and torch.isfinite(images.float()).all()


@pytest.mark.skipif(not CIFAR_JPG.is_file(), reason=f"needs {CIFAR_JPG}")
def test_real_cifar10_jpegs_prepare(tmp_path):
    """Three real images per class and split from the CIFAR-10 JPEG copy, end to end."""
    wanted, taken = {}, {}
    with tarfile.open(CIFAR_JPG) as tar:
        for member in tar:
            key = str(Path(member.name).parent)  # e.g. "train/cat"
            if member.isfile() and taken.get(key, 0) < 3:
                taken[key] = taken.get(key, 0) + 1
                wanted[member.name] = tar.extractfile(member).read()
    for name, data in wanted.items():
        (tmp_path / "jpg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "jpg" / name).write_bytes(data)
    result = peer_data.prepare(tmp_path / "jpg", tmp_path / "out")
    assert result["samples"] == {"train": 30, "test": 30} and len(result["classes"]) == 10
    assert result["classes"][:3] == ["airplane", "automobile", "bird"]


def mnist_files(root: Path, n: int) -> np.ndarray:
    """MNIST's two training idx files (gzipped) of ``n`` random images; the images."""
    images = np.random.default_rng(1).integers(0, 256, (n, 28, 28), dtype=np.uint8)
    root.mkdir()
    with gzip.open(root / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
    with gzip.open(root / "train-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 2049, n) + (np.arange(n) % 10).astype(np.uint8).tobytes())
    return images


def test_peers_runs_latecast_wrap_and_torchvision_rows_and_leaves_the_others_out(tmp_path, capsys):
    """Every workload's latecast, wrap (a DataLoader with a worker) and torchvision rows,
    from formats the script wrote itself: float32 NCHW batches of the workload's shape, a
    rate and a CPU time each, one JSON."""
    cifar = jpeg_folder(tmp_path / "cifar", {"train": 40})
    mnist_files(tmp_path / "mnist", 200)
    argv = [
        "--cifar", cifar, "--mnist", tmp_path / "mnist", "--photos", 4, "--limit", 150,
        "--work", tmp_path / "work", "--rounds", 1, "--warmup", 1, "-b", 32,
        "--photo-batch-size", 2, "--ffcv-python", tmp_path / "none", "--in-process",
        "--loader-workers", 1,
        "--json", tmp_path / "peers.json",
    ]  # fmt: skip
    threads = torch.get_num_threads()
    assert peers.main([str(a) for a in argv]) == 0
    printed = capsys.readouterr().out
    assert f"ffcv: left out: {tmp_path / 'none'} does not exist" in printed
    assert "dali: left out: no --dali-python given" in printed
    result = json.loads((tmp_path / "peers.json").read_text())
    assert json.loads(printed.strip().splitlines()[-1]) == result
    assert set(result["left_out"]) == {"ffcv", "dali"}
    rows = {(r["workload"], r["peer"]): r for r in result["rows"]}
    assert set(rows) == {
        ("cifar-raw", "latecast"), ("cifar-raw", "torchvision"), ("cifar-jpeg", "latecast"),
        ("cifar-jpeg", "wrap-jpeg"), ("cifar-jpeg", "wrap-held"), ("cifar-jpeg", "wrap"),
        ("photos", "wrap-jpeg"), ("photos", "wrap-held"), ("photos", "wrap"),
        ("photos", "latecast"), ("photos", "torchvision"),
        ("mnist", "latecast"), ("mnist", "torchvision"),
    }  # fmt: skip
    shapes = {"cifar-raw": (32, 3, 32, 32), "cifar-jpeg": (32, 3, 32, 32)}
    shapes |= {"photos": (2, 3, 224, 224), "mnist": (32, 1, 28, 28)}
    counts = {"cifar-raw": 120, "cifar-jpeg": 120, "photos": 4, "mnist": 150}
    for (workload, peer), row in rows.items():
        assert row["output"] == f"float32 {shapes[workload]}", (workload, peer)
        assert row["images"] == counts[workload] == row["runs"][0]["epochs"][0]["images"]
        assert row["images_per_s"] > 0 and row["cpu_seconds"] >= 0 and not row["errors"]
        assert f"| {workload} | 1 | {peer} |" in printed
    for workload in ("cifar-jpeg", "photos"):  # the held batches are the DataLoader's own
        held, jpeg = rows[(workload, "wrap-held")], rows[(workload, "wrap-jpeg")]
        assert held["first_batch"] == jpeg["first_batch"], workload
    assert torch.get_num_threads() == threads  # put back: the runs were in this process


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_peers_counts_the_cpu_of_workers_that_outlive_the_epoch():
    """Persistent DataLoader workers are not waited for inside a timed epoch: their CPU is
    read from /proc while they run, and a child waited for between two readings is
    counted once, not twice. Measured in a fresh process, as peers.py measures: this one's
    other children (earlier tests') come and go."""
    import subprocess

    script = f"""
import subprocess, sys, time
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
import peers
spin = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass\\n"
before = peers.cpu_seconds()
child = subprocess.Popen([sys.executable, "-c", spin + "time.sleep(60)"])
while peers.running_children() < 0.3 and child.poll() is None:  # its spin done
    time.sleep(0.01)
alive = peers.cpu_seconds() - before
child.kill()
child.wait()
print(alive, peers.cpu_seconds() - before)  # the child now in RUSAGE_CHILDREN, not /proc
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    alive, waited = map(float, proc.stdout.split())
    assert alive >= 0.3 and alive - 0.02 <= waited <= alive + 0.1, (alive, waited)
