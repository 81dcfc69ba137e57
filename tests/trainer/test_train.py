"""Training learns, the CLI keeps its contract (exit codes, one-line errors, --json)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from _helpers import one_line_error

import latecast
from latecast.errors import ConfigError
from latecast.trainer.loop import TrainConfig, train

BUNDLED = Path(latecast.__file__).parent / "bundled"
NAMES = [
    f"{s}-{k}-idx{d}-ubyte" for s in ("train", "t10k") for k, d in (("images", 3), ("labels", 1))
]
# 64 steps on the first 8,192 images, 2,000 test images: 87% (every strategy alike), against
# 90% for one epoch of 60,000 in batches of 1,024 at 3x the CPU time.
SMALL = "-b 128 --limit-train 8192 --limit-test 2000".split()
MLP = ["--model", "mlp", "--epochs", "1", *SMALL, "--device", "cpu", "--json"]  # on the CPU


def test_short_training_run_learns(tmp_path):
    cfg = dict(model="mlp", epochs=1, batch_size=256, lr=0.05, device="cpu")
    summary = train(TrainConfig(**cfg, output_dir=str(tmp_path)))
    assert summary["test_accuracy"] > 0.93
    assert summary["h2d_bytes"] * 3 < summary["h2d_bytes_float32"]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["epoch"] == 1
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model"] == "mlp" and saved["transfer"] == "resident"


def test_seeded_runs_are_reproducible_on_cpu(tmp_path):
    cfg = dict(model="mlp", epochs=1, batch_size=512, lr=0.05, device="cpu", transfer="uint8")
    cfg.update(limit_train=8192, limit_test=2000)  # the same steps twice: no need for 60,000
    a = train(TrainConfig(**cfg, output_dir=str(tmp_path / "a")))
    b = train(TrainConfig(**cfg, output_dir=str(tmp_path / "b")))
    assert a["test_accuracy"] == b["test_accuracy"]
    ma = json.loads((tmp_path / "a" / "metrics.jsonl").read_text())
    mb = json.loads((tmp_path / "b" / "metrics.jsonl").read_text())
    assert ma["train_loss"] == mb["train_loss"]


@pytest.mark.parametrize("field,value", [("epochs", -1), ("batch_size", 0), ("lr", 0.0)])
def test_bad_config_values_are_named(field, value, tmp_path):
    with pytest.raises(ConfigError, match=field):
        train(TrainConfig(**{field: value}, output_dir=str(tmp_path)))


def test_an_array_where_a_choice_goes_is_named_not_a_raw_numpy_error():
    """numpy cannot say whether an array is among the choices ("truth value ... ambiguous"):
    the field is named instead."""
    with pytest.raises(ConfigError, match="transfer must be one of float32, .*got array"):
        TrainConfig(transfer=np.array(["uint8", "auto"]))


@pytest.mark.parametrize("transfer", ["float32", "uint8", "prefetch", "resident", "auto"])
def test_cli_train_json_every_strategy(transfer, tmp_path, run_cli):
    proc = run_cli("train", *MLP, "--lr", "0.05", "--transfer", transfer, "--output-dir", tmp_path)
    assert proc.rc == 0, proc.err
    result = proc.json
    keys = "test_accuracy train_seconds epochs transfer device h2d_bytes h2d_bytes_float32"
    for key in keys.split():
        assert key in result
    assert 0.8 < result["test_accuracy"] <= 1 and result["device"] == "cpu"
    assert result["transfer"] == ("resident" if transfer == "auto" else transfer)
    assert "float32 would have moved" in proc.out


def test_cli_info_json(run_cli):
    proc = run_cli("info", "--json")
    assert proc.rc == 0, proc.err
    info = proc.json
    assert info["train"]["samples"] == 60000 and info["test"]["samples"] == 10000
    epoch = info["train"]["epoch_bytes"]
    assert epoch["float32"]["per_epoch"] == 60000 * (784 * 4 + 8)
    assert epoch["uint8"]["per_epoch"] == 60000 * (784 + 1)


def test_cli_bad_usage_exits_2(run_cli):
    assert run_cli("train", "--epochs", "many", process=True).rc == 2
    assert run_cli("nonsense").rc == 2


def _data_root(tmp_path: Path) -> Path:
    root = tmp_path / "mnist"
    root.mkdir()
    for name in NAMES:
        (root / name).write_bytes(gzip.decompress((BUNDLED / f"{name}.gz").read_bytes()))
    return root


@pytest.mark.parametrize("fault", ["missing", "truncated", "wrong-role", "html"])
def test_bad_data_root_gives_one_line_naming_the_file(fault, tmp_path, run_cli):
    root = _data_root(tmp_path)
    target = root / "train-labels-idx1-ubyte"
    if fault == "missing":
        target.unlink()
    elif fault == "truncated":
        target.write_bytes(target.read_bytes()[:1000])
    elif fault == "wrong-role":
        target.write_bytes((root / "t10k-images-idx3-ubyte").read_bytes())
    else:
        target.write_bytes(b"<!DOCTYPE html><html>Not found</html>")
    argv = ["--data-root", root, "--epochs", "1", "--device", "cpu"]
    proc = run_cli("train", *argv, "--output-dir", tmp_path / "out", process=True)
    one_line_error(proc, "train-labels-idx1-ubyte")


def test_data_root_with_good_files_trains(tmp_path, run_cli):
    root = _data_root(tmp_path)
    rc, result = run_cli("train", "--data-root", root, *MLP, "--output-dir", tmp_path / "o")
    assert rc == 0 and result["test_accuracy"] > 0.8


def test_unknown_dataset_lists_valid_names(tmp_path, run_cli):
    proc = run_cli("train", "imagenet-22k", "--output-dir", tmp_path)
    one_line_error(proc, "imagenet-22k")
    assert "mnist" in proc.err


def test_warm_up_leaves_weights_and_batchnorm_untouched():
    import torch

    from latecast.loader import Loader
    from latecast.trainer.loop import TrainConfig, resolve_config, warm_up
    from latecast.trainer.models import build_model

    ds = latecast.load_dataset("mnist", "test")
    loader = Loader(ds, 64, device="cpu", channels_last=True)
    model = build_model("cnn", (1, 28, 28), 10).to(memory_format=torch.channels_last)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    warm_up(model, loader, resolve_config(TrainConfig(), ds, torch.device("cpu")))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
