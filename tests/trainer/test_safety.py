"""Never lose a user's data, never show a traceback (issue 12): the output folder, the data
fingerprint, full and read-only disks (a real small tmpfs: root only, else skipped with the
reason), killed saves, every input checked before work starts, and Ctrl-C at any moment."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from subprocess import PIPE

import _helpers
import numpy as np
import pytest
import torch
from _helpers import held, one_line_error, tmpfs

from latecast.data import from_arrays
from latecast.errors import CheckpointError, ConfigError, FormatError
from latecast.loader import Loader
from latecast.storage.datasets import load_dataset
from latecast.storage.store import open_store, write_store
from latecast.tools.cli import _strict
from latecast.trainer import checkpoint as ckpt
from latecast.trainer.checkpoint import fingerprint
from latecast.trainer.loop import TrainConfig
from latecast.trainer.rundir import ASIDE, LOCK, MOVING, RUN_FILES
from latecast.transforms import Mix, normalize

# Two steps of an mlp on bundled MNIST: about a second in-process.
TINY = "--model mlp --epochs 1 -b 128 --limit-train 256 --limit-test 128 --device cpu --no-progress"
TINY = TINY.split()


tree = partial(_helpers.tree, skip=(LOCK,))  # the run lock's record of who held it last aside


def read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def started(*argv, env: dict | None = None, **kwargs) -> subprocess.Popen:
    """A real ``python -m latecast *argv`` (``env`` added to this one's), running."""
    argv = [sys.executable, "-m", "latecast", *map(str, argv)]
    return subprocess.Popen(argv, env={**os.environ, **(env or {})}, **kwargs)


def stopped(proc: subprocess.Popen) -> None:
    """Until ``proc`` has stopped itself at the point ``LATECAST_STOP_AT=...:STOP`` names."""
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"it ended (status {status}) before its stop point"


# -- one run at a time ------------------------------------------------------------


def test_a_held_folder_is_refused_naming_the_other_run_and_a_dead_holder_does_not_block(
    tmp_path, run_cli
):
    out = tmp_path / "run"
    with held(out) as other:
        for extra in ([], ["--check"], ["--resume", "auto"], ["--overwrite"]):
            proc = run_cli("train", *TINY, "--output-dir", out, *extra)
            one_line_error(proc, str(out), "in use by another latecast run", f"pid {other.pid}")
        assert sorted(p.name for p in out.iterdir()) == [LOCK]  # nothing else written
    assert (out / LOCK).read_text().startswith(f"latecast run: pid {other.pid}")  # stale file
    rc, summary = run_cli("train", *TINY, "--output-dir", out, "--json")
    assert rc == 0 and summary["step"] == 2
    assert f"pid {os.getpid()}" in (out / LOCK).read_text()  # this run held it


def test_two_runs_started_at_once_into_one_folder_never_both_run(tmp_path, run_cli):
    """The folder is held before any data loads: a second run started while the first loads
    (stopped there) is refused, not trained and then replaced by the first."""
    out, args = tmp_path / "run", [*TINY, "--resume", "auto"]
    stop = {"LATECAST_STOP_AT": "data:STOP"}
    first = started("train", *args, "--output-dir", out, "--json", stdout=PIPE, text=True, env=stop)
    try:
        stopped(first)
        second = run_cli("train", *args, "--output-dir", out)
        first.send_signal(signal.SIGCONT)
        summary = json.loads(first.communicate(timeout=300)[0].strip().splitlines()[-1])
    finally:
        first.kill()
    one_line_error(second, str(out), "in use by another latecast run", f"pid {first.pid}")
    assert first.returncode == 0 and summary["step"] == 2
    assert json.loads((out / "summary.json").read_text()) == summary  # the first run's


@pytest.mark.slow
def test_under_torchrun_a_held_folder_is_refused_by_rank_0(tmp_path):
    """Rank 0 alone locks the folder; another run holds it: the job stops before training."""
    out = tmp_path / "held"
    with held(out) as other:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
            + ["--monitor-interval=0.1", "-m", "latecast", "train", *TINY, "--output-dir", out],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert proc.returncode != 0
    assert proc.stderr.count(f"in use by another latecast run (pid {other.pid}") == 1, proc.stderr
    assert "epoch 1/1" not in proc.stdout and sorted(os.listdir(out)) == [LOCK]


# -- a previous run is never silently replaced ------------------------------------


def test_a_previous_run_is_refused_unless_resume_or_overwrite(tmp_path, run_cli):
    out = tmp_path / "run"
    assert run_cli("train", *TINY, "--output-dir", out).rc == 0
    (out / "notes.txt").write_text("mine")
    (out / "plots").mkdir()
    before = tree(out)

    line = one_line_error(run_cli("train", *TINY, "--output-dir", out, "--lr", "0.2"), str(out))
    assert "--resume auto" in line and "--overwrite" in line and "checkpoint.pt" in line
    elsewhere = tmp_path / "other" / "checkpoint.pt"
    assert run_cli("train", *TINY, "--output-dir", elsewhere.parent).rc == 0
    one_line_error(run_cli("train", *TINY, "--output-dir", out, "--resume", elsewhere), str(out))
    assert tree(out) == before  # refused: not a byte changed

    # The same run continues: it had finished, so nothing is trained, nothing moved.
    proc = run_cli("train", *TINY, "--output-dir", out, "--resume", "auto", "--json")
    assert proc.rc == 0, proc.err
    moved = [line for line in proc.out.splitlines() if line.startswith("host->device")]
    assert moved == ["host->device: 0 B moved; float32 would have moved 0 B"]

    proc = run_cli("train", *TINY, "--output-dir", out, "--lr", "0.2", "--overwrite", "--json")
    assert proc.rc == 0, proc.err
    assert json.loads((out / "config.json").read_text())["lr"] == 0.2
    assert (out / "notes.txt").read_text() == "mine" and (out / "plots").is_dir()


def foreign(out: Path, name: str) -> None:
    """A file of the user's that merely has one of a run's names."""
    out.mkdir()
    if name.endswith(".pt"):
        torch.save({"state_dict": {"w": torch.ones(3)}}, out / name)  # their own model
    elif name == "metrics.jsonl":
        (out / name).write_text('{"epoch": 1, "step": 5, "test_accuracy": 0.5}\n{"note": 1}\n')
    else:
        (out / name).write_text('{"my": "settings"}')


@pytest.mark.parametrize("name", RUN_FILES)
def test_overwrite_never_replaces_a_file_latecast_did_not_write(name, tmp_path, run_cli):
    out = tmp_path / "run"
    foreign(out, name)
    before = tree(out)
    for extra in (["--overwrite"], ["--overwrite", "--check"]):
        one_line_error(run_cli("train", *TINY, "--output-dir", out, *extra), str(out / name))
    assert tree(out) == before


def test_overwrite_and_resume_exclude_each_other(tmp_path, run_cli):
    proc = run_cli("train", *TINY, "--output-dir", tmp_path, "--overwrite", "--resume", "auto")
    one_line_error(proc, "overwrite", "resume")


def run_files(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in RUN_FILES if (out / name).exists()}


def test_overwrite_that_fails_before_its_first_checkpoint_puts_the_previous_run_back(
    tmp_path, run_cli
):
    out = tmp_path / "run"
    assert run_cli("train", *TINY, "--output-dir", out).rc == 0
    before = tree(out)
    proc = run_cli("train", *TINY, "--output-dir", out, "--overwrite", "--lr", "1e30")
    one_line_error(proc, "NaN/inf at step 2", "no checkpoint saved yet")
    assert tree(out) == before  # not a byte lost, nothing of the new run left, nothing aside


# Each stage of an --overwrite run, as the point it stops itself at (LATECAST_STOP_AT): the
# previous files gone aside, the new run's first file, its first checkpoint saved.
STAGES = {"aside": "aside", "new config": "config", "new checkpoint": "checkpoint"}


def test_a_replacement_stopped_while_moving_the_files_aside_is_put_back(tmp_path, run_cli):
    """``kill -9`` between two of ``--overwrite``'s ``os.replace`` moves (made here, too quick
    to stop a real process between): the next run puts every file back."""
    out = tmp_path / "run"
    assert run_cli("train", *TINY, "--output-dir", out).rc == 0
    previous = run_files(out)
    for k in range(1, len(previous) + 1):
        (out / MOVING).mkdir()
        for name in list(previous)[:k]:  # the first k moved, as claim moves them
            os.replace(out / name, out / MOVING / name)
        one_line_error(run_cli("train", *TINY, "--output-dir", out), "holds a previous run")
        assert run_files(out) == previous and not (out / MOVING).exists()


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["set-up", "aside", "new config", "new checkpoint", "finished"])
def test_overwrite_killed_at_any_stage_leaves_one_whole_run(stage, tmp_path, run_cli):
    """A real ``train --overwrite`` stopped at each stage, then ``kill -9``: the previous run
    byte for byte or the new one with its checkpoint; the next run says which, goes on."""
    out = tmp_path / "run"
    assert run_cli("train", *TINY, "--output-dir", out).rc == 0  # lr 0.1: the gray preset's
    (out / "notes.txt").write_text("mine")
    previous = run_files(out)
    args = [*TINY, "--limit-train", "2048", "--lr", "0.2", "--output-dir", str(out), "--overwrite"]
    stop = {"LATECAST_STOP_AT": f"{STAGES[stage]}:STOP"} if stage in STAGES else {}
    proc = started("train", *args, env=stop)
    try:
        if stage == "set-up":
            wait_for(proc.pid, "libtorch")  # importing: nothing moved yet
            proc.send_signal(signal.SIGSTOP)
        elif stage == "finished":
            proc.wait(300)
        else:
            stopped(proc)
        latest = out / "checkpoint.pt"
        new = latest.exists() and ckpt.load_checkpoint(latest)["config"]["lr"] == 0.2
    finally:
        proc.kill()
        proc.wait(30)
    for left in (out / MOVING, out / ASIDE):  # as the kill left them: --check only looks
        if left.is_dir():
            one_line_error(run_cli("train", *TINY, "--output-dir", out, "--check"), str(left))
    line = one_line_error(run_cli("train", *TINY, "--output-dir", out), "holds a previous run")
    assert not (out / ASIDE).exists() and not (out / MOVING).exists()
    assert (out / "notes.txt").read_text() == "mine"
    if new:  # a whole new run: its config and checkpoint, resumable
        assert json.loads((out / "config.json").read_text())["lr"] == 0.2
        resumed = run_cli("train", *args[:-1], "--resume", "auto", "--json")
    else:
        assert run_files(out) == previous, line
        resumed = run_cli("train", *TINY, "--output-dir", out, "--resume", "auto", "--json")
    assert resumed.rc == 0 and resumed.json["step"] == (16 if new else 2), resumed.err
    assert stage != "set-up" or not new
    assert stage != "finished" or new


# -- unwritable places and full disks ----------------------------------------


@pytest.mark.parametrize("kind", ["file", "under-file", "long-name", "empty", "read-only"])
def test_an_output_dir_that_cannot_be_written_is_one_line(kind, tmp_path, run_cli):
    (tmp_path / "afile").write_text("mine")
    out = {
        "file": tmp_path / "afile",
        "under-file": tmp_path / "afile" / "run",
        "long-name": tmp_path / ("x" * 300) / "run",
        "empty": "",
        "read-only": tmp_path / "ro" / "run",
    }[kind]
    with tmpfs(tmp_path / "ro", "1m") if kind == "read-only" else contextlib.nullcontext():
        if kind == "read-only":
            read_only(tmp_path / "ro")
        before = tree(tmp_path)
        for extra in ([], ["--check"]):
            proc = run_cli("train", *TINY, "--output-dir", out, *extra)
            one_line_error(proc, "output" if kind == "empty" else str(out)[:80])
        assert tree(tmp_path) == before
        if kind == "read-only":  # the mount point itself, which exists
            proc = run_cli("train", *TINY, "--output-dir", tmp_path / "ro")
            one_line_error(proc, "not writable")


def fill(disk: Path, leave: int) -> None:
    """Write a file on ``disk`` so that ``leave`` bytes stay free."""
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    with open(disk / f"filler-{free}", "wb") as f:
        f.truncate(0)
        f.write(b"\0" * max(free - leave, 0))


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint_and_no_temp(tmp_path, run_cli):
    """Room for two checkpoints, not a third: epoch 2's save gets a real ENOSPC (tmpfs)."""
    assert run_cli("train", *TINY, "--output-dir", tmp_path / "sized").rc == 0
    size = (tmp_path / "sized" / "checkpoint.pt").stat().st_size
    with tmpfs(tmp_path / "disk", f"{4 * size // 1024 + 1024}k") as disk:
        fill(disk, leave=int(2.6 * size))
        out = disk / "run"
        proc = run_cli("train", *TINY, "--epochs", "2", "--output-dir", out)
        line = one_line_error(proc, str(out), "No space left on device")
        assert ".pt: not saved" in line and "epoch 2/2" in proc.out
        assert ckpt.load_checkpoint(out / "checkpoint.pt")["step"] == 2  # epoch 1's
        assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]

        fill(disk, leave=0)
        proc = run_cli("train", *TINY, "--output-dir", disk / "other")
        one_line_error(proc, str(disk / "other"), "No space left on device")


SAVER = """
import sys, torch
from latecast.trainer.checkpoint import save_checkpoint
for i in range(10**6):
    save_checkpoint(sys.argv[1], {"model": {"w": torch.full((2_000_000,), float(i))},
        "optimizer": {}, "scheduler": {}, "step": i, "loader": {}, "rng": {}, "config": {},
        "world_size": 1, "data_fingerprint": "0" * 16})
"""


def temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_the_next_save_removes_what_a_killed_save_left(tmp_path):
    path = tmp_path / "checkpoint.pt"
    env = {**os.environ, "LATECAST_STOP_AT": "checkpoint-write@2:KILL"}  # inside the 2nd save
    proc = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], env=env)
    assert proc.wait(300) == -signal.SIGKILL
    left = temps(tmp_path)
    assert len(left) == 1 and f"-{proc.pid}." in left[0]
    live = tmp_path / f".checkpoint.pt.{socket.gethostname()}-{os.getpid()}.abcdefgh.tmp"
    other_host = tmp_path / f".checkpoint.pt.elsewhere-{proc.pid}.abcdefgh.tmp"
    live.write_bytes(b"a live writer's")
    other_host.write_bytes(b"another machine's")
    state = ckpt.load_checkpoint(path)
    ckpt.save_checkpoint(path, {**state, "step": state["step"] + 1})
    assert temps(tmp_path) == sorted([live.name, other_host.name])
    assert ckpt.load_checkpoint(path)["step"] == state["step"] + 1


# -- resume identity: the data's content ------------------------------------------


def mnist_store(folder: Path, permute=False, dark: int | None = None, mirror: int | None = None):
    """A store of 256 MNIST training images (optionally with labels permuted, one image
    blacked out or one mirrored) and 128 test images: same sizes and label sums either way."""
    train, test = load_dataset("mnist", "train"), load_dataset("mnist", "test")
    images, labels = np.array(train.images[:256]), np.array(train.labels[:256])
    if permute:
        labels = np.random.default_rng(0).permutation(labels)
    if dark is not None:
        images[dark] = 0
    if mirror is not None:  # the same pixel sums, so the same mean/std
        images[mirror] = images[mirror, :, ::-1]
    tested = test.images[:128], test.labels[:128]
    for split, ims, lbs in (("train", images, labels), ("test", *tested)):
        ds = from_arrays(ims, lbs, name="m", split=split, mean=train.mean, std=train.std)
        write_store(ds, folder / split)
    return folder


@pytest.mark.parametrize("change", ["labels-permuted", "one-image", "one-image-mirrored"])
def test_resume_refuses_a_checkpoint_made_from_other_data(change, tmp_path, run_cli):
    store, out = mnist_store(tmp_path / "store"), tmp_path / "run"
    assert run_cli("train", store, *TINY, "--output-dir", out).rc == 0
    before = tree(out)
    # labels permuted: same counts, same label sum; one image: the last is always among those
    # sampled; mirrored: not among the 64 sampled, caught by the images' SHA-256 in meta.json
    changes = {"labels-permuted": dict(permute=True), "one-image": dict(dark=255)}
    mnist_store(store, **changes.get(change, dict(mirror=100)))
    for extra in (["--check"], []):
        proc = run_cli("train", store, *TINY, "--output-dir", out, "--resume", "auto", *extra)
        line = one_line_error(proc, str(out / "checkpoint.pt"), "data_fingerprint")
        assert "the run differs: data_fingerprint" in line and "!=" in line  # nothing else
    assert tree(out) == before


def test_a_checkpoint_without_a_fingerprint_is_refused_naming_the_field(tmp_path, run_cli):
    out = tmp_path / "run"
    assert run_cli("train", *TINY, "--output-dir", out).rc == 0
    state = ckpt.load_checkpoint(out / "checkpoint.pt")
    del state["data_fingerprint"]
    ckpt.save_checkpoint(out / "checkpoint.pt", state)
    proc = run_cli("train", *TINY, "--output-dir", out, "--resume", "auto")
    one_line_error(proc, "checkpoint lacks data_fingerprint")


def test_fingerprint_is_the_same_in_another_process_and_follows_content(tmp_path):
    ds = load_dataset("mnist", "train")
    code = "from latecast import load_dataset\n"
    code += "from latecast.trainer.checkpoint import fingerprint\n"
    code += "print(fingerprint(load_dataset('mnist', 'train')))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert other.stdout.strip() == fingerprint(ds), other.stderr
    copy = from_arrays(ds.images, ds.labels, name="copy", mean=ds.mean, std=ds.std)
    same = open_store(write_store(copy, tmp_path / "copy"))
    labels = np.array(ds.labels)
    labels[1000] = (labels[1000] + 1) % 10  # one label of 60000
    changed = from_arrays(ds.images, labels, name=ds.name, mean=ds.mean, std=ds.std)
    assert fingerprint(same) == fingerprint(ds) != fingerprint(changed)
    assert fingerprint(copy) == fingerprint(replace(ds, digest=""))  # no SHA-256: sampled


# -- every argument and API input checked before work starts -----------------


@pytest.mark.parametrize(
    "flags,mentions",
    [(["--epochs", "0"], "epochs 0"), (["--momentum", "nan"], "momentum"),
     (["--momentum", "-0.5"], "momentum"), (["--weight-decay", "inf"], "weight_decay"),
     (["--weight-decay", "-1"], "weight_decay"), (["--seed", "-1"], "seed"),
     (["--seed", str(2**64)], "seed"), (["--device", "meta"], "'meta'"),
     (["--device", "mps"], "'mps'"), (["--device", "cuda:7"], "cuda:7"),
     (["-b", "100000000000000"], "batch_size 100000000000000"), (["--lr", "nan"], "lr"),
     (["--dist-timeout", "1e300"], "dist_timeout")],
)  # fmt: skip
def test_bad_values_are_refused_before_any_work(flags, mentions, tmp_path, run_cli):
    for extra in (["--check"], []):
        proc = run_cli("train", *TINY, *flags, "--output-dir", tmp_path / "run", *extra)
        one_line_error(proc, mentions)
        assert "epoch" not in proc.out
    assert not (tmp_path / "run").exists()  # not even the folder


@pytest.mark.parametrize(
    "flags,rc",  # "0": off; the block: past what an index holds
    [(["--mix", "mixup=0"], 0), (["--mix", "mixup=0,cutmix=0"], 0),
     (["--order", f"block:{2**63}:1"], 1)],
)  # fmt: skip
def test_what_check_accepts_does_not_fail_at_the_first_step(flags, rc, tmp_path, run_cli):
    """``--check`` makes the first step's data in miniature: both say yes, or both refuse."""
    out = tmp_path / "run"
    checked = run_cli("train", *TINY, *flags, "--output-dir", out, "--check")
    ran = run_cli("train", *TINY, *flags, "--output-dir", out)
    assert checked.rc == ran.rc == rc, (checked.err, ran.err)
    if rc:
        assert checked.err == ran.err and len(ran.err.splitlines()) == 1 and not out.exists()
        assert "internal error" not in ran.err
    else:
        assert "check passed" in checked.out and "epoch 1/1" in ran.out


def test_mix_with_both_alphas_zero_is_off():
    images, labels = torch.rand(4, 3, 8, 8), torch.tensor([0, 2, 1, 2])
    x, y = Mix(classes=3)(images, labels, torch.Generator().manual_seed(0))
    assert torch.equal(x, images) and torch.equal(y, torch.eye(3)[labels])


def store_of(folder: Path, train: tuple, test: tuple) -> Path:
    """A two-split store from ``(images, labels, classes)`` per split."""
    for split, (images, labels, classes) in (("train", train), ("test", test)):
        ds = from_arrays(images, labels, name="s", split=split, classes=classes)
        write_store(ds, folder / split)
    return folder


def pixels(n: int, h: int, w: int = 0, c: int = 1) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 256, (n, h, w or h, c), dtype=np.uint8)


OUTSIDE = "test label 5 at index 3 is outside the training classes 0..3"


@pytest.mark.parametrize(
    "case,flags,mentions",
    [
        ("4x4", ["--model", "resnet9", "--preset", "gray"], "model resnet9 cannot train on 4x4x1"),
        ("4x4", ["--model", "cnn", "--preset", "gray"], None),  # two pools: 4 -> 1 fits
        ("2x2", ["--model", "cnn", "--preset", "gray"], "model cnn cannot train on 2x2x1"),
        ("shapes", ["--preset", "gray"], "differ in shape (8x8x1 vs 8x6x1"),
        ("labels", ["--preset", "gray"], OUTSIDE),
    ],
)
def test_data_the_run_cannot_use_is_refused_before_the_first_step(
    case, flags, mentions, tmp_path, run_cli
):
    four = [f"c{i}" for i in range(4)]
    train = {
        "4x4": (pixels(32, 4), np.arange(32) % 4, four),
        "2x2": (pixels(32, 2), np.arange(32) % 4, four),
    }
    train = train.get(case, (pixels(32, 8), np.arange(32) % 4, four))
    test = {
        "shapes": (pixels(8, 8, 6), np.arange(8) % 4, four),
        "labels": (pixels(8, 8), np.array([0, 1, 2, 5, 0, 1, 2, 3]), [f"c{i}" for i in range(6)]),
    }.get(case, (train[0][:8], train[1][:8], four))
    store = store_of(tmp_path / "store", train, test)
    argv = [*flags, *"--epochs 1 -b 8 --device cpu --no-progress".split()]
    proc = run_cli("train", store, *argv, "--output-dir", tmp_path / "run")
    if mentions is None:
        assert proc.rc == 0, proc.err
    else:
        one_line_error(proc, mentions)
        assert not (tmp_path / "run").exists()  # not even the folder


def test_from_arrays_and_normalize_refuse_what_they_cannot_use():
    images, labels = np.zeros((4, 8, 8, 3), np.uint8), np.arange(4)
    bad = {
        "NCHW": (np.zeros((4, 3, 32, 32), np.uint8), labels, {}, "look like (N, C, H, W)"),
        "5-d": (np.zeros((4, 1, 8, 8, 3), np.uint8), labels, {}, "(N, H, W) or (N, H, W, C)"),
        "float images": (images.astype(np.float32), labels, {}, "must be uint8"),
        "float labels": (images, labels + 0.5, {}, "labels must be integers"),
        "2-d labels": (images, labels[:, None], {}, "labels must be integers (N,)"),
        "ragged": ([[1, 2], [3]], labels, {}, "images must be an array"),
        "short mean": (images, labels, dict(mean=(0.5,), std=(0.2,) * 3), "3 finite channel"),
        "zero std": (images, labels, dict(mean=(0.5,) * 3, std=(0.2, 0.0, 0.2)), "std > 0"),
        "nan mean": (images, labels, dict(mean=(0.5, math.nan, 0.5), std=(0.2,) * 3), "finite"),
        "mean only": (images, labels, dict(mean=(0.5,) * 3), "both or neither"),
        "scalar std": (images, labels, dict(mean=(0.5,) * 3, std=0.2), "sequences of numbers"),
    }
    for name, (ims, lbs, kw, mentions) in bad.items():
        with pytest.raises(FormatError) as err:
            from_arrays(ims, lbs, name=name, **kw)
        assert mentions in str(err.value) and name in str(err.value), (name, err.value)
    x = torch.zeros(2, 8, 8, 3, dtype=torch.uint8)
    for mean, std, mentions in [
        ((0.5, 0.5), (0.2, 0.2), "3 channels need 3 (or 1)"),
        ((0.5,) * 3, (0.2, -0.1, 0.2), "std > 0"),
        ((0.5,) * 3, (0.2, math.inf, 0.2), "finite"),
        (0.5, (0.2,) * 3, "sequences of numbers"),
    ]:
        with pytest.raises(ConfigError) as err:
            normalize(x, mean, std)
        assert mentions in str(err.value)
    # one value serves every channel, as with torchvision's Normalize
    assert torch.equal(normalize(x, (0.5,), (0.2,)), normalize(x, (0.5,) * 3, (0.2,) * 3))


def test_numpy_integers_are_ints_and_booleans_are_not():
    ds = from_arrays(np.zeros((10, 4, 4), np.uint8), np.arange(10, dtype=np.int16))
    loader = Loader(ds, np.int64(4), device="cpu", seed=np.uint32(7))
    assert [len(y) for _, y in loader] == [4, 4, 2]
    assert TrainConfig(batch_size=np.int32(64), seed=np.int64(1)).batch_size == 64
    for bad in (True, 4.0, 0):
        with pytest.raises(ConfigError, match="batch_size"):
            Loader(ds, bad, device="cpu")
    with pytest.raises(ConfigError, match="seed"):
        Loader(ds, 4, device="cpu", seed=2**63)


def test_json_is_strict_and_never_nan():
    value = {"a": math.nan, "b": [math.inf, 1.5, -math.inf], "c": (np.float64("nan"), "x")}
    assert _strict(value) == {"a": None, "b": [None, 1.5, None], "c": [None, "x"]}
    json.dumps(_strict(value), allow_nan=False)


def test_with_json_the_last_stdout_line_is_one_object_also_on_an_error(tmp_path, run_cli):
    out = tmp_path / "run"
    for argv, process in (
        (["train", *TINY, "--lr", "1e30", "--output-dir", out], False),  # fails at step 2
        (["info", tmp_path / "nothing"], True),  # a real process: stdout as a caller reads it
    ):
        proc = run_cli(*argv, "--json", process=process)
        line = one_line_error(proc)
        last = json.loads(proc.out.splitlines()[-1])
        assert proc.out.endswith("\n") and last == {"error": line[17:], "exit_code": 1}
    assert run_cli("train", *TINY, "--output-dir", tmp_path / "ok", "--json").json["step"] == 2
    for argv in (["train", "--epochs", "x"], ["info", "a", "b"], ["--bogus"]):  # bad usage: 2
        rc, last = run_cli(*argv, "--json")
        error = run_cli(*argv).err.strip().split(": error: ", 1)[1]
        assert rc == 2 and last == {"error": error, "exit_code": 2}
    proc = run_cli("doctor", "--", "x.py", "--json")  # the script's own --json: not ours
    assert proc.rc == 1 and proc.json is None


# -- messages that never mislead, Ctrl-C -------------------------------------


def test_an_unsafe_checkpoint_is_named_without_torchs_advice_to_load_it_anyway(tmp_path, run_cli):
    import argparse

    path = tmp_path / "evil.pt"
    torch.save({"format": ckpt.FORMAT, "obj": argparse.Namespace(x=1)}, path)
    with pytest.raises(CheckpointError) as err:
        ckpt.load_checkpoint(path)
    msg = str(err.value)
    assert str(path) in msg and "argparse.Namespace" in msg and "\n" not in msg
    for advice in ("weights_only", "can still be loaded", "trust", "\x1b"):
        assert advice not in msg
    line = one_line_error(run_cli("train", *TINY, "--resume", path, "--output-dir", tmp_path / "o"))
    assert "weights_only" not in line and "evil.pt" in line


def wait_for(pid: int, what: str, timeout: float = 60) -> None:
    """Until the process at ``pid`` has ``what`` mapped (its shared libraries as they load)."""
    deadline = time.monotonic() + timeout
    while what not in Path(f"/proc/{pid}/maps").read_text():
        assert time.monotonic() < deadline, f"{what} not loaded within {timeout} s"
        time.sleep(0.002)


# 4 steps, a checkpoint after each: checkpoint.pt at steps 1, 2 and 3, then best.pt and
# checkpoint.pt at the epoch's end (step 4): the 2nd checkpoint write is step 2's.
SAVING = [*TINY, "--limit-train", "512", "--checkpoint-every", "1"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "point,saved",
    [
        ("importing", None),  # torch's library just mapped
        ("data", None),  # the splits about to load, the output folder held
        ("step", None),  # the first step
        ("step@3", 2),  # mid-epoch, two checkpoints saved
        ("checkpoint-write@2", 1),  # inside torch.save of step 2's checkpoint
        ("checkpoint@2", 2),  # step 2's checkpoint just saved whole
        ("evaluate", 3),
    ],
)
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(point, saved, tmp_path):
    """SIGINT to a real ``train`` while torch imports and at each named moment (sent by
    itself): one line, exit 130, the last checkpoint whole, no temporary file left."""
    if point == "importing" and not Path("/proc/self/maps").exists():
        pytest.skip("needs /proc to see when torch is being imported")
    out = tmp_path / "run"
    where = {"LATECAST_STOP_AT": point}
    proc = started(
        "train", *SAVING, "--output-dir", out, stdout=PIPE, stderr=PIPE, text=True, env=where
    )
    try:
        if point == "importing":
            wait_for(proc.pid, "libtorch")
            proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)  # a hang guard
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr == "latecast: interrupted\n" and "Traceback" not in stdout
    latest = out / "checkpoint.pt"
    assert (ckpt.load_checkpoint(latest)["step"] if latest.exists() else None) == saved
    assert not out.exists() or not temps(out)
    assert out.exists() == (point not in ("importing", "data"))  # nothing written: no folder


INTERRUPTED_MAINS = {
    # A Ctrl-C landing in a dataclass's ``__set_name__`` while a module imports (the parser
    # imports each command's module) reaches us as a RuntimeError caused by the interrupt.
    "class-body": "def boom(argv):\n    try:\n        raise KeyboardInterrupt\n"
    "    except KeyboardInterrupt as e:\n        raise RuntimeError('__set_name__') from e\n"
    "cli._main = boom\n",
    # CPython marks a KeyboardInterrupt raised inside exec() of a string as unhandled even
    # when it is caught, and then kills itself with SIGINT (-2) instead of exiting with the
    # code it was given; a Ctrl-C that lands in a dataclass's generated code does exactly this.
    "generated-code": "cli._main = lambda argv: exec('raise KeyboardInterrupt')\n",
}


@pytest.mark.parametrize("where", list(INTERRUPTED_MAINS))
def test_an_interrupt_inside_a_class_body_or_generated_code_still_exits_130(where, tmp_path):
    (tmp_path / "interrupted.py").write_text(
        "import sys\nfrom latecast.tools import cli\n"
        f"{INTERRUPTED_MAINS[where]}sys.exit(cli.main())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-m", "interrupted"], capture_output=True, env=env, text=True
    )
    assert proc.returncode == 130 and proc.stderr == "latecast: interrupted\n", proc
