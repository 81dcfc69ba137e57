"""Checkpoints written by an earlier latecast still resume, exactly.

Each earlier release is the package as it landed at a commit of ``RELEASES`` (read from this
checkout's own git history with ``git archive``; skipped where the checkout has no history).
It trains a few steps and is stopped right after a mid-epoch checkpoint; today's code
resumes that checkpoint and must end with the same weights as today's code trained without
a stop. A release's own flags may differ from today's for the same run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RELEASES = [  # (commit, its flags, today's flags for the same run)
    ("b7eaa3d", [], []),  # the last landing before the three-stage refactor (issue 8)
    ("fd98eaa", ["--order", "block", "--block", "8"], ["--order", "block:8:256"]),  # --block
]
ARGS = [
    "train",
    "--model",
    "mlp",
    "--epochs",
    "2",
    "-b",
    "128",
    "--limit-train",
    "1024",
    "--limit-test",
    "256",
    "--device",
    "cpu",
    "--checkpoint-every",
    "5",
    "--augment",
    "crop=2",
    "--no-progress",
]
STOP_AFTER_STEP_5 = """
import importlib, importlib.util, sys
from pathlib import Path
new = importlib.util.find_spec("latecast.trainer") is not None  # the layout of 5f3ee1f on
saver = importlib.import_module("latecast.trainer.checkpoint" if new else "latecast.train")
save = saver.save_checkpoint
def save_then_stop(path, state):
    save(path, state)
    if state["step"] == 5 and Path(path).name == "checkpoint.pt":
        raise SystemExit(3)
saver.save_checkpoint = save_then_stop
cli = importlib.import_module("latecast.tools.cli" if new else "latecast.cli")
sys.exit(cli.main(sys.argv[1:]))
"""


def old_package(tmp: Path, old: str) -> Path:
    archive = tmp / "old.tar"
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "-o", str(archive), old, "src/latecast"],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        pytest.skip(f"this checkout has no git history with {old}: {proc.stderr.strip()}")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp / "old")  # our own history: trusted
    return tmp / "old" / "src"


@pytest.mark.slow
@pytest.mark.parametrize("old, old_flags, flags", RELEASES)
def test_a_checkpoint_of_the_previous_release_resumes_exactly(
    tmp_path, old, old_flags, flags, run_cli
):
    old_src = old_package(tmp_path, old)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",  # bitwise equality needs one thread
        "LATECAST_CACHE": str(tmp_path / "old-cache"),  # its own cache format
        "PYTHONPATH": str(old_src),
    }
    cmd = [sys.executable, "-c", STOP_AFTER_STEP_5, *ARGS, *old_flags]
    proc = subprocess.run(
        [*cmd, "--output-dir", str(tmp_path / "resumed")], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    # Today's code in this process (its start-up is most of a run here), on one thread too.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for out, extra in (("resumed", ["--resume", "auto"]), ("straight", [])):
            proc = run_cli(*ARGS, *flags, "--output-dir", tmp_path / out, *extra)
            assert proc.rc == 0, proc.err[-2000:]
    finally:
        torch.set_num_threads(threads)
    a, b = (
        torch.load(tmp_path / d / "checkpoint.pt", weights_only=True)
        for d in ("resumed", "straight")
    )
    assert a["step"] == b["step"] == 16
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])
    assert [r["train_loss"] for r in a["history"]] == [r["train_loss"] for r in b["history"]]
