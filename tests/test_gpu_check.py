"""benchmarks/gpu_check.sh, run on CPU with tiny settings so the GPU check cannot rot."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = "--model mlp --epochs 1 -b 256 --limit-train 512 --limit-test 500"


@pytest.mark.slow
def test_gpu_check_runs_every_part_on_cpu(tmp_path):
    env = {
        **os.environ,
        "OUT": str(tmp_path),
        "PYTHON": sys.executable,
        "DEVICE": "cpu",
        "STEPS": "1",
        "PROFILE_ARGS": "--warmup 0 -b 16",
        "REPEATS": "1",
        "LIMIT_BATCHES": "1",
        "E2E_EPOCHS": "1",
        "BENCH_ARGS": "-b 32 --e2e-batch-size 32 --folder-images 64",
        "SEEDS": "1",
        "TRAIN_ARGS": f"{TINY} --transfer resident",
        "CIFAR_TRAIN": "256",
        "CIFAR_TEST": "64",
        "CIFAR_EPOCHS": "1",
        "CIFAR_ARGS": "-b 64",
        "PHOTOS": "4",
        "PHOTO_ARGS": "-b 2 --limit-batches 1 --workers 0",
        "TORCHRUN_ARGS": TINY,
        "SWEEP": "-b 128|-b 512",
        "SWEEP_ARGS": TINY,
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = (tmp_path / "parts.tsv").read_text().splitlines()[1:]
    names = [line.split("\t")[0] for line in parts]
    assert names == [
        "gpu-tests",
        "profile",
        "bench",
        "cifar10-store",
        "cifar10-bench-off",
        "cifar10-bench-crop",
        "cifar10-train",
        "photos-folder",
        "photos-loaders",
        "torchrun",
        "train-warmup",
        "train-1",
        "sweep-0",
        "sweep-1",
        "summary",
    ]
    assert all(line.split("\t")[1] == "ok" for line in parts), parts
    # what the summary reads, and the summary itself
    assert json.loads((tmp_path / "profile" / "report.json").read_text())["rows"]
    assert list((tmp_path / "profile").glob("trace-*.json.gz"))
    assert json.loads((tmp_path / "bench" / "bench.json").read_text())["device"] == "cpu"
    assert json.loads((tmp_path / "train" / "1.json").read_text())["device"] == "cpu"
    assert json.loads((tmp_path / "sweep" / "1.json").read_text())["epochs"] == 1
    cifar = json.loads((tmp_path / "cifar10-train.out").read_text().splitlines()[-1])
    assert cifar["model"] == "resnet9" and cifar["dataset"] == "cifar10-shaped"
    augmented = json.loads((tmp_path / "cifar10" / "bench-crop" / "bench.json").read_text())
    assert augmented["config"]["augment"] == "crop,flip,cutout"
    photos = json.loads((tmp_path / "photos-loaders.out").read_text().splitlines()[-1])
    assert set(photos["images_per_s"]) >= {"latecast-jpeg-t1", "torchvision-w0"}
    assert json.loads((tmp_path / "torchrun.out").read_text().splitlines()[-1])["world_size"] == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["targets"]) >= 8 and summary["failed_parts"] == []
    assert "| target | measured |" in proc.stdout and "n/a (no device)" in proc.stdout
    assert (tmp_path / "gpu_check.log").stat().st_size > 0


def test_a_failing_part_is_recorded_and_the_rest_still_runs(tmp_path):
    """A broken part (here: an unknown device for every latecast command) fails the run at
    the end, after every other part ran and the summary was written."""
    env = {
        **os.environ,
        "OUT": str(tmp_path),
        "PYTHON": sys.executable,
        "DEVICE": "nodevice",
        "SEEDS": "1",
        "PHOTOS": "4",
        "PYTEST_ARGS": "-m gpu --co tests/test_gpu_check.py",
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    table = (tmp_path / "parts.tsv").read_text()
    failed = ("profile", "bench", "cifar10-bench-off", "photos-loaders", "torchrun")
    for name in (*failed, "train-warmup", "train-1"):
        assert f"{name}\tFAILED" in table, table
    assert "summary\tok" in table and "gpu-tests\tok" in table
    assert "FAILED parts: profile bench" in proc.stdout
    assert "missing" in (tmp_path / "summary.md").read_text()
