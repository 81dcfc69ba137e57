"""``latecast train`` with the photo options: the photo preset for images larger than 32 px,
batch mixing (soft labels), the block order; and JPEG data through the training step."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from latecast.loader import Loader
from latecast.trainer.loop import (
    TrainConfig,
    evaluate,
    model_and_optimizer,
    resolve_config,
    train_step,
)
from latecast.trainer.models import build_model
from latecast.transforms import Augment, Mix

TINY = ["--model", "mlp", "--epochs", "1", "--limit-train", "512", "--limit-test", "200"]


@pytest.mark.slow
def test_photo_store_trains_with_the_photo_preset(tmp_path, run_cli):
    """A folder of 72x72 colour images: no longer refused, the photo preset is chosen."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 24), ("test", 8)):
        for k in range(n):
            folder = tmp_path / "photos" / split / f"c{k % 2}"
            folder.mkdir(parents=True, exist_ok=True)
            img = rng.integers(0, 256, (72, 72, 3), dtype=np.uint8)
            Image.fromarray(img).save(folder / f"{k}.png")
    assert run_cli("convert", tmp_path / "photos", tmp_path / "store").rc == 0
    out = tmp_path / "run"
    argv = ["--epochs", "1", "-b", "8", "--device", "cpu", "--output-dir", out, "--json"]
    rc, result = run_cli("train", tmp_path / "store", *argv)
    config = json.loads((out / "config.json").read_text())
    assert rc == 0 and 0 <= result["test_accuracy"] <= 1
    assert config["preset"] == "photo" and config["augment"] == "resized_crop=0.35,flip"
    assert config["model"] == "resnet9"


def test_resnet9_has_a_stride_4_stem_above_64_px():
    small, large = build_model("resnet9", (3, 64, 64), 10), build_model("resnet9", (3, 96, 96), 10)
    assert small(torch.zeros(2, 3, 64, 64)).shape == large(torch.zeros(2, 3, 96, 96)).shape
    assert large[0][0].stride == (2, 2) and isinstance(large[1], torch.nn.MaxPool2d)
    assert small[0][0].stride == (1, 1)


def test_mix_and_block_order_train_and_mix_is_part_of_the_run(tmp_path, run_cli):
    out = tmp_path / "run"
    args = [*TINY, "--device", "cpu", "--output-dir", out]
    rc, result = run_cli(
        "train", *args, "--mix", "mixup=0.2,cutmix", "--order", "block:8:256", "--json"
    )
    assert rc == 0 and result["test_accuracy"] > 0.3  # learns from soft labels
    proc = run_cli("train", *args, "--mix", "cutmix", "--resume", "auto")
    assert proc.rc == 1 and "mix 'mixup=0.2,cutmix' (checkpoint) != 'cutmix' (now)" in proc.err


def test_soft_labels_go_through_the_training_step():
    """train_step's cross_entropy takes class probabilities as they come from Mix."""
    rng = np.random.default_rng(0)
    from latecast.data import from_arrays

    ds = from_arrays(rng.integers(0, 256, (64, 8, 8, 3), dtype=np.uint8), rng.integers(0, 4, 64))
    config = resolve_config(
        TrainConfig(model="mlp", epochs=1, batch_size=16, lr=0.1, augment="", preset="colour"),
        ds,
        torch.device("cpu"),
    )
    aug = Augment(resized_crop=0.5, altflip=True, jitter=0.3)
    loader = Loader(ds, 16, device="cpu", augment=aug, mix=Mix(classes=4, mixup=0.4))
    model, opt, sched = model_and_optimizer(config, ds, torch.device("cpu"), len(loader))
    for images, labels in loader:
        assert labels.shape == (16, 4) and labels.dtype == torch.float32
        assert torch.isfinite(train_step(model, opt, sched, images, labels, config))
    correct, total = evaluate(model, Loader(ds, 32, device="cpu", shuffle=False, pad=False))
    assert total == 64 and 0 <= correct <= 64


def test_resuming_with_another_order_is_refused(tmp_path, run_cli):
    out = tmp_path / "run"
    args = [*TINY, "--device", "cpu", "--output-dir", out]
    assert run_cli("train", *args).rc == 0
    proc = run_cli("train", *args, "--order", "block", "--resume", "auto")
    assert proc.rc == 1 and "order 'random' != 'block:32:256'" in proc.err


def test_a_jpeg_store_trains_saves_and_its_content_is_the_resume_identity(tmp_path, run_cli):
    """convert --encoding jpeg, then train (the checkpoints fingerprint the files) and
    resume: the same store continues, a store with one file changed is refused."""
    rng = np.random.default_rng(1)
    for split, n in (("train", 16), ("test", 4)):
        for k in range(n):
            folder = tmp_path / "photos" / split / f"c{k % 2}"
            folder.mkdir(parents=True, exist_ok=True)
            img = rng.integers(0, 256, (20 + k % 3, 24, 3), dtype=np.uint8)  # sizes differ
            Image.fromarray(img).save(folder / f"{k}.jpg", quality=90)
    for store in ("store", "other"):
        if store == "other":  # one training file changed
            Image.fromarray(np.zeros((20, 24, 3), np.uint8)).save(
                tmp_path / "photos" / "train" / "c0" / "0.jpg"
            )
        args = ["convert", tmp_path / "photos", tmp_path / store, "--encoding", "jpeg"]
        assert run_cli(*args).rc == 0
    flags = ["--model", "mlp", "--epochs", "2", "-b", "4", "--preset", "colour", "--device", "cpu"]
    out = tmp_path / "run"
    rc, result = run_cli("train", tmp_path / "store", *flags, "--output-dir", out, "--json")
    assert rc == 0 and result["transfer"] == "jpeg" and (out / "checkpoint.pt").is_file()
    resumed = run_cli("train", tmp_path / "store", *flags, "--output-dir", out, "--resume", "auto")
    assert resumed.rc == 0, resumed.err
    proc = run_cli("train", tmp_path / "other", *flags, "--output-dir", out, "--resume", "auto")
    assert proc.rc == 1 and "data_fingerprint" in proc.err
