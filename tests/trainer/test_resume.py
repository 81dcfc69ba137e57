"""Checkpoints: atomic saves, corrupt or foreign files, another run refused, bit-identical
resume after a kill -9, a NaN loss keeping the last good one. One CPU thread everywhere:
float sums in one fixed order, so bit-identical compares like with like."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from latecast.errors import CheckpointError, TrainingError
from latecast.trainer import checkpoint as ckpt
from latecast.trainer.loop import TrainConfig, train

train_mod = importlib.import_module("latecast.trainer.loop")  # the package re-exports train()

# 10 steps an epoch; checkpoints every 3 steps land mid-epoch and on neither epoch's end.
# crop augmentation is on so the per-batch generators' reseeding is part of what is checked.
TINY = dict(
    model="mlp",
    epochs=2,
    batch_size=32,
    lr=0.05,
    augment="crop=2",
    limit_train=320,
    limit_test=500,
    device="cpu",
    checkpoint_every=3,
    log_every=2,
    progress=False,
)


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run(tmp: Path, **over) -> dict:
    return train(TrainConfig(**{**TINY, "output_dir": str(tmp), **over}))


def assert_same_run(a: Path, b: Path) -> None:
    """Final checkpoints hold bit-identical weights and optimizer state, same metrics."""
    sa, sb = ckpt.load_checkpoint(a / "checkpoint.pt"), ckpt.load_checkpoint(b / "checkpoint.pt")
    assert sa["step"] == sb["step"]
    for name, tensor in sa["model"].items():
        assert torch.equal(tensor, sb["model"][name]), name
    for i, s in sa["optimizer"]["state"].items():
        assert torch.equal(s["momentum_buffer"], sb["optimizer"]["state"][i]["momentum_buffer"])
    assert sa["scheduler"] == sb["scheduler"]
    timing = ("epoch_seconds", "images_per_s")
    strip = [{k: v for k, v in r.items() if k not in timing} for r in sa["history"]]
    assert strip == [{k: v for k, v in r.items() if k not in timing} for r in sb["history"]]
    assert (a / "metrics.jsonl").read_text().count("\n") == len(sa["history"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted TINY run, one thread."""
    out = tmp_path_factory.mktemp("reference")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run(out)
    finally:
        torch.set_num_threads(before)
    return out


# -- exact resume -----------------------------------------------------


@pytest.mark.parametrize("stop_after", [3, 10, 15])  # mid-epoch 1, epoch 1's end, mid-epoch 2
def test_interrupted_run_resumes_bit_identical(
    stop_after, reference, tmp_path, one_thread, monkeypatch
):
    real_save = ckpt.save_checkpoint

    def save_then_stop(path, state):
        real_save(path, state)
        if state["step"] == stop_after and Path(path).name == "checkpoint.pt":
            raise KeyboardInterrupt  # the run stops right after this checkpoint

    monkeypatch.setattr(ckpt, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path)
    monkeypatch.setattr(ckpt, "save_checkpoint", real_save)
    assert ckpt.load_checkpoint(tmp_path / "checkpoint.pt")["step"] == stop_after
    summary = run(tmp_path, resume="auto")
    assert_same_run(tmp_path, reference)
    want = json.loads((reference / "summary.json").read_text())
    assert summary["test_accuracy"] == want["test_accuracy"]


# TINY at 128 steps an epoch: long enough to be killed mid-run
KILLED = dict(TINY, batch_size=16, limit_train=2048, limit_test=1000, checkpoint_every=20)
del KILLED["log_every"]


def _cli(out: Path, *extra: str) -> list[str]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in KILLED.items() if k != "progress"]
    return [sys.executable, "-m", "latecast", "train", *flags, "--no-progress", "--output-dir",
            str(out), *extra]  # fmt: skip


@pytest.mark.slow
def test_kill9_between_checkpoints_then_resume_auto_is_exact(tmp_path, one_thread):
    # killed before its 30th step (LATECAST_STOP_AT): mid-epoch, 9 steps past a checkpoint
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LATECAST_STOP_AT": "step@30:KILL"}
    killed = tmp_path / "killed"
    victim = subprocess.Popen(
        _cli(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        train(TrainConfig(**KILLED, output_dir=str(tmp_path / "full")))  # meanwhile: reference
        assert victim.wait(120) == -signal.SIGKILL
    finally:
        victim.kill()
    state = ckpt.load_checkpoint(killed / "checkpoint.pt")  # an atomic save under a real kill
    assert state["step"] == 20
    del env["LATECAST_STOP_AT"]
    resumed = subprocess.run(
        _cli(killed, "--resume", "auto"), env=env, capture_output=True, text=True, timeout=180
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {killed / 'checkpoint.pt'}" in resumed.stdout
    assert_same_run(killed, tmp_path / "full")


def test_resume_auto_without_checkpoint_starts_fresh(tmp_path, one_thread, capsys):
    summary = run(tmp_path, epochs=1, checkpoint_every=None, resume="auto")
    assert "starting fresh" in capsys.readouterr().out
    assert summary["step"] == 10 and (tmp_path / "checkpoint.pt").is_file()
    assert (tmp_path / "best.pt").is_file()


# -- refusing another run ---------------------------------------------


def test_resume_with_another_run_names_every_field(tmp_path, one_thread):
    run(tmp_path, epochs=1)
    with pytest.raises(CheckpointError) as err:
        run(tmp_path, epochs=1, batch_size=64, model="cnn", resume="auto")
    msg = str(err.value)
    assert str(tmp_path / "checkpoint.pt") in msg
    assert "batch_size 32 (checkpoint) != 64 (now)" in msg
    listed = {part.split()[0] for part in msg.split("the run differs: ")[1].split("; ")}
    assert listed == {"batch_size", "model"}  # all that differs, nothing else


# Other data is told by its fingerprint (issue 25): the dataset's name alone may be spelled
# another way (a store as st/, ./st, its absolute path; shards on another host).
@pytest.mark.parametrize("field,value", [("world_size", 2), ("data_fingerprint", "0" * 16)])
def test_resume_refuses_other_world_size_or_data(field, value, tmp_path, one_thread):
    run(tmp_path, epochs=1)
    path = tmp_path / "checkpoint.pt"
    state = ckpt.load_checkpoint(path)
    state[field] = value
    ckpt.save_checkpoint(path, state)
    with pytest.raises(CheckpointError, match=f"{field} {value!r} \\(checkpoint\\)"):
        run(tmp_path, epochs=1, resume=str(path))


# -- atomic saves -----------------------------------------------------


# a checkpoint's keys, each empty (what save_checkpoint and load_checkpoint check)
STATE = dict.fromkeys(["model", "optimizer", "scheduler", "loader", "rng", "config"], {})
STATE.update(step=0, world_size=1, data_fingerprint="0" * 16)


def test_failed_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    good = dict(STATE, model={"w": torch.arange(4.0)}, step=1)
    ckpt.save_checkpoint(path, good)

    def torn_save(obj, f):
        f.write(b"PK\x03\x04 half a zip")  # partial bytes, then the "crash"
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(CheckpointError, match="not saved \\(disk full\\)") as err:
        ckpt.save_checkpoint(path, {**good, "step": 2})
    assert str(path) in str(err.value)
    monkeypatch.undo()
    assert ckpt.load_checkpoint(path)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


SAVER = """
import sys, torch
from latecast.trainer.checkpoint import save_checkpoint
for i in range(10**6):
    save_checkpoint(sys.argv[1], {"model": {"w": torch.full((4_000_000,), float(i))},
        "optimizer": {}, "scheduler": {}, "step": i, "loader": {}, "rng": {}, "config": {},
        "world_size": 1, "data_fingerprint": "0" * 16})
"""


@pytest.mark.parametrize("save", [2, 3])
def test_kill9_during_saves_leaves_a_loadable_checkpoint(save, tmp_path):
    """``kill -9`` inside a save (``LATECAST_STOP_AT``: torch.save has begun the file)."""
    path = tmp_path / "checkpoint.pt"
    env = {**os.environ, "LATECAST_STOP_AT": f"checkpoint-write@{save}:KILL"}
    proc = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], env=env)
    assert proc.wait(300) == -signal.SIGKILL
    state = ckpt.load_checkpoint(path)
    assert state["step"] == save - 2  # the save before, whole
    assert torch.all(state["model"]["w"] == state["step"])  # one whole save, not a mix


# -- corrupt or foreign files -----------------------------------------


def _corrupt(path: Path, kind: str) -> None:
    good = STATE
    ckpt.save_checkpoint(path, good)
    data = path.read_bytes()
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "garbage":
        path.write_bytes(os.urandom(4096))
    elif kind == "foreign":
        torch.save({"state_dict": {"w": torch.ones(2)}}, path)
    elif kind == "code":  # a pickled object: weights_only refuses to build it
        torch.save({"format": ckpt.FORMAT, "obj": argparse_namespace()}, path)
    elif kind == "future":
        torch.save({**good, "format": ckpt.FORMAT, "version": 99}, path)
    elif kind == "incomplete":
        torch.save({"format": ckpt.FORMAT, "version": ckpt.VERSION, "model": {}}, path)


def argparse_namespace():
    import argparse

    return argparse.Namespace(x=1)


@pytest.mark.parametrize(
    "kind", ["empty", "truncated", "garbage", "foreign", "code", "future", "incomplete", "missing"]
)
def test_corrupt_or_foreign_checkpoint_is_named(kind, tmp_path):
    path = tmp_path / "checkpoint.pt"
    if kind != "missing":
        _corrupt(path, kind)
    with pytest.raises(CheckpointError) as err:
        ckpt.load_checkpoint(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_cli_resume_from_garbage_is_one_line(tmp_path, run_cli):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"<html>not a checkpoint</html>")
    argv = "--model mlp --limit-train 64 --limit-test 64 --device cpu".split()
    argv += ["--output-dir", tmp_path / "o", "--resume", bad]
    proc = run_cli("train", *argv, process=True, env={"OMP_NUM_THREADS": "1"}, timeout=120)
    assert proc.rc == 1
    lines = [line for line in proc.err.splitlines() if line.startswith("latecast:")]
    assert len(lines) == 1 and str(bad) in lines[0] and "Traceback" not in proc.err


# -- contents and NaN ----------------------------------------------------------------


def test_checkpoint_is_plain_data_with_everything_for_resume(reference):
    raw = torch.load(reference / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert raw["format"] == ckpt.FORMAT and raw["version"] == ckpt.VERSION
    keys = "model optimizer scheduler epoch step loader rng config world_size history best_accuracy"
    for key in keys.split():
        assert key in raw, key
    resolved = dict(label_smoothing=0.0, amp=False, channels_last=True, preset="gray")
    config = TrainConfig(**{**TINY, "output_dir": str(reference), **resolved})
    assert raw["config"] == asdict(config)
    assert raw["loader"]["epoch"] == 2 and raw["loader"]["position"] == 0 and raw["step"] == 20
    assert not any(k.startswith("module.") for k in raw["model"])
    best = ckpt.load_checkpoint(reference / "best.pt")
    assert best["best_accuracy"] == max(r["test_accuracy"] for r in raw["history"])


def test_nan_loss_names_the_step_and_keeps_last_good_checkpoint(tmp_path, one_thread):
    with pytest.raises(TrainingError) as err:
        run(tmp_path, lr=1e4, epochs=1, checkpoint_every=2, log_every=1)
    msg = str(err.value)
    bad = int(msg.split("at step ")[1].split(";")[0])
    kept = ckpt.load_checkpoint(tmp_path / "checkpoint.pt")
    assert kept["step"] < bad and f"(step {kept['step']})" in msg
    assert str(tmp_path / "checkpoint.pt") in msg
