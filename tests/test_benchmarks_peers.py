"""The side-by-side with airbench, prepared on the CPU at a small size so it cannot rot:
benchmarks/peer_data.py writes one JPEG folder as a latecast store and as airbench's
cifar10/*.pt, and airbench's own loader reads what it wrote. Only the parts that need the
files under ../shared (the airbench package, the real CIFAR-10 JPEG copy) skip without it."""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

import latecast

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
AIRBENCH = SHARED / "peers" / "airbench-0.1.8.tar.gz"
CIFAR_JPG = SHARED / "datasets" / "cifar10-jpg" / "cifar10-jpg.tar.gz"
CLASSES = ("airplane", "cat", "dog")
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts, imported: no Python start-ups

import airbench_run  # noqa: E402
import peer_data  # noqa: E402


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
