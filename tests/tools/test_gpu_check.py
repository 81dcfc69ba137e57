"""benchmarks/gpu_check.sh, run on CPU with tiny settings so the GPU check cannot rot."""

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = "--model mlp --epochs 1 -b 256 --limit-train 512 --limit-test 500"


def gpu_check(env: dict) -> subprocess.CompletedProcess:
    """``bash benchmarks/gpu_check.sh``, ``env`` added to this process's environment."""
    script = str(ROOT / "benchmarks" / "gpu_check.sh")
    return subprocess.run(
        ["bash", script], env={**os.environ, **env}, capture_output=True, text=True
    )


def tiny_carry(folder: Path) -> Path:
    """What `make shared-carry` puts in shared-carry/, at a tiny size: a CIFAR-10-like JPEG
    tarball (3 classes, 32x32) and its SHA256SUMS; no airbench (it runs on CUDA only)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    jpg = folder / "jpg"
    for split, n in (("train", 20), ("test", 4)):
        for name in ("airplane", "cat", "dog"):
            (jpg / split / name).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(jpg / split / name / f"{i:04d}.jpg")
    carry = folder / "carry"
    carry.mkdir()
    with tarfile.open(carry / "cifar10-jpg.tar.gz", "w:gz") as tar:
        for split in ("test", "train"):
            tar.add(jpg / split, arcname=split)
    digest = hashlib.sha256((carry / "cifar10-jpg.tar.gz").read_bytes()).hexdigest()
    (carry / "SHA256SUMS").write_text(f"{digest}  cifar10-jpg.tar.gz\n")
    return carry


@pytest.mark.slow
def test_gpu_check_runs_every_part_on_cpu(tmp_path):
    out = tmp_path / "out"
    env = {
        "OUT": str(out),
        "PYTHON": sys.executable,
        "DEVICE": "cpu",
        "LIMITS": "off",  # a loaded machine may take many times the GPU's limits
        "PYTEST_ARGS": "-m gpu tests/core/test_gpu.py",
        "SEEDS": "1",
        "TRAIN_ARGS": f"{TINY} --transfer resident",  # --graph is CUDA only
        "CARRY": str(tiny_carry(tmp_path)),
        "PEER_SEEDS": "1",
        "PEER_ARGS": "--preset colour -b 32 --epochs 1 --limit-test 12",
        "VARIANTS": "eager:",  # --compile on the CPU: tests/trainer/test_train_step.py
        "COMPILE_ARGS": TINY,
        "STEPS": "1",
        "PROFILE_ARGS": "--warmup 0 -b 16",
        "REPEATS": "1",
        "LIMIT_BATCHES": "1",
        "E2E_EPOCHS": "1",
        "BENCH_ARGS": "-b 32 --e2e-batch-size 32",
        "CIFAR_BATCHES": "1",
        "FOLDER_IMAGES": "64",
        "PHOTOS": "8",
        "PHOTO_ARGS": "-b 4 --limit-batches 1",
        "WDS_PHOTOS": "16",
        "TORCHRUN_ARGS": TINY,
    }
    proc = gpu_check(env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split("\t") for line in (out / "parts.tsv").read_text().splitlines()[1:]]
    status = {name: state for name, state, _ in rows}
    assert list(status) == [
        "gpu-tests",
        "photo-rows",
        "train-warmup",
        "train-1",
        "peer-data",
        "peer-airbench",
        "peer-latecast-1",
        "mnist-eager",
        "profile",
        "bench",
        "cifar10-bench",
        "photos-folder",
        "photos-loaders",
        "torchrun",
        "summary",
    ]
    assert status.pop("peer-airbench") == "skipped (no CUDA device)"
    assert all(state == "ok" for state in status.values()), rows
    # what the summary reads, and the summary itself
    assert json.loads((out / "train" / "1.json").read_text())["device"] == "cpu"
    assert (out / "train" / "1.metrics.jsonl").read_text().count('"epoch"') == 1
    peer = json.loads((out / "peers" / "latecast-1.json").read_text())
    assert peer["model"] == "resnet9" and peer["dataset"] == "cifar10-jpg" and peer["step"] == 1
    assert json.loads((out / "compile" / "eager.json").read_text())["compile"] is False
    assert json.loads((out / "profile" / "report.json").read_text())["rows"]
    photos = json.loads((out / "photo-rows" / "bench.json").read_text())["webdataset_photos"]
    assert photos["images"] == 16 and "photos-wrap" in photos
    assert list((out / "profile").glob("trace-*.json.gz"))
    assert json.loads((out / "bench" / "bench.json").read_text())["prepare_kernel_us"] == {}
    cifar = json.loads((out / "cifar10-bench" / "bench.json").read_text())
    assert cifar["config"]["augment"] == "crop,flip,cutout" and cifar["dataset"] == "cifar10-jpg"
    kernels = cifar["prepare_kernel_us"]
    assert list(kernels) == ["float32 NCHW", "float32 channels_last"]  # bf16: CUDA only
    for ways in kernels.values():
        assert list(ways) == ["two-pass", "fused", "compiled"]
        assert all(w["us"] > 0 and w["max_diff"] < 1e-5 for w in ways.values())
    assert "Prepare kernel" in (out / "cifar10-bench" / "bench.md").read_text()
    assert json.loads((out / "torchrun.out").read_text().splitlines()[-1])["world_size"] == 1
    summary = json.loads((out / "summary.json").read_text())
    targets = [t["target"] for t in summary["targets"]]
    assert targets[:3] == [
        "data wait < 1% of training time (resident, no profiler)",
        "MNIST >= 99.0% in < 0.3 s of training",
        "CIFAR-10 JPEG: airbench94's mean accuracy in less time",
    ]
    assert summary["targets"][2]["measured"].startswith("missing (airbench94")
    assert targets[-1].startswith("photos streamed")
    assert " -> " in summary["targets"][-1]["measured"]
    assert summary["failed_parts"] == [] and summary["skipped_parts"] == ["peer-airbench"]
    assert "| target | measured |" in proc.stdout and "n/a (no device)" in proc.stdout
    assert (out / "gpu_check.log").stat().st_size > 0


def test_a_failing_part_is_recorded_and_the_rest_still_runs(tmp_path):
    """A broken part (an unknown device; a tarball failing its SHA-256) fails the run at the
    end, after every other part ran and the summary was written."""
    carry = tmp_path / "carry"
    carry.mkdir()
    (carry / "cifar10-jpg.tar.gz").write_bytes(b"not the tarball")
    (carry / "SHA256SUMS").write_text(f"{'0' * 64}  cifar10-jpg.tar.gz\n")
    env = {
        "OUT": str(tmp_path),
        "PYTHON": sys.executable,
        "DEVICE": "nodevice",
        "LIMITS": "off",
        "PHOTOS": "8",  # the one part that still works: make it small
        "SEEDS": "1",
        "CARRY": str(carry),
        "VARIANTS": "eager:",
        "PYTEST_ARGS": "-m gpu --co tests/tools/test_gpu_check.py",
    }
    proc = gpu_check(env)
    assert proc.returncode != 0
    table = (tmp_path / "parts.tsv").read_text()
    parts = (
        "photo-rows",
        "train-warmup",
        "train-1",
        "peer-data",
        "mnist-eager",
        "profile",
        "bench",
    )
    for name in parts:
        assert f"{name}\tFAILED" in table, table
    assert "summary\tok" in table and "gpu-tests\tok" in table
    assert "cifar10-jpg.tar.gz: FAILED" in (tmp_path / "peer-data.out").read_text()
    assert "FAILED parts: photo-rows train-warmup train-1 peer-data" in proc.stdout
    assert "missing" in (tmp_path / "summary.md").read_text()


def test_the_budget_skips_what_would_start_too_late(tmp_path):
    """With no time left every part is recorded as skipped, the table is still written, and
    the whole check returns at once."""
    env = {"OUT": str(tmp_path), "PYTHON": sys.executable, "TOTAL_BUDGET": "0"}
    proc = gpu_check(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = (tmp_path / "parts.tsv").read_text().splitlines()[1:]
    assert rows[0].startswith("gpu-tests\tskipped (out of time)")
    assert rows[-1].startswith("summary\tok") and len(rows) >= 8
    assert "skipped parts: gpu-tests photo-rows train-warmup" in proc.stdout
